"""Small enumerable models and the exact laws the harness compares against.

- :class:`MarkovModel`: a next-token table of order ``order`` (``table[c_1, ..., c_order]`` is a
  ``[V]`` row of any positive scale; contexts shorter than the order are left-padded with 0);
- :func:`model_pairs`: seeded target/draft pairs with the edges that break verifiers: zeros in
  either model, exact ties, draft rows equal to the target's at another scale, one-hot draft rows,
  rows of very different masses (unnormalized);
- :func:`target_law`: ``{tokens: probability}`` of ``L`` tokens sampled from a model;
- :func:`cells`, :func:`law_over_uniforms`: the exact law of a function that is piecewise constant
  in each of its uniforms, from cut points;
- :func:`compose_rounds`: the law of the first ``L`` tokens of repeated rounds;
- :func:`total_variation`, :func:`marginal`.
"""

import itertools
from collections import defaultdict

import numpy as np

__all__ = ["MarkovModel", "model_pairs", "target_law", "cells", "law_over_uniforms", "inverse_cdf_cuts",
           "compose_rounds", "total_variation", "marginal", "inverse_cdf"]


class MarkovModel:
    """Next-token table of order ``order``.

    Args:
        table: ``[V] * order + [V]`` non-negative rows with positive mass (any scale; kept in its
            dtype, so a float32 table is what a verifier reads).
        validate: False for a table of logits (what a logits-in verifier reads).
    """

    def __init__(self, table, validate=True):
        self.table = np.ascontiguousarray(table)
        if self.table.ndim < 1 or self.table.shape[-1] < 2:
            raise ValueError(f"table must be [V] * order + [V] with V >= 2, got shape {list(self.table.shape)}")
        self.order = self.table.ndim - 1
        self.vocab = self.table.shape[-1]
        if any(s != self.vocab for s in self.table.shape):
            raise ValueError(f"table must be [V] * order + [V], got shape {list(self.table.shape)}")
        wide = self.table.astype(np.float64)
        if validate and (not np.all(np.isfinite(wide)) or np.any(wide < 0) or np.any(wide.sum(axis=-1) <= 0)):
            raise ValueError("every row of table needs finite non-negative entries and positive mass")

    def row(self, context):
        """``[V]`` row (as stored) after ``context`` (a tuple of tokens)."""
        context = (0,) * self.order + tuple(int(t) for t in context)
        return self.table[context[len(context) - self.order:]] if self.order else self.table

    def probs(self, context):
        """Normalized float64 ``[V]`` row after ``context`` (cached per context; do not modify)."""
        key = tuple(int(t) for t in context)[-self.order:] if self.order else ()
        cache = self.__dict__.setdefault("_probs", {})
        if key not in cache:
            row = self.row(key).astype(np.float64)
            cache[key] = row / row.sum()
        return cache[key]

    def contexts(self):
        """Every distinct context: the tuples of ``order`` tokens."""
        return list(itertools.product(range(self.vocab), repeat=self.order)) if self.order else [()]

    def __repr__(self):
        return f"MarkovModel(V={self.vocab}, order={self.order})"


def _composition(rng, vocab, zero=None, tie=False, total=16):
    """``[V]`` non-negative integers summing to ``total`` (a power of 2), 0 at ``zero``; with
    ``tie`` the two largest are equal.  Row masses that are powers of 2 keep every ratio of masses,
    every residual ``p - q P/Q`` and every CDF exact in float32, so a float32 kernel's law is exact
    to float64 rounding and bisection measures the rule, not the kernel's rounding."""
    allowed = [t for t in range(vocab) if t != zero]
    row = np.zeros(vocab)
    if tie:
        a = int(rng.integers(total // (2 * len(allowed)) + 1, total // 2 + 1)) if len(allowed) > 2 else total // 2
        first, second = (int(x) for x in rng.choice(allowed, 2, replace=False))
        row[first] = row[second] = a
        rest = [t for t in allowed if t not in (first, second)]
        left = total - 2 * a
        if rest and left > 0:
            row[rest] += rng.multinomial(left, np.ones(len(rest)) / len(rest))
        elif left > 0:
            row[first] = row[second] = total // 2
        return row
    row[allowed] = 1.0
    row[allowed] += rng.multinomial(total - len(allowed), np.ones(len(allowed)) / len(allowed))
    return row


def _spread(row, support):
    """``row`` with at least ``support`` non-zero entries: a quarter of the largest entry moved
    to each of the lowest zero entries needed (the row's mass, a power of 2, is unchanged)."""
    row = row.copy()
    for t in np.flatnonzero(row == 0)[: max(0, support - int((row > 0).sum()))]:
        top = int(np.argmax(row))
        row[t] = row[top] / 4.0
        row[top] -= row[t]
    return row


def model_pairs(vocab=3, order=1, seeds=(0, 1), dtype=np.float32, min_draft_support=1):
    """Seeded ``(target, draft)`` :class:`MarkovModel` pairs with every edge a verifier must get
    right (section G of the verification notes): zeros in target and draft, exact ties, draft rows
    equal to the target's at another scale (``p == q``), one-hot draft rows, and row masses spread
    over six orders of magnitude (powers of 2) (rows are not normalized).

    Args:
        vocab: V (2-5 for exact mode).  order: 1 or 2.  seeds: one pair per seed.
        min_draft_support: every draft row gets at least this many tokens of positive probability
            (a without-replacement tree drawing k siblings needs k; one-hot rows are then spread).
    """
    pairs = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        shape = (vocab,) * order + (vocab,)
        target, draft = np.zeros(shape), np.zeros(shape)
        flat_t, flat_d = target.reshape(-1, vocab), draft.reshape(-1, vocab)
        for c in range(flat_t.shape[0]):
            kind = (c + 3 * seed) % 5  # seeds 0 and 1 cover every kind at V = 3
            zero_t, zero_d = (int(z) for z in rng.choice(vocab, 2, replace=False))
            flat_t[c] = _composition(rng, vocab, zero=zero_t)
            flat_d[c] = _composition(rng, vocab, zero=zero_d)
            if kind == 1:  # p = q at another scale
                flat_d[c] = flat_t[c] * 2.0
            elif kind == 2:  # a one-hot draft row (on a token the target may not emit)
                flat_d[c] = np.eye(vocab)[rng.integers(vocab)] * 16.0
            elif kind == 3:  # exact ties at the top of the target row
                flat_t[c] = _composition(rng, vocab, zero=None, tie=True)
            elif kind == 4:  # ties inside the draft row
                flat_d[c] = _composition(rng, vocab, zero=zero_d, tie=True)
            # Masses far from 1 (normalization matters), by powers of 2.
            flat_t[c] *= 2.0 ** rng.integers(-10, 11)
            flat_d[c] *= 2.0 ** rng.integers(-10, 11)
            flat_d[c] = _spread(flat_d[c], min(min_draft_support, vocab))
        pairs.append((MarkovModel(target.astype(dtype)), MarkovModel(draft.astype(dtype))))
    return pairs


def target_law(model, context, length):
    """``{tokens: probability}`` of ``length`` tokens sampled from ``model`` after ``context``."""
    law = {}
    for seq in itertools.product(range(model.vocab), repeat=length):
        prob = 1.0
        for j, x in enumerate(seq):
            prob *= model.probs(tuple(context) + seq[:j])[x]
            if prob == 0.0:
                break
        if prob > 0:
            law[seq] = prob
    return law


def cells(cuts):
    """``(midpoints, lows, highs)`` of the cells [0, c_1), [c_1, c_2), ..., [c_m, 1) of one uniform.

    cuts: any iterable of points; those outside (0, 1) are ignored, duplicates merged, NaN refused.
    """
    cuts = np.asarray(list(cuts), dtype=np.float64)
    if np.isnan(cuts).any():
        raise ValueError("cuts must not be NaN")
    edges = np.unique(np.concatenate([[0.0, 1.0], cuts[(cuts > 0.0) & (cuts < 1.0)]]))
    lows, highs = edges[:-1], edges[1:]
    mids = np.minimum(lows + (highs - lows) / 2.0, np.nextafter(highs, 0.0))
    return mids, lows, highs


def law_over_uniforms(op, n_uniforms, cuts, leaf=None):
    """``{outcome: probability}`` of ``op(u)`` for ``n_uniforms`` independent U[0, 1) uniforms.

    ``cuts(prefix)`` returns the cut points of uniform ``len(prefix)`` given the values ``prefix``
    chosen for the uniforms before it.  ``leaf(u, lows, highs, outcome)``, if given, is called at
    every cell (for the harness's consistency checks).
    """
    law = defaultdict(float)

    def walk(prefix, lows, highs, weight):
        if len(prefix) == n_uniforms:
            u = np.array(prefix, dtype=np.float64)
            outcome = op(u)
            if leaf is not None:
                leaf(u, lows, highs, outcome)
            law[outcome] += weight
            return
        for m, lo, hi in zip(*cells(cuts(prefix))):
            walk(prefix + [float(m)], lows + [lo], highs + [hi], weight * (hi - lo))

    walk([], [], [], 1.0)
    return dict(law)


def inverse_cdf_cuts(probs):
    """Where an inverse-CDF draw from ``probs`` (token ids in increasing order) changes."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.cumsum(probs / probs.sum())[:-1]


def inverse_cdf(weights, u):
    """Token drawn by inverse CDF from unnormalized ``weights`` ``[V]`` with uniform ``u``."""
    weights = np.asarray(weights, dtype=np.float64)
    c = np.cumsum(weights)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), weights.size - 1))


def compose_rounds(round_law, context, length, state=None, advance=None):
    """Law ``{tokens: probability}`` of the first ``length`` emitted tokens of repeated rounds.

    round_law(context) -> ``{emitted tuple: probability}`` for one round started in ``context``;
    the next round starts in ``advance(context, emitted)``.  Tokens past ``length`` are dropped:
    the round boundary is a stopping time.
    """
    state = {} if state is None else state
    advance = advance or (lambda ctx, emitted: emitted[-1:])
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


def marginal(law, length):
    """The law of the first ``length`` tokens of a law over longer tuples."""
    out = defaultdict(float)
    for seq, prob in law.items():
        out[seq[:length]] += prob
    return dict(out)


def total_variation(law_a, law_b):
    """``1/2 sum |a - b|`` over the union of outcomes."""
    keys = set(law_a) | set(law_b)
    return 0.5 * sum(abs(law_a.get(k, 0.0) - law_b.get(k, 0.0)) for k in keys)
