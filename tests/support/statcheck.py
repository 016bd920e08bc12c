"""Statistical assertions for the tests: chi-square goodness of fit against exact float64 laws, with the
audit's one chi-square (specverify.audit.stats) and its fixed levels."""

from __future__ import annotations

import numpy as np

from specverify.audit.stats import PASS_P_VALUE, POWER_P_VALUE, samples_p_value

__all__ = ["PASS_P_VALUE", "POWER_P_VALUE", "assert_catches", "assert_follows", "samples_p_value"]


def assert_follows(samples: np.ndarray, law: np.ndarray, what: str) -> float:
    """Assert the samples (ids) are consistent with the law [V]; returns the p-value."""
    p_value = samples_p_value(samples, law)
    assert p_value > PASS_P_VALUE, f"{what}: chi-square p = {p_value:.3g} against the exact law (n = {len(samples)})"
    return p_value


def assert_catches(law_of_wrong_variant: np.ndarray, law: np.ndarray, n: int, seed: int, what: str) -> float:
    """Power: n samples of a known-wrong variant are rejected by the same test at the same size."""
    wrong = np.random.default_rng(seed).choice(len(law), size=n, p=law_of_wrong_variant)
    p_value = samples_p_value(wrong, law)
    assert p_value < POWER_P_VALUE, f"{what}: the wrong variant was not caught (p = {p_value:.3g}, n = {n})"
    return p_value
