"""Memory traffic of a verifier call on the Triton backend, in passes over the logits (bytes loaded / bytes of
the logits), counted under Triton's interpreter for the cases of issue 24, float32 and bfloat16.

Each case is one `stochastic_acceptance_sampler` call with validate=False on `specverify.bench.make_batch`
logits (a few heavy head tokens over a Gaussian tail; "flat": the tail alone, scaled down), every row
with the case's parameters, at each B of --batches (K = --drafts, V = --vocab). The counting is
kernels/triton/traffic.py's: bytes of every load and store whose mask is on, per kernel and per pointer
argument (draft-probability reads included in "passes"). Also per case: what a GPU would launch (torch
ops that are not views or allocations, and Triton kernels). The table shows passes per dtype and B; the
last line printed is one JSON object.

    python benchmarks/bench_traffic.py                 # V = 32768, B = 2 and 4, K = 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the kernels run interpreted
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cases.py, also where this file is loaded by path

import torch
from cases import CASES, Case, logits_for

import specverify as sv
from specverify import kernels
from specverify.kernels.triton.traffic import Traffic, metered

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def meter(arguments: dict) -> Traffic:
    """The traffic of one verifier call on the Triton backend (the backend loaded beforehand)."""
    with kernels.forced("triton"):
        kernels.backend_for(arguments["target_logits"])
        with metered() as traffic:
            sv.stochastic_acceptance_sampler(**arguments)
    return traffic


def measure(case: Case, batch: int, positions: int, vocab: int, dtype: torch.dtype) -> dict:
    """One case at one size: passes (all loads, then the logits' alone), stores and launches."""
    arguments = logits_for(case, batch, positions, vocab, dtype)
    logits = arguments["target_logits"]
    traffic = meter(arguments)
    logits_bytes = logits.numel() * logits.element_size()
    return {
        "passes": traffic.passes(logits),
        "logits_passes": traffic.passes(logits, argument="logits.data"),
        "stored_x_logits": traffic.stored() / logits_bytes,
        "gpu_launches": traffic.gpu_launches(),
        "kernels": traffic.per_kernel(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", "-V", type=int, default=32768)
    parser.add_argument("--batches", default="2,4", help="comma-separated B values (default 2,4)")
    parser.add_argument("--drafts", "-K", type=int, default=4)
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="among float32, bfloat16 (default both)")
    parser.add_argument("--cases", default=None, help="comma-separated case numbers from 1 (default all)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    names = list(CASES)
    if args.cases:
        names = [names[int(i) - 1] for i in args.cases.split(",")]
    results: dict = {"config": {"V": args.vocab, "K": args.drafts, "B": batches, "dtypes": dtypes}, "cases": {}}
    for name in names:
        entry = results["cases"][name] = {}
        for dtype in dtypes:
            entry[dtype] = {str(b): measure(CASES[name], b, args.drafts, args.vocab, DTYPES[dtype]) for b in batches}
            entry[dtype]["mean_passes"] = statistics.mean(entry[dtype][str(b)]["passes"] for b in batches)

    print(f"passes over the logits (bytes loaded / bytes of logits), validate=False, V={args.vocab}, K={args.drafts}")
    columns = [f"{d} B={b}" for d in dtypes for b in batches] + [f"{d} mean" for d in dtypes]
    print(f"{'case':58s}" + "".join(f"{c:>16s}" for c in columns) + "  launches")
    for name, entry in results["cases"].items():
        cells = [entry[d][str(b)]["passes"] for d in dtypes for b in batches] + [
            entry[d]["mean_passes"] for d in dtypes
        ]
        launches = entry[dtypes[0]][str(batches[0])]["gpu_launches"]
        print(f"{name:58s}" + "".join(f"{c:16.2f}" for c in cells) + f"  {len(launches)}: {', '.join(launches)}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
