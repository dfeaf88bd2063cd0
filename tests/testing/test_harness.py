"""specverify.testing through its public API: our ops proven lossless, broken rules caught.

Exact mode must pass on specverify's chain and block ops (analytic cuts and bisection) and fail
on catalogued broken rules; sampled mode (alpha = 1e-6, stated by the harness) must pass on
``sv.accept`` and fail on a broken rule with its own randomness.  Fixed seeds: deterministic.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from specverify import testing  # noqa: E402
from specverify.testing import broken  # noqa: E402

ENTRIES = broken.CATALOGUE  # name -> Broken


@pytest.mark.parametrize("cuts", ["analytic", "bisect"])
@pytest.mark.parametrize("kind,op", [("chain", sv.accept_from_uniforms), ("block", sv.accept_block_from_uniforms)])
def test_our_ops_are_lossless_in_exact_mode(kind, op, cuts):
    report = testing.check_exact(op, kind=kind, vocab=3, k=2, cuts=cuts)
    testing.assert_lossless(report)


@pytest.mark.parametrize("name", ["residual_skipped", "uniform_reused", "normalization_ignored",
                                  "bonus_from_wrong_row", "zero_coin_accepts_zero_probability"])
def test_catalogued_chain_bugs_are_caught_in_exact_mode(name):
    entry = ENTRIES[name]
    report = testing.check_exact(entry.fn, **entry.exact)
    assert not report.passed, f"{name} passed the exact check"
    with pytest.raises(AssertionError):
        testing.assert_lossless(report)


def sampled_accept(target_probs, draft_probs, draft_tokens, generator):
    return sv.accept(target_probs, draft_probs, draft_tokens, generator)


def test_accept_passes_sampled_mode_and_states_its_power():
    report = testing.check_sampled(sampled_accept, kind="chain", vocab=3, k=2, rounds=4000, seed=1)
    testing.assert_lossless(report)
    assert "detectable" in str(report).lower()


def test_residual_skipped_is_caught_in_sampled_mode():
    entry = ENTRIES["residual_skipped"]
    assert entry.sampled is not None
    report = testing.check_sampled(testing.adapters.with_generator(entry.fn), **entry.sampled)
    assert not report.passed


def test_exact_mode_refuses_sizes_it_cannot_enumerate():
    with pytest.raises(ValueError, match="vocab"):
        testing.check_exact(sv.accept_from_uniforms, kind="chain", vocab=testing.LIMITS["vocab"] + 1)
