"""Exact laws in float64, written from SPEC.md's first principles with numpy (no code of the verifier).

These are the independent reference that the tests and the audit hold the verifier to: the truncated
target distribution p~ of one position (SPEC §2), what each rule commits at a position given the draft
(SPEC §3), the same averaged over a random draft, and the law of the first rejection.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

GREEDY_TEMPERATURE = 1e-5


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
    if temperature < GREEDY_TEMPERATURE:
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


def relaxed_position_law(masked_logits: np.ndarray, draft: int, relaxed_topk: int, relaxed_delta: float) -> tuple[float, np.ndarray]:
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
