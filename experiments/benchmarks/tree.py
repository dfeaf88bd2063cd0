"""Benchmark rows for tree verification (``sv.verify_tree_greedy``, ``sv.accept_tree``), run by
``python -m experiments.benchmarks.ops`` after the chain sweep, with its timer and read-bandwidth probe.

Sweep (as data below): trees of N = 16 and 64 nodes (EAGLE-like: 4 children at the root, then
3, 2, 2, 1 per node by depth, breadth first) at V = 32000 and 128256 x rule {greedy,
deterministic children, without replacement, with replacement} x cache {warm, cold}.

- Rows: ``experiments.benchmarks.impls.make_row_pool`` (softmax(4 N(0, 1)) targets, drafts with
  per-position acceptance ~0.68); position r of a round reads target row o + r and draft row
  o + r.
- Children (realistic): greedy: the first child of a position is the target's argmax with
  probability 0.68, the others random tokens; deterministic: the draft's top-k; without
  replacement: a Gumbel-top-k draw from the draft row; with replacement: i.i.d. draft draws.
- warm: one tree's rows, a pool of draws cycled.  cold: a round at every row offset of a pool
  larger than the caches, called in shuffled order.  A call reads only the rows of the positions
  its path visits, so rounds laid end to end (as the chain sweep does) would read a small part
  of the pool, which would then stay cached; overlapping rounds read each row a few times per
  pass instead, at random distances far larger than the caches.
- floor: the bytes the call must read (target rows of the visited positions, plus the draft rows
  of those with children for the sampled rules; re-reads for residual passes not counted) / the
  read bandwidth measured in the same run.
"""

from __future__ import annotations

import math

import numpy as np

from . import impls as bi

TREE_SIZES = ((32000, 16), (32000, 64), (128256, 16), (128256, 64))   # (V, N)
TREE_RULES = ("greedy", "deterministic", "without_replacement", "with_replacement")
BRANCHING = (4, 3, 2, 2, 1)   # children per node by depth (the last repeats)
TREE_CSV_NAME = "tree.csv"
TREE_CSV_FIELDS = ("V", "N", "rule", "cache", "impl", "rounds", "n_accepted_mean", "bytes_mean", "min_us",
                   "median_us", "passes", "calls", "ratio_to_floor_min", "ratio_to_floor_median", "floor_method")


def eagle_like_parents(n, branching=BRANCHING):
    """``[n]`` parents of a breadth-first tree whose nodes at depth d have branching[d] children."""
    parents, frontier, depth = [], [-1], 0
    while len(parents) < n:
        width = branching[min(depth, len(branching) - 1)]
        next_frontier = []
        for parent in frontier:
            for _ in range(width):
                if len(parents) == n:
                    break
                next_frontier.append(len(parents))
                parents.append(parent)
        frontier, depth = next_frontier, depth + 1
    return np.array(parents, dtype=np.int64)


def draw_tokens(rule, target, draft, children, rng, alpha=bi.ACCEPTANCE):
    """``[N]`` tokens of a realistic tree for ``rule`` (see the module docstring)."""
    n, v = sum(len(k) for k in children), target.shape[1]
    tokens = np.zeros(n, dtype=np.int64)
    for r, kids in enumerate(children):
        if not kids:
            continue
        k = len(kids)
        if rule == "greedy":
            tokens[kids] = rng.integers(0, v, k)
            if rng.random() < alpha:
                tokens[kids[0]] = int(np.argmax(target[r]))
            continue
        q = draft[r].astype(np.float64)
        if rule == "deterministic":
            top = np.argpartition(-q, k)[:k]
            tokens[kids] = top[np.argsort(-q[top], kind="stable")]
        elif rule == "without_replacement":
            score = np.log(q) + rng.gumbel(size=v)
            top = np.argpartition(-score, k)[:k]
            tokens[kids] = top[np.argsort(-score[top], kind="stable")]
        else:
            cdf = np.cumsum(q / q.sum())
            tokens[kids] = np.minimum(np.searchsorted(cdf, rng.random(k), side="right"), v - 1)
    return tokens


def bytes_read(rule, children, path, v):
    """Rows the call must read: the visited positions' target rows, plus their draft rows when
    they have children under a sampled rule."""
    visited = [0] + [int(i) + 1 for i in path]
    rows = len(visited)
    if rule in ("without_replacement", "with_replacement"):
        rows += sum(1 for r in visited if children[r])
    return rows * v * bi.F32


def tree_call(sv, rule):
    """(function, argument builder) of the op under test for ``rule``."""
    if rule == "greedy":
        return sv.verify_tree_greedy, lambda t, d, tok, par, u: (t, tok, par)
    if rule == "deterministic":
        return sv.accept_tree_from_uniforms, lambda t, d, tok, par, u: (t, None, tok, par, u)
    replacement = rule == "with_replacement"
    return (lambda t, d, tok, par, u: sv.accept_tree_from_uniforms(t, d, tok, par, u, replacement=replacement),
            lambda t, d, tok, par, u: (t, d, tok, par, u))


def run_tree_sweep(sv, settings, seed, probe, overhead_ns, time_round_robin, log=print, sizes=TREE_SIZES):
    """Rows (dicts) for every (V, N, rule, cache): specverify's min and median µs and the floor."""
    import torch
    from specverify.law import tree_children  # bench itself runs without specverify; this sweep needs it

    rng = np.random.default_rng(seed + 14)
    cold_bytes = settings["cold_bytes"]
    groups = len(sizes) * len(TREE_RULES) * 2
    budget = settings.get("tree_budget_s", settings["budget_s"] / 3) / groups
    out = []
    pools = {}
    for v, n in sizes:
        parents = eagle_like_parents(n)
        children = tree_children(parents)
        cold_rows = max(2 * (n + 1), math.ceil(cold_bytes / (v * bi.F32)))
        if v not in pools or pools[v].rows < cold_rows + n + 1:
            log(f"tree V={v}: generating {cold_rows + n + 1} target and draft rows")
            pools[v] = bi.make_row_pool(v, 0, cold_rows + n + 1, rng)
        pool = pools[v]
        torch_parents = torch.from_numpy(parents)
        for rule in TREE_RULES:
            fn, args_of = tree_call(sv, rule)
            for cache in ("warm", "cold"):
                if cache == "warm":
                    offsets = [0] * settings["realistic_pool"]
                else:
                    offsets = list(range(0, cold_rows - n))
                    offsets = [offsets[i] for i in rng.permutation(len(offsets))]
                calls, lengths, nbytes = [], [], []
                for o in offsets:
                    t, d = pool.target[o:o + n + 1], pool.draft[o:o + n + 1]
                    tok = draw_tokens(rule, t, d, children, rng)
                    u = rng.random(n + 1)
                    args = args_of(torch.from_numpy(t), torch.from_numpy(d), torch.from_numpy(tok),
                                   torch_parents, u)
                    path, _ = fn(*args)
                    calls.append(args)
                    lengths.append(len(path))
                    nbytes.append(bytes_read(rule, children, path, v))
                times = time_round_robin({"specverify": fn}, {"specverify": calls}, budget, settings,
                                         overhead_ns)["specverify"]
                floor_ns = float(np.mean([probe.floor_ns(cache, b) for b in nbytes]))
                method = "+".join(sorted({probe.method[(cache, int(b))] for b in nbytes}))
                common = dict(V=v, N=n, rule=rule, cache=cache, rounds=len(calls),
                              n_accepted_mean=float(np.mean(lengths)), bytes_mean=float(np.mean(nbytes)))
                row = dict(common, impl="specverify", min_us=times.min_us, median_us=times.median_us,
                           passes=times.passes, calls=times.calls, floor_method=method,
                           ratio_to_floor_min=times.min_us * 1e3 / floor_ns,
                           ratio_to_floor_median=times.median_us * 1e3 / floor_ns)
                floor = dict(common, impl="floor", min_us=floor_ns / 1e3, median_us=floor_ns / 1e3, passes=0,
                             calls=0, floor_method=method, ratio_to_floor_min=1.0, ratio_to_floor_median=1.0)
                out += [row, floor]
                log(f"  tree V={v} N={n} {rule:19s} {cache:4s} path={np.mean(lengths):.2f}  "
                    f"median {times.median_us:.1f} us, floor {floor_ns / 1e3:.1f} us, "
                    f"÷ floor {row['ratio_to_floor_min']:.2f}")
    return out


def tree_table(rows, fmt, table):
    """Markdown lines: one per (V, N, rule, cache)."""
    header = ["V, N", "rule", "cache", "path", "rows read", "min µs", "median µs", "floor µs", "÷ floor"]
    body = []
    for r in rows:
        if r["impl"] != "specverify":
            continue
        body.append([f"{int(r['V'])}, {int(r['N'])}", r["rule"].replace("_", " "), r["cache"],
                     f"{float(r['n_accepted_mean']):.2f}", f"{float(r['bytes_mean']) / (int(r['V']) * bi.F32):.1f}",
                     fmt(r["min_us"]), fmt(r["median_us"]), fmt(float(r["min_us"]) / float(r["ratio_to_floor_min"])),
                     fmt(r["ratio_to_floor_min"])])
    return table(header, body)
