"""Under a real grammar the committed tokens follow the masked, truncated target exactly (SPEC §2, §5).

A Markov target over the tiny JSON tokenizer (tests/support/tiny_json.py), a regex whose second position depends
on the first token, thousands of rows each with its own matcher and seed, two generated tokens per row:
the pairs are compared by chi-square with the exact float64 law built from llguidance's own masks and
specverify.audit.exact.truncated_distribution. The same check, at the same size, rejects the laws of two
known-wrong variants: a verifier that ignores the mask, and truncation (top-k) applied before the mask.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specverify.audit.exact import truncated_distribution
from specverify.decoding import GrammarCompiler, ModelDrafter, SamplingParams, speculative_generate
from tests.support.models import MarkovModel
from tests.support.statcheck import assert_catches, assert_follows
from tests.support.tiny_json import EOS, MODEL_VOCAB, allowed_after, tiny_tokenizer

pytest.importorskip("llguidance")

ROWS = 4000
PARAMS = SamplingParams(temperature=1.0, top_k=6)
PATTERN = r"[a-m][0-9]{1,2}|[n-z][a-z ]{1,3}"
PROMPT = 44  # "{"


@pytest.fixture(scope="module")
def grammar():
    return GrammarCompiler(tiny_tokenizer(), MODEL_VOCAB, [EOS]).regex(PATTERN)


@pytest.fixture(scope="module")
def tables():
    g = torch.Generator().manual_seed(5)
    target = 2.0 * torch.randn(MODEL_VOCAB, MODEL_VOCAB, generator=g, dtype=torch.float64)
    return target, target + 2.0 * torch.randn(MODEL_VOCAB, MODEL_VOCAB, generator=g, dtype=torch.float64)


def masked_then_truncated(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    return truncated_distribution(logits, PARAMS.temperature, PARAMS.top_k, allowed=allowed)


def truncated_then_masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Known-wrong: top-k on the raw logits, then the mask (the argmax of the allowed if none survives)."""
    kept = truncated_distribution(logits, PARAMS.temperature, PARAMS.top_k) * allowed
    if kept.sum() == 0:
        return truncated_distribution(logits, 0.0, allowed=allowed)
    return kept / kept.sum()


def ignoring_the_mask(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Known-wrong: the verifier never sees the mask."""
    return truncated_distribution(logits, PARAMS.temperature, PARAMS.top_k)


def pair_law(grammar, table: torch.Tensor, position_law) -> np.ndarray:
    """float64 [V*V]: the law of the first two generated tokens (t0 * V + t1), each position drawn from
    position_law(logits, llguidance's mask there)."""
    logits = table.numpy()
    allowed = allowed_after(grammar, []).numpy()
    first = position_law(logits[PROMPT], allowed)
    law = np.zeros((MODEL_VOCAB, MODEL_VOCAB))
    for t0 in np.nonzero(first)[0]:
        after = allowed_after(grammar, [int(t0)]).numpy() if allowed[t0] else np.ones(MODEL_VOCAB, dtype=bool)
        law[t0] = first[t0] * position_law(logits[t0], after)
    return law.reshape(-1)


def committed_pairs(grammar, tables, draft_proposal: str) -> np.ndarray:
    target, draft = (MarkovModel(t.float()) for t in tables)
    result = speculative_generate(
        target,
        ModelDrafter(draft),
        [[PROMPT]] * ROWS,
        PARAMS,
        k=2,
        seed=2024,
        max_tokens=2,
        stop_tokens=[EOS],
        grammar=grammar,
        draft_proposal=draft_proposal,
    )
    pairs = np.array(result.tokens)
    assert pairs.shape == (ROWS, 2)
    return pairs[:, 0] * MODEL_VOCAB + pairs[:, 1]


@pytest.mark.parametrize("draft_proposal", ["argmax", "sampled"])
def test_committed_tokens_follow_the_masked_truncated_target(grammar, tables, draft_proposal):
    law = pair_law(grammar, tables[0], masked_then_truncated)
    assert_follows(committed_pairs(grammar, tables, draft_proposal), law, f"{draft_proposal} drafts under a grammar")
    for seed, wrong in enumerate((ignoring_the_mask, truncated_then_masked)):
        assert_catches(pair_law(grammar, tables[0], wrong), law, ROWS, seed, wrong.__name__)
