"""Toy models and the decoding tests' common setup: a random tiny Llama (transformers), a pure-torch Markov
model without a KV cache, a random drafter, and three prompts with their row parameters and seeds."""

from __future__ import annotations

import pytest
import torch

from specverify.decoding import Draft, GenerationResult, SamplingParams, plain_generate, speculative_generate

VOCAB = 48


def tiny_llama_config(vocab_size: int, **overrides):
    """The config of the tests' random 2-layer Llama (transformers.LlamaConfig)."""
    transformers = pytest.importorskip("transformers")
    sizes = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
    )
    return transformers.LlamaConfig(vocab_size=vocab_size, **{**sizes, **overrides})


def tiny_llama(seed: int, vocab_size: int = VOCAB):
    """A random 2-layer Llama in float64 (its logits do not depend on the batch shape at float32 precision)."""
    transformers = pytest.importorskip("transformers")
    from specverify.decoding import HFLanguageModel

    config = tiny_llama_config(vocab_size)
    torch.manual_seed(seed)
    return HFLanguageModel(transformers.LlamaForCausalLM(config).to(torch.float64))


class MarkovModel:
    """A pure-torch LanguageModel without a KV cache: the next-token logits are table[last token]."""

    def __init__(self, table: torch.Tensor):
        self.table = table
        self.vocab_size = table.shape[1]

    def session(self, batch_size: int) -> MarkovSession:
        return MarkovSession(self.table, batch_size)


class MarkovSession:
    def __init__(self, table: torch.Tensor, batch_size: int):
        self.table = table
        self.lengths = torch.zeros(batch_size, dtype=torch.int64)

    def extend(self, tokens: torch.Tensor, *, return_logits: bool = True) -> torch.Tensor | None:
        self.lengths = self.lengths + (tokens >= 0).sum(1)
        return self.table[tokens.clamp_min(0)] if return_logits else None

    def truncate(self, lengths: torch.Tensor) -> None:
        self.lengths = lengths.clone()


class RandomDrafter:
    """Random tokens, random ragged lengths: the worst drafter, and every padding pattern."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, contexts, k, *, params, seeds, sampled) -> Draft:
        lengths = torch.randint(0, k + 1, (len(contexts),), generator=self.generator)
        tokens = torch.randint(0, VOCAB, (len(contexts), k), generator=self.generator)
        return Draft(torch.where(torch.arange(k) < lengths[:, None], tokens, -1))


PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [1], [9, 10, 11, 12, 13, 9, 10, 11, 12, 13, 9, 10]]
ROW_PARAMS = [
    SamplingParams(),  # greedy
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=10, min_p=0.05),
]
SEEDS = [3, 2**64 - 2, 12345]


def plain(model, prompts=PROMPTS, params=ROW_PARAMS, **kwargs) -> GenerationResult:
    kwargs = {"seed": SEEDS, "max_tokens": 20, **kwargs}
    return plain_generate(model, prompts, params, **kwargs)


def spec(model, drafter, prompts=PROMPTS, params=ROW_PARAMS, **kwargs) -> GenerationResult:
    kwargs = {"seed": SEEDS, "max_tokens": 20, **kwargs}
    return speculative_generate(model, drafter, prompts, params, **kwargs)


def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    return model.session(1).extend(torch.tensor([tokens]))[0]
