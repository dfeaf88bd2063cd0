"""Tree verifiers written from node rules in float64 (``specverify.law.node_rule``), and the
broken node rules of VERIFY_ALGORITHMS.md section B.5: the law side of the exact and
statistical tree tests, and their power checks."""

import numpy as np

from specverify import law


def rule_of(name):
    return lambda p, q, tokens: law.node_rule(p, q, tokens, name)


def walk(target, draft, tokens, parents, u, node_rule):
    """A verifier written from a node rule in float64: the law side, and the broken variants."""
    children = law.tree_children(parents)
    path, r = [], 0
    while True:
        kids = children[r]
        if not kids:
            final = target[r] / target[r].sum()
            break
        accept, residual = node_rule(target[r], draft[r], [tokens[i] for i in kids])
        chosen = next((i for i, a in zip(kids, accept) if u[i] < a), None)
        if chosen is None:
            final = residual
            break
        path.append(chosen)
        r = chosen + 1
    return tuple(path), int(np.searchsorted(np.cumsum(final), u[-1], side="right"))


# Broken node rules (section B.5).

def _normalized(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def against_original_p(p, q, tokens):
    """Every child tested against the original p, then one residual."""
    p, q = _normalized(p), _normalized(q)
    accept = [min(1.0, p[t] / q[t]) if q[t] > 0 else float(p[t] > 0) for t in tokens]
    d = np.maximum(p - q, 0.0)
    return accept, d / d.sum() if d.sum() > 0 else p


def duplicates_merged(p, q, tokens):
    """With-replacement draws whose repeated siblings are merged before the residual recursion."""
    first = [j for j, t in enumerate(tokens) if t not in tokens[:j]]
    accept_unique, residual = law.node_rule(p, q, [tokens[j] for j in first], "with_replacement")
    accept = np.zeros(len(tokens))
    accept[first] = accept_unique
    return accept, residual


def double_counting_target_only(p, q, tokens):
    """Target-only rule on repeated siblings: the accepted mass counts a repeated token twice."""
    p = _normalized(p)
    accept, before = [], 0.0
    for t in tokens:
        accept.append(min(1.0, p[t] / (1.0 - before)) if before < 1.0 else 1.0)
        before += p[t]
    rest = p.copy()
    rest[list(tokens)] = 0.0
    return accept, rest / rest.sum() if rest.sum() > 0 else p


def target_only_not_renormalized(p, q, tokens):
    """Target-only rule testing child j with p(c_j) instead of p(c_j) / (1 - sum_{i<j} p(c_i))."""
    p = _normalized(p)
    rest = p.copy()
    rest[list(tokens)] = 0.0
    return [p[t] for t in tokens], rest / rest.sum() if rest.sum() > 0 else p
