"""Laws of draft trees and multiple drafts: the three node rules and the tree's accepted length.

The assumptions and formulas are stated in :mod:`specverify.law`.
"""

import numpy as np

from .chain import _normalized_rows


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


def ordered_draws_without_replacement(q, k):
    """(tokens, probability) of every ordered draw of ``min(k, |supp q|)`` distinct tokens from q
    (``q`` a ``[V]`` float64 row; also the draft process of ``specverify.testing``'s exact mode)."""
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
    for tokens, prob in ordered_draws_without_replacement(q, k):
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
