"""Where the files that tests read or run lie in the repository, computed once from this file's place (so a
test module's own depth in tests/ does not matter)."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
#: For the PYTHONPATH of subprocesses that import specverify from the source tree.
SRC = ROOT / "src"
README = ROOT / "README.md"
#: The known-wrong verifiers, as a file for `--verifier path/to/file.py:function`.
WRONG_VERIFIERS = SUPPORT / "wrong_verifiers.py"
#: The script that compiles every Triton kernel for real GPU targets.
COMPILE_TRITON = SUPPORT / "compile_triton.py"
