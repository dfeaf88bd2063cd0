"""Sampled mode: verifiers with their own randomness, tested on counts with a computed power.

Rows are fixed per position (per depth for trees), so a lossless verifier's emitted token at
position j, among the rounds that reach j (``n_accepted >= j``), is distributed as the target row
j: reaching j is decided by the tokens before j (a stopping time).  For every position:

- counts of the emitted token, binned: tokens ordered by target probability, consecutive tokens
  merged until a bin expects at least ``max(min_expected, rounds_j / max_bins)`` (at V = 3 every
  token is its own bin); a token of target probability 0 that is emitted fails the check outright;
- Pearson chi-square on the binned counts (never on frequencies), and the accepted-length
  histogram against ``specverify.law`` (chain: ``accepted_length_pmf``; block:
  ``block_survival``; trees: ``tree_length_pmf``), all at ``alpha / m`` (Bonferroni over the ``m``
  sub-tests, so ``alpha`` is the level of the whole check);
- the **power**: a chi-square test with ``d`` degrees of freedom on ``n`` counts has noncentrality
  ``lambda = n * chi2(p' || p)`` against a deviation ``p'``; for a deviation of total variation
  ``delta`` between the binned laws ``chi2(p' || p) >= 4 delta^2`` (moving mass ``delta`` between
  two halves of the probability is the cheapest way to make it), so every deviation with
  ``delta >= sqrt(lambda* / (4 n))`` is detected with probability ``power``, where ``lambda*``
  solves ``P(chi2_{d, lambda*} > crit_{alpha/m}) = power``: :func:`detectable_tv`.
"""

import contextlib
import functools
import math
import time

import numpy as np

from . import _args, _kinds
from ._calls import Caller, VerifierFault, run_guarded
from .models import inverse_cdf
from .report import Report

__all__ = ["check_sampled", "detectable_tv", "sampled_case", "binned_chisquare"]

MAX_K = 64  # drafts per round of the generated case


@functools.lru_cache(maxsize=1024)
def _noncentrality(dof, alpha, power):
    from scipy import optimize, stats

    crit = stats.chi2.isf(alpha, dof)
    f = lambda lam: stats.ncx2.sf(crit, dof, lam) - power  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(f, 1e-9, hi, xtol=1e-9))


def detectable_tv(dof, rounds, alpha, power=0.99):
    """Smallest TV between binned laws that a chi-square test with ``dof`` degrees of freedom on
    ``rounds`` counts at level ``alpha`` detects with probability ``power``: ``sqrt(lambda* / (4 n))``."""
    if rounds <= 0 or dof <= 0:
        return float("inf")
    return float(np.sqrt(_noncentrality(int(dof), float(alpha), float(power)) / (4.0 * rounds)))


def binned_chisquare(counts, probs, min_expected=5.0, max_bins=32):
    """Pearson chi-square of token counts ``[V]`` against ``probs`` ``[V]`` with bins pooled.

    Returns ``dict(statistic, dof, pvalue, bins, observed [B], expected [B] (probabilities),
    impossible)`` where ``impossible`` counts emitted tokens of probability 0 (p-value 0 then).
    """
    from scipy import stats

    counts = np.asarray(counts, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    n = int(counts.sum())
    impossible = int(counts[probs == 0].sum())
    support = np.flatnonzero(probs > 0)
    order = support[np.argsort(-probs[support], kind="stable")]
    floor = max(min_expected, n / max_bins)
    obs, exp, acc_o, acc_e = [], [], 0, 0.0
    for t in order:
        acc_o += counts[t]
        acc_e += probs[t]
        if acc_e * n >= floor:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o, acc_e = 0, 0.0
    if acc_e > 0:
        if exp:
            obs[-1] += acc_o
            exp[-1] += acc_e
        else:
            obs.append(acc_o)
            exp.append(acc_e)
    obs, exp = np.array(obs, dtype=np.float64), np.array(exp)
    if impossible:
        return dict(statistic=float("inf"), dof=max(len(obs) - 1, 1), pvalue=0.0, bins=len(obs),
                    observed=obs.tolist(), expected=exp.tolist(), impossible=impossible)
    if len(obs) < 2 or n == 0:
        return dict(statistic=0.0, dof=0, pvalue=1.0, bins=len(obs), observed=obs.tolist(), expected=exp.tolist(),
                    impossible=0)
    e = exp * n
    statistic = float(((obs - e) ** 2 / e).sum())
    dof = len(obs) - 1
    return dict(statistic=statistic, dof=dof, pvalue=float(stats.chi2.sf(statistic, dof)), bins=len(obs),
                observed=obs.tolist(), expected=exp.tolist(), impossible=0)


def _softmax(x):
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def sampled_case(vocab=3, rows=3, seed=0):
    """Fixed ``(target [rows, V], draft [rows - 1, V])`` float32 rows for sampled mode.

    Small V: rows with zeros in either (the target has zeros where the draft has mass, and the
    reverse), masses ``2^-8 .. 2^8`` (not normalized), the last target row unlike the others (so a
    bonus from the wrong row shows).  Large V: softmax rows of a peaked target, the draft its
    logits plus noise (acceptance about 0.6-0.8), scaled by powers of 2.
    """
    rng = np.random.default_rng(seed)
    if vocab <= 16:
        target = rng.integers(1, 9, (rows, vocab)).astype(np.float64)
        draft = rng.integers(1, 9, (rows - 1, vocab)).astype(np.float64)
        for i in range(rows):
            target[i, (i + 1) % vocab] = 0.0
        for i in range(rows - 1):
            draft[i, (i + 2) % vocab] = 0.0
            draft[i, i % vocab] *= 3.0  # the draft over-proposes a token the target likes less
        target[-1] = target[-1][::-1] + np.arange(vocab)
    else:
        logits = 2.0 * rng.standard_normal((rows, vocab))
        target = _softmax(logits)
        draft = _softmax(logits[:-1] + 0.8 * rng.standard_normal((rows - 1, vocab)))
    target *= 2.0 ** rng.integers(-8, 9, (rows, 1))
    draft *= 2.0 ** rng.integers(-8, 9, (rows - 1, 1))
    return target.astype(np.float32), draft.astype(np.float32)


def _length_law(kind, target, draft, tokens, parents, tree_rule):
    """``[max + 1]`` pmf of the accepted length under the law, or None."""
    from specverify import law

    if kind == "chain":
        if draft is None:
            p = target.astype(np.float64) / target.astype(np.float64).sum(axis=1, keepdims=True)
            rates = p[np.arange(len(tokens)), tokens]
        else:
            rates = law.acceptance_rates(target, draft)
        return law.accepted_length_pmf(rates)
    if kind == "block":
        if draft is None:
            return _length_law("chain", target, None, tokens, parents, tree_rule)
        return law.survival_pmf(law.block_survival(target, draft).survival)
    if tree_rule == "deterministic":
        node = law.tree_node_probabilities(target, None, tokens, parents, "deterministic")
        return law.depth_pmf(node, parents)
    return law.tree_length_pmf(target, draft, parents, tree_rule)


def _sample_tree(rng, q_by_depth, depth_of, parents, rule):
    """Children tokens of every node, drawn per position from its depth's draft row."""
    n = len(parents)
    tokens = np.empty(n, dtype=np.int64)
    children = [[] for _ in range(n + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    for r, kids in enumerate(children):
        if not kids:
            continue
        q = q_by_depth[depth_of[r]].astype(np.float64)
        if rule == "deterministic":
            tokens[kids] = np.argsort(-q, kind="stable")[: len(kids)]
            continue
        left = q.copy()
        for slot, i in enumerate(kids):
            tokens[i] = inverse_cdf(left, rng.random())
            if rule == "without_replacement":
                left[tokens[i]] = 0.0
                if left.sum() <= 0 and slot + 1 < len(kids):
                    raise ValueError("a without-replacement draft row needs at least as many supported tokens as "
                                     "siblings")
    return tokens


def _given_rows(kind, target, draft, draft_kind, rows):
    """Caller-given ``(target, draft)`` rows as float32, checked: a bad row is the caller's error,
    not the verifier's (which would otherwise be the first to read it)."""
    target = np.asarray(target, dtype=np.float32)
    draft_rows = None if draft is None else np.asarray(draft, dtype=np.float32)
    if target.ndim != 2 or target.shape[0] < 1 or target.shape[1] < 2:
        raise _args.ArgumentError("target", f"target must be [rows, V] with V >= 2, got shape {list(target.shape)}")
    want = (target.shape[0] if kind == "tree" else target.shape[0] - 1, target.shape[1])
    if draft_rows is None and draft_kind == "stochastic":
        raise _args.ArgumentError("draft", "draft rows are needed for draft_kind='stochastic'")
    if draft_rows is not None and draft_rows.shape != want:
        raise _args.ArgumentError("draft", f"draft must be {list(want)} for a target of shape {list(target.shape)}, "
                                           f"got {list(draft_rows.shape)}")
    if kind == "tree" and target.shape[0] != rows:
        raise _args.ArgumentError("target", f"a tree of depth {rows - 1} needs one target row per depth ({rows}), "
                                            f"got {target.shape[0]}")
    # Every target row is read; the draft rows drafts are drawn from (a tree's last, its leaves', is not).
    read_draft = None if draft_rows is None else draft_rows[:-1] if kind == "tree" else draft_rows
    for name, r in (("target", target), ("draft", read_draft)):
        if r is None:
            continue
        if not np.all(np.isfinite(r)) or np.any(r < 0):
            raise _args.ArgumentError(name, f"{name} rows must be finite and non-negative")
        empty = np.flatnonzero(r.sum(axis=1) <= 0)
        if empty.size:
            raise _args.ArgumentError(name, f"{name}[{empty[0]}] has zero mass")
    return target, draft_rows


def check_sampled(verifier, kind="chain", *, layout="specverify", vocab=3, k=2, rounds=20_000, seed=0,
                  alpha=1e-6, power=0.99, target=None, draft=None, draft_kind="stochastic",
                  tree_rule="without_replacement", tree_shape="depth2", warp=None, generator="torch",
                  min_expected=5.0, max_bins=32, call_budget=5.0, time_budget=600.0):
    """Test a verifier that draws its own randomness: many rounds, chi-square on counts, power.

    Args:
        verifier: in ``layout``; in specverify's layout ``verifier(target_probs [K+1, V],
            draft_probs [K, V] or None, draft_tokens [K], generator) -> (n_accepted, next_token)``
            (trees: ``(target_probs [N+1, V], draft_probs [N+1, V] or None, draft_tokens [N],
            parents [N], generator) -> (path, next_token)``).  Verifiers using torch's global
            generator are run inside ``torch.random.fork_rng`` seeded from ``seed``, so the check
            is deterministic and the caller's global state is left as it was.
        kind: ``"chain"``, ``"block"`` or ``"tree"``.  layout: as :func:`check_exact`, plus ``"hf"``.
        vocab, k: V and K of the generated case (ignored when ``target`` is given).
        rounds: verification rounds.  seed: seeds the case, the drafts and the generators.
        alpha: significance level of the whole check (Bonferroni over its sub-tests).
        power: the power at which the detectable TV is stated.
        target, draft: optional fixed rows (chain/block: ``[K+1, V]``, ``[K, V]``; trees: one row
            per depth ``[D+1, V]`` each).
        draft_kind: ``"stochastic"`` (drafts sampled from the draft rows, rows passed) or
            ``"deterministic"`` (the draft rows' argmax, ``draft_probs=None``).
        tree_rule, tree_shape: as :func:`check_exact`.
        warp: logits-in verifiers (``sv.warp`` settings): the verifier receives ``log`` of the rows,
            the law is the warped rows'.
        generator: ``"torch"`` or ``"numpy"``: the generator handed to the verifier.
        min_expected, max_bins: binning (module docstring).
        call_budget, time_budget: seconds per call and for the whole check.

    Returns:
        :class:`~specverify.testing.report.Report`.
    """
    from .adapters import LAYOUTS, adapt

    _args.common(verifier, seed, call_budget, time_budget)
    if kind not in ("chain", "block", "tree"):
        raise _args.ArgumentError("kind", f"kind must be 'chain', 'block' or 'tree' for check_sampled, got {kind!r}")
    _args.choice("layout", layout, LAYOUTS)
    rounds = _args.integer("rounds", rounds, 100, _args.MAX_ROUNDS)
    _args.number("alpha", alpha, 0.0, 1.0)
    _args.number("power", power, 0.0, 1.0)
    _args.choice("draft_kind", draft_kind, ("stochastic", "deterministic"))
    _args.choice("generator", generator, ("torch", "numpy"))
    _args.number("min_expected", min_expected, 0.0, math.inf)
    _args.integer("max_bins", max_bins, 2)
    _args.warp(warp)
    parents = None
    if kind == "tree":
        _args.choice("tree_rule", tree_rule, _kinds.TREE_RULES)
        parents = np.asarray(_kinds.tree_parents(tree_shape), dtype=np.int64)
        draft_kind = "deterministic" if tree_rule == "deterministic" else "stochastic"
        depth_of = _kinds.depths(parents)
        rows = int(depth_of.max()) + 1
    else:
        rows = _args.integer("k", k, 0, MAX_K) + 1
    if target is None:
        _args.integer("vocab", vocab, 2, _args.MAX_SAMPLED_VOCAB)  # V = 1: a row with its one token zeroed
        target, draft_rows = sampled_case(vocab, rows, seed)
        if kind == "tree":
            draft_rows = np.concatenate([draft_rows, target[-1:]])  # leaves' rows: never read
    else:
        target, draft_rows = _given_rows(kind, target, draft, draft_kind, rows)
    vocab = target.shape[1]
    k = target.shape[0] - 1
    view_target, view_draft = target, draft_rows
    law_target, law_draft = target, draft_rows
    if warp is not None:
        import specverify as sv

        with np.errstate(divide="ignore"):
            view_target = np.log(target).astype(np.float32)
            view_draft = None if draft_rows is None else np.log(draft_rows).astype(np.float32)
        law_target = np.asarray(sv.warp(view_target, **warp))
        law_draft = None if view_draft is None else np.asarray(sv.warp(view_draft, **warp))
    fn, arg_names = adapt(verifier, kind, layout, "sampled")
    caller = Caller(fn, call_budget, arg_names)
    settings = dict(kind=kind, layout=layout, vocab=vocab, k=k if kind != "tree" else None, rounds=int(rounds),
                    seed=seed, draft_kind=draft_kind, tree_rule=tree_rule if kind == "tree" else None,
                    tree_shape=None if parents is None else parents.tolist(), warp=warp, alpha=alpha)
    start = time.perf_counter()
    work = functools.partial(_simulate, caller, kind, int(rounds), seed, view_target, view_draft, law_target,
                             law_draft, draft_kind, parents, tree_rule, generator)
    result, fault = run_guarded(work, caller, time_budget)
    seconds = time.perf_counter() - start
    if fault is not None:
        hint = None
        if fault.what == "raised" and caller.calls == 1 and not getattr(verifier, "draws_uniforms", False):
            hint = ("if the verifier takes uniforms rather than a generator, wrap it with adapters.with_generator "
                    "(command line: --draws-uniforms)")
        return Report.from_fault("sampled", settings, fault, seconds, caller.calls, hint)
    accepted, emitted, fixed_tokens = result
    return _analyse(settings, kind, accepted, emitted, law_target, law_draft, fixed_tokens, parents, tree_rule,
                    alpha, power, min_expected, max_bins, seconds, caller.calls)


def _simulate(caller, kind, rounds, seed, view_target, view_draft, law_target, law_draft, draft_kind, parents,
              tree_rule, generator_kind):
    rng = np.random.default_rng([seed, 1])
    vocab = view_target.shape[1]
    if generator_kind == "torch":
        import torch

        generator = torch.Generator().manual_seed(seed + 1)
        fork = torch.random.fork_rng(devices=[])
    else:
        generator = np.random.default_rng([seed, 2])
        fork = contextlib.nullcontext()
    depth_rows = law_target.shape[0]
    accepted = np.empty(rounds, dtype=np.int64)
    emitted = np.full((rounds, depth_rows), -1, dtype=np.int64)
    fixed_tokens = None
    with fork:
        if generator_kind == "torch":
            torch.manual_seed(seed + 2)  # for verifiers on torch's global generator (restored on exit)
        if kind == "tree":
            depth_of = _kinds.depths(parents)
            t_view, d_view = view_target[depth_of], None if draft_kind == "deterministic" else view_draft[depth_of]
            q_by_depth = law_draft
            if tree_rule == "deterministic":
                fixed_tokens = _sample_tree(rng, q_by_depth, depth_of, parents, "deterministic")
            for r in range(rounds):
                tokens = fixed_tokens if fixed_tokens is not None else _sample_tree(rng, q_by_depth, depth_of, parents,
                                                                                    tree_rule)
                out = caller(t_view, d_view, tokens, parents, generator)
                try:
                    path, token = _kinds.tree_output(out, tokens, parents, vocab)
                except VerifierFault as fault:
                    raise VerifierFault(fault.what, fault.message, caller.case((t_view, d_view, tokens, parents)))
                accepted[r] = len(path)
                emitted[r, : len(path)] = tokens[list(path)]
                emitted[r, len(path)] = token
            return accepted, emitted, fixed_tokens
        k = law_target.shape[0] - 1
        if draft_kind == "deterministic":
            fixed_tokens = np.argmax(law_draft, axis=1).astype(np.int64) if law_draft is not None else \
                np.zeros(k, dtype=np.int64)
            all_tokens = np.broadcast_to(fixed_tokens, (rounds, k))
            d_view = None
        else:
            cdf = np.cumsum(law_draft.astype(np.float64), axis=1)
            all_tokens = np.stack([np.minimum(np.searchsorted(cdf[j], rng.random(rounds) * cdf[j, -1], side="right"),
                                              vocab - 1) for j in range(k)], axis=1) if k else \
                np.zeros((rounds, 0), dtype=np.int64)
            d_view = view_draft
        for r in range(rounds):
            tokens = np.ascontiguousarray(all_tokens[r])
            out = caller(view_target, d_view, tokens, generator)
            try:
                n, token = _kinds.chain_output(out, tokens, vocab)
            except VerifierFault as fault:
                raise VerifierFault(fault.what, fault.message, caller.case((view_target, d_view, tokens)))
            accepted[r] = n
            emitted[r, :n] = tokens[:n]
            emitted[r, n] = token
    return accepted, emitted, fixed_tokens


def _analyse(settings, kind, accepted, emitted, law_target, law_draft, fixed_tokens, parents, tree_rule, alpha, power,
             min_expected, max_bins, seconds, calls):
    from specverify import stats

    vocab = law_target.shape[1]
    tests = []
    for j in range(law_target.shape[0]):
        reached = accepted >= j
        n = int(reached.sum())
        if n < 20:
            continue
        counts = np.bincount(emitted[reached, j], minlength=vocab)
        tests.append((j, n, binned_chisquare(counts, law_target[j], min_expected, max_bins)))
    if kind == "tree":
        depth_of = _kinds.depths(parents)
        rows_t = law_target[depth_of]
        rows_d = None if law_draft is None else law_draft[depth_of]
        pmf = _length_law(kind, rows_t, rows_d, fixed_tokens, parents, tree_rule)
    else:
        pmf = _length_law(kind, law_target, law_draft, fixed_tokens, parents, tree_rule)
    m = len(tests) + 1
    each = alpha / m
    length_counts = np.bincount(accepted, minlength=pmf.size)[: pmf.size]
    gof = stats.chisquare_counts(length_counts, pmf)
    ns = np.arange(pmf.size)
    length_test = dict(statistic=gof.statistic, dof=gof.dof, pvalue=gof.pvalue, observed=length_counts.tolist(),
                       law=pmf.tolist(), mean=float(accepted.mean()), law_mean=float(ns @ pmf),
                       detectable_tv=detectable_tv(gof.dof, accepted.size, each, power))
    positions = [dict(position=j, rounds=n, statistic=t["statistic"], dof=t["dof"], pvalue=t["pvalue"], bins=t["bins"],
                      impossible=t["impossible"], detectable_tv=detectable_tv(t["dof"], n, each, power))
                 for j, n, t in tests]
    laws = [dict(position=j, rounds=n, observed=t["observed"], expected=t["expected"], binned=vocab > t["bins"])
            for j, n, t in tests]
    failed = [p for p in positions if p["pvalue"] <= each] + ([length_test] if gof.pvalue <= each else [])
    impossible = [p for p in positions if p["impossible"]]
    if impossible:
        summary = f"emitted {impossible[0]['impossible']} tokens of target probability 0 at position " \
                  f"{impossible[0]['position']}"
    elif failed:
        worst = min(failed, key=lambda p: p["pvalue"])
        where = f"position {worst['position']}" if "position" in worst else "the accepted-length histogram"
        summary = f"rejected at {where}: chi2 = {worst['statistic']:.1f} (dof {worst['dof']}), p = {worst['pvalue']:.3g} " \
                  f"<= alpha / {m} = {each:.3g}"
    else:
        summary = f"no deviation found in {accepted.size} rounds (every p > alpha / {m} = {each:.3g})"
    return Report(mode="sampled", verdict="violation" if failed else "lossless", settings=settings, summary=summary,
                  positions=positions, length_test=length_test, alpha=alpha, power=power,
                  detectable_tv=positions[0]["detectable_tv"] if positions else None, laws=laws, seconds=seconds,
                  calls=calls)
