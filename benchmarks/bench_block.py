"""Block verification (SPEC §3.6) against token-wise sampled verification (§3.2), side by side on the CPU.

Per kept set, kind of drafts and B: one `stochastic_acceptance_sampler` call with draft_proposal="sampled" and
validate=False, verification="token" and "block" on the same arguments, the two alternating repeat by repeat
(which goes first alternates too), in one process on the default CPU backend. Kept sets (every row alike):
"sparse" (temperature 0.8, top-k 50, top-p 0.9: short kept lists) and "dense" (temperature 1 only: every token
kept, whole rows of weights). Drafts: "random" (benchmarks/cases.py's: uniform ids, with its q), "unrelated"
(drawn from that q, a law unrelated to the target's: hardly any accepted, so block verification judges every
prefix and draws at every position, its worst case) and "from q" (q = p~ of the logits plus N(0, noise^2)
noise, the drafts drawn from q: most of them accepted, so block verification stops early). With --stages,
block verification in stages over the C row ops too (the path before draw_block_verdicts), the three calls in
an order rotated every repeat, its ratio to token-wise beside. Logits: specverify.bench.inputs.make_batch's,
float32. Per row of the table: min and median ms of each rule, block / token of the mins and of the medians,
and the mean accepted drafts per request of each (block's in expectation at least token-wise's). The machine
may be shared: the ratios, timed side by side, are what to compare; the load average is printed before and
after. The last line printed is one JSON object.

    python benchmarks/bench_block.py                       # B = 1 and 32, K = 4, V = 128256, 2 threads
    python benchmarks/bench_block.py --batches 1 --repeats 41 --threads 1
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cases.py, also where this file is loaded by path

import torch
from cases import Case, logits_for

import specverify as sv
from specverify import kernels

#: The kept sets timed: every row with these parameters (sampled drafts).
KEPT_SETS = {"sparse": Case(0.8, 50, 0.9, sampled=True), "dense": Case(1.0, sampled=True)}


def _drafts_from_q(arguments: dict, noise: float, seed: int) -> dict:
    """The arguments with q = p~ of the logits plus N(0, noise^2) noise (the rows' own truncation) and the
    drafts drawn from it."""
    g = torch.Generator().manual_seed(seed)
    logits = arguments["target_logits"]
    requests, positions = arguments["draft_tokens"].shape
    per_position = positions + 1

    def per_row(values: torch.Tensor) -> torch.Tensor:
        return values.repeat_interleave(per_position)

    noisy = logits.float() + noise * torch.randn(logits.shape, generator=g)
    params = (arguments["temperature"], arguments["top_k"], arguments["top_p"])
    q = sv.truncated_probs(noisy, *map(per_row, params)).view(requests, per_position, -1)[:, :positions]
    draft = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=g).view(requests, positions)
    return {**arguments, "draft_tokens": draft, "draft_probs_full": q.contiguous()}


def _drafts_from_its_q(arguments: dict, seed: int) -> dict:
    """The arguments with the drafts drawn from their own q (make_batch's, unrelated to the target)."""
    q = arguments["draft_probs_full"]
    g = torch.Generator().manual_seed(seed)
    draft = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=g).view(q.shape[:2])
    return {**arguments, "draft_tokens": draft}


def _staged(arguments: dict) -> Callable[[], object]:
    """Block verification in stages over the C row ops (stages.chain.verify_chain with the native ops, each
    position's weights written out: the CPU's path before draw_block_verdicts)."""
    from specverify.kernels import native
    from specverify.kernels.stages import chain

    def run() -> object:
        fused = native.verify_chain
        native.verify_chain = lambda call: chain.verify_chain(call, native)
        try:
            return sv.stochastic_acceptance_sampler(**arguments)
        finally:
            native.verify_chain = fused

    return run


def measure(arguments: dict, repeats: int, stages: bool = False) -> dict:
    """Token-wise and block calls alternating (with `stages`, block in stages too, the order rotated): min
    and median ms of each, ratios to token-wise, and the mean accepted drafts per request of each rule."""
    calls = {rule: {**arguments, "verification": rule} for rule in ("token", "block")}
    runs = {rule: functools.partial(sv.stochastic_acceptance_sampler, **call) for rule, call in calls.items()}
    if stages:
        runs["stages"] = _staged(calls["block"])
    accepted = {}
    for rule, run in runs.items():  # warm-up (the build, scratch buffers, caches), and each rule's verdicts
        for _ in range(2):
            first = run()[0]
        accepted[rule] = float(first.double().mean())
    times: dict[str, list[float]] = {rule: [] for rule in runs}
    names = list(runs)
    for repeat in range(repeats):  # the order rotated every repeat: each rule follows each other as often
        for rule in names[repeat % len(names) :] + names[: repeat % len(names)]:
            start = time.perf_counter()
            runs[rule]()
            times[rule].append(time.perf_counter() - start)
    result = {}
    for rule, values in times.items():
        result[f"{rule}_min_ms"] = min(values) * 1e3
        result[f"{rule}_median_ms"] = statistics.median(values) * 1e3
        result[f"{rule}_accepted"] = accepted[rule]
    for stat in ("min", "median"):
        for rule in set(runs) - {"token"}:
            prefix = "ratio" if rule == "block" else f"{rule}_ratio"
            result[f"{prefix}_{stat}"] = result[f"{rule}_{stat}_ms"] / result[f"token_{stat}_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", "-V", type=int, default=128256)
    parser.add_argument("--batches", default="1,32", help="comma-separated B values (default 1,32)")
    parser.add_argument("--drafts", "-K", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--kept", default="sparse,dense", help=f"comma-separated among {', '.join(KEPT_SETS)}")
    parser.add_argument(
        "--kinds", default="random,unrelated,from q", help="comma-separated draft kinds: random, unrelated, from q"
    )
    parser.add_argument("--noise", type=float, default=0.5, help="the noise of q's logits for 'from q' drafts")
    parser.add_argument(
        "--stages", action="store_true", help="also time block in stages over the C row ops (the path before)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    backend = kernels.backend_for(torch.zeros(1, 8)).name
    load_before = os.getloadavg()
    config = {"V": args.vocab, "K": args.drafts, "B": batches, "repeats": args.repeats, "threads": args.threads}
    results: dict = {"config": {**config, "noise": args.noise, "backend": backend}, "cases": {}}
    print(
        f"block vs token-wise sampled verification, validate=False, backend {backend}, V={args.vocab}, "
        f"K={args.drafts}, float32, {args.threads} threads, {args.repeats} repeats; load average {load_before[0]:.2f}"
    )
    print(
        f"{'kept set':10s}{'drafts':10s}{'B':>4s}{'token min/med ms':>20s}{'block min/med ms':>20s}"
        f"{'block/token min':>17s}{'(med)':>8s}{'accepted token/block':>22s}"
        + (f"{'stages/token min':>18s}{'(med)':>8s}" if args.stages else "")
    )
    for kept in args.kept.split(","):
        for kind in args.kinds.split(","):
            entry = results["cases"][f"{kept}, {kind}"] = {}
            for batch in batches:
                arguments = logits_for(KEPT_SETS[kept], batch, args.drafts, args.vocab, torch.float32)
                if kind == "from q":
                    arguments = _drafts_from_q(arguments, args.noise, seed=batch)
                elif kind == "unrelated":
                    arguments = _drafts_from_its_q(arguments, seed=batch)
                row = entry[str(batch)] = measure(arguments, args.repeats, args.stages)
                staged = f"{row['stages_ratio_min']:10.3f}{row['stages_ratio_median']:8.3f}" if args.stages else ""
                print(
                    f"{kept:10s}{kind:10s}{batch:4d}"
                    f"{row['token_min_ms']:10.3f}/{row['token_median_ms']:<9.3f}"
                    f"{row['block_min_ms']:10.3f}/{row['block_median_ms']:<9.3f}"
                    f"{row['ratio_min']:17.3f}{row['ratio_median']:8.3f}"
                    f"{row['token_accepted']:14.2f}/{row['block_accepted']:<7.2f}{staged}",
                    flush=True,
                )
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(f"load average after: {results['load_average']['after'][0]:.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
