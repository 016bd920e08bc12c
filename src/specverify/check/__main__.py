"""`python -m specverify.check [options]`: the device check without the `specverify` command."""

from __future__ import annotations

import argparse
import sys

from ..usage import UsageError
from .command import add_check_arguments, run_check_command

PROG = "python -m specverify.check"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG)
    add_check_arguments(parser)
    try:
        return run_check_command(parser.parse_args(argv))
    except UsageError as err:  # one line and exit status 2, as `specverify check` shows it
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
