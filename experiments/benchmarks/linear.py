"""Linear rows of ``experiments.benchmarks.ops``: ``sv.linear`` against ``torch.nn.functional.linear`` and the
memory-read floor of the weight matrix, for the few rows a speculative target pass scores.

    python -m experiments.benchmarks.ops --linear-only    # these rows alone (results/bench/linear.csv)

Sweep (declared as data below): layer shape (out, in) x rows n x cache; ``y = x @ W.T`` in float32,
x ``[n, in]`` N(0, 1), W ``[out, in]`` N(0, 1 / in), no bias, one thread, each call allocating its
output (as a model's forward pass does).

- cold: the calls rotate over copies of W (distinct memory) totalling at least the bench's cold size
  (2 x (LLC + all L2s)); one copy when W alone is that large (SmolLM2's 49152 x 576 output layer,
  108 MiB).  Each call reads its weights from DRAM, as in a model pass that streams its layers.
- warm: the same W every call (a 1536 x 576 matrix, 3.4 MiB, stays in the last-level cache).

Implementations: ``specverify`` (``sv.linear(x, W)``), ``torch`` (``F.linear(x, W)``), and ``floor`` =
reading W once (out * in * 4 bytes) at the single-thread read bandwidth the bench's probe measures
for that size and cache state.  A cold read larger than the probe's cold region is charged the
bandwidth of a read the size of the region (a stream far beyond the caches either way).
"""

from __future__ import annotations

import math

LINEAR_IMPLS = ("specverify", "torch")
LINEAR_ROWS = (1, 2, 4, 8, 17)   # tokens a target pass scores: 1 (plain decoding) .. 17 (a tree of 16)
# (layer, out, in, caches): the output layer never fits a cache, so it is cold only.
LINEAR_SHAPES = (("SmolLM2 output layer", 49152, 576, ("cold",)),
                 ("SmolLM2 MLP up/gate", 1536, 576, ("warm", "cold")))
QUICK_LINEAR_SHAPES = (("small output layer", 2048, 64, ("cold",)),
                       ("small MLP matrix", 256, 64, ("warm", "cold")))
LINEAR_CSV_NAME = "linear.csv"
LINEAR_CSV_FIELDS = ("layer", "out", "in", "n", "cache", "impl", "copies", "bytes", "min_us", "median_us",
                     "passes", "calls", "speedup_vs_torch", "ratio_to_floor_min", "ratio_to_floor_median",
                     "floor_method")
F32 = 4


def weight_copies(cache, nbytes, cold_bytes):
    """Distinct copies of the weights the calls rotate over: 1 warm; enough to fill cold_bytes cold."""
    return 1 if cache == "warm" else max(1, math.ceil(cold_bytes / nbytes))


def weight_floor_ns(probe, cache, nbytes):
    """(ns, method): reading nbytes of weights once.  A cold read beyond the probe's cold region
    is charged the bandwidth measured for a read the size of the region."""
    read = nbytes if cache == "warm" else min(nbytes, probe.cold_region_bytes)
    ns = nbytes / probe.bandwidth(cache, read) * 1e9
    method = probe.method[(cache, int(read))]
    return ns, method if read == nbytes else f"{method} at {read >> 20} MiB"


def run_linear_sweep(sv, settings, seed, probe, overhead_ns, time_round_robin, log=print):
    """Rows (dicts) for every (layer, n, cache) and implementation, floor included.

    settings: linear_shapes (default LINEAR_SHAPES), linear_rows (LINEAR_ROWS), linear_budget_s
    (seconds of timing over the whole sweep), cold_bytes, and time_round_robin's own."""
    import torch
    import torch.nn.functional as F

    fns = {"torch": F.linear}
    if sv is not None and hasattr(sv, "linear"):
        fns = {"specverify": sv.linear, **fns}
    shapes = settings.get("linear_shapes", LINEAR_SHAPES)
    n_rows = settings.get("linear_rows", LINEAR_ROWS)
    budget = settings["linear_budget_s"] / (len(n_rows) * sum(len(caches) for *_, caches in shapes))
    generator = torch.Generator().manual_seed(seed + 21)
    out_rows = []
    for layer, n_out, n_in, caches in shapes:
        nbytes = n_out * n_in * F32
        weight = torch.randn(n_out, n_in, generator=generator) / math.sqrt(n_in)   # [out, in]
        for cache in caches:
            copies = weight_copies(cache, nbytes, settings["cold_bytes"])
            weights = [weight] + [weight.clone() for _ in range(copies - 1)]
            floor_ns, method = weight_floor_ns(probe, cache, nbytes)
            for n in n_rows:
                x = torch.randn(n, n_in, generator=generator)                      # [n, in]
                if "specverify" in fns:   # the op computes what torch does before it is timed
                    torch.testing.assert_close(fns["specverify"](x, weight), F.linear(x, weight),
                                               rtol=1e-4, atol=1e-4)
                calls = [(x, w) for w in weights]
                times = time_round_robin(fns, {name: calls for name in fns}, budget, settings, overhead_ns)
                common = dict(layer=layer, out=n_out, n=n, cache=cache, copies=copies, bytes=nbytes,
                              floor_method=method, **{"in": n_in})
                group = {name: dict(common, impl=name, min_us=t.min_us, median_us=t.median_us,
                                    passes=t.passes, calls=t.calls) for name, t in times.items()}
                group["floor"] = dict(common, impl="floor", min_us=floor_ns / 1e3, median_us=floor_ns / 1e3,
                                      passes=0, calls=0)
                for g in group.values():
                    g["speedup_vs_torch"] = group["torch"]["median_us"] / g["median_us"]
                    g["ratio_to_floor_min"] = g["min_us"] * 1e3 / floor_ns
                    g["ratio_to_floor_median"] = g["median_us"] * 1e3 / floor_ns
                out_rows.extend(group.values())
                line = "  ".join(f"{name} {g['min_us']:.1f}/{g['median_us']:.1f}" for name, g in group.items())
                log(f"  linear {n_out}x{n_in} n={n:2d} {cache:4s} min/median us: {line}")
            del weights
    return out_rows


def linear_table(rows, fmt, table):
    """Markdown lines: one per (layer, n, cache): specverify min/median, torch median, floor."""
    header = ["layer", "out × in", "weights", "cache", "n", "specverify min µs", "median µs", "torch µs",
              "× torch", "floor µs", "÷ floor"]
    groups = {}
    for r in rows:
        groups.setdefault((r["layer"], r["out"], r["in"], r["cache"], r["n"]), {})[r["impl"]] = r
    body = []
    for (layer, n_out, n_in, cache, n), g in groups.items():
        sv, nbytes = g.get("specverify"), int(n_out) * int(n_in) * F32
        size = f"{nbytes / 2**20:.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        body.append([layer, f"{n_out} × {n_in}", size, cache, str(n),
                     fmt(sv["min_us"]) if sv else "–", fmt(sv["median_us"]) if sv else "–",
                     fmt(g["torch"]["median_us"]), fmt(sv["speedup_vs_torch"]) if sv else "–",
                     fmt(g["floor"]["min_us"]), fmt(sv["ratio_to_floor_min"]) if sv else "–"])
    return table(header, body)


def linear_markdown(rows, fmt, table, cold_bytes):
    """The bench.md section: what the rows mean, then the table."""
    return "\n".join([
        "Linear layers for the rows a target pass scores (`sv.linear(x, W)` = x @ W.T in float32, "
        "experiments/benchmarks/linear.py) against `torch.nn.functional.linear`, both allocating their "
        "output; n = rows of x; floor = reading W once (out × in × 4 bytes) at the read bandwidth "
        "measured in this run; ÷ floor = specverify min / floor. *cold*: the calls rotate over copies "
        f"of W totalling at least {cold_bytes >> 20} MiB (one copy when W alone is larger), so every "
        "call reads W from DRAM; *warm*: the same W every call.",
        "",
        linear_table(rows, fmt, table),
        "",
    ])

