"""`specverify audit` end to end (through `python -m specverify.audit`'s main): the quick audit passes our
verifier, flags each deliberately wrong one where its mistake matters and nowhere else, and writes its
JSON report and figures."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specverify.audit import add_audit_arguments, run_audit_command
from specverify.audit.__main__ import main
from tests.support.audits import quick_audit_of_wrong


def _quick_audit(tmp_path: Path, *options: str) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    code = main(["--quick", "--json", str(report), *options])
    return code, json.loads(report.read_text())


def _failed(report: dict) -> set[str]:
    return {s["name"] for s in report["scenarios"] if s["verdict"] == "FAIL"}


@pytest.mark.slow
def test_the_quick_audit_passes_our_verifier(tmp_path, capsys):
    code, report = _quick_audit(tmp_path)
    assert code == 0 and report["passed"], report["problems"]
    assert {s["verdict"] for s in report["scenarios"] if s["lossless"]} == {"pass"}
    assert {s["verdict"] for s in report["scenarios"] if not s["lossless"]} == {"lossy"}
    assert report["invariance"]["identical"]
    out = capsys.readouterr().out
    assert "PASS" in out and "Lossless scenarios" in out and "Drafter invariance" in out


@pytest.mark.slow
def test_the_quick_audit_flags_recovery_from_the_full_target():
    code, report = quick_audit_of_wrong("recovery_from_full_target")
    assert code == 1 and not report["passed"]
    sampled = {s["name"] for s in report["scenarios"] if s["draft_proposal"] == "sampled"}
    assert {"sampled/close", "sampled/disagree"} <= _failed(report) <= sampled  # only "sampled" recovers
    assert report["invariance"]["identical"]  # "argmax" decoding is untouched by the mistake


@pytest.mark.slow
def test_the_quick_audit_flags_top_p_before_top_k_renormalisation():
    code, report = quick_audit_of_wrong("top_p_before_top_k_renormalisation")
    assert code == 1 and not report["passed"]
    both = {s["name"] for s in report["scenarios"] if "top-k" in s["setting"] and "top-p" in s["setting"]}
    assert {"argmax/top-k+top-p", "argmax/mix+mask", "sampled/disagree"} <= _failed(report) <= both
    assert not report["invariance"]["identical"]


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    code = main(["--only", "relaxed/top-3", "--scale", "0.02", "--no-invariance", "--plots", str(tmp_path)])
    assert code == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"acceptance.png", "relaxed_divergence.png", "committed_relaxed_top-3.png"}
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in tmp_path.iterdir())


def test_the_arguments_plug_into_a_subcommand():
    parser = argparse.ArgumentParser(prog="specverify")
    commands = parser.add_subparsers(dest="command", required=True)
    add_audit_arguments(commands.add_parser("audit", help="prove a verifier lossless"))
    args = parser.parse_args(["audit", "--quick", "--json", "out.json"])
    assert args.run is run_audit_command and args.quick and args.json == Path("out.json")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--scale", "0"], "--scale must be > 0 and finite (got 0.0)"),
        (["--alpha", "1.5"], "--alpha must be in (0, 1) (got 1.5)"),
        (["--verifier", "nocolon"], "--verifier: verifier must be 'module:function'"),
        (["--verifier", "os:path"], "--verifier: verifier 'os:path' is a module, not a function"),
        (
            ["--verifier", "specverify:sample"],
            "--verifier: verifier 'specverify:sample' takes (logits, temperature, top_k, top_p, seed, min_p=None, "
            "token_bitmask=None, *, validate=True) (too many positional arguments), not the eight positional "
            "arguments of stochastic_acceptance_sampler (draft_tokens, target_logits, temperature, top_k, max_k, "
            "top_p, min_top_p, seed)",
        ),
        (
            ["--tree", "--verifier", "specverify:committed_tokens"],
            "--verifier: verifier 'specverify:committed_tokens' takes (first_rejected_idx, recovered_tokens, "
            "bonus_tokens) (too many positional arguments), not the seven positional "
            "arguments of tree_acceptance_sampler (draft_tokens, parents, target_logits, temperature, top_k, top_p, "
            "seed)",
        ),
        (["--plots", "/proc/nope"], "--plots '/proc/nope' cannot be written (No such file or directory"),
        (["--json", "/proc/nope/report.json"], "--json '/proc/nope/report.json' cannot be written"),
        (["--plots", __file__], f"--plots {__file__!r} cannot be written ({__file__} is a file, not a folder)"),
        (["--json", "/"], "--json '/' is a folder: give a file name, e.g. /audit.json"),
        (["--scale", "inf"], "--scale must be > 0 and finite (got inf)"),
        (["--scale", "1e12", "--quick"], "--scale 1e+12 gives argmax/llm 800,000,000,000,000 rows, about"),
        (["--device", "nonsense"], "--device 'nonsense' is not usable here"),
        (["--quick", "--only", "relaxed/llm"], "--only 'relaxed/llm' matches no scenario of --quick"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(options, message, capsys):
    start = time.perf_counter()
    assert main(options) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"specverify audit: error: {message}") and err.count("\n") == 1
    assert out == "" and time.perf_counter() - start < 10  # refused before any scenario ran


def test_a_bad_verifier_is_one_line_from_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "specverify.cli", "audit", "--verifier", "os:path"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("specverify audit: error: --verifier: verifier 'os:path' is a module, not a function")


def test_a_verifier_that_raises_is_reported_with_its_exception_per_scenario(tmp_path, capsys):
    module = tmp_path / "unfinished.py"
    module.write_text(
        "def verify(draft_tokens, target_logits, temperature, top_k, max_k, top_p, min_top_p, seed, **optional):\n"
        "    raise NotImplementedError('sampled drafts are next week')\n"
    )
    report = tmp_path / "report.json"
    only = ["--only", "argmax/plain", "--scale", "0.02", "--json", str(report), "--verifier", f"{module}:verify"]
    assert main(only) == 1
    out = capsys.readouterr().out
    scenarios = json.loads(report.read_text())["scenarios"]
    assert scenarios and all(s["verdict"] == "raised" for s in scenarios)
    message = "raised NotImplementedError: sampled drafts are next week"
    assert all(s["problems"] == [message] for s in scenarios)
    for s in scenarios:
        assert f"{s['name']}: {message}" in out  # listed under the tables, scenario by scenario
    assert f"the verifier raised in {len(scenarios)} of {len(scenarios)} scenarios" in " ".join(out.split())
    assert "drafter invariance raised" in out
