"""Benchmark of the verification ops: specverify against pure torch, NumPy and the memory-read floor.

    python -m experiments.benchmarks.ops            # full run, a few minutes
    python -m experiments.benchmarks.ops --quick    # smoke run (CI): tiny budget, small cold pool
    python -m experiments.benchmarks.ops --plot-only

Sweep (declared as data below): sizes (V, K) x op {verify_greedy, accept, accept_block} x input {realistic, worst}
x cache {warm, cold}, each timed for every implementation in the same process, single thread,
round-robin so that changes in machine load hit all implementations alike.

- realistic: softmax(4 * N(0, 1)) target rows; draft rows softmax of the target logits plus Gaussian
  noise scaled so that the per-position acceptance sum_v min(p, q) is about 0.68. Greedy draft tokens
  equal the target argmax with probability 0.68; sampled draft tokens are drawn from the draft rows
  with random uniforms. A pool of such rounds is cycled, so a timing sample averages over the law's
  mix of accepted lengths (the mean is reported as n_acc).
- worst: every row the op can read is read. Greedy: all K accepted (K+1 argmaxes). accept: rejection
  at the last position (target and draft rows 0..K-1 read, then the residual), forced by explicit
  uniforms (u_i = 0 before, 1 - 2^-53 at a token with q > p). accept_block always reads every row;
  its worst case gives every row 1..K-1 a residual pass (all ratios in (0, 1)) and rejects all
  coins, so the draw scans row 0's residual.
- warm: the same rows every call (realistic cycles tokens/uniforms over them).
- cold: rounds laid end to end over a row pool larger than 2 x (last-level cache + all L2): each round
  starts at the row after the previous round's last read row, so one pass over the rounds reads
  every row exactly once, and the rounds are called in a fixed shuffled order; every call reads its
  rows from DRAM.

Implementations: ``specverify`` (``verify_greedy`` and ``accept_from_uniforms`` on torch tensors),
``torch`` and ``numpy`` (experiments/benchmarks/impls.py), and ``floor`` = bytes the op must read /
single-thread read bandwidth measured in this run for that read size and cache state (see
``bench_impls.ReadProbe``). Every call is timed on its own (time.perf_counter_ns, GC off, the
timer's own overhead subtracted); passes over the pool of rounds repeat until the time budget is
spent; per round the min and the median over passes are taken, and the reported min and median
are their means over the pool's rounds (the cost of the realistic mix, robust to preemption).

Further rows, each sweep in its own module: trees (bench_tree.py), batches (bench_batch.py), linear
layers for the 1-17 rows a target pass scores (bench_linear.py: sv.linear vs torch's F.linear
against reading the weight matrix once), and warping (run_warp_sweep below).

Outputs (paths below): CSV of every measurement, markdown tables (results + media/bench.md for the
README), meta JSON (machine, versions, load, settings), and media/bench.png drawn from the CSV only.
"""

from __future__ import annotations

import os

# Single thread everywhere, before NumPy/torch load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import batch as bench_batch
from . import impls as bi
from . import linear as bench_linear
from . import tree as bench_tree
from .harness import (FULL, MEDIA_DIR, QUICK, RESULTS_DIR, ROOT, Timing, _fmt, _table, default_cold_bytes,  # noqa: F401
                      kernel_flags, load_snapshot, load_specverify, machine_info, machine_line, read_csv,
                      time_round_robin, timer_overhead_ns, write_csv)

# ---------------------------------------------------------------------------------------------
# Paths and the sweep, as data
# ---------------------------------------------------------------------------------------------

CSV_NAME, OVERHEAD_CSV_NAME = "bench.csv", "overhead.csv"
MD_NAME, META_NAME, PNG_NAME = "bench.md", "meta.json", "bench.png"

SIZES = ((32000, 4), (128256, 5), (4096, 8))   # (V, K): the seed's published rows + a small one
OPS = ("verify_greedy", "accept", "accept_block")
# op: (specverify function, pure torch, NumPy)
OP_FUNCTIONS = {
    "verify_greedy": ("verify_greedy", bi.torch_verify_greedy, bi.numpy_verify_greedy),
    "accept": ("accept_from_uniforms", bi.torch_accept, bi.numpy_accept),
    "accept_block": ("accept_block_from_uniforms", bi.torch_accept_block, bi.numpy_accept_block),
}
CASES = ("realistic", "worst")
CACHES = ("warm", "cold")
IMPLS = ("specverify", "torch", "numpy")
# Warping rows: one row of logits per call, warm; (name, settings) per mode.
WARP_MODES = (("temperature 0.7", dict(temperature=0.7)), ("top-k 50", dict(top_k=50)),
              ("top-p 0.9", dict(top_p=0.9)), ("top-k 50 + top-p 0.9", dict(top_k=50, top_p=0.9)),
              ("min-p 0.05", dict(min_p=0.05)))
WARP_IMPLS = ("specverify", "torch", "transformers")
WARP_CSV_NAME = "warp.csv"
WARP_FIELDS = ("V", "mode", "impl", "min_us", "median_us", "speedup_vs_torch", "speedup_vs_transformers",
               "ratio_to_floor_min", "calls")
OVERHEAD_V, OVERHEAD_K = 8, 4


CSV_FIELDS = ("V", "K", "op", "case", "cache", "impl", "rounds", "n_accepted_mean", "bytes_mean", "min_us",
              "median_us", "passes", "calls", "speedup_vs_torch", "speedup_vs_numpy",
              "ratio_to_floor_min", "ratio_to_floor_median", "floor_method")


class Rounds:
    """Pool of verification rounds for one (V, K, op, case, cache), cycled during timing.

    Round j reads the row pool from row offsets[j]; calls[impl][j] are its arguments.
    """

    def __init__(self, pool, op, offsets, tokens, uniforms, generator):
        self.op, self.k, self.v = op, pool.k, pool.v
        self.offsets = list(offsets)
        self.calls = {"specverify": [], "torch": [], "numpy": []}
        for o, tok, u in zip(offsets, tokens, uniforms):
            t, d = pool.round(o)
            tt, td, ttok = torch.from_numpy(t), torch.from_numpy(d), torch.from_numpy(tok)
            if op == "verify_greedy":
                self.calls["specverify"].append((tt, ttok))
                self.calls["torch"].append((tt, ttok))
                self.calls["numpy"].append((t, tok))
            else:
                self.calls["specverify"].append((tt, td, ttok, u))
                self.calls["torch"].append((tt, td, ttok, torch.from_numpy(u), generator))
                self.calls["numpy"].append((t, d, tok, u))
        self.n_accepted = None

    def functions(self, sv):
        sv_name, torch_fn, numpy_fn = OP_FUNCTIONS[self.op]
        fns = {"torch": torch_fn, "numpy": numpy_fn}
        if sv is not None:
            fns["specverify"] = getattr(sv, sv_name)
        return {name: fns[name] for name in IMPLS if name in fns}

    def check(self, sv, expect_n=None, log=print):
        """Run every round once with each implementation; record n_accepted (specverify's, else
        NumPy's). Disagreement in n_accepted is reported (the Python implementations test in
        float32, specverify in float64, so a uniform within rounding of the threshold may split
        them); a forced case that does not take its path is an error."""
        fns = self.functions(sv)
        results = {name: [fns[name](*a) for a in self.calls[name]] for name in fns}
        n = [r[0] for r in results.get("specverify", results["numpy"])]
        for name, res in results.items():
            other = [r[0] for r in res]
            if other != n:
                bad = sum(a != b for a, b in zip(other, n))
                log(f"  note: {self.op}: {name} n_accepted differs from specverify in {bad} of {len(n)} rounds")
        if self.op == "verify_greedy" and "specverify" in results and results["specverify"] != results["numpy"]:
            raise AssertionError("verify_greedy: specverify and NumPy disagree")
        if expect_n is not None and any(r[0] != expect_n for res in results.values() for r in res):
            raise AssertionError(f"{self.op}: forced case did not give n_accepted = {expect_n}")
        self.n_accepted = n
        return n

    def bytes_each(self):
        return [bi.bytes_read(self.op, self.v, self.k, n) for n in self.n_accepted]


def _round_inputs(pool, op, case, offset, rng):
    t, d = pool.round(offset)
    if op == "verify_greedy":
        tok = bi.realistic_greedy_tokens(t, rng) if case == "realistic" else bi.worst_greedy_tokens(t)
        return tok, None
    if case == "realistic":
        return bi.realistic_accept_inputs(t, d, rng)
    return bi.worst_block_inputs(t, d) if op == "accept_block" else bi.worst_accept_inputs(t, d)


def _path_length(pool, op, offset, tok, u, sv):
    """n_accepted of a round (specverify's if available)."""
    t, d = pool.round(offset)
    sv_name, _, numpy_fn = OP_FUNCTIONS[op]
    args = (t, tok) if op == "verify_greedy" else (t, d, tok, u)
    return (getattr(sv, sv_name) if sv else numpy_fn)(*args)[0]


def _rows_read(op, k, n_accepted):
    """Target rows (or row pairs) a round reads: n + 1, or all K + 1 for accept_block."""
    return k + 1 if op == "accept_block" else n_accepted + 1


def _law_pmf(k, alpha=bi.ACCEPTANCE):
    """P(n_accepted = n), n = 0..K, under a homogeneous per-position acceptance alpha:
    alpha^n (1 - alpha) for n < K, alpha^K for n = K."""
    reach = alpha ** np.arange(k + 1)                 # P(n >= j), j = 0..K
    return reach * np.concatenate([np.full(k, 1.0 - alpha), [1.0]])


def _quotas(pmf, total):
    """Largest-remainder rounding of total * pmf to integers summing to total."""
    raw = pmf * total
    q = np.floor(raw).astype(int)
    q[np.argsort(raw - q)[::-1][:total - q.sum()]] += 1
    return q


OP_LABELS = {"verify_greedy": "greedy", "accept": "accept", "accept_block": "block"}
# The accepted length each op's worst case forces.
WORST_N_ACCEPTED = {"verify_greedy": lambda k: k, "accept": lambda k: k - 1, "accept_block": lambda k: 0}


def build_rounds(pool, op, case, cache, n_warm, rng, generator, sv, cold_rows):
    """warm: rounds at row 0 (n_warm of them for 'realistic', with accepted lengths in the
    proportions of the law at acceptance 0.68; 1 for 'worst').
    cold: rounds laid end to end over the first `cold_rows` rows (each starts at the row after
    the previous round's last read row, so one pass reads each row once), called in a fixed
    shuffled order."""
    offsets, tokens, uniforms = [], [], []
    if cache == "warm" and case == "worst":
        tok, u = _round_inputs(pool, op, case, 0, rng)
        offsets.append(0), tokens.append(tok), uniforms.append(u)
    elif cache == "warm" and op == "accept_block":
        # accept_block reads every row whatever its outcome: plain random rounds.
        for _ in range(n_warm):
            tok, u = _round_inputs(pool, op, case, 0, rng)
            offsets.append(0), tokens.append(tok), uniforms.append(u)
    elif cache == "warm":
        # Stratified: accepted lengths in the proportions of the law at acceptance 0.68, so a
        # small pool has the realistic mix. Draw rounds; keep those whose length has quota left.
        quota = _quotas(_law_pmf(pool.k), n_warm)
        for _ in range(1000 * n_warm):
            if not quota.any():
                break
            tok, u = _round_inputs(pool, op, case, 0, rng)
            n = _path_length(pool, op, 0, tok, u, sv)
            if quota[n] > 0:
                quota[n] -= 1
                offsets.append(0), tokens.append(tok), uniforms.append(u)
    else:
        o = 0
        while o < cold_rows:
            tok, u = _round_inputs(pool, op, case, o, rng)
            offsets.append(o), tokens.append(tok), uniforms.append(u)
            o += _rows_read(op, pool.k, _path_length(pool, op, o, tok, u, sv))
        order = rng.permutation(len(offsets))
        offsets, tokens, uniforms = ([x[i] for i in order] for x in (offsets, tokens, uniforms))
    rounds = Rounds(pool, op, offsets, tokens, uniforms, generator)
    k = pool.k
    return rounds, (None if case == "realistic" else WORST_N_ACCEPTED[op](k))



def parse_sizes(text):
    sizes = []
    for item in text.split(","):
        v, _, k = item.partition(":")
        sizes.append((int(v), int(k)))
    return tuple(sizes)


def run_sweep(sizes, settings, sv, seed, log=print):
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    cold_bytes = settings["cold_bytes"]
    n_groups = len(sizes) * len(OPS) * len(CASES) * len(CACHES)
    budget_per_group = settings["budget_s"] / n_groups
    rows = []
    overhead_ns = timer_overhead_ns()
    log(f"timer overhead {overhead_ns} ns per call (subtracted)")
    probe = bi.ReadProbe(cold_bytes, reps=settings["probe_reps"], budget_s=settings["probe_budget_s"],
                         min_total=settings["probe_min_total"])
    for v, k in sizes:
        cold_rows = max(2 * (k + 1), math.ceil(cold_bytes / (v * bi.F32)))
        log(f"V={v} K={k}: generating {cold_rows} target and draft rows "
            f"({2 * cold_rows * v * bi.F32 / 2**20:.0f} MiB)")
        pool = bi.make_row_pool(v, k, cold_rows, rng)
        for op in OPS:
            for case in CASES:
                for cache in CACHES:
                    rounds, expect_n = build_rounds(pool, op, case, cache, settings["realistic_pool"],
                                                    rng, generator, sv, cold_rows)
                    n_acc = rounds.check(sv, expect_n, log)
                    fns = rounds.functions(sv)
                    times = time_round_robin(fns, rounds.calls, budget_per_group, settings, overhead_ns)
                    nbytes = rounds.bytes_each()
                    floor_ns = float(np.mean([probe.floor_ns(cache, b) for b in nbytes]))
                    methods = sorted({probe.method[(cache, int(b))] for b in nbytes})
                    common = dict(V=v, K=k, op=op, case=case, cache=cache, rounds=len(nbytes),
                                  n_accepted_mean=float(np.mean(n_acc)), bytes_mean=float(np.mean(nbytes)))
                    group = []
                    for name, t in times.items():
                        group.append(dict(common, impl=name, min_us=t.min_us, median_us=t.median_us,
                                          passes=t.passes, calls=t.calls))
                    group.append(dict(common, impl="floor", min_us=floor_ns / 1e3, median_us=floor_ns / 1e3,
                                      passes=0, calls=0, floor_method="+".join(methods)))
                    add_ratios(group)
                    rows.extend(group)
                    line = "  ".join(f"{g['impl']} {g['median_us']:.1f}" for g in group)
                    log(f"  {op:13s} {case:9s} {cache:4s} n_acc={np.mean(n_acc):.2f}  median us: {line}")
    return rows, probe


def run_warp_sweep(settings, sv, probe, seed, log=print):
    """Warping rows: per (V, mode), sv.warp vs the sort-based torch warp vs transformers' warpers
    on model-like rows (bench_impls.model_like_logits; settings["warp_rows"] of them cycled),
    each call one [1, V] tensor row, warm; V in settings["warp_sizes"]; floor = reading the
    row's 4 V bytes at the warm read bandwidth."""
    rng = np.random.default_rng(seed)
    rows = []
    for v in settings["warp_sizes"]:
        pool = [torch.from_numpy(r[None, :]) for r in bi.model_like_logits(v, settings["warp_rows"], rng)]
        floor_us = probe.floor_ns("warm", 4 * v) / 1e3
        for mode, kw in WARP_MODES:
            fns = {"torch": lambda x, kw=kw: bi.torch_warp(x, **kw),
                   "transformers": lambda x, kw=kw: bi.transformers_warp(x, **kw)}
            if sv is not None:
                fns = {"specverify": lambda x, kw=kw: sv.warp(x, **kw), **fns}
            timings = time_round_robin(fns, {name: [(x,) for x in pool] for name in fns},
                                       settings["budget_s"] / 15, settings)
            group = {name: dict(V=v, mode=mode, impl=name, min_us=t.min_us, median_us=t.median_us,
                                calls=t.calls) for name, t in timings.items()}
            group["floor"] = dict(V=v, mode=mode, impl="floor", min_us=floor_us, median_us=floor_us, calls=0)
            for g in group.values():
                g["ratio_to_floor_min"] = g["min_us"] / floor_us
                for other in ("torch", "transformers"):
                    g[f"speedup_vs_{other}"] = group[other]["median_us"] / g["median_us"]
            rows.extend(group.values())
            sv_us = group["specverify"]["min_us"] if "specverify" in group else float("nan")
            log(f"  warp V={v:>6} {mode:<22} specverify {sv_us:8.1f} µs, torch "
                f"{group['torch']['median_us']:8.1f}, transformers {group['transformers']['median_us']:8.1f}, "
                f"floor {floor_us:6.1f}")
    return rows


def warp_table(rows):
    """One line per (V, mode): specverify min/median, torch and transformers medians, floor."""
    header = ["V", "mode", "specverify min µs", "median µs", "torch µs", "transformers µs", "× torch",
              "× transformers", "floor µs", "÷ floor"]
    body = []
    for v in sorted({r["V"] for r in rows}):
        for mode, _ in WARP_MODES:
            by = {r["impl"]: r for r in rows if r["V"] == v and r["mode"] == mode}
            if not by:
                continue
            sv = by.get("specverify")
            body.append([str(v), mode, _fmt(sv["min_us"]) if sv else "–", _fmt(sv["median_us"]) if sv else "–",
                         _fmt(by["torch"]["median_us"]), _fmt(by["transformers"]["median_us"]),
                         _fmt(sv["speedup_vs_torch"]) if sv else "–",
                         _fmt(sv["speedup_vs_transformers"]) if sv else "–",
                         _fmt(by["floor"]["min_us"]), _fmt(sv["ratio_to_floor_min"]) if sv else "–"])
    return _table(header, body)


def add_ratios(group):
    by = {g["impl"]: g for g in group}
    floor = by["floor"]["min_us"]
    for g in group:
        for ref in ("torch", "numpy"):
            g[f"speedup_vs_{ref}"] = by[ref]["median_us"] / g["median_us"] if ref in by else None
        g["ratio_to_floor_min"] = g["min_us"] / floor
        g["ratio_to_floor_median"] = g["median_us"] / floor
        g.setdefault("floor_method", "")


def measure_overhead(sv, settings, seed):
    """Per-call time on a tiny input (V=8) against no-ops with the same argument handling."""
    rng = np.random.default_rng(seed)
    t_np, d_np = bi.make_row_pool(OVERHEAD_V, OVERHEAD_K, 1, rng).round(0)
    t, d = torch.from_numpy(t_np), torch.from_numpy(d_np)
    tok_np = bi.worst_greedy_tokens(t_np)
    tok = torch.from_numpy(tok_np)
    u = np.full(OVERHEAD_K + 1, 0.5)
    g = torch.Generator().manual_seed(seed)
    entries = []   # (label, fn, args)
    if sv is not None:
        entries += [
            ("sv.verify_greedy, torch tensors", sv.verify_greedy, (t, tok)),
            ("sv.verify_greedy, NumPy arrays", sv.verify_greedy, (t_np, tok_np)),
            ("sv.accept_from_uniforms, torch tensors", sv.accept_from_uniforms, (t, d, tok, u)),
            ("sv.accept_from_uniforms, NumPy arrays", sv.accept_from_uniforms, (t_np, d_np, tok_np, u)),
            ("sv.accept, torch tensors + torch.Generator", sv.accept, (t, d, tok, g)),
            ("sv.accept_block_from_uniforms, torch tensors", sv.accept_block_from_uniforms, (t, d, tok, u)),
        ]
        if hasattr(sv, "warp"):  # one [1, V] row of logits, temperature 0.7
            row, row_np = t[:1].clone(), np.array(t_np[:1], dtype=np.float32)
            row_out, row_np_out, in_place = torch.empty_like(row), np.empty_like(row_np), row.clone()
            entries += [
                ("sv.warp, torch tensor [1, V]", lambda x: sv.warp(x, temperature=0.7), (row,)),
                ("sv.warp, torch tensor [1, V], out=", lambda x, o: sv.warp(x, temperature=0.7, out=o),
                 (row, row_out)),
                ("sv.warp, NumPy array [1, V], out=", lambda x, o: sv.warp(x, temperature=0.7, out=o),
                 (row_np, row_np_out)),
                ("sv.warp, torch tensor [1, V], in place", lambda x: sv.warp(x, temperature=0.7, out=x),
                 (in_place,)),
                ("sv.accept_logits_from_uniforms, torch tensors, T = 0.7",
                 lambda t, d, tok, u: sv.accept_logits_from_uniforms(t, d, tok, u, temperature=0.7),
                 (t, d, tok, u)),
            ]
        conv = bi.specverify_conversion_noops(sv)
        if conv:
            entries += [
                ("no-op, same conversion as sv.verify_greedy", conv["verify_greedy"], (t, tok)),
                ("no-op, same conversion as sv.accept_from_uniforms", conv["accept_from_uniforms"],
                 (t, d, tok, u)),
            ]
            if "warp" in conv:
                entries.append(("no-op, same conversion as sv.warp (tensor, out=)", conv["warp"],
                                (t[:1], torch.empty(1, OVERHEAD_V))))
    entries += [
        ("no-op, generic pointer/shape/dtype checks", bi.noop_convert, (t, d, tok, u)),
        ("bare Python no-op call", bi.noop, (t, d, tok, u)),
    ]
    fns = {label: fn for label, fn, _ in entries}
    calls = {label: [args] for label, _, args in entries}
    times = time_round_robin(fns, calls, settings["overhead_budget_s"] * len(fns), settings,
                             timer_overhead_ns())
    return [dict(call=label, V=OVERHEAD_V, K=OVERHEAD_K, min_us=times[label].min_us,
                 median_us=times[label].median_us, calls=times[label].calls) for label in fns]



def summary_table(rows):
    """One line per (V, K, op, case, cache): specverify against torch, NumPy and the floor."""
    groups = {}
    for r in rows:
        groups.setdefault((r["V"], r["K"], r["op"], r["case"], r["cache"]), {})[r["impl"]] = r
    header = ["V, K", "op", "input", "cache", "n_acc", "specverify min µs", "median µs",
              "torch µs", "NumPy µs", "× torch", "× NumPy", "floor µs", "÷ floor"]
    body = []
    for (v, k, op, case, cache), g in groups.items():
        sv, fl = g.get("specverify"), g["floor"]
        body.append([
            f"{int(v)}, {int(k)}", op, case, cache, f"{float(fl['n_accepted_mean']):.2f}",
            _fmt(sv["min_us"]) if sv else "–", _fmt(sv["median_us"]) if sv else "–",
            _fmt(g["torch"]["median_us"]) if "torch" in g else "–",
            _fmt(g["numpy"]["median_us"]) if "numpy" in g else "–",
            _fmt(sv["speedup_vs_torch"]) if sv else "–", _fmt(sv["speedup_vs_numpy"]) if sv else "–",
            _fmt(fl["min_us"]), _fmt(sv["ratio_to_floor_min"]) if sv else "–",
        ])
    return _table(header, body)


def overhead_table(rows):
    header = ["call (V = 8, K = 4)", "min µs", "median µs"]
    body = [[r["call"], _fmt(r["min_us"]), _fmt(r["median_us"])] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))) + " |",
           "|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"]
    out += ["| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))) + " |"
            for b in body]
    return "\n".join(out)



def markdown_report(rows, overhead, meta, tree_rows=(), warp_rows=(), linear_rows=()):
    load = meta["load_start"], meta["load_end"]
    s = meta["settings"]
    tree = [] if not tree_rows else [
        "Tree verification (`sv.verify_tree_greedy`, `sv.accept_tree`; experiments/benchmarks/tree.py): "
        "EAGLE-like trees of N nodes, realistic children per rule; path = mean accepted path length; "
        "rows read = mean rows of V floats the call must read; ÷ floor = min / floor.",
        "",
        bench_tree.tree_table(tree_rows, _fmt, _table),
        "",
    ]
    return "\n".join([
        "### Benchmark: verification ops, single thread",
        "",
        f"Machine: {machine_line(meta)}. Run {meta['date']} (git {meta['machine']['git_revision']}"
        f"{', dirty' if meta['machine']['git_dirty'] else ''}), "
        f"{'quick' if meta['quick'] else 'full'} mode, load average "
        f"{load[0].get('loadavg_1m', '?')} at start, {load[1].get('loadavg_1m', '?')} at end.",
        "",
        "µs per call; specverify min and median, torch and NumPy medians; × = median speed-up of "
        "specverify; floor = bytes the op must read / read bandwidth measured in the same run for that "
        "size and cache state; ÷ floor = specverify min / floor. n_acc = mean accepted length of the "
        "rounds timed. *realistic*: per-position acceptance ≈ 0.68; *worst*: every row read (greedy: "
        "all K accepted; accept: rejection at position K-1; accept_block: all coins fail with every residual "
        "pass done). *warm*: same rows every call; *cold*: "
        f"a pass over the rounds reads {s['cold_bytes'] >> 20} MiB of distinct rows (each once), in "
        "shuffled order.",
        "",
        summary_table(rows),
        "",
        *tree,
        "Warping one row of model-like logits (N(0, 2.5²) plus a head of 20 tokens lifted by 6-12), "
        "warm: `sv.warp` against the sort-based torch warp and transformers' warpers (+ softmax); "
        "floor = reading the row once.",
        "",
        warp_table(warp_rows) if warp_rows else "(not run)",
        "",
        *([bench_linear.linear_markdown(linear_rows, _fmt, _table, s["cold_bytes"])] if linear_rows else []),
        "Python call overhead (tiny input: the kernel does almost nothing):",
        "",
        overhead_table(overhead),
        "",
        "Rerun: `python -m experiments.benchmarks.ops` (a few minutes; `--quick` for a smoke run). "
        "Raw numbers: `results/bench/bench.csv`, `tree.csv`, `warp.csv`, `linear.csv`, `overhead.csv`, "
        "`meta.json`.",
        "",
    ])


def plot(csv_path, png_path, meta=None):
    """Bar chart of median µs per call (log scale) from the CSV alone."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_csv(csv_path)
    sizes = list(dict.fromkeys((r["V"], r["K"]) for r in rows))
    caches = [c for c in CACHES if any(r["cache"] == c for r in rows)]
    impls = [i for i in IMPLS + ("floor",) if any(r["impl"] == i for r in rows)]
    colors = {"specverify": "#1f77b4", "torch": "#d62728", "numpy": "#ff7f0e", "floor": "#7f7f7f"}
    groups = [(op, case) for op in OPS for case in CASES]
    fig, axes = plt.subplots(len(caches), len(sizes), figsize=(4.2 * len(sizes), 3.4 * len(caches)),
                             squeeze=False, sharey=True)
    width = 0.8 / len(impls)
    for ci, cache in enumerate(caches):
        for si, (v, k) in enumerate(sizes):
            ax = axes[ci][si]
            for ii, impl in enumerate(impls):
                ys = []
                for op, case in groups:
                    match = [r for r in rows if (r["V"], r["K"], r["op"], r["case"], r["cache"], r["impl"])
                             == (v, k, op, case, cache, impl)]
                    ys.append(float(match[0]["median_us"]) if match else np.nan)
                xs = np.arange(len(groups)) + (ii - (len(impls) - 1) / 2) * width
                ax.bar(xs, ys, width, label=impl, color=colors[impl],
                       hatch="//" if impl == "floor" else None, alpha=0.5 if impl == "floor" else 1.0)
            ax.set_yscale("log")
            ax.set_xticks(np.arange(len(groups)))
            ax.set_xticklabels([f"{OP_LABELS[op]}\n{case}" for op, case in groups], fontsize=8)
            ax.set_title(f"V={v}, K={k}, {cache} cache", fontsize=9)
            ax.grid(axis="y", which="both", alpha=0.3)
            if si == 0:
                ax.set_ylabel("µs per call (median)")
    axes[0][0].legend(fontsize=8)
    if meta:
        fig.suptitle(f"{meta['machine']['cpu']}, single thread", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.benchmarks.ops", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny time budget, small cold pool")
    ap.add_argument("--sizes", type=parse_sizes, default=SIZES,
                    help="comma-separated V:K pairs (default: 32000:4,128256:5,4096:8)")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing in the sweep")
    ap.add_argument("--cold-bytes", type=int, default=None, help="bytes of distinct inputs cycled when cold")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--media-dir", type=Path, default=MEDIA_DIR)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the CSV in --out-dir")
    ap.add_argument("--no-batch", action="store_true", help="skip the verify_batch rows (experiments/benchmarks/batch.py)")
    ap.add_argument("--warp-only", action="store_true",
                    help="only the warping rows (writes warp.csv and prints their table)")
    ap.add_argument("--linear-only", action="store_true",
                    help="only the linear-layer rows (writes linear.csv and prints their table)")
    args = ap.parse_args(argv)

    if args.plot_only:
        meta = json.loads((args.out_dir / META_NAME).read_text())
        plot(args.out_dir / CSV_NAME, args.media_dir / PNG_NAME, meta)
        return 0

    torch.set_num_threads(1)
    settings = dict(FULL)
    if args.quick:
        settings.update(QUICK)
    machine = machine_info()
    settings.setdefault("cold_bytes", default_cold_bytes(machine["caches_bytes"], machine["cores"]))
    if args.budget is not None:
        settings["budget_s"] = args.budget
    if args.cold_bytes is not None:
        settings["cold_bytes"] = args.cold_bytes
    sv = load_specverify()
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), quick=args.quick,
                sizes=[list(s) for s in args.sizes], seed=args.seed, settings=settings, machine=machine,
                specverify=getattr(sv, "__version__", None), load_start=load_snapshot())
    print(f"machine: {machine_line(meta)}")
    print(f"load: {meta['load_start']}")
    t0 = time.perf_counter()
    if args.warp_only or args.linear_only:
        probe = bi.ReadProbe(settings["cold_bytes"], reps=settings["probe_reps"],
                             budget_s=settings["probe_budget_s"], min_total=settings["probe_min_total"])
        args.out_dir.mkdir(parents=True, exist_ok=True)
        if args.warp_only:
            warp_rows = run_warp_sweep(settings, sv, probe, args.seed)
            write_csv(args.out_dir / WARP_CSV_NAME, warp_rows, WARP_FIELDS)
            print(warp_table(warp_rows))
        if args.linear_only:
            linear_rows = bench_linear.run_linear_sweep(sv, settings, args.seed, probe, timer_overhead_ns(),
                                                        time_round_robin)
            write_csv(args.out_dir / bench_linear.LINEAR_CSV_NAME, linear_rows, bench_linear.LINEAR_CSV_FIELDS)
            print(bench_linear.linear_table(linear_rows, _fmt, _table))
        return 0
    rows, probe = run_sweep(args.sizes, settings, sv, args.seed)
    warp_rows = run_warp_sweep(settings, sv, probe, args.seed)
    linear_rows = bench_linear.run_linear_sweep(sv, settings, args.seed, probe, timer_overhead_ns(),
                                                time_round_robin)
    overhead = measure_overhead(sv, settings, args.seed)
    tree_rows = []
    if sv is not None and hasattr(sv, "accept_tree_from_uniforms"):
        tree_rows = bench_tree.run_tree_sweep(sv, settings, args.seed, probe, timer_overhead_ns(),
                                              time_round_robin, sizes=settings["tree_sizes"])
    batch = None
    if sv is not None and hasattr(sv, "verify_batch") and not args.no_batch:
        print("batch rows (verify_batch):")
        batch = bench_batch.run(sv, settings, args.seed, probe, time_round_robin, timer_overhead_ns(),
                                bench_batch.QUICK_SWEEP if args.quick else bench_batch.FULL_SWEEP)
    meta.update(load_end=load_snapshot(), elapsed_s=round(time.perf_counter() - t0, 1),
                bandwidth_GBps={f"{k[0]} {k[1]} B": round(v / 1e9, 2) for k, v in probe._cache.items()},
                floor_probe="best of " + ", ".join(probe.reductions) + " (see experiments/benchmarks/impls.py)")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.media_dir.mkdir(parents=True, exist_ok=True)
    write_csv(args.out_dir / CSV_NAME, rows, CSV_FIELDS)
    write_csv(args.out_dir / WARP_CSV_NAME, warp_rows, WARP_FIELDS)
    write_csv(args.out_dir / bench_linear.LINEAR_CSV_NAME, linear_rows, bench_linear.LINEAR_CSV_FIELDS)
    write_csv(args.out_dir / OVERHEAD_CSV_NAME, overhead, ("call", "V", "K", "min_us", "median_us",
                                                            "calls"))
    write_csv(args.out_dir / bench_tree.TREE_CSV_NAME, tree_rows, bench_tree.TREE_CSV_FIELDS)
    (args.out_dir / META_NAME).write_text(json.dumps(meta, indent=2) + "\n")
    report = markdown_report(rows, overhead, meta, tree_rows, warp_rows, linear_rows)
    if batch is not None:
        bench_batch.write(args.out_dir, *batch)
        report += "\n" + bench_batch.markdown(*batch, meta)
    (args.out_dir / MD_NAME).write_text(report)
    (args.media_dir / MD_NAME).write_text(report)
    if not args.no_plot:
        plot(args.out_dir / CSV_NAME, args.media_dir / PNG_NAME, meta)
    print()
    print(report)
    print(f"({meta['elapsed_s']} s; wrote {args.out_dir}/{{{CSV_NAME},{OVERHEAD_CSV_NAME},{MD_NAME},{META_NAME}}}, "
          f"{args.media_dir}/{MD_NAME}" + ("" if args.no_plot else f", {args.media_dir}/{PNG_NAME}") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
