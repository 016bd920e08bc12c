"""One function per acceptance rule (SPEC §3): each judges every draft position of a batch at once.

Every verdict takes `draft: int64 [B, K]` with -1 where the row has no draft token (padding, and every
position after a row's first -1) and returns `(accepted: bool [B, K], recovered: int64 [B, K])`, where
`recovered` is the token committed at that position if it is the first rejection (and the draft token
where accepted). A position without a draft is never accepted.
"""

from __future__ import annotations

import torch

from ..interface import FROM_RESIDUAL, FROM_TARGET, WITHOUT_DRAFT, Ops, block_size
from .categorical import total_weight


def _draft_column(draft: torch.Tensor) -> torch.Tensor:
    """The draft as gather indices, with -1 mapped to 0 (its entries are ignored). [B, K] -> [B, K, 1]."""
    return draft.clamp(min=0)[..., None]


def argmax_verdict(draft: torch.Tensor, target_sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC §3.1: accept iff the draft equals y_j ~ p~_j; the committed token is y_j either way.

    target_sample: int64 [B, K], the keyed draws y_j.
    """
    return draft == target_sample, target_sample


def greedy_verdict(draft: torch.Tensor, target_argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC §3.3: accept iff the draft equals the argmax of the masked logits. target_argmax: int64 [B, K]."""
    return draft == target_argmax, target_argmax


def first_rejections_read(
    draft: list[list[int]], target: list[list[int]]
) -> tuple[list[int], list[list[int]], list[int]]:
    """SPEC §3.1 and §3.3 with the first rejection, on values read to the host (small batches): row b
    accepts its drafts while d_bj == y_bj, commits y_bj at every drafted position (the draft where accepted,
    the replacement at the first rejection) and y_bK as the bonus, as argmax_verdict and greedy_verdict do.
    draft: B lists of K ids (-1: none, never accepted); target: B lists of K + 1 tokens y (keyed draws from
    p~, or argmaxes) -> (first rejected index per row (K when all accepted), recovered [B][K], bonus [B])."""
    first = []
    for drafted, tokens in zip(draft, target):
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == tokens[accepted]:
            accepted += 1
        first.append(accepted)
    return first, [tokens[:-1] for tokens in target], [tokens[-1] for tokens in target]


def sampled_verdict(
    ops: Ops,
    draft: torch.Tensor,
    target_weights: torch.Tensor,
    target_sums: torch.Tensor,
    draft_probs: torch.Tensor,
    accept_uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC §3.2: the ratio test `reject iff u * q(d) >= p~(d)` with recovery from max(0, p~ - q).

    target_weights: float32 [B, P, V] with P >= K, p~ unnormalised (positions from K on are not used);
    target_sums: float64 [B, P, blocks], their block sums (contiguous); draft_probs: float
    [B, K, V], q; accept_uniforms, residual_uniforms: float64 [B, K].
    Where q(d) == 0 the position is judged without a distribution: q(d) counts as 1 and the residual is p~
    with d removed. Positions without a draft recover from p~; an empty residual (p~ == q) falls back to p~.
    """
    positions = draft.shape[1]
    target_mass = total_weight(target_sums)[:, :positions]
    at_draft = target_weights[:, :positions].gather(-1, _draft_column(draft))[..., 0]
    accepted, mode = ratio_test(draft, at_draft, target_mass, draft_probs, accept_uniforms)
    drawn = recovery_draw(ops, target_weights, target_sums, target_mass, draft_probs, draft, mode, residual_uniforms)
    return accepted, torch.where(accepted, draft, drawn)


def ratio_test(
    draft: torch.Tensor,
    at_draft: torch.Tensor,
    target_mass: torch.Tensor,
    draft_probs: torch.Tensor,
    accept_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance of sampled_verdict and each position's recovery mode. at_draft: float32 [B, K], the
    weight of each draft token (any value where there is none); target_mass: float64 [B, K], the weights'
    sums; the rest as in sampled_verdict -> (accepted bool [B, K], mode int32 [B, K]: FROM_RESIDUAL,
    WITHOUT_DRAFT where q(d) == 0, FROM_TARGET where there is no draft)."""
    has_draft = draft >= 0
    # p~(d) exactly as truncated_probs gives it (weights over their float32 total), so that a draft whose q
    # is truncated_probs itself is accepted with certainty
    p_draft = (at_draft / target_mass.float()).double()
    q_draft = draft_probs.gather(-1, _draft_column(draft))[..., 0].double()
    blind = q_draft <= 0
    rejected = accept_uniforms * torch.where(blind, 1.0, q_draft) >= p_draft
    mode = torch.where(has_draft, torch.where(blind, WITHOUT_DRAFT, FROM_RESIDUAL), FROM_TARGET).to(torch.int32)
    return has_draft & ~rejected, mode


def recovery_draw(
    ops: Ops,
    target_weights: torch.Tensor,
    target_sums: torch.Tensor,
    target_mass: torch.Tensor,
    draft_probs: torch.Tensor,
    draft: torch.Tensor,
    mode: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """One draw per position from p~ - q clamped at 0 (FROM_RESIDUAL; p~ when that is all zero), p~
    without the draft token (WITHOUT_DRAFT) or p~ (FROM_TARGET). Shapes as in sampled_verdict; target_mass:
    float64 [B, K], the weights' sums; mode: int32 [B, K] -> int64 [B, K]. The backend's recover_rows
    draws (a compiled one without materialising the residual)."""
    batch, positions, vocab = draft_probs.shape
    if not draft_probs.numel():
        return torch.zeros(batch, positions, dtype=torch.int64, device=draft_probs.device)
    return ops.recover_rows(
        target_weights, target_sums, target_mass, draft_probs, draft, mode, uniforms, block_size(vocab)
    )


def relaxed_verdict(
    ops: Ops, draft: torch.Tensor, masked_logits: torch.Tensor, relaxed_topk: int, relaxed_delta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC §3.4 (lossy by design): on softmax(masked logits) without temperature, accept iff the draft is
    among the `relaxed_topk` most likely tokens and p(d) >= p(top-1) - relaxed_delta; recover the top-1.

    masked_logits: float [B, P, V] with P >= K (positions from K on are not used). Tokens are ranked by
    logit, which orders them exactly as their probabilities. "Among the k most likely" counts exactly k
    tokens: a token tied with the k-th is in only if its id is lower (the order of a stable sort), so the
    worked example of the issue holds: probs [.05, .10, .20, .50, .10, .05], top-3 = {3, 2, 1}, and
    draft 4 is rejected. A draft the grammar mask forbids (probability 0) is never accepted.
    The backend's relaxed_rows judges each position (a compiled one without materialising the softmax).
    """
    if not (masked_logits.numel() and draft.numel()):
        return torch.zeros(draft.shape, dtype=torch.bool, device=draft.device), draft
    accepted, top1 = ops.relaxed_rows(masked_logits.detach(), draft, relaxed_topk, relaxed_delta)
    return accepted, torch.where(accepted, draft, top1)
