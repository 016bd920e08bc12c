"""SPEC §5: packed int32 grammar masks (bit v % 32 of word v // 32), and the verifier never commits a
token that the mask disallows."""

from __future__ import annotations

import pytest
import torch

import specverify as sv


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def words_for(vocab: int) -> int:
    return (vocab + 31) // 32


def int32_word(bits: list[int]) -> int:
    """The int32 value of a word with the given bits set (bit 31 makes it negative)."""
    value = sum(1 << b for b in bits)
    return value - (1 << 32) if value >= 1 << 31 else value


# ---------------------------------------------------------------------------------------------------------
# pack / unpack


@pytest.mark.parametrize("vocab", [1, 7, 31, 32, 33, 50, 64, 100, 1000, 1025])
@pytest.mark.parametrize("lead", [(), (5,), (3, 2)])
def test_round_trip(vocab, lead):
    allowed = torch.rand(*lead, vocab, generator=_generator(vocab)) < 0.5
    packed = sv.pack_bitmask(allowed)
    assert packed.dtype == torch.int32 and packed.shape == (*lead, words_for(vocab))
    assert torch.equal(sv.unpack_bitmask(packed, vocab), allowed)


@pytest.mark.parametrize("vocab", [5, 32, 70])
def test_all_and_nothing(vocab):
    for fill in (True, False):
        allowed = torch.full((2, vocab), fill)
        assert torch.equal(sv.unpack_bitmask(sv.pack_bitmask(allowed), vocab), allowed)
    if vocab % 32 == 0:
        assert (sv.pack_bitmask(torch.ones(vocab, dtype=torch.bool)) == -1).all()


def test_bit_convention_against_a_hand_built_mask():
    vocab = 70
    allowed_ids = [0, 5, 31, 32, 63, 69]
    words = torch.tensor([int32_word([0, 5, 31]), int32_word([0, 31]), int32_word([5])], dtype=torch.int32)
    assert words.tolist() == [-2147483615, -2147483647, 32]  # bit 31 makes a negative word
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[allowed_ids] = True
    assert torch.equal(sv.pack_bitmask(allowed), words)
    assert sv.unpack_bitmask(words, vocab).nonzero()[:, 0].tolist() == allowed_ids


@pytest.mark.parametrize("bit", [0, 1, 15, 30, 31])
def test_single_bits(bit):
    word = torch.tensor([0, int32_word([bit])], dtype=torch.int32)  # tokens 32..63
    assert sv.unpack_bitmask(word, 64).nonzero()[:, 0].tolist() == [32 + bit]
    one_hot = torch.zeros(64, dtype=torch.bool)
    one_hot[32 + bit] = True
    assert torch.equal(sv.pack_bitmask(one_hot), word)


def test_pack_leaves_bits_past_V_clear():
    vocab = 40
    packed = sv.pack_bitmask(torch.ones(3, vocab, dtype=torch.bool))
    assert packed[:, 1].tolist() == [int32_word(list(range(8)))] * 3
    assert not sv.unpack_bitmask(packed, 64)[:, vocab:].any()


def test_unpack_ignores_bits_past_V():
    vocab = 40
    words = torch.tensor([[int32_word([3]), int32_word([1] + list(range(8, 32)))]], dtype=torch.int32)
    assert sv.unpack_bitmask(words, vocab)[0].nonzero()[:, 0].tolist() == [3, 33]
    assert sv.unpack_bitmask(words, 64)[0, vocab:].all()  # the bits really are set


# ---------------------------------------------------------------------------------------------------------
# The verifier and the mask

B, K, V = 120, 3, 50  # V = 50: the last word has 14 bits past V


def masked_problem(seed: int):
    """Logits that favour disallowed tokens, drafts that often propose them, and the mask."""
    g = _generator(seed)
    allowed = torch.rand(B, K + 1, V, generator=g) < 0.35
    allowed[torch.arange(B), :, torch.randint(0, V, (B,), generator=g)] = True  # at least one token everywhere
    logits = torch.randn(B, K + 1, V, generator=g) + 4.0 * ~allowed  # without the mask, disallowed tokens win
    scores = torch.where(allowed[:, :K], -torch.rand(B, K, V, generator=g), torch.rand(B, K, V, generator=g))
    disallowed_draft = scores.argmax(-1)  # a disallowed token where there is one
    allowed_draft = torch.where(allowed[:, :K], logits[:, :K], float("-inf")).argmax(-1)  # the best allowed one
    use_disallowed = torch.rand(B, K, generator=g) < 0.5
    draft = torch.where(use_disallowed, disallowed_draft, allowed_draft)
    probs = torch.softmax(torch.randn(B, K, V, generator=g) + 2.0 * ~allowed[:, :K], dim=-1)
    probs[::7] = 0.0  # some rows without a draft distribution
    rows = torch.arange(B)
    temperature = torch.where(rows % 3 == 0, 0.0, torch.where(rows % 3 == 1, 1.0, 0.6))  # greedy rows too
    top_k = torch.where(rows % 4 == 0, 5, -1)
    top_p = torch.where(rows % 5 == 0, 0.8, 1.0)
    return dict(
        allowed=allowed, logits=logits, draft=draft, probs=probs, temperature=temperature, top_k=top_k, top_p=top_p
    )


def verify(problem: dict, seed: int, mode: str, bitmask: torch.Tensor | None, **extra):
    kwargs = dict(token_bitmasks=bitmask, **extra)
    if mode == "sampled":
        kwargs.update(draft_proposal="sampled", draft_probs_full=problem["probs"])
    return sv.stochastic_acceptance_sampler(
        problem["draft"],
        problem["logits"],
        problem["temperature"],
        problem["top_k"],
        None,
        problem["top_p"],
        None,
        torch.arange(B) * 1000 + seed,
        **kwargs,
    )


def committed_disallowed(outputs, allowed: torch.Tensor) -> int:
    """How many committed tokens the mask disallows at their position."""
    tokens, _ = sv.committed_tokens(*outputs)
    present = tokens >= 0
    ok = allowed.gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    return int((present & ~ok).sum())


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_masked_token_is_never_committed(mode):
    total_without_mask = 0
    for seed in range(3):
        problem = masked_problem(seed)
        bitmask = sv.pack_bitmask(problem["allowed"])
        outputs = verify(problem, seed, mode, bitmask)
        assert committed_disallowed(outputs, problem["allowed"]) == 0
        first = outputs[0]
        assert int((first > 0).sum()) > B // 10  # allowed drafts do get accepted
        total_without_mask += committed_disallowed(verify(problem, seed, mode, None), problem["allowed"])
    assert total_without_mask > 50  # power: without the mask these inputs commit disallowed tokens


def test_masked_draft_is_never_accepted_on_greedy_rows():
    problem = masked_problem(9)
    problem["temperature"] = torch.zeros(B)
    first, recovered, bonus = verify(problem, 0, "argmax", sv.pack_bitmask(problem["allowed"]))
    draft_allowed = problem["allowed"][:, :K].gather(-1, problem["draft"][..., None])[..., 0]
    accepted = torch.arange(K) < first[:, None]
    assert draft_allowed[accepted].all()
    assert committed_disallowed((first, recovered, bonus), problem["allowed"]) == 0
    expected = torch.where(problem["allowed"], problem["logits"], float("-inf")).argmax(-1)
    assert torch.equal(bonus[:, 0], expected[:, K])


def test_masked_token_is_never_committed_on_relaxed_rows():
    problem = masked_problem(3)
    bitmask = sv.pack_bitmask(problem["allowed"])
    outputs = verify(
        problem,
        0,
        "argmax",
        bitmask,
        in_thinking_phase=torch.ones(B, dtype=torch.bool),
        relaxed_topk=V,
        relaxed_delta=1.0,
    )
    assert committed_disallowed(outputs, problem["allowed"]) == 0


def test_masked_token_is_never_committed_on_relaxed_rows_with_a_small_topk():
    problem = masked_problem(4)
    bitmask = sv.pack_bitmask(problem["allowed"])
    outputs = verify(
        problem,
        0,
        "argmax",
        bitmask,
        in_thinking_phase=torch.ones(B, dtype=torch.bool),
        relaxed_topk=1,
        relaxed_delta=0.5,
    )
    assert committed_disallowed(outputs, problem["allowed"]) == 0
    assert int((outputs[0] > 0).sum()) > 0


def set_bits_past_V(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """The same mask with every bit past V set in the last word."""
    used = vocab - 32 * (bitmask.shape[-1] - 1)
    out = bitmask.clone()
    out[..., -1] |= int32_word(list(range(used, 32)))
    return out


@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
def test_sampler_ignores_bits_past_V(mode):
    problem = masked_problem(5)
    bitmask = sv.pack_bitmask(problem["allowed"])
    noisy = set_bits_past_V(bitmask, V)
    assert not torch.equal(noisy, bitmask)
    extra = (
        dict(in_thinking_phase=torch.arange(B) % 2 == 0, relaxed_topk=3, relaxed_delta=0.2) if mode == "relaxed" else {}
    )
    base_mode = "argmax" if mode == "relaxed" else mode
    expected = verify(problem, 1, base_mode, bitmask, **extra)
    got = verify(problem, 1, base_mode, noisy, **extra)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_bits_past_V_do_not_count_as_allowed():
    problem = masked_problem(6)
    bitmask = set_bits_past_V(sv.pack_bitmask(problem["allowed"]), V)
    bitmask[7, 2, :-1] = 0
    bitmask[7, 2, -1] = int32_word(list(range(V - 32, 32)))  # only bits past V
    with pytest.raises(
        ValueError,
        match=r"token_bitmasks must leave at least one token with a finite logit \(got none at row 7, position 2\)",
    ):
        verify(problem, 0, "argmax", bitmask)


def test_truncated_probs_and_sample_respect_the_mask():
    problem = masked_problem(7)
    logits = problem["logits"].reshape(-1, V)
    allowed = problem["allowed"].reshape(-1, V)
    rows = logits.shape[0]
    bitmask = sv.pack_bitmask(allowed)
    probs = sv.truncated_probs(
        logits, torch.ones(rows), torch.full((rows,), -1), torch.ones(rows), token_bitmask=bitmask
    )
    assert (probs[~allowed] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(rows))
    for seed in range(3):
        tokens = sv.sample(
            logits, torch.ones(rows), torch.full((rows,), -1), torch.ones(rows), seed, token_bitmask=bitmask
        )
        assert allowed.gather(-1, tokens[:, None]).all()
