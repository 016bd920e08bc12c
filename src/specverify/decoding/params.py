"""Sampling parameters of a request, and per-row seeds, as the verifier takes them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: temperature < 1e-5 is greedy; top_k <= 0, top_p = 1 and min_p = 0 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0 (got {self.temperature})")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1, with <= 0 meaning no limit (got {self.top_k!r})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (got {self.min_p})")


class RowParams(NamedTuple):
    """Sampling parameters per row: temperature, top_p: float32 [B]; top_k: int64 [B]; min_p: float32 [B] or None."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor | None

    def to(self, device: torch.device) -> RowParams:
        return RowParams(*(None if t is None else t.to(device) for t in self))


def row_params(params: SamplingParams | Sequence[SamplingParams], batch: int) -> RowParams:
    """One SamplingParams for every row, or one per row -> RowParams of [batch] tensors."""
    rows = [params] * batch if isinstance(params, SamplingParams) else list(params)
    if len(rows) != batch or not all(isinstance(p, SamplingParams) for p in rows):
        raise ValueError(f"params must be a SamplingParams or a sequence of {batch} of them (got {params!r:.80})")
    min_p = torch.tensor([p.min_p for p in rows], dtype=torch.float32)
    return RowParams(
        temperature=torch.tensor([p.temperature for p in rows], dtype=torch.float32),
        top_k=torch.tensor([p.top_k for p in rows], dtype=torch.int64),
        top_p=torch.tensor([p.top_p for p in rows], dtype=torch.float32),
        min_p=min_p if bool((min_p > 0).any()) else None,
    )


def base_seeds(seed: int | Sequence[int], batch: int) -> torch.Tensor:
    """Per-request base seeds as int64 [batch] (uint64 bit patterns).

    seed: one int for the batch (row b gets base seed + b, so a batch of one gets seed itself; with
    `specverify.request_seed` keys, rows never share keys and row b draws as the verifier's shared seed
    spreads row b, SPEC §4) or one int per row.
    """
    values = [seed + b for b in range(batch)] if isinstance(seed, int) else list(seed)
    if len(values) != batch or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"seed must be an int or a sequence of {batch} ints (got {seed!r:.80})")
    return torch.tensor([(v + 2**63) % 2**64 - 2**63 for v in values], dtype=torch.int64)
