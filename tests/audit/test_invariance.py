"""Keys and invariances (SPEC §4): batch invariance, determinism, independent neighbouring seeds, and
output that does not depend on the draft, on K or on the batch (the audit's toy decode loop)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import specverify as sv
from specverify.audit.invariance import DRAFTERS, decode_plainly, decode_speculatively
from tests.support.seeds import ROW_STRIDE


def _random_call(batch=24, positions=4, vocab=50, seed=0, mode="argmax"):
    g = torch.Generator().manual_seed(seed)
    args = dict(
        draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
        target_logits=torch.randn(batch, positions + 1, vocab, generator=g) * 2,
        temperature=torch.tensor([0.0, 0.5, 1.0, 1.5])[torch.randint(0, 4, (batch,), generator=g)],
        top_k=torch.tensor([-1, 0, 5, 20])[torch.randint(0, 4, (batch,), generator=g)],
        max_k=None,
        top_p=torch.tensor([1.0, 0.9, 0.6])[torch.randint(0, 3, (batch,), generator=g)],
        min_top_p=None,
        seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
        min_p=torch.tensor([0.0, 0.05])[torch.randint(0, 2, (batch,), generator=g)],
    )
    args["draft_tokens"][::5, 2:] = -1
    if mode == "sampled":
        args["draft_probs_full"] = torch.softmax(torch.randn(batch, positions, vocab, generator=g), -1)
        args["draft_proposal"] = "sampled"
    return args


def _rows(args, index):
    """The same call restricted to (or permuted into) the given rows."""
    out = dict(args)
    for name in ("draft_tokens", "target_logits", "temperature", "top_k", "top_p", "seed", "min_p", "draft_probs_full"):
        if name in out:
            out[name] = out[name][index]
    return out


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_each_row_depends_only_on_its_own_inputs(mode):
    args = _random_call(mode=mode)
    full = sv.stochastic_acceptance_sampler(**args)
    permutation = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    permuted = sv.stochastic_acceptance_sampler(**_rows(args, permutation))
    for whole, part in zip(full, permuted):
        assert torch.equal(whole[permutation], part)
    kept = torch.tensor([3, 7, 8, 20])
    dropped = sv.stochastic_acceptance_sampler(**_rows(args, kept))
    for whole, part in zip(full, dropped):
        assert torch.equal(whole[kept], part)
    single = sv.stochastic_acceptance_sampler(**_rows(args, torch.tensor([5])))
    for whole, part in zip(full, single):
        assert torch.equal(whole[5:6], part)


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_same_inputs_same_outputs(mode):
    args = _random_call(mode=mode, seed=2)
    first = sv.stochastic_acceptance_sampler(**args)
    again = sv.stochastic_acceptance_sampler(**args)
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_the_two_logits_layouts_agree():
    args = _random_call(seed=3)
    flat = dict(args, target_logits=args["target_logits"].reshape(-1, 50))
    for a, b in zip(sv.stochastic_acceptance_sampler(**args), sv.stochastic_acceptance_sampler(**flat)):
        assert torch.equal(a, b)


def test_hints_do_not_change_the_outputs():
    args = _random_call(seed=4)
    args["top_k"] = torch.where(args["top_k"] > 0, args["top_k"], 7)
    hinted = dict(args, max_k=int(args["top_k"].max()), min_top_p=float(args["top_p"].min()))
    for a, b in zip(sv.stochastic_acceptance_sampler(**args), sv.stochastic_acceptance_sampler(**hinted)):
        assert torch.equal(a, b)
    for a, b in zip(
        sv.stochastic_acceptance_sampler(**args), sv.stochastic_acceptance_sampler(**hinted, validate=False)
    ):
        assert torch.equal(a, b)


def test_neighbouring_seeds_draw_independently():
    n, vocab = 40000, 8
    logits = torch.zeros(n, vocab)
    seeds = torch.arange(n, dtype=torch.int64) * 2  # pairs (s, s+1) that share no key
    a = sv.sample(logits, 1.0, -1, 1.0, seeds).numpy()
    b = sv.sample(logits, 1.0, -1, 1.0, seeds + 1).numpy()
    table = np.zeros((vocab, vocab))
    np.add.at(table, (a, b), 1)
    assert stats.chi2_contingency(table).pvalue > 1e-4
    # power: a weak mixer (here: the same draw shifted) would be caught at once
    shifted = (a + (np.arange(n) % 2)) % vocab
    weak = np.zeros((vocab, vocab))
    np.add.at(weak, (a, shifted), 1)
    assert stats.chi2_contingency(weak).pvalue < 1e-6


def test_a_shared_seed_spreads_rows_and_row_zero_is_the_seed_itself():
    args = _random_call(seed=5)
    shared = dict(args, seed=12345)
    per_row = [(12345 + b * ROW_STRIDE) % 2**64 for b in range(24)]
    explicit = dict(args, seed=torch.tensor([s - 2**64 if s >= 2**63 else s for s in per_row]))
    for a, b in zip(sv.stochastic_acceptance_sampler(**shared), sv.stochastic_acceptance_sampler(**explicit)):
        assert torch.equal(a, b)
    one = sv.stochastic_acceptance_sampler(**dict(_rows(args, torch.tensor([0])), seed=torch.tensor([12345])))
    assert torch.equal(one[1], sv.stochastic_acceptance_sampler(**shared)[1][:1])


# ---- drafter invariance: the toy decode loop of the audit (specverify.audit.invariance) ---------------


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_output_does_not_depend_on_the_drafter_or_k(drafter, k):
    length, base_seed = 20, 2024
    run = decode_speculatively(sv.stochastic_acceptance_sampler, drafter, k, length, base_seed)
    assert run.tokens == decode_plainly(length, base_seed)


def test_a_perfect_drafter_is_always_accepted():
    run = decode_speculatively(sv.stochastic_acceptance_sampler, "perfect", 4, 12, base_seed=7)
    assert run.accepted == run.proposed > 0
