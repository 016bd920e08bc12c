"""The stages every backend's whole calls share (SPEC §2): a call's truncated target weights p~ and the
keyed draws from them, over the backend's per-row ops (kernels/interface.py).

Every distribution is carried as unnormalised weights `exp((x - max x) / T)`, whose largest entry is
exactly 1: top-k, top-p and min-p are thresholds on these weights (ties kept), so p~ is the weights at or
above the highest of the three thresholds, renormalised. Greedy rows are one-hot at their argmax.
"""

from __future__ import annotations

import threading

import torch

from ...contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from ...rng import STREAM_TARGET, row_seeds_read, row_uniforms_read
from ..interface import Ops, block_size
from .categorical import sample_from_weights


def is_greedy(temperature: torch.Tensor) -> torch.Tensor:
    """temperature: float [N] -> bool [N]."""
    return temperature < GREEDY_TEMPERATURE


#: GREEDY_TEMPERATURE as the float32 torch compares a float32 temperature with.
_GREEDY_BELOW_FLOAT32 = float(torch.tensor(GREEDY_TEMPERATURE, dtype=torch.float32))


def is_greedy_value(temperature: float) -> bool:
    """is_greedy of one float32 temperature read to the host, compared in float32 as torch compares it."""
    return temperature < _GREEDY_BELOW_FLOAT32


def greedy_tokens(ops: Ops, masked_logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim, lowest index on ties, NaN never wins. [..., V] -> int64 [...]."""
    if not masked_logits.numel():
        return torch.zeros(masked_logits.shape[:-1], dtype=torch.int64, device=masked_logits.device)
    rows = masked_logits.reshape(-1, masked_logits.shape[-1])
    return ops.argmax_rows(rows).view(masked_logits.shape[:-1])


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


def truncated_weights(
    ops: Ops,
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
    id), at next to no cost in the C kernels; None: row n is logits row n (M = N).
    The weights live in this thread's scratch buffer: use them before the next call. The backend's
    weigh_rows (kernels/interface.py) does it all."""
    rows, vocab = masked_logits.shape[0] if source is None else source.shape[0], masked_logits.shape[-1]
    out = scratch_weights(torch.Size((rows, vocab)), masked_logits.device)
    block = block_size(vocab)
    if not rows:
        return out, torch.zeros(0, -(-vocab // block), dtype=torch.float64, device=masked_logits.device)
    sums = ops.weigh_rows(
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


def per_position_rows(value: torch.Tensor | None, per_position: int) -> torch.Tensor | None:
    """A per-row parameter [R] repeated for each of a row's positions -> [R * per_position] (None stays None)."""
    return value if value is None or per_position == 1 else value.repeat_interleave(per_position)


def keyed_draws_read(
    ops: Ops,
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
        return greedy_tokens(ops, masked_logits).tolist()
    params = tuple(per_position_rows(p, per_position) for p in params)
    weights, sums = truncated_weights(ops, masked_logits, *params)
    uniforms = row_uniforms_read(row_seeds_read(*seed, len(temperatures)), per_position, STREAM_TARGET)
    return sample_from_weights(ops, weights, torch.tensor(uniforms, dtype=torch.float64), sums).tolist()
