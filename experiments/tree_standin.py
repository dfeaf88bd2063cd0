"""A stand-in for the tree verification ops of issue 14, until they are merged: slow NumPy, same contract.

``verify_tree_greedy(target_probs [N+1, V], draft_tokens [N], parents [N]) -> (path, next_token)``
and ``accept_tree(target_probs, None, draft_tokens, parents, generator)`` for deterministic
children (sample-and-match), with ``N + 1`` uniforms drawn in one call: ``u[i]`` node ``i``'s coin,
``u[N]`` the final draw by inverse CDF. :func:`install` puts them on ``specverify.ops`` only where
the real ops are missing (and says so); the decoder tests use them the same way and build their
broken variants from :func:`sample_and_match`'s switches.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["private_verify_tree_greedy", "private_accept_tree", "sample_and_match", "install"]


def _children(parents, node):
    return [i for i, p in enumerate(parents) if p == node]


def private_verify_tree_greedy(target_probs, draft_tokens, parents):
    """Walk from the root taking the child whose token is the row's argmax."""
    rows = np.asarray(target_probs)
    tokens, parents = np.asarray(draft_tokens).tolist(), np.asarray(parents).tolist()
    path, node = [], -1
    while True:
        best = int(np.argmax(rows[node + 1]))
        child = next((c for c in _children(parents, node) if tokens[c] == best), None)
        if child is None:
            return np.asarray(path, dtype=np.int64), best
        path.append(child)
        node = child


def sample_and_match(target_probs, draft_tokens, parents, u, *, conditioned=True, remove_children=True,
                     next_row_from_parent=False):
    """Deterministic children: child j accepted w.p. P(c_j) / (1 - sum_{i<j} P(c_i)); on total
    rejection draw from P with the children removed (u[i] is node i's coin, u[N] the final draw).
    The switches break it: unconditioned coins, children left in the final draw, next token from
    the parent's row."""
    rows = np.asarray(target_probs)  # [N + 1, V]; each visited row is read once, in float64
    tokens, parents = np.asarray(draft_tokens).tolist(), np.asarray(parents).tolist()
    n = len(tokens)
    path, node = [], -1
    while True:
        p = rows[node + 1].astype(np.float64)
        p /= p.sum()
        remaining, accepted = 1.0, None
        for c in _children(parents, node):
            pc = p[tokens[c]]
            if u[c] * (remaining if conditioned else 1.0) < pc:
                accepted = c
                break
            remaining -= pc
            if remove_children:
                p = p.copy()
                p[tokens[c]] = 0.0
        if accepted is None:
            if next_row_from_parent and path:
                p = rows[parents[path[-1]] + 1].astype(np.float64)
            cdf = np.cumsum(p / p.sum())
            return np.asarray(path, dtype=np.int64), int(min(np.searchsorted(cdf, u[n], side="right"), len(p) - 1))
        path.append(accepted)
        node = accepted


def private_accept_tree(target_probs, draft_probs, draft_tokens, parents, generator=None, *, replacement=False,
                        **broken):
    assert draft_probs is None and not replacement, "the private verifier covers deterministic children only"
    count = len(np.asarray(draft_tokens)) + 1
    if isinstance(generator, torch.Generator):
        u = torch.rand(count, generator=generator, dtype=torch.float64).numpy()
    else:
        u = generator.random(count)
    return sample_and_match(target_probs, draft_tokens, parents, u, **broken)


def install() -> bool:
    """Put the stand-ins on ``specverify.ops`` if the real tree ops are missing; returns whether it did."""
    from specverify import ops

    if hasattr(ops, "verify_tree_greedy") and hasattr(ops, "accept_tree"):
        return False
    warnings.warn("specverify has no tree verification ops yet: using the slow NumPy stand-in "
                  "(experiments/tree_standin.py); verification times of tree rows are the stand-in's")
    ops.verify_tree_greedy = private_verify_tree_greedy
    ops.accept_tree = private_accept_tree
    return True
