"""The Triton code: per-tile helpers and the kernels built from them (launched by kernels/triton/__init__.py).

Every kernel works on ROWS rows per program, a row at a time in tiles of TILE (or SEARCH) columns, with
[ROWS] vectors for per-row state, so the same code serves a large vocabulary (one row per program) and
thousands of small rows (many per program, as the interpreter tests run). A "row" is one (request,
position) of the logits, or of the weights the per-op kernels are given.

Kept sets are found without sorting: a weight w = exp((x - max x) / T) lies in [0, 1], where float32 bit
patterns order like the values, so the top-k and top-p thresholds are the largest bit pattern t whose
tail {w >= t} reaches a count (k) or a mass (top_p of the row's), found by a radix search of 4 bits per
level (8 levels, each one pass over the row testing 16 candidates at once). Ties are kept: the kept set is
{w >= t}. Sums run in float64. Draws are inverse-CDF walks in float64 in vocabulary order.

Keyed uniforms are rng.py's exactly: SplitMix64's finaliser on (s_b + j) and a per-stream salt, 53 bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import contract

# rng.py's constants (bit-identical uniforms are tested against it)
MIX_1 = tl.constexpr(0xBF58476D1CE4E5B9)
MIX_2 = tl.constexpr(0x94D049BB133111EB)
STREAM_SALT = tl.constexpr(0xD1B54A32D192ED03)
ROW_STRIDE = tl.constexpr(contract.ROW_STRIDE)
STREAM_TARGET = tl.constexpr(0)
STREAM_ACCEPT = tl.constexpr(1)
STREAM_RESIDUAL = tl.constexpr(2)
RADIX = tl.constexpr(16)
# a column index above every real one
PAST_END = tl.constexpr(1 << 62)


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
def load_logits(x_ptr, row, cols, valid, V, m_ptr, W, HAS_MASK: tl.constexpr):
    """Masked logits of a tile as float32 [R, C] (-inf where the grammar mask forbids or past V), and
    where the tile holds real columns. row: int64 [R] row indices; cols: [C]; m_ptr: int32 [rows, W]."""
    inside = valid[:, None] & (cols[None, :] < V)
    x = tl.load(x_ptr + row[:, None] * V + cols[None, :], mask=inside, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        words = tl.load(m_ptr + row[:, None] * W + (cols[None, :] >> 5), mask=inside, other=0)
        allowed = ((words >> (cols[None, :] & 31)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    return x, inside


@triton.jit
def load_logit_at(x_ptr, row, col, valid, V, m_ptr, W, HAS_MASK: tl.constexpr):
    """The masked logit of one column per row (col: int64 [R], in [0, V) where used) -> float32 [R]."""
    at = valid & (col >= 0) & (col < V)
    safe = tl.where(at, col, 0)
    x = tl.load(x_ptr + row * V + safe, mask=at, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        word = tl.load(m_ptr + row * W + (safe >> 5), mask=at, other=0)
        x = tl.where(((word >> (safe & 31).to(tl.int32)) & 1) != 0, x, float("-inf"))
    return x


@triton.jit
def row_max_argmax(x_ptr, row, valid, V, m_ptr, W, HAS_MASK: tl.constexpr, ROWS: tl.constexpr, TILE: tl.constexpr):
    """Each row's largest masked logit (NaN skipped; -inf when none) and its lowest index (0 when nothing
    beats -inf) -> (float32 [R], int64 [R])."""
    best = tl.full([ROWS], float("-inf"), tl.float32)
    index = tl.zeros([ROWS], tl.int64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        x, inside = load_logits(x_ptr, row, cols, valid, V, m_ptr, W, HAS_MASK)
        x = tl.where(x == x, x, float("-inf"))
        tile_max = tl.max(x, axis=1)
        first = tl.min(tl.where((x == tile_max[:, None]) & inside, cols[None, :], PAST_END), axis=1)
        better = tile_max > best
        index = tl.where(better, first, index)
        best = tl.where(better, tile_max, best)
    return best, index


@triton.jit
def weights_of(x, top, inverse):
    """w = exp((x - top) * inverse), float32; x = -inf gives 0, NaN stays NaN."""
    return tl.exp((x - top[:, None]) * inverse[:, None])


@triton.jit
def order_bits(w, inside):
    """int64 keys that order non-negative weights like their values; NaN and columns past V get -1."""
    return tl.where(inside & (w == w), w.to(tl.int32, bitcast=True).to(tl.int64), -1)


@triton.jit
def search_threshold(
    x_ptr,
    row,
    valid,
    V,
    m_ptr,
    W,
    top,
    inverse,
    floor,
    target,
    active,
    WEIGHTED: tl.constexpr,
    HAS_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    SEARCH: tl.constexpr,
):
    """The largest bit pattern t such that the tail {w >= t, w >= floor} reaches the target: its count
    (WEIGHTED False) or its mass (True), in float64. floor: int64 bits [R]; target: float64 [R]; rows not
    active are not searched. Returns int64 bits [R]; 0 where even the whole row falls short (keep all).
    A count search stops early for rows whose chosen tail already holds exactly the target count: no value
    lies between that candidate and the exact threshold, so both keep the same set."""
    prefix = tl.zeros([ROWS], tl.int64)
    done = ~active
    digits = tl.arange(0, RADIX).to(tl.int64)
    for level in range(8):
        searching = valid & ~done
        if tl.max(searching.to(tl.int32), axis=0) > 0:
            shift = 28 - 4 * level
            candidates = prefix[:, None] + (digits[None, :] << shift)  # [R, RADIX]
            tail = tl.zeros([ROWS, RADIX], tl.float64)
            for start in range(0, V, SEARCH):
                cols = start + tl.arange(0, SEARCH).to(tl.int64)
                x, inside = load_logits(x_ptr, row, cols, searching, V, m_ptr, W, HAS_MASK)
                w = weights_of(x, top, inverse)
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
def kept_threshold(
    x_ptr,
    row,
    valid,
    V,
    m_ptr,
    W,
    top,
    inverse,
    top_k,
    top_p,
    min_p,
    rtol,
    active,
    HAS_MASK: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    ROWS: tl.constexpr,
    SEARCH: tl.constexpr,
):
    """The kept set's threshold as int64 bits [R] (SPEC §2 steps 3-5): the k-th largest weight, the
    nucleus on the top-k-renormalised row (its target top_p * mass * (1 - rtol)), min_p * (1 - rtol)."""
    limited = active & (top_k > 0) & (top_k < V)
    kth = search_threshold(
        x_ptr,
        row,
        valid,
        V,
        m_ptr,
        W,
        top,
        inverse,
        tl.zeros([ROWS], tl.int64),
        top_k.to(tl.float64),
        limited,
        False,
        HAS_MASK,
        ROWS,
        SEARCH,
    )
    nucleus = active & (top_p < 1.0)
    mass = tl.zeros([ROWS], tl.float64)
    if tl.max(nucleus.to(tl.int32), axis=0) > 0:
        for start in range(0, V, SEARCH):
            cols = start + tl.arange(0, SEARCH).to(tl.int64)
            x, inside = load_logits(x_ptr, row, cols, valid & nucleus, V, m_ptr, W, HAS_MASK)
            w = weights_of(x, top, inverse)
            mass += tl.sum(tl.where(order_bits(w, inside) >= kth[:, None], w, 0.0).to(tl.float64), axis=1)
    target = top_p.to(tl.float64) * mass * (1.0 - rtol)
    threshold = tl.maximum(
        kth,
        search_threshold(
            x_ptr, row, valid, V, m_ptr, W, top, inverse, kth, target, nucleus, True, HAS_MASK, ROWS, SEARCH
        ),
    )
    if HAS_MIN_P:
        ratio = min_p * (1.0 - rtol)
        threshold = tl.maximum(threshold, ratio.to(tl.int32, bitcast=True).to(tl.int64))
    return threshold


@triton.jit
def kept_weights(x_ptr, row, cols, valid, V, m_ptr, W, top, inverse, threshold, greedy, best, HAS_MASK: tl.constexpr):
    """The kept weights of a tile, float32 [R, C]: w where its bits reach the threshold, else 0; greedy rows
    one-hot at their argmax `best`."""
    x, inside = load_logits(x_ptr, row, cols, valid, V, m_ptr, W, HAS_MASK)
    w = weights_of(x, top, inverse)
    kept = tl.where(order_bits(w, inside) >= threshold[:, None], w, 0.0)
    return tl.where(greedy[:, None], tl.where(cols[None, :] == best[:, None], 1.0, 0.0), kept)


@triton.jit
def walk_tile(terms, cols, target, before, token, found, last):
    """One tile of an inverse-CDF walk: the first column whose running sum passes the target (only positive
    terms count), and the last positive one as the fallback for rounding. terms: float32 [R, C];
    before: float64 [R], the sum of earlier tiles -> (before, token, found, last) updated."""
    positive = terms > 0.0
    running = before[:, None] + tl.cumsum(terms.to(tl.float64), axis=1)
    passes = tl.min(tl.where(positive & (running > target[:, None]), cols[None, :], PAST_END), axis=1)
    token = tl.where(~found & (passes < PAST_END), passes, token)
    found = found | (passes < PAST_END)
    last = tl.maximum(last, tl.max(tl.where(positive, cols[None, :], -1), axis=1))
    return before + tl.sum(terms.to(tl.float64), axis=1), token, found, last


@triton.jit
def residual_terms(kept, q, scale, cols, use_q, excluded):
    """What a recovery draws from (SPEC §3.2): max(0, kept * scale - q) where use_q, else kept without the
    excluded column. kept, q: float32 [R, C]; scale: float32 [R] (1 / the kept mass)."""
    residual = tl.maximum(kept * scale[:, None] - q, 0.0)
    without = tl.where(cols[None, :] == excluded[:, None], 0.0, kept)
    return tl.where(use_q[:, None], residual, without)


@triton.jit
def relaxed_judge(
    x_ptr,
    row,
    valid,
    V,
    m_ptr,
    W,
    draft,
    top,
    k,
    delta,
    active,
    HAS_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
):
    """SPEC §3.4 on softmax(masked logits): the draft is among the k most likely (ranked by logit, ties to
    the lower id), has p > 0 and p >= p(top-1) - delta. top: the largest logit [R] -> bool [R]."""
    at_draft = load_logit_at(x_ptr, row, draft, valid & active, V, m_ptr, W, HAS_MASK)
    top = tl.where(active & (top > float("-inf")), top, 0.0)
    rank = tl.zeros([ROWS], tl.int64)
    total = tl.zeros([ROWS], tl.float64)
    if tl.max(active.to(tl.int32), axis=0) > 0:
        for start in range(0, V, TILE):
            cols = start + tl.arange(0, TILE).to(tl.int64)
            x, inside = load_logits(x_ptr, row, cols, valid & active, V, m_ptr, W, HAS_MASK)
            ahead = (x > at_draft[:, None]) | ((x == at_draft[:, None]) & (cols[None, :] < draft[:, None]))
            rank += tl.sum(tl.where(ahead & inside, 1, 0), axis=1).to(tl.int64)
            total += tl.sum(tl.where(inside, tl.exp(x - top[:, None]), 0.0).to(tl.float64), axis=1)
    p_draft = tl.exp(at_draft - top).to(tl.float64) / tl.where(total > 0, total, 1.0)
    return (
        active & (draft >= 0) & (p_draft > 0) & (rank < k) & (p_draft >= 1.0 / tl.where(total > 0, total, 1.0) - delta)
    )


@triton.jit
def _row_setup(
    x_ptr,
    row,
    valid,
    V,
    m_ptr,
    W,
    t_ptr,
    param_row,
    greedy_below,
    HAS_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
):
    """Pass 1 of a row: its argmax and the constants of its weights -> (best, top, inverse, greedy)."""
    largest, best = row_max_argmax(x_ptr, row, valid, V, m_ptr, W, HAS_MASK, ROWS, TILE)
    top = tl.where((largest == largest) & (tl.abs(largest) < float("inf")), largest, 0.0)
    temperature = tl.load(t_ptr + param_row, mask=valid, other=1.0).to(tl.float32)
    greedy = temperature < greedy_below
    inverse = tl.where(greedy, 1.0, tl.div_rn(tl.full([ROWS], 1.0, tl.float32), tl.where(greedy, 1.0, temperature)))
    return largest, best, top, inverse, greedy


@triton.jit
def weigh_kernel(
    x_ptr,
    t_ptr,
    k_ptr,
    p_ptr,
    mp_ptr,
    out_ptr,
    sums_ptr,
    rows,
    V,
    blocks,
    greedy_below,
    rtol,
    HAS_MIN_P: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
    SEARCH: tl.constexpr,
):
    """Truncated weights [rows, V] float32 and their block sums [rows, blocks] float64 (kernels.weigh_rows).
    ONE_BLOCK: V <= BLOCK, one sum per row; else TILE is a multiple of BLOCK."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    valid = row < rows
    largest, best, top, inverse, greedy = _row_setup(
        x_ptr, row, valid, V, x_ptr, 0, t_ptr, row, greedy_below, False, ROWS, TILE
    )
    top_k = tl.load(k_ptr + row, mask=valid, other=0).to(tl.int64)
    top_p = tl.load(p_ptr + row, mask=valid, other=1.0).to(tl.float32)
    min_p = tl.zeros([ROWS], tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(mp_ptr + row, mask=valid, other=0.0).to(tl.float32)
    threshold = kept_threshold(
        x_ptr,
        row,
        valid,
        V,
        x_ptr,
        0,
        top,
        inverse,
        top_k,
        top_p,
        min_p,
        rtol,
        valid & ~greedy,
        False,
        HAS_MIN_P,
        ROWS,
        SEARCH,
    )
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        kept = kept_weights(x_ptr, row, cols, valid, V, x_ptr, 0, top, inverse, threshold, greedy, best, False)
        inside = valid[:, None] & (cols[None, :] < V)
        tl.store(out_ptr + row[:, None] * V + cols[None, :], kept, mask=inside)
        if ONE_BLOCK:
            tl.store(sums_ptr + row * blocks, tl.sum(kept.to(tl.float64), axis=1), mask=valid)
        else:
            per_block = tl.sum(tl.reshape(kept.to(tl.float64), [ROWS, TILE // BLOCK, BLOCK]), axis=2)
            block = start // BLOCK + tl.arange(0, TILE // BLOCK).to(tl.int64)
            tl.store(
                sums_ptr + row[:, None] * blocks + block[None, :],
                per_block,
                mask=valid[:, None] & (block[None, :] < blocks),
            )


@triton.jit
def argmax_kernel(x_ptr, out_ptr, rows, V, ROWS: tl.constexpr, TILE: tl.constexpr):
    """First argmax per row, NaN never winning (kernels.argmax_rows)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    valid = row < rows
    _, best = row_max_argmax(x_ptr, row, valid, V, x_ptr, 0, False, ROWS, TILE)
    tl.store(out_ptr + row, best, mask=valid)


@triton.jit
def scan_kernel(x_ptr, use_ptr, out_ptr, rows, V, ROWS: tl.constexpr, TILE: tl.constexpr):
    """Per row in use (use_ptr: int8 [rows], != 0): 1 if it holds NaN or +inf, | 2 if it holds a value
    other than -inf; 0 for a row not in use (kernels.scan_rows)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    valid = row < rows
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
def _drawn_terms(w_ptr, weight_row, q_ptr, row, cols, valid, V, scale, use_q, excluded, RECOVERY: tl.constexpr):
    """A tile of what draw_kernel draws from: the given weights, or (RECOVERY) the recovery's terms."""
    inside = valid[:, None] & (cols[None, :] < V)
    terms = tl.load(w_ptr + weight_row[:, None] * V + cols[None, :], mask=inside, other=0.0)
    if RECOVERY:
        q = tl.load(q_ptr + row[:, None] * V + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        terms = residual_terms(terms, q, scale, cols, use_q, excluded)
    return terms


@triton.jit
def draw_kernel(
    w_ptr,
    u_ptr,
    out_ptr,
    q_ptr,
    scale_ptr,
    use_q_ptr,
    excluded_ptr,
    weight_rows,
    rows,
    V,
    positions,
    RECOVERY: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
):
    """Inverse-CDF draws from given weights [.., V] float32 (kernels.sample_rows), or (RECOVERY) the recovery
    draw of sampled mode (kernels.recover_rows): row r = (request, position) reads weight row
    (r // positions) * weight_rows + r % positions, draft probabilities q [rows, V], and per row the
    scale (float32, 1 / kept mass), use_q (int8) and excluded column (int64, -1: none)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    valid = row < rows
    weight_row = (row // positions) * weight_rows + row % positions
    scale = tl.zeros([ROWS], tl.float32)
    use_q = row < 0
    excluded = tl.full([ROWS], -1, tl.int64)
    if RECOVERY:
        scale = tl.load(scale_ptr + row, mask=valid, other=0.0)
        use_q = tl.load(use_q_ptr + row, mask=valid, other=0) != 0
        excluded = tl.load(excluded_ptr + row, mask=valid, other=-1)
        # a residual without mass (p~ == q) falls back to p~
        residual = tl.zeros([ROWS], tl.float64)
        for start in range(0, V, TILE):
            cols = start + tl.arange(0, TILE).to(tl.int64)
            terms = _drawn_terms(w_ptr, weight_row, q_ptr, row, cols, valid, V, scale, use_q, excluded, RECOVERY)
            residual += tl.sum(tl.where(use_q[:, None], terms, 0.0).to(tl.float64), axis=1)
        use_q = use_q & (residual > 0)
    total = tl.zeros([ROWS], tl.float64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        terms = _drawn_terms(w_ptr, weight_row, q_ptr, row, cols, valid, V, scale, use_q, excluded, RECOVERY)
        total += tl.sum(terms.to(tl.float64), axis=1)
    target = tl.load(u_ptr + row, mask=valid, other=0.0) * total
    before = tl.zeros([ROWS], tl.float64)
    token = tl.zeros([ROWS], tl.int64)
    found = row < 0
    last = tl.full([ROWS], -1, tl.int64)
    for start in range(0, V, TILE):
        cols = start + tl.arange(0, TILE).to(tl.int64)
        terms = _drawn_terms(w_ptr, weight_row, q_ptr, row, cols, valid, V, scale, use_q, excluded, RECOVERY)
        before, token, found, last = walk_tile(terms, cols, target, before, token, found, last)
    tl.store(out_ptr + row, tl.where(found, token, tl.maximum(last, 0)), mask=valid)


@triton.jit
def relaxed_kernel(
    x_ptr,
    d_ptr,
    accepted_ptr,
    top1_ptr,
    rows,
    V,
    positions,
    logit_positions,
    k,
    delta,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
):
    """The relaxed rule at each drafted position (kernels.relaxed_rows): row r = (request, position) reads
    logit row (r // positions) * logit_positions + r % positions."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    valid = row < rows
    logit_row = (row // positions) * logit_positions + row % positions
    top, best = row_max_argmax(x_ptr, logit_row, valid, V, x_ptr, 0, False, ROWS, TILE)
    draft = tl.load(d_ptr + row, mask=valid, other=-1)
    accepted = relaxed_judge(x_ptr, logit_row, valid, V, x_ptr, 0, draft, top, k, delta, valid, False, ROWS, TILE)
    tl.store(accepted_ptr + row, accepted.to(tl.int8), mask=valid)
    tl.store(top1_ptr + row, best, mask=valid)


@triton.jit
def verify_kernel(
    x_ptr,
    m_ptr,
    t_ptr,
    k_ptr,
    p_ptr,
    mp_ptr,
    seed_ptr,
    d_ptr,
    think_ptr,
    q_ptr,
    first_ptr,
    recovered_ptr,
    bonus_ptr,
    batch,
    K,
    V,
    W,
    greedy_below,
    rtol,
    relaxed_k,
    relaxed_delta,
    HAS_MASK: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    SHARED_SEED: tl.constexpr,
    HAS_RELAXED: tl.constexpr,
    SAMPLED: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
    SEARCH: tl.constexpr,
):
    """A whole verifier call (SPEC §1-§5), one row per (request b, position j <= K), for checked arguments:
    logits [B*(K+1), V] (any float dtype, read as it is), grammar words [B*(K+1), W], per-request
    parameters [B], seeds ([B], or one shared: row b uses s + b * ROW_STRIDE), drafts [B, K] (ids outside
    [0, V) and everything after them are padding), thinking flags [B] (int8), draft probabilities
    [B, K, V] (SAMPLED). Writes recovered [B, K], bonus [B] and first [B] (set to K before the launch:
    each rejection lowers it with an atomic min)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    per_request = K + 1
    valid = row < batch * per_request
    b = row // per_request
    j = row % per_request
    drafted = valid & (j < K)

    # the draft at j, or -1 when it or an earlier one is not an id
    draft = tl.load(d_ptr + b * K + j, mask=drafted, other=-1).to(tl.int64)
    padded = ~drafted
    for i in range(0, K):
        earlier = tl.load(d_ptr + b * K + i, mask=drafted & (i <= j), other=0).to(tl.int64)
        padded = padded | ((i <= j) & ((earlier < 0) | (earlier >= V)))
    draft = tl.where(padded, -1, draft)

    # keys s_b + j
    if SHARED_SEED:
        seed = tl.load(seed_ptr + b * 0, mask=valid, other=0).to(tl.uint64, bitcast=True) + b.to(tl.uint64) * ROW_STRIDE
    else:
        seed = tl.load(seed_ptr + b, mask=valid, other=0).to(tl.uint64, bitcast=True)
    key = seed + j.to(tl.uint64)

    largest, best, top, inverse, greedy = _row_setup(
        x_ptr, row, valid, V, m_ptr, W, t_ptr, b, greedy_below, HAS_MASK, ROWS, TILE
    )
    relaxed = row < 0
    if HAS_RELAXED:
        relaxed = drafted & ~greedy & (tl.load(think_ptr + b, mask=valid, other=0) != 0)
    sampled_rows = valid & ~greedy & ~relaxed
    top_k = tl.load(k_ptr + b, mask=valid, other=0).to(tl.int64)
    top_p = tl.load(p_ptr + b, mask=valid, other=1.0).to(tl.float32)
    min_p = tl.zeros([ROWS], tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(mp_ptr + b, mask=valid, other=0.0).to(tl.float32)
    threshold = kept_threshold(
        x_ptr,
        row,
        valid,
        V,
        m_ptr,
        W,
        top,
        inverse,
        top_k,
        top_p,
        min_p,
        rtol,
        sampled_rows,
        HAS_MASK,
        HAS_MIN_P,
        ROWS,
        SEARCH,
    )
    mass = tl.zeros([ROWS], tl.float64)
    if tl.max(sampled_rows.to(tl.int32), axis=0) > 0:
        for start in range(0, V, TILE):
            cols = start + tl.arange(0, TILE).to(tl.int64)
            kept = kept_weights(
                x_ptr, row, cols, valid & sampled_rows, V, m_ptr, W, top, inverse, threshold, greedy, best, HAS_MASK
            )
            mass += tl.sum(kept.to(tl.float64), axis=1)

    # what each row draws from: p~ with the target stream, or (sampled drafts) the recovery
    uniform = keyed_uniform(key, STREAM_TARGET)
    total = mass
    accepted = sampled_rows & (draft >= 0)  # judged below; argmax mode: the draw decides
    scale = tl.zeros([ROWS], tl.float32)
    use_q = row < 0
    excluded = tl.full([ROWS], -1, tl.int64)
    q_row = b * K + j
    if SAMPLED:
        judged = sampled_rows & (j < K)
        x_draft = load_logit_at(x_ptr, row, draft, judged, V, m_ptr, W, HAS_MASK)
        w_draft = tl.exp((x_draft - top) * inverse)
        w_draft = tl.where(order_bits(w_draft, judged) >= threshold, w_draft, 0.0)
        p_draft = tl.div_rn(w_draft, tl.where(judged, mass, 1.0).to(tl.float32)).to(tl.float64)
        present = judged & (draft >= 0)
        q_draft = (
            tl.load(q_ptr + q_row * V + tl.where(present, draft, 0), mask=present, other=0.0)
            .to(tl.float32)
            .to(tl.float64)
        )
        blind = q_draft <= 0
        coin = keyed_uniform(key, STREAM_ACCEPT)
        accepted = present & ~(coin * tl.where(blind, 1.0, q_draft) >= p_draft)
        use_q = present & ~blind
        excluded = tl.where(present & blind, draft, -1)
        scale = tl.where(judged, (1.0 / tl.where(mass > 0, mass, 1.0)).to(tl.float32), 0.0)
        uniform = tl.where(judged, keyed_uniform(key, STREAM_RESIDUAL), uniform)
        residual = tl.zeros([ROWS], tl.float64)
        without = tl.zeros([ROWS], tl.float64)
        if tl.max(judged.to(tl.int32), axis=0) > 0:
            for start in range(0, V, TILE):
                cols = start + tl.arange(0, TILE).to(tl.int64)
                kept = kept_weights(
                    x_ptr, row, cols, valid & judged, V, m_ptr, W, top, inverse, threshold, greedy, best, HAS_MASK
                )
                q = tl.load(
                    q_ptr + q_row[:, None] * V + cols[None, :], mask=judged[:, None] & (cols[None, :] < V), other=0.0
                ).to(tl.float32)
                residual += tl.sum(residual_terms(kept, q, scale, cols, use_q, excluded).to(tl.float64), axis=1)
                without += tl.sum(tl.where(cols[None, :] == excluded[:, None], 0.0, kept).to(tl.float64), axis=1)
        use_q = use_q & (residual > 0)
        total = tl.where(judged, tl.where(use_q, residual, without), mass)

    # the draw (not for greedy rows: their token is the argmax; nor relaxed positions: their top-1)
    target = uniform * total
    before = tl.zeros([ROWS], tl.float64)
    token = tl.zeros([ROWS], tl.int64)
    found = row < 0
    last = tl.full([ROWS], -1, tl.int64)
    if tl.max(sampled_rows.to(tl.int32), axis=0) > 0:
        for start in range(0, V, TILE):
            cols = start + tl.arange(0, TILE).to(tl.int64)
            kept = kept_weights(
                x_ptr, row, cols, valid & sampled_rows, V, m_ptr, W, top, inverse, threshold, greedy, best, HAS_MASK
            )
            if SAMPLED:
                q = tl.load(
                    q_ptr + q_row[:, None] * V + cols[None, :],
                    mask=(sampled_rows & (j < K))[:, None] & (cols[None, :] < V),
                    other=0.0,
                ).to(tl.float32)
                kept = residual_terms(kept, q, scale, cols, use_q, excluded)
            before, token, found, last = walk_tile(kept, cols, target, before, token, found, last)
    drawn = tl.where(found, token, tl.maximum(last, 0))

    if SAMPLED:
        committed = tl.where(accepted, draft, drawn)
    else:
        accepted = (draft >= 0) & (draft == drawn)
        committed = drawn
    committed = tl.where(greedy, best, committed)
    accepted = tl.where(greedy, (draft >= 0) & (draft == best), accepted)
    if HAS_RELAXED:
        judged = relaxed_judge(
            x_ptr, row, valid, V, m_ptr, W, draft, largest, relaxed_k, relaxed_delta, relaxed, HAS_MASK, ROWS, TILE
        )
        committed = tl.where(relaxed, tl.where(judged, draft, best), committed)
        accepted = tl.where(relaxed, judged, accepted)

    tl.store(recovered_ptr + b * K + j, committed, mask=drafted)
    tl.store(bonus_ptr + b, committed, mask=valid & (j == K))
    tl.atomic_min(first_ptr + b, j, mask=drafted & ~accepted)
