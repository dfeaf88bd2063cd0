"""Train the learned draft for SmolLM2-135M on this CPU, offline: ``python -m experiments.end_to_end.train_draft``.

The draft is :class:`specverify.integrations.learned_draft.FeatureHead` (EAGLE-style: one decoder
layer over the target's last hidden state and the next token's embedding, the target's frozen norm
and a reduced-vocabulary slice of its LM head). Three cached, resumable stages, a module each:

1. **Prompts** (:mod:`experiments.end_to_end.draft_prompts`) from text that is on this machine and
   is not the project's, wrapped in instruction templates; the project's prompt sets
   (:mod:`experiments.end_to_end.prompt_sets`) are the held-out evaluation.
2. **Self-distillation data** (:mod:`experiments.end_to_end.draft_data`): the target's answers to
   the prompts (``--prompts``) and teacher-forced document chats (``--documents``), shards of
   tokens and last-layer hidden states made by ``--data-workers`` processes.
3. **Training** (:mod:`experiments.end_to_end.draft_training`): EAGLE's losses at answer positions,
   over ``--ttt-steps`` unrolled draft steps, on the ``--vocab`` rows of a reduced vocabulary, in
   two phases: phase 1 from the target's last layer over the answers to ``--prompts`` prompts
   (and ``--documents``); phase 2 continues phase 1's draft over the answers to the
   ``--more-prompts`` prompts after them (``--more-epochs``, ``--more-lr``; its rows stay phase
   1's), or, ``--more-source target``, over the answers to ``--more-prompts`` requests the target
   writes itself (drawn; the unfinished dropped). The data grows by phases a session can make,
   and a draft made before by phase 1's parameters (``--init``) is continued rather than trained
   again.

Everything lands in ``results/train_draft/<key>/`` (the data's key hashes the parameters of how
a shard is made, not how many there are; the run's key all parameters; an interrupted run resumes
at the next missing shard or from its last checkpoint, every 50 steps); the trained draft is
written to the run's folder (``draft.safetensors``) or to ``--out``, with the parameters, data
sources and token counts, the losses and the held-out teacher-forced top-1
(:func:`experiments.end_to_end.draft_eval.heldout_metrics`) in its metadata. Nothing is written over the shipped
draft (:data:`~specverify.integrations.learned_draft.DEFAULT_WEIGHTS`) unless ``--out`` names
it; the defaults are the shipped draft's parameters, so
``python -m experiments.end_to_end.train_draft --out specverify/integrations/data/smollm2_draft.safetensors``
reproduces it. ``--tiny`` is the CI-sized run (a handful of prompts, a few steps, a small
vocabulary; it says which options it overrides and refuses to write over the shipped draft).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import paths
from ..cli import number
from .draft_data import collect_data, shard_plan
from .draft_prompts import DOC_CHUNK, GEN_CHUNK, PROMPTS_VERSION, REQUESTS_VERSION
from .draft_training import ASSISTANT_HEADER, FORMAT, PRECISIONS, answer_start, reduced_vocabulary, train

EXPERIMENT = "train_draft"

#: What ``--tiny`` (the CI run) sets, whatever the command line says (it tells which options it overrides).
TINY = dict(prompts=4, more_prompts=4, gen_batch=4, max_new=12, vocab=512, max_files=300, documents=4, doc_batch=4,
            doc_len=48, data_workers=1, epochs=3, more_epochs=1, max_steps=6, batch=2, max_len=64)


def parse_args(argv=None):
    positive, count = number(int, 1), number(int, 0)
    parser = argparse.ArgumentParser(prog="python -m experiments.end_to_end.train_draft", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=count, default=12800, help=f"prompts the target answers (chunks of {GEN_CHUNK})")
    parser.add_argument("--gen-batch", type=positive, default=32, help="prompts per generate call")
    parser.add_argument("--max-new", type=positive, default=128, help="answer tokens per prompt at most")
    parser.add_argument("--documents", type=count, default=0,
                        help=f"teacher-forced document chats (chunks of {DOC_CHUNK}; 0: none)")
    parser.add_argument("--doc-batch", type=positive, default=16, help="document chats per forward")
    parser.add_argument("--doc-len", type=positive, default=384, help="tokens per document chat at most")
    parser.add_argument("--data-workers", type=positive, default=2, help="processes making data shards (one thread each)")
    parser.add_argument("--data-only", action="store_true", help="make the data shards and stop")
    parser.add_argument("--vocab", type=positive, default=12288,
                        help="rows of the draft's reduced LM head (more do not pay: experiments.end_to_end.draft_rows)")
    parser.add_argument("--epochs", type=positive, default=3, help="passes over the data")
    parser.add_argument("--ttt-steps", type=number(int, 1, 8), default=3,
                        help="draft steps unrolled in training (each later step weighs 0.8 times the one before)")
    parser.add_argument("--batch", type=positive, default=8, help="sequences per training step")
    parser.add_argument("--max-len", type=number(int, 8), default=384, help="positions per sequence in training")
    parser.add_argument("--lr", type=number(float, 0, 1, low_open=True, high_open=True), default=1e-3)
    parser.add_argument("--noise", type=number(float, 0), default=0.1, help="uniform feature noise, times the mean |h|")
    parser.add_argument("--precision", choices=("auto",) + PRECISIONS, default="auto",
                        help="the forward's matrix products (bfloat16: ~1.5x faster a step where oneDNN has bfloat16 "
                             "kernels, AVX512 or AMX; auto: bfloat16 there, float32 elsewhere)")
    parser.add_argument("--more-prompts", type=count, default=0,
                        help="phase 2: the draft trained on over the answers to this many prompts after --prompts' (0: none)")
    parser.add_argument("--more-source", choices=("templates", "target"), default="templates",
                        help="phase 2's prompts: the templates' next ones, or requests the target writes itself "
                             "(--more-prompts of them drawn, the unfinished dropped)")
    parser.add_argument("--more-epochs", type=positive, default=2, help="phase 2's passes over its data")
    parser.add_argument("--more-lr", type=number(float, 0, 1, low_open=True, high_open=True), default=5e-4,
                        help="phase 2's peak learning rate")
    parser.add_argument("--init", type=Path, default=None,
                        help="phase 1's draft made before (a file whose metadata has these parameters): train phase 2 "
                             "from it instead of making phase 1's data and training it again")
    parser.add_argument("--max-steps", type=count, default=0, help="stop each phase after this many steps (0: all epochs)")
    parser.add_argument("--seed", type=count, default=0)
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="where the draft goes (default: draft.safetensors in the run's results folder; the "
                             "shipped file is replaced only when named here)")
    parser.add_argument("--results", type=Path, default=None, help="results root (default results/)")
    parser.add_argument("--max-files", type=positive, default=6000, help="text files read for the prompts")
    parser.add_argument("--tiny", action="store_true",
                        help="the CI run: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in TINY.items()))
    args = parser.parse_args(argv)
    if args.tiny:
        given = sorted(k for k, v in TINY.items() if getattr(args, k) != parser.get_default(k))
        if given:
            print("--tiny sets " + ", ".join(f"--{k.replace('_', '-')} {TINY[k]} (not {getattr(args, k)})" for k in given))
        for k, v in TINY.items():
            setattr(args, k, v)
    if args.precision == "auto":
        args.precision = _auto_precision()
    if args.out is not None and args.out.exists() and not args.out.is_file():
        parser.error(f"--out {args.out} is not a file")
    if args.prompts % args.gen_batch and args.more_prompts:
        parser.error(f"--prompts {args.prompts} is not a multiple of --gen-batch {args.gen_batch}: --more-prompts' "
                     "answers begin a shard")
    if args.init is not None and not args.init.is_file():
        parser.error(f"--init: no file {args.init}")
    if args.prompts + args.documents == 0:
        parser.error("--prompts and --documents are both 0: there is nothing to train on")
    if args.tiny and args.out is not None and _is_shipped(args.out):
        parser.error(f"--tiny writes a toy draft: not over the shipped {args.out}")
    return args


def _auto_precision() -> str:
    """bfloat16 where oneDNN computes it natively (x86 with AVX512 or AMX), float32 elsewhere."""
    import torch

    try:
        return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return "float32"


def _is_shipped(path: Path) -> bool:
    from specverify.integrations.learned_draft import DEFAULT_WEIGHTS

    return path.resolve() == DEFAULT_WEIGHTS.resolve()


def _rows(args, plan, header):
    """The training rows of ``plan``'s shards: ``(rows_by_kind, sources, tokens_by_kind)``."""
    from .draft_data import load_sequences

    sources, tokens_by_kind, rows_by_kind = {}, {}, {"answers": [], "requests": [], "documents": []}
    for kind, c, _, path in plan:
        name = f"{kind}_c{c:03d}"
        if name not in sources:
            sources[name] = json.loads((path.parent / f"{name}.json").read_text())["sources"]
        shard_rows = [(t, h, answer_start(t, header)) for t, h in load_sequences([path]) if h.shape[0] >= args.ttt_steps + 2]
        tokens_by_kind[kind] = tokens_by_kind.get(kind, 0) + sum(int(t.numel()) for t, _, _ in shard_rows)
        tokens_by_kind[f"{kind}_trained"] = tokens_by_kind.get(f"{kind}_trained", 0) + sum(
            max(0, min(int(t.numel()), args.max_len + 1) - start) for t, _, start in shard_rows)
        rows_by_kind[kind] += shard_rows
    return rows_by_kind, sources, tokens_by_kind


def _train_phase(args, head, rows, tokens_by_kind, epochs: int, lr: float, folder: Path) -> dict:
    """Train ``head`` over ``rows`` (resumable in ``folder``, its log written there); the phase in a
    few numbers for the metadata: its sequences, tokens, steps, minutes and final losses (the last
    tenth's mean)."""
    history = train(head, rows, epochs, args.batch, args.max_len, lr, args.noise, args.seed, folder,
                    max_steps=args.max_steps, ttt_steps=args.ttt_steps, precision=args.precision)
    if not history:
        raise SystemExit(f"no training step was taken (a finished run: its checkpoint is {folder / 'checkpoint.pt'})")
    (folder / "history.json").write_text(json.dumps(history))
    last = history[-max(1, len(history) // 10):]
    return {"sequences": len(rows), "tokens_by_kind": tokens_by_kind, "steps": history[-1]["step"],
            "minutes": round(history[-1].get("seconds", 0.0) / 60, 1),
            "final": {k: round(sum(h[k] for h in last) / len(last), 4) for k in history[-1]
                      if k not in ("step", "seconds", "tokens")},
            "first": {k: round(history[0][k], 4) for k in ("loss", "top1")}}


def _phase1_params(params: dict) -> dict:
    """The parameters that make phase 1's draft (not the continuation's, not how matrices are multiplied)."""
    return {k: v for k, v in params.items() if not k.startswith("more_") and k not in ("precision", "format")}


def main(argv=None):
    import torch

    from specverify.integrations import learned_draft, smollm2

    args = parse_args(argv)
    shard_params = {k: getattr(args, k) for k in ("seed", "max_files")}
    args.answers_dir = paths.result_dir(EXPERIMENT, {"answers": {**shard_params, "gen_batch": args.gen_batch,
                                                                   "max_new": args.max_new, "prompts_version": PROMPTS_VERSION}},
                                        args.results, versioned=False)
    args.documents_dir = paths.result_dir(EXPERIMENT, {"documents": {**shard_params, "doc_batch": args.doc_batch,
                                                                       "doc_len": args.doc_len}}, args.results, versioned=False)
    args.requests_dir = paths.result_dir(EXPERIMENT, {"requests": {"seed": args.seed, "gen_batch": args.gen_batch,
                                                                     "max_new": args.max_new, "requests_version": REQUESTS_VERSION}},
                                         args.results, versioned=False)
    data_params = {k: getattr(args, k) for k in ("prompts", "gen_batch", "max_new", "documents", "doc_batch", "doc_len", "seed")}
    if args.max_files != 6000:
        data_params["max_files"] = args.max_files
    train_params = {**data_params, **{k: getattr(args, k) for k in ("vocab", "epochs", "batch", "max_len", "lr", "noise",
                                                                      "max_steps", "ttt_steps")},
                    **({"precision": args.precision} if args.precision != "float32" else {}),
                    "format": FORMAT}
    more_params = {k: getattr(args, k) for k in ("more_prompts", "more_epochs", "more_lr")}
    if args.more_source != "templates":  # (the templates' runs keep the keys they had before the option)
        more_params["more_source"] = args.more_source
    run_dir = paths.result_dir(EXPERIMENT, {"train": train_params}, args.results)
    # phase 2's data: the answers to the --more-prompts prompts after phase 1's (their own chunks), or
    # to --more-prompts requests the target writes (their own folder)
    target = args.more_source == "target"
    more = argparse.Namespace(**{**vars(args), "prompts": 0 if target else args.more_prompts, "prompts_from": args.prompts,
                                 "requests": args.more_prompts if target else 0, "documents": 0})
    more_dir = paths.result_dir(EXPERIMENT, {"train": train_params, "more": more_params}, args.results)
    init = None
    if args.init is not None:  # phase 1's draft, made before by these parameters
        init = learned_draft.metadata(args.init)
        made = _phase1_params(init.get("params", {}))
        if init.get("params", {}).get("more_prompts") or made != _phase1_params(train_params):
            raise SystemExit(f"--init {args.init} was not made by phase 1 of these parameters: it says "
                             f"{json.dumps(init.get('params'), sort_keys=True)}")
    print(f"answers: {args.answers_dir}\ndocuments: {args.documents_dir}\n"
          + (f"requests: {args.requests_dir}\n" if target and args.more_prompts else "") + f"run: {run_dir}"
          + (f"\ncontinued: {more_dir}" if args.more_prompts else ""))
    if init is None:
        collect_data(args)
    if args.more_prompts:
        collect_data(more)
    if args.data_only:
        return None
    torch.set_num_threads(args.threads)
    model, tokenizer = smollm2.load(log=print)
    model.requires_grad_(False)
    header = tokenizer(ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
    if init is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        rows_by_kind, sources, tokens_by_kind = _rows(args, shard_plan(args), header)
        rows = rows_by_kind["answers"] + rows_by_kind["documents"]
        always = sorted(set(tokenizer.all_special_ids))
        vocab_ids, coverage = reduced_vocabulary(rows_by_kind["answers"], rows_by_kind["documents"], args.vocab, always)
        print(f"{len(rows)} sequences, {sum(t.numel() for t, _, _ in rows)} tokens; reduced vocabulary "
              f"{vocab_ids.numel()} covers {coverage:.3f} of the answers' tokens")
        torch.manual_seed(args.seed)  # the head's initialization
        head = learned_draft.FeatureHead(model.config, vocab_ids).attach(model)
        head.init_from_layer(model.model.layers[-1])
        phase1 = _train_phase(args, head, rows, tokens_by_kind, args.epochs, args.lr, run_dir)
        coverage = round(coverage, 4)
    else:
        head = learned_draft.load(model, args.init)
        sources, coverage = init["sources"], init["vocab_coverage_answers"]
        phase1 = {k: init[k] for k in ("sequences", "tokens_by_kind", "steps", "minutes", "final", "first")}
        phase1["init"] = {"file": str(args.init), "params": init.get("params"), "run": init.get("run")}
    phases = [phase1]
    if args.more_prompts:  # phase 2: phase 1's draft trained on, over the answers to the next prompts
        more_dir.mkdir(parents=True, exist_ok=True)
        rows_by_kind, more_sources, tokens_by_kind = _rows(args, shard_plan(more), header)
        rows = rows_by_kind["answers"] + rows_by_kind["requests"]
        sources = {**sources, **more_sources}
        head.train().requires_grad_(True)
        phases.append(_train_phase(args, head, rows, tokens_by_kind, args.more_epochs, args.more_lr, more_dir))
    out = args.out if args.out is not None else (more_dir if args.more_prompts else run_dir) / "draft.safetensors"
    heldout = None
    if not args.tiny:  # the held-out teacher-forced top-1 (~1 min; the CI run's toy draft skips it)
        from .draft_eval import heldout_metrics

        head.eval()
        heldout = heldout_metrics(model, tokenizer, head)
        print(f"held-out teacher-forced top-1 at steps 1-4: {heldout['top1']} (random token: {heldout['random_top1']})")
    tokens_by_kind = {}
    for phase in phases:
        for kind, n in phase["tokens_by_kind"].items():
            tokens_by_kind[kind] = tokens_by_kind.get(kind, 0) + n
    meta = {"params": {**train_params, **more_params}, "sources": sources,
            "sequences": sum(s["sequences"] for s in phases),
            "tokens": sum(tokens_by_kind.get(k, 0) for k in ("answers", "requests", "documents")),
            "steps": sum(s["steps"] for s in phases),
            "tokens_by_kind": tokens_by_kind,
            "vocab_coverage_answers": coverage,
            "minutes": round(sum(s["minutes"] for s in phases), 1),  # of training, all parts
            "final": phases[-1]["final"], "first": phases[0]["first"],
            "phases": phases,
            "heldout": heldout,
            "run": paths.run_metadata()}
    learned_draft.save(head, out, meta=meta)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {json.dumps(meta['final'])}")
    return out


if __name__ == "__main__":
    main()
