"""(slow) vLLM's OpenAI-compatible server with the plug-in on and n-gram speculation, started on a loopback port
by this module and stopped at its end: real /v1/completions answers; a bounded load test where 36 concurrent
seeded requests with mixed parameters (at least 32 running at once) all complete and each gives the token
ids it gives alone; requests with bad parameters get vLLM's 4xx while the server keeps serving; data
parallel 2 (two engine cores, each with the plug-in) gives the token ids of one engine.
"""

from __future__ import annotations

import json
import threading
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
    """LOAD seeded requests, each prompt with each parameter set in turn, lengths 8..40 tokens (min_tokens 8: every request stays in flight a while), token ids
    returned."""
    return [
        {"model": "smollm2", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 24 + (i * 5) % 17, "min_tokens": 8, "seed": 1000 + i,
         "return_token_ids": True, **SAMPLING[(i // len(PROMPTS)) % len(SAMPLING)]}
        for i in range(LOAD)
    ]  # fmt: skip


def _token_ids(answer: dict) -> list[int]:
    """The generated token ids of a completion answer (requested with return_token_ids)."""
    return answer["choices"][0]["token_ids"]


def _concurrently(server: support.Server, requests: list[dict]) -> tuple[list[tuple[int, dict]], int]:
    """Send every request at once -> (their (status, answer) in order, the most requests the server's
    /metrics showed in flight, running or waiting, at one time while they were served, over its engines)."""
    most, done = 0, threading.Event()

    def watch():
        nonlocal most
        while not done.is_set():
            in_flight = [
                support.metric_values(server, f"vllm:num_requests_{state}") for state in ("running", "waiting")
            ]
            most = max(most, int(sum(map(sum, in_flight))))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            answers = list(pool.map(lambda body: _complete(server, body), requests))
    finally:
        done.set()
        watcher.join()
    return answers, most


def _spec_decode_counts(server: support.Server) -> tuple[float, float]:
    """(draft tokens, accepted tokens) counted by the server since it started, over its engines."""
    drafted = sum(support.metric_values(server, "vllm:spec_decode_num_draft_tokens_total"))
    return drafted, sum(support.metric_values(server, "vllm:spec_decode_num_accepted_tokens_total"))


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
    """36 seeded requests sent at once (at least 32 in flight together by the server's own gauges) each give
    the token ids they give alone; none is empty, and the server drafted and accepted tokens meanwhile."""
    requests = _load_requests()
    solo = []
    for body in requests:
        status, answer = _complete(server, body)
        assert status == 200, (body, answer)
        solo.append(_token_ids(answer))
    assert all(solo), solo
    drafted, accepted = _spec_decode_counts(server)
    began = time.monotonic()
    answers, most_in_flight = _concurrently(server, requests)
    seconds = time.monotonic() - began
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    ids = [_token_ids(answer) for _, answer in answers]
    differing = [(i, requests[i], solo[i], ids[i]) for i in range(LOAD) if ids[i] != solo[i]]
    assert not differing, differing[:3]
    assert most_in_flight >= 32, most_in_flight
    now_drafted, now_accepted = _spec_decode_counts(server)
    assert now_drafted > drafted and now_accepted > accepted, (drafted, accepted, now_drafted, now_accepted)
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
