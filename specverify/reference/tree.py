"""Slow, readable NumPy references for the tree verification ops.

A draft tree of N nodes: ``draft_tokens [N]`` and ``parents [N]`` with ``parents[i]`` in
``{-1} ∪ [0, i)`` (-1: a child of the root, the last committed token).  *Position* ``r`` is the
root for ``r = 0`` and node ``r - 1`` otherwise; ``target_probs[r]`` (``[N+1, V]``) scores the
token after position ``r`` and ``draft_probs[r]`` is the law its children were drawn from.  The
children of a position are its nodes in increasing index (draw order for sampled children).

Uniforms: ``u[i]`` (``i < N``) is the coin of node i, read only if node i is tested; ``u[N]``
draws the recovered or bonus token by inverse CDF.  A chain ``parents = [-1, 0, ..., N-2]`` is
``specverify.reference.accept`` / ``verify_greedy`` with the same uniforms: node i is the draft at
position i, its coin is ``u[i]``, and ``draft_probs[:N]`` are accept's draft rows (row N, a leaf's,
is never read).

Every sum uses the project's primitives (``block_sums``, ``ordered_total``, ``sample_index``,
``residual_weights``), so the kernels in ``specverify._tree`` can match these bit for bit.

The residual of a residual, unnormalized.  Chain ``accept`` keeps the residual of target ``p``
(mass ``P``) against draft ``q`` (mass ``Q``) as ``max(0, p - q * P/Q)`` (scaled by ``P``).  After
rejecting children c_1..c_j of a position, recursive rejection sampling's residual is, in exact
arithmetic,

    R_j(v) = max(0, p(v) - q(v) * A_j),   A_j = sum_{l<=j} M_{l-1} / Q_l,

where ``M_l`` is the mass of ``R_l`` (``M_0 = P``) and ``Q_l`` the mass of the draft law child l
was tested against (``Q`` with replacement; without replacement ``q`` with c_1..c_{l-1} removed).
Without replacement a removed token v = c_m no longer follows that formula; but c_m was rejected,
which needs ``R_{m-1}(c_m)/M_{m-1} < q(c_m)/Q_m``, so ``R_m(c_m) = 0`` and it stays 0: the
residual after rejecting c_j is the formula with p zeroed at c_1..c_{j-1} (c_j itself keeps the
formula, as chain ``accept`` does).  Here ``A_1 = 0.0 + P/Q = P/Q``: on chains, accept's residual
exactly.  Each step is one more pass over ``p`` and ``q`` with a larger ``A``.
"""

import numpy as np

from ..law import tree_children  # children[r]: the nodes of position r, in index order
from .primitives import block_sums, mass_ratio, ordered_total, residual_weights, row_mass, sample_index


def check_distinct_siblings(tokens, children, rule):
    """ValueError naming the first node whose token repeats an earlier sibling's."""
    for kids in children:
        seen = {}
        for i in kids:
            t = int(tokens[i])
            if t in seen:
                raise ValueError(
                    f"draft_tokens[{i}] = {t} repeats its sibling draft_tokens[{seen[t]}]: {rule} needs "
                    "distinct sibling tokens")
            seen[t] = i


def verify_tree_greedy(target_probs, draft_tokens, parents):
    """``(path, next_token)``: from the root, accept the child whose token is the row's argmax
    (first such child if siblings repeat), stop at a position with no matching child."""
    target = np.asarray(target_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    children = tree_children(parents)
    path, r = [], 0
    while True:
        best = int(np.argmax(target[r]))
        match = next((i for i in children[r] if tokens[i] == best), None)
        if match is None:
            return np.array(path, dtype=np.int64), best
        path.append(match)
        r = match + 1


def masked(row, tokens):
    """float64 copy of ``row`` with the given token ids set to 0."""
    out = np.asarray(row, dtype=np.float64).copy()
    out[list(tokens)] = 0.0
    return out


def sample_and_match(p, tokens, coins):
    """Deterministic children: accept child j with probability p(c_j) / (P - sum_{i<j} p(c_i)).

    p ``[V]`` float32; tokens, coins ``[k]``.  Returns ``(j, None)`` for an accepted child, or
    ``(None, weights)`` with the unnormalized law of the recovered token (p without the children).
    """
    remaining = np.asarray(p, dtype=np.float64).copy()
    for j, (t, coin) in enumerate(zip(tokens, coins)):
        if coin * ordered_total(block_sums(remaining)) < float(p[t]):
            return j, None
        remaining[t] = 0.0
    return None, remaining


def recursive_rejection(p, q, tokens, coins, replacement, nodes=None):
    """Recursive rejection sampling at one position (SpecInfer with replacement; Jeon et al. 2024
    without).  p, q ``[V]`` float32; tokens, coins ``[k]``; nodes: the children's node ids (for
    messages).  Returns ``(j, None)`` or
    ``(None, weights)`` as ``sample_and_match`` (weights: the final unnormalized residual)."""
    residual_mass = row_mass(p)  # M_{j-1}
    draft_mass = row_mass(q)  # Q_j
    ratio = 0.0  # A_{j-1}
    rejected = []  # c_1..c_{j-1}
    weights = None  # R_{j-1}, None while it is p itself
    for j, (t, coin) in enumerate(zip(tokens, coins)):
        if not replacement and rejected:
            draft_mass = ordered_total(block_sums(masked(q, rejected)))
            if not draft_mass > 0.0:
                node = j if nodes is None else nodes[j]
                raise ValueError(f"draft_probs gives no mass outside the earlier siblings of node {node}: "
                                 "it cannot have been drawn without replacement")
        residual_t = float(p[t]) if weights is None else float(weights[t])
        # Accept iff u < (R(t) / M) / (q(t) / Q), written without division.
        if coin * (float(q[t]) * residual_mass) < residual_t * draft_mass:
            return j, None
        ratio = ratio + mass_ratio(residual_mass, draft_mass)
        kept = masked(p, [] if replacement else rejected)
        weights = residual_weights(kept, q, ratio)  # max(0, kept - q * ratio)
        residual_mass = ordered_total(block_sums(weights))
        rejected.append(int(t))
    return None, weights


def accept_tree(target_probs, draft_probs, draft_tokens, parents, uniforms, *, replacement=False):
    """Multi-draft speculative sampling over a tree with explicit uniforms ``[N+1]`` float64.

    target_probs ``[N+1, V]``; draft_probs ``[N+1, V]`` or None (deterministic children: the
    sample-and-match rule); draft_tokens, parents ``[N]``.  Returns ``(path, next_token)``.
    """
    p_rows = np.asarray(target_probs, dtype=np.float32)
    q_rows = None if draft_probs is None else np.asarray(draft_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    u = np.asarray(uniforms, dtype=np.float64)
    n = tokens.size
    children = tree_children(parents)
    if q_rows is None:
        check_distinct_siblings(tokens, children, "the deterministic-children rule")
    elif not replacement:
        check_distinct_siblings(tokens, children, "sampling without replacement")
    path, r = [], 0
    while True:
        p, kids = p_rows[r], children[r]
        if not kids:
            return np.array(path, dtype=np.int64), sample_index(p, u[n])
        if q_rows is None:
            j, weights = sample_and_match(p, tokens[kids], u[kids])
        else:
            j, weights = recursive_rejection(p, q_rows[r], tokens[kids], u[kids], replacement, kids)
        if j is None:
            if ordered_total(block_sums(weights)) > 0.0:
                return np.array(path, dtype=np.int64), sample_index(weights, u[n])
            # A residual of zero mass after rounding: p itself, as chain accept does.
            return np.array(path, dtype=np.int64), sample_index(p, u[n])
        path.append(kids[j])
        r = kids[j] + 1
