"""The learned draft as the decoder's callbacks: :func:`learned_callbacks` (the planner over
prompt lookup and the learned drafts by default, :func:`planned_draft`; or :class:`HybridDraft`,
the fixed rule; or the learned draft alone) and the fixed rules' gate
:data:`DEFAULT_MIN_CONFIDENCE`."""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from ...decoding.tree_drafts import DraftTree, chain_parents
from .drafts import LearnedDraft, LearnedTreeDraft, _check_gate
from .head import FeatureHead, load

__all__ = ["DEFAULT_MIN_CONFIDENCE", "HybridDraft", "COMBINE", "planned_draft", "learned_callbacks"]

#: The gate :func:`learned_callbacks` sets (``min_confidence``) per mode, ``{"greedy": c, "sample": c}``,
#: chosen for the shipped draft. A drafted token costs ~0.1 of a plain step on SmolLM2 greedy (a
#: draft step 0.073, its row in the target pass ~0.03) and ~0.12 sampling (a step 0.087: its row
#: warped and its token drawn), so a position pays when it is reached and accepted more often than
#: that. Chosen on prompts of the training kind the draft never saw (``python -m
#: experiments.end_to_end.draft_eval --prompt-sets tuning --skip-speed``: the gate statistic's
#: calibration), never on the held-out sets: greedy positions with ``c_i`` in [0, 0.05) were reached
#: and accepted at 0.04, in [0.05, 0.1) at 0.17; sampling ones (reached x overlap) in [0.1, 0.2) at
#: 0.13 (break-even), in [0.2, 0.3) at 0.21.
DEFAULT_MIN_CONFIDENCE = {"greedy": 0.05, "sample": 0.2}


def _mode_gate(min_confidence, greedy: bool):
    """The gate of one mode from a number, a ``{"greedy": c, "sample": c}`` mapping, or None
    (:data:`DEFAULT_MIN_CONFIDENCE`); a mapping's unknown or missing key is named."""
    gates = DEFAULT_MIN_CONFIDENCE if min_confidence is None else min_confidence
    if not isinstance(gates, Mapping):
        return gates
    mode = "greedy" if greedy else "sample"
    unknown = sorted(map(repr, set(gates) - set(DEFAULT_MIN_CONFIDENCE)))
    if unknown or mode not in gates:
        problem = f"unknown key {', '.join(unknown)}" if unknown else f"no {mode!r} key (the gate of this mode)"
        raise ValueError(f"min_confidence as a mapping takes the keys 'greedy' and 'sample': {problem}, "
                         f"got {dict(gates)!r}")
    return gates[mode]


def _check_callbacks(head, tree, generator) -> None:
    """learned_callbacks' own arguments, checked before anything is built (the sampling ones are
    :class:`Sampling`'s, the gate :func:`_mode_gate`'s and :func:`_check_gate`'s)."""
    from ...kernels import _inputs

    _inputs.flag(tree, "tree")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__} {generator!r}")
    if head is not None and (not isinstance(head, FeatureHead) or head.head is None):
        raise ValueError("head must be a FeatureHead attached to the target (head.attach(target_model); load() "
                         f"attaches), got {'an unattached FeatureHead' if isinstance(head, FeatureHead) else repr(head)}")


class HybridDraft:
    """A trusted prompt-lookup match first, the learned draft otherwise.

    ``lookup`` is a :class:`~specverify.integrations.transformers.PromptLookupDraft`; its proposal
    is taken when its match is of order at least ``min_ngram`` and not contradicted
    (:meth:`~specverify.integrations.transformers.PromptLookupDraft.context`: the n-gram's latest
    earlier occurrence was followed by the same token as the copied one); otherwise ``learned``
    drafts. Why single tokens count (``min_ngram = 1``): a lookup proposal costs nothing to
    draft, and on SmolLM2's greedy texts an uncontradicted one-token match was right 36 times in
    104, above the learned draft's first-position rate (0.19 on the held-out prompts), while a
    contradicted match was right 8 times in 114, below it. Both proposals verify exactly (a
    lookup proposal is a point mass). With a :class:`LearnedTreeDraft` the lookup's chain is
    returned as a tree (a chain is the tree ``parents = [-1, 0, ..., j - 2]``, deterministic
    children), so every round is a tree round.

    :meth:`context` tells a policy (:class:`~specverify.decoding.adaptive.AdaptiveK`) which of the two
    drafts the round's proposal comes from: the lookup's match context, or :data:`LEARNED_CONTEXT`.
    Without it a policy pools the two, and the learned draft's rejections price the lookup's
    copies out as well (a hybrid under ``AdaptiveK`` drafted 0.42 tokens per pass where lookup
    alone drafted 2.62). Counters: ``lookup_rounds``, ``learned_rounds``.
    """

    #: :meth:`context` of a prefix the learned draft proposes from (lookup's contexts are >= 0).
    LEARNED_CONTEXT = -1

    def __init__(self, learned, lookup, min_ngram: int = 1):
        if isinstance(min_ngram, bool) or int(min_ngram) != min_ngram or not 1 <= min_ngram <= lookup.max_ngram:
            raise ValueError(f"min_ngram must be an integer in [1, {lookup.max_ngram}], got {min_ngram!r}")
        self.learned = learned
        self.lookup = lookup
        self.min_ngram = int(min_ngram)
        self.greedy = learned.greedy
        self.vocab_size = learned.vocab_size
        self.lookup_rounds = 0
        self.learned_rounds = 0

    def _trusted(self, context: int) -> bool:
        return self.min_ngram <= context <= self.lookup.max_ngram

    def context(self, prefix: torch.Tensor) -> int:
        """The lookup's context of ``prefix`` when its match is trusted, else :data:`LEARNED_CONTEXT`."""
        context = self.lookup.context(prefix)
        return context if self._trusted(context) else self.LEARNED_CONTEXT

    def first_token(self, prefix: torch.Tensor) -> Optional[int]:
        """The lookup's first token when its match is trusted (for a policy's hindsight); None
        when the learned draft would propose (its first token needs a draft forward)."""
        return self.lookup.first_token(prefix) if self._trusted(self.lookup.context(prefix)) else None

    def __call__(self, prefix: torch.Tensor, k: int, stop=None):
        if self._trusted(self.lookup.context(prefix)):
            tokens, _ = self.lookup(prefix, k)
            if tokens.numel():
                self.lookup_rounds += 1
                if isinstance(self.learned, LearnedTreeDraft):
                    return DraftTree(tokens, chain_parents(tokens.numel()))
                return tokens, None  # a point mass: verified exactly in either mode
        self.learned_rounds += 1
        if isinstance(self.learned, LearnedTreeDraft):
            return self.learned(prefix, k)
        return self.learned(prefix, k, stop=stop)


#: How :func:`learned_callbacks` combines the learned draft with prompt lookup.
COMBINE = ("planned", "hybrid", "alone")


def planned_draft(head: FeatureHead, target, *, costs=None, generator: Optional[torch.Generator] = None,
                  tree: bool = False, node_budget: int = 16, tree_top_k: int = 4, beam: int = 4, k_max: int = 8,
                  k_learned: int = 4, lookup=None, **planner_args):
    """A :class:`~specverify.decoding.planner.Planner` over ``lookup`` (default
    :class:`~.transformers.PromptLookupDraft`, deterministic: drafted every round), the
    :class:`LearnedDraft` of ``head`` reading ``target`` (a
    :class:`~.transformers.CausalLMTarget`; gated by the planner, its own ``min_confidence``
    off) and, ``tree=True``, a :class:`LearnedTreeDraft` with deterministic top-k children
    (valued from its history: run only in rounds that choose it). Each round it proposes the
    trusted lookup copy, the learned chain (drafted position by position while its rows say it
    pays), the learned tree, or nothing, whichever has the most expected tokens per unit of
    ``costs`` (:class:`specverify.law.MeasuredCosts`, whose draft names are the candidates':
    ``"lookup"``, ``"learned"``, ``"learned_tree"``, as ``python -m
    specverify.integrations.calibrate --learned`` measures them; None: learned from the decoder's
    timings). ``k_max``: the longest proposal (a lookup copy); ``k_learned``: the learned chain's
    (the tree's depth), whose positions beyond the first few rarely pay. ``planner_args`` go to
    the planner (``explore_every``, ``carry``, ``prior_rate``, ...). Decode with
    ``SpeculativeDecoder(planner, target, k="auto")`` (or an integer ``k`` capping ``k_max``)."""
    from ...decoding.planner import Candidate, Planner
    from ..transformers.drafts import PromptLookupDraft

    for name, value in (("k_max", k_max), ("k_learned", k_learned)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    k_learned = min(k_learned, k_max)
    candidates = [Candidate("lookup", lookup if lookup is not None else PromptLookupDraft(), deterministic=True,
                            k_max=k_max),
                  Candidate("learned", LearnedDraft(head, target, generator=generator), k_max=k_learned)]
    if tree:
        candidates.append(Candidate("learned_tree", LearnedTreeDraft(head, target, node_budget=node_budget,
                                                                     top_k=tree_top_k, beam=beam), k_max=k_learned))
    return Planner(candidates, costs, k_max=k_max, **planner_args)


def learned_callbacks(target_model, head: Optional[FeatureHead] = None, *, combine: str = "planned",
                      greedy: bool = True, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      min_p: float = 0.0, generator: Optional[torch.Generator] = None, tree: bool = False,
                      node_budget: int = 16, tree_top_k: int = 4, beam: int = 4, tree_children: str = "top_k",
                      min_confidence=None, costs=None):
    """``(draft_step, target_step)`` for :class:`specverify.SpeculativeDecoder` with the learned
    draft (``head``, default :func:`load` of the shipped weights) and prompt lookup, combined as
    ``combine`` says:

    - ``"planned"`` (default): :func:`planned_draft`, the planner choosing each round between
      lookup's copy, the learned chain (with ``tree=True`` also the learned tree) and nothing by
      expected tokens per unit of ``costs`` (:class:`specverify.law.MeasuredCosts`, or None:
      learned from the decoder's timings). The planner is also the draft-length policy: decode
      with ``k="auto"`` (its ``k_max``, 8) or an integer ``k`` (the longest proposal).
    - ``"hybrid"``: :class:`HybridDraft`, the fixed rule (a trusted lookup match first, the
      learned draft otherwise, gated by ``min_confidence``).
    - ``"alone"``: the learned draft only (gated by ``min_confidence``).

    Sampling arguments as in :func:`~specverify.integrations.transformers.speculative_callbacks`.
    ``tree=True``: the learned draft is a :class:`LearnedTreeDraft` of up to ``node_budget`` nodes,
    ``tree_top_k`` children per expanded node and ``beam`` expanded nodes per level (the decoder's
    ``k`` is then the tree's depth); ``tree_children``: how a node's children are chosen
    (:class:`LearnedTreeDraft`'s ``children``: ``"top_k"``, deterministic, in which case
    ``generator`` is unused; ``"without_replacement"`` or ``"with_replacement"``, drawn with
    ``generator``, sampling only; the planner's tree has top-k children). ``min_confidence``: the
    learned draft's gate of the fixed rules (:class:`LearnedDraft`, :class:`LearnedTreeDraft`; 0:
    off; a ``{"greedy": c, "sample": c}`` mapping: the mode's; None: :data:`DEFAULT_MIN_CONFIDENCE`'s);
    the planner gates on its own estimates and takes none."""
    from ...law.costs import MeasuredCosts
    from ..transformers.drafts import PromptLookupDraft
    from ..transformers.sampling import Sampling
    from ..transformers.target import CausalLMTarget

    if not isinstance(combine, str) or combine not in COMBINE:
        raise ValueError(f"combine must be one of {', '.join(map(repr, COMBINE))}, got {combine!r}")
    _check_callbacks(head, tree, generator)
    if combine == "planned":
        for name, value, default in (("min_confidence", min_confidence, None), ("tree_children", tree_children, "top_k")):
            if value != default:
                raise ValueError(f"{name} is not used by combine='planned' (the planner gates the learned draft on "
                                 f"its own estimates; its tree has top-k children), got {value!r}: leave it out, "
                                 f"or use combine='hybrid' or 'alone'")
        MeasuredCosts.check(costs)  # before the model and head are loaded
    elif costs is not None:
        raise ValueError(f"costs are used by combine='planned' only, got combine={combine!r} with costs")
    sampling = Sampling(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    gate = None if combine == "planned" else _check_gate(_mode_gate(min_confidence, greedy))
    head = head if head is not None else load(target_model)
    target_step = CausalLMTarget(target_model, sampling)
    if combine == "planned":
        return planned_draft(head, target_step, costs=costs, generator=generator, tree=tree, node_budget=node_budget,
                             tree_top_k=tree_top_k, beam=beam), target_step
    if tree:
        draft_step = LearnedTreeDraft(head, target_step, node_budget=node_budget, top_k=tree_top_k, beam=beam,
                                      min_confidence=gate, children=tree_children, generator=generator)
    else:
        draft_step = LearnedDraft(head, target_step, generator=generator, min_confidence=gate)
    if combine == "hybrid":
        draft_step = HybridDraft(draft_step, PromptLookupDraft())
    return draft_step, target_step
