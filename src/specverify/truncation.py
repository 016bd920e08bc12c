"""The truncated target distribution p~ (SPEC §2) and the plain sampler on the verifier's keys (SPEC §4).

Internally every distribution is carried as unnormalised weights `exp((x - max x) / T)`, whose largest
entry is exactly 1: top-k, top-p and min-p are thresholds on these weights (ties kept), so p~ is the
weights at or above the highest of the three thresholds, renormalised. Greedy rows are one-hot at their
argmax. The weights and their thresholds are the backend's `weigh_rows` (kernels/interface.py): one
kernel per row where a compiled backend runs (C on the CPU, Triton on CUDA), torch ops without a
full-vocabulary sort in the torch reference.
"""

from __future__ import annotations

import threading

import torch

from . import checks, kernels
from .bitmask import apply_bitmask, num_words
from .categorical import block_size, sample_from_weights, total_weight
from .rng import (
    HOST_KEYS,
    STREAM_ACCEPT,
    STREAM_TARGET,
    keyed_uniform,
    per_row_seeds,
    row_seeds_read,
    row_uniforms_read,
    stream_salt,
)

#: Rows with temperature below this are greedy (SPEC §3.3).
GREEDY_TEMPERATURE = 1e-5
#: Boundaries given as fractions (top_p's mass, min_p's ratio) are met within this relative float32
#: rounding, so that a token exactly on the boundary in exact arithmetic is kept (SPEC §2 steps 4-5).
BOUNDARY_RTOL = 1e-6


def is_greedy(temperature: torch.Tensor) -> torch.Tensor:
    """temperature: float [N] -> bool [N]."""
    return temperature < GREEDY_TEMPERATURE


#: GREEDY_TEMPERATURE as the float32 torch compares a float32 temperature with.
_GREEDY_BELOW_FLOAT32 = float(torch.tensor(GREEDY_TEMPERATURE, dtype=torch.float32))


def is_greedy_value(temperature: float) -> bool:
    """is_greedy of one float32 temperature read to the host, compared in float32 as torch compares it."""
    return temperature < _GREEDY_BELOW_FLOAT32


def greedy_tokens(masked_logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim, lowest index on ties, NaN never wins. [..., V] -> int64 [...]."""
    if not masked_logits.numel():
        return torch.zeros(masked_logits.shape[:-1], dtype=torch.int64, device=masked_logits.device)
    rows = masked_logits.reshape(-1, masked_logits.shape[-1])
    return kernels.ops_for(rows).argmax_rows(rows).view(masked_logits.shape[:-1])


_workspace = threading.local()


def scratch_weights(shape: torch.Size, device: torch.device) -> torch.Tensor:
    """A float32 buffer of `shape`, reused across calls on this thread: a fresh full-size allocation costs
    more in page faults than the arithmetic written into it. Valid until the next call on this thread. The
    view of the last shape asked is kept too: a call of that shape again takes no torch op."""
    weights = getattr(_workspace, "weights", None)
    if weights is not None and weights.shape == shape and weights.device == device:
        return weights
    numel = shape.numel()
    buffer = getattr(_workspace, "buffer", None)
    with torch.inference_mode(False):  # normal tensors, usable in and out of inference mode
        if buffer is None or buffer.numel() < numel or buffer.device != device:
            buffer = _workspace.buffer = torch.empty(numel, dtype=torch.float32, device=device)
        weights = _workspace.weights = buffer[:numel].view(shape)
    return weights


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


def truncated_weights(
    masked_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    source: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalised p~ for checked arguments. masked_logits: [M, V]; params [N] ->
    (float32 weights [N, V], float64 block sums [N, ceil(V / block)]). Greedy rows are one-hot at their
    argmax (lowest index on ties, NaN never wins), so that drawing from them commits what the greedy rule
    does. source: int64 [N], the logits row of each output row, read in place where the backend can (no
    gathered copy); a negative one is skipped (zero sums, weights undefined: a draw from it gives a valid
    id), at next to no cost where the backend `skips_rows_cheaply`; None: row n is logits row n (M = N).
    The weights live in this thread's scratch buffer: use them before the next call. The backend's
    weigh_rows (kernels/interface.py) does it all."""
    rows, vocab = masked_logits.shape[0] if source is None else source.shape[0], masked_logits.shape[-1]
    out = scratch_weights(torch.Size((rows, vocab)), masked_logits.device)
    block = block_size(vocab)
    if not rows:
        return out, torch.zeros(0, -(-vocab // block), dtype=torch.float64, device=masked_logits.device)
    sums = kernels.ops_for(masked_logits).weigh_rows(
        masked_logits.detach(),
        temperature,
        GREEDY_TEMPERATURE,
        top_k,
        top_p,
        min_p,
        BOUNDARY_RTOL,
        block,
        out,
        source,
    )
    return out, sums


def target_draws(
    masked_logits: torch.Tensor,
    per_position: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor,
    draft: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """The keyed target draws y from p~ of every row of a chain call, where the backend `draws_rows`
    (kernels.draw_rows): the tokens that truncated_weights and sample_from_weights give, the weights never
    written out. masked_logits: [B * per_position, V], row b * per_position + j keyed by seeds[b] + j
    (STREAM_TARGET); params and seeds (int64): per request [B] -> int64 [B * per_position]. With draft
    (int64 [B, per_position - 1], -1: none), sampled mode: also the draft tokens' weights, the ratio test's
    uniforms (STREAM_ACCEPT), the block sums and the kept weights for kernels.recover_kept_rows (a dense
    part may live in this thread's scratch buffer: use it before the next call)."""
    vocab = masked_logits.shape[-1]
    dense = None if draft is None else scratch_weights(masked_logits.shape, masked_logits.device)
    return kernels.ops_for(masked_logits).draw_rows(
        masked_logits.detach(),
        per_position,
        temperature,
        GREEDY_TEMPERATURE,
        top_k,
        top_p,
        min_p,
        BOUNDARY_RTOL,
        block_size(vocab),
        seeds,
        stream_salt(STREAM_TARGET),
        draft,
        stream_salt(STREAM_ACCEPT),
        dense,
    )


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
    weights, sums = truncated_weights(masked, temperature, top_k, top_p, min_p)
    return weights / total_weight(sums)[:, None].float()  # the total the sampled rule divides by too


def per_position_rows(value: torch.Tensor | None, per_position: int) -> torch.Tensor | None:
    """A per-row parameter [R] repeated for each of a row's positions -> [R * per_position] (None stays None)."""
    return value if value is None or per_position == 1 else value.repeat_interleave(per_position)


def keyed_draws_read(
    masked_logits: torch.Tensor,
    params: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    temperatures: list[float],
    seed: tuple[int | torch.Tensor, bool],
    per_position: int = 1,
) -> list[int]:
    """The keyed draws from p~ of a small batch on the CPU whose values were read to the host (a checking
    call): the tokens `sample`, and the verifier in argmax mode, commit, with the bookkeeping on Python
    lists (at such sizes each torch op costs more than the rows). masked_logits: [N, V] CPU, N = B *
    per_position, row n = b * per_position + j keyed by s_b + j (STREAM_TARGET); params: the B requests'
    checked temperature, top_k, top_p, min_p [B]; temperatures: the temperatures as a list; seed: the
    checked seed and whether it is shared. -> N token ids.
    An all-greedy batch takes one argmax per row (what its one-hot p~ commits); else every row goes through
    truncated_weights and one draw."""
    if all(is_greedy_value(t) for t in temperatures):
        return greedy_tokens(masked_logits).tolist()
    params = tuple(per_position_rows(p, per_position) for p in params)
    weights, sums = truncated_weights(masked_logits, *params)
    uniforms = row_uniforms_read(row_seeds_read(*seed, len(temperatures)), per_position, STREAM_TARGET)
    return sample_from_weights(weights, torch.tensor(uniforms, dtype=torch.float64), sums).tolist()


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
        draws = keyed_draws_read(masked, (temperature, top_k, top_p, min_p), host[0], (seed, shared))
        return torch.tensor(draws, dtype=torch.int64)
    seeds = per_row_seeds(seed, shared, rows, masked.device)
    weights, sums = truncated_weights(masked, temperature, top_k, top_p, min_p)
    return sample_from_weights(weights, keyed_uniform(seeds, STREAM_TARGET), sums)
