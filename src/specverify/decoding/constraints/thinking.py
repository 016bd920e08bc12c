"""Thinking regions: the part of an answer between a begin and an end token (e.g. <think> ... </think>).

Inside a region the verifier may use its relaxed, lossy rule (SPEC §3.4), and a grammar does not apply;
outside it everything is exact. The verifier takes one in_thinking_phase flag per row for the whole draft
window, so a phase must not change inside a window. The loop keeps it so:

- a draft is cut right after its first boundary token (begin or end): every drafted position is then
  judged in the phase the row had when the step began;
- a commit is cut right after its first boundary token: the token after a boundary is never taken from
  a step judged in the old phase (with relaxed rows it would be the relaxed rule's top-1 choice). It is
  drawn in the next step, in the new phase, with the same key, so the lossless parts of the output are
  unchanged and a region costs at most one extra target step at each of its ends.

A boundary token is decided in the phase before it: the begin token outside the region (exactly, and
under the grammar if there is one), the end token inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ThinkingRegions:
    """begin, end: the token ids that open and close a thinking region (distinct ids >= 0)."""

    begin: int
    end: int

    def __post_init__(self) -> None:
        for name, value in (("begin", self.begin), ("end", self.end)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"thinking {name} must be a token id >= 0 (got {value!r})")
        if self.begin == self.end:
            raise ValueError(f"thinking begin and end must be different tokens (got {self.begin} for both)")

    def inside(self, tokens: Sequence[int], inside: bool = False) -> bool:
        """Whether a request is inside a region after tokens, having been `inside` before them."""
        for token in reversed(tokens):
            if token in (self.begin, self.end):
                return token == self.begin
        return inside

    def draft_lengths(self, drafts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each row's draft cut right after its first boundary token.

        drafts: int64 [B, K], -1 padded; lengths: int64 [B] -> int64 [B], each <= lengths.
        """
        boundary = (drafts == self.begin) | (drafts == self.end)
        first = torch.cat([boundary, boundary.new_ones(len(drafts), 1)], 1).int().argmax(1)  # K if none
        return torch.minimum(lengths, first + 1)

    def cut(self, tokens: Sequence[int]) -> list[int]:
        """tokens up to and including the first boundary token."""
        for i, token in enumerate(tokens):
            if token in (self.begin, self.end):
                return list(tokens[: i + 1])
        return list(tokens)
