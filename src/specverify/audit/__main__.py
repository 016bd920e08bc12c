"""`python -m specverify.audit [options]`: the audit without the `specverify` command."""

from __future__ import annotations

import argparse
import sys

from .command import add_audit_arguments, run_audit_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specverify.audit")
    add_audit_arguments(parser)
    return run_audit_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
