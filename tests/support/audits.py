"""Audit runs that several test modules read, made once per test session: `quick_audit` of a deliberately wrong
verifier is read by test_audit_command.py (what it flags) and test_audit_doc.py (what docs/audit.md says)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from specverify.audit.__main__ import main
from tests.support.paths import WRONG_VERIFIERS


def audit(*options: str) -> tuple[int, dict]:
    """`specverify audit` with these options -> (exit status, its JSON report)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        code = main([*options, "--json", str(report)])
        return code, json.loads(report.read_text())


@functools.cache
def quick_audit_of_wrong(name: str) -> tuple[int, dict]:
    """`specverify audit --quick` of the wrong verifier `name` of tests/support/wrong_verifiers.py, once a
    session -> (exit status, its JSON report); callers must not change the report."""
    return audit("--quick", "--verifier", f"{WRONG_VERIFIERS}:{name}")
