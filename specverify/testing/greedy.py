"""Greedy mode: a temperature-0 verifier's output must *equal* plain greedy decoding.

A greedy verifier has no randomness, so there is no law to compare: for every case the emitted
tokens must be exactly those of plain greedy decoding of the target's score rows,

- chain (``verify_greedy``'s contract): accept ``t_i`` while ``t_i == argmax(scores[i])``; at the
  first miss emit ``argmax(scores[i])``; if all K match emit ``argmax(scores[K])``;
- tree (``verify_tree_greedy``'s): from the root, follow the first child (in index order) whose
  token is the row's argmax; stop at a position with no such child and emit its argmax.

Ties (``ties=``): ``"lowest"`` (``numpy.argmax`` and ``torch.argmax``'s convention, specverify's)
requires the lowest tied index; ``"any"`` accepts any of the tied maxima wherever one is emitted
(greedy decoding under some tie order; a draft that is its row's unique maximum must still be
accepted).  In both, ``-0.0 == 0.0`` (IEEE comparison) and
``-inf`` entries (masked logits) are ordinary scores; a row is never ``-inf`` everywhere or NaN
(verifiers may refuse those).

Cases:

- exhaustive: every choice of K + 1 rows from a small library of score rows (ties at the top,
  ``-0.0`` against ``0.0`` as the maximum, ``-inf`` masks, all-equal rows, negative logits) and
  every draft sequence in ``[0, V)^K``;
- random: ``random_cases`` cases at a large V (float32 logits with injected ties, ``-0.0`` and
  ``-inf``; drafts equal to the row's argmax with probability 0.7, so long accepted runs occur).
"""

import functools
import itertools
import time

import numpy as np

from . import _args, _kinds
from ._calls import Caller, VerifierFault, describe, run_guarded
from .report import Report

__all__ = ["check_greedy", "greedy_reference", "score_library"]

_NEG = -np.inf


def score_library(vocab):
    """``[R, V]`` float32 score rows with every edge a greedy verifier must get right.

    Rows: a strict maximum at each token; two- and all-way ties at the top (at the lowest and at
    the highest indices); ``-0.0`` tied with ``0.0`` as the maximum, in both orders; ``-inf``
    masks (all but one token masked, the maximum tied beside a mask); negative logits.
    """
    rows = []
    for t in range(vocab):  # strict maximum at t (positive and negative scales)
        r = np.full(vocab, 0.25)
        r[t] = 0.5
        rows.append(r)
        rows.append(np.where(np.arange(vocab) == t, -1.0, -3.0))
    rows.append(np.zeros(vocab))  # all tied
    a = np.full(vocab, 0.1)
    a[[0, 1]] = 0.45  # tie at the lowest indices
    rows.append(a)
    b = np.full(vocab, 0.1)
    b[[vocab - 2, vocab - 1]] = 0.45  # tie at the highest indices
    rows.append(b)
    z = np.full(vocab, -1.0)
    z[0], z[vocab - 1] = -0.0, 0.0  # -0.0 first, tied with +0.0
    rows.append(z)
    z2 = np.full(vocab, -1.0)
    z2[0], z2[vocab - 1] = 0.0, -0.0  # +0.0 first
    rows.append(z2)
    m = np.full(vocab, _NEG)
    m[vocab - 1] = -5.0  # all masked but the last
    rows.append(m)
    m2 = np.full(vocab, 2.0)
    m2[0] = _NEG  # a masked token beside a tie
    rows.append(m2)
    return np.array(rows, dtype=np.float32)


def _argmax_set(row):
    row = np.asarray(row, dtype=np.float64)
    return np.flatnonzero(row == row.max())


def greedy_reference(scores, draft_tokens, parents=None):
    """Plain greedy decoding along the drafts: ``(n_accepted, next_token)`` for a chain,
    ``(path, next_token)`` for a tree (``parents`` given), ties to the lowest index."""
    scores = np.asarray(scores, dtype=np.float64)
    if parents is None:
        for i, t in enumerate(draft_tokens):
            best = int(_argmax_set(scores[i])[0])
            if best != int(t):
                return i, best
        return len(draft_tokens), int(_argmax_set(scores[len(draft_tokens)])[0])
    children = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[int(p) + 1].append(i)
    path, r = [], 0
    while True:
        best = int(_argmax_set(scores[r])[0])
        chosen = next((i for i in children[r] if int(draft_tokens[i]) == best), None)
        if chosen is None:
            return tuple(path), best
        path.append(chosen)
        r = chosen + 1


def _acceptable(scores, draft_tokens, parents, got, ties):
    """Is the emitted tuple ``got`` (validated ``(n or path, token)``) plain greedy decoding?"""
    want = greedy_reference(scores, draft_tokens, parents)
    if ties == "lowest":
        return got == want
    # ties="any": every emitted token a maximum of its row (plain greedy decoding under some tie
    # order), and no stop at a draft that is its row's unique maximum.
    scores = np.asarray(scores, dtype=np.float64)
    if parents is None:
        n, token = got
        positions = list(range(n + 1))
        emitted = [int(t) for t in draft_tokens[:n]] + [token]
        stop_children = [n] if n < len(draft_tokens) else []
    else:
        path, token = got
        positions = [0] + [i + 1 for i in path]
        emitted = [int(draft_tokens[i]) for i in path] + [token]
        children = [[] for _ in range(len(parents) + 1)]
        for i, p in enumerate(parents):
            children[int(p) + 1].append(i)
        stop_children = children[positions[-1]]
    if any(x not in _argmax_set(scores[r]) for r, x in zip(positions, emitted)):
        return False
    best = _argmax_set(scores[positions[-1]])
    return not (best.size == 1 and any(int(draft_tokens[i]) == best[0] for i in stop_children))


def _exhaustive_cases(kind, vocab, k, parents, max_cases, rng):
    library = score_library(vocab)
    n_rows = (len(parents) if kind == "tree" else k) + 1
    n_tokens = n_rows - 1
    combos = len(library) ** n_rows * vocab ** n_tokens
    if combos <= max_cases:
        for rows in itertools.product(range(len(library)), repeat=n_rows):
            for tokens in itertools.product(range(vocab), repeat=n_tokens):
                yield library[list(rows)], np.array(tokens, dtype=np.int64)
        return
    for _ in range(max_cases):  # a seeded sample of the product (stated in the report)
        rows = rng.integers(len(library), size=n_rows)
        yield library[rows], rng.integers(vocab, size=n_tokens).astype(np.int64)


def _random_cases(kind, vocab, k, parents, count, rng):
    n_rows = (len(parents) if kind == "tree" else k) + 1
    for _ in range(count):
        scores = rng.standard_normal((n_rows, vocab)).astype(np.float32) * 3.0
        for r in range(n_rows):
            edge = rng.integers(5)
            top = int(np.argmax(scores[r]))
            if edge == 1:  # a tie at the top with a random other token
                scores[r, rng.integers(vocab)] = scores[r, top]
            elif edge == 2:  # -0.0 and +0.0 tied as the maximum
                scores[r] = -np.abs(scores[r]) - 1.0
                a, b = rng.choice(vocab, 2, replace=False)
                scores[r, a], scores[r, b] = -0.0, 0.0
            elif edge == 3:  # most of the row masked
                keep = rng.random(vocab) < 0.05
                keep[rng.integers(vocab)] = True
                scores[r, ~keep] = _NEG
        tokens = np.empty(n_rows - 1, dtype=np.int64)
        for i in range(n_rows - 1):  # a node's token scored by its parent's row (chain: row i)
            row = scores[parents[i] + 1] if kind == "tree" else scores[i]
            tokens[i] = int(np.argmax(row)) if rng.random() < 0.7 else int(rng.integers(vocab))
        yield scores, tokens


def check_greedy(verifier, kind="chain", *, vocab=3, k=2, tree_shape="depth2", ties="lowest",
                 random_cases=2000, random_vocab=1000, max_exhaustive=20_000, seed=0, call_budget=5.0,
                 time_budget=600.0):
    """Check a greedy (temperature-0) verifier: its output must equal plain greedy decoding.

    Every exhaustive case (K + 1 rows from :func:`score_library`, every draft in ``[0, V)^K``) and
    ``random_cases`` random cases at ``random_vocab`` tokens are run; the verdict is "lossless" iff
    every output equals :func:`greedy_reference` (up to ties, see ``ties``), "violation" with the
    first differing case as the reproducer otherwise, "error" if the verifier misbehaved.

    Args:
        verifier: chain: ``verifier(target_scores [K+1, V] float32, draft_tokens [K] int64) ->
            (n_accepted, next_token)``; tree: ``verifier(target_scores [N+1, V] float32,
            draft_tokens [N] int64, parents [N] int64) -> (path, next_token)`` (``path`` the
            accepted nodes, root first).
        kind: ``"chain"`` (also accepted: ``"greedy"``) or ``"tree"``.
        vocab: V of the exhaustive cases (2 to 5).
        k: drafts per chain round of the exhaustive and random cases (0 to 4).
        tree_shape: a name of ``specverify.testing._kinds.TREE_SHAPES`` or a parents list (trees).
        ties: ``"lowest"`` (the lowest tied index, as ``numpy.argmax``) or ``"any"`` (any maximum).
        random_cases: number of random cases (0 for none).
        random_vocab: V of the random cases.
        max_exhaustive: above this many exhaustive combinations, a seeded sample of that many is
            run instead (the report says so).
        seed: seeds the random cases.
        call_budget: seconds one call may take.
        time_budget: seconds for the whole check.

    Returns:
        :class:`~specverify.testing.report.Report` with mode "greedy".

    Raises:
        ValueError: invalid arguments (the limits are stated in the message).
    """
    _args.common(verifier, seed, call_budget, time_budget)
    if kind == "greedy":
        kind = "chain"
    if kind not in ("chain", "tree"):
        raise _args.ArgumentError("kind", f"kind must be 'chain' or 'tree' for check_greedy, got {kind!r}")
    for name, value, low, high in (("vocab", vocab, 2, 5), ("k", k, 0, 4), ("random_cases", random_cases, 0, 10**7),
                                   ("random_vocab", random_vocab, 2, 10**6), ("max_exhaustive", max_exhaustive, 1,
                                                                               10**7)):
        _args.integer(name, value, low, high)
    _args.choice("ties", ties, ("lowest", "any"))
    parents = np.asarray(_kinds.tree_parents(tree_shape, 6), dtype=np.int64) if kind == "tree" else None
    names = ("target_scores", "draft_tokens") + (("parents",) if kind == "tree" else ())
    caller = Caller(verifier, call_budget, names)
    settings = dict(kind=kind, layout="specverify", vocab=vocab, k=k if kind == "chain" else None, ties=ties,
                    tree_shape=None if parents is None else parents.tolist(), random_cases=random_cases,
                    random_vocab=random_vocab, seed=seed)
    start = time.perf_counter()
    work = functools.partial(_run, caller, kind, vocab, k, parents, ties, random_cases, random_vocab, max_exhaustive,
                             seed)
    result, fault = run_guarded(work, caller, time_budget)
    seconds = time.perf_counter() - start
    if fault is not None:
        hint = None
        if kind == "chain" and caller.calls == 1 and fault.what == "raised" and "TypeError" in fault.message:
            hint = "a tree verifier (it takes parents) is checked with kind='tree' (command line: --kind tree)"
        return Report.from_fault("greedy", settings, fault, seconds, caller.calls, hint)
    counts, bad = result
    settings.update(exhaustive_cases=counts[0], exhaustive_sampled=counts[2])
    sampled_note = " (a seeded sample of the exhaustive product)" if counts[2] else ""
    if bad is None:
        return Report(mode="greedy", verdict="lossless", settings=settings, seconds=seconds, calls=caller.calls,
                      summary=f"{counts[0]} exhaustive{sampled_note} and {counts[1]} random cases equal plain greedy "
                              f"decoding (ties: {ties})")
    return Report(mode="greedy", verdict="violation", settings=settings, seconds=seconds, calls=caller.calls,
                  summary=f"case {bad['case_index']} ({bad['set']}): the verifier emits {bad['verifier_emits']}, plain "
                          f"greedy decoding emits {bad['greedy_emits']} (ties: {ties})",
                  reproducer=bad)


def _run(caller, kind, vocab, k, parents, ties, random_cases, random_vocab, max_exhaustive, seed):
    rng = np.random.default_rng(seed)
    n_tokens = len(parents) if kind == "tree" else k
    combos = len(score_library(vocab)) ** (n_tokens + 1) * vocab ** n_tokens
    counts = [0, 0, combos > max_exhaustive]
    sets = (("exhaustive", _exhaustive_cases(kind, vocab, k, parents, max_exhaustive, rng), 0),
            ("random", _random_cases(kind, random_vocab, k, parents, random_cases, rng), 1))
    for label, cases, slot in sets:
        for index, (scores, tokens) in enumerate(cases):
            args = (scores, tokens) + ((parents.copy(),) if kind == "tree" else ())
            out = caller(*args)
            try:
                if kind == "tree":
                    got = _kinds.tree_output(out, tokens, parents, scores.shape[1])
                else:
                    got = _kinds.chain_output(out, tokens, scores.shape[1])
            except VerifierFault as fault:
                raise VerifierFault(fault.what, fault.message, {**caller.case(args), "returned": describe(out)})
            counts[slot] += 1
            if not _acceptable(scores, tokens, parents, got, ties):
                want = greedy_reference(scores, tokens, parents)
                emit = (lambda g: [int(tokens[i]) for i in g[0]] + [g[1]]) if kind == "tree" else \
                    (lambda g: [int(t) for t in tokens[:g[0]]] + [g[1]])
                return counts, {"set": label, "case_index": index, **caller.case(args),
                                "verifier_returns": describe(list(got)), "verifier_emits": emit(got),
                                "greedy_emits": emit(want)}
    return counts, None
