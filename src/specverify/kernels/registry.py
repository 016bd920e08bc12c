"""The registry of backends: which one runs on a tensor (`backend_for`, `ops_for`), and forcing one."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Iterator

import torch

from . import native, reference
from .backend import Backend
from .interface import Ops

#: The torch reference backend: runs on every device, and wherever a compiled one cannot.
TORCH = reference.BACKEND


ENVIRONMENT = "SPECVERIFY_BACKEND"


@contextlib.contextmanager
def forced(name: str | None) -> Iterator[None]:
    """Inside the block, SPECVERIFY_BACKEND is `name` (None: left as it is); restored afterwards."""
    if name is None:
        yield
        return
    saved = os.environ.get(ENVIRONMENT)
    os.environ[ENVIRONMENT] = name
    try:
        yield
    finally:
        if saved is None:
            del os.environ[ENVIRONMENT]
        else:
            os.environ[ENVIRONMENT] = saved


@functools.cache
def _triton_backend(interpreted: bool) -> Backend | None:
    """The Triton backend (triton/), imported on first use; None (with a one-time warning) where triton
    cannot be imported. interpreted: the caller needs Triton's interpreter (CPU tensors), which Triton
    only offers when TRITON_INTERPRET=1 is set before it is first imported: it is set here when triton is
    not imported yet, and a RuntimeError says so when it was imported without it.
    The setting stays for the whole process; it cannot be scoped to specverify's calls: triton binds its
    own language functions to the interpreter when it is imported (setting the variable after that, or
    unsetting it after our kernels are decorated, makes every interpreted launch fail with "Cannot call
    @triton.jit'd outside of the scope of a kernel", triton 3.7), and the interpret knob it reads at each
    launch is process-wide, not per thread. The interpreter is a testing mode (CPU tensors forced to
    triton); a process that runs Triton on a GPU never sets it."""
    if interpreted and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise RuntimeError(
                f"{ENVIRONMENT}=triton on CPU tensors runs Triton's interpreter, which needs TRITON_INTERPRET=1 "
                "set before triton is first imported (triton was imported without it in this process)"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from . import triton as package
    except ImportError as error:
        if not interpreted:
            warnings.warn(
                f"specverify: the Triton kernels are unavailable ({error}); CUDA tensors run the torch reference "
                "path instead (correct, but slower). Fix: pip install triton; or set SPECVERIFY_BACKEND=torch to "
                "choose that path and silence this warning.",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    return package.BACKEND


def _native(device: torch.device | None) -> Backend | None:
    """The native backend where its kernels are built, else None (native.load warned once). device: where
    it was forced to run (SPECVERIFY_BACKEND=native), raising where it cannot; None: chosen by default."""
    if device is not None and device.type != "cpu":
        raise RuntimeError(f"{ENVIRONMENT}=native runs on CPU tensors only (got a tensor on {device})")
    if native.load() is None:
        if device is not None:
            raise RuntimeError(
                f"{ENVIRONMENT}=native, but the compiled CPU kernels are unavailable: {native.unavailable_because}"
            )
        return None
    return native.BACKEND


def _triton(device: torch.device | None) -> Backend | None:
    """The Triton backend where its kernels import, else None (warned once). device: where it was forced
    to run (SPECVERIFY_BACKEND=triton: CUDA, or CPU interpreted), raising where it cannot; None: chosen by
    default for a CUDA tensor."""
    if device is None:
        return _triton_backend(False)
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(
            f"{ENVIRONMENT}=triton runs on CUDA tensors (and CPU ones, interpreted) (got a tensor on {device})"
        )
    if importlib.util.find_spec("triton") is None:  # (not imported here: on CPU tensors it needs the interpreter first)
        raise RuntimeError(f"{ENVIRONMENT}=triton, but triton is not installed; pip install triton")
    loaded = _triton_backend(device.type == "cpu")
    if loaded is None:
        raise RuntimeError(f"{ENVIRONMENT}=triton, but specverify's Triton kernels could not be imported")
    return loaded


#: The registry: every backend by name (the values of SPECVERIFY_BACKEND), with its loader.
LOADERS: dict[str, Callable[[torch.device | None], Backend | None]] = {
    "torch": lambda device: TORCH,
    "native": _native,
    "triton": _triton,
}
BACKENDS = tuple(LOADERS)


def backend_for(tensor: torch.Tensor) -> Backend:
    """The backend that runs ops on this tensor: the forced one (SPECVERIFY_BACKEND, checked to run on its
    device), else the device's (CPU: native, CUDA: triton) where it can run, else the torch reference."""
    forced = os.environ.get(ENVIRONMENT, "").strip()
    if forced:
        if forced not in LOADERS:
            raise ValueError(f"{ENVIRONMENT} must be one of {', '.join(BACKENDS)} (got {forced!r})")
        return LOADERS[forced](tensor.device)
    if tensor.is_cpu:  # (is_cpu and is_cuda cost less than building a torch.device)
        return _native(None) or TORCH
    if tensor.is_cuda:
        return _triton(None) or TORCH
    return TORCH


def ops_for(tensor: torch.Tensor) -> Ops:
    """The ops (interface.Ops) of the backend that runs on this tensor: backend_for(tensor).ops."""
    return backend_for(tensor).ops
