"""(slow) Preemption under speculation: vLLM's OpenAI server with the plug-in, n-gram speculation and a KV
cache of 6 blocks of 32 tokens, too small for five ~75-token requests at once, so requests are preempted
and recomputed (`vllm:num_preemptions` on /metrics); every seeded request still gives the token ids one
engine gives it without speculation and with room to spare (run first, offline, with the plug-in).
"""

from __future__ import annotations

import json

import pytest

from tests.integrations import vllm_support as support
from tests.integrations.test_vllm_server import _concurrently, _token_ids

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat this sentence twice: the cat sat on the mat.",
    "List the numbers from 1 to 20: 1, 2, 3,",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
]
SAMPLING = [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.0, "top_k": 20},
            {"temperature": 0.9, "min_p": 0.05}, {"temperature": 0.7}]  # fmt: skip


def _requests() -> list[dict]:
    return [
        {"model": "smollm2", "prompt": prompt, "max_tokens": 64, "min_tokens": 48, "seed": 500 + i,
         "return_token_ids": True, **SAMPLING[i]}
        for i, prompt in enumerate(PROMPTS)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def roomy_plain(tmp_path_factory) -> list[list[int]]:
    """The requests' token ids from one engine with the plug-in, no speculation and the default KV cache."""
    return support.plain_token_ids(_requests(), tmp_path_factory.mktemp("roomy"))


@pytest.fixture(scope="module")
def cramped(tmp_path_factory, roomy_plain):
    with support.serve(
        support.model_folder(),
        tmp_path_factory.mktemp("cramped"),
        "--speculative-config",
        json.dumps(support.NGRAM),
        "--num-gpu-blocks-override",
        "6",
        "--block-size",
        "32",
        "--max-model-len",
        "160",  # what 6 blocks of 32 hold, less vLLM's margin (it refuses a longer one)
    ) as running:
        yield running


def test_preempted_requests_keep_their_tokens(cramped, roomy_plain):
    assert all(len(ids) >= 48 for ids in roomy_plain), roomy_plain
    answers, _ = _concurrently(cramped, _requests())
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    preemptions = sum(support.metric_values(cramped, "vllm:num_preemptions_total"))
    assert preemptions > 0, "no request was preempted: the test shows nothing"
    drafted = sum(support.metric_values(cramped, "vllm:spec_decode_num_draft_tokens_total"))
    assert drafted > 0
    ids = [_token_ids(answer) for _, answer in answers]
    differing = [(i, roomy_plain[i], ids[i]) for i in range(len(ids)) if ids[i] != roomy_plain[i]]
    assert not differing, differing[:2]
