"""Exact laws in float64, written from SPEC.md's first principles with numpy (no code of the verifier).

These are the independent reference that the tests and the audit hold the verifier to: the truncated
target distribution p~ of one position (SPEC §2), what each rule commits at a position given the draft
(SPEC §3), the same averaged over a random draft, and the law of the first rejection.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

#: Rows below this temperature are greedy (SPEC §3.3), compared in float32 as the library compares its
#: float32 temperatures (so a row at exactly float32(1e-5) is sampled, not greedy).
GREEDY_TEMPERATURE = float(np.float32(1e-5))


def truncated_distribution(
    logits: np.ndarray,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """p~ for one position. logits: [V]; allowed: bool [V] or None. Returns float64 [V] summing to 1.

    Greedy (temperature < 1e-5) is one-hot at the first argmax of the masked logits.
    """
    x = np.asarray(logits, dtype=np.float64)
    if allowed is not None:
        x = np.where(allowed, x, -np.inf)
    if np.float32(temperature) < np.float32(GREEDY_TEMPERATURE):
        p = np.zeros_like(x)
        p[int(np.argmax(x))] = 1.0
        return p
    z = (x - x.max()) / temperature
    p = np.exp(z)
    p /= p.sum()
    keep = p > 0
    if 0 < top_k < len(p):
        kth = np.sort(p)[::-1][top_k - 1]
        keep &= p >= kth
    if top_p < 1:
        after_k = np.where(keep, p, 0.0)
        after_k /= after_k.sum()
        order = np.argsort(-after_k, kind="stable")
        mass = np.cumsum(after_k[order])
        crossing = int(np.searchsorted(mass, top_p * (1 - 1e-9)))  # first prefix whose mass reaches top_p
        keep &= after_k >= after_k[order[min(crossing, len(p) - 1)]]
    if min_p > 0:
        keep &= p >= min_p * p.max()
    kept = np.where(keep, p, 0.0)
    return kept / kept.sum()


def argmax_position_law(target: np.ndarray, draft: int) -> tuple[float, np.ndarray]:
    """SPEC §3.1 at one position: (P(accept), law of the committed token). target: p~ [V]; draft -1 = none."""
    accept = float(target[draft]) if draft >= 0 else 0.0
    return accept, target.copy()


def sampled_position_law(target: np.ndarray, draft_probs: np.ndarray, draft: int) -> tuple[float, np.ndarray]:
    """SPEC §3.2 at one position for a fixed draft token: (P(accept), law of the committed token).

    target: p~ [V]; draft_probs: q [V] (all zero allowed); draft: id, or -1 for none (recover from p~).
    Averaged over draft ~ q, the committed law is p~ (the guarantee); for one fixed draft it is
    P(accept) * delta_draft + (1 - P(accept)) * residual.
    """
    if draft < 0:
        return 0.0, target.copy()
    p_d, q_d = float(target[draft]), float(draft_probs[draft])
    if q_d > 0:
        accept = min(1.0, p_d / q_d)
        residual = np.maximum(target - draft_probs, 0.0)
    else:
        accept = p_d
        residual = target.copy()
        residual[draft] = 0.0
    residual = residual / residual.sum() if residual.sum() > 0 else target.copy()
    committed = (1 - accept) * residual
    committed[draft] += accept
    return accept, committed


def greedy_position_law(masked_logits: np.ndarray, draft: int) -> tuple[float, np.ndarray]:
    """SPEC §3.3: accept iff draft == first argmax; the committed token is that argmax."""
    top = int(np.argmax(np.where(np.isnan(masked_logits), -np.inf, masked_logits)))
    committed = np.zeros(len(masked_logits))
    committed[top] = 1.0
    return float(draft == top), committed


def relaxed_position_law(
    masked_logits: np.ndarray, draft: int, relaxed_topk: int, relaxed_delta: float
) -> tuple[float, np.ndarray]:
    """SPEC §3.4 (deterministic): accept iff the draft is among the relaxed_topk most likely tokens (ties
    broken by lower id) and p(d) >= p(top1) - delta, on softmax(masked logits) without temperature."""
    x = np.asarray(masked_logits, dtype=np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    top = int(order[0])
    accepted = draft >= 0 and draft in set(order[:relaxed_topk].tolist()) and p[draft] >= p[top] - relaxed_delta
    committed = np.zeros(len(p))
    committed[draft if accepted else top] = 1.0
    return float(accepted), committed


def mixed_position_law(
    draft_law: np.ndarray, law_given_draft: Callable[[int], tuple[float, np.ndarray]]
) -> tuple[float, np.ndarray]:
    """A position law averaged over a random draft: (P(accept), law of the committed token [V]).

    draft_law: float64 [V+1], the probability of each draft id, the last entry for padding (-1);
    law_given_draft(d): one of the *_position_law above with everything but the draft fixed.
    With drafts drawn from q in "sampled" mode this is (sum(min(p~, q)), p~): the guarantee.
    """
    draft_law = np.asarray(draft_law, dtype=np.float64)
    padding = len(draft_law) - 1
    accept, committed = 0.0, 0.0
    for d in np.flatnonzero(draft_law):
        a, law = law_given_draft(-1 if d == padding else int(d))
        accept += draft_law[d] * a
        committed = committed + draft_law[d] * law
    return float(accept), np.asarray(committed, dtype=np.float64)


def first_rejection_law(accept_probs: np.ndarray) -> np.ndarray:
    """P(first rejection = j) for j = 0..K from independent per-position acceptance probabilities [K].

    Returns float64 [K+1]; entry K is P(all accepted).
    """
    accept_probs = np.asarray(accept_probs, dtype=np.float64)
    reach = np.concatenate([[1.0], np.cumprod(accept_probs)])
    law = reach.copy()
    law[:-1] *= 1 - accept_probs
    return law


def sibling_sequences(draft_law: np.ndarray, siblings: int, draws: str) -> list[tuple[tuple[int, ...], float]]:
    """Every ordered sequence of sibling tokens with its probability (SPEC §8 sibling_draws).

    draft_law: float64 [V]; "with_replacement": i.i.d. from it; "without_replacement": each from it
    without the earlier siblings' tokens, renormalised (a sequence that runs out of mass has probability 0).
    """
    q = np.asarray(draft_law, dtype=np.float64)
    out = []
    for sequence in itertools.product(np.flatnonzero(q).tolist(), repeat=siblings):
        probability, left = 1.0, q.copy()
        for token in sequence:
            mass = left.sum()
            probability *= left[token] / mass if mass > 0 else 0.0
            if draws == "without_replacement":
                left[token] = 0.0
        if probability > 0:
            out.append((sequence, probability))
    return out


def tree_node_law(
    target: np.ndarray,
    draft_law: np.ndarray,
    siblings: int,
    draws: str = "with_replacement",
    proposal: str = "argmax",
    *,
    sequences: list[tuple[tuple[int, ...], float]] | None = None,
    judged: str | None = None,
    update_residual: bool = True,
    forget_blind: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """One step of the tree walk (SPEC §8) at a node whose `siblings` children are drawn from draft_law.

    target: p~ [V] of the node; draft_law: q [V], which "sampled" also passes as the children's q.
    Returns (descend [siblings, V]: P(the walk descends into the child of rank k, whose token is v),
    stop [V]: P(the walk stops there committing v)), averaged over the children's draws. The guarantee
    is descend.sum(0) + stop == target.
    "argmax": y ~ p~; descend into the lowest-rank child with token y, else commit y. "sampled": child c
    in rank order is accepted with min(1, r(c) / q(c)) (r(c) when q(c) == 0, or when q, without
    replacement, has lost all its mass: judged without a distribution); on rejection r = max(0, r - q)
    renormalised (r without c, renormalised, when c was judged without q), and q loses c when judged
    "without_replacement"; when all are rejected a draw from r (p~ if r has no mass).
    sequences: the children's tokens in rank order with their probabilities, when they were not drawn as
    `draws` says (e.g. a child the draft could not have drawn, q(c) == 0); None: sibling_sequences.
    judged, update_residual, forget_blind: only to compute known-wrong variants (a verifier judging with
    the other scheme than the draft used; one that never updates r; one that leaves r as it was when it
    rejects a child judged without q).
    """
    target = np.asarray(target, dtype=np.float64)
    judged = judged or draws
    descend, stop = np.zeros((siblings, len(target))), np.zeros(len(target))
    for sequence, probability in sibling_sequences(draft_law, siblings, draws) if sequences is None else sequences:
        if proposal == "argmax":
            for y in np.flatnonzero(target):
                if y in sequence:
                    descend[sequence.index(y), y] += probability * target[y]
                else:
                    stop[y] += probability * target[y]
            continue
        r, q, reach = target.copy(), np.asarray(draft_law, dtype=np.float64).copy(), probability
        for rank, token in enumerate(sequence):
            q_c = q[token]
            accept = min(1.0, r[token] / q_c) if q_c > 0 else r[token]
            descend[rank, token] += reach * accept
            reach *= 1 - accept
            if update_residual:
                if q_c > 0:
                    r = np.maximum(r - q, 0.0)
                elif not forget_blind:
                    r[token] = 0.0
                r = r / r.sum() if r.sum() > 0 else r
            if judged == "without_replacement":
                q[token] = 0.0
                q = q / q.sum() if q.sum() > 0 else q
        stop += reach * (r if r.sum() > 0 else target)
    return descend, stop
