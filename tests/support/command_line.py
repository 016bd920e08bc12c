"""The `specverify` command line run in-process for the command-line tests: exit code, stdout and stderr."""

from __future__ import annotations

import torch

from specverify import cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    threads = torch.get_num_threads()  # generate sets its own (--threads)
    try:
        code = cli.main(list(argv))
    except SystemExit as done:  # argparse's own errors
        code = done.code
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    return code, out, err
