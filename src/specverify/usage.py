"""What every command shares with its user: `UsageError` (a mistake the user can fix, shown as one line,
exit status 2) and the check that an extra's modules are installed, with the one command that installs them."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

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
