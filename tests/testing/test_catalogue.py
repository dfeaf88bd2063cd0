"""Every catalogued broken rule is caught, in exact mode and (where the entry says a sampled check
can see it) in sampled mode at the number of rounds the entry states; the correct rule written the
same way passes the same checks (the control: the catch is the bug's, not the harness's).

Exact mode: TV tolerance 1e-9 on enumerated laws (``full_scan=False``: the check stops at the
first violating context).  Sampled mode: alpha = 1e-6 for a whole check (Bonferroni over its
sub-tests), fixed seeds, so each verdict is deterministic; the rounds are the entries' own.
"""

import functools

import pytest

from specverify import law, testing
from specverify.testing import adapters, broken

CATALOGUE = broken.CATALOGUE
EXACT = [name for name, e in CATALOGUE.items() if e.kind != "greedy"]
SAMPLED = [name for name, e in CATALOGUE.items() if e.sampled is not None]


def sampled_fn(entry):
    return adapters.with_generator(entry.fn, "tree" if entry.kind == "tree" else "chain",
                                   entry.exact.get("layout", "specverify"))


@pytest.mark.parametrize("name", EXACT)
def test_exact_mode_catches_every_entry(name):
    entry = CATALOGUE[name]
    report = testing.check_exact(entry.fn, **entry.exact, full_scan=False, reproducer=False)
    assert not report.passed, report


@pytest.mark.parametrize("name", SAMPLED)
def test_sampled_mode_catches_every_entry_it_can_see(name):
    entry = CATALOGUE[name]
    report = testing.check_sampled(sampled_fn(entry), **entry.sampled)
    assert not report.passed, report
    if report.verdict == "violation" and report.positions:
        assert report.detectable_tv is not None and 0 < report.detectable_tv < 1


def test_every_entry_is_caught_somewhere_and_says_why_not_elsewhere():
    for name, e in CATALOGUE.items():
        assert e.kind in ("chain", "block", "tree", "greedy"), name
        if e.kind != "greedy" and e.sampled is None:
            assert e.note, f"{name}: no sampled check and no note saying why"
        assert e.source and e.effect, name


def _correct_tree(rule):
    node_rule = functools.partial(law.node_rule, rule=rule)
    return functools.partial(broken.tree_walk, node_rule=node_rule), broken.tree_rule_cuts(node_rule)


CONTROLS = {  # the standard rule's cuts: the harness's consistency check still tests every cell
    "chain": (broken.chain_rule, {"kind": "chain", "cuts": "analytic"}, {"kind": "chain", "rounds": 1000}),
    "chain_v4": (broken.chain_rule, {"kind": "chain", "vocab": 4, "cuts": "analytic"},
                 {"kind": "chain", "rounds": 2000, "vocab": 6}),
    "block": (functools.partial(broken.block_rule, variant="correct"), {"kind": "block", "cuts": "analytic"},
              {"kind": "block", "rounds": 1000}),
    "block_v4": (functools.partial(broken.block_rule, variant="correct"), None,  # exact: the "block" control
                 {"kind": "block", "rounds": 3000, "k": 2, "vocab": 4, "seed": 5}),
}
for _rule, _rounds in (("with_replacement", 1000), ("without_replacement", 2000)):
    _fn, _cuts = _correct_tree(_rule)
    CONTROLS[f"tree_{_rule}"] = (_fn, {"kind": "tree", "tree_rule": _rule, "cuts": _cuts},
                                 {"kind": "tree", "tree_rule": _rule, "rounds": _rounds})


@pytest.mark.parametrize("name", list(CONTROLS))
def test_the_correct_rule_written_the_same_way_passes(name):
    """Under the settings (and sample sizes) that catch the entries of its kind."""
    fn, exact, sampled = CONTROLS[name]
    if exact is not None:
        testing.assert_lossless(testing.check_exact(fn, **exact))
    kind = "tree" if name.startswith("tree") else "chain"
    testing.assert_lossless(testing.check_sampled(adapters.with_generator(fn, kind), **sampled))


def test_a_violation_comes_with_a_rerunnable_reproducer():
    entry = CATALOGUE["residual_skipped"]
    report = testing.check_exact(entry.fn, **entry.exact, k=1)
    rep = report.reproducer
    assert rep["round_tv_vs_standard_rule"] > 1e-3 and report.worst_tv[-1]["tv"] > 1e-3
    import numpy as np

    args = [None if rep["inputs"][k] is None else np.array(rep["inputs"][k])
            for k in ("target_probs", "draft_probs", "draft_tokens")]
    u = np.array(rep["uniforms"])
    n, token = entry.fn(*args, u)
    assert [int(t) for t in args[2][:n]] + [int(token)] == rep["verifier_emits"] != rep["standard_rule_emits"]
