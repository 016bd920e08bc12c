"""The argument structs of kernels.c's entry points as ctypes Structures, field for field in the order of
kernels.c (whose struct comments say the same). Each entry point takes one pointer to one of these and
returns 0, or the bytes of an allocation it could not make. A pointer field holds the address of the first
element of the call's slice (`row_address`); B and rows below are the slice's. load() checks the sizes against
kernels.c's (specverify_struct_sizes), so a field added on one side only fails at once.
"""

from __future__ import annotations

import ctypes

import torch

_pointer, _i64, _u64, _f32, _f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float, ctypes.c_double


class ChainRows(ctypes.Structure):
    """A chain call's logits rows and the rules that weigh them (request b: rows b * per_position + j)."""

    _fields_ = [
        ("logits", _pointer),  # [B * per_position, V] of dtype, contiguous
        ("temperature", _pointer),  # float32 [B]
        ("top_k", _pointer),  # int64 [B]; <= 0 or >= V: no limit
        ("top_p", _pointer),  # float32 [B]; >= 1: no nucleus
        ("min_p", _pointer),  # float32 [B], or NULL: no min-p
        ("dtype", _i64),  # the logits' element type (DTYPES code)
        ("requests", _i64),  # B
        ("per_position", _i64),  # K + 1: rows per request
        ("n", _i64),  # V
        ("block", _i64),  # tokens per block of the two-level CDF
        ("rtol", _f64),  # contract.BOUNDARY_RTOL
        ("greedy_below", _f32),  # contract.GREEDY_TEMPERATURE
    ]


class RequestKeys(ctypes.Structure):
    """The requests' key bases: s_b = seeds[b * seeds_step] (0 for NULL) + offset + b * row_stride."""

    _fields_ = [
        ("seeds", _pointer),  # int64 [B] (seeds_step 1), int64 [1] (shared, step 0), or NULL
        ("seeds_step", _i64),  # 1 per request, 0 shared
        ("offset", _u64),  # a shared int seed plus the slice's start * ROW_STRIDE, mod 2**64
        ("row_stride", _u64),  # 0, or ROW_STRIDE for a shared seed
    ]


class KeptRows(ctypes.Structure):
    """What draw_rows keeps for sampled mode's recovery, per row: a short list, or count -1 and a dense row."""

    _fields_ = [
        ("count", _pointer),  # int64 [rows]: kept tokens, or -1 for a dense row
        ("ids", _pointer),  # int32 [rows, capacity]: the kept tokens, ascending
        ("weights", _pointer),  # float32 [rows, capacity]: their weights
        ("dense", _pointer),  # float32 [rows, V]: a row's weights where count is -1
        ("block_sums", _pointer),  # float64 [rows, ceil(V / block)]
        ("capacity", _i64),  # the most tokens a short list holds (KEPT_CAPACITY)
    ]


class WeighArgs(ctypes.Structure):
    """weigh_rows."""

    _fields_ = [
        ("logits", _pointer),  # [.., V] of dtype: output row r weighs row source[r] (r where source is NULL)
        ("source", _pointer),  # int64 [rows], -1: skip the row; or NULL
        ("temperature", _pointer),  # float32 [rows]
        ("top_k", _pointer),  # int64 [rows]
        ("top_p", _pointer),  # float32 [rows]
        ("min_p", _pointer),  # float32 [rows], or NULL
        ("weights", _pointer),  # float32 [rows, V] out
        ("block_sums", _pointer),  # float64 [rows, ceil(V / block)] out
        ("dtype", _i64),  # the logits' element type
        ("rows", _i64),  # rows
        ("n", _i64),  # V
        ("block", _i64),  # tokens per block
        ("rtol", _f64),  # contract.BOUNDARY_RTOL
        ("greedy_below", _f32),  # contract.GREEDY_TEMPERATURE
    ]


class ArgmaxArgs(ctypes.Structure):
    """argmax_rows."""

    _fields_ = [
        ("values", _pointer),  # [rows, V] of dtype
        ("out", _pointer),  # int64 [rows] out
        ("dtype", _i64),  # the values' element type
        ("rows", _i64),  # rows
        ("n", _i64),  # V
    ]


class ScanArgs(ctypes.Structure):
    """scan_rows."""

    _fields_ = [
        ("values", _pointer),  # [rows, V] of dtype
        ("in_use", _pointer),  # uint8 [rows], 0: not read; or NULL: every row
        ("flags", _pointer),  # uint8 [rows] out
        ("dtype", _i64),  # the values' element type
        ("rows", _i64),  # rows
        ("n", _i64),  # V
    ]


class SampleArgs(ctypes.Structure):
    """sample_rows."""

    _fields_ = [
        ("weights", _pointer),  # float32 [rows, V]
        ("block_sums", _pointer),  # float64 [rows, ceil(V / block)]
        ("uniforms", _pointer),  # float64 [rows]
        ("out", _pointer),  # int64 [rows] out
        ("rows", _i64),  # rows
        ("n", _i64),  # V
        ("block", _i64),  # tokens per block
    ]


class RecoverArgs(ctypes.Structure):
    """recover_rows."""

    _fields_ = [
        ("weights", _pointer),  # float32 [B, weight_positions, V]
        ("weight_sums", _pointer),  # float64 [B, weight_positions, ceil(V / block)]
        ("mass", _pointer),  # float64 [B, K]: the weights' sums
        ("draft_probs", _pointer),  # [B, K, V] of draft_dtype
        ("draft", _pointer),  # int64 [B, K]
        ("mode", _pointer),  # int32 [B, K]: FROM_TARGET 0, FROM_RESIDUAL 1 or WITHOUT_DRAFT 2
        ("uniforms", _pointer),  # float64 [B, K]
        ("out", _pointer),  # int64 [B, K] out
        ("draft_dtype", _i64),  # draft_probs' element type
        ("requests", _i64),  # B
        ("positions", _i64),  # K
        ("weight_positions", _i64),  # weight rows per request (K or K + 1)
        ("n", _i64),  # V
        ("block", _i64),  # tokens per block
    ]


class DrawArgs(ctypes.Structure):
    """draw_rows: the target draws, with argmax-mode verdicts (proposed) or sampled mode's hand-over (draft)."""

    _fields_ = [
        ("rows", ChainRows),  # the logits and their rules
        ("keys", RequestKeys),  # the requests' key bases
        ("salt", _u64),  # rng.stream_salt(STREAM_TARGET)
        ("tokens", _pointer),  # int64 [B * (K + 1)] out: the draws; where bonus is set, [B, K]: the drafted positions'
        ("bonus", _pointer),  # int64 [B] out: position K's draws; or NULL (in tokens)
        ("proposed", _pointer),  # int64 [B, K]: the drafts as given (with first)
        ("first", _pointer),  # int64 [B] out: the first position not accepted; NULL: no verdicts
        ("draft", _pointer),  # int64 [B, K], -1 where none; NULL: argmax mode
        ("accept_salt", _u64),  # with draft: rng.stream_salt(STREAM_ACCEPT)
        ("at_draft", _pointer),  # float32 [B, K] out (with draft): the draft tokens' weights
        ("accept_uniforms", _pointer),  # float64 [B, K] out (with draft): the ratio test's uniforms
        ("kept", KeptRows),  # out (with draft): the weights for recover_kept_rows
    ]


class RecoverKeptArgs(ctypes.Structure):
    """recover_kept_rows: sampled mode's recovery from what draw_rows kept."""

    _fields_ = [
        ("kept", KeptRows),  # position j of request b at row b * (K + 1) + j
        ("keys", RequestKeys),  # the requests' key bases
        ("salt", _u64),  # rng.stream_salt(STREAM_RESIDUAL)
        ("mass", _pointer),  # float64 [B, K]: the kept weights' sums
        ("draft_probs", _pointer),  # [B, K, V] of draft_dtype
        ("draft", _pointer),  # int64 [B, K], -1 where none
        ("mode", _pointer),  # int32 [B, K]
        ("out", _pointer),  # int64 [B, K] out
        ("draft_dtype", _i64),  # draft_probs' element type
        ("requests", _i64),  # B
        ("positions", _i64),  # K
        ("n", _i64),  # V
        ("block", _i64),  # tokens per block
    ]


class SampledVerdictArgs(ctypes.Structure):
    """draw_sampled_verdicts and draw_block_verdicts: a sampled-mode chain call, draws to verdicts."""

    _fields_ = [
        ("rows", ChainRows),  # the logits and their rules
        ("keys", RequestKeys),  # the requests' key bases
        ("salt", _u64),  # STREAM_TARGET's salt
        ("accept_salt", _u64),  # STREAM_ACCEPT's salt
        ("residual_salt", _u64),  # STREAM_RESIDUAL's salt
        ("proposed", _pointer),  # int64 [B, K]: the drafts as given
        ("draft_probs", _pointer),  # [B, K, V] of draft_dtype
        ("dense", _pointer),  # float32 [B * (K + 1), V]: room for dense kept rows
        ("bonus", _pointer),  # int64 [B] out: the bonus draws (position K's)
        ("recovered", _pointer),  # int64 [B, K] out
        ("first", _pointer),  # int64 [B] out
        ("draft_dtype", _i64),  # draft_probs' element type
        ("capacity", _i64),  # KEPT_CAPACITY
    ]


class RelaxedArgs(ctypes.Structure):
    """relaxed_rows."""

    _fields_ = [
        ("logits", _pointer),  # [B, logit_positions, V] of dtype
        ("draft", _pointer),  # int64 [B, K], -1: none
        ("accepted", _pointer),  # uint8 [B, K] out
        ("top1", _pointer),  # int64 [B, K] out
        ("dtype", _i64),  # the logits' element type
        ("requests", _i64),  # B
        ("positions", _i64),  # K
        ("logit_positions", _i64),  # logits rows per request
        ("n", _i64),  # V
        ("k", _i64),  # the top-k a draft must be in
        ("delta", _f64),  # how far below the top-1's probability a draft may be
    ]


#: Every struct, in the order of kernels.c's specverify_struct_sizes.
STRUCTS = (
    ChainRows,
    RequestKeys,
    KeptRows,
    WeighArgs,
    ArgmaxArgs,
    ScanArgs,
    SampleArgs,
    RecoverArgs,
    DrawArgs,
    RecoverKeptArgs,
    SampledVerdictArgs,
    RelaxedArgs,
)

#: The entry points and the struct each takes.
ENTRY_POINTS = {
    "weigh_rows": WeighArgs,
    "argmax_rows": ArgmaxArgs,
    "scan_rows": ScanArgs,
    "sample_rows": SampleArgs,
    "recover_rows": RecoverArgs,
    "draw_rows": DrawArgs,
    "recover_kept_rows": RecoverKeptArgs,
    "draw_sampled_verdicts": SampledVerdictArgs,
    "draw_block_verdicts": SampledVerdictArgs,  # (verification="block": the same arguments and outputs)
    "relaxed_rows": RelaxedArgs,
}


def row_address(tensor: torch.Tensor | None, start: int, per_row: int) -> int | None:
    """The address of row `start` of a contiguous tensor of `per_row` elements a row (None for None)."""
    if tensor is None:
        return None
    address = tensor.data_ptr()
    return address + start * per_row * tensor.element_size() if start else address  # (start 0: one slice)
