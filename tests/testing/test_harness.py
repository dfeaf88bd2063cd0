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


def _slow_after_first_call():
    calls = [0]

    def verifier(target_probs, draft_probs, draft_tokens, uniforms):
        calls[0] += 1
        if calls[0] > 1:
            import time

            time.sleep(30)
        return sv.accept_from_uniforms(target_probs, draft_probs, draft_tokens, uniforms)

    return verifier


def test_bad_verifiers_get_a_report_naming_the_case_never_a_hang():
    report = testing.check_exact(_slow_after_first_call(), kind="chain", vocab=3, k=1, cuts="analytic",
                                 call_budget=0.3)
    assert report.verdict == "error" and report.error["what"] == "hung" and "target_probs" in report.error["case"]

    def wrong_type(target_probs, draft_probs, draft_tokens, uniforms):
        return "accepted"

    def out_of_range(target_probs, draft_probs, draft_tokens, uniforms):
        return 0, target_probs.shape[1]

    def own_randomness(target_probs, draft_probs, draft_tokens, uniforms):
        return sv.accept(target_probs, draft_probs, draft_tokens, np.random.default_rng())

    for fn, what in ((wrong_type, "wrong output"), (out_of_range, "out-of-range token"),
                     (own_randomness, "not a function of its uniforms")):
        report = testing.check_exact(fn, kind="chain", vocab=3, k=1, cuts="analytic")
        assert report.verdict == "error" and report.error["what"] == what, report
        assert "uniforms" in report.error["case"]


def test_without_replacement_trees_lacking_draft_support_are_refused_with_the_reason():
    one_hot = np.eye(3, dtype=np.float32)[[0, 1, 2]] * 16  # a draft row with one token cannot give 2 siblings
    target = np.full((3, 3), 16 / 3, dtype=np.float32)
    with pytest.raises(ValueError, match="siblings"):
        testing.check_exact(lambda *a: ([], 0), kind="tree", tree_rule="without_replacement",
                            models=[(target, one_hot)], tree_shape=[-1, -1])
