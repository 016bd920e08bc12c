"""Known answers: what a user's seeds produce, pinned on every code path (SPEC §4).

A backend or a refactor must not change the tokens a user gets for a seed. These tests pin, as literal
values, the uniforms of `keyed_uniform` on every stream (keys with the high bit set included), the draws
of `sample`, and whole verifier calls in both modes with per-request and shared seeds, ragged drafts, a
greedy row, top-k, top-p, min-p and a grammar mask. Each literal is also explained: the uniforms are
recomputed from the mixer as documented (tests/support/mixer.py, Python ints, no torch), and every committed
token from those uniforms and the float64 oracle of p~ (tests/support/oracle.py, NumPy, written from SPEC.md),
with every decision far from its rounding boundary. So a change that moves a literal is either a bug, or
a deliberate change of what users get, to be announced.

The inputs are made from the mixer too (no library RNG whose stream could change): logits on a grid of
0.25 (exact in float32, float16 and bfloat16, with many exact ties).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from tests.support import mixer, oracle
from tests.support.seeds import ROW_STRIDE, int64_bits

STREAMS = (mixer.STREAM_TARGET, mixer.STREAM_ACCEPT, mixer.STREAM_RESIDUAL, 3, 1000)
#: key (as uint64) -> the uniform of each stream of STREAMS, as its numerator over 2**53.
GOLDEN_UNIFORMS = {
    0x0000000000000000: (0x09D2C2ABCBE143, 0x1BEC613AC9A2AC, 0x0668607C2DEDF1, 0x10DD181554C2D3, 0x17ABB8373CEB09),
    0x0000000000000001: (0x1F4569E044FF88, 0x04911705EBB3A6, 0x0717686EE8E440, 0x16CEFE3CB3EF3D, 0x1656DC6716F554),
    0x0000000000003039: (0x1AD5CC22F2785E, 0x1DDBC76E3FD50E, 0x0504C4DA43F573, 0x09BD0F05116541, 0x1992C62549D41A),
    0x4000000000000000: (0x0C3DFF6755571D, 0x1903BB2AC451EE, 0x1C395A94A961D0, 0x175237760D51DA, 0x1370DEEB7DE8E6),
    0x8000000000000000: (0x1F70D8FC80DEAD, 0x001B89EE8C5A36, 0x0D2B1FFE3DEFC2, 0x126EEC5A03D87E, 0x17595924E3823F),
    0x8000000000000001: (0x1C436DD550B820, 0x00FF1F13528FB6, 0x0F1D03C0DAA60B, 0x07B0B4434D342E, 0x0BFD479C35ADC3),
    0x9E3779B97F4A7C15: (0x00FFBB11560750, 0x011263F7CE2448, 0x10B22F4A931155, 0x042150C7B131A3, 0x0FD02403E28F45),
    0xFFFFFFFFFFFFFFFF: (0x1166E241581D2A, 0x00F4806D6D975C, 0x13A4ADA260E80C, 0x0C837DFF180855, 0x0A3C26F6F1D20D),
}


def _keys(values) -> torch.Tensor:
    """uint64 values as the int64 tensor of their bit patterns (how seeds and keys are passed)."""
    return torch.tensor([int64_bits(v) for v in values], dtype=torch.int64)


def test_keyed_uniform_golden_values(each_backend):
    keys = _keys(GOLDEN_UNIFORMS)
    for index, stream in enumerate(STREAMS):
        want = torch.tensor([row[index] for row in GOLDEN_UNIFORMS.values()], dtype=torch.float64) * 2.0**-53
        assert torch.equal(sv.keyed_uniform(keys, stream), want), f"stream {stream}"
        assert torch.equal(sv.keyed_uniform(keys.view(2, 4), stream), want.view(2, 4)), f"stream {stream}, [2, 4]"


def test_golden_uniforms_are_the_documented_mixer():
    for key, row in GOLDEN_UNIFORMS.items():
        assert tuple(mixer.keyed_uniform(key, stream) * 2**53 for stream in STREAMS) == row, hex(key)


def test_mixer_inverse_gives_any_chosen_uniform():
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = int(rng.integers(0, 2**63)) << 1 | int(rng.integers(0, 2))
        assert mixer.unmix64(mixer.mix64(x)) == x and mixer.mix64(mixer.unmix64(x)) == x
    targets = [0, 1, 2**52, 2**53 - 1, 0x123456789ABCD]
    for stream in (*STREAMS, 7):
        keys = [mixer.key_for_uniform(n, stream) for n in targets]
        assert torch.equal(sv.keyed_uniform(_keys(keys), stream), torch.tensor(targets, dtype=torch.float64) * 2.0**-53)


# ---------------------------------------------------------------------------------------------------------
# the inputs of the golden calls

DATA_STREAM = 7  # the mixer stream the test inputs are made from
B, K, V = 5, 3, 96
TEMPERATURE = [0.8, 1.2, 0.0, 1.0, 1.5]  # row 2 is greedy
TOP_K = [5, -1, -1, -1, 40]
TOP_P = [1.0, 0.7, 1.0, 1.0, 0.9]
MIN_P = [0.0, 0.0, 0.0, 0.1, 0.02]  # row 3 also has a grammar mask
SEEDS = [7, 2**63 + 5, 123456789, 2**64 - 2, 0x0123456789ABCDEF]  # per request, as uint64
SHARED_SEED = {"argmax": 2**63 + 12345, "sampled": 2**64 - 99}
#: argmax mode: rows 0 and 3 follow the keyed draws for a while, row 1 is ragged, row 2 greedy.
ARGMAX_DRAFT = [[48, 23, 29], [90, -1, -1], [34, 5, 26], [14, 55, 31], [0, 55, 74]]
#: sampled mode: kept tokens of high and middling p~ (q puts 0.15 more on each); row 4 is ragged; q of
#: row 1, position 1 is all zero (no distribution) and row 3's first draft has q(d) == 0.
SAMPLED_DRAFT = [[0, 80, 24], [3, 21, 39], [34, 72, 26], [74, 64, 30], [44, -1, -1]]

#: argmax mode with thinking rows 0, 2 (greedy: stays greedy) and 3 under relaxed_topk = 3 and
#: relaxed_delta = 0.02 (SPEC §3.4). Many logits tie at the top, so "the 3 most likely" takes the lower ids
#: of a tie: row 0's drafts each rank 3rd (two tied with the top-1, one 0.015 below it), row 3's second
#: draft ranks 3rd but lies more than 0.02 below the top-1.
THINKING_DRAFT = [[54, 17, 70], [90, -1, -1], [34, 72, 33], [74, 14, 90], [0, 55, 74]]
THINKING_ROWS = [True, False, True, True, False]
RELAXED_TOPK, RELAXED_DELTA = 3, 0.02
GOLDEN_THINKING = ([3, 1, 2, 1, 0], [[54, 17, 70, 93], [90, 59], [34, 72, 26], [74, 64], [53]])

#: (mode, seeding) -> (first_rejected_idx, committed tokens of each row)
GOLDEN_VERDICTS = {
    ("argmax", "per-request"): ([3, 1, 1, 2, 0], [[48, 23, 29, 93], [90, 59], [34, 72], [14, 55, 30], [53]]),
    ("argmax", "shared"): ([0, 0, 1, 0, 0], [[94], [25], [34, 72], [44], [67]]),
    ("sampled", "per-request"): ([1, 0, 3, 0, 1], [[0, 44], [53], [34, 72, 26, 3], [44], [44, 12]]),
    ("sampled", "shared"): ([3, 1, 3, 2, 0], [[0, 80, 24, 71], [3, 33], [34, 72, 26, 3], [74, 64, 85], [95]]),
}
#: sample() at every (row, position) with key s_b + j: the y_j of argmax mode (SPEC §4), [B, K+1].
GOLDEN_SAMPLES = [[48, 23, 29, 93], [90, 59, 88, 50], [34, 72, 26, 3], [14, 55, 30, 92], [53, 55, 74, 4]]


def grid(key: int, shape, levels: int, step: float) -> np.ndarray:
    """float32 values (b mod levels - levels // 2) * step, b the mixer's bits of key, key + 1, ..."""
    count = int(np.prod(shape))
    values = [(mixer.keyed_bits(key + i, DATA_STREAM) % levels - levels // 2) * step for i in range(count)]
    return np.array(values, dtype=np.float32).reshape(shape)


def golden_inputs() -> tuple[np.ndarray, np.ndarray]:
    """logits float32 [B, K+1, V] and allowed bool [B, K+1, V] (a grammar mask on row 3 only)."""
    logits = grid(1, (B, K + 1, V), levels=24, step=0.25)
    allowed = np.ones((B, K + 1, V), dtype=bool)
    allowed[3] = grid(2, (K + 1, V), levels=2, step=1.0) >= 0
    return logits, allowed


def golden_draft_probs(logits: np.ndarray) -> np.ndarray:
    """q float32 [B, K, V]: 0.85 * softmax(logits + grid noise) + 0.15 at the draft token, with the all-zero
    row and the q(d) == 0 token of SAMPLED_DRAFT's comment."""
    noisy = logits[:, :K].astype(np.float64) + grid(3, (B, K, V), levels=5, step=0.5)
    q = np.exp(noisy - noisy.max(-1, keepdims=True))
    q = 0.85 * q / q.sum(-1, keepdims=True)
    for b, row in enumerate(SAMPLED_DRAFT):
        for j, d in enumerate(row):
            if d >= 0:
                q[b, j, d] += 0.15
            else:
                q[b, j] /= 0.85
    q[1, 1] = 0.0
    q[3, 0, SAMPLED_DRAFT[3][0]] = 0.0
    q[3, 0] /= q[3, 0].sum()
    return q.astype(np.float32)


def _seed_argument(mode: str, seeding: str):
    return _keys(SEEDS) if seeding == "per-request" else SHARED_SEED[mode]


def _row_seeds(mode: str, seeding: str) -> list[int]:
    """s_b of each row as uint64 (SPEC §4), computed with Python ints."""
    if seeding == "per-request":
        return list(SEEDS)
    return [(SHARED_SEED[mode] + b * ROW_STRIDE) & mixer.MASK64 for b in range(B)]


def _params():
    return (
        torch.tensor(TEMPERATURE),
        torch.tensor(TOP_K),
        torch.tensor(TOP_P),
        torch.tensor(MIN_P),
    )


def _run(
    mode: str, seed, logits: torch.Tensor, draft: torch.Tensor, allowed: np.ndarray, q: torch.Tensor | None, **kwargs
):
    """The verifier on the golden parameters -> (first_rejected_idx, committed tokens of each row)."""
    temperature, top_k, top_p, min_p = _params()
    out = sv.stochastic_acceptance_sampler(
        draft,
        logits,
        temperature,
        top_k,
        None,
        top_p,
        None,
        seed,
        token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)),
        draft_proposal=mode,
        draft_probs_full=q,
        min_p=min_p,
        **kwargs,
    )
    tokens, count = sv.committed_tokens(*out)
    return out[0].tolist(), [row[:n] for row, n in zip(tokens.tolist(), count.tolist())]


CASES = sorted(GOLDEN_VERDICTS)


@pytest.mark.parametrize("mode, seeding", CASES)
@pytest.mark.parametrize("validate", [True, False])
def test_verifier_golden_calls(each_backend, mode, seeding, validate):
    logits, allowed = golden_inputs()
    draft = torch.tensor(ARGMAX_DRAFT if mode == "argmax" else SAMPLED_DRAFT)
    q = torch.as_tensor(golden_draft_probs(logits)) if mode == "sampled" else None
    got = _run(mode, _seed_argument(mode, seeding), torch.as_tensor(logits), draft, allowed, q, validate=validate)
    assert got == GOLDEN_VERDICTS[mode, seeding]


@pytest.mark.parametrize("validate", [True, False])
def test_verifier_golden_call_with_thinking_rows(each_backend, validate):
    logits, allowed = golden_inputs()
    got = _run(
        "argmax",
        _keys(SEEDS),
        torch.as_tensor(logits),
        torch.tensor(THINKING_DRAFT),
        allowed,
        None,
        in_thinking_phase=torch.tensor(THINKING_ROWS),
        relaxed_topk=RELAXED_TOPK,
        relaxed_delta=RELAXED_DELTA,
        validate=validate,
    )
    assert got == GOLDEN_THINKING


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_verifier_golden_calls_in_every_layout_and_dtype(each_backend, dtype):
    """The same logits (exact in half precision) as [B*(K+1), V] in float16 / bfloat16, drafts as int32,
    the seed as a 0-d tensor: the same tokens."""
    logits, allowed = golden_inputs()
    flat = torch.as_tensor(logits).to(dtype).reshape(B * (K + 1), V)
    for mode in ("argmax", "sampled"):
        draft = torch.tensor(ARGMAX_DRAFT if mode == "argmax" else SAMPLED_DRAFT, dtype=torch.int32)
        q = torch.as_tensor(golden_draft_probs(logits)) if mode == "sampled" else None
        shared = torch.tensor(int64_bits(SHARED_SEED[mode]))
        assert _run(mode, shared, flat, draft, allowed, q) == GOLDEN_VERDICTS[mode, "shared"], mode
        assert _run(mode, _keys(SEEDS), flat, draft, allowed, q) == GOLDEN_VERDICTS[mode, "per-request"], mode


def _oracle_laws(logits: np.ndarray, allowed: np.ndarray) -> list[list[oracle.Law]]:
    """The oracle's p~ of every (row, position): [B][K+1]."""
    per_position = [np.repeat(values, K + 1) for values in (TEMPERATURE, TOP_K, TOP_P, MIN_P)]
    flat = oracle.row_laws(logits.reshape(-1, V), *per_position, allowed.reshape(-1, V))
    return [flat[b * (K + 1) : (b + 1) * (K + 1)] for b in range(B)]


@pytest.mark.parametrize("mode, seeding", CASES)
def test_golden_verdicts_are_explained(mode, seeding):
    """Each golden row, predicted from the oracle's p~ and the mixer's uniforms on keys s_b + j (SPEC §3,
    §4), far from every rounding boundary."""
    logits, allowed = golden_inputs()
    laws = _oracle_laws(logits, allowed)
    q = golden_draft_probs(logits)
    first, committed = [], []
    for b, s in enumerate(_row_seeds(mode, seeding)):
        u = {stream: [mixer.keyed_uniform(s + j, stream) for j in range(K + 1)] for stream in STREAMS[:3]}
        if mode == "argmax":
            verdict = oracle.argmax_row(laws[b], ARGMAX_DRAFT[b], u[mixer.STREAM_TARGET])
        else:
            verdict = oracle.sampled_row(
                laws[b],
                SAMPLED_DRAFT[b],
                q[b],
                u[mixer.STREAM_ACCEPT],
                u[mixer.STREAM_RESIDUAL],
                u[mixer.STREAM_TARGET][K],
            )
        assert verdict.margin > oracle.AMBIGUOUS, f"row {b} is too close to a boundary to explain"
        first.append(verdict.first_rejected)
        committed.append(verdict.tokens)
    assert (first, committed) == GOLDEN_VERDICTS[mode, seeding]


def test_golden_thinking_call_is_explained():
    """Thinking rows by the relaxed rule (oracle.relaxed_row) with their bonus drawn from p~ as in §3.1;
    the other rows as argmax mode."""
    logits, allowed = golden_inputs()
    masked = np.where(allowed, logits, -np.inf)
    first, committed = [], []
    for b, (laws, s) in enumerate(zip(_oracle_laws(logits, allowed), SEEDS)):
        uniforms = [mixer.keyed_uniform(s + j, mixer.STREAM_TARGET) for j in range(K + 1)]
        if THINKING_ROWS[b] and TEMPERATURE[b] >= oracle.GREEDY_TEMPERATURE:
            bonus = oracle.inverse_cdf(laws[K].probs, uniforms[K])
            verdict = oracle.relaxed_row(masked[b], THINKING_DRAFT[b], RELAXED_TOPK, RELAXED_DELTA, bonus)
        else:
            verdict = oracle.argmax_row(laws, THINKING_DRAFT[b], uniforms)
        assert verdict.margin > oracle.AMBIGUOUS, f"row {b} is too close to a boundary to explain"
        first.append(verdict.first_rejected)
        committed.append(verdict.tokens)
    assert (first, committed) == GOLDEN_THINKING


def test_sample_golden_values(each_backend):
    """sample() at every (row, position) with per-row keys s_b + j gives the y_j that argmax mode commits."""
    logits, allowed = golden_inputs()
    temperature, top_k, top_p, min_p = (t.repeat_interleave(K + 1) for t in _params())
    keys = _keys([s + j for s in SEEDS for j in range(K + 1)])
    got = sv.sample(
        torch.as_tensor(logits).reshape(-1, V),
        temperature,
        top_k,
        top_p,
        keys,
        min_p,
        sv.pack_bitmask(torch.as_tensor(allowed)).reshape(B * (K + 1), -1),
    )
    assert got.view(B, K + 1).tolist() == GOLDEN_SAMPLES


def test_golden_samples_are_explained():
    logits, allowed = golden_inputs()
    for b, (laws, s) in enumerate(zip(_oracle_laws(logits, allowed), SEEDS)):
        draws = [
            oracle.inverse_cdf(law.probs, mixer.keyed_uniform(s + j, mixer.STREAM_TARGET)) for j, law in enumerate(laws)
        ]
        assert min(min(d.margin for d in draws), min(law.margin for law in laws)) > oracle.AMBIGUOUS
        assert [d.token for d in draws] == GOLDEN_SAMPLES[b]


#: sample() over a vocabulary of three CDF blocks (the draw walks block sums, then one block): six rows
#: of logits grid(4, [6, 3000]), keys with the high bit set -> the drawn ids.
WIDE_VOCAB = 3000
WIDE_PARAMS = ([2.0, 2.0, 1.0, 3.0, 0.5, 2.5], [-1, 2000, -1, 1500, -1, -1], [1.0, 1.0, 0.9, 1.0, 1.0, 0.95])
WIDE_SEEDS = [2**63 + 1000 + 17 * n for n in range(6)]
GOLDEN_WIDE_SAMPLES = [2014, 2762, 2520, 508, 184, 958]


def test_sample_golden_values_over_several_blocks(each_backend):
    logits = grid(4, (len(WIDE_SEEDS), WIDE_VOCAB), levels=24, step=0.25)
    temperature, top_k, top_p = (torch.tensor(values) for values in WIDE_PARAMS)
    got = sv.sample(torch.as_tensor(logits), temperature, top_k, top_p, _keys(WIDE_SEEDS))
    assert got.tolist() == GOLDEN_WIDE_SAMPLES


def test_golden_wide_samples_are_explained():
    logits = grid(4, (len(WIDE_SEEDS), WIDE_VOCAB), levels=24, step=0.25)
    laws = oracle.row_laws(logits, *WIDE_PARAMS)
    draws = [
        oracle.inverse_cdf(law.probs, mixer.keyed_uniform(s, mixer.STREAM_TARGET)) for law, s in zip(laws, WIDE_SEEDS)
    ]
    assert min(min(d.margin for d in draws), min(law.margin for law in laws)) > oracle.AMBIGUOUS
    assert [d.token for d in draws] == GOLDEN_WIDE_SAMPLES
