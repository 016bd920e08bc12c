"""Fresh installs of the package, as a user makes them, for the tests of the command on every install.

Each is a new venv in which `pip install -e '<repository>[EXTRA]'` (or no extra: the core install) runs as
a user runs it, pip resolving the extra's requirements. torch is the one exception: a gigabyte per venv,
it is installed once per session into a venv of its own (`torch_venv`, torch and numpy alone, from
wherever pip finds `torch==2.13.0`: the local CPU wheel on CI), whose site-packages each install's venv
reads through a .pth file, so that pip there finds `torch==2.13.0` and `numpy` already installed and
installs nothing else beside them. pip byte-compiles nothing (--no-compile): Python compiles what a
command imports as it runs, and compiling all of torch and transformers would take longer than the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from specverify.usage import TORCH_REQUIREMENT
from tests.support.paths import ROOT

#: What pip may take at most for one install (downloads on a cold cache included).
PIP_TIMEOUT = 900


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _site_packages(venv: Path) -> Path:
    """The venv's site-packages (purelib), computed as the venv's Python computes it."""
    scheme_paths = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})
    return Path(scheme_paths["purelib"])


def new_venv(folder: Path) -> Path:
    """A fresh venv at folder, made by this interpreter's Python -> its bin folder."""
    _run([sys.executable, "-m", "venv", str(folder)], f"python -m venv {folder}")
    return folder / "bin"


def torch_venv(folder: Path) -> Path:
    """A venv with torch and numpy alone -> its site-packages, for `install` to share."""
    python = new_venv(folder) / "python"
    _run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", TORCH_REQUIREMENT, "numpy"],
        f"pip install {TORCH_REQUIREMENT}",
    )
    return _site_packages(folder)


def install(folder: Path, extra: str | None, torch_site: Path) -> Path:
    """A fresh venv at folder with the package installed from the repository with `extra` (None: the core
    install), torch read from torch_site -> the venv's bin folder (its `specverify` command)."""
    bin_folder = new_venv(folder)
    (_site_packages(folder) / "shared-torch.pth").write_text(f"{torch_site}\n")
    target = f"{ROOT}[{extra}]" if extra else str(ROOT)
    _run(
        [str(bin_folder / "python"), "-m", "pip", "install", "-q", "--no-compile", "-e", target],
        f"pip install -e {target}",
    )
    return bin_folder


def command_environment(bin_folder: Path) -> dict[str, str]:
    """The environment a user's shell gives the venv's command: the venv's bin first on PATH, and nothing of
    this test process's own imports (PYTHONPATH) leaking in."""
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment["PATH"] = f"{bin_folder}{os.pathsep}{environment.get('PATH', '')}"
    environment["VIRTUAL_ENV"] = str(bin_folder.parent)
    return environment
