"""The cache of converted models: one folder per GGUF content and kind of conversion, shared by every
clone and venv.

A GGUF file is de-quantised to float32 by transformers on every load (~15-20 s); the cache keeps the
result as a transformers model folder under `cache_root()` (one folder for the whole machine, the one the
compiled kernels use too: `$SPECVERIFY_CACHE`, else `~/.cache/specverify`), named

    <GGUF stem>-<size in bytes>-<first 16 hex digits of the GGUF's SHA-256>-transformers<version>

so that a reinstall of the same file (a new modification time, another venv, another clone) finds the
same folder, and a changed file (same name and size, other bytes) does not. transformers' version is part
of the key because the de-quantisation is its code. Hashing the 98 MB SmolLM2 file takes ~0.15 s.
Other conversions of the same GGUF are kept the same way, each a `Kind` with its own name in place of
"transformers" (and the version of the code that converts): the tokenizer alone (`TOKENIZER`, for the
llama.cpp engine, which needs no transformers weights) and llama.cpp's F16 copy (`LLAMACPP_F16`).

Writes are atomic: a folder is written under a temporary name in the same directory and renamed into
place, so another process sees either no folder or a complete one; when two processes convert the same
file at once the first rename wins and the other's copy is discarded (the content is the same). Once a
new folder is in place, the other folders of the same GGUF stem and kind (other content or another
converter version, including the modification-time keyed folders of earlier versions) are removed; the
other kinds' folders stay. Two venvs with different transformers versions therefore take turns converting
the same model.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...contract import cache_root

#: Hex digits of the SHA-256 kept in a folder name (64 bits: collisions are not a concern).
DIGEST_CHARS = 16
#: The file every complete folder holds (transformers' single-file weights).
WEIGHTS = "model.safetensors"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Kind:
    """A kind of conversion: its name in folder names (letters and underscores, no hyphen) and the file
    every complete folder of that kind holds."""

    name: str
    marker: str


#: transformers' float32 model folder (config, weights, tokenizer).
TRANSFORMERS = Kind("transformers", WEIGHTS)
#: transformers' tokenizer alone (converting it from a GGUF takes ~3 s, reading it back ~0.2 s).
TOKENIZER = Kind("tokenizer_transformers", "tokenizer_config.json")
#: llama.cpp's F16 copy of a GGUF (`llama_model_quantize`), versioned by llama-cpp-python.
LLAMACPP_F16 = Kind("F16_llamacpp", "model.F16.gguf")


def content_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def entry_folder(gguf: Path, version: str, kind: Kind = TRANSFORMERS) -> Path:
    """The cache folder of a GGUF file's conversion of this kind by the converter at `version` (it may
    not exist yet)."""
    key = f"{gguf.stat().st_size}-{content_digest(gguf)[:DIGEST_CHARS]}-{kind.name}{version}"
    return cache_root() / f"{gguf.stem}-{key}"


def is_complete(folder: Path, kind: Kind = TRANSFORMERS) -> bool:
    """Whether a cache folder is in place (folders appear only complete, by rename)."""
    return (folder / kind.marker).is_file()


def write_entry(folder: Path, write: Callable[[Path], None], kind: Kind = TRANSFORMERS) -> None:
    """Fill `folder` (an entry_folder) atomically with write(temporary folder), then remove the stale
    folders of the same model. If another process put the folder in place first, its copy is kept and
    ours discarded."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
    try:
        partial.chmod(0o755)  # mkdtemp's 0o700 would hide the entry from the machine's other users
        write(partial)
        try:
            partial.rename(folder)
        except OSError:
            if not is_complete(folder, kind):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    remove_stale(folder, kind)


def stale_entries(folder: Path, kind: Kind = TRANSFORMERS) -> list[Path]:
    """The other folders of the same GGUF stem and kind beside `folder` (an entry_folder): any size,
    digest or converter version, the modification-time keyed folders of earlier versions included;
    temporary folders of writes in progress and other kinds' folders are not."""
    stem = folder.name.rsplit("-", 3)[0]  # size, digest and kind + version hold no hyphen
    pattern = re.compile(re.escape(stem) + r"-\d+-[0-9a-f]+-" + re.escape(kind.name) + r"[^-]+")
    return sorted(p for p in folder.parent.iterdir() if p != folder and p.is_dir() and pattern.fullmatch(p.name))


def remove_stale(folder: Path, kind: Kind = TRANSFORMERS) -> None:
    """Remove the stale folders of folder's model and kind. Each is first moved into a temporary folder
    (a rename: no process starts reading a half-removed folder), then deleted; one that another process
    is removing at the same time is left to it."""
    for stale in stale_entries(folder, kind):
        try:
            doomed = Path(tempfile.mkdtemp(prefix=f"{stale.name}.removing-", dir=folder.parent))
        except OSError:  # the cache folder cannot be written now: a later write removes them
            return
        try:
            stale.rename(doomed / stale.name)
        except OSError:  # another process moved it first
            pass
        shutil.rmtree(doomed, ignore_errors=True)
