"""The timing section of the device check: what a verifier call costs on the candidate.

Side by side with one read of the same logits (`torch.amax`, the floor of a memory-bound call) and
`torch.softmax`, timed by `specverify.bench.measure` (min and median over repeats). Where the candidate runs the
Triton kernels on a GPU, each case also gets its passes over the logits (bytes loaded / bytes of logits),
metered by `specverify bench --traffic` under Triton's interpreter in a child process on the CPU (a
process that runs Triton on a GPU cannot interpret it), at a small shape: the figure does not depend on B
or V, which the test of the meter pins (tests/kernels/test_traffic.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from .. import kernels
from ..bench.cases import Mode
from ..bench.measure import run_benchmark
from .targets import Target, running_on

#: (B, K, V) of the timed call: a quick shape, and a serving batch on a 128k vocabulary.
QUICK_SHAPE, FULL_SHAPE = (8, 4, 32768), (32, 4, 128256)
#: The verifier cases timed (`specverify bench --modes`).
MODES = (Mode.ARGMAX, Mode.SAMPLED, Mode.GREEDY)
#: (B, K, V) at which the Triton kernels' traffic is metered under the interpreter, and the most seconds it may take.
TRAFFIC_SHAPE, TRAFFIC_TIMEOUT = (2, 4, 16384), 900


def interpreted_passes(modes: tuple[Mode, ...]) -> dict[str, float]:
    """Passes over the logits of each verifier case of `specverify bench --traffic --modes ...` at
    TRAFFIC_SHAPE, run in a child process on the CPU under Triton's interpreter -> {case name: passes}.
    Raises RuntimeError naming the child's last line where it fails."""
    batch, positions, vocab = TRAFFIC_SHAPE
    command = [
        sys.executable,
        "-c",
        "import sys; from specverify.cli import main; sys.exit(main(sys.argv[1:]))",
        *("bench", "--device", "cpu", "--traffic", "--repeats", "1", "--modes", ",".join(mode.value for mode in modes)),
        *("--batch", str(batch), "--drafts", str(positions), "--vocab", str(vocab), "--json"),
    ]
    environment = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=TRAFFIC_TIMEOUT)
    if done.returncode != 0 or not done.stdout.strip():
        last = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"the traffic meter failed (exit {done.returncode}): {last[-1] if last else 'no output'}")
    cases = json.loads(done.stdout)["cases"]
    return {name: case["passes"] for name, case in cases.items() if "passes" in case}


def timing_check(candidate: Target, quick: bool) -> dict:
    """Time the verifier on the candidate -> {"passed": True (timing informs, it does not judge), "shape",
    "backend", "cases": {name: {"min_ms", "median_ms", "x_read_floor"}}}."""
    batch, positions, vocab = QUICK_SHAPE if quick else FULL_SHAPE
    with running_on(candidate):
        results = run_benchmark(
            batch,
            positions,
            vocab,
            torch.float32,
            MODES,
            repeats=5 if quick else 11,
            device=torch.device(candidate.device),
        )
    cases = {
        name: {key: round(case[key], 4) for key in ("min_ms", "median_ms", "x_read_floor", "x_softmax")}
        for name, case in results["cases"].items()
    }
    report = {
        "passed": True,
        "shape": {"B": batch, "K": positions, "V": vocab},
        "backend": results["config"]["kernels"],
        "cases": cases,
    }
    if torch.device(candidate.device).type == "cuda" and _backend_name(candidate) == "triton":
        for name, passes in interpreted_passes(MODES).items():
            cases[name]["passes"] = round(passes, 3)
        report["traffic_shape"] = dict(zip(("B", "K", "V"), TRAFFIC_SHAPE))
    return report


def _backend_name(candidate: Target) -> str:
    """The backend that runs the verifier on the candidate's device."""
    with running_on(candidate):
        return kernels.backend_for(torch.empty(0, device=candidate.device)).name
