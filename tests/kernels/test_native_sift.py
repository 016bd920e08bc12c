"""The CPU kernels' sifting search for the nucleus of a row without top-k (kernels.c, nucleus_sifted) keeps
exactly nucleus_threshold's set, bit for bit, on every row.

The search narrows a bracket around the threshold in a few estimated passes, lists the bracket's values and
resolves them with sums in double; it keeps its threshold only where those sums miss the target by more than
a margin that covers the rounding of either search (SIFT_MARGIN), and otherwise takes nucleus_threshold's.
Here rows are weighed with the search on and off (the test hook specverify_sift) and compared bit for bit
(weights and block sums), their kept sets compared with the torch reference backend's, and the test hook
specverify_sift_fallbacks tells which rows the search certified: rows whose crossing lies just inside the
margin (they must fall back) and just outside it (they must not), built from two levels of weights (1 and
one w < 1, summed exactly in double, so that every backend meets the same target at the same distance).
"""

from __future__ import annotations

import pytest
import torch

import specverify as sv
from specverify.kernels import native, reference
from tests.support.backends import native_available
from tests.support.native_hooks import hook_set, read_count
from tests.support.nucleus_rows import two_level_rows, weigh

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")


def sifting(on: bool):
    """Rows without top-k sift for their nucleus (on, the default) or go to nucleus_threshold alone."""
    return hook_set("specverify_sift", int(on), 1)


def fallbacks() -> int:
    """How many sifted rows took nucleus_threshold's threshold since the last call."""
    return read_count("specverify_sift_fallbacks")


def _compare(logits, temperature, top_p, min_p=None) -> int:
    """Weigh the rows with the search on and off and by the torch reference: the same weights and block sums
    bit for bit, the same kept sets as the reference. Returns how many rows fell back."""
    fallbacks()
    sifted, sifted_sums = weigh(native.weigh_rows, logits, temperature, top_p, min_p)
    fell_back = fallbacks()
    with sifting(False):
        dense, dense_sums = weigh(native.weigh_rows, logits, temperature, top_p, min_p)
    assert fallbacks() == 0
    assert torch.equal(sifted.view(torch.int32), dense.view(torch.int32))
    assert torch.equal(sifted_sums, dense_sums)
    expected, _ = weigh(reference.weigh_rows, logits, temperature, top_p, min_p)
    for row in range(logits.shape[0]):
        kept, reference_kept = sifted[row] > 0, expected[row] > 0
        assert torch.equal(kept, reference_kept), (
            f"row {row} (T {float(temperature[row])}, top-p {float(top_p[row])}): kept {int(kept.sum())} tokens, "
            f"the torch reference keeps {int(reference_kept.sum())}"
        )
    return fell_back


def _logits(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    if kind == "heavy":  # the benchmark's rows: a few heavy tokens over a Gaussian tail (a wide nucleus)
        x = torch.randn(rows, vocab, generator=g) * 2
        head = torch.randint(0, vocab, (rows, 8), generator=g)
        return x.scatter_add_(1, head, torch.rand(rows, 8, generator=g) * 8 + 4)
    if kind == "zipf":
        rank = torch.arange(1, vocab + 1).float()
        return -1.1 * torch.log(rank)[None].repeat(rows, 1) + torch.randn(rows, vocab, generator=g) * 0.5
    if kind == "flat":  # the nucleus is most of the vocabulary
        return torch.randn(rows, vocab, generator=g) * 0.1
    if kind == "ties":  # integer logits: wide ties at every threshold
        return torch.randint(-6, 3, (rows, vocab), generator=g).float()
    if kind == "equal":  # every weight 1
        return torch.full((rows, vocab), 0.25)
    if kind == "masked":  # a grammar mask: most tokens -inf, one row with a single allowed token
        x = torch.randn(rows, vocab, generator=g) * 3
        x[torch.rand(rows, vocab, generator=g) < 0.8] = float("-inf")
        x[0] = float("-inf")
        x[0, vocab // 2] = 1.0
        return x
    raise AssertionError(kind)


TOP_P = [1e-3, 0.3, 0.5, 0.9, 0.95, 0.999, 0.99999994]  # the last: the largest float32 below 1
TEMPERATURE = [0.05, 0.7, 1.0, 1.3, 3.0]


@pytest.mark.parametrize(
    ("kind", "vocab", "dtype"),
    [
        ("heavy", 128256, torch.float32),
        ("zipf", 32000, torch.float32),
        ("flat", 50000, torch.float32),
        ("ties", 4097, torch.float32),
        ("equal", 1000, torch.float32),
        ("masked", 3000, torch.float32),
        ("heavy", 50000, torch.bfloat16),
        ("zipf", 20000, torch.float16),
        ("heavy", 100, torch.float32),
        ("ties", 17, torch.float32),
        ("heavy", 2, torch.float32),
        ("heavy", 1, torch.float32),
    ],
)
def test_sifted_nucleus_is_nucleus_thresholds_bit_for_bit(kind, vocab, dtype):
    g = torch.Generator().manual_seed(vocab + len(kind))
    rows = len(TOP_P) * len(TEMPERATURE) if vocab < 60000 else 2 * len(TOP_P)
    logits = _logits(kind, rows, vocab, g).to(dtype)
    top_p = torch.tensor(TOP_P * (rows // len(TOP_P)))
    temperature = torch.tensor(TEMPERATURE, dtype=torch.float32).repeat_interleave(len(TOP_P))[:rows]
    if rows < len(TOP_P) * len(TEMPERATURE):
        temperature = torch.tensor([1.0, 0.7] * len(TOP_P))[:rows]
    fell_back = _compare(logits, temperature, top_p)
    assert fell_back < max(2, rows // 10), f"{fell_back} of {rows} rows were not certified"
    min_p = torch.rand(rows, generator=g) * 0.2  # min-p on top of the sifted nucleus
    _compare(logits, temperature, top_p, min_p)


@pytest.mark.parametrize("inside", [True, False], ids=["inside the margin", "outside the margin"])
def test_a_crossing_within_the_margin_falls_back_and_beyond_it_is_certified(inside):
    for name, logits, top_p, d in two_level_rows(inside):
        fell_back = _compare(logits, torch.ones(1), torch.tensor([top_p]))
        assert fell_back == (1 if inside else 0), f"{name} (d {d:.3g}): {fell_back} fallbacks"
        weights, _ = weigh(native.weigh_rows, logits, torch.ones(1), torch.tensor([top_p]))
        kept_level = int((weights[0] > 0).sum())
        n1 = int((logits[0] == 0).sum())
        assert kept_level == (n1 if d >= 0 else logits.shape[1]), f"{name}: kept {kept_level} tokens"


def test_verifier_calls_with_top_p_alone_are_the_same_sifted_or_not():
    g = torch.Generator().manual_seed(7)
    batch, drafts, vocab = 4, 3, 128256
    logits = _logits("heavy", batch * (drafts + 1), vocab, g)
    arguments = dict(
        draft_tokens=torch.randint(0, vocab, (batch, drafts), generator=g),
        target_logits=logits,
        temperature=torch.tensor([1.0, 0.7, 1.3, 1.0]),
        top_k=torch.tensor([-1, 0, -1, vocab]),
        max_k=None,
        top_p=torch.tensor([0.95, 0.9, 0.5, 0.99999994]),
        min_top_p=None,
        seed=torch.tensor([1, 2, 3, 4]),
    )
    draft_probs = torch.softmax(torch.randn(batch, drafts, vocab, generator=g), -1)
    for extra in ({}, {"draft_proposal": "sampled", "draft_probs_full": draft_probs}):
        sifted = sv.stochastic_acceptance_sampler(**arguments, **extra)
        with sifting(False):
            dense = sv.stochastic_acceptance_sampler(**arguments, **extra)
        for a, b in zip(sifted, dense):
            assert torch.equal(a, b)
