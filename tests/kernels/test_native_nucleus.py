"""The CPU kernels' top-p threshold on rows of a real vocabulary's size, against SPEC §2 from first principles.

weigh_rows finds the nucleus of a row without a sort (kernels.c, nucleus_threshold: a search on the weights'
bits with estimated weights, then the bracket's values listed and resolved with exact sums). Here its kept
set is compared with the one computed independently in float64 from the same float32 weights: sort
descending, add up, keep the shortest prefix whose mass reaches top_p (less the boundary tolerance) and the
ties of its last token. The rows are LLM-shaped (a Zipf-like head, heavy tokens over a Gaussian tail), flat,
integer-valued (wide ties), masked to -inf in part, in float32 and bfloat16, with and without a top-k floor
above the heap's limit; among them rows whose prefix mass crosses the target by less than 1e-7 of the row's
mass, where a sum that loses 2^-40 per token (the fixed-point histogram these kernels used before) keeps one
token too few.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specverify.contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from specverify.kernels import block_size, native
from tests.support.backends import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")

TOP_P = [0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 0.3, 0.97]


def _rows(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    if kind == "zipf":
        rank = torch.arange(1, vocab + 1).float()
        return -1.1 * torch.log(rank)[None].repeat(rows, 1) + torch.randn(rows, vocab, generator=g) * 0.5
    if kind == "heavy":
        x = torch.randn(rows, vocab, generator=g) * 2
        return x.scatter_add_(
            1, torch.randint(0, vocab, (rows, 8), generator=g), torch.rand(rows, 8, generator=g) * 8 + 4
        )
    if kind == "flat":
        return torch.randn(rows, vocab, generator=g) * 0.1
    if kind == "ties":
        return torch.randint(-6, 3, (rows, vocab), generator=g).float()
    x = torch.randn(rows, vocab, generator=g)  # "masked"
    x[torch.rand(rows, vocab, generator=g) < 0.7] = float("-inf")
    return x


def _weights(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    weights = torch.empty(logits.shape)
    native.weigh_rows(
        logits,
        temperature,
        GREEDY_TEMPERATURE,
        top_k,
        top_p,
        None,
        BOUNDARY_RTOL,
        block_size(logits.shape[-1]),
        weights,
    )
    return weights


def _kept_from_first_principles(weights: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """SPEC §2 steps 3-4 in float64 on one row of float32 weights: a boolean mask of the kept tokens."""
    ordered = np.sort(weights.astype(np.float64))[::-1]
    floor = ordered[top_k - 1] if 0 < top_k < len(ordered) else 0.0
    ordered = ordered[ordered >= floor]
    target = top_p * (1 - BOUNDARY_RTOL) * ordered.sum()
    threshold = ordered[min(int(np.searchsorted(np.cumsum(ordered), target)), len(ordered) - 1)]
    return weights >= max(threshold, floor)


@pytest.mark.parametrize(
    ("kind", "vocab", "dtype"),
    [
        ("zipf", 151936, torch.float32),
        ("zipf", 128256, torch.float32),
        ("heavy", 128256, torch.float32),
        ("heavy", 50000, torch.bfloat16),
        ("flat", 128256, torch.float32),
        ("ties", 32768, torch.float32),
        ("masked", 50000, torch.float32),
    ],
)
def test_nucleus_of_large_rows_is_the_float64_one(kind, vocab, dtype):
    g = torch.Generator().manual_seed(vocab + len(kind))
    rows = 2 * len(TOP_P)
    logits = _rows(kind, rows, vocab, g).to(dtype)
    temperature = torch.tensor([1.0, 0.7, 1.3, 0.5] * (rows // 4))
    top_k = torch.where(torch.arange(rows) % 4 == 3, 5000, -1)  # a floor above the heap's limit
    top_p = torch.tensor(TOP_P * 2)
    everything = _weights(logits, temperature, torch.full((rows,), -1), torch.ones(rows))
    kept = _weights(logits, temperature, top_k, top_p) > 0
    for row in range(rows):
        expected = _kept_from_first_principles(everything[row].numpy(), int(top_k[row]), float(top_p[row]))
        got = kept[row].numpy()
        assert (got == expected).all(), (
            f"row {row} (T {float(temperature[row])}, top-k {int(top_k[row])}, top-p {float(top_p[row])}): "
            f"kept {int(got.sum())} tokens, first principles keep {int(expected.sum())}"
        )
