"""(slow) vLLM's OpenAI-compatible server with the plug-in on and n-gram speculation, started on a loopback port
by this module and stopped at its end: real /v1/completions answers; a bounded load test where 36 concurrent
seeded requests with mixed parameters (at least 32 in flight at once, none ending early) all complete and
each gives the token ids it gives alone; requests with bad parameters get vLLM's 4xx while the server keeps
serving; top-k, min-p and top-p are honoured by their effect (every sampled token inside the set its
parameter keeps, judged from raw logprobs at T = 1).
"""

from __future__ import annotations

import json
import math
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
    """LOAD seeded requests, each prompt with each parameter set in turn, each exactly 32..48 tokens long
    (min_tokens = max_tokens: none ends early, so every one stays in flight while the others arrive), token
    ids returned."""
    return [
        {"model": "smollm2", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 32 + (i * 5) % 17,
         "min_tokens": 32 + (i * 5) % 17, "seed": 1000 + i, "return_token_ids": True,
         **SAMPLING[(i // len(PROMPTS)) % len(SAMPLING)]}
        for i in range(LOAD)
    ]  # fmt: skip


def _token_ids(answer: dict) -> list[int]:
    """The generated token ids of a completion answer (requested with return_token_ids)."""
    return answer["choices"][0]["token_ids"]


def _concurrently(server: support.Server, requests: list[dict]) -> tuple[list[tuple[int, dict]], list[tuple]]:
    """Send every request at once -> (their (status, answer) in order, what the server's /metrics showed
    while they were served: (seconds since the start, requests running, requests waiting) over its
    engines, one entry each time the counts changed)."""
    began, gauges, done = time.monotonic(), [], threading.Event()

    def watch():
        while not done.is_set():
            counts = tuple(
                int(sum(support.metric_values(server, f"vllm:num_requests_{state}")))
                for state in ("running", "waiting")
            )
            if not gauges or gauges[-1][1:] != counts:
                gauges.append((round(time.monotonic() - began, 2), *counts))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            answers = list(pool.map(lambda body: _complete(server, body), requests))
    finally:
        done.set()
        watcher.join()
    return answers, gauges


def _most_in_flight(gauges: list[tuple]) -> int:
    """The most requests running or waiting at one time in _concurrently's trace of the gauges."""
    return max((running + waiting for _, running, waiting in gauges), default=0)


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
    answers, gauges = _concurrently(server, requests)
    seconds = time.monotonic() - began
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    ids = [_token_ids(answer) for _, answer in answers]
    differing = [(i, requests[i], solo[i], ids[i]) for i in range(LOAD) if ids[i] != solo[i]]
    assert not differing, differing[:3]
    assert _most_in_flight(gauges) >= 32, gauges
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


#: One parameter per request at T = 1, and the test each sampled token must pass: (parameter, value).
FILTERS = [("top_k", 5), ("min_p", 0.2), ("top_p", 0.6)]
TOP = 20  # logprobs returned per position (vLLM's max_logprobs)
FILTER_PROMPTS = [PROMPTS[0], PROMPTS[2], PROMPTS[4]]


def _steps(answer: dict) -> list[tuple[float, list[float]]]:
    """Per generated token of an answer requested with logprobs=TOP and return_tokens_as_token_ids:
    (its raw logprob, the logprobs of the TOP most likely tokens (and of it), largest first)."""
    logprobs = answer["choices"][0]["logprobs"]
    ids = _token_ids(answer)
    assert ids and len(logprobs["token_logprobs"]) == len(ids) == len(logprobs["top_logprobs"]), logprobs
    steps = []
    for token, chosen, top in zip(ids, logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert f"token_id:{token}" in top and len(top) >= TOP, top
        steps.append((chosen, sorted(top.values(), reverse=True)))
    return steps


def _outside(parameter: str, value: float, chosen: float, top: list[float]) -> bool:
    """Whether a token of raw logprob `chosen` (T = 1) falls outside what `parameter` = value keeps, judged
    from the TOP largest logprobs `top` (largest first; a small tolerance for float32 rounding): rank >= k for
    top_k; probability < min_p x the largest for min_p; the mass of the tokens more likely than it >= top_p
    for top_p (the nucleus: the fewest most likely tokens whose mass reaches top_p)."""
    above = [logprob for logprob in top if logprob > chosen + 1e-5]
    if parameter == "top_k":
        return len(above) >= value
    if parameter == "min_p":
        return chosen < top[0] + math.log(value) - 1e-4
    return sum(math.exp(logprob) for logprob in above) >= value + 1e-4


def _filter_requests(parameter: str | None, value: float = 0) -> list[dict]:
    """Seeded T = 1 requests (three prompts, two seeds each, 24 tokens) with `parameter` = value, or with
    no filter at all when parameter is None; raw logprobs of the TOP most likely tokens returned. ignore_eos,
    not min_tokens: min_tokens masks the end token after vLLM takes the raw logprobs, which would move the
    sets these logprobs describe."""
    extra = {} if parameter is None else {parameter: value}
    return [
        {"model": "smollm2", "prompt": prompt, "max_tokens": 24, "ignore_eos": True, "temperature": 1.0,
         "seed": 4000 + 10 * p + s, "logprobs": TOP, "return_tokens_as_token_ids": True, "return_token_ids": True,
         **extra}
        for p, prompt in enumerate(FILTER_PROMPTS) for s in range(2)
    ]  # fmt: skip


def test_top_k_min_p_and_top_p_are_honoured_by_their_effect_under_speculation(server):
    """At T = 1 with raw logprobs (the target's own distribution), every token sampled with top_k 5 ranks
    among the 5 most likely, every token sampled with min_p 0.2 has at least 0.2 x the largest probability,
    and every token sampled with top_p 0.6 lies inside the 0.6 nucleus — 144 tokens per parameter, drafts
    proposed and accepted meanwhile. What it catches: a dropped or mis-mapped parameter (vLLM's top-k,
    top-p or min-p not reaching specverify, or reaching the wrong row); its power is shown on the same
    prompts and seeds without the parameter, whose tokens land outside each set at least once (27, 45 and 39
    of 144 when measured), so a sampler ignoring the parameter would fail this test."""
    groups = [(None, 0), *FILTERS]
    before = _spec_decode_counts(server)
    with ThreadPoolExecutor(max_workers=6 * len(groups)) as pool:  # all 24 requests at once
        sent = {group: [pool.submit(_answer, server, body) for body in _filter_requests(*group)] for group in groups}
        answers = {group: [future.result() for future in futures] for group, futures in sent.items()}
    unfiltered = [step for answer in answers[None, 0] for step in _steps(answer)]
    for parameter, value in FILTERS:
        steps = [step for answer in answers[parameter, value] for step in _steps(answer)]
        misses = [(chosen, top[:8]) for chosen, top in steps if _outside(parameter, value, chosen, top)]
        assert len(steps) == 144 and not misses, (parameter, value, misses[:3])
        control = sum(_outside(parameter, value, chosen, top) for chosen, top in unfiltered)
        assert control > 0, f"without {parameter} no token fell outside it: the check has no power here"
    drafted, accepted = _spec_decode_counts(server)
    assert drafted > before[0] and accepted > before[1], (before, drafted, accepted)


def _answer(server: support.Server, body: dict) -> dict:
    status, answer = _complete(server, body)
    assert status == 200, (body, answer)
    return answer
