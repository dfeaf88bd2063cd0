"""Exact mode: the exact law of a verifier's emitted tokens, by enumeration of its uniforms.

A verifier that takes its uniforms as inputs is, for fixed rows and drafts, a function of those
uniforms; every correct verifier (and nearly every broken one) is *piecewise constant* in each:
a coin is compared with a threshold, an inverse-CDF draw with cumulative masses.  Given the cut
points of every uniform (declared by the caller, the analytic cuts of specverify's rules, or found
here by bisection), calling the verifier at the midpoint of every cell of the grid and weighting by
the cell's volume gives its exact one-round law.  Rounds are composed over small Markov models
(every draft path enumerated with its draft probability) until ``length`` tokens exist, and the
law of those tokens is compared with the target's joint law: a lossless verifier has total
variation 0 (up to float64 rounding and the bisection resolution), a broken one does not.

Bisection (``cuts="bisect"``), for uniform j given the values of the uniforms before it:

- the later uniforms are set to each of a few probe vectors (all ``2^-30``, all 0.5, all
  ``1 - 2^-30``, and one seeded random vector); the *signature* of a value x of uniform j is the
  tuple of the verifier's outputs at those probes;
- the signature is evaluated at ``x = 0``, at the midpoints of ``grid`` equal cells and at
  ``1 - 2^-30``; wherever
  two neighbours differ, the interval is halved until it is ``resolution`` wide (default
  ``2^-40``), recursing into both halves when the midpoint differs from both ends: each change
  point is located within ``resolution``, so each cut costs at most ``resolution`` of probability;
- two change points within one grid cell whose outer signatures agree would be missed, and so would
  a change visible at none of the probes; a *consistency check* at every cell catches both when
  they matter: the verifier is called with each uniform moved to just inside its cell's ends
  (``margin`` = 1e-6 from them, above a float32 kernel's rounding of its thresholds; exactly 0 at a cell starting at 0) and must return the same output.
  It also checks declared cuts.  A verifier that fails it, that needs more than ``max_cuts`` cuts
  in one uniform, or that returns different outputs for the same inputs (one that draws its own
  randomness and ignores the given uniforms) is reported as not piecewise constant.

Every output is also checked against the target's support: a lossless verifier never emits a
token of target probability 0, for *any* uniforms in ``[0, 1)``, including exactly 0 (SGLang
#35771: ``coin <= ratio`` with coin = 0 accepted a zero-probability draft).
"""

import functools
import time
from collections import defaultdict

import numpy as np

from . import _args, _kinds
from ._args import ArgumentError
from ._calls import Caller, VerifierFault, describe, run_guarded
from .models import MarkovModel, compose_rounds, law_over_uniforms, marginal, model_pairs, target_law, \
    total_variation
from .report import Report

__all__ = ["check_exact", "bisect_cuts", "LIMITS"]

# Enumeration grows as V^K (draft paths) times the cells of K + 1 uniforms, and V^L (sequences).
LIMITS = {"vocab": 5, "k": 4, "length": 6, "uniforms": 9, "tree_nodes": 6}

_PROBES = (2.0 ** -30, 0.5, 1.0 - 2.0 ** -30)


class _SupportViolation(Exception):
    def __init__(self, emitted, context, uniforms):
        super().__init__(f"emitted {emitted} has target probability 0 after context {context}")
        self.emitted, self.context, self.uniforms = emitted, context, uniforms


def bisect_cuts(op, prefix, n_uniforms, *, grid=16, resolution=2.0 ** -40, max_cuts=64, seed=0,
                max_evaluations=20_000):
    """Change points of uniform ``len(prefix)`` of ``op(u [n_uniforms])`` given ``prefix``.

    Returns the sorted cut points (each within ``resolution`` of a change).  Raises
    :class:`VerifierFault` ("not piecewise constant") past ``max_cuts`` cuts or
    ``max_evaluations`` calls.
    """
    j = len(prefix)
    rest = n_uniforms - j - 1
    rng = np.random.default_rng(seed + 7919 * j)
    probes = [np.full(rest, a) for a in _PROBES] + [rng.random(rest)]
    head = np.array(prefix, dtype=np.float64)
    count = [0]

    def signature(x):
        count[0] += len(probes)
        if count[0] > max_evaluations:
            raise VerifierFault("not piecewise constant", f"bisection of uniform {j} needed over "
                                f"{max_evaluations} calls: the output keeps changing (does the verifier "
                                "draw its own randomness, or use the uniform continuously?)")
        return tuple(op(np.concatenate([head, [x], p])) for p in probes)

    xs = [0.0] + [(i + 0.5) / grid for i in range(grid)] + [1.0 - 2.0 ** -30]
    sigs = [signature(x) for x in xs]
    cuts = []

    def split(a, sa, b, sb):
        if b - a <= resolution:
            cuts.append((a + b) / 2.0)
            if len(cuts) > max_cuts:
                raise VerifierFault("not piecewise constant", f"uniform {j} has more than max_cuts = {max_cuts} "
                                    "change points")
            return
        m = (a + b) / 2.0
        sm = signature(m)
        if sm != sa:
            split(a, sa, m, sm)
        if sm != sb:
            split(m, sm, b, sb)

    for (a, sa), (b, sb) in zip(zip(xs, sigs), zip(xs[1:], sigs[1:])):
        if sa != sb:
            split(a, sa, b, sb)
    return sorted(cuts)


class _Problem:
    """One kind's rounds on one model pair: the verifier's inputs, outputs and cuts."""

    def __init__(self, kind, target, draft, view_target, view_draft, k, deterministic, tree_rule, parents):
        self.kind, self.target, self.draft = kind, target, draft
        self.view_target, self.view_draft = view_target, view_draft  # what the verifier reads (logits?)
        self.k, self.deterministic, self.tree_rule = k, deterministic, tree_rule
        self.parents = None if parents is None else np.asarray(parents, dtype=np.int64)

    def inputs(self, context):
        """``[(probability, args, emitted_of(output), law_rows)]`` for a round after ``context``."""
        context = tuple(context)
        vocab = self.target.vocab
        out = []
        if self.kind in ("chain", "block"):
            for path, prob in _kinds.chain_draft_paths(self.draft, context, self.k, self.deterministic):
                rows = lambda m: np.stack([m.row(context + path[:i]) for i in range(self.k + 1)])  # noqa: E731
                t_rows = rows(self.view_target)  # [K+1, V]
                d_rows = None if self.deterministic else rows(self.view_draft)[: self.k]  # [K, V]
                tokens = np.array(path, dtype=np.int64)
                law_rows = (rows(self.target), None if self.deterministic else rows(self.draft)[: self.k])

                def emitted(output, tokens=tokens):
                    n, token = _kinds.chain_output(output, tokens, vocab)
                    return tuple(int(t) for t in tokens[:n]) + (token,)

                out.append((prob, (t_rows, d_rows, tokens), emitted, law_rows))
        else:
            parents = self.parents
            for tokens, prob in _kinds.tree_drafts(self.draft, context, list(parents), self.tree_rule):
                paths = [()]
                for i, p in enumerate(parents):
                    paths.append(paths[p + 1] + (tokens[i],))
                rows = lambda m: np.stack([m.row(context + pth) for pth in paths])  # noqa: E731
                t_rows, d_rows = rows(self.view_target), None if self.deterministic else rows(self.view_draft)
                tok = np.array(tokens, dtype=np.int64)
                law_rows = (rows(self.target), None if self.deterministic else rows(self.draft))

                def emitted(output, tok=tok):
                    path, token = _kinds.tree_output(output, tok, parents, vocab)
                    return tuple(int(tok[i]) for i in path) + (token,)

                out.append((prob, (t_rows, d_rows, tok, parents.copy()), emitted, law_rows))
        return out

    def analytic_cuts(self, law_rows, args):
        if self.kind == "chain":
            return _kinds.token_rule_cuts(law_rows[0], law_rows[1], args[2])
        if self.kind == "block":
            return _kinds.block_rule_cuts(law_rows[0], law_rows[1], args[2])
        return _kinds.tree_rule_cuts(self.tree_rule)(law_rows[0], law_rows[1], args[2], args[3])

    def reference(self, law_rows, args, u):
        """The standard rule of this kind (specverify's reference) on the law's rows."""
        from specverify import reference
        from specverify.reference import tree as reference_tree

        t, d = (np.asarray(x, dtype=np.float32) if x is not None else None for x in law_rows)
        if self.kind == "chain":
            n, tok = reference.accept(t, d, args[2], u)
            return tuple(int(x) for x in args[2][:n]) + (int(tok),)
        if self.kind == "block":
            n, tok = reference.accept_block(t, d, args[2], u)
            return tuple(int(x) for x in args[2][:n]) + (int(tok),)
        path, tok = reference_tree.accept_tree(t, d, args[2], args[3], u,
                                               replacement=self.tree_rule == "with_replacement")
        return tuple(int(args[2][i]) for i in path) + (int(tok),)


def _warped_model(model, warp):
    import specverify as sv

    with np.errstate(divide="ignore"):
        logits = np.log(model.table.astype(np.float32))
    flat = np.ascontiguousarray(logits.reshape(-1, model.vocab), dtype=np.float32)
    return MarkovModel(logits.astype(np.float32), validate=False), MarkovModel(np.asarray(sv.warp(flat, **warp)).reshape(model.table.shape))


def _validate(kind, layout, vocab, k, length, order, drafts, tree_rule, tree_shape, cuts, tolerance, resolution,
              grid, max_cuts, margin, warp):
    """Every argument of :func:`check_exact` but the shared ones; returns ``(parents, length, drafts)``."""
    from .adapters import KIND_NAMES, LAYOUTS

    if kind not in KIND_NAMES or kind == "greedy":
        raise ArgumentError("kind", f"kind must be one of 'chain', 'block', 'tree' for check_exact (greedy verifiers: "
                                    f"check_greedy), got {kind!r}")
    _args.choice("layout", layout, LAYOUTS)
    if layout == "hf":
        raise ArgumentError("layout", "layout 'hf' draws its own randomness (torch's generator): check it with "
                                      "check_sampled, not exact mode")
    for name, value, low in (("vocab", vocab, 2), ("k", k, 0), ("order", order, 1)):
        _args.integer(name, value, low)
    if vocab > LIMITS["vocab"]:
        raise ArgumentError("vocab", f"exact mode enumerates V^K draft paths and V^L sequences: vocab = {vocab} "
                                     f"exceeds the limit {LIMITS['vocab']} (use check_sampled for large V)")
    if k > LIMITS["k"]:
        raise ArgumentError("k", f"k = {k} exceeds exact mode's limit {LIMITS['k']} (cells grow as 2^K * V^K per "
                                 "context)")
    if order > 2:
        raise ArgumentError("order", f"order must be 1 or 2, got {order}")
    parents = None
    if kind == "tree":
        _args.choice("tree_rule", tree_rule, _kinds.TREE_RULES)
        parents = _kinds.tree_parents(tree_shape, LIMITS["tree_nodes"])
        drafts = ("deterministic",) if tree_rule == "deterministic" else ("stochastic",)
    else:
        given = drafts
        drafts = (drafts,) if isinstance(drafts, str) else tuple(drafts) if isinstance(drafts, (list, tuple)) else ()
        if not drafts or any(d not in ("stochastic", "deterministic") for d in drafts):
            raise ArgumentError("drafts", f"drafts must name 'stochastic' and/or 'deterministic', got {given!r}")
    if length is None:
        length = (k if kind != "tree" else int(_kinds.depths(parents).max())) + 2
    _args.integer("length", length, 1)
    if length > LIMITS["length"]:
        raise ArgumentError("length", f"length = {length} exceeds exact mode's limit {LIMITS['length']}")
    n_uniforms = (len(parents) if kind == "tree" else k) + 1
    if n_uniforms > LIMITS["uniforms"]:
        raise ArgumentError("k", f"{n_uniforms} uniforms per round exceed exact mode's limit {LIMITS['uniforms']}")
    if not (cuts in ("bisect", "analytic") or callable(cuts)):
        raise ArgumentError("cuts", f"cuts must be 'bisect', 'analytic' or a callable, got {cuts!r}")
    _args.number("tolerance", tolerance, 0.0, 1.0)
    _args.number("resolution", resolution, 0.0, 2.0 ** -20, closed_high=True)
    _args.integer("grid", grid, 1)
    _args.integer("max_cuts", max_cuts, 1)
    _args.number("margin", margin, 0.0, 1e-3, closed_high=True)
    _args.warp(warp)
    return parents, length, drafts


def check_exact(verifier, kind="chain", *, layout="specverify", vocab=3, k=2, length=None, order=1,
                models=None, drafts=("stochastic", "deterministic"), tree_rule="without_replacement",
                tree_shape="depth2", cuts="bisect", warp=None, tolerance=1e-9, resolution=2.0 ** -40,
                grid=16, max_cuts=64, margin=1e-6, call_budget=5.0, time_budget=600.0, seed=0, full_scan=True,
                reproducer=True):
    """Prove a verifier lossless (or find a counterexample) by enumerating its uniforms.

    The law of the first ``length`` emitted tokens, composed over rounds from every start context
    of every model pair and draft process, is compared with the target's joint law
    ``prod_j p(x_j | x_<j)``; the verdict is "lossless" if every total variation is below
    ``tolerance``, "violation" otherwise (with the worst TV per output length, where it occurs,
    and a minimal reproducer), "error" if the verifier misbehaved (the report names the case).

    Args:
        verifier: the function under test, in ``layout`` (see :mod:`specverify.testing.adapters`);
            in specverify's layout ``verifier(target_probs [K+1, V], draft_probs [K, V] or None,
            draft_tokens [K], uniforms [K+1]) -> (n_accepted, next_token)`` for chain/block, and
            ``verifier(target_probs [N+1, V], draft_probs [N+1, V] or None, draft_tokens [N],
            parents [N], uniforms [N+1]) -> (path, next_token)`` for trees.
        kind: ``"chain"``, ``"block"`` or ``"tree"``.
        layout: ``"specverify"``, ``"batch"``, ``"vllm"`` or ``"flashinfer"`` (``"hf"`` draws its own
            randomness: sampled mode only).
        vocab: V of the generated models (2 to 5).  k: drafts per round (chain/block, <= 4).
        length: tokens compared (default K + 2 for chains, depth + 2 for trees: at least two rounds).
        order: Markov order of the generated models (1 or 2).
        models: optional list of ``(target, draft)`` tables ``[V]*order + [V]`` (or
            :class:`~specverify.testing.models.MarkovModel`) replacing the generated pairs.
        drafts: draft processes for chain/block: ``"stochastic"`` (drafts sampled from the draft
            model, rows passed) and/or ``"deterministic"`` (its greedy path, ``draft_probs=None``).
        tree_rule: for trees, how the children are drafted and which rows are passed:
            ``"with_replacement"``, ``"without_replacement"`` or ``"deterministic"`` (top-k
            children, ``draft_probs=None``).
        tree_shape: a name in ``TREE_SHAPES`` or a parents list.
        cuts: ``"bisect"`` (find them; any verifier), ``"analytic"`` (the standard rule's of this
            kind: fast; where the consistency check shows they are not the verifier's, that round
            input falls back to bisection), or ``cuts(target_rows, draft_rows,
            tokens[, parents]) -> cuts(prefix)``.
        warp: logits-in verifiers: ``sv.warp`` settings; the verifier then receives logits
            (``log`` of the model rows, ``-inf`` at zeros) and the target law is the warped
            target's (drafts sampled from the warped draft).
        tolerance: largest total variation taken as exact.
        resolution, grid, max_cuts: bisection settings (see the module docstring).
        margin: how far inside its cell the consistency check moves each uniform.
        call_budget: seconds one call may take.  time_budget: seconds for the whole check.
        seed: seeds the generated models and the bisection's random probe.
        full_scan: False stops at the first violating start context (the worst TVs then cover
            only what was scanned); True scans every model pair, draft process and context.
        reproducer: False skips the search for a minimal reproducer (inputs and uniforms) of a
            violation; the report then names only the model, draft, context and length.

    Returns:
        :class:`~specverify.testing.report.Report`.

    Raises:
        ValueError, TypeError: invalid harness arguments (the limits are in ``LIMITS``).
    """
    from .adapters import adapt

    _args.common(verifier, seed, call_budget, time_budget)
    parents, length, drafts = _validate(kind, layout, vocab, k, length, order, drafts, tree_rule, tree_shape, cuts,
                                        tolerance, resolution, grid, max_cuts, margin, warp)
    full_scan, reproducer = _args.flag("full_scan", full_scan), _args.flag("reproducer", reproducer)
    if models is None:
        support = 1
        if kind == "tree" and tree_rule == "without_replacement":  # k distinct siblings need k tokens
            support = max(list(parents).count(p) for p in set(parents))
        pairs = model_pairs(vocab, order, seeds=(seed, seed + 1), min_draft_support=support)
    else:
        pairs = [tuple(m if isinstance(m, MarkovModel) else MarkovModel(m) for m in pair) for pair in models]
        if not pairs or any(len(p) != 2 or p[0].table.shape != p[1].table.shape for p in pairs):
            raise ValueError("models must be a non-empty list of (target, draft) tables of one shape each")
        if pairs[0][0].vocab > LIMITS["vocab"]:
            raise ValueError(f"models have V = {pairs[0][0].vocab}, over exact mode's limit {LIMITS['vocab']}")
    fn, arg_names = adapt(verifier, kind, layout, "exact")
    caller = Caller(fn, call_budget, arg_names)
    settings = dict(kind=kind, layout=layout, vocab=pairs[0][0].vocab, k=k if kind != "tree" else None,
                    length=length, order=pairs[0][0].order, drafts=list(drafts), cuts=cuts if isinstance(cuts, str)
                    else "declared", tolerance=tolerance, resolution=resolution if cuts == "bisect" else None,
                    tree_rule=tree_rule if kind == "tree" else None, tree_shape=parents, warp=warp)
    start = time.perf_counter()
    work = functools.partial(_run, caller, kind, pairs, drafts, k, length, tree_rule, parents, cuts, warp,
                             tolerance, resolution, grid, max_cuts, margin, seed, full_scan, reproducer)
    result, fault = run_guarded(work, caller, time_budget)
    seconds = time.perf_counter() - start
    if fault is not None:
        hint = None
        # Drafted rows run first: a fault with draft_probs=None came after those rounds went through.
        if drafts[0] == "stochastic" and (fault.case or {}).get("draft_probs", 0) is None:
            hint = ("the verifier failed only with draft_probs=None (deterministic drafts), after running on drafted "
                    "rows: one written for drafted rows only is checked with drafts='stochastic' (command line: "
                    "--drafts stochastic)")
        return Report.from_fault("exact", settings, fault, seconds, caller.calls, hint)
    if isinstance(result, _SupportViolation):
        return Report(mode="exact", verdict="violation", settings=settings, seconds=seconds, calls=caller.calls,
                      summary=f"emitted tokens {result.emitted} of target probability 0 after context "
                              f"{result.context}",
                      reproducer={"context": list(result.context), "emitted": list(result.emitted),
                                  **result.uniforms})
    worst, laws, reproducer = result
    bad = [w for w in worst if w["tv"] > tolerance]
    verdict = "violation" if bad else "lossless"
    top = max(worst, key=lambda w: w["tv"])
    summary = (f"worst TV {top['tv']:.3g} at length {top['length']} (model pair {top['model']}, draft "
               f"{top['draft']}, context {top['context']}); tolerance {tolerance:g}" if top["context"] is not None
               else f"every total variation is exactly 0 (lengths 1 to {length}); tolerance {tolerance:g}")
    return Report(mode="exact", verdict=verdict, settings=settings, seconds=seconds, calls=caller.calls,
                  summary=summary, worst_tv=worst, laws=laws, reproducer=reproducer if bad else None)


def _run(caller, kind, pairs, drafts, k, length, tree_rule, parents, cuts, warp, tolerance, resolution, grid,
         max_cuts, margin, seed, full_scan=True, want_reproducer=True):
    worst = [dict(length=ell, tv=0.0, model=None, draft=None, context=None) for ell in range(1, length + 1)]
    laws = {}
    first_bad = None
    determinism_checks = [32]
    for m, (target, draft) in enumerate(pairs):
        view_target, view_draft = target, draft
        if warp is not None:
            view_target, target = _warped_model(target, warp)
            view_draft, draft = _warped_model(draft, warp)
        for d in drafts:
            problem = _Problem(kind, target, draft, view_target, view_draft, k, d == "deterministic", tree_rule, parents)
            round_law = functools.lru_cache(maxsize=None)(
                functools.partial(_round_law, caller, problem, cuts, resolution, grid, max_cuts, margin, seed,
                                  determinism_checks))
            state = {}
            advance = lambda ctx, emitted: tuple((ctx + emitted)[-target.order:])  # noqa: E731
            for context in target.contexts():
                try:
                    got = compose_rounds(round_law, context, length, state, advance)
                except _SupportViolation as sv_:
                    return sv_
                want = target_law(target, context, length)
                found_here = False
                for ell in range(1, length + 1):
                    tv = total_variation(marginal(got, ell), marginal(want, ell))
                    if tv > worst[ell - 1]["tv"]:
                        worst[ell - 1] = dict(length=ell, tv=tv, model=m, draft=d, context=list(context))
                    if tv > tolerance and first_bad is None:
                        first_bad = (problem, context, ell, marginal(got, ell), marginal(want, ell), m, d)
                        found_here = True
                if not laws or found_here:  # the figure: the first context, replaced by the first violating one
                    laws["law"] = dict(context=list(context), model=m, draft=d, length=length, violating=found_here,
                                       verifier={"".join(map(str, s)): p for s, p in got.items()},
                                       target={"".join(map(str, s)): p for s, p in want.items()})
                if first_bad is not None and not full_scan:
                    break
            if first_bad is not None and not full_scan:
                break
        if first_bad is not None and not full_scan:
            break
    reproducer = None
    if first_bad and want_reproducer:
        reproducer = _reproducer(caller, first_bad, cuts, resolution, grid, max_cuts, margin, seed)
    elif first_bad:
        problem, context, ell, _, _, m, d = first_bad
        reproducer = dict(model=m, draft=d, context=list(context), length=ell)
    return worst, laws, reproducer


def _round_law(caller, problem, cuts, resolution, grid, max_cuts, margin, seed, determinism_checks, context):
    out = defaultdict(float)
    target = problem.target
    inputs = problem.inputs(context)
    mass = sum(prob for prob, *_ in inputs)
    if abs(mass - 1.0) > 1e-9:
        raise ValueError(f"the draft process after context {tuple(context)} covers probability {mass:.6g}, not 1: a "
                         "without-replacement tree needs as many supported draft tokens as it has siblings "
                         "(give models whose draft rows have that support)")
    for prob, args, emitted_of, law_rows in inputs:
        law = _input_law(caller, problem, context, args, emitted_of, law_rows, cuts, resolution, grid, max_cuts,
                         margin, seed, determinism_checks)
        for emitted, w in law.items():
            out[emitted] += prob * w
    del target
    return dict(out)


def _input_law(caller, problem, context, args, emitted_of, law_rows, cuts, resolution, grid, max_cuts, margin,
               seed, determinism_checks):
    """Exact law of one round's emitted tuple for fixed inputs ``args``."""
    target = problem.target
    n_uniforms = len(args[2]) + 1

    def op(u):
        output = caller(*args, u)
        try:
            emitted = emitted_of(output)
        except VerifierFault as fault:
            raise VerifierFault(fault.what, fault.message, {**caller.case(args + (u,)), "returned": describe(output)})
        if determinism_checks[0] > 0:
            determinism_checks[0] -= 1
            again = emitted_of(caller(*args, u))
            if again != emitted:
                raise VerifierFault("not a function of its uniforms", f"the same inputs returned {emitted} and then "
                                    f"{again}: the verifier draws its own randomness (sampled mode checks such "
                                    "verifiers)", caller.case(args + (u,)))
        prob = 1.0
        for j, x in enumerate(emitted):
            prob *= target.probs(tuple(context) + emitted[:j])[x]
        if prob == 0.0:
            raise _SupportViolation(emitted, tuple(context), {**caller.case(args + (u,))})
        return emitted

    if cuts == "bisect":
        cut_fn = lambda prefix: bisect_cuts(op, prefix, n_uniforms, grid=grid, resolution=resolution,  # noqa: E731
                                            max_cuts=max_cuts, seed=seed)
    elif cuts == "analytic":
        cut_fn = problem.analytic_cuts(law_rows, args)
    else:
        cut_fn = cuts(*(law_rows + tuple(args[2:])))

    def leaf(u, lows, highs, outcome):
        for j in range(n_uniforms):
            for x in (lows[j] if lows[j] == 0.0 else lows[j] + margin, highs[j] - margin):
                if highs[j] - lows[j] <= 4 * margin and x != 0.0:
                    continue
                v = u.copy()
                v[j] = x
                got = op(v)
                if got != outcome and not (x == 0.0 and lows[j] == 0.0 and highs[j] - lows[j] <= 4 * margin):
                    source = "bisection" if cuts == "bisect" else "the declared cuts"
                    raise VerifierFault("not piecewise constant", f"uniform {j}'s output changes inside the cell "
                                        f"[{lows[j]:.12g}, {highs[j]:.12g}) found by {source}: {outcome} at "
                                        f"{u[j]:.12g}, {got} at {x:.12g}", caller.case(args + (v,)))

    try:
        return law_over_uniforms(op, n_uniforms, cut_fn, leaf)
    except VerifierFault as fault:
        if cuts != "analytic" or fault.what != "not piecewise constant":
            raise
    # The standard rule's cuts are not this verifier's (a different, possibly broken, rule): find its own.
    return _input_law(caller, problem, context, args, emitted_of, law_rows, "bisect", resolution, grid, max_cuts,
                      margin, seed, determinism_checks)


def _reproducer(caller, first_bad, cuts, resolution, grid, max_cuts, margin, seed):
    """The round input whose one-round law departs most from the standard rule's, and uniforms
    at which the verifier and the standard rule disagree."""
    problem, context, ell, got, want, m, d = first_bad
    over = max(set(got) | set(want), key=lambda s: got.get(s, 0.0) - want.get(s, 0.0))
    out = dict(model=m, draft=d, context=list(context), length=ell, most_over_represented=list(over),
               verifier_probability=got.get(over, 0.0), target_probability=want.get(over, 0.0))
    rng = np.random.default_rng(seed)
    best = None
    for prob, args, emitted_of, law_rows in problem.inputs(context):
        try:
            mine = _input_law(caller, problem, context, args, emitted_of, law_rows, cuts, resolution, grid,
                              max_cuts, margin, seed, [0])
            ref = law_over_uniforms(lambda u: problem.reference(law_rows, args, u), len(args[2]) + 1,
                                    problem.analytic_cuts(law_rows, args))
        except Exception:  # the reproducer is a diagnosis; the verdict stands without it
            continue
        tv = total_variation(mine, ref)
        if best is None or prob * tv > best[0]:
            best = (prob * tv, tv, args, emitted_of, law_rows)
    if best is None or best[1] <= 1e-12:
        return out
    _, tv, args, emitted_of, law_rows = best
    out.update(round_tv_vs_standard_rule=tv, inputs=caller.case(args))
    for _ in range(4000):
        u = rng.random(len(args[2]) + 1)
        mine = emitted_of(caller(*args, u))
        ref = problem.reference(law_rows, args, u)
        if mine != ref:
            out.update(uniforms=u.tolist(), verifier_emits=list(mine), standard_rule_emits=list(ref))
            break
    return out
