"""PNG figures of an audit (matplotlib's object API; nothing global is touched).

- committed_<scenario>.png: per position, the exact committed law (bars) and the observed frequencies
  (dots, ±2 standard errors); relaxed scenarios also show p~ (crosses), what they diverge from;
- acceptance.png: per scenario, P(draft j accepted | j reached), observed (95% interval) vs exact;
- relaxed_divergence.png: per relaxed scenario and position, TV from p~, measured vs exact.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .runner import AuditResult, ScenarioResult

#: Above this vocabulary a panel shows the most likely tokens and one bar for the rest.
SHOWN_TOKENS = 24
EXACT_COLOR, OBSERVED_COLOR, TARGET_COLOR = "#c8c8c8", "#1f77b4", "#d62728"


def file_stem(name: str) -> str:
    """A scenario name as a file name: 'argmax/top-k' -> 'argmax_top-k'."""
    return name.replace("/", "_").replace("+", "-")


def _shown(law: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The token ids a panel shows (all, or the most likely ones) and their labels (+ 'rest')."""
    if len(law) <= SHOWN_TOKENS:
        ids = np.arange(len(law))
        return ids, [str(i) for i in ids]
    ids = np.argsort(-law, kind="stable")[: SHOWN_TOKENS - 1]
    return ids, [str(i) for i in ids] + ["rest"]


def _with_rest(values: np.ndarray, ids: np.ndarray, total: float) -> np.ndarray:
    shown = values[ids]
    return shown if len(ids) == len(values) else np.append(shown, total - shown.sum())


def plot_committed(result: ScenarioResult, path: Path) -> None:
    """One panel per position: exact committed law vs observed frequencies."""
    laws, positions = result.laws, result.positions
    fig = Figure(figsize=(3.4 * len(positions), 3.3), layout="constrained")
    for ax, position in zip(fig.subplots(1, len(positions), squeeze=False)[0], positions):
        j, n = position.position, position.fit.n
        ids, labels = _shown(laws.committed[j])
        exact = _with_rest(laws.committed[j], ids, 1.0)
        observed = _with_rest(position.counts / max(n, 1), ids, 1.0 if n else 0.0)
        x = np.arange(len(labels))
        ax.bar(x, exact, color=EXACT_COLOR, label="exact")
        spread = np.sqrt(np.clip(exact * (1 - exact), 0, None) / max(n, 1))
        ax.errorbar(x, observed, yerr=2 * spread, fmt="o", ms=3, color=OBSERVED_COLOR, label="observed ±2σ")
        if not result.scenario.lossless:
            ax.plot(x, _with_rest(laws.target[j], ids, 1.0), "x", color=TARGET_COLOR, label="p~ (target)")
        ax.set_xticks(x, labels, fontsize=6, rotation=90 if len(labels) > 12 else 0)
        if result.scenario.lossless:
            detail = f"TV {position.fit.tv:.4f} (exact samples {position.fit.null_tv:.4f})"
        else:
            detail = f"TV from p~ {position.divergence:.3f} (exact {position.exact_divergence:.3f})"
        ax.set_title(f"position {j}: n={n:,}\n{detail}", fontsize=8)
    fig.axes[0].legend(fontsize=7)
    s = result.scenario
    fig.suptitle(f"{s.name} ({s.setting}): committed vs exact, {result.verdict}", fontsize=10)
    fig.savefig(path, dpi=110)


def plot_acceptance(results: list[ScenarioResult], path: Path) -> None:
    """Small multiples: acceptance rate per position, observed with a 95% interval vs exact."""
    columns = 4
    rows = math.ceil(len(results) / columns)
    fig = Figure(figsize=(3.2 * columns, 2.6 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, result in zip(axes, results):
        rate, exact, reached = result.acceptance_by_position()
        j = np.arange(len(rate))
        error = 1.96 * np.sqrt(exact * (1 - exact) / np.maximum(reached, 1))
        ax.plot(j, exact, "s", mfc="none", color="gray", label="exact")
        ax.errorbar(j, rate, yerr=error, fmt="o", ms=3, color=OBSERVED_COLOR, label="observed (95%)")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xticks(j)
        ax.set_title(f"{result.scenario.name} ({result.verdict})", fontsize=8)
    for ax in axes[len(results) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.supxlabel("position j")
    fig.supylabel("P(draft j accepted | j reached)")
    fig.savefig(path, dpi=110)


def plot_relaxed_divergence(results: list[ScenarioResult], path: Path) -> None:
    """Grouped bars: TV of what relaxed rows commit from p~, exact and measured, per position."""
    fig = Figure(figsize=(3.4 * len(results), 3.0), layout="constrained")
    for ax, result in zip(fig.subplots(1, len(results), squeeze=False)[0], results):
        j = np.array([p.position for p in result.positions])
        ax.bar(j - 0.2, [p.exact_divergence for p in result.positions], 0.4, color=EXACT_COLOR, label="exact")
        ax.bar(j + 0.2, [p.divergence for p in result.positions], 0.4, color=OBSERVED_COLOR, label="measured")
        ax.set_xticks(j)
        ax.set_title(f"{result.scenario.name}\n{result.scenario.setting}", fontsize=8)
    fig.axes[0].legend(fontsize=7)
    fig.supxlabel("position j (K = bonus)")
    fig.supylabel("TV from p~")
    fig.savefig(path, dpi=110)


def write_plots(audit: AuditResult, directory: Path) -> list[Path]:
    """Every figure of the module docstring, for the scenarios that were run; returns the files."""
    directory.mkdir(parents=True, exist_ok=True)
    judged = [r for r in audit.scenarios if r.positions]
    written = []
    for result in judged:
        written.append(directory / f"committed_{file_stem(result.scenario.name)}.png")
        plot_committed(result, written[-1])
    if judged:
        written.append(directory / "acceptance.png")
        plot_acceptance(judged, written[-1])
    relaxed = [r for r in judged if not r.scenario.lossless]
    if relaxed:
        written.append(directory / "relaxed_divergence.png")
        plot_relaxed_divergence(relaxed, written[-1])
    return written
