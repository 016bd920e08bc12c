"""The device check's run and report: the chosen sections run into one dict (JSON-ready), then printed
for a person."""

from __future__ import annotations

import sys
import time

import torch

from .exactness import exactness_check
from .parity import parity_check
from .statistics import statistics_check
from .targets import Target
from .timing import timing_check
from .vllm import print_vllm, vllm_section


def print_report(report: dict, out=None) -> None:
    """The report of run_checks for a person: a line per section, the parity cases, every failure (to out,
    default stdout)."""
    out = out or sys.stdout
    print(f"specverify check: candidate {report['candidate']} against reference {report['reference']}", file=out)
    if "exactness" in report:
        e = report["exactness"]
        flat = e["flat_256k"]
        print(
            f"  exactness   {'PASS' if e['passed'] else 'FAIL'}  {e['rows']} rows vs float64 oracle, worst |p - exact| {e['worst_abs_error']:.2e}; "
            f"flat V=256000 top_p {flat['top_p']}: excess {flat['worst_excess']:.2e}, deficit {flat['worst_deficit']:.2e}",
            file=out,
        )
    if "statistics" in report:
        s = report["statistics"]
        if "skipped" in s:
            print(f"  statistics  SKIP  {s['skipped']}", file=out)
        else:
            print(
                f"  statistics  {'PASS' if s['passed'] else 'FAIL'}  {s['tests']} chi-square tests, {s['rows_per_group']} rows/group, "
                f"smallest p {s['smallest_p_value']:.3g}; power: wrong law p {s['power_p_value']:.3g}",
                file=out,
            )
    if "parity" in report:
        p = report["parity"]
        print(
            f"  parity      {'PASS' if p['passed'] else 'FAIL'}  {p['total']['mismatches']} of {p['total']['positions']} positions differ: "
            f"boundary {p['total']['boundary']}, kept-set {p['total']['kept-set']}, kept-set-large {p['total']['kept-set-large']}, "
            f"unexplained {p['total']['unexplained']}; rate on ordinary inputs {p['natural_mismatch_rate']:.2e}, "
            f"on draws placed on a boundary {p['on_boundary_mismatch_rate']:.2e}",
            file=out,
        )
        print(
            f"    {'case':<24} {'positions':>10} {'differ':>7} {'boundary':>9} {'kept-set':>9} {'unexplained':>12}",
            file=out,
        )
        for r in p["cases"]:
            print(
                f"    {r['case']:<24} {r['positions']:>10} {r['mismatches']:>7} {r['boundary']:>9} {r['kept-set'] + r['kept-set-large']:>9} {r['unexplained']:>12}",
                file=out,
            )
            for d in r["details"][:5]:
                what = (
                    "differing mass"
                    if d["kind"].startswith("kept-set")
                    else "relative distance to the nearest boundary"
                )
                print(
                    f"      row {d['row']} position {d['position']}: token {d['reference']} vs {d['candidate']} ({d['kind']}, "
                    f"{what} {d['measure']:.2e})",
                    file=out,
                )
    if "timing" in report:
        t = report["timing"]
        shape = ", ".join(f"{k}={v}" for k, v in t["shape"].items())
        print(
            f"  timing      {shape} float32 on {t['backend']}, median x one torch.amax read, x torch.softmax:", file=out
        )
        if "traffic_shape" in t:
            traffic = ", ".join(f"{k}={v}" for k, v in t["traffic_shape"].items())
            print(f"              passes over the logits metered under Triton's interpreter at {traffic}", file=out)
        for name, case in t["cases"].items():
            passes = f"  {case['passes']:>6.2f} passes" if "passes" in case else ""
            print(
                f"    {name:<32} {case['median_ms']:>9.3f} ms  {case['x_read_floor']:>6.2f}x  {case['x_softmax']:>5.2f}x"
                f"{passes}",
                file=out,
            )
    if "vllm" in report:
        print_vllm(report["vllm"], out)
    for section in ("exactness", "statistics", "parity", "vllm"):
        for failure in report.get(section, {}).get("failures", []):
            print(f"  FAILED {section}: {failure}", file=out)


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
) -> dict:
    """Run the sections named (of exactness, statistics, parity, timing, vllm) on the candidate, parity
    against the reference, the vLLM plug-in where vLLM is installed (on `vllm_model`, default the embedded
    model; vllm_stock: stock vLLM, the section's self-test) -> the report, JSON-ready: each section's results, the seconds taken, whether all passed."""
    report: dict = dict(candidate=str(candidate), reference=str(reference), torch=torch.__version__)
    if candidate.device.startswith("cuda"):
        report["device_name"] = torch.cuda.get_device_name(torch.device(candidate.device))
    started = time.time()
    if "exactness" in sections:
        report["exactness"] = exactness_check(candidate, quick)
    if "statistics" in sections:
        report["statistics"] = statistics_check(candidate, rows_per_group)
    if "parity" in sections:
        report["parity"] = parity_check(reference, candidate, quick, rtol, kept_mass)
    if "timing" in sections:
        report["timing"] = timing_check(candidate, quick)
    if "vllm" in sections:
        report["vllm"] = vllm_section(vllm_model, vllm_stock)
    report["seconds"] = round(time.time() - started, 1)
    report["passed"] = all(report[s]["passed"] for s in sections)
    return report
