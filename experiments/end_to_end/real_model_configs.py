"""The configurations :mod:`experiments.end_to_end.real_model` times: what each name runs.

- ``hf_greedy``            plain ``model.generate(do_sample=False)``
- ``hf_greedy_torchlinears`` the same with torch's own ``nn.Linear`` forwards (see ``--linears``)
- ``hf_prompt_lookup``     HF's prompt lookup, ``generate(prompt_lookup_num_tokens=k)``, greedy
- ``hf_assisted_ee``       HF's assisted generation with the early-exit draft, greedy
- ``sv_greedy_lookup``     specverify greedy, prompt-lookup draft
- ``sv_greedy_lookup_tree`` specverify greedy, multi-candidate prompt-lookup tree (one target pass per tree)
- ``sv_greedy_ee``         specverify greedy, early-exit draft (first N layers + norm + lm_head)
- ``sv_greedy_ee_tree``    specverify greedy, early-exit top-k tree (EAGLE-2-style reranking)
- ``hf_sample``            plain ``generate(do_sample=True)`` with the same warping
- ``hf_sample_torchlinears`` the same with torch's own ``nn.Linear`` forwards
- ``sv_sample_lookup``     specverify sampling, prompt-lookup draft (``accept(p, None, t)``)
- ``sv_sample_lookup_tree`` specverify sampling, prompt-lookup tree (``accept_tree(p, None, t, parents)``)
- ``sv_sample_ee``         specverify sampling, early-exit draft
- ``sv_sample_ee_block``   the same with block verification (``accept_block``): same output law,
                           more tokens per target pass from the same stochastic draft

The learned-draft configs (run by :mod:`experiments.end_to_end.draft_eval`, which loads the draft
into ``p["_head"]``): ``sv_greedy_learned``, ``sv_sample_learned`` (the chain
:class:`~specverify.integrations.learned_draft.LearnedDraft`), ``_hybrid`` in place of
``_learned`` (prompt lookup first), and ``sv_greedy_learned_tree``, ``sv_sample_learned_tree``
(:class:`~specverify.integrations.learned_draft.LearnedTreeDraft`, ``node_budget`` nodes, depth
``k_learned``, top-k children; ``sv_sample_learned_drawn_tree`` / ``sv_sample_learned_iid_tree``:
children drawn without / with replacement, verified by the stochastic tree rules);
``LEARNED_CONFIGS`` lists them. Every learned draft is gated at
``p["min_confidence"]`` (a number, ``{"greedy": c, "sample": c}``, or None: :data:`~specverify.integrations.learned_draft.DEFAULT_MIN_CONFIDENCE` of the mode);
``_ungated`` (``sv_greedy_learned_ungated``, ``sv_sample_learned_ungated``) turns the gate off.
``_planned`` (``sv_greedy_planned``, ``sv_sample_planned``, ``_block``, ``_tree``): each round the
:class:`~specverify.decoding.planner.Planner` of
:func:`~specverify.integrations.learned_draft.learned_callbacks` proposes prompt lookup's copy,
the learned chain (``_tree``: or the learned tree) or nothing, up to ``k_lookup`` tokens, with
the costs of the mode in ``p["_costs"]`` (``{"greedy": costs, "sample": costs}``, each calibrated or
None: learned online; ``_online``: always learned online, as ``learned_callbacks`` does by default). A row's ``won`` counts the rounds each
candidate won.

A ``_auto`` suffix (``sv_greedy_lookup_tree_auto``, ``sv_sample_lookup_tree_auto``) has
:class:`~specverify.decoding.adaptive.AdaptiveK` choose each round's tree depth (up to ``--k-tree``, 0
allowed) from the rounds before, pricing a round by the nodes its trees score; one policy per
config is carried across the run's prompts and repetitions, as a server keeps one.

The ``*_torchlinears`` configs run plain ``generate`` with torch's own ``nn.Linear`` forwards beside
the model's :func:`specverify.linear` layers (``--linears``); a ``_torchwarp`` twin makes its target
and draft rows with the sort-based torch warp the adapter used before ``sv.warp``
(``integrations.transformers.warp``; ``--warp-compare``, :data:`WARP_PAIRS`).

:func:`make_params` holds a run's parameters (``p``); :func:`sv_callbacks` builds a specverify
config's draft and target callbacks; :mod:`experiments.end_to_end.real_model_timing` runs them.
"""

from __future__ import annotations

CONFIGS = ["hf_greedy", "hf_greedy_torchlinears", "hf_prompt_lookup", "hf_assisted_ee", "sv_greedy_lookup", "sv_greedy_lookup_tree",
           "sv_greedy_ee", "sv_greedy_ee_tree", "hf_sample", "hf_sample_torchlinears", "sv_sample_lookup", "sv_sample_lookup_tree",
           "sv_sample_ee", "sv_sample_ee_block"]
LEARNED_CONFIGS = ["sv_greedy_learned", "sv_sample_learned", "sv_greedy_learned_ungated", "sv_sample_learned_ungated",
                   "sv_greedy_learned_tree", "sv_sample_learned_tree", "sv_sample_learned_drawn_tree",
                   "sv_sample_learned_iid_tree"]
# How a learned tree's children are chosen, by config infix (LearnedTreeDraft's ``children``); default top-k.
TREE_CHILDREN = {"_drawn_tree": "without_replacement", "_iid_tree": "with_replacement"}
# Warping before (torch / transformers' warpers) and after (specverify's kernels): (before, after).
WARP_PAIRS = [("hf_sample", "hf_sample_svwarp"), ("sv_sample_lookup_torchwarp", "sv_sample_lookup"),
              ("sv_sample_ee_torchwarp", "sv_sample_ee")]
WARP_CONFIGS = [c for pair in WARP_PAIRS for c in pair]
TORCH_WARP = "_torchwarp"  # config suffix: the same config with the sort-based torch warp
TORCH_LINEARS = "_torchlinears"  # config suffix: the same config with torch's own nn.Linear forwards
AUTO = "_auto"  # config suffix: the draft length (a tree's depth) chosen by AdaptiveK each round


def make_params(max_new=64, k_lookup=5, k_ee=3, ee_layers=12, temperature=0.7, top_k=50, top_p=1.0, seed=0,
                k_tree=12, node_budget=16, ee_node_budget=8, linears="specverify", attention="sdpa"):
    return dict(max_new=max_new, k_lookup=k_lookup, k_ee=k_ee, ee_layers=ee_layers,
                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, k_tree=k_tree,
                node_budget=node_budget, ee_node_budget=ee_node_budget, linears=linears, attention=attention)


class _TorchLinears:
    """For the duration of a ``with`` block, the model's linear layers use torch's own forward
    (undoing ``use_fast_linears`` on them, then redoing it)."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.switched = [(m, m.__dict__.pop("forward")) for m in self.model.modules() if "forward" in m.__dict__]

    def __exit__(self, *exc):
        for module, forward in self.switched:
            module.forward = forward


def _torch_warp_sampling(sampling):
    """``sampling`` (an ``integrations.transformers.Sampling``) with its rows made by the
    sort-based torch warp (``integrations.transformers.warp``: temperature, top-k, top-p; no
    min-p) instead of ``sv.warp``: the adapter before issue 15."""
    from specverify.integrations import transformers as adapter

    class TorchWarpSampling(adapter.Sampling):
        def rows(self, logits):
            if self.greedy:
                return logits.float()
            return adapter.warp(logits, self.temperature, self.top_k, self.top_p)

    if sampling.min_p > 0.0:
        raise ValueError("the torch warp has no min-p")
    return TorchWarpSampling(greedy=sampling.greedy, temperature=sampling.temperature, top_k=sampling.top_k,
                             top_p=sampling.top_p)


def _learned(config) -> bool:
    """Whether a config drafts with the learned draft (``_learned``, ``_hybrid``, ``_planned`` configs)."""
    return "_learned" in config or "_hybrid" in config or "_planned" in config


def _draft_name(config, p) -> str:
    if "lookup" in config:
        return "lookup"
    if "_hybrid" in config:
        return "lookup+learned"
    if "_planned" in config:
        return "planner(lookup, learned" + (", learned tree)" if config.endswith("_tree") else ")")
    if "_learned" in config:
        return "learned"
    return "early_exit_%d" % p["ee_layers"] if "ee" in config else ""


def sv_callbacks(config, model, draft_model, p, greedy: bool, tree: bool, node_budget: int):
    """``(draft_step, target_step)`` of a specverify config (``config`` without its ``_torchwarp`` /
    ``_auto`` suffixes): the learned draft (``p["_head"]``, loaded by the caller; ``_learned``,
    ``_hybrid``, a ``_tree`` of them with :class:`~specverify.integrations.learned_draft.LearnedTreeDraft`),
    prompt lookup or the early-exit ``draft_model``."""
    import torch

    from specverify.integrations.transformers import speculative_callbacks

    sample = dict(temperature=p["temperature"], top_k=p["top_k"], top_p=p["top_p"])
    generator = torch.Generator().manual_seed(p["seed"])
    if "_planned" in config:  # the planner over lookup, the learned chain (and tree): the decoder's k caps it
        from specverify.integrations.learned_draft import learned_callbacks

        # one planner per config over the run, as a user keeps one (p["_policies"], set by _run_prompts):
        # what it learned of the learned draft carries from prompt to prompt, lookup's starts over
        policies = p.get("_policies", {})
        if config not in policies:
            # each mode's calibration (draft_eval.planner_cost_files); _online: learned from the timings
            costs = None if "_online" in config else (p.get("_costs") or {}).get("greedy" if greedy else "sample")
            policies[config] = learned_callbacks(model, p["_head"], costs=costs, greedy=greedy,
                                                 generator=generator, tree=config.endswith("_tree"),
                                                 node_budget=p["node_budget"], **sample)
        return policies[config]
    if _learned(config):  # the learned draft, alone or after prompt lookup, a chain or a tree
        from specverify.integrations.learned_draft import learned_callbacks

        gate = 0.0 if "_ungated" in config else p.get("min_confidence")  # per mode or None: learned_callbacks resolves it
        children = next((v for infix, v in TREE_CHILDREN.items() if infix in config), "top_k")
        combine = "hybrid" if "hybrid" in config else "alone"
        return learned_callbacks(model, p["_head"], combine=combine, greedy=greedy, generator=generator, tree=tree,
                                 node_budget=node_budget, tree_children=children, min_confidence=gate, **sample)
    draft = "prompt_lookup" if "lookup" in config else draft_model
    return speculative_callbacks(model, draft, greedy=greedy, generator=generator, tree=tree,
                                 node_budget=node_budget, **sample)
