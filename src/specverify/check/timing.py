"""The timing section of the device check: what a verifier call costs on the candidate.

Side by side with one read of the same logits (`torch.amax`, the floor of a memory-bound call) and `torch.softmax`, timed by
`specverify.bench` (min and median over repeats)."""

from __future__ import annotations

import torch

from ..bench import run_benchmark
from .targets import Target, running_on

#: (B, K, V) of the timed call: a quick shape, and a serving batch on a 128k vocabulary.
QUICK_SHAPE, FULL_SHAPE = (8, 4, 32768), (32, 4, 128256)
#: The verifier cases timed (`specverify bench --modes`).
MODES = ["argmax", "sampled", "greedy"]


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
        name: {key: round(case[key], 4) for key in ("min_ms", "median_ms", "x_read_floor")}
        for name, case in results["cases"].items()
    }
    return {
        "passed": True,
        "shape": {"B": batch, "K": positions, "V": vocab},
        "backend": results["config"]["kernels"],
        "cases": cases,
    }
