"""Grammar-constrained speculative decoding with a real matcher (llguidance) on tiny in-test models.

The tiny models and llguidance share a tiny byte-level BPE tokenizer (tests/support/tiny_json.py). Constrained
speculative decoding gives constrained plain decoding's tokens with the same seed, whatever the drafter
and K; a draft ends at its first token the grammar refuses, which is always rejected (never committed);
the masks are those of the matcher at every position, and ids past the tokenizer's are never allowed.
"""

from __future__ import annotations

import json

import pytest
import torch

import specverify as sv
from specverify.decoding import (
    Draft,
    GrammarCompiler,
    ModelDrafter,
    NgramDrafter,
    plain_generate,
    speculative_generate,
)
from specverify.decoding.constraints.grammar import GrammarDeadEnd, GrammarMatchers
from specverify.decoding.loop import chain
from tests.support.models import ROW_PARAMS, SEEDS
from tests.support.tiny_json import EOS, MODEL_VOCAB, allowed_after, tiny_llama, tiny_tokenizer

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
MAX_TOKENS = 40


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(tiny_tokenizer(), MODEL_VOCAB, [EOS])


@pytest.fixture(scope="module")
def schema_grammar(compiler):
    return compiler.json_schema(SCHEMA)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(1)


def prompts() -> list[list[int]]:
    tokenizer = tiny_tokenizer()
    return [tokenizer.encode(text) for text in ('{"name": "bob", "age": 42}', "age", '["a", "b"]')]


def generate(model, grammar, drafter=None, **kwargs):
    """Constrained plain decoding (drafter None) or speculative decoding of the three test prompts."""
    kwargs = {"seed": SEEDS, "max_tokens": MAX_TOKENS, "stop_tokens": [EOS], "grammar": grammar, **kwargs}
    if drafter is None:
        return plain_generate(model, prompts(), ROW_PARAMS, **kwargs)
    return speculative_generate(model, drafter, prompts(), ROW_PARAMS, **kwargs)


def answer(tokens: list[int]) -> str:
    return tiny_tokenizer().decode(tokens, skip_special_tokens=True)


class RandomDrafter:
    """Random ids over the model's whole vocabulary (ids past the tokenizer's and <eos> included): nearly
    every draft violates the grammar. Records what it proposed."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)
        self.proposed = 0

    def propose(self, contexts, k, *, params, seeds, sampled) -> Draft:
        tokens = torch.randint(0, MODEL_VOCAB, (len(contexts), k), generator=self.generator)
        self.proposed += tokens.numel()
        return Draft(tokens)


class ValidDrafter:
    """Drafts what plain constrained decoding produced: every draft token is allowed (a perfect drafter)."""

    def __init__(self, outputs: list[list[int]]):
        self.sequences = [p + out for p, out in zip(prompts(), outputs)]

    def propose(self, contexts, k, *, params, seeds, sampled) -> Draft:
        rows = [full[len(c) : len(c) + k] for full, c in zip(self.sequences, contexts)]
        return Draft(torch.tensor([r + [-1] * (k - len(r)) for r in rows]))


# --- the masks ------------------------------------------------------------------------------------


def llguidance_allowed(grammar, tokens: list[int]) -> set[int]:
    return set(allowed_after(grammar, tokens).nonzero()[:, 0].tolist())


def allowed_ids(masks: torch.Tensor) -> list[set[int]]:
    return [set(row.nonzero()[:, 0].tolist()) for row in sv.unpack_bitmask(masks, MODEL_VOCAB)]


def test_masks_are_the_matchers_at_every_draft_position(schema_grammar):
    text = tiny_tokenizer().encode('{"name": "bob", "age": 42}')
    refused = 44  # "{" cannot follow '{"name'
    drafts = torch.tensor([text[:3] + [refused, text[4]], [62, *text[:4]], text[:5]])
    matchers = GrammarMatchers([schema_grammar, schema_grammar, None], MODEL_VOCAB)
    lengths, masks = matchers.masks(drafts, [False, False, False])
    assert masks.shape == (3, 6, 2) and masks.dtype == torch.int32
    # kept: the accepted prefix and the first refused token (id 62 is past the tokenizer's 60); row 2 is free
    assert lengths.tolist() == [4, 1, 5]
    row0 = allowed_ids(masks[0])
    for j in range(4):
        assert row0[j] == llguidance_allowed(schema_grammar, text[:j]), j
    assert refused not in row0[3]
    assert row0[4] == row0[5] == row0[3]  # past the refused token: the last mask again
    assert allowed_ids(masks[1]) == [llguidance_allowed(schema_grammar, [])] * 6
    assert (masks[2] == -1).all()
    again = matchers.masks(drafts, [False, False, False])
    assert torch.equal(again[1], masks) and torch.equal(again[0], lengths)  # the matchers were not moved
    matchers.advance(0, text[:2])
    assert allowed_ids(matchers.masks(drafts[:, :0], [False, True, True])[1][0])[0] == row0[2]
    assert all(not ({60, 61, 62, 63} & ids) for ids in row0 + allowed_ids(masks[1]))


def test_free_rows_allow_everything(schema_grammar):
    matchers = GrammarMatchers([schema_grammar], MODEL_VOCAB)
    lengths, masks = matchers.masks(torch.tensor([[52, 44, 44]]), [True])
    assert lengths.tolist() == [3] and (masks == -1).all()


# --- speculative == plain under a grammar ---------------------------------------------------------


@pytest.mark.parametrize(
    ("drafter_name", "k"), [("ngram", 3), ("model", 2), ("self", 4), ("random", 3), ("valid", 5), ("ngram", 0)]
)
def test_constrained_speculative_equals_constrained_plain(target, draft_model, schema_grammar, drafter_name, k):
    reference = generate(target, schema_grammar)
    drafter = {
        "ngram": lambda: NgramDrafter(),
        "model": lambda: ModelDrafter(draft_model),
        "self": lambda: ModelDrafter(target),
        "random": lambda: RandomDrafter(k),
        "valid": lambda: ValidDrafter(reference.tokens),
    }[drafter_name]()
    result = generate(target, schema_grammar, drafter, k=k)
    assert result.tokens == reference.tokens
    assert result.grammar_complete == reference.grammar_complete
    if drafter_name == "valid":
        assert result.acceptance and min(result.acceptance) == 1.0
    for tokens, complete in zip(result.tokens, result.grammar_complete):
        if complete:
            assert tokens[-1] == EOS
            jsonschema.validate(json.loads(answer(tokens)), SCHEMA)
        else:
            assert len(tokens) == MAX_TOKENS


def test_unconstrained_rows_beside_constrained_ones(target, schema_grammar):
    grammars = [schema_grammar, None, schema_grammar]
    reference = generate(target, grammars)
    result = generate(target, grammars, ModelDrafter(target), k=3)
    assert result.tokens == reference.tokens
    assert result.grammar_complete[1] is None and reference.grammar_complete[1] is None
    unconstrained = plain_generate(target, prompts()[1:2], ROW_PARAMS[1], seed=SEEDS[1:2], max_tokens=MAX_TOKENS)
    assert result.tokens[1] == unconstrained.tokens[0]


def test_sampled_proposals_under_a_grammar(target, draft_model, schema_grammar):
    reference = generate(target, schema_grammar)
    result = generate(target, schema_grammar, ModelDrafter(draft_model), k=3, draft_proposal="sampled")
    assert result.tokens[0] == reference.tokens[0]  # the greedy row
    for tokens, complete in zip(result.tokens, result.grammar_complete):
        assert complete or len(tokens) == MAX_TOKENS
        if complete:
            jsonschema.validate(json.loads(answer(tokens)), SCHEMA)


# --- drafts that violate the grammar --------------------------------------------------------------


@pytest.mark.parametrize("draft_proposal", ["argmax", "sampled"])
def test_a_violating_draft_is_cut_rejected_and_never_committed(target, schema_grammar, monkeypatch, draft_proposal):
    """Each row's draft reaches the verifier up to its first refused token; that one is always rejected
    (and the matcher would refuse any committed token it disallows)."""
    verified = []
    verifier = sv.stochastic_acceptance_sampler

    def spy(draft_tokens, *args, token_bitmasks=None, **kwargs):
        out = verifier(draft_tokens, *args, token_bitmasks=token_bitmasks, **kwargs)
        verified.append((draft_tokens, token_bitmasks, out[0]))
        return out

    monkeypatch.setattr(chain.specverify, "stochastic_acceptance_sampler", spy)
    drafter = RandomDrafter(7)
    result = generate(target, schema_grammar, drafter, k=4, draft_proposal=draft_proposal)
    if draft_proposal == "argmax":
        assert result.tokens == generate(target, schema_grammar).tokens
    refused_rows = 0
    for drafts, masks, first in verified:
        real = drafts >= 0
        allowed = sv.unpack_bitmask(masks, MODEL_VOCAB)[:, :-1].gather(2, drafts.clamp_min(0)[..., None])[..., 0]
        refused = real & ~allowed
        last = real.sum(1) - 1
        assert (~refused | (torch.arange(drafts.shape[1]) == last[:, None])).all()  # only a row's last draft
        rows = refused.any(1)
        assert (first[rows] <= last[rows]).all()  # is rejected
        refused_rows += int(rows.sum())
    assert refused_rows > 0 and sum(int((d >= 0).sum()) for d, _, _ in verified) < drafter.proposed / 2


def test_a_verifier_that_ignores_the_mask_is_caught(target, schema_grammar, monkeypatch):
    """Known-wrong variant: the masks do not reach the verifier. The matcher refuses what it commits."""
    verifier = sv.stochastic_acceptance_sampler

    def ignore_masks(*args, token_bitmasks=None, **kwargs):
        return verifier(*args, **kwargs)

    monkeypatch.setattr(chain.specverify, "stochastic_acceptance_sampler", ignore_masks)
    with pytest.raises(RuntimeError, match="the grammar refused committed token"):
        generate(target, schema_grammar, NgramDrafter(), k=2)


# --- the grammar's end, stop tokens, choices and regexes ------------------------------------------


@pytest.mark.parametrize("kind", ["choices", "regex"])
def test_a_complete_answer_ends_with_the_stop_token(target, compiler, kind):
    grammar = compiler.choices(["yes", "no", "maybe"]) if kind == "choices" else compiler.regex(r"[0-9]{2}-[a-z]{1,3}")
    reference = generate(target, grammar)
    result = generate(target, grammar, ModelDrafter(target), k=4)
    assert result.tokens == reference.tokens
    assert result.grammar_complete == [True, True, True]
    for tokens in result.tokens:
        assert tokens[-1] == EOS and EOS not in tokens[:-1]
        if kind == "choices":
            assert answer(tokens) in ("yes", "no", "maybe")
        else:
            assert answer(tokens)[:2].isdigit() and answer(tokens)[2] == "-"


def test_the_grammar_stop_tokens_must_end_the_rows(target, schema_grammar):
    with pytest.raises(ValueError, match=r"the grammar's stop tokens \[0\] must be among stop_tokens \(got \[\]\)"):
        generate(target, schema_grammar, stop_tokens=[])
    with pytest.raises(ValueError, match="grammar must be a Grammar, None or a sequence of 3"):
        generate(target, [schema_grammar])


def test_a_grammar_for_another_vocabulary_is_refused(schema_grammar):
    with pytest.raises(ValueError, match="compiled for a vocabulary of 64 .the model has 48."):
        GrammarMatchers([schema_grammar], 48)
    with pytest.raises(ValueError, match=r"the tokenizer has more tokens \(60\) than the model's vocabulary \(32\)"):
        GrammarCompiler(tiny_tokenizer(), 32, [EOS])
    with pytest.raises(ValueError, match="at least one stop token"):
        GrammarCompiler(tiny_tokenizer(), MODEL_VOCAB, [])
    with pytest.raises(ValueError, match=r"EOS token ID 61 is out of range \(vocab_size=60\)"):
        GrammarCompiler(tiny_tokenizer(), MODEL_VOCAB, [EOS, 61])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda c: c.regex("a(b"), r"invalid regex: .*regex parse error: unclosed group$"),
        (lambda c: c.json_schema({"type": "foo"}), "invalid json schema: Invalid type: foo"),
        (lambda c: c.json_schema('{"type": '), "invalid json schema: "),
        (lambda c: c.choices([]), "choices must be a non-empty list of non-empty strings"),
        (lambda c: c.choices(["a", ""]), "choices must be a non-empty list of non-empty strings"),
    ],
)
def test_compile_errors_are_one_line(compiler, make, message):
    with pytest.raises(ValueError, match=message) as error:
        make(compiler)
    assert "\n" not in str(error.value)


def test_a_grammar_the_tokenizer_cannot_continue_says_so(target, compiler):
    """The tiny tokenizer has no upper-case letters: after "a" nothing can follow."""
    grammar = compiler.regex("a[A-Z]+")
    message = "request 0: the grammar cannot be continued with this tokenizer"
    with pytest.raises(GrammarDeadEnd, match=message):
        generate(target, grammar)
    with pytest.raises(GrammarDeadEnd, match=message):
        generate(target, grammar, ModelDrafter(target), k=2)
