"""The `specverify` command: it parses and dispatches; each command's arguments and logic live beside
its subject (`decoding.command`, `audit.command`, `bench.command`, `check.command`).

Errors a user can fix (bad arguments, a missing extra or model package) end the command with one line on
stderr that says what to do, and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .usage import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _add_generate(commands: argparse._SubParsersAction) -> None:
    from .decoding.command import HELP, add_generate_arguments

    add_generate_arguments(commands.add_parser("generate", help=HELP))


def _add_audit(commands: argparse._SubParsersAction) -> None:
    from .audit import add_audit_arguments

    add_audit_arguments(commands.add_parser("audit", help="prove a verifier lossless against exact float64 laws"))


def _add_bench(commands: argparse._SubParsersAction) -> None:
    from .bench.command import DESCRIPTION, HELP, add_bench_arguments

    add_bench_arguments(commands.add_parser("bench", help=HELP, description=DESCRIPTION))


def _add_check(commands: argparse._SubParsersAction) -> None:
    from .check import add_check_arguments

    add_check_arguments(commands.add_parser("check", help="check parity, exactness and timing on the device at hand"))


#: The subcommands, in the order `specverify --help` lists them: one line per command.
COMMANDS = (_add_generate, _add_audit, _add_bench, _add_check)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specverify", description="Lossless verification of speculative-decoding drafts.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return parser


#: The exit status of a command stopped by Ctrl-C (SIGINT), as a shell reports it: 128 + 2.
INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    command = "specverify"
    try:
        args = build_parser().parse_args(argv)
        command = f"specverify {args.command}"
        return args.run(args)
    except UsageError as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if sys.stdout.isatty():  # end a line the streamed text may have left open
            print()
        print(f"{command}: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
