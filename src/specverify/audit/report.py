"""The audit's report: rich tables for the terminal and one JSON object."""

from __future__ import annotations

import math

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from . import runner, stats
from .runner import AuditResult, ScenarioResult

VERDICT_STYLE = {"pass": "green", "FAIL": "bold red", "lossy": "yellow", "skipped": "dim", "raised": "bold magenta"}
#: How much of an exception's message a table cell shows (the full text is listed under the tables).
SHOWN_MESSAGE = 80


def _verdict(verdict: str) -> Text:
    return Text(verdict, style=VERDICT_STYLE[verdict])


def _power(result: ScenarioResult) -> str:
    """'best–worst' detectable TV over the scenario's tests (positions reached rarely see less)."""
    tvs = result.detectable_tvs
    return f"{min(tvs):.2g}–{max(tvs):.2g}"


def _accepted(result: ScenarioResult) -> str:
    observed, exact = result.accepted_per_row
    return f"{observed:.3f} | {exact:.3f}"


#: Below this many columns the tables are compact: the setting under the scenario's name, V and K in one
#: column, and the detail columns (acceptance per row, detectable TV) left to the wide view and the JSON.
WIDE = 140


def _shape(result: ScenarioResult, compact: bool) -> list:
    s = result.scenario
    if compact:
        return [Text.assemble(s.name, "\n", (s.setting, "dim")), f"{s.vocab}×{s.positions}", f"{result.rows:,}"]
    return [s.name, s.setting, str(s.vocab), str(s.positions), f"{result.rows:,}"]


def _unjudged_cells(result: ScenarioResult, columns: int) -> list[str]:
    """The statistics cells of a scenario that was not judged: what the verifier raised, or blanks."""
    cells = [""] * columns
    if result.verdict == "raised":
        message = result.problems[0]
        cells[0] = message if len(message) <= SHOWN_MESSAGE else message[: SHOWN_MESSAGE - 1] + "…"
    return cells


def _shape_columns(table: Table, compact: bool) -> None:
    if compact:
        table.add_column("scenario · setting", overflow="fold")
        table.add_column("V×K", justify="right")
    else:
        table.add_column("scenario")
        table.add_column("setting", style="dim")
        table.add_column("V", justify="right")
        table.add_column("K", justify="right")
    table.add_column("rows", justify="right")


def lossless_table(audit: AuditResult, compact: bool = False) -> Table:
    """One row per lossless scenario: the position with the smallest p-value shows its TV."""
    table = Table(title=f"Lossless scenarios: {audit.verifier}", title_justify="left")
    _shape_columns(table, compact)
    table.add_column("TV (exact samples)", justify="right")
    table.add_column("p min", justify="right")
    if not compact:
        table.add_column("accepted/row obs | exact", justify="right")
        table.add_column("detects TV ≥", justify="right")
    table.add_column("verdict")
    for result in audit.scenarios:
        if not result.scenario.lossless:
            continue
        if not result.positions:
            table.add_row(
                *_shape(result, compact), *_unjudged_cells(result, 2 if compact else 4), _verdict(result.verdict)
            )
            continue
        worst = result.worst.fit
        details = [] if compact else [_accepted(result), _power(result)]
        table.add_row(
            *_shape(result, compact),
            f"{worst.tv:.4f} ({worst.null_tv:.4f})",
            f"{result.min_p_value:.2g}",
            *details,
            _verdict(result.verdict),
        )
    return table


def relaxed_table(audit: AuditResult, compact: bool = False) -> Table | None:
    """One row per relaxed scenario: how far what it commits is from p~ (the position farthest away)."""
    results = [r for r in audit.scenarios if not r.scenario.lossless]
    if not results:
        return None
    table = Table(title="Relaxed scenarios (lossy by design: divergence from p~, not failed)", title_justify="left")
    _shape_columns(table, compact)
    table.add_column("TV from p~ measured | exact", justify="right")
    table.add_column("p vs §3.4 rule", justify="right")
    if not compact:
        table.add_column("accepted/row obs | exact", justify="right")
    table.add_column("verdict")
    for result in results:
        if not result.positions:
            table.add_row(
                *_shape(result, compact), *_unjudged_cells(result, 2 if compact else 3), _verdict(result.verdict)
            )
            continue
        farthest = max(result.positions, key=lambda p: p.exact_divergence)
        table.add_row(
            *_shape(result, compact),
            f"{farthest.divergence:.3f} | {farthest.exact_divergence:.3f}",
            f"{result.min_p_value:.2g}",
            *([] if compact else [_accepted(result)]),
            _verdict(result.verdict),
        )
    return table


def invariance_table(audit: AuditResult) -> Group | Text | None:
    """Drafters × K: accepted/proposed drafts and whether the tokens equal plain sampling's."""
    check = audit.invariance
    if check is None:
        return None
    if check.skipped:
        return Text(f"Drafter invariance skipped: {check.skipped}", style="dim")
    ks = sorted({run.k for run in check.runs})
    title = Text(
        f"Drafter invariance: a toy model, {check.requests} requests × {check.length} tokens, decoded "
        "speculatively (accepted/proposed drafts) and compared with plain sampling",
        style="italic",
    )
    table = Table()
    table.add_column("drafter")
    for k in ks:
        table.add_column(f"K={k}", justify="right")
    for drafter in dict.fromkeys(run.drafter for run in check.runs):
        cells = []
        for k in ks:
            run = next(r for r in check.runs if r.drafter == drafter and r.k == k)
            if run.raised:
                cells.append(Text("raised", style=VERDICT_STYLE["raised"]))
                continue
            mark = Text("identical", style="green") if run.identical else Text("DIFFERS", style="bold red")
            cells.append(Text.assemble(f"{run.accepted}/{run.proposed} ", mark))
        table.add_row(drafter, *cells)
    return Group(title, table)


def problems(audit: AuditResult) -> list[str]:
    """Every problem a scenario or the invariance check reported, one line each."""
    lines = [f"{r.scenario.name}: {p}" for r in audit.scenarios for p in r.problems]
    runs = audit.invariance.runs if audit.invariance else ()
    for what, failing in (("differ", [r for r in runs if r.difference]), ("raised", [r for r in runs if r.raised])):
        if failing:
            first = failing[0]
            lines.append(
                f"drafter invariance: {len(failing)} of {len(runs)} runs {what} "
                f"(first: {first.drafter} drafter, K={first.k}, {first.difference or first.raised})"
            )
    return lines


def summary(audit: AuditResult) -> Text:
    """The one-line verdict."""
    lossless = [r for r in audit.scenarios if r.scenario.lossless and r.verdict in ("pass", "FAIL", "raised")]
    passing = sum(r.verdict == "pass" for r in lossless)
    head = Text("PASS", style="bold green") if audit.passed else Text("FAIL", style="bold red")
    failed = ", ".join(r.scenario.name for r in audit.failed)
    parts = [
        f" · {passing}/{len(lossless)} lossless scenarios pass" + (f" (failed: {failed})" if failed else ""),
        f" · {audit.tests} chi-square tests at family-wise α = {audit.alpha:g}"
        f" (Bonferroni: each p ≥ {audit.level:.2g})",
    ]
    if audit.raised:
        first = audit.raised[0].problems[0].removeprefix("raised ")
        parts.append(f" · the verifier raised in {len(audit.raised)} of {len(audit.scenarios)} scenarios ({first})")
    check = audit.invariance
    if check is not None and not check.skipped:
        verdict = "identical" if check.identical else "raised" if any(r.raised for r in check.runs) else "DIFFERS"
        parts.append(f" · drafter invariance {verdict}")
    skipped = [r.scenario.name for r in audit.scenarios if r.verdict == "skipped"]
    if skipped:
        parts.append(f" · skipped: {', '.join(skipped)}")
    parts.append(f" · {audit.seconds:.0f} s")
    return Text.assemble(head, *parts)


def print_report(audit: AuditResult, console: Console) -> None:
    """The audit's tables, problems and verdict for a person (compact below WIDE columns)."""
    compact = console.width < WIDE
    parts = [lossless_table(audit, compact), relaxed_table(audit, compact), invariance_table(audit)]
    console.print(Group(*[p for p in parts if p is not None]))
    for line in problems(audit):
        console.print(Text(line, style="red"))
    console.print(summary(audit))
    console.print(
        Text(
            "TV: at the position with the smallest p-value, beside its expectation for exact samples. "
            + (
                "A wider terminal (or --json) also shows acceptance per row and the smallest TV each test detects."
                if compact
                else "detects TV ≥: every deviation this large on a test's bins is flagged with probability ≥ 80% "
                "(best–worst over the positions and the acceptance law)."
            ),
            style="dim",
        )
    )


# ---- JSON --------------------------------------------------------------------------------------------


def _number(value: float) -> float | None:
    """JSON has no NaN: a rate of a position never reached is null."""
    value = float(value)
    return None if math.isnan(value) else value


def _fit(fit) -> dict:
    return {
        "n": fit.n,
        "tv": fit.tv,
        "null_tv": fit.null_tv,
        "p_value": fit.p_value,
        "bins": fit.bins,
        "detectable_tv": fit.detectable_tv,
    }


def scenario_json(result: ScenarioResult) -> dict:
    s = result.scenario
    out = {
        "name": s.name,
        "about": s.about,
        "setting": s.setting,
        "draft_proposal": s.draft_proposal,
        "lossless": s.lossless,
        "V": s.vocab,
        "K": s.positions,
        "rows": result.rows,
        "verdict": result.verdict,
        "problems": list(result.problems),
        "seconds": round(result.seconds, 3),
    }
    if not result.positions:
        return out
    rate, exact_rate, reached = result.acceptance_by_position()
    observed, exact = result.accepted_per_row
    out["positions"] = [
        {
            "position": p.position,
            **_fit(p.fit),
            "divergence_from_target": p.divergence,
            "exact_divergence_from_target": p.exact_divergence,
        }
        for p in result.positions
    ]
    out["acceptance"] = {
        **_fit(result.acceptance),
        "first_rejection_observed": (result.first_counts / result.rows).tolist(),
        "first_rejection_exact": result.laws.first_rejection.tolist(),
        "rate_observed": [_number(r) for r in rate],
        "rate_exact": exact_rate.tolist(),
        "reached": reached.tolist(),
        "accepted_per_row": {"observed": observed, "exact": exact},
    }
    return out


def report_json(audit: AuditResult) -> dict:
    """The whole audit as one JSON-ready object."""
    invariance = None
    if audit.invariance is not None:
        check = audit.invariance
        invariance = {
            "identical": check.identical,
            "skipped": check.skipped,
            "requests": check.requests,
            "length": check.length,
            "runs": [vars(run) for run in check.runs],
        }
    return {
        "verifier": audit.verifier,
        "passed": audit.passed,
        "seed": audit.seed,
        "alpha": audit.alpha,
        "tests": audit.tests,
        "level": audit.level,
        "seconds": round(audit.seconds, 3),
        "definitions": {"verdict": runner.__doc__.strip(), "statistics": stats.__doc__.strip()},
        "scenarios": [scenario_json(r) for r in audit.scenarios],
        "invariance": invariance,
        "problems": problems(audit),
    }
