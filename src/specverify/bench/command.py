"""`specverify bench`: its arguments, checked once into `BenchSettings` (a mistake is a `UsageError` naming
the flag, the rule and the value, before anything is allocated), and its run: `measure.run_benchmark` under
a `report.Progress`, then the table or the JSON."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch

from .. import kernels
from ..usage import JSON_TO_STDOUT, UsageError, json_destination_problem, show_results
from .cases import Mode, memory_estimate
from .measure import run_benchmark
from .report import Progress, print_table

HELP = "time the verifier side by side with the read floor, softmax and a sort-based baseline"
DESCRIPTION = (
    "Time the verifier against one amax pass, torch.softmax and a sort-based baseline on the same logits: a "
    "table for 80 columns, what it is doing on stderr while it works, the results as JSON with --json."
)
#: The words --modes takes, in the order the cases are shown.
MODE_NAMES = tuple(mode.value for mode in Mode)
#: The dtypes --dtype takes.
DTYPES = ("float32", "float16", "bfloat16")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` and set `run=run_bench_command` as a default."""
    parser.add_argument("--batch", "-B", type=int, default=32, help="requests B (default 32)")
    parser.add_argument("--drafts", "-K", type=int, default=4, help="draft positions K (default 4)")
    parser.add_argument("--vocab", "-V", type=int, default=128256, help="vocabulary V (default 128256)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument(
        "--modes",
        default=",".join(MODE_NAMES),
        help=f"comma-separated cases among {', '.join(MODE_NAMES)} (default all); tree: an argmax-mode "
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


@dataclass(frozen=True)
class BenchSettings:
    """A checked `bench` command: the shape (B, K, V) and dtype of the logits, the case groups, timed calls
    per case, torch threads (None: torch's choice), the device, whether traffic is metered, and where the
    JSON goes (None: the table alone; JSON_TO_STDOUT: stdout instead of it; else a file beside it)."""

    batch: int
    drafts: int
    vocab: int
    dtype: torch.dtype
    modes: tuple[Mode, ...]
    repeats: int
    threads: int | None
    device: torch.device
    traffic: bool
    json: str | None

    @property
    def dtype_name(self) -> str:
        """The dtype as --dtype names it."""
        return str(self.dtype).replace("torch.", "")


def _check_sizes(args: argparse.Namespace) -> None:
    """--batch, --drafts, --vocab, --repeats and --threads against their lower bounds."""
    for name, low in (("batch", 1), ("drafts", 0), ("vocab", 1), ("repeats", 1)):
        if getattr(args, name) < low:
            raise UsageError(f"--{name} must be >= {low} (got {getattr(args, name)})")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1 (got {args.threads})")


def _modes(text: str) -> tuple[Mode, ...]:
    """--modes: comma-separated words among MODE_NAMES -> the Modes, in the order given."""
    words = [word.strip() for word in text.split(",") if word.strip()]
    if not words or not set(words) <= set(MODE_NAMES):
        raise UsageError(f"--modes must name cases among {', '.join(MODE_NAMES)} (got {text!r})")
    return tuple(Mode(word) for word in words)


def _check_memory(args: argparse.Namespace, modes: tuple[Mode, ...]) -> None:
    """Refuse a shape whose benchmark cannot fit in this machine's memory, before anything is allocated."""
    needed = memory_estimate(args.batch, args.drafts, args.vocab, modes)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > physical:
        raise UsageError(
            f"--batch {args.batch} x (--drafts {args.drafts} + 1) x --vocab {args.vocab} logits need about "
            f"{needed / 2**30:,.1f} GiB while the benchmark runs, more than this machine's {physical / 2**30:.1f} GiB: "
            f"use a smaller --vocab or --batch"
        )


def _device(name: str) -> torch.device:
    """--device, once a tensor could be made there."""
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise UsageError(f"--device {name!r} is not usable here ({str(error).splitlines()[0]})") from None
    return device


def _traffic(asked: bool, device: torch.device) -> bool:
    """Whether traffic is metered: --traffic, or SPECVERIFY_BACKEND=triton on the CPU; only on the CPU."""
    triton_on_cpu = device.type == "cpu" and os.environ.get(kernels.ENVIRONMENT, "").strip() == "triton"
    if asked and device.type != "cpu":
        raise UsageError("--traffic meters under Triton's interpreter: use --device cpu")
    return asked or triton_on_cpu


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """Check every bench argument before anything is allocated -> BenchSettings; a UsageError says what is
    wrong (the flag, the rule and the value)."""
    _check_sizes(args)
    modes = _modes(args.modes)
    _check_memory(args, modes)
    device = _device(args.device)
    problem = json_destination_problem(args.json)
    if problem is not None:
        raise UsageError(problem)
    traffic = _traffic(args.traffic, device)
    dtype = getattr(torch, args.dtype)
    sizes = (args.batch, args.drafts, args.vocab)
    return BenchSettings(*sizes, dtype, modes, args.repeats, args.threads, device, traffic, args.json)


def run_bench(settings: BenchSettings) -> int:
    """Run a checked `bench` command: progress on stderr, then the table or the JSON -> exit status 0."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    print(
        f"specverify bench: B={settings.batch} K={settings.drafts} V={settings.vocab} {settings.dtype_name} "
        f"on {settings.device}",
        file=sys.stderr,
    )
    shape = (settings.batch, settings.drafts, settings.vocab, settings.dtype)
    with Progress() as progress:
        results = run_benchmark(
            *shape, settings.modes, settings.repeats, settings.device, settings.traffic, progress=progress
        )
    show_results(settings.json, results, lambda: print_table(results))
    return 0


def run_bench_command(args: argparse.Namespace) -> int:
    """Run a parsed `bench` command -> exit status 0 (a UsageError for a mistake the user can fix)."""
    return run_bench(bench_settings(args))
