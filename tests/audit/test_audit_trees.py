"""The audit on trees (SPEC §8): its exact tree laws are right, it passes our tree verifier, catches a
wrong one where the mistake matters and only there, names contract breaks, and tells a tree verifier
from a chain one."""

from __future__ import annotations

import json

import numpy as np
import pytest

import specverify as sv
from specverify.audit.__main__ import main
from specverify.audit.runner import audit_scenario, run_audit
from specverify.audit.scenarios import scenario_matrix
from specverify.audit.trees import audited_verifiers, tree_contract_problems, tree_scenario, tree_scenario_matrix
from specverify.audit.verifier import DEFAULT_VERIFIER, as_verifier, load_verifier
from tests.support.paths import WRONG_VERIFIERS
from tests.support.wrong_verifiers import recovery_from_full_target, tree_recovery_from_full_target

TREES = {s.name: s for s in tree_scenario_matrix()}
OURS = as_verifier(sv.tree_acceptance_sampler)
WRONG = str(WRONG_VERIFIERS)


@pytest.mark.parametrize("name", list(TREES))
def test_every_tree_scenario_has_consistent_exact_laws(name):
    scenario = TREES[name]
    laws = scenario.laws
    nodes = scenario.positions
    assert laws.target.shape == laws.committed.shape == (nodes + 1, scenario.vocab)
    assert np.allclose(laws.committed, laws.target, atol=1e-12)  # lossless: p~ at every index
    assert laws.first_rejection.shape == (nodes + 1,) and laws.first_rejection.sum() == pytest.approx(1, abs=1e-12)
    reached = laws.first_rejection[::-1].cumsum()[::-1]
    assert np.allclose(np.append(reached[1:], 0)[:-1], reached[:-1] * laws.accept, atol=1e-12)


def test_the_path_length_law_by_hand():
    # root -> one child drawn from q; argmax: descend with probability sum_v q(v) p~(v)
    scenario = tree_scenario("hand", "one node", groups=((-1, 1),), vocab=5, rows=100)
    accept = float((scenario.draft_law[0] * scenario.target(0)).sum())
    assert scenario.laws.first_rejection == pytest.approx([1 - accept, accept])


def test_drafts_follow_the_sibling_scheme():
    scenario = TREES["tree/sampled/without-replacement"]
    drafts = scenario.draw(20_000, np.random.default_rng(0))
    root = drafts[:, :3]
    assert all(len(set(row)) == 3 for row in root[:200].tolist())  # no repeated sibling token
    q = scenario.draft_law[0]
    assert np.bincount(root[:, 0], minlength=len(q)) / len(root) == pytest.approx(q, abs=0.015)
    iid = TREES["tree/sampled/with-replacement"].draw(5_000, np.random.default_rng(1))[:, :3]
    assert any(len(set(row)) < 3 for row in iid.tolist())


def test_our_tree_verifier_passes_a_scenario_of_each_mode():
    for name in ("tree/argmax/mix+mask", "tree/sampled/without-replacement", "tree/argmax/greedy"):
        result = audit_scenario(OURS, TREES[name], 6000, seed=3, level=1e-4, device="cpu")
        assert result.verdict == "pass", (name, result.min_p_value, result.problems)


def test_a_wrong_tree_verifier_fails_where_its_mistake_matters_and_passes_elsewhere():
    wrong = as_verifier(tree_recovery_from_full_target)
    assert wrong.tree
    assert (
        audit_scenario(wrong, TREES["tree/sampled/with-replacement"], 6000, seed=3, level=1e-4, device="cpu").verdict
        == "FAIL"
    )
    assert audit_scenario(wrong, TREES["tree/argmax/plain"], 6000, seed=3, level=1e-4, device="cpu").verdict == "pass"


def test_a_tree_verifier_that_raises_is_reported_as_raised_with_its_exception():
    def raises(draft_tokens, parents, target_logits, temperature, top_k, top_p, seed, **kwargs):
        raise RuntimeError("boom")

    result = audit_scenario(as_verifier(raises), TREES["tree/argmax/plain"], 500, seed=0, level=1e-4, device="cpu")
    assert result.verdict == "raised" and result.problems == ("raised RuntimeError: boom",)


def test_tree_contract_breaks_are_named():
    drafts = np.array([[4, 5, 6], [4, 5, 6]])
    parents = np.array([-1, -1, 0])
    ok = tree_contract_problems(
        drafts, parents, np.array([[0, 2, -1], [1, -1, -1]]), np.array([2, 1]), np.array([3, 3]), 8
    )
    assert ok == []
    path = np.array([[2, -1, -1], [1, -1, -1], [0, -1, 5], [0, 2, -1]])
    problems = tree_contract_problems(
        np.tile(drafts[:1], (4, 1)), parents, path, np.array([1, 1, 1, 5]), np.array([3, 9, 3, 3]), 8
    )
    assert problems == [
        "path_length outside [0, 3] in 1 rows (first: row 3)",
        "path not -1 after path_length in 1 rows (first: row 2)",
        "a path that is not a walk down the tree in 2 rows (first: row 0)",  # node 2 hangs from node 0; row 3
        "next_token outside [0, 8) in 1 rows (first: row 1)",
    ]


def test_a_tree_verifier_is_told_from_a_chain_verifier():
    assert as_verifier(sv.tree_acceptance_sampler).tree and not as_verifier(sv.stochastic_acceptance_sampler).tree
    assert not as_verifier(recovery_from_full_target).tree
    assert load_verifier(f"{WRONG}:tree_recovery_from_full_target").tree
    forced = as_verifier(lambda *args, **kwargs: sv.tree_acceptance_sampler(*args, **kwargs), tree=True)
    assert forced.tree and "sibling_draws" in forced.accepts
    # the default audits both of specverify's verifiers, each on its own scenarios
    chain, tree, matrix = audited_verifiers(DEFAULT_VERIFIER, tree=False)
    assert not chain.tree and tree.tree and len(matrix) == len(scenario_matrix()) + len(TREES)
    alone, none, trees = audited_verifiers(DEFAULT_VERIFIER, tree=True)
    assert alone.tree and none is None and trees[0].name.startswith("tree/")
    user, none, chains = audited_verifiers(f"{WRONG}:recovery_from_full_target", tree=False)
    assert not user.tree and {s.name for s in chains} == {s.name for s in scenario_matrix()}


def test_a_mixed_audit_names_both_verifiers_and_counts_every_test():
    chain, tree, _ = audited_verifiers(DEFAULT_VERIFIER, tree=False)
    scenarios = [s for s in scenario_matrix() if s.name == "argmax/padding"] + [TREES["tree/argmax/plain"]]
    audit = run_audit(chain, scenarios, scale=0.05, alpha=1e-3, tree_verifier=tree)
    assert (
        audit.passed
        and audit.verifier == "specverify:stochastic_acceptance_sampler and specverify:tree_acceptance_sampler"
    )
    assert audit.tests == (3 + 2) + (8 + 2)


def test_the_command_audits_a_tree_verifier(tmp_path):
    report = tmp_path / "trees.json"
    assert main(["--tree", "--only", "tree/argmax/plain", "--scale", "0.1", "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["verifier"] == "specverify:tree_acceptance_sampler" and result["invariance"] is None
    assert [s["name"] for s in result["scenarios"]] == ["tree/argmax/plain"] and result["passed"]
    code = main(
        [
            "--verifier",
            f"{WRONG}:tree_recovery_from_full_target",
            "--only",
            "tree/sampled/with",
            "--scale",
            "0.2",
            "--json",
            str(report),
        ]
    )
    assert code == 1 and json.loads(report.read_text())["scenarios"][0]["verdict"] == "FAIL"


def test_a_tree_that_runs_out_of_distinct_siblings_is_refused():
    with pytest.raises(ValueError, match="index 0 cannot draw 3 distinct siblings"):
        tree_scenario("few", "q on two tokens", q="outside", proposal="sampled", draws="without_replacement")
