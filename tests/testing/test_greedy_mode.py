"""Greedy mode: specverify's greedy ops equal plain greedy decoding on every exhaustive case
(score rows with ties, -0.0 against 0.0, -inf masks) and on random large-V cases; every
catalogued greedy bug is caught; bad arguments are refused up front.  Fixed seeds."""

import numpy as np
import pytest

import specverify as sv
from specverify import testing
from specverify.testing import broken
from specverify.testing.greedy import greedy_reference, score_library

GREEDY_BUGS = [name for name, e in broken.CATALOGUE.items() if e.kind == "greedy"]


def batch_greedy(target_scores, draft_tokens):
    """verify_batch's greedy method on one request, through its ragged layout."""
    k = len(draft_tokens)
    out, accepted = sv.verify_batch(target_scores, None, draft_tokens, np.array([0, k]), method="greedy")
    return int(accepted[0]), int(out[0, accepted[0]])


@pytest.mark.parametrize("fn", [sv.verify_greedy, batch_greedy], ids=["verify_greedy", "verify_batch"])
def test_greedy_chain_ops_equal_plain_greedy_decoding(fn):
    report = testing.check_greedy(fn, vocab=3, k=2, random_cases=300, random_vocab=500, seed=3)
    testing.assert_lossless(report)
    assert report.settings["exhaustive_cases"] == len(score_library(3)) ** 3 * 3 ** 2  # the whole product
    assert not report.settings["exhaustive_sampled"]


def test_greedy_tree_op_equals_plain_greedy_decoding():
    report = testing.check_greedy(sv.verify_tree_greedy, kind="tree", tree_shape=[-1, -1, 0], vocab=3,
                                  random_cases=300, random_vocab=500, max_exhaustive=8000, seed=4)
    testing.assert_lossless(report)


@pytest.mark.parametrize("name", GREEDY_BUGS)
def test_catalogued_greedy_bugs_are_caught(name):
    entry = broken.CATALOGUE[name]
    report = testing.check_greedy(entry.fn, **entry.exact, random_cases=0)
    assert report.verdict == "violation", report
    case = report.reproducer
    # The reproducer is re-runnable: the entry and plain greedy decoding disagree on it.
    scores, tokens = np.array(case["target_scores"], dtype=np.float32), np.array(case["draft_tokens"])
    assert tuple(entry.fn(scores, tokens)) != greedy_reference(scores, tokens)


def test_ties_any_accepts_another_tie_order_but_not_a_rejected_unique_maximum():
    ties_to_last = broken.CATALOGUE["greedy_ties_to_last"].fn
    testing.assert_lossless(testing.check_greedy(ties_to_last, ties="any", k=1, random_cases=100))

    def always_rejects(target_scores, draft_tokens):
        return 0, int(np.argmax(target_scores[0]))

    assert testing.check_greedy(always_rejects, ties="any", random_cases=0).verdict == "violation"


def test_signed_zero_and_masked_rows_are_in_the_library():
    lib = score_library(4)
    assert any(np.signbit(r[0]) and r[0] == 0 and r[-1] == 0 and not np.signbit(r[-1]) for r in lib)
    assert any(np.isneginf(r).sum() == 3 for r in lib)
    assert greedy_reference(np.array([[-0.0, 0.0, -1.0]]), []) == (0, 0)  # -0.0 == 0.0: lowest index


def test_a_raising_or_misshapen_greedy_verifier_is_an_error_naming_the_case():
    def raises(target_scores, draft_tokens):
        raise RuntimeError("boom")

    report = testing.check_greedy(raises, random_cases=0)
    assert report.verdict == "error" and "boom" in report.summary and "target_scores" in report.error["case"]
    report = testing.check_greedy(lambda s, t: (0, s.shape[1]), random_cases=0)
    assert report.verdict == "error" and "outside" in report.summary


@pytest.mark.parametrize("kwargs,match", [({"vocab": 6}, "vocab"), ({"k": 5}, "k must"), ({"ties": "first"}, "ties"),
                                          ({"kind": "block"}, "kind"), ({"kind": "tree", "tree_shape": [0]}, "tree_shape")])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        testing.check_greedy(sv.verify_greedy, **kwargs)
