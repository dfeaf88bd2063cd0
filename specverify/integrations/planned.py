"""The planner over prompt lookup and the learned draft: each round proposes the trusted lookup
copy, the learned chain (drafted position by position while its rows say it pays), the learned
tree, or nothing, whichever has the most expected tokens per unit of measured cost
(:class:`specverify.decoding.planner.Planner`).

::

    costs = law.load_costs(law.cost_cache_path("smollm2", threads=1))  # None: learned online
    draft, target = planned_callbacks(model, costs=costs, greedy=True)
    SpeculativeDecoder(draft, target, k="auto", greedy=True).generate(ids, max_new=128)

The costs' draft names are the candidates' names: ``"lookup"``, ``"learned"``, ``"learned_tree"``
(what ``python -m specverify.integrations.calibrate --learned`` measures).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..decoding.planner import Candidate, Planner
from ..law.costs import MeasuredCosts
from .learned_draft import FeatureHead, LearnedDraft, LearnedTreeDraft, load
from .transformers import CausalLMTarget, PromptLookupDraft, Sampling

__all__ = ["planned_draft", "planned_callbacks"]


def planned_draft(head: FeatureHead, target: CausalLMTarget, *, costs: Optional[MeasuredCosts] = None,
                  generator: Optional[torch.Generator] = None, tree: bool = False, node_budget: int = 16,
                  tree_top_k: int = 4, beam: int = 4, k_max: int = 8, k_learned: int = 4,
                  lookup: Optional[PromptLookupDraft] = None, **planner_args) -> Planner:
    """A :class:`~specverify.decoding.planner.Planner` over ``lookup`` (default
    :class:`~.transformers.PromptLookupDraft`, deterministic: drafted every round), the
    :class:`~.learned_draft.LearnedDraft` of ``head`` reading ``target`` (gated by the planner,
    its own ``min_confidence`` off) and, ``tree=True``, a :class:`~.learned_draft.LearnedTreeDraft`
    with deterministic top-k children (valued from its history: run only in rounds that choose
    it). ``k_max``: the longest proposal (a lookup copy); ``k_learned``: the learned chain's (the
    tree's depth), whose positions beyond the first few rarely pay. ``planner_args`` go to the
    planner (``explore_every``, ``carry``, ``prior_rate``, ...)."""
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


def planned_callbacks(target_model, head: Optional[FeatureHead] = None, *, costs: Optional[MeasuredCosts] = None,
                      greedy: bool = True, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      min_p: float = 0.0, generator: Optional[torch.Generator] = None, **draft_args):
    """``(planner, target_step)`` for ``SpeculativeDecoder(planner, target_step, k="auto")``:
    :func:`planned_draft` over the shipped learned draft (``head``, default :func:`~.learned_draft.load`)
    and a :class:`~.transformers.CausalLMTarget` sampling as the arguments say (as
    :func:`~.transformers.speculative_callbacks`). ``costs``: measured
    (:func:`specverify.law.load_costs`), or None to learn them from the decoder's timings."""
    head = head if head is not None else load(target_model)
    sampling = Sampling(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    target_step = CausalLMTarget(target_model, sampling)
    return planned_draft(head, target_step, costs=costs, generator=generator, **draft_args), target_step
