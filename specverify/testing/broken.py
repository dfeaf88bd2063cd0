"""The field's known-broken verifiers, as small runnable functions (the catalogue).

One entry per pitfall of the verification notes' section H (and A.5, B.5, B.6, D) and every
broken variant specverify's own tests use.  Each is a readable float64 rule in the harness's
layout taking its uniforms (exact mode); :func:`with_generator` (from
:mod:`specverify.testing.adapters`) turns it into a sampled-mode verifier.  ``CATALOGUE`` maps a
name to a :class:`Broken` record: where the bug was found, its effect, and the arguments of
``check_exact`` and ``check_sampled`` (including the number of rounds) that catch it; the tests
run every entry through both.

These functions are wrong on purpose.  Do not use them to verify anything.
"""

import functools
from typing import NamedTuple, Optional

import numpy as np

from .models import inverse_cdf

__all__ = ["Broken", "CATALOGUE", "chain_rule", "block_rule", "block_rule_cuts", "tree_walk", "tree_rule_cuts"]


class Broken(NamedTuple):
    name: str
    kind: str  # chain | block | tree | greedy
    source: str  # where it was found
    effect: str
    fn: object  # exact-mode function (harness layout unless exact["layout"] says otherwise)
    exact: dict  # check_exact / check_greedy keyword arguments that catch it
    sampled: Optional[dict]  # check_sampled keyword arguments (rounds included) that catch it; None: see note
    note: str = ""


def _rows(x):
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Chains: one readable token-wise rule, each defect a switch.
# ---------------------------------------------------------------------------------------------

def chain_rule(target_probs, draft_probs, draft_tokens, uniforms, *, residual="max(p-q,0)", draw="own",
               normalize=True, bonus_row=None, compare="u*q<p", coins=None, length="first failure"):
    """Token-wise speculative sampling in float64 with one switchable defect.

    Correct with the defaults: accept ``t_i`` iff ``u_i q_i(t_i) < p_i(t_i)`` (normalized rows), at
    the first rejection draw ``norm(max(p_i - q_i, 0))`` with ``u_K``, else the bonus from ``p_K``.

    Args:
        residual: ``"max(p-q,0)"``, ``"p"`` (residual skipped) or ``"p without t"`` (EAGLE #20).
        draw: ``"own"`` (``u_K``) or ``"reused"`` (the rejected coin ``u_i`` draws the token).
        normalize: False reads raw rows as probabilities.
        bonus_row: row of the bonus (default K).
        compare: ``"u*q<p"`` or ``"u<=p/q"`` (accepts a p = 0 draft at u = 0).
        coins: ``coins(q_rows, tokens, u) -> [K]`` replaces the coins (shared streams, hard-coded 0).
        length: ``"first failure"`` or ``"count passes"`` (n = number of passing coins anywhere).
    """
    p = _rows(target_probs)
    k = len(draft_tokens)
    v = p.shape[1]
    q = np.eye(v)[list(draft_tokens)].reshape(k, v) if draft_probs is None else _rows(draft_probs)
    if normalize:
        p = p / p.sum(axis=1, keepdims=True)
        q = q / q.sum(axis=1, keepdims=True)
    u = np.asarray(uniforms, dtype=np.float64)
    c = u[:k] if coins is None else coins(q, draft_tokens, u)
    passes = []
    for i, t in enumerate(draft_tokens):
        if compare == "u*q<p":
            passes.append(c[i] * q[i, t] < p[i, t])
        else:
            ratio = np.inf if q[i, t] == 0 else p[i, t] / q[i, t]
            passes.append(c[i] <= ratio)
    n = int(sum(passes)) if length == "count passes" else next((i for i, ok in enumerate(passes) if not ok), k)
    if n == k:
        return k, inverse_cdf(p[k if bonus_row is None else bonus_row], u[k])
    if residual == "max(p-q,0)":
        w = np.maximum(p[n] - q[n], 0.0)
    elif residual == "p":
        w = p[n].copy()
    else:
        w = p[n].copy()
        w[draft_tokens[n]] = 0.0
    if w.sum() <= 0:
        w = p[n]
    return n, inverse_cdf(w, c[n] if draw == "reused" else u[k])


def _shared_stream_coins(q, tokens, u):
    """The draft's own inverse-CDF uniform reused as the coin: given token t it lies in
    ``[F(t-1), F(t))``, i.e. ``F(t-1) + u q(t)`` (vLLM #47386: one Philox stream for both)."""
    out = np.empty(len(tokens))
    for i, t in enumerate(tokens):
        cdf = np.concatenate([[0.0], np.cumsum(q[i])])
        out[i] = cdf[t] + u[i] * q[i, t]
    return out


def _mutating(target_probs, draft_probs, draft_tokens, uniforms):
    """vllm-ascend #2881: the n-gram (point-mass) path zeroes target_probs in place for the
    recovered draw instead of zeroing a copy."""
    k = len(draft_tokens)
    u = np.asarray(uniforms, dtype=np.float64)
    for i, t in enumerate(draft_tokens):
        row = target_probs[i]
        if u[i] * row.sum() < row[t]:
            continue
        row[t] = 0.0  # in place: the caller's rows are corrupted
        return i, inverse_cdf(row if row.sum() > 0 else np.ones_like(row), u[k])
    return k, inverse_cdf(target_probs[k], u[k])


def _typical_acceptance(target_probs, draft_probs, draft_tokens, uniforms, epsilon=0.09, delta=0.3):
    """Medusa's typical acceptance (Cai et al. 2024, notes D): accept t iff ``p(t) > min(eps,
    delta exp(-H(p)))``; at the first miss sample p.  Lossy by design."""
    p = _rows(target_probs)
    p = p / p.sum(axis=1, keepdims=True)
    k = len(draft_tokens)
    for i, t in enumerate(draft_tokens):
        h = -np.sum(np.where(p[i] > 0, p[i] * np.log(np.where(p[i] > 0, p[i], 1.0)), 0.0))
        if not p[i, t] > min(epsilon, delta * np.exp(-h)):
            return i, inverse_cdf(p[i], uniforms[k])
    return k, inverse_cdf(p[k], uniforms[k])


def _softmax(logits):
    x = np.asarray(logits, dtype=np.float64)
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _target_not_warped(target_logits, draft_logits, draft_tokens, uniforms, *, warp):
    """vLLM #9834: the draft warped, the target's verification rows left raw (softmax only)."""
    import specverify as sv

    d = None if draft_logits is None else np.asarray(sv.warp(np.asarray(draft_logits, np.float32), **warp))
    return chain_rule(_softmax(target_logits), d, draft_tokens, uniforms)


def _draft_not_warped(target_logits, draft_logits, draft_tokens, uniforms, *, warp):
    """transformers #47932: the drafter samples from the warped q but reports the raw q."""
    import specverify as sv

    t = np.asarray(sv.warp(np.asarray(target_logits, np.float32), **warp))
    return chain_rule(t, None if draft_logits is None else _softmax(draft_logits), draft_tokens, uniforms)


# ---------------------------------------------------------------------------------------------
# Block verification (notes A.1, A.4, A.5).
# ---------------------------------------------------------------------------------------------

def _block_parts(target_probs, draft_probs, draft_tokens, variant):
    """``(h [K], dists [K+1, V], first_failure)`` of block verification or a broken variant."""
    P = _rows(target_probs)
    P = P / P.sum(axis=1, keepdims=True)
    k = len(draft_tokens)
    v = P.shape[1]
    Q = np.eye(v)[list(draft_tokens)].reshape(k, v) if draft_probs is None else _rows(draft_probs)
    Q = Q / Q.sum(axis=1, keepdims=True)
    r = [0.0 if P[i, t] == 0 else (np.inf if Q[i, t] == 0 else P[i, t] / Q[i, t]) for i, t in enumerate(draft_tokens)]
    s = [1.0]
    for i in range(k):
        s.append(0.0 if s[-1] == 0.0 else min(1.0, s[-1] * r[i]))
    h = []
    for i in range(1, k):
        z = np.maximum(s[i] * P[i] - Q[i], 0.0).sum()
        h.append(1.0 if z + 1.0 - s[i] <= 0.0 else z / (z + 1.0 - s[i]))
    h.append(s[k])
    scale = list(s)
    if variant == "h_equals_p":
        h = s[1:]
    elif variant == "tokenwise_ratio":
        h = [min(1.0, x) for x in r]
        scale = [1.0] * (k + 1)
    elif variant == "tokenwise_residual":
        scale = [1.0] * (k + 1)
    dists = []
    for i in range(k):
        w = np.maximum(scale[i] * P[i] - Q[i], 0.0)
        dists.append(w / w.sum() if w.sum() > 0 else P[i])
    dists.append(P[k])
    return h, np.array(dists), variant == "first_failure"


def block_rule(target_probs, draft_probs, draft_tokens, uniforms, *, variant):
    """Block verification (Sun et al.) with one of the broken variants of notes A.4:
    ``"h_equals_p"``, ``"first_failure"`` (vllm-ascend #11985 review), ``"tokenwise_ratio"``
    (vllm-ascend #7807: token-wise ratio with the longest prefix) or ``"tokenwise_residual"``
    (block acceptance, token-wise residual: the p_tau scaling omitted)."""
    h, dists, first_failure = _block_parts(target_probs, draft_probs, draft_tokens, variant)
    k = len(draft_tokens)
    u = np.asarray(uniforms, dtype=np.float64)
    passes = [u[i] < h[i] for i in range(k)]
    if first_failure:
        tau = next((i for i, ok in enumerate(passes) if not ok), k)
    else:
        tau = max([i + 1 for i, ok in enumerate(passes) if ok], default=0)
    return tau, inverse_cdf(dists[tau], u[k])


def block_rule_cuts(variant):
    """Declared cuts of :func:`block_rule` (``check_exact(cuts=...)``): coin i at ``h_i``, the final
    draw at the CDF points of every distribution it can end with."""
    from .models import inverse_cdf_cuts

    def make(target_rows, draft_rows, tokens):
        h, dists, _ = _block_parts(target_rows, draft_rows, tokens, variant)
        final = np.concatenate([inverse_cdf_cuts(d) for d in dists])
        return lambda prefix: [h[len(prefix)]] if len(prefix) < len(tokens) else final

    return make


def tree_rule_cuts(node_rule):
    """Declared cuts of :func:`tree_walk` with ``node_rule``: node i's coin at its acceptance
    probability, the final draw at the CDF points of every residual and leaf row."""
    from specverify import law

    from .models import inverse_cdf_cuts

    def make(target_rows, draft_rows, tokens, parents):
        target = np.asarray(target_rows, dtype=np.float64)
        cuts = [[] for _ in range(len(tokens) + 1)]
        for r, kids in enumerate(law.tree_children(np.asarray(parents, dtype=np.int64))):
            if not kids:
                cuts[-1].extend(inverse_cdf_cuts(target[r]))
                continue
            accept, residual = node_rule(target[r], None if draft_rows is None else np.asarray(draft_rows)[r],
                                         [int(tokens[i]) for i in kids])
            for i, a in zip(kids, accept):
                cuts[i].append(a)
            cuts[-1].extend(inverse_cdf_cuts(residual))
        return lambda prefix: cuts[len(prefix)]

    return make


# ---------------------------------------------------------------------------------------------
# Trees (notes B.5, B.6): a walk over node rules.
# ---------------------------------------------------------------------------------------------

def _normalized(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def _rrs(p, q, tokens, replacement):
    from specverify import law

    return law.node_rule(p, q, tokens, "with_replacement" if replacement else "without_replacement")


def against_original_p(p, q, tokens):
    """Every child tested against the original p, then one residual."""
    p, q = _normalized(p), _normalized(q)
    accept = [min(1.0, p[t] / q[t]) if q[t] > 0 else float(p[t] > 0) for t in tokens]
    d = np.maximum(p - q, 0.0)
    return accept, d / d.sum() if d.sum() > 0 else p


def duplicates_merged(p, q, tokens):
    """With-replacement children whose repeated tokens are merged before the residual recursion."""
    first = [j for j, t in enumerate(tokens) if t not in tokens[:j]]
    accept_unique, residual = _rrs(p, q, [tokens[j] for j in first], True)
    accept = np.zeros(len(tokens))
    accept[first] = accept_unique
    return accept, residual


def unconditioned_q(p, q, tokens):
    """Without-replacement children verified with the with-replacement rule (q not conditioned)."""
    return _rrs(p, q, tokens, True)


def double_counting_target_only(p, q, tokens):
    """The target-only rule on repeated siblings: a repeated token's mass is counted twice."""
    p = _normalized(p)
    accept, before = [], 0.0
    for t in tokens:
        accept.append(min(1.0, p[t] / (1.0 - before)) if before < 1.0 else 1.0)
        before += p[t]
    rest = p.copy()
    rest[list(tokens)] = 0.0
    return accept, rest / rest.sum() if rest.sum() > 0 else p


def target_only_not_renormalized(p, q, tokens):
    """The target-only rule testing child j with p(c_j), not p(c_j) / (1 - sum_{i<j} p(c_i))."""
    p = _normalized(p)
    rest = p.copy()
    rest[list(tokens)] = 0.0
    return [p[t] for t in tokens], rest / rest.sum() if rest.sum() > 0 else p


def sibling_unrenormalized_residual(p, q, tokens):
    """Recursive rejection sampling whose residual ``max(r - q, 0)`` is not renormalized before
    the next sibling is tested against it."""
    p, q = _normalized(p), _normalized(q)
    r, accept = p, []
    for t in tokens:
        accept.append(min(1.0, r[t] / q[t]) if q[t] > 0 else float(r[t] > 0))
        r = np.maximum(r - q, 0.0)  # not renormalized
    return accept, (r / r.sum() if r.sum() > 0 else p)


def tree_walk(target_probs, draft_probs, draft_tokens, parents, uniforms, *, node_rule):
    """A tree verifier from a node rule ``node_rule(p [V], q [V] or None, tokens) -> (accept [k],
    residual [V])``: node i accepted iff ``u_i < accept``; the final draw with ``u_N``."""
    from specverify import law

    target = np.asarray(target_probs, dtype=np.float64)
    draft = None if draft_probs is None else np.asarray(draft_probs, dtype=np.float64)
    children = law.tree_children(np.asarray(parents, dtype=np.int64))
    u = np.asarray(uniforms, dtype=np.float64)
    path, r = [], 0
    while True:
        kids = children[r]
        if not kids:
            final = target[r] / target[r].sum()
            break
        accept, residual = node_rule(target[r], None if draft is None else draft[r], [int(draft_tokens[i]) for i in kids])
        chosen = next((i for i, a in zip(kids, accept) if u[i] < a), None)
        if chosen is None:
            final = residual
            break
        path.append(chosen)
        r = chosen + 1
    return path, inverse_cdf(final, u[-1])


# ---------------------------------------------------------------------------------------------
# Greedy (verify_greedy's contract: ties to the lowest index, -0.0 == 0.0).
# ---------------------------------------------------------------------------------------------

def _greedy(target_scores, draft_tokens, *, argmax):
    s = np.asarray(target_scores, dtype=np.float64)
    for i, t in enumerate(draft_tokens):
        best = argmax(s[i])
        if best != t:
            return i, best
    return len(draft_tokens), argmax(s[len(draft_tokens)])


def _ties_to_last(row):
    return int(row.size - 1 - np.argmax(row[::-1]))


def _signed_zero_argmax(row):
    # Orders -0.0 below +0.0 (a bit-pattern comparison), so a -0.0 maximum tied with +0.0 loses.
    key = np.where((row == 0) & np.signbit(row), -1e-300, row)
    return int(np.argmax(key))


def _greedy_bonus_wrong_row(target_scores, draft_tokens):
    s = np.asarray(target_scores, dtype=np.float64)
    k = len(draft_tokens)
    for i, t in enumerate(draft_tokens):
        if int(np.argmax(s[i])) != t:
            return i, int(np.argmax(s[i]))
    return k, int(np.argmax(s[max(k - 1, 0)]))


def _flashinfer_unguarded(draft_probs, draft_token_ids, uniform_samples, target_probs):
    from .peers import flashinfer_style_chain

    return flashinfer_style_chain(draft_probs, draft_token_ids, uniform_samples, target_probs, guard_padding=False)


# ---------------------------------------------------------------------------------------------
# The catalogue.
# ---------------------------------------------------------------------------------------------

_P = functools.partial
_WARP = {"temperature": 0.7, "top_k": 2}


def _chain(name, source, effect, fn, exact=None, rounds=1000, sampled=None, note=""):
    return Broken(name, "chain", source, effect, fn, {"kind": "chain", **(exact or {})},
                  None if rounds is None else {"kind": "chain", "rounds": rounds, **(sampled or {})}, note)


def _tree(name, source, effect, node_rule, rule, rounds=1000, vocab=3):
    return Broken(name, "tree", source, effect, _P(tree_walk, node_rule=node_rule),
                  {"kind": "tree", "tree_rule": rule, "cuts": tree_rule_cuts(node_rule)},
                  {"kind": "tree", "tree_rule": rule, "rounds": rounds, "vocab": vocab})


def _block(name, source, effect, variant, exact=None, rounds=1000, sampled=None):
    return Broken(name, "block", source, effect, _P(block_rule, variant=variant),
                  {"kind": "block", "cuts": block_rule_cuts(variant), **(exact or {})},
                  {"kind": "block", "rounds": rounds, **(sampled or {})})


_ENTRIES = [
    _chain("residual_skipped", "specverify tests (test_ops_statistics)", "recovered token drawn from p, not "
           "norm(max(p - q, 0)): over-represents the draft's tokens", _P(chain_rule, residual="p")),
    _chain("uniform_reused", "specverify tests; FlashInfer #424 (\"use unique uniform samples\")",
           "the rejected coin also draws the recovered token: the draw is confined to part of the CDF",
           _P(chain_rule, draw="reused"), exact={"vocab": 4}, rounds=2000, sampled={"vocab": 6},
           note="needs a residual with two or more tokens: V = 4 in exact mode"),
    _chain("normalization_ignored", "specverify tests", "raw rows read as probabilities: acceptance and residual "
           "scaled by the row masses", _P(chain_rule, normalize=False)),
    _chain("bonus_from_wrong_row", "specverify tests", "the bonus token drawn from row K-1 instead of row K",
           _P(chain_rule, bonus_row=-2)),
    _chain("zero_coin_accepts_zero_probability", "SGLang #35771 (coin <= prob_acc); vLLM V1 keeps target/draft >= u",
           "coin = 0 accepts a draft of target probability 0", _P(chain_rule, compare="u<=p/q"),
           exact={"cuts": "analytic"}, rounds=None,
           note="measure zero: a sampled check cannot see it (a float32 coin is exactly 0 with probability "
                "2^-24 per test); exact mode evaluates every cell at u = 0 and finds the zero-probability token"),
    _chain("coin_hardcoded_zero", "vllm-ascend #13766 (NPU port hard-coded u = 0)", "every draft with p > 0 accepted",
           _P(chain_rule, coins=lambda q, t, u: np.zeros(len(t)))),
    _chain("residual_zeroes_the_token", "EAGLE #20, xLLM #2175", "residual = p with the rejected token zeroed "
           "instead of max(p - q, 0), for stochastic drafts", _P(chain_rule, residual="p without t"),
           exact={"drafts": "stochastic"}),
    _chain("n_counts_every_pass", "transformers PR #28508 (n_matches); FlashInfer output_accepted_token_num used as tau",
           "the accepted count counts passing coins anywhere, not the leading run",
           _P(chain_rule, length="count passes"), exact={"k": 3}, sampled={"k": 3}),
    _chain("one_stream_for_draft_and_coin", "vLLM #47386 / PR #54282 (MRV2 Philox stream shared)",
           "the acceptance coin is the draft's own uniform: biased toward draft-preferred tokens",
           _P(chain_rule, coins=_shared_stream_coins), exact={"drafts": "stochastic"}),
    _chain("inputs_mutated", "vllm-ascend #2881 (target_probs zeroed in place before cloning)",
           "corrupts the rows later rounds read", _mutating, exact={"drafts": "deterministic"},
           sampled={"draft_kind": "deterministic"}),
    _chain("typical_acceptance", "Medusa (Cai et al. 2024), vLLM V0 TypicalAcceptanceSampler (notes D)",
           "lossy by design: a deterministic threshold on p", _typical_acceptance),
    _chain("target_not_warped", "vLLM #9834 / PR #10198", "target rows not temperature/top-k processed in "
           "verification", _P(_target_not_warped, warp=_WARP), exact={"warp": _WARP}, sampled={"warp": _WARP}),
    _chain("draft_probs_not_warped", "transformers #47932", "the drafter samples from the top-k-warped q but "
           "reports the raw q", _P(_draft_not_warped, warp=_WARP), exact={"warp": _WARP, "drafts": "stochastic"},
           rounds=4000, sampled={"warp": _WARP}),
    _chain("padding_read_as_token", "FlashInfer #879 (open PR #3551)", "a -1 padded draft id used as an index: "
           "out-of-bounds read, spurious acceptance", _flashinfer_unguarded, exact={"layout": "flashinfer"},
           sampled={"layout": "flashinfer"}),
    _block("block_h_equals_p", "notes A.4", "h_i = p_i (no residual-mass correction)", "h_equals_p", rounds=4000),
    _block("block_first_failure", "vllm-ascend #11985 review suggestion", "stop at the first failing coin with "
           "block h_i", "first_failure", rounds=2000),
    _block("block_tokenwise_ratio", "vllm-ascend #7807 / #7808", "token-wise ratio with the longest prefix and "
           "token-wise residual", "tokenwise_ratio"),
    _block("block_tokenwise_residual", "notes A.4 (the subtle one: TV ~0.016)", "block acceptance with the token-wise "
           "residual (p_tau scaling omitted)", "tokenwise_residual",
           exact={"k": 3, "vocab": 4, "drafts": "stochastic"}, rounds=3000, sampled={"k": 2, "vocab": 4, "seed": 5}),
    _tree("tree_children_against_original_p", "notes B.5", "every child tested against the original p, then one "
          "residual", against_original_p, "with_replacement"),
    _tree("tree_duplicates_merged", "notes B.5/B.6", "with-replacement siblings with repeated tokens merged",
          duplicates_merged, "with_replacement", rounds=6000, vocab=6),
    _tree("tree_q_not_conditioned", "notes B.5", "without-replacement drafts verified with the with-replacement "
          "residual", unconditioned_q, "without_replacement", rounds=4000, vocab=4),
    _tree("tree_target_only_double_counting", "notes B.5/B.6", "target-only rule on repeated siblings counts a "
          "token's mass twice", double_counting_target_only, "with_replacement"),
    _tree("tree_target_only_not_renormalized", "specverify tests", "target-only rule tests child j with p(c_j), not "
          "renormalized by the earlier siblings", target_only_not_renormalized, "without_replacement",
          rounds=4000),
    _tree("tree_sibling_unrenormalized_residual", "specverify tests (issue 39)", "a later sibling tested against "
          "max(r - q, 0) without renormalizing", sibling_unrenormalized_residual, "with_replacement", rounds=6000,
          vocab=4),
    Broken("greedy_ties_to_last", "greedy", "notes C (tie-break must match plain greedy)", "ties broken to the "
           "highest index", _P(_greedy, argmax=_ties_to_last), {}, None),
    Broken("greedy_signed_zero", "greedy", "verify_greedy contract (-0.0 == 0.0)", "-0.0 ordered below +0.0",
           _P(_greedy, argmax=_signed_zero_argmax), {}, None),
    Broken("greedy_bonus_from_wrong_row", "greedy", "specverify tests", "all-matched bonus from row K-1",
           _greedy_bonus_wrong_row, {}, None),
]

CATALOGUE = {entry.name: entry for entry in _ENTRIES}
