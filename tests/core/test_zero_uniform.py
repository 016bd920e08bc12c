"""The edges of the uniforms: u = 0 in the sampled rule's ratio test and in every draw, u = 1 - 2**-53 too.

How a key with a chosen uniform is built (tests/support/mixer.py): the bits of (key, stream) are
`mix64(mix64(key) ^ salt(stream))` and the uniform is `(bits >> 11) * 2**-53`, so u == 0 exactly when
bits < 2**11. mix64 is a bijection (xor-shifts and odd multiplications mod 2**64, each undone in turn), so
`key = unmix64(unmix64(bits) ^ salt(stream))` is the one key with those bits. For bits = 0 it is simply
`stream + 0xD1B54A32D192ED03` (mix64(0) == 0, and salt(stream) is mix64 of that number); bits = 2047 gives
another key with u == 0, whose other streams differ. A row whose draft position j should meet the key gets
the per-request seed `key - j` (the draw at position j is keyed by s_b + j, SPEC §4).

At u = 0 the rule "reject iff u * q(d) >= p~(d)" rejects exactly the drafts with p~(d) == 0: written with
`>` instead it would accept a token the target can never commit. Every draw (inverse CDF in vocabulary
order) at u = 0 gives the lowest id with positive weight, and at u = 1 - 2**-53 the highest: a draw that
lands on a zero-weight id at either end is caught.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from tests.support import mixer, oracle
from tests.support.seeds import int64_bits

V = 80
ZERO_BITS = (0, 2**11 - 1)  # both give u == 0


def zero_key(stream: int, bits: int = 0) -> int:
    """A uint64 key whose uniform on `stream` is exactly 0."""
    return mixer.key_for_bits(bits, stream)


@pytest.mark.parametrize("bits", ZERO_BITS)
def test_the_built_keys_give_zero(bits):
    for stream in (mixer.STREAM_TARGET, mixer.STREAM_ACCEPT, mixer.STREAM_RESIDUAL):
        key = zero_key(stream, bits)
        u = sv.keyed_uniform(torch.tensor([int64_bits(key + delta) for delta in (0, 1, -1)]), stream)
        assert u[0] == 0.0 and (u[1:] > 0).all()  # only that key: its neighbours are ordinary
        others = [s for s in range(3) if s != stream]
        assert (sv.keyed_uniform(torch.tensor([int64_bits(key)] * 2), others[0]) > 0).all()
    assert zero_key(mixer.STREAM_ACCEPT) == 0xD1B54A32D192ED03 + mixer.STREAM_ACCEPT


def _logits(rng: np.random.Generator) -> np.ndarray:
    """One position's float32 logits: a clear top token, a spread, and a far tail with tiny p~."""
    x = rng.normal(0, 1, V)
    x[0], x[V - 1] = 8.0, -9.0  # token V-1: p~ about 4e-8 when nothing truncates it
    return x.astype(np.float32)


# (name, temperature, top_k, top_p, min_p, draft token, q of the draft position, p~(d) > 0): at u = 0 the
# draft is accepted iff p~(d) > 0 (the last column, which the oracle confirms). q: "one-hot" (q(d) = 1),
# "half" (q(d) = 0.5), "blind" (q(d) = 0 in a present row), "empty" (an all-zero row).
CASES = [
    ("masked, q(d) = 1", 1.0, -1, 1.0, 0.0, 3, "one-hot", False),
    ("outside top-k", 1.0, 2, 1.0, 0.0, 5, "half", False),
    ("outside top-p", 1.0, -1, 0.5, 0.0, 6, "one-hot", False),
    ("outside min-p", 1.0, -1, 1.0, 0.2, 7, "half", False),
    ("tiny p~, q(d) = 1", 1.0, -1, 1.0, 0.0, V - 1, "one-hot", True),
    ("tiny p~, blind", 1.0, -1, 1.0, 0.0, V - 1, "blind", True),
    ("masked, blind", 1.0, -1, 1.0, 0.0, 3, "blind", False),
    ("tiny p~, no q", 1.0, -1, 1.0, 0.0, V - 1, "empty", True),
    ("outside top-k, no q", 1.0, 2, 1.0, 0.0, 5, "empty", False),
    ("greedy, not the argmax", 0.0, -1, 1.0, 0.0, 9, "one-hot", False),
    ("greedy, the argmax", 0.0, -1, 1.0, 0.0, 0, "half", True),
    ("kept, q(d) < p~(d)", 1.0, 3, 1.0, 0.0, 0, "half", True),
]


def _draft_probs(kind: str, draft: int, rng: np.random.Generator) -> np.ndarray:
    q = np.zeros(V)
    if kind == "one-hot":
        q[draft] = 1.0
    elif kind == "half":
        q = rng.random(V)
        q[draft] = 0.0
        q = 0.5 * q / q.sum()
        q[draft] = 0.5
    elif kind == "blind":
        q = rng.random(V)
        q[draft] = 0.0
        q /= q.sum()
    return q


def _case_inputs(position: int, bits: int):
    """Every case as one row of K = 2 whose case draft sits at `position`, the seed putting the accept
    uniform 0 there. An earlier position drafts token 0 with q one-hot at it, where the logits make p~(0)
    == 1 in float32, so it is accepted whatever its uniform. -> logits, allowed, q, draft, seeds."""
    rng = np.random.default_rng(position)
    rows, positions = len(CASES), 2
    logits = np.stack([np.stack([_logits(rng) for _ in range(positions + 1)]) for _ in CASES])
    allowed = np.ones((rows, positions + 1, V), dtype=bool)
    allowed[:, :, 3] = False  # token 3 is masked everywhere
    q = np.zeros((rows, positions, V))
    draft = np.full((rows, positions), -1)
    for b, (_, _, _, _, _, d, kind, _) in enumerate(CASES):
        draft[b, position] = d
        q[b, position] = _draft_probs(kind, d, rng)
        for j in range(position):  # earlier positions: the top token with q = one-hot, accepted at any u
            draft[b, j] = 0
            q[b, j, 0] = 1.0
            logits[b, j] = -30.0
            logits[b, j, 0] = 10.0
    seeds = [int64_bits(zero_key(mixer.STREAM_ACCEPT, bits) - position)] * rows
    return logits, allowed, q, draft, seeds


@pytest.mark.parametrize("position", [0, 1])
@pytest.mark.parametrize("bits", ZERO_BITS)
def test_u_zero_rejects_exactly_the_drafts_outside_p_tilde(code_path, position, bits):
    logits, allowed, q, draft, seeds = _case_inputs(position, bits)
    params = [torch.tensor([case[i] for case in CASES]) for i in (1, 2, 3, 4)]
    first, recovered, _ = sv.stochastic_acceptance_sampler(
        torch.as_tensor(draft),
        torch.as_tensor(logits),
        params[0].float(),
        params[1],
        None,
        params[2].float(),
        None,
        torch.tensor(seeds),
        token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)),
        draft_proposal="sampled",
        draft_probs_full=torch.as_tensor(q, dtype=torch.float32),
        min_p=params[3].float(),
    )
    for b, (name, temperature, top_k, top_p, min_p, d, _, kept) in enumerate(CASES):
        law = oracle.truncated_distribution(logits[b, position], temperature, top_k, top_p, min_p, allowed[b, position])
        assert (law.probs[d] > 0) == kept, f"the case is not what it says: {name}, p~(d) = {law.probs[d]:.3g}"
        assert int(first[b]) == (position + 1 if kept else position), f"{name}: p~(d) = {law.probs[d]:.3g}"
        if not kept:  # the replacement is a token the target can commit
            assert law.probs[int(recovered[b, position])] > 0, name


def test_u_zero_through_a_shared_seed(code_path):
    """A draft with tiny p~(d) and q(d) = 1 is accepted only by a uniform below p~(d): the key as a shared
    seed reaches row 0 only (row 1 has s + 0x9E3779B97F4A7C15), as per-request seeds it reaches both."""
    rng = np.random.default_rng(5)
    logits = torch.as_tensor(np.stack([_logits(rng), _logits(rng)])).expand(2, 2, V)
    q = torch.zeros(2, 1, V)
    q[:, 0, V - 1] = 1.0
    key = int64_bits(zero_key(mixer.STREAM_ACCEPT))
    verdicts = []
    for seed in (key, torch.tensor(key), torch.tensor([key]), torch.tensor([key, key])):
        first, _, _ = sv.stochastic_acceptance_sampler(
            torch.tensor([[V - 1], [V - 1]]),
            logits,
            torch.ones(2),
            torch.tensor([-1, -1]),
            None,
            torch.ones(2),
            None,
            seed,
            draft_proposal="sampled",
            draft_probs_full=q,
        )
        verdicts.append(first.tolist())
    assert verdicts == [[1, 0], [1, 0], [1, 0], [1, 1]]


def _support_edges(probs: np.ndarray) -> tuple[int, int]:
    support = np.flatnonzero(probs > 0)
    return int(support[0]), int(support[-1])


@pytest.mark.parametrize("vocab", [80, 3000])
def test_draws_at_the_ends_of_the_unit_interval(code_path, vocab):
    """sample() and the argmax-mode verifier at u = 0 give the lowest id of p~'s support, at u = 1 - 2**-53
    the highest, with zero-weight ids at both ends of the vocabulary (masked, or truncated by top-k)."""
    rng = np.random.default_rng(vocab)
    rows = 4
    logits = rng.normal(0, 1, (rows, vocab)).astype(np.float32)
    allowed = np.ones((rows, vocab), dtype=bool)
    allowed[:, :3] = False
    allowed[:, -3:] = False
    top_k = np.array([-1, 10, 1, vocab // 3])
    laws = [oracle.truncated_distribution(logits[n], 1.0, int(top_k[n]), allowed=allowed[n]) for n in range(rows)]
    for numerator, edge in ((0, 0), (2**53 - 1, 1)):
        key = int64_bits(mixer.key_for_uniform(numerator, mixer.STREAM_TARGET))
        got = sv.sample(
            torch.as_tensor(logits),
            torch.ones(rows),
            torch.as_tensor(top_k),
            torch.ones(rows),
            torch.full((rows,), key),
            token_bitmask=sv.pack_bitmask(torch.as_tensor(allowed)),
        )
        assert got.tolist() == [_support_edges(law.probs)[edge] for law in laws]
        _, recovered, bonus = sv.stochastic_acceptance_sampler(
            torch.full((rows, 1), -1),
            torch.as_tensor(logits)[:, None].expand(rows, 2, vocab),
            torch.ones(rows),
            torch.as_tensor(top_k),
            None,
            torch.ones(rows),
            None,
            torch.tensor([key, int64_bits(key - 1)] * 2),
            token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed))[:, None].expand(rows, 2, -1),
        )
        drawn = [int(recovered[n, 0]) if n % 2 == 0 else int(bonus[n, 0]) for n in range(rows)]
        assert drawn == got.tolist()


def test_residual_draw_at_u_zero(code_path):
    """A rejection whose residual uniform is 0 commits the lowest id of max(0, p~ - q)'s support."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 1, (1, 2, V)).astype(np.float32)
    law = oracle.truncated_distribution(logits[0, 0], 1.0)
    q = np.zeros((1, 1, V))
    q[0, 0, :10] = law.probs[:10] * 2  # the first ten tokens are covered by q, so not in the residual
    q[0, 0, 40] = 1 - q[0, 0].sum()
    residual = np.maximum(law.probs - q[0, 0], 0)
    key = int64_bits(mixer.key_for_uniform(0, mixer.STREAM_RESIDUAL))
    assert mixer.keyed_uniform(key, mixer.STREAM_ACCEPT) * q[0, 0, 40] >= law.probs[40]  # rejected
    _, recovered, _ = sv.stochastic_acceptance_sampler(
        torch.tensor([[40]]),
        torch.as_tensor(logits),
        torch.ones(1),
        torch.tensor([-1]),
        None,
        torch.ones(1),
        None,
        torch.tensor([key]),
        draft_proposal="sampled",
        draft_probs_full=torch.as_tensor(q, dtype=torch.float32),
    )
    assert int(recovered[0, 0]) == _support_edges(residual)[0] == 10
