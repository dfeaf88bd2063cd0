"""The speed-up model and the optimal draft length (specverify.law.speedup / optimal_k).

Closed form against brute force on a 1400-point grid, the four checked examples of
VERIFY_ALGORITHMS.md section F, the general model against a direct enumeration of a round's
(accepted, proposed) law, and the documented edge cases.
"""

import itertools
import math

import numpy as np
import pytest

from specverify import law

pytestmark = pytest.mark.emulated


def brute_homogeneous(a, c, k_big=2000):
    ks = np.arange(k_big + 1)
    f = (1.0 - a ** (ks + 1)) / ((1.0 - a) * (ks * c + 1.0))
    k = int(np.argmax(f))
    return k, float(f[k])


@pytest.mark.parametrize("a,c,k,f", [(0.8, 0.05, 8, 3.09), (0.8, 0.2, 4, 1.87), (0.6, 0.05, 4, 1.92),
                                     (0.9, 0.01, 24, 7.49)])
def test_checked_examples(a, c, k, f):
    opt = law.optimal_k(a, c)
    assert opt.k == k and round(opt.speedup, 2) == f
    assert law.speedup([a] * k, c) == pytest.approx(opt.speedup, rel=1e-12)
    assert law.optimal_k([a] * 60, c) == pytest.approx(opt)  # the scan agrees


def test_closed_form_matches_brute_force_on_a_grid():
    grid = list(itertools.product(np.linspace(0.02, 0.98, 35), np.geomspace(1e-3, 1.0, 40)))
    assert len(grid) == 1400
    interior = 0
    for a, c in grid:
        k, f = brute_homogeneous(a, c)
        opt = law.optimal_k(a, c)
        assert opt.k == k, (a, c, opt, k)
        assert opt.speedup == pytest.approx(f, rel=1e-12)
        if c < a:
            interior += 1
            x = law.optimal_k_continuous(a, c)
            assert math.floor(x) <= k <= math.ceil(x)
            assert opt.speedup >= (1 + a) / (1 + c) - 1e-12  # Leviathan's Cor. 3.9
        else:
            assert opt == (0, 1.0)
    assert interior > 600  # both regimes covered


def test_continuous_optimum_is_stationary_and_stable_for_tiny_c():
    a, c = 0.85, 0.03
    x = law.optimal_k_continuous(a, c)
    g = lambda t: (1 - a ** (t + 1)) / ((1 - a) * (t * c + 1))  # noqa: E731
    assert (g(x + 1e-5) - g(x - 1e-5)) / 2e-5 == pytest.approx(0.0, abs=1e-7)
    # e^{-s} underflows here: the fixed-point branch, still the brute-force answer
    assert law.optimal_k(0.5, 1e-300).k == 995
    assert law.optimal_k(0.9, 1e-9) == pytest.approx(brute_homogeneous(0.9, 1e-9))


def test_speedup_is_leviathans_formula_and_accepts_survival():
    for a, c, k in [(0.7, 0.1, 5), (0.95, 0.0, 12), (0.3, 0.5, 1), (0.6, 0.05, 0)]:
        expected = (1 - a ** (k + 1)) / ((1 - a) * (k * c + 1))
        assert law.speedup([a] * k, c) == pytest.approx(expected, rel=1e-13)
    rates = np.array([0.9, 0.6, 0.8, 0.3])
    s = np.cumprod(rates)
    assert law.speedup(survival=s, c=0.1) == law.speedup(rates, 0.1)
    np.testing.assert_allclose(law.speedup_curve(rates, 0.1),
                               [(1 + s[:k].sum()) / (1 + 0.1 * k) for k in range(5)], rtol=1e-13)
    assert law.speedup_curve(rates, 0.1)[0] == 1.0  # k = 0 is plain decoding


def test_general_model_against_a_direct_enumeration():
    """f = E[tokens] / E[time] computed from an explicit joint law of (proposed M, accepted N)."""
    k = 3
    cont = np.array([0.9, 0.7, 0.5])  # P(position i proposed | i-1 proposed)
    acc = np.array([0.8, 0.6, 0.9])  # P(accepted | proposed, previous accepted)
    draft = np.array([0.02, 0.05, 0.07])  # D(1..3)
    target = np.array([1.0, 1.1, 1.3, 1.6])  # T(1..4)
    tokens = time = 0.0
    for m in range(k + 1):  # M = m proposed
        p_m = np.prod(cont[:m]) * (1 - cont[m] if m < k else 1.0)
        for n in range(m + 1):  # N = n accepted of them
            p_n = np.prod(acc[:n]) * (1 - acc[n] if n < m else 1.0)
            tokens += p_m * p_n * (n + 1)
            time += p_m * p_n * (draft[k - 1] + target[m])
    proposed = np.cumprod(cont)
    survival = np.cumprod(cont * acc)
    got = law.speedup(survival=survival, c=draft, target_cost=target, proposed=proposed)
    assert got == pytest.approx(tokens / time, rel=1e-13)
    assert law.speedup(survival=survival, c=lambda j: draft[j - 1], target_cost=lambda n: target[n - 1],
                       proposed=proposed) == got
    # the scan picks the best prefix of the same model
    curve = law.speedup_curve(survival=survival, c=draft, target_cost=target, proposed=proposed)
    assert law.optimal_k(None, draft, target, survival=survival, proposed=proposed) == (int(np.argmax(curve)),
                                                                                       curve.max())


def test_target_cost_moves_the_optimum_down():
    free = law.optimal_k(0.8, 0.05)
    costly = law.optimal_k(0.8, 0.05, target_cost=lambda n: 1 + 0.1 * (n - 1), k_max=60)
    assert costly.k < free.k and costly.speedup < free.speedup
    curve = [law.speedup([0.8] * k, 0.05, lambda n: 1 + 0.1 * (n - 1)) for k in range(61)]
    assert costly == (int(np.argmax(curve)), max(curve))


def test_edges():
    assert law.optimal_k(0.5, 0.5) == (0, 1.0)  # c >= a: never pays
    assert law.optimal_k(0.0, 0.0) == (0, 1.0)
    assert law.optimal_k(0.3, 2.0) == (0, 1.0)
    assert law.optimal_k(1.0, 1.0) == (0, 1.0)  # f = (K+1)/(K+1)
    assert law.optimal_k(1.0, 0.25) == (math.inf, 4.0)  # f -> 1/c
    assert law.optimal_k(1.0, 0.0) == (math.inf, math.inf)
    assert law.optimal_k(0.75, 0.0) == (math.inf, 4.0)  # f -> 1/(1 - a)
    assert law.optimal_k(0.75, 0.0, k_max=3) == (3, pytest.approx((1 - 0.75**4) / 0.25))
    assert law.optimal_k(1.0, 0.25, k_max=6) == (6, pytest.approx(7 / 2.5))
    assert law.optimal_k(0.8, 0.05, k_max=5) == (5, pytest.approx(law.speedup([0.8] * 5, 0.05)))
    assert law.optimal_k(0.8, 0.05, k_max=0) == (0, 1.0)
    assert law.speedup([], 0.3) == 1.0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="a in"):
        law.optimal_k(1.2, 0.1)
    with pytest.raises(ValueError, match="c >= 0"):
        law.optimal_k(0.5, -0.1)
    with pytest.raises(ValueError, match="exactly one"):
        law.speedup([0.5], 0.1, survival=[0.5])
    with pytest.raises(ValueError, match="non-increasing"):
        law.speedup(survival=[0.5, 0.6])
    with pytest.raises(ValueError, match="target_cost\\(1\\) must be 1"):
        law.speedup([0.5], 0.1, target_cost=[2.0, 3.0])
    with pytest.raises(ValueError, match="costs of 1..2"):
        law.speedup([0.5], 0.1, target_cost=[1.0])
    with pytest.raises(ValueError, match="at least survival"):
        law.speedup(survival=[0.5], proposed=[0.4])
    with pytest.raises(ValueError, match="needs k_max"):
        law.optimal_k(0.5, 0.1, target_cost=lambda n: 1.0)
    with pytest.raises(ValueError, match="interior"):
        law.optimal_k_continuous(0.5, 0.6)


def test_trees_plug_in_through_survival_and_drafted():
    """A tree's accepted-depth law (law.tree_length_pmf) gives the survival; its node count the costs."""
    rng = np.random.default_rng(5)
    v, parents = 6, [-1, -1, 0, 0, 1, 2]  # 6 nodes, depth 3
    p = rng.dirichlet(np.ones(v), size=len(parents) + 1)
    q = rng.dirichlet(np.ones(v), size=len(parents) + 1)
    pmf = law.tree_length_pmf(p, q, parents, "with_replacement")
    survival = pmf[::-1].cumsum()[::-1][1:]  # P(depth >= i), i = 1..3
    cost = lambda n: 1 + 0.05 * (n - 1)  # noqa: E731
    got = law.speedup(survival=survival, c=0.02, target_cost=cost, drafted=len(parents))
    assert got == pytest.approx((1 + (np.arange(pmf.size) * pmf).sum()) / (0.02 * 6 + cost(7)), rel=1e-12)
    # a chain is the tree that drafts exactly K tokens
    assert law.speedup([0.7, 0.6], 0.1, cost, drafted=2) == pytest.approx(law.speedup([0.7, 0.6], 0.1, cost))
    with pytest.raises(ValueError, match="drafted"):
        law.speedup([0.5], drafted=-1)
