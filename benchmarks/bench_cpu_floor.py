"""Time of a verifier call on the CPU's compiled kernels beside one read of the logits, for the cases of issue 24.

Each case (benchmarks/cases.py) is one `stochastic_acceptance_sampler` call with validate=False on the
default CPU backend (the C kernels), at each B of --batches (K = --drafts, V = --vocab, float32 logits or
--dtype bfloat16). Beside it, in the same process and interleaved repeat by repeat, `logits.amax(-1)` over
the same tensor: the read floor; and `torch.softmax(logits.float(), -1)`, the floor of a row that needs every
token's weight (temperature only, top-p without top-k: an exp per token). The floor is timed two ways:
interleaved (right after a verifier call and a softmax, whose traffic evicts the logits from the caches)
and back to back (--repeats amax calls in a row); the ratios divide by the faster of the two, the fastest
read of the logits the machine gives. Per case and B: min and median ms of each over --repeats, and the
verifier's ratio to that floor (and to softmax) of the medians and of the mins. The machine may be shared: the ratios, timed side
by side, are what to compare between runs; the load average (os.getloadavg) is printed before and after.
The last line printed is one JSON object.

    python benchmarks/bench_cpu_floor.py                       # B = 32 and 1, K = 4, V = 128256, 2 threads
    python benchmarks/bench_cpu_floor.py --batches 1 --cases 3 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cases.py, also where this file is loaded by path

import torch
from cases import CASES, logits_for

import specverify as sv
from specverify import kernels

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _seconds(call) -> float:
    """Wall time of one call."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(arguments: dict, repeats: int) -> dict:
    """The verifier call, one amax and one softmax over its logits, interleaved: min and median ms, ratios
    to amax and to softmax."""
    logits = arguments["target_logits"]

    def verify() -> None:
        sv.stochastic_acceptance_sampler(**arguments)

    def floor() -> None:
        logits.amax(-1)

    def softmax() -> None:
        torch.softmax(logits.float(), -1)

    for call in (verify, floor, softmax, verify, floor, softmax):  # warm-up: the build, scratch buffers, caches
        call()
    times: dict[str, list[float]] = {"verify": [], "amax": [], "softmax": []}
    for _ in range(repeats):
        times["amax"].append(_seconds(floor))
        times["softmax"].append(_seconds(softmax))
        times["verify"].append(_seconds(verify))
    times["amax_alone"] = [_seconds(floor) for _ in range(repeats)]  # back to back: the logits stay warm
    result = {}
    for name, values in times.items():
        result[f"{name}_min_ms"] = min(values) * 1e3
        result[f"{name}_median_ms"] = statistics.median(values) * 1e3
    for stat in ("min", "median"):  # the floor: the faster way of timing the read
        result[f"floor_{stat}_ms"] = min(result[f"amax_{stat}_ms"], result[f"amax_alone_{stat}_ms"])
    result["ratio_median"] = result["verify_median_ms"] / result["floor_median_ms"]
    result["ratio_min"] = result["verify_min_ms"] / result["floor_min_ms"]
    result["softmax_ratio_median"] = result["verify_median_ms"] / result["softmax_median_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", "-V", type=int, default=128256)
    parser.add_argument("--batches", default="32,1", help="comma-separated B values (default 32,1)")
    parser.add_argument("--drafts", "-K", type=int, default=4)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--cases", default=None, help="comma-separated case numbers from 1 (default all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    names = list(CASES)
    if args.cases:
        names = [names[int(i) - 1] for i in args.cases.split(",")]
    probe = torch.zeros(1, 8)
    backend = kernels.backend_for(probe).name
    load_before = os.getloadavg()
    config = {"V": args.vocab, "K": args.drafts, "B": batches, "dtype": args.dtype, "repeats": args.repeats}
    config.update(threads=args.threads, backend=backend)
    results: dict = {"config": config, "cases": {}}
    print(
        f"verifier vs amax, validate=False, backend {backend}, V={args.vocab}, K={args.drafts}, {args.dtype}, "
        f"{args.threads} threads, {args.repeats} repeats; load average {load_before[0]:.2f}"
    )
    print(
        f"{'case':58s}{'B':>4s}{'amax after min/med':>20s}{'amax alone min/med':>20s}{'call min/med ms':>18s}"
        f"{'x floor (med)':>14s}{'(min)':>8s}{'x softmax (med)':>17s}"
    )
    for name in names:
        entry = results["cases"][name] = {}
        for batch in batches:
            arguments = logits_for(CASES[name], batch, args.drafts, args.vocab, DTYPES[args.dtype])
            row = entry[str(batch)] = measure(arguments, args.repeats)
            print(
                f"{name:58s}{batch:4d}"
                f"{row['amax_min_ms']:11.3f}/{row['amax_median_ms']:<8.3f}"
                f"{row['amax_alone_min_ms']:11.3f}/{row['amax_alone_median_ms']:<8.3f}"
                f"{row['verify_min_ms']:9.3f}/{row['verify_median_ms']:<8.3f}"
                f"{row['ratio_median']:14.2f}{row['ratio_min']:8.2f}{row['softmax_ratio_median']:17.2f}",
                flush=True,
            )
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(f"load average after: {results['load_average']['after'][0]:.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
