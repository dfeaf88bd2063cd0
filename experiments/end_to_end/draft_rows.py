"""How many LM-head rows the learned draft should propose from: ``python -m experiments.end_to_end.draft_rows``.

The draft is trained on ``--vocab`` rows (the tokens commonest in the target's answers to the
training prompts); it may propose from more (:func:`specverify.integrations.learned_draft.widened_rows`:
the trained rows and the lowest ids beyond them), at one more read of ``d`` floats a row and
draft step. Each width is judged on two groups of prompts, neither held out: the tuning prompts
(of the training kind, from a chunk no training reaches: the training distribution) and the
project's chat prompts ``PROMPTS`` and ``LONG_PROMPTS`` (copies, edits of code, a story, a module;
the decoding policies were tuned on them, the draft never), by:

- its teacher-forced top-1 at draft steps ``1 .. k`` against the target's argmax over the whole
  vocabulary (:func:`~experiments.end_to_end.draft_eval.teacher_forced`, the same answers for every
  width; with the context rows, as the drafts propose) and the share of the answers' tokens it can
  propose;
- its cost, calibrated here (:func:`specverify.integrations.calibrate.calibrate`: a target pass
  scoring ``n`` tokens ``T(n)`` and the chain's call proposing ``K`` ``D(K)``, in one-token passes,
  fast linears, ``--threads``);
- the modelled speed-up of a greedy chain, reading top-1 at step ``i`` as the chance a round that
  reached draft position ``i`` accepts it: ``E[tokens] = 1 + sum_{i <= K} prod_{j <= i} a_j`` over
  ``T(K + 1) + D(K)``, at the best ``K <= k``.

The width with the highest modelled speed-up on the chat prompts is the one to train with
(``train_draft --vocab``): on the training distribution the trained rows hold ~0.98 of the
answers' tokens, and a wider head mostly costs. Writes
``media/draft_rows.md``; answers and results are cached in ``results/draft_rows/<key>/``.
"""

from __future__ import annotations

import argparse
import sys

from .. import paths
from ..cli import number

EXPERIMENT = "draft_rows"
TABLE = "draft_rows.md"
WIDTHS = (12288, 16384, 20480, 24576, 32768, 49152)


def chain_value(top1, passes, draft):
    """``(K, E[tokens], speed-up)`` of the greedy chain at its best ``K``: ``top1 [k]`` per-position
    acceptance, ``passes [n]`` ``T(1 .. n)`` and ``draft [k]`` ``D(1 .. k)`` in one-token passes."""
    best, reach, tokens = (0, 1.0, 1.0), 1.0, 1.0
    for K in range(1, min(len(top1), len(draft), len(passes) - 1) + 1):
        reach *= top1[K - 1]
        tokens += reach
        speed = tokens / (passes[K] + draft[K - 1])
        if speed > best[2]:
            best = (K, tokens, speed)
    return best


def measure(widths, n_tuning: int, k: int, max_new: int, threads: int, repeats: int, seed: int, log=print):
    import torch
    from safetensors import safe_open

    from specverify.integrations import learned_draft, smollm2
    from specverify.integrations.calibrate import calibrate
    from specverify.integrations.transformers import CausalLMTarget, use_fast_linears, use_grouped_attention

    from . import prompt_sets
    from .draft_data import generate_shard
    from .draft_eval import teacher_forced, tuning_prompts

    torch.set_num_threads(threads)
    groups = {"tuning": list(tuning_prompts(n_tuning, seed).values()),
              "chat": [*prompt_sets.PROMPTS.values(), *prompt_sets.LONG_PROMPTS.values()]}
    model, tokenizer = smollm2.load()
    with safe_open(str(learned_draft.DEFAULT_WEIGHTS), "pt") as f:  # every width checked before the long part
        trained = f.get_tensor("vocab_ids")
    for width in widths:
        learned_draft.widened_rows(trained, width, model.config.vocab_size)
    answers = {g: generate_shard(model, tokenizer, texts, max_new, sample=False, seed=seed)
               for g, texts in groups.items()}
    use_fast_linears(model, threads)
    use_grouped_attention(model)
    rows = []
    for width in widths:
        head = learned_draft.load(model, rows=width)
        target = CausalLMTarget(model)
        chain = learned_draft.LearnedDraft(head, target)
        costs = calibrate(model, {"learned": chain}, max_tokens=k + 1, max_draft=k, repeats=repeats, target=target,
                          generator=torch.Generator().manual_seed(seed))
        chain.tap.remove()  # its hooks on the target would slow the next width's passes
        row = {"rows": width, "passes": list(costs.target), "draft": list(costs.drafts["learned"]),
               "one_pass_ms": 1e3 * costs.meta["one_token_pass_s"]}
        for group, texts in groups.items():
            forced = teacher_forced(model, tokenizer, head, texts, max_new, k, seed, answers=answers[group])
            K, tokens, speed = chain_value(forced["top1"], costs.target, costs.drafts["learned"])
            row[group] = {"coverage": forced["vocab_coverage"], "top1": forced["top1"], "positions": forced["positions"],
                          "K": K, "tokens": tokens, "speedup": speed}
            log(f"rows {width}, {group}: top-1 {[round(x, 3) for x in forced['top1']]}, coverage "
                f"{forced['vocab_coverage']:.3f}, D(1..{k}) {[round(x, 3) for x in row['draft']]}, best K {K}: "
                f"{tokens:.2f} tokens, {speed:.3f}x")
        rows.append(row)
    return {"rows": rows, "prompts": {g: len(t) for g, t in groups.items()}, "n_tuning": n_tuning, "k": k, "max_new": max_new,
            "threads": threads, "repeats": repeats}


def write_table(result, meta, path, command):
    best = max(result["rows"], key=lambda r: r["chat"]["speedup"])
    k = result["k"]
    n = result["prompts"]
    lines = ["# How many LM-head rows the learned draft proposes from", "",
             f"Machine: {meta['platform']}, {result['threads']} torch thread(s), {meta['utc'][:10]}; command: "
             f"`{command}`; prompts (none held out; {result['max_new']} new tokens, greedy): tuning, {n['tuning']} of "
             f"the training kind from a chunk no training reaches; chat, the project's PROMPTS and LONG_PROMPTS "
             f"({n['chat']}).", "",
             "Top-1: the draft's argmax at step i (teacher-forced; its rows: the width's and the context's tokens, "
             "as the drafts propose) equals the target's over all tokens. Costs: "
             "calibrated in this run, in one-token target passes (T(1) in ms). Modelled speed-up: a greedy chain "
             "at its best K, top-1 read as per-position acceptance. Chosen: the best modelled speed-up on the chat "
             "prompts.", "",
             "| rows | prompts | can propose, of the answers' tokens | " + " | ".join(f"top-1 step {i + 1}" for i in range(k))
             + " | T(1) ms | D(1) | best K | D(K) | tokens/pass | modelled speed-up |",
             "|--:|---|--:|" + "--:|" * k + "--:|--:|--:|--:|--:|--:|"]
    for r in result["rows"]:
        for group in ("tuning", "chat"):
            g = r[group]
            mark = " **(chosen)**" if r is best and group == "chat" else ""
            lines.append(f"| {r['rows']}{mark} | {group} ({g['positions']} positions) | {g['coverage']:.3f} | "
                         + " | ".join(f"{x:.3f}" for x in g["top1"])
                         + f" | {r['one_pass_ms']:.1f} | {r['draft'][0]:.3f} | {g['K']} | {r['draft'][g['K'] - 1]:.3f} "
                         f"| {g['tokens']:.2f} | {g['speedup']:.3f}x |")
    lines += ["", "The held-out sets are judged once, at the chosen width, by "
              "`python -m experiments.end_to_end.draft_eval` (media/learned_draft.md).", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.end_to_end.draft_rows", description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="comma-separated row counts to judge")
    ap.add_argument("--tuning", type=number(int, 1), default=48, help="tuning prompts (with the project's 5)")
    ap.add_argument("--k", type=number(int, 1, 8), default=4, help="draft steps judged")
    ap.add_argument("--max-new", type=number(int, 8), default=96, help="answer tokens per prompt")
    ap.add_argument("--threads", type=number(int, 1), default=1)
    ap.add_argument("--repeats", type=number(int, 1), default=7, help="timings per cost (the least is kept)")
    ap.add_argument("--seed", type=number(int, 0), default=0)
    args = ap.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        ap.error(f"--widths must be comma-separated integers, got {args.widths!r}")
    if any(w < 1 for w in widths):
        ap.error(f"--widths must be positive, got {args.widths!r}")
    params = dict(widths=widths, tuning=args.tuning, k=args.k, max_new=args.max_new, threads=args.threads,
                  repeats=args.repeats, seed=args.seed)
    out_dir = paths.result_dir(EXPERIMENT, params)
    try:
        result = measure(widths, args.tuning, args.k, args.max_new, args.threads, args.repeats, args.seed)
    except ValueError as error:  # a width below the file's trained rows or above the vocabulary
        ap.error(f"--widths: {error}")
    meta = paths.run_metadata()
    paths.write_json(out_dir / "result.json", dict(result, meta=meta))
    command = "python -m experiments.end_to_end.draft_rows" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    best = write_table(result, meta, paths.MEDIA_DIR / TABLE, command)
    print(f"wrote {paths.MEDIA_DIR / TABLE}: chosen {best['rows']} rows ({best['chat']['speedup']:.3f}x modelled)")


if __name__ == "__main__":
    main()
