"""Exact laws of one whole verification step of a chain, in float64, written from SPEC §3.2 and §3.6 (and
from Sun et al., "Block Verification Accelerates Speculative Decoding", 2024) with numpy, without code of
the verifier.

A step drafts gamma tokens x_1..x_gamma, each from the draft's law given the tokens before it, and commits
a prefix of them and one more token. Its outcome is the tuple of committed tokens (1 to gamma + 1 of them).
Here the target's and the draft's laws may depend on the whole prefix: `target(prefix)` is p~ after the
tokens `prefix` (a tuple of ids) and `draft(prefix)` the q the next draft token is drawn from there.

- `outcome_law` enumerates every draft block and gives the exact law of the outcome under a rule.
- `lossless_gap` checks the guarantee on a whole step: an outcome c followed by the target's own
  sampling must be distributed as the target sampling gamma + 1 tokens alone.
- `expected_accepted` is the mean number of accepted drafts, what block verification raises.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

#: A law of the next token after a prefix: float64 [V] summing to 1 (a draft law may be one-hot).
Law = Callable[[tuple[int, ...]], np.ndarray]

#: The rules `outcome_law` knows. "token": SPEC §3.2, each draft judged alone, the first rejection ends
#: the step. "block": SPEC §3.6. "block-without-residual-mass": a known-wrong variant (accept the prefix
#: of length i with the probability P_i of its joint ratio alone, h_i = P_i), which the audit must catch.
RULES = ("token", "block", "block-without-residual-mass")


def draft_blocks(draft: Law, vocab: int, gamma: int) -> list[tuple[tuple[int, ...], float]]:
    """Every draft block of gamma tokens with its probability under `draft` (blocks of probability 0
    left out)."""
    blocks = []
    for block in itertools.product(range(vocab), repeat=gamma):
        probability = 1.0
        for i, token in enumerate(block):
            probability *= float(draft(block[:i])[token])
            if probability == 0:
                break
        if probability > 0:
            blocks.append((block, probability))
    return blocks


def _normalised(weights: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """weights over their sum, or `fallback` when they have no mass."""
    total = weights.sum()
    return weights / total if total > 0 else fallback


def _token_step(block: tuple[int, ...], targets: list[np.ndarray], drafts: list[np.ndarray]) -> list:
    """SPEC §3.2 for one draft block: [(P(tau = i), law of the token committed after the i accepted)]."""
    reach, laws = 1.0, []
    for i, token in enumerate(block):
        accept = min(1.0, targets[i][token] / drafts[i][token])
        residual = _normalised(np.maximum(targets[i] - drafts[i], 0.0), targets[i])
        laws.append((reach * (1 - accept), residual))
        reach *= accept
    laws.append((reach, targets[len(block)]))
    return laws


def _block_step(block: tuple[int, ...], targets: list, drafts: list, residual_mass: bool = True) -> list:
    """SPEC §3.6 for one draft block: [(P(tau = i), law of the token committed after the i accepted)].

    P_0 = 1 and P_i = min(1, P_{i-1} p~_{i-1}(x_i) / q_{i-1}(x_i)) (the indices of the lists: position i
    scores the token after i drafts); the prefix of length i < gamma is kept with probability
    h_i = R_i / (R_i + 1 - P_i), R_i = sum_x max(0, P_i p~_i(x) - q_i(x)) (h_i = 1 where P_i = 1), the
    whole block with h_gamma = P_gamma; tau is the longest prefix kept (each judged on its own uniform),
    and the token after it is drawn from max(0, P_tau p~_tau - q_tau) renormalised, or from p~_gamma
    when tau = gamma."""
    gamma = len(block)
    joint = [1.0]
    for i, token in enumerate(block):
        joint.append(min(1.0, joint[-1] * targets[i][token] / drafts[i][token]))
    keep = [1.0]  # h_0: the empty prefix is always kept
    for i in range(1, gamma + 1):
        if i == gamma or not residual_mass:
            keep.append(joint[i])
            continue
        mass = float(np.maximum(joint[i] * targets[i] - drafts[i], 0.0).sum())
        keep.append(1.0 if joint[i] >= 1 else mass / (mass + 1 - joint[i]))
    laws = []
    for i in range(gamma + 1):
        longest = keep[i] * float(np.prod([1 - h for h in keep[i + 1 :]]))
        after = targets[i] if i == gamma else _normalised(np.maximum(joint[i] * targets[i] - drafts[i], 0), targets[i])
        laws.append((longest, after))
    return laws


def outcome_law(
    target: Law, draft: Law, vocab: int, gamma: int, rule: str = "block", blind: bool = False
) -> dict[tuple[int, ...], float]:
    """The exact law of one step's committed tokens under `rule` (one of RULES), the gamma drafts drawn
    from `draft`: {committed tokens: probability}. blind: the verifier is given no distribution (SPEC §3.2:
    each draft is judged with the point mass at itself)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES} (got {rule!r})")
    law: dict[tuple[int, ...], float] = {}
    for block, probability in draft_blocks(draft, vocab, gamma):
        targets = [np.asarray(target(block[:i]), dtype=np.float64) for i in range(gamma + 1)]
        drafts = [
            np.eye(vocab)[token] if blind else np.asarray(draft(block[:i]), dtype=np.float64)
            for i, token in enumerate(block)
        ]
        if rule == "token":
            steps = _token_step(block, targets, drafts)
        else:
            steps = _block_step(block, targets, drafts, residual_mass=rule == "block")
        for accepted, (chance, after) in enumerate(steps):
            for token in np.flatnonzero(after):
                outcome = (*block[:accepted], int(token))
                law[outcome] = law.get(outcome, 0.0) + probability * chance * float(after[token])
    return law


def lossless_gap(law: dict[tuple[int, ...], float], target: Law, vocab: int, gamma: int) -> float:
    """The largest difference, over every sequence z of gamma + 1 tokens, between P(the step commits a
    prefix c of z, then the target samples the rest of z) and P(the target samples z): 0 for a lossless
    rule."""
    worst = 0.0
    for z in itertools.product(range(vocab), repeat=gamma + 1):
        steps = [float(target(z[:i])[z[i]]) for i in range(gamma + 1)]
        through = sum(law.get(z[:length], 0.0) * float(np.prod(steps[length:])) for length in range(1, gamma + 2))
        worst = max(worst, abs(through - float(np.prod(steps))))
    return worst


def expected_accepted(law: dict[tuple[int, ...], float]) -> float:
    """The mean number of accepted drafts of a step (committed tokens minus one)."""
    return sum(probability * (len(outcome) - 1) for outcome, probability in law.items())
