"""`specverify audit`: the arguments and the run. Heavy imports (scipy, rich, matplotlib) wait for the run,
so building the `specverify` parser stays cheap and works without the audit's extra installed."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from ..usage import install_command

DESCRIPTION = (
    "Prove a verifier lossless: for a matrix of scenarios, compute in float64 the exact distribution of "
    "every committed token and of the first rejection, run the verifier on thousands of rows (one batched "
    "call per scenario, a seed per row) and test what it commits against them. Exit status 0 when every "
    "lossless scenario passes (and decoding does not depend on the drafter), 1 when one fails, 2 on bad "
    "arguments."
)
#: The chance that a correct verifier fails some test of the audit, by default.
DEFAULT_ALPHA = 1e-3
#: Memory a batched call holds per target logit, roughly: the float32 logits, float64 draft
#: distributions in sampled mode and the verifier's float32 scratch.
BYTES_PER_LOGIT = 16


class _Invalid(Exception):
    """A bad argument or a missing dependency; the message says what to do."""


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the audit's options to `parser` (its description too, if it has none) and set
    `run=run_audit_command` as a default, so a subcommand dispatcher can call `args.run(args)`."""
    from .verifier import DEFAULT_VERIFIER

    parser.description = parser.description or DESCRIPTION
    parser.add_argument(
        "--verifier",
        default=DEFAULT_VERIFIER,
        metavar="MODULE:FUNCTION",
        help="any callable with the stochastic_acceptance_sampler signature, as 'module:function' "
        f"or 'path/file.py:function' (default {DEFAULT_VERIFIER})",
    )
    parser.add_argument(
        "--tree",
        action="store_true",
        help="the verifier has the tree_acceptance_sampler signature (SPEC §8): audit it on the tree "
        "scenarios (implied by a parameter named `parents`; alone: audits "
        "specverify:tree_acceptance_sampler). Without --verifier both of specverify's "
        "verifiers are audited, each on its scenarios",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller matrix with fewer rows (under 30 s)")
    parser.add_argument("--only", metavar="TEXT", help="run only the scenarios whose name contains TEXT")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's rows (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the rows' seeds and drafts (default 0)")
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"chance that a correct verifier fails the audit (default {DEFAULT_ALPHA:g})",
    )
    parser.add_argument("--device", default="cpu", help="where the verifier's inputs live, e.g. cuda (default cpu)")
    parser.add_argument(
        "--no-invariance",
        action="store_true",
        help="skip the drafter-invariance check (for verifiers not keyed as SPEC §4)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the full report as JSON to FILE")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="write PNG figures to DIR (needs matplotlib)")
    parser.set_defaults(run=run_audit_command)


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.scale < math.inf:
        raise _Invalid(f"--scale must be > 0 and finite (got {args.scale})")
    if not 0 < args.alpha < 1:
        raise _Invalid(f"--alpha must be in (0, 1) (got {args.alpha})")
    needed = ["numpy", "scipy", "rich"] + (["matplotlib"] if args.plots else [])
    for module in needed:
        try:
            __import__(module)
        except ImportError:
            raise _Invalid(
                f"the audit needs the audit extra ({module} is not installed); from the repository root run: "
                f"{install_command('audit')}"
            ) from None
    import torch

    try:
        torch.empty(0, device=args.device)
    except (RuntimeError, AssertionError) as err:
        raise _Invalid(f"--device {args.device!r} is not usable here ({err})") from None
    if args.json is not None:
        if args.json.is_dir():
            raise _Invalid(f"--json {str(args.json)!r} is a folder: give a file name, e.g. {args.json / 'audit.json'}")
        _check_writable(args.json.parent, "--json", args.json)
    if args.plots is not None:
        _check_writable(args.plots, "--plots", args.plots)


def _check_writable(folder: Path, flag: str, given: Path) -> None:
    """Create `folder` if needed and write a scratch file in it, so that a destination that cannot be
    written fails before the audit runs rather than after."""
    blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise _Invalid(f"{flag} {str(given)!r} cannot be written ({blocking} is a file, not a folder)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise _Invalid(
            f"{flag} {str(given)!r} cannot be written ({err.strerror or err}: {err.filename or folder})"
        ) from None


def _audit(args: argparse.Namespace, console):
    """Load the verifier and run the audit under a progress display."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .runner import run_audit
    from .scenarios import QUICK_FRACTION
    from .trees import audited_verifiers

    try:
        verifier, tree_verifier, matrix = audited_verifiers(args.verifier, args.tree)
    except ValueError as err:
        raise _Invalid(f"--verifier: {err}") from None
    scenarios = [s for s in matrix if (s.quick or not args.quick) and (args.only or "") in s.name]
    if not scenarios:
        raise _Invalid(f"--only {args.only!r} matches no scenario{' of --quick' if args.quick else ''}")
    scale = args.scale * (QUICK_FRACTION if args.quick else 1.0)
    _check_memory(scenarios, scale, args.scale)
    invariance = None if args.no_invariance or verifier.tree else {"ks": (1, 4) if args.quick else (1, 3, 5)}
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("auditing", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        return run_audit(
            verifier,
            scenarios,
            scale=scale,
            seed=args.seed,
            alpha=args.alpha,
            device=args.device,
            invariance=invariance,
            progress=progress,
            tree_verifier=tree_verifier,
        )


def _check_memory(scenarios, scale: float, flag_value: float) -> None:
    """Refuse a --scale (flag_value; scale: with --quick's fraction) whose largest batched call cannot fit
    in this machine's memory, before anything runs."""
    from .runner import scaled_rows

    largest = max(scenarios, key=lambda s: scaled_rows(s, scale) * (s.positions + 1) * s.vocab)
    rows = scaled_rows(largest, scale)
    needed = rows * (largest.positions + 1) * largest.vocab * BYTES_PER_LOGIT
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > physical:
        raise _Invalid(
            f"--scale {flag_value:g} gives {largest.name} {rows:,} rows, about {needed / 2**30:,.1f} GiB, more than "
            f"this machine's {physical / 2**30:.1f} GiB: use a smaller --scale"
        )


def run_audit_command(args: argparse.Namespace) -> int:
    """Run `specverify audit` with parsed arguments -> exit status (0 pass, 1 fail, 2 bad arguments)."""
    try:
        _check(args)
        from rich.console import Console

        from .report import print_report, report_json

        console = Console(highlight=False)
        audit = _audit(args, console)
    except _Invalid as err:
        print(f"specverify audit: error: {err}", file=sys.stderr)
        return 2
    print_report(audit, console)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report_json(audit), indent=1) + "\n")
        console.print(f"[dim]JSON report: {args.json}[/dim]")
    if args.plots:
        from .plots import write_plots

        written = write_plots(audit, args.plots)
        console.print(f"[dim]{len(written)} figures in {args.plots}[/dim]")
    return 0 if audit.passed else 1
