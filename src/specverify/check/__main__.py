"""`python -m specverify.check [options]`: the device check without the `specverify` command."""

from __future__ import annotations

import argparse
import sys

from .command import add_check_arguments, run_check_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specverify.check")
    add_check_arguments(parser)
    return run_check_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
