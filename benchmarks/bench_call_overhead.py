"""Per-call time of `sample` and `stochastic_acceptance_sampler` at a small batch on the CPU, warm and cold.

The speculative loop on a small CPU model (llama.cpp, SmolLM2-135M: ~21 ms a one-token step) calls the
verifier once a step at B = 1, so its fixed per-call host cost (argument checks, tiny torch ops, the
dispatch) is what counts there, not its throughput. Cases: B = 1 (--batch), V = 49152 (--vocab), K = 0
and 4, greedy / T = 0.7 / T = 0.7 with top_p = 0.9, validate=True, torch on 1 thread; float32 logits.

warm: calls back to back. cold: each call after a pass over a buffer larger than the last-level cache
(--evict-mb, default 256 MB, read and written), as the target's forward pass runs between two calls of
the loop: the interpreter's and torch's code and data are then out of the caches.

Side by side: with `--against PATH` (a tree's `src` folder, e.g. /work/main/src), the same measurement
runs in subprocesses that import specverify from PATH and from this tree's src, alternating round by
round (--rounds), and min and median are taken over every repeat of every round. Without it, one
measurement in this process of whatever `specverify` imports. The last line printed is one JSON object.

    python benchmarks/bench_call_overhead.py --against /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

THIS_SRC = Path(__file__).resolve().parents[1] / "src"
SETTINGS = {"greedy": (0.0, 1.0), "T=0.7": (0.7, 1.0), "T=0.7 top_p=0.9": (0.7, 0.9)}


def _cases(batch: int, vocab: int) -> list[tuple[str, object]]:
    """(name, call) for every case; each call runs one verifier or sampler call on fixed inputs."""
    import torch

    import specverify

    generator = torch.Generator().manual_seed(0)
    cases = []
    for setting, (temperature_value, top_p_value) in SETTINGS.items():
        temperature = torch.full((batch,), temperature_value)
        top_k = torch.zeros(batch, dtype=torch.int64)
        top_p = torch.full((batch,), top_p_value)
        seeds = torch.randint(0, 2**62, (batch,), generator=generator)
        logits = torch.randn(batch, vocab, generator=generator) * 3
        cases.append(
            (
                f"sample {setting}",
                lambda logits=logits, t=temperature, k=top_k, p=top_p, s=seeds: specverify.sample(logits, t, k, p, s),
            )
        )
        for positions in (0, 4):
            logits = torch.randn(batch * (positions + 1), vocab, generator=generator) * 3
            draft = torch.randint(0, vocab, (batch, positions), generator=generator)
            cases.append(
                (
                    f"verify K={positions} {setting}",
                    lambda d=draft, logits=logits, t=temperature, k=top_k, p=top_p, s=seeds: (
                        specverify.stochastic_acceptance_sampler(d, logits, t, k, None, p, None, s)
                    ),
                )
            )
    return cases


def measure(batch: int, vocab: int, repeats: int, evict_mb: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per call of every case: {case: {"warm": [...], "cold": [...]}}, in this process."""
    import torch

    torch.set_num_threads(1)
    buffer = torch.zeros(evict_mb * (1 << 20) // 4)
    results = {}
    for name, call in _cases(batch, vocab):
        for _ in range(5):
            call()
        warm = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            warm.append(time.perf_counter() - start)
        cold = []
        for _ in range(repeats):
            buffer.add_(1.0)
            start = time.perf_counter()
            call()
            cold.append(time.perf_counter() - start)
        results[name] = {"warm": warm, "cold": cold}
    return results


def _worker_command(arguments: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--worker",
        "--batch",
        str(arguments.batch),
        "--vocab",
        str(arguments.vocab),
        "--repeats",
        str(arguments.repeats),
        "--evict-mb",
        str(arguments.evict_mb),
    ]


def _run_worker(arguments: argparse.Namespace, source: str) -> dict[str, dict[str, list[float]]]:
    environment = {**os.environ, "PYTHONPATH": source}
    done = subprocess.run(_worker_command(arguments), env=environment, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(times: list[float]) -> dict[str, float]:
    return {"min_us": round(min(times) * 1e6, 1), "median_us": round(statistics.median(times) * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=30, help="calls per case, warm and cold, per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per tree (with --against)")
    parser.add_argument("--evict-mb", type=int, default=256, help="buffer touched before each cold call")
    parser.add_argument("--against", help="a src folder to compare with (e.g. /work/main/src)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    for name in ("batch", "vocab", "repeats", "rounds", "evict_mb"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(arguments, name)})")
    if arguments.worker:
        print(json.dumps(measure(arguments.batch, arguments.vocab, arguments.repeats, arguments.evict_mb)))
        return 0
    trees = {"this": str(THIS_SRC)}
    if arguments.against:
        if not (Path(arguments.against) / "specverify").is_dir():
            parser.error(f"--against must be a src folder holding specverify/ (got {arguments.against})")
        trees = {"against": arguments.against, "this": str(THIS_SRC)}
    times: dict[str, dict[str, dict[str, list[float]]]] = {tree: {} for tree in trees}
    for _ in range(arguments.rounds):
        for tree, source in trees.items():
            for case, kinds in _run_worker(arguments, source).items():
                for kind, values in kinds.items():
                    times[tree].setdefault(case, {}).setdefault(kind, []).extend(values)
    print(
        f"B={arguments.batch} V={arguments.vocab} float32, validate=True, 1 torch thread; "
        f"{arguments.rounds} rounds x {arguments.repeats} calls; cold: after touching {arguments.evict_mb} MB"
    )
    for tree, source in trees.items():
        print(f"  {tree}: {source}")
    header = f"{'case':28s} {'kind':5s}" + "".join(f" {tree + ' min/median us':>24s}" for tree in trees)
    print(header + ("  ratio (median)" if len(trees) == 2 else ""))
    summary = {tree: {} for tree in trees}
    for case in times["this"]:
        for kind in ("warm", "cold"):
            row = f"{case:28s} {kind:5s}"
            for tree in trees:
                numbers = summary[tree].setdefault(case, {})[kind] = _summary(times[tree][case][kind])
                row += f" {numbers['min_us']:>11.0f} / {numbers['median_us']:>10.0f}"
            if len(trees) == 2:
                ratio = summary["this"][case][kind]["median_us"] / summary["against"][case][kind]["median_us"]
                row += f"  {ratio:.2f}x"
            print(row)
    print(json.dumps({"batch": arguments.batch, "vocab": arguments.vocab, "trees": trees, "results": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
