"""The decoder's callbacks over a ``transformers`` target and a draft, in one call:
:func:`speculative_callbacks`."""

from __future__ import annotations

from typing import Optional

import torch

from ...kernels import _inputs
from .drafts import CausalLMDraft, PromptLookupDraft
from .sampling import Sampling
from .target import CausalLMTarget
from .trees import CausalLMTreeDraft, PromptLookupTreeDraft


def speculative_callbacks(
    target_model,
    draft,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: Optional[torch.Generator] = None,
    tree: bool = False,
    node_budget: int = 16,
):
    """``(draft_step, target_step)`` for :class:`specverify.SpeculativeDecoder`.

    ``draft`` is a causal LM (``torch.nn.Module``, e.g. a smaller model or :func:`early_exit`),
    the string ``"prompt_lookup"``, the string ``"learned"`` (the shipped learned draft for
    SmolLM2-135M and prompt lookup, each round's proposal chosen by the planner: lookup's copy,
    the learned chain, with ``tree=True`` also the learned tree, or nothing;
    :func:`~specverify.integrations.learned_draft.learned_callbacks` with its defaults, costs
    learned from the decoder's timings; pass calibrated costs, or another way of combining the
    two, to ``learned_callbacks`` itself), or any
    ``draft_step`` callable (used as is). ``tree=True``
    makes the model or prompt-lookup draft propose trees of up to ``node_budget`` nodes
    (:class:`CausalLMTreeDraft`, :class:`PromptLookupTreeDraft`; the decoder's ``k`` is then
    their depth) and the target score them in one forward. One
    :class:`Sampling` built from ``greedy, temperature, top_k, top_p, min_p`` is shared by the target
    and a model draft. ``generator`` drives the draft's own draws (not the verification's: give
    the decoder its own generator).

    Accepted types: ``target_model`` a ``transformers`` causal LM; ``greedy`` and ``tree`` bools
    (a string such as ``"False"`` raises a TypeError); ``temperature > 0``, ``top_k >= 0``,
    ``0 < top_p <= 1`` and ``0 <= min_p < 1`` numbers; ``generator`` a ``torch.Generator`` or
    ``None``; ``node_budget`` a positive integer. The target carries ``vocab_size`` and both model
    callbacks ``greedy``: a decoder whose ``greedy`` differs refuses them when it is built.

    Thread-safety: the pair follows one sequence; a second thread calling a callback while the
    first is inside it gets a RuntimeError saying each thread needs its own callbacks. Call this
    function once per thread (the models' weights are shared, not copied).

    Recovery: an exception or ``KeyboardInterrupt`` inside a callback (in a forward, say) drops
    that callback's KV cache; the next call rebuilds it, and its output is an uninterrupted run's.
    """
    _inputs.flag(tree, "tree")
    if isinstance(draft, str) and draft == "learned":  # its own module builds the target and the draft
        from ..learned_draft import learned_callbacks

        return learned_callbacks(target_model, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                                 min_p=min_p, generator=generator, tree=tree, node_budget=node_budget)
    sampling = Sampling(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    target_step = CausalLMTarget(target_model, sampling)
    if isinstance(draft, torch.nn.Module):
        draft_step = CausalLMTreeDraft(draft, node_budget) if tree else CausalLMDraft(draft, sampling, generator)
    elif isinstance(draft, str):
        if draft != "prompt_lookup":
            raise ValueError(f"unknown draft {draft!r}: pass a model, 'prompt_lookup', 'learned' or a callable")
        draft_step = PromptLookupTreeDraft(node_budget) if tree else PromptLookupDraft()
    elif callable(draft):
        draft_step = draft
    else:
        raise TypeError(f"draft must be a model, 'prompt_lookup', 'learned' or a callable, got {type(draft).__name__}")
    return draft_step, target_step
