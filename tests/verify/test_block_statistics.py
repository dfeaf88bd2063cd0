"""accept_block at a realistic vocabulary (V = 32000): chi-square on counts, with power checks.

R rounds with fixed seeds; Pearson chi-square on counts (bins with expectation < 5 pooled) at
ALPHA = 1e-6, Bonferroni over a case's sub-tests:

- the accepted-length histogram against the block law P(N = n) = E[p_n] - E[p_{n+1}]
  (``specverify.law.block_survival``; its grid error, < 1e-4, is far below the test's resolution);
- for every position j, the emitted token at j among the rounds that reach it against the
  normalized target row j (block verification keeps this per-position property too: checked
  exactly in test_block_exact);
- the mean accepted length within 3 standard errors of the law's.

Power: the same test rejects three of the broken variants of the shared notes' section A.4 at a
tenth of the rounds.  The fourth (block acceptance with the token-wise residual) shifts the law by
TV ~0.016 and needs ~1e5 rounds: the exact harness (test_block_exact) is what rejects it.
"""

import functools

import numpy as np
import pytest

import specverify as sv
from specverify import law

from conftest import EMULATED, softmax_rows
from test_block_exact import rule_op
from test_ops_statistics import passes, pmf_pvalues, simulate

ALPHA = 1e-6
ROUNDS = 2_000 if EMULATED else 12_000
VOCAB = 32000


@functools.lru_cache(maxsize=None)
def realistic_pair(seed, k, sigma, vocab=VOCAB):
    """Peaked target rows ``softmax(z / 0.25)`` and noisy drafts ``softmax((z + sigma * eps) / 0.25)``
    (the synthetic experiments' "noise" family: ratios spread around 1, where block verification
    gains the most)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((k + 1, vocab))
    target = softmax_rows(4.0 * z)
    draft = softmax_rows(4.0 * (z[:k] + sigma * rng.standard_normal((k, vocab))))
    target.setflags(write=False)
    draft.setflags(write=False)
    return target, draft


@functools.lru_cache(maxsize=None)
def block_law_of(seed, k, sigma):
    return law.block_survival(*realistic_pair(seed, k, sigma))


def block_law_test_passes(sampler, case, rounds=ROUNDS, seed=0):
    """case: (seed, k, sigma) of realistic_pair.  The sub-tests of test_ops_statistics against the
    block law's pmf (its grid error, < 1e-4, far below the test's resolution)."""
    target, draft = realistic_pair(*case)
    accepted, emitted = simulate(sampler, target, draft, rounds, seed)
    block = block_law_of(*case)
    assert block.error < 1e-4
    pvalues = pmf_pvalues(block.pmf, target, accepted, emitted)
    return passes(pvalues), pvalues


@pytest.mark.parametrize("k,sigma", [(4, 0.2), (6, 0.4)])
def test_accept_block_follows_the_block_law(k, sigma):
    ok, pvalues = block_law_test_passes(sv.accept_block_from_uniforms, (1, k, sigma), seed=11)
    assert ok, pvalues


def test_accept_block_with_a_generator_follows_the_block_law():
    gen = np.random.default_rng(6)
    ok, pvalues = block_law_test_passes(lambda t, d, k, u: sv.accept_block(t, d, k, gen), (1, 4, 0.2),
                                        seed=13, rounds=ROUNDS // 2)
    assert ok, pvalues


def test_accept_block_is_never_worse_than_accept_empirically():
    # Same rows, same seeds: block accepts more on average (law: +0.28 tokens per round here).
    target, draft = realistic_pair(1, 4, 0.2)
    block, _ = simulate(sv.accept_block_from_uniforms, target, draft, ROUNDS // 2, 21)
    token, _ = simulate(sv.accept_from_uniforms, target, draft, ROUNDS // 2, 21)
    gain_law = block_law_of(1, 4, 0.2).mean - law.mean_accepted(law.acceptance_rates(target, draft))
    assert gain_law > 0.2
    assert block.mean() > token.mean()


@pytest.mark.parametrize("variant", ["h_equals_p", "first_failure", "tokenwise_ratio_longest_prefix"])
def test_the_block_law_test_rejects_broken_variants(variant):
    ok, pvalues = block_law_test_passes(rule_op(variant), (1, 4, 0.2), rounds=ROUNDS // 10, seed=22)
    assert not ok, pvalues


def test_the_readable_rule_itself_passes():
    # Sanity for the power checks: the same readable sampler without a defect passes.
    assert block_law_test_passes(rule_op("correct"), (1, 4, 0.2), rounds=ROUNDS // 10, seed=22)[0]
