"""SPEC §7: greedy_acceptance_sampler, the synthetic benchmarking mode and AcceptanceSampler."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import specverify as sv


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _equal_outputs(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------------------
# greedy_acceptance_sampler


def reference_argmax(scores: list[float], allowed: list[bool] | None = None) -> int:
    """Lowest index among the allowed maxima, from first principles."""
    best, best_id = -math.inf, None
    for token, score in enumerate(scores):
        if (allowed is None or allowed[token]) and (best_id is None or score > best):
            best, best_id = score, token
    return best_id


def reference_greedy(draft: torch.Tensor, logits: torch.Tensor, allowed: torch.Tensor | None):
    """SPEC §3.3 row by row: (f [B], argmax at every position [B, K+1])."""
    batch, positions = draft.shape
    targets = [
        [
            reference_argmax(logits[b, j].float().tolist(), None if allowed is None else allowed[b, j].tolist())
            for j in range(positions + 1)
        ]
        for b in range(batch)
    ]
    firsts = []
    for b in range(batch):
        f = 0
        while f < positions and int(draft[b, f]) == targets[b][f]:
            f += 1
        firsts.append(f)
    return torch.tensor(firsts), torch.tensor(targets)


def tied_logits(batch: int, positions: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Integer-valued logits in a small range, so that ties for the maximum are common and exact in every dtype."""
    return torch.randint(-3, 4, (batch, positions + 1, vocab), generator=_generator(seed)).to(dtype)


def drafts_near_argmax(targets: torch.Tensor, vocab: int, seed: int, p_wrong: float = 0.3) -> torch.Tensor:
    """Drafts that equal the target argmax except, with probability p_wrong, a random other token."""
    g = _generator(seed)
    draft = targets[:, :-1].clone()
    wrong = torch.rand(draft.shape, generator=g) < p_wrong
    return torch.where(wrong, (draft + torch.randint(1, vocab, draft.shape, generator=g)) % vocab, draft)


def assert_greedy_outputs(outputs, expected_first, expected_targets) -> None:
    first, recovered, bonus = outputs
    positions = recovered.shape[1]
    assert torch.equal(first, expected_first)
    for b in range(first.shape[0]):
        f = int(first[b])
        assert recovered[b, : f + 1].tolist() == expected_targets[b, : min(f + 1, positions)].tolist()
    assert torch.equal(bonus[:, 0], expected_targets[:, positions])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_greedy_accepts_iff_draft_is_argmax_lowest_index_on_ties(dtype, layout):
    batch, positions, vocab = 64, 4, 9
    logits = tied_logits(batch, positions, vocab, dtype, seed=1)
    _, targets = reference_greedy(torch.zeros(batch, positions, dtype=torch.int64), logits, None)
    draft = drafts_near_argmax(targets, vocab, seed=2)
    first_ref, _ = reference_greedy(draft, logits, None)
    given = logits.reshape(batch * (positions + 1), vocab) if layout == "flat" else logits
    outputs = sv.greedy_acceptance_sampler(draft, given)
    assert_greedy_outputs(outputs, first_ref, targets)
    assert 0 < int((first_ref == positions).sum()) < batch  # both full acceptances and rejections occur


def test_greedy_tie_draft_with_higher_index_is_rejected():
    logits = torch.tensor([[[0.0, 5.0, 1.0, 5.0], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 3.0, 3.0]]])
    first, recovered, bonus = sv.greedy_acceptance_sampler(torch.tensor([[1, 0]]), logits)
    assert first.tolist() == [2] and recovered.tolist() == [[1, 0]] and bonus.tolist() == [[2]]
    first, recovered, bonus = sv.greedy_acceptance_sampler(torch.tensor([[3, 0]]), logits)
    assert first.tolist() == [0] and recovered[0, 0].item() == 1
    first, recovered, _ = sv.greedy_acceptance_sampler(torch.tensor([[1, 3]]), logits)
    assert first.tolist() == [1] and recovered[0, :2].tolist() == [1, 0]


def test_greedy_respects_bitmasks():
    batch, positions, vocab = 64, 3, 45
    logits = tied_logits(batch, positions, vocab, torch.float32, seed=3)
    allowed = torch.rand(batch, positions + 1, vocab, generator=_generator(4)) < 0.3
    allowed[..., vocab - 1] = True  # at least one token everywhere
    _, targets = reference_greedy(torch.zeros(batch, positions, dtype=torch.int64), logits, allowed)
    _, unmasked_targets = reference_greedy(torch.zeros(batch, positions, dtype=torch.int64), logits, None)
    assert not torch.equal(targets, unmasked_targets)  # the mask changes the answer
    draft = drafts_near_argmax(targets, vocab, seed=5)
    draft[:8] = unmasked_targets[:8, :-1]  # drafts that would win without the mask
    first_ref, _ = reference_greedy(draft, logits, allowed)
    outputs = sv.greedy_acceptance_sampler(draft, logits, sv.pack_bitmask(allowed))
    assert_greedy_outputs(outputs, first_ref, targets)


def test_greedy_padding_is_never_accepted():
    logits = tied_logits(3, 4, 7, torch.float32, seed=6)
    _, targets = reference_greedy(torch.zeros(3, 4, dtype=torch.int64), logits, None)
    draft = targets[:, :-1].clone()
    draft[0, 2:] = -1
    draft[1, 0] = -1
    first, recovered, bonus = sv.greedy_acceptance_sampler(draft, logits)
    assert first.tolist() == [2, 0, 4]
    assert recovered[0, 2].item() == targets[0, 2].item() and recovered[1, 0].item() == targets[1, 0].item()
    assert bonus[2, 0].item() == targets[2, 4].item()


# ---------------------------------------------------------------------------------------------------------
# compute_synthetic_acceptance_base_rate


def mean_joint_acceptance(r: float, n: int) -> Fraction:
    """(1/n) * sum_{k=1..n} r**k in exact rational arithmetic (r is read as the exact value of the float)."""
    exact = Fraction(r)
    return sum(exact**k for k in range(1, n + 1)) / n


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 16, 100])
@pytest.mark.parametrize("p_avg", [1e-300, 1e-12, 0.01, 0.25, 0.5, 0.7, 0.9, 0.999, 1 - 2**-52])
def test_base_rate_solves_the_mean_joint_acceptance_to_float_resolution(p_avg, n):
    r = sv.compute_synthetic_acceptance_base_rate(p_avg, n)
    assert 0 < r <= 1  # 1 - 2**-52 over 8 positions is solved best by 1.0 itself
    # no float within a few steps of r solves it noticeably better (the bisection evaluates the mean in
    # floating point, so the last ulps are rounding noise)
    neighbours = []
    for direction in (0.0, 1.0):
        x = r
        for _ in range(4):
            x = math.nextafter(x, direction)
            neighbours.append(x)
    error = abs(mean_joint_acceptance(r, n) - Fraction(p_avg))
    best = min(abs(mean_joint_acceptance(x, n) - Fraction(p_avg)) for x in neighbours)
    assert error <= best + Fraction(8 * n) * Fraction(math.ulp(p_avg)), (r, float(error), float(best))
    if n > 1:
        assert r > p_avg  # reaching later positions needs every earlier acceptance


@pytest.mark.parametrize("p_avg", [0.0, 0.3, 0.77, 1.0, 1e-300])
def test_base_rate_for_one_position_is_p_avg_exactly(p_avg):
    assert sv.compute_synthetic_acceptance_base_rate(p_avg, 1) == p_avg


@pytest.mark.parametrize("n", [1, 2, 3, 4, 10, 1000])
def test_base_rate_endpoints_are_exact(n):
    zero = sv.compute_synthetic_acceptance_base_rate(0.0, n)
    one = sv.compute_synthetic_acceptance_base_rate(1, n)
    assert zero == 0.0 and one == 1.0  # not 3.1e-61, not 1 - 1e-16
    assert type(zero) is float and type(one) is float


# ---------------------------------------------------------------------------------------------------------
# synthetic_acceptance_sampler

ROWS, STEPS, VOCAB = 20_000, 4, 16


def synthetic_batch(seed: int = 7):
    g = _generator(seed)
    draft = torch.randint(0, VOCAB, (ROWS, STEPS), generator=g)
    logits = torch.randn(ROWS, STEPS + 1, VOCAB, generator=g)
    seeds = torch.randint(-(2**62), 2**62, (ROWS,), generator=g)
    return draft, logits, seeds


def per_position_acceptance(first: torch.Tensor, positions: int) -> list[tuple[float, int]]:
    """(fraction accepted among the rows that reached position j, number of such rows) for each j."""
    out = []
    for j in range(positions):
        reached = int((first >= j).sum())
        accepted = int((first > j).sum())
        out.append((accepted / reached, reached))
    return out


@pytest.mark.parametrize("p_avg", [0.3, 0.6, 0.85])
def test_synthetic_acceptance_matches_the_base_rate(p_avg):
    rate = sv.compute_synthetic_acceptance_base_rate(p_avg, STEPS)
    draft, logits, seeds = synthetic_batch()
    first, recovered, bonus = sv.synthetic_acceptance_sampler(draft, logits, rate, STEPS, seeds)
    for j, (observed, reached) in enumerate(per_position_acceptance(first, STEPS)):
        standard_error = math.sqrt(rate * (1 - rate) / reached)
        assert abs(observed - rate) < 4 * standard_error, (j, observed, rate)
        if j == 0:  # power: a sampler that accepted with p_avg itself would be caught
            assert abs(observed - p_avg) > 4 * standard_error
    accepted_share = first.double() / STEPS  # mean accepted fraction estimates p_avg
    standard_error = float(accepted_share.std()) / math.sqrt(ROWS)
    assert abs(float(accepted_share.mean()) - p_avg) < 4 * standard_error


def test_synthetic_commits_drafts_then_the_target_token():
    draft, logits, seeds = synthetic_batch()
    first, recovered, bonus = sv.synthetic_acceptance_sampler(draft, logits, 0.7, STEPS, seeds)
    positions = torch.arange(STEPS)
    accepted = positions < first[:, None]
    assert torch.equal(recovered[accepted], draft[accepted])
    target = logits.argmax(-1)  # the default temperature is 0: the target token is the argmax
    rejected = positions == first[:, None]
    assert torch.equal(recovered[rejected], target[:, :STEPS][rejected])
    assert torch.equal(bonus[:, 0], target[:, STEPS])
    assert 0 < int(rejected.sum()) < ROWS and int((first == STEPS).sum()) > 0


def test_synthetic_rate_0_and_1():
    draft, logits, seeds = synthetic_batch()
    assert (sv.synthetic_acceptance_sampler(draft, logits, 0.0, STEPS, seeds)[0] == 0).all()
    assert (sv.synthetic_acceptance_sampler(draft, logits, 1.0, STEPS, seeds)[0] == STEPS).all()


def test_synthetic_padding_is_never_accepted():
    draft, logits, seeds = synthetic_batch()
    draft = draft[:200].clone()
    draft[:, 2] = -1
    first, _, _ = sv.synthetic_acceptance_sampler(draft, logits[:200], 1.0, STEPS, seeds[:200])
    assert (first == 2).all()


def test_synthetic_is_deterministic_and_keyed_by_seed():
    draft, logits, seeds = synthetic_batch()
    a = sv.synthetic_acceptance_sampler(draft[:500], logits[:500], 0.5, STEPS, seeds[:500])
    b = sv.synthetic_acceptance_sampler(draft[:500], logits[:500], 0.5, STEPS, seeds[:500])
    c = sv.synthetic_acceptance_sampler(draft[:500], logits[:500], 0.5, STEPS, seeds[:500] + 1)
    assert _equal_outputs(a, b)
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("steps", [STEPS - 1, STEPS + 1, 0])
def test_synthetic_num_draft_steps_must_equal_K(steps):
    draft, logits, seeds = synthetic_batch()
    with pytest.raises(ValueError, match=rf"num_draft_steps must equal K .*\(got {steps} for shape \[20000, 4\]\)"):
        sv.synthetic_acceptance_sampler(draft, logits, 0.5, steps, seeds)


# ---------------------------------------------------------------------------------------------------------
# AcceptanceSampler

B, K, V = 8, 3, 30


def sampler_inputs(seed: int = 11) -> dict:
    g = _generator(seed)
    logits = torch.randn(B, K + 1, V, generator=g) * 0.5  # flat: stochastic verdicts vary with the seed
    allowed = torch.rand(B, K + 1, V, generator=g) < 0.7
    allowed[..., 0] = True
    return dict(
        draft_tokens=torch.randint(0, V, (B, K), generator=g),
        target_logits=logits,
        token_bitmasks=sv.pack_bitmask(allowed),
        seed=torch.randint(0, 2**40, (B,), generator=g),
        temperature=torch.tensor([1.0, 0.8, 0.0, 1.2, 1.0, 1.0, 0.5, 2.0]),
        top_k=torch.tensor([-1, 5, 0, 10, 3, -1, 7, 20]),
        top_p=torch.tensor([1.0, 0.9, 1.0, 0.8, 1.0, 0.95, 1.0, 1.0]),
        min_p=torch.tensor([0.0, 0.05, 0.0, 0.0, 0.1, 0.0, 0.0, 0.02]),
    )


def direct_stochastic(inputs: dict, **kwargs):
    return sv.stochastic_acceptance_sampler(
        inputs["draft_tokens"],
        inputs["target_logits"],
        inputs["temperature"],
        inputs["top_k"],
        None,
        inputs["top_p"],
        None,
        inputs["seed"],
        token_bitmasks=inputs["token_bitmasks"],
        min_p=inputs["min_p"],
        **kwargs,
    )


def call_configured(sampler: sv.AcceptanceSampler, inputs: dict, **kwargs):
    return sampler(
        inputs["draft_tokens"],
        inputs["target_logits"],
        seed=inputs["seed"],
        temperature=inputs["temperature"],
        top_k=inputs["top_k"],
        top_p=inputs["top_p"],
        token_bitmasks=inputs["token_bitmasks"],
        min_p=inputs["min_p"],
        **kwargs,
    )


@pytest.mark.parametrize(
    "kwargs, mode",
    [
        (dict(), "greedy"),
        (dict(use_stochastic=False), "greedy"),
        (dict(use_stochastic=True), "stochastic"),
        (dict(use_stochastic=True, draft_proposal="sampled"), "stochastic"),
        (dict(synthetic_acceptance_rate=0.5, num_draft_steps=K), "synthetic"),
        (dict(synthetic_acceptance_rate=0.5, num_draft_steps=K, use_stochastic=True), "synthetic"),
        (dict(synthetic_acceptance_rate=0.0, num_draft_steps=K, use_stochastic=True), "synthetic"),
    ],
)
def test_acceptance_sampler_mode_order(kwargs, mode):
    assert sv.AcceptanceSampler(**kwargs).mode == mode


def test_acceptance_sampler_synthetic_matches_direct_call():
    inputs = sampler_inputs()
    sampler = sv.AcceptanceSampler(synthetic_acceptance_rate=0.6, num_draft_steps=K, use_stochastic=True)
    rate = sv.compute_synthetic_acceptance_base_rate(0.6, K)
    assert sampler.base_acceptance_rate == rate
    got = call_configured(sampler, inputs)
    expected = sv.synthetic_acceptance_sampler(
        inputs["draft_tokens"],
        inputs["target_logits"],
        rate,
        K,
        inputs["seed"],
        temperature=inputs["temperature"],
        top_k=inputs["top_k"],
        top_p=inputs["top_p"],
        token_bitmasks=inputs["token_bitmasks"],
        min_p=inputs["min_p"],
    )
    assert _equal_outputs(got, expected)
    assert not _equal_outputs(got, direct_stochastic(inputs))  # the mode matters for these inputs


def test_acceptance_sampler_stochastic_matches_direct_call():
    inputs = sampler_inputs()
    got = call_configured(sv.AcceptanceSampler(use_stochastic=True, vocab_size=V), inputs)
    assert _equal_outputs(got, direct_stochastic(inputs))
    greedy = sv.greedy_acceptance_sampler(inputs["draft_tokens"], inputs["target_logits"], inputs["token_bitmasks"])
    assert not _equal_outputs(got, greedy)


def test_acceptance_sampler_stochastic_sampled_matches_direct_call():
    inputs = sampler_inputs()
    probs = torch.softmax(torch.randn(B, K, V, generator=_generator(12)), dim=-1)
    sampler = sv.AcceptanceSampler(use_stochastic=True, draft_proposal="sampled")
    got = call_configured(sampler, inputs, draft_probs_full=probs)
    expected = direct_stochastic(inputs, draft_proposal="sampled", draft_probs_full=probs)
    assert _equal_outputs(got, expected)
    assert not _equal_outputs(got, direct_stochastic(inputs))  # "sampled" is really used


def test_acceptance_sampler_stochastic_relaxed_matches_direct_call():
    inputs = sampler_inputs()
    thinking = torch.tensor([True, False, True, True, False, True, True, False])
    sampler = sv.AcceptanceSampler(use_stochastic=True, relaxed_topk=4, relaxed_delta=0.5)
    got = call_configured(sampler, inputs, in_thinking_phase=thinking)
    expected = direct_stochastic(inputs, in_thinking_phase=thinking, relaxed_topk=4, relaxed_delta=0.5)
    assert _equal_outputs(got, expected)
    assert not _equal_outputs(got, direct_stochastic(inputs))  # the relaxed rule is really used


def test_acceptance_sampler_greedy_matches_direct_call():
    inputs = sampler_inputs()
    got = call_configured(sv.AcceptanceSampler(), inputs)
    expected = sv.greedy_acceptance_sampler(inputs["draft_tokens"], inputs["target_logits"], inputs["token_bitmasks"])
    assert _equal_outputs(got, expected)
    assert not _equal_outputs(got, sv.greedy_acceptance_sampler(inputs["draft_tokens"], inputs["target_logits"]))


def test_acceptance_sampler_defaults():
    """Missing sampling arguments: temperature 1, no top-k, top_p 1, seed 0 (stochastic mode)."""
    inputs = sampler_inputs()
    got = sv.AcceptanceSampler(use_stochastic=True)(inputs["draft_tokens"], inputs["target_logits"])
    expected = sv.stochastic_acceptance_sampler(
        inputs["draft_tokens"],
        inputs["target_logits"],
        torch.ones(B),
        torch.full((B,), -1),
        None,
        torch.ones(B),
        None,
        0,
    )
    assert _equal_outputs(got, expected)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (
            dict(use_stochastic=True, draft_proposal="sampled", relaxed_topk=3, relaxed_delta=0.1),
            r'need draft_proposal="argmax"',
        ),
        (dict(draft_proposal="sampled", relaxed_topk=3, relaxed_delta=0.1), r'need draft_proposal="argmax"'),
        (dict(use_stochastic=True, relaxed_topk=3), r"relaxed_topk and relaxed_delta must be given together"),
        (dict(use_stochastic=True, relaxed_delta=0.2), r"relaxed_topk and relaxed_delta must be given together"),
    ],
)
def test_acceptance_sampler_configuration_errors_raise_at_construction(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sv.AcceptanceSampler(**kwargs)
