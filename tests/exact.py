"""Exact laws of verification ops by enumeration of their uniforms, for the tests: the public
harness's machinery (``specverify.testing.models``), with the few signatures the older tests use.

An op that takes its uniforms as inputs is a piecewise-constant function of them; given, per
uniform, cut points containing every place where it can change, calling it at the midpoint of
every cell and weighting by the cell's volume gives its exact output law
(:func:`law_over_uniforms`, :func:`exact_law`); composing rounds gives the law of the first L
emitted tokens (:func:`compose_rounds`), to compare with the target's (:func:`target_law`,
:func:`markov_joint`).  :func:`chain_round_law` is one round of a chain op with every draft path of
a Markov draft enumerated.
"""

from collections import defaultdict

import numpy as np

from specverify.testing import models
from specverify.testing._kinds import chain_draft_paths
from specverify.testing.models import MarkovModel, inverse_cdf_cuts, law_over_uniforms, target_law, total_variation

__all__ = ["MarkovModel", "inverse_cdf_cuts", "law_over_uniforms", "target_law", "total_variation", "exact_law",
           "compose_rounds", "markov_joint", "chain_round_law"]


def exact_law(op, cuts_per_uniform):
    """``{outcome: probability}`` of ``op(u)``; cuts_per_uniform: ``n`` iterables of cut points."""
    cuts_per_uniform = list(cuts_per_uniform)
    return law_over_uniforms(op, len(cuts_per_uniform), lambda prefix: cuts_per_uniform[len(prefix)])


def compose_rounds(round_law, context, length, state=None, advance=None):
    """:func:`specverify.testing.models.compose_rounds` whose default next context is the last
    emitted token itself (an int: the order-1 tests index their matrices with it)."""
    return models.compose_rounds(round_law, context, length, state,
                                 advance or (lambda ctx, emitted: emitted[-1]))


def markov_joint(transitions, context, length):
    """``{tokens: probability}`` of ``length`` tokens from a Markov chain ``[V, V]`` (rows
    normalized here) started after ``context``."""
    return target_law(MarkovModel(transitions), (context,), length)


def chain_round_law(op, cuts_for, target, draft, k, context, deterministic_draft=None):
    """Law ``{emitted tuple: probability}`` of one round of a chain op after ``context``.

    op(target_probs [k+1, V], draft_probs [k, V] or None, tokens [k], uniforms [k+1]) ->
    (n_accepted, next_token); ``cuts_for(target_probs, draft_probs, tokens)`` returns the
    ``cuts(prefix)`` of :func:`law_over_uniforms` for that round.  target, draft:
    :class:`MarkovModel`.  The draft samples its k tokens from ``draft`` (every path enumerated),
    or, with ``deterministic_draft(context, k)``, proposes them (``draft_probs=None``).
    """
    context = tuple(context)
    if deterministic_draft is not None:
        paths = [(tuple(int(x) for x in deterministic_draft(context, k)), 1.0)]
    else:
        paths = chain_draft_paths(draft, context, k, deterministic=False)
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
