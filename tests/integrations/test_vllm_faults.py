"""(slow) Faults under load on vLLM's OpenAI server with the plug-in and n-gram speculation, one server for the
module, capped at 4 running requests (`--max-num-seqs 4`): streamed answers equal non-streamed ones token for
token; clients that hang up mid-stream are aborted while the other requests keep their token ids; a burst of
24 requests beyond the cap is queued and every one of them completes with its own token ids. Each test reads
vLLM's spec-decode counters on /metrics (drafts proposed and accepted meanwhile), so its comparisons are made
under speculation. The reference of every request is its answer sent alone to the same server, non-streamed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integrations import vllm_support as support
from tests.integrations.test_vllm_server import PROMPTS, _complete, _spec_decode_counts, _token_ids

pytestmark = pytest.mark.slow

CAPACITY = 4  # --max-num-seqs: requests the engine runs at once
BURST = 24  # requests sent at once in the burst test
SAMPLING = [
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 20},
    {"temperature": 1.0, "min_p": 0.1},
    {"temperature": 0.7},
]
ABANDONED = 3  # clients that hang up mid-stream
ABANDON_AFTER = 3  # server-sent events each of them reads first
LONG = 900  # max_tokens of an abandoned request (ignore_eos): tens of seconds if it were not aborted
REQUEST_TIMEOUT = 240  # seconds, per request


def _requests() -> list[dict]:
    """BURST seeded sampled requests (the server test's prompts, each sampling set in turn), 16..28 tokens,
    at least 8 (min_tokens: none is empty, each stays in flight a while), token ids returned."""
    return [
        {"model": "smollm2", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16 + (i * 5) % 13, "min_tokens": 8,
         "seed": 3000 + i, "return_token_ids": True, **SAMPLING[(i // len(PROMPTS)) % len(SAMPLING)]}
        for i in range(BURST)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    support.require_vllm()
    with support.serve(
        support.model_folder(),
        tmp_path_factory.mktemp("faults"),
        "--speculative-config",
        json.dumps(support.NGRAM),
        "--max-num-seqs",
        str(CAPACITY),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def solo(server) -> list[list[int]]:
    """Each of _requests()'s token ids, sent alone and not streamed (one at a time)."""
    answers = []
    for body in _requests():
        status, answer = _complete(server, body)
        assert status == 200, (body, answer)
        answers.append(_token_ids(answer))
    assert all(len(ids) >= 8 for ids in answers), answers
    return answers


def _events(raw: bytes) -> list[dict]:
    """The JSON events of a server-sent-events body (`data: {...}` lines; `data: [DONE]` ends it)."""
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: ") :]))
    return events


def _stream(server: support.Server, body: dict) -> tuple[list[int], int]:
    """One completion with `stream: true`, read to its end -> (the token ids of all its chunks in order, the
    number of chunks that carried tokens). AssertionError if the stream does not end with [DONE]."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=REQUEST_TIMEOUT)
    try:
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                           {"Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        assert response.status == 200, response.read()[:2000]
        raw = response.read()
    finally:
        connection.close()
    assert raw.rstrip().endswith(b"data: [DONE]"), raw[-500:]
    chunks = [event["choices"][0].get("token_ids") or [] for event in _events(raw) if event.get("choices")]
    return [token for chunk in chunks for token in chunk], sum(1 for chunk in chunks if chunk)


def _abandon(server: support.Server, body: dict, events: int) -> int:
    """Start a streamed completion on a raw socket, read until `events` server-sent events have arrived, then
    hang up (shutdown and close) -> how many events were read."""
    payload = json.dumps({**body, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT) as connection:
        connection.sendall(head + payload)
        received = b""
        while received.count(b"data: ") < events:
            block = connection.recv(4096)
            assert block, f"the server closed the stream first: {received[-500:]!r}"
            received += block
        connection.shutdown(socket.SHUT_RDWR)
    return received.count(b"data: ")


class _Gauges:
    """The largest value each of vLLM's request gauges (running, waiting; summed over engines) reached on
    /metrics while the `watching` block ran, sampled every 50 ms."""

    NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting")

    def __init__(self, server: support.Server) -> None:
        self.server, self.most = server, dict.fromkeys(self.NAMES, 0.0)

    def now(self) -> dict[str, float]:
        return {name: sum(support.metric_values(self.server, name)) for name in self.NAMES}

    @contextlib.contextmanager
    def watching(self) -> Iterator[_Gauges]:
        done = threading.Event()

        def watch():
            while not done.is_set():
                for name, value in self.now().items():
                    self.most[name] = max(self.most[name], value)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            yield self
        finally:
            done.set()
            watcher.join()


def _idle_within(gauges: _Gauges, seconds: float) -> dict[str, float]:
    """Poll until no request is running or waiting, or `seconds` pass -> the gauges last read."""
    deadline = time.monotonic() + seconds
    while True:
        now = gauges.now()
        if not any(now.values()) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def _assert_speculated_since(server: support.Server, before: tuple[float, float]) -> None:
    """The server drafted and accepted tokens since `before` ((draft tokens, accepted tokens))."""
    drafted, accepted = _spec_decode_counts(server)
    assert drafted > before[0] and accepted > before[1], (before, drafted, accepted)


def test_streamed_answers_equal_non_streamed_ones_token_for_token(server, solo):
    """Six seeded sampled requests streamed at once give, chunk after chunk, the token ids each gives alone and
    not streamed. Would fail if the stream lost, repeated or reordered the several tokens that one speculative
    step commits (at least one chunk must carry more than one token, or the test fails as showing nothing),
    or if the plug-in were absent: stock vLLM's seeded sampling under speculation changes with the batch
    (docs/vllm.md), and these requests run together instead of alone."""
    requests = _requests()[:6]
    before = _spec_decode_counts(server)
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        streamed = list(pool.map(lambda body: _stream(server, body), requests))
    _assert_speculated_since(server, before)
    for index, (ids, _chunks) in enumerate(streamed):
        assert len(ids) >= 8 and ids == solo[index], (index, requests[index], solo[index], ids)
    assert any(chunks < len(ids) for ids, chunks in streamed), "no chunk carried two tokens: nothing speculative"


def test_clients_that_hang_up_mid_stream_are_aborted_and_the_others_keep_their_tokens(server, solo):
    """Three long streams (900 tokens, ignore_eos) hang up after three events each, while eight seeded
    requests are served beside them: the eight give their solo token ids, no request is left running or
    waiting within 10 s (an abandoned request that kept running would hold the running gauge up for the tens
    of seconds its 900 tokens take), the three generated less than half of their 900 tokens each
    (vllm:generation_tokens_total; vLLM counts no aborted request in vllm:request_success_total), and the
    server answers afterwards. Would fail
    if the server kept generating for clients that left, or if a request leaving mid-step disturbed the
    plug-in's per-request keys of the rows that stay (their tokens would change)."""
    requests = _requests()[:8]
    long = {"model": "smollm2", "prompt": "Count from one to one thousand:", "max_tokens": LONG,
            "ignore_eos": True, "temperature": 0.9, "seed": 77, "return_token_ids": True}  # fmt: skip
    gauges = _Gauges(server)
    generated_before = _generated(server)
    before = _spec_decode_counts(server)
    with ThreadPoolExecutor(max_workers=ABANDONED + len(requests)) as pool:
        hung_up = [pool.submit(_abandon, server, long, ABANDON_AFTER) for _ in range(ABANDONED)]
        served = list(pool.map(lambda body: _complete(server, body), requests))
        assert all(future.result() >= ABANDON_AFTER for future in hung_up)
    assert all(status == 200 for status, _ in served), [answer for status, answer in served if status != 200][:2]
    ids = [_token_ids(answer) for _, answer in served]
    differing = [(i, solo[i], ids[i]) for i in range(len(ids)) if ids[i] != solo[i]]
    assert not differing, differing[:2]
    left = _idle_within(gauges, 10)
    assert not any(left.values()), f"requests still in the engine 10 s after the others finished: {left}"
    generated = _generated(server) - generated_before
    assert generated < sum(map(len, ids)) + ABANDONED * LONG / 2, (generated, "the abandoned requests ran on")
    _assert_speculated_since(server, before)
    status, answer = _complete(server, {**requests[0]})
    assert status == 200 and _token_ids(answer) == solo[0], answer


def _generated(server: support.Server) -> float:
    """Tokens the server has generated since it started (vllm:generation_tokens_total, over its engines)."""
    return sum(support.metric_values(server, "vllm:generation_tokens_total"))


def test_a_burst_beyond_capacity_is_queued_and_every_request_completes_with_its_tokens(server, solo):
    """24 seeded requests at once against a server that runs 4: requests waited in the queue (the waiting
    gauge rose above 0, the running one never above 4), and every one completed with status 200 and the
    non-empty token ids it gives alone. Would fail if the server dropped or refused requests beyond its
    capacity (a non-200 or an empty answer), and shows nothing unless requests really queued (asserted);
    stock vLLM would fail it too, its seeded sampling under speculation changing with the batch."""
    requests = _requests()
    gauges = _Gauges(server)
    before = _spec_decode_counts(server)
    with gauges.watching(), ThreadPoolExecutor(max_workers=len(requests)) as pool:
        answers = list(pool.map(lambda body: _complete(server, body), requests))
    assert all(status == 200 for status, _ in answers), [answer for status, answer in answers if status != 200][:2]
    ids = [_token_ids(answer) for _, answer in answers]
    assert all(len(tokens) >= 8 for tokens in ids), ids
    differing = [(i, requests[i], solo[i], ids[i]) for i in range(len(ids)) if ids[i] != solo[i]]
    assert not differing, differing[:2]
    assert gauges.most["vllm:num_requests_waiting"] > 0, gauges.most
    assert 0 < gauges.most["vllm:num_requests_running"] <= CAPACITY, gauges.most
    _assert_speculated_since(server, before)
