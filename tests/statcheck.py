"""Statistical helpers for the tests: chi-square goodness of fit against exact float64 laws."""

from __future__ import annotations

import numpy as np

from specverify.audit import stats as audit_stats

#: A correct sampler passes at this level; a known-wrong variant must fall far below it.
PASS_P_VALUE = 1e-4
POWER_P_VALUE = 1e-6


def chi_square_p_value(samples: np.ndarray, law: np.ndarray) -> float:
    """p-value of `samples` (ids) against `law` [V], with the audit's pooling of small bins; a sample in
    a zero-probability bin gives p = 0."""
    law = np.asarray(law, dtype=np.float64)
    counts = np.bincount(np.asarray(samples).reshape(-1), minlength=len(law))
    return audit_stats.chi_square_p_value(counts, law)[0]


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
