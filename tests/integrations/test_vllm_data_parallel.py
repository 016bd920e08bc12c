"""(slow) Data parallel 2 through vLLM's OpenAI server (`--data-parallel-size 2`, each engine core's threads
bound: `VLLM_CPU_OMP_THREADS_BIND="0|1"`), the plug-in on, n-gram speculation: both engine cores load the
plug-in and log its line, requests sent together are served with drafts proposed and accepted, and every
seeded request gives the token ids one engine gives it without speculation (run first, offline, with the
plug-in; a data-parallel engine is a whole model, so its logits are one engine's).
"""

from __future__ import annotations

import json

import pytest

from tests.integrations import vllm_support as support
from tests.integrations.test_vllm_server import (
    _concurrently,
    _load_requests,
    _most_in_flight,
    _spec_decode_counts,
    _token_ids,
)

pytestmark = pytest.mark.slow

REQUESTS = 16  # of the server test's load requests
ENGINE_CORES = 2


def _requests() -> list[dict]:
    return _load_requests()[:REQUESTS]


@pytest.fixture(scope="module")
def one_engine_plain(tmp_path_factory) -> list[list[int]]:
    """The requests' token ids from one engine with the plug-in and no speculation (LLM.generate)."""
    return support.plain_token_ids(_requests(), tmp_path_factory.mktemp("dp-ref"))


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory, one_engine_plain):
    with support.serve(
        support.model_folder(),
        tmp_path_factory.mktemp("dp-server"),
        "--speculative-config",
        json.dumps(support.NGRAM),
        "--data-parallel-size",
        str(ENGINE_CORES),
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
    ) as running:
        yield running


def test_each_engine_core_loads_the_plugin(data_parallel):
    assert data_parallel.output().count("specverify plug-in on (vLLM 0.32") == ENGINE_CORES, data_parallel.output()[
        -4000:
    ]


def test_data_parallel_with_speculation_gives_one_engines_plain_tokens(data_parallel, one_engine_plain):
    assert all(one_engine_plain) and sum(map(len, one_engine_plain)) >= 150, one_engine_plain
    drafted, accepted = _spec_decode_counts(data_parallel)
    answers, gauges = _concurrently(data_parallel, _requests())
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    ids = [_token_ids(answer) for _, answer in answers]
    differing = [(i, one_engine_plain[i], ids[i]) for i in range(REQUESTS) if ids[i] != one_engine_plain[i]]
    assert not differing, differing[:3]
    now_drafted, now_accepted = _spec_decode_counts(data_parallel)
    assert now_drafted > drafted and now_accepted > accepted, (drafted, accepted, now_drafted, now_accepted)
    assert _most_in_flight(gauges) >= REQUESTS // 2, gauges
