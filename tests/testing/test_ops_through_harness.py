"""Every specverify op proven lossless through the public harness (exact mode, to TV 1e-9 by
enumerating the cells of its uniforms), and bisection finding the same change points as the
analytic cuts of the standard rules.

Ops: chain (``accept_from_uniforms``), block (``accept_block_from_uniforms``), the three tree
rules (``accept_tree_from_uniforms``), the batch (``verify_batch`` in its ragged layout, and behind
the FlashInfer and vLLM signatures), logits in (``accept_*_logits_from_uniforms`` with warping).
No randomness: every number here is deterministic.
"""

import functools

import numpy as np
import pytest

import specverify as sv
from specverify import testing
from specverify.testing import _kinds, adapters
from specverify.testing.exact import bisect_cuts
from specverify.testing.models import model_pairs

WARP = {"temperature": 0.7, "top_k": 2}


def tree_op(rule):
    if rule == "deterministic":
        return lambda t, d, tok, par, u: sv.accept_tree_from_uniforms(t, None, tok, par, u)
    return functools.partial(_tree_sampled, replacement=rule == "with_replacement")


def _tree_sampled(t, d, tok, par, u, replacement):
    return sv.accept_tree_from_uniforms(t, d, tok, par, u, replacement=replacement)


def batch_op(method):
    return lambda t, d, tok, cu, u: sv.verify_batch(t, d, tok, cu, method=method, uniforms=u)


def vllm_op(method):
    """specverify behind vLLM V1's verifier layout (bonus sampled outside, as vLLM does)."""
    f = adapters.specverify_as_vllm(method)

    def call(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids, uniform_samples,
             recovery_uniforms):
        # vLLM's target rows are the verification rows; specverify wants each request's bonus row after
        # them, whose draw the adapter has already made (bonus_token_ids): a one-hot row reproduces it.
        cu = np.asarray(cu_num_draft_tokens)
        starts = np.concatenate([[0], cu[:-1]])
        v = target_probs.shape[1]
        rows, u = [], []
        for r, (a, b) in enumerate(zip(starts, cu)):
            rows.append(target_probs[a:b])
            rows.append(np.eye(v, dtype=target_probs.dtype)[[bonus_token_ids[r]]])
            u.extend(list(uniform_samples[a:b]) + [recovery_uniforms[r]])
        return f(draft_token_ids, cu, draft_probs, np.concatenate(rows), np.array(u), int(np.diff(starts, append=cu[-1]).max()))

    return call


OPS = {
    "chain": (sv.accept_from_uniforms, {"kind": "chain"}),
    "block": (sv.accept_block_from_uniforms, {"kind": "block"}),
    "tree_deterministic": (tree_op("deterministic"), {"kind": "tree", "tree_rule": "deterministic"}),
    "tree_with_replacement": (tree_op("with_replacement"), {"kind": "tree", "tree_rule": "with_replacement"}),
    "tree_without_replacement": (tree_op("without_replacement"), {"kind": "tree", "tree_rule": "without_replacement"}),
    "tree_wide": (tree_op("without_replacement"), {"kind": "tree", "tree_rule": "without_replacement",
                                                   "tree_shape": "wide"}),
    "batch_token": (batch_op("token"), {"kind": "chain", "layout": "batch"}),
    "batch_block": (batch_op("block"), {"kind": "block", "layout": "batch"}),
    "flashinfer_signature": (adapters.specverify_as_flashinfer(), {"kind": "chain", "layout": "flashinfer"}),
    "vllm_signature": (vllm_op("token"), {"kind": "chain", "layout": "vllm"}),
    "logits_chain": (functools.partial(sv.accept_logits_from_uniforms, **WARP), {"kind": "chain", "warp": WARP}),
    "logits_block": (functools.partial(sv.accept_block_logits_from_uniforms, **WARP), {"kind": "block", "warp": WARP}),
    "order2_chain": (sv.accept_from_uniforms, {"kind": "chain", "order": 2, "k": 1}),
}


@pytest.mark.parametrize("name", list(OPS))
def test_every_op_is_lossless_in_exact_mode(name):
    fn, kwargs = OPS[name]
    kwargs = {"vocab": 3, "k": 2, **kwargs}
    report = testing.check_exact(fn, cuts="analytic", **kwargs)
    testing.assert_lossless(report)
    assert all(w["tv"] <= 1e-9 for w in report.worst_tv)


# chain and block under bisection: test_harness.py.
@pytest.mark.parametrize("name", ["tree_with_replacement", "batch_token"])
def test_bisection_proves_the_ops_without_being_told_the_cuts(name):
    fn, kwargs = OPS[name]
    if name.startswith("tree"):
        kwargs = {**kwargs, "tree_shape": [-1, -1, 0]}  # 4 uniforms: bisection cost grows with every one
    report = testing.check_exact(fn, vocab=3, k=1 if name.startswith("batch") else 2, cuts="bisect", **kwargs)
    testing.assert_lossless(report)  # within the bisection's resolution 2^-40 per cut


def test_logits_ops_under_bisection_are_exact_to_float32_warping():
    """Bisection sees the kernel's own float32 thresholds: after a temperature the warped rows are
    not dyadic, so the law is exact only to float32 rounding (measured 1.3e-8); stated tolerance 1e-6."""
    fn, kwargs = OPS["logits_chain"]
    report = testing.check_exact(fn, vocab=3, k=1, cuts="bisect", tolerance=1e-6, **kwargs)
    testing.assert_lossless(report)


def _cases(kind, seed=0):
    """Round inputs (target rows, draft rows, tokens[, parents]) from the harness's models."""
    target, draft = model_pairs(3, 1, seeds=(seed,))[0]
    if kind == "tree":
        parents = [-1, -1, 0]
        for tokens, _ in list(_kinds.tree_drafts(draft, (1,), parents, "with_replacement"))[:6]:
            paths = [()]
            for i, p in enumerate(parents):
                paths.append(paths[p + 1] + (tokens[i],))
            t = np.stack([target.row((1,) + pth) for pth in paths])
            d = np.stack([draft.row((1,) + pth) for pth in paths])
            yield t, d, np.array(tokens), np.array(parents)
        return
    for path, _ in _kinds.chain_draft_paths(draft, (2,), 2, False)[:6]:
        t = np.stack([target.row((2,) + path[:i]) for i in range(3)])
        d = np.stack([draft.row((2,) + path[:i]) for i in range(2)])
        yield t, d, np.array(path), None


def _tree_outcome(t, d, tokens, parents):
    def op(u):
        path, token = sv.accept_tree_from_uniforms(t, d, tokens, parents, u, replacement=True)
        return tuple(path.tolist()), token

    return op


def _chain_outcome(fn, t, d, tokens, u):
    return fn(t, d, tokens, u)


@pytest.mark.parametrize("kind", ["chain", "block", "tree"])
def test_bisection_finds_the_analytic_cuts(kind):
    """Every change point bisection finds is an analytic cut (within the resolution), and every
    analytic cut where the output does change is found, uniform by uniform along the cell walk."""
    resolution = 2.0 ** -40
    for t, d, tokens, parents in _cases(kind):
        n = len(tokens) + 1
        if kind == "tree":
            analytic = _kinds.tree_rule_cuts("with_replacement")(t, d, tokens, parents)
            op = _tree_outcome(t, d, tokens, parents)
        else:
            fn = sv.accept_from_uniforms if kind == "chain" else sv.accept_block_from_uniforms
            analytic = (_kinds.token_rule_cuts if kind == "chain" else _kinds.block_rule_cuts)(t, d, tokens)
            op = functools.partial(_chain_outcome, fn, t, d, tokens)
        checked = [0]

        def walk(prefix):
            if len(prefix) == n:
                return
            found = bisect_cuts(op, prefix, n, resolution=resolution)
            want = sorted(c for c in set(np.round(analytic(prefix), 15)) if 0.0 < c < 1.0)
            for c in found:  # no change point that is not an analytic cut
                assert min(abs(c - a) for a in want) <= resolution, (prefix, found, want)
            for a in want:  # an analytic cut is found unless the output is the same on both sides
                if min((abs(c - a) for c in found), default=1.0) > resolution:
                    lo, hi = a - 1e-6, a + 1e-6
                    rest = [0.5] * (n - len(prefix) - 1)
                    assert op(np.array(prefix + [lo] + rest)) == op(np.array(prefix + [hi] + rest)), (prefix, a)
            checked[0] += 1
            mids = np.concatenate([[0.0], found, [1.0]])
            for lo, hi in zip(mids[:-1], mids[1:]):
                walk(prefix + [(lo + hi) / 2.0])

        walk([])
        assert checked[0] >= n
