"""The CPU kernels' exp gives the same bits on its fast path as on its full one.

kernels.c exponentiates 64 values at a time (exp_chunk): by exp_normal, exp_nonpositive without its clamps
and its subnormal step, where every y = (x - max) / T of the 64 lies in [-87, 0], else by exp_nonpositive.
Here a row holds pairs of 64-value steps with the same values, the second of each with one value below -87,
so that the first is weighed on the fast path and the second on the full one: every shared value must weigh
the same, bit for bit (an exp_normal built with other contractions than exp_nonpositive fails here). The
values cover [-87, 0] (its ends, values near them, tiny ones, every binade down to 2^-20).
"""

from __future__ import annotations

import pytest
import torch

from specverify.contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from specverify.kernels import block_size, native
from tests.support.backends import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")

STEP = 64


def _values(count: int) -> torch.Tensor:
    """count values of y in [-87, 0]: random ones of every scale and the edges of the range."""
    g = torch.Generator().manual_seed(11)
    edges = torch.tensor([-87.0, -86.99999, -0.0, -1e-30, -1e-7, -0.5, -0.6931472, -1.0, -42.0, -86.5])
    scales = 2.0 ** torch.randint(-20, 7, (count,), generator=g).float()
    random = -(torch.rand(count, generator=g) * scales).clamp(max=87.0)
    return torch.cat([edges, random])[:count]


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_the_fast_exp_step_weighs_as_the_full_one(temperature):
    steps = 400
    shared = _values(steps * (STEP - 1)).view(steps, STEP - 1)
    fast = torch.cat([torch.zeros(steps, 1), shared], 1)  # y = 0: the row's max, in range
    slow = torch.cat([torch.full((steps, 1), -100.0), shared], 1)  # y = -100 < -87: the full exp
    y = torch.stack([fast, slow], 1).reshape(1, -1)
    logits = y * temperature  # (x - 0) / T = y exactly: T and 1 / T are powers of 2
    out = torch.empty_like(logits)
    native.weigh_rows(
        logits,
        torch.tensor([temperature]),
        GREEDY_TEMPERATURE,
        torch.tensor([-1]),
        torch.ones(1),
        None,
        BOUNDARY_RTOL,
        block_size(logits.shape[1]),
        out,
    )
    weights = out.view(steps, 2, STEP)
    assert torch.equal(weights[:, 0, 1:].view(torch.int32), weights[:, 1, 1:].view(torch.int32))
    assert (weights[:, 0, 0] == 1.0).all()
    close = torch.exp(shared.double())
    assert ((weights[:, 0, 1:].double() - close).abs() <= 4e-7 * close + 1e-45).all()
