"""How seeds become per-row seeds (SPEC §4), with Python ints: the one copy of the row stride for every test
(written down here, not imported from src), int64 bit patterns, and each row's seed s_b."""

from __future__ import annotations

import torch

#: Row spreading constant of a seed shared by the batch (SPEC §4).
ROW_STRIDE = 0x9E3779B97F4A7C15


def int64_bits(value: int) -> int:
    """The int64 whose bit pattern is `value` mod 2**64."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def per_row_seeds(seed, batch: int) -> list[int]:
    """Each row's seed s_b (SPEC §4) as int64 bit patterns, computed with Python ints."""
    if isinstance(seed, torch.Tensor):
        values = [int(v) for v in seed.reshape(-1).tolist()]
        if seed.dim() == 0 or tuple(seed.shape) == (1,):
            return [int64_bits(values[0] + b * ROW_STRIDE) for b in range(batch)]
        return [int64_bits(v) for v in values]
    return [int64_bits(seed + b * ROW_STRIDE) for b in range(batch)]
