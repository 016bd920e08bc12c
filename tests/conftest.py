"""What must be a conftest for the whole suite: Triton's interpreter chosen before triton is imported, and the
fixtures tests of several folders use (code_path, each_backend). Helpers live in tests/support."""

from __future__ import annotations

import os

import pytest
import torch

# Triton's interpreter (the triton backend on CPU tensors) must be chosen before triton is first imported
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.support.backends import backend_path, native_available, triton_available


@pytest.fixture(params=["default", "torch-path"])
def code_path(request):
    """Run the test on the default CPU path (compiled kernels where available) and on the torch path."""
    with backend_path("default" if request.param == "default" else "torch"):
        yield request.param


def _backend_params() -> list:
    skip_native = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")
    skip_triton = pytest.mark.skipif(
        not triton_available(),
        reason="needs triton and its interpreter (no CUDA here; on a GPU run python -m specverify.check)",
    )
    return [pytest.param("native", marks=skip_native), "torch", pytest.param("triton", marks=skip_triton)]


@pytest.fixture(params=_backend_params())
def each_backend(request):
    """Run the test on every backend (SPECVERIFY_BACKEND): native, torch and triton (interpreted on the CPU)."""
    with backend_path(request.param):
        yield request.param
