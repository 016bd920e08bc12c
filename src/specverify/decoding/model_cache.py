"""The cache of de-quantised models: one folder per GGUF content, shared by every clone and venv.

A GGUF file is de-quantised to float32 by transformers on every load (~15-20 s); the cache keeps the
result as a transformers model folder under `cache_root()` (one folder for the whole machine, the one the
compiled kernels use too: `$SPECVERIFY_CACHE`, else `~/.cache/specverify`), named

    <GGUF stem>-<size in bytes>-<first 16 hex digits of the GGUF's SHA-256>-transformers<version>

so that a reinstall of the same file (a new modification time, another venv, another clone) finds the
same folder, and a changed file (same name and size, other bytes) does not. transformers' version is part
of the key because the de-quantisation is its code. Hashing the 98 MB SmolLM2 file takes ~0.15 s.

Writes are atomic: a folder is written under a temporary name in the same directory and renamed into
place, so another process sees either no folder or a complete one; when two processes convert the same
file at once the first rename wins and the other's copy is discarded (the content is the same). Once a
new folder is in place, the other folders of the same GGUF stem (other content or another transformers
version, including the modification-time keyed folders of earlier versions) are removed. Two venvs with
different transformers versions therefore take turns converting the same model.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

#: Hex digits of the SHA-256 kept in a folder name (64 bits: collisions are not a concern).
DIGEST_CHARS = 16
#: The file every complete folder holds (transformers' single-file weights).
WEIGHTS = "model.safetensors"
_CHUNK = 1 << 20


def cache_root() -> Path:
    """Where de-quantised models are kept: $SPECVERIFY_CACHE, else ~/.cache/specverify (as the kernels)."""
    return Path(os.environ.get("SPECVERIFY_CACHE") or Path.home() / ".cache" / "specverify")


def content_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def entry_folder(gguf: Path, transformers_version: str) -> Path:
    """The cache folder of a GGUF file's de-quantised model (it may not exist yet)."""
    key = f"{gguf.stat().st_size}-{content_digest(gguf)[:DIGEST_CHARS]}-transformers{transformers_version}"
    return cache_root() / f"{gguf.stem}-{key}"


def is_complete(folder: Path) -> bool:
    """Whether a cache folder is in place (folders appear only complete, by rename)."""
    return (folder / WEIGHTS).is_file()


def write_entry(folder: Path, write: Callable[[Path], None]) -> None:
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
            if not is_complete(folder):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    remove_stale(folder)


def stale_entries(folder: Path) -> list[Path]:
    """The other folders of the same GGUF stem beside `folder` (an entry_folder): any size, digest or
    transformers version, the modification-time keyed folders of earlier versions included; temporary
    folders of writes in progress are not."""
    stem = folder.name.rsplit("-", 3)[0]  # size, digest and transformers version hold no hyphen
    pattern = re.compile(re.escape(stem) + r"-\d+-[0-9a-f]+-transformers[^-]+")
    return sorted(p for p in folder.parent.iterdir() if p != folder and p.is_dir() and pattern.fullmatch(p.name))


def remove_stale(folder: Path) -> None:
    """Remove the stale folders of folder's model. Each is first moved into a temporary folder (a rename:
    no process starts reading a half-removed folder), then deleted; one that another process is removing
    at the same time is left to it."""
    for stale in stale_entries(folder):
        try:
            doomed = Path(tempfile.mkdtemp(prefix=f"{stale.name}.removing-", dir=folder.parent))
        except OSError:  # the cache folder cannot be written now: a later write removes them
            return
        try:
            stale.rename(doomed / stale.name)
        except OSError:  # another process moved it first
            pass
        shutil.rmtree(doomed, ignore_errors=True)
