"""The analytic law: formulas against brute-force enumeration of the rejection sampler."""

import itertools

import numpy as np
import pytest

from specverify import law

from conftest import softmax_rows

pytestmark = pytest.mark.emulated


def enumerated_length_pmf(p, q):
    """Exact P(N = n) by summing over every draft-token sequence and acceptance outcome."""
    k, v = q.shape
    p = p / p.sum(axis=1, keepdims=True)
    q = q / q.sum(axis=1, keepdims=True)
    pmf = np.zeros(k + 1)
    for tokens in itertools.product(range(v), repeat=k):
        prob_tokens = np.prod([q[i, t] for i, t in enumerate(tokens)])
        survive = 1.0
        for i, t in enumerate(tokens):
            accept = min(1.0, p[i, t] / q[i, t]) if q[i, t] > 0 else 1.0
            pmf[i] += prob_tokens * survive * (1.0 - accept)
            survive *= accept
        pmf[k] += prob_tokens * survive
    return pmf


def test_pmf_matches_enumeration():
    rng = np.random.default_rng(0)
    p = softmax_rows(rng.standard_normal((4, 4))).astype(np.float64)
    q = softmax_rows(rng.standard_normal((3, 4))).astype(np.float64)
    a = law.acceptance_rates(p, q)
    np.testing.assert_allclose(law.accepted_length_pmf(a), enumerated_length_pmf(p[:3], q), rtol=1e-12, atol=1e-15)


def test_acceptance_is_one_minus_total_variation():
    rng = np.random.default_rng(1)
    p = rng.random((3, 50)) * 7.0  # unnormalized on purpose
    q = rng.random((3, 50))
    np.testing.assert_allclose(law.acceptance_rates(p, q), 1.0 - law.total_variation(p, q), rtol=1e-12)
    np.testing.assert_allclose(law.acceptance_rates(q, q * 3.0), 1.0, rtol=1e-12)


def test_mean_variance_and_tokens_per_round():
    a = np.array([0.9, 0.5, 0.7, 0.2])
    pmf = law.accepted_length_pmf(a)
    n = np.arange(5)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-15)
    assert law.mean_accepted(a) == pytest.approx((n * pmf).sum(), rel=1e-14)
    assert law.mean_accepted(a) == pytest.approx(0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.7 + 0.9 * 0.5 * 0.7 * 0.2)
    assert law.var_accepted(a) == pytest.approx((n**2 * pmf).sum() - (n * pmf).sum() ** 2, rel=1e-12)
    assert law.expected_tokens_per_round(a) == pytest.approx(law.mean_accepted(a) + 1.0)


def test_homogeneous_mean_and_edges():
    assert law.mean_accepted_homogeneous(0.678, 4) == pytest.approx(sum(0.678**i for i in range(1, 5)))
    assert law.mean_accepted_homogeneous(1.0, 5) == 5.0
    assert law.mean_accepted_homogeneous(0.0, 5) == 0.0
    np.testing.assert_array_equal(law.accepted_length_pmf([]), [1.0])  # K = 0: N = 0 surely
    with pytest.raises(ValueError):
        law.accepted_length_pmf([1.2])
