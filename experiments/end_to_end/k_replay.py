"""Offline replay of draft-length policies on a recorded prompt-lookup run (``experiments.end_to_end.choose_k``).

Greedy decoding with the prompt-lookup draft is deterministic: the emitted text is the same at
every K, and a round's proposal is a function of the text so far and the K asked. So a policy's
rounds can be replayed exactly from the recorded text, without the model, and timed with the
per-pass costs measured in the run (:func:`experiments.end_to_end.choose_k.costs`: the median seconds of a
target pass by tokens scored, of a draft call by K asked, and the loop's overhead per round).
The replay evaluates a policy in about a second, so that it can be studied over every order of
the prompts (the policy is carried from prompt to prompt, as in the real run) and, with
``jitter``, with each pass's time drawn from the recorded times of passes of its length (the
noise the policy learns its costs from, and that makes a measured fixed-K curve jagged).

``python -m experiments.end_to_end.k_replay`` replays :class:`specverify.decoding.adaptive.AdaptiveK` and every
fixed K on the last ``choose_k`` run (``results/choose_k``) and prints, per prompt, auto / best
fixed K and auto / plain over all prompt orders. With ``--evidence`` it replays the policy over
several recorded runs (each with its own costs), longer texts (``--texts FILE:N1,N2``: a JSON
``name -> {ids, text}``, replayed with the first run's costs at each ``max_new``) and jittered
repeats of the first run (``--jitter-seeds``), and prints per (set, prompt) the worst and median
ratio to the best fixed K over the orders: the table a change of policy is judged by. With
``--cost-beliefs`` it feeds each run's recorded ``auto`` rounds to the policy and prints how far
its cost model's ``T(n) / T(1)`` is from the run's medians (:func:`cost_beliefs`).
``--record-texts FILE`` writes the held-out texts such a ``--texts`` file holds: greedy
continuations of ``prompt_sets.HELDOUT_PROMPTS``, prompts no policy was tuned on
(:func:`record_texts`: it needs the model, not a recorded run).
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from . import choose_k


@dataclass(frozen=True)
class CostProfile:
    """Seconds of one round's parts: ``target[n - 1]`` a target pass scoring n tokens (n = 1..k_max + 1),
    ``draft[k - 1]`` a draft call asked for k (k = 1..k_max), ``overhead`` the rest of a round; with
    ``target_pool[n - 1]`` / ``draft_pool[k - 1]`` the individual recorded times (for ``jitter``)."""

    target: np.ndarray  # [k_max + 1]
    draft: np.ndarray  # [k_max]
    overhead: float
    target_pool: Sequence[np.ndarray] = ()
    draft_pool: Sequence[np.ndarray] = ()

    @classmethod
    def from_rows(cls, rows) -> "CostProfile":
        """Medians (and pools) over the plain and fixed-K runs of a ``choose_k`` run's rows."""
        fixed = [r for r in rows if r["config"] != "auto"]
        t, d, overhead = choose_k.costs(fixed)
        recs = np.concatenate([choose_k._records(r) for r in fixed])  # [rounds, 6]
        scored, asked = recs[:, 1].astype(int) + 1, recs[:, 0].astype(int)
        target_pool = [recs[scored == n, 4] if np.any(scored == n) else t[n - 1 : n] for n in range(1, t.size + 1)]
        draft_pool = [recs[asked == k, 3] if np.any(asked == k) else d[k - 1 : k] for k in range(1, d.size + 1)]
        return cls(t, d, overhead, target_pool, draft_pool)


def replay(policy, prompt_ids, text, profile: CostProfile, max_new: int, jitter: Optional[np.random.Generator] = None,
           draft=None) -> dict:
    """Decode ``text`` (the recorded greedy continuation of ``prompt_ids``) again with ``policy``.

    Each round asks ``policy`` for K as the decoder does (``draft_length(remaining - 1)``, with
    the draft's ``context`` of the text so far if the policy takes one; none when one token is
    left; after a round that asked K = 0, whether the draft's ``first_token`` was right), proposes
    with prompt lookup, accepts the longest prefix of the
    proposal that agrees with ``text`` and emits it and the next token of ``text``; the round
    costs ``D(K) + T(M + 1) + overhead`` (M proposed), or draws from the recorded times of its
    lengths with ``jitter``, and the policy observes those times. Returns ``tokens_per_s``,
    ``rounds``, and each round's K ``asked`` and drafts ``accepted``.
    """
    from specverify.decoding.adaptive import RoundRecord, ask_policy, draft_hindsight, takes_keyword
    from specverify.integrations.transformers import PromptLookupDraft

    draft = draft or PromptLookupDraft()
    takes_context = takes_keyword(policy.draft_length, "context")
    draft_context = getattr(draft, "context", None)
    truth = torch.as_tensor(text, dtype=torch.int64).reshape(-1)  # [new]
    seq = torch.as_tensor(prompt_ids, dtype=torch.int64).reshape(-1)
    pos, seconds, asked, accepted = 0, 0.0, [], []
    policy.begin()
    while pos < truth.numel():
        remaining = max_new - pos
        k, context = ask_policy(policy, remaining - 1, lambda: int(draft_context(seq)) if draft_context else None,
                                takes_context)
        proposal = draft(seq, k)[0] if k > 0 else seq[:0]  # [m]
        m, rest = proposal.numel(), truth[pos:]
        n = 0  # accepted drafts: the proposal's longest prefix that agrees with the text
        while n < min(m, rest.numel()) and proposal[n] == rest[n]:
            n += 1
        emitted = min(n + 1, rest.numel())
        if jitter is None:
            d, t = (profile.draft[k - 1] if k else 0.0), profile.target[m]
        else:
            d = float(jitter.choice(profile.draft_pool[k - 1])) if k else 0.0
            t = float(jitter.choice(profile.target_pool[m]))
        seconds += d + t + profile.overhead
        hindsight = draft_hindsight(draft, seq, int(rest[0])) if k == 0 else None  # as the decoder
        policy.observe(RoundRecord(k, m, n, d, t, context=context, hindsight=hindsight))
        asked.append(k)
        accepted.append(n)
        seq = torch.cat([seq, rest[:emitted]])
        pos += emitted
    return dict(tokens_per_s=pos / seconds, rounds=len(asked), asked=asked, accepted=accepted)


def fixed_policy(k: int):
    from specverify.decoding.adaptive import FixedK

    return choose_k.PlainDecoding() if k == 0 else FixedK(k)


def study(make_policy: Callable[[], object], prompts: Dict[str, tuple], profile: CostProfile, max_new: int,
          repeats: int = 1, orders: Optional[Sequence[Sequence[str]]] = None, jitter_seed: Optional[int] = None,
          ks: Sequence[int] = tuple(choose_k.KS), warmup: int = 0) -> dict:
    """The policy from ``make_policy()`` carried through ``repeats`` passes over the prompts in each
    order (by default every permutation of up to 4 prompts; of more, their rotations), against
    plain decoding and every fixed K; with ``warmup``, after that many unmeasured passes (as in a
    long measured run, where the policy has learned the machine's costs after its first prompts).

    ``prompts``: name -> (prompt_ids, text). Returns ``fixed[k][name]`` (tok/s, k = 0 plain),
    ``auto[order_index][name]`` (the mean over repeats) and per prompt ``ratio_best`` /
    ``ratio_plain``: auto over the best fixed K >= 1 and over plain, one value per order; and
    ``set_ratio`` per order: auto's mean over prompts against the best fixed K's.
    With ``jitter_seed`` every pass's time is drawn (see :func:`replay`), and each fixed K's value is
    the mean of ``repeats`` jittered runs, as in a measured run.
    """
    names = list(prompts)
    if orders is None:
        orders = itertools.permutations(names) if len(names) <= 4 else (names[i:] + names[:i] for i in range(len(names)))
    orders = list(orders)
    rng = None if jitter_seed is None else np.random.default_rng(jitter_seed)

    def run(policy, name):
        ids, text = prompts[name]
        return replay(policy, ids, text, profile, max_new, rng)["tokens_per_s"]

    fixed = {k: {name: float(np.mean([run(fixed_policy(k), name) for _ in range(repeats if rng else 1)]))
                 for name in names} for k in [0, *ks]}
    best = {name: max(fixed[k][name] for k in ks) for name in names}
    best_set = max(np.mean([fixed[k][name] for name in names]) for k in ks)
    autos = []
    for order in orders:
        policy = make_policy()
        for _ in range(warmup):
            for name in order:
                run(policy, name)
        got = {name: [] for name in names}
        for _ in range(repeats):
            for name in order:
                got[name].append(run(policy, name))
        autos.append({name: float(np.mean(v)) for name, v in got.items()})
    return dict(fixed=fixed, auto=autos, orders=[list(o) for o in orders],
                ratio_best={n: [a[n] / best[n] for a in autos] for n in names},
                ratio_plain={n: [a[n] / fixed[0][n] for a in autos] for n in names},
                set_ratio=[float(np.mean([a[n] for n in names]) / best_set) for a in autos])


def summary_lines(res) -> list:
    """Per prompt: the fixed-K curve and auto / best fixed K, auto / plain over orders (min, median)."""
    lines = []
    for name, ratios in res["ratio_best"].items():
        curve = " ".join(f"{res['fixed'][k][name]:5.1f}" for k in sorted(res["fixed"]))
        rp = res["ratio_plain"][name]
        lines.append(f"{name:12s} plain,K=1..: {curve} | auto/best K min {min(ratios):.3f} median "
                     f"{np.median(ratios):.3f} | auto/plain min {min(rp):.3f} median {np.median(rp):.3f}")
    sr = res["set_ratio"]
    lines.append(f"{'whole set':12s} auto mean / best fixed K's mean: min {min(sr):.3f} median {np.median(sr):.3f}"
                 f" over {len(sr)} orders")
    return lines


def recorded_prompts(summary, names=None) -> Dict[str, tuple]:
    """name -> (prompt_ids, recorded text) of a ``choose_k`` summary (prompt ids recorded since this
    module; older summaries: rebuilt with the SmolLM2 tokenizer's chat template)."""
    names = names or list(summary["texts"])
    ids = summary.get("prompt_ids")
    if ids is None:
        from transformers import AutoTokenizer

        from specverify.integrations import smollm2

        from . import prompt_sets

        tok = AutoTokenizer.from_pretrained(smollm2.cache_dir(), local_files_only=True)
        ids = {n: v.tolist() for n, v in prompt_sets.chat_ids(tok, {n: prompt_sets.PROMPTS[n] for n in names}).items()}
    return {n: (ids[n], summary["texts"][n]) for n in names}


@dataclass(frozen=True)
class EvidenceSet:
    """One replay setting of :func:`evidence_table`: prompts replayed with a cost profile."""

    label: str
    profile: CostProfile
    prompts: Dict[str, tuple]  # name -> (prompt_ids, text)
    max_new: int
    jitter_seed: Optional[int] = None
    repeats: int = 1


def run_labels(results: Sequence) -> list:
    """A label per results folder (``None``: the default one): the shortest tail of its path that no
    other folder shares. Runs kept under several ``SPECVERIFY_RESULTS`` roots are all named
    ``choose_k``; labelled by that name alone, :func:`evidence_table` would merge them."""
    parts = [Path(f).resolve().parts if f else (choose_k.EXPERIMENT,) for f in results]
    labels = []
    for p in parts:
        n = 1
        while n < len(p) and sum(q[-n:] == p[-n:] for q in parts) > 1:
            n += 1
        labels.append("/".join(p[-n:]))
    return labels


def evidence_sets(results: Sequence, texts: Sequence[str] = (), jitter_seeds: Sequence[int] = (),
                  jitter_repeats: int = 3) -> list:
    """Every recorded run in ``results`` (folders) with its own costs and texts; each ``texts`` entry
    ``"FILE:N1,N2"`` (JSON ``name -> {ids, text}``) with the first run's costs, its texts cut to
    ``max_new = N`` for each N; the first run again with each jitter seed (``jitter_repeats`` passes)."""
    sets = []
    for folder, label in zip(results, run_labels(results)):
        rows, summary = choose_k.load(folder)
        sets.append(EvidenceSet(label,
                                CostProfile.from_rows(rows), recorded_prompts(summary), summary["params"]["max_new"]))
    first = sets[0]
    for spec in texts:
        path, _, lengths = spec.rpartition(":")
        loaded = json.loads(Path(path).read_text())
        for n in (int(x) for x in lengths.split(",")):
            sets.append(EvidenceSet(f"{Path(path).stem}@{n}", first.profile,
                                    {name: (d["ids"], d["text"][:n]) for name, d in loaded.items()}, n))
    for seed in jitter_seeds:
        sets.append(EvidenceSet(f"{first.label} jitter {seed}", first.profile, first.prompts, first.max_new, seed,
                                jitter_repeats))
    return sets


def evidence_table(make_policy: Callable[[], object], sets: Sequence[EvidenceSet], warmup: int = 0) -> Dict[tuple, tuple]:
    """``(set label, prompt) -> (worst, median)`` of auto / best fixed K over every prompt order, and
    ``(set label, "whole set") -> (worst, median)`` of the set ratio (see :func:`study`)."""
    table = {}
    for e in sets:
        res = study(make_policy, e.prompts, e.profile, e.max_new, e.repeats, jitter_seed=e.jitter_seed, warmup=warmup)
        for name, ratios in [*res["ratio_best"].items(), ("whole set", res["set_ratio"])]:
            table[(e.label, name)] = (float(min(ratios)), float(np.median(ratios)))
    return table


def table_lines(tables: Dict[str, Dict[tuple, tuple]]) -> list:
    """Side by side, per (set, prompt): ``worst/median`` of each named policy's :func:`evidence_table`,
    then per policy the worst prompt and the geometric mean of the prompts' medians."""
    names, keys = list(tables), list(next(iter(tables.values())))
    lines = [f"{'set':24s} {'prompt':12s} " + " ".join(f"{n[:13]:>13s}" for n in names)]
    lines += [f"{k[0][:24]:24s} {k[1]:12s} " + " ".join(f"  {tables[n][k][0]:.3f}/{tables[n][k][1]:.3f}" for n in names)
              for k in keys]
    prompts = [k for k in keys if k[1] != "whole set"]
    for n in names:
        medians = np.log([tables[n][k][1] for k in prompts])
        lines.append(f"{n}: worst prompt {min(tables[n][k][0] for k in prompts):.3f}, "
                     f"geometric mean of medians {np.exp(medians.mean()):.4f}")
    return lines


def cost_beliefs(make_policy: Callable[[], object], rows, lengths: Sequence[int] = (4, 8, 9),
                 skip_rounds: int = 100) -> dict:
    """How well a policy's cost model follows the machine: the recorded ``auto`` rounds of a
    ``choose_k`` run (in the order they ran) fed to ``make_policy()``, and after every round past
    the first ``skip_rounds`` its ``T(n) / T(1)`` at ``lengths`` compared with the run's medians
    (plain and fixed-K rounds). The rounds are the recorded policy's, not this one's: the costs
    it is shown are the same whatever it would have asked. Returns the rms and the mean of the
    log errors per length, and the rms error of ``T(max) / T(min)`` of ``lengths`` (the ratio a
    choice between a short and a long K turns on)."""
    from specverify.decoding.adaptive import RoundRecord

    t, _, _ = choose_k.costs([r for r in rows if r["config"] != "auto"])
    idx = np.asarray(lengths) - 1
    truth = t[idx] / t[0]
    policy, errors = make_policy(), []
    for row in (r for r in rows if r["config"] == "auto"):
        policy.begin()
        for asked, proposed, accepted, d, tt, _ in choose_k._records(row):
            costs = policy.costs()
            if costs is not None and policy.rounds >= skip_rounds:
                errors.append(np.log(costs[1][idx] / truth))
            policy.observe(RoundRecord(int(asked), int(proposed), int(accepted), float(d), float(tt)))
    e = np.array(errors)  # [rounds, lengths]
    return dict(lengths=list(lengths), rms=np.sqrt((e ** 2).mean(axis=0)).tolist(), bias=e.mean(axis=0).tolist(),
                rms_long_over_short=float(np.sqrt(((e[:, -1] - e[:, 0]) ** 2).mean())))


class ContextWithheld:
    """``policy`` asked for K without the draft's context (this ``draft_length`` takes none, so the
    decoder and :func:`replay` pass none): :class:`specverify.decoding.adaptive.AdaptiveK` as it was before
    draft contexts, for ``--evidence --without-context``."""

    def __init__(self, policy):
        self.policy, self.k_max, self.stop = policy, policy.k_max, policy.stop

    def begin(self):
        self.policy.begin()

    def draft_length(self, limit):
        return self.policy.draft_length(limit)

    def observe(self, record):
        self.policy.observe(record)


def record_texts(path, max_new: int = 128, prompts=None, log=print, model=None) -> dict:
    """Greedy SmolLM2-135M continuations (``max_new`` tokens) of ``prompts`` (default
    ``prompt_sets.HELDOUT_PROMPTS``), written to ``path`` as JSON ``name -> {ids, text}``: the
    ``--texts`` input, replayed with a recorded run's costs. ``model``: a loaded ``(model,
    tokenizer)`` used as it is; by default SmolLM2 is loaded as ``choose_k`` runs it (switched
    linear layers, one thread)."""
    from . import prompt_sets

    if model is None:
        from specverify.integrations import smollm2
        from specverify.integrations.transformers import use_fast_linears

        torch.set_num_threads(1)
        model = smollm2.load(log=log)
        use_fast_linears(model[0])
    model, tokenizer = model
    ids = prompt_sets.chat_ids(tokenizer, prompts or prompt_sets.HELDOUT_PROMPTS)
    texts = {}
    for name, prompt_ids in ids.items():
        row = choose_k.run_one(model, prompt_ids, choose_k.PlainDecoding(), max_new, tokenizer.eos_token_id)
        texts[name] = dict(ids=prompt_ids.tolist(), text=row["_text"])
        log(f"{name:12s} {len(row['_text'])} tokens")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(texts))
    return texts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", nargs="+", default=[None], help="choose_k results folders (default results/choose_k)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--jitter-seed", type=int, default=None, help="draw each pass's time from the recorded ones")
    ap.add_argument("--evidence", action="store_true", help="the worst/median table over every --results, --texts, "
                    "--jitter-seeds (see evidence_sets)")
    ap.add_argument("--texts", nargs="*", default=[], help="FILE:N1,N2 longer texts replayed with the first run's costs")
    ap.add_argument("--jitter-seeds", nargs="*", type=int, default=[])
    ap.add_argument("--warmup", type=int, default=0,
                    help="--evidence: unmeasured passes over the prompts in each order first (costs learned)")
    ap.add_argument("--without-context", action="store_true",
                    help="--evidence: also the policy asked without the draft's context, side by side")
    ap.add_argument("--cost-beliefs", action="store_true",
                    help="the policy's T(n)/T(1) along each run's recorded auto rounds against the run's medians, "
                         "with the pace and without it (pace_decay=1)")
    ap.add_argument("--record-texts", metavar="FILE", default=None,
                    help="record greedy continuations of held-out prompts to FILE (for --texts) and stop")
    ap.add_argument("--prompt-set", choices=["heldout", "heldout2"], default="heldout",
                    help="--record-texts: prompt_sets.HELDOUT_PROMPTS or HELDOUT_PROMPTS_2")
    ap.add_argument("--max-new", type=int, default=128, help="tokens per text for --record-texts")
    args = ap.parse_args(argv)
    if args.record_texts:
        from . import prompt_sets

        prompts = prompt_sets.HELDOUT_PROMPTS if args.prompt_set == "heldout" else prompt_sets.HELDOUT_PROMPTS_2
        record_texts(args.record_texts, args.max_new, prompts=prompts)
        return
    if args.cost_beliefs:
        from specverify.decoding.adaptive import AdaptiveK

        for folder, label in zip(args.results, run_labels(args.results)):
            rows, summary = choose_k.load(folder)
            decay = summary["params"]["decay"]
            for name, kw in (("paced", {}), ("raw means", dict(pace_decay=1.0))):
                b = cost_beliefs(lambda: AdaptiveK(k_max=max(choose_k.KS), k_min=0, decay=decay, **kw), rows)
                print(f"{label:24s} {name:10s} rms log error of T(n)/T(1), n = {b['lengths']}: "
                      + " ".join(f"{v:.3f}" for v in b["rms"]) + "  mean " + " ".join(f"{v:+.3f}" for v in b["bias"])
                      + f"  T({b['lengths'][-1]})/T({b['lengths'][0]}): {b['rms_long_over_short']:.3f}")
        return
    if args.evidence:
        sets = evidence_sets(args.results, args.texts, args.jitter_seeds)
        decay = choose_k.load(args.results[0])[1]["params"]["decay"]
        policies = {"auto": lambda: choose_k.auto_policy(decay)}
        if args.without_context:
            policies["without context"] = lambda: ContextWithheld(choose_k.auto_policy(decay))
        print("\n".join(table_lines({name: evidence_table(make, sets, args.warmup) for name, make in policies.items()})))
        return
    rows, summary = choose_k.load(args.results[0])
    profile = CostProfile.from_rows(rows)
    prompts = recorded_prompts(summary)
    decay = summary["params"]["decay"]
    res = study(lambda: choose_k.auto_policy(decay), prompts, profile,
                summary["params"]["max_new"], args.repeats, jitter_seed=args.jitter_seed)
    print("\n".join(summary_lines(res)))


if __name__ == "__main__":
    main()
