"""SPEC §8, the laws: what a tree walk commits, against exact float64 laws computed from first principles
(specverify.audit.exact.tree_node_law enumerates every sibling draw), with chi-square tests; each test
also catches a known-wrong variant at the same sample size.

The trees: the root has 3 children drawn from q0; each depth-0 node with token a has 2 children drawn
from q_a; depth-0 nodes with token a are scored by logits L_a (siblings with one token share them, as a
real target would); one padding node sits at a random index of every row, with NaN logits and q.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

import specverify as sv
from specverify.audit.exact import sibling_sequences, tree_node_law, truncated_distribution
from tests.support.statcheck import POWER_P_VALUE, assert_catches, assert_follows, samples_p_value
from tests.support.trees import insert_padding

V = 6
ROOT_CHILDREN, GRANDCHILDREN = 3, 2
ROWS = 40_000
TEMPERATURE, TOP_K = 0.9, 5
OTHER = {"with_replacement": "without_replacement", "without_replacement": "with_replacement"}


def _setting(seed: int):
    """Logits of the root [V] and of each depth-0 token [V, V], and the draft laws q0 [V] and q_a [V, V].
    q0 cannot draft the target's second most likely token (judged without a distribution); q0 drafts
    the token that top-k drops."""
    rng = np.random.default_rng(seed)
    root, by_token = rng.normal(0, 1.2, V), rng.normal(0, 1.2, (V, V))
    q0 = 0.5 * np.exp(root) / np.exp(root).sum() + 0.5 * rng.dirichlet(np.ones(V))
    q0[int(np.argsort(root)[-2])] = 0.0
    q0 /= q0.sum()
    q = rng.dirichlet(np.ones(V) * 0.7, size=V)
    return root.astype(np.float32), by_token.astype(np.float32), q0, q


def _draw(rng: np.random.Generator, law: np.ndarray, siblings: int, draws: str, rows: int) -> np.ndarray:
    """int64 [rows, siblings]: each row's sibling tokens, drawn as SPEC §8 sibling_draws says."""
    sequences = sibling_sequences(law, siblings, draws)
    pick = rng.choice(len(sequences), size=rows, p=np.array([p for _, p in sequences]) / sum(p for _, p in sequences))
    return np.array([sequences[i][0] for i in pick], dtype=np.int64).reshape(rows, siblings)


def _trees(seed: int, draws: str, rows: int = ROWS):
    """The arguments of one call over `rows` independent trees, and the setting they come from."""
    rng = np.random.default_rng(seed + 1)
    root, by_token, q0, q = _setting(seed)
    top = _draw(rng, q0, ROOT_CHILDREN, draws, rows)  # [R, 3]
    below = np.stack([_draw(rng, q[a], GRANDCHILDREN, draws, rows) for a in range(V)], axis=1)  # [R, V, 2]
    below = np.take_along_axis(below, top[..., None].repeat(GRANDCHILDREN, -1), axis=1)  # [R, 3, 2]
    nodes = ROOT_CHILDREN * (1 + GRANDCHILDREN)
    draft = np.concatenate([top, below.reshape(rows, -1)], axis=1)
    parents = np.concatenate(
        [np.full((rows, ROOT_CHILDREN), -1), np.repeat(np.arange(ROOT_CHILDREN), GRANDCHILDREN)[None].repeat(rows, 0)],
        axis=1,
    )
    logits = np.empty((rows, nodes + 1, V), dtype=np.float32)
    logits[:, 0] = root
    logits[:, 1 : ROOT_CHILDREN + 1] = by_token[top]
    logits[:, ROOT_CHILDREN + 1 :] = rng.normal(0, 1, (rows, nodes - ROOT_CHILDREN, V))  # leaves: bonus only
    probs = np.empty((rows, nodes, V))
    probs[:, :ROOT_CHILDREN] = q0
    probs[:, ROOT_CHILDREN:] = q[np.repeat(top, GRANDCHILDREN, axis=1)]
    draft, parents, logits, probs = insert_padding(rng, draft, parents, logits, probs)
    seeds = torch.as_tensor(rng.integers(-(2**63), 2**63 - 1, size=rows, dtype=np.int64))
    args = dict(
        draft_tokens=torch.as_tensor(draft),
        parents=torch.as_tensor(parents),
        target_logits=torch.as_tensor(logits),
        temperature=torch.full((rows,), TEMPERATURE),
        top_k=torch.full((rows,), TOP_K),
        top_p=torch.ones(rows),
        seed=seeds,
    )
    return args, probs, (root, by_token, q0, q)


def _first_two(args: dict, **extra) -> np.ndarray:
    """Each row's first two committed tokens as one bin: t1 * (V + 1) + (t2, or V when only t1 was committed)."""
    tokens, count = sv.tree_committed_tokens(args["draft_tokens"], *sv.tree_acceptance_sampler(**args, **extra))
    second = torch.where(count >= 2, tokens[:, 1], V)
    return (tokens[:, 0] * (V + 1) + second).numpy()


def _joint_law(setting, draws: str, **variant) -> np.ndarray:
    """Exact law of the first-two-tokens bin under SPEC §8 (or a variant of it), from tree_node_law."""
    root, by_token, q0, q = setting

    def target(logits):
        return truncated_distribution(logits, TEMPERATURE, TOP_K)

    descend, stop = tree_node_law(target(root), q0, ROOT_CHILDREN, draws, "sampled", **variant)
    law = np.zeros((V, V + 1))
    for a in range(V):
        below_descend, below_stop = tree_node_law(target(by_token[a]), q[a], GRANDCHILDREN, draws, "sampled", **variant)
        law[a, :V] = descend[:, a].sum() * (below_descend.sum(0) + below_stop)
        law[a, V] = stop[a]
    return law.reshape(-1)


@pytest.mark.parametrize("draws", ["with_replacement", "without_replacement"])
def test_sampled_mode_commits_the_exact_joint_law_of_the_first_two_tokens(code_path, draws):
    args, probs, setting = _trees(seed=40 + (draws == "without_replacement"), draws=draws)
    law = _joint_law(setting, draws)
    # the guarantee itself: the first token follows p~ of the root whatever the sibling scheme
    root_target = truncated_distribution(setting[0], TEMPERATURE, TOP_K)
    assert np.allclose(law.reshape(V, V + 1).sum(1), root_target, atol=1e-12)
    observed = _first_two(
        args, draft_proposal="sampled", draft_probs=torch.as_tensor(probs, dtype=torch.float32), sibling_draws=draws
    )
    assert_follows(observed, law, f"{draws}: the first two committed tokens")
    assert (observed % (V + 1) < V).mean() > 0.5  # most rows descended
    # power: a verifier that never updates the residual between siblings
    assert_catches(
        _joint_law(setting, draws, update_residual=False), law, ROWS, seed=41, what=f"{draws}: residual not updated"
    )
    if draws == "without_replacement":
        # a verifier that judges siblings drawn without replacement as if drawn i.i.d. (q keeps their tokens)
        assert_catches(
            _joint_law(setting, draws, judged=OTHER[draws]), law, ROWS, seed=42, what="judged with replacement"
        )


def test_siblings_drawn_without_replacement_but_judged_iid_are_caught_in_the_verifier_itself():
    # the other sibling scheme, run for real: siblings drawn without replacement, verified with
    # sibling_draws="with_replacement", keep the first token's law (both are lossless at the root) but not
    # the joint law of its split between descending and stopping.
    args, probs, setting = _trees(seed=41, draws="without_replacement")
    law = _joint_law(setting, "without_replacement")
    observed = _first_two(
        args,
        draft_proposal="sampled",
        draft_probs=torch.as_tensor(probs, dtype=torch.float32),
        sibling_draws="with_replacement",
    )
    assert (law[observed] > 0).all()  # no committed pair is impossible: the split is wrong, not the tokens
    assert samples_p_value(observed, law) < POWER_P_VALUE


def test_argmax_mode_accepts_at_the_root_with_the_mass_of_the_distinct_children():
    args, _, setting = _trees(seed=44, draws="with_replacement")
    root, _, q0, _ = setting
    target = truncated_distribution(root, TEMPERATURE, TOP_K)
    # P(some child has token y) for y ~ p~: three i.i.d. draws from q0, duplicates counted once
    accept = float((target * (1 - (1 - q0) ** ROOT_CHILDREN)).sum())
    assert accept == pytest.approx(
        tree_node_law(target, q0, ROOT_CHILDREN, "with_replacement", "argmax")[0].sum(), abs=1e-12
    )
    _, length, _ = sv.tree_acceptance_sampler(**args)
    descended = int((length >= 1).sum())
    assert stats.binomtest(descended, ROWS, accept).pvalue > 1e-4
    # power: counting duplicate children twice (the sum of p~ over every child) is caught at the same size
    wrong = float(ROOT_CHILDREN * (target * q0).sum())
    assert abs(wrong - accept) > 0.01
    caught = np.random.default_rng(45).binomial(ROWS, wrong)
    assert stats.binomtest(int(caught), ROWS, accept).pvalue < POWER_P_VALUE


def test_argmax_mode_commits_the_target_at_the_root_and_below():
    args, _, setting = _trees(seed=46, draws="with_replacement")
    root, by_token, q0, q = setting
    observed = _first_two(args)

    def target(logits):
        return truncated_distribution(logits, TEMPERATURE, TOP_K)

    descend, stop = tree_node_law(target(root), q0, ROOT_CHILDREN, "with_replacement", "argmax")
    law = np.zeros((V, V + 1))
    for a in range(V):
        law[a, :V] = descend[:, a].sum() * target(by_token[a])
        law[a, V] = stop[a]
    assert_follows(observed, law.reshape(-1), "argmax: the first two committed tokens")
    # power: a walk that descends into the first child whatever y is (the draft's tokens, not the target's)
    wrong = np.zeros((V, V + 1))
    for sequence, probability in sibling_sequences(q0, ROOT_CHILDREN, "with_replacement"):
        wrong[sequence[0], :V] += probability * target(by_token[sequence[0]])
    assert_catches(wrong.reshape(-1), law.reshape(-1), ROWS, seed=47, what="argmax: descending regardless of y")


# Siblings of rank >= 1 that q cannot have drawn (SPEC §8: q(c) == 0 is judged without a distribution,
# accepted with r(c), and on rejection r loses c), on a root with three leaf children:
# - "with_replacement": rank 1 holds a token q gives no mass (a drafter's extra child, e.g. from an
#   n-gram trie), ranks 0 and 2 are drawn from q;
# - "without_replacement": q is one token, so after rank 0 it has lost all its mass and ranks 1 and 2
#   (two other tokens, distinct) are judged without a distribution.
BLIND_V = 6


def _blind_setting(draws: str):
    """(root logits [V] float32, q [V], the children's token sequences with their probabilities)."""
    rng = np.random.default_rng(60 + (draws == "without_replacement"))
    root = rng.normal(0, 1.0, BLIND_V).astype(np.float32)
    if draws == "with_replacement":
        q = rng.dirichlet(np.ones(BLIND_V))
        outside = [1, 4]  # tokens q gives no mass: the blind sibling's, uniform over them
        q[outside] = 0.0
        q /= q.sum()
        sequences = [
            ((a, b, c), q[a] * q[c] / len(outside))
            for a, b, c in itertools.product(range(BLIND_V), outside, range(BLIND_V))
            if q[a] * q[c] > 0
        ]
    else:
        only = int(np.argsort(root)[-3])  # q's one token: the third most likely, often rejected
        q = np.eye(BLIND_V)[only]
        others = [t for t in range(BLIND_V) if t != only]
        pairs = [(b, c) for b in others for c in others if b != c]
        sequences = [((only, b, c), 1.0 / len(pairs)) for b, c in pairs]
    return root, q, sequences


def _blind_law(draws: str, **variant) -> np.ndarray:
    """Exact law of (the rank of the accepted child, its token) or (stopped, the committed token), as bins
    rank * V + token with rank 3 = stopped."""
    root, q, sequences = _blind_setting(draws)
    target = truncated_distribution(root, TEMPERATURE, TOP_K)
    descend, stop = tree_node_law(target, q, 3, draws, "sampled", sequences=sequences, **variant)
    return np.concatenate([descend.reshape(-1), stop])


@pytest.mark.slow
@pytest.mark.parametrize("draws", ["with_replacement", "without_replacement"])
def test_sampled_siblings_that_q_cannot_draw_are_judged_without_a_distribution(code_path, draws):
    root, q, sequences = _blind_setting(draws)
    assert sum(p for _, p in sequences) == pytest.approx(1.0, abs=1e-12)
    law = _blind_law(draws)
    target = truncated_distribution(root, TEMPERATURE, TOP_K)
    # the guarantee, in float64: the committed token follows p~ with the blind siblings too
    assert np.allclose(law.reshape(4, BLIND_V).sum(0), target, atol=1e-12)
    assert law[BLIND_V : 3 * BLIND_V].sum() > 0.1  # ranks 1 and 2 are accepted often enough to be seen
    rng = np.random.default_rng(62)
    pick = rng.choice(len(sequences), size=ROWS, p=np.array([p for _, p in sequences]))
    draft = torch.as_tensor(np.array([sequences[i][0] for i in pick], dtype=np.int64))
    args = dict(
        draft_tokens=draft,
        parents=torch.full((ROWS, 3), -1),
        target_logits=torch.as_tensor(root).expand(ROWS, 4, BLIND_V).contiguous(),
        temperature=torch.full((ROWS,), TEMPERATURE),
        top_k=torch.full((ROWS,), TOP_K),
        top_p=torch.ones(ROWS),
        seed=torch.as_tensor(rng.integers(-(2**63), 2**63 - 1, size=ROWS, dtype=np.int64)),
    )
    path, length, token = sv.tree_acceptance_sampler(
        **args,
        draft_proposal="sampled",
        draft_probs=torch.as_tensor(q, dtype=torch.float32).expand(ROWS, 3, BLIND_V),
        sibling_draws=draws,
    )
    rank = torch.where(length > 0, path[:, 0], 3)
    committed = torch.where(length > 0, draft.gather(1, path[:, :1].clamp(min=0))[:, 0], token)
    assert_follows((rank * BLIND_V + committed).numpy(), law, f"{draws}: blind siblings")
    # power: a verifier that leaves r as it was when it rejects a blind sibling (which can then commit it)
    assert_catches(
        _blind_law(draws, forget_blind=True), law, ROWS, seed=63, what=f"{draws}: r keeps a rejected blind sibling"
    )
