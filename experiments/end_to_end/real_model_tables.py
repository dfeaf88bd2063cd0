"""real_model's results as numbers and text: summaries of its cached CSVs, read only.

:func:`read` loads a CSV that :mod:`experiments.end_to_end.real_model_timing` wrote;
:func:`summarize` pools each config's runs over prompts (tokens/s, speed-up over plain
``generate``, tokens per pass, acceptance, the time split); :func:`per_prompt_speedup` and
:func:`pooled_rates` give each (config, prompt)'s ratio and rate (repeats pooled: tokens over
seconds); :func:`warp_summary` pairs each warping config with its twin (``--warp-compare``);
:func:`sweep_summary` the node-budget sweep (``--tree-sweep``). :func:`table` and
:func:`warp_table` are the text tables ``python -m experiments.end_to_end.real_model`` prints.
Nothing here loads a model.
"""

from __future__ import annotations

import csv

from .real_model_configs import CONFIGS, WARP_CONFIGS, WARP_PAIRS


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
