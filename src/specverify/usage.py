"""What every command shares with its user: `UsageError` (a mistake the user can fix, shown as one line,
exit status 2), the check that an extra's modules are installed, with the one command that installs them,
and `--json [FILE]` (check, bench): the results as one JSON object instead of the summary, or in a file."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

#: The torch build specverify is pinned to (pyproject.toml), named in every install hint.
TORCH_REQUIREMENT = "torch==2.13.0"


class UsageError(Exception):
    """Bad input from the command line, or a missing extra; the message is shown as is."""


def install_command(extras: str) -> str:
    """The command, run from the repository root, that installs the package with these extras
    (comma-separated) into this interpreter."""
    return f"{sys.executable} -m pip install {TORCH_REQUIREMENT} -e '.[{extras}]'"


def require_modules(modules: Sequence[str], what: str, extra: str = "demo") -> None:
    """Raise UsageError naming the missing modules and the install command unless every module of
    `modules` can be imported. what: the flag or command that needs them; extra: the extra that
    installs them (installed beside the demo extra)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extras = "demo" if extra == "demo" else f"demo,{extra}"
        raise UsageError(
            f"{what} needs the {extra} extra ({', '.join(missing)} not installed); from the repository root run: "
            f"{install_command(extras)}"
        )


#: --json without FILE: the JSON object on stdout, instead of the summary for a person.
JSON_TO_STDOUT = "-"


def json_destination_problem(destination: str | None) -> str | None:
    """Why the --json FILE given cannot be written (its folder does not exist), or None; checked before the
    command works, so that its results are not lost at the end."""
    if destination in (None, JSON_TO_STDOUT) or Path(destination).parent.is_dir():
        return None
    return f"--json {destination}: its folder {Path(destination).parent} does not exist"


def show_results(destination: str | None, results: dict, for_a_person: Callable[[], None]) -> None:
    """A command's results as --json asks: the one JSON object on stdout instead of for_a_person() (without
    FILE), written to FILE beside it, or for_a_person() alone (no --json)."""
    if destination == JSON_TO_STDOUT:
        print(json.dumps(results, default=float))
        return
    if destination is not None:
        Path(destination).write_text(json.dumps(results, default=float) + "\n")
    for_a_person()
