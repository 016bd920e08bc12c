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
    p_draft, q_draft, mode = draft_probabilities(draft, at_draft, target_mass, draft_probs)
    rejected = accept_uniforms * q_draft >= p_draft
    return (draft >= 0) & ~rejected, mode


def draft_probabilities(
    draft: torch.Tensor, at_draft: torch.Tensor, target_mass: torch.Tensor, draft_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p~(d) and q(d) of each draft token in float64, and each position's recovery mode. Shapes as in
    ratio_test -> (p_draft float64 [B, K], q_draft float64 [B, K]: 1 where q(d) == 0 (judged without a
    distribution, as its point mass at d), mode int32 [B, K])."""
    has_draft = draft >= 0
    # p~(d) exactly as truncated_probs gives it (weights over their float32 total), so that a draft whose q
    # is truncated_probs itself is accepted with certainty
    p_draft = (at_draft / target_mass.float()).double()
    q_draft = draft_probs.gather(-1, _draft_column(draft))[..., 0].double()
    blind = q_draft <= 0
    mode = torch.where(has_draft, torch.where(blind, WITHOUT_DRAFT, FROM_RESIDUAL), FROM_TARGET).to(torch.int32)
    return p_draft, torch.where(blind, 1.0, q_draft), mode


def block_verdict(
    ops: Ops,
    draft: torch.Tensor,
    target_weights: torch.Tensor,
    target_sums: torch.Tensor,
    draft_probs: torch.Tensor,
    accept_uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC §3.6: a row's sampled drafts judged as a block. Arguments as in sampled_verdict; `accepted`
    holds the longest kept prefix tau, `recovered` at tau the draw from max(0, P_tau p~ - q) (the other
    rules of sampled_verdict for q(d) == 0, padding and an empty residual)."""
    positions = draft.shape[1]
    if not positions:  # K = 0: no prefix to judge (and none to take the longest of)
        return sampled_verdict(ops, draft, target_weights, target_sums, draft_probs, accept_uniforms, residual_uniforms)
    target_mass = total_weight(target_sums)[:, :positions]
    at_draft = target_weights[:, :positions].gather(-1, _draft_column(draft))[..., 0]
    p_draft, q_draft, mode = draft_probabilities(draft, at_draft, target_mass, draft_probs)
    joint = joint_ratios(p_draft, q_draft)
    scaled_q = draft_probs.float() * _inverse(joint[:, :positions], mode)[..., None]  # q / P_i: [B, K, V]
    residual_masses = _residual_masses(target_weights, target_mass, scaled_q, joint, mode, p_draft)
    kept = kept_prefixes(draft, joint, p_draft, q_draft, residual_masses, accept_uniforms)
    longest = torch.where(kept, torch.arange(1, positions + 1, device=draft.device), 0).amax(-1, keepdim=True)
    accepted = torch.arange(positions, device=draft.device) < longest
    drawn = recovery_draw(ops, target_weights, target_sums, target_mass, scaled_q, draft, mode, residual_uniforms)
    return accepted, torch.where(accepted, draft, drawn)


def joint_ratios(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """P_0 = 1, P_{i+1} = min(1, P_i p~_i(d_i) / q_i(d_i)) (SPEC §3.6): float64 [B, K] -> [B, K + 1]
    (entries past a row's drafts are not used)."""
    ratios = torch.ones(p_draft.shape[0], p_draft.shape[1] + 1, dtype=torch.float64, device=p_draft.device)
    for i in range(p_draft.shape[1]):
        ratios[:, i + 1] = (ratios[:, i] * p_draft[:, i] / q_draft[:, i]).clamp(max=1.0)
    return ratios


def _inverse(joint: torch.Tensor, mode: torch.Tensor) -> torch.Tensor:
    """1 / P_i where position i recovers from the residual with q (1 elsewhere and where P_i == 0), as
    float32 clamped at its largest finite value: the factor of q in max(0, p~ - q / P_i). [B, K]."""
    usable = (mode == FROM_RESIDUAL) & (joint > 0)
    inverse = torch.where(usable, 1.0 / torch.where(usable, joint, 1.0), 1.0)
    return inverse.clamp(max=torch.finfo(torch.float32).max).float()


def _residual_masses(
    target_weights: torch.Tensor,
    target_mass: torch.Tensor,
    scaled_q: torch.Tensor,
    joint: torch.Tensor,
    mode: torch.Tensor,
    p_draft: torch.Tensor,
) -> torch.Tensor:
    """R_i = sum_x max(0, P_i p~_i(x) - q_i(x)) at each position (float64 [B, K]): P_i times the mass of
    max(0, p~_i - q_i / P_i) as recover_rows draws it, P_i (1 - p~_i(d)) where q_i(d) == 0 (q_i is the
    point mass at d). scaled_q: float32 [B, K, V], q / P_i (q where not FROM_RESIDUAL); p_draft: float64
    [B, K], p~_i(d) from draft_probabilities."""
    positions = scaled_q.shape[1]
    target_probs = target_weights[:, :positions] / target_mass[..., None].float()
    residual = (target_probs - scaled_q).clamp(min=0).sum(-1, dtype=torch.float64)
    residual = torch.where(mode == WITHOUT_DRAFT, (1 - p_draft).clamp(min=0), residual)
    return joint[:, :positions] * residual


def kept_prefixes(
    draft: torch.Tensor,
    joint: torch.Tensor,
    p_draft: torch.Tensor,
    q_draft: torch.Tensor,
    residual_masses: torch.Tensor,
    accept_uniforms: torch.Tensor,
) -> torch.Tensor:
    """Whether each prefix of length i = 1..K is kept (SPEC §3.6), on the coin of its last draft: bool
    [B, K] (entry i - 1 for the prefix of length i; False past a row's drafts). joint: [B, K + 1] from
    joint_ratios; residual_masses: float64 [B, K], R_i at position i; the rest as in ratio_test."""
    positions = draft.shape[1]
    drafted = (draft >= 0).sum(-1, keepdim=True)
    length = torch.arange(1, positions + 1, device=draft.device)
    # every draft (i = gamma): u * q(d) < P_{gamma-1} p~(d), coin for coin the test of SPEC §3.2
    whole = accept_uniforms * q_draft < joint[:, :positions] * p_draft
    # a shorter prefix (i < gamma): u * (R_i + 1 - P_i) < R_i, or P_i == 1; R_i sits at position i
    inner_joint = joint[:, 1:]
    inner_mass = torch.cat([residual_masses[:, 1:], torch.zeros_like(residual_masses[:, :1])], dim=-1)
    inner = (inner_joint >= 1) | (accept_uniforms * (inner_mass + 1 - inner_joint) < inner_mass)
    return torch.where(length == drafted, whole, inner & (length < drafted))


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
