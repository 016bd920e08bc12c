"""The drafter protocol: what proposes the K tokens the target then verifies, and the helpers every
drafter shares (padding, evidence, common prefixes).

A drafter sees each row's whole context (prompt and generated tokens) and proposes up to k next tokens
per row, padded with -1 (ragged). It may be stateful (a draft model keeps a KV cache), but it must not
assume that its previous proposal was accepted: it is handed the committed context every time.

A drafter may also say, before it drafts, how much support each row's next draft has (`evidence`, in
its own units, 0 when it has nothing to propose); the adaptive draft length then keeps an acceptance
rate per evidence class (see `draft_length`). The n-gram drafter's evidence is its match length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ... import kernels
from ...contract import PAD
from ...kernels.stages.categorical import sample_from_weights
from ...rng import STREAM_DRAFT, keyed_uniform
from ..params import RowParams


@dataclass
class Draft:
    """tokens: int64 [B, K], -1 padded; probs: float32 [B, K, V], the distribution each token was drawn
    from (zero rows at padding), or None for a deterministic proposal."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: int,
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> Draft:
        """Up to k tokens for each context. params: the target's sampling parameters [B]; seeds: int64
        [B], the verifier's seeds for this step; sampled: draw from a distribution and return it (else
        propose deterministically)."""
        ...


def drafter_evidence(drafter: Drafter, contexts: Sequence[Sequence[int]]) -> list[int] | None:
    """The drafter's `evidence(contexts)` for each row's next draft (an int >= 0; 0: it will propose
    nothing), or None for a drafter that gives none."""
    evidence = getattr(drafter, "evidence", None)
    if evidence is None:
        return None
    values = list(evidence(contexts))
    if len(values) != len(contexts) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ValueError(f"the drafter's evidence must be one int >= 0 per row (got {values!r:.80})")
    return values


def pad_rows(rows: Sequence[Sequence[int]], width: int | None = None) -> torch.Tensor:
    """Right-pad token lists with -1 -> int64 [len(rows), width (default: the longest)]."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    padded = [[int(t) for t in r[:width]] + [PAD] * (width - len(r[:width])) for r in rows]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(rows), width)  # one torch op: a row each cost more


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def draw_draft(probs: torch.Tensor, keys: torch.Tensor, draw: int = 0) -> torch.Tensor:
    """A sampled draft token per row, drawn from the drafter's own distribution on its own stream (SPEC §4):
    the key is the verifier's key of the position drafted, the stream STREAM_DRAFT + draw, so a draft never
    uses a uniform the verifier uses, and drafts of requests that never share a key are independent.
    probs: float [B, V], >= 0 (the q passed to the verifier, or q with earlier siblings removed);
    keys: int64 [B]; draw: the draw's index among its siblings (0 for a chain) -> int64 [B]."""
    return sample_from_weights(kernels.ops_for(probs), probs, keyed_uniform(keys.to(probs.device), STREAM_DRAFT + draw))
