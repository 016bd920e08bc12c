"""truncated_probs, sample and the verifier held to tests/support/oracle.py, which shares no code with them.

The property suites compare the verifier with `sample` / `truncated_probs`, which share its truncation
code, so an error in that code is invisible to them. Here every expectation comes from the float64 NumPy
oracle written from SPEC.md alone, and the verifier's uniforms from the pure-Python mixer (tests/support/mixer.py):
- kept sets and probabilities of `truncated_probs` over a grid of parameters, with many exact ties, at V
  from 40 (pairwise threshold search) to 5000 (radix selection), on every code path;
- ties exactly at the top-k and at the top-p boundary, built on purpose, at V > 64;
- the verifier's own kept set, read exactly through the sampled rule with an accept uniform of 0 (which
  accepts a one-hot draft iff its token is kept), with and without the max_k hint (which switches the
  torch path from radix selection to torch.topk);
- every row of whole verifier calls in both modes, predicted token for token from the oracle's p~ and the
  mixer's uniforms (SPEC §3), so that a rule, a key or a truncation that changes is caught row by row;
- (slow) the committed law of sampled mode against p~ by chi-square, with power.
A row whose decision lies within float32 rounding of its boundary (oracle margin <= AMBIGUOUS) is not
compared; each test checks that such rows are few.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import specverify as sv
from tests.support import mixer, oracle
from tests.support.seeds import ROW_STRIDE, int64_bits
from tests.support.statcheck import assert_catches, assert_follows

#: Each comparison must judge at least this share of its cases (the rest sit on a rounding boundary).
MIN_CLEAR_SHARE = 0.9


def _quantised_logits(rng: np.random.Generator, shape, levels: int = 24, step: float = 0.25) -> np.ndarray:
    """float32 logits on a grid of `levels` values `step` apart: exact in float32, with many exact ties."""
    return ((rng.integers(0, levels, size=shape) - levels // 2) * step).astype(np.float32)


def _as_tensors(temperature, top_k, top_p, min_p):
    """Per-row parameters (lists or arrays [N]) as the tensors a caller passes; min_p may be None."""
    return (
        torch.as_tensor(np.asarray(temperature), dtype=torch.float32),
        torch.as_tensor(np.asarray(top_k), dtype=torch.int64),
        torch.as_tensor(np.asarray(top_p), dtype=torch.float32),
        None if min_p is None else torch.as_tensor(np.asarray(min_p), dtype=torch.float32),
    )


def _assert_matches_oracle(logits, temperature, top_k, top_p, min_p=None, allowed=None) -> int:
    """truncated_probs has the oracle's kept set and probabilities on every clear row. Returns their count."""
    got = (
        sv.truncated_probs(
            torch.as_tensor(logits),
            *_as_tensors(temperature, top_k, top_p, min_p),
            None if allowed is None else sv.pack_bitmask(torch.as_tensor(allowed)),
        )
        .double()
        .numpy()
    )
    laws = oracle.row_laws(logits, temperature, top_k, top_p, min_p, allowed)
    clear = [n for n, law in enumerate(laws) if law.margin > oracle.AMBIGUOUS]
    assert len(clear) >= MIN_CLEAR_SHARE * len(laws), f"only {len(clear)} of {len(laws)} rows are clear"
    for n in clear:
        params = (temperature[n], top_k[n], top_p[n], None if min_p is None else min_p[n])
        want = laws[n].probs
        np.testing.assert_array_equal(
            np.flatnonzero(got[n]), np.flatnonzero(want), err_msg=f"kept set, row {n} {params}"
        )
        np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-7, err_msg=f"probabilities, row {n} {params}")
    return len(clear)


# ---------------------------------------------------------------------------------------------------------
# the oracle itself, on cases worked by hand from SPEC §2


def test_oracle_imports_nothing_of_the_library():
    tree = ast.parse(Path(oracle.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "numpy"}, imported


def _kept(probs, **params) -> list[int]:
    return np.flatnonzero(oracle.truncated_distribution(np.log(np.asarray(probs)), 1.0, **params).probs).tolist()


def test_oracle_on_hand_worked_cases():
    p = [0.05, 0.10, 0.20, 0.50, 0.10, 0.05]
    assert _kept(p) == [0, 1, 2, 3, 4, 5]
    assert _kept(p, top_k=1) == [3]
    assert _kept(p, top_k=3) == [1, 2, 3, 4]  # the 3rd largest, 0.10, is tied: both kept
    assert _kept(p, top_p=0.5) == [3]  # 0.50 reaches 0.5 exactly: the shortest prefix is one token
    assert _kept(p, top_p=0.6) == [2, 3]
    assert _kept(p, top_p=0.75) == [1, 2, 3, 4]  # 0.50 + 0.20 + 0.10 crosses; its tie 0.10 is kept
    assert _kept(p, top_k=4, top_p=0.75) == [2, 3]  # renormalised after top-k: (0.5 + 0.2) / 0.9 >= 0.75
    assert _kept(p, min_p=0.2) == [1, 2, 3, 4]  # p >= 0.1 exactly is kept
    assert _kept(p, min_p=0.21) == [2, 3]
    law = oracle.truncated_distribution(np.log(p), 1.0, top_k=3)
    np.testing.assert_allclose(law.probs[[1, 2, 3, 4]], np.array([0.1, 0.2, 0.5, 0.1]) / 0.9)
    greedy = oracle.truncated_distribution(np.array([1.0, 3.0, 3.0, -np.inf]), 0.0)
    assert greedy.probs.tolist() == [0.0, 1.0, 0.0, 0.0]  # lowest index among the largest
    masked = oracle.truncated_distribution(np.array([5.0, 1.0, 1.0]), 1.0, allowed=np.array([False, True, True]))
    assert masked.probs.tolist() == [0.0, 0.5, 0.5]


def test_oracle_draws_and_rules_on_hand_worked_cases():
    weights = np.array([0.0, 0.25, 0.0, 0.5, 0.25])
    assert [oracle.inverse_cdf(weights, u).token for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 1 - 2**-53)] == [
        1,
        1,
        3,
        3,
        4,
        4,
    ]
    law = oracle.Law(np.array([0.5, 0.5, 0.0]), np.inf)
    q = np.array([[0.25, 0.75, 0.0]])
    # u * q(d) >= p~(d) rejects: d = 1 with q = 0.75, p~ = 0.5 is accepted iff u < 2/3
    assert oracle.sampled_row([law, law], [1], q, [0.66], [0.0], 0.9).tokens == [1, 1]
    rejected = oracle.sampled_row([law, law], [1], q, [0.67], [0.0], 0.9)
    assert rejected.tokens == [0] and rejected.first_rejected == 0  # the residual max(0, p~ - q) is {0}
    assert oracle.sampled_row([law, law], [2], q, [0.0], [0.99], 0.9).tokens == [1]  # p~(2) == 0: rejected at u = 0
    assert oracle.argmax_row([law, law], [1], [0.7, 0.1]).tokens == [1, 0]
    # SPEC §3.4's worked example: top-3 of [.05, .10, .20, .50, .10, .05] is {3, 2, 1}; draft 4 is rejected
    logits = np.log([[0.05, 0.10, 0.20, 0.50, 0.10, 0.05]] * 2)
    bonus = oracle.Draw(5, np.inf)
    assert oracle.relaxed_row(logits, [1], 3, 0.45, bonus).tokens == [1, 5]
    assert oracle.relaxed_row(logits, [4], 3, 0.45, bonus).tokens == [3]
    assert oracle.relaxed_row(logits, [2], 3, 0.25, bonus).tokens == [3]  # 0.20 < 0.50 - 0.25


# ---------------------------------------------------------------------------------------------------------
# truncated_probs


@pytest.mark.parametrize("vocab", [40, 128, 1000, 5000])
def test_truncated_probs_matches_the_oracle(each_backend, vocab):
    rng = np.random.default_rng(vocab)
    rows = 48 if vocab <= 1000 else 24
    logits = _quantised_logits(rng, (rows, vocab))
    temperature = rng.choice([0.0, 1e-5, 0.05, 0.4, 1.0, 2.0], size=rows)  # 1e-5 is not greedy; 0.05 underflows
    top_k = rng.choice([-1, 0, 1, 2, 5, 33, vocab // 2, vocab - 1, vocab, vocab + 3], size=rows)
    top_p = rng.choice([1.0, 0.95, 0.6, 0.3, 0.05], size=rows)
    min_p = rng.choice([0.0, 0.02, 0.3, 1.0], size=rows)
    allowed = rng.random((rows, vocab)) < np.where(rng.random(rows) < 0.5, 1.0, 0.4)[:, None]
    allowed[np.arange(rows), rng.integers(0, vocab, rows)] = True
    _assert_matches_oracle(logits, temperature, top_k, top_p, min_p, allowed)


def _tie_groups(row: np.ndarray) -> list[np.ndarray]:
    """The ids of each group of equal logits, largest logit first."""
    return [np.flatnonzero(row == value) for value in np.unique(row)[::-1]]


@pytest.mark.parametrize("vocab", [128, 1000, 5000])
def test_top_k_boundary_inside_a_tie(each_backend, vocab):
    """k falls on the first, a middle and the last member of a group of equal logits: the whole group is
    kept each time, and nothing below it (SPEC §2 step 3)."""
    rng = np.random.default_rng(10 + vocab)
    row = _quantised_logits(rng, vocab, levels=12)  # groups of about vocab / 12 equal logits
    groups = _tie_groups(row)
    cases = []
    for g in (0, 2, 5):
        before = sum(len(group) for group in groups[:g])
        for k in (before + 1, before + len(groups[g]) // 2 + 1, before + len(groups[g])):
            cases.append((k, np.concatenate(groups[: g + 1])))
    n = len(cases)
    got = sv.truncated_probs(
        torch.as_tensor(np.tile(row, (n, 1))), *_as_tensors([1.0] * n, [k for k, _ in cases], [1.0] * n, None)
    ).numpy()
    for (k, kept), probs in zip(cases, got):
        assert np.flatnonzero(probs).tolist() == sorted(kept.tolist()), f"top_k={k}"
    assert _assert_matches_oracle(np.tile(row, (n, 1)), [1.0] * n, [k for k, _ in cases], [1.0] * n) == n


@pytest.mark.parametrize("vocab", [128, 1000, 5000])
def test_top_p_crossing_token_tied(each_backend, vocab):
    """top_p is reached inside a group of equal probabilities (the crossing token's ties are all kept),
    just after a group ends, and, after a top-k, inside a group of the renormalised distribution."""
    rng = np.random.default_rng(20 + vocab)
    row = _quantised_logits(rng, vocab, levels=10, step=0.5)
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    groups = _tie_groups(row)
    mass_through = np.cumsum([p[group].sum() for group in groups])
    cases = []  # (top_k, top_p)
    for g in (0, 1, 3):
        start = mass_through[g - 1] if g else 0.0
        cases += [(-1, start + 0.5 * (mass_through[g] - start)), (-1, mass_through[g] + 1e-3)]
    k = len(groups[0]) + len(groups[1]) + 1  # keeps groups 0 to 2
    renormalised = mass_through[:3] / mass_through[2]
    cases += [(k, (renormalised[0] + renormalised[1]) / 2), (k, renormalised[1] + 1e-3)]
    n = len(cases)
    top_k, top_p = [c[0] for c in cases], [c[1] for c in cases]
    assert _assert_matches_oracle(np.tile(row, (n, 1)), [1.0] * n, top_k, top_p) == n
    got = sv.truncated_probs(torch.as_tensor(np.tile(row, (n, 1))), *_as_tensors([1.0] * n, top_k, top_p, None)).numpy()
    assert (got[0] > 0).sum() == len(groups[0])  # the whole first group, reached in its middle
    assert (got[1] > 0).sum() == len(groups[0]) + len(groups[1])


def test_top_p_after_a_top_k_above_the_heap_limit(each_backend):
    """top_k > 4096 (where the compiled kernels select by radix instead of keeping a heap) with top_p: the
    nucleus is counted on the distribution renormalised after top-k (k falls inside the second lowest tie
    group, so only the lowest group, 5% of the mass, is dropped). top_p falls in the middle of each kept
    tie group in turn."""
    rng = np.random.default_rng(70)
    vocab, temperature = 5000, 4.0
    row = _quantised_logits(rng, vocab, levels=10, step=0.5)
    groups = _tie_groups(row)
    k = vocab - len(groups[-1]) - len(groups[-2]) // 2  # inside the second lowest group, above 4096
    p = np.exp((row.astype(np.float64) - row.max()) / temperature)
    kept_groups = groups[:-1]
    mass_through = np.cumsum([p[group].sum() for group in kept_groups]) / sum(p[group].sum() for group in kept_groups)
    top_p = [(lower + upper) / 2 for lower, upper in zip([0.0, *mass_through[:-1]], mass_through)][:-1]
    n = len(top_p)
    assert k > 4096 and p[groups[-1]].sum() / p.sum() > 0.04
    assert _assert_matches_oracle(np.tile(row, (n, 1)), [temperature] * n, [k] * n, top_p) == n


# ---------------------------------------------------------------------------------------------------------
# the verifier's own kept set, read exactly with an accept uniform of 0


@pytest.mark.parametrize("vocab", [128, 1000, 5000])
@pytest.mark.parametrize("validate", [True, False])
def test_verifier_kept_set_at_ties(each_backend, vocab, validate):
    """Each row drafts one token with q one-hot at it and a key whose accept uniform is 0: the rule
    `u * q(d) >= p~(d)` then rejects iff p~(d) == 0, so the verdicts spell out the verifier's kept set.
    Probed: the first and last tokens of each group around the top-k / top-p / min-p boundaries (the
    whole group when small), and some far below. validate=True derives max_k, with which the torch path
    finds the k-th largest by torch.topk; validate=False without the hint leaves it to radix selection."""
    rng = np.random.default_rng(30 + vocab)
    row = _quantised_logits(rng, vocab, levels=12)
    groups = _tie_groups(row)
    k = len(groups[0]) + len(groups[1]) // 2 + 1  # inside group 1
    settings = [(1.0, k, 1.0, 0.0), (0.7, -1, 0.5, 0.0), (1.3, 2 * k, 0.9, 0.3), (1.0, vocab + 1, 1.0, 0.05)]
    sampled = [group if len(group) <= 12 else np.concatenate([group[:6], group[-6:]]) for group in groups[:4]]
    probes = np.concatenate(sampled + [rng.choice(np.concatenate(groups[4:]), 8, replace=False)])
    laws = oracle.row_laws(np.tile(row, (len(settings), 1)), *zip(*settings))
    assert all(law.margin > oracle.AMBIGUOUS for law in laws)
    cases = [(s, d) for s in range(len(settings)) for d in probes]
    rows = len(cases)
    params = np.array([settings[s] for s, _ in cases])
    draft = torch.tensor([[d] for _, d in cases], dtype=torch.int64)
    q = torch.zeros(rows, 1, vocab)
    q[torch.arange(rows), 0, draft[:, 0]] = 1.0
    zero_accept = int64_bits(mixer.key_for_uniform(0, mixer.STREAM_ACCEPT))
    temperature, top_k, top_p, min_p = _as_tensors(
        params[:, 0], params[:, 1].astype(np.int64), params[:, 2], params[:, 3]
    )
    first, _, _ = sv.stochastic_acceptance_sampler(
        draft,
        torch.as_tensor(row).expand(rows, 2, vocab),
        temperature,
        top_k,
        None,
        top_p,
        None,
        torch.full((rows,), zero_accept),
        draft_proposal="sampled",
        draft_probs_full=q,
        min_p=min_p,
        validate=validate,
    )
    for (s, d), accepted in zip(cases, (first == 1).tolist()):
        assert accepted == (laws[s].probs[d] > 0), f"token {d} under {settings[s]}: accepted={accepted}"


# ---------------------------------------------------------------------------------------------------------
# whole verifier calls, row by row


def _mixed_batch(rng: np.random.Generator, rows: int, positions: int, vocab: int):
    """Logits, masks and per-row sampling parameters covering every kind of row (greedy included)."""
    logits = _quantised_logits(rng, (rows, positions + 1, vocab))
    allowed = rng.random((rows, positions + 1, vocab)) < np.where(rng.random(rows) < 0.6, 1.0, 0.5)[:, None, None]
    allowed[np.arange(rows)[:, None], np.arange(positions + 1), rng.integers(0, vocab, (rows, positions + 1))] = True
    params = dict(
        temperature=rng.choice([0.0, 0.5, 1.0, 1.6], size=rows),
        top_k=rng.choice([-1, 1, 4, 20, vocab], size=rows),
        top_p=rng.choice([1.0, 0.9, 0.6], size=rows),
        min_p=rng.choice([0.0, 0.05], size=rows),
    )
    per_position = {name: np.repeat(values, positions + 1) for name, values in params.items()}
    flat = oracle.row_laws(logits.reshape(-1, vocab), **per_position, allowed=allowed.reshape(-1, vocab))
    laws = [flat[b * (positions + 1) : (b + 1) * (positions + 1)] for b in range(rows)]
    return logits, allowed, params, laws


def _verify(logits, allowed, params, draft, seed, **kwargs):
    temperature, top_k, top_p, min_p = _as_tensors(
        params["temperature"], params["top_k"], params["top_p"], params["min_p"]
    )
    out = sv.stochastic_acceptance_sampler(
        torch.as_tensor(draft),
        torch.as_tensor(logits),
        temperature,
        top_k,
        None,
        top_p,
        None,
        seed,
        token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)),
        min_p=min_p,
        **kwargs,
    )
    tokens, count = sv.committed_tokens(*out)
    return out[0].tolist(), [t[:c] for t, c in zip(tokens.tolist(), count.tolist())]


def _assert_rows_match(predictions: list[oracle.Verdict], first: list[int], committed: list[list[int]]) -> None:
    clear = [b for b, v in enumerate(predictions) if v.margin > oracle.AMBIGUOUS]
    assert len(clear) >= MIN_CLEAR_SHARE * len(predictions), f"only {len(clear)} of {len(predictions)} rows are clear"
    for b in clear:
        assert (first[b], committed[b]) == (predictions[b].first_rejected, predictions[b].tokens), f"row {b}"


#: (rows, vocab): one CDF block, and three (the draws walk block sums first)
SIZES = [(300, 96), (60, 2100)]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("rows, vocab", SIZES)
def test_argmax_mode_rows_are_the_oracle_draws(each_backend, shared, rows, vocab):
    rng = np.random.default_rng(40 + shared)
    positions = 3
    logits, allowed, params, laws = _mixed_batch(rng, rows, positions, vocab)
    seed = int(rng.integers(0, 2**63)) | (1 << 63) if shared else rng.integers(-(2**63), 2**63 - 1, rows)
    seeds = (
        [mixer.MASK64 & (seed + b * ROW_STRIDE) for b in range(rows)]
        if shared
        else [s & mixer.MASK64 for s in seed.tolist()]
    )
    uniforms = [[mixer.keyed_uniform(s + j, mixer.STREAM_TARGET) for j in range(positions + 1)] for s in seeds]
    draws = [[oracle.inverse_cdf(law.probs, u).token for law, u in zip(laws[b], uniforms[b])] for b in range(rows)]
    # drafts that agree with the draws for a while, so that long accepted runs are judged too
    agree = rng.integers(0, positions + 1, rows)
    draft = np.array(
        [[draws[b][j] if j < agree[b] else int(rng.integers(-1, vocab)) for j in range(positions)] for b in range(rows)]
    )
    draft = np.where(np.cumsum(draft == -1, axis=1) > 0, -1, draft)  # ragged: -1 to the end of the row
    predictions = [oracle.argmax_row(laws[b], draft[b].tolist(), uniforms[b]) for b in range(rows)]
    seed_arg = int64_bits(seed) if shared else torch.as_tensor(seed)
    _assert_rows_match(predictions, *_verify(logits, allowed, params, draft, seed_arg))


def _draft_from_q(rng: np.random.Generator, q: np.ndarray) -> np.ndarray:
    """One draft id per (row, position) drawn from q [B, K, V] (any id where q is all zero)."""
    cumulative = q.astype(np.float64).cumsum(-1)
    u = rng.random(q.shape[:2]) * cumulative[..., -1]
    ids = (cumulative <= u[..., None]).sum(-1)
    return np.where(
        cumulative[..., -1] > 0, np.minimum(ids, q.shape[-1] - 1), rng.integers(0, q.shape[-1], q.shape[:2])
    )


@pytest.mark.parametrize("rows, vocab", SIZES)
def test_sampled_mode_rows_follow_the_ratio_test(each_backend, rows, vocab):
    rng = np.random.default_rng(50)
    positions = 3
    logits, allowed, params, laws = _mixed_batch(rng, rows, positions, vocab)
    draft_logits = logits[:, :positions] + rng.normal(0, 1, (rows, positions, vocab))
    q = np.exp(draft_logits - draft_logits.max(-1, keepdims=True))
    q[rng.random((rows, positions, vocab)) < 0.3] = 0.0  # tokens the draft cannot propose
    q = (q / q.sum(-1, keepdims=True)).astype(np.float32)
    q[rng.random((rows, positions)) < 0.1] = 0.0  # all-zero rows: no distribution
    draft = _draft_from_q(rng, q)
    blind = rng.random((rows, positions)) < 0.05
    draft[blind] = rng.integers(0, vocab, blind.sum())  # tokens with q(d) == 0 in a present row
    draft[rng.random(rows) < 0.1, rng.integers(0, positions)] = -1
    draft = np.where(np.cumsum(draft == -1, axis=1) > 0, -1, draft)
    seed = rng.integers(-(2**63), 2**63 - 1, rows)
    predictions = []
    for b, s in enumerate(seed.tolist()):
        keys = [s + j for j in range(positions + 1)]
        predictions.append(
            oracle.sampled_row(
                laws[b],
                draft[b].tolist(),
                q[b],
                [mixer.keyed_uniform(k, mixer.STREAM_ACCEPT) for k in keys[:positions]],
                [mixer.keyed_uniform(k, mixer.STREAM_RESIDUAL) for k in keys[:positions]],
                mixer.keyed_uniform(keys[positions], mixer.STREAM_TARGET),
            )
        )
    first, committed = _verify(
        logits,
        allowed,
        params,
        draft,
        torch.as_tensor(seed),
        draft_proposal="sampled",
        draft_probs_full=torch.as_tensor(q),
    )
    _assert_rows_match(predictions, first, committed)
    assert 0.05 < np.mean([f > 0 for f in first]) < 0.95  # the cases accept and reject


# ---------------------------------------------------------------------------------------------------------
# the committed law, by chi-square (slow)


@pytest.mark.slow
def test_sampled_mode_commits_the_oracle_law(each_backend):
    """Drafts drawn from q: the token committed at position 0 follows the oracle's p~ (SPEC §1's
    guarantee); the classic mistake of recovering from p~ instead of max(0, p~ - q) is caught at the same n."""
    rng = np.random.default_rng(60)
    n, vocab = 20_000, 70
    logits = _quantised_logits(rng, (1, 2, vocab), levels=16)
    law = oracle.truncated_distribution(logits[0, 0], 0.8, 9, 0.85, 0.02)
    assert law.margin > oracle.AMBIGUOUS
    q = np.exp(0.5 * logits[0, 0].astype(np.float64) + rng.normal(0, 1, vocab))
    q /= q.sum()
    draft = rng.choice(vocab, size=(n, 1), p=q)
    first, recovered, _ = sv.stochastic_acceptance_sampler(
        torch.as_tensor(draft),
        torch.as_tensor(logits).expand(n, 2, vocab),
        torch.full((n,), 0.8),
        torch.full((n,), 9),
        None,
        torch.full((n,), 0.85),
        None,
        torch.as_tensor(rng.integers(-(2**63), 2**63 - 1, n)),
        draft_proposal="sampled",
        draft_probs_full=torch.as_tensor(q, dtype=torch.float32).expand(n, 1, vocab),
        min_p=torch.full((n,), 0.02),
    )
    assert_follows(recovered[:, 0].numpy(), law.probs, "committed token, sampled mode")
    accept = np.minimum(law.probs, q)  # P(draft d and accepted)
    wrong = accept + (1 - accept.sum()) * law.probs
    assert_catches(wrong, law.probs, n, seed=61, what="recovery from p~ instead of the residual")
    assert abs(float((first == 1).double().mean()) - accept.sum()) < 5 * np.sqrt(accept.sum() * (1 - accept.sum()) / n)
