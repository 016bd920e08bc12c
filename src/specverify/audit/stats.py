"""Goodness of fit of observed counts against an exact law: TV distance, chi-square, and power. The one
chi-square of the repository: the audit, the device check (specverify.check) and the tests use it.

One `fit` answers three questions about n samples whose exact law is known:
- how far are they (total-variation distance), and how far would exact samples be (its expectation);
- are they consistent with the law (chi-square p-value, bins with expected count < 5 pooled);
- how large a deviation could this test see (the detectable TV, defined below).

**Pooling.** Bins expected to hold fewer than 5 samples are pooled into one; when that pool itself
expects fewer than 5 it is merged into the smallest other bin, so that every bin of the test expects at
least 5. A small pool left as a bin of its own would be a bin where the chi-square approximation fails:
one sample in a pool expecting 0.01 adds ~100 to the statistic, a false alarm that a correct sampler
would raise far more often than the test's level says.

**Detectable TV.** The smallest total-variation distance delta such that *every* law at TV >= delta from
the exact one (measured on the test's pooled bins) is flagged at the test's level with probability >= 80%.
Why it holds: the chi-square statistic of n samples from a law p1 is approximately noncentral chi-square
with noncentrality n * chi2(p1 || p0) >= 4 n TV(p1, p0)^2 (Cauchy-Schwarz), so delta = sqrt(lambda* / 4n)
where lambda* is the noncentrality that gives 80% power (the asymptotic approximation is the only one
made). The rows needed to detect a given delta are therefore lambda* / (4 delta^2). A law with a single
bin (a greedy row) is tested exactly: any sample elsewhere has probability 0, so delta is the deviation
seen at least once in n samples with probability 80%, 1 - 0.2^(1/n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

#: The probability with which a deviation of the detectable TV is flagged.
POWER = 0.8
#: Bins expected to hold fewer samples than this are pooled (the chi-square approximation needs ~5).
MIN_EXPECTED = 5.0
#: Fixed levels of the checks outside the audit (the device check, the tests): a correct sampler passes
#: each chi-square test at PASS_P_VALUE; a known-wrong variant, at the same sample size, falls below
#: POWER_P_VALUE.
PASS_P_VALUE = 1e-4
POWER_P_VALUE = 1e-6


@dataclass(frozen=True)
class Fit:
    """n samples against an exact law. p_value is 0 when a sample fell where the law is 0."""

    n: int
    tv: float
    null_tv: float  # expected TV of n samples drawn from the exact law itself
    p_value: float
    bins: int  # after pooling
    detectable_tv: float  # at the level the fit was judged at; 1.0 when n == 0


def total_variation(counts: np.ndarray, law: np.ndarray) -> float:
    """TV between the empirical law of `counts` [V] and `law` [V]; 0 when there are no samples."""
    n = counts.sum()
    return float(0.5 * np.abs(counts / n - law).sum()) if n else 0.0


def null_total_variation(law: np.ndarray, n: int) -> float:
    """E[TV] of n samples of `law` [V] from the law itself, exactly: each count is Binomial(n, p) and
    E|X - np| = 2 m (1 - p) P(X = m) with m = floor(np) + 1 (de Moivre)."""
    if n == 0:
        return 0.0
    law = np.asarray(law, dtype=np.float64)
    law = law[(law > 0) & (law < 1)]  # a count of a certain or impossible bin never deviates
    m = np.floor(n * law) + 1
    return float((m * (1 - law) * stats.binom.pmf(m, n, law)).sum() / n)


def pooled_bins(counts: np.ndarray, law: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(observed, expected) over bins with expected >= 5 plus one bin pooling the rest; a pool still
    below 5 is merged into the smallest big bin. counts, law: [V] -> two float64 [bins]."""
    expected = law * counts.sum()
    big = expected >= MIN_EXPECTED
    observed, wanted = counts[big].astype(np.float64), expected[big]
    pool_observed, pool_expected = counts[~big].sum(), expected[~big].sum()
    if pool_expected >= MIN_EXPECTED or len(wanted) == 0:
        return np.append(observed, pool_observed), np.append(wanted, pool_expected)
    smallest = int(np.argmin(wanted))
    observed[smallest] += pool_observed
    wanted[smallest] += pool_expected
    return observed, wanted


def chi_square_p_value(counts: np.ndarray, law: np.ndarray) -> tuple[float, int]:
    """(p-value, bins) of counts [V] against law [V]; p = 0 when a sample fell where the law is 0."""
    if counts[law == 0].sum() > 0:
        return 0.0, int((law > 0).sum()) + 1
    observed, expected = pooled_bins(counts, law)
    keep = expected > 0
    if keep.sum() < 2:
        return 1.0, int(keep.sum())
    return float(stats.chisquare(observed[keep], expected[keep]).pvalue), int(keep.sum())


def samples_p_value(samples: np.ndarray, law: np.ndarray) -> float:
    """chi_square_p_value of token ids (int, any shape) against law [V]."""
    law = np.asarray(law, dtype=np.float64)
    counts = np.bincount(np.asarray(samples).reshape(-1), minlength=len(law))
    return chi_square_p_value(counts, law)[0]


def detectable_tv(n: int, bins: int, level: float) -> float:
    """The detectable TV (module docstring) of a chi-square test with `bins` bins at `level` on n samples."""
    if n == 0:
        return 1.0
    if bins < 2:
        return float(1 - (1 - POWER) ** (1 / n))
    dof = bins - 1
    critical = stats.chi2.isf(level, dof)

    def shortfall(noncentrality):
        return stats.ncx2.sf(critical, dof, noncentrality) - POWER

    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    noncentrality = optimize.brentq(shortfall, 0.0, high, xtol=1e-6)
    return float(min(1.0, np.sqrt(noncentrality / (4 * n))))


def fit(counts: np.ndarray, law: np.ndarray, level: float) -> Fit:
    """All of the above for counts [V] (int) against an exact law [V] (float64), judged at `level`."""
    counts = np.asarray(counts)
    law = np.asarray(law, dtype=np.float64)
    n = int(counts.sum())
    p_value, bins = chi_square_p_value(counts, law) if n else (1.0, 0)
    return Fit(
        n=n,
        tv=total_variation(counts, law),
        null_tv=null_total_variation(law, n),
        p_value=p_value,
        bins=bins,
        detectable_tv=detectable_tv(n, bins, level),
    )
