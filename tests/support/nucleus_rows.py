"""Rows for the tests of the CPU kernels' nucleus search (test_native_sift.py, test_native_team.py): a weighing
through a backend's weigh_rows, and two-level rows whose nucleus crossing lies at a chosen distance from the
search's margin."""

from __future__ import annotations

import numpy as np
import torch

from specverify.contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from specverify.kernels import block_size, native


def weigh(weigh_rows, logits, temperature, top_p, min_p=None):
    """The rows' truncated weights [N, V] and block sums by `weigh_rows` (a backend's op), no top-k."""
    rows, vocab = logits.shape
    out = torch.empty(rows, vocab)
    top_k = torch.full((rows,), -1, dtype=torch.int64)
    arguments = (logits, temperature, GREEDY_TEMPERATURE, top_k, top_p, min_p, BOUNDARY_RTOL, block_size(vocab), out)
    sums = weigh_rows(*arguments)
    return out, sums


def two_level_rows(inside: bool) -> list[tuple[str, torch.Tensor, float, float]]:
    """Rows of n1 tokens of weight 1 and n2 of weight w = exp(x) (the same float32 from the C kernels and from
    torch), whose target p * (n1 + n2 * w) (every sum exact in double) lies at a distance d from n1, the
    weight of the first level: within a quarter of the search's margin on either side (inside: the search
    must fall back), or beyond eight margins (it must certify). Each is (name, logits [1, n], top_p, d)."""
    g = torch.Generator().manual_seed(35)
    x = -2.0 - 5.0 * torch.rand(60000, generator=g)
    probe = torch.cat([torch.zeros(1), x])[None]
    weights, _ = weigh(native.weigh_rows, probe, torch.ones(1), torch.ones(1))
    w = weights[0, 1:].double().numpy()
    alike = w == torch.exp(x).double().numpy()
    x, w = x.numpy()[alike], w[alike]
    found = {}
    for top_p in (0.8, 0.9, 0.6, 0.95):
        p = float(np.float32(top_p)) * (1.0 - BOUNDARY_RTOL)  # as kernels.c forms it
        for n1 in range(1000, 3000, 20):
            n2 = np.rint((n1 / p - n1) / w)
            total = n1 + n2 * w
            d = n1 - p * total
            margin = (4 * (n1 + n2) + 16384) * 2.0**-53 * total  # SIFT_MARGIN
            wanted = {
                "inside, kept": (d > 1e-11) & (d < margin / 4),
                "inside, not kept": (d < -1e-11) & (-d < margin / 4),
                "outside, kept": (d > 8 * margin) & (d < 1e-9 * total),
                "outside, not kept": (-d > 8 * margin) & (-d < 1e-9 * total),
            }
            for name, chosen in wanted.items():
                hits = np.nonzero(chosen & (n2 >= 1) & (n1 + n2 <= 60000))[0]
                if name.startswith("inside") == inside and name not in found and len(hits):
                    at = hits[0]
                    row = torch.cat([torch.zeros(n1), torch.full((int(n2[at]),), float(x[at]))])
                    row = row[torch.randperm(row.numel(), generator=g)]
                    found[name] = (name, row[None], top_p, float(d[at]))
    assert len(found) == 2, f"two-level rows found only for {sorted(found)}"
    return list(found.values())
