"""`specverify check`: the device check's arguments and its run. Heavy imports (the sections) wait for the
run, so building the `specverify` parser stays cheap.

    specverify check                        # the device at hand: on cuda (Triton kernels) against the CPU, or
                                            # on a machine without CUDA the CPU's kernels against its torch path
    python -m specverify.check --device cuda
                                            # on cuda, against the CPU; without CUDA: one line, exit 2
    python -m specverify.check --quick      # smaller sizes (about a minute on a GPU, plus Triton's compiles)
    python -m specverify.check --candidate-backend torch --quick
                                            # the torch reference path on CUDA instead
    python -m specverify.check --device cpu --candidate-fallback --quick
                                            # the same logic on the CPU: compiled kernels vs torch path
    TRITON_INTERPRET=1 python -m specverify.check --device cpu --candidate-backend triton --quick
                                            # the Triton kernels under the interpreter, on the CPU

On the GPU machine, with the project's sources on the path (no install needed), the whole GPU evidence is:

    PYTHONPATH=src python -m specverify.check --quick && PYTHONPATH=src python -m specverify.cli bench --device cuda
"""

from __future__ import annotations

import argparse

from ..usage import JSON_TO_STDOUT, UsageError, json_destination_problem, show_results

DESCRIPTION = (
    "Check specverify on the device at hand (the candidate: CUDA where there is one, else the CPU): "
    "truncated_probs against the float64 oracle (exactness), committed tokens against exact laws by chi-square, "
    "with power (statistics), every token against the same call on a reference (the CPU; on the CPU, its torch "
    "reference path), each difference classified (parity), and the cost of a call beside one read of the "
    "logits (timing); where vLLM is installed, its engine with the specverify plug-in, seeded requests compared "
    "with n-gram speculation on and off (vllm). A line on stderr as each section starts; the summary last; the "
    "whole report as JSON with --json. Exit status 0 when every section run passed, 1 when one failed or none "
    "could run, 2 on bad arguments or a device that is not there."
)
SECTIONS = ("exactness", "statistics", "parity", "timing", "vllm")


def _sections(text: str) -> tuple[str, ...]:
    """--sections: comma-separated names among SECTIONS, run in that order."""
    sections = tuple(s for s in text.split(",") if s)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sections {sorted(unknown)}")
    return sections


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the device check's options to `parser` (its description too, if it has none) and set
    `run=run_check_command` as a default, so a subcommand dispatcher can call `args.run(args)`."""
    from ..kernels import BACKENDS

    parser.description = parser.description or DESCRIPTION
    parser.add_argument(
        "--device", default="auto", help="the device under test (default auto: cuda if there is one, else cpu)"
    )
    parser.add_argument(
        "--reference",
        default="cpu",
        help="the device it is compared with (default: cpu; with --device "
        "auto on a machine without CUDA, the CPU's torch reference path)",
    )
    parser.add_argument(
        "--candidate-fallback", action="store_true", help="on the CPU: test the torch path (no compiled kernels)"
    )
    parser.add_argument(
        "--reference-fallback", action="store_true", help="on the CPU: the reference uses the torch path"
    )
    parser.add_argument(
        "--candidate-backend",
        choices=list(BACKENDS),
        default=None,
        help="force the candidate's backend (default: the device's own: CUDA -> triton, CPU -> native)",
    )
    parser.add_argument(
        "--perturb-ulps", type=int, default=0, help="self-test: nudge the candidate's float32 logits by N ulps"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--rows", type=int, default=None, help="rows per statistical group (default 20000, quick 4000)")
    parser.add_argument(
        "--rtol", type=float, default=1e-6, help="relative distance to a CDF boundary that explains a mismatch"
    )
    parser.add_argument(
        "--kept-set-mass", type=float, default=1e-4, help="largest differing mass of a kept-set difference"
    )
    parser.add_argument(
        "--sections",
        type=_sections,
        default=",".join(SECTIONS),
        help=f"the sections to run, comma-separated (default: {','.join(SECTIONS)})",
    )
    parser.add_argument(
        "--vllm-model",
        default=None,
        help="the model of the vllm section: a folder or a name vLLM loads offline (default: the embedded "
        "SmolLM2 from the model cache)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const=JSON_TO_STDOUT,
        metavar="FILE",
        help="the whole report as one JSON object: on stdout instead of the summary, or written to FILE",
    )
    parser.add_argument(
        "--vllm-stock",
        action="store_true",
        help="self-test of the vllm section: the same comparison on stock vLLM, without the plug-in (expected to fail)",
    )
    parser.set_defaults(run=run_check_command)


def run_check_command(args: argparse.Namespace) -> int:
    """Run the device check with parsed arguments -> exit status (0 every section run passed, 1 one failed or
    none ran). A line on stderr as each section starts, then the summary on stdout (or the JSON, --json).
    Raises UsageError naming the flag when a device asked for is not there."""
    import torch

    from .report import print_report, run_checks, say_section
    from .targets import Target

    reference_fallback = args.reference_fallback
    if args.device == "auto":  # the device at hand; on the CPU its compiled kernels against its torch path
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        reference_fallback = reference_fallback or (
            args.device == "cpu" and args.reference == "cpu" and not args.candidate_fallback
        )
    for flag, device in (("--device", args.device), ("--reference", args.reference)):
        _check_device(flag, device)
    problem = json_destination_problem(args.json)
    if problem is not None:
        raise UsageError(f"{problem}; nothing was checked")
    candidate = Target(
        args.device, native=not args.candidate_fallback, perturb_ulps=args.perturb_ulps, backend=args.candidate_backend
    )
    reference = Target(args.reference, native=not reference_fallback)
    rows = args.rows or (4000 if args.quick else 20_000)
    report = run_checks(
        candidate,
        reference,
        args.quick,
        rows,
        args.rtol,
        args.kept_set_mass,
        args.sections,
        args.vllm_model,
        args.vllm_stock,
        on_section=say_section,
    )
    show_results(args.json, report, lambda: print_report(report))
    return 0 if report["passed"] else 1


def _check_device(flag: str, device: str) -> None:
    """Raise UsageError naming the flag and the device unless tensors can be made on it."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"{flag} {device}: no CUDA device on this machine (torch {torch.__version__}: torch.cuda.is_available() "
            "is False); nothing was checked (--device cpu checks the CPU)"
        )
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as error:
        raise UsageError(
            f"{flag} {device}: not usable here ({str(error).splitlines()[0]}); nothing was checked"
        ) from None
