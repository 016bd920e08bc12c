"""The truncated target distribution p~ (SPEC §2) and the plain sampler on the verifier's keys (SPEC §4).

Internally every distribution is carried as unnormalised weights `exp((x - max x) / T)`, whose largest
entry is exactly 1: top-k, top-p and min-p are thresholds on these weights (ties kept), so p~ is the
weights at or above the highest of the three thresholds, renormalised. Greedy rows are one-hot at their
argmax. The weights and their thresholds are the backend's `weigh_rows` (kernels/interface.py): one
kernel per row where a compiled backend runs (C on the CPU, Triton on CUDA), torch ops without a
full-vocabulary sort in the torch reference.
"""

from __future__ import annotations

import torch

from . import checks, kernels
from .bitmask import apply_bitmask, num_words
from .kernels.stages.categorical import sample_from_weights, total_weight
from .kernels.stages.weights import keyed_draws_read, truncated_weights
from .rng import (
    HOST_KEYS,
    STREAM_TARGET,
    keyed_uniform,
    per_row_seeds,
)


def _prepare(
    logits: object,
    temperature: object,
    top_k: object,
    top_p: object,
    min_p: object,
    token_bitmask: object,
    validate: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, tuple | None]:
    """Check the arguments of truncated_probs / sample and mask the logits -> (masked [N, V], params...,
    the params read to the host as lists where the value checks read them (checks.host_values), else None)."""
    checks.check_tensor("logits", logits, checks.FLOAT_DTYPES, "a float32, float16 or bfloat16 tensor [N, V]")
    if logits.dim() != 2 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape [N, V] with V >= 1 (got {list(logits.shape)})")
    rows, vocab = logits.shape
    device = logits.device
    temperature, top_k, top_p, min_p = checks.check_sampling_params(
        temperature, top_k, top_p, min_p, rows, device, "[N]"
    )
    if token_bitmask is not None:
        checks.check_tensor("token_bitmask", token_bitmask, (torch.int32,), "an int32 tensor [N, ceil(V/32)]")
        checks.check_shape("token_bitmask", token_bitmask, (rows, num_words(vocab)), "[N, ceil(V/32)]")
    checks.check_same_device({"token_bitmask": token_bitmask}, device, "logits")
    masked = logits if token_bitmask is None else apply_bitmask(logits, token_bitmask)
    host = checks.host_values(temperature, top_k, top_p, min_p) if validate else None
    if validate:
        checks.check_finite_logits("logits", logits, some_finite=token_bitmask is None)
        checks.check_sampling_values(temperature, top_k, top_p, min_p, host)
        if token_bitmask is not None:
            checks.check_some_allowed("token_bitmask", masked)
    return masked, temperature, top_k, top_p, min_p, host


def truncated_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
    token_bitmask: torch.Tensor | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """The truncated target distribution p~ of SPEC §2, one row per logits row.

    logits: float32/float16/bfloat16 [N, V]; temperature, top_p, min_p: float [N]; top_k: int [N]
    (<= 0 means no limit); token_bitmask: int32 [N, ceil(V/32)] or None. Per-row parameters may also be
    given as Python numbers, which apply to every row.
    Returns float32 [N, V], each row summing to 1. Greedy rows (temperature < 1e-5) are one-hot at the
    argmax of the masked logits (lowest index on ties), which is what the verifier commits for them.
    """
    masked, temperature, top_k, top_p, min_p, _ = _prepare(
        logits, temperature, top_k, top_p, min_p, token_bitmask, validate
    )
    weights, sums = truncated_weights(kernels.ops_for(masked), masked, temperature, top_k, top_p, min_p)
    return weights / total_weight(sums)[:, None].float()  # the total the sampled rule divides by too


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: int | torch.Tensor,
    min_p: torch.Tensor | None = None,
    token_bitmask: torch.Tensor | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """Plain (non-speculative) sampling of one token per row from p~, on the verifier's keys (SPEC §4).

    logits: float [N, V]; parameters as in `truncated_probs`; seed: int or 0-d/[1] integer tensor shared
    by the batch (row n uses s + n * 0x9E3779B97F4A7C15), or int [N] per row. Row n's draw is keyed by
    (s_n, target stream), so `sample(logits, ..., seed=request_seed(base, n))` for the n-th generated token
    gives exactly the tokens the verifier commits in argmax mode with per-request seed
    request_seed(base, tokens generated).
    Returns int64 [N]; greedy rows return the argmax.
    """
    masked, temperature, top_k, top_p, min_p, host = _prepare(
        logits, temperature, top_k, top_p, min_p, token_bitmask, validate
    )
    rows = masked.shape[0]
    seed, shared = checks.check_seed(seed, rows, masked.device, layout="[N]")
    if host is not None and rows <= HOST_KEYS:
        draws = keyed_draws_read(
            kernels.ops_for(masked), masked, (temperature, top_k, top_p, min_p), host[0], (seed, shared)
        )
        return torch.tensor(draws, dtype=torch.int64)
    seeds = per_row_seeds(seed, shared, rows, masked.device)
    ops = kernels.ops_for(masked)
    weights, sums = truncated_weights(ops, masked, temperature, top_k, top_p, min_p)
    return sample_from_weights(ops, weights, keyed_uniform(seeds, STREAM_TARGET), sums)
