"""Greedy rows (SPEC §3.3), relaxed thinking rows (§3.4), padding (§3.5), empty shapes and half precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from specverify.audit.exact import relaxed_position_law, truncated_distribution
from tests.support.statcheck import assert_follows


def _verify(draft, logits, temperature, **kwargs):
    batch = len(draft)
    return sv.stochastic_acceptance_sampler(
        torch.as_tensor(draft),
        torch.as_tensor(logits, dtype=torch.float32),
        torch.as_tensor(temperature, dtype=torch.float32),
        torch.full((batch,), -1),
        None,
        torch.ones(batch),
        None,
        torch.arange(batch) * 1000 + 1,
        **kwargs,
    )


def test_greedy_rows_accept_exactly_the_argmax_and_commit_it():
    logits = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])
    first, recovered, bonus = _verify([[1, 0]], logits, [0.0])
    assert (first.tolist(), recovered.tolist(), bonus.tolist()) == ([2], [[1, 0]], [[2]])
    first, recovered, bonus = _verify([[1, 2]], logits, [1e-6])
    assert (first.tolist(), recovered.tolist(), bonus.tolist()) == ([1], [[1, 0]], [[2]])


def test_greedy_ties_go_to_the_lowest_id_and_nan_never_wins():
    logits = torch.tensor([[[1.0, 4.0, 4.0, 0.0], [float("nan"), 1.0, 2.0, 2.0]]])
    first, recovered, bonus = _verify([[2]], logits, [0.0], validate=False)
    assert (first.tolist(), recovered.tolist(), bonus.tolist()) == ([0], [[1]], [[2]])


@pytest.mark.parametrize("vocab", [1, 3, 7, 8, 9, 16, 17, 63, 64, 65, 1000])
def test_greedy_argmax_on_ties_nan_and_inf_at_every_lane_and_tail_position(each_backend, vocab):
    # few distinct values, so ties land in every vector lane, both accumulators and the scalar tail
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randint(0, 3, (400, vocab), generator=g).float()
    specials = torch.tensor([float("nan"), float("-inf"), float("inf"), 2.0])
    where = torch.rand(400, vocab, generator=g) < 0.2
    logits = torch.where(where, specials[torch.randint(0, 4, (400, vocab), generator=g)], logits)
    logits[:20] = float("nan")
    logits[20:40] = float("-inf")
    cleaned = torch.nan_to_num(logits, nan=float("-inf"))
    expected = torch.where(cleaned == cleaned.amax(-1, keepdim=True), torch.arange(vocab), vocab).amin(-1)
    expected = torch.where(cleaned.amax(-1) == float("-inf"), 0, expected)  # nothing beats -inf: id 0
    got = sv.sample(logits, 0.0, 0, 1.0, seed=1, validate=False)
    assert torch.equal(got, expected)


def test_greedy_respects_the_bitmask():
    logits = torch.tensor([[[0.0, 9.0, 1.0, 2.0], [9.0, 0.0, 0.0, 1.0]]])
    allowed = torch.tensor([[[True, False, True, False], [False, True, True, True]]])
    first, recovered, bonus = _verify([[1]], logits, [0.0], token_bitmasks=sv.pack_bitmask(allowed))
    assert (first.tolist(), recovered.tolist(), bonus.tolist()) == ([0], [[2]], [[3]])


def test_a_temperature_of_exactly_1e_5_is_sampled_not_greedy():
    logits = torch.tensor([[[0.0, 0.0]]]).expand(2000, 1, 2)
    first, _, bonus = sv.stochastic_acceptance_sampler(
        torch.zeros(2000, 0, dtype=torch.int64),
        logits,
        torch.full((2000,), 1e-5),
        -1,
        None,
        1.0,
        None,
        torch.arange(2000),
    )
    assert 0.45 < bonus.float().mean() < 0.55  # a tie at any temperature > 0 is a fair coin


RELAXED = dict(relaxed_topk=3, relaxed_delta=0.6)
EXAMPLE = np.log([0.05, 0.10, 0.20, 0.50, 0.10, 0.05])


def test_the_relaxed_worked_example(each_backend):
    logits = np.stack([EXAMPLE] * 3)[None]
    thinking = torch.tensor([True])
    first, recovered, _ = _verify([[2, 4]], logits, [1.0], in_thinking_phase=thinking, **RELAXED)
    assert first.tolist() == [1] and recovered[0].tolist() == [2, 3]  # 2 accepted; 4 rejected, recovered as 3
    first, recovered, _ = _verify([[4]], logits[:, :2], [1.0], in_thinking_phase=thinking, **RELAXED)
    assert first.tolist() == [0] and recovered.tolist() == [[3]]


def test_relaxed_rows_follow_the_rule_on_random_cases_and_other_rows_do_not(each_backend):
    rng = np.random.default_rng(5)
    batch, positions, vocab = 64, 3, 20
    logits = rng.normal(0, 1.5, size=(batch, positions + 1, vocab)).astype(np.float32)
    draft = rng.integers(0, vocab, size=(batch, positions))
    draft[:, 0] = np.argsort(-logits[:, 0], axis=-1)[:, 1]  # often inside the top-k
    thinking = torch.as_tensor(rng.random(batch) < 0.7)
    temperature = np.where(rng.random(batch) < 0.2, 0.0, 1.0)
    topk, delta = 4, 0.15
    first, recovered, _ = _verify(
        draft, logits, temperature, in_thinking_phase=thinking, relaxed_topk=topk, relaxed_delta=delta
    )
    for b in range(batch):
        if not thinking[b] or temperature[b] == 0:
            continue
        accepted = [relaxed_position_law(logits[b, j], int(draft[b, j]), topk, delta)[0] for j in range(positions)]
        expected_first = next((j for j, a in enumerate(accepted) if not a), positions)
        assert int(first[b]) == expected_first, b
        if expected_first < positions:
            assert int(recovered[b, expected_first]) == int(np.argmax(logits[b, expected_first]))
    greedy_rows = temperature == 0
    top = logits.argmax(-1)
    np.testing.assert_array_equal(recovered.numpy()[greedy_rows][:, 0], top[greedy_rows][:, 0])


@pytest.mark.parametrize("vocab", [1, 5, 16, 17, 33, 1000])
def test_relaxed_rule_with_ties_masks_and_every_lane_matches_the_float64_law(each_backend, vocab):
    rng = np.random.default_rng(vocab)
    batch, positions = 48, 3
    logits = rng.integers(0, 5, size=(batch, positions + 1, vocab)).astype(np.float32)  # many ties
    allowed = rng.random((batch, positions + 1, vocab)) < 0.7
    allowed[..., 0] = True
    masked = np.where(allowed, logits, -np.inf)
    draft = rng.integers(0, vocab, size=(batch, positions))
    for topk, delta in [(1, 0.0), (3, 0.05), (8, 1.0)]:
        first, _, _ = _verify(
            draft,
            logits,
            [1.0] * batch,
            in_thinking_phase=torch.ones(batch, dtype=torch.bool),
            relaxed_topk=topk,
            relaxed_delta=delta,
            token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)),
        )
        for b in range(batch):
            accepted = [
                relaxed_position_law(masked[b, j], int(draft[b, j]), topk, delta)[0] == 1.0
                and allowed[b, j, draft[b, j]]
                for j in range(positions)
            ]
            assert int(first[b]) == next((j for j, a in enumerate(accepted) if not a), positions), (topk, delta, b)


def test_relaxed_acceptance_is_lossy_and_the_bonus_is_still_sampled_from_the_target():
    n = 6000
    logits = np.stack([EXAMPLE] * 2)[None].repeat(n, 0)
    first, _, bonus = sv.stochastic_acceptance_sampler(
        torch.full((n, 1), 2),
        torch.as_tensor(logits, dtype=torch.float32),
        torch.ones(n),
        -1,
        None,
        torch.ones(n),
        None,
        torch.arange(n),
        in_thinking_phase=torch.ones(n, dtype=torch.bool),
        **RELAXED,
    )
    assert (first == 1).all()  # always accepted: far more than p(2) = 0.2 (the lossless rate)
    assert_follows(bonus[:, 0].numpy(), truncated_distribution(EXAMPLE, 1.0), "bonus of relaxed rows")


def test_padding_is_never_accepted_and_ends_the_draft():
    logits = torch.zeros(1, 4, 3)
    logits[0, :, 1] = 50.0  # the target all but surely picks 1
    first, recovered, _ = _verify([[1, -1, 1]], logits, [1.0])
    assert first.tolist() == [1] and recovered[0, 1] == 1
    first, _, _ = _verify([[1, -1, 1]], logits, [0.0])
    assert first.tolist() == [1]


def test_k_zero_returns_the_bonus_only():
    logits = torch.randn(3, 1, 7)
    first, recovered, bonus = _verify(torch.zeros(3, 0, dtype=torch.int64), logits, [1.0, 0.0, 0.5])
    assert first.tolist() == [0, 0, 0] and recovered.shape == (3, 0) and bonus.shape == (3, 1)
    assert bonus[1, 0] == logits[1, 0].argmax()
    tokens, count = sv.committed_tokens(first, recovered, bonus)
    assert tokens.shape == (3, 1) and count.tolist() == [1, 1, 1]


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_an_empty_batch_returns_empty_shapes(mode):
    extra = dict(draft_proposal="sampled", draft_probs_full=torch.zeros(0, 2, 5)) if mode == "sampled" else {}
    first, recovered, bonus = sv.stochastic_acceptance_sampler(
        torch.zeros(0, 2, dtype=torch.int64),
        torch.zeros(0, 5),
        torch.zeros(0),
        torch.zeros(0, dtype=torch.int64),
        None,
        torch.ones(0),
        None,
        torch.zeros(0, dtype=torch.int64),
        **extra,
    )
    assert (first.shape, recovered.shape, bonus.shape) == ((0,), (0, 2), (0, 1))
    assert first.dtype == recovered.dtype == bonus.dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_half_precision_logits_give_the_tokens_of_their_float32_upcast(dtype, mode):
    g = torch.Generator().manual_seed(6)
    batch, positions, vocab = 32, 3, 500
    logits = (torch.randn(batch, positions + 1, vocab, generator=g) * 3).to(dtype)
    args = dict(
        draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
        temperature=torch.rand(batch, generator=g) + 0.3,
        top_k=torch.full((batch,), 40),
        max_k=None,
        top_p=torch.full((batch,), 0.9),
        min_top_p=None,
        seed=torch.arange(batch),
    )
    if mode == "sampled":
        args.update(
            draft_proposal="sampled",
            draft_probs_full=torch.softmax(torch.randn(batch, positions, vocab, generator=g), -1),
        )
    half = sv.stochastic_acceptance_sampler(target_logits=logits, **args)
    upcast = sv.stochastic_acceptance_sampler(target_logits=logits.float(), **args)
    for a, b in zip(half, upcast):
        assert torch.equal(a, b)


def test_acceptance_counts_per_draft_position():
    drafted, accepted = sv.acceptance_counts(torch.tensor([0, 2, 3, 1]), torch.tensor([3, 3, 3, 1]))
    assert drafted.tolist() == [4, 3, 3] and accepted.tolist() == [3, 2, 1]
