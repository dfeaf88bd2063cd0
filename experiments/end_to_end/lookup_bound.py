"""How much can prompt-lookup trees beat the chain? Greedy replays with oracles, on SmolLM2-135M.

Greedy decoding is deterministic: whatever the draft, the decoder emits the text plain greedy
decoding emits, and a round's proposal is a function of the text so far. So every draft's rounds
are replayed exactly, without the model, from that text, and each round is charged the measured
cost of its target pass (the median CPU seconds of a whole pass scoring n tokens after the prompt,
``use_fast_linears``, one thread: ``CachedCausalLM.logits`` for a chain, ``tree_logits`` for a
tree of n - 1 nodes). Draft calls and the decoder's own work, the same order of cost for every
draft, are left out: the ratios between drafts are what this measures.

Drafts replayed on each prompt of :data:`experiments.end_to_end.prompt_sets.PROMPTS`:

- ``chain``: :class:`~specverify.integrations.transformers.PromptLookupDraft`, K = 5 (the chain of
  ``experiments.end_to_end.real_model``);
- ``tree``: :class:`~specverify.integrations.transformers.PromptLookupTreeDraft`, 16 nodes, depth 12
  (its hindsight rule decides when to propose);
- ``first-token oracle``: for each trie shape of a grid (node budget x depth x shortest n-gram,
  every earlier continuation of the last 3, 2 (, 1) tokens, the chain's proposal first), the trie
  proposed only in the rounds whose first token is accepted, else nothing; the best shape over the
  prompt set is reported. No rule that decides from the prefix when to propose can do better with
  these tries;
- ``path oracle``: each round proposes exactly the accepted part of the best continuation (up to
  16 tokens) of any earlier occurrence of the last token, charged for those tokens only. It bounds
  every draft that copies what followed an earlier occurrence of the last token, whatever its tree
  and its gate.

``python -m experiments.end_to_end.lookup_bound`` generates the greedy texts and measures the pass costs (about
a minute; cached in ``results/lookup_bound/summary.json`` for one ``--max-new``, ``--recompute`` to
redo) and prints per prompt tok/s over plain decoding and over the chain, and their mean over the
prompts (the measure of issue 16's goal, a tree at >= 1.2x the chain).
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import paths

EXPERIMENT = "lookup_bound"
CHAIN_K, TREE_BUDGET, TREE_DEPTH = 5, 16, 12
GRID = dict(budget=(4, 8, 12, 16, 32), depth=(4, 8, 12, 16), min_ngram=(1, 2))
PASS_TOKENS = 1 + max(GRID["budget"])  # costs measured for passes scoring 1..PASS_TOKENS tokens

Proposal = Tuple[List[int], List[int]]  # (tokens [N], parents [N]) of a draft tree; a chain is a tree


def accepted_depth(tokens: Sequence[int], parents: Sequence[int], truth: torch.Tensor) -> int:
    """Nodes on the tree's longest root path that agrees with ``truth`` ``[m]`` (the greedy verdict)."""
    depth = {-1: 0}  # node -> accepted path length ending at it (agreeing nodes only)
    best = 0
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        d = depth.get(parent)
        if d is not None and d < truth.numel() and int(truth[d]) == token:
            depth[i] = d + 1
            best = max(best, d + 1)
    return best


def replay(prompt_ids, text, propose: Callable[[torch.Tensor, torch.Tensor], Proposal],
           cost: Callable[[int, bool], float], oracle: bool = False) -> dict:
    """Decode ``text`` (greedy continuation of ``prompt_ids``) with the proposals of
    ``propose(seq, rest)`` (``rest``: the text still to come, for the path oracle only).

    Each round accepts the tree's longest agreeing path, emits it and the next token of ``text``,
    and costs ``cost(n, is_tree)`` for n = nodes + 1 scored tokens. ``oracle``: a proposal whose
    first token would be rejected is replaced by none. Returns tok/s and tokens per pass."""
    truth = torch.as_tensor(text, dtype=torch.int64).reshape(-1)
    seq = torch.as_tensor(prompt_ids, dtype=torch.int64).reshape(-1)
    pos, seconds, rounds = 0, 0.0, 0
    while pos < truth.numel():
        rest = truth[pos:]
        tokens, parents = propose(seq, rest)
        accepted = accepted_depth(tokens, parents, rest)
        if oracle and accepted == 0:
            tokens, parents = [], []
        is_tree = any(p != i - 1 for i, p in enumerate(parents))
        seconds += cost(len(tokens) + 1, is_tree)
        emitted = min(accepted + 1, rest.numel())
        seq = torch.cat([seq, rest[:emitted]])
        pos += emitted
        rounds += 1
    return dict(tokens_per_s=pos / seconds, tokens_per_pass=pos / rounds)


def chain_draft(k: int = CHAIN_K):
    from specverify.integrations.transformers import PromptLookupDraft

    draft = PromptLookupDraft()

    def propose(seq, rest):
        tokens = draft(seq, k)[0].tolist()
        return tokens, list(range(-1, len(tokens) - 1))
    return propose


def tree_draft(budget: int = TREE_BUDGET, depth: int = TREE_DEPTH):
    from specverify.integrations.transformers import PromptLookupTreeDraft

    draft = PromptLookupTreeDraft(budget)

    def propose(seq, rest):
        tree = draft(seq, depth)
        return tree.tokens.tolist(), tree.parents.tolist()
    return propose


def trie_draft(budget: int, depth: int, min_ngram: int):
    """Every candidate, always: :class:`PromptLookupTreeDraft`'s continuations (the chain's proposal,
    then each earlier continuation of the last 3, 2, ..., ``min_ngram`` tokens, earliest first)
    merged into a trie of ``budget`` nodes, without its rule for when to propose."""
    from specverify.integrations.transformers import PromptLookupTreeDraft
    from specverify.decoding.tree_drafts import Trie

    candidates = PromptLookupTreeDraft(budget, min_ngram=min_ngram)

    def propose(seq, rest):
        trie = Trie(budget)
        for continuation in candidates.continuations(seq, depth):
            if trie.full:
                break
            trie.insert(continuation.tolist())
        return list(trie.tokens), list(trie.parents)
    return propose


def path_oracle(depth: int = 16):
    """The accepted part of the best continuation (up to ``depth`` tokens) of any earlier
    occurrence of the last token: an oracle, it reads the text still to come."""

    def propose(seq, rest):
        best: List[int] = []
        for start in (seq[:-1] == seq[-1]).nonzero().flatten().tolist():
            continuation = seq[start + 1 : start + 1 + depth]
            n = 0
            while n < min(continuation.numel(), rest.numel()) and continuation[n] == rest[n]:
                n += 1
            if n > len(best):
                best = rest[:n].tolist()
        return best, list(range(-1, len(best) - 1))
    return propose


def analyse(prompts: Dict[str, tuple], cost: Callable[[int, bool], float]) -> dict:
    """Per prompt (name -> (prompt_ids, text)) the replays of every draft, and the best oracle shape."""
    def run(make, oracle=False):
        return {name: replay(ids, text, make(), cost, oracle) for name, (ids, text) in prompts.items()}

    plain = run(lambda: (lambda seq, rest: ([], [])))  # no draft: one token per pass
    out = {"plain": {name: r["tokens_per_s"] for name, r in plain.items()}, "drafts": {}}

    out["drafts"]["chain"] = run(chain_draft)
    out["drafts"]["tree"] = run(tree_draft)
    best = None
    for budget, depth, min_ngram in itertools.product(*GRID.values()):
        res = run(lambda: trie_draft(budget, depth, min_ngram), oracle=True)
        mean = np.mean([res[n]["tokens_per_s"] / out["drafts"]["chain"][n]["tokens_per_s"] for n in prompts])
        if best is None or mean > best[0]:
            best = (mean, dict(budget=budget, depth=depth, min_ngram=min_ngram), res)
    out["drafts"]["first-token oracle"] = best[2]
    out["oracle_shape"] = best[1]
    out["drafts"]["path oracle"] = run(path_oracle)
    return out


def table(result: dict) -> str:
    names = list(result["plain"])
    chain = result["drafts"]["chain"]
    lines = [f"{'draft':20s} " + " ".join(f"{n:>22s}" for n in names) + f" {'mean x chain':>13s}",
             f"{'':20s} " + " ".join(f"{'x plain  x chain  tok/pass':>22s}" for _ in names)]
    for draft, res in result["drafts"].items():
        ratios = [res[n]["tokens_per_s"] / chain[n]["tokens_per_s"] for n in names]
        cells = [f"{res[n]['tokens_per_s'] / result['plain'][n]:7.2f} {r:8.3f} {res[n]['tokens_per_pass']:9.2f}"
                 for n, r in zip(names, ratios)]
        lines.append(f"{draft:20s} " + " ".join(f"{c:>22s}" for c in cells) + f" {np.mean(ratios):13.3f}")
    shape = result["oracle_shape"]
    lines.append(f"(first-token oracle: best of {int(np.prod([len(v) for v in GRID.values()]))} trie shapes, "
                 f"budget {shape['budget']}, depth {shape['depth']}, n-grams down to {shape['min_ngram']})")
    return "\n".join(lines)


def measure(max_new: int = 64, reps: int = 5, log=print) -> dict:
    """Greedy texts of the prompts and the median CPU seconds of passes scoring 1..PASS_TOKENS tokens."""
    from specverify.integrations import smollm2
    from specverify.integrations.transformers import CachedCausalLM, use_fast_linears

    from . import prompt_sets

    torch.set_num_threads(1)
    model, tokenizer = smollm2.load(log=log)
    use_fast_linears(model)
    prompts = {}
    for name, ids in prompt_sets.chat_ids(tokenizer, prompt_sets.PROMPTS).items():
        out = model.generate(ids[None], do_sample=False, max_new_tokens=max_new, pad_token_id=tokenizer.eos_token_id)
        text = out[0, ids.numel():]
        prompts[name] = (ids.tolist(), text[text != tokenizer.eos_token_id].tolist())
    lm = CachedCausalLM(model)
    ids = torch.as_tensor(next(iter(prompts.values()))[0])
    fill = torch.randint(100, 20000, (PASS_TOKENS,), generator=torch.Generator().manual_seed(0))
    seq = torch.cat([ids, fill])
    chain_s = {n: [] for n in range(1, PASS_TOKENS + 1)}
    tree_s = {n: [] for n in range(2, PASS_TOKENS + 1)}
    parents = torch.tensor([(i - 1) // 2 if i else -1 for i in range(PASS_TOKENS)])  # a bushy tree
    lm.logits(ids, 1)
    for _ in range(reps):
        for n in range(1, PASS_TOKENS + 1):
            t0 = time.process_time()
            lm.logits(seq[: ids.numel() + n], n)
            chain_s[n].append(time.process_time() - t0)
        for n in range(2, PASS_TOKENS + 1):  # n - 1 nodes, node i's parent (i - 1) // 2
            lm.logits(ids, 1)  # drops the last tree: a tree extending it would feed only its new nodes
            t0 = time.process_time()
            lm.tree_logits(ids, fill[: n - 1], parents[: n - 1])
            tree_s[n].append(time.process_time() - t0)
    return dict(paths.run_metadata(), max_new=max_new, prompts=prompts,
                chain_seconds={n: float(np.median(v)) for n, v in chain_s.items()},
                tree_seconds={n: float(np.median(v)) for n, v in tree_s.items()})


def cost_model(summary: dict) -> Callable[[int, bool], float]:
    chain = {int(n): s for n, s in summary["chain_seconds"].items()}
    tree = {int(n): s for n, s in summary["tree_seconds"].items()}

    def cost(n: int, is_tree: bool) -> float:
        return (tree if is_tree and n in tree else chain)[n]
    return cost


def main(argv: Optional[Sequence[str]] = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--recompute", action="store_true")
    args = ap.parse_args(argv)
    path = paths.RESULTS_DIR / EXPERIMENT / "summary.json"
    if args.recompute or not path.exists() or paths.read_json(path).get("max_new") != args.max_new:
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_json(path, measure(args.max_new))
    summary = paths.read_json(path)
    prompts = {name: tuple(v) for name, v in summary["prompts"].items()}
    print(table(analyse(prompts, cost_model(summary))))


if __name__ == "__main__":
    main()
