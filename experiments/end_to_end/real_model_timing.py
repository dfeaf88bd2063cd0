"""Timed generations of SmolLM2-135M: the computation of :mod:`experiments.end_to_end.real_model`.

:func:`run_one` runs one configuration (:mod:`experiments.end_to_end.real_model_configs`) on one
prompt and times it: tokens/s, target passes, acceptance and the decoder's time split (draft /
target / verify / other). :func:`compute` runs every (repeat, prompt, config), configs innermost,
and writes ``results/real_model/real_model.csv`` with ``meta.json`` (versions, git revision,
machine load, the texts); :func:`compute_tree_sweep` writes ``tree_sweep.csv`` and every target
pass into ``tree_passes.csv``. Nothing here draws or prints a table: the tables
(:mod:`~experiments.end_to_end.real_model_tables`) and figures
(:mod:`~experiments.end_to_end.real_model_figures`) read these files only. ``draft_eval`` and
``coupled`` run their own rows with :func:`_load`, :func:`_run_prompts` and :func:`_write_csv`.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

from .. import paths
from .prompt_sets import PROMPTS, chat_ids
from .real_model_configs import (AUTO, CONFIGS, TORCH_LINEARS, TORCH_WARP, _draft_name, _learned, _torch_warp_sampling,
                                 _TorchLinears, sv_callbacks)

EXPERIMENT = "real_model"
CSV_NAME = "real_model.csv"
FIELDS = ["config", "prompt", "repeat", "mode", "draft", "warp", "linears", "temperature", "top_k", "top_p", "k", "node_budget",
          "new_tokens", "seconds", "tokens_per_s",
          "target_passes", "tokens_per_round", "drafted", "accepted", "acceptance", "draft_s", "target_s", "verify_s",
          "other_s", "verify_share", "same_as_generate"]
WARP_CSV = "warp_compare.csv"
SWEEP_CSV = "tree_sweep.csv"
PASSES_CSV = "tree_passes.csv"
BUDGETS = (4, 8, 16, 32, 64)
PASS_FIELDS = ["prompt", "node_budget", "nodes", "seconds"]


class _PassCounter:
    """Counts forward passes of one top-level module (target passes inside HF's generate)."""

    def __init__(self, module):
        self.n = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.n += 1

    def close(self):
        self._handle.remove()


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
               k=p["k_tree"] if tree and "lookup" in config else (p["k_lookup"] if "lookup" in config or "_planned" in config
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
        k = p["k_lookup"] if "_planned" in name else row["k"]  # a planner's longest proposal: lookup's K
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
