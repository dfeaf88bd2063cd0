"""The learned draft on held-out text: acceptance per position against the law, and speed end to end.

``python -m experiments.end_to_end.draft_eval`` loads SmolLM2-135M-Instruct and the shipped learned draft
(:mod:`specverify.integrations.learned_draft`, trained by :mod:`experiments.end_to_end.train_draft`
on package documentation and code, never on these prompts) and, on the project's held-out prompt
sets (:data:`experiments.end_to_end.prompt_sets.HELDOUT_PROMPTS`, ``HELDOUT_PROMPTS_2``; open text,
formats, code, chat):

1. **Acceptance per position**: every round of a greedy and a sampling decoder with the learned
   draft alone (``K = --k``) is recorded: greedy, whether draft token ``i`` is the target's argmax
   given the drafts before it; sampling (temperature 0.7, top-p 0.9), the overlap
   ``a_i = sum_v min(p_i(v), q_i(v))`` of the warped target and draft rows. The measured rates
   give :func:`specverify.law.expected_tokens_per_round` (token-wise) and
   :func:`specverify.law.block_gain` (block verification), compared with the tokens per pass
   measured.
2. **Speed**: ``tokens/s`` of every config of :data:`CONFIGS`, side by side (configs innermost per
   prompt, so machine load hits all alike), one torch thread (``--threads``), the same model with
   ``use_fast_linears`` for every row, greedy outputs compared with plain ``generate``.

Results: ``results/draft_eval/<key>/`` (``acceptance.csv``, ``runs.csv``, ``meta.json``);
``media/learned_draft.md`` (tables with machine, date, command) and ``media/learned_draft.png``
(:func:`plot`) are written from them (``--table-only`` rewrites both from the cached run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

from .. import paths
from ..cli import number
from . import prompt_sets, real_model_configs, real_model_figures, real_model_tables, real_model_timing

EXPERIMENT = "draft_eval"
CONFIGS = ["hf_greedy", "hf_prompt_lookup", "hf_assisted_ee", "sv_greedy_lookup", "sv_greedy_learned_ungated",
           "sv_greedy_learned", "sv_greedy_learned_tree", "sv_greedy_hybrid", "sv_greedy_hybrid_auto",
           "hf_sample", "sv_sample_lookup", "sv_sample_learned_ungated", "sv_sample_learned", "sv_sample_learned_block",
           "sv_sample_learned_tree", "sv_sample_learned_drawn_tree", "sv_sample_learned_iid_tree",
           "sv_sample_hybrid_block", "sv_sample_hybrid_block_auto", "sv_greedy_planned", "sv_greedy_planned_tree",
           "sv_sample_planned", "sv_sample_planned_block", "sv_sample_planned_tree", "sv_greedy_planned_online",
           "sv_sample_planned_online", "sv_sample_planned_online_block", "sv_greedy_planned_online_tree",
           "sv_sample_planned_online_tree"]
PROMPT_SETS = {"heldout": prompt_sets.HELDOUT_PROMPTS, "heldout2": prompt_sets.HELDOUT_PROMPTS_2,
               "tuning": None}  # built by tuning_prompts
TABLE = "learned_draft.md"
FIGURE = "learned_draft.png"
ROUND_PARTS = ("draft_s", "target_s", "verify_s", "other_s")  # a decoder's time, split (the table's shares)
# train_draft's prompts come in seeded chunks from 0 up; this one is far past any training run (the shipped
# draft was trained on chunks 0-4), so the answers can grow without reaching the tuning prompts.
TUNING_CHUNK = 999


def tuning_prompts(n: int = 10, seed: int = 0):
    """``n`` prompts of the training kind that the shipped draft never saw (train_draft's prompt
    chunk :data:`TUNING_CHUNK`; training would reach it only from ``--prompts`` 640,000 on): where
    the gate's threshold is chosen, never on the held-out sets it is reported on."""
    import random

    from .draft_prompts import prompt_chunk

    prompts, _ = prompt_chunk(TUNING_CHUNK, seed, 6000)
    return {f"p{i}": text for i, text in enumerate(random.Random(seed + 1).sample(prompts, n))}


def teacher_forced(model, tokenizer, head, prompts, max_new: int = 64, steps: int = 3, seed: int = 0, answers=None,
                   context_rows: bool = True):
    """The draft's teacher-forced top-1 on the target's own greedy answers to ``prompts`` (a list
    of strings), at answer positions only, and the token ablation that shows whether it reads its
    token.

    The target answers (:func:`~experiments.end_to_end.draft_data.generate_shard`, its hidden
    states kept); then, as in training (:func:`~experiments.end_to_end.draft_training.draft_losses`),
    ``top1[s]`` is the share of answer positions where draft step ``s + 1`` (fed its own features
    from the steps before, the true tokens) has the target's argmax (over the whole vocabulary:
    outside the draft's rows is a miss) as its own. The ablation
    feeds each first-step pair ``(h_t, x_{t+1})`` once more with ``x_{t+1}`` replaced by a token
    drawn uniformly from the draft's vocabulary (``seed``), the pair alone (the true pairs before
    it as context): ``random_top1``. Returns a dict with ``top1 [steps]``, ``random_top1``,
    ``positions``, ``vocab_coverage`` (the share of the answers' tokens the draft can propose), ``only_true`` / ``only_random`` (positions right with one token and not the
    other: a token the draft ignores makes them equally likely), ``answers`` (per prompt, the answer's
    tokens) and ``first_right`` (per prompt, per answer token: 1 where step 1 drafted it; see
    :func:`round_starts`). ``context_rows``: the draft
    proposes from its trained rows and the tokens of the call's prefix, as
    :class:`~specverify.integrations.learned_draft.LearnedDraft` does by default (False: the
    trained rows only); ``vocab_coverage`` counts the same rows. ``answers``: the target's answers
    to ``prompts`` made before (:func:`~experiments.end_to_end.draft_data.generate_shard`), to
    judge several drafts on the same ones.
    """
    import torch

    from . import draft_training
    from .draft_data import generate_shard

    rows = answers if answers is not None else generate_shard(model, tokenizer, prompts, max_new, sample=False, seed=seed)
    header = tokenizer(draft_training.ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
    seqs = [(t, h, draft_training.answer_start(t, header)) for t, h in rows]
    tokens, hidden, learn = draft_training._pad(seqs, max(h.shape[0] for _, h, _ in seqs))
    with torch.no_grad():
        full_head = model.get_output_embeddings().weight.detach()  # [V, d]
        first = draft_training.first_positions(tokens, full_head.shape[0]) if context_rows else None  # [B, V]
        _, stats = draft_training.draft_losses(head, tokens, hidden, learn, noise=0.0, steps=steps, full_head=full_head,
                                               first=first)
        n0 = hidden.shape[1] - 1
        feats = hidden[:, :-1]
        f, z, past = head(feats, tokens[:, 1 : n0 + 1], torch.arange(n0))
        generator = torch.Generator().manual_seed(seed)
        swapped = head.vocab_ids[torch.randint(head.vocab_ids.numel(), tokens[:, 1 : n0 + 1].shape, generator=generator)]
        mask = torch.zeros(n0, 2 * n0, dtype=torch.bool)  # row j: the true pairs before j, and itself
        mask[:, :n0] = torch.ones(n0, n0, dtype=torch.bool).tril(-1)
        mask[torch.arange(n0), n0 + torch.arange(n0)] = True
        f_random, z_random, _ = head(feats, swapped, torch.arange(n0), past=past, mask=mask)
        weight = learn[:, 1:]  # [B, n0]: pair j's label x_{j+2} is an answer token
        b, j = weight.nonzero(as_tuple=True)
        best = draft_training.argmax_over_rows(head.final_norm(hidden[:, 1:][weight]), full_head)  # [n]
        if context_rows:
            drafted, drafted_random = (draft_training.argmax_over_rows(head.final_norm(x[weight]), full_head,
                                                                       head.vocab_ids, first, b, j + 1)
                                       for x in (f, f_random))
        else:
            drafted, drafted_random = head.vocab_ids[z[weight].argmax(-1)], head.vocab_ids[z_random[weight].argmax(-1)]
    right, right_random = drafted == best, drafted_random == best
    n = int(weight.sum())
    # the ceiling on any draft position's top-1: answer tokens in the trained rows (or earlier in the sequence)
    inside = []
    for b_, (t, _, start) in enumerate(seqs):
        t = t.long()
        known = torch.isin(t[start:], head.vocab_ids)
        if context_rows:
            known |= first[b_, t[start:]] < torch.arange(start, t.numel())
        inside.append(known)
    inside = float(torch.cat(inside).float().mean())
    first_right = [[] for _ in seqs]  # per sequence, answer token by answer token: whether step 1 drafted it
    for b_, right_ in zip(b.tolist(), right.tolist()):  # (b, j) in row-major order: j ascending
        first_right[b_].append(int(right_))
    return {"top1": [stats[f"top{s + 1}"] for s in range(steps)], "random_top1": float(right_random.sum()) / max(1, n),
            "vocab_coverage": inside,
            "positions": n, "only_true": int((right & ~right_random).sum()), "only_random": int((right_random & ~right).sum()),
            "first_right": first_right, "answers": [t[start:].tolist() for t, _, start in seqs]}


def heldout_metrics(model, tokenizer, head, max_new: int = 96, steps: int = 4) -> dict:
    """:func:`teacher_forced` on the two held-out prompt sets (``heldout``, ``heldout2``: the
    project's, never trained or tuned on), rounded: what a draft file's metadata says of it."""
    prompts = [text for name in ("heldout", "heldout2") for text in PROMPT_SETS[name].values()]
    r = teacher_forced(model, tokenizer, head, prompts, max_new, steps)
    return {"prompt_sets": "heldout,heldout2", "max_new": max_new, "positions": r["positions"],
            "top1": [round(x, 4) for x in r["top1"]], "random_top1": round(r["random_top1"], 4),
            "vocab_coverage": round(r["vocab_coverage"], 4)}


class _Recorder:
    """Callbacks that pass through and keep each round's ``(tokens [m], draft rows [m, V] or None,
    target rows [m + 1, V])``."""

    def __init__(self, draft_step, target_step):
        self.draft_step, self.target_step = draft_step, target_step
        # per round; logits: the draft's last_logits [m, V_r + C] if it has them, row_ids the tokens of their columns
        self.rounds, self.logits, self.row_ids = [], [], []
        self._drafted = self._logits = None

    def draft(self, prefix, k):
        self._drafted = self.draft_step(prefix, k)
        self._logits = getattr(self.draft_step, "last_logits", None)
        self._row_ids = getattr(self.draft_step, "row_ids", None)
        return self._drafted

    def target(self, prefix, proposed, parents=None):
        rows = self.target_step(prefix, proposed, parents)
        m = proposed.numel()  # the decoder may verify fewer than were drafted (the max_new cap)
        probs = self._drafted[1]
        self.rounds.append((proposed.clone(), None if probs is None else probs[:m].clone(), rows.clone()))
        self.logits.append(None if self._logits is None else self._logits[:m].clone())
        self.row_ids.append(self._row_ids)
        return rows


def gate_statistics(tokens, probs, logits, row_ids):
    """The gate's ``c_i = q_1(t_1) ... q_{i-1}(t_{i-1}) max q_i`` at every drafted position
    (:class:`~specverify.integrations.learned_draft.LearnedDraft`): ``q`` from ``probs [m, V]``
    (sampling) or the softmax of ``logits [m, V_r + C]`` over ``row_ids`` (greedy; the draft's
    rows in its order)."""
    import numpy as np
    import torch

    from specverify.decoding.adaptive import draft_confidences

    if probs is not None:
        rows, ids = probs.double(), tokens  # [m, V], full-vocabulary ids
    else:
        column = (row_ids[None, :] == tokens[:, None]).long().argmax(1)  # [m]: each token's column
        rows, ids = torch.softmax(logits.double(), -1), column  # [m, V_r + C]
    top = (rows.max(1).values / rows.sum(1)).numpy()  # [m] max q_i
    before = np.cumprod(np.concatenate([[1.0], draft_confidences(rows, ids)]))[:-1]  # [m] q_1(t_1) .. q_{i-1}(t_{i-1})
    return (before * top).tolist()


def acceptance(model, head, ids, k: int, max_new: int, sample: dict, eos, seed: int):
    """Per-round records of the learned draft (alone) on every prompt, greedy and sampling.

    Returns ``(records, coverage, continuations)``: a list of dicts ``mode, prompt, round,
    position, reached, value`` (greedy: argmax match; sampling: the overlap ``a_i``), ``emitted``
    (tokens the round emitted), ``gate`` (the gate's statistic :func:`gate_statistics`; the draft
    runs ungated) and ``start`` (the continuation's index of the round's first draft token); the
    share of the target's greedy continuations' tokens the draft could propose (in its trained rows
    or earlier in the sequence: its context rows); and those continuations by prompt name (the
    new tokens, for :func:`round_starts`).
    """
    import torch

    import specverify as sv
    from specverify.integrations.learned_draft import learned_callbacks

    records, inside, generated, continuations = [], 0, 0, {}
    vocab = set(head.vocab_ids.tolist())
    for mode in ("greedy", "sample"):
        for name, prompt in ids.items():
            greedy = mode == "greedy"
            d, t = learned_callbacks(model, head, combine="alone", greedy=greedy, min_confidence=0.0,
                                     generator=torch.Generator().manual_seed(seed), **({} if greedy else sample))
            rec = _Recorder(d, t)
            dec = sv.SpeculativeDecoder(_Mode(rec.draft, greedy), _Mode(rec.target, greedy), k=k, greedy=greedy,
                                        generator=torch.Generator().manual_seed(seed + 1), eos_token_id=eos)
            out = dec.generate(prompt, max_new)
            if greedy:  # the target's own greedy continuation (greedy output == the target's)
                new = continuations[name] = out[prompt.numel():].tolist()
                seen = set(prompt.tolist())  # context rows: a token of the prefix is proposable
                for t in new:
                    inside += t in vocab or t in seen
                    seen.add(t)
                generated += len(new)
            start = 0  # the continuation's index of the round's first drafted token
            for r, ((tokens, probs, rows), logits, row_ids, emitted) in enumerate(
                    zip(rec.rounds, rec.logits, rec.row_ids, dec.stats.emitted)):
                gates = gate_statistics(tokens, probs, logits, row_ids)
                for i in range(tokens.numel()):
                    if greedy:
                        value = float(int(torch.argmax(rows[i])) == int(tokens[i]))
                    else:
                        p = rows[i].double() / rows[i].double().sum()
                        value = float(torch.minimum(p, probs[i].double()).sum())
                    records.append(dict(mode=mode, prompt=name, round=r, position=i + 1,
                                        reached=int(i < emitted), value=value, emitted=emitted,
                                        gate=round(gates[i], 6), start=start))
                start += emitted
    return records, inside / max(1, generated), continuations


def round_starts(records, names, answers, first_right, continuations) -> dict:
    """Why decoding's position 1 accepts less than teacher-forced step 1 reads: where rounds start.

    A round's first draft token sits right after the previous round's end, mostly where the draft
    had just failed: a harder position than the average answer token. On each prompt whose greedy
    decoding (``continuations``, :func:`acceptance`) is the teacher-forced answer (``answers``,
    ``first_right``: :func:`teacher_forced`; ``names`` its prompts' names in order), the greedy
    records' position-1 acceptance at the rounds' starts, teacher-forced step 1 at those same
    answer positions (equal, up to the two runs' arithmetic) and at all of the prompt's answer
    positions."""
    import numpy as np

    decoded, forced, every, aligned = [], [], [], 0
    for name, answer, right in zip(names, answers, first_right):
        cont = continuations.get(name)
        n = min(len(answer), len(right))
        if cont is None or cont[:n] != answer[:n]:
            continue
        aligned += 1
        every += right[:n]
        for r in records:
            if r["mode"] == "greedy" and r["prompt"] == name and r["position"] == 1 and r["start"] < n:
                decoded.append(r["value"])
                forced.append(right[r["start"]])
    mean = lambda x: float(np.mean(x)) if x else float("nan")  # noqa: E731
    return {"aligned_prompts": aligned, "round_starts": len(decoded), "decoded_at_starts": mean(decoded),
            "forced_at_starts": mean(forced), "forced_everywhere": mean(every), "answer_positions": len(every)}


class _Mode:
    """A callable with the ``greedy`` attribute the decoder checks."""

    def __init__(self, fn, greedy):
        self.fn, self.greedy = fn, greedy

    def __call__(self, *args):
        return self.fn(*args)


def acceptance_summary(records, k: int):
    """Per mode: the rate at each position (over rounds that reached it), the law's tokens per pass
    from those rates, the measured tokens per pass; for sampling, block's predicted gain too."""
    import numpy as np

    from specverify import law

    out = {}
    for mode in ("greedy", "sample"):
        rs = [r for r in records if r["mode"] == mode]
        rates = []
        for i in range(1, k + 1):
            vals = [r["value"] for r in rs if r["position"] == i and r["reached"]]
            rates.append(float(np.mean(vals)) if vals else float("nan"))
        rounds = {(r["prompt"], r["round"]): r["emitted"] for r in rs}
        measured = sum(rounds.values()) / max(1, len(rounds))
        a = np.array([x for x in rates if x == x])
        out[mode] = dict(rates=rates, predicted=float(law.expected_tokens_per_round(a)) if a.size else float("nan"),
                         measured=measured, rounds=len(rounds), gate=gate_calibration(rs))
    return out


GATE_BINS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)  # an edge at the default gate, 0.2


#: The warp of the sampling rows (the acceptance measurement's and the timed configs').
SAMPLE = dict(temperature=0.7, top_k=0, top_p=0.9)


def calibrate_args(mode: str, threads: int) -> str:
    """The arguments with which ``python -m specverify.integrations.calibrate`` writes the costs
    :func:`planner_cost_files` reads for ``mode`` ("greedy" or "sample", the warp :data:`SAMPLE`)."""
    args = f"--learned --fast-linears --threads {threads}"
    if mode == "sample":
        args += " --sample " + " ".join(f"--{name.replace('_', '-')} {value}" for name, value in SAMPLE.items())
    return args


def planner_cost_files(threads: int):
    """``({"greedy": costs, "sample": costs}, {mode: where they came from})``: each mode's calibrated
    costs (:func:`specverify.integrations.calibrate.cost_key`) for ``threads`` threads on the fast
    linears (every row runs on them). A sampling calibration that is missing or was made with
    another warp than :data:`SAMPLE` is replaced by the greedy one (as before calibrations had
    modes), and the table says so; no calibration at all: None, learned online."""
    from specverify import law
    from specverify.integrations.calibrate import cost_key

    costs, sources = {}, {}
    for mode in ("greedy", "sample"):
        path = law.cost_cache_path(cost_key("smollm2", fast_linears=True, sample=mode == "sample"), threads=threads)
        found = law.load_costs(path)
        if found is not None and mode == "sample" and found.meta.get("sampling") != SAMPLE | {"min_p": 0.0}:
            found = None  # timed with another warp: not this run's costs
        if found is None and mode == "sample" and costs["greedy"] is not None:
            costs[mode], sources[mode] = costs["greedy"], sources["greedy"] + " (no sampling calibration)"
            continue
        costs[mode] = found
        sources[mode] = f"{path} (`python -m specverify.integrations.calibrate {calibrate_args(mode, threads)}`)" \
            if found is not None else "learned online"
    return costs, sources


def _costs_text(planner_costs) -> str:
    """The table's words for the planner's costs (a run's meta; older runs stored one string)."""
    if isinstance(planner_costs, str):
        return planner_costs
    return "; ".join(f"{mode}: {source}" for mode, source in planner_costs.items())


def gate_calibration(records):
    """Per bin of the gate statistic: ``(lo, hi, positions, realized)``, ``realized`` the mean of
    ``reached * value`` (greedy: the position was reached and accepted; sampling: reached, times
    the overlap), what the statistic estimates."""
    out = []
    for lo, hi in zip(GATE_BINS[:-1], GATE_BINS[1:]):
        hits = [r["reached"] * r["value"] for r in records if lo <= r["gate"] < hi or (hi == 1.0 and r["gate"] == 1.0)]
        out.append((lo, hi, len(hits), sum(hits) / len(hits) if hits else float("nan")))
    return out


def _write_csv(path, rows):
    if rows:  # every row's columns (a planner's rows have "won")
        real_model_timing._write_csv(path, rows, list(dict.fromkeys(key for row in rows for key in row)))


def write_table(summary, speed, meta, out_path, command):
    """``media/learned_draft.md``: acceptance per position vs the law, and the speed table."""
    info = meta["draft"]  # the metadata of the draft file that was run
    lines = ["# The learned draft on held-out prompts", "",
             f"Machine: {_cpu_name()}, {os.cpu_count()} cores ({meta['platform']}), {_threads(meta)}, {meta['utc'][:10]}; "
             f"command: `{command}`; prompts: {', '.join(meta['prompt_sets'])} ({meta['n_prompts']} held-out chat prompts, "
             f"{meta['max_new']} new tokens, K = {meta['k']}).",
             f"Draft: {info.get('tokens', '?')} training tokens{_by_kind(info)}, reduced vocabulary "
             f"{info.get('params', {}).get('vocab', '?')} (trained rows cover "
             + (f"{info['vocab_coverage_answers']} of the training answers' tokens" if "vocab_coverage_answers" in info
                else f"{info.get('vocab_coverage', '?')} of the training tokens")
             + (f"; the rows proposed from, {summary['greedy']['vocab_coverage']:.3f} of the target's greedy answers "
                "to these prompts"
                if "vocab_coverage" in summary.get("greedy", {}) else "")
             + f"); trained {info['steps']} steps of {info['params']['batch']} sequences ({info['params']['epochs']} "
             "epochs) by `python -m experiments.end_to_end.train_draft`.", "",
             "## Acceptance per draft position (rounds that reached it)", "",
             "| mode | " + " | ".join(f"pos {i + 1}" for i in range(meta["k"])) + " | law: tokens/pass | measured tokens/pass |",
             "|---|" + "--:|" * (meta["k"] + 2)]
    for mode, s in summary.items():
        if "rates" not in s:
            continue
        lines.append(f"| {mode} | " + " | ".join(f"{x:.3f}" for x in s["rates"]) +
                     f" | {s['predicted']:.2f} | {s['measured']:.2f} |")
    lines += ["", "Greedy: the rate at which draft token i equals the target's argmax; sampling: the overlap "
              "sum(min(p, q)) of the warped rows (temperature 0.7, top-p 0.9).", ""]
    forced = summary.get("teacher_forced")
    if forced:
        steps = len(forced["top1"])
        lines += ["## Teacher-forced top-1, and whether the draft reads its token", "",
                  f"On the target's own greedy answers to the same prompts ({forced['positions']} answer positions): "
                  "draft step i fed the true tokens and its own features from the steps before "
                  "(`draft_eval.teacher_forced`), and the first step once more with its token replaced by a random "
                  "one from its vocabulary. A draft that ignores its token scores alike with both.", "",
                  "| | " + " | ".join(f"step {i + 1}" for i in range(steps)) + " | step 1, random token | right only with the true / only with the random token |",
                  "|---|" + "--:|" * (steps + 2),
                  "| top-1 | " + " | ".join(f"{x:.3f}" for x in forced["top1"])
                  + f" | {forced['random_top1']:.3f} | {forced['only_true']} / {forced['only_random']} |", ""]
        starts = forced.get("round_starts")
        if starts and starts["round_starts"]:
            lines += ["Where decoding's rounds start (`draft_eval.round_starts`; the "
                      f"{starts['aligned_prompts']} prompts whose greedy decoding is the teacher-forced answer): a "
                      "round's first draft token comes right after the previous round's end, mostly where the draft "
                      "had just failed.", "",
                      "| | positions | top-1 / accepted |", "|---|--:|--:|",
                      f"| teacher-forced step 1, every answer position | {starts['answer_positions']} | "
                      f"{starts['forced_everywhere']:.3f} |",
                      f"| teacher-forced step 1, where greedy rounds start | {starts['round_starts']} | "
                      f"{starts['forced_at_starts']:.3f} |",
                      f"| greedy decoding, position 1 of those rounds | {starts['round_starts']} | "
                      f"{starts['decoded_at_starts']:.3f} |", ""]
    if all("gate" in summary.get(mode, {}) for mode in ("greedy", "sample")):
        lines += ["## The gate's statistic against what it estimates", "",
                  "c_i = q_1(t_1) ... q_{i-1}(t_{i-1}) max q_i of the ungated draft at every drafted position (all "
                  "positions pooled), against the rate at which the position was reached and accepted (sampling: "
                  "reached, times the overlap). The learned configs below propose a position only when c_i >= "
                  f"{_gate_text(meta.get('min_confidence'))}.", "",
                  "| c_i | greedy: positions | greedy: reached and accepted | sampling: positions | sampling: reached x overlap |",
                  "|---|--:|--:|--:|--:|"]
        for (lo, hi, n_g, r_g), (_, _, n_s, r_s) in zip(summary["greedy"]["gate"], summary["sample"]["gate"]):
            lines.append(f"| [{lo:.2f}, {hi:.2f}) | {n_g} | {r_g:.3f} | {n_s} | {r_s:.3f} |")
        lines.append("")
    if speed:
        lines += ["## Speed end to end (tokens/s ratios to plain generate, same prompts, side by side)", "",
                  "| config | tokens/s | x plain | min x over prompts | tokens/pass | drafted/pass "
                  "| draft / target / verify / other | greedy == generate |"
                  + (" rounds won (planner) |" if any(x.get("won") for x in speed) else ""),
                  "|---|--:|--:|--:|--:|--:|--:|--:|" + ("---|" if any(x.get("won") for x in speed) else "")]
        for s in speed:
            per_pass = s.get("drafted_per_round", float("nan"))
            lines.append(f"| {s['config']} | {s['tokens_per_s']:.1f} | {s['ratio']:.2f} | {s['min_ratio']:.2f} | "
                         f"{s['tokens_per_round']:.2f} | {'' if math.isnan(per_pass) else f'{per_pass:.2f}'} | "
                         f"{s.get('shares', s.get('draft_share', ''))} | {s['same']} |"
                         + (f" {s.get('won', '')} |" if any(x.get("won") for x in speed) else ""))
        lines += ["", "Drafted/pass: the draft tokens (tree nodes) the target scores per pass, besides the one "
                  "token a plain step scores. Shares: of the decoder's wall time, the draft's calls, the target's passes, verification "
                  "(the accept ops) and the rest (the decoder's own bookkeeping). `hf_assisted_ee`: transformers' "
                  "assisted generation with real_model's early-exit draft (the target's first `ee_layers` layers); `_auto`: AdaptiveK chooses "
                  "each round's K (0 to K) from the rounds before; `_drawn_tree` / `_iid_tree`: the learned tree's "
                  "children drawn without / with replacement, verified by recursive rejection sampling / SpecInfer's "
                  "rule (the other trees: top-k children, sample-and-match); `_planned`: each round the planner "
                  "(`specverify.decoding.planner`) proposes prompt lookup's copy, the learned chain (`_tree`: or the "
                  "learned tree) or nothing, by expected tokens per cost, up to lookup's K (5) tokens (the learned chain "
                  "up to 4); its costs: "
                  f"{_costs_text(meta.get('planner_costs', 'learned online'))}; `_online`: its costs learned from the decoder's timings instead "
                  "(`learned_callbacks`' default, what `speculative_callbacks(model, \"learned\")` gives); one planner per config over the prompts, in order, as a user keeps one "
                  "(what it learned of the learned draft carries from prompt to prompt; lookup's rates start over "
                  "with each prompt)."]
    Path(out_path).write_text("\n".join(lines) + "\n")


GOALS = {"greedy": 1.8, "sample": 1.6}  # the goals, x plain generate averaged over the prompts


def plot(out_dir, out_path=None):
    """``media/learned_draft.png`` from a cached run (``acceptance.csv``, ``runs.csv``,
    ``meta.json`` in ``out_dir``): acceptance per draft position against the law's tokens per
    pass, the gate statistic's calibration, and each config's speed-up over plain generate
    (pooled, and per prompt)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    meta = paths.read_json(out_dir / "meta.json")
    k = int(meta["k"])
    records = [dict(r, position=int(r["position"]), reached=int(r["reached"]), value=float(r["value"]),
                    emitted=int(r["emitted"]), gate=float(r["gate"]))
               for r in real_model_tables.read(out_dir / "acceptance.csv")]
    summary = acceptance_summary(records, k)
    has_speed = bool(meta.get("speed")) and (out_dir / "runs.csv").is_file()
    fig, axes = plt.subplots(1, 3 if has_speed else 2, figsize=(16 if has_speed else 10, 5.2),
                             gridspec_kw=dict(width_ratios=[1, 1, 1.6] if has_speed else [1, 1]))
    colors = {"greedy": "#2b7bba", "sample": "#f0a030"}
    ax = axes[0]
    modes = {mode: s for mode, s in summary.items() if mode in colors}  # not "teacher_forced"
    for j, (mode, s) in enumerate(modes.items()):
        xs = [i + 1 + (j - 0.5) * 0.38 for i in range(k)]
        ax.bar(xs, s["rates"], width=0.38, color=colors[mode],
               label=f"{mode}: law {s['predicted']:.2f}, measured {s['measured']:.2f} tokens/pass")
    ax.set_xticks(range(1, k + 1))
    ax.set_xlabel("draft position (rounds that reached it)")
    ax.set_ylabel("greedy: argmax match; sampling: sum min(p, q)")
    ax.set_ylim(0, 1)
    ax.set_title("acceptance of the learned draft (ungated)")
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[1]
    for mode, s in modes.items():
        bins = [(lo, hi, n, r) for lo, hi, n, r in s["gate"] if n]
        ax.plot([(lo + hi) / 2 for lo, hi, _, _ in bins], [r for *_, r in bins], "o-", color=colors[mode], label=mode)
    ax.plot([0, 1], [0, 1], color="#999999", lw=0.8, ls="--", label="calibrated")
    gate = meta.get("min_confidence")
    gates = gate if isinstance(gate, dict) else {} if gate is None else {"greedy": gate, "sample": gate}
    for mode, value in gates.items():
        ax.axvline(value, color=colors[mode], lw=0.8, ls=":", label=f"the gate ({mode}), {value}")
    ax.set_xlabel("gate statistic c_i (bin middle)")
    ax.set_ylabel("reached and accepted")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("what c_i estimates, measured")
    ax.legend(fontsize=8, loc="upper left")
    if has_speed:
        ax = axes[2]
        by_prompt = real_model_tables.per_prompt_speedup(real_model_tables.read(out_dir / "runs.csv"))
        shown = [x for x in meta["speed"] if x["config"] not in ("hf_greedy", "hf_sample")]
        for i, x in enumerate(shown):
            mode = "sample" if "sample" in x["config"] else "greedy"
            ax.barh(i, x["ratio"], color=colors[mode], alpha=0.8)
            pts = [v for (c, _), v in by_prompt.items() if c == x["config"]]
            ax.plot(pts, [i] * len(pts), "|", color="black", ms=7, alpha=0.6)
        for mode, goal in GOALS.items():
            ax.axvline(goal, color=colors[mode], ls="--", lw=1, label=f"goal, {mode}: {goal}x")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_yticks(range(len(shown)))
        ax.set_yticklabels([x["config"] for x in shown], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("x plain generate (bar: pooled over prompts; ticks: each prompt)")
        ax.set_title(f"end to end, {meta['n_prompts']} held-out prompts, {_threads(meta)}")
        ax.legend(fontsize=8, loc="lower right")
    fig.text(0.01, 0.01, f"python -m experiments.end_to_end.draft_eval; K = {k}, {meta['max_new']} new tokens; "
             f"{meta['utc'][:10]}, git {meta.get('git_revision', '?')}", fontsize=7, color="#555555")
    return real_model_figures._save(fig, out_path or paths.MEDIA_DIR / FIGURE)


def _by_kind(info) -> str:
    """`` (365,614 answers, of them 197,548 trained on, ...)``: tokens per kind of data (``<kind>_trained``:
    the answer tokens the losses were taken on; the rest of a sequence is its prompt, context only)."""
    kinds = info.get("tokens_by_kind")
    if not kinds:
        return ""
    return " (" + ", ".join(f"{n:,} {kind}" + (f", of them {kinds[kind + '_trained']:,} trained on"
                                                 if kind + "_trained" in kinds else "")
                            for kind, n in kinds.items() if not kind.endswith("_trained")) + ")"


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _gates(min_confidence) -> dict:
    """The gate of each mode, ``{"greedy": c, "sample": c}``: ``min_confidence`` for both, or the defaults."""
    from specverify.integrations import learned_draft

    if min_confidence is None:
        return dict(learned_draft.DEFAULT_MIN_CONFIDENCE)
    return {"greedy": min_confidence, "sample": min_confidence}


def _gate_text(gate) -> str:
    """A run's gate (``meta["min_confidence"]``: per mode, or one number in older runs) for the table."""
    if isinstance(gate, dict):
        return f"{gate['greedy']} (greedy) / {gate['sample']} (sampling)"
    return str(gate if gate is not None else "?")


def _numbers(row: dict) -> dict:
    """A ``runs.csv`` row with its numeric fields as numbers (``same_as_generate`` as 0 / 1)."""
    out = {}
    for key, value in row.items():
        if key == "same_as_generate":
            out[key] = {"1": 1, "True": 1, "0": 0, "False": 0}.get(value, value)
            continue
        try:
            out[key] = float(value) if value != "" else value
        except ValueError:
            out[key] = value
    return out


def speed_summary(rows):
    """Per config: pooled tokens/s, its ratio to plain generate of the same mode, the lowest
    per-prompt ratio, tokens per pass, draft share, greedy equality."""
    out = []
    by = lambda c: [r for r in rows if r["config"] == c]  # noqa: E731
    for config in [c for c in CONFIGS if by(c)]:
        rs = by(config)
        base = real_model_tables._plain_generate(config)
        base_rows = {(r["prompt"], r["repeat"]): r for r in by(base)}
        new, secs = sum(r["new_tokens"] for r in rs), sum(r["seconds"] for r in rs)
        bnew, bsecs = sum(r["new_tokens"] for r in base_rows.values()), sum(r["seconds"] for r in base_rows.values())
        ratios = [r["tokens_per_s"] / base_rows[(r["prompt"], r["repeat"])]["tokens_per_s"] for r in rs
                  if (r["prompt"], r["repeat"]) in base_rows]
        same = [r.get("same_as_generate") for r in rs if r["mode"] == "greedy" and r.get("same_as_generate") not in (None, "")]
        shares = "/".join(f"{sum(float(r[part]) for r in rs) / secs:.2f}" for part in ROUND_PARTS) \
            if config.startswith("sv_") else ""
        passes = sum(r["target_passes"] for r in rs)
        drafted = [float(r["drafted"]) for r in rs if r.get("drafted") not in (None, "")]
        out.append(dict(config=config, tokens_per_s=new / secs, ratio=(new / secs) / (bnew / bsecs),
                        min_ratio=min(ratios) if ratios else float("nan"),
                        tokens_per_round=new / passes,
                        drafted_per_round=sum(drafted) / passes if drafted and not any(map(math.isnan, drafted))
                        else float("nan"),
                        shares=shares, same=f"{sum(same)}/{len(same)}" if same else "", won=_won(rs)))
    return out


def _won(rows) -> str:
    """A planner config's share of rounds won by each candidate, pooled over its runs ("" for others)."""
    counts = {}
    for r in rows:
        for item in filter(None, str(r.get("won") or "").split(";")):
            name, n = item.rsplit(":", 1)
            counts[name] = counts.get(name, 0) + int(n)
    total = sum(counts.values())
    return ", ".join(f"{name} {n / total:.2f}" for name, n in sorted(counts.items())) if total else ""


def _threads(meta) -> str:
    n = int(meta.get("threads", 1))
    return "one torch thread" if n == 1 else f"{n} torch threads"


def _media_name(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9_]+", text):
        raise argparse.ArgumentTypeError(f"must be lowercase letters, digits and _, got {text!r}")
    return text


def main(argv=None):
    import torch

    from specverify.integrations import learned_draft

    ap = argparse.ArgumentParser(prog="python -m experiments.end_to_end.draft_eval", description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (the learned configs)")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--prompt-sets", default="heldout,heldout2", help=f"comma-separated, of {sorted(PROMPT_SETS)}")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--min-confidence", type=float, default=None,
                    help="the learned configs' gate in both modes (default: DEFAULT_MIN_CONFIDENCE of each mode; "
                         "the _ungated configs: 0)")
    ap.add_argument("--skip-speed", action="store_true", help="acceptance only")
    ap.add_argument("--weights", type=Path, default=None, help="the draft file (default: the shipped one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=number(int, 1), default=1, metavar="N",
                    help="torch threads for every row (plain generate too); the planner's costs are read from "
                         "the calibration of this many threads")
    ap.add_argument("--name", default=TABLE[:-3], type=_media_name,
                    help="the table and figure written: media/<name>.md and .png (a subset of configs may get its own)")
    ap.add_argument("--table-only", action="store_true",
                    help="rewrite media/learned_draft.md and media/learned_draft.png from the cached run")
    args = ap.parse_args(argv)
    if args.k < 1 or args.max_new < 1 or args.repeats < 1:
        ap.error("--k, --max-new and --repeats must be positive")
    if args.min_confidence is not None and not 0 <= args.min_confidence < 1:
        ap.error(f"--min-confidence must be in [0, 1), got {args.min_confidence}")
    sets = args.prompt_sets.split(",")
    unknown = [s for s in sets if s not in PROMPT_SETS]
    if unknown:
        ap.error(f"--prompt-sets: unknown {unknown}, choose from {sorted(PROMPT_SETS)}")
    configs = args.configs.split(",")
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"--configs: unknown {bad}, choose from {CONFIGS}")
    torch.set_num_threads(args.threads)
    prompts = {f"{s}/{n}": text for s in sets for n, text in (PROMPT_SETS[s] or tuning_prompts()).items()}
    params = dict(real_model_configs.make_params(max_new=args.max_new, **SAMPLE, seed=args.seed),
                  k_learned=args.k, min_confidence=_gates(args.min_confidence))
    weights = args.weights if args.weights is not None else learned_draft.DEFAULT_WEIGHTS
    if not weights.is_file():
        ap.error(f"--weights: no file {weights}")
    # the draft's bytes, not its path: a retrained file shipped in place is a new run
    key = dict(params, _head=hashlib.sha256(weights.read_bytes()).hexdigest()[:16], sets=sets, configs=configs,
               repeats=args.repeats)
    if args.threads != 1:  # (one thread keeps the key of the runs before the option)
        key["threads"] = args.threads
    out_dir = paths.result_dir(EXPERIMENT, key)
    command = "python -m experiments.end_to_end.draft_eval" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    command = command.replace(" --table-only", "")
    if args.table_only:  # from the cached run of these parameters (its summary recomputed from its records)
        if not (out_dir / "meta.json").is_file():
            ap.error(f"--table-only: no cached run of these parameters ({out_dir}); run without it first")
        meta = paths.read_json(out_dir / "meta.json")
        summary = meta["summary"]
        if (out_dir / "acceptance.csv").is_file():
            records = [dict(r, position=int(r["position"]), reached=int(r["reached"]), value=float(r["value"]),
                            emitted=int(r["emitted"]), gate=float(r["gate"]))
                       for r in real_model_tables.read(out_dir / "acceptance.csv")]
            summary = acceptance_summary(records, args.k)
            if "vocab_coverage" in meta["summary"]["greedy"]:
                summary["greedy"]["vocab_coverage"] = meta["summary"]["greedy"]["vocab_coverage"]
            if "teacher_forced" in meta["summary"]:
                summary["teacher_forced"] = meta["summary"]["teacher_forced"]
        speed = meta["speed"]
        if (out_dir / "runs.csv").is_file():  # recomputed: the table's columns may be newer than the run
            speed = speed_summary([_numbers(r) for r in real_model_tables.read(out_dir / "runs.csv")])
        write_table(summary, speed, meta, paths.MEDIA_DIR / f"{args.name}.md", command)
        print(f"wrote {paths.MEDIA_DIR / args.name}.md and {plot(out_dir, paths.MEDIA_DIR / f'{args.name}.png')} "
              f"from {out_dir}")
        return
    load_before = os.getloadavg()
    model, tokenizer, draft_model, ids = real_model_timing._load(params, prompts, print)
    head = learned_draft.load(model, weights)
    params["_head"] = head
    params["_costs"], planner_costs = planner_cost_files(args.threads)
    print(f"planner costs: {planner_costs}")
    out_dir.mkdir(parents=True, exist_ok=True)
    sample = SAMPLE
    records, coverage, continuations = acceptance(model, head, ids, args.k, args.max_new, sample,
                                                  tokenizer.eos_token_id, args.seed)
    _write_csv(out_dir / "acceptance.csv", records)
    summary = acceptance_summary(records, args.k)
    summary["greedy"]["vocab_coverage"] = coverage
    forced = teacher_forced(model, tokenizer, head, list(prompts.values()), args.max_new, args.k, args.seed)
    forced["round_starts"] = round_starts(records, list(prompts), forced.pop("answers"), forced.pop("first_right"),
                                          continuations)
    summary["teacher_forced"] = forced
    print(json.dumps(summary, indent=1))
    speed = []
    if not args.skip_speed:
        rows = real_model_timing._run_prompts(ids, configs, model, tokenizer, draft_model, params, args.repeats, "speed")
        _write_csv(out_dir / "runs.csv", [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
        speed = speed_summary(rows)
        for s in speed:
            print(s)
    meta = dict(paths.run_metadata(), prompt_sets=sets, n_prompts=len(prompts), max_new=args.max_new, k=args.k,
                threads=args.threads,
                planner_costs=planner_costs,
                draft={k: v for k, v in learned_draft.metadata(weights).items() if k not in ("sources", "run")},
                min_confidence=params["min_confidence"],
                loadavg_before=load_before, loadavg_after=os.getloadavg())
    paths.write_json(out_dir / "meta.json", dict(meta, summary=summary, speed=speed))
    if "tuning" in sets:  # the gate's calibration: summary["*"]["gate"], printed above; not the held-out table
        print(f"tuning run: {out_dir / 'meta.json'} (media/{TABLE} is written from held-out sets only)")
        return
    paths.MEDIA_DIR.mkdir(parents=True, exist_ok=True)
    write_table(summary, speed, meta, paths.MEDIA_DIR / f"{args.name}.md", command)
    print(f"wrote {paths.MEDIA_DIR / args.name}.md and {plot(out_dir, paths.MEDIA_DIR / f'{args.name}.png')}")


if __name__ == "__main__":
    main()
