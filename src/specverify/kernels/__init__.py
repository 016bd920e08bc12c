"""The hot loops, one backend per device, behind one interface: `backend_for(t)` and one function per op.

Backends: `native` (compiled C kernels, CPU tensors), `triton` (Triton kernels, CUDA tensors; CPU tensors
under Triton's interpreter) and `torch` (the reference code in the rooms above, which runs everywhere).
The device of an op's first tensor chooses: CPU -> native, CUDA -> triton, anything else -> torch; where
the chosen backend cannot run (no C compiler, triton not installed) it is reported once by a warning and
torch runs instead. `SPECVERIFY_BACKEND=torch|native|triton` forces one for every op (read at each call,
so tests can switch); an unknown value, or a forced backend that cannot run on the tensors, raises.

The interface (backend.py): `backend_for(t)` is the `Backend` that runs ops on t, and callers ask it what
it declares, never its name: `.compiled` (it runs the ops below; else the caller runs its torch
reference, the `TORCH` backend, which has no ops), `.runs_whole_calls` (`verify_rows` runs a whole
verifier call: every rule and the first rejection in one launch) and `.skips_rows_cheaply` (`weigh_rows`
skips rows with a negative source for free). They then call the op by its name here; `.name` is for
reports (the bench). The op functions below are the interface's signatures and shapes.

Adding a backend: (1) a package kernels/<name>/ with every op of backend.ROW_OPS (and `verify_rows` if
it runs whole calls), same arguments and results as here, and a module-level `BACKEND = Backend(name,
sys.modules[__name__], <its capabilities>)` (checked on import for the ops it declares); (2) a loader
here returning that BACKEND or None (raising where forced and it cannot run), and its line in LOADERS
(the default device choice in `backend_for` if it is to run unforced); (3) its name in tests/conftest.py's
backend list, so that it passes what every backend must: tests/kernels/test_backends.py and tests/core/test_tree.py
(`each_backend`), then the parity and statistics checks of `specverify check` on its device.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType

import torch

from . import native
from .backend import TORCH, Backend
from .native import FROM_RESIDUAL, FROM_TARGET, WITHOUT_DRAFT

__all__ = [
    "BACKENDS",
    "FROM_RESIDUAL",
    "FROM_TARGET",
    "HOLDS_ABOVE_MINUS_INF",
    "HOLDS_NAN_OR_INF",
    "TORCH",
    "WITHOUT_DRAFT",
    "Backend",
    "argmax_rows",
    "backend_for",
    "draw_rows",
    "draw_sampled_verdicts",
    "draw_verdicts",
    "forced",
    "recover_kept_rows",
    "recover_rows",
    "relaxed_rows",
    "sample_rows",
    "scan_rows",
    "verify_rows",
    "weigh_rows",
]

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
    device), else the device's (CPU: native, CUDA: triton) where it can run, else TORCH."""
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


def _ops(tensor: torch.Tensor) -> ModuleType:
    """The ops of the compiled backend for this tensor; raises where the torch reference runs."""
    ops = backend_for(tensor).ops
    if ops is None:
        raise RuntimeError(
            "no compiled backend runs on this tensor: call the torch reference (see backend_for(t).compiled)"
        )
    return ops


def weigh_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    out: torch.Tensor,
    source: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each row's truncated weights exp((x - max x) / T), zero outside its kept set (SPEC §2; one-hot at the
    argmax for rows with T < greedy_below), written into `out`; returns the sums of each `block` consecutive
    kept weights. logits: float [M, V] (float32, bfloat16 or float16, read as they are); out: contiguous
    float32 [N, V]; params [N] -> float64 [N, ceil(V / block)]. source: int64 [N] or None, the logits row
    each output row weighs (None: row r, M = N); a negative one is skipped: zero sums, weights undefined
    (free where the backend `skips_rows_cheaply`, else weighed as row 0 and its sums zeroed)."""
    return _ops(logits).weigh_rows(logits, temperature, greedy_below, top_k, top_p, min_p, rtol, block, out, source)


def draw_rows(
    logits: torch.Tensor,
    per_position: int,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    seeds: torch.Tensor,
    salt: int,
    draft: torch.Tensor | None = None,
    accept_salt: int = 0,
    dense: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """Where `backend_for(logits).draws_rows`: the keyed target draw from p~ (SPEC §2, §4) of every row of
    a chain call, the tokens `sample_rows` gives on `weigh_rows`' weights, without writing the weights out.
    logits: float [B * per_position, V], row b * per_position + j weighed with request b's params [B] and
    drawn with the uniform of key seeds[b] + j (int64 [B]) and `salt` (rng.stream_salt) -> int64 [R].
    With draft (int64 [B, per_position - 1], -1: none), accept_salt (the ratio test's stream) and dense
    (float32 [R, V], written where a kept set is too large to hold sparsely), for sampled mode: (tokens [R],
    each draft token's weight float32 [B, per_position - 1], the ratio test's uniforms float64
    [B, per_position - 1], block sums float64 [R, ceil(V / block)], the kept weights for recover_kept_rows)."""
    return _ops(logits).draw_rows(
        logits,
        per_position,
        temperature,
        greedy_below,
        top_k,
        top_p,
        min_p,
        rtol,
        block,
        seeds,
        salt,
        draft,
        accept_salt,
        dense,
    )


def draw_verdicts(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    seed: int | torch.Tensor,
    shared: bool,
    salt: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where `backend_for(logits).draws_rows`: the argmax-mode verdicts of a chain call (SPEC §3.1, §3.3) in
    one kernel call, draw_rows' keyed draws y of logits [B, K + 1, V] and the first rejection among the
    drafts as given, int [B, K] (an id outside [0, V) and everything after it is padding). seed: int64 [B]
    per request, or (shared) an int or int64 [] for the batch, request b keyed by s + b * ROW_STRIDE ->
    (first rejected index int64 [B], recovered int64 [B, K], bonus int64 [B, 1])."""
    return _ops(logits).draw_verdicts(
        logits, draft_tokens, temperature, greedy_below, top_k, top_p, min_p, rtol, block, seed, shared, salt
    )


def draw_sampled_verdicts(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    seed: int | torch.Tensor,
    shared: bool,
    salts: tuple[int, int, int],
    draft_probs: torch.Tensor,
    dense: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where `backend_for(logits).draws_rows`: the sampled-mode verdicts of a chain call (SPEC §3.2) in one
    kernel call, draw_rows' draws of logits [B, K + 1, V], the ratio test of the drafts as given (int
    [B, K]: an id outside [0, V) and everything after it is padding) against draft_probs float [B, K, V],
    the recovery of recover_kept_rows and the first rejection. seed as in draw_verdicts; salts: the
    streams' (target, accept, residual); dense: float32 [B, K + 1, V] of room -> (first rejected index
    int64 [B], recovered int64 [B, K], bonus int64 [B, 1])."""
    return _ops(logits).draw_sampled_verdicts(
        logits,
        draft_tokens,
        temperature,
        greedy_below,
        top_k,
        top_p,
        min_p,
        rtol,
        block,
        seed,
        shared,
        salts,
        draft_probs,
        dense,
    )


def recover_kept_rows(
    kept: tuple,
    weight_sums: torch.Tensor,
    mass: torch.Tensor,
    draft_probs: torch.Tensor,
    draft: torch.Tensor,
    mode: torch.Tensor,
    seeds: torch.Tensor,
    salt: int,
    block: int,
) -> torch.Tensor:
    """recover_rows (SPEC §3.2) on the weights draw_rows kept, and their block sums float64
    [B * (K + 1), blocks]; the uniform of position j of request b keyed by seeds[b] + j and `salt`.
    mass: float64 [B, K]; draft_probs: float [B, K, V]; draft: int64 [B, K]; mode: int [B, K] -> int64 [B, K]."""
    return _ops(draft_probs).recover_kept_rows(kept, weight_sums, mass, draft_probs, draft, mode, seeds, salt, block)


def argmax_rows(values: torch.Tensor) -> torch.Tensor:
    """First argmax per row, NaN never winning. values: float [N, V] -> int64 [N]."""
    return _ops(values).argmax_rows(values)


#: Flags of scan_rows.
HOLDS_NAN_OR_INF, HOLDS_ABOVE_MINUS_INF = 1, 2


def scan_rows(values: torch.Tensor, in_use: torch.Tensor | None = None) -> torch.Tensor:
    """The value checks of logits (SPEC §6) in one streaming pass: per row in use, HOLDS_NAN_OR_INF if it
    holds NaN or +inf, | HOLDS_ABOVE_MINUS_INF if it holds a value other than -inf; 0 for a row not in use.
    values: float [N, V] (float32, bfloat16 or float16, read as they are); in_use: bool [N] or None
    (every row) -> uint8 [N]."""
    return _ops(values).scan_rows(values, in_use)


def sample_rows(weights: torch.Tensor, sums: torch.Tensor, block: int, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row. weights: contiguous float32 [N, V] (>= 0); sums: float64 [N, ceil(V / block)],
    their block sums; uniforms: float64 [N] -> int64 [N]."""
    return _ops(weights).sample_rows(weights, sums, block, uniforms)


def recover_rows(
    weights: torch.Tensor,
    weight_sums: torch.Tensor,
    mass: torch.Tensor,
    draft_probs: torch.Tensor,
    draft: torch.Tensor,
    mode: torch.Tensor,
    uniforms: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """The recovery draw of sampled verification at each drafted position (SPEC §3.2), the residual never
    materialised. weights: float32 [B, P, V] with P >= K (unnormalised p~), weight_sums: float64
    [B, P, ceil(V / block)]; mass: float64 [B, K]; draft_probs: float [B, K, V]; draft: int64 [B, K];
    mode: int [B, K] (FROM_TARGET, FROM_RESIDUAL or WITHOUT_DRAFT); uniforms: float64 [B, K] -> int64 [B, K]."""
    return _ops(weights).recover_rows(weights, weight_sums, mass, draft_probs, draft, mode, uniforms, block)


def relaxed_rows(logits: torch.Tensor, draft: torch.Tensor, k: int, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The relaxed acceptance (SPEC §3.4) at each drafted position, and each position's top-1 token.
    logits: float [B, P, V] with P >= K, masked; draft: int64 [B, K] (-1: none) -> (bool [B, K], int64 [B, K])."""
    return _ops(logits).relaxed_rows(logits, draft, k, delta)


def verify_rows(
    draft: torch.Tensor, logits: torch.Tensor, *arguments
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A whole verifier call for checked arguments, where `backend_for(logits).runs_whole_calls`; the
    arguments and shapes are those of kernels/triton.verify_rows. Returns (first_rejected_idx [B],
    recovered [B, K], bonus [B, 1])."""
    return _ops(logits).verify_rows(draft, logits, *arguments)
