"""The block-verification law (specverify.law.block_*): exact cases, never worse than token-wise,
equal where theory says so, and the grid's error bound."""

import numpy as np
import pytest

from specverify import law


def random_pair(rng, k, vocab, zeros=0.3):
    target = rng.random((k + 1, vocab)) * (rng.random((k + 1, vocab)) > zeros)
    draft = rng.random((k, vocab)) * (rng.random((k, vocab)) > zeros)
    target[np.arange(k + 1), rng.integers(0, vocab, k + 1)] += 0.1
    draft[np.arange(k), rng.integers(0, vocab, k)] += 0.1
    return target, draft


def test_paper_example():
    # Sun et al.: binary, context-free, K = 2, p = (1/3, 2/3), q = (2/3, 1/3).
    target = np.array([[1 / 3, 2 / 3]] * 3)
    draft = np.array([[2 / 3, 1 / 3]] * 2)
    block = law.block_survival(target, draft)
    assert block.method == "support" and block.error == 0.0
    assert block.mean == pytest.approx(11 / 9, abs=1e-15)
    assert law.mean_accepted(law.acceptance_rates(target, draft)) == pytest.approx(10 / 9, abs=1e-15)
    np.testing.assert_allclose(block.pmf, [1 / 3, 1 / 9, 5 / 9], atol=1e-15)
    mean, token, err = law.block_gain(target, draft)
    assert (mean - token) == pytest.approx(1 / 9, abs=1e-15) and err == 0.0


def test_block_never_worse_than_token_wise_on_random_pairs():
    rng = np.random.default_rng(0)
    gains = []
    for _ in range(300):
        k, vocab = int(rng.integers(1, 6)), int(rng.integers(2, 7))
        target, draft = random_pair(rng, k, vocab)
        block = law.block_survival(target, draft)
        token = law.token_survival(law.acceptance_rates(target, draft))
        assert np.all(block.survival >= token - 1e-12)  # pointwise in i, not only the mean
        assert np.all(np.diff(block.survival) <= 1e-15) and block.pmf.sum() == pytest.approx(1.0)
        gains.append(block.mean - token[1:].sum())
        if k == 1:
            assert block.mean == pytest.approx(token[1], abs=1e-14)
    assert max(gains) > 0.05  # strictly better somewhere (stochastic drafts, K >= 2)


def test_markov_enumeration_never_worse_and_matches_context_free():
    rng = np.random.default_rng(1)
    for _ in range(40):
        vocab, k = int(rng.integers(2, 5)), int(rng.integers(1, 4))
        t_table, d_table = rng.random((vocab, vocab)) + 0.01, rng.random((vocab, vocab)) * (rng.random((vocab, vocab)) > 0.3)
        d_table[np.arange(vocab), rng.integers(0, vocab, vocab)] += 0.1

        def row(table):
            return lambda prefix: table[prefix[-1] if prefix else 0]

        block = law.block_survival_markov(row(t_table), row(d_table), k)
        token = law.token_survival_markov(row(t_table), row(d_table), k)
        assert np.all(block >= token - 1e-12)
        if k == 1:
            assert block[1] == pytest.approx(token[1], abs=1e-14)
    # rows that do not depend on the prefix: the Markov enumeration is the context-free law
    target, draft = random_pair(rng, 3, 4)
    got = law.block_survival_markov(lambda p: target[len(p)], lambda p: draft[len(p)], 3)
    np.testing.assert_allclose(got, law.block_survival(target, draft).survival, atol=1e-14)


def test_one_hot_drafts_equal_token_wise():
    # q_i a point mass on t_i: p_i = prod_j p_j(t_j) exactly as token-wise.
    rng = np.random.default_rng(2)
    for _ in range(50):
        k, vocab = int(rng.integers(1, 6)), int(rng.integers(2, 8))
        target, _ = random_pair(rng, k, vocab)
        draft = np.eye(vocab)[rng.integers(0, vocab, k)]
        block = law.block_survival(target, draft)
        token = law.token_survival(law.acceptance_rates(target, draft))
        np.testing.assert_allclose(block.survival, token, atol=1e-14)


@pytest.mark.parametrize("vocab,k", [(25, 4), (300, 2)])
def test_grid_brackets_the_exact_law(vocab, k):
    rng = np.random.default_rng(3)
    target = rng.dirichlet(np.full(vocab, 0.3), k + 1)
    draft = 0.6 * target[:k] + 0.4 * rng.dirichlet(np.full(vocab, 0.3), k)
    exact = law.block_survival(target, draft, max_support=10**7)
    grid = law.block_survival(target, draft, max_support=vocab)  # exact first step, then the grid
    assert exact.method == "support" and grid.method == "grid"
    assert 0 < grid.error < 1e-4
    assert np.all(np.abs(grid.survival - exact.survival) <= grid.error)


def test_grid_at_a_large_vocabulary_is_fast_and_tight():
    rng = np.random.default_rng(4)
    target = rng.dirichlet(np.full(32000, 0.1), 9)
    draft = 0.7 * target[:8] + 0.3 * rng.dirichlet(np.full(32000, 0.1), 8)
    block = law.block_survival(target, draft)
    token = law.mean_accepted(law.acceptance_rates(target, draft))
    assert block.method == "grid" and block.error < 1e-4
    assert block.mean > token + 0.1
