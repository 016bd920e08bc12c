"""The contract at the edges of the uniforms, on every backend: u = 0 and u = 1 - 2**-53 on every stream the
verifier draws on, exact ties of the ratio test and of the inverse CDF, in chains and in sampled trees.

Every test takes `each_backend` (tests/conftest.py): it runs forced on native (the C kernels), torch (the
reference) and triton (its kernels under Triton's interpreter on the CPU); test_every_backend_runs_here
fails where a backend would be skipped on a CPU-only machine, so none is silently left out.

How a key with a chosen uniform is built (tests/support/mixer.py): the bits of (key, stream) are
`mix64(mix64(key) ^ salt(stream))` and the uniform is `(bits >> 11) * 2**-53`, so u == 0 exactly when
bits < 2**11. mix64 is a bijection (xor-shifts and odd multiplications mod 2**64, each undone in turn), so
`key = unmix64(unmix64(bits) ^ salt(stream))` is the one key with those bits. For bits = 0 it is simply
`stream + 0xD1B54A32D192ED03` (mix64(0) == 0, and salt(stream) is mix64 of that number); bits = 2047 gives
another key with u == 0, whose other streams differ. Any uniform n * 2**-53 is built the same way (bits
n << 11, plus any low 11 bits). A row whose draft position (or tree depth) j should meet the key gets the
per-request seed `key - j` (the draw at j is keyed by s_b + j, SPEC §4).

The streams (SPEC §4) and where each is driven to its ends here:
- target (0): sample(), the chain's bonus and argmax-mode draws, the tree's bonus at depth 0 and 1;
- accept (1): the chain's ratio test, the tree's child of rank 0;
- residual (2): the chain's recovery, the tree's final draw after every child is rejected;
- sibling streams 3 and 4 (`sibling_stream(1)`, `(2)`): the tree's children of rank 1 and 2, with and
  without replacement. (STREAM_DRAFT is the drafters' own, never the verifier's.)

At u = 0 the rule "reject iff u * q(d) >= p~(d)" rejects exactly the drafts with p~(d) == 0: written with
`>` instead it would accept a token the target can never commit. The same holds for each later sibling
("reject iff u * q(c) >= r(c)"). At u = 1/2 with q(d) = 2 p~(d) exactly the product meets p~(d): `>=`
rejects, `>` accepts. Every draw (inverse CDF in vocabulary order: the smallest id with cumulative weight
> u * total) at u = 0 gives the lowest id with positive weight, at u = 1 - 2**-53 the highest, and at
u = k / n over n equal weights exactly the (k+1)-th id.

Mutants this module catches (each planted by hand in src and the module run against it, then reverted):
- src/specverify/kernels/triton/jit.py, `coin * tl.where(blind, 1.0, q_draft) >= p_draft` -> `>`:
  test_u_zero_rejects_exactly_the_drafts_outside_p_tilde[triton-*] and test_ratio_test_ties[triton];
- src/specverify/tree.py, `_later_siblings`, `coin * torch.where(q_c <= 0, 1.0, q_c) >= r_c` -> `>`:
  test_sampled_tree_at_the_edges[*] (the rows "rank 1/2, p~ = 0", every backend, both sibling schemes);
- src/specverify/kernels/native/kernels.c, `accept[at] * (blind ? 1.0 : q_draft) >= p_draft` -> `>`:
  test_u_zero_rejects_exactly_the_drafts_outside_p_tilde[native-*] and test_ratio_test_ties[native];
- src/specverify/verdicts.py, `ratio_test`, `accept_uniforms * torch.where(blind, 1.0, q_draft) >= p_draft`
  -> `>`: test_u_zero_rejects_exactly_the_drafts_outside_p_tilde[torch-*], test_ratio_test_ties[torch] and
  test_sampled_tree_at_the_edges[*] (the row "rank 0, p~ = 0": a tree's rank 0 is the chain's rule).
Also, not asked of it: the torch draw's tie `cumsum <= target` -> `<` (kernels/reference/__init__.py) fails
test_draw_ties_on_the_target_stream[torch], the end-of-interval draws and the tree at u = 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from specverify.rng import sibling_stream
from tests.support import mixer, oracle
from tests.support.backends import HAS_CUDA, native_available, triton_available
from tests.support.seeds import int64_bits

V = 80
ZERO_BITS = (0, 2**11 - 1)  # both give u == 0
#: The numerator of the largest uniform, 1 - 2**-53.
TOP = 2**53 - 1
#: The streams of the accept coins of a sampled tree's children of rank 1 and 2 (SPEC §4, §8).
STREAM_SIBLING_1, STREAM_SIBLING_2 = 3, 4
#: Every stream the verifier draws on that these tests drive to its ends.
VERIFIER_STREAMS = (mixer.STREAM_TARGET, mixer.STREAM_ACCEPT, mixer.STREAM_RESIDUAL, STREAM_SIBLING_1, STREAM_SIBLING_2)


def zero_key(stream: int, bits: int = 0) -> int:
    """A uint64 key whose uniform on `stream` is exactly 0."""
    return mixer.key_for_bits(bits, stream)


def key_at(numerator: int, stream: int, low: int = 0) -> int:
    """A uint64 key whose uniform on `stream` is exactly numerator * 2**-53 (`low`: the 11 bits below, which
    choose among the 2**11 such keys)."""
    return mixer.key_for_bits((numerator << 11) | low, stream)


def test_every_backend_runs_here():
    """On a CPU-only machine each_backend must run all three backends: a skip would hide a backend."""
    if HAS_CUDA:
        pytest.skip("with CUDA the triton kernels are checked on the device (python -m specverify.check)")
    assert native_available(), "the native C kernels do not load: each_backend would skip them"
    assert triton_available(), "triton or its interpreter is missing: each_backend would skip it"


@pytest.mark.parametrize("low", ZERO_BITS)
def test_the_built_keys_give_the_ends(low):
    assert sibling_stream(1) == STREAM_SIBLING_1 and sibling_stream(2) == STREAM_SIBLING_2
    for stream in VERIFIER_STREAMS:
        for numerator, value in ((0, 0.0), (TOP, 1 - 2**-53)):
            key = key_at(numerator, stream, low)
            u = sv.keyed_uniform(torch.tensor([int64_bits(key + delta) for delta in (0, 1, -1)]), stream)
            assert u[0] == value and (u[1:] != value).all()  # only that key: its neighbours are ordinary
            for other in (s for s in VERIFIER_STREAMS if s != stream):  # the other streams are ordinary
                assert sv.keyed_uniform(torch.tensor([int64_bits(key)]), other)[0] != value
    assert zero_key(mixer.STREAM_ACCEPT) == 0xD1B54A32D192ED03 + mixer.STREAM_ACCEPT
    assert zero_key(mixer.STREAM_ACCEPT, 2**11 - 1) == key_at(0, mixer.STREAM_ACCEPT, 2**11 - 1)


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
def test_u_zero_rejects_exactly_the_drafts_outside_p_tilde(each_backend, position, bits):
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


def test_u_zero_through_a_shared_seed(each_backend):
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
def test_draws_at_the_ends_of_the_unit_interval(each_backend, vocab):
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


@pytest.mark.parametrize("numerator", [0, TOP])
def test_residual_draw_at_the_ends(each_backend, numerator):
    """A rejection whose residual uniform is 0 commits the lowest id of max(0, p~ - q)'s support, one whose
    residual uniform is 1 - 2**-53 the highest."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 1, (1, 2, V)).astype(np.float32)
    law = oracle.truncated_distribution(logits[0, 0], 1.0)
    q = np.zeros((1, 1, V))
    q[0, 0, :10] = law.probs[:10] * 2  # the first ten tokens are covered by q, so not in the residual
    q[0, 0, 40] = 1 - q[0, 0].sum()
    residual = np.maximum(law.probs - q[0, 0], 0)
    key = int64_bits(key_at(numerator, mixer.STREAM_RESIDUAL))
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
    assert int(recovered[0, 0]) == _support_edges(residual)[numerator > 0] == (10 if numerator == 0 else V - 1)


SMALL_V = 16


def _allowed(support, vocab: int = SMALL_V) -> np.ndarray:
    allowed = np.zeros(vocab, dtype=bool)
    allowed[list(support)] = True
    return allowed


def _inverse_cdf(weights: np.ndarray, u: float) -> tuple[int, float]:
    """SPEC §4's draw in float64 and its margin: the smallest id with cumulative weight > u * total, and the
    distance of u * total from the nearest cumulative sum, relative to the total."""
    cumulative = np.cumsum(weights)
    threshold = u * cumulative[-1]
    return int(np.flatnonzero(cumulative > threshold)[0]), float(np.abs(cumulative - threshold).min() / cumulative[-1])


# The ratio test at exact ties and at the ends (SPEC §3.2), K = 1, draft token 0, the logits all equal so
# that p~ is exactly 1 / |support| in float32: (name, support, q as {id: prob}, numerator of the accept
# uniform (u = n * 2**-53), accepted). Rejection iff u * q(d) >= p~(d), q(d) == 0 counting as 1.
HALF, QUARTER = 2**52, 2**51
RATIO_CASES = [
    ("tie: u = 1/2, q(d) = 2 p~(d)", (0, 1, 2, 3), {0: 0.5, 1: 0.5}, HALF, False),
    ("below the tie: q(d) a float32 step under 1/2", (0, 1, 2, 3), {0: 0.5 - 2**-25, 1: 0.5 + 2**-25}, HALF, True),
    ("tie: u = 1/4, q(d) = 1", (0, 1, 2, 3), {0: 1.0}, QUARTER, False),
    ("below the tie: u a step under 1/4, q(d) = 1", (0, 1, 2, 3), {0: 1.0}, QUARTER - 1, True),
    ("tie: u = 1/2, blind (q(d) = 0 counts as 1), p~(d) = 1/2", (0, 1), {2: 1.0}, HALF, False),
    ("u = 1 - 2**-53, q(d) == p~(d)", (0, 1, 2, 3), {0: 0.25, 1: 0.75}, TOP, True),
    ("u = 1 - 2**-53, q(d) a float32 step above p~(d)", (0, 1, 2, 3), {0: 0.25 + 2**-25, 1: 0.75 - 2**-25}, TOP, False),
    ("u = 1 - 2**-53, blind, p~(d) = 1", (0,), {1: 1.0}, TOP, True),
    ("u = 1 - 2**-53, blind, p~(d) = 1/4", (0, 1, 2, 3), {1: 1.0}, TOP, False),
    ("u = 0, p~(d) = 0", (1, 2, 3, 4), {0: 0.5, 1: 0.5}, 0, False),
    ("u = 0, p~(d) = 0, blind", (1, 2, 3, 4), {1: 1.0}, 0, False),
    ("u = 0, p~(d) = 1/4, q(d) = 1", (0, 1, 2, 3), {0: 1.0}, 0, True),
]


def test_ratio_test_ties(each_backend):
    """Each case's verdict exactly, and on a rejection the recovery: the inverse CDF of max(0, p~ - q) (p~
    without d where q(d) == 0) at the same key's residual uniform."""
    rows = len(RATIO_CASES)
    allowed = np.ones((rows, 2, SMALL_V), dtype=bool)
    q = np.zeros((rows, 1, SMALL_V), dtype=np.float32)
    seeds = []
    for b, (_, support, probs, numerator, _) in enumerate(RATIO_CASES):
        allowed[b, 0] = _allowed(support)
        for token, prob in probs.items():
            q[b, 0, token] = prob
        seeds.append(int64_bits(key_at(numerator, mixer.STREAM_ACCEPT, low=b)))
    first, recovered, _ = sv.stochastic_acceptance_sampler(
        torch.zeros(rows, 1, dtype=torch.int64),
        torch.zeros(rows, 2, SMALL_V),
        torch.ones(rows),
        torch.full((rows,), -1),
        None,
        torch.ones(rows),
        None,
        torch.tensor(seeds),
        token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)),
        draft_proposal="sampled",
        draft_probs_full=torch.as_tensor(q),
    )
    want = []
    for b, (name, support, _, numerator, accepted) in enumerate(RATIO_CASES):
        p = allowed[b, 0] / len(support)
        q_d = float(q[b, 0, 0])
        assert (numerator * 2.0**-53 * (q_d if q_d > 0 else 1.0) < p[0]) == accepted, f"the case is wrong: {name}"
        if accepted:
            want.append((1, 0))
            continue
        residual = np.maximum(p - q[b, 0], 0) if q_d > 0 else np.where(np.arange(SMALL_V) == 0, 0.0, p)
        token, margin = _inverse_cdf(residual, mixer.keyed_uniform(seeds[b], mixer.STREAM_RESIDUAL))
        assert margin > 1e-6, f"{name}: the residual draw lies too near a boundary to be exact"
        want.append((0, token))
    got = [(int(first[b]), int(recovered[b, 0])) for b in range(rows)]
    assert got == want, [(case[0], g) for case, g, w in zip(RATIO_CASES, got, want) if g != w]


# Draws at exact ties of the inverse CDF (SPEC §4): four equal weights on the ids below, so u * total is
# exactly a cumulative sum at u = k / 4, where the draw is the (k+1)-th id (the sum must exceed u * total).
TIE_SUPPORT = (3, 5, 8, 13)
TIE_DRAWS = [(0, 3), (QUARTER - 1, 3), (QUARTER, 5), (HALF, 8), (3 * QUARTER - 1, 8), (3 * QUARTER, 13), (TOP, 13)]


def test_draw_ties_on_the_target_stream(each_backend):
    """sample() and the chain's argmax-mode bonus at u = k / 4 over four equal weights (and a step below)."""
    rows = len(TIE_DRAWS)
    allowed = torch.as_tensor(np.stack([_allowed(TIE_SUPPORT)] * rows))
    keys = torch.tensor([int64_bits(key_at(n, mixer.STREAM_TARGET, low=b)) for b, (n, _) in enumerate(TIE_DRAWS)])
    params = (torch.ones(rows), torch.full((rows,), -1), torch.ones(rows))
    got = sv.sample(torch.zeros(rows, SMALL_V), *params[:2], params[2], keys, token_bitmask=sv.pack_bitmask(allowed))
    assert got.tolist() == [token for _, token in TIE_DRAWS]
    _, _, bonus = sv.stochastic_acceptance_sampler(
        torch.zeros(rows, 0, dtype=torch.int64),
        torch.zeros(rows, 1, SMALL_V),
        params[0],
        params[1],
        None,
        params[2],
        None,
        keys,
        token_bitmasks=sv.pack_bitmask(allowed)[:, None],
    )
    assert bonus[:, 0].tolist() == [token for _, token in TIE_DRAWS]


# A sampled tree (SPEC §8) whose children all hang from the root, one row per case; index 0's p~ is 1/3 on
# ids 10, 11, 12 (equal logits, the rest masked, or outside top-k for the row that says so). (name, the
# children's tokens by rank, their q as {id: prob}, the stream and uniform numerator its key meets (at
# depth `at`), the expected path length, the expected next token.) The q are chosen so that after the
# rejections the residual holds id 12 alone (whatever the residual uniform, and with or without
# replacement), and below an accepted child (index i + 1 of node i) only id 7 is allowed.
GONE = {10: 0.4, 11: 0.4}  # q's mass that empties 10 and 11 from the residual on the first rejection
TREE_CASES = [
    ("rank 0, p~ = 0, u = 0", (5,), {5: 0.2, **GONE}, mixer.STREAM_ACCEPT, 0, 0, 0, 12),
    ("rank 1, p~ = 0, u = 0", (5, 6), {5: 0.2, 6: 0.2, 10: 0.3, 11: 0.3}, STREAM_SIBLING_1, 0, 0, 0, 12),
    ("rank 1, p~ = 0, blind, u = 0", (5, 6), {5: 0.2, **GONE}, STREAM_SIBLING_1, 0, 0, 0, 12),
    ("rank 1, outside top-k, u = 0", (5, 9), {5: 0.2, 9: 0.2, 10: 0.3, 11: 0.3}, STREAM_SIBLING_1, 0, 0, 0, 12),
    ("rank 2, p~ = 0, u = 0", (5, 6, 8), {5: 0.2, 6: 0.2, 8: 0.2, 10: 0.2, 11: 0.2}, STREAM_SIBLING_2, 0, 0, 0, 12),
    ("rank 1, p~ > 0, u = 0: accepted", (5, 11), {5: 0.2, 10: 0.4, 11: 0.3, 12: 0.1}, STREAM_SIBLING_1, 0, 0, 1, 7),
    (
        "rank 1, r(c) < q(c), u = 1 - 2**-53",
        (5, 11),
        {5: 0.2, 10: 0.4, 11: 0.3, 12: 0.1},
        STREAM_SIBLING_1,
        TOP,
        0,
        0,
        12,
    ),
    (
        "rank 2, p~ > 0, u = 0: accepted",
        (5, 6, 11),
        {5: 0.2, 6: 0.2, 10: 0.3, 11: 0.2, 12: 0.1},
        STREAM_SIBLING_2,
        0,
        0,
        1,
        7,
    ),
    ("residual, u = 0", (5,), {5: 0.5, 10: 0.5}, mixer.STREAM_RESIDUAL, 0, 0, 0, 11),
    ("residual, u = 1 - 2**-53", (5,), {5: 0.5, 10: 0.5}, mixer.STREAM_RESIDUAL, TOP, 0, 0, 12),
    ("bonus at the root, u = 0", (), {}, mixer.STREAM_TARGET, 0, 0, 0, 10),
    ("bonus at the root, u = 1 - 2**-53", (), {}, mixer.STREAM_TARGET, TOP, 0, 0, 12),
    ("bonus below a child, u = 0", (10,), {10: 0.25, 5: 0.75}, mixer.STREAM_TARGET, 0, 1, 1, 2),
    ("bonus below a child, u = 1 - 2**-53", (10,), {10: 0.25, 5: 0.75}, mixer.STREAM_TARGET, TOP, 1, 1, 13),
]
TREE_NODES = 3


def _tree_inputs(low: int):
    rows = len(TREE_CASES)
    draft = np.full((rows, TREE_NODES), -1)
    q = np.zeros((rows, TREE_NODES, SMALL_V), dtype=np.float32)
    logits = np.zeros((rows, TREE_NODES + 1, SMALL_V), dtype=np.float32)
    allowed = np.zeros((rows, TREE_NODES + 1, SMALL_V), dtype=bool)
    top_k = np.full(rows, -1)
    seeds = []
    for b, (name, children, probs, stream, numerator, depth, _, _) in enumerate(TREE_CASES):
        allowed[b, 0] = _allowed((10, 11, 12))
        allowed[b, 1:] = _allowed((7,))
        if "outside top-k" in name:  # 9 allowed, but the fourth largest: top_k = 3 truncates it
            allowed[b, 0, 9], logits[b, 0, 9], top_k[b] = True, -1.0, 3
        if "bonus below" in name:
            allowed[b, 1] = _allowed((2, 7, 13))
        draft[b, : len(children)] = children
        for token, prob in probs.items():
            q[b, : len(children), token] = prob
        seeds.append(int64_bits(key_at(numerator, stream, low) - depth))
    parents = np.full((rows, TREE_NODES), -1)
    return draft, parents, logits, allowed, top_k, q, seeds


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement"])
@pytest.mark.parametrize("low", ZERO_BITS)
def test_sampled_tree_at_the_edges(each_backend, scheme, low):
    """Each tree stream at its ends: a child whose p~ (or r) is 0 is rejected by a coin of exactly 0 at rank
    0 (accept stream) and at ranks 1 and 2 (sibling streams), and accepted when r(c) > 0; at u = 1 - 2**-53
    a later sibling with r(c) < q(c) is rejected; the final residual draw and the bonus (depth 0 and 1)
    give the lowest id of their support at u = 0 and the highest at u = 1 - 2**-53."""
    draft, parents, logits, allowed, top_k, q, seeds = _tree_inputs(low)
    for b, (name, children, *_) in enumerate(TREE_CASES):  # the cases are what they say
        law = oracle.truncated_distribution(logits[b, 0], 1.0, int(top_k[b]), allowed=allowed[b, 0])
        assert np.allclose(law.probs, _allowed((10, 11, 12)) / 3), name
        if "p~ = 0" in name or "outside top-k" in name:  # every child is outside p~
            assert (law.probs[list(children)] == 0).all(), name
    # the accepted child, where there is one, is the last (rank 1 and 2) or the only child
    want = [
        ([len(case[1]) - 1] if case[-2] else []) + [-1] * (TREE_NODES - case[-2]) + [case[-1]] for case in TREE_CASES
    ]
    for validate in (True, False):  # (False: every row walks N + 1 steps, each up to N - depth siblings deep)
        path, path_length, next_token = sv.tree_acceptance_sampler(
            torch.as_tensor(draft),
            torch.as_tensor(parents),
            torch.as_tensor(logits),
            torch.ones(len(seeds)),
            torch.as_tensor(top_k),
            torch.ones(len(seeds)),
            torch.tensor(seeds),
            token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)),
            draft_proposal="sampled",
            draft_probs=torch.as_tensor(q),
            sibling_draws=scheme,
            validate=validate,
        )
        assert (path >= 0).sum(-1).tolist() == path_length.tolist()
        got = torch.cat([path, next_token[:, None]], dim=1).tolist()
        assert got == want, [(case[0], g, validate) for case, g, w in zip(TREE_CASES, got, want) if g != w]
