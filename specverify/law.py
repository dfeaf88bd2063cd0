"""The analytic law of speculative (rejection) sampling.

Assumptions: within a round, position ``i`` has a fixed normalized target distribution ``p_i`` and
draft distribution ``q_i`` (they do not depend on which tokens were drawn — true for the
synthetic experiments, an approximation for real models), and the draft tokens are drawn from
``q_i``.  Then position ``i`` accepts independently with probability

    a_i = sum_v min(p_i(v), q_i(v)) = 1 - TV(p_i, q_i),

and the number N of accepted drafts in a round of K has the truncated-geometric law

    P(N = n) = (prod_{j<n} a_j) (1 - a_n)    for 0 <= n < K,
    P(N = K) =  prod_{j<K} a_j,

with mean  E[N] = sum_{i=1..K} prod_{j<i} a_j  (homogeneous: sum_{i=1..K} a^i) and
tokens per round  E[N] + 1  (each round also emits a recovered or bonus token).

Block verification (Sun et al. 2024, ``specverify.accept_block``) has, with
``p_i = min(1, p_{i-1} p_{i-1}(X_{i-1}) / q_{i-1}(X_{i-1}))`` (``p_0 = 1``, X drawn from the draft),

    P(N >= i) = E[p_i]    (the capped cumulative ratio, averaged over the draft's paths),

so E[N] = sum_{i=1..K} E[p_i] and P(N = n) = E[p_n] - E[p_{n+1}] (``p_{K+1} = 0``).  Since
``p_i >= p_{i-1} min(1, r_i)``, pointwise ``p_i >= prod_{j<=i} min(1, r_j)``: block verification
never accepts less than token-wise in expectation (equal for K = 1 and for one-hot drafts, where
``p_i = prod_j p_j(t_j)``).  Functions: :func:`block_survival` (per-position rows: exact on the
finite support of ``p_i`` when it is small, else on a log grid with a proven error bound),
:func:`block_survival_markov` / :func:`token_survival_markov` (any draft path dependence, by
enumeration), :func:`survival_pmf`, :func:`block_gain`.
"""

from typing import NamedTuple

import numpy as np

__all__ = [
    "acceptance_rates",
    "total_variation",
    "accepted_length_pmf",
    "mean_accepted",
    "var_accepted",
    "expected_tokens_per_round",
    "mean_accepted_homogeneous",
    "BlockLaw",
    "block_survival",
    "block_survival_markov",
    "token_survival_markov",
    "token_survival",
    "survival_pmf",
    "block_gain",
]


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


# ------------------------------------------------------------------------------------------
# Block verification
# ------------------------------------------------------------------------------------------
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
