"""(slow) `specverify check`'s vllm section as a user runs it, in the vLLM venv: with the plug-in, every
seeded request of the check gives the same tokens with n-gram speculation on and off (exit status 0, the
backend named); on stock vLLM the same comparison (its requests without min-p and top-k, which stock refuses or mishandles with speculation) fails (exit status
1): the check has power."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integrations import vllm_support as support

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stock", [False, True], ids=["plug-in", "stock vLLM"])
def test_the_check_passes_with_the_plugin_and_fails_on_stock_vllm(stock, tmp_path):
    python = support.require_vllm()
    result = tmp_path / "check.json"
    argv = [str(python), "-m", "specverify.check", "--sections", "vllm", "--vllm-model", str(support.model_folder())]
    argv += ["--json", str(result)]
    done = subprocess.run(
        [*argv, *(["--vllm-stock"] if stock else [])],
        cwd=tmp_path,
        env=support.environment(plugin=False),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    report = json.loads(result.read_text())["vllm"]
    assert "requests" in report, done.stdout[-3000:] + done.stderr[-3000:]
    identical = [request["identical"] for request in report["requests"]]
    if stock:
        assert done.returncode == 1 and not report["passed"] and not all(identical), done.stdout
        assert "FAIL" in done.stdout and "stock vLLM" in report["plug_in"]
    else:
        assert done.returncode == 0 and report["passed"] and all(identical), done.stdout
        assert "vllm        PASS  4 of 4 seeded requests identical" in done.stdout
        assert "backend native (compiled C kernels) on cpu" in report["plug_in"]
