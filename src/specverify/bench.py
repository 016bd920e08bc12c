"""Side-by-side benchmark of the verifier against the read floor, softmax and a sort-based baseline, and
of a tree verification (SPEC §8) against chains of the same depth and of as many nodes.

Everything is timed in one process on the same logits, so the ratios hold even on a noisy machine:
each case reports min and median over repeats, as a ratio to one `amax` pass over the logits (the
physical read floor) and to one `torch.softmax`: a table for 80 columns, or JSON (`--json`).
On a GPU (`--device cuda`) each call is timed between two synchronisations, peak memory comes from
torch.cuda's allocator statistics, and the torch reference path (SPECVERIFY_BACKEND=torch) and
FlashInfer's samplers (when `flashinfer` is importable; a line says why when not) run beside it.
With --traffic (CPU), each verifier case also shows its passes: the bytes its Triton kernels load over the
bytes of the logits, counted under Triton's interpreter (kernels/triton/traffic.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from . import kernels, stochastic_acceptance_sampler, tree_acceptance_sampler
from .kernels import native
from .usage import JSON_TO_STDOUT, json_destination_problem, show_results

#: The default device of the timed calls.
CPU = torch.device("cpu")


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


#: Children per level of the benchmark's draft tree: N = TREE_WIDTH * depth nodes.
TREE_WIDTH = 4


def make_tree(batch: Batch, depth: int, width: int = TREE_WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft tree per request for a Batch made with K = depth * width positions (so N + 1 logits rows per
    request): at each of `depth` levels, the `width` most likely target tokens after the level's parent,
    the first of them (the spine) being the parent of the next level (an EAGLE-style top-`width` expansion
    along the best path). Returns (draft_tokens [B, N], parents [B, N]), int64."""
    requests = batch.temperature.shape[0]
    nodes = depth * width
    logits = batch.target_logits.view(requests, nodes + 1, -1)
    spine = torch.arange(depth) * width  # the first node of each level
    parent_of_level = torch.cat([torch.tensor([-1]), spine[:-1]])
    tokens = logits[:, parent_of_level + 1].float().topk(width, dim=-1).indices  # [B, depth, width]
    parents = parent_of_level.repeat_interleave(width).expand(requests, nodes).contiguous()
    return tokens.reshape(requests, nodes), parents


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


def _verifier(
    batch: Batch, mode: str, validate: bool, greedy_only: bool = False, backend: str | None = None
) -> Callable[[], object]:
    """One verifier call on the batch; backend: force one (SPECVERIFY_BACKEND) for the call, else the device's."""
    temperature = torch.zeros_like(batch.temperature) if greedy_only else batch.temperature
    extra = {"draft_proposal": "sampled", "draft_probs_full": batch.draft_probs} if mode == "sampled" else {}
    if mode == "relaxed":  # every request in its thinking phase: top-3, delta 0.3
        extra = {
            "in_thinking_phase": torch.ones_like(batch.temperature, dtype=torch.bool),
            "relaxed_topk": 3,
            "relaxed_delta": 0.3,
        }

    def run() -> object:
        with kernels.forced(backend):
            return stochastic_acceptance_sampler(
                batch.draft_tokens,
                batch.target_logits,
                temperature,
                batch.top_k,
                None,
                batch.top_p,
                None,
                batch.seed,
                validate=validate,
                **extra,
            )

    return run


def _flashinfer_cases(batch: Batch) -> tuple[dict[str, Callable[[], object]], str | None]:
    """FlashInfer's sort-free samplers on the same inputs, where `flashinfer` imports (CUDA only): top-k/top-p
    sampling from the logits of every position, and the chain speculative sampling of sampled drafts from
    the target's probabilities (no per-request seeds, min-p or masks), timed with and without the softmax
    that makes those probabilities. Returns (cases, why there are none)."""
    if batch.target_logits.device.type != "cuda":
        return {}, "FlashInfer runs on CUDA only"
    try:
        sampling = importlib.import_module("flashinfer.sampling")
    except Exception as error:
        return {}, f"flashinfer is not importable ({type(error).__name__}: {error})"
    requests, positions = batch.draft_tokens.shape
    logits = batch.target_logits.float()

    def per_row(t):
        return t.repeat_interleave(positions + 1)

    top_k, top_p = (
        per_row(torch.where(batch.top_k > 0, batch.top_k, logits.shape[-1])).int(),
        per_row(batch.top_p).float(),
    )
    target_probs = torch.softmax(logits, -1).view(requests, positions + 1, -1)
    draft = batch.draft_tokens.int()

    def chain(probs: torch.Tensor) -> object:
        return sampling.chain_speculative_sampling(batch.draft_probs, draft, probs)

    cases = {
        "flashinfer top_k_top_p_sampling_from_logits": lambda: sampling.top_k_top_p_sampling_from_logits(
            logits, top_k, top_p
        ),
        "flashinfer chain_speculative_sampling": lambda: chain(target_probs),
        "flashinfer softmax + chain_speculative_sampling": lambda: chain(
            torch.softmax(logits, -1).view(requests, positions + 1, -1)
        ),
    }
    working = {}
    for name, run in cases.items():
        try:
            run()
            working[name] = run
        except Exception as error:
            print(f"{name}: skipped ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
    return working, None


def _tree_verifier(
    batch: Batch, draft_tokens: torch.Tensor, parents: torch.Tensor, validate: bool
) -> Callable[[], object]:
    """Argmax-mode tree verification of a Batch made with K = N positions."""
    return lambda: tree_acceptance_sampler(
        draft_tokens,
        parents,
        batch.target_logits,
        batch.temperature,
        batch.top_k,
        batch.top_p,
        batch.seed,
        validate=validate,
    )


def _max_verifier(batch: Batch) -> Callable[[], object] | None:
    """Modular MAX's CPU verifier, when its package is importable (an optional extra)."""
    try:
        sampling = importlib.import_module("max.nn.sampling")
    except ImportError:
        return None
    return lambda: sampling.stochastic_acceptance_sampler(
        batch.draft_tokens,
        batch.target_logits,
        batch.temperature,
        batch.top_k,
        -1,
        batch.top_p,
        float(batch.top_p.min()),
        batch.seed,
    )


def time_case(
    run: Callable[[], object], repeats: int, device: torch.device = CPU, on_call: Callable[[int], None] | None = None
) -> list[float]:
    """Wall-clock seconds of each of `repeats` calls, after one warm-up call (on a GPU: from a synchronised
    start to the synchronised end of the call's work); on_call(i) after the i-th timed call, and on_call(0)
    after the warm-up (progress)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run()
    if on_call is not None:
        on_call(0)
    times = []
    for i in range(repeats):
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - start)
        if on_call is not None:
            on_call(i + 1)
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


def peak_extra_bytes(run: Callable[[], object], device: torch.device = CPU) -> int:
    """Peak bytes allocated during one call beyond what was allocated before it (CPU: via the profiler;
    CUDA: the caching allocator's statistics).

    The call runs on a fresh thread, so per-thread scratch buffers that later calls reuse are counted."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - before

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
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage != 0), key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def _kernels(logits: torch.Tensor) -> dict:
    """Which backend runs the verifier on these logits (kernels/), and how long loading it took in this
    process (the C build or the Triton import included when not done yet: the stall a first call would see)."""
    start = time.perf_counter()
    backend = kernels.backend_for(logits).name
    seconds = time.perf_counter() - start
    if backend == "native":
        threads = "OpenMP on torch's runtime" if native.load().specverify_threads_itself else "a Python thread pool"
        text = f"native (compiled C kernels, rows spread by {threads})"
    elif backend == "triton":
        text = "triton (Triton kernels" + (", interpreted)" if logits.device.type == "cpu" else ")")
    else:
        why = f": {native.unavailable_because}" if logits.device.type == "cpu" and native.unavailable_because else ""
        text = f"torch (the torch reference ops{why})"
    return {"backend": backend, "kernels": text, "kernels_load_s": seconds}


def _passes(run: Callable[[], object], logits: torch.Tensor) -> float:
    """Bytes the Triton kernels of one call load over the bytes of the logits, counted under Triton's
    interpreter (kernels/triton/traffic.py); the logits must be on the CPU."""
    from .kernels.triton.traffic import metered

    with kernels.forced("triton"), metered() as traffic:
        run()
    return traffic.passes(logits)


def _on(batch: Batch, device: torch.device) -> Batch:
    return Batch(**{name: value.to(device) for name, value in vars(batch).items()})


def _calls_done(name: str, calls: int, repeats: int) -> str:
    return f"timing {name}: " + (f"{calls} of {repeats} calls" if calls else "warmed up")


def run_benchmark(
    batch_size: int,
    positions: int,
    vocab: int,
    dtype: torch.dtype,
    modes: list[str],
    repeats: int,
    device: torch.device = CPU,
    traffic: bool = False,
    progress: Callable[[str, bool], None] | None = None,
) -> dict:
    """Time every case side by side; returns the results as a dict (`print_table` shows them). traffic: also
    meter each verifier case once on the Triton backend under its interpreter (CPU only): `passes`.
    progress(text, step): what the benchmark is doing, for a person: step=True as each step starts (a case
    timed, measured or metered), False after each call within it (`Progress` shows those only after a quiet
    spell)."""
    say = progress or (lambda text, step: None)
    say("making the logits", True)
    batch = _on(make_batch(batch_size, positions, vocab, dtype), device)
    logits = batch.target_logits
    say("loading the kernels (the first run of a machine builds them)", True)
    backend = _kernels(logits)
    if traffic:  # loaded before anything imports triton (torch's profiler does): it sets TRITON_INTERPRET first
        with kernels.forced("triton"):
            kernels.backend_for(logits)
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
    if backend["backend"] != "torch" and device.type != "cpu":  # on the CPU the torch path is too slow to time here
        for mode in ("argmax", "sampled"):
            if mode in modes:
                cases[f"{mode}, torch reference path"] = _verifier(batch, mode, validate=False, backend="torch")
    if "sort" in modes:
        cases["sort-based baseline"] = lambda: sort_based_baseline(batch)
    tree = {}
    if "tree" in modes and positions > 0:
        # a tree of N = 4K nodes and depth K beside the chains of the same depth (above) and of K = N
        nodes = TREE_WIDTH * positions
        say(f"making the logits of a tree of {nodes} nodes", True)
        wide = _on(make_batch(batch_size, nodes, vocab, dtype, seed=1), device)
        draft_tokens, parents = make_tree(wide, positions)
        _, path_length, _ = tree_acceptance_sampler(
            draft_tokens, parents, wide.target_logits, wide.temperature, wide.top_k, wide.top_p, wide.seed
        )
        tree = {
            "tree_nodes": nodes,
            "tree_depth": positions,
            "tree_mean_path_length": float(path_length.float().mean()),
        }
        for validate in (False, True):
            cases[f"tree N={nodes} depth {positions}, validate={validate}"] = _tree_verifier(
                wide, draft_tokens, parents, validate
            )
            cases[f"chain K={nodes}, validate={validate}"] = _verifier(wide, "argmax", validate)
    max_run = _max_verifier(batch) if device.type == "cpu" else None
    if max_run is not None:
        cases["MAX stochastic_acceptance_sampler"] = max_run
    flashinfer, flashinfer_missing = _flashinfer_cases(batch)
    cases.update(flashinfer)
    times = {}
    for i, (name, run) in enumerate(cases.items()):
        say(f"timing {i + 1}/{len(cases)}: {name}", True)
        times[name] = time_case(run, repeats, device, lambda n, name=name: say(_calls_done(name, n, repeats), False))
    floor = statistics.median(times["read floor (amax)"])
    softmax = statistics.median(times["torch.softmax"])
    logits_bytes = logits.numel() * logits.element_size()
    results = {
        "config": {
            "B": batch_size,
            "K": positions,
            "V": vocab,
            "dtype": str(dtype).replace("torch.", ""),
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg()[0],
            "device": str(device),
            "torch": torch.__version__,
            **backend,
            **({"device_name": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}),
            **({"flashinfer": flashinfer_missing} if flashinfer_missing and device.type == "cuda" else {}),
            **tree,
        },
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
            say(f"peak memory of {name}", True)
            entry["peak_extra_x_logits"] = peak_extra_bytes(cases[name], device) / logits_bytes
            if traffic and "torch reference" not in name:
                say(f"passes over the logits of {name}, under Triton's interpreter", True)
                entry["passes"] = _passes(cases[name], logits)
        results["cases"][name] = entry
    return results


#: The width the table is laid out for (a terminal's default).
WIDTH = 80
#: The table's number columns: (heading, width, format), "passes" only where it was metered.
COLUMNS = (
    ("min ms", 9, "{:9.3f}"),
    ("median ms", 10, "{:10.3f}"),
    ("x amax", 7, "{:7.1f}"),
    ("x softmax", 9, "{:9.2f}"),
    ("mem x", 6, "{:6.2f}"),
    ("passes", 6, "{:6.2f}"),
)
#: The case name's column: what the number columns leave of WIDTH; a longer name gets a line of its own.
NAME_WIDTH = WIDTH - sum(width + 1 for _, width, _ in COLUMNS)


def _wrapped(text: str) -> str:
    return textwrap.fill(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def print_table(results: dict, out=None) -> None:
    """The results for a person, laid out for 80 columns (to out, default stdout): the configuration, then
    a row per case (a name too long for its column on a line of its own, its numbers on the next), then what
    the columns mean."""
    out = out or sys.stdout
    config = results["config"]
    where = config.get("device_name", f"{config['threads']} threads")
    lines = [
        f"B={config['B']} K={config['K']} V={config['V']} {config['dtype']} on {config['device']} ({where}), "
        f"{config['repeats']} repeats, load average {config['load_average']:.2f}",
        f"backend: {config['kernels']} (loaded in {config['kernels_load_s']:.2f} s)",
    ]
    if "flashinfer" in config:
        lines.append(f"FlashInfer: not timed: {config['flashinfer']}")
    if "tree_nodes" in config:
        lines.append(
            f"tree: {config['tree_nodes']} nodes, depth {config['tree_depth']}, mean accepted path "
            f"{config['tree_mean_path_length']:.2f} (argmax mode, logits of {config['tree_nodes'] + 1} rows per request)"
        )
    for line in lines:
        print(_wrapped(line), file=out)
    metered = any("passes" in entry for entry in results["cases"].values())
    columns = COLUMNS if metered else COLUMNS[:-1]
    print(f"{'case':<{NAME_WIDTH}}" + "".join(f" {heading:>{width}}" for heading, width, _ in columns), file=out)
    for name, entry in results["cases"].items():
        values = (
            entry["min_ms"],
            entry["median_ms"],
            entry["x_read_floor"],
            entry["x_softmax"],
            entry.get("peak_extra_x_logits"),
            entry.get("passes"),
        )
        numbers = "".join(
            f" {'' if value is None else form.format(value):>{width}}"
            for (_, width, form), value in zip(columns, values)
        )
        if len(name) > NAME_WIDTH:
            print(name, file=out)
            name = ""
        print(f"{name:<{NAME_WIDTH}}{numbers}", file=out)
    legend = (
        "min/median ms: of the timed calls; x amax, x softmax: the median over one torch.amax read of the logits "
        "and over one torch.softmax; mem x: the peak memory a call adds, over the logits' bytes"
    )
    print(_wrapped(legend + ("; passes: bytes loaded over the logits' bytes" if metered else "")), file=out)


#: The cases --modes may name.
MODES = ("argmax", "sampled", "relaxed", "greedy", "sort", "tree")
HELP = "time the verifier side by side with the read floor, softmax and a sort-based baseline"
DESCRIPTION = (
    "Time the verifier against one amax pass, torch.softmax and a sort-based baseline on the same logits: a "
    "table for 80 columns, what it is doing on stderr while it works, the results as JSON with --json."
)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` and set `run=run_bench_command` as a default."""
    parser.add_argument("--batch", "-B", type=int, default=32, help="requests B (default 32)")
    parser.add_argument("--drafts", "-K", type=int, default=4, help="draft positions K (default 4)")
    parser.add_argument("--vocab", "-V", type=int, default=128256, help="vocabulary V (default 128256)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated cases among {', '.join(MODES)} (default all); tree: an argmax-mode "
        "tree of 4K nodes and depth K beside the chain of K = 4K",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per case (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="where the logits live: cpu (default) or cuda (cuda:N)")
    parser.add_argument(
        "--traffic",
        action="store_true",
        help="also meter each verifier case once on the Triton backend under its interpreter: passes = bytes "
        "loaded / bytes of the logits (CPU only; on by default when SPECVERIFY_BACKEND=triton runs there)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const=JSON_TO_STDOUT,
        metavar="FILE",
        help="the results as one JSON object: on stdout instead of the table, or written to FILE",
    )
    parser.set_defaults(run=run_bench_command)


def memory_estimate(batch: int, positions: int, vocab: int, modes: list[str]) -> int:
    """Bytes the benchmark holds at its peak, roughly: about 4 float32 copies of the logits (the logits,
    the draft distributions, softmax's output, the verifier's scratch), 12 with the sort-based baseline
    (its sorted values, int64 order, cumulative sums and masks)."""
    copies = 12 if "sort" in modes else 4
    rows = positions + 1 + (TREE_WIDTH * positions + 1 if "tree" in modes else 0)  # the tree's batch beside
    return batch * rows * vocab * 4 * copies


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


class Progress:
    """What the benchmark is doing, on stderr (stdout keeps the table or the JSON): a line as each step starts,
    and, while a step runs, a line whenever QUIET seconds have passed without one: after a call where calls
    end that often (the sort-based baseline's take seconds each at the default shape), else from a watch
    thread while one long call runs (a loaded machine can stretch one to tens of seconds). Use it as a
    context manager: the watch runs inside the block."""

    #: Seconds without a line after which one is written.
    QUIET = 2.0
    #: How often the watch thread looks.
    LOOK = 0.25

    def __init__(self, out=None):
        self._out = out or sys.stderr
        self._lock = threading.Lock()
        self._last = self._started = time.monotonic()
        self._step, self._done = "", threading.Event()
        self._watch = threading.Thread(target=self._watching, daemon=True)

    def __enter__(self) -> Progress:
        self._watch.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._watch.join()

    def __call__(self, text: str, step: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if step:
                self._step, self._started = text, now
            if step or now - self._last >= self.QUIET:
                self._say(text, now)

    def _say(self, text: str, now: float) -> None:
        print(f"  {text}", file=self._out, flush=True)
        self._last = now

    def _watching(self) -> None:
        while not self._done.wait(self.LOOK):
            with self._lock:
                now = time.monotonic()
                if self._step and now - self._last >= self.QUIET:
                    self._say(f"{self._step}: {now - self._started:.0f} s so far", now)


def run_bench_command(args: argparse.Namespace) -> int:
    try:
        modes = bench_modes(args)
    except ValueError as err:
        print(f"specverify bench: error: {err}", file=sys.stderr)
        return 2
    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        print(
            f"specverify bench: error: --device {args.device!r} is not usable here ({str(error).splitlines()[0]})",
            file=sys.stderr,
        )
        return 2
    problem = json_destination_problem(args.json)
    if problem is not None:
        print(f"specverify bench: error: {problem}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    traffic = args.traffic or (device.type == "cpu" and os.environ.get(kernels.ENVIRONMENT, "").strip() == "triton")
    if traffic and device.type != "cpu":
        print("specverify bench: error: --traffic meters under Triton's interpreter: use --device cpu", file=sys.stderr)
        return 2
    shape = (args.batch, args.drafts, args.vocab, getattr(torch, args.dtype))
    print(f"specverify bench: B={args.batch} K={args.drafts} V={args.vocab} {args.dtype} on {device}", file=sys.stderr)
    with Progress() as progress:
        results = run_benchmark(*shape, modes, args.repeats, device, traffic, progress=progress)
    show_results(args.json, results, lambda: print_table(results))
    return 0
