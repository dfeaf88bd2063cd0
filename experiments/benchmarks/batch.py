"""Batch rows of ``experiments.benchmarks.ops``: ``verify_batch`` against a Python loop of single-op calls
and against the summed memory-read floors of its requests, on 1 and 2 threads.

    python -m experiments.benchmarks.batch            # batch rows only (results/bench/batch.*)
    python -m experiments.benchmarks.batch --quick    # smoke run

Sweep (data below): R requests x V x method {token, greedy} x cache {warm, cold}; K_r uniform in
0..8, rows as the main bench's *realistic* case (draft = target logits plus noise, per-position
acceptance about 0.68; token-wise: tokens drawn from the draft rows, with draft probabilities;
greedy: each token the row's argmax with probability 0.68).

- warm: the same batch every call (whatever of it fits in the caches stays there);
- cold: distinct batches totalling at least the main bench's cold size (2 x (LLC + L2s)) cycled in
  turn, so each call reads its rows from DRAM (R = 256 is far larger than the caches on its own).

Implementations: ``batch`` (``sv.verify_batch``, explicit uniforms, NumPy arrays) on 1 and 2
threads; ``batch 2t asleep``: 2 threads with the helpers' spin-before-sleep off, so that every
call wakes a sleeping helper (a serving engine's case: a model's forward pass between two calls
outlasts the spin window; the other 2-thread calls, back to back, mostly find the helper
spinning); ``loop`` (the single op, ``sv.accept_from_uniforms`` or ``sv.verify_greedy``, per request
on NumPy views sliced before timing, so the loop is not charged for slicing); ``floor`` = sum over
the batch's requests of the bytes each
must read divided by the single-thread read bandwidth the main bench's probe measures for that
read size and cache state; ``batch floor`` = for warm batches, their total bytes divided by the
bandwidth of one buffer of that total size read again and again (a batch of 8 requests at V =
32000 is already 4 MB, beyond L2, so the summed per-request floors, each at L2 speed, are no
reachable time for it), for cold ones the summed floors.  Per-request cost at V = 8 (kernels
doing almost nothing) is the slope (T(R) - T(1)) / (R - 1), an upper bound on the per-request
overhead beyond the kernel.
"""

from __future__ import annotations

import math

import numpy as np

from . import harness
from . import impls as bi

K_MAX = 8
CACHES = ("warm", "cold")
METHODS = ("token", "greedy")
IMPLS = ("batch 1t", "batch 2t", "batch 2t asleep", "loop")
OVERHEAD_V, OVERHEAD_REQUESTS = 8, (1, 256)
FULL_SWEEP = dict(requests=(1, 8, 64, 256), vocabs=(32000, 128256), budget_s=120.0)
QUICK_SWEEP = dict(requests=(1, 8), vocabs=(4096,), budget_s=2.0)
CSV_NAME, OVERHEAD_CSV_NAME, MD_NAME = "batch.csv", "batch_overhead.csv", "batch.md"

CSV_FIELDS = ("V", "R", "method", "cache", "rows_read_mean", "bytes_mean", "impl", "min_us", "median_us",
              "us_per_request", "ratio_to_floor_min", "ratio_to_batch_floor_min", "speedup_vs_loop", "speedup_2t_vs_1t",
              "speedup_2t_vs_1t_median", "dram_2t_ceiling", "ratio_to_2t_floor_min")


def make_batch(v, n_requests, rng, tau):
    """One realistic batch: dict of target [sum K + R, V], draft [sum K, V], tokens (drawn from
    the draft rows), greedy_tokens (the row's argmax with probability 0.68), cu, uniforms."""
    k = rng.integers(0, K_MAX + 1, n_requests)
    cu = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    n_tokens = int(cu[-1])
    target = np.empty((n_tokens + n_requests, v), dtype=np.float32)
    logits = np.empty((n_tokens + n_requests, v), dtype=np.float32)
    for a in range(0, target.shape[0], 64):   # chunks bound the temporaries
        b = min(target.shape[0], a + 64)
        logits[a:b] = rng.standard_normal((b - a, v), dtype=np.float32) * np.float32(bi.TARGET_LOGIT_SCALE)
        target[a:b] = bi._softmax_rows(logits[a:b].copy())
    # Draft token j of request r is verified on target row j + r: its draft is that row's noisy copy.
    paired = np.arange(n_tokens) + np.repeat(np.arange(n_requests), k)
    draft = np.empty((n_tokens, v), dtype=np.float32)
    tokens = np.empty(n_tokens, dtype=np.int64)
    for a in range(0, n_tokens, 64):
        b = min(n_tokens, a + 64)
        draft[a:b] = bi._softmax_rows(logits[paired[a:b]]
                                      + np.float32(tau) * rng.standard_normal((b - a, v), dtype=np.float32))
        cdf = np.cumsum(draft[a:b], axis=1, dtype=np.float64)
        u = rng.random(b - a)[:, None] * cdf[:, -1:]
        tokens[a:b] = np.minimum((cdf <= u).sum(axis=1), v - 1)
    del logits
    greedy_tokens = bi.realistic_greedy_tokens(np.concatenate([target[paired], target[:1]]), rng)
    return dict(target=target, draft=draft, tokens=tokens, greedy_tokens=greedy_tokens, cu=cu,
                uniforms=rng.random(n_tokens + n_requests))


def batch_call(batch, method):
    """Arguments of the timed functions: (target, draft, tokens, cu, method, uniforms, views),
    views being the per-request arguments of the single op (sliced once, outside timing)."""
    target, cu = batch["target"], batch["cu"]
    rows = [(cu[r] + r, cu[r + 1] + r + 1, cu[r], cu[r + 1]) for r in range(cu.size - 1)]
    if method == "greedy":
        tokens = batch["greedy_tokens"]
        views = [(target[a:b], tokens[c:d]) for a, b, c, d in rows]
        return target, None, tokens, cu, method, None, views
    draft, tokens, u = batch["draft"], batch["tokens"], batch["uniforms"]
    views = [(target[a:b], draft[c:d], tokens[c:d], u[a:b]) for a, b, c, d in rows]
    return target, draft, tokens, cu, method, u, views


def bytes_per_request(sv, call):
    """Bytes each request's kernel reads (its path, as the main bench counts them)."""
    *_, method, _, views = call
    op, single = (("verify_greedy", sv.verify_greedy) if method == "greedy"
                  else ("accept", sv.accept_from_uniforms))
    v = call[0].shape[1]
    return [bi.bytes_read(op, v, args[0].shape[0] - 1, single(*args)[0]) for args in views]


def _functions(sv):
    # The helpers' poll window: each 2-thread variant sets its own before its call and leaves it
    # set (restoring it after the call would race with a helper about to read it).
    spin = getattr(getattr(getattr(sv, "kernels", None), "_kernels", None), "_pool_spin_ns", None)
    default_spin = spin() if spin is not None else None

    def batch_on(threads, spin_ns=default_spin):
        def call(target, draft, tokens, cu, method, uniforms, views):
            if spin is not None:
                spin(spin_ns)
            return sv.verify_batch(target, draft, tokens, cu, method=method, uniforms=uniforms,
                                   num_threads=threads)
        return call

    asleep = batch_on(2, spin_ns=0)   # the helper sleeps as soon as its part is done

    def loop(target, draft, tokens, cu, method, uniforms, views):
        single = sv.verify_greedy if method == "greedy" else sv.accept_from_uniforms
        return [single(*args) for args in views]

    fns = {"batch 1t": batch_on(1), "batch 2t": batch_on(2), "batch 2t asleep": asleep, "loop": loop}
    return fns if spin is not None else {k: f for k, f in fns.items() if k != "batch 2t asleep"}


class DramCeiling:
    """What a second thread can gain reading DRAM, measured beside each cold cell: the time of a
    pool read (``_kernels._pool_read_ns``: the batch pool's own claiming, 1 MiB per claim) of
    ``slice_bytes`` on one thread over that on two, best of ``passes`` each, alternated. The
    slices of a ``region_bytes`` region are read in turn, so each has been evicted by the others
    before it comes back. A batch whose one-thread run is DRAM-bound cannot gain more than this
    from a second thread; the 2-thread floor of a cold cell is its summed floors over it.
    ``None`` (no ceiling) when the build has no pool probe."""

    def __init__(self, kernels, region_bytes, slice_bytes=32 << 20, passes=5):
        self.read = getattr(kernels, "_pool_read_ns", None)
        self.passes = passes
        if self.read is not None:
            words = max(1, slice_bytes // 4)
            region = np.ones(max(region_bytes // 4, 4 * words), dtype=np.uint32)  # pages touched
            self.slices = [region[i:i + words] for i in range(0, region.size - words + 1, words)]
            self.next = 0

    def __call__(self):
        if self.read is None:
            return None
        best = {1: math.inf, 2: math.inf}
        for _ in range(self.passes):
            for threads in best:
                ns = self.read(self.slices[self.next], threads)[0]
                self.next = (self.next + 1) % len(self.slices)
                best[threads] = min(best[threads], ns)
        return best[1] / best[2]


def run(sv, settings, seed, probe, time_round_robin, overhead_ns, sweep=FULL_SWEEP, log=print):
    """Rows of the batch sweep (dicts with CSV_FIELDS) and the V = 8 overhead rows.

    settings, probe, time_round_robin, overhead_ns: the main bench's (experiments.benchmarks.ops)."""
    rng = np.random.default_rng(seed)
    spin = getattr(getattr(getattr(sv, "kernels", None), "_kernels", None), "_pool_spin_ns", None)
    saved_spin = spin() if spin is not None else None
    fns = _functions(sv)
    # 8 slices of the cold size (at most 64 MiB): each is out of every cache when it comes back
    ceiling_slice = min(settings["cold_bytes"], 64 << 20)
    ceiling = DramCeiling(getattr(getattr(sv, "kernels", None), "_kernels", None), 8 * ceiling_slice, slice_bytes=ceiling_slice)
    requests, vocabs = sweep["requests"], sweep["vocabs"]
    budget = sweep["budget_s"] / (len(requests) * len(vocabs) * len(CACHES) * len(METHODS))
    rows = []
    for v in vocabs:
        tau = bi.draft_noise_for_acceptance(v, bi.ACCEPTANCE, rng)
        for n_requests in requests:
            # Cold: enough distinct batches to cover the cold size (one, when a batch alone is
            # larger); warm: the first of them, every call.
            allocated = n_requests * (K_MAX + 1) * v * bi.F32          # 2 * mean K + 1 rows each
            batches = [make_batch(v, n_requests, rng, tau)
                       for _ in range(max(1, math.ceil(settings["cold_bytes"] / allocated)))]
            for method in METHODS:
                for cache in CACHES:
                    calls = [batch_call(b, method) for b in (batches[:1] if cache == "warm" else batches)]
                    nbytes = [bytes_per_request(sv, c) for c in calls]
                    for args in calls:   # the batch and the loop agree
                        out, n = fns["batch 2t"](*args)
                        assert [(int(a), int(out[r, a])) for r, a in enumerate(n)] == fns["loop"](*args)
                    times = time_round_robin(fns, {name: calls for name in fns}, budget, settings, overhead_ns)
                    floor_us = float(np.mean([sum(probe.floor_ns(cache, x) for x in per)
                                              for per in nbytes])) / 1e3
                    # A warm batch's physical floor: its rows read at the bandwidth a buffer of the
                    # batch's whole size gets when read again and again (the summed floors charge
                    # each request its own size's, L2-resident, bandwidth, which a batch larger
                    # than L2 cannot have). Cold, the summed floors already are physical.
                    bytes_mean = float(np.mean([sum(per) for per in nbytes]))
                    batch_floor_us = probe.floor_ns("warm", int(bytes_mean)) / 1e3 if cache == "warm" else floor_us
                    dram_2t = ceiling() if cache == "cold" else None  # right after the cell's timing
                    common = dict(V=v, R=n_requests, method=method, cache=cache,
                                  rows_read_mean=bytes_mean / (v * bi.F32), bytes_mean=bytes_mean,
                                  dram_2t_ceiling=dram_2t)
                    group = {name: dict(common, impl=name, min_us=t.min_us, median_us=t.median_us)
                             for name, t in times.items()}
                    group["floor"] = dict(common, impl="floor", min_us=floor_us, median_us=floor_us)
                    group["batch floor"] = dict(common, impl="batch floor", min_us=batch_floor_us,
                                                median_us=batch_floor_us)
                    for g in group.values():
                        g["us_per_request"] = g["min_us"] / n_requests
                        g["ratio_to_floor_min"] = g["min_us"] / floor_us
                        g["ratio_to_batch_floor_min"] = g["min_us"] / batch_floor_us
                        g["speedup_vs_loop"] = group["loop"]["median_us"] / g["median_us"]
                    for name in ("batch 2t", "batch 2t asleep"):
                        if name in group:
                            one, two = group["batch 1t"], group[name]
                            two["speedup_2t_vs_1t"] = one["min_us"] / two["min_us"]
                            two["speedup_2t_vs_1t_median"] = one["median_us"] / two["median_us"]
                            if dram_2t is not None:
                                two["ratio_to_2t_floor_min"] = two["min_us"] * dram_2t / floor_us
                    rows.extend(group.values())
                    log(f"  batch V={v} R={n_requests:3d} {method:6s} {cache}: " + "  ".join(
                        f"{name} {g['min_us']:.1f}" for name, g in group.items())
                        + f" us  (÷floor 1t {group['batch 1t']['ratio_to_floor_min']:.2f}, 2t/1t " + " ".join(
                            f"{g['speedup_2t_vs_1t']:.2f}" for g in group.values() if "speedup_2t_vs_1t" in g)
                        + ("" if dram_2t is None else f", DRAM 2t/1t {dram_2t:.2f}") + ")")
            del batches
    if saved_spin is not None:
        sv.kernels._kernels._pool_spin_ns(saved_spin)
    return rows, overhead_rows(sv, settings, seed, time_round_robin, overhead_ns)


def overhead_rows(sv, settings, seed, time_round_robin, overhead_ns):
    """Per-call time at V = 8 for R = 1 and 256 (single thread, token-wise): the slope is the
    per-request cost, an upper bound on the overhead beyond the kernel."""
    import torch

    rng = np.random.default_rng(seed + 1)
    tau = bi.draft_noise_for_acceptance(OVERHEAD_V, bi.ACCEPTANCE, rng)
    variants = {  # label: (function, its arguments from a batch)
        "verify_batch, uniforms": (
            lambda b: (lambda: sv.verify_batch(b["target"], b["draft"], b["tokens"], b["cu"],
                                               uniforms=b["uniforms"], num_threads=1))),
        "verify_batch, one numpy Generator": (
            lambda b: (lambda g=np.random.default_rng(0): sv.verify_batch(
                b["target"], b["draft"], b["tokens"], b["cu"], generator=g, num_threads=1))),
        "verify_batch, a torch.Generator per request": (
            lambda b: (lambda g=[torch.Generator().manual_seed(r) for r in range(b["cu"].size - 1)]:
                       sv.verify_batch(b["target"], b["draft"], b["tokens"], b["cu"], generators=g,
                                       num_threads=1))),
        "loop of accept_from_uniforms": (
            lambda b: (lambda views=batch_call(b, "token")[-1]: [sv.accept_from_uniforms(*a) for a in views])),
    }
    fns = {}
    for n_requests in OVERHEAD_REQUESTS:
        b = make_batch(OVERHEAD_V, n_requests, rng, tau)
        for label, make in variants.items():
            fns[f"{label}, R = {n_requests}"] = make(b)
    times = time_round_robin(fns, {name: [()] for name in fns}, settings["overhead_budget_s"] * len(fns),
                             settings, overhead_ns)
    out = [dict(call=name, V=OVERHEAD_V, min_us=t.min_us, median_us=t.median_us) for name, t in times.items()]
    first, last = OVERHEAD_REQUESTS
    for label in variants:
        t0, t1 = times[f"{label}, R = {first}"].min_us, times[f"{label}, R = {last}"].min_us
        out.append(dict(call=f"{label}: per-request slope", V=OVERHEAD_V,
                        min_us=(t1 - t0) / (last - first), median_us=float("nan")))
    return out


def _fmt(x, digits=3):
    if x is None or x == "" or (isinstance(x, float) and math.isnan(x)):
        return "–"
    x = float(x)
    return f"{x:,.0f}" if x >= 100 else (f"{x:.{digits}g}" if x < 10 else f"{x:.1f}")


def table(rows):
    """One line per (V, R, cache): µs per call (min), per request, and the ratios."""
    groups = {}
    for r in rows:
        groups.setdefault((r["V"], r["R"], r["method"], r["cache"]), {})[r["impl"]] = r
    header = ["V", "R", "method", "cache", "rows read", "batch 1t µs", "µs / request", "÷ floor (1t)",
              "÷ batch floor (1t)", "batch 2t µs", "2t speed-up (min / median)", "2t, helper asleep: speed-up",
              "DRAM 2t ÷ 1t (cold)", "2t ÷ 2t floor (cold)", "loop µs", "× loop (1t)", "floor µs",
              "batch floor µs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 4 + ["--:"] * (len(header) - 4)) + "|"]
    for (v, n, method, cache), g in groups.items():
        one, two, loop, floor, batch_floor = g["batch 1t"], g["batch 2t"], g["loop"], g["floor"], g["batch floor"]
        asleep = g.get("batch 2t asleep", {})

        def speedups(row):
            return (f"{_fmt(row['speedup_2t_vs_1t'])} / {_fmt(row.get('speedup_2t_vs_1t_median'))}"
                    if row else "–")
        lines.append("| " + " | ".join([
            str(v), str(n), method, cache, _fmt(float(floor["rows_read_mean"])), _fmt(one["min_us"]),
            _fmt(float(one["us_per_request"])), _fmt(one["ratio_to_floor_min"]),
            _fmt(one["ratio_to_batch_floor_min"]), _fmt(two["min_us"]), speedups(two), speedups(asleep),
            _fmt(two.get("dram_2t_ceiling")), _fmt(two.get("ratio_to_2t_floor_min")), _fmt(loop["min_us"]),
            _fmt(float(loop["min_us"]) / float(one["min_us"])), _fmt(floor["min_us"]),
            _fmt(batch_floor["min_us"])]) + " |")
    return "\n".join(lines)


def overhead_table(rows):
    lines = ["| call (V = 8, K_r uniform in 0..8, one thread) | min µs |", "|---|--:|"]
    lines += [f"| {r['call']} | {_fmt(r['min_us'])} |" for r in rows]
    return "\n".join(lines)


def markdown(rows, overhead, meta=None):
    load = ""
    if meta:
        load = (f" Load average {meta['load_start'].get('loadavg_1m', '?')} at start, "
                f"{meta['load_end'].get('loadavg_1m', '?')} at end (2-thread numbers need a second "
                "idle core).")
    return "\n".join([
        "### Batch rows: `verify_batch` (R requests, K_r uniform in 0..8, realistic drafts)",
        "",
        "µs per call (min over passes, averaged over the batches cycled); rows read = target + draft "
        "rows the requests' kernels read; floor = sum of the requests' single-thread read floors; "
        "batch floor = warm: the same bytes read at the single-thread bandwidth of one buffer of the batch's "
        "total size, read again and again (a batch larger than L2 cannot be read at its requests' "
        "L2-resident bandwidth); cold: the summed floors; "
        "loop = the single op (`accept_from_uniforms` / `verify_greedy`) per request on pre-sliced "
        "views; 2t speed-up = batch 1t ÷ batch 2t (min over passes / median); DRAM 2t ÷ 1t = what a "
        "second thread gains reading DRAM (the pool's read probe, right after the cell: the most a "
        "DRAM-bound batch can gain); 2t floor = the summed floors over it; helper asleep: "
        "helpers sleep as soon as their part is done, so every call wakes one (a serving engine's "
        "case)." + load,
        "",
        table(rows),
        "",
        overhead_table(overhead),
        "",
    ])


def write(out_dir, rows, overhead):
    harness.write_csv(out_dir / CSV_NAME, rows, CSV_FIELDS)
    harness.write_csv(out_dir / OVERHEAD_CSV_NAME, overhead, ("call", "V", "min_us", "median_us"))


def main(argv=None):
    """Batch rows alone, with the main bench's settings, probe and timing."""
    import argparse
    import time
    from pathlib import Path

    import torch

    bench = harness  # the main bench's settings, probe and timing

    ap = argparse.ArgumentParser(prog="python -m experiments.benchmarks.batch", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing over the sweep")
    ap.add_argument("--requests", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    ap.add_argument("--vocabs", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    ap.add_argument("--cold-bytes", type=int, default=None,
                    help="bytes of distinct inputs cycled when cold (and the cold read probe's region)")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--out-dir", type=Path, default=bench.RESULTS_DIR)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sv = bench.load_specverify()
    settings = dict(bench.QUICK if args.quick else bench.FULL)
    machine = bench.machine_info()
    settings.setdefault("cold_bytes", bench.default_cold_bytes(machine["caches_bytes"], machine["cores"]))
    if args.cold_bytes is not None:
        settings["cold_bytes"] = args.cold_bytes
    sweep = dict(QUICK_SWEEP if args.quick else FULL_SWEEP)
    sweep.update({k: v for k, v in (("budget_s", args.budget), ("requests", args.requests),
                                    ("vocabs", args.vocabs)) if v is not None})
    probe = bi.ReadProbe(settings["cold_bytes"], reps=settings["probe_reps"],
                         budget_s=settings["probe_budget_s"], min_total=settings["probe_min_total"])
    meta = dict(load_start=bench.load_snapshot())
    t0 = time.perf_counter()
    rows, overhead = run(sv, settings, args.seed, probe, bench.time_round_robin, bench.timer_overhead_ns(),
                         sweep)
    meta.update(load_end=bench.load_snapshot(), elapsed_s=round(time.perf_counter() - t0, 1))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write(args.out_dir, rows, overhead)
    report = markdown(rows, overhead, meta)
    (args.out_dir / MD_NAME).write_text(report)
    print(report)
    print(f"machine: {bench.machine_line(dict(machine=machine))}; {meta['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
