"""Inverse-CDF draws from unnormalised weights with one uniform per row.

The CDF is taken in vocabulary order in two levels, both in float64: block sums locate the block that
holds the draw, then a cumulative sum inside that one block locates the token. Only tokens with positive
weight can be drawn, and the result is always a valid id in [0, V). The walk is the backend's
`sample_rows` (kernels/interface.py); this room gives it the block sums.
"""

from __future__ import annotations

import torch

from .. import registry
from ..interface import block_size


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


def sample_from_weights(
    weights: torch.Tensor, uniforms: torch.Tensor, sums: torch.Tensor | None = None
) -> torch.Tensor:
    """Draw token i with probability weights[i] / sum(weights), using the given uniform for each row.

    weights: float [N, V], >= 0 (need not be normalised); uniforms: float64 [N] in [0, 1);
    sums: the weights' block_sums when already known. Returns int64 [N] in [0, V). A row without
    positive weight (invalid input) returns a valid id. The backend of the weights draws float32
    contiguous weights; others (a draft model's float16 q, a strided view) the torch reference.
    """
    rows, vocab = weights.shape
    sums = block_sums(weights) if sums is None else sums
    if not rows:
        return torch.zeros(0, dtype=torch.int64, device=weights.device)
    compiled_layout = weights.dtype == torch.float32 and weights.is_contiguous()
    backend = registry.backend_for(weights) if compiled_layout else registry.torch_backend()
    return backend.ops.sample_rows(weights, sums, block_size(vocab), uniforms)
