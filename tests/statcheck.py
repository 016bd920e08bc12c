"""Statistical helpers for the tests: chi-square goodness of fit against exact float64 laws."""

from __future__ import annotations

import numpy as np
from scipy import stats

#: A correct sampler passes at this level; a known-wrong variant must fall far below it.
PASS_P_VALUE = 1e-4
POWER_P_VALUE = 1e-6


def chi_square_p_value(samples: np.ndarray, law: np.ndarray) -> float:
    """p-value of `samples` (ids) against `law` [V]. Bins with expected count < 5 are pooled; a sample in a
    zero-probability bin gives p = 0."""
    samples = np.asarray(samples).reshape(-1)
    law = np.asarray(law, dtype=np.float64)
    counts = np.bincount(samples, minlength=len(law)).astype(np.float64)
    if counts[law == 0].sum() > 0:
        return 0.0
    expected = law * len(samples)
    big = expected >= 5
    observed = np.concatenate([counts[big], [counts[~big].sum()]])
    expected = np.concatenate([expected[big], [expected[~big].sum()]])
    keep = expected > 0
    if keep.sum() < 2:
        return 1.0
    return float(stats.chisquare(observed[keep], expected[keep]).pvalue)


def assert_follows(samples: np.ndarray, law: np.ndarray, what: str) -> float:
    """Assert the samples are consistent with the law; returns the p-value."""
    p_value = chi_square_p_value(samples, law)
    assert p_value > PASS_P_VALUE, f"{what}: chi-square p = {p_value:.3g} against the exact law (n = {len(samples)})"
    return p_value


def assert_catches(law_of_wrong_variant: np.ndarray, law: np.ndarray, n: int, seed: int, what: str) -> float:
    """Power: n samples of a known-wrong variant are rejected by the same test at the same size."""
    wrong = np.random.default_rng(seed).choice(len(law), size=n, p=law_of_wrong_variant)
    p_value = chi_square_p_value(wrong, law)
    assert p_value < POWER_P_VALUE, f"{what}: the wrong variant was not caught (p = {p_value:.3g}, n = {n})"
    return p_value
