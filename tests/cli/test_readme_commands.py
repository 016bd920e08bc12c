"""(slow) The README's command lines as a person runs them: in a fresh clone of this repository (`git clone`,
so what is committed), each line of its bash blocks in the README's order, typed into bash in a real
pseudo-terminal of 80 columns whose screen a VT100 emulator (pyte) renders, after the lines before it that
change the shell (`source .venv/bin/activate`). `make demo` builds the clone's own .venv, and every later
line runs in it as the README says. A line shown twice runs once. Not run: the vLLM server line (a
placeholder MODEL, and a server that runs until stopped: tests/integrations/test_vllm_server.py starts it
from the vLLM venv)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import README, ROOT

pexpect = pytest.importorskip("pexpect", reason="pip install -e '.[test]'")
pyte = pytest.importorskip("pyte", reason="pip install -e '.[test]'")

pytestmark = pytest.mark.slow

COLUMNS, ROWS = 80, 1000
#: Lines of the README's bash blocks not run here, each with why (the module docstring).
NOT_RUN = ("vllm.entrypoints",)
#: Lines that change the shell for the lines after them.
SHELL_STATE = ("source ", "cd ", "export ")
#: A spinner's frames (rich's "dots"): none may stay on a final screen.
SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")


def readme_command_lines(text: str) -> list[str]:
    """Each command line of the README's ```bash blocks, in order, its trailing comment cut, once each."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#") and command not in lines:
                lines.append(command)
    return lines


def test_the_readme_shows_the_lines_a_user_needs():
    lines = readme_command_lines(README.read_text())
    assert lines[:2] == ["make demo", "source .venv/bin/activate"]  # how to reach the command after make demo
    assert {"specverify audit", "specverify bench", "specverify check"} <= set(lines)
    assert any(
        line.startswith("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu") for line in lines
    )


class Shell:
    """One command line run by bash in a pseudo-terminal of COLUMNS columns, the screen rendered by pyte;
    the longest silence between two writes is kept (what a person waits without a sign of life)."""

    def __init__(self, command: str, cwd: Path, timeout: float):
        self.screen = pyte.Screen(COLUMNS, ROWS)
        stream = pyte.ByteStream(self.screen)
        child = pexpect.spawn(
            "bash", ["-c", command], cwd=str(cwd), env=_user_environment(), dimensions=(ROWS, COLUMNS)
        )
        self.longest_silence, last, deadline = 0.0, time.monotonic(), time.monotonic() + timeout
        while True:
            try:
                stream.feed(child.read_nonblocking(65536, timeout=max(deadline - time.monotonic(), 0.1)))
            except pexpect.EOF:
                break
            except pexpect.TIMEOUT:
                child.terminate(force=True)
                raise AssertionError(f"{command!r} ran past {timeout} s; screen:\n{self.text()}") from None
            now = time.monotonic()
            self.longest_silence, last = max(self.longest_silence, now - last), now
        child.close()
        self.status = child.exitstatus if child.exitstatus is not None else 128 + child.signalstatus

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]

    def text(self) -> str:
        return "\n".join(self.lines())


def _user_environment() -> dict[str, str]:
    """A person's shell: this test's venv neither active nor on PATH, the terminal's size in the environment."""
    own_bin = str(Path(sys.executable).parent)
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST")}
    environment["PATH"] = os.pathsep.join(p for p in environment.get("PATH", "").split(os.pathsep) if p != own_bin)
    return {**environment, "TERM": "xterm-256color", "COLUMNS": str(COLUMNS), "LINES": str(ROWS)}


#: What each line must leave on the screen besides exit status 0: (substring of the screen's text, or a check).
SCREENS = {
    "make demo": lambda s: "identical text" in s.text(),
    "specverify audit": lambda s: "PASS · " in s.text() and "lossless scenarios pass" in s.text(),
    "specverify check": lambda s: s.lines()[-1].startswith("PASSED: "),
    "specverify bench": lambda s: s.lines()[-1].endswith("over the logits' bytes") and "{" not in s.text(),
}
#: The longest a person may wait without a new word on the screen, where the README's commands work for long.
LONGEST_SILENCE = {"specverify bench": 10.0, "specverify check": 20.0}


def test_every_readme_line_runs_as_written_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True, timeout=300)
    shell_state: list[str] = []
    for line in readme_command_lines((clone / "README.md").read_text()):
        if any(marker in line for marker in NOT_RUN):
            continue
        started = time.monotonic()
        run = Shell(" && ".join([*shell_state, line]), clone, timeout=1200 if line.startswith("make") else 600)
        print(f"{line}: {time.monotonic() - started:.0f} s, longest silence {run.longest_silence:.1f} s")  # with -s
        assert run.status == 0, f"{line!r} exited {run.status}; screen:\n{run.text()[-4000:]}"
        assert not SPINNER & set(run.text()), f"{line!r} left a spinner on the screen:\n{run.text()[-2000:]}"
        if line in SCREENS:
            assert SCREENS[line](run), f"{line!r}; screen:\n{run.text()[-4000:]}"
        if line in LONGEST_SILENCE:
            assert run.longest_silence <= LONGEST_SILENCE[line], (line, run.longest_silence)
        if line.startswith(SHELL_STATE):
            shell_state.append(line)
