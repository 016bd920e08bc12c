"""The device check's run and report: the chosen sections run into one dict (JSON-ready), then printed
for a person."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Callable

import torch

from .exactness import exactness_check
from .parity import parity_check
from .statistics import statistics_check
from .targets import Target
from .timing import timing_check
from .vllm import print_vllm_details, vllm_section, vllm_summary

#: What each section checks, said as it starts.
SECTION_WORK = {
    "exactness": "truncated_probs against the float64 oracle",
    "statistics": "committed tokens against exact laws, by chi-square",
    "parity": "every token against the same call on the reference",
    "timing": "a verifier call beside one read of the logits",
    "vllm": "vLLM's engine with the plug-in, speculation on and off",
}
#: The width the report is laid out for (a terminal's default); longer lines wrap with an indent.
WIDTH = 80


def say_section(section: str) -> None:
    """The line on stderr that a section has started (the sections take seconds each)."""
    print(f"specverify check: {section}: {SECTION_WORK[section]} ...", file=sys.stderr, flush=True)


def _line(text: str, out, indent: int = 14) -> None:
    """text wrapped at WIDTH columns, its continuation lines indented by `indent`."""
    print(textwrap.fill(text, WIDTH, subsequent_indent=" " * indent, break_on_hyphens=False), file=out)


def print_report(report: dict, out=None) -> None:
    """The report of run_checks for a person (to out, default stdout), laid out for 80 columns: the
    details first (parity's cases, the timing table, vLLM's differing requests), then the summary, a line
    per section and every failure, and last the verdict."""
    out = out or sys.stdout
    _line(f"specverify check: candidate {report['candidate']} against reference {report['reference']}", out, 2)
    if "parity" in report:
        _print_parity_cases(report["parity"], out)
    if "timing" in report:
        _print_timing(report["timing"], out)
    if "vllm" in report:
        print_vllm_details(report["vllm"], out)
    print("summary:", file=out)
    for section in SECTION_WORK:
        if section in report:
            _line(f"  {section:<11} {_summary(section, report[section])}", out)
    for section in SECTION_WORK:
        for failure in report.get(section, {}).get("failures", []):
            _line(f"  FAILED {section}: {failure}", out, 4)
    _line(_verdict(report), out, 2)


def _summary(section: str, result: dict) -> str:
    """A section's summary: its verdict (PASS, FAIL, SKIP or, for timing, which informs, DONE) and what it found."""
    if "skipped" in result:
        return f"SKIP  {result['skipped']}"
    verdict = "PASS" if result["passed"] else "FAIL"
    if section == "exactness":
        flat = result["flat_256k"]
        return (
            f"{verdict}  {result['rows']} rows vs float64 oracle, worst |p - exact| {result['worst_abs_error']:.2e}; "
            f"flat V=256000 top_p {flat['top_p']}: excess {flat['worst_excess']:.2e}, deficit {flat['worst_deficit']:.2e}"
        )
    if section == "statistics":
        return (
            f"{verdict}  {result['tests']} chi-square tests, {result['rows_per_group']} rows/group, smallest p "
            f"{result['smallest_p_value']:.3g}; power: wrong law p {result['power_p_value']:.3g}"
        )
    if section == "parity":
        total = result["total"]
        return (
            f"{verdict}  {total['mismatches']} of {total['positions']} positions differ: boundary {total['boundary']}, "
            f"kept-set {total['kept-set']}, kept-set-large {total['kept-set-large']}, unexplained "
            f"{total['unexplained']}; rate on ordinary inputs {result['natural_mismatch_rate']:.2e}, on draws "
            f"placed on a boundary {result['on_boundary_mismatch_rate']:.2e}"
        )
    if section == "timing":
        cases = result["cases"]
        timed = [f"{mode} {cases[f'{mode}, validate=False']['x_read_floor']:.2f}x" for mode in TIMING_SUMMARY]
        return f"DONE  {', '.join(timed)} the time of one read of the logits (validate=False)"
    return vllm_summary(result)


#: The verifier modes whose cost the timing summary names (the table above it has every case).
TIMING_SUMMARY = ("argmax", "sampled")


def _verdict(report: dict) -> str:
    """The last line: PASSED or FAILED, the sections checked and skipped, the seconds taken (under 80 columns
    with every section named)."""
    checked = report["checked"]
    skipped = [s for s in SECTION_WORK if s in report and s not in checked]
    tail = f" (skipped: {', '.join(skipped)})" if skipped else ""
    if not checked:
        return f"FAILED: nothing was checked{tail}"
    verdict = "PASSED" if report["passed"] else "FAILED"
    return f"{verdict}: {', '.join(checked)}{tail} in {report['seconds']:.0f} s"


def _print_parity_cases(p: dict, out) -> None:
    """Parity's table of cases, with the first differences of each."""
    print("parity:", file=out)
    print(
        f"    {'case':<24} {'positions':>10} {'differ':>7} {'boundary':>9} {'kept-set':>9} {'unexplained':>12}",
        file=out,
    )
    for r in p["cases"]:
        print(
            f"    {r['case']:<24} {r['positions']:>10} {r['mismatches']:>7} {r['boundary']:>9} "
            f"{r['kept-set'] + r['kept-set-large']:>9} {r['unexplained']:>12}",
            file=out,
        )
        for d in r["details"][:5]:
            what = "differing mass" if d["kind"].startswith("kept-set") else "relative distance"
            _line(
                f"      row {d['row']} position {d['position']}: token {d['reference']} vs {d['candidate']} "
                f"({d['kind']}, {what} {d['measure']:.2e})",
                out,
                8,
            )


def _print_timing(t: dict, out) -> None:
    """Timing's table: each case's median, as a multiple of one torch.amax read and of torch.softmax."""
    shape = ", ".join(f"{k}={v}" for k, v in t["shape"].items())
    _line(f"timing: {shape} float32 on {t['backend']}; median, x one torch.amax read, x torch.softmax:", out, 4)
    if "traffic_shape" in t:
        traffic = ", ".join(f"{k}={v}" for k, v in t["traffic_shape"].items())
        _line(f"    passes over the logits metered under Triton's interpreter at {traffic}", out, 4)
    for name, case in t["cases"].items():
        passes = f"  {case['passes']:>6.2f} passes" if "passes" in case else ""
        print(
            f"    {name:<28} {case['median_ms']:>9.3f} ms  {case['x_read_floor']:>6.2f}x  {case['x_softmax']:>5.2f}x"
            f"{passes}",
            file=out,
        )


def run_checks(
    candidate: Target,
    reference: Target,
    quick: bool,
    rows_per_group: int,
    rtol: float,
    kept_mass: float,
    sections: tuple[str, ...],
    vllm_model: str | None = None,
    vllm_stock: bool = False,
    on_section: Callable[[str], None] | None = None,
) -> dict:
    """Run the sections named (of exactness, statistics, parity, timing, vllm) on the candidate, parity
    against the reference, the vLLM plug-in where vLLM is installed (on `vllm_model`, default the embedded
    model; vllm_stock: stock vLLM, the section's self-test); on_section(name) is called as each starts ->
    the report, JSON-ready: each section's results, `checked` (the sections that ran: not skipped), the
    seconds taken, and `passed`: some section ran, and every one that ran passed (nothing checked is no pass)."""
    report: dict = dict(candidate=str(candidate), reference=str(reference), torch=torch.__version__)
    if candidate.device.startswith("cuda"):
        report["device_name"] = torch.cuda.get_device_name(torch.device(candidate.device))
    run = {
        "exactness": lambda: exactness_check(candidate, quick),
        "statistics": lambda: statistics_check(candidate, rows_per_group),
        "parity": lambda: parity_check(reference, candidate, quick, rtol, kept_mass),
        "timing": lambda: timing_check(candidate, quick),
        "vllm": lambda: vllm_section(vllm_model, vllm_stock),
    }
    started = time.time()
    for section in sections:
        if on_section is not None:
            on_section(section)
        report[section] = run[section]()
    report["seconds"] = round(time.time() - started, 1)
    report["checked"] = [s for s in sections if "skipped" not in report[s]]
    report["passed"] = bool(report["checked"]) and all(report[s]["passed"] for s in report["checked"])
    return report
