"""real_model's figures, drawn from its cached CSVs only (matplotlib, ``Agg``).

:func:`plot` draws ``media/real_model.png`` (the speed-up of every config per prompt, and where a
specverify config's time goes) from ``real_model.csv``; :func:`plot_tree_sweep` draws
``media/real_model_tree.png`` (tokens per pass and speed-up against the node budget, time per
target pass against the node count) from ``tree_sweep.csv`` and ``tree_passes.csv``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import paths
from .real_model_tables import per_prompt_speedup, read, summarize, sweep_summary
from .real_model_timing import PASSES_CSV

FIGURE = "real_model.png"
TREE_FIGURE = "real_model_tree.png"


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
