"""The guarantee (SPEC §1, §3): committed tokens follow p~ at every position, and acceptance follows theory.

Each test makes thousands of rows in one call, each row with its own seed, and compares the committed
tokens with exact float64 laws from specverify.audit.exact by chi-square. Each also shows power: samples
of a known-wrong variant, of the same size, are rejected by the same check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import specverify as sv
from specverify.audit.exact import first_rejection_law, sampled_position_law, truncated_distribution
from tests.support.statcheck import assert_catches, assert_follows

V = 12
K = 3
ROWS_PER_GROUP = 6000


@dataclass
class Group:
    """Rows sharing logits and sampling parameters; every row has its own seed."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    masked: bool = False


GROUPS = [
    Group(1.0, -1, 1.0, 0.0),
    Group(0.7, 5, 1.0, 0.0),
    Group(1.3, -1, 0.8, 0.0),
    Group(1.0, 6, 0.7, 0.05, masked=True),
]


def _batch(seed: int, groups=GROUPS):
    """Per group: logits [K+1, V] and allowed [K+1, V]; the batch repeats them ROWS_PER_GROUP times."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, size=(len(groups), K + 1, V)).astype(np.float32)
    allowed = np.ones((len(groups), K + 1, V), dtype=bool)
    for g, group in enumerate(groups):
        if group.masked:
            allowed[g] = rng.random((K + 1, V)) < 0.6
            allowed[g, :, int(np.argmax(logits[g, 0]))] = True
    laws = np.array(
        [
            [
                truncated_distribution(
                    logits[g, j], group.temperature, group.top_k, group.top_p, group.min_p, allowed[g, j]
                )
                for j in range(K + 1)
            ]
            for g, group in enumerate(groups)
        ]
    )
    return logits, allowed, laws


def _params(groups, rows):
    def column(name, dtype):
        return torch.tensor([getattr(g, name) for g in groups], dtype=dtype).repeat_interleave(rows)

    return (
        column("temperature", torch.float32),
        column("top_k", torch.int64),
        column("top_p", torch.float32),
        column("min_p", torch.float32),
    )


def _seeds(n: int, seed: int) -> torch.Tensor:
    return torch.randint(-(2**62), 2**62, (n,), generator=torch.Generator().manual_seed(seed))


def _verify(logits, allowed, draft, groups, rows, seed, **kwargs):
    temperature, top_k, top_p, min_p = _params(groups, rows)
    target = torch.as_tensor(logits).repeat_interleave(rows, dim=0)
    masks = sv.pack_bitmask(torch.as_tensor(allowed)).repeat_interleave(rows, dim=0)
    first, recovered, bonus = sv.stochastic_acceptance_sampler(
        draft,
        target,
        temperature,
        top_k,
        None,
        top_p,
        None,
        _seeds(len(draft), seed),
        token_bitmasks=masks,
        min_p=min_p,
        **kwargs,
    )
    tokens, _ = sv.committed_tokens(first, recovered, bonus)
    return first.numpy(), tokens.numpy()


def _wrong_top_p_law(logits, group):
    """Known-wrong truncation: top-p on the distribution *before* renormalising after top-k."""
    p = np.exp((logits - logits.max()) / group.temperature)
    p /= p.sum()
    keep = p >= np.sort(p)[::-1][group.top_k - 1]
    order = np.argsort(-p, kind="stable")
    mass = np.cumsum(np.where(keep, p, 0)[order])
    cut = p[order[min(int(np.searchsorted(mass, group.top_p)), V - 1)]]
    kept = np.where(keep & (p >= cut), p, 0)
    return kept / kept.sum()


def test_argmax_mode_commits_the_truncated_target_at_every_position():
    logits, allowed, laws = _batch(seed=10)
    rows = ROWS_PER_GROUP
    # Drafts: the most likely token of each position (so later positions are reached often), a padded
    # tail in a quarter of the rows (ragged K).
    draft = torch.as_tensor(laws.argmax(-1)[:, :K]).repeat_interleave(rows, dim=0)
    draft[::4, 2:] = -1
    first, tokens = _verify(logits, allowed, draft, GROUPS, rows, seed=11)
    for g in range(len(GROUPS)):
        block = slice(g * rows, (g + 1) * rows)
        for j in range(K + 1):
            reached = first[block] >= j
            assert_follows(tokens[block][reached, j], laws[g, j], f"group {g} position {j}")
        full = np.ones(rows, dtype=bool)
        full[::4] = False
        accept = [laws[g, j, int(draft[g * rows + 1, j])] for j in range(K)]
        assert_follows(first[block][full], first_rejection_law(accept), f"acceptance law, group {g}")
        padded = first[block][~full]
        assert padded.max() <= 2  # a padded position is never accepted


def test_argmax_mode_check_catches_top_p_before_renormalisation():
    logits, allowed, laws = _batch(seed=12)
    group = GROUPS[1]
    tight = Group(group.temperature, 4, 0.55, 0.0)
    right = truncated_distribution(logits[0, 0], tight.temperature, tight.top_k, tight.top_p)
    wrong = _wrong_top_p_law(logits[0, 0], tight)
    assert not np.allclose(right, wrong)
    draft = torch.full((ROWS_PER_GROUP, K), -1)
    _, tokens = _verify(logits[:1], np.ones_like(allowed[:1]), draft, [tight], ROWS_PER_GROUP, seed=13)
    assert_follows(tokens[:, 0], right, "top-k then renormalised top-p")
    assert_catches(wrong, right, ROWS_PER_GROUP, seed=14, what="top-p before renormalisation")


def _draft_law(rng, target, kind):
    """A draft distribution q [V]: close to p~, disagreeing with it, or concentrated outside its support."""
    if kind == "close":
        q = target * 0.7 + rng.dirichlet(np.ones(V)) * 0.3
    elif kind == "disagree":
        q = rng.dirichlet(np.ones(V) * 0.3)
    elif kind == "outside":
        q = np.zeros(V)
        q[int(np.argmin(target))] = 0.8  # probably outside the kept set
        q[int(np.argmax(target))] = 0.2
    else:
        q = np.zeros(V)
    return q / q.sum() if q.sum() else q


@pytest.mark.parametrize("kind", ["close", "disagree", "outside", "zero"])
def test_sampled_mode_commits_the_truncated_target(kind):
    rng = np.random.default_rng(20)
    logits, allowed, laws = _batch(seed=21)
    rows = ROWS_PER_GROUP
    q = np.array([[_draft_law(rng, laws[g, j], kind) for j in range(K)] for g in range(len(GROUPS))])
    # each row draws its own drafts from q (uniformly when q is all zero: the scheduler had no distribution)
    draft = np.empty((len(GROUPS) * rows, K), dtype=np.int64)
    for g in range(len(GROUPS)):
        for j in range(K):
            law = q[g, j] if q[g, j].sum() else np.full(V, 1 / V)
            draft[g * rows : (g + 1) * rows, j] = rng.choice(V, size=rows, p=law)
    q_rows = torch.as_tensor(q, dtype=torch.float32).repeat_interleave(rows, dim=0)
    first, tokens = _verify(
        logits,
        allowed,
        torch.as_tensor(draft),
        GROUPS,
        rows,
        seed=22,
        draft_proposal="sampled",
        draft_probs_full=q_rows,
    )
    for g in range(len(GROUPS)):
        block = slice(g * rows, (g + 1) * rows)
        for j in range(K + 1):
            reached = first[block] >= j
            assert_follows(tokens[block][reached, j], laws[g, j], f"{kind} group {g} position {j}")
        # acceptance at position 0 against theory: sum(min(p~, q)) when drafts follow q
        accepted = (first[block] >= 1).mean()
        if q[g, 0].sum():
            theory = np.minimum(laws[g, 0], q[g, 0]).sum()
        else:
            theory = laws[g, 0].mean()  # uniform drafts judged without q: accept w.p. p~(d)
        assert abs(accepted - theory) < 4.5 * np.sqrt(theory * (1 - theory) / rows) + 1e-12, (kind, g, accepted, theory)
    # power: recovering from the full target instead of the residual distorts the committed law
    if kind in ("close", "disagree"):
        g, target, draft_q = 0, laws[0, 0], q[0, 0]
        accept = np.minimum(1, np.divide(target, draft_q, out=np.ones(V), where=draft_q > 0))
        wrong = draft_q * accept + (draft_q * (1 - accept)).sum() * target
        assert_catches(wrong / wrong.sum(), target, rows, seed=23, what=f"{kind}: recovery from the full target")


def test_sampled_mode_law_for_each_fixed_draft_token():
    # Stronger than the marginal: given the draft token, the committed token follows
    # P(accept) * delta_d + (1 - P(accept)) * residual exactly, including q(d) == 0 (judged without q).
    rng = np.random.default_rng(30)
    group = Group(0.9, -1, 0.9, 0.0)
    logits, allowed, laws = _batch(seed=31, groups=[group])
    target = laws[0, 0]
    q = rng.dirichlet(np.ones(V))
    q[int(np.argsort(target)[-2])] = 0.0  # a likely target token the draft cannot produce
    q /= q.sum()
    rows = 4000
    for draft_token in (int(np.argmax(target)), int(np.argmax(q)), int(np.argsort(target)[-2]), int(np.argmin(target))):
        draft = torch.full((rows, K), draft_token)
        q_rows = torch.as_tensor(q, dtype=torch.float32).expand(rows, K, V).contiguous()
        first, tokens = _verify(
            logits,
            allowed,
            draft,
            [group],
            rows,
            seed=32 + draft_token,
            draft_proposal="sampled",
            draft_probs_full=q_rows,
        )
        accept, law = sampled_position_law(target, q, draft_token)
        assert_follows(tokens[:, 0], law, f"fixed draft {draft_token}")
        assert abs((first >= 1).mean() - accept) < 4.5 * np.sqrt(accept * (1 - accept) / rows) + 1e-12


def test_acceptance_in_argmax_mode_is_the_target_probability_of_the_draft():
    logits, allowed, laws = _batch(seed=40, groups=[GROUPS[0]])
    rows = 8000
    draft_token = int(np.argsort(laws[0, 0])[-3])
    draft = torch.full((rows, K), draft_token)
    first, _ = _verify(logits, allowed, draft, [GROUPS[0]], rows, seed=41)
    theory = laws[0, 0, draft_token]
    assert abs((first >= 1).mean() - theory) < 4.5 * np.sqrt(theory * (1 - theory) / rows)
