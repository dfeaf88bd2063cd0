"""The token-wise law: per-position acceptance and the truncated-geometric accepted length.

The assumptions and formulas are stated in :mod:`specverify.law`.
"""

import numpy as np


def _normalized_rows(x, name):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{name} must be [rows, V], got shape {x.shape}")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    mass = x.sum(axis=1, keepdims=True)
    if np.any(mass <= 0):
        raise ValueError(f"{name} has a row with zero mass")
    return x / mass


def acceptance_rates(target_probs, draft_probs):
    """Per-position acceptance ``a_i = sum_v min(p_i, q_i)``.

    target_probs: ``[K+1, V]`` or ``[K, V]`` (only the first K rows are used); draft_probs:
    ``[K, V]``.  Rows are normalized first.  Returns ``[K]`` float64.
    """
    q = _normalized_rows(draft_probs, "draft_probs")
    p = _normalized_rows(target_probs, "target_probs")[: q.shape[0]]
    if p.shape != q.shape:
        raise ValueError(f"target_probs rows {p.shape} do not match draft_probs {q.shape}")
    return np.minimum(p, q).sum(axis=1)


def total_variation(target_probs, draft_probs):
    """``TV(p_i, q_i) = 1/2 sum_v |p_i - q_i| = 1 - a_i`` per row, ``[K]``."""
    q = _normalized_rows(draft_probs, "draft_probs")
    p = _normalized_rows(target_probs, "target_probs")[: q.shape[0]]
    return 0.5 * np.abs(p - q).sum(axis=1)


def _rates(a):
    a = np.atleast_1d(np.asarray(a, dtype=np.float64))
    if a.ndim != 1 or np.any(~np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
        raise ValueError("acceptance rates must be a 1-D sequence in [0, 1]")
    return a


def accepted_length_pmf(a):
    """``[K+1]`` probabilities of accepting n = 0..K drafts, given rates ``a`` ``[K]``."""
    a = _rates(a)
    survive = np.concatenate([[1.0], np.cumprod(a)])  # prod_{j<n} a_j, n = 0..K
    pmf = survive.copy()
    pmf[:-1] *= 1.0 - a
    return pmf


def mean_accepted(a):
    """``E[N] = sum_{i=1..K} prod_{j<i} a_j``."""
    return float(np.cumprod(_rates(a)).sum())


def var_accepted(a):
    """``Var[N]`` from the pmf (used for standard errors of empirical means)."""
    pmf = accepted_length_pmf(a)
    n = np.arange(pmf.size)
    mean = float((n * pmf).sum())
    return float(((n - mean) ** 2 * pmf).sum())


def expected_tokens_per_round(a):
    """``E[N] + 1``: accepted drafts plus the recovered or bonus token."""
    return mean_accepted(a) + 1.0


def mean_accepted_homogeneous(alpha, k):
    """``sum_{i=1..k} alpha^i`` (every position accepts with the same ``alpha``)."""
    return mean_accepted(np.full(int(k), float(alpha)))
