"""The recovery draw of sampled mode (SPEC §3.2) on both code paths, against laws computed in float64.

A grid of uniforms (i + 1/2) / n through an inverse CDF hits every token a number of times within one of
n times its probability (two with float32 rounding), so each test compares counts with a float64 law
without chance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from specverify import kernels
from specverify.rng import STREAM_ACCEPT, keyed_uniform
from tests.support.recovery import DRAWS, grid_counts, random_weights, recovery_law


@pytest.mark.parametrize("vocab", [37, 3000])
def test_every_mode_draws_its_law(code_path, vocab):
    rng = np.random.default_rng(vocab)
    weights = random_weights(rng, 3, vocab)
    target = weights[:3] / weights[:3].sum(-1, keepdims=True)
    q = rng.dirichlet(np.ones(vocab), size=3).astype(np.float32)
    q[2] = 1.5 * target[2]  # q >= p~ everywhere: the residual is empty and the draw falls back to p~
    draft = weights[:3].argmax(-1)  # the heaviest token: removing it (WITHOUT_DRAFT) changes the law most
    modes = [
        np.array([kernels.FROM_RESIDUAL, kernels.WITHOUT_DRAFT, kernels.FROM_RESIDUAL]),
        np.array([kernels.FROM_TARGET, kernels.FROM_RESIDUAL, kernels.WITHOUT_DRAFT]),
    ]
    for mode in modes:
        counts = grid_counts(weights, q, draft, mode)
        for j in range(3):
            expected = DRAWS * recovery_law(weights[j], q[j], draft[j], mode[j])
            assert np.abs(counts[j] - expected).max() <= 2.0, (mode, j)  # 1, and 1 for float32 rounding


def test_catches_a_recovery_from_the_full_target(code_path):
    rng = np.random.default_rng(1)
    weights = random_weights(rng, 1, 50)
    q = rng.dirichlet(np.ones(50), size=1).astype(np.float32)
    counts = grid_counts(weights, q, np.array([3]), np.array([kernels.FROM_RESIDUAL]))
    wrong = DRAWS * recovery_law(weights[0], q[0], 3, kernels.FROM_TARGET)
    assert np.abs(counts[0] - wrong).max() > 10


def test_the_bonus_position_is_never_read():
    rng = np.random.default_rng(2)
    weights = random_weights(rng, 2, 100)
    q = rng.dirichlet(np.ones(100), size=2).astype(np.float32)
    mode = np.array([kernels.FROM_RESIDUAL, kernels.FROM_TARGET])
    before = grid_counts(weights, q, np.array([1, 2]), mode)
    weights[2] = np.nan
    assert np.array_equal(grid_counts(weights, q, np.array([1, 2]), mode), before)


def test_a_draft_whose_q_is_truncated_probs_itself_is_accepted_even_at_an_extreme_uniform(code_path):
    # every request draws the acceptance uniform 1 - 2.6e-8 at position 0: judged against p~(d) rounded in
    # any other way than truncated_probs rounds it (about a third of these rows round up by more than
    # that), some drafts would be rejected; judged as the rule states, u * p~(d) < p~(d) accepts them all
    seed = torch.full((2000,), 47239468)
    assert keyed_uniform(seed[:1], STREAM_ACCEPT).item() > 1 - 3e-8
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2000, 2, 40, generator=g) * 3
    temperature, top_k, top_p = torch.rand(2000, generator=g) + 0.5, torch.full((2000,), -1), torch.ones(2000)
    q = sv.truncated_probs(logits[:, 0], temperature, top_k, top_p)
    draft = torch.randint(0, 40, (2000, 1), generator=g)
    first, recovered, _ = sv.stochastic_acceptance_sampler(
        draft,
        logits,
        temperature,
        top_k,
        None,
        top_p,
        None,
        seed,
        draft_proposal="sampled",
        draft_probs_full=q[:, None],
    )
    assert bool((first == 1).all()) and torch.equal(recovered, draft)
