"""`specverify audit` end to end (through `python -m specverify.audit`'s main): the quick audit passes our
verifier, flags each deliberately wrong one where its mistake matters and nowhere else, and writes its
JSON report and figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from specverify.audit import add_audit_arguments, run_audit_command
from specverify.audit.__main__ import main

WRONG = str(Path(__file__).with_name("wrong_verifiers.py"))


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
def test_the_quick_audit_flags_recovery_from_the_full_target(tmp_path):
    code, report = _quick_audit(tmp_path, "--verifier", f"{WRONG}:recovery_from_full_target")
    assert code == 1 and not report["passed"]
    sampled = {s["name"] for s in report["scenarios"] if s["draft_proposal"] == "sampled"}
    assert {"sampled/close", "sampled/disagree"} <= _failed(report) <= sampled  # only "sampled" recovers
    assert report["invariance"]["identical"]  # "argmax" decoding is untouched by the mistake


@pytest.mark.slow
def test_the_quick_audit_flags_top_p_before_top_k_renormalisation(tmp_path):
    code, report = _quick_audit(tmp_path, "--verifier", f"{WRONG}:top_p_before_top_k_renormalisation")
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
        (["--scale", "0"], "--scale must be > 0 (got 0.0)"),
        (["--alpha", "1.5"], "--alpha must be in (0, 1) (got 1.5)"),
        (["--verifier", "nocolon"], "--verifier: verifier must be 'module:function'"),
        (["--device", "nonsense"], "--device 'nonsense' is not usable here"),
        (["--quick", "--only", "relaxed/llm"], "--only 'relaxed/llm' matches no scenario of --quick"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(options, message, capsys):
    assert main(options) == 2
    assert f"specverify audit: error: {message}" in capsys.readouterr().err
