"""Run a verifier on every scenario and judge what it commits against the exact laws.

Per scenario: one batched call of N rows (scenario.observe), each row with its own seed and its own draft
drawn from the scenario's draft law; then, at every position j = 0..K, the tokens committed at j by the rows that reached
j are fitted to the exact committed law, and the first-rejection index of every row to its exact law
(stats.fit: TV distance, chi-square p-value, detectable TV).

**Verdict.** A lossless scenario passes when its outputs keep the contract of SPEC §1 (shapes, ids in
[0, V), accepted tokens equal to the drafts, nothing accepted past a padding) and every one of its K + 2
chi-square p-values is at least alpha / m, where m counts the K + 2 tests of every lossless scenario
audited (Bonferroni): a correct verifier fails the whole audit with probability at most alpha. Relaxed
scenarios are lossy by design: their divergence from p~ is measured and reported, never failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .calls import Observation
from .invariance import InvarianceResult, check_drafter_invariance
from .scenarios import Laws, Scenario
from .stats import Fit, fit, total_variation
from .verifier import Verifier

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class PositionResult:
    """Position j: the committed tokens of the rows that reached it against the exact law, and their
    divergence from p~ (measured; exact_divergence is 0 for lossless scenarios). counts: int64 [V]."""

    position: int
    fit: Fit
    counts: np.ndarray
    divergence: float
    exact_divergence: float


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario judged. verdict: 'pass' or 'FAIL' (lossless; any scenario whose outputs break the
    contract FAILs), 'lossy' (relaxed), 'skipped' (the verifier lacks an argument the scenario needs) or
    'raised' (the verifier raised; problems holds the exception; a failure on a lossless scenario, not on
    a relaxed one, which a verifier may not support)."""

    scenario: Scenario
    rows: int
    verdict: str
    problems: tuple[str, ...] = ()
    positions: tuple[PositionResult, ...] = ()
    acceptance: Fit | None = None
    first_counts: np.ndarray | None = None  # int64 [K+1]
    seconds: float = 0.0

    @property
    def laws(self) -> Laws:
        return self.scenario.laws

    @property
    def worst(self) -> PositionResult | None:
        """The position with the smallest p-value (the strongest evidence against the verifier)."""
        return min(self.positions, key=lambda p: p.fit.p_value) if self.positions else None

    @property
    def min_p_value(self) -> float:
        return min([p.fit.p_value for p in self.positions] + [self.acceptance.p_value]) if self.positions else 1.0

    @property
    def detectable_tvs(self) -> list[float]:
        """The detectable TV of each test: every position, then the acceptance law."""
        return [p.fit.detectable_tv for p in self.positions] + [self.acceptance.detectable_tv]

    @property
    def accepted_per_row(self) -> tuple[float, float]:
        """(observed, exact) mean number of accepted drafts per row."""
        K = self.scenario.positions
        observed = float((np.arange(K + 1) * self.first_counts).sum() / self.rows)
        return observed, float((np.arange(K + 1) * self.laws.first_rejection).sum())

    def acceptance_by_position(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(observed rate, exact rate, rows that reached j) of P(draft j accepted | j reached), each [K]."""
        K = self.scenario.positions
        reached = self.first_counts[::-1].cumsum()[::-1][:K]  # rows with first >= j
        passed = np.append(reached[1:], self.first_counts[K])  # rows with first >= j + 1
        rate = np.divide(passed, reached, out=np.full(K, np.nan), where=reached > 0)
        return rate, self.laws.accept, reached


@dataclass(frozen=True)
class AuditResult:
    verifier: str
    seed: int
    alpha: float
    tests: int  # m: the chi-square tests of every lossless scenario audited
    scenarios: tuple[ScenarioResult, ...]
    invariance: InvarianceResult | None
    seconds: float

    @property
    def level(self) -> float:
        return bonferroni_level(self.alpha, self.tests)

    @property
    def failed(self) -> list[ScenarioResult]:
        return [r for r in self.scenarios if r.verdict == "FAIL" or (r.verdict == "raised" and r.scenario.lossless)]

    @property
    def raised(self) -> list[ScenarioResult]:
        """The scenarios on which the verifier raised."""
        return [r for r in self.scenarios if r.verdict == "raised"]

    @property
    def passed(self) -> bool:
        invariant = self.invariance is None or self.invariance.skipped or self.invariance.identical
        return not self.failed and invariant


def bonferroni_level(alpha: float, tests: int) -> float:
    """Each test's level, alpha / m: the chance that any of m tests of a correct verifier fails is <= alpha."""
    return alpha / max(tests, 1)


# ---- judging -----------------------------------------------------------------------------------------


def judge(scenario: Scenario, observation: Observation, level: float) -> ScenarioResult:
    """Fit every position and the first-rejection index to the exact laws; the verdict of the module
    docstring."""
    rows = len(observation.first)
    if observation.problems:
        return ScenarioResult(scenario, rows, "FAIL", observation.problems, seconds=observation.seconds)
    laws, V, K = scenario.laws, scenario.vocab, scenario.positions
    positions = []
    for j in range(K + 1):
        tokens = observation.committed[:, j]
        counts = np.bincount(tokens[tokens >= 0], minlength=V)
        positions.append(
            PositionResult(
                j,
                fit(counts, laws.committed[j], level),
                counts,
                divergence=total_variation(counts, laws.target[j]),
                exact_divergence=float(0.5 * np.abs(laws.committed[j] - laws.target[j]).sum()),
            )
        )
    first_counts = np.bincount(observation.first, minlength=K + 1)
    acceptance = fit(first_counts, laws.first_rejection, level)
    result = ScenarioResult(
        scenario, rows, "lossy", (), tuple(positions), acceptance, first_counts, observation.seconds
    )
    if not scenario.lossless:
        return result
    return replace(result, verdict="pass" if result.min_p_value >= level else "FAIL")


def lacking_arguments(verifier: Verifier, scenario: Scenario) -> list[str]:
    """The optional arguments a scenario (chain or tree) passes that the verifier does not take."""
    probe = np.zeros((1, scenario.positions), dtype=np.int64)
    return verifier.lacks(scenario.arguments(probe, np.zeros(1, dtype=np.int64), "cpu")[1])


def audit_scenario(
    verifier: Verifier, scenario: Scenario, rows: int, seed: int, level: float, device: str
) -> ScenarioResult:
    """observe + judge, turning a missing argument into 'skipped' and an exception into a verdict."""
    lacking = lacking_arguments(verifier, scenario)
    if lacking:
        return ScenarioResult(scenario, rows, "skipped", (f"the verifier takes no {', '.join(lacking)}",))
    try:
        observation = scenario.observe(verifier, rows, seed, device)
    except Exception as err:  # a verifier under audit may raise anything; the report says what
        return ScenarioResult(scenario, rows, "raised", (f"raised {type(err).__name__}: {err}",))
    return judge(scenario, observation, level)


def scaled_rows(scenario: Scenario, scale: float) -> int:
    """The rows a scenario runs with: its default count times `scale` (at least 100)."""
    return max(100, int(round(scenario.rows * scale)))


def run_audit(
    verifier: Verifier,
    scenarios: list[Scenario],
    *,
    scale: float = 1.0,
    alpha: float,
    seed: int = 0,
    device: str = "cpu",
    invariance: dict | None = None,
    progress: Progress | None = None,
    tree_verifier: Verifier | None = None,
) -> AuditResult:
    """Audit `verifier` on `scenarios` (rows scaled by `scale`) so that a correct verifier fails with
    probability at most `alpha`, then, unless `invariance` is None, run
    check_drafter_invariance(verifier, **invariance). Tree scenarios (trees.py) are audited with
    `tree_verifier` when given, else with `verifier`. progress(done, total, label) is called before each
    step and once at the end."""
    start = time.perf_counter()

    def pick(scenario):
        return tree_verifier if tree_verifier is not None and scenario.tree else verifier

    tests = sum(s.positions + 2 for s in scenarios if s.lossless and not lacking_arguments(pick(s), s))
    level = bonferroni_level(alpha, tests)
    steps = len(scenarios) + (invariance is not None)
    results = []
    for done, scenario in enumerate(scenarios):
        if progress:
            progress(done, steps, scenario.name)
        results.append(audit_scenario(pick(scenario), scenario, scaled_rows(scenario, scale), seed, level, device))
    checked = None
    if invariance is not None:
        if progress:
            progress(len(scenarios), steps, "drafter invariance")
        checked = check_drafter_invariance(verifier, **invariance)
    if progress:
        progress(steps, steps, "done")
    names = dict.fromkeys(pick(scenario).name for scenario in scenarios) or {verifier.name: None}
    return AuditResult(" and ".join(names), seed, alpha, tests, tuple(results), checked, time.perf_counter() - start)
