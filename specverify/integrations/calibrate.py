"""Calibration: measure, on this machine, what a target pass scoring ``n`` tokens and each draft's
call cost, and cache it for the decoder (:class:`specverify.law.MeasuredCosts`).

A target pass is timed as the decoder runs it: :class:`~.transformers.CausalLMTarget` scoring
``n = 1 .. max_tokens`` tokens after a cached prefix of ``prefix_len`` tokens (the cache is
cropped back after every pass, as after a rejection), best of ``repeats`` runs per length (the
minimum is the least disturbed by other work on a shared machine), in the order
``1..N, N..1, ...`` so that a slow minute does not fall on one end of the curve. A draft is timed
by calls ``draft(prefix, k)`` for ``k = 1 .. max_draft``, the same way. Everything is divided by
the one-token pass.

Command (writes the cache the planner reads, :func:`specverify.law.cost_cache_path`)::

    python -m specverify.integrations.calibrate --model smollm2 --threads 1 [--learned] [--fast-linears]
        [--sample [--temperature T] [--top-k K] [--top-p P] [--min-p M]]

``--model`` is ``smollm2`` (the offline SmolLM2-135M, :mod:`.smollm2`) or a transformers model name
or path (loaded with ``local_files_only``); ``--out`` overrides the cache path. ``--sample`` times
the calls as sampling decoding makes them: the target's rows warped into probabilities, a model
draft's rows warped and its tokens drawn (SmolLM2's learned chain ~1.2-1.35x its greedy call here); it
writes its own cache (:func:`cost_key`), which sampling decoders should be given. Run it on a
quiet machine: the numbers are what the decoder's choices are priced with.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Callable, Dict, Mapping, Optional

import torch

from ..law.costs import MeasuredCosts, cost_cache_path, machine_name, save_costs
from .transformers import CausalLMTarget, PromptLookupDraft, Sampling

__all__ = ["calibrate", "cost_key", "main"]


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _best_times(call: Callable[[int], object], lengths, repeats: int, clock) -> Dict[int, float]:
    """``{length: least seconds of call(length)}`` over ``repeats`` sweeps, alternating direction."""
    best = {n: float("inf") for n in lengths}
    order = list(lengths)
    for r in range(repeats):
        for n in order if r % 2 == 0 else order[::-1]:
            t0 = clock()
            call(n)
            best[n] = min(best[n], clock() - t0)
    return best


def calibrate(model, drafts: Optional[Mapping[str, Callable]] = None, *, max_tokens: int = 17, max_draft: int = 8,
              prefix_len: int = 200, repeats: int = 5, generator: Optional[torch.Generator] = None,
              target: Optional[CausalLMTarget] = None, clock: Callable[[], float] = time.perf_counter,
              meta: Optional[Mapping[str, object]] = None) -> MeasuredCosts:
    """:class:`~specverify.law.MeasuredCosts` of ``model`` (a causal LM) and ``drafts``
    (``{name: draft_step}``, each called ``draft_step(prefix, k)``; drafts that share the target's
    cache, such as :class:`~.learned_draft.LearnedDraft`, take ``target``, the
    :class:`~.transformers.CausalLMTarget` timed here, default a new one over ``model``).

    The prefix is ``prefix_len`` token ids drawn uniformly with ``generator`` (the cost of a
    pass depends on the prefix's length, not its text); passes score ``1 .. max_tokens`` tokens,
    drafts are asked ``k = 1 .. max_draft``; ``repeats`` timings each, the least kept. ``meta``
    is stored with the result, next to the one-token pass's seconds, torch's thread count and
    the machine.
    """
    max_tokens = _positive(max_tokens, "max_tokens")
    max_draft = _positive(max_draft, "max_draft")
    prefix_len = _positive(prefix_len, "prefix_len")
    repeats = _positive(repeats, "repeats")
    drafts = dict(drafts or {})
    for name, step in drafts.items():
        if not isinstance(name, str) or not name or not callable(step):
            raise TypeError(f"drafts must map names to draft_step callables, got {name!r}: {step!r}")
    target = CausalLMTarget(model) if target is None else target
    vocab = target.vocab_size
    if vocab is None:
        raise ValueError("model: its vocabulary size is unknown (no output embeddings or config.vocab_size)")
    ids = torch.randint(0, vocab, (prefix_len + max_tokens,), generator=generator)
    prefix, proposal = ids[:prefix_len], ids[prefix_len:]
    with torch.inference_mode():
        target(prefix, proposal[:0])  # the prefix enters the cache once; every timed pass reuses it
        passes = _best_times(lambda n: target(prefix, proposal[: n - 1]), range(1, max_tokens + 1), repeats, clock)
        one = passes[1]
        draft_costs = {}
        for name, step in drafts.items():
            target(prefix, proposal[:0])
            times = _best_times(lambda k: step(prefix, k), range(1, max_draft + 1), repeats, clock)
            draft_costs[name] = tuple(times[k] / one for k in range(1, max_draft + 1))
    info = {"machine": machine_name(), "platform": platform.platform(), "threads": torch.get_num_threads(),
            "one_token_pass_s": one, "prefix_len": prefix_len, "repeats": repeats, "torch": torch.__version__}
    info.update(meta or {})
    return MeasuredCosts(tuple(passes[n] / one for n in range(1, max_tokens + 1)), draft_costs, info)


def cost_key(model: str, *, fast_linears: bool = False, sample: bool = False) -> str:
    """The name under which ``model``'s costs are cached (:func:`specverify.law.cost_cache_path`):
    ``model``, ``-fast`` with the fast linears, ``-sample`` when timed as sampling decoding runs."""
    return model + ("-fast" if fast_linears else "") + ("-sample" if sample else "")


def _load_model(name: str):
    if name == "smollm2":
        from . import smollm2

        return smollm2.load()[0]  # (model, tokenizer)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(name, local_files_only=True, torch_dtype=torch.float32).eval()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specverify.integrations.calibrate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a transformers model name or path")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, as the decoder will run (default 1)")
    parser.add_argument("--max-tokens", type=int, default=17, help="longest target pass timed, in tokens")
    parser.add_argument("--max-draft", type=int, default=8, help="longest draft call timed, in tokens")
    parser.add_argument("--prefix", type=int, default=200, help="cached prefix length, in tokens")
    parser.add_argument("--repeats", type=int, default=5, help="timings per length (the least is kept)")
    parser.add_argument("--learned", action="store_true", help="also time the shipped learned draft (chain and tree)")
    parser.add_argument("--fast-linears", action="store_true", help="time with use_fast_linears and grouped attention")
    parser.add_argument("--sample", action="store_true", help="time the calls as sampling decoding makes them")
    parser.add_argument("--temperature", type=float, default=1.0, help="with --sample: the warp's temperature")
    parser.add_argument("--top-k", type=int, default=0, help="with --sample: the warp's top-k (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --sample: the warp's top-p (1: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="with --sample: the warp's min-p (0: off)")
    parser.add_argument("--out", default=None, help="cost file to write (default: the user cache)")
    return parser


def main(argv=None) -> MeasuredCosts:
    parser = _parser()
    args = parser.parse_args(argv)
    threads = _positive(args.threads, "--threads")
    warp = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    if not args.sample and warp != {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}:
        parser.error("--temperature, --top-k, --top-p and --min-p need --sample")
    try:
        sampling = Sampling(greedy=not args.sample, **warp)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(threads)
    model = _load_model(args.model)
    if args.fast_linears:
        from .transformers import use_fast_linears, use_grouped_attention

        use_fast_linears(model, threads)
        use_grouped_attention(model)
    target = CausalLMTarget(model, sampling)
    drafts = {"lookup": PromptLookupDraft()}
    if args.learned:  # named as learned_draft.planned_draft's candidates; they read the mode from the target
        from .learned_draft import LearnedDraft, LearnedTreeDraft, load

        head = load(model)
        drafts["learned"] = LearnedDraft(head, target, generator=torch.Generator().manual_seed(1))
        drafts["learned_tree"] = LearnedTreeDraft(head, target)
    key = cost_key(args.model, fast_linears=args.fast_linears, sample=args.sample)
    costs = calibrate(model, drafts, max_tokens=args.max_tokens, max_draft=args.max_draft, prefix_len=args.prefix,
                      repeats=args.repeats, target=target, generator=torch.Generator().manual_seed(0),
                      meta={"model": key, "sampling": None if not args.sample else warp})
    path = save_costs(costs, args.out or cost_cache_path(key, threads))
    print(f"{path}\n" + "\n".join(f"T({n}) = {t:.3f}" for n, t in enumerate(costs.target, 1)))
    for name, values in costs.drafts.items():
        print(f"D_{name}(1..{len(values)}) = " + ", ".join(f"{v:.3f}" for v in values))
    return costs


if __name__ == "__main__":
    main()
