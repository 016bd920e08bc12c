"""Argument checking (SPEC §6): every rule raises an error that names the argument, the rule and the value.

Two kinds of checks live here. Metadata checks (types, dtypes, shapes, devices) never touch tensor data
and always run. Value checks read tensor data to the host and run only under `validate=True`.
Nothing here writes to its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import kernels

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _type_name(value: object) -> str:
    return f"dtype {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__


def _first_row(bad: torch.Tensor) -> int:
    """Index of the first True in a flattened bool tensor (host read; value checks only)."""
    return int(bad.reshape(-1).nonzero()[0, 0])


def check_tensor(name: str, value: object, dtypes: Sequence[torch.dtype], rule: str) -> torch.Tensor:
    """`value` must be a tensor with one of `dtypes`; `rule` says so in words."""
    if not isinstance(value, torch.Tensor) or value.dtype not in dtypes:
        raise TypeError(f"{name} must be {rule} (got {_type_name(value)})")
    return value


def check_shape(name: str, value: torch.Tensor, shape: Sequence[int], layout: str) -> None:
    """`value.shape` must equal `shape`; `layout` names the dims, e.g. "[B, K]"."""
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {layout} = {list(shape)} (got {list(value.shape)})")


def check_same_device(tensors: dict[str, torch.Tensor | None], device: torch.device, anchor: str) -> None:
    """Every given tensor must live on `device` (the device of the argument `anchor`)."""
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.device != device:
            check_device(name, tensor, device, anchor)


def check_device(name: str, tensor: torch.Tensor, device: torch.device, anchor: str) -> None:
    """`tensor` must live on `device` (the device of the argument `anchor`)."""
    if tensor.device != device:
        raise ValueError(f"{name} must be on the same device as {anchor} ({device}) (got {tensor.device})")


def check_logits_3d(target_logits: object, batch: int, count: int, positions: str = "K") -> torch.Tensor:
    """target_logits as [B, P+1, V] (a view), from [B*(P+1), V] or [B, P+1, V], where P = count is K draft
    positions for a chain, N nodes for a tree (`positions` names it in messages)."""
    check_tensor("target_logits", target_logits, FLOAT_DTYPES, "a float32, float16 or bfloat16 tensor")
    shape = target_logits.shape
    if len(shape) == 2 and shape[0] == batch * (count + 1) and shape[1] >= 1:
        return target_logits.view(batch, count + 1, shape[1])
    if len(shape) == 3 and shape[0] == batch and shape[1] == count + 1 and shape[2] >= 1:
        return target_logits
    raise ValueError(
        f"target_logits must have shape [B*({positions}+1), V] = [{batch * (count + 1)}, V] or "
        f"[B, {positions}+1, V] = [{batch}, {count + 1}, V] with V >= 1 (got {list(shape)})"
    )


def check_masks_and_draft_probs(
    token_bitmasks: object,
    draft_proposal: str,
    draft_probs: object,
    probs_name: str,
    batch: int,
    count: int,
    vocab: int,
    words: int,
    positions: str = "K",
) -> None:
    """Metadata of token_bitmasks (int32 [B, P+1, words] or None) and of the draft distributions, named
    `probs_name` (float [B, P, V]: required when draft_proposal is "sampled", an error when "argmax").
    P = count, named `positions` in messages (K for a chain, N for a tree)."""
    if token_bitmasks is not None:
        layout = f"[B, {positions}+1, ceil(V/32)]"
        check_tensor("token_bitmasks", token_bitmasks, (torch.int32,), f"an int32 tensor {layout}")
        check_shape("token_bitmasks", token_bitmasks, (batch, count + 1, words), layout)
    if draft_proposal == "sampled":
        if draft_probs is None:
            raise ValueError(f'{probs_name} is required when draft_proposal="sampled" (got None)')
        layout = f"[B, {positions}, V]"
        check_tensor(probs_name, draft_probs, FLOAT_DTYPES + (torch.float64,), f"a float tensor {layout}")
        check_shape(probs_name, draft_probs, (batch, count, vocab), layout)
    elif draft_probs is not None:
        raise ValueError(f'{probs_name} must be None when draft_proposal="argmax" (got a tensor)')


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """A Python int (or 0-d integer tensor) >= minimum."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (got {_type_name(value)})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum} (got {value})")
    return value


def check_float(name: str, value: object, low: float, high: float, rule: str) -> float:
    """A finite Python float (or 0-d float tensor) in [low, high]; `rule` says the range in words."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float (got {_type_name(value)})")
    if not (low <= value <= high) or math.isnan(value):
        raise ValueError(f"{name} must be {rule} (got {value})")
    return float(value)


def check_rows(name: str, bad: torch.Tensor, values: torch.Tensor, rule: str) -> None:
    """Raise for the first row where `bad` holds. bad: bool [B]; values: [B] (value check)."""
    if bool(bad.any()):
        row = _first_row(bad)
        _raise_row(name, rule, values.reshape(-1)[row].item(), row)


def _raise_row(name: str, rule: str, value: object, row: int) -> None:
    raise ValueError(f"{name} must be {rule} (got {value} at row {row})")


#: The value rule of each per-row sampling parameter (SPEC §6), in the order they are checked: its name,
#: the rule in words, and the test of a bad value on a tensor and on a Python number (NaN is bad in both).
ROW_RULES = (
    ("temperature", "finite and >= 0", lambda t: ~torch.isfinite(t) | (t < 0), lambda t: not 0 <= t < math.inf),
    ("top_k", ">= -1 (0 or -1 means no limit)", lambda k: k < -1, lambda k: k < -1),
    ("top_p", "in (0, 1]", lambda p: ~((p > 0) & (p <= 1)), lambda p: not 0 < p <= 1),
    ("min_p", "in [0, 1]", lambda m: ~((m >= 0) & (m <= 1)), lambda m: not 0 <= m <= 1),
)

#: Up to this many rows on the CPU, the per-row parameters are read to the host once (a list per tensor)
#: and their value rules checked there: a torch op per rule costs more than the rules at such sizes.
HOST_ROWS = 256


def host_values(*params: torch.Tensor | None) -> tuple[list | None, ...] | None:
    """The given per-row tensors [B] as Python lists (None stays None), where the value checks read them to
    the host (CPU tensors, B <= HOST_ROWS); None otherwise."""
    for p in params:  # (loops, not generators: this runs on every checking call)
        if p is not None and (not p.is_cpu or p.shape[0] > HOST_ROWS):
            return None
    return tuple([None if p is None else p.tolist() for p in params])


def check_sampling_values(
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    host: tuple[list, list, list, list | None] | None = None,
) -> None:
    """The value rules of the per-row sampling parameters (value checks), in the order of ROW_RULES.

    host: the same parameters as lists (`host_values`), checked in Python instead of by torch ops."""
    tensors = (temperature, top_k, top_p, min_p)
    for index, (name, rule, bad_tensor, bad_number) in enumerate(ROW_RULES):
        if tensors[index] is None:
            continue
        if host is None:
            check_rows(name, bad_tensor(tensors[index]), tensors[index], rule)
            continue
        for row, value in enumerate(host[index]):
            if bad_number(value):
                _raise_row(name, rule, value, row)


def check_draft_ids(
    draft_tokens: torch.Tensor, vocab_size: int, second: str = "position", values: list[list[int]] | None = None
) -> None:
    """Ids in [-1, V) (value check). draft_tokens: int [B, K] (a tree's [B, N]: second="node").
    values: draft_tokens read to the host (`tolist()`), checked in Python instead of by torch ops."""
    if values is not None:
        bad = [
            (row, position)
            for row, ids in enumerate(values)
            for position, i in enumerate(ids)
            if not -1 <= i < vocab_size
        ]
        if bad:
            _raise_draft_id(vocab_size, values[bad[0][0]][bad[0][1]], *bad[0], second)
        return
    bad = (draft_tokens < -1) | (draft_tokens >= vocab_size)
    if bool(bad.any()):
        row, position = (int(i) for i in bad.nonzero()[0])
        _raise_draft_id(vocab_size, int(draft_tokens[row, position]), row, position, second)


def _raise_draft_id(vocab_size: int, value: int, row: int, position: int, second: str) -> None:
    raise ValueError(f"draft_tokens must be in [-1, {vocab_size}) (got {value} at row {row}, {second} {position})")


def _where(index: list[int], second: str = "position") -> str:
    """ "row r, position j, token v" for an index into [B, P, V] ("row r, token v" for [N, V]); `second`
    names the middle dim (a tree's logits have an "index" there, its draft_probs a "node")."""
    names = ("row", second, "token") if len(index) == 3 else ("row", "token")
    return ", ".join(f"{name} {i}" for name, i in zip(names, index))


def _in_use(bad: torch.Tensor, in_use: torch.Tensor | None) -> torch.Tensor:
    """bad [B, P, ...] restricted to the (row, position) pairs in use (bool [B, P]; None: all)."""
    return bad if in_use is None else bad & in_use.view(*in_use.shape, *[1] * (bad.dim() - in_use.dim()))


def _scan_logits(logits: torch.Tensor, in_use: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One streaming pass over the (row, position) pairs in use -> (holds NaN or +inf, holds nothing above
    -inf), bool [B, P] or [N], False where not in use; None where neither holds anywhere (known at once
    from a compiled scan of every row). logits: float [B, P, V] or [N, V]; in_use: bool [B, P] or None.
    The backend's scan_rows does the pass (a compiled one on the bit patterns, rows not in use not read;
    the torch reference by one max reduction, which propagates NaN and +inf)."""
    shape, vocab = logits.shape[:-1], logits.shape[-1]
    if not logits.numel():
        return None
    rows = logits.reshape(-1, vocab)
    flags = kernels.ops_for(rows).scan_rows(rows, None if in_use is None else in_use.reshape(-1))
    if in_use is None and _all_clear(flags):
        return None
    flags = flags.view(shape)
    bad, empty = (flags & kernels.HOLDS_NAN_OR_INF) != 0, (flags & kernels.HOLDS_ABOVE_MINUS_INF) == 0
    return _in_use(bad, in_use), _in_use(empty, in_use)


def _all_clear(flags: torch.Tensor) -> bool:
    """Whether every scanned row holds nothing but finite values and -inf, and some finite value. flags:
    uint8 [N] of kernels.scan_rows, read to the host for up to HOST_FLAGS rows (one op where a comparison
    and a reduction cost three)."""
    if flags.numel() <= HOST_FLAGS:
        return all(flag == kernels.HOLDS_ABOVE_MINUS_INF for flag in flags.tolist())
    return bool((flags == kernels.HOLDS_ABOVE_MINUS_INF).all())


#: Up to this many scanned rows, their flags are read to the host at once (_all_clear).
HOST_FLAGS = 4096


def check_finite_logits(
    name: str,
    logits: torch.Tensor,
    some_finite: bool = False,
    *,
    in_use: torch.Tensor | None = None,
    second: str = "position",
) -> None:
    """No NaN and no +inf; -inf is allowed (value check). logits: float [B, P, V] or [N, V].
    some_finite: also require a finite logit at every (row, position), as check_some_allowed does.
    in_use: bool [B, P] or None: only those (row, position) pairs are checked (None: every one).
    second: the name of the middle dim in messages.

    One streaming pass (_scan_logits) finds whether there is anything to report; only then is the
    offending entry located."""
    scanned = _scan_logits(logits, in_use)
    if scanned is None:
        return
    bad, empty = scanned
    if bool(bad.any()):
        located = _in_use(torch.isnan(logits) | (logits == float("inf")), in_use)
        index = [int(i) for i in located.nonzero()[0]]
        raise ValueError(
            f"{name} must not hold NaN or +inf (got {logits[tuple(index)].item()} at {_where(index, second)})"
        )
    if some_finite:
        _check_not_empty(name, empty, second)


def check_some_allowed(
    name: str, masked_logits: torch.Tensor, *, in_use: torch.Tensor | None = None, second: str = "position"
) -> None:
    """Every (row, position) keeps a token with a finite logit (value check). masked_logits: [B, P, V] or [N, V].

    name: the argument to blame, the bitmask when there is one, else the logits. in_use, second: as in
    check_finite_logits."""
    scanned = _scan_logits(masked_logits, in_use)
    if scanned is not None:
        _check_not_empty(name, scanned[1], second)


def _check_not_empty(name: str, empty: torch.Tensor, second: str = "position") -> None:
    """empty: bool [B, P] or [N], where no token has a finite logit (in use)."""
    if bool(empty.any()):
        index = [int(i) for i in empty.nonzero()[0]]
        where = _where(index + [0], second)[: -len(", token 0")]
        raise ValueError(f"{name} must leave at least one token with a finite logit (got none at {where})")


def check_draft_probs(
    draft_probs: torch.Tensor,
    *,
    name: str = "draft_probs_full",
    in_use: torch.Tensor | None = None,
    second: str = "position",
) -> None:
    """Finite, >= 0, each row summing to 1 within 1e-3 or all zero (value check). draft_probs: [B, K, V].
    name: the argument to blame; in_use: bool [B, K] or None, the rows checked (None: all); second: the
    name of the middle dim in messages.

    Two reductions find whether anything is wrong (a sum is finite and a minimum >= 0 only if every entry
    is finite and >= 0), judged on the host where they are few (_pairs_read); only then is the offending
    entry located."""
    # float32 sums, in cascades (~1e-7): far inside 1e-3, and 20x faster than a float64 accumulator
    total = draft_probs.sum(-1, dtype=torch.float64 if draft_probs.dtype == torch.float64 else torch.float32).double()
    lowest = draft_probs.amin(-1) if draft_probs.shape[-1] else total
    pairs = _pairs_read(total, lowest, in_use)
    if _some_not_finite_or_negative(total, lowest, in_use, pairs):
        for bad, rule in ((~torch.isfinite(draft_probs), "finite"), (draft_probs < 0, ">= 0")):
            bad = _in_use(bad, in_use)
            if bool(bad.any()):
                index = [int(i) for i in bad.nonzero()[0]]
                raise ValueError(
                    f"{name} must be {rule} (got {draft_probs[tuple(index)].item()} at {_where(index, second)})"
                )
    if _some_sum_off(total, in_use, pairs):
        row, position = (int(i) for i in _in_use(_sum_off(total), in_use).nonzero()[0])
        raise ValueError(
            f"{name} rows must sum to 1 (within 1e-3) or be all zero "
            f"(got a sum of {total[row, position].item():.6g} at row {row}, {second} {position})"
        )


#: Up to this many (row, position) pairs on the CPU, draft_probs' sums and minima are read to the host and
#: judged there: two reads where the rules on tensors cost a dozen torch ops (about 35 us; a pair judged in
#: Python about 0.5 us, so the two break even near 64 pairs).
HOST_PAIRS = 32


def _pairs_read(
    total: torch.Tensor, lowest: torch.Tensor, in_use: torch.Tensor | None
) -> list[tuple[float, float]] | None:
    """(sum, minimum) of each (row, position) pair in use, read to the host; None where the pairs are not
    few CPU tensors. total: float64 [B, K]; lowest: [B, K]; in_use: bool [B, K] or None (every pair)."""
    if not total.is_cpu or total.numel() > HOST_PAIRS:
        return None
    sums, minima = total.reshape(-1).tolist(), lowest.reshape(-1).tolist()
    used = [True] * len(sums) if in_use is None else in_use.reshape(-1).tolist()
    return [(s, m) for s, m, use in zip(sums, minima, used) if use]


def _some_not_finite_or_negative(
    total: torch.Tensor, lowest: torch.Tensor, in_use: torch.Tensor | None, pairs: list | None
) -> bool:
    """Whether a pair in use has a sum that is not finite or a minimum below 0: on the pairs read to the
    host (_pairs_read), else by torch ops."""
    if pairs is not None:
        return any(not math.isfinite(s) or m < 0 for s, m in pairs)
    return bool(_in_use(~torch.isfinite(total) | (lowest < 0), in_use).any())


def _some_sum_off(total: torch.Tensor, in_use: torch.Tensor | None, pairs: list | None) -> bool:
    """Whether a pair in use has a sum neither 1 (within 1e-3) nor 0: on the pairs read to the host, else by
    torch ops."""
    if pairs is not None:
        return any(_sum_off(s) for s, _ in pairs)
    return bool(_in_use(_sum_off(total), in_use).any())


def _sum_off(total: torch.Tensor | float) -> torch.Tensor | bool:
    """Where a sum is neither 1 (within 1e-3) nor 0: on a float64 tensor, or on one sum as a Python float
    (the same float64 arithmetic)."""
    if isinstance(total, torch.Tensor):
        return ~(((total - 1).abs() <= 1e-3) | (total == 0))
    return not (abs(total - 1) <= 1e-3 or total == 0)


def check_row_param(
    name: str, value: object, rows: int, device: torch.device, integer: bool, layout: str = "[B]"
) -> torch.Tensor:
    """A per-row parameter as a [rows] tensor: a tensor of that shape, or a Python number broadcast to it.

    integer: True for int64 parameters (top_k), False for float32 ones (temperature, top_p, min_p).
    """
    dtype = torch.int64 if integer else torch.float32
    kind = "an int" if integer else "a float"
    if isinstance(value, torch.Tensor):
        given = value.dtype
        if given is dtype and value.shape == (rows,) and value.device == device:
            return value  # (the common form: [rows], of its dtype, on the device)
        if given.is_floating_point == integer or given == torch.bool:  # (bool: not floating, not an int)
            raise TypeError(f"{name} must be {kind} tensor of shape {layout} (got dtype {given})")
        if value.dim() == 0:
            value = value.reshape(1).expand(rows)
        check_shape(name, value, (rows,), layout)
        check_device(name, value, device, "the logits")
        return value if given == dtype else value.to(dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TypeError(f"{name} must be {kind} tensor of shape {layout} or a number (got {_type_name(value)})")
    return torch.full((rows,), value, dtype=dtype, device=device)


def check_seed(seed: object, rows: int, device: torch.device, layout: str = "[B]") -> tuple[int | torch.Tensor, bool]:
    """The seed and whether it is shared by the batch.

    seed: int in [-2**63, 2**64) (uint64 semantics), a 0-d or [1] integer tensor (shared), or a [rows]
    integer tensor (one key per request). Returns (the int, or int64 [] or [1] if shared else int64 [rows],
    shared).
    """
    if isinstance(seed, torch.Tensor):
        if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool:
            raise TypeError(f"seed must be an int or an integer tensor (got dtype {seed.dtype})")
        check_device("seed", seed, device, "the logits")
        seed = seed if seed.dtype == torch.int64 else seed.to(torch.int64)
        if seed.dim() == 0 or seed.shape == (1,):
            return seed, True  # (as it is: a view to [] would cost more than the rest of the check)
        if seed.shape != (rows,):
            raise ValueError(
                f"seed must be an int, a 0-d or [1] tensor, or a tensor of shape {layout} = [{rows}] "
                f"(got shape {list(seed.shape)})"
            )
        return seed, False
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or an integer tensor (got {_type_name(seed)})")
    if not -(1 << 63) <= seed < 1 << 64:
        raise ValueError(f"seed must fit in 64 bits, in [-2**63, 2**64) (got {seed})")
    return seed, True


def check_sampling_params(
    temperature: object, top_k: object, top_p: object, min_p: object, rows: int, device: torch.device, layout: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The per-row sampling parameters as tensors [rows] (metadata checks). min_p may be None."""
    return (
        check_row_param("temperature", temperature, rows, device, integer=False, layout=layout),
        check_row_param("top_k", top_k, rows, device, integer=True, layout=layout),
        check_row_param("top_p", top_p, rows, device, integer=False, layout=layout),
        None if min_p is None else check_row_param("min_p", min_p, rows, device, integer=False, layout=layout),
    )


def check_tree_parents(parents: torch.Tensor, present: torch.Tensor) -> None:
    """Each present node's parent is -1 (the root) or a present node with a smaller index (value check).
    parents: int [B, N]; present: bool [B, N], the nodes that are not padding (SPEC §8)."""
    nodes = torch.arange(parents.shape[-1], device=parents.device)
    checked = present & (parents != -1)
    for bad, rule in (
        (
            checked & ((parents < 0) | (parents >= nodes)),
            "-1 (the root) or the index of an earlier node, in [-1, i) for node i",
        ),
        (
            checked & ~present.gather(-1, parents.clamp(0, max(parents.shape[-1] - 1, 0))),
            "a present node (not padding)",
        ),
    ):
        if bool(bad.any()):
            row, node = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"parents must be {rule} (got {int(parents[row, node])} at row {row}, node {node})")


def check_sibling_draft_probs(draft_probs: torch.Tensor, parents: torch.Tensor, present: torch.Tensor) -> None:
    """Siblings share one q: each present node's draft_probs row agrees within 1e-6 with that of its
    first sibling (value check). draft_probs: float [B, N, V]; parents: int [B, N]; present: bool [B, N]."""
    if draft_probs.shape[1] == 0 or draft_probs.shape[2] == 0:
        return
    siblings = (parents[:, :, None] == parents[:, None, :]) & present[:, None, :] & present[:, :, None]
    first = siblings.to(torch.int8).argmax(-1)  # the lowest-index sibling (a node is its own sibling)
    rows = torch.arange(draft_probs.shape[0], device=first.device)[:, None]
    reference = draft_probs[rows, first]  # whole rows copied by indexing (gather goes entry by entry)
    # in float32 (or the input's float64): the difference of two close floats is exact
    gap = torch.sub(draft_probs, reference, out=reference).abs_().amax(-1).to(torch.float64)
    unequal = present & (gap > 1e-6)
    if bool(unequal.any()):
        row, node = (int(i) for i in unequal.nonzero()[0])
        raise ValueError(
            "draft_probs rows of siblings must agree within 1e-6 "
            f"(got a difference of {gap[row, node].item():.3g} between node {node} and node {int(first[row, node])} at row {row})"
        )
