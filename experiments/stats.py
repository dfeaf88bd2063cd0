"""The statistics of the experiments: chi-square on counts, z-scores, TV, KS uniformity.

Goodness of fit is always computed on *counts* against ``N * pmf`` (never on frequencies, which
make the statistic ``N`` times too small to ever fail), with small-expectation bins merged; the
test itself is :mod:`specverify.stats`, shared with the package's own tests.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as _st

MIN_EXPECTED = 5.0


def chisquare_counts(counts, pmf, min_expected: float = MIN_EXPECTED):
    """Pearson chi-square of observed ``counts`` against the law ``pmf`` (any matching shapes).

    Thin wrapper of :func:`specverify.stats.chisquare_counts` (counts, not frequencies; bins with
    expectation below ``min_expected`` merged; an impossible outcome observed gives p = 0) that
    accepts multi-dimensional laws such as the joint law of a whole continuation. Returns its
    ``(statistic, dof, pvalue, n_bins)``.
    """
    from specverify import stats as svs

    counts = np.asarray(counts).ravel()
    pmf = np.asarray(pmf, dtype=np.float64).ravel()
    if counts.shape != pmf.shape:
        raise ValueError(f"counts {counts.shape} and pmf {pmf.shape} differ in shape")
    return svs.chisquare_counts(counts, pmf, min_expected)


def histogram(values, k: int) -> np.ndarray:
    """Counts of accepted lengths ``0..k``."""
    return np.bincount(np.asarray(values, dtype=np.int64), minlength=k + 1)


def zscore(sample_mean: float, n: int, law_mean: float, law_var: float) -> float:
    """(empirical mean - law mean) / law standard error, the s.e. being sqrt(law_var / n)."""
    from specverify import stats as svs

    return svs.mean_z_score(sample_mean, law_mean, law_var, n)


def tv_distance(counts, pmf) -> float:
    """Total variation between the empirical distribution of ``counts`` and ``pmf``."""
    counts = np.asarray(counts, dtype=np.float64)
    pmf = np.asarray(pmf, dtype=np.float64)
    return float(0.5 * np.abs(counts / counts.sum() - pmf / pmf.sum()).sum())


def positionwise_acceptance(counts) -> np.ndarray:
    """Empirical per-position acceptance from accepted-length counts ``[k+1]``.

    ``a_i = #(N > i) / #(N >= i)`` for ``i = 0..k-1`` (NaN where no round reached position i).
    """
    counts = np.asarray(counts, dtype=np.float64)
    reach = counts[::-1].cumsum()[::-1]  # reach[i] = #(N >= i)
    with np.errstate(invalid="ignore", divide="ignore"):
        return reach[1:] / reach[:-1]


def ks_uniform(pvalues) -> tuple[float, float]:
    """Kolmogorov-Smirnov test of ``pvalues`` against Uniform(0, 1): (statistic, p-value)."""
    res = _st.kstest(np.asarray(pvalues, dtype=np.float64), "uniform")
    return float(res.statistic), float(res.pvalue)
