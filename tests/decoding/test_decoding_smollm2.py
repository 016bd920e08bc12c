"""End to end on the embedded SmolLM2-135M-Instruct, on each engine (transformers; llama.cpp when the
`llamacpp` extra is installed): speculative decoding gives plain decoding's tokens. On llama.cpp that rests
on its Q4_1 logits not depending on the step's width nor on the other rows (tests/decoding/test_llamacpp.py)."""

from __future__ import annotations

import pytest

from specverify.decoding import NgramDrafter, SamplingParams, plain_generate, speculative_generate
from specverify.decoding.examples import EXAMPLES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "params", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)], ids=["greedy", "t0.7"]
)
def test_speculative_equals_plain_on_smollm2(smollm2, params):
    ids = smollm2.tokenizer.encode_chat(EXAMPLES["copy"])
    plain = plain_generate(smollm2.model, [ids], params, seed=7, max_tokens=32)
    spec = speculative_generate(smollm2.model, NgramDrafter(), [ids], params, seed=7, max_tokens=32, k=4)
    assert len(plain.tokens[0]) == 32
    assert spec.tokens == plain.tokens
    assert spec.steps < plain.steps  # the drafts were used
    assert "quick brown fox" in smollm2.tokenizer.decode(spec.tokens[0])


def test_a_batch_of_requests_decodes_each_as_alone_on_smollm2(smollm2):
    """Ragged drafts, per-row parameters and seeds, auto K: each request's tokens are those it gets alone
    (and those of plain batched decoding)."""
    from specverify.decoding.batch import run_requests
    from specverify.decoding.requests import Request

    requests = [
        Request(EXAMPLES["copy"], SamplingParams(), seed=1, max_tokens=24),
        Request(EXAMPLES["chat"], SamplingParams(temperature=0.7, top_p=0.9), seed=3, max_tokens=16),
        Request(EXAMPLES["code"], SamplingParams(temperature=0.7, top_k=40), seed=5, max_tokens=24),
    ]
    batch = run_requests(smollm2, NgramDrafter(), requests, k="auto", compare=True)
    assert batch.identical == [True, True, True]
    assert [len(t) for t in batch.speculative.tokens] == [24, 16, 24]
    for request, tokens in zip(requests, batch.speculative.tokens):
        assert run_requests(smollm2, NgramDrafter(), [request], k="auto").speculative.tokens == [tokens]


@pytest.mark.parametrize(
    "params", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)], ids=["greedy", "t0.7"]
)
def test_tree_steps_equal_plain_on_smollm2(smollm2, params):
    """`tree_generate` with the n-gram trie (16 nodes): plain decoding's tokens, in fewer target steps; a
    llama.cpp target, whose sessions score no trees, is refused by name before any step."""
    from specverify.decoding import HFLanguageModel, NgramTrieDrafter, tree_generate

    ids = smollm2.tokenizer.encode_chat(EXAMPLES["code"])
    if not isinstance(smollm2.model, HFLanguageModel):
        with pytest.raises(TypeError, match="needs a target whose sessions score trees"):
            tree_generate(smollm2.model, NgramTrieDrafter(), [ids], params, seed=7, max_tokens=40, nodes=16)
        return
    plain = plain_generate(smollm2.model, [ids], params, seed=7, max_tokens=40)
    tree = tree_generate(smollm2.model, NgramTrieDrafter(), [ids], params, seed=7, max_tokens=40, nodes=16)
    assert tree.tokens == plain.tokens
    assert tree.steps < plain.steps


def test_what_generate_checks_before_loading_is_what_the_loaded_model_has(smollm2):
    """`loading.check_prompts_fit` reads the context and the tokenizer without the weights: they must be the
    loaded model's (its max_context, its token ids), on each engine."""
    from specverify.decoding import HFLanguageModel
    from specverify.decoding.engines import loading

    path = loading.smollm2_gguf()
    engine = "transformers" if isinstance(smollm2.model, HFLanguageModel) else "llamacpp"
    assert loading.ENGINES[engine].context_length(path) == smollm2.model.max_context == 8192
    tokenizer = loading.chat_tokenizer(path)
    for text in (EXAMPLES["code"], "word " * 50, "Héllo ✓ <|im_start|> 日本語"):
        assert tokenizer.encode_chat(text) == smollm2.tokenizer.encode_chat(text)
