"""The key-value metadata at the head of a GGUF file, read without its tensors or its large arrays.

`gguf.GGUFReader` (gguf 0.19, which has no metadata-only reader) maps the whole file and builds a numpy
view of every element of every array and every tensor's info: ~10 s on the 98 MB SmolLM2 file, most of
it the tokenizer's 49k-string arrays. Checking a prompt against the model's context before its weights
load needs two values, so this reads the header as llama.cpp's docs/gguf.md lays it out (versions 2 and
3, either byte order):

    uint32 magic "GGUF" · uint32 version · uint64 tensor count · uint64 key-value count ·
    then each key-value: string key, uint32 value type (`gguf.GGUFValueType`), value

where a string is a uint64 byte length and UTF-8 bytes, and an array a uint32 element type, a uint64
count and the elements. Values of keys not asked for are skipped (a fixed-size array in one seek), and
reading stops once every key asked for is found, before the tensor infos.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


@functools.cache
def _scalars() -> dict[int, str]:
    """The struct code of each fixed-size value type (strings and arrays are read by `_Header`). gguf (the
    demo extra) is imported when a header is first read, so importing this module, and with it
    `specverify.decoding`, needs no extra."""
    from gguf.constants import GGUFValueType

    return {
        GGUFValueType.UINT8: "B",
        GGUFValueType.INT8: "b",
        GGUFValueType.UINT16: "H",
        GGUFValueType.INT16: "h",
        GGUFValueType.UINT32: "I",
        GGUFValueType.INT32: "i",
        GGUFValueType.FLOAT32: "f",
        GGUFValueType.BOOL: "?",
        GGUFValueType.UINT64: "Q",
        GGUFValueType.INT64: "q",
        GGUFValueType.FLOAT64: "d",
    }


class _Header:
    """A GGUF file's header read in order from an open binary file; `order` is struct's byte order."""

    def __init__(self, file: BinaryIO, path: Path):
        from gguf.constants import GGUF_MAGIC, GGUFValueType
        from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

        self._file, self._path = file, path
        self._types, self._scalars = GGUFValueType, _scalars()
        magic, version = struct.unpack("<II", self._read(8))
        if magic != GGUF_MAGIC:
            raise ValueError(f"{str(path)!r} is not a GGUF file (its first bytes are not 'GGUF')")
        self.order = "<"
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in READER_SUPPORTED_VERSIONS:
            raise ValueError(f"{str(path)!r} is GGUF version {version}; readable: {READER_SUPPORTED_VERSIONS}")
        self.tensor_count, self.kv_count = self._unpack("QQ")

    def _read(self, size: int) -> bytes:
        data = self._file.read(size)
        if len(data) != size:
            raise ValueError(f"{str(self._path)!r} ends inside its GGUF header")
        return data

    def _unpack(self, codes: str) -> tuple:
        layout = struct.Struct(self.order + codes)
        return layout.unpack(self._read(layout.size))

    def string(self) -> str:
        (size,) = self._unpack("Q")
        return self._read(size).decode("utf-8", errors="replace")

    def key_value(self, wanted: Callable[[str], bool]) -> tuple[str, bool, object]:
        """The next key-value -> (key, whether wanted accepts it, its value: None when not)."""
        key = self.string()
        (kind,) = self._unpack("I")
        keep = wanted(key)
        return key, keep, self.value(kind, keep)

    def value(self, kind: int, keep: bool):
        """The next value, of value type `kind`: decoded when keep, else skipped (None)."""
        scalars = self._scalars
        if kind in scalars:
            code = scalars[kind]
            if keep:
                return self._unpack(code)[0]
            self._file.seek(struct.calcsize(code), 1)
            return None
        if kind == self._types.STRING:
            if keep:
                return self.string()
            self._file.seek(self._unpack("Q")[0], 1)
            return None
        if kind == self._types.ARRAY:
            item, count = self._unpack("IQ")
            if not keep and item in scalars:
                self._file.seek(count * struct.calcsize(scalars[item]), 1)
                return None
            values = [self.value(item, keep) for _ in range(count)]
            return values if keep else None
        raise ValueError(f"{str(self._path)!r} holds a GGUF value of unknown type {kind}")


def read_metadata(
    path: str | Path,
    wanted: Callable[[str], bool] = lambda key: True,
    done: Callable[[dict], bool] | None = None,
) -> dict:
    """The key-values of a GGUF file's header whose key `wanted` accepts (all by default), without the
    tensors: {key: value}, a value being an int, float, bool, str or list. Reading stops after the last
    key-value, or as soon as done(values found so far) is true. Raises ValueError for a file that is not
    GGUF version 2 or 3, or ends inside its header."""
    path = Path(path)
    values: dict = {}
    with open(path, "rb") as file:
        header = _Header(file, path)
        for _ in range(header.kv_count):
            key, keep, value = header.key_value(wanted)
            if keep:
                values[key] = value
                if done is not None and done(values):
                    break
    return values


def context_length(path: str | Path) -> int | None:
    """The training context of a GGUF model, `<general.architecture>.context_length` (what llama.cpp
    reads as n_ctx_train and transformers as the config's max_position_embeddings), or None if the
    header has none."""
    from gguf.constants import Keys

    architecture = Keys.General.ARCHITECTURE

    def key(values: dict) -> str | None:
        return Keys.LLM.CONTEXT_LENGTH.format(arch=values[architecture]) if architecture in values else None

    values = read_metadata(
        path,
        wanted=lambda k: k == architecture or k.endswith(".context_length"),
        done=lambda found: key(found) in found,
    )
    length = values.get(key(values))
    return int(length) if isinstance(length, int) and not isinstance(length, bool) else None
