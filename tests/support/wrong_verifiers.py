"""Deliberately wrong verifiers, two with the `stochastic_acceptance_sampler` signature and one with the
`tree_acceptance_sampler` signature, for the audit to catch.

Each makes one classic mistake on top of the correct verifier, through the public API only, so that
everything else (keys, padding, greedy rows, masks) stays right and the audit has to find the mistake
itself. Audit them with
    python -m specverify.audit --quick --verifier tests/support/wrong_verifiers.py:recovery_from_full_target
"""

from __future__ import annotations

import torch

import specverify as sv


def _per_row(value, rows: int, dtype) -> torch.Tensor:
    """A per-row argument as a [B] tensor (Python numbers apply to every row)."""
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        return value
    return torch.as_tensor(value, dtype=dtype).expand(rows)


def recovery_from_full_target(
    draft_tokens,
    target_logits,
    temperature,
    top_k,
    max_k,
    top_p,
    min_top_p,
    seed,
    in_thinking_phase=None,
    relaxed_topk=None,
    relaxed_delta=None,
    token_bitmasks=None,
    draft_proposal="argmax",
    draft_probs_full=None,
    vocab_size=None,
    *,
    min_p=None,
    validate=True,
):
    """Wrong in "sampled" mode: a rejected draft is replaced by a sample of the full p~ instead of the
    residual max(0, p~ - q), which over-weights the tokens q already proposes. Per-request seeds [B]."""
    first, recovered, bonus = sv.stochastic_acceptance_sampler(
        draft_tokens,
        target_logits,
        temperature,
        top_k,
        max_k,
        top_p,
        min_top_p,
        seed,
        in_thinking_phase,
        relaxed_topk,
        relaxed_delta,
        token_bitmasks,
        draft_proposal,
        draft_probs_full,
        vocab_size,
        min_p=min_p,
        validate=validate,
    )
    rows, K = draft_tokens.shape
    if draft_proposal != "sampled" or K == 0:
        return first, recovered, bonus
    rejected = torch.nonzero(first < K)[:, 0]
    at = first[rejected]
    logits = target_logits.reshape(rows, K + 1, -1)[rejected, at]
    redrawn = sv.sample(
        logits,
        _per_row(temperature, rows, torch.float32)[rejected],
        _per_row(top_k, rows, torch.int64)[rejected],
        _per_row(top_p, rows, torch.float32)[rejected],
        seed[rejected] + at,
        min_p=None if min_p is None else _per_row(min_p, rows, torch.float32)[rejected],
        token_bitmask=None if token_bitmasks is None else token_bitmasks[rejected, at],
    )
    recovered = recovered.clone()
    recovered[rejected, at] = redrawn
    return first, recovered, bonus


def _top_p_before_renormalisation(masked: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """The wrong kept set: top-p's mass is counted on p itself, not on p renormalised after top-k, so
    it reaches top_p later and keeps too many tokens. masked: [N, V] -> bool [N, V]."""
    p = torch.softmax(masked.float() / temperature.clamp(min=1e-5)[:, None], dim=-1)
    vocab = p.shape[-1]
    limited = (top_k > 0) & (top_k < vocab)
    kth = p.sort(-1, descending=True).values.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])
    keep = ~limited[:, None] | (p >= kth)
    ordered = torch.where(keep, p, 0.0).sort(-1, descending=True).values
    crossing = (ordered.cumsum(-1) < top_p[:, None]).sum(-1).clamp(max=vocab - 1)
    return keep & (p >= ordered.gather(1, crossing[:, None]))


def top_p_before_top_k_renormalisation(
    draft_tokens,
    target_logits,
    temperature,
    top_k,
    max_k,
    top_p,
    min_top_p,
    seed,
    in_thinking_phase=None,
    relaxed_topk=None,
    relaxed_delta=None,
    token_bitmasks=None,
    draft_proposal="argmax",
    draft_probs_full=None,
    vocab_size=None,
    *,
    min_p=None,
    validate=True,
):
    """Wrong whenever top-k and top-p meet: truncates with `_top_p_before_renormalisation` (sending the
    dropped tokens to -inf), then verifies with top-k and top-p off; relaxed rows are left to the
    verifier. Per-row tensor parameters."""
    rows, K = draft_tokens.shape
    logits = target_logits.reshape(rows, K + 1, -1).float()
    if token_bitmasks is not None:
        logits = logits.masked_fill(~sv.unpack_bitmask(token_bitmasks, logits.shape[-1]), float("-inf"))
    keep = _top_p_before_renormalisation(
        logits.reshape(rows * (K + 1), -1),
        temperature.repeat_interleave(K + 1),
        top_k.repeat_interleave(K + 1),
        top_p.repeat_interleave(K + 1),
    ).reshape(logits.shape)
    thinking = torch.zeros(rows, dtype=torch.bool) if in_thinking_phase is None else in_thinking_phase
    truncated = logits.masked_fill(~(keep | thinking[:, None, None]), float("-inf"))
    top_k = torch.where(thinking, top_k, -1)
    top_p = torch.where(thinking, top_p, 1.0)
    return sv.stochastic_acceptance_sampler(
        draft_tokens,
        truncated,
        temperature,
        top_k,
        None,
        top_p,
        None,
        seed,
        in_thinking_phase,
        relaxed_topk,
        relaxed_delta,
        token_bitmasks,
        draft_proposal,
        draft_probs_full,
        vocab_size,
        min_p=min_p,
        validate=validate,
    )


def tree_recovery_from_full_target(
    draft_tokens,
    parents,
    target_logits,
    temperature,
    top_k,
    top_p,
    seed,
    *,
    min_p=None,
    token_bitmasks=None,
    draft_proposal="argmax",
    draft_probs=None,
    sibling_draws="with_replacement",
    validate=True,
):
    """The same mistake in a tree verifier (SPEC §8): where the walk stops at a node whose children were all
    rejected, commit a sample of the full p~ there instead of a draw from the residual. Per-row tensor
    parameters and seeds [B]."""
    path, length, token = sv.tree_acceptance_sampler(
        draft_tokens,
        parents,
        target_logits,
        temperature,
        top_k,
        top_p,
        seed,
        min_p=min_p,
        token_bitmasks=token_bitmasks,
        draft_proposal=draft_proposal,
        draft_probs=draft_probs,
        sibling_draws=sibling_draws,
        validate=validate,
    )
    rows, nodes = draft_tokens.shape
    if draft_proposal != "sampled" or nodes == 0:
        return path, length, token
    last = torch.where(length > 0, path.gather(1, (length - 1).clamp(min=0)[:, None])[:, 0], -1)  # -1: the root
    has_children = ((parents == last[:, None]) & (draft_tokens >= 0)).any(1)
    rejected = torch.nonzero(has_children)[:, 0]
    index = last[rejected] + 1
    redrawn = sv.sample(
        target_logits.reshape(rows, nodes + 1, -1)[rejected, index],
        temperature[rejected],
        top_k[rejected],
        top_p[rejected],
        seed[rejected] + length[rejected],
        min_p=None if min_p is None else min_p[rejected],
        token_bitmask=None if token_bitmasks is None else token_bitmasks[rejected, index],
    )
    return path, length, token.index_copy(0, rejected, redrawn)


def block_as_token_wise(
    draft_tokens,
    target_logits,
    temperature,
    top_k,
    max_k,
    top_p,
    min_top_p,
    seed,
    in_thinking_phase=None,
    relaxed_topk=None,
    relaxed_delta=None,
    token_bitmasks=None,
    draft_proposal="argmax",
    draft_probs_full=None,
    vocab_size=None,
    *,
    min_p=None,
    verification="token",
    validate=True,
):
    """Wrong under verification="block": takes the argument and judges the drafts one by one (SPEC §3.2), a
    silent fallback. Every committed token still follows p~; what gives it away is the first rejection's
    law, which is not block verification's."""
    return sv.stochastic_acceptance_sampler(
        draft_tokens,
        target_logits,
        temperature,
        top_k,
        max_k,
        top_p,
        min_top_p,
        seed,
        in_thinking_phase,
        relaxed_topk,
        relaxed_delta,
        token_bitmasks,
        draft_proposal,
        draft_probs_full,
        vocab_size,
        min_p=min_p,
        validate=validate,
    )
