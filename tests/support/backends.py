"""Which of specverify's backends (and whether a CUDA device) can run here, and a block that forces one
(SPECVERIFY_BACKEND); the backend fixtures of tests/conftest.py are built on them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
import torch

#: Whether a CUDA device is here (the CUDA tests skip without one).
HAS_CUDA = torch.cuda.is_available()


def native_available() -> bool:
    """Whether specverify's compiled CPU kernels are in use (else the CPU runs the torch path as well)."""
    from specverify.kernels import native

    return native.load() is not None


def triton_available() -> bool:
    """Whether the Triton kernels can run on CPU tensors here: triton installed and its interpreter chosen
    (TRITON_INTERPRET=1, set by tests/conftest.py where there is no CUDA device; on a GPU machine the kernels
    are checked on CUDA tensors by `python -m specverify.check` instead)."""
    try:
        import triton  # noqa: F401 - imported to learn whether it can be
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def backend_path(name: str) -> Iterator[None]:
    """Inside the block specverify runs every op on the named backend ("torch", "native" or "triton",
    SPECVERIFY_BACKEND); "default" leaves the choice to the device."""
    with pytest.MonkeyPatch.context() as patch:
        if name == "default":
            patch.delenv("SPECVERIFY_BACKEND", raising=False)
        else:
            patch.setenv("SPECVERIFY_BACKEND", name)
        yield


def torch_path():
    """Inside the block specverify runs its torch reference implementation on the CPU too, instead of the
    compiled CPU kernels."""
    return backend_path("torch")
