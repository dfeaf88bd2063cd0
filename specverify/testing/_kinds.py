"""What each kind of verifier takes and returns in the harness's own layout (specverify's).

Chain kinds (``"chain"``: token-wise speculative sampling; ``"block"``: block verification, Sun et
al. 2024), exact mode::

    verifier(target_probs [K+1, V], draft_probs [K, V] or None, draft_tokens [K], uniforms [K+1])
        -> (n_accepted, next_token)

Tree kind (``"tree"``, multi-draft), exact mode::

    verifier(target_probs [N+1, V], draft_probs [N+1, V] or None, draft_tokens [N], parents [N],
             uniforms [N+1]) -> (path, next_token)

Sampled mode: the same with ``generator`` (a ``torch.Generator`` or ``numpy.random.Generator``) in
place of ``uniforms``.  The emitted tokens of a round are ``draft_tokens[:n_accepted] +
[next_token]`` (chain) or ``draft_tokens[path] + [next_token]`` (tree).
"""

import itertools
import re

import numpy as np

from specverify.law import tree as law_tree

from . import _args
from ._calls import VerifierFault, as_int
from .models import inverse_cdf_cuts

__all__ = ["KINDS", "TREE_RULES", "TREE_SHAPES", "chain_output", "tree_output", "chain_draft_paths",
           "tree_drafts", "tree_parents", "token_rule_cuts", "block_rule_cuts", "tree_rule_cuts", "depths"]

KINDS = ("chain", "block", "tree", "greedy")
TREE_RULES = ("deterministic", "with_replacement", "without_replacement")

# Tree shapes as parents arrays (nodes in breadth-first order, siblings in draw order).
TREE_SHAPES = {
    "depth2": [-1, -1, 0, 0],        # root: 2 children, the first with 2 children (N = 4)
    "wide": [-1, -1, -1, 0, 0],      # root: 3 children, the first with 2 (N = 5)
    "depth3": [-1, -1, 0, 1, 2],     # depth 3 (N = 5)
}


_PARENTS_TEXT = re.compile(r"^\s*-?\d+(\s*,\s*-?\d+)*\s*$")


def tree_parents(tree_shape, max_nodes=None):
    """The parents list of ``tree_shape``: a name of ``TREE_SHAPES``, a parents list, or the same
    as comma-separated text (``"-1,-1,0,0"``); every parent -1 or an earlier node."""
    shapes = f"one of {', '.join(map(repr, TREE_SHAPES))}, a parents list or comma-separated parents " \
             "such as '-1,-1,0,0'"
    if isinstance(tree_shape, str):
        if tree_shape in TREE_SHAPES:
            return list(TREE_SHAPES[tree_shape])
        if not _PARENTS_TEXT.match(tree_shape):
            raise _args.ArgumentError("tree_shape", f"tree_shape must be {shapes}, got {tree_shape!r}")
        tree_shape = [int(x) for x in tree_shape.split(",")]
    try:
        parents = [_args.integer("tree_shape", p, -1) for p in tree_shape]
    except (TypeError, _args.ArgumentError):
        raise _args.ArgumentError("tree_shape", f"tree_shape must be {shapes}, got {tree_shape!r}") from None
    if not parents:
        raise _args.ArgumentError("tree_shape", "tree_shape must have at least one node, got an empty parents list")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise _args.ArgumentError("tree_shape", f"tree_shape[{i}] = {p} is not -1 or an earlier node "
                                                    f"(parents {parents})")
    if max_nodes is not None and len(parents) > max_nodes:
        raise _args.ArgumentError("tree_shape", f"a tree of {len(parents)} nodes exceeds the limit of "
                                                f"{max_nodes} (tree_shape {parents})")
    return parents


def _normalized(rows):
    rows = np.asarray(rows, dtype=np.float64)
    return rows / rows.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Outputs: validated, turned into the emitted tuple.
# ---------------------------------------------------------------------------------------------

def _pair(out, names):
    if hasattr(out, "detach") or isinstance(out, np.ndarray):
        out = list(out)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise VerifierFault("wrong output", f"expected a pair ({', '.join(names)}), got {type(out).__name__} "
                            f"{out!r:.200}")
    return out


def chain_output(out, tokens, vocab):
    """``(n, token)`` of a chain verifier, validated: ``0 <= n <= K``, ``0 <= token < V``."""
    n, token = _pair(out, ("n_accepted", "next_token"))
    n, token = as_int(n, "n_accepted"), as_int(token, "next_token")
    k = len(tokens)
    if not 0 <= n <= k:
        raise VerifierFault("wrong output", f"n_accepted = {n} is outside [0, K = {k}]")
    if not 0 <= token < vocab:
        raise VerifierFault("out-of-range token", f"next_token = {token} is outside [0, V = {vocab})")
    return n, token


def tree_output(out, tokens, parents, vocab):
    """``(path, token)`` of a tree verifier, validated: a root path of the tree, token in range."""
    path, token = _pair(out, ("path", "next_token"))
    if hasattr(path, "detach"):
        path = path.detach().cpu().numpy()
    path = [as_int(i, "path[...]") for i in (path.tolist() if isinstance(path, np.ndarray) else path)]
    parent = -1
    for i in path:
        if not 0 <= i < len(tokens) or parents[i] != parent:
            raise VerifierFault("wrong output", f"path {path} is not a path from the root of the tree with "
                                f"parents {list(parents)}")
        parent = i
    token = as_int(token, "next_token")
    if not 0 <= token < vocab:
        raise VerifierFault("out-of-range token", f"next_token = {token} is outside [0, V = {vocab})")
    return tuple(path), token


# ---------------------------------------------------------------------------------------------
# Draft processes (exact mode: every draft with its probability).
# ---------------------------------------------------------------------------------------------

def chain_draft_paths(draft, context, k, deterministic):
    """``[(path, probability)]``: every K-token draft path after ``context`` (draft: a
    MarkovModel), or its single greedy path (ties to the lowest id) for a deterministic draft."""
    context = tuple(context)
    if deterministic:
        path = []
        for _ in range(k):
            path.append(int(np.argmax(draft.probs(context + tuple(path)))))
        return [(tuple(path), 1.0)]
    paths = []
    for path in itertools.product(range(draft.vocab), repeat=k):
        prob = 1.0
        for j, x in enumerate(path):
            prob *= draft.probs(context + path[:j])[x]
            if prob == 0.0:
                break
        if prob > 0.0:
            paths.append((path, prob))
    return paths


def _children_draws(q, k, rule):
    """(children tokens, probability) of k children drawn from ``q`` under a tree rule's process."""
    if rule == "with_replacement":
        for tokens in itertools.product(range(q.size), repeat=k):
            prob = float(np.prod(q[list(tokens)]))
            if prob > 0:
                yield tokens, prob
    elif rule == "without_replacement":
        yield from law_tree.ordered_draws_without_replacement(q, k)
    else:  # deterministic: the draft's top k, ties to the lowest id
        yield tuple(int(t) for t in np.argsort(-q, kind="stable")[:k]), 1.0


def tree_drafts(draft, context, parents, rule):
    """Every draft tree of the shape ``parents`` after ``context``: ``(tokens, probability)``.

    A position's children are drawn from the draft model's row after the position's path; a
    without-replacement draw with fewer supported tokens than slots leaves the later slots empty,
    so such trees are skipped (the harness's shapes need full support; their probability is
    reported as untested mass)."""
    children = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    n = len(parents)
    paths = [None] * (n + 1)
    paths[0] = ()

    def expand(position, tokens, prob):
        if position > n:
            yield tuple(tokens), prob
            return
        kids = children[position]
        if not kids:
            yield from expand(position + 1, tokens, prob)
            return
        path = paths[position]
        q = draft.probs(tuple(context) + path)
        for drawn, p in _children_draws(q, len(kids), rule):
            if len(drawn) < len(kids):
                continue
            new = list(tokens)
            for i, t in zip(kids, drawn):
                new[i] = t
                paths[i + 1] = path + (t,)
            yield from expand(position + 1, new, prob * p)

    yield from expand(0, [None] * n, 1.0)


def depths(parents):
    """``[N + 1]`` depth of every position (root 0)."""
    return np.concatenate([[0], law_tree.tree_depths(parents)]).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Analytic cuts of the three rules specverify knows (any superset of the true cuts is fine).
# ---------------------------------------------------------------------------------------------

def _final_cuts(distributions):
    return np.concatenate([inverse_cdf_cuts(d) for d in distributions if np.sum(d) > 0] or [np.zeros(0)])


def token_rule_cuts(target_rows, draft_rows, tokens):
    """Cuts of token-wise speculative sampling: coin i at ``min(1, p_i(t_i) / q_i(t_i))``; the final
    draw at the CDF points of every residual and every target row."""
    p = _normalized(target_rows)
    k = len(tokens)
    q = np.eye(p.shape[1])[list(tokens)] if draft_rows is None else _normalized(draft_rows)
    if draft_rows is None and k:
        q = q.reshape(k, p.shape[1])
    coins = [[min(1.0, p[i, t] / q[i, t]) if q[i, t] > 0 else (1.0 if p[i, t] > 0 else 0.0)]
             for i, t in enumerate(tokens)]
    final = _final_cuts([np.maximum(p[i] - q[i], 0.0) for i in range(k)] + list(p))
    return lambda prefix: coins[len(prefix)] if len(prefix) < k else final


def block_rule_cuts(target_rows, draft_rows, tokens):
    """Cuts of block verification: coin i at ``h_i``; the final draw at the CDF points of every
    block residual ``max(p_i P_i - Q_i, 0)`` and every target row."""
    P = _normalized(target_rows)
    k = len(tokens)
    Q = np.eye(P.shape[1])[list(tokens)].reshape(k, P.shape[1]) if draft_rows is None else _normalized(draft_rows)
    s = [1.0]
    for i, t in enumerate(tokens):
        r = 0.0 if P[i, t] == 0 else (np.inf if Q[i, t] == 0 else P[i, t] / Q[i, t])
        s.append(0.0 if s[-1] == 0.0 else min(1.0, s[-1] * r))
    h = []
    for i in range(1, k):
        z = np.maximum(s[i] * P[i] - Q[i], 0.0).sum()
        h.append(1.0 if z + 1.0 - s[i] <= 0.0 else z / (z + 1.0 - s[i]))
    if k:
        h.append(s[k])
    final = _final_cuts([np.maximum(s[i] * P[i] - Q[i], 0.0) for i in range(k)] + list(P))
    return lambda prefix: [h[len(prefix)]] if len(prefix) < k else final


def tree_rule_cuts(rule):
    """Cuts of a tree rule (``specverify.law.node_rule``): node i's coin at its acceptance
    probability; the final draw at the CDF points of every residual and leaf row."""
    from specverify import law

    def make(target_rows, draft_rows, tokens, parents):
        target = np.asarray(target_rows, dtype=np.float64)
        draft = None if draft_rows is None else np.asarray(draft_rows, dtype=np.float64)
        cuts = [[] for _ in range(len(tokens) + 1)]
        for r, kids in enumerate(law.tree_children(np.asarray(parents, dtype=np.int64))):
            if not kids:
                cuts[-1].extend(inverse_cdf_cuts(target[r]))
                continue
            accept, residual = law.node_rule(target[r], None if draft is None else draft[r],
                                             [int(tokens[i]) for i in kids], rule)
            for i, a in zip(kids, accept):
                cuts[i].append(a)
            cuts[-1].extend(inverse_cdf_cuts(residual))
            cuts[-1].extend(inverse_cdf_cuts(target[r]))
        return lambda prefix: cuts[len(prefix)]

    return make
