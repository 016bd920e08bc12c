"""The quick guard of the command on the core install, in the fast suite: a Python that does not find the extras'
modules (its path finder, wrapped, finds nothing of theirs: importing them fails and `find_spec` says None, as
where they are not installed) builds every command's parser, imports `specverify.decoding`, and refuses audit
and generate in one line each. test_installs.py runs every command in real fresh venvs (slow)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import SRC

#: The modules of the extras (pyproject's optional dependencies), and vLLM's.
EXTRAS = ("gguf", "transformers", "accelerate", "llama_cpp", "llguidance", "jsonschema", "rich", "matplotlib")
EXTRAS += ("scipy", "hypothesis", "triton", "pexpect", "pyte", "vllm")

WITHOUT_EXTRAS = f"""
import importlib.abc, importlib.machinery, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path[:] = [Hide() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
import specverify.decoding
from specverify.cli import main
if sys.argv[1:] == ["--every-help"]:  # each command's --help, one after the other in this process
    for argv in ([], ["generate"], ["audit"], ["bench"], ["check"]):
        try:
            main([*argv, "--help"])
        except SystemExit as done:
            assert done.code == 0, (argv, done.code)
    sys.exit(0)
sys.exit(main(sys.argv[1:]))
"""


def start(*argv: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-c", WITHOUT_EXTRAS, *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def without_extras(*argv: str) -> subprocess.CompletedProcess:
    return finish(start(*argv))


def test_every_parser_builds_and_a_missing_extra_is_one_line():
    helps = start("--every-help")
    refusals = {extra: start(*argv) for argv, extra in ((["audit", "--quick"], "audit"), (["generate", "hi"], "demo"))}
    done = finish(helps)  # the three side by side: each spends its second importing torch
    assert done.returncode == 0 and done.stdout.count("usage: specverify") == 5, done.stderr[-2000:]
    for extra, process in refusals.items():
        done = finish(process)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
        assert f"needs the {extra} extra (" in done.stderr and f"-e '.[{extra}]'" in done.stderr
