"""End to end on the embedded SmolLM2-135M-Instruct with a JSON schema: every answer is valid (checked with
jsonschema), and constrained speculative decoding gives constrained plain decoding's tokens."""

from __future__ import annotations

import json

import pytest

from specverify.decoding import (
    GrammarCompiler,
    ModelDrafter,
    NgramDrafter,
    SamplingParams,
    plain_generate,
    speculative_generate,
)
from specverify.decoding.constraints.schema import read_schema, schema_violation
from specverify.decoding.examples import EXAMPLES
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

SCHEMA_FILE = ROOT / "examples" / "person.schema.json"


@pytest.fixture(scope="module")
def grammar(smollm2):
    pytest.importorskip("llguidance", reason="llguidance is not installed (pip install -e '.[demo]')")
    pytest.importorskip("jsonschema", reason="jsonschema is not installed (pip install -e '.[demo]')")
    compiler = GrammarCompiler(smollm2.tokenizer.tokenizer, smollm2.model.vocab_size, smollm2.tokenizer.stop_tokens)
    return compiler.json_schema(read_schema(SCHEMA_FILE))


@pytest.mark.parametrize(
    ("params", "drafter", "k", "proposal"),
    [
        (SamplingParams(), "ngram", 4, "argmax"),
        (SamplingParams(temperature=0.8, top_p=0.95), "ngram", 6, "argmax"),
        (SamplingParams(temperature=1.0), "self", 3, "sampled"),
    ],
    ids=["greedy-ngram-k4", "t0.8-ngram-k6", "t1-self-k3-sampled"],
)
def test_schema_valid_answers_on_smollm2(smollm2, grammar, params, drafter, k, proposal):
    ids = smollm2.tokenizer.encode_chat(EXAMPLES["json"])
    common = {"seed": 11, "max_tokens": 160, "stop_tokens": smollm2.tokenizer.stop_tokens, "grammar": grammar}
    drafter = NgramDrafter() if drafter == "ngram" else ModelDrafter(smollm2.model)
    spec = speculative_generate(smollm2.model, drafter, [ids], params, k=k, draft_proposal=proposal, **common)
    text = smollm2.tokenizer.decode(spec.tokens[0])
    assert spec.grammar_complete == [True], text
    assert schema_violation(read_schema(SCHEMA_FILE), text) is None, text
    assert json.loads(text)["name"]
    if proposal == "argmax":
        assert spec.tokens == plain_generate(smollm2.model, [ids], params, **common).tokens
