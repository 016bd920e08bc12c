"""(slow) Data-parallel engine cores started by another command, the multi-node pattern, on loopback.

First vLLM's own handshake code with the mark a front end with the plug-in adds (no engine). Then a front end
with the plug-in (the OpenAI server, `--data-parallel-size 2 --data-parallel-size-local 1`: its own engine core
is rank 0) and engine core rank 1 started by vLLM's command line, `vllm serve MODEL --headless
--data-parallel-start-rank 1`, as another node would start it.

Without SPECVERIFY_VLLM=1 the headless engine core fails its start with the plug-in's message, before it loads
the model, and the front end never serves (it keeps waiting for that engine core, as vLLM's front end waits for
any remote one that does not start). With it, both engine cores log the plug-in's line, and the same seeded
sampled requests (min-p among them) sent to each rank (vLLM's X-data-parallel-rank header) give the same token
ids on both, with drafts proposed and accepted on both.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations import vllm_support as support
from tests.integrations.test_vllm_server import PROMPTS, SAMPLING

pytestmark = pytest.mark.slow

#: Seconds the headless engine core may take to refuse, and the pair to start.
REFUSAL_TIMEOUT, START_TIMEOUT = 300, 420
PLUGIN_LINE = "specverify plug-in on (vLLM 0.32"
PROBE = Path(__file__).with_name("vllm_handshake_probe.py")
#: Seeded sampled requests: every sampling set of the server tests but greedy, on two prompts each.
REQUESTS = [
    {"model": "smollm2", "prompt": PROMPTS[(2 * i + j) % len(PROMPTS)], "max_tokens": 24, "seed": 500 + 2 * i + j,
     "return_token_ids": True, **sampling}
    for i, sampling in enumerate(SAMPLING[1:]) for j in range(2)
]  # fmt: skip


def _data_parallel(rpc_port: int) -> tuple[str, ...]:
    """What the front end and the headless engine core share: n-gram speculation, two data-parallel ranks of
    which each process runs one, the front end's handshake on 127.0.0.1:rpc_port."""
    return (
        "--speculative-config", json.dumps(support.NGRAM), "--data-parallel-size", "2",
        "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
        "--data-parallel-rpc-port", str(rpc_port),
    )  # fmt: skip


def _front_end(folder, rpc_port: int, stop_grace: float = 60):
    """The OpenAI server with the plug-in and engine core rank 0 (threads on CPU 0), not waited for."""
    return support.serve(
        support.model_folder(), folder, *_data_parallel(rpc_port), env={"VLLM_CPU_OMP_THREADS_BIND": "0"},
        ready=False, stop_grace=stop_grace,
    )  # fmt: skip


def _engine_core(folder, rpc_port: int, plugin: bool):
    """Engine core rank 1 (threads on CPU 1), headless, with SPECVERIFY_VLLM=1 or without it."""
    return support.headless(
        support.model_folder(), folder, *_data_parallel(rpc_port), "--data-parallel-start-rank", "1",
        plugin=plugin, env={"VLLM_CPU_OMP_THREADS_BIND": "1"},
    )  # fmt: skip


def test_vllms_own_handshake_carries_the_mark_and_nothing_else_changes(tmp_path):
    """vllm_handshake_probe.py: vLLM's engine-core side of the handshake, over real sockets, reads a marked init
    message as it reads a stock one (same addresses, same entries) plus the mark on its ParallelConfig."""
    python = support.require_vllm()
    done = subprocess.run(
        [str(python), str(PROBE)], cwd=tmp_path, env=support.environment(False), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["stock"] == {"mark": None, "verdict": "accepted"}, read
    assert read["marked"]["mark"] == 1 and read["marked"]["verdict"].startswith("refused: this data-parallel"), read
    assert read["marked"]["verdict_with_plugin"] == "accepted", read
    assert read["same_addresses"] and read["same_size"], read


def test_a_headless_engine_core_without_the_opt_in_refuses_a_front_end_with_the_plugin(tmp_path):
    support.require_vllm()
    rpc_port = support.free_port()
    # the front end then waits for engine core 1 and ignores SIGINT: stopped by SIGKILL after 5 s
    with _front_end(tmp_path, rpc_port, stop_grace=5) as front, _engine_core(tmp_path, rpc_port, False) as core:
        try:
            core.wait(timeout=REFUSAL_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the headless engine core still runs after {REFUSAL_TIMEOUT} s:\n{_log(tmp_path)[-4000:]}")
        log = _log(tmp_path)  # `vllm serve --headless` exits with status 0 whatever its engine cores did
        assert "EngineCore failed to start." in log, log[-4000:]
        assert "EngineCoreWithoutPlugin: this data-parallel engine core (rank 1)" in log, log[-4000:]
        assert "set SPECVERIFY_VLLM=1 in this engine core's environment (on its node)" in log, log[-4000:]
        assert "Starting to load model" not in log, "the engine core refused only after loading the model"
        assert PLUGIN_LINE not in log
        assert front.process.poll() is None and not front.healthy(), front.output()[-4000:]


def test_a_headless_engine_core_with_the_opt_in_serves_with_the_plugin(tmp_path):
    support.require_vllm()
    rpc_port = support.free_port()
    with _front_end(tmp_path, rpc_port) as front, _engine_core(tmp_path, rpc_port, True):
        support.wait_until_healthy(front, START_TIMEOUT)
        assert front.output().count(PLUGIN_LINE) == 1 and _log(tmp_path).count(PLUGIN_LINE) == 1, _log(tmp_path)[-4000:]
        before = {rank: _drafts(front, rank) for rank in (0, 1)}
        answers = {rank: _on_rank(front, rank) for rank in (0, 1)}
        for rank, ranked in answers.items():
            assert all(status == 200 for status, _ in ranked), (rank, [a for a in ranked if a[0] != 200][:2])
        ids = {rank: [answer["choices"][0]["token_ids"] for _, answer in ranked] for rank, ranked in answers.items()}
        assert all(ids[0]) and sum(map(len, ids[0])) >= 100, ids[0]
        differing = [(i, a, b) for i, (a, b) in enumerate(zip(ids[0], ids[1])) if a != b]
        assert not differing, differing[:2]
        for rank in (0, 1):
            drafted, accepted = _drafts(front, rank)
            assert drafted > before[rank][0] and accepted > before[rank][1], (rank, before[rank], drafted, accepted)


def _on_rank(front: support.Server, rank: int) -> list[tuple[int, dict]]:
    """Every request at once, all to data-parallel rank `rank` -> their (status, answer) in order."""
    header = {"X-data-parallel-rank": str(rank)}
    with ThreadPoolExecutor(max_workers=len(REQUESTS)) as pool:
        return list(pool.map(lambda body: front.request("POST", "/v1/completions", body, 240, header), REQUESTS))


def _drafts(front: support.Server, rank: int) -> tuple[float, float]:
    """(draft tokens, accepted tokens) counted by engine core `rank` since it started (/metrics)."""
    label = f'engine="{rank}"'
    return tuple(
        sum(support.metric_values(front, f"vllm:spec_decode_num_{name}_tokens_total", label))
        for name in ("draft", "accepted")
    )


def _log(folder) -> str:
    return (folder / "headless.log").read_text(errors="replace")
