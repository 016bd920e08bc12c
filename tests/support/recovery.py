"""The recovery draw of sampled mode (SPEC §3.2) at a grid of uniforms, and its law in float64, for the
recovery tests of every backend (tests/core/test_recovery.py, tests/kernels/test_triton.py)."""

from __future__ import annotations

import numpy as np
import torch

from specverify import kernels
from specverify.kernels.stages.categorical import block_sums
from specverify.kernels.stages.rules import recovery_draw

DRAWS = 4000


def random_weights(rng: np.random.Generator, positions: int, vocab: int) -> np.ndarray:
    """Truncated-looking target weights [positions + 1, vocab]: a few zeros, the largest entry 1."""
    weights = rng.exponential(size=(positions + 1, vocab)) ** 3
    weights[rng.random(weights.shape) < 0.3] = 0.0
    return (weights / weights.max(-1, keepdims=True)).astype(np.float32)


def grid_counts(weights: np.ndarray, q: np.ndarray, draft: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """Tokens drawn at the uniform grid -> counts [K, V]. weights [K+1, V]; q [K, V]; draft, mode [K]."""
    positions, vocab = q.shape
    grid = (np.arange(DRAWS) + 0.5) / DRAWS
    w = torch.as_tensor(weights).expand(DRAWS, positions + 1, vocab).contiguous()
    sums = block_sums(w.view(-1, vocab)).view(DRAWS, positions + 1, -1)
    mass = sums[:, :positions].sum(-1)
    tokens = recovery_draw(
        kernels.ops_for(w),
        w,
        sums,
        mass,
        torch.as_tensor(q).expand(DRAWS, positions, vocab),
        torch.as_tensor(draft).expand(DRAWS, positions),
        torch.as_tensor(mode, dtype=torch.int32).expand(DRAWS, positions),
        torch.as_tensor(grid)[:, None].expand(DRAWS, positions),
    )
    return np.stack([np.bincount(tokens[:, j].numpy(), minlength=vocab) for j in range(positions)])


def recovery_law(weights: np.ndarray, q: np.ndarray, draft: int, mode: int) -> np.ndarray:
    """The recovery law in float64 from first principles."""
    target = weights.astype(np.float64) / weights.astype(np.float64).sum()
    if mode == kernels.FROM_RESIDUAL:
        residual = np.maximum(target - q.astype(np.float64), 0.0)
        return residual / residual.sum() if residual.sum() > 0 else target
    if mode == kernels.WITHOUT_DRAFT:
        kept = target.copy()
        kept[draft] = 0.0
        return kept / kept.sum()
    return target
