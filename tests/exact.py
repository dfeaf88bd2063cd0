"""Exact laws of verification ops by enumeration of their uniforms (no sampling, no tolerance
beyond float rounding).

An op that takes its uniforms as inputs is a piecewise-constant function of them: each coin is
compared with a threshold, each inverse-CDF draw with cumulative masses.  Given, per uniform, a
set of cut points containing every place where the op can change (extra cuts are harmless),
calling the op at the midpoint of every cell of the product grid and weighting by the cell's
volume gives the op's exact output law.  Composing rounds (each round's law from the context it
starts in) gives the law of the first L emitted tokens, to compare with the target's joint law.
"""

import itertools
from collections import defaultdict

import numpy as np


def cells(cuts):
    """``(midpoints, widths)`` of the cells [0, c_1), [c_1, c_2), ..., [c_m, 1) of one uniform.

    cuts: any iterable of points; those outside (0, 1) are ignored, duplicates merged."""
    edges = np.unique(np.concatenate([[0.0, 1.0], [c for c in cuts if 0.0 < c < 1.0]]))
    return (edges[:-1] + edges[1:]) / 2.0, np.diff(edges)


def exact_law(op, cuts_per_uniform):
    """``{outcome: probability}`` of ``op(u)`` for independent uniforms ``u`` (``[n]`` float64).

    op: a function of the ``[n]`` uniforms returning a hashable outcome; cuts_per_uniform: ``n``
    iterables of cut points (see ``cells``).
    """
    grids = [cells(c) for c in cuts_per_uniform]
    law = defaultdict(float)
    for choice in itertools.product(*[range(len(m)) for m, _ in grids]):
        u = np.array([grids[i][0][c] for i, c in enumerate(choice)], dtype=np.float64)
        weight = float(np.prod([grids[i][1][c] for i, c in enumerate(choice)]))
        law[op(u)] += weight
    return law


def inverse_cdf_cuts(probs):
    """Where an inverse-CDF draw from ``probs`` (token ids in increasing order) changes."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.cumsum(probs / probs.sum())[:-1]


def compose_rounds(round_law, context, length, state=None):
    """Law ``{tokens: probability}`` of the first ``length`` emitted tokens.

    round_law(context) -> ``{emitted tuple: probability}`` for one round started in ``context``
    (the last committed token); rounds are chained on their last emitted token.
    """
    state = {} if state is None else state
    key = (context, length)
    if key in state:
        return state[key]
    law = defaultdict(float)
    for emitted, prob in round_law(context).items():
        if len(emitted) >= length:
            law[tuple(emitted[:length])] += prob
            continue
        for rest, rest_prob in compose_rounds(round_law, emitted[-1], length - len(emitted), state).items():
            law[tuple(emitted) + rest] += prob * rest_prob
    state[key] = dict(law)
    return state[key]


def markov_joint(transitions, context, length):
    """``{tokens: probability}`` of ``length`` tokens from a Markov chain ``[V, V]`` (rows
    normalized here) started after ``context``."""
    t = np.asarray(transitions, dtype=np.float64)
    t = t / t.sum(axis=1, keepdims=True)
    law = {}
    for tokens in itertools.product(range(t.shape[0]), repeat=length):
        prob, prev = 1.0, context
        for x in tokens:
            prob *= t[prev, x]
            prev = x
        if prob > 0:
            law[tokens] = prob
    return law


def total_variation(law_a, law_b):
    """``1/2 sum |a - b|`` over the union of outcomes."""
    keys = set(law_a) | set(law_b)
    return 0.5 * sum(abs(law_a.get(k, 0.0) - law_b.get(k, 0.0)) for k in keys)
