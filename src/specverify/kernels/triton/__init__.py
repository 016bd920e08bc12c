"""Triton kernels for CUDA tensors (on CPU tensors they run under Triton's interpreter): the launchers.

Each op of kernels/ is one launch here, with the same arguments and results as the native ones, and
`verify_rows` runs a whole verifier call: with its output buffers and a candidate scratch of fixed size
made beforehand, one fill (first = K) and one kernel launch (an int seed passed as kernel arguments), no
host read and no allocation whose size depends on data, so it can be captured in a CUDA graph. Tile shapes depend only on (rows, V) and the device: a large vocabulary runs one row per
program in tiles of 1024 columns (searches in tiles of 128 x 16 candidates); a small one many rows per
program. Under the interpreter, whose cost is per operation and program, tiles are as large as V allows.
"""

from __future__ import annotations

import sys

import torch

from ...contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE, MASK64
from ..backend import Backend
from ..interface import FROM_RESIDUAL, WITHOUT_DRAFT, ChainCall, TreeCall
from ..stages import tree
from . import jit
from .groups import (
    Drafts,
    Draws,
    Flags,
    Logits,
    Outputs,
    RecoveryRows,
    RelaxedRows,
    Requests,
    Settings,
    Shape,
    constexprs,
)

#: Elements per program a tile holds on a GPU (a [ROWS, TILE] tile; searches [ROWS, SEARCH, 16]).
GPU_TILE_ELEMENTS = 1024
GPU_SEARCH_ELEMENTS = 2048
#: A program of block verification holds whole requests (ROWS >= SPAN): on a GPU its [ROWS, TILE] tiles hold
#: up to this many elements (wider tiles than 1024 / ROWS: the [ROWS, TILES] tile sums, updated at every tile,
#: stay small), and its candidates ROWS * CANDIDATES <= MAX_CANDIDATES (the [ROWS, CANDIDATES, 16] searches
#: on them stay the size of a token-wise row's).
GPU_BLOCK_TILE_ELEMENTS = 4096
#: Under the interpreter: as large as this, so that few programs run.
INTERPRETED_TILE_ELEMENTS = 1 << 16
INTERPRETED_MAX_TILE = 4096


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def launch_shape(rows: int, vocab: int, device: torch.device, block: int | None = None) -> dict:
    """ROWS, TILE and SEARCH (powers of two) and num_warps for `rows` rows of `vocab` columns. When block
    sums are written (block < vocab), TILE is a multiple of `block`."""
    interpreted = device.type != "cuda"
    widest = INTERPRETED_MAX_TILE if interpreted else GPU_TILE_ELEMENTS
    tile = max(16, min(_next_power_of_two(vocab), widest))
    if block is not None and block < vocab:
        tile = max(tile, block)
    if interpreted:
        per_program = max(1, min(_next_power_of_two(max(rows, 1)), INTERPRETED_TILE_ELEMENTS // tile))
        search = tile
    else:  # the searches' [ROWS, SEARCH, 16] tiles bound the rows per program
        search = max(16, min(tile, GPU_SEARCH_ELEMENTS // jit.RADIX.value))
        per_program = max(
            1,
            min(
                _next_power_of_two(max(rows, 1)),
                GPU_TILE_ELEMENTS // tile,
                GPU_SEARCH_ELEMENTS // (search * jit.RADIX.value),
            ),
        )
    shape = dict(ROWS=per_program, TILE=tile, SEARCH=search)
    if not interpreted:
        shape["num_warps"] = 8 if per_program * tile >= 1024 else 4
    return shape


#: The most candidates a truncating row of a whole call keeps for its kept set (verify_kernel's scratch).
MAX_CANDIDATES = 1024


#: The most elements a Triton tensor may hold (triton.language's TRITON_MAX_TENSOR_NUMEL).
MAX_TENSOR_ELEMENTS = 1 << 20


def verify_shape(rows: int, vocab: int, device: torch.device, span: int = 1) -> dict:
    """launch_shape for verify_kernel, with TILES (tile sums per row, a power of two) and CANDIDATES (the
    candidates' slots per row, a power of two: MAX_CANDIDATES, or fewer for a small vocabulary); ROWS and
    SEARCH small enough for compact's [ROWS, SEARCH, SPLITS] cuts (only the interpreter's wide programs
    need it). span: SPAN, the lanes of a request (block verification: a power of two >= K + 1; ROWS is at
    least that, a program holding whole requests; on a GPU its tiles, searches and candidates narrowed as
    GPU_BLOCK_TILE_ELEMENTS says)."""
    shape = launch_shape(rows, vocab, device)
    gpu_block = device.type == "cuda" and span > 1
    if shape["ROWS"] < span:
        shape["ROWS"] = span
        if device.type == "cuda":
            shape["TILE"] = max(16, min(shape["TILE"], GPU_BLOCK_TILE_ELEMENTS // span))
            shape["SEARCH"] = max(16, min(shape["TILE"], GPU_SEARCH_ELEMENTS // (span * jit.RADIX.value)))
            shape["num_warps"] = 8
    shape["ROWS"] = min(shape["ROWS"], MAX_TENSOR_ELEMENTS // (16 * jit.SPLITS.value))
    shape["SEARCH"] = min(shape["SEARCH"], max(16, MAX_TENSOR_ELEMENTS // (shape["ROWS"] * jit.SPLITS.value)))
    shape["TILES"] = _next_power_of_two(-(-vocab // shape["TILE"]))
    shape["CANDIDATES"] = min(MAX_CANDIDATES, max(16, _next_power_of_two(vocab)))
    if gpu_block:
        shape["CANDIDATES"] = min(shape["CANDIDATES"], max(16, MAX_CANDIDATES // shape["ROWS"]))
    shape["SPAN"] = span
    return shape


def _int32_halves(value: int) -> tuple[int, int]:
    """The low and high 32 bits of an int's 64-bit pattern, each as a signed int32 (one kernel signature)."""
    bits = value & MASK64
    low, high = bits & 0xFFFFFFFF, bits >> 32
    return tuple(half - (1 << 32) if half >= 1 << 31 else half for half in (low, high))


def verify_groups(
    logits: Logits,
    requests: Requests,
    drafts: Drafts,
    outputs: Outputs,
    settings: Settings,
    seed: int,
    flags: Flags,
    shape: dict,
) -> tuple:
    """verify_kernel's arguments in its order: the groups, an int seed's low and high 32 bits (a shared seed
    given as an int: two arguments, never specialised on their values) and the constexpr groups (Flags, and
    the Shape of verify_shape's dict)."""
    tiling = constexprs(Shape, **{name: shape[name] for name in Shape._fields})
    return (logits, requests, drafts, outputs, settings, *_int32_halves(seed), flags, tiling)


def _launch_options(shape: dict) -> dict:
    """The launch options in a launch shape (num_warps on a GPU), without its tile sizes."""
    return {name: value for name, value in shape.items() if name == "num_warps"}


def _grid(rows: int, shape: dict) -> tuple[int]:
    return (max(1, -(-rows // shape["ROWS"])),)


def _without_search(shape: dict) -> dict:
    return {name: value for name, value in shape.items() if name != "SEARCH"}


def weigh_rows(logits, temperature, greedy_below, top_k, top_p, min_p, rtol, block, out, source=None):
    """interface.weigh_rows on the GPU. With `source` the rows are gathered first (a copy that
    costs microseconds on a GPU) and skipped rows weigh row 0, their sums zeroed."""
    if source is not None:
        sums = weigh_rows(
            logits.index_select(0, source.clamp(min=0)),
            temperature,
            greedy_below,
            top_k,
            top_p,
            min_p,
            rtol,
            block,
            out,
        )
        return sums.masked_fill_((source < 0)[:, None], 0.0)
    rows, vocab = logits.shape
    logits = logits.contiguous()
    blocks = -(-vocab // block)
    sums = torch.empty(rows, blocks, dtype=torch.float64, device=logits.device)
    shape = launch_shape(rows, vocab, logits.device, block)
    jit.weigh_kernel[_grid(rows, shape)](
        logits,
        temperature.contiguous(),
        top_k.contiguous(),
        top_p.contiguous(),
        top_p if min_p is None else min_p.contiguous(),
        out,
        sums,
        rows,
        vocab,
        blocks,
        greedy_below,
        rtol,
        HAS_MIN_P=min_p is not None,
        ONE_BLOCK=block >= vocab,
        BLOCK=block,
        **shape,
    )
    return sums


def argmax_rows(values):
    """interface.argmax_rows on the GPU."""
    rows, vocab = values.shape
    out = torch.empty(rows, dtype=torch.int64, device=values.device)
    shape = _without_search(launch_shape(rows, vocab, values.device))
    jit.argmax_kernel[_grid(rows, shape)](values.contiguous(), out, rows, vocab, **shape)
    return out


def scan_rows(values, in_use=None):
    """interface.scan_rows on the GPU."""
    rows, vocab = values.shape
    out = torch.empty(rows, dtype=torch.uint8, device=values.device)
    use = (
        torch.ones(rows, dtype=torch.int8, device=values.device)
        if in_use is None
        else in_use.to(torch.int8).contiguous()
    )
    shape = _without_search(launch_shape(rows, vocab, values.device))
    jit.scan_kernel[_grid(rows, shape)](values.contiguous(), use, out, rows, vocab, **shape)
    return out


def sample_rows(weights, sums, block, uniforms):
    """interface.sample_rows on the GPU: the walk runs over the weights themselves, in float64 (the block
    sums are not needed; draws agree with the two-level walk except within rounding of a boundary)."""
    rows, vocab = weights.shape
    out = torch.empty(rows, dtype=torch.int64, device=weights.device)
    shape = _without_search(launch_shape(rows, vocab, weights.device))
    uniforms = uniforms.to(torch.float64).contiguous()
    jit.draw_kernel[_grid(rows, shape)](
        Draws(weights=weights, uniforms=uniforms, tokens=out, V=vocab, rows=rows, positions=1, weight_rows=1),
        RecoveryRows(probs=weights, scale=uniforms, use_q=out, excluded=out),  # (not read)
        RECOVERY=False,
        **shape,
    )
    return out


def recover_rows(weights, weight_sums, mass, draft_probs, draft, mode, uniforms, block):
    """interface.recover_rows on the GPU: per position the residual max(0, p~ - q) (p~ where it
    has no mass), p~ without the draft, or p~."""
    requests, positions, vocab = draft_probs.shape
    rows = requests * positions
    out = torch.empty(requests, positions, dtype=torch.int64, device=weights.device)
    shape = _without_search(launch_shape(rows, vocab, weights.device))
    mass = mass.to(torch.float64)
    # (a row without mass, one a tree's walk has left, draws from zeros rather than from 0 * inf = NaN)
    scale = torch.where(mass > 0, 1.0 / mass, 0.0).to(torch.float32).contiguous()
    use_q = (mode == FROM_RESIDUAL).to(torch.int8).contiguous()
    excluded = torch.where(mode == WITHOUT_DRAFT, draft.to(torch.int64), -1).contiguous()
    jit.draw_kernel[_grid(rows, shape)](
        Draws(
            weights=weights.contiguous(),  # float32 [requests, weight rows, V]
            uniforms=uniforms.to(torch.float64).contiguous(),  # float64 [rows]
            tokens=out,  # int64 [requests, positions]
            V=vocab,
            rows=rows,
            positions=positions,
            weight_rows=weights.shape[1],
        ),
        RecoveryRows(
            probs=draft_probs.contiguous(),  # float [requests, positions, V]
            scale=scale,  # float32 [rows]
            use_q=use_q,  # int8 [rows]
            excluded=excluded,  # int64 [rows]
        ),
        RECOVERY=True,
        **shape,
    )
    return out


def relaxed_rows(logits, draft, k, delta):
    """interface.relaxed_rows on the GPU."""
    requests, positions = draft.shape
    rows = requests * positions
    accepted = torch.empty(requests, positions, dtype=torch.int8, device=logits.device)
    top1 = torch.empty(requests, positions, dtype=torch.int64, device=logits.device)
    shape = _without_search(launch_shape(rows, logits.shape[-1], logits.device))
    vocab = logits.shape[-1]
    logits = logits.contiguous()
    jit.relaxed_kernel[_grid(rows, shape)](
        Logits(data=logits, words=logits, V=vocab, W=0),  # float [requests, logit positions, V], no grammar mask
        RelaxedRows(
            drafts=draft.to(torch.int64).contiguous(),  # int64 [requests, positions]
            accepted=accepted,  # int8 [requests, positions]
            top1=top1,  # int64 [requests, positions]
            rows=rows,
            positions=positions,
            logit_positions=logits.shape[1],
            k=k,
            delta=delta,
        ),
        **shape,
    )
    return accepted.bool(), top1


def verify_rows(
    draft: torch.Tensor,
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    seed: int | torch.Tensor,
    shared_seed: bool,
    thinking: torch.Tensor | None,
    relaxed_topk: int | None,
    relaxed_delta: float | None,
    draft_probs: torch.Tensor | None,
    greedy_below: float,
    rtol: float,
    block: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A whole verifier call (SPEC §1-§5) for checked arguments: two launches (the fill of first_rejected
    and one kernel), no host read.

    draft: int [B, K] as given (ids outside [0, V) and all after them are padding); logits: float [B, K+1, V]
    (any float dtype); bitmask: int32 [B, K+1, ceil(V/32)] or None; temperature, top_k, top_p, min_p: [B];
    seed: an int or int64 [] or [1] shared (row b uses s + b * contract.ROW_STRIDE; an int goes to the kernel as
    arguments, no device tensor made) or int64 [B]; thinking: bool [B] or None with
    relaxed_topk and relaxed_delta; draft_probs: float [B, K, V] for sampled drafts, else None; block: judge
    sampled drafts as a block (SPEC §3.6: a program holds whole requests, a power of two >= K + 1 lanes each).
    Returns (first_rejected_idx int64 [B], recovered int64 [B, K], bonus int64 [B, 1]).
    """
    batch, positions = draft.shape
    vocab = logits.shape[-1]
    device = logits.device
    rows = batch * (positions + 1)
    first = torch.full((batch,), positions, dtype=torch.int64, device=device)
    recovered = torch.empty(batch, positions, dtype=torch.int64, device=device)
    bonus = torch.empty(batch, 1, dtype=torch.int64, device=device)
    if batch == 0:
        return first, recovered, bonus
    span = _next_power_of_two(positions + 1) if block else 1
    lanes = batch * span if block else rows  # (rows of a program, where each request takes span of them)
    shape = verify_shape(lanes, vocab, device, span)
    candidates = torch.empty(rows, shape["CANDIDATES"], dtype=torch.int64, device=device)
    given = isinstance(seed, int)
    relaxed = thinking is not None and relaxed_topk is not None
    logits = logits.contiguous()
    groups = verify_groups(
        Logits(
            data=logits,  # float [B*(K+1), V]
            words=logits if bitmask is None else bitmask.contiguous(),  # int32 [B*(K+1), W]; no mask: the logits
            V=vocab,
            W=bitmask.shape[-1] if bitmask is not None else 0,
        ),
        Requests(
            temperature=temperature.contiguous(),  # float32 [B]
            top_k=top_k.contiguous(),  # int64 [B]
            top_p=top_p.contiguous(),  # float32 [B]
            min_p=top_p if min_p is None else min_p.contiguous(),  # float32 [B]
            seeds=first if given else seed.contiguous(),  # int64 [B] or []
            thinking=thinking.contiguous().view(torch.int8) if relaxed else first,  # int8 [B]
        ),
        Drafts(
            tokens=draft.contiguous(),  # int [B, K]
            probs=draft_probs.contiguous() if draft_probs is not None else logits,  # float [B, K, V]
            B=batch,
            K=positions,
        ),
        Outputs(first=first, recovered=recovered, bonus=bonus, candidates=candidates),
        Settings(
            greedy_below=greedy_below,
            rtol=rtol,
            relaxed_k=relaxed_topk if relaxed else 1,
            relaxed_delta=float(relaxed_delta) if relaxed else 0.0,
        ),
        seed if given else 0,
        constexprs(
            Flags,
            HAS_MIN_P=min_p is not None,
            SHARED_SEED=shared_seed,
            SEED_GIVEN=given,
            HAS_RELAXED=relaxed,
            SAMPLED=draft_probs is not None,
            BLOCK_VERIFICATION=block,
        ),
        shape,
    )
    jit.verify_kernel[_grid(lanes, shape)](*groups, **_launch_options(shape))
    return first, recovered, bonus


def verify_chain(call: ChainCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_chain: the whole call in one kernel (verify_rows), the grammar mask,
    the padding of drafts that are not ids and the keys s_b + j all applied inside it, block verification
    (SPEC §3.6) too."""
    relaxed = call.relaxed
    return verify_rows(
        call.draft_tokens,
        call.logits,
        call.bitmask,
        call.temperature,
        call.top_k,
        call.top_p,
        call.min_p,
        call.seed,
        call.shared_seed,
        None if relaxed is None else relaxed.thinking,
        None if relaxed is None else relaxed.topk,
        None if relaxed is None else relaxed.delta,
        call.draft_probs,
        GREEDY_TEMPERATURE,
        BOUNDARY_RTOL,
        call.block,
    )


def verify_tree(call: TreeCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_tree: the walk of stages.tree. A row skipped in weigh_rows costs as
    much as any here (the rows are gathered first), so a walk without host reads judges every node of an
    argmax-mode tree in one truncation (one launch over every row costs less than N + 1 of them)."""
    return tree.verify_tree(call, sys.modules[__name__], skips_rows_cheaply=False)


BACKEND = Backend(name="triton", ops=sys.modules[__name__])
