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

Wall-clock (:func:`speedup`, :func:`optimal_k`): a round drafts up to K tokens and runs one
target pass scoring the drafts plus one; its speed-up over plain decoding (one target pass
scoring one token per emitted token) is

    f(K) = E[tokens per round] / E[time per round]
         = (1 + sum_{i=1..K} P(N >= i)) / (E[D(M)] + E[T(M + 1)]),

times in units of one single-token target pass (``T(1) = 1``), ``M <= K`` the tokens actually
proposed, ``D(m)`` the draft's cost for m tokens (``c m`` by default) and ``T(n)`` the target's
cost for a pass scoring n tokens (1 by default: free extra positions). Homogeneous rates, K
proposals every round, ``D(m) = c m`` and ``T = 1`` give Leviathan et al.'s Thm 3.8,
``f(K) = (1 - a^{K+1}) / ((1 - a)(K c + 1))``.
"""

import math
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
    "TREE_RULES",
    "tree_children",
    "tree_depths",
    "node_rule",
    "tree_node_probabilities",
    "depth_pmf",
    "child_acceptance",
    "rrs_acceptance",
    "optimal_multidraft_acceptance",
    "tree_length_pmf",
    "speedup",
    "speedup_curve",
    "optimal_k",
    "optimal_k_continuous",
    "Optimum",
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
# ---------------------------------------------------------------------------------------------
# Trees and multiple drafts (specverify.accept_tree / verify_tree_greedy).
#
# A tree of N nodes has ``parents [N]`` (``parents[i]`` in ``{-1} ∪ [0, i)``); position ``r`` is
# the root for r = 0 and node r - 1 otherwise; row r of ``target_probs`` / ``draft_probs``
# (``[N+1, V]``) is the target law / the children's draft law after position r.
#
# Node rules, for a position with target p, draft q and children c_1..c_k (R_0 = p):
#
# - "deterministic" (draft_probs None, sample-and-match): child j is accepted w.p.
#   p(c_j) / (1 - sum_{i<j} p(c_i)); on total rejection the token is drawn from p without the
#   children.  P(child j accepted) = p(c_j): over a tree, E[accepted] = sum over nodes of the
#   product of the target probabilities along the node's path.
# - "with_replacement" (SpecInfer): children i.i.d. from q; child j is accepted w.p.
#   min(1, R_{j-1}(c_j) / q(c_j)), else R_j = norm(max(R_{j-1} - q, 0)).  Marginally over the
#   draws a child is accepted w.p. a_j = sum_v min(R_{j-1}, q) and the position accepts one of
#   its k children w.p. 1 - prod_j (1 - a_j).
# - "without_replacement" (Jeon et al. 2024): as above with q^(j) = q without c_1..c_{j-1},
#   renormalized, in place of q (an expectation over the ordered draws: small V).
#
# For k i.i.d. drafts the best any verifier can do is 1 - max_S [q(S)^k - p(S)] (Khisti et al.
# 2025; Hu et al. 2025): ``optimal_multidraft_acceptance``.
# ---------------------------------------------------------------------------------------------

TREE_RULES = ("deterministic", "with_replacement", "without_replacement")


def _normalized(row, name):
    return _normalized_rows(row, name)[0]


def tree_children(parents):
    """``children[r]`` (node indices, increasing) for positions ``r = 0..N``; validates parents."""
    parents = np.asarray(parents)
    if parents.ndim != 1 or (parents.size and parents.dtype.kind not in "iu"):
        raise ValueError(f"parents must be a 1-D integer array, got shape {parents.shape}")
    children = [[] for _ in range(parents.size + 1)]
    for i, parent in enumerate(parents.tolist()):
        if not -1 <= parent < i:
            raise ValueError(f"parents[{i}] = {parent} is not -1 or an earlier node")
        children[parent + 1].append(i)
    return children


def _check_rule(rule):
    if rule not in TREE_RULES:
        raise ValueError(f"rule must be one of {TREE_RULES}, got {rule!r}")


def _minus_and_normalize(r, q):
    """norm(max(r - q, 0)); r itself if that has no mass (only reachable by rounding)."""
    d = np.maximum(r - q, 0.0)
    return d / d.sum() if d.sum() > 0 else r


def node_rule(target_row, draft_row, tokens, rule):
    """One position's rule for given children tokens.

    target_row, draft_row: ``[V]`` (normalized here; draft_row unused by "deterministic");
    tokens: ``[k]`` the children's tokens in order.  Returns ``(accept [k], residual [V])``:
    ``accept[j]`` = P(child j accepted | children before it rejected), ``residual`` the law of
    the recovered token when all k are rejected.
    """
    _check_rule(rule)
    p = _normalized(target_row, "target_row")
    tokens = [int(t) for t in np.atleast_1d(tokens)]
    accept = np.zeros(len(tokens))
    if rule == "deterministic":
        remaining = p.copy()
        for j, t in enumerate(tokens):
            mass = remaining.sum()
            accept[j] = p[t] / mass if mass > 0 else 0.0
            remaining[t] = 0.0
        return accept, (remaining / remaining.sum() if remaining.sum() > 0 else p)
    q = _normalized(draft_row, "draft_row")
    r = p
    for j, t in enumerate(tokens):
        accept[j] = min(1.0, r[t] / q[t]) if q[t] > 0 else float(r[t] > 0)
        r = _minus_and_normalize(r, q)
        if rule == "without_replacement":
            q = q.copy()
            q[t] = 0.0
            if q.sum() > 0:
                q /= q.sum()
    return accept, r


def tree_node_probabilities(target_probs, draft_probs, draft_tokens, parents, rule):
    """``[N]``: the probability that each node of a GIVEN tree is on the accepted path.

    target_probs ``[N+1, V]``, draft_probs ``[N+1, V]`` (or None for "deterministic"),
    draft_tokens, parents ``[N]``.  Their sum is E[accepted | tree]; for "deterministic" node i
    gets the product of the target probabilities of the tokens along its path.
    """
    children = tree_children(parents)
    tokens = np.asarray(draft_tokens).reshape(-1)
    reached = np.zeros(len(children))
    reached[0] = 1.0
    for r, kids in enumerate(children):  # topological: a position is final before its children
        if not kids or reached[r] == 0.0:
            continue
        draft_row = None if draft_probs is None else np.asarray(draft_probs)[r]
        accept, _ = node_rule(np.asarray(target_probs)[r], draft_row, tokens[kids], rule)
        survive = 1.0
        for i, a in zip(kids, accept):
            reached[i + 1] = reached[r] * survive * a
            survive *= 1.0 - a
    return reached[1:]


def tree_depths(parents):
    """``[N]`` depth of each node (children of the root have depth 1)."""
    depth = []
    for parent in np.asarray(parents).tolist():
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return np.array(depth, dtype=np.int64)


def depth_pmf(node_probabilities, parents):
    """Accepted-length pmf ``[max depth + 1]`` from the nodes' acceptance probabilities:
    P(N >= d) = sum of the nodes at depth d."""
    depth = tree_depths(parents)
    at_least = np.ones(int(depth.max(initial=0)) + 1)
    for d in range(1, at_least.size):
        at_least[d] = np.asarray(node_probabilities)[depth == d].sum()
    return at_least - np.append(at_least[1:], 0.0)


def _ordered_draws_without_replacement(q, k):
    """(tokens, probability) of every ordered draw of min(k, |supp q|) distinct tokens from q."""
    k = min(k, int((q > 0).sum()))

    def extend(prefix, prob, remaining):
        if len(prefix) == k:
            yield tuple(prefix), prob
            return
        mass = remaining.sum()
        for t in np.flatnonzero(remaining > 0):
            rest = remaining.copy()
            rest[t] = 0.0
            yield from extend(prefix + [int(t)], prob * remaining[t] / mass, rest)

    yield from extend([], 1.0, q.copy())


def child_acceptance(target_row, draft_row, k, rule):
    """``[k]``: P(the j-th child is the accepted one) when the k children are drawn from the draft
    law (with or without replacement), marginally over the draws.  With replacement:
    ``a_j prod_{l<j} (1 - a_l)`` with ``a_j = sum_v min(R_{j-1}, q)``; without replacement by
    enumeration of the ordered draws (small V).  Their sum is the position's acceptance."""
    if rule not in ("with_replacement", "without_replacement"):
        raise ValueError(f"per-position draft laws need a sampled rule, got {rule!r}")
    p = _normalized(target_row, "target_row")
    q = _normalized(draft_row, "draft_row")
    out = np.zeros(k)
    if rule == "with_replacement":
        r, survive = p, 1.0
        for j in range(k):
            a = np.minimum(r, q).sum()
            out[j] = survive * a
            survive *= 1.0 - a
            r = _minus_and_normalize(r, q)
        return out
    for tokens, prob in _ordered_draws_without_replacement(q, k):
        accept, _ = node_rule(p, q, tokens, rule)
        survive = 1.0
        for j, a in enumerate(accept):
            out[j] += prob * survive * a
            survive *= 1.0 - a
    return out


def rrs_acceptance(target_row, draft_row, k, replacement):
    """Acceptance of one position with k children drawn from q (recursive rejection sampling):
    with replacement ``1 - prod_j (1 - a_j)`` over the recursive residuals."""
    rule = "with_replacement" if replacement else "without_replacement"
    return float(child_acceptance(target_row, draft_row, k, rule).sum())


def optimal_multidraft_acceptance(target_row, draft_row, k):
    """``1 - max_S [q(S)^k - p(S)]`` over every subset S of the vocabulary: the largest
    acceptance of any valid verifier of k i.i.d. drafts from q (small V: 2^V subsets)."""
    p = _normalized(target_row, "target_row")
    q = _normalized(draft_row, "draft_row")
    if p.size > 20:
        raise ValueError(f"optimal_multidraft_acceptance enumerates 2^V subsets; V = {p.size} is too large")
    members = (np.arange(2**p.size)[:, None] >> np.arange(p.size)) & 1  # [2^V, V] subsets
    return float(1.0 - np.max((members @ q) ** k - members @ p))


def tree_length_pmf(target_probs, draft_probs, parents, rule):
    """Accepted-length pmf ``[max depth + 1]`` of a tree SHAPE whose children are drawn at every
    position from that position's draft row (rows fixed per position, as the chain law assumes).

    target_probs, draft_probs ``[N+1, V]`` (row r: position r); ``parents [N]`` gives the shape
    (a position's children are its draw slots in order).  Recursion over the tree: from position
    r, nothing more is accepted w.p. 1 - sum_j pi_j, slot j w.p. pi_j = ``child_acceptance`` and
    then the subtree's length follows.
    """
    children = tree_children(parents)
    target_probs = np.asarray(target_probs)
    draft_probs = np.asarray(draft_probs)
    depth = int(tree_depths(parents).max(initial=0))
    length = [None] * len(children)
    for r in reversed(range(len(children))):  # children before parents
        kids = children[r]
        pmf = np.zeros(depth + 1)
        pi = child_acceptance(target_probs[r], draft_probs[r], len(kids), rule) if kids else np.zeros(0)
        pmf[0] = 1.0 - pi.sum()
        for i, share in zip(kids, pi):
            pmf[1:] += share * length[i + 1][:-1]
        length[r] = pmf
    return length[0]
# ------------------------------------------------------------------------------------------
# wall-clock: the speed-up model and the optimal draft length
# ------------------------------------------------------------------------------------------
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
    :class:`specverify.adaptive.AdaptiveK` calls it every round, right after a target pass has
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
