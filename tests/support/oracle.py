"""An oracle of p~ (SPEC §2) and of the verdicts (SPEC §3) in float64 NumPy, written from SPEC.md alone.

It imports nothing from specverify and shares no code with it (nor with specverify.audit.exact, which
lives in the package): the tests hold `truncated_probs`, `sample` and `stochastic_acceptance_sampler`
to it, so a truncation error shared by the verifier and its reference functions shows up here.

The law is computed in float64 from the float32 logits the caller passes; the library computes in
float32, so a decision that lies within float32 rounding of its boundary may go either way there. Every
function therefore also returns a margin: the smallest distance of any decision it made from its boundary,
relative to that boundary (for draws: to the total mass), inf when it made none. Tests compare only where
the margin exceeds AMBIGUOUS, and check that such cases are the rare exception. Ties that are exact in
the inputs (equal logits) are exact in both. Where float32 itself defines the answer, the oracle follows
SPEC §2's "computed in float32": temperatures are compared with float32(1e-5), and a probability below
float32's range (2**-150) is 0.

What the SPEC leaves to the implementation and the tests pin (so that a refactor cannot change a user's
tokens unnoticed), written down here as the oracle does it:
- a draw from weights w with uniform u is the inverse CDF in vocabulary order: the smallest id i with
  w[0] + ... + w[i] > u * sum(w), among ids with w > 0;
- in "sampled" mode a padding position draws from p~ with the residual stream's uniform;
- the relaxed rule's "k most likely" breaks ties by the lower id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: temperature below this: the row is greedy (SPEC §3.3). Temperatures are float32, and so is the bound
#: they are compared with: a caller's 1e-5 (float32(1e-5), just below 1e-5 in float64) is not greedy.
GREEDY_TEMPERATURE = float(np.float32(1e-5))
#: Relative distances up to this are float64 rounding of an exact equality: the boundary is met.
EXACT = 1e-9
#: Relative distances up to this may be decided either way by float32 arithmetic.
AMBIGUOUS = 1e-5
#: A probability below this (half of float32's smallest subnormal) is 0 in float32 (SPEC §2 step 2).
FLOAT32_UNDERFLOW = 2.0**-150


@dataclass(frozen=True)
class Law:
    """p~ of one (row, position): probs float64 [V] summing to 1, and the margin of its kept set."""

    probs: np.ndarray
    margin: float


def _boundary_margin(values: np.ndarray, boundary: float) -> float:
    """The smallest relative distance of distinct values from the boundary they are compared with; values
    that meet it up to float64 rounding (an exact meeting, decided the same way in float32) are left out."""
    distances = np.abs(np.unique(values) - boundary) / boundary
    distances = distances[distances > EXACT]
    return float(distances.min()) if distances.size else np.inf


def truncated_distribution(
    logits: np.ndarray, temperature: float, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0, allowed=None
) -> Law:
    """SPEC §2 step by step for one (row, position). logits: float [V] (use the float32 values the library
    reads); allowed: bool [V] or None (the grammar mask, SPEC §5)."""
    x = np.asarray(logits, dtype=np.float64).copy()
    if allowed is not None:
        x[~np.asarray(allowed, dtype=bool)] = -np.inf  # step 1: disallowed tokens get probability 0
    vocab = len(x)
    if temperature < GREEDY_TEMPERATURE:  # SPEC §3.3: the lowest index among the largest logits
        probs = np.zeros(vocab)
        probs[int(np.flatnonzero(x == x.max())[0])] = 1.0
        return Law(probs, np.inf)
    p = np.exp((x - x.max()) / temperature)  # step 2
    p /= p.sum()
    keep = p > 0
    margin = np.inf
    descending = np.sort(p)[::-1]
    if 0 < top_k < vocab:  # step 3: >= the k-th largest, ties at the boundary all kept
        kth, next_one = descending[top_k - 1], descending[top_k]
        keep &= p >= kth
        if next_one != kth and next_one > 0:  # distinct in float64, but float32 might merge them
            margin = min(margin, (kth - next_one) / kth)
    if top_p < 1:  # step 4, on p renormalised after step 3
        after_k = np.where(keep, p, 0.0)
        after_k /= after_k.sum()
        values = np.unique(after_k[after_k > 0])[::-1]  # distinct probabilities, largest first
        mass_through = np.cumsum([v * np.count_nonzero(after_k == v) for v in values])
        reaches = mass_through >= top_p * (1 - EXACT)  # reaching exactly counts
        crossing = values[int(np.argmax(reaches))] if reaches.any() else values[-1]
        keep &= after_k >= crossing  # the crossing token and every token tied with it
        margin = min(margin, _boundary_margin(mass_through, top_p))
    if min_p > 0:  # step 5
        boundary = min_p * p.max()
        keep &= p >= boundary * (1 - EXACT)  # tokens exactly on the boundary are kept
        margin = min(margin, _boundary_margin(p[p > 0], boundary))
    kept = np.where(keep, p, 0.0)
    probs = kept / kept.sum()  # step 6, where float32 holds no probability below FLOAT32_UNDERFLOW
    margin = min(margin, _boundary_margin(probs[probs > 0], FLOAT32_UNDERFLOW))
    return Law(np.where(probs < FLOAT32_UNDERFLOW, 0.0, probs), margin)


def row_laws(logits, temperature, top_k, top_p, min_p=None, allowed=None) -> list[Law]:
    """The law of every row: logits float32 [N, V]; temperature, top_k, top_p, min_p (or None): [N];
    allowed: bool [N, V] or None. Float parameters are read as float32, as the library reads them."""

    def as_read(value):
        return float(np.float32(value))

    return [
        truncated_distribution(
            logits[n],
            as_read(temperature[n]),
            int(top_k[n]),
            as_read(top_p[n]),
            0.0 if min_p is None else as_read(min_p[n]),
            None if allowed is None else allowed[n],
        )
        for n in range(len(logits))
    ]


@dataclass(frozen=True)
class Draw:
    """A token drawn by inverse CDF, and how far (relatively) the uniform lay from a CDF boundary."""

    token: int
    margin: float


def inverse_cdf(weights: np.ndarray, uniform: float) -> Draw:
    """The smallest id whose cumulative weight (vocabulary order) exceeds uniform * total, among ids with
    positive weight. weights: float [V] >= 0 with some positive weight. The margin is the distance of
    uniform * total from the drawn token's two CDF edges, over the total (a first or last token has no
    edge on its outer side)."""
    weights = np.asarray(weights, dtype=np.float64)
    cumulative = np.cumsum(weights)
    total = cumulative[-1]
    target = uniform * total
    positive = np.flatnonzero(weights > 0)
    rank = min(int(np.searchsorted(cumulative[positive], target, side="right")), len(positive) - 1)
    token = int(positive[rank])
    below = target - (cumulative[token] - weights[token]) if rank > 0 else np.inf
    above = cumulative[token] - target if rank < len(positive) - 1 else np.inf
    return Draw(token, min(below, above) / total)


@dataclass(frozen=True)
class Verdict:
    """The committed tokens of one row (SPEC §1) and the margin of every decision that made them."""

    tokens: list[int]
    first_rejected: int
    margin: float


def argmax_row(laws: list[Law], draft: list[int], uniforms: list[float]) -> Verdict:
    """SPEC §3.1 (and §3.3 for greedy rows, whose p~ is one-hot): y_j drawn from p~_j with the target
    stream's uniform of key s_b + j; accept d_j iff d_j == y_j; commit y_j at the first rejection, or the
    bonus y_K. laws: K+1 laws; draft: K ids (-1 padding); uniforms: K+1 target-stream uniforms."""
    tokens, margin = [], np.inf
    for j, law in enumerate(laws):
        y = inverse_cdf(law.probs, uniforms[j])
        margin = min(margin, law.margin, y.margin)
        tokens.append(y.token)
        if j == len(draft) or draft[j] != y.token:
            return Verdict(tokens, j, margin)
    raise AssertionError("unreachable: the bonus position always commits")


def sampled_row(
    laws: list[Law],
    draft: list[int],
    draft_probs: np.ndarray,
    accept_uniforms: list[float],
    residual_uniforms: list[float],
    bonus_uniform: float,
) -> Verdict:
    """SPEC §3.2: reject d iff u * q(d) >= p~(d) (q(d) counts as 1 where it is 0); on rejection draw from
    max(0, p~ - q) renormalised (p~ without d where q(d) == 0; p~ itself if the residual has no mass); a
    padding position draws from p~ (residual stream); the bonus is drawn from p~_K (target stream).
    draft_probs: float [K, V] (q rows as the caller passed them)."""
    tokens, margin = [], np.inf
    for j, d in enumerate(draft):
        p = laws[j].probs
        margin = min(margin, laws[j].margin)
        if d >= 0:
            q = np.asarray(draft_probs[j], dtype=np.float64)
            q_d = q[d] if q[d] > 0 else 1.0
            if p[d] > 0:
                margin = min(margin, abs(accept_uniforms[j] * q_d - p[d]) / p[d])
            if accept_uniforms[j] * q_d < p[d]:
                tokens.append(d)
                continue
            residual = np.maximum(p - q, 0.0) if q[d] > 0 else np.where(np.arange(len(p)) == d, 0.0, p)
            if not residual.sum() > 0:
                residual = p
        else:
            residual = p
        y = inverse_cdf(residual, residual_uniforms[j])  # its margin, in units of p~'s total mass:
        return Verdict(tokens + [y.token], j, min(margin, y.margin * residual.sum()))
    bonus = inverse_cdf(laws[-1].probs, bonus_uniform)
    return Verdict(tokens + [bonus.token], len(draft), min(margin, laws[-1].margin, bonus.margin))


def relaxed_row(masked_logits: np.ndarray, draft: list[int], topk: int, delta: float, bonus: Draw) -> Verdict:
    """SPEC §3.4 (deliberately lossy): on softmax(masked logits) without temperature, accept d_j iff it is
    among the `topk` most likely tokens and p(d_j) >= p(top-1) - delta; commit the top-1 at the first
    rejection, or the bonus (drawn as in §3.1) when all are accepted. Ties in "most likely" go to the lower
    id (the order of a stable sort; SPEC is silent). masked_logits: float [K+1, V] (-inf where masked)."""
    tokens, margin = [], np.inf
    for j, d in enumerate(draft):
        x = np.asarray(masked_logits[j], dtype=np.float64)
        p = np.exp(x - x.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        if d >= 0 and p[d] > 0:
            margin = min(margin, abs(p[d] - (p[order[0]] - delta)))
        if d >= 0 and p[d] > 0 and d in order[:topk] and p[d] >= p[order[0]] - delta:
            tokens.append(d)
            continue
        return Verdict(tokens + [int(order[0])], j, margin)
    return Verdict(tokens + [bonus.token], len(draft), min(margin, bonus.margin))
