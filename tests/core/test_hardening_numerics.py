"""Numerical edge cases: huge logits, all-equal rows, a single finite token, nearly flat 256k vocabularies,
extreme temperatures and truncations, and half precision against its float32 upcast.

Every test runs on the default CPU path (the compiled kernels, where a compiler exists) and on the torch
path (`code_path` fixture), which is the code a CUDA device runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specverify as sv
from tests.support.backends import native_available, torch_path
from tests.support.invariants import check_output_invariants, outputs_equal
from tests.support.statcheck import assert_follows

FP16_MAX = 65504.0
FP32_MAX = float(torch.finfo(torch.float32).max)
TEMPERATURES = [1e-6, 1e-5, 0.5, 1.0, 100.0]


def _args(logits: torch.Tensor, mode: str, seed: int = 0, **overrides) -> dict:
    """A call over logits [B, K+1, V] with random drafts; mode "argmax", "sampled" or "relaxed"."""
    batch, positions_1, vocab = logits.shape
    positions = positions_1 - 1
    g = torch.Generator().manual_seed(seed)
    args = dict(
        draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
        target_logits=logits,
        temperature=torch.ones(batch),
        top_k=torch.full((batch,), -1),
        max_k=None,
        top_p=torch.ones(batch),
        min_top_p=None,
        seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
    )
    if mode == "sampled":
        q = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 3, -1)
        q[::3] = 0.0  # no distribution
        q[1::3] = torch.nn.functional.one_hot(args["draft_tokens"][1::3], vocab).float()
        args.update(draft_proposal="sampled", draft_probs_full=q)
    elif mode == "relaxed":
        args.update(in_thinking_phase=torch.arange(batch) % 2 == 0, relaxed_topk=2, relaxed_delta=0.3)
    args.update(overrides)
    return args


def _committed(out) -> torch.Tensor:
    tokens, _ = sv.committed_tokens(*out)
    return tokens


def _row_params(batch: int, g: torch.Generator, vocab: int) -> dict:
    def pick(values, dtype):
        return torch.tensor(values, dtype=dtype)[torch.randint(0, len(values), (batch,), generator=g)]

    return dict(
        temperature=pick(TEMPERATURES + [0.0], torch.float32),
        top_k=pick([-1, 1, 3, vocab, vocab + 1], torch.int64),
        top_p=pick([1e-6, 0.5, 1.0], torch.float32),
        min_p=pick([0.0, 0.5, 0.999999, 1.0], torch.float32),
    )


# ---------------------------------------------------------------------------------------------------------
# Huge magnitudes


@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
@pytest.mark.parametrize(
    "dtype, magnitude",
    [(torch.float32, 1e30), (torch.float32, FP32_MAX), (torch.bfloat16, 1e30), (torch.float16, FP16_MAX)],
    ids=["fp32-1e30", "fp32-max", "bf16-1e30", "fp16-max"],
)
def test_huge_logits_with_a_unique_maximum_commit_it(code_path, mode, dtype, magnitude):
    """+-M logits with one token at +M: p~ is one-hot at it for every temperature, so every committed token
    is that token (no overflow to NaN, no inf - inf)."""
    batch, positions, vocab = 18, 3, 200
    g = torch.Generator().manual_seed(1)
    logits = torch.where(torch.rand(batch, positions + 1, vocab, generator=g) < 0.5, -magnitude, magnitude / 2)
    top = torch.randint(0, vocab, (batch, positions + 1), generator=g)
    logits.scatter_(-1, top[..., None], magnitude)
    logits = logits.to(dtype)
    assert torch.isfinite(logits).all()
    params = _row_params(batch, g, vocab)
    if mode == "relaxed":
        params.pop("min_p")
    args = _args(logits, mode, **params)
    out = sv.stochastic_acceptance_sampler(**args)
    check_output_invariants(args, out)
    tokens = _committed(out)
    committed = tokens >= 0
    assert torch.equal(tokens[committed], top[committed]), "a huge-logit row committed something other than its maximum"
    probs = sv.truncated_probs(logits.reshape(-1, vocab), args["temperature"].repeat_interleave(positions + 1), -1, 1.0)
    assert (
        torch.isfinite(probs).all() and torch.equal(probs.argmax(-1), top.reshape(-1)) and (probs.amax(-1) == 1).all()
    )


@pytest.mark.parametrize("dtype, magnitude", [(torch.float32, 1e30), (torch.float16, FP16_MAX), (torch.bfloat16, 1e30)])
def test_huge_logits_tied_at_the_maximum_share_it_uniformly(code_path, dtype, magnitude):
    """Several tokens tied at +M: p~ is uniform over them (chi-square), greedy rows take the lowest id."""
    rows, vocab = 6000, 50
    logits = torch.full((vocab,), -magnitude)
    tied = torch.tensor([3, 17, 18, 40])
    logits[tied] = magnitude
    batch_logits = logits.to(dtype).expand(rows, 2, vocab).contiguous()
    args = _args(batch_logits, "argmax", temperature=torch.full((rows,), 100.0))
    out = sv.stochastic_acceptance_sampler(**args)
    law = np.zeros(vocab)
    law[tied.numpy()] = 1 / len(tied)
    assert_follows(out[2][:, 0].numpy(), law, f"bonus over the {len(tied)} tied maxima ({dtype})")
    greedy = sv.stochastic_acceptance_sampler(**{**args, "temperature": torch.zeros(rows)})
    assert (greedy[2] == 3).all() and (greedy[1] == 3).all()


# ---------------------------------------------------------------------------------------------------------
# All-equal rows and the greedy boundary


@pytest.mark.parametrize("vocab", [7, 300, 5000])
def test_all_equal_rows_keep_every_token(code_path, vocab):
    """With every logit equal, every truncation keeps every token (ties are kept): p~ is uniform."""
    rows = 8
    logits = torch.full((rows, vocab), 1.25)
    probs = sv.truncated_probs(
        logits,
        torch.tensor([1e-5, 0.5, 1.0, 100.0] * 2),
        torch.tensor([1, 2, vocab - 1, -1, 1, 3, vocab, 10 * vocab]),
        torch.tensor([1e-6, 0.5, 1.0, 0.999, 1e-3, 0.2, 0.9, 1.0]),
        torch.tensor([0.0, 1.0, 0.5, 0.999999, 1.0, 0.0, 0.3, 1.0]),
    )
    assert torch.allclose(probs, torch.full_like(probs, 1 / vocab)), "an all-equal row was not kept whole"


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_all_equal_rows_commit_uniformly_and_greedy_takes_token_zero(code_path, mode):
    rows, positions, vocab = 6000, 1, 9
    logits = torch.zeros(rows, positions + 1, vocab)
    args = _args(
        logits,
        mode,
        temperature=torch.full((rows,), 1e-5),
        top_k=torch.full((rows,), 2),
        top_p=torch.full((rows,), 0.1),
    )
    out = sv.stochastic_acceptance_sampler(**args)
    tokens = _committed(out)
    # temperature exactly 1e-5 is not greedy (SPEC: < 1e-5), and ties survive top-k and top-p
    assert_follows(tokens[:, 0].numpy(), np.full(vocab, 1 / vocab), f"{mode}: position 0 of all-equal rows at T = 1e-5")
    greedy = sv.stochastic_acceptance_sampler(**{**args, "temperature": torch.full((rows,), 1e-6)})
    assert (_committed(greedy)[:, 0] == 0).all() and (greedy[2] == 0).all(), "greedy ties must take the lowest id"


def test_temperature_just_below_and_at_the_greedy_threshold():
    """1e-5 (as float32 or as a Python float) samples; the float32 just below it is greedy."""
    rows, vocab = 400, 4
    logits = torch.zeros(rows, 1, vocab)
    below = torch.nextafter(torch.tensor(1e-5), torch.tensor(0.0))
    at = sv.sample(logits[:, 0], 1e-5, -1, 1.0, torch.arange(rows))
    at_tensor = sv.sample(logits[:, 0], torch.full((rows,), 1e-5), -1, 1.0, torch.arange(rows))
    under = sv.sample(logits[:, 0], below.expand(rows), -1, 1.0, torch.arange(rows))
    assert torch.equal(at, at_tensor)
    assert set(at.tolist()) == set(range(vocab)), "temperature 1e-5 must not be greedy"
    assert (under == 0).all(), "temperature just below 1e-5 must be greedy"


# ---------------------------------------------------------------------------------------------------------
# A single finite (or allowed) token


@pytest.mark.parametrize("vocab", [1, 5, 65, 2000])
@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
def test_minus_inf_everywhere_but_one_token_commits_it(code_path, vocab, mode):
    batch, positions = 12, 3
    g = torch.Generator().manual_seed(vocab)
    only = torch.randint(0, vocab, (batch, positions + 1), generator=g)
    logits = torch.full((batch, positions + 1, vocab), float("-inf"))
    logits.scatter_(-1, only[..., None], torch.randn(batch, positions + 1, 1, generator=g) * 1e4)
    params = _row_params(batch, g, vocab)
    if mode == "relaxed":
        params.pop("min_p")
    args = _args(logits, mode, **params)
    if mode == "sampled":  # q disagrees completely with p~: all of its mass on another token
        other = (only[:, :positions] + 1) % vocab
        args["draft_probs_full"] = torch.nn.functional.one_hot(other, vocab).float()
        args["draft_tokens"] = other
    for dtype in (torch.float32, torch.float16, torch.bfloat16) if mode == "argmax" else (torch.float32,):
        case = {**args, "target_logits": logits.to(dtype)}
        out = sv.stochastic_acceptance_sampler(**case)
        check_output_invariants(case, out)
        tokens = _committed(out)
        assert torch.equal(tokens[tokens >= 0], only[tokens >= 0])
        assert torch.equal(out[2][:, 0], only[:, positions])
        if mode == "sampled" and vocab > 1:
            assert (out[0] == 0).all(), "a draft with p~(d) == 0 was accepted"


@pytest.mark.parametrize("vocab", [33, 4097])
def test_single_allowed_token_with_bits_past_V_set(code_path, vocab):
    """The bitmask allows one token (and sets every bit past V, which must be ignored)."""
    batch, positions = 16, 2
    g = torch.Generator().manual_seed(0)
    only = torch.randint(0, vocab, (batch, positions + 1), generator=g)
    allowed = torch.nn.functional.one_hot(only, vocab).bool()
    mask = sv.pack_bitmask(allowed)
    mask[..., -1] |= -1 << (vocab % 32)
    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 5
    args = _args(logits, "argmax", token_bitmasks=mask, **_row_params(batch, g, vocab))
    out = sv.stochastic_acceptance_sampler(**args)
    check_output_invariants(args, out)
    tokens = _committed(out)
    assert torch.equal(tokens[tokens >= 0], only[tokens >= 0])


# ---------------------------------------------------------------------------------------------------------
# Truncations that leave only the top token


@pytest.mark.parametrize("vocab", [10, 1000, 50000])
@pytest.mark.parametrize("truncation", ["top_k=1", "top_p=1e-6", "min_p=1", "min_p=0.999999"])
def test_extreme_truncations_leave_the_unique_maximum(code_path, vocab, truncation):
    batch, positions = 12, 2
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 0.01  # nearly flat...
    top = logits.argmax(-1)
    logits.scatter_add_(-1, top[..., None], torch.ones(batch, positions + 1, 1))  # ...with a unique maximum 1 above
    name, value = truncation.split("=")
    value = torch.full((batch,), float(value)) if name != "top_k" else torch.full((batch,), int(value))
    temperature = torch.tensor([1e-5, 1.0, 100.0] * (batch // 3))
    args = _args(logits, "argmax", temperature=temperature, **{name: value})
    out = sv.stochastic_acceptance_sampler(**args)
    tokens = _committed(out)
    assert torch.equal(tokens[tokens >= 0], top[tokens >= 0]), f"{truncation} kept more than the maximum"


# ---------------------------------------------------------------------------------------------------------
# Nearly flat 256k vocabularies


def _flat(vocab=256_000, rows=2, scale=1e-2, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _nucleus_errors(logits: torch.Tensor, top_p: float):
    """SPEC §2 step 4 checked in float64 on the float32 weights exp(x - max x): the kept set is {w >= t},
    its mass reaches top_p, and the mass strictly above t does not. Returns (excess, deficit): relative
    amounts by which the kept set is too large / too small (each should be <= ~1e-6)."""
    rows = logits.shape[0]
    probs = sv.truncated_probs(logits, torch.ones(rows), torch.full((rows,), -1), torch.full((rows,), top_p))
    weights = torch.exp(logits - logits.amax(-1, keepdim=True)).double()
    excess = deficit = -1.0
    for row in range(rows):
        w, kept = weights[row], probs[row] > 0
        total, t = w.sum(), w[kept].min()
        assert torch.equal(kept, w >= t), "the kept set is not a threshold set"
        excess = max(excess, float((w[w > t].sum() / total) / top_p - 1))
        deficit = max(deficit, float(1 - (w[kept].sum() / total) / top_p))
    return excess, deficit


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_nearly_flat_256k_vocabulary_runs_in_every_mode(code_path, mode):
    batch, positions, vocab = 2, 1, 256_000
    logits = _flat(vocab, batch * (positions + 1), 1e-3).view(batch, positions + 1, vocab)
    g = torch.Generator().manual_seed(5)
    params = dict(
        temperature=torch.tensor([1.0, 0.0]),
        top_k=torch.tensor([-1, 100_000]),
        top_p=torch.tensor([0.9, 1.0]),
        min_p=torch.tensor([0.0, 0.999]),
    )
    args = _args(logits, mode, **params)
    if mode == "sampled":
        args["draft_probs_full"] = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 1e-3, -1)
    out = sv.stochastic_acceptance_sampler(**args)
    check_output_invariants(args, out)


def test_nearly_flat_256k_top_k_and_min_p_are_exact(code_path):
    logits = _flat(rows=2, scale=1e-3)
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    for k in (1, 1000, 128_000, 255_999):
        probs = sv.truncated_probs(logits, 1.0, k, 1.0)
        kth = weights.sort(-1, descending=True).values[:, k - 1 : k]
        assert torch.equal(probs > 0, weights >= kth), f"top_k {k}"
    for min_p in (0.999, 0.9995):
        probs = sv.truncated_probs(logits, 1.0, -1, 1.0, min_p=torch.full((2,), min_p))
        ratio = weights.double()
        assert (ratio[probs > 0] >= min_p * (1 - 2e-6)).all() and (ratio[probs == 0] < min_p * (1 + 2e-6)).all(), (
            f"min_p {min_p}"
        )


@pytest.mark.skipif(not native_available(), reason="without the compiled kernels the default path is the torch path")
@pytest.mark.parametrize("top_p, scale", [(0.5, 1e-3), (0.9, 1e-3), (0.99, 1e-2), (0.5, 1.0), (0.9, 1.0)])
def test_nearly_flat_256k_top_p_default_path_meets_spec(top_p, scale):
    excess, deficit = _nucleus_errors(_flat(rows=4, scale=scale), top_p)
    assert excess <= 1e-5 and deficit <= 1e-5, f"kept set off by {max(excess, deficit):.3g} of the mass"


def test_nearly_flat_256k_top_p_torch_path_meets_spec():
    with torch_path():
        excess, deficit = _nucleus_errors(_flat(rows=8, scale=1e-2), 0.99)
    assert excess <= 1e-5 and deficit <= 1e-5, f"kept set off by {max(excess, deficit):.3g} of the mass"


# ---------------------------------------------------------------------------------------------------------
# Half precision gives the tokens of its float32 upcast


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
def test_half_precision_equals_its_float32_upcast(code_path, dtype, mode):
    batch, positions, vocab = 18, 3, 2000
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(batch, positions + 1, vocab, generator=g) * 4).to(dtype)
    logits[::7, :, ::3] = float("-inf")
    allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.7
    allowed.scatter_(-1, logits.float().argmax(-1, keepdim=True), True)
    params = _row_params(batch, g, vocab)
    if mode == "relaxed":
        params.pop("min_p")
    args = _args(logits, mode, token_bitmasks=sv.pack_bitmask(allowed), **params)
    half = sv.stochastic_acceptance_sampler(**args)
    upcast = sv.stochastic_acceptance_sampler(**{**args, "target_logits": logits.float()})
    assert outputs_equal(half, upcast)
    rows = logits.reshape(-1, vocab)

    def flat(t):
        return t.repeat_interleave(positions + 1)

    sample_args = (flat(args["temperature"]), flat(args["top_k"]), flat(args["top_p"]), torch.arange(rows.shape[0]))
    assert torch.equal(sv.sample(rows, *sample_args), sv.sample(rows.float(), *sample_args))
    assert torch.equal(sv.truncated_probs(rows, *sample_args[:3]), sv.truncated_probs(rows.float(), *sample_args[:3]))
