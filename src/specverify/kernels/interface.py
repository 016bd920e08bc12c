"""The ops every backend implements, declared once: their signatures, shapes and meaning (SPEC §2-§6).

A backend is a module with one function per op of `Ops` (same arguments, same results) and a
module-level `BACKEND = Backend(name, module, ...)` (kernels/backend.py checks the module for them when
it is imported). Callers take the backend of their tensors with `kernels.ops_for(t)` and call the op by
its name; they never learn which backend ran. The torch reference (kernels/reference/) implements every
op in plain torch; the compiled backends (kernels/native/: C on the CPU, kernels/triton/: Triton on CUDA)
implement the same ops and must give the same tokens (tests/kernels/test_backends.py).

The facts the ops share live here too: the block of the two-level CDF, the recovery modes and the scan
flags. The records a call hands its backend (ChainCall, TreeCall and their parts) are NamedTuples: as
immutable as a frozen dataclass, and built in a third of its time (0.7 us for ChainCall's 13 fields
against 1.8 us: a frozen dataclass sets each field through object.__setattr__), a cost every call pays.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

#: Tokens per block of the two-level CDF (categorical draws walk block sums, then one block).
BLOCK = 1024

#: Recovery modes of `recover_rows`, per position (kernels.c's enum).
FROM_TARGET, FROM_RESIDUAL, WITHOUT_DRAFT = 0, 1, 2

#: Flags of `scan_rows`.
HOLDS_NAN_OR_INF, HOLDS_ABOVE_MINUS_INF = 1, 2


def block_size(vocab: int) -> int:
    """Tokens per block of the two-level CDF for a vocabulary of `vocab` tokens."""
    return min(BLOCK, vocab)


class Ops(Protocol):
    """The per-row ops of a backend. Every float tensor may be float32, bfloat16 or float16 where it is
    read (logits, draft_probs), float32 where weights are written; int parameters int64 unless said."""

    def weigh_rows(
        self,
        logits: torch.Tensor,  # float [M, V]
        temperature: torch.Tensor,  # float [N]
        greedy_below: float,
        top_k: torch.Tensor,  # int [N], <= 0: no limit
        top_p: torch.Tensor,  # float [N]
        min_p: torch.Tensor | None,  # float [N]
        rtol: float,
        block: int,
        out: torch.Tensor,  # float32 [N, V], contiguous: written
        source: torch.Tensor | None = None,  # int64 [N]
    ) -> torch.Tensor:  # float64 [N, ceil(V / block)]
        """Each row's truncated weights exp((x - max x) / T), zero outside its kept set (SPEC §2; one-hot at
        the argmax for rows with T < greedy_below), written into `out`; returns the sums of each `block`
        consecutive kept weights. source: the logits row each output row weighs (None: row r, M = N); a
        negative one is skipped: zero sums, weights undefined (free in the C kernels,
        else weighed as row 0 and its sums zeroed)."""

    def argmax_rows(self, values: torch.Tensor) -> torch.Tensor:  # float [N, V] -> int64 [N]
        """First argmax per row, NaN never winning."""

    def scan_rows(
        self,
        values: torch.Tensor,  # float [N, V]
        in_use: torch.Tensor | None = None,  # bool [N] or None (every row)
    ) -> torch.Tensor:  # uint8 [N]
        """The value checks of logits (SPEC §6) in one pass: per row in use, HOLDS_NAN_OR_INF if it holds NaN
        or +inf, | HOLDS_ABOVE_MINUS_INF if it holds a value other than -inf; 0 for a row not in use."""

    def sample_rows(
        self,
        weights: torch.Tensor,  # float32 [N, V], >= 0, contiguous
        sums: torch.Tensor,  # float64 [N, ceil(V / block)], their block sums
        block: int,
        uniforms: torch.Tensor,  # float64 [N]
    ) -> torch.Tensor:  # int64 [N]
        """Inverse-CDF draw per row: the block by the CDF of the block sums, then the token inside it, in
        float64; only a token of positive weight can be drawn, and a row without one gives a valid id."""

    def recover_rows(
        self,
        weights: torch.Tensor,  # float32 [B, P, V], P >= K, unnormalised p~
        weight_sums: torch.Tensor,  # float64 [B, P, ceil(V / block)]
        mass: torch.Tensor,  # float64 [B, K], the weights' sums
        draft_probs: torch.Tensor,  # float [B, K, V], q
        draft: torch.Tensor,  # int64 [B, K], -1: none
        mode: torch.Tensor,  # int [B, K]: FROM_TARGET, FROM_RESIDUAL or WITHOUT_DRAFT
        uniforms: torch.Tensor,  # float64 [B, K]
        block: int,
    ) -> torch.Tensor:  # int64 [B, K]
        """The recovery draw of sampled verification at each drafted position (SPEC §3.2): from max(0, p~ - q)
        (FROM_RESIDUAL; p~ where that is all zero), p~ without the draft token (WITHOUT_DRAFT) or p~
        (FROM_TARGET)."""

    def relaxed_rows(
        self,
        logits: torch.Tensor,  # float [B, P, V], P >= K, masked
        draft: torch.Tensor,  # int64 [B, K], -1: none
        k: int,
        delta: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (bool [B, K], int64 [B, K])
        """The relaxed acceptance (SPEC §3.4) at each drafted position, and each position's top-1 token."""


class Relaxed(NamedTuple):
    """The relaxed rule's arguments (SPEC §3.4): the rows in their thinking phase and the rule's limits."""

    thinking: torch.Tensor  # bool [B]
    topk: int  # >= 1
    delta: float  # >= 0


class HostValues(NamedTuple):
    """What a validating call read to the host, for the stages that can use it (a validating call may read
    more: which rows each rule judges)."""

    temperatures: list[float] | None  # [B], where the checks read them (CPU tensors, B <= checks.HOST_ROWS)
    draft: list[list[int]] | None  # [B][K], read where the call is small enough to judge on the host


class ChainCall(NamedTuple):
    """One checked chain verifier call (SPEC §1-§5), as `verify_chain` receives it."""

    draft_tokens: torch.Tensor  # int32/int64 [B, K] as given: an id outside [0, V) and all after it are padding
    logits: torch.Tensor  # float [B, K + 1, V], unmasked; position K scores the bonus
    bitmask: torch.Tensor | None  # int32 [B, K + 1, ceil(V / 32)], the grammar's allowed tokens
    masked: torch.Tensor | None  # float [B, K + 1, V]: logits with the bitmask applied, where the checks made it
    temperature: torch.Tensor  # float [B], < greedy threshold: a greedy row
    top_k: torch.Tensor  # int [B], <= 0: no limit
    top_p: torch.Tensor  # float [B]
    min_p: torch.Tensor | None  # float [B]
    seed: int | torch.Tensor  # an int or int64 [] or [1] shared (row b keyed s + b * ROW_STRIDE), or int64 [B]
    shared_seed: bool
    relaxed: Relaxed | None
    draft_probs: torch.Tensor | None  # float [B, K, V], q of sampled drafts; None: argmax drafts
    host: HostValues | None  # a validating call: what it read to the host; None: no host read allowed
    block: bool = False  # sampled drafts judged as a block (SPEC §3.6) rather than one by one (§3.2)


class TreeCall(NamedTuple):
    """One checked tree verifier call (SPEC §8), as `verify_tree` receives it."""

    draft: torch.Tensor  # int64 [B, N], -1 where no node (padding, or an id or parent out of range)
    parents: torch.Tensor  # int64 [B, N], -1: a child of the root
    logits: torch.Tensor  # float [B, N + 1, V]: index 0 scores the root's children, index i + 1 node i's
    bitmask: torch.Tensor | None  # int32 [B, N + 1, ceil(V / 32)], None also where the logits come masked
    temperature: torch.Tensor  # float [B]
    top_k: torch.Tensor  # int [B]
    top_p: torch.Tensor  # float [B]
    min_p: torch.Tensor | None  # float [B]
    seeds: torch.Tensor  # int64 [B], s_b: depth j of row b keyed by s_b + j
    draft_probs: torch.Tensor | None  # float [B, N, V], q of each node (siblings share it); None: argmax drafts
    without_replacement: bool  # the sibling scheme of sampled drafts
    validate: bool  # host reads allowed: the walk stops when every row has stopped


class WholeCallOps(Protocol):
    """The whole-call ops of a backend: what the verifier's public functions call, one name each."""

    def verify_chain(self, call: ChainCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every rule of SPEC §3 for every row of a chain call and the first rejection -> (first_rejected_idx
        int64 [B] (K when all accepted), recovered int64 [B, K] (accepted drafts before it, the replacement
        at it), bonus int64 [B, 1])."""

    def verify_tree(self, call: TreeCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The walk of SPEC §8 for every row -> (path int64 [B, N]: the accepted nodes from depth 0 down, -1
        after them; path_length int64 [B]; next_token int64 [B]: the recovered token or the bonus)."""
