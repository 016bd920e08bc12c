"""Block verification (SPEC §3.6): lossless on whole steps, never fewer accepted drafts than token-wise,
and every backend's committed blocks following the exact law.

The exact laws are `specverify.audit.blocks` (float64, every draft block and coin enumerated, no code of
the verifier). The target's and the draft's laws here depend on the whole prefix, as a model's do: each
row's logits at position j are those of its own drafted prefix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from specverify.audit.blocks import expected_accepted, lossless_gap, outcome_law
from specverify.audit.exact import truncated_distribution
from tests.support.statcheck import POWER_P_VALUE, assert_follows, samples_p_value


class PrefixLaws:
    """Random laws of the next token after every prefix, each a function of (seed, prefix) alone: target
    logits [V] and a draft law q [V] (some with zeros, some one-hot)."""

    def __init__(self, vocab: int, seed: int, params=(1.0, -1, 1.0, 0.0), spread: float = 1.5):
        self.vocab, self.seed, self.params, self.spread = vocab, seed, params, spread

    def _rng(self, kind: int, prefix: tuple[int, ...]) -> np.random.Generator:
        return np.random.default_rng([self.seed, kind, len(prefix), *prefix])

    def logits(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._rng(0, prefix).normal(0, self.spread, self.vocab).astype(np.float32)

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return truncated_distribution(self.logits(prefix), *self.params)

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        rng = self._rng(1, prefix)
        weights = np.exp(rng.normal(0, self.spread, self.vocab))
        weights[rng.random(self.vocab) < 0.2] = 0.0  # tokens the draft never proposes
        if weights.sum() == 0 or rng.random() < 0.1:
            weights = np.eye(self.vocab)[rng.integers(self.vocab)]  # a deterministic drafter here
        return weights / weights.sum()


TRUNCATIONS = {
    "plain": (1.0, -1, 1.0, 0.0),
    "temperature, top-k, top-p, min-p": (0.8, 3, 0.85, 0.1),
}


@pytest.mark.parametrize("params", TRUNCATIONS.values(), ids=TRUNCATIONS.keys())
@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_block_rule_is_lossless_exactly(params, gamma):
    """Every draft block and coin enumerated: the committed block followed by the target's own sampling
    is the target's joint law, for 25 random prefix-dependent (p~, q) each; the known-wrong variant
    (h_i = P_i, the residual masses left out) is caught on the same cases."""
    worst, wrong = 0.0, 0.0
    for seed in range(25):
        laws = PrefixLaws(3, seed, params)
        worst = max(worst, lossless_gap(outcome_law(laws.target, laws.draft, 3, gamma), laws.target, 3, gamma))
        variant = outcome_law(laws.target, laws.draft, 3, gamma, "block-without-residual-mass")
        wrong = max(wrong, lossless_gap(variant, laws.target, 3, gamma))
    assert worst < 1e-12
    blind = outcome_law(laws.target, laws.draft, 3, gamma, blind=True)
    assert lossless_gap(blind, laws.target, 3, gamma) < 1e-12  # drafts judged without their distribution
    if gamma > 1:  # with one draft the variant is the rule itself
        assert wrong > 1e-2


def test_block_accepts_at_least_as_many_as_token_wise():
    """On 200 random prefix-dependent (p~, q) pairs block's expected accepted drafts are >= token-wise's,
    and strictly more on most; on the paper's example (V = 2, p = (1/3, 2/3), q = (2/3, 1/3), two drafts)
    exactly 11/9 against 10/9."""
    gains = []
    for seed in range(200):
        laws = PrefixLaws(
            3, 1000 + seed, TRUNCATIONS["plain"] if seed % 2 else TRUNCATIONS["temperature, top-k, top-p, min-p"]
        )
        block = expected_accepted(outcome_law(laws.target, laws.draft, 3, 3, "block"))
        token = expected_accepted(outcome_law(laws.target, laws.draft, 3, 3, "token"))
        assert block >= token - 1e-12, f"case {seed}: block {block} < token-wise {token}"
        gains.append(block - token)
    assert np.mean(np.array(gains) > 1e-9) > 0.5
    p, q = (lambda prefix: np.array([1 / 3, 2 / 3])), (lambda prefix: np.array([2 / 3, 1 / 3]))
    assert expected_accepted(outcome_law(p, q, 2, 2, "block")) == pytest.approx(11 / 9, abs=1e-12)
    assert expected_accepted(outcome_law(p, q, 2, 2, "token")) == pytest.approx(10 / 9, abs=1e-12)


V, K = 4, 3


def _rows(laws: PrefixLaws, rows: int, drafted: int, seed: int, blind: bool = False):
    """`rows` rows whose `drafted` drafts are drawn from laws.draft prefix by prefix (then padding):
    (draft int64 [R, K], logits float32 [R, K+1, V] of each row's own prefixes, q float32 [R, K, V]; all
    zero where `blind`: the drafter passes no distribution)."""
    rng = np.random.default_rng(seed)
    draft = np.full((rows, K), -1, dtype=np.int64)
    logits = np.zeros((rows, K + 1, V), dtype=np.float32)
    q = np.zeros((rows, K, V), dtype=np.float32)
    for r in range(rows):
        prefix: tuple[int, ...] = ()
        for j in range(K + 1):
            logits[r, j] = laws.logits(prefix)
            if j == drafted:
                break
            law = laws.draft(prefix)
            q[r, j] = 0.0 if blind else law
            token = int(rng.choice(V, p=law))
            draft[r, j] = token
            prefix = (*prefix, token)
        logits[r, j + 1 :] = logits[r, j]  # past the draft: any finite scores (never committed)
    return torch.from_numpy(draft), torch.from_numpy(logits), torch.from_numpy(q)


def _committed_blocks(draft, logits, q, params, seed: int) -> list[tuple[int, ...]]:
    """Each row's committed tokens under verification="block", one seed per row."""
    rows = draft.shape[0]
    temperature, top_k, top_p, min_p = params
    outputs = sv.stochastic_acceptance_sampler(
        draft, logits, torch.full((rows,), temperature), torch.full((rows,), top_k), None,
        torch.full((rows,), top_p), None, sv.request_seed(torch.arange(rows) + seed, torch.zeros(rows, dtype=torch.int64)),
        draft_proposal="sampled", draft_probs_full=q, min_p=torch.full((rows,), min_p), verification="block",
    )  # fmt: skip
    tokens, counts = sv.committed_tokens(*outputs)
    return [tuple(row[:count]) for row, count in zip(tokens.tolist(), counts.tolist())]


def _outcome_ids(blocks: list[tuple[int, ...]], law: dict) -> tuple[np.ndarray, np.ndarray]:
    """Samples as indices into the law's outcomes (an outcome outside the law gets its own index of
    probability 0) -> (ids [n], law [outcomes + 1])."""
    index = {outcome: i for i, outcome in enumerate(law)}
    ids = np.array([index.get(block, len(law)) for block in blocks])
    return ids, np.append(np.array(list(law.values())), 0.0)


#: (drafts per row, no distribution given, truncation, the seed of the laws: one where the wrong laws lie
#: at a total-variation distance >= 0.07 from the exact one, so that telling them apart means something).
#: Judged without a distribution (point masses), block verification is token-wise exactly (as for argmax
#: drafts, token-wise is optimal there): that case tells only the known-wrong variant apart.
CASES = {
    "three drafts": (3, False, "plain", 28),
    "three drafts, truncated": (3, False, "temperature, top-k, top-p, min-p", 28),
    "two drafts of three (ragged)": (2, False, "temperature, top-k, top-p, min-p", 28),
    "no distribution (all-zero q)": (3, True, "plain", 28),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_block_outcomes_follow_the_exact_law(each_backend, case):
    """8000 rows, each its own seed and its own drafts drawn from prefix-dependent q: the committed blocks
    follow the exact law of SPEC §3.6 by chi-square; the same samples reject the known-wrong variant's law
    and the token-wise law (the test's power)."""
    drafted, blind, truncation, seed = case
    laws = PrefixLaws(V, seed, TRUNCATIONS[truncation], spread=1.2)
    draft, logits, q = _rows(laws, 8000, drafted, seed=11, blind=blind)
    blocks = _committed_blocks(draft, logits, q, laws.params, seed=5)
    exact = outcome_law(laws.target, laws.draft, V, drafted, "block", blind)
    ids, law = _outcome_ids(blocks, exact)
    assert_follows(ids, law, f"block outcomes, {each_backend}")
    for rule in ("block-without-residual-mass",) if blind else ("block-without-residual-mass", "token"):
        ids, wrong = _outcome_ids(blocks, outcome_law(laws.target, laws.draft, V, drafted, rule, blind))
        assert samples_p_value(ids, wrong) < POWER_P_VALUE, f"the {rule} law was not told apart"
    accepted = np.mean([len(block) - 1 for block in blocks])
    assert accepted > 0.3, "drafts were hardly accepted: the test would show little"


def test_one_draft_is_token_wise_coin_for_coin(each_backend):
    """A row with one draft (K = 1, or a ragged row of K = 3) commits under "block" exactly what it commits
    under "token", for 300 seeds (SPEC §3.6: gamma = 1 is §3.2)."""
    laws = PrefixLaws(V, 3, TRUNCATIONS["temperature, top-k, top-p, min-p"])
    draft, logits, q = _rows(laws, 300, 1, seed=2)
    for width in (1, K):
        args = (draft[:, :width], logits[:, : width + 1].contiguous(), torch.full((300,), 0.8), 3, None, 0.85, None)
        seed = sv.request_seed(torch.arange(300), torch.zeros(300, dtype=torch.int64))
        same = dict(draft_proposal="sampled", draft_probs_full=q[:, :width].contiguous(), min_p=0.1)
        token = sv.stochastic_acceptance_sampler(*args, seed, **same)
        block = sv.stochastic_acceptance_sampler(*args, seed, **same, verification="block")
        for a, b in zip(token, block):
            assert torch.equal(a, b)
        assert 0 < int(token[0].sum()) < 300  # both verdicts occur


def test_greedy_rows_keep_their_rule_under_block(each_backend):
    """A greedy row judged with verification="block" accepts its drafts while they are the argmax, as §3.3."""
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * (K + 1))
    draft = torch.tensor([[1, 1, 3]])
    q = torch.full((1, K, V), 0.25)
    first, recovered, bonus = sv.stochastic_acceptance_sampler(
        draft, logits, 0.0, -1, None, 1.0, None, 9, draft_proposal="sampled", draft_probs_full=q, verification="block"
    )
    assert first.tolist() == [2] and recovered.tolist() == [[1, 1, 1]] and bonus.tolist() == [[1]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"verification": "blocks"}, 'verification must be "token" or "block"'),
        ({"verification": "block", "draft_proposal": "argmax"}, 'verification="block" needs draft_proposal="sampled"'),
    ],
)
@pytest.mark.parametrize("validate", [True, False])
def test_block_refusals(kwargs, message, validate):
    """Block verification of argmax drafts, and an unknown rule, are errors naming the argument (also
    without validation: the arguments are Python values)."""
    draft, logits = torch.zeros(1, 2, dtype=torch.int64), torch.zeros(3, 5)
    with pytest.raises(ValueError, match=message):
        sv.stochastic_acceptance_sampler(draft, logits, 1.0, -1, None, 1.0, None, 0, validate=validate, **kwargs)
