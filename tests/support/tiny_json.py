"""A tiny byte-level BPE tokenizer over JSON-ish text, built offline, that llguidance can read, and tiny
random models over its vocabulary.

Imported by the grammar tests (`from tests.support.tiny_json import ...`): the tiny in-test models and
llguidance share the tokenizer. It has TOKENIZER_SIZE ids (id 0 is <eos>); the models
have MODEL_VOCAB > TOKENIZER_SIZE logits, so the ids past the tokenizer's must never be allowed.
"""

from __future__ import annotations

import functools

import pytest
import torch

TOKENIZER_SIZE = 60
MODEL_VOCAB = 64
EOS = 0
ALPHABET = '{}[]":, 0123456789abcdefghijklmnopqrstuvwxyz-.'
CORPUS = [
    '{"name": "bob", "age": 42}',
    '{"name": "alice", "age": 7, "ok": true}',
    '["a", "b"]',
    "null false true",
    '{"x": -1.5}',
] * 5
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
#: The JSON schema the command-line tests ask `specverify generate` for (test_grammar_cli.py, test_requests.py).
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 4}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}


@functools.cache
def tiny_tokenizer():
    """A transformers fast tokenizer: byte-level BPE trained on CORPUS, TOKENIZER_SIZE ids, <eos> = 0."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = byte_level
    bpe.decoder = tokenizers.decoders.ByteLevel()
    alphabet = [byte_level.pre_tokenize_str(c)[0][0] for c in ALPHABET]
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=TOKENIZER_SIZE,
        special_tokens=["<eos>"],
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == TOKENIZER_SIZE and tokenizer.eos_token_id == EOS
    return tokenizer


def token_id(text: str) -> int:
    """The id of a token of the tiny vocabulary, by its text."""
    ids = tiny_tokenizer().encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is not one token ({ids})"
    return ids[0]


def tiny_llama(seed: int):
    """A random 2-layer Llama over MODEL_VOCAB ids, in float64 (tests/support/models.py's)."""
    from tests.support.models import tiny_llama as llama

    return llama(seed, MODEL_VOCAB)


def allowed_after(grammar, tokens: list[int]) -> torch.Tensor:
    """bool [MODEL_VOCAB]: the ids a fresh llguidance matcher for grammar allows after tokens, read from
    llguidance's own bitmask (not through specverify.decoding.constraints.grammar)."""
    import specverify as sv

    matcher = grammar.matcher()
    assert matcher.consume_tokens(tokens), matcher.get_error()
    words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)[: (TOKENIZER_SIZE + 31) // 32]
    allowed = torch.zeros(MODEL_VOCAB, dtype=torch.bool)
    allowed[:TOKENIZER_SIZE] = sv.unpack_bitmask(words, TOKENIZER_SIZE)
    return allowed
