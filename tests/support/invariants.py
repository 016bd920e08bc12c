"""What every valid verifier call keeps, checked from outside: the SPEC §1 output invariants, inputs never
written to (snapshots of them), outputs equal bit for bit, and no read of tensor data back to the host.

`forbid_host_reads` is a context manager, usable inside hypothesis examples, where a function-scoped
`monkeypatch` fixture cannot be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import specverify as sv
from tests.support.oracle import GREEDY_TEMPERATURE
from tests.support.seeds import per_row_seeds

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_HOST_READS = ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns, so that NaN compares equal to itself and -0.0 differs from 0.0."""
    return tensor.view(_SAME_SIZE_INT[tensor.element_size()]) if tensor.dtype != torch.bool else tensor


def snapshot(args: dict) -> dict:
    """Deep copies of every tensor argument."""
    return {name: value.clone() for name, value in args.items() if isinstance(value, torch.Tensor)}


def assert_untouched(args: dict, before: dict) -> None:
    """Every tensor argument still has the dtype, shape and bits it had when `before` was taken."""
    for name, old in before.items():
        new = args[name]
        assert new.dtype == old.dtype and new.shape == old.shape, f"{name} changed dtype or shape"
        assert torch.equal(bits(new), bits(old)), f"{name} was written to"


def outputs_equal(a, b) -> bool:
    """Two output tuples are identical: same dtypes, shapes and values."""
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


@contextlib.contextmanager
def forbid_host_reads() -> Iterator[None]:
    """Inside the block, every Python-level way of reading tensor data back to the host raises."""

    def forbidden(*_args, **_kwargs):
        raise AssertionError("read tensor data back to the host")

    with pytest.MonkeyPatch.context() as patch:
        for name in _HOST_READS:
            patch.setattr(torch.Tensor, name, forbidden)
        yield


def logits_3d(args: dict) -> torch.Tensor:
    """target_logits as [B, K+1, V] whatever its layout."""
    batch, positions = args["draft_tokens"].shape
    logits = args["target_logits"]
    return logits.reshape(batch, positions + 1, logits.shape[-1])


def row_param(args: dict, name: str, batch: int, dtype: torch.dtype) -> torch.Tensor | None:
    """A per-row parameter as a [B] tensor (numbers broadcast), or None."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.reshape(-1).expand(batch).to(dtype) if value.dim() == 0 else value.to(dtype)
    return torch.full((batch,), value, dtype=dtype)


def allowed_tokens(args: dict) -> torch.Tensor:
    """bool [B, K+1, V]: tokens allowed by the bitmask with a finite logit (the only committable ones)."""
    logits = logits_3d(args).float()
    allowed = torch.isfinite(logits)
    if args.get("token_bitmasks") is not None:
        allowed &= sv.unpack_bitmask(args["token_bitmasks"], logits.shape[-1])
    return allowed


def check_output_invariants(args: dict, out) -> None:
    """SPEC §1 / §3 invariants that every valid call satisfies, whatever the randomness.

    - shapes [B], [B, K], [B, 1], dtype int64, on the device of target_logits;
    - every id in [0, V); f in [0, K]; f is at most the row's first padding position;
    - recovered equals the draft before f;
    - every committed token is allowed by the mask and has a finite logit;
    - greedy rows (temperature < 1e-5) commit the argmax of the masked logits (lowest id on ties);
    - the bonus is a sample of p~ at position K (`sv.sample` with key s_b + K, SPEC §3.1, §3.4);
    - rows that are neither greedy nor relaxed commit only tokens of p~'s support; in "argmax" mode they
      commit exactly what `sv.sample` draws with key s_b + j (SPEC §4), and f is the first disagreement.
    """
    first, recovered, bonus = out
    draft = args["draft_tokens"].to(torch.int64)
    batch, positions = draft.shape
    logits = logits_3d(args)
    vocab = logits.shape[-1]
    device = logits.device
    for tensor, shape in ((first, (batch,)), (recovered, (batch, positions)), (bonus, (batch, 1))):
        assert tensor.dtype == torch.int64 and tuple(tensor.shape) == shape and tensor.device == device
    if batch == 0:
        return
    assert ((first >= 0) & (first <= positions)).all(), first
    assert ((recovered >= 0) & (recovered < vocab)).all(), recovered
    assert ((bonus >= 0) & (bonus < vocab)).all(), bonus

    index = torch.arange(positions)
    padding = draft == -1
    first_padding = (
        torch.where(padding.any(-1), padding.int().argmax(-1), positions)
        if positions
        else torch.zeros(batch, dtype=torch.int64)
    )
    assert (first <= first_padding).all(), "a padding position was accepted"
    before = index[None, :] < first[:, None]
    assert torch.equal(recovered[before], draft[before]), "recovered differs from the accepted draft"

    # what each row commits: tokens [B, K+1] padded with -1
    tokens, count = sv.committed_tokens(first, recovered, bonus)
    committed = tokens >= 0
    allowed = allowed_tokens(args)
    ok = allowed.gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    assert (ok | ~committed).all(), "a masked (or -inf) token was committed"

    temperature = row_param(args, "temperature", batch, torch.float32)
    greedy = temperature < GREEDY_TEMPERATURE
    relaxed = torch.zeros(batch, dtype=torch.bool)
    if args.get("relaxed_topk") is not None and args.get("in_thinking_phase") is not None:
        relaxed = args["in_thinking_phase"] & ~greedy

    masked = torch.where(allowed, logits.float(), float("-inf"))
    argmax = masked.argmax(-1)  # lowest index on ties
    if greedy.any():
        g_tokens = tokens[greedy]
        g_argmax = argmax[greedy]
        g_committed = committed[greedy]
        assert torch.equal(g_tokens[g_committed], g_argmax[g_committed]), "a greedy row did not commit the argmax"
        g_draft = draft[greedy]
        disagree = torch.cat(
            [g_draft != g_argmax[:, :positions], torch.ones(g_draft.shape[0], 1, dtype=torch.bool)], -1
        )
        assert torch.equal(first[greedy], disagree.int().argmax(-1)), "greedy f is not the first disagreement"

    # the keyed draws y_j of every (row, position): sv.sample with key s_b + j (SPEC §4)
    seeds = torch.tensor(per_row_seeds(args["seed"], batch), dtype=torch.int64)
    keys = seeds[:, None] + torch.arange(positions + 1)

    def flat(t):
        return None if t is None else t.repeat_interleave(positions + 1)

    bitmask = args.get("token_bitmasks")
    y = sv.sample(
        logits.reshape(-1, vocab),
        flat(temperature),
        flat(row_param(args, "top_k", batch, torch.int64)),
        flat(row_param(args, "top_p", batch, torch.float32)),
        keys.reshape(-1),
        min_p=flat(row_param(args, "min_p", batch, torch.float32)),
        token_bitmask=None if bitmask is None else bitmask.reshape(batch * (positions + 1), -1),
    ).view(batch, positions + 1)
    assert torch.equal(bonus[:, 0], y[:, positions]), "the bonus is not the keyed sample of p~ at position K"

    plain = ~greedy & ~relaxed
    if not plain.any():
        return
    probs = sv.truncated_probs(
        logits.reshape(-1, vocab),
        flat(temperature),
        flat(row_param(args, "top_k", batch, torch.int64)),
        flat(row_param(args, "top_p", batch, torch.float32)),
        flat(row_param(args, "min_p", batch, torch.float32)),
        None if bitmask is None else bitmask.reshape(batch * (positions + 1), -1),
    ).view(batch, positions + 1, vocab)
    in_support = probs.gather(-1, tokens.clamp(min=0)[..., None])[..., 0] > 0
    assert (in_support | ~committed)[plain].all(), "a token outside p~'s support was committed"
    if args.get("draft_proposal", "argmax") == "argmax":
        assert torch.equal(recovered[plain], y[plain, :positions]), "argmax mode: recovered is not y_j"
        disagree = torch.cat([draft != y[:, :positions], torch.ones(batch, 1, dtype=torch.bool)], -1)
        assert torch.equal(first[plain], disagree.int().argmax(-1)[plain]), (
            "argmax mode: f is not the first disagreement"
        )
    else:
        p_d = probs[:, :positions].gather(-1, draft.clamp(min=0)[..., None])[..., 0]
        impossible = (draft >= 0) & (p_d == 0)  # the target cannot commit it: always rejected
        assert not (before & impossible)[plain].any(), "sampled mode accepted a draft with p~(d) == 0"
