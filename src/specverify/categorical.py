"""Inverse-CDF draws from unnormalised weights with one uniform per row.

The CDF is taken in vocabulary order in two levels, both in float64: block sums locate the block that
holds the draw, then a cumulative sum inside that one block locates the token. Only tokens with positive
weight can be drawn, and the result is always a valid id in [0, V). Compiled backends (kernels/) make the
same walk; the torch code is the reference and the fallback.
"""

from __future__ import annotations

import torch

from . import kernels

BLOCK = 1024


def _last_positive(weights: torch.Tensor) -> torch.Tensor:
    """Index of the last positive entry of each row (0 for a row without one). weights: [N, M] -> int64 [N]."""
    positions = torch.arange(weights.shape[-1], device=weights.device)
    return torch.where(weights > 0, positions, 0).amax(-1)


def _cdf_index(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Smallest i with cumsum(weights)[i] > target, kept on a positive entry. weights: float64 [N, M]."""
    below = (weights.cumsum(-1) <= target.clamp(min=0)[:, None]).sum(-1)
    return torch.minimum(below, _last_positive(weights))


def block_size(vocab: int) -> int:
    """Tokens per block of the two-level CDF."""
    return min(BLOCK, vocab)


def block_sums(weights: torch.Tensor) -> torch.Tensor:
    """Sum of each block of consecutive weights. weights: float [N, V] -> float64 [N, ceil(V / block)]."""
    rows, vocab = weights.shape
    size = block_size(vocab)
    full_blocks = vocab // size
    sums = weights[:, : full_blocks * size].reshape(rows, full_blocks, size).sum(-1)
    if vocab % size:
        sums = torch.cat([sums, weights[:, full_blocks * size :].sum(-1, keepdim=True)], dim=-1)
    return sums.to(torch.float64)


def total_weight(sums: torch.Tensor) -> torch.Tensor:
    """Each row's total weight from its block sums, added in block order as the draw's walk and the kernels
    add them (a sequential float64 sum, so every path divides by the same bits). float64 [..., blocks] ->
    [...]."""
    return sums.cumsum(-1)[..., -1]


def sample_from_weights(
    weights: torch.Tensor, uniforms: torch.Tensor, sums: torch.Tensor | None = None
) -> torch.Tensor:
    """Draw token i with probability weights[i] / sum(weights), using the given uniform for each row.

    weights: float [N, V], >= 0 (need not be normalised); uniforms: float64 [N] in [0, 1);
    sums: the weights' block_sums when already known. Returns int64 [N] in [0, V). A row without
    positive weight (invalid input) returns a valid id.
    """
    rows, vocab = weights.shape
    size = block_size(vocab)
    block_sums_ = block_sums(weights) if sums is None else sums
    if rows and weights.dtype == torch.float32 and weights.is_contiguous() and kernels.backend_for(weights).compiled:
        return kernels.sample_rows(weights, block_sums_, size, uniforms)
    block_cdf = block_sums_.cumsum(-1)
    target = uniforms * block_cdf[:, -1]
    block = _cdf_index(block_sums_, target)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    columns = block[:, None] * size + torch.arange(size, device=weights.device)
    inside = columns < vocab
    block_weights = torch.where(inside, weights.gather(1, columns.clamp(max=vocab - 1)), 0).to(torch.float64)
    token = block * size + _cdf_index(block_weights, target - before)
    return token.clamp(0, vocab - 1)
