"""The audit's parts: its statistics are honest, its exact laws are right, its scenarios are well posed,
and its runner catches what it should (contract breaks, the two wrong verifiers) and nothing else."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

import specverify as sv
from specverify.audit import stats
from specverify.audit.exact import argmax_position_law, mixed_position_law, sampled_position_law, truncated_distribution
from specverify.audit.invariance import check_drafter_invariance
from specverify.audit.report import report_json
from specverify.audit.runner import audit_scenario, run_audit
from specverify.audit.scenarios import check_well_posed, contract_problems, scenario, scenario_matrix
from specverify.audit.verifier import as_verifier, load_verifier
from tests.support.wrong_verifiers import (
    block_as_token_wise,
    recovery_from_full_target,
    top_p_before_top_k_renormalisation,
)

MATRIX = {s.name: s for s in scenario_matrix()}
OURS = as_verifier(sv.stochastic_acceptance_sampler)

# ---- statistics ---------------------------------------------------------------------------------------


def test_null_total_variation_is_the_mean_tv_of_exact_samples():
    rng = np.random.default_rng(0)
    law = rng.dirichlet(np.full(30, 0.5))
    for n in (20, 500, 5000):
        simulated = [stats.total_variation(rng.multinomial(n, law), law) for _ in range(4000)]
        assert stats.null_total_variation(law, n) == pytest.approx(np.mean(simulated), rel=0.02)


def test_a_deviation_of_the_detectable_tv_is_caught_four_times_in_five():
    # the worst case for chi-square at a given TV: the deviation spread in proportion to the law
    rng = np.random.default_rng(1)
    law = rng.dirichlet(np.ones(10))
    n, level = 3000, 1e-4
    delta = stats.detectable_tv(n, 10, level)
    half = np.argsort(law).argsort() % 2 == 0  # alternate bins up and down
    shifted = law * np.where(half, 1 + delta / law[half].sum(), 1 - delta / law[~half].sum())
    assert 0.5 * np.abs(shifted - law).sum() == pytest.approx(delta)
    caught = np.mean([stats.chi_square_p_value(rng.multinomial(n, shifted), law)[0] < level for _ in range(1000)])
    assert 0.74 < caught < 0.9  # 80% up to the chi-square approximation


def test_single_bin_laws_are_tested_exactly():
    assert stats.detectable_tv(1000, 1, 1e-5) == pytest.approx(1 - 0.2 ** (1 / 1000))
    law = np.array([0.0, 1.0, 0.0])
    assert stats.chi_square_p_value(np.array([0, 50, 0]), law)[0] == 1.0
    assert stats.chi_square_p_value(np.array([1, 49, 0]), law)[0] == 0.0


def test_small_bins_are_pooled_and_a_small_pool_joins_the_smallest_big_bin():
    law = np.array([0.5, 0.3, 0.19, 0.006, 0.004])
    observed, expected = stats.pooled_bins(np.array([50, 30, 19, 1, 0]), law)
    assert expected.tolist() == pytest.approx([50, 30, 20])
    assert observed.tolist() == [50, 30, 20]


def test_the_chi_square_p_value_matches_scipy_without_pooling():
    law = np.array([0.4, 0.35, 0.25])
    counts = np.array([430, 330, 240])
    assert stats.chi_square_p_value(counts, law)[0] == pytest.approx(scipy_stats.chisquare(counts, law * 1000).pvalue)


# ---- exact laws and scenarios ---------------------------------------------------------------------------


def test_drafts_sampled_from_q_commit_the_target_and_accept_sum_min():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    accept, committed = mixed_position_law(np.append(q, 0.0), lambda d: sampled_position_law(p, q, d))
    assert committed == pytest.approx(p)
    assert accept == pytest.approx(np.minimum(p, q).sum())


def test_padding_mass_is_judged_as_no_draft():
    p = np.array([0.5, 0.3, 0.2])
    accept, committed = mixed_position_law(np.array([0.0, 0.6, 0.0, 0.4]), lambda d: argmax_position_law(p, d))
    assert accept == pytest.approx(0.6 * 0.3)
    assert committed == pytest.approx(p)


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_every_scenario_is_well_posed_and_its_laws_are_consistent(name):
    s = MATRIX[name]
    check_well_posed(s)
    laws = s.laws
    assert laws.first_rejection.sum() == pytest.approx(1.0)
    assert laws.committed.sum(-1) == pytest.approx(np.ones(s.positions + 1))
    if s.lossless:  # up to q's float32 rounding in "sampled" mode
        assert laws.committed == pytest.approx(laws.target, abs=1e-7)
    else:
        assert 0.5 * np.abs(laws.committed - laws.target).sum(-1).max() > 0.1  # lossy by design, visibly


def test_a_boundary_scenario_is_refused():
    # p = [.5, .3, .2]: the mass reaches top-p 0.8 exactly at the second token
    edge = replace(
        scenario("edge", "", drafts="agree", vocab=3, positions=1, top_p=0.8),
        logits=np.log([[0.5, 0.3, 0.2]] * 2).astype(np.float32),
    )
    with pytest.raises(ValueError, match="edge: position 0 sits on a top-p/min-p boundary"):
        check_well_posed(edge)
    check_well_posed(replace(edge, top_p=0.85))


def test_the_matrix_covers_the_issue():
    settings = " ".join(s.setting for s in MATRIX.values())
    for needed in ("greedy", "top-k", "top-p", "min-p", "mask", "padding", "relaxed", "bfloat16"):
        assert needed in settings
    assert {s.draft_proposal for s in MATRIX.values()} == {"argmax", "sampled"}
    assert {s.verification for s in MATRIX.values()} == {"token", "block"}
    assert {s.vocab for s in MATRIX.values()} == {12, 4096}
    assert all(s.quick for s in MATRIX.values() if s.name in ("argmax/top-k+top-p", "sampled/disagree"))


# ---- the runner ----------------------------------------------------------------------------------------


def test_our_verifier_passes_a_scenario_of_each_mode():
    for name in ("argmax/mix+mask", "sampled/mix+mask+padding", "argmax/greedy+mask", "block/mix+mask+padding"):
        result = audit_scenario(OURS, MATRIX[name], 4000, seed=3, level=1e-4, device="cpu")
        assert result.verdict == "pass", (name, result.min_p_value)


@pytest.mark.parametrize(
    "wrong, name",
    [
        (recovery_from_full_target, "sampled/disagree"),
        (top_p_before_top_k_renormalisation, "argmax/top-k+top-p"),
        (block_as_token_wise, "block/model"),
    ],
)
def test_each_wrong_verifier_fails_where_its_mistake_matters_and_passes_elsewhere(wrong, name):
    verifier = as_verifier(wrong)
    assert audit_scenario(verifier, MATRIX[name], 4000, seed=3, level=1e-4, device="cpu").verdict == "FAIL"
    unaffected = audit_scenario(verifier, MATRIX["argmax/plain/agree"], 4000, seed=3, level=1e-4, device="cpu")
    assert unaffected.verdict == "pass"


def test_contract_breaks_are_named():
    drafts = np.array([[3, 1], [2, -1]])
    first = np.array([2, 2])  # row 1 accepted its padding
    recovered = np.array([[3, 0], [2, 9]])  # row 0 position 1 was accepted but is not the draft
    bonus = np.array([[12], [0]])  # row 0's committed bonus is out of range
    problems = contract_problems(drafts, first, recovered, bonus, vocab=12)
    assert any("after padding in 1 rows (first: row 1)" in p for p in problems)
    assert any("differs from its draft in 2 rows (first: row 0)" in p for p in problems)
    assert any("outside [0, 12) in 1 rows (first: row 0)" in p for p in problems)
    flat = contract_problems(drafts, first, recovered, bonus[:, 0], 12)
    assert flat == ["bonus_tokens has shape [2], expected [2, 1]"]


def test_a_verifier_that_breaks_the_contract_or_raises_fails():
    def off_by_one(*args, **kwargs):
        first, recovered, bonus = sv.stochastic_acceptance_sampler(*args, **kwargs)
        return first, recovered, bonus + 1

    def raises(*args, **kwargs):
        raise RuntimeError("boom")

    s = MATRIX["argmax/plain/agree"]
    broken = audit_scenario(as_verifier(off_by_one), s, 500, seed=0, level=1e-4, device="cpu")
    assert broken.verdict == "FAIL" and "outside [0, 12)" in broken.problems[0]
    crashed = audit_scenario(as_verifier(raises), s, 500, seed=0, level=1e-4, device="cpu")
    assert crashed.verdict == "raised" and crashed.problems == ("raised RuntimeError: boom",)
    relaxed = audit_scenario(as_verifier(raises), MATRIX["relaxed/top-3"], 500, seed=0, level=1e-4, device="cpu")
    assert relaxed.verdict == "raised"
    audit = run_audit(as_verifier(raises), [s, MATRIX["relaxed/top-3"]], scale=0.01, alpha=1e-3, invariance=None)
    assert audit.failed == [audit.scenarios[0]] and not audit.passed  # a relaxed rule may be unsupported
    assert audit.raised == list(audit.scenarios)


def test_scenarios_needing_an_argument_the_verifier_lacks_are_skipped_and_not_counted():
    def no_min_p(draft_tokens, target_logits, temperature, top_k, max_k, top_p, min_top_p, seed, token_bitmasks=None):
        return sv.stochastic_acceptance_sampler(
            draft_tokens,
            target_logits,
            temperature,
            top_k,
            max_k,
            top_p,
            min_top_p,
            seed,
            token_bitmasks=token_bitmasks,
        )

    scenarios = [MATRIX["argmax/min-p"], MATRIX["argmax/plain/agree"]]
    audit = run_audit(as_verifier(no_min_p), scenarios, scale=0.01, alpha=1e-3, invariance=None)
    assert [r.verdict for r in audit.scenarios] == ["skipped", "pass"]
    assert audit.scenarios[0].problems == ("the verifier takes no min_p",)
    assert audit.tests == MATRIX["argmax/plain/agree"].positions + 2
    assert audit.passed


def test_the_report_is_json_with_every_scenario():
    import json

    scenarios = [MATRIX["argmax/padding"], MATRIX["relaxed/top-3"]]
    audit = run_audit(OURS, scenarios, scale=0.02, alpha=1e-3, invariance={"ks": (2,), "length": 6})
    report = json.loads(json.dumps(report_json(audit), allow_nan=False))
    assert [s["verdict"] for s in report["scenarios"]] == ["pass", "lossy"]
    padding = report["scenarios"][0]
    assert len(padding["positions"]) == 4 and padding["acceptance"]["first_rejection_exact"][3] > 0
    assert report["invariance"]["identical"] and report["passed"]


# ---- invariance and loading ------------------------------------------------------------------------------


def test_drafter_invariance_holds_for_ours_and_not_for_a_wrong_truncation():
    assert check_drafter_invariance(OURS, ks=(2,), length=12).identical
    wrong = check_drafter_invariance(as_verifier(top_p_before_top_k_renormalisation), ks=(2,), length=12)
    assert not wrong.identical and "request 2" in wrong.runs[0].difference


def test_verifiers_load_from_a_module_or_a_file(tmp_path):
    assert load_verifier("specverify:stochastic_acceptance_sampler").function is sv.stochastic_acceptance_sampler
    path = tmp_path / "mine.py"
    path.write_text(
        "import specverify\n"
        "def verify(*args, min_p=None, **kwargs):\n"
        "    return specverify.stochastic_acceptance_sampler(*args, **kwargs)\n"
    )
    loaded = load_verifier(f"{path}:verify")
    assert loaded.name == f"{path}:verify" and "draft_probs_full" in loaded.accepts
    for spec, message in [
        ("nocolon", "must be 'module:function'"),
        ("no_such_module_xyz:f", "cannot be imported"),
        ("specverify:no_such_function", "has no attribute"),
        (f"{tmp_path}/missing.py:f", "does not exist"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_verifier(spec)


def test_outputs_are_read_back_as_cpu_int64_and_must_be_integers():
    int32 = torch.zeros(2, 1, dtype=torch.int32)
    outputs = as_verifier(lambda *args, **kwargs: (int32[:, 0], int32, int32))(*[None] * 8)
    assert all(out.dtype == torch.int64 for out in outputs)
    floats = as_verifier(lambda *args, **kwargs: (int32[:, 0], int32, int32.float()), name="floaty")
    with pytest.raises(TypeError, match="floaty must return integer tensors .got torch.float32 for bonus_tokens."):
        floats(*[None] * 8)


@pytest.mark.parametrize("temperature", [float(np.float32(1e-5)), 1e-5, 9.9e-6, 0.0])
def test_exact_law_draws_the_greedy_line_where_the_library_does(temperature):
    """The library compares float32 temperatures with float32(1e-5): the exact law must agree exactly at the
    boundary (a row at T = 1e-5 keeps its ties, one just below is one-hot)."""
    logits = np.float32([1.0, 1.0, 0.0])
    library = (
        sv.truncated_probs(
            torch.from_numpy(logits)[None], torch.tensor([temperature]), torch.tensor([-1]), torch.tensor([1.0])
        )[0]
        .double()
        .numpy()
    )
    np.testing.assert_allclose(truncated_distribution(logits, temperature), library, atol=1e-6)
