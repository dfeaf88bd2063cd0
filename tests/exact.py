"""Exact laws by enumeration: the proof harness for verification rules (generic, no op inside).

A verification op driven by explicit uniforms ``u`` ``[d]`` is piecewise constant in ``u``: every
coin is compared with a threshold and every draw is an inverse CDF, so the op is constant on the
cells of a grid cut at those thresholds and CDF points.  Calling the op once at the midpoint of
every cell, weighted by the cell's volume, gives its exact output law (up to float64 rounding of
the cut points, ~1e-16 per cell) — no sampling, no statistics.

- :func:`law_over_uniforms`: the law of ``op(u)`` given where to cut each coordinate (the cuts of
  coordinate ``j`` may depend on the values chosen for the coordinates before it, e.g. the final
  draw's CDF depends on which residual the coins selected).
- :class:`MarkovModel`: a small order-``n`` next-token table (float32, rows may hold zeros).
- :func:`sequence_law`: compose the rounds of a decoder until ``length`` tokens exist, from a
  ``round_law(context)`` that returns ``{emitted tokens: probability}``; :func:`target_law` is the
  target's own joint law of ``length`` tokens; :func:`total_variation` compares the two.
- :func:`chain_round_law`: the round law of a chain op (``accept``-like signature) when the draft
  samples its K tokens from a Markov model (or proposes them deterministically), enumerating
  every draft path.
"""

from __future__ import annotations

import itertools
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

Law = Dict[tuple, float]


def cells(cuts) -> Tuple[np.ndarray, np.ndarray]:
    """Midpoints and widths of the cells of [0, 1) cut at ``cuts`` (empty cells dropped)."""
    cuts = np.asarray(cuts, dtype=np.float64)
    if np.isnan(cuts).any():
        raise ValueError("cuts must not be NaN")
    edges = np.unique(np.concatenate([[0.0, 1.0], np.clip(cuts, 0.0, 1.0)]))
    widths = np.diff(edges)
    keep = widths > 0
    mids = np.minimum(edges[:-1] + widths / 2, np.nextafter(edges[1:], 0.0))  # inside even when 1 ulp wide
    return mids[keep], widths[keep]


def law_over_uniforms(op: Callable[[np.ndarray], object], n_uniforms: int,
                      cuts: Callable[[Sequence[float]], Sequence[float]]) -> Law:
    """Exact law of ``op(u)`` for ``u ~ U[0, 1)^n_uniforms``.

    ``cuts(prefix)`` returns the points where coordinate ``len(prefix)`` may change the output
    given the earlier coordinates' values ``prefix``; every threshold the op compares that
    coordinate with must be among them (extra cuts are harmless).  Outcomes are dict keys.
    """
    law: Law = {}

    def walk(prefix, weight):
        if len(prefix) == n_uniforms:
            outcome = op(np.array(prefix, dtype=np.float64))
            law[outcome] = law.get(outcome, 0.0) + weight
            return
        mids, widths = cells(cuts(prefix))
        for m, w in zip(mids, widths):
            walk(prefix + [float(m)], weight * w)

    walk([], 1.0)
    return law


class MarkovModel:
    """Next-token table of order ``order``: ``table[c_1, ..., c_order]`` is a float32 ``[V]`` row.

    Contexts shorter than the order are left-padded with token 0.
    """

    def __init__(self, table):
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.order = self.table.ndim - 1
        self.vocab = self.table.shape[-1]
        masses = self.table.astype(np.float64).sum(axis=-1)
        if np.any(masses <= 0) or np.any(self.table < 0):
            raise ValueError("every row needs non-negative entries and positive mass")

    def row(self, context) -> np.ndarray:
        """float32 ``[V]`` (unnormalized) row after ``context``."""
        context = (0,) * self.order + tuple(context)
        return self.table[context[len(context) - self.order:]] if self.order else self.table

    def probs(self, context) -> np.ndarray:
        """Normalized float64 ``[V]`` row after ``context``."""
        row = self.row(context).astype(np.float64)
        return row / row.sum()


def target_law(model: MarkovModel, context, length: int) -> Law:
    """Joint law of the next ``length`` tokens sampled from ``model`` after ``context``."""
    law: Law = {}
    for seq in itertools.product(range(model.vocab), repeat=length):
        prob = 1.0
        for j, x in enumerate(seq):
            prob *= model.probs(tuple(context) + seq[:j])[x]
            if prob == 0.0:
                break
        if prob > 0.0:
            law[seq] = prob
    return law


def sequence_law(round_law: Callable[[tuple], Law], context, length: int) -> Law:
    """Law of the first ``length`` tokens emitted by repeated rounds, starting after ``context``.

    ``round_law(context)`` maps each tuple of tokens a round can emit to its probability.  Tokens
    past ``length`` are dropped (the round boundary is a stopping time, so the law of the first
    ``length`` tokens is well defined whatever the later rounds do).
    """
    cache: Dict[tuple, Law] = {}

    def law_from(ctx, remaining) -> Law:
        key = (ctx, remaining)
        if key not in cache:
            out: Law = {}
            for emitted, prob in round_law(ctx).items():
                head = emitted[:remaining]
                if len(head) == remaining:
                    out[head] = out.get(head, 0.0) + prob
                    continue
                for tail, p_tail in law_from(ctx + head, remaining - len(head)).items():
                    out[head + tail] = out.get(head + tail, 0.0) + prob * p_tail
            cache[key] = out
        return cache[key]

    return law_from(tuple(context), length)


def total_variation(a: Law, b: Law) -> float:
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


def chain_round_law(op, cuts_for, target: MarkovModel, draft: MarkovModel, k: int, context,
                    deterministic_draft: Optional[Callable[[tuple, int], Sequence[int]]] = None) -> Law:
    """Law of the tokens one round of a chain op emits after ``context``.

    op(target_probs [k+1, V], draft_probs [k, V] or None, tokens [k], uniforms [k+1]) ->
    (n_accepted, next_token).  ``cuts_for(target_probs, draft_probs, tokens)`` returns the
    ``cuts(prefix)`` function of :func:`law_over_uniforms` for that round.  The draft samples
    its k tokens from ``draft`` (every path enumerated with its probability), or, with
    ``deterministic_draft(context, k)``, proposes them deterministically (``draft_probs=None``).
    """
    context = tuple(context)
    if deterministic_draft is not None:
        paths = [(tuple(int(x) for x in deterministic_draft(context, k)), 1.0)]
    else:
        paths = []
        for path in itertools.product(range(target.vocab), repeat=k):
            prob = 1.0
            for j, x in enumerate(path):
                prob *= draft.probs(context + path[:j])[x]
            if prob > 0.0:
                paths.append((path, prob))
    law: Law = {}
    for path, prob in paths:
        target_rows = np.stack([target.row(context + path[:i]) for i in range(k + 1)])  # [k+1, V]
        draft_rows = None if deterministic_draft is not None else np.stack(
            [draft.row(context + path[:i]) for i in range(k)]).reshape(k, target.vocab)  # [k, V]
        tokens = np.array(path, dtype=np.int64)
        round_op = lambda u: op(target_rows, draft_rows, tokens, u)  # noqa: E731
        for (n, nxt), p_out in law_over_uniforms(round_op, k + 1, cuts_for(target_rows, draft_rows, tokens)).items():
            emitted = path[:n] + (int(nxt),)
            law[emitted] = law.get(emitted, 0.0) + prob * p_out
    return law
