"""The small-batch host paths of a validating call give what the tensor paths give, bit for bit and error
for error: value checks on host lists (checks.host_values), keys mixed as Python ints
(rng.keyed_uniform_read), and the verifier's row plan read to the host (validate=True against
validate=False, which reads nothing back and runs every row through the tensor path)."""

from __future__ import annotations

import math

import pytest
import torch

import specverify as sv
from specverify import checks
from specverify.contract import GREEDY_TEMPERATURE
from specverify.kernels.stages.weights import is_greedy, is_greedy_value
from specverify.rng import (
    HOST_KEYS,
    keyed_uniform,
    keyed_uniform_read,
    per_row_seeds,
    row_keys,
    row_seeds_read,
    row_uniforms_read,
)
from tests.support.invariants import outputs_equal

EXTREME_KEYS = [0, 1, -1, 2**63 - 1, -(2**63), 0x9E3779B97F4A7C15 - 2**64, 12345678901234567]


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (HOST_KEYS,), (HOST_KEYS + 1,)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_keys_mixed_on_the_host_give_the_tensor_path_bits(shape, dtype):
    g = torch.Generator().manual_seed(len(shape) * 31 + sum(shape))
    info = torch.iinfo(dtype)
    keys = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
    if keys.numel() and dtype == torch.int64:
        keys.view(-1)[: len(EXTREME_KEYS)] = torch.tensor(EXTREME_KEYS)[: keys.numel()]
    for stream in (0, 1, 2, 3, 7):
        expected, got = keyed_uniform(keys, stream), keyed_uniform_read(keys, stream)
        assert got.dtype == torch.float64 and got.shape == expected.shape
        assert torch.equal(got, expected)


@pytest.mark.parametrize("shared", [True, False])
def test_seeds_and_uniforms_read_to_the_host_are_those_of_the_tensor_path(shared):
    g = torch.Generator().manual_seed(11)
    for rows in (1, 3, 8) if shared else (2, 3, 8):  # a [1] tensor seed is shared
        if shared:
            seeds = [0, -1, 2**64 - 1, 2**63, 12345, torch.tensor(-5), torch.tensor([2**62])]
        else:
            seeds = [torch.randint(-(2**63), 2**63 - 1, (rows,), generator=g)]
            seeds[0][0] = 2**63 - 1
        for seed in seeds:
            checked, is_shared = checks.check_seed(seed, rows, torch.device("cpu"))
            assert is_shared == shared
            expected = per_row_seeds(checked, is_shared, rows, torch.device("cpu"))
            assert row_seeds_read(checked, is_shared, rows) == expected.tolist()
            for positions, stream in ((1, 0), (5, 0), (3, 2)):
                uniforms = keyed_uniform(row_keys(expected, positions), stream).reshape(-1)
                assert torch.equal(
                    torch.tensor(row_uniforms_read(expected.tolist(), positions, stream), dtype=torch.float64), uniforms
                )


def test_greedy_read_on_the_host_compares_in_float32_as_torch_does():
    edge = torch.tensor(GREEDY_TEMPERATURE, dtype=torch.float32)
    values = torch.stack(
        [
            edge,
            torch.nextafter(edge, torch.tensor(0.0)),
            torch.nextafter(edge, torch.tensor(1.0)),
            torch.tensor(0.0),
            torch.tensor(-0.0),
            torch.tensor(1e-5 * 0.999999),
            torch.tensor(1e-5 * 1.000001),
            torch.tensor(0.7),
        ]
    ).to(torch.float32)
    assert [is_greedy_value(t) for t in values.tolist()] == is_greedy(values).tolist()
    assert is_greedy(values).tolist()[:3] == [False, True, False]


def test_draft_ids_read_to_the_host_raise_what_the_tensor_check_raises():
    g = torch.Generator().manual_seed(5)
    for _ in range(40):
        draft = torch.randint(-1, 20, (3, 4), generator=g)
        for _ in range(int(torch.randint(0, 3, (), generator=g))):
            row, position = (int(i) for i in torch.randint(0, 3, (2,), generator=g))
            draft[row, position] = int(torch.tensor([-2, -7, 20, 99])[torch.randint(0, 4, (), generator=g)])
        expected = _outcome(checks.check_draft_ids, draft, 20)
        assert _outcome(checks.check_draft_ids, draft, 20, values=draft.tolist()) == expected


def _outcome(function, *args, **kwargs):
    """function(*args, **kwargs) -> ("ok", None) or (exception type, message)."""
    try:
        function(*args, **kwargs)
    except (ValueError, TypeError) as error:
        return type(error), str(error)
    return "ok", None


BAD = {
    "temperature": [math.nan, math.inf, -math.inf, -0.5, -1e-30],
    "top_k": [-2, -100],
    "top_p": [math.nan, 0.0, -0.1, 1.5, math.inf],
    "min_p": [math.nan, -0.01, 1.01, -math.inf],
}
GOOD = {
    "temperature": [0.0, 1e-6, 0.7, 2.0],
    "top_k": [-1, 0, 1, 50],
    "top_p": [1e-3, 0.5, 1.0],
    "min_p": [0.0, 0.1, 1.0],
}


@pytest.mark.parametrize("rows", [1, 5, checks.HOST_ROWS + 3])
def test_value_checks_on_host_lists_raise_what_the_tensor_checks_raise(rows):
    g = torch.Generator().manual_seed(rows)

    def params():
        out = {}
        for name, values in GOOD.items():
            picked = torch.tensor(values)[torch.randint(0, len(values), (rows,), generator=g)]
            out[name] = picked.to(torch.int64 if name == "top_k" else torch.float32)
        return out

    cases = [params()]
    for name, values in BAD.items():
        for value in values:
            for row in {0, rows - 1, rows // 2}:
                case = params()
                case[name][row] = value
                cases.append(case)
    for case in cases + [{**params(), "min_p": None}]:
        tensors = (case["temperature"], case["top_k"], case["top_p"], case["min_p"])
        expected = _outcome(checks.check_sampling_values, *tensors)
        host = checks.host_values(*tensors)
        assert (host is None) == (rows > checks.HOST_ROWS)
        if host is not None:
            assert _outcome(checks.check_sampling_values, *tensors, host) == expected
        sampled = _outcome(sv.sample, torch.zeros(rows, 6), *tensors[:3], 0, tensors[3])
        assert sampled == expected


def test_a_nan_top_p_is_named_before_a_min_top_p_hint_above_other_rows():
    """torch's min propagates NaN, so a min_top_p hint above the other rows is not blamed first (as before)."""
    for top_p in ([0.5, math.nan], [math.nan, 0.5]):
        with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\] \(got nan at row"):
            sv.stochastic_acceptance_sampler(
                torch.zeros(2, 1, dtype=torch.int64),
                torch.zeros(2, 2, 8),
                torch.ones(2),
                torch.zeros(2, dtype=torch.int64),
                None,
                torch.tensor(top_p),
                0.9,
                0,
            )


def _random_call(g: torch.Generator, batch: int, positions: int, vocab: int, mode: str) -> dict:
    def pick(values, dtype):
        return torch.tensor(values, dtype=dtype)[torch.randint(0, len(values), (batch,), generator=g)]

    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 3
    draft = torch.where(
        torch.rand(batch, positions, generator=g) < 0.5,
        logits[:, :positions].argmax(-1),
        torch.randint(0, vocab, (batch, positions), generator=g),
    )
    cut = torch.randint(0, positions + 1, (batch, 1), generator=g)  # ragged: -1 from a row's cut onward
    draft = torch.where(torch.arange(positions) >= cut, -1, draft)
    draft = torch.where(
        torch.rand(batch, positions, generator=g) < 0.15, -1, draft
    )  # holes: a row ends at its first -1
    args = dict(
        draft_tokens=draft.to(torch.int32 if batch % 2 else torch.int64),
        target_logits=logits,
        temperature=pick([0.0, 0.0, 0.5, 1.0, 1.3], torch.float32),
        top_k=pick([-1, 0, 1, 3, vocab + 5], torch.int64),
        max_k=None,
        top_p=pick([1.0, 0.9, 0.5], torch.float32),
        min_top_p=None,
        seed=torch.randint(-(2**62), 2**62, (batch,) if batch % 3 else (1,), generator=g),
        min_p=pick([0.0, 0.05], torch.float32) if batch % 2 else None,
    )
    if mode in ("bitmask", "sampled"):
        allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.6
        allowed.scatter_(-1, torch.randint(0, vocab, (batch, positions + 1, 1), generator=g), True)
        args["token_bitmasks"] = sv.pack_bitmask(allowed)
    if mode == "sampled":
        args["draft_proposal"] = "sampled"
        args["draft_probs_full"] = torch.softmax(torch.randn(batch, positions, vocab, generator=g), -1)
    if mode == "relaxed":
        args["in_thinking_phase"] = torch.rand(batch, generator=g) < 0.5
        args["relaxed_topk"], args["relaxed_delta"] = 3, 0.3
    return args


@pytest.mark.parametrize("mode", ["argmax", "bitmask", "sampled", "relaxed"])
def test_validating_calls_give_the_outputs_of_calls_that_read_nothing_back(mode):
    g = torch.Generator().manual_seed(7)
    for batch in (1, 2, 3, 6, 9, 13):  # 13 rows of K = 4: past HOST_KEYS, the tensor path
        for positions in (0, 1, 4):
            args = _random_call(g, batch, positions, 50, mode)
            snapshot = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
            checked = sv.stochastic_acceptance_sampler(**args, validate=True)
            unchecked = sv.stochastic_acceptance_sampler(**args, validate=False)
            assert outputs_equal(checked, unchecked), (batch, positions)
            for name, value in snapshot.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(args[name], value), f"{name} was written to"


def test_validating_sample_gives_the_draws_of_a_sample_that_reads_nothing_back():
    g = torch.Generator().manual_seed(3)
    for rows in (1, 2, 5, HOST_KEYS, HOST_KEYS + 1):
        args = _random_call(g, rows, 0, 40, "bitmask")
        call = (
            args["target_logits"][:, 0],
            args["temperature"],
            args["top_k"],
            args["top_p"],
            args["seed"],
            args["min_p"],
        )
        mask = args["token_bitmasks"][:, 0]
        for token_bitmask in (None, mask):
            checked = sv.sample(*call, token_bitmask=token_bitmask, validate=True)
            assert torch.equal(checked, sv.sample(*call, token_bitmask=token_bitmask, validate=False))
