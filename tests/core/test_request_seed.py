"""SPEC §4, a request's keys: `request_seed(base, n)` keys a request's n-th token so that requests whose base
seeds are close (best-of-n seeds 0, 1, 2, ...; vLLM's n > 1 children seed + i) never share a key, and draw
independently of one another.

The scheme under test is written down here from SPEC §4 alone (`KEY_STRIDE`, Python ints), and every
property is also run against the scheme it replaced (`seed + n`), which each one must catch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import specverify as sv
from tests.support.seeds import int64_bits

#: SPEC §4: request_seed(base, n) = base * 0x9E3779B97F4A7C15 + n (mod 2**64).
KEY_STRIDE = 0x9E3779B97F4A7C15
#: SPEC §4: bases closer than this never share a key over 2**40 tokens; F_35, the first difference that does.
SEPARATED = 9_227_465
KEYED_TOKENS = 2**40


def old_request_seed(base, n):
    """The scheme every caller used before: seed + tokens generated (a known-wrong variant)."""
    return base + n


def circular_distance(keys: torch.Tensor) -> torch.Tensor:
    """|x| of int64 bit patterns read modulo 2**64 (distance to the nearest multiple of 2**64); 2**63, whose
    absolute value int64 cannot hold, as 2**63 - 1."""
    return torch.where(keys == -(2**63), 2**63 - 1, keys.abs())


# ---------------------------------------------------------------------------------------------------------
# the function


@pytest.mark.parametrize("base", [0, 1, 7, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63)])
@pytest.mark.parametrize("n", [0, 1, 999, 2**40 - 1])
def test_is_the_documented_formula_on_ints_and_tensors(base, n):
    want = int64_bits(base * KEY_STRIDE + n)
    assert sv.request_seed(base, n) == want
    assert type(sv.request_seed(base, n)) is int
    as_tensor = sv.request_seed(
        torch.tensor([int64_bits(base)]), torch.tensor([n], dtype=torch.int32 if n < 2**31 else torch.int64)
    )
    assert as_tensor.dtype == torch.int64 and as_tensor.tolist() == [want]
    assert sv.request_seed(torch.tensor(int64_bits(base)), n).item() == want
    assert sv.request_seed(base, torch.tensor([n])).tolist() == [want]


def test_broadcasts_and_leaves_its_inputs_alone():
    bases = torch.tensor([[3], [-4]])
    counts = torch.tensor([0, 5, 9], dtype=torch.int32)
    before = bases.clone(), counts.clone()
    keys = sv.request_seed(bases, counts)
    assert keys.shape == (2, 3)
    assert keys.tolist() == [[int64_bits(b * KEY_STRIDE + n) for n in (0, 5, 9)] for b in (3, -4)]
    assert torch.equal(bases, before[0]) and torch.equal(counts, before[1])


def test_the_verifier_position_j_is_the_requests_token_n_plus_j():
    """A step's keys are consecutive: the verifier's key s_b + j is request_seed(base, n + j)."""
    for base in (0, 5, 2**64 - 3):
        for n in (0, 17, 2**40 - 10):
            for j in range(5):
                assert int64_bits(sv.request_seed(base, n) + j) == sv.request_seed(base, n + j)


@pytest.mark.parametrize(
    ("base", "n", "error", "words"),
    [
        (1.0, 0, TypeError, "base_seed must be an int or an integer tensor (got float)"),
        (True, 0, TypeError, "base_seed must be an int or an integer tensor (got bool)"),
        (torch.tensor([1.0]), 0, TypeError, "base_seed must be an int or an integer tensor (got dtype torch.float32)"),
        (2**64, 0, ValueError, "base_seed must be an int in [-2**63, 2**64) (got 18446744073709551616)"),
        (-(2**63) - 1, 0, ValueError, "base_seed must be an int in [-2**63, 2**64)"),
        (0, -1, ValueError, "tokens_generated must be an int in [0, 2**40) (got -1)"),
        (0, 2**40, ValueError, "tokens_generated must be an int in [0, 2**40) (got 1099511627776)"),
        (0, "3", TypeError, "tokens_generated must be an int or an integer tensor (got str)"),
        (
            0,
            torch.tensor([True]),
            TypeError,
            "tokens_generated must be an int or an integer tensor (got dtype torch.bool)",
        ),
        (torch.tensor([1, 2]), torch.tensor([0, -3]), ValueError, "tokens_generated must be in [0, 2**40) (got -3)"),
        (0, torch.tensor([2**40]), ValueError, "tokens_generated must be in [0, 2**40) (got 1099511627776)"),
    ],
)
def test_bad_arguments_are_named(base, n, error, words):
    with pytest.raises(error) as caught:
        sv.request_seed(base, n)
    assert words in str(caught.value)


def test_validate_false_reads_no_values():
    """Tensor counts are not read to the host without validate (a CUDA graph can capture the call)."""
    keys = sv.request_seed(torch.tensor([1]), torch.tensor([-1]), validate=False)
    assert keys.tolist() == [int64_bits(KEY_STRIDE - 1)]


# ---------------------------------------------------------------------------------------------------------
# no shared keys


def keys_apart(request_seed, differences: torch.Tensor, base: int = 0) -> torch.Tensor:
    """How far request (base + d)'s keys lie from request base's, modulo 2**64: the two share a key over the
    first N tokens exactly when this is below N (given that a request's keys are consecutive in n)."""
    return circular_distance(request_seed(torch.tensor(int64_bits(base)) + differences, 0) - request_seed(base, 0))


def test_every_base_closer_than_the_bound_keeps_apart_and_the_bound_is_tight():
    differences = torch.arange(1, SEPARATED, dtype=torch.int64)
    assert int(keys_apart(sv.request_seed, differences).min()) >= KEYED_TOKENS
    assert int(keys_apart(sv.request_seed, torch.tensor([SEPARATED]))[0]) < KEYED_TOKENS
    assert int(keys_apart(old_request_seed, differences).min()) < KEYED_TOKENS


@pytest.mark.parametrize("base", [0, 42, 2**63 - 500, 2**64 - 1000, -(2**63)])
def test_seeds_up_to_1000_apart_share_no_key_over_a_million_tokens(base):
    n = torch.tensor([0, 1, 2, 999_999, 10**6, 2**40 - 1])
    assert torch.equal(sv.request_seed(base, n) - sv.request_seed(base, 0), n)  # keys consecutive in n
    differences = torch.arange(1, 1001)
    assert int(keys_apart(sv.request_seed, differences, base).min()) >= 10**6
    assert int(keys_apart(old_request_seed, differences, base).min()) < 10**6


FAR_PAIRS = [(0, 2**32), (1, 2**63 + 1), (12345, 987654321), (7, 7 + 10**12), (2**40, 2**41), (-1, 2**62)]


@pytest.mark.parametrize(("first", "second"), [(5, 6), (5, 1005), (-1, 0), *FAR_PAIRS])
def test_key_sets_of_a_million_tokens_do_not_intersect(first, second):
    """The literal sets, no arithmetic shortcut."""
    tokens = torch.arange(10**6)
    a = sv.request_seed(torch.tensor(int64_bits(first)), tokens).numpy()
    b = sv.request_seed(torch.tensor(int64_bits(second)), tokens).numpy()
    assert np.intersect1d(a, b).size == 0
    if abs(second - first) < 10**6:
        old = [old_request_seed(int64_bits(s), tokens).numpy() for s in (first, second)]
        assert np.intersect1d(*old).size > 0


def test_round_far_apart_bases_keep_apart():
    """Bases that users pick far apart: c * 2**k and c * 10**k for every c < 1000 (mod 2**64, zero aside)."""
    rounds = {(c * 2**k) % 2**64 for c in range(1, 1000) for k in range(64)}
    rounds |= {(c * 10**k) % 2**64 for c in range(1, 1000) for k in range(19)}
    differences = torch.tensor([int64_bits(d) for d in sorted(rounds - {0})])
    distances = keys_apart(sv.request_seed, differences)
    assert int(distances.min()) >= KEYED_TOKENS


# ---------------------------------------------------------------------------------------------------------
# independent draws: pairs of requests with close seeds on one fixed distribution

PROBS = np.array([0.35, 0.25, 0.2, 0.12, 0.08])
PAIRS, TOKENS = 3000, 8
LEVEL = 1e-3


def plain_decoding(request_seed, bases: torch.Tensor, tokens: int) -> np.ndarray:
    """Each request's first `tokens` tokens sampled from PROBS (a stand-in for a context that barely moves
    the next token) with seed request_seed(base, n) -> int [requests, tokens]."""
    logits = torch.tensor(np.log(PROBS), dtype=torch.float32).expand(len(bases) * tokens, -1).contiguous()
    seeds = request_seed(bases[:, None], torch.arange(tokens)[None, :]).reshape(-1)
    return sv.sample(logits, 1.0, -1, 1.0, seeds).view(len(bases), tokens).numpy()


def joint_p_value(first: np.ndarray, second: np.ndarray) -> float:
    """Pearson's chi-square of the joint counts of (first, second) token pairs against PROBS x PROBS,
    the exact product of the marginals."""
    counts = np.zeros((len(PROBS), len(PROBS)))
    np.add.at(counts, (first.reshape(-1), second.reshape(-1)), 1)
    expected = counts.sum() * np.outer(PROBS, PROBS)
    return float(stats.chisquare(counts.reshape(-1), expected.reshape(-1)).pvalue)


def shifted_p_values(request_seed, apart: int) -> dict[str, float]:
    """Requests with seeds b and b + apart (3000 pairs, b far apart): their tokens at the same position,
    and at positions shifted by one and by `apart` each way."""
    bases = torch.arange(PAIRS, dtype=torch.int64) * 100_003
    a = plain_decoding(request_seed, bases, TOKENS)
    b = plain_decoding(request_seed, bases + apart, TOKENS)
    values = {"same position": joint_p_value(a, b)}
    for shift in sorted({1, apart}):
        values[f"a[n + {shift}], b[n]"] = joint_p_value(a[:, shift:], b[:, :-shift])
        values[f"a[n], b[n + {shift}]"] = joint_p_value(a[:, :-shift], b[:, shift:])
    return values


@pytest.mark.parametrize("apart", [1, 2, 3])
def test_requests_with_close_seeds_draw_independently(apart):
    """Consecutive seeds, and the seeds of vLLM's n = 4 children (seed + 1, + 2, + 3): the joint frequencies
    equal the product of the exact marginals at level 1e-3; the old scheme is caught with p < 1e-12."""
    values = shifted_p_values(sv.request_seed, apart)
    assert min(values.values()) > LEVEL, values
    old = shifted_p_values(old_request_seed, apart)
    assert old[f"a[n + {apart}], b[n]"] < 1e-12, old


def test_marginals_are_the_distribution():
    """The test's own footing: each request alone draws from PROBS."""
    tokens = plain_decoding(sv.request_seed, torch.arange(PAIRS, dtype=torch.int64) * 100_003, TOKENS)
    counts = np.bincount(tokens.reshape(-1), minlength=len(PROBS))
    assert stats.chisquare(counts, counts.sum() * PROBS).pvalue > LEVEL
