"""The facts every room shares, once: the pad id, the per-row seed stride, the mode names, the cache folder.

Everything here is part of the behaviour contract (docs/spec.md) or of the machine's layout; no
room defines its own copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

#: Padding of a draft, a committed row or a tree (SPEC §1, §8): not a token.
PAD = -1

#: The stride between requests' keys (SPEC §4), 2**64 over the golden ratio: row b of a seed shared by the batch
#: uses s + b * ROW_STRIDE, and request_seed(base, n) = base * ROW_STRIDE + n (mod 2**64).
ROW_STRIDE = 0x9E3779B97F4A7C15
#: Seeds and keys are uint64 (SPEC §4): arithmetic on them is taken modulo 2**64 by this mask.
MASK64 = (1 << 64) - 1

#: Rows with temperature below this are greedy (SPEC §3.3).
GREEDY_TEMPERATURE = 1e-5
#: Boundaries given as fractions (top_p's mass, min_p's ratio) are met within this relative float32
#: rounding, so that a token exactly on the boundary in exact arithmetic is kept (SPEC §2 steps 4-5).
BOUNDARY_RTOL = 1e-6

DraftProposal = Literal["argmax", "sampled"]
#: How drafts were proposed (SPEC §1): "argmax" (any deterministic drafter) or "sampled" (drawn from q).
DRAFT_PROPOSALS: tuple[DraftProposal, ...] = ("argmax", "sampled")

Verification = Literal["token", "block"]
#: How sampled drafts are judged (SPEC §3.2, §3.6): each on its own, or the drafts of a row as a block.
VERIFICATIONS: tuple[Verification, ...] = ("token", "block")

SiblingDraws = Literal["with_replacement", "without_replacement"]
#: How a sampled tree's siblings were drawn (SPEC §8).
SIBLING_DRAWS: tuple[SiblingDraws, ...] = ("with_replacement", "without_replacement")

#: The environment variable naming the cache folder.
CACHE_ENVIRONMENT = "SPECVERIFY_CACHE"


def cache_root() -> Path:
    """The one folder of the machine where specverify keeps what it builds once: the compiled CPU
    kernels, de-quantised models, measured draft costs. $SPECVERIFY_CACHE when set and not empty, else
    ~/.cache/specverify."""
    return Path(os.environ.get(CACHE_ENVIRONMENT) or Path.home() / ".cache" / "specverify")
