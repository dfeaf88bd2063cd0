"""The law of block verification (Sun et al. 2024): survival ``P(N >= i) = E[p_i]``.

The assumptions and formulas are stated in :mod:`specverify.law`.
"""

from typing import NamedTuple

import numpy as np

from .chain import _normalized_rows, _rates, acceptance_rates, mean_accepted


class BlockLaw(NamedTuple):
    survival: np.ndarray  # [K+1] P(N >= i), i = 0..K (survival[0] = 1)
    error: float  # |true - survival[i]| <= error for every i (0.0: exact up to float64 rounding)
    method: str  # "support" or "grid"

    @property
    def mean(self) -> float:
        """E[N] = sum_{i=1..K} P(N >= i)."""
        return float(self.survival[1:].sum())

    @property
    def pmf(self) -> np.ndarray:
        return survival_pmf(self.survival)


def survival_pmf(survival):
    """``[K+1]`` P(N = n) from ``[K+1]`` P(N >= n): consecutive differences, P(N >= K+1) = 0."""
    s = np.asarray(survival, dtype=np.float64)
    return np.clip(s - np.append(s[1:], 0.0), 0.0, None)


def token_survival(a):
    """``[K+1]`` P(N >= i) = prod_{j<i} a_j of token-wise verification, rates ``a`` ``[K]``."""
    return np.concatenate([[1.0], np.cumprod(_rates(a))])


def _ratio_supports(target_probs, draft_probs):
    """Per position j < K: the ratios r = p_j(x) / q_j(x) and weights q_j(x) over x with q_j(x) > 0."""
    q = _normalized_rows(draft_probs, "draft_probs")
    p = _normalized_rows(target_probs, "target_probs")[: q.shape[0]]
    if p.shape != q.shape:
        raise ValueError(f"target_probs rows {p.shape} do not match draft_probs {q.shape}")
    out = []
    for pj, qj in zip(p, q):
        drawn = qj > 0
        out.append((pj[drawn] / qj[drawn], qj[drawn]))
    return out


def block_survival(target_probs, draft_probs, *, max_support=200_000, log_step=1e-4, log_floor=-30.0):
    """P(N >= i), i = 0..K, of block verification with per-position rows.

    target_probs: ``[K+1, V]`` or ``[K, V]`` (only the first K rows matter); draft_probs ``[K, V]``
    (rows normalized first).  ``p_i = min(1, p_{i-1} r_{i-1}(X))`` with ``X ~ q_{i-1}`` is a
    capped multiplicative random walk (here independent steps, as for :func:`acceptance_rates`).

    - "support": while the walk's support (distinct values of ``p_i``) stays below
      ``max_support`` it is carried exactly (values merged when equal): exact up to float64
      rounding; ``error = 0``.
    - "grid": otherwise ``log p`` is carried on the lattice ``log_step * Z`` twice: once with every
      ``log r`` rounded down (values below ``exp(log_floor)`` sent to 0) and once rounded up (values
      below kept at ``exp(log_floor)``).  ``p_i`` is non-decreasing in ``p_{i-1}`` and in ``r``, so
      the two walks bracket the true ``E[p_i]``: the result is their midpoint, ``error`` half
      their largest gap (about ``i * log_step * E[p_i] / 2``: ~2e-4 at K = 8 by default).
    """
    steps = _ratio_supports(target_probs, draft_probs)
    survival = [1.0]
    values, probs = np.array([1.0]), np.array([1.0])
    for j, (r, w) in enumerate(steps):
        if values.size * r.size > max_support:
            return _block_survival_grid(steps, survival, j, values, probs, log_step, log_floor)
        new = np.minimum(1.0, np.outer(values, r)).ravel()
        values, inverse = np.unique(new, return_inverse=True)
        probs = np.bincount(inverse.ravel(), weights=np.outer(probs, w).ravel(), minlength=values.size)
        survival.append(float(values @ probs))
    return BlockLaw(np.array(survival), 0.0, "support")


def _block_survival_grid(steps, survival, start, values, probs, log_step, log_floor):
    """Continue :func:`block_survival` from position ``start`` on the log lattice (see there).

    Level ``l = 0..M`` stands for ``p = exp(-l * log_step)``; a step with ratio ``r`` moves level
    ``l`` to ``max(0, l - log(r) / log_step)``.  Mass that reaches ``p = 0`` (``r = 0``, or below
    the floor in the lower walk) adds nothing to ``E[p]`` and is dropped.  The steps are a
    convolution with the law of the (rounded) level shift, done by FFT (its rounding, ~1e-12,
    is far inside the bound).
    """
    from scipy.signal import fftconvolve

    m = int(np.ceil(-log_floor / log_step))
    s_max = m + 1  # |shift| beyond this gives the same result as s_max (cap, or below the floor)
    grid = np.exp(-log_step * np.arange(m + 1))  # [M+1] the value of each level
    bounds = []
    for upper in (False, True):
        # upper walk: smaller levels (larger p): levels rounded down, shifts rounded up
        positive = values > 0
        with np.errstate(divide="ignore"):
            levels = -np.log(values[positive]) / log_step
        levels = np.floor(levels) if upper else np.ceil(levels)
        weights = probs[positive]
        if not upper:
            levels, weights = levels[levels <= m], weights[levels <= m]
        mass = np.bincount(np.clip(levels, 0, m).astype(np.int64), weights=weights, minlength=m + 1)
        out = []
        for r, w in steps[start:]:
            drawn = r > 0
            shift = np.log(r[drawn]) / log_step
            shift = np.clip(np.ceil(shift) if upper else np.floor(shift), -s_max, s_max).astype(np.int64)
            kernel = np.bincount(s_max - shift, weights=w[drawn], minlength=2 * s_max + 1)
            conv = np.clip(fftconvolve(mass, kernel), 0.0, None)  # index c <-> level c - s_max
            new_levels = np.arange(conv.size) - s_max
            mass = np.zeros(m + 1)
            mass[0] = conv[new_levels <= 0].sum()
            inside = (new_levels > 0) & (new_levels <= m)
            mass[new_levels[inside]] = conv[inside]
            if upper:
                mass[m] += conv[new_levels > m].sum()
            out.append(float(mass @ grid))
        bounds.append(np.array(out))
    lo, hi = bounds
    err = float(np.max(hi - lo) / 2) if lo.size else 0.0
    return BlockLaw(np.concatenate([survival, (lo + hi) / 2]), err, "grid")


def _survival_walk(target_row, draft_row, k, step):
    """Enumerate every draft path of length k: ``survival[i] = E[s_i]`` with ``s_0 = 1`` and
    ``s_{i+1} = step(s_i, p_i(x), q_i(x))`` for the drawn x (p, q normalized rows)."""
    survival = np.zeros(k + 1)

    def walk(prefix, prob, s):
        survival[len(prefix)] += prob * s
        if len(prefix) == k:
            return
        p = np.asarray(target_row(prefix), dtype=np.float64)
        q = np.asarray(draft_row(prefix), dtype=np.float64)
        p, q = p / p.sum(), q / q.sum()
        for x in np.flatnonzero(q > 0):
            walk(prefix + (int(x),), prob * q[x], step(s, p[x], q[x]))

    walk((), 1.0, 1.0)
    return survival


def block_survival_markov(target_row, draft_row, k):
    """``[K+1]`` P(N >= i) of block verification when rows depend on the drafted prefix.

    ``target_row(prefix)`` and ``draft_row(prefix)``: ``[V]`` rows (any positive scale) after the
    drafted tuple ``prefix``.  Exact enumeration of the ``V^K`` paths (small V and K only).
    """
    return _survival_walk(target_row, draft_row, k, lambda s, p, q: min(1.0, s * p / q))


def token_survival_markov(target_row, draft_row, k):
    """As :func:`block_survival_markov` for token-wise verification: ``E[prod_j min(1, r_j)]``."""
    return _survival_walk(target_row, draft_row, k, lambda s, p, q: s * min(1.0, p / q))


def block_gain(target_probs, draft_probs, **kwargs):
    """``(E[N_block], E[N_token], error)`` for per-position rows: the gain is the difference."""
    block = block_survival(target_probs, draft_probs, **kwargs)
    token = mean_accepted(acceptance_rates(target_probs, draft_probs))
    return block.mean, token, block.error * (len(block.survival) - 1)
