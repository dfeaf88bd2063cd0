"""The tree laws: the table of VERIFY_ALGORITHMS.md B.1, closed forms against enumeration."""

import itertools

import numpy as np
import pytest

from specverify import law

pytestmark = pytest.mark.emulated

P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.3, 0.5])


@pytest.mark.parametrize("k,optimum,with_replacement,without_replacement", [
    (1, 0.70, 0.70, 0.70), (2, 0.86, 0.76, 0.82), (3, 0.988, 0.808, 1.0)])
def test_table_b1(k, optimum, with_replacement, without_replacement):
    assert law.optimal_multidraft_acceptance(P, Q, k) == pytest.approx(optimum, abs=1e-12)
    assert law.rrs_acceptance(P, Q, k, replacement=True) == pytest.approx(with_replacement, abs=1e-12)
    assert law.rrs_acceptance(P, Q, k, replacement=False) == pytest.approx(without_replacement, abs=1e-12)


def test_one_draft_is_sum_of_minima_and_no_rule_beats_the_optimum():
    rng = np.random.default_rng(3)
    for _ in range(50):
        p, q = rng.dirichlet(np.ones(4) * 0.7), rng.dirichlet(np.ones(4) * 0.7)
        a = np.minimum(p, q).sum()
        for rule in (True, False):
            assert law.rrs_acceptance(p, q, 1, rule) == pytest.approx(a, abs=1e-12)
        for k in (2, 3):
            # With replacement sees k i.i.d. drafts: it cannot beat the i.i.d. optimum.
            assert law.rrs_acceptance(p, q, k, True) <= law.optimal_multidraft_acceptance(p, q, k) + 1e-12


def test_with_replacement_closed_form_matches_enumerated_draws():
    rng = np.random.default_rng(4)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
        q[rng.integers(0, 3)] = 0.0
        q /= q.sum()
        k = 3
        enumerated = np.zeros(k)
        for tokens in itertools.product(range(3), repeat=k):
            prob = np.prod(q[list(tokens)])
            if prob == 0:
                continue
            accept, _ = law.node_rule(p, q, tokens, "with_replacement")
            survive = 1.0
            for j, a in enumerate(accept):
                enumerated[j] += prob * survive * a
                survive *= 1.0 - a
        np.testing.assert_allclose(law.child_acceptance(p, q, k, "with_replacement"), enumerated, atol=1e-14)
        a_first = np.minimum(p, q).sum()
        assert enumerated[0] == pytest.approx(a_first)


def test_deterministic_children_accept_the_path_product():
    rng = np.random.default_rng(5)
    parents = np.array([-1, -1, 0, 0, 2, -1, 5])
    tokens = np.array([0, 1, 2, 3, 1, 4, 0])
    target = rng.dirichlet(np.ones(5), size=parents.size + 1)
    nodes = law.tree_node_probabilities(target, None, tokens, parents, "deterministic")
    for i in range(parents.size):
        product, j = 1.0, i
        while j >= 0:
            product *= target[parents[j] + 1, tokens[j]]
            j = parents[j]
        assert nodes[i] == pytest.approx(product, rel=1e-12)
    pmf = law.depth_pmf(nodes, parents)
    assert pmf.sum() == pytest.approx(1.0)
    assert (np.arange(pmf.size) * pmf).sum() == pytest.approx(nodes.sum())


def test_chain_tree_is_the_chain_law():
    rng = np.random.default_rng(6)
    k = 4
    target, draft = rng.dirichlet(np.ones(6), size=k + 1), rng.dirichlet(np.ones(6), size=k + 1)
    parents = np.arange(k) - 1
    chain = law.accepted_length_pmf(law.acceptance_rates(target[:k], draft[:k]))
    for rule in ("with_replacement", "without_replacement"):
        np.testing.assert_allclose(law.tree_length_pmf(target, draft, parents, rule), chain, atol=1e-14)


def test_tree_length_pmf_matches_enumerated_draft_trees():
    # Per-position draft rows: enumerate every drawn tree, average the per-tree node law.
    rng = np.random.default_rng(7)
    parents = np.array([-1, -1, 0, 0, 1])
    target = rng.dirichlet(np.ones(3), size=6)
    draft = rng.dirichlet(np.ones(3), size=6)
    draft[0, 2] = 0.0
    draft /= draft.sum(axis=1, keepdims=True)
    children = law.tree_children(parents)
    for rule in ("with_replacement", "without_replacement"):
        expected = np.zeros(3)
        slots = [list(kids) for kids in children]

        def draws(r):
            k = len(slots[r])
            if rule == "with_replacement":
                return [(t, np.prod(draft[r][list(t)])) for t in itertools.product(range(3), repeat=k)]
            return list(law.tree.ordered_draws_without_replacement(draft[r], k))

        # Every position's children are drawn independently of the tokens (rows fixed per position).
        per_position = [draws(r) if slots[r] else [((), 1.0)] for r in range(parents.size + 1)]
        for combo in itertools.product(*per_position):
            prob = np.prod([p for _, p in combo])
            if prob == 0 or any(len(t) != len(slots[r]) for r, (t, _) in enumerate(combo)):
                continue
            tokens = np.zeros(parents.size, dtype=np.int64)
            for r, (t, _) in enumerate(combo):
                tokens[slots[r]] = t
            nodes = law.tree_node_probabilities(target, draft, tokens, parents, rule)
            expected += prob * law.depth_pmf(nodes, parents)
        np.testing.assert_allclose(law.tree_length_pmf(target, draft, parents, rule), expected, atol=1e-13)


def test_bad_parents_are_named():
    with pytest.raises(ValueError, match=r"parents\[1\]"):
        law.tree_children([-1, 1])
    with pytest.raises(ValueError, match="rule"):
        law.node_rule(P, Q, [0], "greedy")
