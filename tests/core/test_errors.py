"""SPEC §6: bad input raises TypeError (wrong type) or ValueError (wrong value or shape) with a message that
names the argument, the rule and what it got; inputs are never written to; validate=False changes nothing
for valid inputs, reads nothing back to the host, and still returns valid ids for garbage."""

from __future__ import annotations

import re

import pytest
import torch

import specverify as sv
from specverify import checks
from tests.support.invariants import forbid_host_reads

B, K, V = 4, 3, 40  # V is not a multiple of 32: the bitmask has a partial last word
WORDS = (V + 31) // 32


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def base_args(**overrides) -> dict:
    """A valid argmax-mode call of stochastic_acceptance_sampler; `overrides` replace arguments."""
    g = _generator()
    args = dict(
        draft_tokens=torch.randint(0, V, (B, K), generator=g),
        target_logits=torch.randn(B * (K + 1), V, generator=g),
        temperature=torch.ones(B),
        top_k=torch.full((B,), -1),
        max_k=None,
        top_p=torch.ones(B),
        min_top_p=None,
        seed=torch.arange(B) * 7 + 1,
    )
    args.update(overrides)
    return args


def draft_probs(seed: int = 1) -> torch.Tensor:
    """A valid draft_probs_full [B, K, V]."""
    return torch.softmax(torch.randn(B, K, V, generator=_generator(seed)), dim=-1)


def sampled_args(**overrides) -> dict:
    return base_args(**{"draft_proposal": "sampled", "draft_probs_full": draft_probs(), **overrides})


def relaxed_args(**overrides) -> dict:
    relaxed = dict(in_thinking_phase=torch.tensor([True, False, True, False]), relaxed_topk=3, relaxed_delta=0.1)
    return base_args(**{**relaxed, **overrides})


def call(args: dict):
    return sv.stochastic_acceptance_sampler(**args)


def with_value(tensor: torch.Tensor, index: tuple, value) -> torch.Tensor:
    """A copy of `tensor` with one entry replaced."""
    out = tensor.clone()
    out[index] = value
    return out


def expect(exc: type[Exception], pattern: str, args: dict) -> None:
    """The call raises `exc` with a message matching `pattern` (a regex, searched)."""
    with pytest.raises(exc, match=pattern):
        call(args)


def lit(text: str) -> str:
    """A literal piece of an expected message."""
    return re.escape(text)


# ---------------------------------------------------------------------------------------------------------
# The base calls are valid: every error below comes from the one argument that was changed.


@pytest.mark.parametrize("make", [base_args, sampled_args, relaxed_args], ids=["argmax", "sampled", "relaxed"])
def test_base_calls_are_valid(make):
    first, recovered, bonus = call(make())
    assert first.shape == (B,) and recovered.shape == (B, K) and bonus.shape == (B, 1)


# ---------------------------------------------------------------------------------------------------------
# Types and shapes


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (torch.zeros(B, K), TypeError, r"draft_tokens must be an int32 or int64 tensor.*\(got dtype torch\.float32\)"),
        (torch.zeros(B, K, dtype=torch.int16), TypeError, r"draft_tokens.*\(got dtype torch\.int16\)"),
        ([[0] * K] * B, TypeError, r"draft_tokens.*\(got list\)"),
        (torch.zeros(B * K, dtype=torch.int64), ValueError, lit("draft_tokens must have shape [B, K] (got [12])")),
        (
            torch.zeros(B, K, 1, dtype=torch.int64),
            ValueError,
            lit("draft_tokens must have shape [B, K] (got [4, 3, 1])"),
        ),
    ],
    ids=["float", "int16", "list", "1d", "3d"],
)
def test_draft_tokens_type_and_shape(value, exc, pattern):
    expect(exc, pattern, base_args(draft_tokens=value))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_draft_tokens_int32_and_int64_agree(dtype):
    args = base_args()
    expected = call(args)
    got = call({**args, "draft_tokens": args["draft_tokens"].to(dtype)})
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (
            torch.zeros(B * (K + 1), V, dtype=torch.int64),
            TypeError,
            lit("target_logits must be a float32, float16 or bfloat16 tensor (got dtype torch.int64)"),
        ),
        (torch.zeros(B * (K + 1), V, dtype=torch.float64), TypeError, r"target_logits.*\(got dtype torch\.float64\)"),
        ("logits", TypeError, r"target_logits.*\(got str\)"),
        (
            torch.zeros(B * K, V),
            ValueError,
            r"target_logits must have shape \[B\*\(K\+1\), V\] = \[16, V\].*\(got \[12, 40\]\)",
        ),
        (
            torch.zeros(B, K, V),
            ValueError,
            r"target_logits must have shape .*\[B, K\+1, V\] = \[4, 4, V\].*\(got \[4, 3, 40\]\)",
        ),
        (torch.zeros(B + 1, K + 1, V), ValueError, r"target_logits.*\(got \[5, 4, 40\]\)"),
        (torch.zeros(B * (K + 1) * V), ValueError, r"target_logits.*\(got \[640\]\)"),
        (torch.zeros(B * (K + 1), 0), ValueError, r"target_logits.*V >= 1 \(got \[16, 0\]\)"),
    ],
    ids=["int", "float64", "str", "2d-rows", "3d-K", "3d-B", "1d", "V=0"],
)
def test_target_logits_type_and_shape(value, exc, pattern):
    expect(exc, pattern, base_args(target_logits=value))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_target_logits_both_layouts_agree(dtype):
    args = base_args(target_logits=base_args()["target_logits"].to(dtype))
    flat = call(args)
    nested = call({**args, "target_logits": args["target_logits"].view(B, K + 1, V)})
    for a, b in zip(flat, nested):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "name, value, exc, pattern",
    [
        (
            "temperature",
            torch.ones(B, dtype=torch.int64),
            TypeError,
            lit("temperature must be a float tensor of shape [B] (got dtype torch.int64)"),
        ),
        ("temperature", torch.ones(B + 1), ValueError, lit("temperature must have shape [B] = [4] (got [5])")),
        ("temperature", torch.ones(B, 1), ValueError, lit("temperature must have shape [B] = [4] (got [4, 1])")),
        ("temperature", "hot", TypeError, r"temperature must be a float tensor.*\(got str\)"),
        ("top_k", torch.ones(B), TypeError, lit("top_k must be an int tensor of shape [B] (got dtype torch.float32)")),
        ("top_k", torch.ones(B, dtype=torch.bool), TypeError, r"top_k.*\(got dtype torch\.bool\)"),
        ("top_k", torch.ones(B - 1, dtype=torch.int64), ValueError, lit("top_k must have shape [B] = [4] (got [3])")),
        ("top_k", 2.0, TypeError, r"top_k must be an int tensor.*\(got float\)"),
        (
            "top_p",
            torch.ones(B, dtype=torch.int64),
            TypeError,
            lit("top_p must be a float tensor of shape [B] (got dtype torch.int64)"),
        ),
        ("top_p", torch.ones(2 * B), ValueError, lit("top_p must have shape [B] = [4] (got [8])")),
        (
            "min_p",
            torch.zeros(B, dtype=torch.int32),
            TypeError,
            lit("min_p must be a float tensor of shape [B] (got dtype torch.int32)"),
        ),
        ("min_p", torch.zeros(B + 2), ValueError, lit("min_p must have shape [B] = [4] (got [6])")),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 12 else None,
)
def test_row_parameter_type_and_shape(name, value, exc, pattern):
    expect(exc, pattern, base_args(**{name: value}))


def test_row_parameters_as_python_numbers_broadcast():
    args = base_args(top_k=torch.full((B,), 5), top_p=torch.full((B,), 0.9), temperature=torch.full((B,), 0.7))
    expected = call(args)
    got = call({**args, "temperature": 0.7, "top_k": 5, "top_p": 0.9})
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "seed, exc, pattern",
    [
        (1.0, TypeError, lit("seed must be an int or an integer tensor (got float)")),
        (True, TypeError, lit("seed must be an int or an integer tensor (got bool)")),
        (torch.tensor(1.0), TypeError, lit("seed must be an int or an integer tensor (got dtype torch.float32)")),
        (torch.ones(B, dtype=torch.float64), TypeError, r"seed.*\(got dtype torch\.float64\)"),
        (torch.ones(B, dtype=torch.bool), TypeError, r"seed.*\(got dtype torch\.bool\)"),
        (torch.ones(B - 1, dtype=torch.int64), ValueError, lit("a tensor of shape [B] = [4] (got shape [3])")),
        (torch.ones(B, 1, dtype=torch.int64), ValueError, r"seed must be .*\(got shape \[4, 1\]\)"),
        (torch.ones(1, 1, dtype=torch.int64), ValueError, r"seed must be .*\(got shape \[1, 1\]\)"),
        (2**64, ValueError, lit("seed must fit in 64 bits, in [-2**63, 2**64) (got 18446744073709551616)")),
        (-(2**63) - 1, ValueError, r"seed must fit in 64 bits.*\(got -9223372036854775809\)"),
    ],
    ids=["float", "bool", "0d-float", "B-float", "B-bool", "B-1", "Bx1", "1x1", "2**64", "below-int64"],
)
def test_seed_type_and_shape(seed, exc, pattern):
    expect(exc, pattern, base_args(seed=seed))


def test_seed_shared_forms_agree_and_per_request_differs():
    """int, 0-d and [1] tensors are one shared key; a [B] tensor of that value is a different thing."""
    args = base_args(target_logits=torch.randn(B * (K + 1), V, generator=_generator(5)) * 0.1)
    outputs = [
        call({**args, "seed": s})
        for s in (1234, torch.tensor(1234), torch.tensor([1234]), torch.tensor([1234], dtype=torch.int32))
    ]
    for other in outputs[1:]:
        for a, b in zip(outputs[0], other):
            assert torch.equal(a, b)
    per_request = call({**args, "seed": torch.full((B,), 1234)})
    assert not all(torch.equal(a, b) for a, b in zip(outputs[0], per_request))


@pytest.mark.parametrize("seed", [0, 2**64 - 1, -(2**63), 2**63 - 1, 2**63])
def test_seed_extremes_are_accepted(seed):
    first, recovered, bonus = call(base_args(seed=seed))
    assert ((recovered >= 0) & (recovered < V)).all() and ((bonus >= 0) & (bonus < V)).all()


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (
            torch.ones(B, dtype=torch.int64),
            TypeError,
            lit("in_thinking_phase must be a bool tensor [B] (got dtype torch.int64)"),
        ),
        ([True] * B, TypeError, r"in_thinking_phase must be a bool tensor.*\(got list\)"),
        (torch.ones(B + 1, dtype=torch.bool), ValueError, lit("in_thinking_phase must have shape [B] = [4] (got [5])")),
    ],
    ids=["int", "list", "shape"],
)
def test_in_thinking_phase_type_and_shape(value, exc, pattern):
    expect(exc, pattern, relaxed_args(in_thinking_phase=value))


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (
            torch.full((B, K + 1, WORDS), -1, dtype=torch.int64),
            TypeError,
            lit("token_bitmasks must be an int32 tensor [B, K+1, ceil(V/32)] (got dtype torch.int64)"),
        ),
        (torch.ones(B, K + 1, V, dtype=torch.bool), TypeError, r"token_bitmasks.*\(got dtype torch\.bool\)"),
        (
            torch.full((B, K + 1, 1), -1, dtype=torch.int32),
            ValueError,
            lit("token_bitmasks must have shape [B, K+1, ceil(V/32)] = [4, 4, 2] (got [4, 4, 1])"),
        ),
        (
            torch.full((B, K, WORDS), -1, dtype=torch.int32),
            ValueError,
            r"token_bitmasks must have shape .*\(got \[4, 3, 2\]\)",
        ),
        (
            torch.full((B * (K + 1), WORDS), -1, dtype=torch.int32),
            ValueError,
            r"token_bitmasks must have shape .*\(got \[16, 2\]\)",
        ),
    ],
    ids=["int64", "bool", "words", "positions", "2d"],
)
def test_token_bitmasks_type_and_shape(value, exc, pattern):
    expect(exc, pattern, base_args(token_bitmasks=value))


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (
            torch.zeros(B, K, V, dtype=torch.int64),
            TypeError,
            lit("draft_probs_full must be a float tensor [B, K, V] (got dtype torch.int64)"),
        ),
        (
            torch.zeros(B, K + 1, V),
            ValueError,
            lit("draft_probs_full must have shape [B, K, V] = [4, 3, 40] (got [4, 4, 40])"),
        ),
        (torch.zeros(B, K, V + 1), ValueError, r"draft_probs_full must have shape .*\(got \[4, 3, 41\]\)"),
        (torch.zeros(B * K, V), ValueError, r"draft_probs_full must have shape .*\(got \[12, 40\]\)"),
    ],
    ids=["int", "K+1", "V+1", "2d"],
)
def test_draft_probs_full_type_and_shape(value, exc, pattern):
    expect(exc, pattern, sampled_args(draft_probs_full=value))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_draft_probs_full_float_dtypes_are_accepted(dtype):
    call(sampled_args(draft_probs_full=draft_probs().to(dtype)))


@pytest.mark.parametrize(
    "name, value, exc, pattern",
    [
        ("max_k", 2.5, TypeError, lit("max_k must be an int, a 0-d tensor or None (got float)")),
        ("max_k", torch.tensor([3]), ValueError, lit("max_k must be a number or a 0-d tensor (got shape [1])")),
        ("min_top_p", "0.5", TypeError, lit("min_top_p must be a float, a 0-d tensor or None (got str)")),
        ("min_top_p", torch.ones(B), ValueError, lit("min_top_p must be a number or a 0-d tensor (got shape [4])")),
        ("vocab_size", V + 1, ValueError, lit("vocab_size must equal the logits' V = 40 (got 41)")),
        ("vocab_size", V - 1, ValueError, lit("vocab_size must equal the logits' V = 40 (got 39)")),
        ("vocab_size", "40", TypeError, lit("vocab_size must be an int (got str)")),
        ("vocab_size", 40.0, TypeError, lit("vocab_size must be an int (got float)")),
    ],
    ids=["max_k-float", "max_k-1d", "min_top_p-str", "min_top_p-1d", "vocab+1", "vocab-1", "vocab-str", "vocab-float"],
)
def test_hints_and_vocab_size_type(name, value, exc, pattern):
    expect(exc, pattern, base_args(**{name: value}))


def test_vocab_size_equal_to_V_is_accepted():
    call(base_args(vocab_size=V))
    call(base_args(vocab_size=torch.tensor(V)))


# ---------------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("bad", [-2, -100, V, V + 7])
def test_draft_ids_outside_range(bad):
    draft = with_value(base_args()["draft_tokens"], (1, 2), bad)
    expect(
        ValueError,
        lit(f"draft_tokens must be in [-1, {V}) (got {bad} at row 1, position 2)"),
        base_args(draft_tokens=draft),
    )


def test_draft_padding_minus_one_is_valid():
    draft = with_value(base_args()["draft_tokens"], (1, slice(1, None)), -1)
    first, _, _ = call(base_args(draft_tokens=draft))
    assert int(first[1]) <= 1


@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("inf"), "inf")])
@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_target_logits_nan_and_plus_inf_name_row_and_position(bad, shown, layout):
    logits = with_value(base_args()["target_logits"], (2 * (K + 1) + 1, 5), bad)  # row 2, position 1, token 5
    if layout == "nested":
        logits = logits.view(B, K + 1, V)
    pattern = lit(f"target_logits must not hold NaN or +inf (got {shown} at row 2, position 1, token 5)")
    expect(ValueError, pattern, base_args(target_logits=logits))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_target_logits_nan_in_half_precision(dtype):
    logits = with_value(base_args()["target_logits"], (K + 1 + K, 0), float("nan")).to(dtype)  # row 1, position K
    expect(ValueError, lit(f"(got nan at row 1, position {K}, token 0)"), base_args(target_logits=logits))


def test_target_logits_minus_inf_is_allowed_and_never_committed():
    logits = base_args()["target_logits"].clone()
    logits[:, ::2] = float("-inf")  # even tokens are impossible
    first, recovered, bonus = call(base_args(target_logits=logits, temperature=torch.tensor([1.0, 0.0, 2.0, 0.5])))
    tokens, _ = sv.committed_tokens(first, recovered, bonus)
    committed = tokens[tokens >= 0]
    assert committed.numel() > 0 and (committed % 2 == 1).all()


def test_target_logits_position_all_minus_inf():
    logits = with_value(base_args()["target_logits"], (1 * (K + 1) + 3, slice(None)), float("-inf"))
    expect(
        ValueError,
        r"target_logits must leave at least one token with a finite logit \(got none at row 1, position 3\)",
        base_args(target_logits=logits),
    )


@pytest.mark.parametrize(
    "bad, shown", [(-0.5, "-0.5"), (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")]
)
def test_temperature_negative_nan_inf(bad, shown):
    temperature = with_value(torch.ones(B), 2, bad)
    expect(
        ValueError,
        lit(f"temperature must be finite and >= 0 (got {shown} at row 2)"),
        base_args(temperature=temperature),
    )


def test_temperature_zero_is_valid():
    call(base_args(temperature=torch.zeros(B)))


@pytest.mark.parametrize("bad", [-2, -1000])
def test_top_k_below_minus_one(bad):
    top_k = with_value(torch.full((B,), 5), 3, bad)
    expect(
        ValueError, lit(f"top_k must be >= -1 (0 or -1 means no limit) (got {bad} at row 3)"), base_args(top_k=top_k)
    )


@pytest.mark.parametrize("value", [-1, 0, 1, V, 10 * V])
def test_top_k_valid_values(value):
    call(base_args(top_k=torch.full((B,), value)))


@pytest.mark.parametrize("bad, shown", [(0.0, "0.0"), (1.5, "1.5"), (-0.25, "-0.25"), (float("nan"), "nan")])
def test_top_p_outside_0_1(bad, shown):
    top_p = with_value(torch.ones(B), 3, bad)
    expect(ValueError, lit(f"top_p must be in (0, 1] (got {shown} at row 3)"), base_args(top_p=top_p))


@pytest.mark.parametrize("bad, shown", [(-0.25, "-0.25"), (1.5, "1.5"), (float("nan"), "nan")])
def test_min_p_outside_0_1(bad, shown):
    min_p = with_value(torch.zeros(B), 1, bad)
    expect(ValueError, lit(f"min_p must be in [0, 1] (got {shown} at row 1)"), base_args(min_p=min_p))


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_min_p_bounds_are_valid(value):
    call(base_args(min_p=torch.full((B,), value)))


def test_max_k_smaller_than_a_row_top_k():
    args = base_args(top_k=torch.tensor([5, 2, 7, 1]), max_k=6)
    expect(ValueError, lit("max_k must be -1 or >= the largest top_k (7) (got 6)"), args)


def test_max_k_as_0d_tensor_is_checked():
    args = base_args(top_k=torch.tensor([5, 2, 7, 1]), max_k=torch.tensor(6))
    expect(ValueError, lit("max_k must be -1 or >= the largest top_k (7) (got 6)"), args)


def test_max_k_not_minus_one_when_a_row_has_no_limit():
    args = base_args(top_k=torch.tensor([5, 0, 7, 1]), max_k=7)
    expect(ValueError, lit("max_k must be -1 when a row has no top-k limit (row 1 has top_k 0) (got 7)"), args)


@pytest.mark.parametrize("bad", [0, -2, -7])
def test_max_k_zero_or_below_minus_one(bad):
    expect(ValueError, lit(f"max_k must be -1 (some row has no limit) or >= 1 (got {bad})"), base_args(max_k=bad))


@pytest.mark.parametrize(
    "top_k, max_k", [([5, 2, 7, 1], 7), ([5, 2, 7, 1], -1), ([5, 0, 7, 1], -1), ([-1, -1, -1, -1], -1)]
)
def test_max_k_consistent_values_are_accepted(top_k, max_k):
    call(base_args(top_k=torch.tensor(top_k), max_k=max_k))


def test_min_top_p_above_min_top_p():
    args = base_args(top_p=torch.tensor([1.0, 0.5, 0.9, 1.0]), min_top_p=0.75)
    expect(ValueError, r"min_top_p must be <= min\(top_p\) = 0\.5 \(got 0\.75\)", args)
    args["min_top_p"] = torch.tensor(0.75)
    expect(ValueError, r"min_top_p must be <= min\(top_p\) = 0\.5 \(got 0\.75", args)


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1])
def test_min_top_p_outside_0_1(bad):
    expect(ValueError, lit(f"min_top_p must be in (0, 1] (got {bad})"), base_args(min_top_p=bad))


def test_min_top_p_consistent_values_are_accepted():
    top_p = torch.tensor([1.0, 0.5, 0.9, 1.0])
    for min_top_p in (0.5, 0.25, torch.tensor(0.5), None):
        call(base_args(top_p=top_p, min_top_p=min_top_p))


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (
            dict(relaxed_topk=3),
            r"relaxed_topk and relaxed_delta must be given together .*\(got relaxed_topk=3, relaxed_delta=None\)",
        ),
        (
            dict(relaxed_delta=0.1),
            r"relaxed_topk and relaxed_delta must be given together .*\(got relaxed_topk=None, relaxed_delta=0\.1\)",
        ),
        (
            dict(in_thinking_phase=torch.ones(B, dtype=torch.bool)),
            lit("in_thinking_phase needs relaxed_topk and relaxed_delta (got neither)"),
        ),
        (
            dict(in_thinking_phase=torch.ones(B, dtype=torch.bool), relaxed_topk=3),
            r"relaxed_topk and relaxed_delta must be given together",
        ),
    ],
    ids=["topk-only", "delta-only", "phase-only", "phase-and-topk"],
)
def test_relaxed_arguments_incomplete(overrides, pattern):
    expect(ValueError, pattern, base_args(**overrides))


def test_relaxed_with_sampled_drafts():
    args = sampled_args(in_thinking_phase=torch.ones(B, dtype=torch.bool), relaxed_topk=3, relaxed_delta=0.1)
    expect(
        ValueError, lit('relaxed_topk/relaxed_delta need draft_proposal="argmax" (got draft_proposal="sampled")'), args
    )


@pytest.mark.parametrize(
    "overrides, exc, pattern",
    [
        (dict(relaxed_topk=0), ValueError, lit("relaxed_topk must be >= 1 (got 0)")),
        (dict(relaxed_topk=2.5), TypeError, lit("relaxed_topk must be an int (got float)")),
        (dict(relaxed_delta=-0.1), ValueError, lit("relaxed_delta must be a float >= 0 (got -0.1)")),
        (dict(relaxed_delta=float("nan")), ValueError, lit("relaxed_delta must be a float >= 0 (got nan)")),
        (dict(relaxed_delta="0.1"), TypeError, lit("relaxed_delta must be a float (got str)")),
    ],
    ids=["topk-0", "topk-float", "delta-neg", "delta-nan", "delta-str"],
)
def test_relaxed_argument_values(overrides, exc, pattern):
    expect(exc, pattern, relaxed_args(**overrides))


def test_relaxed_topk_above_V_is_valid():
    call(relaxed_args(relaxed_topk=10 * V))


@pytest.mark.parametrize("bad", ["greedy", "Argmax", None, 1])
def test_unknown_draft_proposal(bad):
    expect(
        ValueError, lit(f'draft_proposal must be "argmax" or "sampled" (got {bad!r})'), base_args(draft_proposal=bad)
    )


def test_sampled_without_draft_probs_full():
    expect(
        ValueError,
        lit('draft_probs_full is required when draft_proposal="sampled" (got None)'),
        base_args(draft_proposal="sampled"),
    )


def test_draft_probs_full_with_argmax():
    expect(
        ValueError,
        lit('draft_probs_full must be None when draft_proposal="argmax" (got a tensor)'),
        base_args(draft_probs_full=draft_probs()),
    )


@pytest.fixture(params=["on the host", "by torch ops"])
def probs_judged(request, monkeypatch):
    """draft_probs_full's sums and minima judged on the host (B * K pairs are few here) and by torch ops
    (checks.HOST_PAIRS 0): the same errors either way."""
    if request.param == "by torch ops":
        monkeypatch.setattr(checks, "HOST_PAIRS", 0)


def test_draft_probs_full_negative(probs_judged):
    probs = draft_probs()
    probs[1, 2, 3] -= 0.5
    probs[1, 2, 4] += 0.5  # the row still sums to 1: only the sign is wrong
    expect(
        ValueError,
        r"draft_probs_full must be >= 0 \(got -0\.\d+ at row 1, position 2",
        sampled_args(draft_probs_full=probs),
    )

    probs[1, 2, 3] = -0.5
    probs[1, 2, 4] += 0.5 + float(draft_probs()[1, 2, 3])
    expect(ValueError, r"draft_probs_full must be >= 0 .*-0\.5", sampled_args(draft_probs_full=probs))


@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("inf"), "inf")])
def test_draft_probs_full_not_finite(bad, shown, probs_judged):
    probs = with_value(draft_probs(), (2, 0, 7), bad)
    expect(ValueError, rf"draft_probs_full must be finite \(got {shown}", sampled_args(draft_probs_full=probs))


@pytest.mark.parametrize("scale, shown", [(1.1, "1.1"), (0.9, "0.9"), (0.5, "0.5")])
def test_draft_probs_full_rows_not_summing_to_one(scale, shown, probs_judged):
    probs = draft_probs()
    probs[3, 1] *= scale
    expect(
        ValueError,
        rf"draft_probs_full rows must sum to 1 \(within 1e-3\) or be all zero \(got a sum of {shown}",
        sampled_args(draft_probs_full=probs),
    )


def test_draft_probs_full_all_zero_rows_and_small_errors_are_allowed(probs_judged):
    probs = draft_probs()
    probs[0, 1] = 0.0
    probs[2] = 0.0
    probs[3, 0] *= 1 + 5e-4  # within the 1e-3 tolerance
    call(sampled_args(draft_probs_full=probs))


def test_bitmask_position_that_allows_nothing():
    allowed = torch.ones(B, K + 1, V, dtype=torch.bool)
    allowed[2, K] = False  # the bonus position of row 2
    expect(
        ValueError,
        rf"token_bitmasks must leave at least one token with a finite logit \(got none at row 2, position {K}\)",
        base_args(token_bitmasks=sv.pack_bitmask(allowed)),
    )


def test_bitmask_that_allows_only_minus_inf_tokens():
    logits = base_args()["target_logits"].clone()
    logits[1 * (K + 1) + 0, :10] = float("-inf")
    allowed = torch.ones(B, K + 1, V, dtype=torch.bool)
    allowed[1, 0, 10:] = False
    expect(
        ValueError,
        r"token_bitmasks must leave at least one token with a finite logit \(got none at row 1, position 0\)",
        base_args(target_logits=logits, token_bitmasks=sv.pack_bitmask(allowed)),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for a second device")
@pytest.mark.parametrize(
    "name",
    [
        "draft_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "in_thinking_phase",
        "token_bitmasks",
        "draft_probs_full",
    ],
)
def test_tensors_on_different_devices(name):
    args = relaxed_args(min_p=torch.zeros(B), token_bitmasks=torch.full((B, K + 1, WORDS), -1, dtype=torch.int32))
    if name == "draft_probs_full":
        args = sampled_args(min_p=torch.zeros(B))
    args = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    args[name] = args[name].cpu()
    expect(ValueError, rf"{name} must be on the same device as .*\(got cpu\)", args)


# ---------------------------------------------------------------------------------------------------------
# The other public functions


def trunc_args(**overrides) -> dict:
    g = _generator(3)
    n = 5
    args = dict(
        logits=torch.randn(n, V, generator=g),
        temperature=torch.ones(n),
        top_k=torch.full((n,), -1),
        top_p=torch.ones(n),
    )
    args.update(overrides)
    return args


@pytest.mark.parametrize("function", ["truncated_probs", "sample"])
@pytest.mark.parametrize(
    "overrides, exc, pattern",
    [
        (
            dict(logits=torch.zeros(5, V, dtype=torch.int64)),
            TypeError,
            r"logits must be a float32, float16 or bfloat16 tensor \[N, V\] \(got dtype torch\.int64\)",
        ),
        (
            dict(logits=torch.zeros(5, 2, V)),
            ValueError,
            lit("logits must have shape [N, V] with V >= 1 (got [5, 2, 40])"),
        ),
        (dict(logits=torch.zeros(5, 0)), ValueError, lit("logits must have shape [N, V] with V >= 1 (got [5, 0])")),
        (dict(temperature=torch.ones(6)), ValueError, lit("temperature must have shape [N] = [5] (got [6])")),
        (
            dict(top_k=torch.ones(5)),
            TypeError,
            lit("top_k must be an int tensor of shape [N] (got dtype torch.float32)"),
        ),
        (
            dict(top_p=torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])),
            ValueError,
            lit("top_p must be in (0, 1] (got 0.0 at row 2)"),
        ),
        (
            dict(temperature=torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0])),
            ValueError,
            lit("temperature must be finite and >= 0 (got -1.0 at row 1)"),
        ),
        (
            dict(top_k=torch.tensor([1, 1, 1, 1, -3])),
            ValueError,
            lit("top_k must be >= -1 (0 or -1 means no limit) (got -3 at row 4)"),
        ),
        (
            dict(min_p=torch.tensor([0.0, 0.0, 0.0, 2.0, 0.0])),
            ValueError,
            lit("min_p must be in [0, 1] (got 2.0 at row 3)"),
        ),
        (
            dict(token_bitmask=torch.full((5, WORDS), -1, dtype=torch.int64)),
            TypeError,
            r"token_bitmask must be an int32 tensor.*\(got dtype torch\.int64\)",
        ),
        (
            dict(token_bitmask=torch.full((5, 1), -1, dtype=torch.int32)),
            ValueError,
            lit("token_bitmask must have shape [N, ceil(V/32)] = [5, 2] (got [5, 1])"),
        ),
        (
            dict(token_bitmask=with_value(torch.full((5, WORDS), -1, dtype=torch.int32), 3, 0)),
            ValueError,
            r"token_bitmask must leave at least one token with a finite logit \(got none at row 3\)",
        ),
    ],
    ids=[
        "logits-int",
        "logits-3d",
        "V=0",
        "temperature-shape",
        "top_k-float",
        "top_p-0",
        "temperature-neg",
        "top_k-3",
        "min_p-2",
        "bitmask-int64",
        "bitmask-shape",
        "bitmask-empty",
    ],
)
def test_truncated_probs_and_sample_errors(function, overrides, exc, pattern):
    args = trunc_args(**overrides)
    if function == "sample":
        args["seed"] = 0
    with pytest.raises(exc, match=pattern):
        getattr(sv, function)(**args)


@pytest.mark.parametrize("function", ["truncated_probs", "sample"])
def test_truncated_probs_and_sample_nan_logits(function):
    args = trunc_args(logits=with_value(trunc_args()["logits"], (4, 9), float("nan")))
    if function == "sample":
        args["seed"] = 0
    with pytest.raises(ValueError, match=r"logits must not hold NaN or \+inf \(got nan at row 4, .*token 9\)"):
        getattr(sv, function)(**args)


@pytest.mark.parametrize(
    "seed, exc, pattern",
    [
        (0.5, TypeError, lit("seed must be an int or an integer tensor (got float)")),
        (torch.zeros(4, dtype=torch.int64), ValueError, lit("a tensor of shape [N] = [5] (got shape [4])")),
        (torch.zeros(5), TypeError, lit("seed must be an int or an integer tensor (got dtype torch.float32)")),
    ],
)
def test_sample_seed_errors(seed, exc, pattern):
    with pytest.raises(exc, match=pattern):
        sv.sample(**trunc_args(), seed=seed)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (
            dict(use_stochastic=True, draft_proposal="sampled", relaxed_topk=3, relaxed_delta=0.1),
            ValueError,
            lit('relaxed_topk/relaxed_delta need draft_proposal="argmax" (got "sampled")'),
        ),
        (
            dict(use_stochastic=True, relaxed_topk=3),
            ValueError,
            r"relaxed_topk and relaxed_delta must be given together .*relaxed_delta=None",
        ),
        (
            dict(use_stochastic=True, relaxed_delta=0.1),
            ValueError,
            r"relaxed_topk and relaxed_delta must be given together .*relaxed_topk=None",
        ),
        (dict(draft_proposal="tree"), ValueError, lit('draft_proposal must be "argmax" or "sampled" (got \'tree\')')),
        (dict(num_draft_steps=0), ValueError, lit("num_draft_steps must be >= 1 (got 0)")),
        (dict(num_draft_steps=2.0), TypeError, lit("num_draft_steps must be an int (got float)")),
        (dict(relaxed_topk=0, relaxed_delta=0.1), ValueError, lit("relaxed_topk must be >= 1 (got 0)")),
        (dict(relaxed_topk=3, relaxed_delta=-1.0), ValueError, lit("relaxed_delta must be a float >= 0 (got -1.0)")),
        (dict(vocab_size=0), ValueError, lit("vocab_size must be >= 1 (got 0)")),
        (dict(synthetic_acceptance_rate="high"), TypeError, r"\(got str\)"),
    ],
    ids=[
        "relaxed-sampled",
        "topk-only",
        "delta-only",
        "proposal",
        "steps-0",
        "steps-float",
        "topk-0",
        "delta-neg",
        "vocab-0",
        "rate-str",
    ],
)
def test_acceptance_sampler_construction_errors(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        sv.AcceptanceSampler(**kwargs)


def test_acceptance_sampler_bad_synthetic_rate_raises_at_construction():
    with pytest.raises(ValueError, match=r"must be in \[0, 1\] \(got 1\.5\)"):
        sv.AcceptanceSampler(synthetic_acceptance_rate=1.5, num_draft_steps=3)


@pytest.mark.parametrize(
    "overrides, exc, pattern",
    [
        (dict(base_acceptance_rate=1.5), ValueError, lit("base_acceptance_rate must be in [0, 1] (got 1.5)")),
        (dict(base_acceptance_rate=float("nan")), ValueError, lit("base_acceptance_rate must be in [0, 1] (got nan)")),
        (dict(base_acceptance_rate="x"), TypeError, lit("base_acceptance_rate must be a float (got str)")),
        (
            dict(num_draft_steps=K + 1),
            ValueError,
            lit("num_draft_steps must equal K = draft_tokens.shape[1] (got 4 for shape [4, 3])"),
        ),
        (dict(num_draft_steps=-1), ValueError, lit("num_draft_steps must be >= 0 (got -1)")),
        (
            dict(draft_tokens=torch.zeros(B, K)),
            TypeError,
            r"draft_tokens must be an int32 or int64 tensor.*\(got dtype torch\.float32\)",
        ),
        (dict(top_q=0.5), TypeError, r"synthetic_acceptance_sampler got unknown sampling arguments \['top_q'\]"),
        (dict(top_p=torch.tensor([1.0, 2.0, 1.0, 1.0])), ValueError, lit("top_p must be in (0, 1] (got 2.0 at row 1)")),
        (dict(seed=0.5), TypeError, lit("seed must be an int or an integer tensor (got float)")),
        (
            dict(draft_tokens=torch.tensor([[0, 1, 2], [3, V, 4], [0, 0, 0], [1, 1, 1]])),
            ValueError,
            lit(f"draft_tokens must be in [-1, {V}) (got {V} at row 1, position 1)"),
        ),
        (
            dict(draft_tokens=torch.tensor([[0, 1, 2], [3, -2, 4], [0, 0, 0], [1, 1, 1]])),
            ValueError,
            lit(f"draft_tokens must be in [-1, {V}) (got -2 at row 1, position 1)"),
        ),
    ],
    ids=[
        "rate-1.5",
        "rate-nan",
        "rate-str",
        "steps-K+1",
        "steps-neg",
        "draft-float",
        "unknown-kw",
        "top_p",
        "seed",
        "draft-id-V",
        "draft-id-below-pad",
    ],
)
def test_synthetic_acceptance_sampler_errors(overrides, exc, pattern):
    args = dict(
        draft_tokens=base_args()["draft_tokens"],
        target_logits=base_args()["target_logits"],
        base_acceptance_rate=0.5,
        num_draft_steps=K,
        seed=0,
    )
    args.update(overrides)
    with pytest.raises(exc, match=pattern):
        sv.synthetic_acceptance_sampler(**args)


@pytest.mark.parametrize(
    "p_avg, n, exc, pattern",
    [
        (1.5, 3, ValueError, lit("p_avg must be in [0, 1] (got 1.5)")),
        (-0.1, 3, ValueError, lit("p_avg must be in [0, 1] (got -0.1)")),
        (float("nan"), 3, ValueError, lit("p_avg must be in [0, 1] (got nan)")),
        (0.5, 0, ValueError, lit("n must be >= 1 (got 0)")),
        (0.5, 2.0, TypeError, lit("n must be an int (got float)")),
        ("0.5", 2, TypeError, lit("p_avg must be a float (got str)")),
    ],
)
def test_compute_synthetic_acceptance_base_rate_errors(p_avg, n, exc, pattern):
    with pytest.raises(exc, match=pattern):
        sv.compute_synthetic_acceptance_base_rate(p_avg, n)


def _outputs(batch: int = B, positions: int = K):
    return (
        torch.zeros(batch, dtype=torch.int64),
        torch.zeros(batch, positions, dtype=torch.int64),
        torch.zeros(batch, 1, dtype=torch.int64),
    )


@pytest.mark.parametrize(
    "index, value, exc, pattern",
    [
        (0, torch.zeros(B), TypeError, r"first_rejected_idx must be an integer tensor \[B\]"),
        (1, torch.zeros(B, K), TypeError, r"recovered_tokens must be an integer tensor \[B"),
        (2, [[0]] * B, TypeError, r"bonus_tokens must be an integer tensor \[B"),
        (
            0,
            torch.zeros(B + 1, dtype=torch.int64),
            ValueError,
            lit("first_rejected_idx must be [B] and bonus_tokens [B, 1] with B = 4 (got [5] and [4, 1])"),
        ),
        (2, torch.zeros(B, 2, dtype=torch.int64), ValueError, lit("with B = 4 (got [4] and [4, 2])")),
    ],
    ids=["f-float", "recovered-float", "bonus-list", "f-shape", "bonus-shape"],
)
def test_committed_tokens_errors(index, value, exc, pattern):
    args = list(_outputs())
    args[index] = value
    with pytest.raises(exc, match=pattern):
        sv.committed_tokens(*args)

    args[0] = torch.zeros(B, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"first_rejected_idx.*\[4, 1\]"):
        sv.committed_tokens(*args)


@pytest.mark.parametrize(
    "call_, exc, pattern",
    [
        (
            lambda: sv.pack_bitmask(torch.ones(3, V, dtype=torch.int32)),
            TypeError,
            lit("allowed must be a bool tensor (got torch.int32)"),
        ),
        (lambda: sv.pack_bitmask([True] * V), TypeError, lit("allowed must be a bool tensor (got list)")),
        (
            lambda: sv.pack_bitmask(torch.tensor(True)),
            ValueError,
            lit("allowed must have a vocabulary dimension (got a 0-d tensor)"),
        ),
        (
            lambda: sv.unpack_bitmask(torch.zeros(3, WORDS, dtype=torch.int64), V),
            TypeError,
            lit("bitmask must be an int32 tensor (got torch.int64)"),
        ),
        (
            lambda: sv.unpack_bitmask(torch.zeros(3, WORDS + 1, dtype=torch.int32), V),
            ValueError,
            lit("bitmask must have ceil(vocab_size/32) = 2 words in its last dim (got shape (3, 3))"),
        ),
        (
            lambda: sv.unpack_bitmask(torch.tensor(0, dtype=torch.int32), 1),
            ValueError,
            r"bitmask must have ceil\(vocab_size/32\) = 1 words .*\(got shape \(\)\)",
        ),
        (
            lambda: sv.unpack_bitmask(torch.zeros(3, WORDS, dtype=torch.int32), -1),
            ValueError,
            lit("vocab_size must be an int >= 0 (got -1)"),
        ),
    ],
    ids=["pack-int", "pack-list", "pack-0d", "unpack-int64", "unpack-words", "unpack-0d", "unpack-negative-V"],
)
def test_bitmask_errors(call_, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call_()


@pytest.mark.parametrize(
    "keys, stream, exc, pattern",
    [
        ([1, 2, 3], 0, TypeError, lit("keys must be an integer torch.Tensor (got list)")),
        (torch.zeros(3), 0, TypeError, lit("keys must be an integer tensor (got dtype torch.float32)")),
        (torch.zeros(3, dtype=torch.bool), 0, TypeError, lit("keys must be an integer tensor (got dtype torch.bool)")),
        (torch.zeros(3, dtype=torch.int64), -1, ValueError, lit("stream must be an int >= 0 (got -1)")),
    ],
    ids=["list", "float", "bool", "stream-neg"],
)
def test_keyed_uniform_errors(keys, stream, exc, pattern):
    with pytest.raises(exc, match=pattern):
        sv.keyed_uniform(keys, stream)


# ---------------------------------------------------------------------------------------------------------
# Nothing is written to


def rich_sampled_args() -> dict:
    g = _generator(11)
    allowed = torch.rand(B, K + 1, V, generator=g) < 0.6
    allowed[..., 0] = True
    probs = draft_probs(12)
    probs[1, 0] = 0.0
    draft = torch.randint(0, V, (B, K), generator=g, dtype=torch.int32)
    draft[2, 1:] = -1
    return base_args(
        draft_tokens=draft,
        target_logits=torch.randn(B, K + 1, V, generator=g).to(torch.bfloat16),
        temperature=torch.tensor([1.0, 0.0, 0.7, 1.3]),
        top_k=torch.tensor([5, -1, 0, 12]),
        top_p=torch.tensor([0.9, 1.0, 0.8, 1.0]),
        seed=torch.tensor([3, -1, 2**62, 17]),
        token_bitmasks=sv.pack_bitmask(allowed),
        draft_proposal="sampled",
        draft_probs_full=probs,
        min_p=torch.tensor([0.05, 0.0, 0.1, 0.0]),
        vocab_size=V,
    )


def rich_relaxed_args() -> dict:
    args = rich_sampled_args()
    del args["draft_probs_full"]
    return {
        **args,
        "draft_proposal": "argmax",
        "in_thinking_phase": torch.tensor([True, True, False, True]),
        "relaxed_topk": 4,
        "relaxed_delta": 0.3,
        "max_k": torch.tensor(-1),
        "min_top_p": torch.tensor(0.8),
    }


def _snapshot(args: dict) -> dict:
    return {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns, so that NaN compares equal to itself."""
    return tensor.view(_SAME_SIZE_INT[tensor.element_size()])


def _assert_untouched(args: dict, snapshot: dict) -> None:
    for name, before in snapshot.items():
        after = args[name]
        assert after.dtype == before.dtype and after.shape == before.shape, name
        assert torch.equal(_bits(after), _bits(before)), name


@pytest.mark.parametrize("make", [rich_sampled_args, rich_relaxed_args], ids=["sampled", "relaxed"])
def test_valid_call_does_not_modify_inputs(make):
    args = make()
    snapshot = _snapshot(args)
    assert len(snapshot) >= 9
    call(args)
    _assert_untouched(args, snapshot)


@pytest.mark.parametrize(
    "make, name, index, value",
    [
        (rich_sampled_args, "top_p", 3, 1.5),
        (rich_sampled_args, "draft_probs_full", (0, 0, 0), -1.0),
        (rich_sampled_args, "target_logits", (3, 2, 1), float("nan")),
        (rich_relaxed_args, "draft_tokens", (0, 0), V),
        (rich_relaxed_args, "token_bitmasks", (1, 1), 0),
    ],
)
def test_failing_call_does_not_modify_inputs(make, name, index, value):
    args = make()
    args[name] = with_value(args[name], index, value)
    snapshot = _snapshot(args)
    with pytest.raises(ValueError):
        call(args)
    _assert_untouched(args, snapshot)


# ---------------------------------------------------------------------------------------------------------
# validate=False


def _equal_outputs(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize(
    "make",
    [
        rich_sampled_args,
        rich_relaxed_args,
        lambda: base_args(
            top_k=torch.tensor([3, 7, 1, 25]), max_k=25, top_p=torch.tensor([0.5, 0.95, 1.0, 0.7]), min_top_p=0.5
        ),
        lambda: base_args(
            top_k=torch.tensor([3, 7, 1, 25]), top_p=torch.tensor([0.5, 0.95, 1.0, 0.7])
        ),  # derived hints
        lambda: base_args(top_k=torch.tensor([3, 7, 0, 25]), max_k=torch.tensor(-1), min_top_p=torch.tensor(1.0)),
        lambda: base_args(temperature=torch.tensor([0.0, 1e-6, 1.0, 0.0])),
    ],
    ids=["sampled", "relaxed", "hints", "derived", "tensor-hints", "greedy"],
)
def test_validate_false_matches_validate_true(make):
    outputs = []
    for seed in range(5):
        args = make()
        args["seed"] = torch.arange(B) + 100 * seed
        checked = call({**args, "validate": True})
        unchecked = call({**args, "validate": False})
        assert _equal_outputs(checked, unchecked)
        outputs.append(checked)
    assert not all(_equal_outputs(outputs[0], o) for o in outputs[1:])  # not vacuous: the seeds matter


@pytest.mark.parametrize("make", [rich_sampled_args, rich_relaxed_args], ids=["sampled", "relaxed"])
def test_validate_false_reads_nothing_back_to_the_host(make):
    args = make()
    with forbid_host_reads():
        first, recovered, bonus = call({**args, "validate": False})
        with pytest.raises(AssertionError, match="read tensor data back"):  # the detector works
            call({**args, "validate": True})
    assert first.shape == (B,) and recovered.shape == (B, K) and bonus.shape == (B, 1)


def _garbage(mode: str) -> dict:
    g = _generator(21)
    logits = torch.randn(B, K + 1, V, generator=g)
    logits[0, 1, 3] = float("nan")
    logits[1, 2] = float("nan")  # a whole position of NaN
    logits[2, 0] = float("-inf")  # a position with nothing allowed
    logits[3, K] = float("inf")
    draft = torch.randint(0, V, (B, K), generator=g)
    draft[0, 0] = V + 5
    draft[1, 1] = -7
    draft[3, 2] = 10**9
    args = base_args(
        draft_tokens=draft,
        target_logits=logits,
        temperature=torch.tensor([1.0, 0.0, 0.5, 1.0]),
        top_k=torch.tensor([5, -1, 0, 3]),
        top_p=torch.tensor([0.9, 1.0, 1.0, 0.5]),
    )
    if mode == "sampled":
        probs = draft_probs(22)
        probs[2, 2, 4] = float("nan")
        args.update(draft_proposal="sampled", draft_probs_full=probs)
    elif mode == "relaxed":
        args.update(in_thinking_phase=torch.ones(B, dtype=torch.bool), relaxed_topk=2, relaxed_delta=0.2)
    elif mode == "bitmask":
        allowed = torch.rand(B, K + 1, V, generator=g) < 0.3
        allowed[1, 0] = False
        args.update(token_bitmasks=sv.pack_bitmask(allowed), min_p=torch.full((B,), 0.2))
    elif mode == "bad-params":  # values the checks would refuse
        args.update(
            temperature=torch.tensor([-1.0, float("nan"), float("inf"), 1.0]),
            top_k=torch.tensor([-5, 0, 2, 1]),
            top_p=torch.tensor([0.0, 2.0, float("nan"), -1.0]),
            min_p=torch.tensor([2.0, -1.0, float("nan"), 0.5]),
        )
    return args


@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed", "bitmask", "bad-params"])
def test_validate_false_garbage_still_gives_valid_ids(mode):
    args = _garbage(mode)
    with pytest.raises((ValueError, TypeError)):
        call(args)  # the checks would have refused it
    for seed in range(4):
        first, recovered, bonus = call({**args, "seed": torch.arange(B) + 10 * seed, "validate": False})
        assert first.dtype == recovered.dtype == bonus.dtype == torch.int64
        assert first.shape == (B,) and recovered.shape == (B, K) and bonus.shape == (B, 1)
        assert ((first >= 0) & (first <= K)).all(), first
        assert ((recovered >= 0) & (recovered < V)).all(), recovered
        assert ((bonus >= 0) & (bonus < V)).all(), bonus
