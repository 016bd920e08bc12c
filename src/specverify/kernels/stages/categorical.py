"""Inverse-CDF draws from unnormalised weights with one uniform per row.

The CDF is taken in vocabulary order in two levels, both in float64: block sums locate the block that
holds the draw, then a cumulative sum inside that one block locates the token. Only tokens with positive
weight can be drawn, and the result is always a valid id in [0, V). The walk is the backend's
`sample_rows` (kernels/interface.py); this room gives it the block sums.
"""

from __future__ import annotations

import torch

from ..interface import Ops, block_size


def block_sums(weights: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """Sum of each `block` consecutive weights (None: block_size(V)). weights: float [N, V] -> float64
    [N, ceil(V / block)]."""
    rows, vocab = weights.shape
    block = block or block_size(vocab)
    full_blocks = vocab // block
    sums = weights[:, : full_blocks * block].reshape(rows, full_blocks, block).sum(-1)
    if vocab % block:
        sums = torch.cat([sums, weights[:, full_blocks * block :].sum(-1, keepdim=True)], dim=-1)
    return sums.to(torch.float64)


def total_weight(sums: torch.Tensor) -> torch.Tensor:
    """Each row's total weight from its block sums, added in block order as the draw's walk and the kernels
    add them (a sequential float64 sum, so every path divides by the same bits). float64 [..., blocks] ->
    [...]."""
    return sums.cumsum(-1)[..., -1]


def _last_positive(weights: torch.Tensor) -> torch.Tensor:
    """Index of the last positive entry of each row (0 for a row without one). weights: [N, M] -> int64 [N]."""
    positions = torch.arange(weights.shape[-1], device=weights.device)
    return torch.where(weights > 0, positions, 0).amax(-1)


def _cdf_index(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Smallest i with cumsum(weights)[i] > target, kept on a positive entry. weights: float64 [N, M]."""
    below = (weights.cumsum(-1) <= target.clamp(min=0)[:, None]).sum(-1)
    return torch.minimum(below, _last_positive(weights))


def cdf_walk(weights: torch.Tensor, sums: torch.Tensor, block: int, uniforms: torch.Tensor) -> torch.Tensor:
    """interface.sample_rows in torch ops, for weights of any float dtype and layout: the block by the CDF
    of the block sums, then the token inside that one block, both in float64. weights: float [N, V] (>= 0);
    sums: float64 [N, ceil(V / block)]; uniforms: float64 [N] -> int64 [N]."""
    vocab = weights.shape[-1]
    block_cdf = sums.cumsum(-1)
    target = uniforms * block_cdf[:, -1]
    chosen = _cdf_index(sums, target)
    before = torch.where(chosen > 0, block_cdf.gather(1, (chosen - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    columns = chosen[:, None] * block + torch.arange(block, device=weights.device)
    inside = columns < vocab
    block_weights = torch.where(inside, weights.gather(1, columns.clamp(max=vocab - 1)), 0).to(torch.float64)
    token = chosen * block + _cdf_index(block_weights, target - before)
    return token.clamp(0, vocab - 1)


def sample_from_weights(
    ops: Ops, weights: torch.Tensor, uniforms: torch.Tensor, sums: torch.Tensor | None = None
) -> torch.Tensor:
    """Draw token i with probability weights[i] / sum(weights), using the given uniform for each row.

    weights: float [N, V], >= 0 (need not be normalised); uniforms: float64 [N] in [0, 1);
    sums: the weights' block_sums when already known. Returns int64 [N] in [0, V). A row without
    positive weight (invalid input) returns a valid id. The backend's sample_rows (ops) draws float32
    contiguous weights; others (a draft model's float16 q, a strided view) cdf_walk.
    """
    rows, vocab = weights.shape
    sums = block_sums(weights) if sums is None else sums
    if not rows:
        return torch.zeros(0, dtype=torch.int64, device=weights.device)
    walk = ops.sample_rows if weights.dtype == torch.float32 and weights.is_contiguous() else cdf_walk
    return walk(weights, sums, block_size(vocab), uniforms)
