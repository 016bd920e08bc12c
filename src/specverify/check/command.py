"""`specverify check`: the device check's arguments and its run. Heavy imports (the sections) wait for the
run, so building the `specverify` parser stays cheap.

    specverify check                        # the device at hand: on cuda (Triton kernels) against the CPU, or
                                            # on a machine without CUDA the CPU's kernels against its torch path
    python -m specverify.check --device cuda
                                            # on cuda, against the CPU; exits 0 with a message without CUDA
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
import json

DESCRIPTION = (
    "Check specverify on the device at hand (the candidate: CUDA where there is one, else the CPU): "
    "truncated_probs against the float64 oracle (exactness), committed tokens against exact laws by chi-square, "
    "with power (statistics), every token against the same call on a reference (the CPU; on the CPU, its torch "
    "reference path), each difference classified (parity), and the cost of a call beside one read of the "
    "logits (timing); where vLLM is installed, its engine with the specverify plug-in, seeded requests compared with n-gram "
    "speculation on and off (vllm). The last line of the output is one JSON object with every result. Exit status 0 when "
    "every check passed (or --device cuda finds no CUDA device), 1 when one failed, 2 on bad arguments."
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
        "--vllm-stock",
        action="store_true",
        help="self-test of the vllm section: the same comparison on stock vLLM, without the plug-in (expected to fail)",
    )
    parser.set_defaults(run=run_check_command)


def run_check_command(args: argparse.Namespace) -> int:
    """Run the device check with parsed arguments -> exit status (0 pass or no CUDA device, 1 fail, 2 an
    unusable device). Prints the report, then its JSON on the last line."""
    import torch

    from .report import print_report, run_checks
    from .targets import Target

    reference_fallback = args.reference_fallback
    if args.device == "auto":  # the device at hand; on the CPU its compiled kernels against its torch path
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        reference_fallback = reference_fallback or (
            args.device == "cpu" and args.reference == "cpu" and not args.candidate_fallback
        )
    for device in (args.device, args.reference):
        if device.startswith("cuda") and not torch.cuda.is_available():
            print(
                f"specverify check: no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False); "
                "nothing was checked. Use --device cpu --candidate-fallback to run the same checks on the CPU."
            )
            print(json.dumps(dict(skipped=True, reason="no CUDA device", passed=True)))
            return 0
        try:
            torch.empty(1, device=device)
        except (RuntimeError, AssertionError) as error:
            print(f"specverify check: cannot use device {device!r}: {error}")
            print(json.dumps(dict(skipped=True, reason=f"device {device} unusable", passed=False)))
            return 2

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
    )
    print_report(report)
    print(json.dumps(report, default=float))
    return 0 if report["passed"] else 1
