"""The device check (python -m specverify.check, `specverify check`) kept alive.

The device check compares a device against a reference and classifies every differing token. Without CUDA
its logic runs here on the CPU: the compiled kernels against the torch path (the code CUDA runs), a
candidate whose logits are nudged by a few ulps (to make the rounding differences a GPU would make), and
a candidate that is simply wrong (which must be flagged). The CUDA tests skip cleanly without a device.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest

from specverify.check import parity
from specverify.check.__main__ import main as check_main
from specverify.check.parity import boundary_cases, parity_cases, parity_check
from specverify.check.report import SECTION_WORK, print_report
from specverify.check.targets import Target
from tests.support.backends import HAS_CUDA, native_available
from tests.support.paths import SRC


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device exists: the check runs for real (see the CUDA tests)")
def test_check_of_an_absent_device_fails_in_one_line_naming_it():
    """--device cuda on a machine without CUDA checks nothing: exit 2, one line naming the flag and the device,
    nothing on stdout (no report that a CI job could read as a pass)."""
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-m", "specverify.check", "--device", "cuda", "--json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("python -m specverify.check: error: --device cuda: no CUDA device on this machine")
    assert result.stderr.count("\n") == 1 and "nothing was checked" in result.stderr


def test_a_check_that_checks_nothing_does_not_pass(capsys, tmp_path):
    """Sections asked for that all skip (none here) or none at all: exit 1, passed false, and the verdict
    says that nothing was checked."""
    report_file = tmp_path / "check.json"
    code = check_main(["--device", "cpu", "--sections", "", "--json", str(report_file)])
    out = capsys.readouterr().out
    report = json.loads(report_file.read_text())
    assert code == 1 and report["passed"] is False and report["checked"] == []
    assert out.strip().splitlines()[-1] == "FAILED: nothing was checked"
    if importlib.util.find_spec("vllm") is None:  # the vllm section skips here
        code = check_main(["--device", "cpu", "--sections", "vllm", "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 1 and report["passed"] is False and "skipped" in report["vllm"]


def test_a_json_file_that_cannot_be_written_is_refused_before_the_check(capsys):
    assert check_main(["--device", "cpu", "--json", "/no-such-folder/check.json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "python -m specverify.check: error: --json /no-such-folder/check.json: its folder /no-such-folder does not "
        "exist; nothing was checked\n"
    )


def test_check_rejects_unknown_sections(capsys):
    with pytest.raises(SystemExit) as exit_:
        check_main(["--device", "cpu", "--sections", "parity,speed"])
    assert exit_.value.code == 2


def test_check_cpu_run_of_every_section(capsys, tmp_path):
    """The whole check on the CPU (reference and candidate both the default CPU path): every section passes."""
    # without the compiled kernels the CPU runs the torch path, whose exactness fails on the known float32
    # histogram bug (see tests/core/test_hardening_numerics.py): then only the other sections are run
    sections = "exactness,statistics,parity" if native_available() else "statistics,parity"
    report_file = tmp_path / "check.json"
    argv = ["--device", "cpu", "--quick", "--rows", "2000", "--sections", sections, "--json", str(report_file)]
    code = check_main(argv)
    output, progress = capsys.readouterr()
    report = json.loads(report_file.read_text())
    assert code == 0, output
    assert report["passed"] and report["parity"]["total"]["mismatches"] == 0
    assert report["statistics"]["tests"] == 40 and report["statistics"]["power_p_value"] < 1e-6
    assert report["checked"] == sections.split(",")
    # a line on stderr as each section starts; the summary last on stdout: a line per section, the verdict
    assert progress.splitlines() == [f"specverify check: {s}: {SECTION_WORK[s]} ..." for s in sections.split(",")]
    lines = output.splitlines()
    summary = lines[lines.index("summary:") + 1 :]
    assert [line.split()[0] for line in summary if line.startswith("  ") and not line.startswith("   ")] == (
        sections.split(",")
    )
    assert summary[-1].startswith(f"PASSED: {sections.replace(',', ', ')} in ")
    assert max(map(len, lines)) <= 80


def test_classifier_explains_rounding_at_cdf_boundaries():
    """Draws placed exactly on a CDF boundary, with the candidate's logits nudged by 2 ulps: tokens differ
    in many rows, and every difference is classified as a rounding boundary."""
    cases = boundary_cases(200, seed=3)
    report = parity_check(Target("cpu"), Target("cpu", perturb_ulps=2), cases=cases)
    by_case = {r["case"]: r for r in report["cases"]}
    for name in ("on-boundary argmax", "on-boundary sampled"):
        assert by_case[name]["mismatches"] >= 10, by_case[name]
        assert by_case[name]["boundary"] == by_case[name]["mismatches"], by_case[name]
    assert report["passed"] and report["total"]["unexplained"] == 0
    assert all(d["measure"] <= 1e-6 for r in report["cases"] for d in r["details"])


def test_classifier_flags_a_wrong_candidate(monkeypatch):
    """A candidate that commits other tokens (here: token + 1) is reported as unexplained, and fails."""
    original = parity.run_verifier

    def wrong(args, target):
        out = original(args, target)
        if target.perturb_ulps == 0 and target.native is False:
            vocab = args["target_logits"].shape[-1]
            return out[0], (out[1] + 1) % vocab, (out[2] + 1) % vocab
        return out

    monkeypatch.setattr(parity, "run_verifier", wrong)
    cases = parity_cases(quick=True, include_flat_256k=False)[:4]
    report = parity_check(Target("cpu"), Target("cpu", native=False), cases=cases)
    assert not report["passed"]
    assert report["total"]["unexplained"] > 0.5 * report["total"]["mismatches"] > 0


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are not available: one CPU path only")
def test_compiled_kernels_and_torch_path_agree_up_to_rounding():
    """The CPU stand-in for CPU vs CUDA: the torch path (what CUDA runs) against the compiled kernels.
    Tokens may differ only on rounding boundaries, which the on-boundary cases provoke on purpose."""
    cases = parity_cases(quick=True, include_flat_256k=False)
    report = parity_check(Target("cpu"), Target("cpu", native=False), cases=cases)
    assert report["passed"], report["failures"]
    natural = [r for r in report["cases"] if not r["case"].startswith("on-boundary")]
    assert sum(r["mismatches"] for r in natural) == 0, natural


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_check_on_cuda_quick(capsys):
    code = check_main(["--quick"])
    output = capsys.readouterr().out
    assert code == 0, output


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device exists: auto picks it")
def test_specverify_check_runs_on_the_device_at_hand(capsys):
    """`specverify check` without --device on a machine without CUDA: the CPU's default backend against its
    torch reference path, parity and a timing beside one amax read, exit 0."""
    from specverify import cli

    code = cli.main(["check", "--quick", "--sections", "parity,timing", "--json"])
    output = capsys.readouterr().out
    report = json.loads(output)
    assert code == 0, output
    assert report["candidate"] == "cpu" and report["reference"] == "cpu (torch path)"
    assert report["parity"]["total"]["unexplained"] == 0
    cases = report["timing"]["cases"]
    assert cases["read floor (amax)"]["x_read_floor"] == 1.0
    assert {"argmax, validate=False", "sampled, validate=False", "all greedy, validate=False"} <= set(cases)
    code = cli.main(["check", "--quick", "--sections", "timing"])
    output = capsys.readouterr().out
    assert code == 0 and "\n  timing      DONE  argmax " in output
    assert "x one torch.amax read" in " ".join(output.split())  # the table's heading, wrapped at 80 columns


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install -e '.[test]')")
def test_the_timing_section_can_meter_the_triton_kernels_traffic():
    """On a GPU the timing section prints each case's passes over the logits, metered in a child process
    under Triton's interpreter (timing.interpreted_passes): run here, it meters the same kernels."""
    from specverify.bench.cases import Mode
    from specverify.check.timing import interpreted_passes

    passes = interpreted_passes((Mode.ARGMAX, Mode.GREEDY))
    assert set(passes) == {
        "argmax, validate=False",
        "argmax, validate=True",
        "all greedy, validate=False",
        "all greedy, validate=True",
    }, passes
    assert 0.99 <= passes["all greedy, validate=False"] <= 1.05, passes  # one read (tests/kernels/test_traffic.py)
    # the bench's mixed rows: a third greedy (1 pass), a third top-k + top-p (2), a third top-p 0.95 alone
    # (the counted fallback, about 17 here)
    assert 2.0 <= passes["argmax, validate=False"] <= 8.0, passes
    for mode in ("argmax", "all greedy"):  # validating reads the logits once more (the value scan)
        assert 0.95 <= passes[f"{mode}, validate=True"] - passes[f"{mode}, validate=False"] <= 1.05, passes


def test_the_report_fits_80_columns_with_the_gpu_s_traffic_column(capsys):
    """On a GPU the timing table gains each case's passes over the logits (metered under Triton's interpreter):
    the report still fits 80 columns."""
    code = check_main(["--device", "cpu", "--quick", "--sections", "timing", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    for case in report["timing"]["cases"].values():
        case["passes"] = 17.25
    report["timing"]["traffic_shape"] = {"B": 2, "K": 4, "V": 16384}
    out = io.StringIO()
    print_report(report, out)
    lines = out.getvalue().splitlines()
    assert any(line.endswith("17.25 passes") for line in lines) and max(map(len, lines)) <= 80, lines
