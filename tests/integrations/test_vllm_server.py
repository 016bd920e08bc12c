"""(slow) vLLM's OpenAI-compatible server with the plug-in on and n-gram speculation, started on a loopback port
by this module and stopped at its end: real /v1/completions answers; a bounded load test where 36 concurrent
seeded requests with mixed parameters all complete and each equals its output when sent alone; requests
with bad parameters get vLLM's 4xx while the server keeps serving.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integrations import vllm_support as support

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat this sentence twice: the cat sat on the mat.",
    "The capital of France is",
    "List the numbers from 1 to 20: 1, 2, 3,",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Name three colours:",
]
SAMPLING = [
    {"temperature": 0.0},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 20},
    {"temperature": 1.0, "min_p": 0.1},
    {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 0.6},
]
LOAD = 36  # concurrent requests in the load test
REQUEST_TIMEOUT = 240  # seconds, per request


def _load_requests() -> list[dict]:
    """LOAD seeded requests, each prompt with each parameter set in turn, lengths 12..28 tokens."""
    return [
        {"model": "smollm2", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 12 + (i * 5) % 17, "seed": 1000 + i,
         **SAMPLING[(i // len(PROMPTS)) % len(SAMPLING)]}
        for i in range(LOAD)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    support.require_vllm()
    model = support.model_folder()
    with support.serve(
        model, tmp_path_factory.mktemp("server"), "--speculative-config", json.dumps(support.NGRAM)
    ) as running:
        yield running
    assert running.process.poll() is not None, "the server is still running after the module"


def _complete(server: support.Server, body: dict) -> tuple[int, dict]:
    return server.request("POST", "/v1/completions", body, timeout=REQUEST_TIMEOUT)


def test_the_server_answers_completions_with_the_plugin_on(server):
    status, body = _complete(
        server, {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    )
    assert status == 200, body
    choice = body["choices"][0]
    assert "Paris" in choice["text"] and body["usage"]["completion_tokens"] <= 8
    assert "specverify plug-in on (vLLM 0.32" in server.output()
    assert "drafts by specverify.stochastic_acceptance_sampler" in server.output()
    seeded = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "seed": 7}
    first, second = _complete(server, seeded), _complete(server, seeded)
    assert first[0] == second[0] == 200 and first[1]["choices"][0]["text"] == second[1]["choices"][0]["text"]


def test_concurrent_seeded_requests_all_complete_and_each_equals_its_solo_output(server):
    requests = _load_requests()
    solo = []
    for body in requests:
        status, answer = _complete(server, body)
        assert status == 200, (body, answer)
        solo.append(answer["choices"][0]["text"])
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=LOAD) as pool:
        answers = list(pool.map(lambda body: _complete(server, body), requests))
    seconds = time.monotonic() - began
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    texts = [answer["choices"][0]["text"] for _, answer in answers]
    differing = [(i, requests[i], solo[i], texts[i]) for i in range(LOAD) if texts[i] != solo[i]]
    assert not differing, differing[:3]
    assert seconds < REQUEST_TIMEOUT


@pytest.mark.parametrize(
    ("change", "named"),
    [({"top_p": 2}, "top_p"), ({"temperature": -1}, "temperature"), ({"seed": "abc"}, "seed")],
)
def test_bad_parameters_get_a_4xx_and_the_server_keeps_serving(server, change, named):
    body = {"model": "smollm2", "prompt": "Hello", "max_tokens": 4, "temperature": 0.5, "seed": 1, **change}
    status, answer = _complete(server, body)
    assert 400 <= status < 500, (status, answer)
    assert named in json.dumps(answer), answer
    status, answer = _complete(server, {"model": "smollm2", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert status == 200 and answer["choices"][0]["text"], answer
