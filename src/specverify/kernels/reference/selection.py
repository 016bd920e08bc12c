"""Sort-free threshold search: the value at which a weighted tail first reaches a target.

Top-k and top-p both keep every token whose weight is >= a per-row threshold (ties kept). The
threshold is found by radix selection on the float32 bit patterns (non-negative floats order like their
bits): three histogram passes of 1024 buckets over 10-11 bits each, instead of a full-vocabulary sort.
"""

from __future__ import annotations

import torch

#: Up to this vocabulary, comparing every pair of values costs less than the histograms.
PAIRWISE_LIMIT = 64
_LEVEL_SHIFTS = (20, 10, 0)
_BUCKETS = 1024
_LOW_BITS = _BUCKETS - 1


def largest_reaching_threshold(
    values: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """The largest value t of each row such that the weight of {values >= t} reaches the target.

    values: float32 [N, V], every entry in [0, 1] (not NaN);
    target: float [N], the weight to reach;
    weights: float32 [N, V] or None, where None weighs every value 1 (so t is the target-th largest value).
    Returns float32 [N]; 0 where the whole row's weight is below its target (everything is kept).
    """
    target = target.to(torch.float64)
    if weights is None:
        weights = torch.ones((), dtype=torch.float32, device=values.device).expand_as(values)
    if values.shape[-1] <= PAIRWISE_LIMIT:
        return _pairwise_threshold(values, target, weights)
    return _radix_threshold(values, target, weights)


def _pairwise_threshold(values: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """For small V: the tail weight at every candidate value, from all V*V comparisons."""
    tail = ((values[:, None, :] >= values[:, :, None]) * weights[:, None, :]).sum(-1, dtype=torch.float64)
    candidates = torch.where(tail >= target[:, None], values, torch.zeros_like(values))
    return candidates.amax(-1) if values.shape[-1] else torch.zeros(values.shape[0], device=values.device)


def _radix_threshold(values: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Radix selection on the float32 bit patterns: three histogram passes of 1024 buckets, summed in
    float64. Values outside [0, 1] (NaN, inf: invalid input) land in an ignored bucket."""
    rows = values.shape[0]
    bits = values.contiguous().view(torch.int32)
    weights = weights.to(torch.float64)
    prefix = torch.zeros(rows, dtype=torch.int32, device=values.device)
    above = torch.zeros(rows, dtype=torch.float64, device=values.device)
    reached_anywhere = None
    for level, shift in enumerate(_LEVEL_SHIFTS):
        key = bits >> shift
        if level == 0:
            bucket = torch.where((key >= 0) & (key < _BUCKETS), key, _BUCKETS)
        else:
            in_prefix = (key >> 10) == prefix[:, None]
            bucket = torch.where(in_prefix, key & _LOW_BITS, _BUCKETS)
        hist = torch.zeros(rows, _BUCKETS + 1, dtype=torch.float64, device=values.device)
        hist = hist.scatter_add_(1, bucket.long(), weights)[:, :_BUCKETS]
        tail = hist.flip(-1).cumsum(-1).flip(-1)  # tail[b] = weight of buckets b.. (at this level)
        reaches = (above[:, None] + tail) >= target[:, None]
        chosen = reaches.sum(-1) - 1  # tail is non-increasing in b, so reaches is a prefix of True
        if reached_anywhere is None:
            reached_anywhere = chosen >= 0
        chosen = chosen.clamp(min=0)
        above = above + (tail.gather(1, chosen[:, None]) - hist.gather(1, chosen[:, None]))[:, 0]
        chosen = chosen.to(torch.int32)
        prefix = chosen if level == 0 else (prefix << 10) | chosen
    threshold = prefix.view(torch.float32)
    return torch.where(reached_anywhere, threshold, torch.zeros_like(threshold))
