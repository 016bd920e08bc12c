"""Draft length per step: a fixed K, a random schedule, and the adaptive policy ("auto"). The output never
depends on the K schedule in argmax mode (row b's n-th token is keyed by s_b + n); the adaptive policy
picks the K that its acceptance and cost model says is fastest, 0 included."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from specverify.decoding import ModelDrafter, NgramDrafter, SamplingParams, speculative_generate
from specverify.decoding.drafting import draft_length
from specverify.decoding.drafting.draft_length import (
    POSITIONS,
    AdaptiveDraftLength,
    FixedDraftLength,
    calibrate,
    draft_length_policy,
    expected_tokens,
)
from tests.support.models import PROMPTS, SEEDS, RandomDrafter, plain, spec

pytestmark = pytest.mark.usefixtures("one_thread")


class RandomSchedule:
    """A DraftLength that gives every row a random K in 0..budget every step, and probes sometimes."""

    def __init__(self, seed: int, probes: bool):
        self.generator = torch.Generator().manual_seed(seed)
        self.probes = probes
        self.seen: list[list[int]] = []

    def begin(self, target, session, last_tokens) -> float:
        return 0.0

    def choose(self, budgets, evidence):
        ks = [int(torch.randint(0, b + 1, (1,), generator=self.generator)) for b in budgets]
        self.seen.append(ks)
        return ks

    def observe(self, drafted, accepted, probe_hits, width, forward_seconds, step_seconds, evidence) -> None:
        assert width == max(drafted) + 1


@pytest.mark.parametrize(("seed", "probes"), [(0, False), (1, True), (2, True)])
def test_any_k_schedule_gives_plain_decoding_tokens(target, seed, probes):
    schedule = RandomSchedule(seed, probes)
    result = spec(target, ModelDrafter(target), k=schedule)
    assert result.tokens == plain(target).tokens
    assert len({k for ks in schedule.seen for k in ks}) > 3  # the schedule did vary


@pytest.mark.parametrize("drafter", ["ngram", "random"])
def test_auto_gives_plain_decoding_tokens(target, drafter):
    made = NgramDrafter() if drafter == "ngram" else RandomDrafter(4)
    assert spec(target, made, k="auto").tokens == plain(target).tokens
    one = spec(target, made, prompts=[PROMPTS[2]], params=SamplingParams(), seed=[SEEDS[2]], k="auto")
    assert one.tokens == plain(target, prompts=[PROMPTS[2]], params=SamplingParams(), seed=[SEEDS[2]]).tokens


def test_expected_tokens_is_the_sum_of_acceptance_products():
    acceptance = np.array([[0.5, 0.8, 0.9, 0.3], [1.0, 0.0, 0.5, 0.5]])
    k = np.array([[0, 1, 2, 3, 4, 6], [0, 1, 2, 3, 4, 6]])
    for b, c in itertools.product(range(2), range(6)):
        rates = acceptance[b].tolist()
        exact, reach = 1.0, 1.0
        for j in range(int(k[b, c])):
            reach *= rates[min(j, POSITIONS - 1)]
            exact += reach
        assert float(expected_tokens(acceptance, k)[b, c]) == pytest.approx(exact, rel=1e-12)


def _policy(costs, max_k):
    policy = AdaptiveDraftLength(max_k=max_k)
    policy.costs = list(costs)
    policy.reset(1)
    return policy


#: SmolLM2 on one thread, widths 1 to 4: a 2-wide pass costs ~3% more than a 1-wide one.
NEAR_FLAT_COSTS = [0.0527, 0.0544, 0.0585, 0.0842]


def _fail_every_draft(policy, steps: int, step_time) -> list[int]:
    """Run the policy for `steps` steps in which every draft token and probe fails; step_time(k) is the
    measured time of a step with k draft tokens. Returns the k chosen at each step."""
    chosen = []
    for _ in range(steps):
        (k,) = policy.choose([100], None)
        chosen.append(k)
        policy.observe([k], [0], [False if k == 0 else None], k + 1, step_time(k), step_time(k), None)
    return chosen


def test_auto_stops_drafting_when_drafts_always_fail_even_if_one_more_token_is_almost_free():
    """Drafts that never pass (chat at T = 0.7) must end in plain steps, probes included, not one failing
    draft token a step; a probe that passes brings drafting back."""
    policy = _policy(NEAR_FLAT_COSTS, 3)
    chosen = _fail_every_draft(policy, 20, NEAR_FLAT_COSTS.__getitem__)
    assert chosen[0] > 0 and chosen[-10:] == [0] * 10
    for _ in range(2):
        policy.observe([0], [0], [True], 1, NEAR_FLAT_COSTS[0], NEAR_FLAT_COSTS[0], None)
    assert policy.choose([100], None) != [0]


def test_a_noisy_step_time_scales_every_width_and_does_not_reshape_the_curve():
    """On a loaded machine a 2-wide step may be timed below a 1-wide one; failing drafts must still end
    in plain steps, while a slower machine shows in every width's cost."""
    policy = _policy(NEAR_FLAT_COSTS, 3)
    chosen = _fail_every_draft(policy, 30, lambda k: NEAR_FLAT_COSTS[k] * (0.9 if k == 1 else 1.3))
    assert chosen[-10:] == [0] * 10
    assert policy.costs == NEAR_FLAT_COSTS and policy.load == pytest.approx(1.3, rel=0.01)


def test_auto_drafts_nothing_when_drafts_fail_and_everything_when_they_pass():
    costs = [0.050, 0.055, 0.060, 0.085, 0.090]
    failing, passing = _policy(costs, 4), _policy(costs, 4)
    for _ in range(10):
        failing.observe([2], [0], [None], 3, 0.06, 0.06, None)
        passing.observe([4], [4], [None], 5, 0.09, 0.09, None)
    assert failing.choose([10], None) == [0]  # a plain step
    assert passing.choose([10], None) == [4]
    assert passing.choose([2], None) == [2]  # never past the row's budget
    assert passing.choose([0], None) == [0]


def test_auto_weighs_each_width_by_its_measured_cost():
    """Acceptance 0.9 at every position: E(k) = sum 0.9**i. The choice is the argmax of E(k)/cost(k+1)."""
    costs = [0.050, 0.051, 0.052, 0.200, 0.201, 0.060]
    policy = _policy(costs, 5)
    policy.successes += 90.0
    policy.failures += 10.0
    rate = [sum(0.9**i for i in range(k + 1)) / c for k, c in enumerate(costs)]
    assert policy.choose([10], None) == [max(range(6), key=rate.__getitem__)] == [5]
    policy.costs[5] = 0.5  # measured slower: the choice moves
    assert policy.choose([10], None) == [2]


@pytest.mark.parametrize(("acceptance", "margin", "chosen"), [(0.45, 0.1, 0), (0.45, 0.0, 1), (0.6, 0.1, 1)])
def test_auto_drafts_only_when_a_draft_promises_the_margin_over_a_plain_step(acceptance, margin, chosen):
    """Width 2 costs 1.38x width 1: one drafted token at acceptance 0.45 promises 1.45 / 1.38 = 1.05x a plain
    step's rate, under the 10% margin; at 0.6, 1.16x."""
    policy = AdaptiveDraftLength(max_k=1, margin=margin)
    policy.costs = [0.020, 0.0276]
    policy.reset(1)
    policy.first_weight[:] = 0.0
    policy.successes[0, 0, 0], policy.failures[0, 0, 0] = acceptance * 100, (1 - acceptance) * 100
    assert policy.choose([10], None) == [chosen]


def test_a_probe_counts_as_a_one_token_draft():
    policy = _policy([0.05, 0.06], 1)
    policy.observe([0], [0], [True], 1, 0.05, 0.05, None)
    assert policy.successes[0, 0, 0] == 1 and policy.failures.sum() == 0
    policy.observe([0], [0], [False], 1, 0.05, 0.05, None)
    assert policy.failures[0, 0, 0] == 1


def test_observe_counts_each_draft_position_in_its_bucket():
    """Position j of a row's draft passed when j < accepted and failed when j == accepted < drafted; from
    POSITIONS - 1 on positions share the last bucket; a probe is a one-token draft; only the class of a
    row's evidence learns, and its counts decay per observation; a row that neither drafted nor probed
    keeps its counts."""
    policy = AdaptiveDraftLength(max_k=8)
    policy.reset(6)
    policy.successes += 1.0
    policy.failures += 1.0
    evidence = [4, 2, 1, 7, 9, 3]
    policy.observe([6, 3, 0, 0, 5, 0], [6, 1, 0, 0, 4, 0], [None, None, True, False, None, None], 7, 0.0, 0.0, evidence)
    passed = [[1, 1, 1, 3], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    failed = [[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]
    for row, cls in enumerate([4, 2, 1, 4, 4]):
        assert policy.successes[row, cls].tolist() == (0.8 + np.array(passed[row], dtype=float)).tolist()
        assert policy.failures[row, cls].tolist() == (0.8 + np.array(failed[row], dtype=float)).tolist()
        assert policy.first_weight[row, cls] == 0.8
        others = [c for c in range(policy.successes.shape[1]) if c != cls]
        assert (policy.successes[row, others] == 1).all() and (policy.first_weight[row, others] == 1).all()
    assert (policy.successes[5] == 1).all() and (policy.failures[5] == 1).all() and (policy.first_weight[5] == 1).all()


def test_auto_drafts_by_the_acceptance_of_the_draft_s_evidence_class():
    """Short n-gram matches that fail and long ones that pass, in one row: the policy drafts after a long
    match and not after a short one, and a row whose drafter has nothing (evidence 0) drafts nothing."""
    costs = [0.020, 0.0276, 0.0347, 0.0437, 0.050]  # llama.cpp, Q4_1, widths 1-5: a drafted token costs 38%
    policy = _policy(costs, 4)
    for _ in range(10):
        policy.observe([1], [0], [None], 2, 0.0276, 0.0276, [1])
        policy.observe([4], [4], [None], 5, 0.050, 0.050, [6])
    assert policy.choose([10], [1]) == [0]
    assert policy.choose([10], [5]) == [4]
    assert policy.choose([10], [0]) == [0]
    before = policy.successes.copy()
    policy.observe([0], [0], [None], 1, 0.02, 0.02, [0])  # no draft, no probe: nothing learnt
    assert (policy.successes == before).all()


def test_calibration_leaves_the_session_as_it_was(target):
    session = target.session(2)
    session.extend(torch.tensor([[1, 2, 3], [4, 5, -1]]), return_logits=False)
    before = session.lengths.clone()
    costs = calibrate(session, torch.tensor([[3], [5]]), 4)
    assert len(costs) == 4 and all(c > 0 for c in costs)
    assert torch.equal(session.lengths, before)
    fresh = target.session(2)
    fresh.extend(torch.tensor([[1, 2, 3], [4, 5, -1]]), return_logits=False)
    step = torch.tensor([[7], [8]])
    assert torch.allclose(session.extend(step), fresh.extend(step))


def test_calibration_keeps_each_width_s_fastest_time_once_another_agrees(monkeypatch):
    """Noise only slows a pass: a width's cost is its fastest time, and a width whose two fastest times
    disagree (by more than 10%) is timed again, at most 5 times in all."""
    clock = [0.0]
    durations = [
        9.0,  # untimed widest pass
        1.0,
        5.0,
        2.0,  # sweep 1: widths 1, 2, 3 (the clock adds up: compare approximately)
        1.05,
        3.0,
        9.0,  # sweep 2: width 1 agrees; width 2 (3.0 against 5.0) and 3 (2.0 against 9.0) do not
        2.9,  # width 2 again: 2.9 and 3.0 agree
        4.0,
        8.0,
        7.0,  # width 3 again and again: never agrees, stops at 5 times
    ]

    class ClockSession:
        lengths = torch.tensor([3])

        def extend(self, tokens, **kwargs):
            clock[0] += durations.pop(0)
            return torch.zeros(*tokens.shape, 1)

        def truncate(self, lengths):
            self.lengths = lengths

    monkeypatch.setattr(draft_length.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(draft_length, "CALIBRATION_ROUNDS", 2)
    monkeypatch.setattr(draft_length, "CALIBRATION_SAMPLES", 5)
    assert calibrate(ClockSession(), torch.tensor([[5]]), 3) == pytest.approx([1.0, 2.9, 2.0]) and not durations


@pytest.mark.parametrize("bad", [-1, "fast", True, 2.5, None])
def test_bad_k_names_itself(target, bad):
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        speculative_generate(target, NgramDrafter(), [[1, 2]], k=bad)


def test_fixed_policy_and_names():
    assert isinstance(draft_length_policy(3), FixedDraftLength)
    assert isinstance(draft_length_policy("auto"), AdaptiveDraftLength)
    assert FixedDraftLength(3).choose([5, 1, 0], None) == [3, 1, 0]
    with pytest.raises(ValueError, match="max_k must be an int >= 1"):
        AdaptiveDraftLength(max_k=0)
    with pytest.raises(ValueError, match=r"margin must be >= 0 \(got -0.1\)"):
        AdaptiveDraftLength(margin=-0.1)


class CountingModel:
    """A LanguageModel wrapper that counts the forward passes of its sessions (and may have a cache folder)."""

    def __init__(self, model, cache_folder):
        self.model, self.cache_folder, self.vocab_size, self.passes = model, cache_folder, model.vocab_size, 0

    def session(self, batch_size):
        inner, outer = self.model.session(batch_size), self

        class Counted:
            @property
            def lengths(self):
                return inner.lengths

            def extend(self, tokens, **kwargs):
                outer.passes += 1
                return inner.extend(tokens, **kwargs)

            def truncate(self, lengths):
                inner.truncate(lengths)

        return Counted()


def _begin(model, max_k=3):
    session = model.session(2)
    session.extend(torch.tensor([[1, 2, 3], [4, 5, 6]]), return_logits=False)
    passes = model.passes
    policy = AdaptiveDraftLength(max_k=max_k)
    policy.begin(model, session, torch.tensor([[3], [5]]))
    return policy.costs, model.passes - passes


def test_calibration_is_stored_in_the_model_cache_folder_and_read_back(target, tmp_path):
    costs, passes = _begin(CountingModel(target, tmp_path))
    assert passes >= 9  # one untimed pass at the widest width, then widths 1..4 twice (and where they disagree, more)
    files = list(tmp_path.glob("draft-costs*.json"))
    assert (
        len(files) == 1 and f"threads{torch.get_num_threads()}" in files[0].name and "batch2-widths4" in files[0].name
    )
    again, passes = _begin(CountingModel(target, tmp_path))  # another process's model object: no pass at all
    assert passes == 0 and again == costs
    _, passes = _begin(CountingModel(target, tmp_path), max_k=2)  # other widths: another file
    assert passes >= 7 and len(list(tmp_path.glob("draft-costs*.json"))) == 2


@pytest.mark.parametrize("content", ["not json", "[1.0, 2.0]", "[1.0, 2.0, -3.0, 4.0]", '{"a": 1}', "[1, 2, true, 4]"])
def test_a_damaged_calibration_file_is_measured_again(target, tmp_path, content):
    _, passes = _begin(CountingModel(target, tmp_path))
    (path,) = tmp_path.glob("draft-costs*.json")
    path.write_text(content)
    costs, passes = _begin(CountingModel(target, tmp_path))
    assert passes >= 9 and len(costs) == 4 and all(c > 0 for c in costs)
    assert json.loads(path.read_text()) == costs  # and stored again


def test_without_a_cache_folder_calibration_is_per_process(target, tmp_path):
    _, passes = _begin(CountingModel(target, None))
    assert passes >= 9
    not_a_folder = tmp_path / "a-file"  # (root ignores a read-only mode, so a file stands for what cannot be written)
    not_a_folder.write_text("")
    _, passes = _begin(CountingModel(target, not_a_folder))  # cannot store: measures, and says nothing
    assert passes >= 9 and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
