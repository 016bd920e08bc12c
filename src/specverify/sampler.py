"""`stochastic_acceptance_sampler` and its family (SPEC §1, §7).

One call: check the arguments -> mask the logits with the grammar bitmasks -> build each position's
truncated target weights -> draw one keyed uniform per (row, position, stream) -> judge every position
with the rule of its row (greedy, relaxed, argmax or sampled) -> take the first rejection. Where the
backend runs whole calls (Triton, on CUDA), everything after the checks is one kernel; where it draws rows
(the C kernels, on the CPU), so is every call without thinking rows (verdicts.drawn_verdicts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import checks, kernels
from .bitmask import apply_bitmask, num_words
from .categorical import block_size, sample_from_weights, total_weight
from .contract import DRAFT_PROPOSALS
from .rng import (
    HOST_KEYS,
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    STREAM_TARGET,
    keyed_uniform,
    keyed_uniform_read,
    per_row_seeds,
    row_keys,
    stream_salt,
)
from .truncation import (
    greedy_tokens,
    is_greedy,
    keyed_draws_read,
    per_position_rows,
    target_draws,
    truncated_weights,
)
from .verdicts import (
    argmax_verdict,
    drawn_verdicts,
    first_rejections_read,
    greedy_verdict,
    ratio_test,
    relaxed_verdict,
    sampled_verdict,
    whole_call_verdicts,
)


@dataclass(frozen=True)
class _Plan:
    """Which work a call needs, known on the host without reading device data unless validating."""

    stochastic_rows: tuple[int, ...] | None  # rows sampled from p~ (None: all rows, not known on the host)
    greedy_rows: tuple[int, ...] | None  # greedy rows (None: all rows)
    relaxed_rows: tuple[int, ...] | None  # relaxed rows (None: all rows)
    reads_host: bool = False  # small tensors may be read to the host (a validating call)


def _hint(name: str, value: object, validate: bool, kind: type) -> int | float | None:
    """A host-side hint: a Python number, or a 0-d tensor (read only when validating; else ignored)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(f"{name} must be a number or a 0-d tensor (got shape {list(value.shape)})")
        if not validate:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise TypeError(
            f"{name} must be {'an int' if kind is int else 'a float'}, a 0-d tensor or None (got {type(value).__name__})"
        )
    return value


def _check_max_k(max_k: int | None, top_k: list[int] | None, validate: bool) -> None:
    """max_k is -1 when some row has no top-k limit, else -1 or at least the largest top_k (MAX's hint: the
    backends need no hint, but a wrong one is the caller's error). top_k: the rows' top_k read to the host
    (needed only when validating)."""
    if max_k is not None and max_k != -1 and max_k < 1:
        raise ValueError(f"max_k must be -1 (some row has no limit) or >= 1 (got {max_k})")
    if validate and max_k is not None and max_k != -1:
        unlimited = [row for row, k in enumerate(top_k) if k <= 0]
        if unlimited:
            row = unlimited[0]
            raise ValueError(
                f"max_k must be -1 when a row has no top-k limit (row {row} has top_k {top_k[row]}) (got {max_k})"
            )
        largest = max(top_k, default=0)
        if max_k < largest:
            raise ValueError(f"max_k must be -1 or >= the largest top_k ({largest}) (got {max_k})")


def _check_min_top_p(min_top_p: float | None, top_p: list[float] | None, validate: bool) -> None:
    """min_top_p is in (0, 1] and at most min(top_p) (MAX's hint, checked as max_k is). top_p: the rows'
    top_p read to the host (needed only when validating); a NaN makes the minimum NaN, as torch's min does
    (the value check names it next)."""
    if min_top_p is not None and not (0 < min_top_p <= 1):
        raise ValueError(f"min_top_p must be in (0, 1] (got {min_top_p})")
    if not validate:
        return
    smallest = math.nan if any(math.isnan(p) for p in top_p) else min(top_p, default=1.0)
    # compared in float32, the precision of top_p: a hint equal to the caller's top_p is consistent
    if min_top_p is not None and float(torch.tensor(min_top_p, dtype=torch.float32)) > smallest:
        raise ValueError(f"min_top_p must be <= min(top_p) = {smallest} (got {min_top_p})")


def _check_relaxed(
    in_thinking_phase: object, relaxed_topk: object, relaxed_delta: object, draft_proposal: str, batch: int, device
) -> tuple[torch.Tensor | None, int | None, float | None]:
    """Relaxed arguments are complete, valid and only with "argmax" drafts (SPEC §3.4, §6)."""
    if (relaxed_topk is None) != (relaxed_delta is None):
        raise ValueError(
            "relaxed_topk and relaxed_delta must be given together or not at all "
            f"(got relaxed_topk={relaxed_topk!r}, relaxed_delta={relaxed_delta!r})"
        )
    if in_thinking_phase is not None and relaxed_topk is None:
        raise ValueError("in_thinking_phase needs relaxed_topk and relaxed_delta (got neither)")
    if relaxed_topk is None:
        return None, None, None
    if draft_proposal != "argmax":
        raise ValueError(
            f'relaxed_topk/relaxed_delta need draft_proposal="argmax" (got draft_proposal="{draft_proposal}")'
        )
    topk = checks.check_int("relaxed_topk", relaxed_topk, minimum=1)
    delta = checks.check_float("relaxed_delta", relaxed_delta, 0.0, math.inf, "a float >= 0")
    if in_thinking_phase is not None:
        checks.check_tensor("in_thinking_phase", in_thinking_phase, (torch.bool,), "a bool tensor [B]")
        checks.check_shape("in_thinking_phase", in_thinking_phase, (batch,), "[B]")
        checks.check_same_device({"in_thinking_phase": in_thinking_phase}, device, "target_logits")
    return in_thinking_phase, topk, delta


def stochastic_acceptance_sampler(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    max_k: int | torch.Tensor | None,
    top_p: torch.Tensor,
    min_top_p: float | torch.Tensor | None,
    seed: int | torch.Tensor,
    in_thinking_phase: torch.Tensor | None = None,
    relaxed_topk: int | None = None,
    relaxed_delta: float | None = None,
    token_bitmasks: torch.Tensor | None = None,
    draft_proposal: str = "argmax",
    draft_probs_full: torch.Tensor | None = None,
    vocab_size: int | None = None,
    *,
    min_p: torch.Tensor | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify K draft tokens per request against the target: how many to keep, what replaces the first
    rejection, and the bonus token (SPEC §1-§5). Lossless for every row that is not relaxed.

    draft_tokens: int32/int64 [B, K]; -1 is padding and the first -1 ends that row's draft.
    target_logits: float32/float16/bfloat16 [B*(K+1), V] or [B, K+1, V]; position K scores the bonus.
    temperature: float [B] (< 1e-5: greedy row); top_k: int [B] (<= 0: no limit); top_p: float [B] in (0, 1];
    min_p: float [B] in [0, 1] or None. Per-row parameters may also be Python numbers (every row).
    max_k: -1, an int >= the largest top_k, or None (derived); min_top_p: <= min(top_p) or None (derived).
    Hints given as 0-d tensors are read only when validating.
    seed: int or 0-d/[1] integer tensor shared by the batch (row b uses s + b * 0x9E3779B97F4A7C15),
    or int [B] per request; the draw at position j of row b is keyed by (s_b + j, stream).
    in_thinking_phase: bool [B] or None, with relaxed_topk (int >= 1) and relaxed_delta (float >= 0).
    token_bitmasks: int32 [B, K+1, ceil(V/32)] or None. draft_proposal: "argmax" or "sampled";
    draft_probs_full: float [B, K, V], required for "sampled". vocab_size: optional, must equal V.
    validate: check every value (SPEC §6); False skips the checks that read tensor data to the host.

    Returns int64 tensors on the device of target_logits: first_rejected_idx [B] (K when all accepted),
    recovered_tokens [B, K] (accepted drafts before f, the replacement at f), bonus_tokens [B, 1].
    """
    checks.check_tensor("draft_tokens", draft_tokens, checks.INDEX_DTYPES, "an int32 or int64 tensor [B, K]")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have shape [B, K] (got {list(draft_tokens.shape)})")
    batch, positions = draft_tokens.shape
    logits = checks.check_logits_3d(target_logits, batch, positions)
    vocab, device = logits.shape[-1], logits.device
    if draft_proposal not in DRAFT_PROPOSALS:
        raise ValueError(f'draft_proposal must be "argmax" or "sampled" (got {draft_proposal!r})')
    if vocab_size is not None and checks.check_int("vocab_size", vocab_size) != vocab:
        raise ValueError(f"vocab_size must equal the logits' V = {vocab} (got {vocab_size})")
    temperature, top_k, top_p, min_p = checks.check_sampling_params(
        temperature, top_k, top_p, min_p, batch, device, "[B]"
    )
    seed, shared_seed = checks.check_seed(seed, batch, device)
    in_thinking_phase, relaxed_topk, relaxed_delta = _check_relaxed(
        in_thinking_phase, relaxed_topk, relaxed_delta, draft_proposal, batch, device
    )
    checks.check_masks_and_draft_probs(
        token_bitmasks, draft_proposal, draft_probs_full, "draft_probs_full", batch, positions, vocab, num_words(vocab)
    )
    checks.check_same_device(
        {"draft_tokens": draft_tokens, "token_bitmasks": token_bitmasks, "draft_probs_full": draft_probs_full},
        device,
        "target_logits",
    )
    host = checks.host_values(temperature, top_k, top_p, min_p) if validate else None
    # the hints are checked against the rows' top_k and top_p, read to the host when validating
    top_k_values, top_p_values = host[1:3] if host else (top_k.tolist(), top_p.tolist()) if validate else (None, None)
    _check_max_k(_hint("max_k", max_k, validate, int), top_k_values, validate)
    _check_min_top_p(_hint("min_top_p", min_top_p, validate, float), top_p_values, validate)

    # a small argmax-mode call on the CPU that checks values is judged on the host (_verify_read)
    on_host = (
        host is not None
        and in_thinking_phase is None
        and draft_proposal == "argmax"
        and batch * (positions + 1) <= HOST_KEYS
    )
    draft_values = draft_tokens.tolist() if on_host else None
    masked = None
    if validate:
        masked = logits if token_bitmasks is None else apply_bitmask(logits, token_bitmasks)
        if draft_tokens.numel():
            checks.check_draft_ids(draft_tokens, vocab, values=draft_values)
        checks.check_finite_logits("target_logits", logits, some_finite=token_bitmasks is None)
        checks.check_sampling_values(temperature, top_k, top_p, min_p, host)
        if draft_probs_full is not None:
            checks.check_draft_probs(draft_probs_full)
        if token_bitmasks is not None:
            checks.check_some_allowed("token_bitmasks", masked)
    backend = kernels.backend_for(logits)  # (masked, made from logits, lives on its device)
    if backend.runs_whole_calls:
        return whole_call_verdicts(
            draft_tokens,
            logits,
            token_bitmasks,
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            shared_seed,
            in_thinking_phase,
            relaxed_topk,
            relaxed_delta,
            draft_probs_full,
        )
    if masked is None:
        masked = logits if token_bitmasks is None else apply_bitmask(logits, token_bitmasks)
    if in_thinking_phase is None and backend.draws_rows:
        return drawn_verdicts(
            draft_tokens, masked, temperature, top_k, top_p, min_p, seed, shared_seed, draft_probs_full
        )
    if on_host:
        params = (temperature, top_k, top_p, min_p)
        return _verify_read(draft_values, masked, params, host[0], (seed, shared_seed))
    if validate:
        greedy = is_greedy(temperature).tolist()
        thinking = [False] * batch if in_thinking_phase is None else in_thinking_phase.tolist()
        plan = _Plan(
            stochastic_rows=tuple(row for row in range(batch) if not greedy[row]),
            greedy_rows=tuple(row for row in range(batch) if greedy[row]),
            relaxed_rows=tuple(row for row in range(batch) if thinking[row] and not greedy[row]),
            reads_host=True,
        )
    else:
        plan = _Plan(stochastic_rows=None, greedy_rows=None, relaxed_rows=None)

    draft = _draft_or_padding(draft_tokens, vocab) if positions else draft_tokens.to(torch.int64)
    first, recovered, bonus = _verify(
        draft,
        masked,
        temperature,
        top_k,
        top_p,
        min_p,
        (seed, shared_seed),
        plan,
        in_thinking_phase,
        relaxed_topk,
        relaxed_delta,
        draft_probs_full,
    )
    return first, recovered, bonus


def _verify_read(
    draft: list[list[int]],
    masked: torch.Tensor,
    params: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    temperatures: list[float],
    seed: tuple[int | torch.Tensor, bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verdicts of a small argmax-mode batch on the CPU with its values read to the host (a checking
    call): the outputs of _verify bit for bit, with the bookkeeping on Python lists, since at such sizes the
    fixed cost of each torch op, not the vocabulary pass, is what a call costs. draft: B lists of K checked
    ids (-1: none); masked: [B, K+1, V] CPU; params: the rows' checked temperature, top_k, top_p, min_p
    [B]; temperatures: the temperatures as a list; seed: the checked seed and whether it is shared. Every position's y comes from keyed_draws_read (a
    greedy row's is its argmax, which both rules commit: _verify relies on it too)."""
    batch, per_position, vocab = masked.shape
    target = keyed_draws_read(masked.reshape(-1, vocab), params, temperatures, seed, per_position)
    rows = [target[row * per_position : (row + 1) * per_position] for row in range(batch)]
    first, recovered, bonus = first_rejections_read(draft, rows)  # a row's first -1 is its first rejection
    return (
        torch.tensor(first, dtype=torch.int64),
        torch.tensor(recovered, dtype=torch.int64).view(batch, per_position - 1),
        torch.tensor(bonus, dtype=torch.int64).view(batch, 1),
    )


def _draft_or_padding(draft_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 [B, K] with -1 at every position from a row's first non-id (-1, or out of range) onward."""
    draft = draft_tokens.to(torch.int64)
    present = ((draft >= 0) & (draft < vocab)).to(torch.int64).cumprod(-1).bool()
    return torch.where(present, draft, -1)


def _verify(
    draft: torch.Tensor,
    masked: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    seed: tuple[int | torch.Tensor, bool],
    plan: _Plan,
    in_thinking_phase: torch.Tensor | None,
    relaxed_topk: int | None,
    relaxed_delta: float | None,
    draft_probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verdicts of every row for checked arguments. draft: int64 [B, K]; masked: [B, K+1, V]; seed: the
    checked seed and whether it is shared (checks.check_seed), spread to rows only where a row samples.

    Each rule runs on the rows the plan gives it (all rows when the plan does not know); every
    computation is row-independent, so a row's outputs do not depend on which rows ran beside it.
    """
    batch, positions = draft.shape
    device = masked.device
    outputs = None  # (accepted bool [B, K], recovered int64 [B, K], bonus int64 [B]), zeros until a rule writes

    rows = plan.stochastic_rows
    if rows is not None and 2 * len(rows) >= batch:
        rows = None  # cheaper to run every row than to copy most of the logits
    # p~ of a greedy row is one-hot at its argmax, so the stochastic rules commit for it what the greedy
    # rule does: when they run on every row, greedy rows need nothing more
    greedy_done = rows is None
    if _any(rows):
        index = _index(rows, batch, device)
        seeds = per_row_seeds(*seed, batch, device)
        parts = _stochastic_verdicts(
            *(_pick(t, index) for t in (draft, masked, temperature, top_k, top_p, min_p, seeds)),
            plan,
            _pick(draft_probs, index),
        )
        outputs = _merge(outputs, parts, index, None, batch)

    rows = plan.relaxed_rows
    if in_thinking_phase is not None and _any(rows):
        index = _index(rows, batch, device)
        parts = relaxed_verdict(_pick(draft, index), _pick(masked, index), relaxed_topk, relaxed_delta)
        thinking = in_thinking_phase & ~is_greedy(temperature) if rows is None else None
        outputs = _merge(outputs, parts, index, thinking, batch)

    rows = plan.greedy_rows
    if not greedy_done and _any(rows):
        index = _index(rows, batch, device)
        target_argmax = greedy_tokens(_pick(masked, index))
        parts = (*greedy_verdict(_pick(draft, index), target_argmax[:, :positions]), target_argmax[:, positions])
        outputs = _merge(outputs, parts, index, None, batch)

    accepted, recovered, bonus = outputs if outputs is not None else _zeros(batch, positions, device)
    return _first_rejection(accepted), recovered, bonus[:, None]


def _any(rows: tuple[int, ...] | None) -> bool:
    """Whether a rule has rows to judge (None: every row may need it)."""
    return rows is None or len(rows) > 0


def _index(rows: tuple[int, ...] | None, batch: int, device: torch.device) -> torch.Tensor | None:
    """The rows as an int64 index tensor; None for every row (None, or all `batch` rows)."""
    return None if rows is None or len(rows) == batch else torch.tensor(rows, dtype=torch.int64, device=device)


def _pick(value: torch.Tensor | None, index: torch.Tensor | None) -> torch.Tensor | None:
    """value restricted to the given rows (sorted, distinct; None: value itself)."""
    return value if index is None or value is None else value.index_select(0, index)


def _zeros(batch: int, positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch outputs before any rule writes: (accepted bool [B, K], recovered int64 [B, K], bonus int64 [B])."""
    return (
        torch.zeros(batch, positions, dtype=torch.bool, device=device),
        torch.zeros(batch, positions, dtype=torch.int64, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
    )


def _merge(
    outputs: tuple | None, parts: tuple, index: torch.Tensor | None, rule_rows: torch.Tensor | None, batch: int
) -> tuple:
    """Write a rule's outputs over the batch outputs (None: all zeros, made only where some stay): at the
    rows of `index`, or where `rule_rows` (bool [B]) holds, or at every row when both are None. Outputs
    without a counterpart in `parts` stay as they are."""
    covers_all = index is None and rule_rows is None
    if outputs is None:
        if covers_all and len(parts) == 3:
            return parts
        outputs = _zeros(batch, parts[0].shape[1], parts[0].device)
    merged = []
    for position, output in enumerate(outputs):
        if position >= len(parts):
            merged.append(output)
        elif covers_all:
            merged.append(parts[position])
        elif rule_rows is not None:
            merged.append(torch.where(rule_rows.view(-1, *[1] * (output.dim() - 1)), parts[position], output))
        else:
            merged.append(output.index_copy(0, index, parts[position]))
    return tuple(merged)


def _stochastic_verdicts(
    draft: torch.Tensor,
    masked: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor,
    plan: _Plan,
    draft_probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SPEC §3.1/3.2 for the given rows -> (accepted bool [R, K], recovered int64 [R, K], bonus int64 [R])."""
    batch, positions = draft.shape
    vocab = masked.shape[-1]
    per_position = positions + 1
    if kernels.backend_for(masked).draws_rows:
        return _drawn_verdicts(draft, masked, temperature, top_k, top_p, min_p, seeds, draft_probs)
    weights, sums = truncated_weights(
        masked.reshape(-1, vocab), *(per_position_rows(t, per_position) for t in (temperature, top_k, top_p, min_p))
    )
    keys = row_keys(seeds, per_position)
    uniform = keyed_uniform_read if plan.reads_host else keyed_uniform
    target_uniforms = uniform(keys, STREAM_TARGET)
    if draft_probs is None:
        target_sample = sample_from_weights(weights, target_uniforms.view(-1), sums).view(batch, per_position)
        accepted, recovered = argmax_verdict(draft, target_sample[:, :positions])
        return accepted, recovered, target_sample[:, positions]
    weights, sums = weights.view(batch, per_position, vocab), sums.view(batch, per_position, sums.shape[-1])
    accepted, recovered = sampled_verdict(
        draft,
        weights,
        sums,
        draft_probs,
        uniform(keys[:, :positions], STREAM_ACCEPT),
        uniform(keys[:, :positions], STREAM_RESIDUAL),
    )
    bonus = sample_from_weights(weights[:, positions], target_uniforms[:, positions], sums[:, positions])
    return accepted, recovered, bonus


def _drawn_verdicts(
    draft: torch.Tensor,
    masked: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor,
    draft_probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """_stochastic_verdicts where the backend `draws_rows`: the same verdicts bit for bit, each row weighed
    and drawn inside one kernel (target_draws), the uniforms of every stream keyed there, the weights written out only where sampled mode hands a large kept set to the recovery."""
    batch, positions = draft.shape
    vocab = masked.shape[-1]
    per_position = positions + 1
    rows = masked.reshape(-1, vocab)
    if draft_probs is None:
        tokens = target_draws(rows, per_position, temperature, top_k, top_p, min_p, seeds).view(batch, per_position)
        accepted, recovered = argmax_verdict(draft, tokens[:, :positions])
        return accepted, recovered, tokens[:, positions]
    drawn = target_draws(rows, per_position, temperature, top_k, top_p, min_p, seeds, draft)
    tokens, at_draft, accept_uniforms, sums, kept = drawn
    target_mass = total_weight(sums.view(batch, per_position, sums.shape[-1]))[:, :positions]
    accepted, mode = ratio_test(draft, at_draft, target_mass, draft_probs, accept_uniforms)
    drawn = kernels.ops_for(draft_probs).recover_kept_rows(
        kept, sums, target_mass, draft_probs, draft, mode, seeds, stream_salt(STREAM_RESIDUAL), block_size(vocab)
    )
    return accepted, torch.where(accepted, draft, drawn), tokens.view(batch, per_position)[:, positions]


def _first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """Index of the first False per row, K when none. accepted: bool [B, K] -> int64 [B]."""
    return torch.cumprod(accepted, -1, dtype=torch.int64).sum(-1)
