"""Chi-square at V = 32000 for realistic trees: the accepted path against the tree law.

Counts (never frequencies), bins with expectation below 5 merged (``specverify.stats``), fixed
seeds, significance level ALPHA.  Power: the same tests reject broken rules (section B.5 of
VERIFY_ALGORITHMS.md, written as float64 walkers in ``test_tree_exact``) on the same trees.
"""

import numpy as np
import pytest

import specverify as sv
from specverify import law
from specverify.stats import chisquare_counts

from conftest import softmax_rows
from tree_rules import against_original_p, target_only_not_renormalized, walk

ALPHA = 1e-4
V = 32000
# A 20-node tree: 4 children at the root, 3 under the first two, 2 under some of those, depth 4.
PARENTS = np.array([-1, -1, -1, -1, 0, 0, 0, 1, 1, 1, 4, 4, 5, 7, 7, 10, 10, 13, 15, 2], dtype=np.int64)
N = PARENTS.size


def models(seed):
    """[N+1, V] target and draft rows: a head of 6 likely tokens per row (~2/3 of the mass, the
    largest probability ~0.2-0.5) over a long tail, the draft's logits noisier (per-position
    acceptance ~0.7): several children per position are plausible, so many paths are too."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((N + 1, V))
    head = rng.integers(0, V, (N + 1, 6))
    logits[np.arange(N + 1)[:, None], head] += 9.0 + 0.7 * rng.standard_normal((N + 1, 6))
    target = softmax_rows(logits)
    draft = softmax_rows(logits + 0.8 * rng.standard_normal((N + 1, V)))
    return rng, target, draft


def draw_children(rng, draft, rule, cdfs=None):
    """Tokens of the tree's nodes drawn from their position's draft row (cdfs: ``[N+1, V]``
    cumulative draft laws, for draws with replacement)."""
    tokens = np.zeros(N, dtype=np.int64)
    for r, kids in enumerate(law.tree_children(PARENTS)):
        if not kids:
            continue
        q = draft[r].astype(np.float64)
        if rule == "deterministic":  # top-k of the draft
            tokens[kids] = np.argsort(-q, kind="stable")[:len(kids)]
        elif rule == "with_replacement":
            cdf = np.cumsum(q / q.sum()) if cdfs is None else cdfs[r]
            tokens[kids] = np.minimum(np.searchsorted(cdf, rng.random(len(kids)), side="right"), V - 1)
        else:  # Gumbel-top-k: a draw without replacement, in draw order
            tokens[kids] = np.argsort(-(np.log(q) + rng.gumbel(size=V)), kind="stable")[:len(kids)]
    return tokens


def path_end_law(node_probabilities):
    """``[N+1]``: P(the accepted path ends at position r) from P(node accepted)."""
    ends = np.zeros(N + 1)
    ends[0] = 1.0
    ends[1:] = node_probabilities
    for i, parent in enumerate(PARENTS):
        ends[parent + 1] -= node_probabilities[i]
    return np.maximum(ends, 0.0)


def end_counts(op, rng, draws):
    counts = np.zeros(N + 1, dtype=np.int64)
    for _ in range(draws):
        path, _ = op(rng.random(N + 1))
        counts[path[-1] + 1 if len(path) else 0] += 1
    return counts


def compiled(target, draft, tokens, rule):
    draft_probs = None if rule == "deterministic" else draft
    return lambda u: sv.accept_tree_from_uniforms(target, draft_probs, tokens, PARENTS, u,
                                                  replacement=rule == "with_replacement")


@pytest.mark.parametrize("rule", ["deterministic", "without_replacement", "with_replacement"])
def test_path_end_of_a_fixed_tree(rule):
    # Given the drawn tree, where the accepted path ends follows the tree law of the rule.
    rng, target, draft = models(11)
    tokens = draw_children(rng, draft, rule)
    t64, d64 = target.astype(np.float64), draft.astype(np.float64)
    expected = path_end_law(law.tree_node_probabilities(t64, d64, tokens, PARENTS, rule))
    draws = 4000
    assert (expected * draws >= 5).sum() >= 5  # a test with some resolution: several live paths
    fit = chisquare_counts(end_counts(compiled(target, draft, tokens, rule), rng, draws), expected)
    assert fit.pvalue > ALPHA, fit
    # Power: a broken rule on the same tree (every child tested against the original p; for
    # deterministic children, p(c_j) not renormalized by the earlier siblings' mass).
    broken_rule = target_only_not_renormalized if rule == "deterministic" else against_original_p
    broken = lambda u: walk(t64, d64, tokens, PARENTS, u, broken_rule)  # noqa: E731
    fit = chisquare_counts(end_counts(broken, rng, draws // 4), expected)
    assert fit.pvalue < ALPHA, fit


def test_accepted_length_law_with_replacement():
    # Children drawn afresh every round from per-position draft rows: the accepted length
    # follows law.tree_length_pmf (the recursion over the tree with 1 - prod(1 - a_j) per node).
    rng, target, draft = models(12)
    t64, d64 = target.astype(np.float64), draft.astype(np.float64)
    expected = law.tree_length_pmf(t64, d64, PARENTS, "with_replacement")
    rounds = 3000
    counts = np.zeros(expected.size, dtype=np.int64)
    broken_counts = np.zeros(expected.size, dtype=np.int64)
    generator = np.random.default_rng(13)
    cdfs = np.cumsum(d64 / d64.sum(axis=1, keepdims=True), axis=1)
    for i in range(rounds):
        tokens = draw_children(rng, draft, "with_replacement", cdfs)
        path, _ = sv.accept_tree(target, draft, tokens, PARENTS, generator, replacement=True)
        counts[len(path)] += 1
        if i % 3 == 0:
            # Power: the naive rule on the same drafts must fail the same test (a third as many rounds).
            path, _ = walk(t64, d64, tokens, PARENTS, rng.random(N + 1), against_original_p)
            broken_counts[len(path)] += 1
    fit = chisquare_counts(counts, expected)
    assert fit.pvalue > ALPHA, fit
    broken_fit = chisquare_counts(broken_counts, expected)
    assert broken_fit.pvalue < ALPHA, broken_fit


def test_node_acceptance_is_one_minus_product():
    # The root of a star tree with k i.i.d. children: acceptance 1 - prod_j (1 - a_j).
    rng, target, draft = models(14)
    k = 4
    parents = -np.ones(k, dtype=np.int64)
    t64, d64 = target[:k + 1].astype(np.float64), draft[:k + 1].astype(np.float64)
    expected_accept = law.rrs_acceptance(t64[0], d64[0], k, replacement=True)
    rounds, accepted = 4000, 0
    cdf = np.cumsum(d64[0] / d64[0].sum())
    for _ in range(rounds):
        tokens = np.minimum(np.searchsorted(cdf, rng.random(k), side="right"), V - 1)
        path, _ = sv.accept_tree_from_uniforms(target[:k + 1], draft[:k + 1], tokens, parents,
                                               rng.random(k + 1), replacement=True)
        accepted += len(path)
    fit = chisquare_counts(np.array([accepted, rounds - accepted]), np.array([expected_accept, 1 - expected_accept]))
    assert fit.pvalue > ALPHA, fit
    single = law.rrs_acceptance(t64[0], d64[0], 1, replacement=True)
    assert expected_accept > single + 0.05  # four drafts do help: the test could tell them apart
    fit = chisquare_counts(np.array([accepted, rounds - accepted]), np.array([single, 1 - single]))
    assert fit.pvalue < ALPHA, fit
