"""Property-based hardening of the verifier (hypothesis): random valid calls keep every SPEC §1 invariant,
random malformed calls raise a ValueError/TypeError that names the argument, and garbage values under
validate=False still give valid ids without reading anything back to the host.

Budgets: the examples are derandomized (the same examples every run, so CI is reproducible; no example
database is written) and sized so this file runs in about half a minute on two cores; the `slow` variants
run about ten times as many (about three minutes). `pytest --hypothesis-show-statistics` shows what kinds
of call were generated.

The properties run on the default CPU path (the compiled kernels, where a C compiler exists) and on the
torch path (the code a CUDA device runs), see tests/support/backends.py:torch_path.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import specverify as sv
from tests.support.backends import native_available, torch_path
from tests.support.invariants import (
    allowed_tokens,
    assert_untouched,
    check_output_invariants,
    forbid_host_reads,
    logits_3d,
    outputs_equal,
    row_param,
    snapshot,
)
from tests.support.oracle import GREEDY_TEMPERATURE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Seeds whose int64 bit patterns are extremes (0, the largest int64, all ones, the sign bit alone).
SEED_PATTERNS = (0, 1, 2**63 - 1, -1, -(2**63))


_SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FAST = settings(max_examples=60, **_SETTINGS)
FAST_INVALID = settings(max_examples=8, **_SETTINGS)  # per mutation (40 of them)
FAST_GARBAGE = settings(max_examples=40, **_SETTINGS)
FAST_TORCH_PATH = settings(max_examples=25, **_SETTINGS)
SLOW = settings(max_examples=400, **_SETTINGS)
SLOW_TORCH_PATH = settings(max_examples=150, **_SETTINGS)
SLOW_INVALID = settings(max_examples=60, **_SETTINGS)
SLOW_GARBAGE = settings(max_examples=400, **_SETTINGS)


def call(args: dict):
    return sv.stochastic_acceptance_sampler(**args)


# ---------------------------------------------------------------------------------------------------------
# Strategies


def _seed_pattern():
    return st.one_of(st.sampled_from(SEED_PATTERNS), st.integers(-(2**63), 2**63 - 1))


def _per_row(draw, values, batch: int, dtype: torch.dtype):
    """A [B] tensor of drawn values, or (sometimes) one Python number for every row."""
    if draw(st.integers(0, 3)) == 0:
        return draw(values)
    return torch.tensor(draw(st.lists(values, min_size=batch, max_size=batch)), dtype=dtype).reshape(batch)


def _make_logits(draw, g: torch.Generator, shape: tuple, dtype: torch.dtype, kinds) -> torch.Tensor:
    kind = draw(st.sampled_from(kinds))
    if kind == "normal":
        x = torch.randn(shape, generator=g) * 2
    elif kind == "wide":
        x = torch.randn(shape, generator=g) * 30
    elif kind == "ties":
        x = torch.randint(-2, 3, shape, generator=g).float()
    elif kind == "equal":
        x = torch.full(shape, 0.5)
    elif kind == "flat":
        x = torch.randn(shape, generator=g) * 1e-3
    elif kind == "huge":  # +-1e30 (fp16: +-65504, its largest finite value)
        top = 65504.0 if dtype == torch.float16 else 1e30
        x = torch.where(torch.rand(shape, generator=g) < 0.5, -top, top) * torch.rand(shape, generator=g).round()
        x = torch.where(x == 0, torch.randn(shape, generator=g), x)
    else:  # "sparse": -inf in most tokens, at least one finite per position
        x = torch.randn(shape, generator=g) * 2
        x = torch.where(torch.rand(shape, generator=g) < draw(st.sampled_from([0.5, 0.99, 1.0])), float("-inf"), x)
        if shape[-1]:
            keep = torch.randint(0, shape[-1], shape[:-1], generator=g)
            x.scatter_(-1, keep[..., None], torch.randn(*shape[:-1], 1, generator=g))
    return x.to(dtype)


def _make_bitmask(draw, g: torch.Generator, logits: torch.Tensor) -> torch.Tensor | None:
    """None, or packed masks: every token, a single token, or a random subset; always one finite logit allowed."""
    kind = draw(st.sampled_from([None, "all", "single", "random"]))
    if kind is None:
        return None
    shape, vocab = logits.shape, logits.shape[-1]
    finite = torch.isfinite(logits.float())
    # one allowed token with a finite logit per position, picked at random among the finite ones
    pick = (
        torch.multinomial(finite.reshape(-1, vocab).float() + 1e-30, 1, generator=g).view(*shape[:-1], 1)
        if finite.numel()
        else None
    )
    if kind == "all":
        allowed = torch.ones(shape, dtype=torch.bool)
    elif kind == "single":
        allowed = torch.zeros(shape, dtype=torch.bool)
    else:
        allowed = torch.rand(shape, generator=g) < draw(st.sampled_from([0.05, 0.5, 0.95]))
    if pick is not None:
        allowed.scatter_(-1, pick, True)
    packed = sv.pack_bitmask(allowed)
    if vocab % 32 and draw(st.booleans()):  # bits past V are set: they must be ignored
        packed[..., -1] |= -1 << (vocab % 32)
    return packed


def _draft_probs(draw, g, draft, logits, params) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, K, V] mixing, per position: a softmax, one-hot at the draft, all zero, disjoint from p~, or p~
    itself; then (sometimes) the drafts are resampled from q. Returns (q, draft)."""
    batch, positions = draft.shape
    vocab = logits.shape[-1]
    if batch * positions == 0:
        return torch.zeros(batch, positions, vocab), draft

    def flat(t):
        return None if t is None else t.repeat_interleave(positions)

    target = sv.truncated_probs(
        logits[:, :positions].reshape(-1, vocab).float(),
        flat(params["temperature"]),
        flat(params["top_k"]),
        flat(params["top_p"]),
        flat(params["min_p"]),
        None
        if params["token_bitmasks"] is None
        else params["token_bitmasks"][:, :positions].reshape(batch * positions, -1),
    ).view(batch, positions, vocab)
    softmax = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 3, -1)
    present = draft >= 0
    one_hot = torch.nn.functional.one_hot(torch.where(present, draft, 0), vocab).float()
    outside = (target == 0).float()
    disjoint = torch.where(
        outside.sum(-1, keepdim=True) > 0, outside / outside.sum(-1, keepdim=True).clamp(min=1), one_hot
    )
    choices = torch.stack([softmax, one_hot, torch.zeros_like(softmax), disjoint, target])
    weights = torch.tensor(
        draw(st.sampled_from([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1], [0, 1, 1, 0, 0]])),
        dtype=torch.float,
    )
    kind = torch.multinomial(weights, batch * positions, replacement=True, generator=g).view(batch, positions)
    q = choices.gather(0, kind[None, ..., None].expand(1, batch, positions, vocab))[0]
    if draw(st.booleans()):  # drafts sampled from q where q has mass (the setting of the guarantee)
        has_mass = q.sum(-1) > 0
        sampled = torch.multinomial(q.reshape(-1, vocab) + (~has_mass).reshape(-1, 1) * 1.0, 1, generator=g).view(
            batch, positions
        )
        draft = torch.where(present & has_mass, sampled, draft)
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    converted = q.to(dtype)
    total = converted.double().sum(-1)
    if (((total - 1).abs() <= 1e-3) | (total == 0)).all():
        q = converted
    return q, draft


@st.composite
def valid_calls(
    draw,
    max_elements: int = 200_000,
    modes=("argmax", "sampled", "relaxed"),
    max_vocab: int = 5000,
    min_batch: int = 0,
    min_positions: int = 0,
):
    """A valid call of stochastic_acceptance_sampler (a dict of its arguments)."""
    positions = draw(st.integers(min_positions, 8))
    small = [v for v in (1, 2, 31, 32, 33, 64, 65, 1024, 1025, 4097, 5000) if v <= max_vocab]
    vocab = draw(st.one_of(st.integers(1, min(64, max_vocab)), st.integers(1, max_vocab), st.sampled_from(small)))
    cap = max(1, min(64, max_elements // ((positions + 1) * vocab)))
    batch = draw(st.one_of(st.integers(min_batch, cap), st.sampled_from([min_batch, 1, cap])))
    dtype = draw(st.sampled_from(DTYPES))
    mode = draw(st.sampled_from(modes))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    logits = _make_logits(
        draw, g, (batch, positions + 1, vocab), dtype, ["normal", "wide", "ties", "equal", "flat", "huge", "sparse"]
    )
    bitmask = _make_bitmask(draw, g, logits)

    temperature = _per_row(
        draw,
        st.one_of(st.sampled_from([0.0, 1e-6, 1e-5, 0.3, 1.0, 2.0, 100.0]), st.floats(1e-5, 100.0)),
        batch,
        torch.float32,
    )
    top_k = _per_row(
        draw,
        st.one_of(st.sampled_from([-1, 0, 1, 2, vocab - 1, vocab, vocab + 1, 10 * vocab]), st.integers(1, vocab)),
        batch,
        torch.int64,
    )
    top_p = _per_row(
        draw,
        st.one_of(st.sampled_from([1e-6, 1e-3, 0.5, 0.9, 0.999999, 1.0]), st.floats(1e-6, 1.0)),
        batch,
        torch.float32,
    )
    min_p = None
    if draw(st.booleans()):
        min_p = _per_row(
            draw,
            st.one_of(st.sampled_from([0.0, 0.1, 0.5, 0.999, 0.999999, 1.0]), st.floats(0.0, 1.0)),
            batch,
            torch.float32,
        )

    # hints: absent, exact, loose (still consistent), or as 0-d tensors
    top_k_rows = row_param({"top_k": top_k}, "top_k", batch, torch.int64)
    exact_k = -1 if batch == 0 or bool((top_k_rows <= 0).any()) else int(top_k_rows.max())
    max_k = draw(st.sampled_from([None, exact_k, -1 if exact_k == -1 else exact_k + 3, torch.tensor(exact_k)]))
    top_p_rows = row_param({"top_p": top_p}, "top_p", batch, torch.float32)
    exact_p = float(top_p_rows.min()) if batch else 1.0
    min_top_p = draw(st.sampled_from([None, exact_p, exact_p / 2, torch.tensor(exact_p)]))

    seed_kind = draw(st.sampled_from(["int", "0-d", "[1]", "[B]", "[B] int32"]))
    if seed_kind == "int":
        seed = draw(st.one_of(_seed_pattern(), st.sampled_from([2**64 - 1, 2**63])))
    elif seed_kind == "0-d":
        seed = torch.tensor(draw(_seed_pattern()))
    elif seed_kind == "[1]":
        seed = torch.tensor([draw(_seed_pattern())])
    elif seed_kind == "[B]":
        seed = torch.tensor(draw(st.lists(_seed_pattern(), min_size=batch, max_size=batch)), dtype=torch.int64).reshape(
            batch
        )
    else:
        seed = torch.randint(-(2**31), 2**31 - 1, (batch,), generator=g, dtype=torch.int32)

    # drafts: random ids (masked ones included), or the argmax (mostly accepted); ragged padding, with junk
    # ids after a row's first -1 (the first -1 ends the draft)
    allowed = torch.isfinite(logits.float())
    if bitmask is not None:
        allowed &= sv.unpack_bitmask(bitmask, vocab)
    if draw(st.booleans()):
        draft = torch.randint(0, vocab, (batch, positions), generator=g)
    else:
        draft = torch.where(allowed, logits.float(), float("-inf"))[:, :positions].argmax(-1)
    if draw(st.booleans()) and positions:
        pad_from = torch.randint(0, positions + 1, (batch,), generator=g)
        index = torch.arange(positions)
        junk = torch.randint(-1, vocab, (batch, positions), generator=g)
        draft = torch.where(index == pad_from[:, None], -1, torch.where(index > pad_from[:, None], junk, draft))

    args = dict(
        draft_tokens=None,
        target_logits=logits if draw(st.booleans()) else logits.reshape(batch * (positions + 1), vocab),
        temperature=temperature,
        top_k=top_k,
        max_k=max_k,
        top_p=top_p,
        min_top_p=min_top_p,
        seed=seed,
    )
    if bitmask is not None:
        args["token_bitmasks"] = bitmask
    if min_p is not None:
        args["min_p"] = min_p
    if draw(st.booleans()):
        args["vocab_size"] = vocab
    if mode == "sampled":
        params = {
            name: row_param(args, name, batch, torch.int64 if name == "top_k" else torch.float32)
            for name in ("temperature", "top_k", "top_p", "min_p")
        }
        params["token_bitmasks"] = bitmask
        q, draft = _draft_probs(draw, g, draft, logits, params)
        args.update(draft_proposal="sampled", draft_probs_full=q)
    elif mode == "relaxed":
        phase = torch.rand(batch, generator=g) < 0.5
        args.update(
            in_thinking_phase=draw(st.sampled_from([phase, None])) if batch else phase,
            relaxed_topk=draw(st.sampled_from([1, 2, vocab, vocab + 7])),
            relaxed_delta=draw(st.sampled_from([0.0, 0.05, 0.5, 1.0])),
        )
    args["draft_tokens"] = draft.to(draw(st.sampled_from([torch.int64, torch.int32])))
    return args


# ---------------------------------------------------------------------------------------------------------
# Valid input: the invariants


def check_truncated_probs(args: dict) -> None:
    """p~ rows are distributions on allowed tokens that keep the most likely one; greedy rows are one-hot."""
    logits = logits_3d(args)
    batch, positions_1, vocab = logits.shape
    if batch == 0:
        return

    def flat(t):
        return None if t is None else t.repeat_interleave(positions_1)

    temperature = row_param(args, "temperature", batch, torch.float32)
    bitmask = args.get("token_bitmasks")
    probs = sv.truncated_probs(
        logits.reshape(-1, vocab),
        flat(temperature),
        flat(row_param(args, "top_k", batch, torch.int64)),
        flat(row_param(args, "top_p", batch, torch.float32)),
        flat(row_param(args, "min_p", batch, torch.float32)),
        None if bitmask is None else bitmask.reshape(batch * positions_1, -1),
    ).view(batch, positions_1, vocab)
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all() and (probs >= 0).all()
    assert torch.allclose(probs.double().sum(-1), torch.ones(batch, positions_1, dtype=torch.float64), atol=1e-5)
    allowed = allowed_tokens(args)
    assert (probs[~allowed] == 0).all(), "p~ gives mass to a masked token"
    top = torch.where(allowed, logits.float(), float("-inf")).argmax(-1, keepdim=True)
    assert (probs.gather(-1, top) > 0).all(), "the most likely token did not survive"
    greedy = (temperature < GREEDY_TEMPERATURE)[:, None].expand(batch, positions_1)
    assert (probs.gather(-1, top)[..., 0][greedy] == 1).all(), "a greedy row is not one-hot at the argmax"


def _describe(args: dict) -> None:
    """hypothesis events (shown by --hypothesis-show-statistics): what kinds of call were generated."""
    batch, positions = args["draft_tokens"].shape
    vocab = args["target_logits"].shape[-1]
    event(f"mode={args.get('draft_proposal', 'argmax')}{'+relaxed' if args.get('relaxed_topk') else ''}")
    event(f"dtype={args['target_logits'].dtype}")
    event(f"B={'0' if batch == 0 else '1-8' if batch <= 8 else '9-64'}")
    event(f"K={'0' if positions == 0 else '1-8'}")
    event(f"V={'1-64' if vocab <= 64 else '65-1024' if vocab <= 1024 else '1025-5000'}")
    event(f"bitmask={'yes' if args.get('token_bitmasks') is not None else 'no'}")


def check_valid_call(args: dict) -> None:
    _describe(args)
    before = snapshot(args)
    out = call(args)
    assert_untouched(args, before)
    check_output_invariants(args, out)
    assert outputs_equal(out, call(args)), "the same call twice is not bit-identical"
    logits = args["target_logits"]
    if logits.dtype != torch.float32:  # half precision gives the tokens of its float32 upcast
        assert outputs_equal(out, call({**args, "target_logits": logits.float()})), f"{logits.dtype} != float32 upcast"
    with forbid_host_reads():
        unchecked = call({**args, "validate": False})
    assert outputs_equal(out, unchecked), "validate=False changed the outputs of a valid call"
    check_truncated_probs(args)
    assert_untouched(args, before)


@FAST
@given(valid_calls())
def test_valid_calls_keep_every_invariant(args):
    check_valid_call(args)


@pytest.mark.slow
@SLOW
@given(valid_calls(max_elements=400_000))
def test_valid_calls_keep_every_invariant_many(args):
    check_valid_call(args)


@FAST_TORCH_PATH
@given(valid_calls(max_elements=20_000))
def test_valid_calls_keep_every_invariant_torch_path(args):
    """The same on the torch implementation (the code CUDA runs; on the CPU it stands in for the kernels)."""
    with torch_path():
        check_valid_call(args)


@pytest.mark.slow
@SLOW_TORCH_PATH
@given(valid_calls(max_elements=200_000))
def test_valid_calls_keep_every_invariant_torch_path_many(args):
    with torch_path():
        check_valid_call(args)


# ---------------------------------------------------------------------------------------------------------
# Invalid input: ValueError / TypeError naming the argument, inputs untouched


def _rows_tensor(args: dict, name: str, batch: int, dtype: torch.dtype) -> torch.Tensor:
    value = row_param(args, name, batch, dtype)
    return torch.zeros(batch, dtype=dtype) if value is None else value.clone()


#: Every mutation, and what it needs of the valid call it breaks: (B > 0, K > 0, mode) where mode is
#: "sampled", "not-sampled" or None (any).
MUTATIONS = {
    "draft_tokens.dtype": (False, False, None),
    "draft_tokens.shape": (False, False, None),
    "draft_tokens.value": (True, True, None),
    "target_logits.dtype": (False, False, None),
    "target_logits.shape": (False, False, None),
    "target_logits.nonfinite": (True, False, None),
    "target_logits.empty-position": (True, False, None),
    "temperature.type": (False, False, None),
    "temperature.shape": (False, False, None),
    "temperature.value": (True, False, None),
    "top_k.type": (False, False, None),
    "top_k.shape": (False, False, None),
    "top_k.value": (True, False, None),
    "top_p.type": (False, False, None),
    "top_p.shape": (False, False, None),
    "top_p.value": (True, False, None),
    "min_p.shape": (False, False, None),
    "min_p.value": (True, False, None),
    "seed.type": (False, False, None),
    "seed.shape": (False, False, None),
    "seed.range": (False, False, None),
    "max_k.value": (False, False, None),
    "max_k.type": (False, False, None),
    "max_k.inconsistent": (True, False, None),
    "min_top_p.value": (False, False, None),
    "min_top_p.type": (False, False, None),
    "min_top_p.inconsistent": (True, False, None),
    "vocab_size": (False, False, None),
    "token_bitmasks.type": (False, False, None),
    "token_bitmasks.shape": (False, False, None),
    "token_bitmasks.empty-position": (True, False, None),
    "draft_proposal": (False, False, None),
    "draft_probs_full.missing": (False, False, "sampled"),
    "draft_probs_full.unexpected": (False, False, "not-sampled"),
    "draft_probs_full.shape": (False, False, "sampled"),
    "draft_probs_full.value": (True, True, "sampled"),
    "relaxed.incomplete": (False, False, None),
    "relaxed.values": (False, False, None),
    "relaxed.sampled": (False, False, "not-sampled"),
    "in_thinking_phase": (False, False, None),
}


@st.composite
def invalid_calls(draw, mutation: str):
    """(args, names, mutation): a valid call with one argument broken by `mutation`, and the argument
    names its error may give."""
    needs_batch, needs_positions, mode = MUTATIONS[mutation]
    modes = {"sampled": ("sampled",), "not-sampled": ("argmax", "relaxed"), None: ("argmax", "sampled", "relaxed")}[
        mode
    ]
    args = draw(
        valid_calls(
            max_elements=20_000,
            max_vocab=300,
            modes=modes,
            min_batch=int(needs_batch),
            min_positions=int(needs_positions),
        )
    )
    batch, positions = args["draft_tokens"].shape
    logits = logits_3d(args)
    vocab = logits.shape[-1]
    name = mutation.split(".")[0]
    row = draw(st.integers(0, max(batch - 1, 0)))
    position = draw(st.integers(0, positions))
    names = {name}
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    if mutation == "draft_tokens.dtype":
        args[name] = args[name].to(draw(st.sampled_from([torch.float32, torch.int16, torch.uint8, torch.bool])))
    elif mutation == "draft_tokens.shape":
        args[name] = draw(st.sampled_from([args[name].reshape(-1), args[name][..., None], args[name].tolist()]))
    elif mutation == "draft_tokens.value":
        bad = draw(st.sampled_from([vocab, vocab + 1, 10**9, -2, -(2**40)]))
        args[name] = args[name].to(torch.int64).clone()
        args[name][row, min(position, positions - 1)] = bad
    elif mutation == "target_logits.dtype":
        args[name] = args[name].to(draw(st.sampled_from([torch.float64, torch.int32, torch.int64])))
    elif mutation == "target_logits.shape":
        shapes = [
            logits[:, :, :0],
            logits.reshape(-1),
            logits[None],
            logits.reshape(batch * (positions + 1), vocab)[1:] if batch else logits[:, :1, :0],
        ]
        if positions:
            shapes.append(logits[:, :positions])
        shapes.append(torch.cat([logits, logits[:1]]) if batch else logits.new_zeros(1, positions + 1, vocab))
        args[name] = draw(st.sampled_from(shapes))
    elif mutation == "target_logits.nonfinite":
        bad = draw(st.sampled_from([float("nan"), float("inf")]))
        new = logits.clone()
        new[row, position, draw(st.integers(0, vocab - 1))] = bad
        args[name] = new if args[name].dim() == 3 else new.reshape(-1, vocab)
    elif mutation == "target_logits.empty-position":
        new = logits.clone()
        new[row, position] = float("-inf")
        if args.get("token_bitmasks") is not None:  # the checks blame the mask when there is one
            names.add("token_bitmasks")
        args[name] = new if args[name].dim() == 3 else new.reshape(-1, vocab)
    elif mutation in ("temperature.type", "top_p.type", "top_k.type"):
        wrong = torch.int64 if name != "top_k" else draw(st.sampled_from([torch.float32, torch.bool]))
        args[name] = draw(
            st.sampled_from([torch.ones(batch, dtype=wrong), "1", [1.0] * batch, None if name != "top_k" else 2.0])
        )
    elif mutation in ("temperature.shape", "top_k.shape", "top_p.shape", "min_p.shape"):
        dtype = torch.int64 if name == "top_k" else torch.float32
        args[name] = draw(
            st.sampled_from(
                [
                    torch.ones(batch + 1, dtype=dtype),
                    torch.ones(batch, 1, dtype=dtype),
                    torch.ones(batch + 3, 2, dtype=dtype),
                ]
            )
        )
    elif mutation in ("temperature.value", "top_k.value", "top_p.value", "min_p.value"):
        bads = {
            "temperature": [-1e-3, -1.0, float("nan"), float("inf"), float("-inf")],
            "top_k": [-2, -1000, -(2**40)],
            "top_p": [0.0, -0.5, 1.0001, 2.0, float("nan"), float("inf")],
            "min_p": [-0.01, 1.5, float("nan"), float("-inf")],
        }[name]
        bad = draw(st.sampled_from(bads))
        if draw(st.booleans()):
            value = _rows_tensor(args, name, batch, torch.int64 if name == "top_k" else torch.float32)
            value[row] = bad
        else:
            value = bad  # a Python number for every row
        args[name] = value
        names |= {"max_k", "min_top_p"} & {k for k, v in args.items() if v is not None}  # a hint may be what breaks
    elif mutation == "seed.type":
        args[name] = draw(
            st.sampled_from(
                [
                    1.5,
                    True,
                    "7",
                    None,
                    torch.tensor(1.0),
                    torch.ones(batch, dtype=torch.float64),
                    torch.ones(batch, dtype=torch.bool),
                ]
            )
        )
    elif mutation == "seed.shape":
        args[name] = draw(
            st.sampled_from(
                [
                    torch.zeros(batch + 2, dtype=torch.int64),
                    torch.zeros(batch, 2, dtype=torch.int64),
                    torch.zeros(1, 1, dtype=torch.int64),
                ]
            )
        )
    elif mutation == "seed.range":
        args[name] = draw(st.sampled_from([2**64, -(2**63) - 1, 10**30]))
    elif mutation == "max_k.value":
        args[name] = draw(st.sampled_from([0, -2, -100]))
    elif mutation == "max_k.type":
        args[name] = draw(st.sampled_from([2.5, "3", torch.tensor([3]), [3]]))
    elif mutation == "max_k.inconsistent":
        top_k = _rows_tensor(args, "top_k", batch, torch.int64)
        top_k[row] = draw(st.sampled_from([0, -1]))
        args["top_k"] = top_k
        args[name] = draw(st.sampled_from([1, vocab, 10 * vocab]))
        names.add("top_k")
    elif mutation == "min_top_p.value":
        args[name] = draw(st.sampled_from([0.0, -0.5, 1.5, float("nan")]))
    elif mutation == "min_top_p.type":
        args[name] = draw(st.sampled_from(["0.5", [0.5], torch.ones(2)]))
    elif mutation == "min_top_p.inconsistent":
        top_p = _rows_tensor(args, "top_p", batch, torch.float32)
        top_p[row] = 0.25
        args["top_p"] = top_p
        args[name] = draw(st.sampled_from([0.5, 1.0, torch.tensor(0.75)]))
        names.add("top_p")
    elif mutation == "vocab_size":
        args[name] = draw(st.sampled_from([vocab + 1, vocab - 1 if vocab > 1 else 0, str(vocab), float(vocab), -1]))
    elif mutation == "token_bitmasks.type":
        mask = args.get(name, torch.full((batch, positions + 1, (vocab + 31) // 32), -1, dtype=torch.int32))
        args[name] = draw(st.sampled_from([mask.to(torch.int64), mask.bool(), mask.tolist()]))
    elif mutation == "token_bitmasks.shape":
        words = (vocab + 31) // 32
        args[name] = draw(
            st.sampled_from(
                [
                    torch.full((batch, positions + 1, words + 1), -1, dtype=torch.int32),
                    torch.full((batch, positions + 2, words), -1, dtype=torch.int32),
                    torch.full((batch * (positions + 1), words), -1, dtype=torch.int32),
                ]
            )
        )
    elif mutation == "token_bitmasks.empty-position":
        mask = args.get(name, torch.full((batch, positions + 1, (vocab + 31) // 32), -1, dtype=torch.int32)).clone()
        mask[row, position] = 0
        if vocab % 32 and draw(st.booleans()):
            mask[row, position, -1] = -1 << (vocab % 32)  # only bits past V are set: still nothing allowed
        args[name] = mask
        names.add("target_logits")
    elif mutation == "draft_proposal":
        args[name] = draw(st.sampled_from(["greedy", "ARGMAX", "", None, 1]))
        names.add("relaxed")
    elif mutation == "draft_probs_full.missing":
        del args[name]
    elif mutation == "draft_probs_full.unexpected":
        args[name] = torch.zeros(batch, positions, vocab)
    elif mutation == "draft_probs_full.shape":
        q = args[name]
        args[name] = draw(
            st.sampled_from(
                [
                    q[..., :-1] if vocab > 1 else q[..., :0],
                    q.reshape(batch * positions, vocab),
                    torch.zeros(batch, positions + 1, vocab),
                    q.to(torch.int64),
                ]
            )
        )
    elif mutation == "draft_probs_full.value":
        q = args[name].clone()
        j, v = min(position, positions - 1), draw(st.integers(0, vocab - 1))
        how = draw(st.sampled_from(["nan", "inf", "negative", "scaled"]))
        if how == "scaled":
            q[row, j] = torch.softmax(torch.randn(vocab, generator=g), -1).to(q.dtype) * draw(
                st.sampled_from([0.5, 1.01, 2.0, 1e6])
            )
        else:
            q[row, j, v] = {"nan": float("nan"), "inf": float("inf"), "negative": -0.25}[how]
        args[name] = q
    elif mutation == "relaxed.incomplete":
        for key in ("in_thinking_phase", "relaxed_topk", "relaxed_delta"):
            args.pop(key, None)
        which = draw(
            st.sampled_from(
                [("relaxed_topk",), ("relaxed_delta",), ("in_thinking_phase",), ("in_thinking_phase", "relaxed_topk")]
            )
        )
        full = dict(in_thinking_phase=torch.ones(batch, dtype=torch.bool), relaxed_topk=2, relaxed_delta=0.1)
        args.update({key: full[key] for key in which})
        names = {"relaxed", "in_thinking_phase"}
        if args.get("draft_proposal") == "sampled":
            names.add("draft_proposal")
    elif mutation == "relaxed.values":
        bad = draw(
            st.sampled_from(
                [
                    ("relaxed_topk", 0),
                    ("relaxed_topk", -3),
                    ("relaxed_topk", 2.5),
                    ("relaxed_delta", -0.1),
                    ("relaxed_delta", float("nan")),
                    ("relaxed_delta", "0.1"),
                ]
            )
        )
        args.update(in_thinking_phase=torch.ones(batch, dtype=torch.bool), relaxed_topk=2, relaxed_delta=0.1)
        args[bad[0]] = bad[1]
        if args.get("draft_proposal") == "sampled":
            names = {"relaxed", "draft_proposal"}
        else:
            names = {bad[0]}
    elif mutation == "relaxed.sampled":
        args.update(
            in_thinking_phase=torch.ones(batch, dtype=torch.bool),
            relaxed_topk=2,
            relaxed_delta=0.1,
            draft_proposal="sampled",
            draft_probs_full=torch.zeros(batch, positions, vocab),
        )
        names = {"relaxed", "draft_proposal"}
    elif mutation == "in_thinking_phase":
        args.update(relaxed_topk=2, relaxed_delta=0.1)
        args[name] = draw(
            st.sampled_from(
                [torch.ones(batch, dtype=torch.int64), torch.ones(batch + 1, dtype=torch.bool), [True] * batch]
            )
        )
        if args.get("draft_proposal") == "sampled":
            names = {"relaxed", "draft_proposal", name}
    else:  # pragma: no cover
        raise AssertionError(mutation)
    return args, names, mutation


def check_invalid_call(case) -> None:
    args, names, mutation = case
    event(mutation)
    before = snapshot(args)
    try:
        call(args)
    except (ValueError, TypeError) as error:
        message = str(error)
        assert type(error) in (ValueError, TypeError), f"{mutation}: {type(error).__name__}: {message}"
        assert any(name in message for name in names), (
            f"{mutation}: the message does not name {sorted(names)}: {message}"
        )
        assert "(got" in message, f"{mutation}: the message does not say what it got: {message}"
    else:
        raise AssertionError(f"{mutation}: the malformed call was accepted")
    assert_untouched(args, before)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@FAST_INVALID
@given(data=st.data())
def test_malformed_calls_raise_naming_the_argument(mutation, data):
    check_invalid_call(data.draw(invalid_calls(mutation)))


@pytest.mark.slow
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@SLOW_INVALID
@given(data=st.data())
def test_malformed_calls_raise_naming_the_argument_many(mutation, data):
    check_invalid_call(data.draw(invalid_calls(mutation)))


# ---------------------------------------------------------------------------------------------------------
# validate=False on garbage values: no host read, no exception, valid ids (SPEC §6)


@st.composite
def garbage_calls(draw):
    """A call whose values validation would refuse (shapes and dtypes stay right)."""
    nonfinite = draw(st.booleans())
    args = draw(valid_calls(max_elements=50_000, max_vocab=3000))
    batch, positions = args["draft_tokens"].shape
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    logits = logits_3d(args).clone()
    vocab = logits.shape[-1]

    def spots(shape, p):
        return torch.rand(shape, generator=g) < p

    draft = args["draft_tokens"].to(torch.int64)
    junk = torch.randint(-(2**40), 2**40, draft.shape, generator=g)
    args["draft_tokens"] = torch.where(spots(draft.shape, 0.3), junk, draft)
    logits = torch.where(spots(logits.shape, 0.05), float("-inf"), logits)
    logits[spots(logits.shape[:2], 0.2)] = float("-inf")  # whole positions with nothing allowed
    if nonfinite:
        logits = torch.where(spots(logits.shape, 0.02), float("nan"), logits)
        logits = torch.where(spots(logits.shape, 0.02), float("inf"), logits)
    args["target_logits"] = logits if args["target_logits"].dim() == 3 else logits.reshape(-1, vocab)
    bad = {
        "temperature": [-1.0, 0.0, 1e-30, 1e30] + ([float("nan"), float("inf")] if nonfinite else []),
        "top_k": [-2, -(2**40), 2**40, 0],
        "top_p": [0.0, -1.0, 2.0, float("nan"), float("inf"), 1e-30],
        "min_p": [-1.0, 2.0, float("nan"), float("inf")],
    }
    for name, values in bad.items():
        if draw(st.booleans()):
            dtype = torch.int64 if name == "top_k" else torch.float32
            value = _rows_tensor(args, name, batch, dtype)
            choice = torch.tensor(values, dtype=dtype)[torch.randint(0, len(values), (batch,), generator=g)]
            args[name] = torch.where(spots((batch,), 0.5), choice, value)
    if args.get("token_bitmasks") is not None:
        mask = args["token_bitmasks"].clone()
        mask[spots(mask.shape[:2], 0.2)] = 0
        args["token_bitmasks"] = mask
    if args.get("draft_proposal") == "sampled" and args["draft_probs_full"].numel():
        q = args["draft_probs_full"].float()
        q = torch.where(
            spots(q.shape, 0.05),
            torch.tensor([float("nan"), -1.0, 5.0, float("inf")])[torch.randint(0, 4, q.shape, generator=g)],
            q,
        )
        args["draft_probs_full"] = q
    # the hints may now be inconsistent as well
    args["max_k"] = draw(st.sampled_from([None, -1, 1, 3, 10**6]))
    args["min_top_p"] = draw(st.sampled_from([None, 1.0, 0.5, 1e-9]))
    return args


def check_garbage_call(args: dict) -> None:
    batch, positions = args["draft_tokens"].shape
    vocab = logits_3d(args).shape[-1]
    before = snapshot(args)
    with forbid_host_reads():
        first, recovered, bonus = call({**args, "validate": False})
    assert_untouched(args, before)
    assert first.shape == (batch,) and recovered.shape == (batch, positions) and bonus.shape == (batch, 1)
    assert first.dtype == recovered.dtype == bonus.dtype == torch.int64
    assert ((first >= 0) & (first <= positions)).all(), first
    assert ((recovered >= 0) & (recovered < vocab)).all(), recovered
    assert ((bonus >= 0) & (bonus < vocab)).all(), bonus


@FAST_GARBAGE
@given(garbage_calls())
def test_validate_false_garbage_gives_valid_ids(args):
    check_garbage_call(args)


@pytest.mark.slow
@SLOW_GARBAGE
@given(garbage_calls())
def test_validate_false_garbage_gives_valid_ids_many(args):
    check_garbage_call(args)


@FAST_GARBAGE
@given(garbage_calls())
def test_validate_false_garbage_gives_valid_ids_torch_path(args):
    with torch_path():
        check_garbage_call(args)


@pytest.mark.slow
@SLOW_GARBAGE
@given(garbage_calls())
def test_validate_false_garbage_gives_valid_ids_torch_path_many(args):
    with torch_path():
        check_garbage_call(args)


# ---------------------------------------------------------------------------------------------------------
# Bugs this file found, kept as minimal regression tests


def _radix_case(**overrides) -> dict:
    batch, positions, vocab = 1, 1, 65  # V > 64: the torch path finds thresholds by radix selection
    args = dict(
        draft_tokens=torch.zeros(batch, positions, dtype=torch.int64),
        target_logits=torch.zeros(batch, positions + 1, vocab),
        temperature=torch.ones(batch),
        top_k=torch.full((batch,), -1),
        max_k=None,
        top_p=torch.ones(batch),
        min_top_p=None,
        seed=0,
        validate=False,
    )
    args.update(overrides)
    return args


def _nonfinite_case(case: str) -> dict:
    logits = torch.zeros(1, 2, 65)
    overrides = {}
    if case == "nan-logit":
        logits[0, 0, 3] = float("nan")
    elif case == "inf-logit":
        logits[0, 0, 3] = float("inf")
    elif case == "nan-temperature":
        overrides["temperature"] = torch.tensor([float("nan")])
    else:
        logits[0, 0, 3] = float("-inf")
        overrides["temperature"] = torch.tensor([float("inf")])
    return _radix_case(target_logits=logits, **overrides)


NONFINITE_CASES = ["nan-logit", "inf-logit", "nan-temperature", "inf-temperature-with-minus-inf"]


@pytest.mark.skipif(not native_available(), reason="without the compiled kernels the default path is the torch path")
@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_validate_false_nonfinite_with_large_vocabulary_default_path(case):
    first, recovered, bonus = call(_nonfinite_case(case))
    assert ((recovered >= 0) & (recovered < 65)).all() and ((bonus >= 0) & (bonus < 65)).all()


@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_validate_false_nonfinite_with_large_vocabulary_torch_path(case):
    # was: NaN/inf weights gave radix buckets past 1024 and scatter_add_ raised (a device assert on CUDA)
    with torch_path():
        first, recovered, bonus = call(_nonfinite_case(case))
    assert ((recovered >= 0) & (recovered < 65)).all() and ((bonus >= 0) & (bonus < 65)).all()


def _empty_batch(mode: str) -> dict:
    extra = dict(draft_proposal="sampled", draft_probs_full=torch.zeros(0, 2, 5)) if mode == "sampled" else {}
    return _radix_case(
        draft_tokens=torch.zeros(0, 2, dtype=torch.int64),
        target_logits=torch.zeros(0, 3, 5),
        temperature=torch.ones(0),
        top_k=torch.ones(0, dtype=torch.int64),
        top_p=torch.ones(0),
        **extra,
    )


@pytest.mark.parametrize("validate", [True, False])
def test_empty_batch_argmax(validate):
    first, recovered, bonus = call({**_empty_batch("argmax"), "validate": validate})
    assert first.shape == (0,) and recovered.shape == (0, 2) and bonus.shape == (0, 1)


@pytest.mark.parametrize("path", ["default", "torch-path"])
def test_validate_false_empty_batch_sampled(path):
    # was: `sums.view(batch, per_position, -1)` cannot infer -1 from 0 elements
    with torch_path() if path == "torch-path" else contextlib.nullcontext():
        first, recovered, bonus = call(_empty_batch("sampled"))
    assert first.shape == (0,) and recovered.shape == (0, 2) and bonus.shape == (0, 1)


@pytest.mark.parametrize("shape", [(0, 5), (0, 3, 40), (2, 0, 33)])
def test_pack_bitmask_empty(shape):
    # was: a reshape with -1 cannot infer it from 0 elements
    packed = sv.pack_bitmask(torch.zeros(shape, dtype=torch.bool))
    assert packed.dtype == torch.int32 and packed.shape == (*shape[:-1], (shape[-1] + 31) // 32)
