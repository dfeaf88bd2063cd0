"""Wall-clock: the speed-up model ``f(K)`` and the optimal draft length.

The assumptions and formulas are stated in :mod:`specverify.law`.
"""

import math
from typing import NamedTuple

import numpy as np

from .chain import _rates


def _survival(rates, survival):
    """``[K]`` ``S_i = P(N >= i)``, i = 1..K, from per-position rates or given directly."""
    if (rates is None) == (survival is None):
        raise ValueError("give exactly one of rates (per-position acceptance) and survival (P(N >= i))")
    if rates is not None:
        return np.cumprod(_rates(rates))
    s = np.atleast_1d(np.asarray(survival, dtype=np.float64))
    if s.ndim != 1 or np.any(~np.isfinite(s)) or np.any(s < 0) or np.any(s > 1):
        raise ValueError("survival must be a 1-D sequence of probabilities P(N >= i), i = 1..K, in [0, 1]")
    if np.any(np.diff(s) > 1e-12):
        raise ValueError("survival P(N >= i) must be non-increasing in i (did you pass rates?)")
    return s


def _cost_values(cost, ns, name):
    """``cost`` at the counts ``ns`` (``[n]`` ints >= 1): scalar per unit, ``[>= max n]`` array of
    the costs of 1, 2, ... units, or a callable of the count."""
    ns = np.asarray(ns, dtype=np.int64)
    if callable(cost):
        values = np.array([float(cost(int(n))) for n in ns], dtype=np.float64)
    elif np.ndim(cost) == 0:
        values = float(cost) * ns.astype(np.float64)
    else:
        arr = np.asarray(cost, dtype=np.float64)
        if arr.ndim != 1 or arr.size < (ns.max() if ns.size else 0):
            raise ValueError(f"{name} as an array must be 1-D with the costs of 1..{ns.max()} units, got shape {arr.shape}")
        values = arr[ns - 1]
    if np.any(~np.isfinite(values)) or np.any(values < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    return values


def speedup_curve(rates=None, c=0.0, target_cost=None, *, survival=None, proposed=None):
    """``[K+1]`` modelled speed-up ``f(k)`` for draft lengths ``k = 0..K`` (``f(0) = 1``).

    rates:       ``[K]`` per-position acceptance ``a_i`` (token-wise verification:
                 ``P(N >= i) = prod_{j<=i} a_j``); or instead
    survival:    ``[K]`` ``P(N >= i)`` directly, i = 1..K (non-increasing): block verification's
                 ``E[p_i]``, a tree's accepted depth, or rates measured from a decoder's rounds.
    c:           the draft's cost when asked for k tokens, in units of one single-token target
                 pass: a scalar per token (``D(k) = c k``), ``[K]`` costs ``D(1..K)``, or a
                 callable ``D(k)``. Asking for nothing costs nothing (``D(0) = 0``).
    target_cost: the cost ``T(n)`` of a target pass scoring n tokens (``[K+1]`` array of
                 ``T(1..K+1)`` or a callable), relative to ``T(1) = 1``; default 1 for every n.
    proposed:    ``[K]`` ``P(M >= i)``: the probability that position i is proposed at all when
                 k >= i are asked for (drafts that may propose fewer, like prompt lookup);
                 default 1. Only the target's cost depends on it; ``survival <= proposed``.

    ``f(k) = (1 + sum_{i<=k} S_i) / (D(k) + T(1) + sum_{i<=k} P(M >= i) (T(i+1) - T(i)))``:
    expected tokens per round over expected time per round, the time of plain decoding per
    token being ``T(1) = 1``.
    """
    s = _survival(rates, survival)  # [K]
    k = s.size
    ks = np.arange(1, k + 1)
    if proposed is None:
        pm = np.ones(k)
    else:
        pm = np.atleast_1d(np.asarray(proposed, dtype=np.float64))
        if pm.shape != s.shape or np.any(~np.isfinite(pm)) or np.any(pm < 0) or np.any(pm > 1):
            raise ValueError(f"proposed must be [{k}] probabilities P(M >= i), got shape {pm.shape}")
        if np.any(np.diff(pm) > 1e-12) or np.any(s > pm + 1e-12):
            raise ValueError("proposed P(M >= i) must be non-increasing and at least survival P(N >= i)")
    draft = np.concatenate([[0.0], _cost_values(c, ks, "c")])  # D(0..K)
    if target_cost is None:
        target = np.ones(k + 1)
    else:
        target = _cost_values(target_cost, np.arange(1, k + 2), "target_cost")  # T(1..K+1)
        if not math.isclose(target[0], 1.0, rel_tol=1e-9):
            raise ValueError(f"target_cost(1) must be 1 (costs are relative to a one-token pass), got {target[0]!r}; "
                             "divide by it")
    return np.array(_speedup_values(s.tolist(), pm.tolist(), draft[1:].tolist(), target.tolist()))


def _speedup_values(survival, proposed, draft, target) -> list:
    """``speedup_curve``'s ``f(0..K)`` from checked lists: survival ``S_1..S_K``, proposed
    ``P(M >= 1..K)``, draft ``D(1..K)``, target ``T(1..K+1)`` with ``T(1) = 1``. A plain loop:
    :class:`specverify.decoding.adaptive.AdaptiveK` calls it every round, right after a target pass has
    evicted the caches, where NumPy's per-call overhead is most of the cost."""
    curve = [1.0]
    tokens = time = 0.0  # running sums of S_i and of P(M >= i) (T(i+1) - T(i))
    for i, s in enumerate(survival):
        tokens += s
        time += proposed[i] * (target[i + 1] - target[i])
        curve.append((1.0 + tokens) / ((draft[i] + 1.0) + time))
    return curve


def speedup(rates=None, c=0.0, target_cost=None, *, survival=None, proposed=None, drafted=None) -> float:
    """The modelled speed-up over plain decoding of rounds drafting ``K = len(rates)`` tokens.

    Expected tokens per round over expected time per round (see :func:`speedup_curve` for the
    arguments). With ``rates = [a] * K``, scalar ``c`` and no ``target_cost`` this is
    Leviathan et al.'s ``(1 - a^{K+1}) / ((1 - a)(K c + 1))``.

    ``drafted``: a round that drafts ``N`` tokens however deep it accepts, e.g. a tree of ``N``
    nodes whose accepted depth has ``survival`` (from :func:`tree_length_pmf`): then
    ``f = (1 + sum_i survival_i) / (D(N) + T(N + 1))``, ``c`` and ``target_cost`` evaluated at N.
    """
    if drafted is None:
        return float(speedup_curve(rates, c, target_cost, survival=survival, proposed=proposed)[-1])
    if proposed is not None or int(drafted) != drafted or drafted < 0:
        raise ValueError(f"drafted must be a node count >= 0 and excludes proposed, got {drafted!r}")
    n = int(drafted)
    tokens = 1.0 + _survival(rates, survival).sum()
    draft = _cost_values(c, [n], "c")[0] if n else 0.0
    target = 1.0 if target_cost is None else _cost_values(target_cost, [1, n + 1], "target_cost")
    if target_cost is not None:
        if not math.isclose(target[0], 1.0, rel_tol=1e-9):
            raise ValueError(f"target_cost(1) must be 1 (costs are relative to a one-token pass), got {target[0]!r}")
        target = target[1]
    return float(tokens / (draft + target))


class Optimum(NamedTuple):
    """The best draft length ``k`` (``math.inf`` when f grows without bound) and ``f(k)``."""

    k: float
    speedup: float


def _homogeneous_f(a, c, k):
    return (1.0 - a ** (k + 1)) / ((1.0 - a) * (k * c + 1.0))


def optimal_k_continuous(a: float, c: float) -> float:
    """The real maximizer of Leviathan's ``f(x) = (1 - a^{x+1}) / ((1 - a)(x c + 1))``, for ``c < a < 1``.

    With ``L = -ln a`` and ``s = 1 + (1 - c) L / c``, setting ``f'(x) = 0`` gives
    ``(y / c) e^{-y / c} = e^{-s}`` for ``y = L (c (x + 1) + 1 - c) + c > c``, so
    ``-y / c = W_{-1}(-e^{-s})`` (the lower branch, since ``-y / c < -1``) and

        x* = (-c W_{-1}(-e^{-s}) - c - (1 - c) L) / (c L) - 1  =  ln(t) / L - 1,

    with ``t = -W_{-1}(-e^{-s}) > 1`` (the second form because ``t - ln t = s``; it avoids the
    cancellation of the first when c is small). When ``e^{-s}`` underflows, t solves
    ``t - ln t = s`` by the fixed point ``t <- s + ln t`` (fast for large s).
    """
    from scipy.special import lambertw

    a, c = float(a), float(c)
    if not (0.0 < c < a < 1.0):
        raise ValueError(f"the interior optimum needs 0 < c < a < 1, got a={a!r}, c={c!r}")
    big_l = -math.log(a)
    s = 1.0 + (1.0 - c) * big_l / c
    if s < 700.0:
        t = -float(lambertw(-math.exp(-s), k=-1).real)
    else:
        t = s
        for _ in range(100):
            t_new = s + math.log(t)
            if abs(t_new - t) <= 1e-15 * t_new:
                break
            t = t_new
    return math.log(t) / big_l - 1.0


def optimal_k(a, c=0.0, target_cost=None, *, survival=None, proposed=None, k_max=None) -> Optimum:
    """The draft length maximizing the modelled speed-up, and that speed-up.

    Homogeneous case (scalar ``a``, scalar ``c``, no ``target_cost``, ``survival`` or
    ``proposed``): Leviathan's ``f(K) = (1 - a^{K+1}) / ((1 - a)(K c + 1))`` is maximized in
    closed form by :func:`optimal_k_continuous` (Lambert W, lower branch), then the better of
    its floor and ceiling (ties to the smaller K). Edges:

    - ``c >= a`` (including ``a = 0``): no K beats plain decoding (``sum_{i<=K} a^i <= K a <= K c``),
      ``K* = 0``, ``f = 1``;
    - ``a = 1`` and ``c < 1``, or ``c = 0`` and ``0 < a < 1``: f grows without bound in K:
      ``K* = inf`` with ``f`` its supremum (``1 / c``, ``1 / (1 - a)``, or ``inf`` when both);
    - ``k_max`` caps the answer (f is unimodal in K here, so the cap is the capped optimum).

    General case (``a`` a ``[K]`` sequence of per-position rates or ``a=None`` with ``survival``,
    array or callable costs, ``proposed``): a scan of :func:`speedup_curve` over ``k = 0..K``
    with ``K = len(a)`` (or ``k_max`` for a scalar ``a``); ties go to the smaller k.
    """
    if k_max is not None and (int(k_max) != k_max or k_max < 0):
        raise ValueError(f"k_max must be a non-negative integer, got {k_max!r}")
    homogeneous = (a is not None and np.ndim(a) == 0 and survival is None and proposed is None
                   and target_cost is None and np.ndim(c) == 0 and not callable(c))
    if not homogeneous:
        if a is not None and np.ndim(a) == 0:
            if k_max is None:
                raise ValueError("a scalar rate with position- or length-dependent costs needs k_max")
            a = np.full(int(k_max), float(a))
        f = speedup_curve(a, c, target_cost, survival=survival, proposed=proposed)
        if k_max is not None:
            f = f[: int(k_max) + 1]
        k = int(np.argmax(f))  # first maximum: the smaller k on ties
        return Optimum(k, float(f[k]))

    a, c = float(a), float(c)
    if not 0.0 <= a <= 1.0 or not c >= 0.0 or not math.isfinite(c):
        raise ValueError(f"need a in [0, 1] and a finite c >= 0, got a={a!r}, c={c!r}")
    cap = math.inf if k_max is None else int(k_max)
    if c >= a:
        return Optimum(0, 1.0)
    if a == 1.0 or c == 0.0:  # f increases with K
        if cap < math.inf:
            return Optimum(cap, float(_homogeneous_f(a, c, cap)) if a < 1.0 else (cap + 1) / (cap * c + 1.0))
        return Optimum(math.inf, 1.0 / c if a == 1.0 and c > 0.0 else (1.0 / (1.0 - a) if a < 1.0 else math.inf))
    x = optimal_k_continuous(a, c)
    lo = max(0, min(math.floor(x), cap))
    hi = max(0, min(math.ceil(x), cap))
    f_lo, f_hi = _homogeneous_f(a, c, lo), _homogeneous_f(a, c, hi)
    return Optimum(lo, float(f_lo)) if f_lo >= f_hi else Optimum(hi, float(f_hi))
