"""The argument groups of the Triton kernels: named tuples that Triton passes whole (a kernel argument that is a
NamedTuple is flattened into its fields at the launch, so a group costs nothing on the GPU: no packing, no
load), and those the kernels build inside to hand a stage what it needs in a few arguments.

Field names avoid `values` and `type` (attributes of Triton's own tuple, which a field would not shadow).
A constexpr group (Flags, Shape) is a kernel argument only, holding `tl.constexpr` values (`constexprs`
builds one: Triton compiles a group of plain ints as no constants); the groups a kernel builds hold none
(an assignment inside a compiled kernel turns a tuple's constexprs into tensors), so a stage takes its
constexprs beside them. `do_not_specialize` does not reach into a group, so the launch's int seed stays
two arguments of verify_kernel.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton.language as tl

# --- built by the launchers (kernels/triton/__init__.py): verify_kernel's arguments ------------------------


class Logits(NamedTuple):
    """The rows a kernel reads, with their grammar mask; a row is (request b, position j), b * (K + 1) + j."""

    data: Any  # float [rows, V], any float dtype, read as it is
    words: Any  # int32 [rows, W]: bit c % 32 of word c // 32 allows column c; without a mask, `data` itself:
    # a kernel applies the mask where `words` points at int32 (a compile-time fact of the pointer's type)
    V: Any  # int: columns per row
    W: Any  # int: mask words per row (0 without a mask)


class Requests(NamedTuple):
    """Each request's sampling parameters."""

    temperature: Any  # float32 [B]
    top_k: Any  # int64 [B] (<= 0 or >= V: no top-k)
    top_p: Any  # float32 [B] (1: no top-p)
    min_p: Any  # float32 [B] (read where Flags.HAS_MIN_P; any float32 pointer else)
    seeds: Any  # int64 [B], or [] shared (Flags.SHARED_SEED); any int64 pointer where Flags.SEED_GIVEN
    thinking: Any  # int8 [B], 1: relaxed rule (read where Flags.HAS_RELAXED; any pointer else)


class Drafts(NamedTuple):
    """The drafted tokens of B requests, K each, and the draft's probabilities."""

    tokens: Any  # int [B, K]: ids outside [0, V) and everything after them are padding
    probs: Any  # float [B, K, V] (read where Flags.SAMPLED; any pointer else)
    B: Any  # int: requests
    K: Any  # int: drafted positions per request


class Outputs(NamedTuple):
    """What a whole call writes, and its scratch."""

    first: Any  # int64 [B]: K before the launch, each rejection lowers it (atomic min)
    recovered: Any  # int64 [B, K]
    bonus: Any  # int64 [B]
    candidates: Any  # int64 [B * (K + 1), Shape.CANDIDATES] scratch: (weight bits << 32) | column


class Settings(NamedTuple):
    """The call's scalar settings."""

    greedy_below: Any  # float: a temperature below it is greedy (contract.GREEDY_TEMPERATURE)
    rtol: Any  # float: the kept set's boundary tolerance (contract.BOUNDARY_RTOL)
    relaxed_k: Any  # int: the relaxed rule's top-k (1 without relaxed rows)
    relaxed_delta: Any  # float: the relaxed rule's probability margin (0 without relaxed rows)


class Flags(NamedTuple):
    """verify_kernel's code paths (constexpr)."""

    HAS_MIN_P: Any  # Requests.min_p is read
    SHARED_SEED: Any  # one seed s for every request: row b uses s + b * ROW_STRIDE
    SEED_GIVEN: Any  # the shared seed is the kernel's seed_low / seed_high arguments, not a tensor
    HAS_RELAXED: Any  # Requests.thinking is read: relaxed rows exist
    SAMPLED: Any  # sampled drafts: Drafts.probs is read
    BLOCK_VERIFICATION: Any  # (with SAMPLED) a request's drafts judged as a block (SPEC §3.6), not one by one


class Shape(NamedTuple):
    """verify_kernel's tiling (constexpr powers of two; kernels/triton/__init__.py's verify_shape)."""

    ROWS: Any  # rows per program
    TILE: Any  # columns per tile of a pass
    SEARCH: Any  # columns per tile of a search or compaction
    TILES: Any  # tile sums a row keeps (>= ceil(V / TILE))
    CANDIDATES: Any  # candidate slots per row
    SPAN: Any  # lanes per request: 1 (token-wise: a program's rows are any consecutive rows), or (block
    # verification) a power of two >= K + 1: a program holds ROWS // SPAN whole requests, lane j its position j


# --- built by the launchers: the per-op kernels' arguments (with Logits above) --------------------------------


class Draws(NamedTuple):
    """draw_kernel's draws: row r is (request r // positions, position r % positions)."""

    weights: Any  # float32 [.., V]: row r draws from weight row (r // positions) * weight_rows + r % positions
    uniforms: Any  # float64 [rows]
    tokens: Any  # int64 [rows]: the draws
    V: Any  # int: columns per row
    rows: Any  # int
    positions: Any  # int: rows per request
    weight_rows: Any  # int: weight rows per request


class RecoveryRows(NamedTuple):
    """What a recovery draw (draw_kernel's RECOVERY; any pointers else) reads per row."""

    probs: Any  # float [rows, V]: the draft's probabilities q
    scale: Any  # float32 [rows]: 1 / the kept mass
    use_q: Any  # int8 [rows]: draw from max(0, p~ - q), else from p~ without `excluded`
    excluded: Any  # int64 [rows]: the column left out (-1: none)


class RelaxedRows(NamedTuple):
    """relaxed_kernel's rows: row r is (request r // positions, position r % positions)."""

    drafts: Any  # int64 [rows]: the drafted tokens
    accepted: Any  # int8 [rows]: written, the rule's verdicts
    top1: Any  # int64 [rows]: written, each row's argmax
    rows: Any  # int
    positions: Any  # int: drafted positions per request
    logit_positions: Any  # int: logit rows per request (row r reads (r // positions) * logit_positions + r % positions)
    k: Any  # int: the rule's top-k
    delta: Any  # float: its probability margin


def constexprs(group: type, **fields) -> tuple:
    """A constexpr group (Flags, Shape) of these field values, each a tl.constexpr."""
    return group(**{name: tl.constexpr(value) for name, value in fields.items()})


# --- built inside the kernels, handed to their stages (shapes: R rows of a program, C columns). No constexpr
# field: an assignment inside a compiled kernel turns a tuple's constexprs into tensors -------------------------


class Weights(NamedTuple):
    """A row's weights w = exp((x - top) * inverse), read a tile at a time."""

    logits: Any  # Logits
    row: Any  # int64 [R]: the logit rows
    top: Any  # float32 [R]: the largest logit where finite, else 0
    inverse: Any  # float32 [R]: 1 / temperature (1 for greedy rows)


class Truncation(NamedTuple):
    """A row's truncation parameters (SPEC §2 steps 3-5)."""

    top_k: Any  # int64 [R]
    top_p: Any  # float32 [R]
    floor: Any  # int64 [R]: min-p's weight bits, min_p * (1 - rtol) (0 without min-p)
    rtol: Any  # float: the boundary tolerance


class Position(NamedTuple):
    """Which (request, position) each row of a program is."""

    row: Any  # int64 [R]: b * (K + 1) + j
    b: Any  # int64 [R]: the request
    j: Any  # int64 [R]: the position, K for the bonus row
    valid: Any  # bool [R]: a row of the call
    drafted: Any  # bool [R]: valid and j < K (a drafted token is judged here)


class Roles(NamedTuple):
    """What each row does; bool [R] each."""

    greedy: Any  # temperature below greedy_below: the argmax decides
    relaxed: Any  # a drafted row of a thinking request: the relaxed rule decides
    sampled: Any  # neither: a draw from the kept set
    limited: Any  # sampled with a top-k below V
    nucleus: Any  # sampled with top-p < 1
    truncating: Any  # sampled with top-k, top-p or min-p
    plain: Any  # sampled without truncation: its mass is first_pass's tile sums


class FirstPass(NamedTuple):
    """What first_pass learns in its one read of a row."""

    largest: Any  # float32 [R]: the largest masked logit (NaN skipped; -inf when none)
    best: Any  # int64 [R]: its lowest column
    top: Any  # float32 [R]: `largest` where finite, else 0
    sums: Any  # float64 [R, TILES]: each tile's weights (plain rows)
    counts: Any  # float32 [R, BUCKETS]: the depth histogram's counts (truncating rows)
    masses: Any  # float32 [R, BUCKETS]: and its approximate masses
    lead: Any  # float32 [R]: how far above the top bucket 0 starts, in nats
    deepest: Any  # int64 [R]: the bits of the smallest weight of a finite logit


class Region(NamedTuple):
    """The weight bits a compaction pass lists as candidates: [bound, hi)."""

    bound: Any  # int64 [R]: the lowest listed bits (at least 1: never a zero weight)
    hi: Any  # int64 [R]: above the highest; what reaches it is kept for sure (ONE_UP: nothing is)


class Scratch(NamedTuple):
    """Each row's candidate slots (Outputs.candidates)."""

    words: Any  # pointer to int64 [rows, Shape.CANDIDATES]: (weight bits << 32) | column
    row: Any  # int64 [R]: the rows whose slots these are


class Compacted(NamedTuple):
    """What one compaction pass (compact) learns of its rows."""

    mass: Any  # float64 [R]: the row's weights
    positives: Any  # int32 [R]: its positive weights
    count: Any  # int32 [R]: the candidates (may exceed CANDIDATES: not all written)
    sure: Any  # float64 [R, TILES]: per tile, the weights at or above the region (kept for sure)
    cut: Any  # float64 [R, SPLITS]: per cut, the candidates' mass at or above its lower edge
    least: Any  # int64 [R, SPLITS]: per cut, its smallest candidate bits at or above that edge
    most: Any  # int64 [R, SPLITS]: per cut, its largest candidate bits below the upper edge


class KeptSet(NamedTuple):
    """A row's kept set, as a draw needs it."""

    threshold: Any  # int64 [R]: the weight bits a kept weight reaches
    candidates: Any  # float32 [R, CANDIDATES]: the kept candidates' weights (listed rows)
    columns: Any  # int64 [R, CANDIDATES]: and their columns
    listed: Any  # bool [R]: the candidates are the whole kept set (else a walk reads tiles)
    sums: Any  # float64 [R, TILES]: per tile, the kept weights (rows walked by tiles)
    mass: Any  # float64 [R]: the kept mass


class Recovery(NamedTuple):
    """What a rejected sampled draft draws from (SPEC §3.2): max(0, p~ - q), or p~ without the draft; under
    block verification (SPEC §3.6) max(0, p~ - q / P)."""

    probs: Any  # pointer to the draft's probabilities q [B, K, V]
    q_row: Any  # int64 [R]: b * K + j
    judged: Any  # bool [R]: sampled rows at a drafted position
    scale: Any  # float32 [R]: 1 / the kept mass
    use_q: Any  # bool [R]: the residual max(0, p~ - q) (else p~ without `excluded`)
    excluded: Any  # int64 [R]: the column left out (-1: none)
    inverse: Any  # float32 [R]: 1 / P, q's factor in the residual (read only under Flags.BLOCK_VERIFICATION)


class Prefixes(NamedTuple):
    """What block verification (SPEC §3.6) knows of each lane (Shape.SPAN lanes per request), [R] each."""

    lane: Any  # int32: the lane's position j in its request
    joint: Any  # float64: P_j, the joint ratio of the drafts before j
    p_draft: Any  # float64: p~_j(d_j) (0 where there is no draft)
    blind: Any  # bool: a draft judged without a distribution (q_j(d_j) == 0: q_j is its point mass)
    drafted: Any  # int32: gamma, the request's drafts (at each of its lanes)
    coin: Any  # float64: u_j, the coin of the prefix of length j (the accept stream's, key j - 1)


class Residuals(NamedTuple):
    """What each lane draws from if it recovers (block verification computes it lazily, lane by lane)."""

    recovery: Any  # Recovery: use_q final at computed lanes
    listed_q: Any  # float32 [R, CANDIDATES]: q / P at the candidates of computed listed lanes (else 0)
    kept: Any  # KeptSet: its sums the recovery's at computed lanes walked by tiles
    total: Any  # float64 [R]: the mass a computed lane's draw is a share of (the kept mass elsewhere)
    computed: Any  # bool [R]: the lanes whose recovery is known
