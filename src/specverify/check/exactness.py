"""Exactness on the target: `truncated_probs` against the float64 oracle `audit.exact.truncated_distribution`
(same kept set, probabilities within float32 rounding), greedy rows, and keyed uniforms bit-identical to the CPU's.

The grid covers temperatures, top-k, top-p, min-p, masks, ties and dtypes; `nucleus_conditions` checks the
SPEC §2 top-p conditions on a nearly flat 256k vocabulary.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import specverify as sv

from ..audit.exact import truncated_distribution
from ..rng import STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_TARGET
from .targets import Target, run_truncated_probs, running_on, to_target


def exactness_check(target: Target, quick: bool = False) -> dict:
    """truncated_probs on the target against the float64 oracle; greedy = argmax; uniforms bit-identical."""
    rng = np.random.default_rng(7)
    failures: list[str] = []
    worst_abs = 0.0
    rows_checked = 0

    def compare(logits, temperature, top_k, top_p, min_p, allowed, dtype, label):
        """logits: float64 [n, V], rounded to dtype; the parameters [n]; allowed: bool [n, V] or None."""
        nonlocal worst_abs, rows_checked
        n, vocab = logits.shape
        x = torch.as_tensor(logits, dtype=torch.float32).to(dtype)
        bitmask = None if allowed is None else sv.pack_bitmask(torch.as_tensor(allowed))
        got = (
            run_truncated_probs(
                x,
                torch.as_tensor(temperature, dtype=torch.float32),
                torch.as_tensor(top_k, dtype=torch.int64),
                torch.as_tensor(top_p, dtype=torch.float32),
                torch.as_tensor(min_p, dtype=torch.float32),
                bitmask,
                target,
            )
            .double()
            .numpy()
        )
        exact_logits = x.float().double().numpy()
        for row in range(n):
            want = truncated_distribution(
                exact_logits[row],
                float(np.float32(temperature[row])),
                int(top_k[row]),
                float(np.float32(top_p[row])),
                float(np.float32(min_p[row])),
                None if allowed is None else allowed[row],
            )
            rows_checked += 1
            if not np.array_equal(got[row] > 0, want > 0):
                failures.append(
                    f"{label} row {row}: kept set differs ({int((got[row] > 0).sum())} vs {int((want > 0).sum())} tokens)"
                )
                continue
            error = np.abs(got[row] - want)
            worst_abs = max(worst_abs, float(error.max()))
            if not np.all(error <= 2e-6 + 1e-4 * want):
                failures.append(f"{label} row {row}: probabilities differ by {error.max():.3g}")

    vocab = 40
    grid = list(
        itertools.product([0.0, 0.3, 1.0, 2.5], [-1, 1, 3, vocab, vocab + 5], [1.0, 0.9, 0.5, 0.05], [0.0, 0.1, 0.6])
    )
    if quick:
        grid = grid[::3]
    params = [np.array(column) for column in zip(*grid)]
    for ties, dtype in [(False, torch.float32), (True, torch.float32), (False, torch.float16), (False, torch.bfloat16)]:
        logits = rng.normal(0, 2, size=(len(grid), vocab))
        logits = np.round(logits) if ties else logits
        compare(logits, *params, None, dtype, f"grid ties={ties} {dtype}")
    n, vocab = (8, 5000) if quick else (48, 5000)
    allowed = rng.random((n, vocab)) < 0.7
    compare(
        rng.normal(0, 3, size=(n, vocab)),
        rng.choice([0.5, 1.0, 1.7], size=n),
        rng.choice([-1, 1, 7, 100, 4000], size=n),
        rng.choice([1.0, 0.95, 0.7, 0.2], size=n),
        rng.choice([0.0, 0.01, 0.3], size=n),
        allowed,
        torch.float32,
        "V=5000 masked",
    )

    flat = nucleus_conditions(target, vocab=256_000, rows=2 if quick else 8, top_p=0.99, scale=1e-2)
    if flat["worst_excess"] > 1e-5 or flat["worst_deficit"] > 1e-5 or not flat["threshold_sets"]:
        failures.append(
            f"nearly flat 256k vocabulary, top_p 0.99: kept set off by {max(flat['worst_excess'], flat['worst_deficit']):.3g} of the mass"
        )

    # greedy rows are the argmax; keyed uniforms are bit-identical to the CPU's
    logits = torch.randn(64, 3000, generator=torch.Generator().manual_seed(3))
    logits[::3, 7] = logits[::3].amax(-1) + 0  # ties with the max: the lowest id wins
    with running_on(target):
        greedy = sv.sample(to_target(logits, target), 0.0, -1, 1.0, 0).cpu()
    if not torch.equal(greedy, logits.argmax(-1)):
        failures.append("greedy sample is not the argmax")
    keys = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63)] + list(range(1000)), dtype=torch.int64)
    for stream in (STREAM_TARGET, STREAM_ACCEPT, STREAM_RESIDUAL):
        if not torch.equal(sv.keyed_uniform(to_target(keys, target), stream).cpu(), sv.keyed_uniform(keys, stream)):
            failures.append(f"keyed_uniform stream {stream} differs from the CPU")
    return dict(rows=rows_checked, worst_abs_error=worst_abs, flat_256k=flat, failures=failures, passed=not failures)


def nucleus_conditions(target: Target, vocab: int, rows: int, top_p: float, scale: float, seed: int = 0) -> dict:
    """SPEC §2 step 4 on a nearly flat vocabulary, in float64 on the float32 weights exp((x - max) / T):
    the kept set is {w >= t}; its mass reaches top_p; the mass strictly above t does not (else t could
    be higher). Returns the worst relative excess / deficit (each should be <= ~1e-6)."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    probs = run_truncated_probs(
        logits, torch.ones(rows), torch.full((rows,), -1), torch.full((rows,), top_p), None, None, target
    )
    weights = torch.exp(logits - logits.amax(-1, keepdim=True)).double()
    worst_excess, worst_deficit, threshold_sets = -1.0, -1.0, True
    for row in range(rows):
        w, kept = weights[row], probs[row] > 0
        total, t = w.sum(), w[kept].min()
        worst_excess = max(worst_excess, float((w[w > t].sum() / total) / top_p - 1))
        worst_deficit = max(worst_deficit, float(1 - (w[kept].sum() / total) / top_p))
        threshold_sets &= bool(torch.equal(kept, w >= t))
    return dict(
        vocab=vocab,
        rows=rows,
        top_p=top_p,
        worst_excess=worst_excess,
        worst_deficit=worst_deficit,
        threshold_sets=threshold_sets,
    )
