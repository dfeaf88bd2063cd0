"""What every benchmark shares: the machine's description, the timing loop, the settings and the
output helpers (CSV, Markdown tables).

Timing: ``time_round_robin`` cycles the functions under test in one loop (so that drift of a shared
machine hits them alike) and reports per-call minima and medians with the timer's own overhead
subtracted.
"""

from __future__ import annotations

import csv
import gc
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import linear as bench_linear
from . import tree as bench_tree

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "results" / "bench"
MEDIA_DIR = ROOT / "media"


FULL = dict(budget_s=120.0, min_passes=5, max_calls=50000,
            realistic_pool=32, probe_reps=15, probe_budget_s=0.4, probe_min_total=8 << 20,
            overhead_budget_s=1.0, tree_budget_s=40.0, tree_sizes=bench_tree.TREE_SIZES,
            warp_sizes=(32000, 49152, 128256), warp_rows=8, linear_budget_s=45.0)
QUICK = dict(budget_s=3.0, min_passes=3, max_calls=2000, warp_sizes=(4096,), warp_rows=2,
             linear_budget_s=0.5, linear_shapes=bench_linear.QUICK_LINEAR_SHAPES, linear_rows=(1, 4),
             realistic_pool=8, probe_reps=3, probe_budget_s=0.02, probe_min_total=1 << 20,
             overhead_budget_s=0.05, cold_bytes=4 << 20, tree_budget_s=0.5, tree_sizes=((4096, 16),))


# ---------------------------------------------------------------------------------------------
# Machine description
# ---------------------------------------------------------------------------------------------

def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpuinfo():
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "stepping", "flags", "Features",
                       "CPU part", "CPU implementer") and key not in info:
                info[key] = value.strip()
    except OSError:
        pass
    return info


def _uarch_hint(cpu):
    """', Zen 4'-style hint for AMD families whose model ranges are public (a VM may hide the
    brand string, e.g. plain 'AMD EPYC'); '' otherwise."""
    if "AMD" not in cpu.get("model name", ""):
        return ""
    try:
        family, model = int(cpu["cpu family"]), int(cpu["model"])
    except (KeyError, ValueError):
        return ""
    if family == 25:
        return ", Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF \
            else ", Zen 3"
    return {23: ", Zen/Zen 2", 26: ", Zen 5"}.get(family, "")


def _caches():
    """{'L1d': bytes, 'L2': bytes per instance, 'L3': bytes, ...} of cpu0, plus sharing counts."""
    out = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for d in sorted(base.glob("index*")):
        try:
            level = (d / "level").read_text().strip()
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
        n = int(size.rstrip("KMG")) * mult
        out[f"L{level}" + ("d" if kind == "Data" else "")] = n
    return out


def default_cold_bytes(caches, cores):
    """2 x (last-level cache + every core's L2), at least 64 MiB."""
    llc = max((v for k, v in caches.items() if k.startswith("L3")), default=32 << 20)
    l2 = caches.get("L2", 1 << 20) * cores
    return max(64 << 20, 2 * (llc + l2))


def kernel_flags():
    """extra_compile_args setup.py uses for the kernels on this machine (None if unreadable)."""
    try:
        from tools.check_vectorization import builds_from_setup
        builds = builds_from_setup(ROOT / "setup.py")
        return " ".join(builds[0].extra_compile_args) if builds else None
    except Exception:   # noqa: BLE001 - informational only
        return None


def machine_info():
    cpu = _cpuinfo()
    flags = set((cpu.get("flags") or cpu.get("Features") or "").split())
    simd = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                        "asimd", "sve", "sve2") if f in flags]
    model = cpu.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in cpu:
        model += f" (family {cpu['cpu family']}, model {cpu.get('model')}{_uarch_hint(cpu)})"
    try:
        import Cython
        cython_version = Cython.__version__
    except ImportError:
        cython_version = None
    caches = _caches()
    cores = os.cpu_count() or 1
    return {
        "cpu": model,
        "simd": simd,
        "cores": cores,
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores,
        "caches_bytes": caches,
        "machine": platform.machine(),
        "os": platform.platform(),
        "compiler": (_run(["gcc", "--version"]).splitlines() or ["gcc not found"])[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cython": cython_version,
        "torch_threads": torch.get_num_threads(),
        "kernel_flags": kernel_flags(),
        "git_revision": _run(["git", "rev-parse", "--short", "HEAD"]) or "none",
        "git_dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"])),
    }


def load_snapshot():
    try:
        fields = Path("/proc/loadavg").read_text().split()
        return {"loadavg_1m": float(fields[0]), "loadavg_5m": float(fields[1]),
                "runnable/total": fields[3]}
    except (OSError, IndexError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------
# Implementations under test
# ---------------------------------------------------------------------------------------------

def load_specverify():
    try:
        import specverify as sv
        sv.verify_greedy, sv.accept_from_uniforms   # noqa: B018 (attribute check)
        return sv
    except (ImportError, AttributeError) as error:
        print(f"warning: specverify unavailable ({error}); timing torch and NumPy only",
              file=sys.stderr)
        return None


# ---------------------------------------------------------------------------------------------
# Rounds: the argument tuples each implementation is called with, per (size, op, case, cache)
# ---------------------------------------------------------------------------------------------



# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def timer_overhead_ns(n=20000):
    """Smallest interval between two consecutive perf_counter_ns() calls (subtracted per call)."""
    pc = time.perf_counter_ns
    best = None
    for _ in range(n):
        t0 = pc()
        dt = pc() - t0
        best = dt if best is None or dt < best else best
    return best


def _timed_pass(fn, pool, out):
    """Call fn once per round of the pool, timing each call; out: int64 [len(pool)]."""
    pc = time.perf_counter_ns
    for j, args in enumerate(pool):
        t0 = pc()
        fn(*args)
        out[j] = pc() - t0


@dataclass
class Timing:
    """Per-call times of one implementation: ns[p, j] = pass p, round j (timer overhead removed).

    min / median: for each round its min / median over passes, averaged over the rounds, i.e. the
    cost per call of the pool's mix of paths, robust to preemption of individual calls."""
    ns: np.ndarray

    @property
    def min_us(self):
        return float(self.ns.min(axis=0).mean()) / 1e3

    @property
    def median_us(self):
        return float(np.median(self.ns, axis=0).mean()) / 1e3

    @property
    def passes(self):
        return self.ns.shape[0]

    @property
    def calls(self):
        return self.ns.size


def time_round_robin(fns, calls, budget_s, settings, overhead_ns=0, rounds=3):
    """{impl: Timing}: every call timed on its own (time.perf_counter_ns, GC off).

    Each implementation gets about budget_s / len(fns) seconds of whole passes over its pool
    (at least min_passes, at most max_calls calls), in `rounds` interleaved rounds so that a
    change in machine load hits every implementation alike.
    """
    plan = {}
    for name, fn in fns.items():
        pool = calls[name]
        scratch = np.empty(len(pool), dtype=np.int64)
        _timed_pass(fn, pool, scratch)                 # warm-up
        _timed_pass(fn, pool, scratch)
        t_pass = max(float(scratch.sum()), 1.0)
        passes = int(budget_s * 1e9 / len(fns) / t_pass)
        passes = max(settings["min_passes"], min(passes, settings["max_calls"] // len(pool)))
        plan[name] = np.empty((passes, len(pool)), dtype=np.int64)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name, fn in fns.items():
                ns = plan[name]
                for p in range(r, ns.shape[0], rounds):
                    _timed_pass(fn, calls[name], ns[p])
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(np.maximum(ns - overhead_ns, 0)) for name, ns in plan.items()}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Outputs (tables are written from the row dicts; the plot reads only the CSV)
# ---------------------------------------------------------------------------------------------

def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k)) for k in fields})


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _fmt(x, digits=3):
    if x is None or x == "":
        return "–"
    x = float(x)
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}" if x < 10 else f"{x:.1f}"


def _table(header, body):
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    right = [i for i in range(len(header)) if i >= 5]
    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2))
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in body])



def machine_line(meta):
    m = meta["machine"]
    caches = ", ".join(f"{k} {v // 1024} KiB" if v < 1 << 20 else f"{k} {v >> 20} MiB"
                       for k, v in m["caches_bytes"].items())
    flags = f" `{m['kernel_flags']}`" if m.get("kernel_flags") else ""
    return (f"{m['cpu']}, {m['cores']} cores ({caches}; {'/'.join(m['simd'])}), {m['compiler']}{flags}, "
            f"Python {m['python']}, torch {m['torch']}, NumPy {m['numpy']}, Cython {m['cython']}; "
            f"single thread")
