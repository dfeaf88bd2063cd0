"""Exact laws of verification ops by enumeration of their uniforms (no sampling, no tolerance
beyond float rounding).

An op that takes its uniforms as inputs is a piecewise-constant function of them: each coin is
compared with a threshold, each inverse-CDF draw with cumulative masses.  Given, per uniform, a
set of cut points containing every place where the op can change (extra cuts are harmless),
calling the op at the midpoint of every cell of the grid and weighting by the cell's volume gives
the op's exact output law.  Composing rounds (each round's law from the context it starts in)
gives the law of the first L emitted tokens, to compare with the target's joint law.

- :func:`exact_law` (cuts fixed per uniform) and :func:`law_over_uniforms` (the cuts of a uniform
  may depend on the values taken by the ones before it, e.g. the final draw's CDF on which
  residual the coins selected);
- :func:`compose_rounds`: the law of the first ``length`` tokens of repeated rounds;
- :func:`markov_joint`, :class:`MarkovModel` and :func:`target_law`: the target's joint law
  (order-1 matrices, or tables of any order);
- :func:`chain_round_law`: one round of a chain op (``accept``-like signature) with every draft
  path of a Markov draft enumerated.
"""

import itertools
from collections import defaultdict

import numpy as np


def cells(cuts):
    """``(midpoints, widths)`` of the cells [0, c_1), [c_1, c_2), ..., [c_m, 1) of one uniform.

    cuts: any iterable of points; those outside (0, 1) are ignored, duplicates merged, NaN refused.
    A midpoint stays inside its cell even when the cell is one ulp wide.
    """
    cuts = np.asarray(list(cuts), dtype=np.float64)
    if np.isnan(cuts).any():
        raise ValueError("cuts must not be NaN")
    edges = np.unique(np.concatenate([[0.0, 1.0], cuts[(cuts > 0.0) & (cuts < 1.0)]]))
    widths = np.diff(edges)
    return np.minimum(edges[:-1] + widths / 2.0, np.nextafter(edges[1:], 0.0)), widths


def law_over_uniforms(op, n_uniforms, cuts):
    """``{outcome: probability}`` of ``op(u)`` for independent uniforms ``u`` (``[n_uniforms]``).

    ``cuts(prefix)`` returns the cut points of uniform ``len(prefix)`` given the values
    ``prefix`` chosen for the uniforms before it (see ``cells``).
    """
    law = defaultdict(float)

    def walk(prefix, weight):
        if len(prefix) == n_uniforms:
            law[op(np.array(prefix, dtype=np.float64))] += weight
            return
        for m, w in zip(*cells(cuts(prefix))):
            walk(prefix + [float(m)], weight * w)

    walk([], 1.0)
    return dict(law)


def exact_law(op, cuts_per_uniform):
    """``{outcome: probability}`` of ``op(u)``; cuts_per_uniform: ``n`` iterables of cut points."""
    cuts_per_uniform = list(cuts_per_uniform)
    return law_over_uniforms(op, len(cuts_per_uniform), lambda prefix: cuts_per_uniform[len(prefix)])


def inverse_cdf_cuts(probs):
    """Where an inverse-CDF draw from ``probs`` (token ids in increasing order) changes."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.cumsum(probs / probs.sum())[:-1]


def compose_rounds(round_law, context, length, state=None, advance=None):
    """Law ``{tokens: probability}`` of the first ``length`` emitted tokens.

    round_law(context) -> ``{emitted tuple: probability}`` for one round started in ``context``;
    the next round starts in ``advance(context, emitted)`` (default: the last emitted token).
    Tokens past ``length`` are dropped: the round boundary is a stopping time.
    """
    state = {} if state is None else state
    advance = advance or (lambda ctx, emitted: emitted[-1])
    key = (context, length)
    if key in state:
        return state[key]
    law = defaultdict(float)
    for emitted, prob in round_law(context).items():
        if len(emitted) >= length:
            law[tuple(emitted[:length])] += prob
            continue
        rest_law = compose_rounds(round_law, advance(context, tuple(emitted)), length - len(emitted), state, advance)
        for rest, rest_prob in rest_law.items():
            law[tuple(emitted) + rest] += prob * rest_prob
    state[key] = dict(law)
    return state[key]


class MarkovModel:
    """Next-token table of order ``order``: ``table[c_1, ..., c_order]`` is a ``[V]`` row (any
    positive scale; kept in its dtype, so float32 tables are what the ops read).

    Contexts shorter than the order are left-padded with token 0.
    """

    def __init__(self, table):
        self.table = np.ascontiguousarray(table)
        self.order = self.table.ndim - 1
        self.vocab = self.table.shape[-1]
        if np.any(self.table.astype(np.float64).sum(axis=-1) <= 0) or np.any(self.table < 0):
            raise ValueError("every row needs non-negative entries and positive mass")

    def row(self, context):
        """``[V]`` row (as stored) after ``context`` (a tuple of tokens)."""
        context = (0,) * self.order + tuple(context)
        return self.table[context[len(context) - self.order:]] if self.order else self.table

    def probs(self, context):
        """Normalized float64 ``[V]`` row after ``context``."""
        row = self.row(context).astype(np.float64)
        return row / row.sum()


def target_law(model, context, length):
    """``{tokens: probability}`` of ``length`` tokens sampled from ``model`` after ``context``."""
    law = {}
    for seq in itertools.product(range(model.vocab), repeat=length):
        prob = 1.0
        for j, x in enumerate(seq):
            prob *= model.probs(tuple(context) + seq[:j])[x]
        if prob > 0:
            law[seq] = prob
    return law


def markov_joint(transitions, context, length):
    """``{tokens: probability}`` of ``length`` tokens from a Markov chain ``[V, V]`` (rows
    normalized here) started after ``context``."""
    return target_law(MarkovModel(transitions), (context,), length)


def total_variation(law_a, law_b):
    """``1/2 sum |a - b|`` over the union of outcomes."""
    keys = set(law_a) | set(law_b)
    return 0.5 * sum(abs(law_a.get(k, 0.0) - law_b.get(k, 0.0)) for k in keys)


def chain_round_law(op, cuts_for, target, draft, k, context, deterministic_draft=None):
    """Law ``{emitted tuple: probability}`` of one round of a chain op after ``context``.

    op(target_probs [k+1, V], draft_probs [k, V] or None, tokens [k], uniforms [k+1]) ->
    (n_accepted, next_token).  ``cuts_for(target_probs, draft_probs, tokens)`` returns the
    ``cuts(prefix)`` function of :func:`law_over_uniforms` for that round.  target, draft:
    :class:`MarkovModel`.  The draft samples its k tokens from ``draft`` (every path enumerated
    with its probability), or, with ``deterministic_draft(context, k)``, proposes them
    deterministically (``draft_probs=None``).
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
    law = defaultdict(float)
    for path, prob in paths:
        target_rows = np.stack([target.row(context + path[:i]) for i in range(k + 1)])  # [k+1, V]
        draft_rows = None if deterministic_draft is not None else np.stack(
            [draft.row(context + path[:i]) for i in range(k)]).reshape(k, target.vocab)  # [k, V]
        tokens = np.array(path, dtype=np.int64)
        round_op = lambda u: op(target_rows, draft_rows, tokens, u)  # noqa: E731
        for (n, nxt), p_out in law_over_uniforms(round_op, k + 1, cuts_for(target_rows, draft_rows, tokens)).items():
            law[path[:n] + (int(nxt),)] += prob * p_out
    return dict(law)
