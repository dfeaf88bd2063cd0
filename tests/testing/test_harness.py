"""specverify.testing through its public API: our ops proven lossless, broken rules caught.

Exact mode must pass on specverify's chain and block ops (analytic cuts and bisection); sampled
mode (alpha = 1e-6, stated by the harness) must pass on ``sv.accept``.  The catalogue of broken
rules is run in both modes by test_catalogue.py, every other op by test_ops_through_harness.py.
Fixed seeds: deterministic.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from specverify import testing  # noqa: E402


@pytest.mark.parametrize("cuts", ["analytic", "bisect"])
@pytest.mark.parametrize("kind,op", [("chain", sv.accept_from_uniforms), ("block", sv.accept_block_from_uniforms)])
def test_our_ops_are_lossless_in_exact_mode(kind, op, cuts):
    report = testing.check_exact(op, kind=kind, vocab=3, k=2, cuts=cuts)
    testing.assert_lossless(report)


def sampled_accept(target_probs, draft_probs, draft_tokens, generator):
    return sv.accept(target_probs, draft_probs, draft_tokens, generator)


def test_accept_passes_sampled_mode_and_states_its_power():
    report = testing.check_sampled(sampled_accept, kind="chain", vocab=3, k=2, rounds=4000, seed=1)
    testing.assert_lossless(report)
    assert "detectable" in str(report).lower()


def test_exact_mode_refuses_sizes_it_cannot_enumerate():
    with pytest.raises(ValueError, match="vocab"):
        testing.check_exact(sv.accept_from_uniforms, kind="chain", vocab=testing.LIMITS["vocab"] + 1)
