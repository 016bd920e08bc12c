"""Side-by-side benchmark of the verifier against the read floor, softmax and a sort-based baseline.

Everything is timed in one process on the same logits, so the ratios hold even on a noisy machine:
each case reports min and median over repeats, as a ratio to one `amax` pass over the logits (the
physical read floor) and to one `torch.softmax`. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from . import native, stochastic_acceptance_sampler


@dataclass
class Batch:
    """One benchmark input: B requests with K drafts over V tokens, with the realistic row mix."""

    draft_tokens: torch.Tensor  # [B, K] int64
    target_logits: torch.Tensor  # [B*(K+1), V]
    temperature: torch.Tensor  # [B]
    top_k: torch.Tensor  # [B]
    top_p: torch.Tensor  # [B]
    seed: torch.Tensor  # [B]
    draft_probs: torch.Tensor  # [B, K, V]


def make_batch(batch: int, positions: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> Batch:
    """LLM-shaped logits (a few heavy head tokens over a long Gaussian tail); rows cycle through
    (T=0.8, top_k=50, top_p=0.9), (T=1, top_p=0.95) and greedy."""
    g = torch.Generator().manual_seed(seed)
    rows = batch * (positions + 1)
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    head = torch.randint(0, vocab, (rows, 8), generator=g)
    logits.scatter_add_(1, head, torch.rand(rows, 8, generator=g) * 8 + 4)
    kind = torch.arange(batch) % 3
    draft_probs = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2.0, dim=-1)
    return Batch(
        draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
        target_logits=logits.to(dtype),
        temperature=torch.tensor([0.8, 1.0, 0.0])[kind],
        top_k=torch.tensor([50, -1, -1])[kind],
        top_p=torch.tensor([0.9, 0.95, 1.0])[kind],
        seed=torch.randint(0, 2**62, (batch,), generator=g),
        draft_probs=draft_probs,
    )


def sort_based_baseline(batch: Batch) -> torch.Tensor:
    """What peers do (HF warpers, vLLM's native path): sort, cumulative sum, mask, softmax, and an
    exponential race. Returns one sampled token per position: int64 [B*(K+1)]."""
    positions = batch.target_logits.shape[0] // batch.temperature.shape[0]
    logits = batch.target_logits.float()
    temperature = batch.temperature.clamp(min=1e-5).repeat_interleave(positions)[:, None]
    top_k = batch.top_k.repeat_interleave(positions)
    top_p = batch.top_p.repeat_interleave(positions)[:, None]
    sorted_logits, order = torch.sort(logits / temperature, dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1])
    outside_k = (top_k[:, None] > 0) & (ranks >= top_k[:, None])
    sorted_logits = sorted_logits.masked_fill(outside_k, float("-inf"))
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    outside_p = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    sorted_logits = sorted_logits.masked_fill(outside_p, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    race = probs / torch.empty_like(probs).exponential_()
    return order.gather(1, race.argmax(-1, keepdim=True))[:, 0]


def _verifier(batch: Batch, mode: str, validate: bool, greedy_only: bool = False) -> Callable[[], object]:
    temperature = torch.zeros_like(batch.temperature) if greedy_only else batch.temperature
    extra = {"draft_proposal": "sampled", "draft_probs_full": batch.draft_probs} if mode == "sampled" else {}
    if mode == "relaxed":  # every request in its thinking phase: top-3, delta 0.3
        extra = {"in_thinking_phase": torch.ones_like(batch.temperature, dtype=torch.bool), "relaxed_topk": 3,
                 "relaxed_delta": 0.3}
    return lambda: stochastic_acceptance_sampler(
        batch.draft_tokens, batch.target_logits, temperature, batch.top_k, None, batch.top_p, None, batch.seed,
        validate=validate, **extra,
    )


def _max_verifier(batch: Batch) -> Callable[[], object] | None:
    """Modular MAX's CPU verifier, when its package is importable (an optional extra)."""
    try:
        sampling = importlib.import_module("max.nn.sampling")
    except ImportError:
        return None
    return lambda: sampling.stochastic_acceptance_sampler(
        batch.draft_tokens, batch.target_logits, batch.temperature, batch.top_k, -1, batch.top_p,
        float(batch.top_p.min()), batch.seed,
    )


def time_case(run: Callable[[], object], repeats: int) -> list[float]:
    """Wall-clock seconds of each of `repeats` calls, after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send what C++ code writes to file descriptor 2 to /dev/null inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_extra_bytes(run: Callable[[], object]) -> int:
    """Peak bytes allocated during one call beyond what was allocated before it (CPU: via the profiler).

    The call runs on a fresh thread, so per-thread scratch buffers that later calls reuse are counted."""

    def profiled() -> None:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
        result.append(prof)

    result: list = []
    worker = threading.Thread(target=profiled)
    with _quiet_stderr():  # the profiler's C++ side logs its start and stop there
        worker.start()
        worker.join()
    prof = result[0]
    # an op's memory includes what the ops it calls allocate: count each allocation once, at its own op
    events = sorted(
        (e for e in prof.events() if e.self_cpu_memory_usage != 0), key=lambda e: e.time_range.start
    )
    level = peak = 0
    for event in events:
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def _kernels() -> dict:
    """Which CPU code runs, and how long loading it took in this process (the C build included when it was
    not cached yet: the stall a first call would see)."""
    start = time.perf_counter()
    library = native.load()
    seconds = time.perf_counter() - start
    if library is None:
        return {"kernels": "torch ops (no compiled kernels)", "kernels_load_s": seconds}
    threads = "OpenMP on torch's runtime" if library.specverify_threads_itself else "a Python thread pool"
    return {"kernels": f"compiled, rows spread by {threads}", "kernels_load_s": seconds}


def run_benchmark(batch_size: int, positions: int, vocab: int, dtype: torch.dtype, modes: list[str], repeats: int) -> dict:
    """Time every case side by side; returns the results as a dict (also printed as a table)."""
    kernels = _kernels()
    batch = make_batch(batch_size, positions, vocab, dtype)
    logits = batch.target_logits
    cases: dict[str, Callable[[], object]] = {
        "read floor (amax)": lambda: logits.amax(-1),
        "torch.softmax": lambda: torch.softmax(logits, dim=-1),
    }
    if "argmax" in modes:
        cases["argmax, validate=False"] = _verifier(batch, "argmax", validate=False)
        cases["argmax, validate=True"] = _verifier(batch, "argmax", validate=True)
    if "sampled" in modes:
        cases["sampled, validate=False"] = _verifier(batch, "sampled", validate=False)
    if "relaxed" in modes:
        cases["relaxed, every row thinking"] = _verifier(batch, "relaxed", validate=False)
    if "greedy" in modes:
        cases["all greedy, validate=False"] = _verifier(batch, "argmax", validate=False, greedy_only=True)
        cases["all greedy, validate=True"] = _verifier(batch, "argmax", validate=True, greedy_only=True)
    if "sort" in modes:
        cases["sort-based baseline"] = lambda: sort_based_baseline(batch)
    max_run = _max_verifier(batch)
    if max_run is not None:
        cases["MAX stochastic_acceptance_sampler"] = max_run
    times = {name: time_case(run, repeats) for name, run in cases.items()}
    floor = statistics.median(times["read floor (amax)"])
    softmax = statistics.median(times["torch.softmax"])
    logits_bytes = logits.numel() * logits.element_size()
    results = {
        "config": {"B": batch_size, "K": positions, "V": vocab, "dtype": str(dtype).replace("torch.", ""),
                   "repeats": repeats, "threads": torch.get_num_threads(), "load_average": os.getloadavg()[0],
                   **kernels},
        "cases": {},
    }
    for name, seconds in times.items():
        entry = {
            "min_ms": min(seconds) * 1e3,
            "median_ms": statistics.median(seconds) * 1e3,
            "x_read_floor": statistics.median(seconds) / floor,
            "x_softmax": statistics.median(seconds) / softmax,
        }
        if name.startswith(("argmax", "sampled", "relaxed", "all greedy")):
            entry["peak_extra_x_logits"] = peak_extra_bytes(cases[name]) / logits_bytes
        results["cases"][name] = entry
    return results


def print_table(results: dict) -> None:
    config = results["config"]
    print(f"B={config['B']} K={config['K']} V={config['V']} {config['dtype']}, {config['threads']} threads, "
          f"{config['repeats']} repeats, load average {config['load_average']:.2f}")
    print(f"kernels: {config['kernels']} (loaded in {config['kernels_load_s']:.2f} s)")
    print(f"{'case':36s} {'min ms':>9s} {'median ms':>10s} {'x amax':>8s} {'x softmax':>10s} {'peak mem x logits':>18s}")
    for name, entry in results["cases"].items():
        memory = f"{entry['peak_extra_x_logits']:.2f}" if "peak_extra_x_logits" in entry else ""
        print(f"{name:36s} {entry['min_ms']:9.1f} {entry['median_ms']:10.1f} {entry['x_read_floor']:8.1f} "
              f"{entry['x_softmax']:10.2f} {memory:>18s}")


#: The cases --modes may name.
MODES = ("argmax", "sampled", "relaxed", "greedy", "sort")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", "-B", type=int, default=32, help="requests B (default 32)")
    parser.add_argument("--drafts", "-K", type=int, default=4, help="draft positions K (default 4)")
    parser.add_argument("--vocab", "-V", type=int, default=128256, help="vocabulary V (default 128256)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated cases among {', '.join(MODES)} (default all)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per case (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")


def memory_estimate(batch: int, positions: int, vocab: int, modes: list[str]) -> int:
    """Bytes the benchmark holds at its peak, roughly: about 4 float32 copies of the logits (the logits,
    the draft distributions, softmax's output, the verifier's scratch), 12 with the sort-based baseline
    (its sorted values, int64 order, cumulative sums and masks)."""
    copies = 12 if "sort" in modes else 4
    return batch * (positions + 1) * vocab * 4 * copies


def bench_modes(args: argparse.Namespace) -> list[str]:
    """Check the bench arguments before anything is allocated -> the modes; ValueError says what is wrong."""
    for name, low in (("batch", 1), ("drafts", 0), ("vocab", 1), ("repeats", 1)):
        if getattr(args, name) < low:
            raise ValueError(f"--{name} must be >= {low} (got {getattr(args, name)})")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1 (got {args.threads})")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown or not modes:
        raise ValueError(f"--modes must name cases among {', '.join(MODES)} (got {args.modes!r})")
    needed = memory_estimate(args.batch, args.drafts, args.vocab, modes)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > physical:
        raise ValueError(
            f"--batch {args.batch} x (--drafts {args.drafts} + 1) x --vocab {args.vocab} logits need about "
            f"{needed / 2**30:,.1f} GiB while the benchmark runs, more than this machine's {physical / 2**30:.1f} GiB: "
            f"use a smaller --vocab or --batch"
        )
    return modes


def run_bench_command(args: argparse.Namespace) -> int:
    try:
        modes = bench_modes(args)
    except ValueError as err:
        print(f"specverify bench: error: {err}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    results = run_benchmark(args.batch, args.drafts, args.vocab, getattr(torch, args.dtype), modes, args.repeats)
    print_table(results)
    print(json.dumps(results))
    return 0
