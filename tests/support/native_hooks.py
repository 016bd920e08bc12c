"""The test hooks of the compiled CPU kernels (kernels.c): a setting held for a block, a counter read and
reset, and torch's thread count (the kernels' OpenMP team) for a block."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import torch

from specverify.kernels import native


@contextlib.contextmanager
def hook_set(name: str, value: int, default: int) -> Iterator[None]:
    """Inside the block the kernels' setting hook `name` holds `value`; `default` after it."""
    hook = getattr(native.load(), name)
    hook(ctypes.c_uint64(value))
    try:
        yield
    finally:
        hook(ctypes.c_uint64(default))


def read_count(name: str) -> int:
    """The kernels' counter hook `name`: its count since the last read (the read resets it)."""
    count = getattr(native.load(), name)
    count.restype = ctypes.c_int64
    return int(count())


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Inside the block torch (and the kernels' OpenMP team) runs on `count` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
