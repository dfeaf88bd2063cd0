"""Tree verification is lossless, exactly: the op at the midpoint of every cell of its uniforms.

Small Markov models (V = 3, zeros in target and draft), every draft tree of a few shapes
(depth 2 and 3, 2-3 children per node) enumerated with its draft probability, children drawn
with replacement, without replacement or chosen deterministically; rounds composed until 4
tokens are emitted.  The law of those 4 tokens must be the target's to 1e-9 for every rule, and
the same harness must reject the broken variants of VERIFY_ALGORITHMS.md section B.5.
"""

from collections import defaultdict
from functools import lru_cache

import numpy as np
import pytest

import specverify as sv
from specverify import law
from specverify.reference import tree as reference_tree

from exact import compose_rounds, exact_law, inverse_cdf_cuts, markov_joint, total_variation
from tree_rules import (against_original_p, double_counting_target_only, duplicates_merged, rule_of,
                        target_only_not_renormalized, walk)

# Markov chains over V = 3 tokens, exact in float32: zeros where the other model has mass.
TARGET = (np.array([[4, 3, 1], [0, 5, 3], [2, 0, 6]]) / 8).astype(np.float32)  # p(b | a) = TARGET[a, b]
DRAFT = (np.array([[1, 3, 4], [4, 4, 0], [1, 5, 2]]) / 8).astype(np.float32)
LENGTH = 4

# Tree shapes: a node is the list of its children's shapes.
SHAPES = {
    "depth2": [[[], []], []],  # root: 2 children, the first with 2 children (N = 4)
    "depth3": [[[[]], []], [[]]],  # depth 3, N = 6
    "wide": [[[], []], [], []],  # root: 3 children (N = 5)
}


# --- Draft processes: ((tokens of the k children), probability) for a position ------------------

def with_replacement(q, k):
    q = q / q.sum()
    for tokens in np.ndindex(*([q.size] * k)):
        prob = float(np.prod(q[list(tokens)]))
        if prob > 0:
            yield tokens, prob


def without_replacement(q, k):
    yield from law.tree.ordered_draws_without_replacement(q / q.sum(), k)


def top_k(q, k):
    yield tuple(int(t) for t in np.argsort(-q, kind="stable")[:k]), 1.0


def draft_trees(shape, context, draw):
    """Every draft tree of ``shape`` after ``context``: ``(tokens, parents, probability)``, nodes
    in breadth-first order (siblings in draw order)."""

    def expand(pending, tokens, parents, prob):
        if not pending:
            yield tokens, parents, prob
            return
        (node, token, children), rest = pending[0], pending[1:]
        for drawn, p in draw(DRAFT[token].astype(np.float64), len(children)):
            first = len(tokens)
            queued = rest + [(first + j, t, children[j]) for j, t in enumerate(drawn)]
            yield from expand(queued, tokens + list(drawn), parents + [node] * len(drawn), prob * p)

    yield from expand([(-1, context, shape)], [], [], 1.0)


# --- Cuts: where an op following a node rule can change --------------------------------------

def tree_cuts(target, draft, tokens, parents, node_rule):
    """Per uniform: the coin of node i cuts at its acceptance probability; the final uniform at
    the cumulative masses of every law a round can end with (a residual, or a leaf's target)."""
    cuts = [[] for _ in range(len(tokens) + 1)]
    for r, kids in enumerate(law.tree_children(parents)):
        if not kids:
            cuts[-1].extend(inverse_cdf_cuts(target[r]))
            continue
        accept, residual = node_rule(target[r], draft[r], [tokens[i] for i in kids])
        for i, a in zip(kids, accept):
            cuts[i].append(a)
        cuts[-1].extend(inverse_cdf_cuts(residual))
    return cuts


# --- The harness --------------------------------------------------------------------------------

DRAWS = {"with_replacement": with_replacement, "without_replacement": without_replacement,
         "deterministic": without_replacement, "top_k": top_k}


def emitted_law(op_of_tree, node_rule, draw, shape):
    """TV between the first LENGTH emitted tokens and the target's joint law, from every start.

    op_of_tree(target, draft, tokens, parents) -> op(u) -> (path, next_token)."""

    @lru_cache(maxsize=None)
    def round_law(context):
        out = defaultdict(float)
        for tokens, parents, prob in draft_trees(shape, context, draw):
            rows = [context] + tokens
            target, draft = TARGET[rows], DRAFT[rows]
            op = op_of_tree(target, draft, np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))
            cuts = tree_cuts(target.astype(np.float64), draft.astype(np.float64), tokens, parents, node_rule)
            for (path, next_token), weight in exact_law(op, cuts).items():
                out[tuple(tokens[i] for i in path) + (int(next_token),)] += prob * weight
        return dict(out)

    state = {}
    return max(total_variation(compose_rounds(round_law, c, LENGTH, state), markov_joint(TARGET, c, LENGTH))
               for c in range(TARGET.shape[0]))


def walker(node_rule):
    return lambda target, draft, tokens, parents: (
        lambda u: walk(target.astype(np.float64), draft.astype(np.float64), tokens, parents, u, node_rule))


def op_under_test(accept_tree, rule):
    """``accept_tree(target, draft, tokens, parents, u, replacement=)`` (the reference or the
    compiled op) as a function of its uniforms, for ``rule``."""
    def op_of_tree(target, draft, tokens, parents):
        draft_probs = None if rule == "deterministic" else draft
        replacement = rule == "with_replacement"

        def op(u):
            path, next_token = accept_tree(target, draft_probs, tokens, parents, u, replacement=replacement)
            return tuple(int(i) for i in path), next_token
        return op
    return op_of_tree


CASES = [("with_replacement", "with_replacement"), ("without_replacement", "without_replacement"),
         ("deterministic", "deterministic"), ("deterministic", "top_k")]  # (rule, draft process)


@pytest.mark.parametrize("rule,process", CASES)
def test_law_side_node_rules_are_lossless(rule, process):
    # The law's node rules, walked in float64: they give the cuts, so they must be right too.
    assert emitted_law(walker(rule_of(rule)), rule_of(rule), DRAWS[process], SHAPES["depth2"]) < 1e-9


@pytest.mark.parametrize("shape", ["depth2", "wide"])  # depth 3 through the compiled op
@pytest.mark.parametrize("rule,process", CASES)
def test_reference_is_lossless(rule, process, shape):
    op = op_under_test(reference_tree.accept_tree, rule)
    assert emitted_law(op, rule_of(rule), DRAWS[process], SHAPES[shape]) < 1e-9


@pytest.mark.parametrize("shape", [pytest.param("depth2", marks=pytest.mark.emulated), "depth3", "wide"])
@pytest.mark.parametrize("rule,process", CASES)
def test_compiled_op_is_lossless(rule, process, shape):
    op = op_under_test(sv.accept_tree_from_uniforms, rule)
    assert emitted_law(op, rule_of(rule), DRAWS[process], SHAPES[shape]) < 1e-9


BROKEN = {
    "children tested against the original p": (against_original_p, "with_replacement"),
    "duplicate siblings merged (with replacement)": (duplicates_merged, "with_replacement"),
    "draft law not conditioned (without replacement)": (rule_of("with_replacement"), "without_replacement"),
    "duplicate tokens under the target-only rule": (double_counting_target_only, "with_replacement"),
    "target-only rule not renormalized by earlier siblings": (target_only_not_renormalized, "without_replacement"),
}


@pytest.mark.parametrize("variant", list(BROKEN))
def test_broken_variants_are_rejected(variant):
    node_rule, process = BROKEN[variant]
    tv = emitted_law(walker(node_rule), node_rule, DRAWS[process], SHAPES["depth2"])
    assert tv > 1e-3, f"{variant}: TV {tv:.3g} — the harness cannot see this bug"
