"""(slow) The `specverify` command on every install: the core install (torch and numpy, no extra) and each
extra alone, each a fresh venv made with pip as a user makes it (tests/support/installs.py). In each, every
command's --help (`specverify --help` by the installed command, the others in one process of the venv's
Python, to import torch once), and each command's quickest real run: `check` and `bench` run on the core
install; `audit` runs where its modules are (the audit and test extras) and `generate` where the demo extra
is; elsewhere each says in one line which extra it needs and the pip command, exit status 2, no traceback."""

from __future__ import annotations

import subprocess

import pytest

from specverify.usage import TORCH_REQUIREMENT
from tests.support import installs

pytestmark = pytest.mark.slow

#: The installs: None is the core install.
EXTRAS = [None, "audit", "demo", "test", "llamacpp"]
#: Where `specverify audit` and `specverify generate` have what they need.
RUNS_AUDIT = {"audit", "test"}
RUNS_GENERATE = {"demo"}
COMMANDS = ["generate", "audit", "bench", "check"]


@pytest.fixture(scope="session")
def torch_site(tmp_path_factory):
    return installs.torch_venv(tmp_path_factory.mktemp("torch-venv"))


@pytest.fixture(scope="session", params=EXTRAS, ids=lambda extra: extra or "core")
def installed(request, tmp_path_factory, torch_site):
    """(extra, bin folder) of a fresh install with that extra alone (None: the core install)."""
    extra = request.param
    return extra, installs.install(tmp_path_factory.mktemp(f"install-{extra or 'core'}"), extra, torch_site)


def start(installed, *argv: str) -> subprocess.Popen:
    """The install's `specverify` command started as a user's shell starts it (the venv's bin first on PATH),
    in the venv's folder, its output piped."""
    _, bin_folder = installed
    return subprocess.Popen(
        [str(bin_folder / "specverify"), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=installs.command_environment(bin_folder),
        cwd=bin_folder.parent,
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def specverify(installed, *argv: str) -> subprocess.CompletedProcess:
    return finish(start(installed, *argv))


def names_its_extra(done: subprocess.CompletedProcess, command: str, extra: str, bin_folder) -> None:
    """The command stopped before any work with one line on stderr naming the extra it needs and the pip
    command that installs it into this venv, exit status 2."""
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr.startswith(f"specverify {command}: error: ") and f"needs the {extra} extra (" in done.stderr
    assert f" run: {bin_folder}/python" in done.stderr
    assert done.stderr.endswith(f" -m pip install {TORCH_REQUIREMENT} -e '.[{extra}]'\n"), done.stderr


#: Each command's --help in one process of the install's Python (one import of torch, not four), the
#: outputs separated by a line of its own.
HELPS = f"""
import sys
from specverify.cli import main
for command in {COMMANDS!r}:
    try:
        main([command, "--help"])
    except SystemExit as done:
        assert done.code == 0, (command, done.code)
    print("-" * 20)
"""


def test_every_command_s_help(installed):
    """`specverify --help` run by the install's command, and each command's --help in its Python."""
    _, bin_folder = installed
    top = start(installed, "--help")
    each = subprocess.run(
        [str(bin_folder / "python"), "-c", HELPS],
        capture_output=True,
        text=True,
        timeout=300,
        env=installs.command_environment(bin_folder),
    )
    done = finish(top)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("usage: specverify "), done.stderr
    assert each.returncode == 0 and each.stderr == "", each.stderr[-2000:]
    helps = each.stdout.split("-" * 20 + "\n")[:-1]
    assert [h.split()[:3] for h in helps] == [["usage:", "specverify", command] for command in COMMANDS], helps


def test_check_and_bench_run(installed):
    done = specverify(installed, "check", "--quick", "--sections", "exactness")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("PASSED: exactness in ")
    done = specverify(installed, "bench", "-B", "2", "-K", "1", "-V", "64", "--repeats", "1", "--modes", "greedy")
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(line.startswith("all greedy, validate=False ") for line in done.stdout.splitlines())


def quick_lossless_scenarios() -> int:
    """How many lossless scenarios `specverify audit --quick` runs, counted from the matrix it runs."""
    from specverify.audit.trees import audited_verifiers
    from specverify.audit.verifier import DEFAULT_VERIFIER

    _, _, matrix = audited_verifiers(DEFAULT_VERIFIER, tree=False)
    return sum(s.quick and s.lossless for s in matrix)


def test_audit_runs_or_names_its_extra(installed):
    extra, bin_folder = installed
    done = specverify(installed, "audit", "--quick")
    if extra in RUNS_AUDIT:
        quick = quick_lossless_scenarios()
        assert quick > 0, "the quick audit has no lossless scenario to run"
        expected = f"PASS · {quick}/{quick} lossless scenarios pass"
        assert done.returncode == 0 and expected in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
        return
    names_its_extra(done, "audit", "audit", bin_folder)


def test_generate_runs_or_names_its_extra(installed, model_folder):
    extra, bin_folder = installed
    done = specverify(installed, "generate", "w3 w4 w5 w3 w4", "--model", str(model_folder), "--max-tokens", "6")
    if extra in RUNS_GENERATE:
        assert done.returncode == 0 and "speculative decoding" in done.stdout, done.stderr[-2000:]
        return
    names_its_extra(done, "generate", "demo", bin_folder)
