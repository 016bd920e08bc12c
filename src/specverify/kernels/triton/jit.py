"""The Triton code: per-tile helpers and the kernels built from them (launched by kernels/triton/__init__.py).

Every kernel works on ROWS rows per program, a row at a time in tiles of TILE (or SEARCH) columns, with
[ROWS] vectors for per-row state, so the same code serves a large vocabulary (one row per program) and
thousands of small rows (many per program, as the interpreter tests run). A "row" is one (request,
position) of the logits, or of the weights the per-op kernels are given.

Kept sets are found without sorting: a weight w = exp((x - max x) / T) lies in [0, 1], where float32 bit
patterns order like the values, so the top-k and top-p thresholds are the largest bit pattern t whose
tail {w >= t} reaches a count (k) or a mass (top_p of the row's). Ties are kept: the kept set is
{w >= t}. Sums run in float64. Draws are inverse-CDF walks in float64 in vocabulary order.
A whole call (verify_kernel) reads a row about once (no truncation) or twice: pass 1 takes the max
with per-tile sums (rescaled as the max grows) and a histogram by depth below the max; a second pass
writes the few weights that can be kept to a per-row candidate buffer, where thresholds, mass and draw
are finished; a walk reads only the tile its draw lands in. A top-p row without top-k whose nucleus is
too large for the buffer keeps for sure every weight above its boundary region (the histogram's buckets
where the mass can reach top_p), sums those exactly per tile in pass 2 and lists only the region's
weights; where the region holds too many, pass 2 also cuts it SPLITS ways (exact float64 tails at each
cut, and the range of bits each cut holds) and pass 3 lists only the cut where the threshold lies (a
pass 4 cuts once more; a cut of one tied value pins the threshold, nothing to list); the threshold is
found on the candidates with the sure mass added to every tail, and the draw walks tiles whose sums are
the sure sums plus their kept candidates (about 3 passes for wide nuclei and flat rows, 4 for flat rows
of V = 128256). Where the candidates cannot decide (a top-k row with too many, a top-p row whose cut
still holds too many after LEVELS passes), the radix search of 4 bits per level (8 levels, each one
pass testing 16 candidates at once) finds the thresholds, as weigh_kernel does.

Keyed uniforms are rng.py's exactly: SplitMix64's finaliser on (s_b + j) and a per-stream salt, 53 bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import contract
from .groups import (
    Compacted,
    FirstPass,
    KeptSet,
    Logits,
    Position,
    Prefixes,
    Recovery,
    Region,
    Requests,
    Residuals,
    Roles,
    Scratch,
    Truncation,
    Weights,
)

# rng.py's constants (bit-identical uniforms are tested against it)
MIX_1 = tl.constexpr(0xBF58476D1CE4E5B9)
MIX_2 = tl.constexpr(0x94D049BB133111EB)
STREAM_SALT = tl.constexpr(0xD1B54A32D192ED03)
ROW_STRIDE = tl.constexpr(contract.ROW_STRIDE)
STREAM_TARGET = tl.constexpr(0)
STREAM_ACCEPT = tl.constexpr(1)
STREAM_RESIDUAL = tl.constexpr(2)
RADIX = tl.constexpr(16)
# the first pass's histogram: buckets of this many nats below the running top (the last one: deeper)
BUCKETS = tl.constexpr(16)
BUCKET_NATS = tl.constexpr(1.0)
# how far above top_p of the row's approximate mass a histogram's depth must reach
MASS_MARGIN = tl.constexpr(1e-4)
# how many weight bits (about 1.2e-4 relative) a bucket's edge is moved outwards where it bounds a region:
# the histogram places a weight by its float32 depth, the edge is exp of another float32 sum, and bf16
# logits meet an edge exactly (lead, like the depths, is a sum of their differences), so a tie group at
# an edge may be counted on either side of it; the rounding is under 1e-6 relative
EDGE_SLACK = tl.constexpr(1 << 10)
# a tile walk reads a tile whose sum takes the running sum within this fraction of the target. A tile sum
# that first_pass rescaled to a grown top differs from the exact one by the float32 rounding of the
# weights' exponents (x - top) / T at both tops: up to about 2**-24 * (depth in nats + 1) relative
# (measured; exp2-based exp alike), so under 1e-5 for every weight above float32's smallest normal (87
# nats deep; denormal ones are far too small to reach a target). 1e-4 covers that tenfold and costs a
# needless read only where the target lies within 1e-4 of itself above the end of a tile
WALK_MARGIN = tl.constexpr(1e-4)
# float32's largest finite value: the bound of 1 / P (block verification's factor of q)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)
# a column index above every real one
PAST_END = tl.constexpr(1 << 62)
# weight bits above every weight (1.0's bits + 1: weights are at most 1): a bound that leaves nothing sure
ONE_UP = tl.constexpr(0x3F800001)
# a top-p row's boundary region is cut at this many edges, evenly spaced in weight bits (about evenly in
# log weight), per refining pass: a region of up to SPLITS * CANDIDATES tokens at the threshold's density
# resolves on the next pass. Flat rows hold the most there: about 2 V tokens per nat near top-p 0.9, so a
# bucket of 1 nat at V = 32768 needs 64 (~1000 per cut); larger costs registers ([R, SEARCH, SPLITS])
SPLITS = tl.constexpr(64)
# passes after the first that a top-p row may take to bring its boundary region to CANDIDATES tokens
# (each cuts it SPLITS ways) before the radix search takes over: the first's region is one or two buckets,
# the next is at most 1/64 of that, the last 1/4096 (flat rows at V = 128256 need it; a cut of tied
# weights pins the threshold instead)
LEVELS = tl.constexpr(3)


@triton.jit
def _mix64(x):
    """SplitMix64's finaliser on uint64 values."""
    x = (x ^ (x >> 30)) * MIX_1
    x = (x ^ (x >> 27)) * MIX_2
    return x ^ (x >> 31)


@triton.jit
def keyed_uniform(key, stream):
    """rng.keyed_uniform: uint64 keys [R], stream (int) -> float64 [R] in [0, 1) with 53 random bits."""
    salt = _mix64(tl.full(key.shape, stream, tl.uint64) + STREAM_SALT)
    bits = _mix64(_mix64(key) ^ salt)
    return (bits >> 11).to(tl.float64) * 1.1102230246251565e-16  # 2**-53


@triton.jit
def load_logits(logits, row, cols, valid):
    """Masked logits of a tile as float32 [R, C] (-inf where the grammar mask forbids or past V), and
    where the tile holds real columns. logits: Logits (masked where its words are int32); row: int64 [R]
    row indices; cols: [C]; valid: bool [R]."""
    inside = valid[:, None] & (cols[None, :] < logits.V)
    x = tl.load(logits.data + row[:, None] * logits.V + cols[None, :], mask=inside, other=float("-inf"))
    x = x.to(tl.float32)
    if logits.words.dtype.element_ty == tl.int32:  # a grammar mask (else words is the logits: none)
        words = tl.load(logits.words + row[:, None] * logits.W + (cols[None, :] >> 5), mask=inside, other=0)
        allowed = ((words >> (cols[None, :] & 31)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    return x, inside


@triton.jit
def load_logit_at(logits, row, col, valid):
    """The masked logit of one column per row (col: int64 [R], in [0, V) where used) -> float32 [R]."""
    at = valid & (col >= 0) & (col < logits.V)
    safe = tl.where(at, col, 0)
    x = tl.load(logits.data + row * logits.V + safe, mask=at, other=float("-inf")).to(tl.float32)
    if logits.words.dtype.element_ty == tl.int32:  # a grammar mask (else words is the logits: none)
        word = tl.load(logits.words + row * logits.W + (safe >> 5), mask=at, other=0)
        x = tl.where(((word >> (safe & 31).to(tl.int32)) & 1) != 0, x, float("-inf"))
    return x


@triton.jit
def weights_at(weights, cols, valid):
    """A tile of a row's weights (Weights), float32 [R, C] (NaN stays NaN, masked and past V 0), and where
    the tile holds real columns -> (w, inside)."""
    x, inside = load_logits(weights.logits, weights.row, cols, valid)
    return weights_of(x, weights.top, weights.inverse), inside


@triton.jit
def row_max_argmax(logits, row, valid, TILE: tl.constexpr):
    """Each row's largest masked logit (NaN skipped; -inf when none) and its lowest index (0 when nothing
    beats -inf) -> (float32 [R], int64 [R])."""
    best = tl.full(row.shape, float("-inf"), tl.float32)
    index = tl.zeros_like(row)
    for start in range(0, logits.V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        x, inside = load_logits(logits, row, cols, valid)
        best, index = max_argmax_update(x, inside, cols, best, index)
    return best, index


@triton.jit
def max_argmax_update(x, inside, cols, best, index):
    """The running largest logit (NaN skipped) and its lowest index after one more tile -> (best, index)."""
    x = tl.where(x == x, x, float("-inf"))
    tile_max = tl.max(x, axis=1)
    first = tl.min(tl.where((x == tile_max[:, None]) & inside, cols[None, :], PAST_END), axis=1)
    better = tile_max > best
    return tl.where(better, tile_max, best), tl.where(better, first, index)


@triton.jit
def weights_of(x, top, inverse):
    """w = exp((x - top) * inverse), float32; x = -inf gives 0, NaN stays NaN."""
    return tl.exp((x - top[:, None]) * inverse[:, None])


@triton.jit
def order_bits(w, inside):
    """int64 keys that order non-negative weights like their values; NaN and columns past V get -1."""
    return tl.where(inside & (w == w), w.to(tl.int32, bitcast=True).to(tl.int64), -1)


@triton.jit
def kept_of(w, inside, threshold):
    """Weights [R, C] whose bits reach the threshold (int64, [R] or a number), 0 for the others (NaN too)."""
    return tl.where(order_bits(w, inside) >= threshold, w, 0.0)


@triton.jit
def any_row(rows):
    """Whether any of the program's rows (bool [R]) is set: a scalar a loop or pass can be skipped on."""
    return tl.max(rows.to(tl.int32), axis=0) > 0


@triton.jit
def temper(temperature_ptr, index, valid, greedy_below):
    """A row's temperature (float32 [?] at `index`, int64 [R]) as (greedy bool [R], inverse float32 [R]):
    greedy below greedy_below, inverse 1 / temperature (1 for greedy rows)."""
    temperature = tl.load(temperature_ptr + index, mask=valid, other=1.0).to(tl.float32)
    greedy = temperature < greedy_below
    one = tl.full(index.shape, 1.0, tl.float32)
    return greedy, tl.where(greedy, 1.0, tl.div_rn(one, tl.where(greedy, 1.0, temperature)))


@triton.jit
def load_truncation(requests, index, valid, rtol, HAS_MIN_P: tl.constexpr):
    """The truncation parameters (Truncation) of rows whose request is `index` (int64 [R]) in Requests."""
    top_k = tl.load(requests.top_k + index, mask=valid, other=0).to(tl.int64)
    top_p = tl.load(requests.top_p + index, mask=valid, other=1.0).to(tl.float32)
    floor = tl.zeros_like(index)
    if HAS_MIN_P:
        min_p = tl.load(requests.min_p + index, mask=valid, other=0.0).to(tl.float32)
        floor = (min_p * (1.0 - rtol)).to(tl.int32, bitcast=True).to(tl.int64)
    return Truncation(top_k, top_p, floor, rtol)


@triton.jit
def truncated_rows(truncation, active, V):
    """Which `active` rows take a top-k below V and which a top-p below 1 -> (limited, nucleus), bool [R]."""
    limited = active & (truncation.top_k > 0) & (truncation.top_k < V)
    return limited, active & (truncation.top_p < 1.0)


@triton.jit
def search_threshold(weights, valid, floor, target, active, WEIGHTED: tl.constexpr, SEARCH: tl.constexpr):
    """The largest bit pattern t such that the tail {w >= t, w >= floor} of a row's weights (Weights)
    reaches the target: its count (WEIGHTED False) or its mass (True), in float64. floor: int64 bits [R];
    target: float64 [R]; rows not active are not searched. Returns int64 bits [R]; 0 where even the whole
    row falls short (keep all). A count search stops early for rows whose chosen tail already holds exactly
    the target count: no value lies between that candidate and the exact threshold, so both keep the same set."""
    ROWS: tl.constexpr = weights.row.shape[0]
    prefix = tl.zeros_like(weights.row)
    done = ~active
    digits = tl.arange(0, RADIX).to(tl.int64)
    for level in range(8):
        searching = valid & ~done
        if any_row(searching):
            shift = 28 - 4 * level
            candidates = prefix[:, None] + (digits[None, :] << shift)  # [R, RADIX]
            tail = tl.zeros([ROWS, RADIX], tl.float64)
            for start in range(0, weights.logits.V, SEARCH):
                cols = start + tl.arange(0, SEARCH).to(tl.int64)
                w, inside = weights_at(weights, cols, searching)
                keys = order_bits(w, inside)
                keys = tl.where(keys >= floor[:, None], keys, -1)
                if WEIGHTED:
                    amount = tl.where(keys >= 0, w, 0.0).to(tl.float64)
                else:
                    amount = tl.where(keys >= 0, 1.0, 0.0).to(tl.float64)
                reaches = keys[:, :, None] >= candidates[:, None, :]
                tail += tl.sum(tl.where(reaches, amount[:, :, None], 0.0), axis=1)
            chosen = tl.max(tl.where(searching[:, None] & (tail >= target[:, None]), digits[None, :], 0), axis=1)
            prefix = prefix + (chosen << shift)
            if not WEIGHTED:
                reached = tl.sum(tl.where(digits[None, :] == chosen[:, None], tail, 0.0), axis=1)
                done = done | (searching & (reached == target))
    return tl.where(active, prefix, 0)


@triton.jit
def kept_threshold(weights, valid, truncation, active, SEARCH: tl.constexpr):
    """The kept set's threshold as int64 bits [R] (SPEC §2 steps 3-5) of `active` rows: the k-th largest
    weight, the nucleus on the top-k-renormalised row (its target top_p * mass * (1 - rtol)), min-p's floor."""
    V = weights.logits.V
    limited, nucleus = truncated_rows(truncation, active, V)
    top_k = truncation.top_k
    kth = search_threshold(weights, valid, tl.zeros_like(top_k), top_k.to(tl.float64), limited, False, SEARCH)
    mass = tl.zeros(top_k.shape, tl.float64)
    if any_row(nucleus):
        for start in range(0, V, SEARCH):
            cols = start + tl.arange(0, SEARCH).to(tl.int64)
            w, inside = weights_at(weights, cols, valid & nucleus)
            mass += tl.sum(tl.where(order_bits(w, inside) >= kth[:, None], w, 0.0).to(tl.float64), axis=1)
    target = truncation.top_p.to(tl.float64) * mass * (1.0 - truncation.rtol)
    threshold = tl.maximum(kth, search_threshold(weights, valid, kth, target, nucleus, True, SEARCH))
    return tl.maximum(threshold, truncation.floor)  # (a floor of 0 without min-p: thresholds are >= 0)


@triton.jit
def kept_weights(weights, cols, valid, threshold, greedy, best):
    """The kept weights of a tile, float32 [R, C]: w where its bits reach the threshold, else 0; greedy rows
    one-hot at their argmax `best`."""
    w, inside = weights_at(weights, cols, valid)
    kept = kept_of(w, inside, threshold[:, None])
    return tl.where(greedy[:, None], tl.where(cols[None, :] == best[:, None], 1.0, 0.0), kept)


@triton.jit
def walk_tile(terms, columns, target, before, token, found, last):
    """One tile of an inverse-CDF walk: the first column whose running sum passes the target (only positive
    terms count), and the last positive one as the fallback for rounding. terms: float32 [R, C] in
    vocabulary order; columns: int64 [R, C] or [1, C], their columns; before: float64 [R], the sum of
    earlier tiles -> (before, token, found, last) updated."""
    positive = terms > 0.0
    running = before[:, None] + tl.cumsum(terms.to(tl.float64), axis=1)
    passes = tl.min(tl.where(positive & (running > target[:, None]), columns, PAST_END), axis=1)
    token = tl.where(~found & (passes < PAST_END), passes, token)
    found = found | (passes < PAST_END)
    last = tl.maximum(last, tl.max(tl.where(positive, columns, -1), axis=1))
    return before + tl.sum(terms.to(tl.float64), axis=1), token, found, last


@triton.jit
def residual_terms(kept, q, columns, recovery):
    """What a recovery draws from (SPEC §3.2; Recovery): max(0, kept * scale - q) where use_q, else kept
    without the excluded column. kept, q: float32 [R, C]; columns: int64 [R, C] or [1, C]."""
    residual = tl.maximum(kept * recovery.scale[:, None] - q, 0.0)
    without = tl.where(columns == recovery.excluded[:, None], 0.0, kept)
    return tl.where(recovery.use_q[:, None], residual, without)


@triton.jit
def relaxed_judge(logits, row, draft, top, active, k, delta, TILE: tl.constexpr):
    """SPEC §3.4 on softmax(masked logits) of `active` rows: the draft is among the k most likely (ranked by
    logit, ties to the lower id), has p > 0 and p >= p(top-1) - delta. top: the largest logit [R] -> bool [R]."""
    at_draft = load_logit_at(logits, row, draft, active)
    top = tl.where(active & (top > float("-inf")), top, 0.0)
    rank = tl.zeros_like(row)
    total = tl.zeros(row.shape, tl.float64)
    if any_row(active):
        for start in range(0, logits.V, TILE):
            cols = start + tl.arange(0, TILE).to(tl.int64)
            x, inside = load_logits(logits, row, cols, active)
            ahead = (x > at_draft[:, None]) | ((x == at_draft[:, None]) & (cols[None, :] < draft[:, None]))
            rank += tl.sum(tl.where(ahead & inside, 1, 0), axis=1).to(tl.int64)
            total += tl.sum(tl.where(inside, tl.exp(x - top[:, None]), 0.0).to(tl.float64), axis=1)
    p_draft = tl.exp(at_draft - top).to(tl.float64) / tl.where(total > 0, total, 1.0)
    return (
        active & (draft >= 0) & (p_draft > 0) & (rank < k) & (p_draft >= 1.0 / tl.where(total > 0, total, 1.0) - delta)
    )


@triton.jit
def program_rows(count, ROWS: tl.constexpr):
    """The rows of this program, int64 [ROWS], and which of them are among `count` -> (row, valid)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    return row, row < count


@triton.jit
def weigh_kernel(
    x_ptr,  # float [rows, V]: the logits (no grammar mask)
    t_ptr,  # float32 [rows]: temperatures
    k_ptr,  # int64 [rows]: top-k
    p_ptr,  # float32 [rows]: top-p
    mp_ptr,  # float32 [rows]: min-p (read where HAS_MIN_P)
    out_ptr,  # float32 [rows, V]: the truncated weights
    sums_ptr,  # float64 [rows, blocks]: their block sums
    rows,  # int
    V,  # int
    blocks,  # int: ceil(V / BLOCK)
    greedy_below,  # float
    rtol,  # float
    HAS_MIN_P: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
    SEARCH: tl.constexpr,
):
    """Truncated weights [rows, V] float32 and their block sums [rows, blocks] float64 (kernels.weigh_rows).
    ONE_BLOCK: V <= BLOCK, one sum per row; else TILE is a multiple of BLOCK."""
    row, valid = program_rows(rows, ROWS)
    logits = Logits(x_ptr, x_ptr, V, 0)  # no grammar mask
    requests = Requests(t_ptr, k_ptr, p_ptr, mp_ptr, k_ptr, k_ptr)
    largest, best = row_max_argmax(logits, row, valid, TILE)
    top = tl.where((largest == largest) & (tl.abs(largest) < float("inf")), largest, 0.0)
    greedy, inverse = temper(t_ptr, row, valid, greedy_below)
    weights = Weights(logits, row, top, inverse)
    truncation = load_truncation(requests, row, valid, rtol, HAS_MIN_P)
    threshold = kept_threshold(weights, valid, truncation, valid & ~greedy, SEARCH)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        kept = kept_weights(weights, cols, valid, threshold, greedy, best)
        inside = valid[:, None] & (cols[None, :] < V)
        tl.store(out_ptr + row[:, None] * V + cols[None, :], kept, mask=inside)
        if ONE_BLOCK:
            tl.store(sums_ptr + row * blocks, tl.sum(kept.to(tl.float64), axis=1), mask=valid)
        else:
            per_block = tl.sum(tl.reshape(kept.to(tl.float64), [ROWS, TILE // BLOCK, BLOCK]), axis=2)
            block = start // BLOCK + tl.arange(0, TILE // BLOCK).to(tl.int64)
            at = sums_ptr + row[:, None] * blocks + block[None, :]
            tl.store(at, per_block, mask=valid[:, None] & (block[None, :] < blocks))


@triton.jit
def argmax_kernel(x_ptr, out_ptr, rows, V, ROWS: tl.constexpr, TILE: tl.constexpr):
    """First argmax per row, NaN never winning (kernels.argmax_rows). x_ptr: float [rows, V]; out_ptr: int64 [rows]."""
    row, valid = program_rows(rows, ROWS)
    _, best = row_max_argmax(Logits(x_ptr, x_ptr, V, 0), row, valid, TILE)
    tl.store(out_ptr + row, best, mask=valid)


@triton.jit
def scan_kernel(x_ptr, use_ptr, out_ptr, rows, V, ROWS: tl.constexpr, TILE: tl.constexpr):
    """Per row in use (use_ptr: int8 [rows], != 0): 1 if it holds NaN or +inf, | 2 if it holds a value
    other than -inf; 0 for a row not in use (kernels.scan_rows). x_ptr: float [rows, V]; out_ptr: uint8 [rows]."""
    row, valid = program_rows(rows, ROWS)
    scanned = valid & (tl.load(use_ptr + row, mask=valid, other=0) != 0)
    bad = tl.zeros([ROWS], tl.int32)
    some = tl.zeros([ROWS], tl.int32)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE)
        inside = scanned[:, None] & (cols[None, :] < V)
        x = tl.load(x_ptr + row[:, None] * V + cols[None, :], mask=inside, other=float("-inf")).to(tl.float32)
        bad = bad | tl.max(((x != x) | (x == float("inf"))).to(tl.int32), axis=1)
        some = some | tl.max((x != float("-inf")).to(tl.int32), axis=1)
    tl.store(out_ptr + row, (bad | (some * 2)).to(tl.uint8), mask=valid)


@triton.jit
def _drawn_terms(draws, weight_row, cols, valid, recovery, RECOVERY: tl.constexpr):
    """A tile of what draw_kernel draws from (Draws): the given weights, or (RECOVERY) the recovery's terms."""
    V = draws.V
    inside = valid[:, None] & (cols[None, :] < V)
    terms = tl.load(draws.weights + weight_row[:, None] * V + cols[None, :], mask=inside, other=0.0)
    if RECOVERY:
        q = tl.load(recovery.probs + recovery.q_row[:, None] * V + cols[None, :], mask=inside, other=0.0)
        terms = residual_terms(terms, q.to(tl.float32), cols[None, :], recovery)
    return terms


@triton.jit
def draw_kernel(
    draws,  # Draws: weights float32 [.., V], uniforms float64 [rows], tokens int64 [rows], V, rows, positions, weight_rows
    recovering,  # RecoveryRows: probs float [rows, V], scale float32 [rows], use_q int8 [rows], excluded int64 [rows]
    RECOVERY: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
):
    """Inverse-CDF draws from given weights [.., V] float32 (kernels.sample_rows), or (RECOVERY) the recovery
    draw of sampled mode (kernels.recover_rows): row r = (request, position) reads weight row
    (r // positions) * weight_rows + r % positions, draft probabilities q [rows, V], and per row the
    scale (float32, 1 / kept mass), use_q (int8) and excluded column (int64, -1: none)."""
    V = draws.V
    row, valid = program_rows(draws.rows, ROWS)
    weight_row = (row // draws.positions) * draws.weight_rows + row % draws.positions
    probs = recovering.probs
    nothing = tl.zeros([ROWS], tl.float32)
    recovery = Recovery(probs, row, valid, nothing, row < 0, tl.full([ROWS], -1, tl.int64), nothing)
    if RECOVERY:
        scale = tl.load(recovering.scale + row, mask=valid, other=0.0)
        use_q = tl.load(recovering.use_q + row, mask=valid, other=0) != 0
        excluded = tl.load(recovering.excluded + row, mask=valid, other=-1)
        recovery = Recovery(probs, row, valid, scale, use_q, excluded, nothing)
        # a residual without mass (p~ == q) falls back to p~
        residual = tl.zeros([ROWS], tl.float64)
        for start in range(0, V, TILE):
            cols = start + tl.arange(0, TILE).to(tl.int64)
            terms = _drawn_terms(draws, weight_row, cols, valid, recovery, RECOVERY)
            residual += tl.sum(tl.where(use_q[:, None], terms, 0.0).to(tl.float64), axis=1)
        recovery = Recovery(probs, row, valid, scale, use_q & (residual > 0), excluded, nothing)
    total = tl.zeros([ROWS], tl.float64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        total += tl.sum(_drawn_terms(draws, weight_row, cols, valid, recovery, RECOVERY).to(tl.float64), axis=1)
    target = tl.load(draws.uniforms + row, mask=valid, other=0.0) * total
    before = tl.zeros([ROWS], tl.float64)
    token = tl.zeros([ROWS], tl.int64)
    found = row < 0
    last = tl.full([ROWS], -1, tl.int64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        terms = _drawn_terms(draws, weight_row, cols, valid, recovery, RECOVERY)
        before, token, found, last = walk_tile(terms, cols[None, :], target, before, token, found, last)
    tl.store(draws.tokens + row, tl.where(found, token, tl.maximum(last, 0)), mask=valid)


@triton.jit
def relaxed_kernel(
    logits,  # Logits: data float [requests * logit_positions, V], no grammar mask (words: the logits)
    rule,  # RelaxedRows: drafts int64 [rows], accepted int8 [rows], top1 int64 [rows], rows, positions, ...
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
):
    """The relaxed rule at each drafted position (kernels.relaxed_rows): row r = (request, position) reads
    logit row (r // positions) * logit_positions + r % positions."""
    row, valid = program_rows(rule.rows, ROWS)
    logit_row = (row // rule.positions) * rule.logit_positions + row % rule.positions
    top, best = row_max_argmax(logits, logit_row, valid, TILE)
    draft = tl.load(rule.drafts + row, mask=valid, other=-1)
    accepted = relaxed_judge(logits, logit_row, draft, top, valid, rule.k, rule.delta, TILE)
    tl.store(rule.accepted + row, accepted.to(tl.int8), mask=valid)
    tl.store(rule.top1 + row, best, mask=valid)


@triton.jit
def rescale(old, new, inverse, active):
    """What turns weights taken with the top `old` into weights taken with `new` (float32 [R], new >= old
    where active): exp((old - new) * inverse) in float64, <= 1; 1 for rows not active or whose top did
    not change -> float64 [R]."""
    grown = active & (new != old)
    exponent = (old.to(tl.float64) - new.to(tl.float64)) * inverse.to(tl.float64)
    return tl.where(grown, tl.exp(tl.where(grown, exponent, 0.0)), 1.0)


@triton.jit
def deepen_histogram(counts, masses, lead, grown):
    """first_pass's histogram after the top grew by `grown` nats (float32 [R], 0 where it did not): every
    bucket moves deeper by whole buckets, the deepest ones merging into the last, masses scaled down, and
    lead takes up the rest -> (counts, masses, lead)."""
    buckets = tl.arange(0, BUCKETS)
    steps = tl.maximum(tl.ceil((grown - lead) / BUCKET_NATS), 0.0)  # whole buckets deeper
    lead = lead + steps * BUCKET_NATS - grown
    shift = tl.minimum(steps, BUCKETS).to(tl.int32)
    moved = tl.minimum(buckets[None, :] + shift[:, None], BUCKETS - 1)[:, :, None] == buckets[None, None, :]
    counts = tl.sum(tl.where(moved, counts[:, :, None], 0.0), axis=1)
    masses = tl.sum(tl.where(moved, masses[:, :, None], 0.0), axis=1) * tl.exp(-grown)[:, None]
    return counts, masses, lead


@triton.jit
def first_pass(logits, row, valid, inverse, roles, SHAPE: tl.constexpr):
    """Pass 1 of verify_kernel, the only full read of most rows -> FirstPass: the largest masked logit (NaN
    skipped, -inf when none) and its lowest index, and the top of the weights (it, 0 where it is not
    finite). For plain rows (Roles), the float64 sum of each tile's weights [R, TILES] (NaN left out) with the
    final top: a tile's sum is taken with the top known at that tile and multiplied by exp((old - new) *
    inverse) in float64 each time the top grows later, so it differs from the exact sum by the rounding of
    the weights' exponents (WALK_MARGIN); tiles from the final top's on are exact. For truncating rows, a
    histogram of the weights by depth (BUCKETS buckets of BUCKET_NATS; the last one holds everything
    deeper, -inf and NaN logits none): counts and approximate masses, float32 [R, BUCKETS]. Bucket i holds
    the depths below the top in [i * BUCKET_NATS - lead, (i + 1) * BUCKET_NATS - lead), lead in [0,
    BUCKET_NATS) nats [R]: as the top grows the histogram moves deeper by whole buckets and lead takes up
    the rest, so that the buckets' edges stay where they were (up to float32 rounding) and each weight sits
    in its final bucket. Also the bits of the smallest weight of a finite logit, `deepest` (int64 [R]; 0
    for rows not truncating)."""
    ROWS: tl.constexpr = SHAPE.ROWS
    TILE: tl.constexpr = SHAPE.TILE
    TILES: tl.constexpr = SHAPE.TILES
    plain = roles.plain
    sifted = roles.truncating
    best = tl.full([ROWS], float("-inf"), tl.float32)
    index = tl.zeros([ROWS], tl.int64)
    top = tl.zeros([ROWS], tl.float32)
    slots = tl.arange(0, TILES)
    sums = tl.zeros([ROWS, TILES], tl.float64)
    buckets = tl.arange(0, BUCKETS)
    counts = tl.zeros([ROWS, BUCKETS], tl.float32)
    masses = tl.zeros([ROWS, BUCKETS], tl.float32)
    lead = tl.zeros([ROWS], tl.float32)
    least = tl.full([ROWS], float("inf"), tl.float32)
    any_plain = any_row(plain)
    any_sifted = any_row(sifted)
    for start in range(0, logits.V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        tile = start // TILE
        x, inside = load_logits(logits, row, cols, valid)
        seen = best > float("-inf")
        best, index = max_argmax_update(x, inside, cols, best, index)
        now = tl.where(tl.abs(best) < float("inf"), best, 0.0)
        w = weights_of(x, now, inverse)
        if any_plain:
            sums = tl.where(
                slots[None, :] == tile,
                tl.sum(kept_of(w, inside, 0).to(tl.float64), axis=1)[:, None],
                sums * rescale(top, now, inverse, plain & seen & (tl.abs(best) < float("inf")))[:, None],
            )
        if any_sifted:
            grown = tl.where(sifted & seen, (now - top) * inverse, 0.0)
            if tl.max(grown, axis=0) > 0:
                counts, masses, lead = deepen_histogram(counts, masses, lead, grown)
            counted = sifted[:, None] & inside & (x > float("-inf"))
            depth = ((now[:, None] - x) * inverse[:, None] + lead[:, None]) / BUCKET_NATS
            bucket = tl.where(counted, tl.floor(tl.minimum(tl.maximum(depth, 0.0), BUCKETS - 1)), -1.0).to(tl.int32)
            hits = bucket[:, :, None] == buckets[None, None, :]
            counts += tl.sum(hits.to(tl.float32), axis=1)
            masses += tl.sum(tl.where(hits, w[:, :, None], 0.0), axis=1)
            least = tl.minimum(least, tl.min(tl.where(counted, x, float("inf")), axis=1))
        top = now
    deepest = tl.where(least < float("inf"), tl.exp((least - top) * inverse).to(tl.int32, bitcast=True), 0)
    return FirstPass(best, index, top, sums, counts, masses, lead, deepest.to(tl.int64))


@triton.jit
def tile_sums(weights, active, threshold, sums, TILE: tl.constexpr):
    """The float64 sum of the kept weights (bits >= threshold [R]) of each tile of `active` rows, written
    into their slots of sums [R, TILES] (other rows' kept) -> sums."""
    slots = tl.arange(0, sums.shape[1])
    for start in range(0, weights.logits.V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        w, inside = weights_at(weights, cols, active)
        kept = kept_of(w, inside, threshold[:, None])
        at = active[:, None] & (slots[None, :] == start // TILE)
        sums = tl.where(at, tl.sum(kept.to(tl.float64), axis=1)[:, None], sums)
    return sums


@triton.jit
def in_order(sums, V, TILE: tl.constexpr):
    """The float64 total of tile sums [R, TILES], added tile after tile as a walk adds them -> [R]."""
    slots = tl.arange(0, sums.shape[1])
    total = tl.zeros([sums.shape[0]], tl.float64)
    for start in range(0, V, TILE):
        total += tl.sum(tl.where(slots[None, :] == start // TILE, sums, 0.0), axis=1)
    return total


@triton.jit
def candidate_bound(first, truncation, roles):
    """Where a sifted row's candidates start, as weight bits [R] (at least 1: never a zero weight): the lower
    edge (less EDGE_SLACK) of the first histogram bucket (first_pass's FirstPass, starting lead nats above
    the top) whose cumulative count reaches top_k (top-k rows), else whose cumulative mass reaches top_p of
    the row's with a margin (top-p rows), or the deepest weight where that lies below it; raised to min-p's
    floor unless both top-k and top-p apply; 1 (every positive weight) where no bucket but the last one
    reaches. Also how many candidates there are by the histogram (0 where min-p raised the bound) ->
    (bound int64 [R], float32 [R])."""
    buckets = tl.arange(0, BUCKETS)
    above = tl.cumsum(first.counts, axis=1)
    by_count = above >= truncation.top_k.to(tl.float32)[:, None]
    masses = first.masses
    by_mass = tl.cumsum(masses, axis=1) >= (truncation.top_p * (1.0 + MASS_MARGIN) * tl.sum(masses, axis=1))[:, None]
    reaches = tl.where(roles.limited[:, None], by_count, roles.nucleus[:, None] & by_mass)
    depth = tl.min(tl.where(reaches, buckets[None, :], BUCKETS - 1), axis=1)
    edge = bucket_edge(first.lead, depth + 1) - EDGE_SLACK
    bound = tl.maximum(tl.where(depth < BUCKETS - 1, tl.maximum(edge, first.deepest), 1), 1)
    raised = tl.where(roles.limited & roles.nucleus, bound, tl.maximum(bound, truncation.floor))
    at_least = tl.sum(tl.where(buckets[None, :] == depth[:, None], above, 0.0), axis=1)
    return raised, tl.where(raised == bound, at_least, 0.0)


@triton.jit
def bucket_edge(lead, depth):
    """The weight bits [R] (int64) where histogram bucket `depth` (int [R]) begins: exp(lead - depth * BUCKET_NATS)."""
    return tl.exp(lead - depth.to(tl.float32) * BUCKET_NATS).to(tl.int32, bitcast=True).to(tl.int64)


@triton.jit
def sure_bound(masses, lead, top_p):
    """Where a top-p row's surely kept weights start, as weight bits [R]: the upper edge of the first
    histogram bucket whose cumulative mass reaches top_p of the row's less MASS_MARGIN (the nucleus
    threshold lies at or below it), plus EDGE_SLACK, at most ONE_UP (nothing sure) -> int64 [R]."""
    buckets = tl.arange(0, BUCKETS)
    reaches = tl.cumsum(masses, axis=1) >= (top_p * (1.0 - MASS_MARGIN) * tl.sum(masses, axis=1))[:, None]
    depth = tl.min(tl.where(reaches, buckets[None, :], BUCKETS - 1), axis=1)
    return tl.minimum(bucket_edge(lead, depth) + EDGE_SLACK, ONE_UP)


@triton.jit
def compact(weights, sifted, region, split, scratch, SHAPE: tl.constexpr):
    """Pass 2 of verify_kernel (and the refining passes of top-p rows), for sifted rows, SEARCH columns at a
    time -> Compacted: the float64 sum of their exact weights (NaN left out), the count of positive ones,
    every column whose weight bits lie in the Region [bound, hi) written in vocabulary order to the row's
    slots of the Scratch as (bits << 32) | column (a count above CANDIDATES: they
    did not all fit; the first CANDIDATES are written), the float64 sums per tile of the weights at or above
    hi (float64 [R, TILES]: kept whatever the threshold in the region), and for `split` rows, per cut i of
    the region (split_edges: cut i holds the bits in [edge i, edge i - 1), edge -1 = hi), the float64 mass
    of the candidates at or above edge i, the smallest candidate's bits at or above it and the largest
    below edge i - 1 (int64 [R, SPLITS]; the cut's range where it holds any)."""
    ROWS: tl.constexpr = SHAPE.ROWS
    bound = region.bound
    hi = region.hi
    mass = tl.zeros([ROWS], tl.float64)
    positives = tl.zeros([ROWS], tl.int32)
    count = tl.zeros([ROWS], tl.int32)
    slots = tl.arange(0, SHAPE.TILES)
    sure = tl.zeros([ROWS, SHAPE.TILES], tl.float64)
    cut = tl.zeros([ROWS, SPLITS], tl.float64)
    least = tl.full([ROWS, SPLITS], PAST_END, tl.int64)
    most = tl.full([ROWS, SPLITS], -1, tl.int64)
    lower = split_edges(bound, hi, 1)
    upper = split_edges(bound, hi, 0)
    any_split = any_row(sifted & split)
    if any_row(sifted):
        for start in range(0, weights.logits.V, SHAPE.SEARCH):
            cols = start + tl.arange(0, SHAPE.SEARCH).to(tl.int64)
            w, inside = weights_at(weights, cols, sifted)
            keys = order_bits(w, inside)
            mass += tl.sum(tl.where(keys >= 0, w, 0.0).to(tl.float64), axis=1)
            positives += tl.sum((keys > 0).to(tl.int32), axis=1)
            chosen = (keys >= bound[:, None]) & (keys < hi[:, None])
            at = count[:, None] + tl.cumsum(chosen.to(tl.int32), axis=1) - 1
            slot = scratch.words + scratch.row[:, None] * SHAPE.CANDIDATES + at
            tl.store(slot, (keys << 32) | cols[None, :], mask=chosen & (at < SHAPE.CANDIDATES))
            count += tl.sum(chosen.to(tl.int32), axis=1)
            above = tl.sum(tl.where(keys >= hi[:, None], w, 0.0).to(tl.float64), axis=1)
            sure = tl.where(slots[None, :] == start // SHAPE.TILE, sure + above[:, None], sure)
            if any_split:
                reaches = chosen[:, :, None] & (keys[:, :, None] >= lower[:, None, :])
                cut += tl.sum(tl.where(reaches, w.to(tl.float64)[:, :, None], 0.0), axis=1)
                least = tl.minimum(least, tl.min(tl.where(reaches, keys[:, :, None], PAST_END), axis=1))
                under = chosen[:, :, None] & (keys[:, :, None] < upper[:, None, :])
                most = tl.maximum(most, tl.max(tl.where(under, keys[:, :, None], -1), axis=1))
    return Compacted(mass, positives, count, sure, cut, least, most)


@triton.jit
def split_edges(bound, hi, OFFSET: tl.constexpr):
    """The cuts' edges of a region of weight bits [bound, hi) (int64 [R]): hi - (hi - bound) * (i + OFFSET)
    // SPLITS for i < SPLITS, descending: OFFSET 1, where each cut begins (the last one `bound`); OFFSET 0,
    where each one ends (the first one hi) -> int64 [R, SPLITS]."""
    steps = tl.arange(0, SPLITS).to(tl.int64) + OFFSET
    return hi[:, None] - ((hi - bound)[:, None] * steps[None, :]) // SPLITS


@triton.jit
def refine_region(compacted, above, target, bound, floor):
    """The next region of a top-p row that compact cut (Compacted) but whose candidates did not decide it:
    the range of bits [least, most + 1) that the candidates of cut i hold, i the first cut where the tail
    above + cut (above: the mass at or above the region) reaches the target, so the nucleus threshold lies
    in it. It is `pinned` (the threshold is its lower end, nothing is left to list: the next region is
    [t, t), everything at or above t sure) where the cut holds one value (ties), and where no cut reaches
    the target on a row whose bound is min-p's floor (the threshold lies below it, so the floor decides).
    Also whether there is a next region (the threshold below the region's top, and in it or under the
    floor) -> (bound, hi, found, pinned), int64 [R] and bool [R]."""
    steps = tl.arange(0, SPLITS)
    first = tl.min(tl.where(above[:, None] + compacted.cut >= target[:, None], steps[None, :], SPLITS), axis=1)
    lower = tl.sum(tl.where(steps[None, :] == first[:, None], compacted.least, 0), axis=1)
    upper = tl.sum(tl.where(steps[None, :] == first[:, None], compacted.most, 0), axis=1) + 1
    floored = (first == SPLITS) & (floor >= bound)
    found = (above < target) & ((first < SPLITS) | floored)
    pinned = found & (floored | (upper - lower == 1))
    lower = tl.where(floored, bound, lower)
    return lower, tl.where(pinned, lower, upper), found, pinned


@triton.jit
def load_candidates(scratch, fits, count, CANDIDATES: tl.constexpr):
    """The candidates compact wrote to the Scratch for rows that `fits` (bool [R]; count int32 [R] of them): which slots
    hold one, their packed words, keys (weight bits, -1 past the count) and weights -> (bool [R, C],
    int64 [R, C], int64 [R, C], float32 [R, C])."""
    slots = tl.arange(0, CANDIDATES)
    held = fits[:, None] & (slots[None, :] < count[:, None])
    packed = tl.load(scratch.words + scratch.row[:, None] * CANDIDATES + slots[None, :], mask=held, other=-1)
    keys = tl.where(held, packed >> 32, -1)
    return held, packed, keys, tl.where(held, keys.to(tl.int32).to(tl.float32, bitcast=True), 0.0)


@triton.jit
def resolve_candidates(scratch, sifted, compacted, truncation, roles, region, above, SHAPE: tl.constexpr):
    """SPEC §2 steps 3-5 on a sifted row's candidates (Compacted: the weights with bits in the Region; the
    mass `above` [R] at or above hi, for top-p rows, is added to every tail), where they decide it: the
    kept set's threshold (int64 bits [R], keeping the set kept_threshold keeps), whether the candidates
    decide it (`resolved`: they all fit, every value the threshold depends on is among them, every weight
    that reaches it is a candidate or at or above hi, and every weight at or above hi reaches it), the
    candidates' kept weights (float32 [R, CANDIDATES], 0 for the others and past the count) with their
    columns (int64 [R, CANDIDATES]), and the top-p target -> (threshold, resolved, kept, columns, target)."""
    count = compacted.count
    fits = sifted & (count <= SHAPE.CANDIDATES)
    held, packed, keys, weights = load_candidates(scratch, fits, count, SHAPE.CANDIDATES)
    every = fits & (count == compacted.positives)  # every positive weight is a candidate
    # top-k: the k-th largest weight, where it is a candidate
    top_k = truncation.top_k
    kth_here = roles.limited & (count.to(tl.int64) >= top_k)
    ones = tl.where(held, 1.0, 0.0).to(tl.float64)
    nothing = tl.zeros_like(above)
    kth = search_candidates(keys, ones, tl.zeros_like(top_k), top_k.to(tl.float64), nothing, kth_here)
    # top-p on the top-k-renormalised row: the largest weight whose tail reaches the target
    amounts = tl.where(keys >= kth[:, None], weights, 0.0).to(tl.float64)
    mass = tl.where(kth_here, tl.sum(amounts, axis=1), compacted.mass)
    target = truncation.top_p.to(tl.float64) * mass * (1.0 - truncation.rtol)
    nucleus_here = roles.nucleus & (above + tl.sum(amounts, axis=1) >= target)
    reached = search_candidates(keys, amounts, kth, target, above, nucleus_here)
    threshold = tl.maximum(tl.maximum(kth, reached), truncation.floor)
    # an unknown k-th weight lies below the candidates and leaves top-p unknown; an unknown nucleus lies below them
    known = ~roles.limited | kth_here | every | ~roles.nucleus
    # a tail that reaches the target at hi leaves the threshold unknown above it
    sure = (reached < region.hi) & (threshold <= region.hi)
    resolved = fits & known & sure & ((threshold >= region.bound) | every)
    return threshold, resolved, tl.where(keys >= threshold[:, None], weights, 0.0), packed & 0xFFFFFFFF, target


@triton.jit
def search_candidates(keys, amounts, floor, target, base, active):
    """search_threshold over candidates held in registers: keys int64 [R, C] (-1: no candidate), amounts
    float64 [R, C] (1 each: a count) -> int64 bits [R], the largest t such that base [R] (float64, the
    amount above every candidate) plus the amounts of {keys >= t, keys >= floor [R]} reaches the target
    [R]; 0 where even all of them fall short, and for rows not active."""
    prefix = tl.zeros_like(floor)
    digits = tl.arange(0, RADIX).to(tl.int64)
    counted = tl.where(keys >= floor[:, None], amounts, 0.0)
    for level in tl.static_range(8):
        shift = 28 - 4 * level
        candidates = prefix[:, None] + (digits[None, :] << shift)  # [R, RADIX]
        tail = tl.sum(tl.where(keys[:, :, None] >= candidates[:, None, :], counted[:, :, None], 0.0), axis=1)
        tail = base[:, None] + tail
        prefix = prefix + (tl.max(tl.where(tail >= target[:, None], digits[None, :], 0), axis=1) << shift)
    return tl.where(active, prefix, 0)


@triton.jit
def candidate_tile_sums(sure, kept, columns, V, TILE: tl.constexpr):
    """Per tile, sure [R, TILES] (float64, the kept weights at or above the candidates) plus the kept weights
    of the candidates in it (kept float32 [R, C] at columns int64 [R, C]) -> float64 [R, TILES]."""
    slots = tl.arange(0, sure.shape[1])
    tile = columns // TILE
    for start in range(0, V, TILE):
        inside = tl.sum(tl.where(tile == start // TILE, kept, 0.0).to(tl.float64), axis=1)
        sure = tl.where(slots[None, :] == start // TILE, sure + inside[:, None], sure)
    return sure


@triton.jit
def over_joint(q, recovery, BLOCK: tl.constexpr):
    """The q a recovery (Recovery) takes from the draft's probabilities q (float32 [R, C]): q itself, or
    (BLOCK, block verification) q / P, times recovery.inverse -> float32 [R, C]."""
    if BLOCK:
        q = q * recovery.inverse[:, None]
    return q


@triton.jit
def residual_tile_sums(weights, walked, threshold, recovery, SHAPE: tl.constexpr, BLOCK: tl.constexpr):
    """Per tile of `walked` rows (bool [R]), the float64 sums of the recovery's terms (residual_terms,
    Recovery; BLOCK: with q / P) and of the kept weights without the excluded column -> (residual sums,
    without sums), float64 [R, TILES]."""
    ROWS: tl.constexpr = walked.shape[0]
    TILE: tl.constexpr = SHAPE.TILE
    V = weights.logits.V
    slots = tl.arange(0, SHAPE.TILES)
    residual = tl.zeros([ROWS, SHAPE.TILES], tl.float64)
    without = tl.zeros([ROWS, SHAPE.TILES], tl.float64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        at = slots[None, :] == start // TILE
        w, inside = weights_at(weights, cols, walked)
        kept = kept_of(w, inside, threshold[:, None])
        q = tl.load(recovery.probs + recovery.q_row[:, None] * V + cols[None, :], mask=inside, other=0.0)
        terms = residual_terms(kept, over_joint(q.to(tl.float32), recovery, BLOCK), cols[None, :], recovery)
        residual = tl.where(at, tl.sum(terms.to(tl.float64), axis=1)[:, None], residual)
        kept = tl.where(cols[None, :] == recovery.excluded[:, None], 0.0, kept)
        without = tl.where(at, tl.sum(kept.to(tl.float64), axis=1)[:, None], without)
    return residual, without


@triton.jit
def walk_tiles(weights, walking, kept, target, recovery, FLAGS: tl.constexpr, TILE: tl.constexpr):
    """The inverse-CDF walk over the kept weights (KeptSet; Flags.SAMPLED: the recovery's terms for judged
    rows, Recovery, with q / P under BLOCK_VERIFICATION) of `walking` rows, tile after tile as a walk over
    every tile, but reading a tile only where its sum (kept.sums [R, TILES], the sums of those terms: exact,
    or first_pass's within rounding) can take the running sum past the target: within WALK_MARGIN, above
    that rounding, so it stops where the full walk would. The running sum enters a tile as the total of the
    earlier tiles' sums, read or not (so which tiles are read does not change the draw, and the last one
    ends at in_order(sums), the mass the target is a share of); within a tile it adds the exact terms
    -> int64 [R]."""
    ROWS: tl.constexpr = walking.shape[0]
    V = weights.logits.V
    slots = tl.arange(0, kept.sums.shape[1])
    before = tl.zeros([ROWS], tl.float64)
    token = tl.zeros([ROWS], tl.int64)
    found = weights.row < 0
    last = tl.full([ROWS], -1, tl.int64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        tile_sum = tl.sum(tl.where(slots[None, :] == start // TILE, kept.sums, 0.0), axis=1)
        read = walking & ~found & (tile_sum > 0) & ~(before + tile_sum < target * (1.0 - WALK_MARGIN))
        w, inside = weights_at(weights, cols, read)
        terms = kept_of(w, inside, kept.threshold[:, None])
        if FLAGS.SAMPLED:
            q_at = recovery.probs + recovery.q_row[:, None] * V + cols[None, :]
            q = tl.load(q_at, mask=(read & recovery.judged)[:, None] & inside, other=0.0).to(tl.float32)
            q = over_joint(q, recovery, FLAGS.BLOCK_VERIFICATION)
            terms = residual_terms(terms, q, cols[None, :], recovery)
        _, token, found, last = walk_tile(terms, cols[None, :], target, before, token, found, last)
        before = before + tile_sum  # the tile's sum, not its terms' total: the same whether it was read
    return tl.where(found, token, tl.maximum(last, 0))


@triton.jit
def positions_of(drafts, ROWS: tl.constexpr):
    """Which (request b, position j <= K) each row of this program is (Drafts: B requests of K) -> Position."""
    per_request = drafts.K + 1
    row, valid = program_rows(drafts.B * per_request, ROWS)
    b = row // per_request
    j = row % per_request
    return Position(row, b, j, valid, valid & (j < drafts.K))


@triton.jit
def draft_at(drafts, at, V):
    """The draft at each drafted row (Position), or -1 where it or an earlier one is not an id in [0, V)."""
    K = drafts.K
    draft = tl.load(drafts.tokens + at.b * K + at.j, mask=at.drafted, other=-1).to(tl.int64)
    padded = ~at.drafted
    for i in range(0, K):
        earlier = tl.load(drafts.tokens + at.b * K + i, mask=at.drafted & (i <= at.j), other=0).to(tl.int64)
        padded = padded | ((i <= at.j) & ((earlier < 0) | (earlier >= V)))
    return tl.where(padded, -1, draft)


@triton.jit
def row_keys(requests, at, seed_low, seed_high, FLAGS: tl.constexpr):
    """Each row's key s_b + j, uint64 [R]: s_b from Requests.seeds, or (Flags.SHARED_SEED) one seed s plus
    b * ROW_STRIDE, given (Flags.SEED_GIVEN) as its low and high 32 bits."""
    if FLAGS.SEED_GIVEN:
        given = (seed_high.to(tl.uint32).to(tl.uint64) << 32) | seed_low.to(tl.uint32).to(tl.uint64)
        seed = given + at.b.to(tl.uint64) * ROW_STRIDE
    elif FLAGS.SHARED_SEED:
        shared = tl.load(requests.seeds + at.b * 0, mask=at.valid, other=0).to(tl.uint64, bitcast=True)
        seed = shared + at.b.to(tl.uint64) * ROW_STRIDE
    else:
        seed = tl.load(requests.seeds + at.b, mask=at.valid, other=0).to(tl.uint64, bitcast=True)
    return seed + at.j.to(tl.uint64)


@triton.jit
def row_roles(requests, at, greedy, truncation, V, HAS_RELAXED: tl.constexpr):
    """What each row (Position) does (Roles): greedy rows take the argmax, relaxed ones (HAS_RELAXED: drafted
    rows of thinking requests) the relaxed rule, the others a draw, truncated or not (Truncation)."""
    relaxed = at.row < 0
    if HAS_RELAXED:
        relaxed = at.drafted & ~greedy & (tl.load(requests.thinking + at.b, mask=at.valid, other=0) != 0)
    sampled = at.valid & ~greedy & ~relaxed
    limited, nucleus = truncated_rows(truncation, sampled, V)
    truncating = limited | nucleus | (sampled & (truncation.floor > 0))
    return Roles(greedy, relaxed, sampled, limited, nucleus, truncating, sampled & ~truncating)


@triton.jit
def sift_candidates(weights, first, truncation, roles, scratch, SHAPE: tl.constexpr):
    """The kept set of truncating rows from candidates (pass 2 on): compact lists the weights of a region
    (from candidate_bound: the whole kept set where it fits, else a top-p row's boundary region, with the
    weights above it sure) and resolve_candidates finds the threshold on them; a top-p row whose region did
    not decide it refines the region (refine_region) for up to LEVELS passes -> (threshold int64 [R],
    candidates float32 [R, C], columns int64 [R, C], decided, listed (the candidates are the kept set),
    bool [R], sums float64 [R, TILES]: first_pass's, with the kept tile sums of rows decided with a sure part)."""
    ROWS: tl.constexpr = SHAPE.ROWS
    CANDIDATES: tl.constexpr = SHAPE.CANDIDATES
    V = weights.logits.V
    row = weights.row
    bound, at_least = candidate_bound(first, truncation, roles)
    finite = tl.abs(first.largest) < float("inf")
    split = (
        roles.nucleus & ~roles.limited & finite
    )  # top-p rows: what lies above their boundary region is kept for sure
    sifted = roles.truncating & finite & ((at_least <= CANDIDATES) | split)
    hi = tl.where(split & (at_least > CANDIDATES), sure_bound(first.masses, first.lead, truncation.top_p), ONE_UP)
    threshold = tl.zeros([ROWS], tl.int64)
    candidates = tl.zeros([ROWS, CANDIDATES], tl.float32)
    columns = tl.zeros([ROWS, CANDIDATES], tl.int64)
    decided = row < 0
    listed = row < 0
    pinned = row < 0
    sums = first.sums
    for _level in range(LEVELS):
        if any_row(sifted):
            region = Region(bound, hi)
            tl.debug_barrier()  # the previous level's candidates have been read
            compacted = compact(weights, sifted, region, split, scratch, SHAPE)
            tl.debug_barrier()  # the candidates written above are read back by other threads of the program
            above = in_order(compacted.sure, V, SHAPE.TILE)
            found, resolved, kept, at, target = resolve_candidates(
                scratch, sifted, compacted, truncation, roles, region, above, SHAPE
            )
            now = sifted & (resolved | pinned)
            threshold = tl.where(now, tl.where(pinned, bound, found), threshold)
            candidates = tl.where(now[:, None], kept, candidates)
            columns = tl.where(now[:, None], at, columns)
            listed = listed | (now & (hi == ONE_UP))  # nothing sure: the candidates are the kept set
            if any_row(now & (hi < ONE_UP)):
                sure_sums = candidate_tile_sums(compacted.sure, kept, at, V, SHAPE.TILE)
                sums = tl.where((now & (hi < ONE_UP))[:, None], sure_sums, sums)
            decided = decided | now
            bound, hi, narrowed, pinned = refine_region(compacted, above, target, bound, truncation.floor)
            sifted = sifted & split & ~now & narrowed
    return threshold, candidates, columns, decided, listed, sums


@triton.jit
def kept_set(weights, valid, first, truncation, roles, scratch, SHAPE: tl.constexpr):
    """Each sampled row's kept set and its mass (KeptSet): rows without truncation by first_pass's tile sums,
    truncating ones on candidates (sift_candidates), or where those do not decide it, by the radix search
    of kept_threshold and one more pass for the tile sums."""
    threshold, candidates, columns, decided, listed, sums = sift_candidates(
        weights, first, truncation, roles, scratch, SHAPE
    )
    searched = roles.truncating & ~decided
    threshold = tl.where(decided, threshold, 0)
    if any_row(searched):
        found_threshold = kept_threshold(weights, valid, truncation, searched, SHAPE.SEARCH)
        threshold = tl.where(searched, found_threshold, threshold)
        sums = tile_sums(weights, searched, threshold, sums, SHAPE.TILE)
    in_tiles = in_order(sums, weights.logits.V, SHAPE.TILE)
    mass = tl.where(listed, tl.sum(candidates.to(tl.float64), axis=1), in_tiles)
    return KeptSet(threshold, candidates, columns, listed, sums, mass)


@triton.jit
def draft_odds(weights, draft, kept, recovery):
    """p~(d) and q(d) of the drafts at judged rows (Recovery), float64 [R] each (q(d) 1 where q gives the
    draft no mass: it is judged without a distribution, as its point mass), and which rows hold a draft and
    which of those q gives none -> (p_draft, q_draft, present, blind)."""
    judged = recovery.judged
    x_draft = load_logit_at(weights.logits, weights.row, draft, judged)
    w_draft = tl.exp((x_draft - weights.top) * weights.inverse)
    w_draft = tl.where(order_bits(w_draft, judged) >= kept.threshold, w_draft, 0.0)
    p_draft = tl.div_rn(w_draft, tl.where(judged, kept.mass, 1.0).to(tl.float32)).to(tl.float64)
    present = judged & (draft >= 0)
    q_at = recovery.probs + recovery.q_row * weights.logits.V + tl.where(present, draft, 0)
    q_draft = tl.load(q_at, mask=present, other=0.0).to(tl.float32).to(tl.float64)
    blind = q_draft <= 0
    return p_draft, tl.where(blind, 1.0, q_draft), present, blind


@triton.jit
def recovery_of(recovery, mass, draft, present, blind):
    """The Recovery of judged rows (draft_odds' present and blind): scale 1 / the kept mass (float64 [R]),
    the residual where q gives the draft mass, else p~ without the draft."""
    judged = recovery.judged
    scale = tl.where(judged, (1.0 / tl.where(mass > 0, mass, 1.0)).to(tl.float32), 0.0)
    excluded = tl.where(present & blind, draft, -1)
    return Recovery(recovery.probs, recovery.q_row, judged, scale, present & ~blind, excluded, recovery.inverse)


@triton.jit
def judge_draft(weights, draft, key, kept, recovery):
    """SPEC §3.2 for sampled drafts at judged rows (Recovery): accept where coin * q(draft) < p~(draft) (a
    draft q gives no mass is judged with q = 1 and left out of the recovery) -> (accepted bool [R], the
    Recovery they draw from if rejected, with its scale, use_q and excluded)."""
    p_draft, q_draft, present, blind = draft_odds(weights, draft, kept, recovery)
    coin = keyed_uniform(key, STREAM_ACCEPT)
    accepted = present & ~(coin * q_draft >= p_draft)
    return accepted, recovery_of(recovery, kept.mass, draft, present, blind)


@triton.jit
def recovery_mass(weights, kept, recovery, tiled, SHAPE: tl.constexpr, BLOCK: tl.constexpr):
    """The mass of what judged rows (Recovery) draw from if rejected: the residual's (q read where p~ is not
    0: elsewhere the residual is 0; BLOCK: q / P), or p~ without the draft where the residual has none; on
    the candidates of listed rows, by one more pass of logits and q for `tiled` ones -> (Recovery with use_q
    where the residual has mass, q at the candidates float32 [R, C], KeptSet with those rows' tile sums,
    total float64 [R]: the mass the draw's target is a share of)."""
    V = weights.logits.V
    judged = recovery.judged
    candidates = kept.candidates
    columns = kept.columns
    q_at = recovery.probs + recovery.q_row[:, None] * V + columns
    listed_q = tl.load(q_at, mask=(kept.listed & judged)[:, None] & (candidates > 0), other=0.0).to(tl.float32)
    listed_q = over_joint(listed_q, recovery, BLOCK)
    terms = residual_terms(candidates, listed_q, columns, recovery)
    residual = tl.sum(terms.to(tl.float64), axis=1)
    without = tl.sum(tl.where(columns == recovery.excluded[:, None], 0.0, candidates).to(tl.float64), axis=1)
    residual_sums = kept.sums
    without_sums = kept.sums
    walked = judged & tiled
    if any_row(walked):
        residual_sums, without_sums = residual_tile_sums(weights, walked, kept.threshold, recovery, SHAPE, BLOCK)
        residual = tl.where(walked, in_order(residual_sums, V, SHAPE.TILE), residual)
        without = tl.where(walked, in_order(without_sums, V, SHAPE.TILE), without)
    use_q = recovery.use_q & (residual > 0)
    sums = tl.where(walked[:, None], tl.where(use_q[:, None], residual_sums, without_sums), kept.sums)
    total = tl.where(judged, tl.where(use_q, residual, without), kept.mass)
    recovery = Recovery(
        recovery.probs, recovery.q_row, judged, recovery.scale, use_q, recovery.excluded, recovery.inverse
    )
    kept = KeptSet(kept.threshold, candidates, columns, kept.listed, sums, kept.mass)
    return recovery, listed_q, kept, total


# --- block verification (SPEC §3.6): a program holds whole requests, Shape.SPAN lanes each ----------------------


@triton.jit
def request_positions(drafts, SHAPE: tl.constexpr):
    """positions_of for block verification: lane i of the program is position j = i % SPAN of request
    b = program * (ROWS // SPAN) + i // SPAN (a row only where j <= K and b < B) -> Position."""
    SPAN: tl.constexpr = SHAPE.SPAN
    lane = tl.arange(0, SHAPE.ROWS).to(tl.int64)
    b = tl.program_id(0).to(tl.int64) * (SHAPE.ROWS // SPAN) + lane // SPAN
    j = lane % SPAN
    valid = (b < drafts.B) & (j <= drafts.K)
    return Position(b * (drafts.K + 1) + j, b, j, valid, valid & (j < drafts.K))


@triton.jit
def by_request(x, SPAN: tl.constexpr):
    """A program's lanes [R] as [R // SPAN, SPAN]: one request per row, its positions along it."""
    return tl.reshape(x, [x.shape[0] // SPAN, SPAN])


@triton.jit
def request_max(x, SPAN: tl.constexpr):
    """The largest value (int32 [R]) among each request's lanes, at every one of its lanes -> int32 [R]."""
    largest = tl.max(by_request(x, SPAN), axis=1)  # [R // SPAN]
    return tl.reshape(tl.broadcast_to(largest[:, None], [x.shape[0] // SPAN, SPAN]), [x.shape[0]])


@triton.jit
def joint_ratios(p_draft, q_draft, SPAN: tl.constexpr):
    """P_j of each lane j (SPEC §3.6): P_0 = 1, P_{i+1} = min(1, P_i p~_i(d_i) / q_i(d_i)) over the lanes
    of its request, in float64 (p_draft, q_draft: float64 [R] from draft_odds; past a request's drafts the
    product goes on over p~ = 0, q = 1: unused) -> float64 [R]."""
    p = by_request(p_draft, SPAN)  # [R // SPAN, SPAN]
    q = by_request(q_draft, SPAN)
    lanes = tl.arange(0, SPAN)[None, :]
    running = tl.full([p_draft.shape[0] // SPAN], 1.0, tl.float64)
    joint = tl.full([p_draft.shape[0] // SPAN, SPAN], 1.0, tl.float64)
    for i in range(0, SPAN - 1):
        p_i = tl.sum(tl.where(lanes == i, p, 0.0), axis=1)
        q_i = tl.sum(tl.where(lanes == i, q, 0.0), axis=1)
        running = tl.minimum(running * p_i / q_i, 1.0)
        joint = tl.where(lanes == i + 1, running[:, None], joint)
    return tl.reshape(joint, [p_draft.shape[0]])


@triton.jit
def residuals_at(weights, found, tiled, lanes, SHAPE: tl.constexpr):
    """recovery_mass (with q / P) for `lanes` (bool [R]) alone, merged into the Residuals found so far:
    one pass of logits and q where they are walked by tiles, q at the candidates where listed -> Residuals."""
    recovery = found.recovery
    step = Recovery(
        recovery.probs, recovery.q_row, lanes, recovery.scale, recovery.use_q, recovery.excluded, recovery.inverse
    )
    now, listed_q, kept, total = recovery_mass(weights, found.kept, step, tiled, SHAPE, True)
    use_q = tl.where(lanes, now.use_q, recovery.use_q)
    recovery = Recovery(
        recovery.probs, recovery.q_row, recovery.judged, recovery.scale, use_q, recovery.excluded, recovery.inverse
    )
    listed_q = tl.where(lanes[:, None], listed_q, found.listed_q)
    return Residuals(recovery, listed_q, kept, tl.where(lanes, total, found.total), found.computed | lanes)


@triton.jit
def longest_kept_prefix(weights, prefixes, found, tiled, tau, SHAPE: tl.constexpr):
    """SPEC §3.6's tau for requests whose whole block was not kept (tau < 0; the others' tau stays): going
    down from i = gamma - 1 to 1, the first prefix kept: P_i == 1, or u_i (R_i + 1 - P_i) < R_i with
    R_i = P_i * the mass of max(0, p~_i - q_i / P_i) (P_i (1 - p~_i(d)) where q_i is a point mass), computed
    at lane i only when its test comes and 0 < P_i < 1 (lazily: one pass of logits and q for a lane walked
    by tiles, q at the candidates for a listed one); 0 where none is. The recovery of lane tau < gamma is
    computed on the step after tau is found, with the lanes tested then, where its test did not compute it
    (Prefixes, Residuals whose recovery is judged where there is a draft) -> (tau int32 [R] at every lane
    of a request, Residuals)."""
    SPAN: tl.constexpr = SHAPE.SPAN
    lane = prefixes.lane
    joint = prefixes.joint
    for step in range(0, SPAN):  # (gamma <= SPAN - 1 tests, and the step that computes tau's recovery)
        current = prefixes.drafted - 1 - step  # the prefix tested now, at its lane (a request's at every lane)
        tau = tl.where((tau < 0) & (current < 1), 0, tau)  # no longer prefix kept
        tested = (tau < 0) & (lane == current)
        # R_i where it decides the test (0 where P_i is, and no q at all for a point mass), and tau's recovery
        needs = tested & (joint < 1.0) & (joint > 0.0) & ~prefixes.blind
        needs = needs | (found.recovery.judged & (lane == tau) & ~found.computed)
        if any_row(needs):
            found = residuals_at(weights, found, tiled, needs, SHAPE)
        if any_row(tested):
            residual = tl.where(found.recovery.use_q, found.total, 0.0)
            residual = tl.where(prefixes.blind, tl.maximum(1.0 - prefixes.p_draft, 0.0), residual)
            mass = joint * residual  # R_i
            kept = tested & ((joint >= 1.0) | (prefixes.coin * (mass + 1.0 - joint) < mass))
            tau = tl.where(request_max(kept.to(tl.int32), SPAN) > 0, current, tau)
    return tau, found


@triton.jit
def block_verdict(weights, draft, key, kept, recovery, tiled, SHAPE: tl.constexpr):
    """SPEC §3.6 at the judged lanes (Recovery) of whole requests, SPAN lanes each: the joint ratios P_j,
    the whole block kept where u_gamma q(d) < P_{gamma-1} p~(d) at its last draft (the coin of §3.2), else
    the longest kept prefix tau going down (longest_kept_prefix), and at tau < gamma the recovery from
    max(0, p~_tau - q_tau / P_tau) (with §3.2's fallbacks) -> (accepted bool [R]: the lanes before tau, the
    Recovery judged at lane tau alone, q / P at the candidates float32 [R, C], KeptSet, total float64 [R],
    the lanes that draw by a walk over tiles: tau's and the bonus lane, bool [R])."""
    SPAN: tl.constexpr = SHAPE.SPAN
    lane = (tl.arange(0, SHAPE.ROWS) % SPAN).to(tl.int32)  # [R]: the position j of each lane
    p_draft, q_draft, present, blind = draft_odds(weights, draft, kept, recovery)  # float64 [R], bool [R]
    joint = joint_ratios(p_draft, q_draft, SPAN)  # float64 [R]: P_j
    usable = present & ~blind & (joint > 0)
    inverse = tl.where(usable, tl.minimum(1.0 / tl.where(usable, joint, 1.0), FLOAT32_MAX), 1.0).to(tl.float32)
    r = recovery
    judged = Recovery(r.probs, r.q_row, present, r.scale, r.use_q, r.excluded, inverse)
    nothing = tl.zeros_like(kept.candidates)
    found = Residuals(recovery_of(judged, kept.mass, draft, present, blind), nothing, kept, kept.mass, lane < 0)
    drafted = request_max(tl.where(present, lane + 1, 0), SPAN)  # int32 [R]: gamma
    coin = keyed_uniform(key, STREAM_ACCEPT)
    whole = present & (lane == drafted - 1) & (coin * q_draft < joint * p_draft)
    tau = tl.where(request_max(whole.to(tl.int32), SPAN) > 0, drafted, -1)  # int32 [R]: -1 until known
    prefixes = Prefixes(lane, joint, p_draft, blind, drafted, keyed_uniform(key - 1, STREAM_ACCEPT))
    tau, found = longest_kept_prefix(weights, prefixes, found, tiled, tau, SHAPE)
    recovering = present & (lane == tau)
    drawing = tiled & ((lane == tau) | ~recovery.judged)  # (the bonus lane is not judged)
    r = found.recovery
    recovery = Recovery(r.probs, r.q_row, recovering, r.scale, r.use_q & recovering, r.excluded, r.inverse)
    return present & (lane < tau), recovery, found.listed_q, found.kept, found.total, drawing


@triton.jit
def draw(weights, kept, tiled, target, recovery, listed_q, FLAGS: tl.constexpr, TILE: tl.constexpr):
    """The inverse-CDF draw of each sampled row at `target` (float64 [R]) from its kept set (KeptSet;
    Flags.SAMPLED: the recovery's terms for judged rows, Recovery, q at the candidates listed_q, q / P under
    BLOCK_VERIFICATION): `tiled` rows by a walk over tiles, listed ones over their candidates -> int64 [R]
    (0 for other rows)."""
    drawn = tl.zeros_like(weights.row)
    if any_row(tiled):
        drawn = walk_tiles(weights, tiled, kept, target, recovery, FLAGS, TILE)
    if any_row(kept.listed):
        terms = kept.candidates
        if FLAGS.SAMPLED:
            terms = residual_terms(kept.candidates, listed_q, kept.columns, recovery)
        nothing = tl.zeros(target.shape, tl.float64)
        zero = tl.zeros_like(weights.row)
        _, token, found, last = walk_tile(terms, kept.columns, target, nothing, zero, weights.row < 0, zero - 1)
        drawn = tl.where(kept.listed, tl.where(found, token, tl.maximum(last, 0)), drawn)
    return drawn


@triton.jit
def store_outputs(outputs, at, committed, accepted, K):
    """Write each drafted row's committed token to recovered [B, K], the bonus row's to bonus [B], and lower
    first [B] to the row's position where its draft is rejected (Outputs, Position)."""
    tl.store(outputs.recovered + at.b * K + at.j, committed, mask=at.drafted)
    tl.store(outputs.bonus + at.b, committed, mask=at.valid & (at.j == K))
    tl.atomic_min(outputs.first + at.b, at.j, mask=at.drafted & ~accepted)


@triton.jit(do_not_specialize=["seed_low", "seed_high"])
def verify_kernel(
    logits,  # Logits: data float [B*(K+1), V], words int32 [B*(K+1), W], V, W
    requests,  # Requests: temperature, top_k, top_p, min_p, seeds, thinking, [B] each
    drafts,  # Drafts: tokens int64 [B, K], probs float [B, K, V], B, K
    outputs,  # Outputs: first int64 [B], recovered int64 [B, K], bonus int64 [B], candidates int64 scratch
    settings,  # Settings: greedy_below, rtol, relaxed_k, relaxed_delta
    seed_low,  # int32: the low 32 bits of a given shared seed (Flags.SEED_GIVEN)
    seed_high,  # int32: its high 32 bits
    FLAGS: tl.constexpr,  # Flags: HAS_MIN_P, SHARED_SEED, SEED_GIVEN, HAS_RELAXED, SAMPLED, BLOCK_VERIFICATION
    SHAPE: tl.constexpr,  # Shape: ROWS, TILE, SEARCH, TILES, CANDIDATES, SPAN
):
    """A whole verifier call (SPEC §1-§5), one row per (request b, position j <= K), for checked arguments
    (kernels/triton/groups.py names and shapes every one). Writes recovered [B, K], bonus [B] and first [B]
    (set to K before the launch: each rejection lowers it with an atomic min).

    Reads: pass 1 (first_pass) for every row; rows without truncation take their mass from its tile sums
    (rescaled there as the maximum grows, no re-read) and walk only the tile their draw lands in (rarely
    two, within WALK_MARGIN of a tile's end); truncating rows read once more (compact) and finish on their
    candidates; a top-p row without top-k whose nucleus does not fit lists only its boundary region, with
    the weights above it summed per tile as surely kept, and where even the region does not fit, up to
    LEVELS - 1 more passes each list and cut only the part of the region where the threshold lies (then
    it walks tiles); where the candidates do not decide the kept set (too many, or a row whose largest
    logit is not finite) the radix search of kept_threshold runs, then the tile walk.
    Sampled drafts read q at the draft, and over the candidates or (rows walked by tiles) one more pass of
    logits and q for the residual's mass. Under BLOCK_VERIFICATION (SPEC §3.6) a program holds whole
    requests (request_positions) and only the lanes whose prefix test needs a residual mass compute it
    (block_verdict), with the same reads; only the lane at tau and the bonus lane draw."""
    if FLAGS.BLOCK_VERIFICATION:
        at = request_positions(drafts, SHAPE)
    else:
        at = positions_of(drafts, SHAPE.ROWS)
    draft = draft_at(drafts, at, logits.V)
    key = row_keys(requests, at, seed_low, seed_high, FLAGS)
    greedy, inverse = temper(requests.temperature, at.b, at.valid, settings.greedy_below)
    truncation = load_truncation(requests, at.b, at.valid, settings.rtol, FLAGS.HAS_MIN_P)
    roles = row_roles(requests, at, greedy, truncation, logits.V, FLAGS.HAS_RELAXED)

    # the kept set and its mass: rows without truncation by their tile sums, truncating ones on candidates
    first = first_pass(logits, at.row, at.valid, inverse, roles, SHAPE)
    weights = Weights(logits, at.row, first.top, inverse)
    kept = kept_set(weights, at.valid, first, truncation, roles, Scratch(outputs.candidates, at.row), SHAPE)
    tiled = roles.sampled & ~kept.listed

    # what each row draws from: p~ with the target stream, or (sampled drafts) the recovery
    uniform = keyed_uniform(key, STREAM_TARGET)
    judged = roles.sampled & (at.j < drafts.K)
    no_recovery = Recovery(
        drafts.probs,
        at.b * drafts.K + at.j,
        judged,
        tl.zeros_like(inverse),
        at.row < 0,
        tl.full(at.row.shape, -1, tl.int64),
        tl.full(at.row.shape, 1.0, tl.float32),
    )
    accepted, recovery = roles.sampled & (draft >= 0), no_recovery  # judged below; argmax mode: the draw decides
    listed_q = tl.zeros_like(kept.candidates)
    total = kept.mass
    if FLAGS.SAMPLED and FLAGS.BLOCK_VERIFICATION:
        uniform = tl.where(judged, keyed_uniform(key, STREAM_RESIDUAL), uniform)
        accepted, recovery, listed_q, kept, total, tiled = block_verdict(
            weights, draft, key, kept, no_recovery, tiled, SHAPE
        )
    elif FLAGS.SAMPLED:
        accepted, recovery = judge_draft(weights, draft, key, kept, no_recovery)
        uniform = tl.where(judged, keyed_uniform(key, STREAM_RESIDUAL), uniform)
        recovery, listed_q, kept, total = recovery_mass(weights, kept, recovery, tiled, SHAPE, False)

    # the draw (not for greedy rows: their token is the argmax; nor relaxed positions: their top-1)
    drawn = draw(weights, kept, tiled, uniform * total, recovery, listed_q, FLAGS, SHAPE.TILE)
    committed = drawn
    if FLAGS.SAMPLED:
        committed = tl.where(accepted, draft, drawn)
    else:
        accepted = (draft >= 0) & (draft == drawn)
    committed = tl.where(greedy, first.best, committed)
    accepted = tl.where(greedy, (draft >= 0) & (draft == first.best), accepted)
    if FLAGS.HAS_RELAXED:
        k, delta = settings.relaxed_k, settings.relaxed_delta
        judged = relaxed_judge(logits, at.row, draft, first.largest, roles.relaxed, k, delta, SHAPE.TILE)
        committed = tl.where(roles.relaxed, tl.where(judged, draft, first.best), committed)
        accepted = tl.where(roles.relaxed, judged, accepted)
    store_outputs(outputs, at, committed, accepted, drafts.K)
