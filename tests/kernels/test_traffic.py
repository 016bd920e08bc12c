"""The memory traffic of the Triton backend, pinned: each case of benchmarks/bench_traffic.py stays under its
bound in passes over the logits, so that a kernel change that reads the logits more often fails here.

Measured under Triton's interpreter (kernels/triton/traffic.py) at a small vocabulary (V = 16384: four
interpreted tiles; B = 2, K = 4, validate=False), float32 and bfloat16 logits; a bound is today's figure plus a small margin,
lowered as the kernels improve. Also: what a call would launch on a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[2]
SIZE = dict(batch=2, positions=4, vocab=16384)
#: The most passes each case may take, (float32, bfloat16): today's figure at SIZE plus a margin.
BOUNDS = {
    "argmax, temperature only": (1.3, 1.3),
    "argmax, temperature + top-k 50 + top-p 0.9": (2.15, 2.15),
    "greedy rows": (1.05, 1.05),
    "sampled, temperature + top-k 50 + top-p 0.9": (2.15, 2.15),
    "argmax, temperature + top-k 50 + top-p 0.9 + min-p 0.05": (2.15, 2.15),
    "argmax, temperature + top-p 0.95": (3.0, 3.0),
    "argmax, flat logits, temperature + top-p 0.9": (3.45, 3.45),
    "block, temperature + top-k 50 + top-p 0.9": (2.15, 2.15),
    "sampled, temperature only": (3.15, 4.15),
    "block, temperature only": (2.3, 2.85),
}


def _unavailable() -> str | None:
    """Why the meter cannot run in this process, or None."""
    if importlib.util.find_spec("triton") is None:
        return "needs triton (pip install -e '.[test]')"
    import triton

    if not triton.knobs.runtime.interpret:
        return "needs Triton's interpreter: TRITON_INTERPRET=1 set before triton is imported (not on a CUDA machine)"
    return None


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))


@pytest.fixture(scope="module")
def bench_traffic():
    spec = importlib.util.spec_from_file_location("bench_traffic", ROOT / "benchmarks" / "bench_traffic.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def test_every_case_is_pinned(bench_traffic):
    assert set(BOUNDS) == set(bench_traffic.CASES)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(BOUNDS))
def test_passes_over_the_logits_stay_under_their_bound(bench_traffic, case, dtype):
    measured = bench_traffic.measure(bench_traffic.CASES[case], dtype=bench_traffic.DTYPES[dtype], **SIZE)
    bound = BOUNDS[case][dtype == "bfloat16"]
    assert measured["passes"] <= bound, (case, dtype, measured["passes"], measured["kernels"])
    assert measured["logits_passes"] >= 1.0, measured["kernels"]  # the logits' reads, charged to logits.data
    assert measured["gpu_launches"] == ["full", "triton:verify_kernel"], measured["gpu_launches"]


@pytest.mark.parametrize("truncation", ["temperature + top-k 50 + top-p 0.9", "temperature only"])
def test_block_verification_reads_no_more_than_token_wise(bench_traffic, truncation):
    """SPEC §3.6 in the whole-call kernel reads what token-wise sampled drafts read at most: the residual
    mass of a prefix only where its test needs it, and draws only at tau and the bonus (on candidates for
    the truncated rows: the same 2 passes; rows walked by tiles read less)."""
    token, block = (
        bench_traffic.measure(bench_traffic.CASES[f"{rule}, {truncation}"], dtype=torch.float32, **SIZE)
        for rule in ("sampled", "block")
    )
    assert block["passes"] <= token["passes"], (block["kernels"], token["kernels"])


@pytest.mark.parametrize("seed", [12345, -1, 2**64 - 1])
def test_an_int_seed_makes_no_device_tensor(bench_traffic, seed):
    """An int seed goes to the kernel as arguments: the call still launches one fill and one kernel."""
    arguments = bench_traffic.logits_for(bench_traffic.CASES["argmax, temperature only"], 2, 4, 256, torch.float32)
    arguments["seed"] = seed
    assert bench_traffic.meter(arguments).gpu_launches() == ["full", "triton:verify_kernel"]
