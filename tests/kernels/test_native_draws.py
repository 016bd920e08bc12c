"""The native draws of a chain call (draw_rows, recover_kept_rows) against the per-op kernels they replace in
the verifier: weigh_rows' weights and block sums, sample_rows' draws and recover_rows' recoveries, bit for bit.

draw_rows holds a top-k row sparsely (the k largest raw logits, then only the candidates near the k-th
exponentiated) and a greedy row as its argmax alone, so each case below compares every block sum, every
draft token's weight and every token with the dense path: ties at the k-th, -inf tokens, min-p, top-k above
the sparse capacity, float32, bfloat16 and float16 logits and draft probabilities.
"""

from __future__ import annotations

import pytest
import torch

from specverify.contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from specverify.kernels import block_size, native
from specverify.rng import STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_TARGET, keyed_uniform, row_keys, stream_salt
from tests.support.backends import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")

#: (requests, drafted positions, V, logits dtype, kind of logits)
CASES = [
    (6, 3, 12, torch.float32, "ties"),
    (5, 4, 1000, torch.float32, "normal"),
    (4, 2, 4097, torch.bfloat16, "normal"),
    (4, 3, 3000, torch.float16, "ties"),
    (3, 4, 50000, torch.float32, "heavy"),
    (8, 1, 2048, torch.float32, "minus-inf"),
    (2, 3, 128256, torch.float32, "one-lane"),
    (3, 2, 20000, torch.float32, "flat"),
]


def _logits(rows: int, vocab: int, kind: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if kind == "ties":
        x = torch.randint(-3, 3, (rows, vocab), generator=g).float()
    else:
        x = torch.randn(rows, vocab, generator=g) * 3
    if kind == "heavy":
        x.scatter_add_(1, torch.randint(0, vocab, (rows, 8), generator=g), torch.rand(rows, 8, generator=g) * 8 + 4)
    if kind == "minus-inf":
        x[torch.rand(rows, vocab, generator=g) < 0.5] = float("-inf")
    if kind == "one-lane":  # the likely tokens 64 apart: one lane of every block of the stripe maxima
        x[:, 5::64] += 20
    if kind == "flat":
        x *= 1e-3
    return x.to(dtype)


def _params(requests: int, vocab: int, g: torch.Generator):
    pick = lambda values: torch.tensor(values)[torch.randint(0, len(values), (requests,), generator=g)]  # noqa: E731
    temperature = pick([0.0, 0.3, 0.8, 1.0, 1.7])
    top_k = pick([-1, 1, 2, 5, 50, 3000, vocab - 1, vocab])
    top_p = pick([1.0, 0.9, 0.5, 1e-3])
    min_p = pick([0.0, 0.05, 0.3])
    return temperature, top_k, top_p, min_p


@pytest.mark.parametrize("use_min_p", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}-{c[3]}-{c[4]}" for c in CASES])
def test_draws_match_the_dense_kernels_bit_for_bit(case, use_min_p):
    requests, positions, vocab, dtype, kind = case
    g = torch.Generator().manual_seed(vocab + positions + use_min_p)
    per_position = positions + 1
    rows = requests * per_position
    logits = _logits(rows, vocab, kind, dtype, g)
    temperature, top_k, top_p, min_p = _params(requests, vocab, g)
    min_p = min_p if use_min_p else None
    seeds = torch.randint(0, 2**62, (requests,), generator=g)
    draft = torch.randint(-1, vocab, (requests, positions), generator=g)
    block = block_size(vocab)

    def each_row(value):
        return None if value is None else value.repeat_interleave(per_position)

    weights = torch.empty(rows, vocab)
    sums = native.weigh_rows(
        logits, *map(each_row, (temperature,)), GREEDY_TEMPERATURE, *map(each_row, (top_k, top_p, min_p)),
        BOUNDARY_RTOL, block, weights,
    )  # fmt: skip
    uniforms = keyed_uniform(row_keys(seeds, per_position), STREAM_TARGET).reshape(-1)
    expected = native.sample_rows(weights, sums, block, uniforms)
    params = (temperature, GREEDY_TEMPERATURE, top_k, top_p, min_p, BOUNDARY_RTOL, block, seeds)
    salt = stream_salt(STREAM_TARGET)
    assert torch.equal(native.draw_rows(logits, per_position, *params, salt), expected)

    dense = torch.full((rows, vocab), float("nan"))
    drawn = native.draw_rows(logits, per_position, *params, salt, draft, stream_salt(STREAM_ACCEPT), dense)
    tokens, at_draft, accept_uniforms, drawn_sums, kept = drawn
    assert torch.equal(tokens, expected)
    expected_uniforms = keyed_uniform(row_keys(seeds, positions), STREAM_ACCEPT)
    assert torch.equal(accept_uniforms.view(torch.int64), expected_uniforms.view(torch.int64))
    assert torch.equal(drawn_sums.view(torch.int64), sums.view(torch.int64))
    grid = weights.view(requests, per_position, vocab)[:, :positions]
    present = draft >= 0
    expected_at_draft = grid.gather(-1, draft.clamp(min=0)[..., None])[..., 0]
    assert torch.equal(at_draft[present].view(torch.int32), expected_at_draft[present].view(torch.int32))

    mass = sums.view(requests, per_position, -1).sum(-1)[:, :positions]
    q = torch.softmax(torch.randn(requests, positions, vocab, generator=g) * 2, -1)
    q[torch.rand(requests, positions, vocab, generator=g) < 0.3] = 0
    q = q / q.sum(-1, keepdim=True)
    q[0] = grid[0] / mass[0, :, None].float()  # q = p~ itself: an empty residual
    for q_dtype in (torch.float32, torch.bfloat16):
        mode = torch.randint(0, 3, (requests, positions), generator=g, dtype=torch.int32)
        residual_uniforms = keyed_uniform(row_keys(seeds, positions), STREAM_RESIDUAL)
        expected_recovery = native.recover_rows(
            weights.view(requests, per_position, vocab),
            sums.view(requests, per_position, -1),
            mass,
            q.to(q_dtype),
            draft,
            mode,
            residual_uniforms,
            block,
        )
        recovered = native.recover_kept_rows(
            kept, drawn_sums, mass, q.to(q_dtype), draft, mode, seeds, stream_salt(STREAM_RESIDUAL), block
        )
        assert torch.equal(recovered, expected_recovery)


@pytest.mark.parametrize("vocab", [5000, 128256])
def test_top_k_rows_are_held_sparsely_with_the_dense_weights(vocab):
    """A drafted top-k row (k from 1 to 1000, logits of spread 3) is weighed sparsely in draw_rows (a kept
    count, not -1: the dense path was not taken) and its kept (id, weight) pairs are the dense row's nonzero
    weights, bit for bit."""
    g = torch.Generator().manual_seed(vocab)
    ks = torch.tensor([1, 2, 5, 50, 64, 200, 1000])
    requests = len(ks)
    logits = torch.randn(requests * 2, vocab, generator=g) * 3  # one drafted position and the bonus each
    temperature, top_p = torch.full((requests,), 0.8), torch.full((requests,), 0.95)
    block = block_size(vocab)
    weights = torch.empty(requests * 2, vocab)
    per_row = [value.repeat_interleave(2) for value in (temperature, ks, top_p)]
    sums = native.weigh_rows(logits, per_row[0], GREEDY_TEMPERATURE, *per_row[1:], None, BOUNDARY_RTOL, block, weights)
    params = (temperature, GREEDY_TEMPERATURE, ks, top_p, None, BOUNDARY_RTOL, block, torch.arange(requests))
    draft = torch.zeros(requests, 1, dtype=torch.int64)
    dense = torch.full((requests * 2, vocab), float("nan"))
    drawn = native.draw_rows(logits, 2, *params, stream_salt(STREAM_TARGET), draft, stream_salt(STREAM_ACCEPT), dense)
    count, ids, kept_weights, _ = drawn[4]
    drafted = torch.arange(requests) * 2  # the rows kept for a recovery
    assert (count[drafted] > 0).all(), count[drafted]
    for row in drafted.tolist():
        listed = ids[row, : count[row]].long()
        nonzero = weights[row].nonzero()[:, 0]
        assert torch.equal(listed, nonzero), (int(ks[row // 2]), listed.tolist()[:8], nonzero.tolist()[:8])
        assert torch.equal(kept_weights[row, : count[row]], weights[row, nonzero])
    assert torch.equal(drawn[3].view(torch.int64), sums.view(torch.int64))


def _first_argmax(row: list[float]) -> int:
    """SPEC §3.3's argmax from first principles: the lowest index of the largest value, NaN never winning;
    0 when no value beats -inf."""
    best, index = float("-inf"), 0
    for i, value in enumerate(row):
        if value > best:
            best, index = value, i
    return index


@pytest.mark.parametrize("vocab", [1, 63, 64, 1000, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_is_the_first_largest_and_never_nan(vocab, dtype):
    """argmax_rows (the greedy rows' scan: one streaming max, then the first chunk holding it) on rows whose
    largest value sits anywhere (first, last, in the tail after the last whole chunk), ties, NaN beside and
    above the largest, -0.0 tied with +0.0, rows of -inf and NaN only."""
    g = torch.Generator().manual_seed(vocab)
    rows = torch.randint(-3, 3, (12, vocab), generator=g).float()  # many ties
    rows[1] = torch.randn(vocab, generator=g)
    rows[2, -1] = 10.0  # the largest last
    rows[3, 0] = 10.0  # ... first
    rows[4] = float("nan")
    rows[4, vocab // 2] = -1.0  # NaN everywhere else
    rows[5] = float("-inf")
    rows[6] = float("nan")  # nothing beats -inf: 0
    rows[7, ::7] = float("nan")
    rows[8] = -0.0
    rows[8, vocab // 3] = 0.0  # -0.0 == 0.0: the first of them
    rows[9, vocab // 2 :] = 5.0  # the largest tied across the second half
    rows[10, -(vocab % 64 or 64) :] = 7.0  # ... in the tail
    rows[11, : vocab // 2] = float("nan")
    rows = rows.to(dtype)
    expected = [_first_argmax(row) for row in rows.float().tolist()]
    assert native.argmax_rows(rows).tolist() == expected


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("vocab", [20000, 128256])
def test_greedy_rows_split_between_threads_give_the_first_largest(vocab, threads):
    """A call of few greedy float32 rows (here 5 and 10: fewer than four a thread) splits each row's argmax
    scan between the threads (kernels.c's split_greedy_rows) and meets the parts in order: every row's token
    is still the first largest, NaN never winning, 0 when nothing beats -inf — with the largest tied across
    the parts, in the last part only, at a part's first value, in the tail, beside NaN."""
    import specverify as sv

    g = torch.Generator().manual_seed(vocab + threads)
    for requests in (1, 2):
        rows = torch.randint(-3, 3, (requests * 5, vocab), generator=g).float()
        rows[0, [vocab // 4, 3 * vocab // 4]] = 9.0  # tied in the first and the last part: the first
        rows[1, -1] = 9.0  # the largest last
        rows[2] = float("nan")
        rows[2, vocab // 2 + 1] = -2.0  # NaN everywhere else, the value in the second half
        rows[3] = float("-inf")  # nothing beats -inf: 0
        rows[4, vocab // threads * (threads - 1) :] = 4.0  # tied across the last part
        rows[4, :: vocab // 7] = float("nan")
        expected = torch.tensor([_first_argmax(row) for row in rows.tolist()]).view(requests, 5)
        args = dict(
            draft_tokens=expected[:, :4].clone(),
            target_logits=rows.view(requests, 5, vocab),
            temperature=torch.zeros(requests),
            top_k=torch.full((requests,), -1),
            max_k=None,
            top_p=torch.ones(requests),
            min_top_p=None,
            seed=7,
            validate=False,
        )
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            first, recovered, bonus = sv.stochastic_acceptance_sampler(**args)
        finally:
            torch.set_num_threads(previous)
        assert torch.equal(torch.cat([recovered, bonus], 1), expected), (requests, vocab, threads)
        assert first.tolist() == [4] * requests


def _shared_seed(kind: str, requests: int, g: torch.Generator):
    """A seed of the given kind (SPEC §4): an int or 0-d / [1] tensor shared by the batch, or one per request."""
    value = int(torch.randint(-(2**63), 2**63 - 1, (), generator=g))
    return {
        "int": value,
        "0-d tensor": torch.tensor(value),
        "[1] int32 tensor": torch.tensor([value % 2**31], dtype=torch.int32),
        "per request": torch.randint(-(2**63), 2**63 - 1, (requests,), generator=g),
    }[kind]


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "thread-pool"])
@pytest.mark.parametrize("seed_kind", ["int", "0-d tensor", "[1] int32 tensor", "per request"])
@pytest.mark.parametrize("mode", ["argmax", "sampled float32", "sampled bfloat16", "block float32"])
def test_verdicts_in_one_call_match_the_torch_reference(monkeypatch, tmp_path, mode, seed_kind, openmp):
    """A verifier call on the CPU is one kernel call (draw_verdicts, draw_sampled_verdicts and, for block
    verification, draw_block_verdicts: the padding of drafts that are not ids, the keys of a shared seed,
    the ratio test or the block judge, the recovery and the first rejection inside the kernel): the torch
    reference's outputs bit for bit, also where a build without OpenMP splits the batch into slices (each
    slice's shared keys start at its first request)."""
    import specverify as sv
    from tests.support.backends import torch_path

    requests, positions, vocab = 16, 3, 3000
    g = torch.Generator().manual_seed(len(seed_kind))
    logits = _logits(requests * (positions + 1), vocab, "heavy", torch.float32, g).view(requests, positions + 1, vocab)
    temperature, top_k, top_p, min_p = _params(requests, vocab, g)
    best = logits[:, :positions].argmax(-1)
    draft = torch.where(torch.rand(requests, positions, generator=g) < 0.7, best, torch.randint(0, vocab, best.shape))
    draft[1, 1], draft[2, 0], draft[3, 2], draft[4, 1] = -1, vocab, -5, vocab + 7  # padding inside a row
    args = dict(
        draft_tokens=draft.to(torch.int32),
        target_logits=logits,
        temperature=temperature,
        top_k=top_k,
        max_k=None,
        top_p=top_p,
        min_top_p=None,
        seed=_shared_seed(seed_kind, requests, g),
        min_p=min_p,
        validate=False,
    )
    if mode != "argmax":
        q = torch.softmax(torch.randn(requests, positions, vocab, generator=g) * 2, -1)
        q.scatter_(-1, draft.clamp(0, vocab - 1)[..., None], torch.rand(requests, positions, 1, generator=g) * 0.5)
        q[8:12].scatter_(-1, draft[8:12].clamp(0, vocab - 1)[..., None], 0.0)  # q(d) = 0: d left out of the recovery
        dtype = torch.bfloat16 if mode.endswith("bfloat16") else torch.float32
        args.update(draft_proposal="sampled", draft_probs_full=q.to(dtype))
        if mode.startswith("block"):
            args.update(verification="block")  # (draw_block_verdicts: the judge of SPEC §3.6 on the same draws)
    with torch_path():
        expected = sv.stochastic_acceptance_sampler(**args)
    if not openmp:
        monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
        monkeypatch.setattr(native, "torch_openmp_runtime", lambda: None)
        native.load.cache_clear()
    try:
        assert native.load().specverify_threads_itself == (openmp and native.torch_openmp_runtime() is not None)
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            got = sv.stochastic_acceptance_sampler(**args)
        finally:
            torch.set_num_threads(threads)
    finally:
        native.load.cache_clear()
    if mode.startswith("block"):
        # the committed tokens in place of recovered: after the first rejection, where §1 leaves recovered
        # free, torch's recovery from an empty p~ without d (p~ one-hot at a draft whose q(d) is 0)
        # falls back to p~ and the C kernels' to token 0 (never committed: test_block_verdicts_* in
        # tests/kernels/test_backends.py compares every output with the stages over the C row ops)
        expected, got = ((out[0], sv.committed_tokens(*out)[0], out[2]) for out in (expected, got))
    for name, e, o in zip(("first", "recovered", "bonus"), expected, got):
        assert o.shape == e.shape and o.dtype == torch.int64, name
        assert torch.equal(o, e), f"{name}: {o.tolist()} != {e.tolist()}"
    assert got[0].tolist() != [positions] * requests  # some drafts are rejected, and some kept
    assert sum(got[0].tolist()) > 0
