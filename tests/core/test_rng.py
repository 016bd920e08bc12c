"""SPEC §4: keyed counter-based uniforms, and how seeds become keys (shared seeds, uint64 bit patterns)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import specverify as sv
from tests.support.seeds import ROW_STRIDE

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def as_int64(value: int) -> int:
    """The int64 whose bit pattern is value mod 2**64."""
    value %= 2**64
    return value - 2**64 if value >= 2**63 else value


def uniforms(keys, stream: int = 0) -> np.ndarray:
    return sv.keyed_uniform(torch.as_tensor(keys, dtype=torch.int64), stream).numpy()


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


# ---------------------------------------------------------------------------------------------------------
# keyed_uniform

EXTREME_KEYS = [INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX]


def test_range_dtype_shape_and_device():
    keys = torch.cat([torch.arange(-50_000, 50_000), torch.tensor(EXTREME_KEYS)])
    u = sv.keyed_uniform(keys, 0)
    assert u.dtype == torch.float64 and u.shape == keys.shape and u.device == keys.device
    assert (u >= 0).all() and (u < 1).all()
    grid = sv.keyed_uniform(keys[:1000].reshape(10, 100), 2)
    assert grid.shape == (10, 100)
    assert torch.equal(grid.reshape(-1), sv.keyed_uniform(keys[:1000], 2))


def test_uses_53_bits():
    u = sv.keyed_uniform(torch.arange(10_000), 0)
    scaled = u * 2.0**53
    assert torch.equal(scaled, scaled.floor())  # multiples of 2**-53
    assert float((u * 2.0**32).frac().max()) > 0  # more than 32 bits of resolution are used


def test_deterministic_and_pure():
    keys = torch.randint(INT64_MIN, INT64_MAX, (5000,), generator=torch.Generator().manual_seed(0))
    for stream in (0, 1, 2, 17):
        a = sv.keyed_uniform(keys, stream)
        assert torch.equal(a, sv.keyed_uniform(keys.clone(), stream))
        assert torch.equal(a[1234:1240], sv.keyed_uniform(keys[1234:1240], stream))  # no dependence on neighbours
        assert torch.equal(a.flip(0), sv.keyed_uniform(keys.flip(0), stream))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integer_dtypes_are_read_as_their_value(dtype):
    keys = torch.arange(0, 100, dtype=dtype)
    assert torch.equal(sv.keyed_uniform(keys, 1), sv.keyed_uniform(keys.to(torch.int64), 1))


def test_same_key_different_streams_differ():
    keys = torch.arange(100_000)
    streams = [sv.keyed_uniform(keys, s).numpy() for s in (0, 1, 2, 3, 1000)]
    bound = 5 / math.sqrt(len(keys))
    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            assert not np.any(streams[i] == streams[j])
            assert abs(correlation(streams[i], streams[j])) < bound


@pytest.mark.parametrize("offset", [1, 2, 2**32, 2**63, ROW_STRIDE])
def test_nearby_keys_are_uncorrelated(offset):
    n = 100_000
    keys = torch.arange(n) * 3 + 12345
    a = sv.keyed_uniform(keys, 0).numpy()
    b = sv.keyed_uniform(torch.tensor(as_int64(offset)) + keys, 0).numpy()  # key + offset mod 2**64
    bound = 5 / math.sqrt(n)
    assert abs(correlation(a, b)) < bound
    # power: a 3% dependence between the two would be caught at this n
    leaky = 0.97 * b + 0.03 * a
    assert abs(correlation(a, leaky)) > bound


def test_consecutive_keys_lag_one():
    n = 100_000
    u = uniforms(np.arange(n + 1, dtype=np.int64) + 777)
    assert abs(correlation(u[:-1], u[1:])) < 5 / math.sqrt(n)
    assert abs(correlation(u[:-2], u[2:])) < 5 / math.sqrt(n)


def test_uniformity_ks_with_power():
    n = 1_000_000
    u = uniforms(np.arange(n, dtype=np.int64) * 7 - n)
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert stats.kstest(u**1.01, "uniform").pvalue < 1e-3  # a 1% bend is caught at the same n


def test_bits_are_balanced():
    """Each of the top 20 bits of the uniform is 1 half of the time on sequential keys."""
    n = 200_000
    u = uniforms(np.arange(n, dtype=np.int64))
    bits = (u * 2**20).astype(np.int64)
    for bit in range(20):
        share = float(((bits >> bit) & 1).mean())
        assert abs(share - 0.5) < 5 * 0.5 / math.sqrt(n), bit


def test_extreme_bit_patterns():
    u = uniforms(EXTREME_KEYS)
    assert ((u >= 0) & (u < 1)).all()
    assert len(set(u.tolist())) == len(EXTREME_KEYS)
    for stream in (1, 2):
        assert not np.array_equal(u, uniforms(EXTREME_KEYS, stream))


# ---------------------------------------------------------------------------------------------------------
# Seeds in the verifier and the plain sampler

B, K, V = 6, 3, 64


def problem(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        draft_tokens=torch.randint(0, V, (B, K), generator=g),
        target_logits=torch.randn(B, K + 1, V, generator=g) * 0.3,  # flat: the draws vary with the key
        temperature=torch.ones(B),
        top_k=torch.full((B,), -1),
        max_k=None,
        top_p=torch.ones(B),
        min_top_p=None,
    )


def draft_probs() -> torch.Tensor:
    return torch.softmax(torch.randn(B, K, V, generator=torch.Generator().manual_seed(99)), dim=-1)


def verify(args: dict, seed, mode: str, rows: slice = slice(None)):
    args = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    extra = dict(draft_proposal="sampled", draft_probs_full=draft_probs()[rows]) if mode == "sampled" else {}
    return sv.stochastic_acceptance_sampler(**args, seed=seed, **extra)


def per_request(shared: int, batch: int, stride: int = ROW_STRIDE) -> torch.Tensor:
    """SPEC §4: the per-request seeds that a shared seed stands for."""
    return torch.tensor([as_int64(shared + b * stride) for b in range(batch)])


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


SHARED_SEEDS = [0, 1, 123456789, INT64_MAX, 2**63, 2**64 - 1, -1, INT64_MIN, -987654321]


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
@pytest.mark.parametrize("shared", SHARED_SEEDS)
def test_shared_seed_is_the_spread_per_request_seed(shared, mode):
    args = problem()
    expected = verify(args, per_request(shared, B), mode)
    for form in (shared, torch.tensor(as_int64(shared)), torch.tensor([as_int64(shared)])):
        assert same(verify(args, form, mode), expected)
    assert not same(expected, verify(args, per_request(shared, B, stride=1), mode))  # power: s + b is different


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
@pytest.mark.parametrize("shared", [0, 2**64 - 1, INT64_MIN, 42])
def test_row_zero_and_a_batch_of_one_use_the_seed_itself(shared, mode):
    args = problem()
    batch = verify(args, shared, mode)
    alone_shared = verify(args, shared, mode, rows=slice(0, 1))
    alone_per_request = verify(args, torch.tensor([as_int64(shared)]), mode, rows=slice(0, 1))
    assert same(alone_shared, alone_per_request)
    assert same(alone_shared, tuple(t[:1] for t in batch))


def test_rows_of_one_batch_never_share_keys():
    """Identical rows under a shared seed still draw differently."""
    args = problem()
    for name in ("draft_tokens", "target_logits"):
        args[name] = args[name][:1].expand_as(args[name]).clone()
    first, recovered, bonus = verify(args, 7, "argmax")
    rows = {tuple(recovered[b].tolist()) + (int(bonus[b]),) for b in range(B)}
    assert len(rows) > 1


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_per_request_rows_depend_only_on_their_own_seed(mode):
    args = problem()
    seeds = torch.tensor([5, -1, INT64_MAX, INT64_MIN, 2**40, 5])
    batch = verify(args, seeds, mode)
    for b in range(B):
        alone = verify(args, seeds[b : b + 1], mode, rows=slice(b, b + 1))
        assert same(alone, tuple(t[b : b + 1] for t in batch))


def test_uint64_int_seed_equals_its_int64_bit_pattern():
    args = problem()
    for big in (2**64 - 1, 2**63, 2**63 + 12345):
        assert same(verify(args, big, "argmax"), verify(args, torch.tensor(as_int64(big)), "argmax"))
        assert same(verify(args, big, "argmax"), verify(args, as_int64(big), "argmax"))


def test_per_request_keys_wrap_around_modulo_2_64():
    """Position j of row b is keyed by s_b + j mod 2**64, which is what sample(seed=s_b + j) draws (argmax mode)."""
    args = problem()
    seeds = torch.tensor([INT64_MAX, -1, INT64_MAX - 1, -2, 0, 2**62])
    first, recovered, bonus = verify(args, seeds, "argmax")
    candidates = torch.cat([recovered, bonus], dim=1)
    for b in range(B):
        for j in range(int(first[b]) + 1):
            token = sv.sample(
                args["target_logits"][b, j][None], 1.0, -1, 1.0, torch.tensor([as_int64(int(seeds[b]) + j)])
            )
            assert int(token) == int(candidates[b, j]), (b, j)


def test_sample_shared_seed_rule():
    n = 16
    logits = torch.randn(n, V, generator=torch.Generator().manual_seed(3)) * 0.3
    params = (torch.ones(n), torch.full((n,), -1), torch.ones(n))
    for shared in (0, 2**64 - 1, INT64_MIN, 31337):
        drawn = sv.sample(logits, *params, shared)
        assert torch.equal(drawn, sv.sample(logits, *params, per_request(shared, n)))
        assert torch.equal(drawn, sv.sample(logits, *params, torch.tensor([as_int64(shared)])))
        assert not torch.equal(drawn, sv.sample(logits, *params, per_request(shared, n, stride=1)))
        assert int(sv.sample(logits[:1], 1.0, -1, 1.0, shared)) == int(drawn[0])
