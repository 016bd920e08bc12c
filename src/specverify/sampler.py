"""`stochastic_acceptance_sampler` and its family (SPEC §1, §7).

One call: check the arguments -> the backend's `verify_chain` (kernels/interface.py) -> its outputs. The
backend masks the logits with the grammar bitmasks, builds each position's truncated target weights,
draws one keyed uniform per (row, position, stream), judges every position with the rule of its row
(greedy, relaxed, argmax or sampled) and takes the first rejection: in one kernel (Triton, on CUDA; the
C kernels on the CPU, for every call without thinking rows) or in stages over its per-row ops
(kernels/stages/chain.py).
"""

from __future__ import annotations

import math

import torch

from . import checks, kernels
from .bitmask import apply_bitmask, num_words
from .contract import DRAFT_PROPOSALS, VERIFICATIONS
from .kernels.interface import ChainCall, HostValues, Relaxed
from .rng import HOST_KEYS


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


def _check_verification(verification: object, draft_proposal: str) -> None:
    """verification is "token" or "block", and "block" judges sampled drafts only (SPEC §3.6)."""
    if verification not in VERIFICATIONS:
        raise ValueError(f'verification must be "token" or "block" (got {verification!r})')
    if verification == "block" and draft_proposal != "sampled":
        raise ValueError(
            f'verification="block" needs draft_proposal="sampled": argmax drafts are judged by SPEC §3.1 '
            f'(got draft_proposal="{draft_proposal}")'
        )


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
    verification: str = "token",
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
    verification: "token" (each sampled draft judged alone, SPEC §3.2) or "block" (a row's sampled drafts
    judged jointly, SPEC §3.6: at least as many accepted in expectation, the same law); "block" needs
    draft_proposal="sampled".
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
    _check_verification(verification, draft_proposal)
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
    top_k_values, top_p_values = None, None
    if validate:
        top_k_values, top_p_values = (host[1], host[2]) if host else (top_k.tolist(), top_p.tolist())
    _check_max_k(_hint("max_k", max_k, validate, int), top_k_values, validate)
    _check_min_top_p(_hint("min_top_p", min_top_p, validate, float), top_p_values, validate)

    # a small argmax-mode call that checks values reads its drafts once, for the check and the backend
    small = batch * (positions + 1) <= HOST_KEYS and in_thinking_phase is None and draft_proposal == "argmax"
    draft_values = draft_tokens.tolist() if host is not None and small else None
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
    call = ChainCall(
        draft_tokens=draft_tokens,
        logits=logits,
        bitmask=token_bitmasks,
        masked=masked,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
        shared_seed=shared_seed,
        relaxed=None if in_thinking_phase is None else Relaxed(in_thinking_phase, relaxed_topk, relaxed_delta),
        draft_probs=draft_probs_full,
        host=HostValues(temperatures=host[0] if host else None, draft=draft_values) if validate else None,
        block=verification == "block",
    )
    return kernels.ops_for(logits).verify_chain(call)
