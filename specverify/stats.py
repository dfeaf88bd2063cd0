"""Goodness-of-fit helpers used by the tests and the experiments: statistics on counts.

A chi-square test is only valid on counts (never on frequencies: dividing by N shrinks the
statistic by N and the test can then essentially never fail) and only when every bin's expected
count is not too small; bins below ``min_expected`` are merged, smallest first.
"""

from typing import NamedTuple

import numpy as np


class GoodnessOfFit(NamedTuple):
    statistic: float
    dof: int
    pvalue: float
    n_bins: int  # after merging


def merge_small_bins(observed, expected, min_expected=5.0):
    """Merge bins whose expected count is below ``min_expected``.

    observed, expected: ``[B]`` counts (expected sums to observed's total).  All bins below
    ``min_expected`` are pooled into one bin; if the pool itself is still short, it is folded
    into the smallest remaining bin.  Returns the merged ``(observed, expected)``.
    """
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    small = expected < min_expected
    obs, exp = list(observed[~small]), list(expected[~small])
    pooled_obs, pooled_exp = observed[small].sum(), expected[small].sum()
    if small.any():
        if pooled_exp >= min_expected or not exp:
            obs.append(pooled_obs)
            exp.append(pooled_exp)
        else:
            j = int(np.argmin(exp))
            obs[j] += pooled_obs
            exp[j] += pooled_exp
    return np.array(obs), np.array(exp)


def chisquare_counts(counts, probs, min_expected=5.0):
    """Pearson chi-square goodness of fit of ``counts`` to the law ``probs``.

    counts: ``[B]`` non-negative integer counts.  probs: ``[B]`` probabilities (normalized here).
    A count in a bin of zero probability is an impossible outcome: p-value 0.
    """
    from scipy import stats

    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts.shape != probs.shape or counts.ndim != 1:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} must be matching 1-D arrays")
    if np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise ValueError("counts must be non-negative integers (a chi-square test needs counts)")
    total = counts.sum()
    probs = probs / probs.sum()
    if np.any(counts[probs == 0] > 0):
        return GoodnessOfFit(float("inf"), max(int((probs > 0).sum()) - 1, 0), 0.0, int((probs > 0).sum()))
    support = probs > 0
    obs, exp = merge_small_bins(counts[support], total * probs[support], min_expected)
    if obs.size < 2:
        return GoodnessOfFit(0.0, 0, 1.0, int(obs.size))
    statistic = float(((obs - exp) ** 2 / exp).sum())
    dof = int(obs.size - 1)
    return GoodnessOfFit(statistic, dof, float(stats.chi2.sf(statistic, dof)), int(obs.size))


def mean_z_score(samples_mean, law_mean, law_variance, n):
    """z = (empirical mean - law mean) / sqrt(law variance / n)."""
    se = np.sqrt(law_variance / n)
    return float((samples_mean - law_mean) / se) if se > 0 else (0.0 if samples_mean == law_mean else float("inf"))
