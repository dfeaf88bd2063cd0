"""Tree verifiers written from node rules in float64 (``specverify.law.node_rule``) and the
broken node rules of VERIFY_ALGORITHMS.md section B.5, for the tree tests: the public
catalogue's (``specverify.testing.broken``), with the signatures the tests use."""

from specverify import law
from specverify.testing.broken import (against_original_p, double_counting_target_only, duplicates_merged,
                                       target_only_not_renormalized, tree_walk)

__all__ = ["rule_of", "walk", "against_original_p", "duplicates_merged", "double_counting_target_only",
           "target_only_not_renormalized"]


def rule_of(name):
    return lambda p, q, tokens: law.node_rule(p, q, tokens, name)


def walk(target, draft, tokens, parents, u, node_rule):
    """``(path tuple, next_token)`` of :func:`specverify.testing.broken.tree_walk` with ``node_rule``."""
    path, token = tree_walk(target, draft, tokens, parents, u, node_rule=node_rule)
    return tuple(path), int(token)
