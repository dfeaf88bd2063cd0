"""What two threads can gain on this machine: the batch pool's wake latency and 1- vs 2-thread
read bandwidth (run on a quiet machine; see the quiet-machine protocol).

    python -m tools.thread_probe               # both probes (about 30 s)
    python -m tools.thread_probe --quick       # smoke run

(a) Wake latency: ns from ``verify_batch``'s pool posting a job to a helper thread starting it
    (``_kernels._pool_wake_latency_ns``), after the helper has been idle for a given time: with
    the helpers' spin-before-sleep on (the default) and off (``_pool_spin_ns(0)``: every helper
    sleeps as soon as its job is done, so every call wakes a sleeping thread).  Idle times below
    1 ms are waited out by polling the clock (time.sleep cannot wait 10 us).
(b) What a helper costs the caller: µs per ``verify_batch`` call on a batch of R = 2 tiny
    requests (V = 8, nothing to share) on 1 and on 2 threads, the helper spinning (calls back to
    back) or asleep (spin 0): the difference is the price of posting the job (the wake-up system
    call, the lock), which a batch must outweigh for ``num_threads=None`` to use a helper.
(c) Read bandwidth: the bytes per second of OR-ing every word of a buffer on 1 thread and on 2
    (the pool's own claiming, 1 MiB per claim): a buffer far larger than the last-level cache
    read once per pass (cold: DRAM), and a small one read over and over (warm: each core's own
    L2).  If two threads cannot read DRAM 1.7x as fast as one, no DRAM-bound batch can run 1.7x
    faster on two threads here.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from specverify.kernels import _kernels

IDLE_US = (0, 10, 30, 100, 1000, 10000)


def wait_us(us):
    if us >= 1000:
        time.sleep(us * 1e-6)
        return
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


def wake_latencies(idle_us, repeats, spin_ns=None):
    """Latencies (ns) of `repeats` jobs, each posted `idle_us` after the previous one ended."""
    previous = _kernels._pool_spin_ns(spin_ns)
    try:
        _kernels._pool_wake_latency_ns()   # the helper exists and has finished a job
        out, same = [], 0
        for _ in range(repeats):
            wait_us(idle_us)
            ns, on_callers_cpu = _kernels._pool_wake_latency_ns()
            out.append(ns)
            same += on_callers_cpu
        return np.array(out, dtype=np.int64), same
    finally:
        _kernels._pool_spin_ns(previous)


def cpu_seconds_of_others():
    """A clock of the CPU time every OTHER process has used (busy time from /proc/stat minus this
    process's): its advance over a run says whether the machine was quiet."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    own = os.times()
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK") - own.user - own.system


def posting_cost_us(repeats):
    """{(threads, helper state): min µs per call} on a batch of two V = 8 requests."""
    import specverify as sv
    rng = np.random.default_rng(0)
    target = rng.random((6, 8), dtype=np.float32) + np.float32(0.1)
    args = (target, target[:4].copy(), np.array([1, 2, 3, 4]), np.array([0, 2, 4]))
    uniforms = rng.random(6)
    out = {}
    for label, spin in (("spinning", None), ("asleep", 0)):
        previous = _kernels._pool_spin_ns(spin)
        try:
            for threads in (1, 2):
                best = None
                for _ in range(repeats):
                    t0 = time.perf_counter_ns()
                    sv.verify_batch(*args, uniforms=uniforms, num_threads=threads)
                    dt = time.perf_counter_ns() - t0
                    best = dt if best is None or dt < best else best
                out[threads, label] = best / 1e3
        finally:
            _kernels._pool_spin_ns(previous)
    return out


def read_bandwidths(nbytes, passes, threads, region_bytes=None):
    """Best and median GB/s over `passes` reads of `nbytes` bytes on `threads` threads, and the
    helpers' mean share of the chunks.  With region_bytes (cold), each pass reads the next
    nbytes-sized slice of a region that large."""
    region = np.ones(max(nbytes, region_bytes or 0) // 4, dtype=np.uint32)   # pages touched
    slices = [region[i:i + nbytes // 4] for i in range(0, region.size - nbytes // 4 + 1, nbytes // 4)]
    _kernels._pool_read_ns(slices[0], threads)   # warm-up (helper started; warm: cached)
    rates, shares = [], []
    chunks = -(-nbytes // (1 << 20))
    for p in range(passes):
        ns, bits, helper_chunks = _kernels._pool_read_ns(slices[(p + 1) % len(slices)], threads)
        assert bits == 1
        rates.append(nbytes / ns)
        shares.append(helper_chunks / chunks)
    return max(rates), float(np.median(rates)), float(np.mean(shares))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.thread_probe", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=400)
    args = ap.parse_args(argv)
    repeats = 20 if args.quick else args.repeats
    others, wall = cpu_seconds_of_others(), time.perf_counter()
    print(f"(a) wake latency of the batch pool's helper, us (p10 / median / p90 over {repeats} jobs; "
          f"spin window {_kernels._pool_spin_ns() / 1e3:.0f} us)")
    print("  [%]: jobs whose helper started on the caller's CPU (it ran only once the caller's "
          "request, polling for it, gave the CPU up)")
    print("  idle before the job | spinning helper               | sleeping helper (spin 0)")
    for idle in IDLE_US:
        cells = []
        for spin in (None, 0):
            ns, same = wake_latencies(idle, repeats if idle < 10000 else max(repeats // 8, 5), spin)
            ok = ns[ns >= 0] / 1e3
            missed = int((ns < 0).sum())
            cells.append(f"{np.percentile(ok, 10):6.1f} / {np.median(ok):6.1f} / {np.percentile(ok, 90):7.1f}"
                         + f" [{100 * same / len(ns):3.0f}%]" + (f" ({missed} missed)" if missed else ""))
        print(f"  {idle:>10} us        | " + " | ".join(cells))

    cost = posting_cost_us(repeats)
    print("(b) µs per verify_batch call, R = 2, V = 8 (min): " + ", ".join(
        f"{threads} thread{'s' if threads > 1 else ''}, helper {label} {us:.2f}"
        for (threads, label), us in cost.items() if threads > 1 or label == "spinning"))
    cold_region = (64 << 20) if args.quick else (2 << 30)
    cases = [("cold", 16 << 20 if args.quick else 256 << 20, cold_region, 4 if args.quick else 16),
             ("warm (1 MiB per thread)", 2 << 20, None, 50 if args.quick else 400)]
    print("(c) read bandwidth, GB/s (best / median over passes)")
    for label, nbytes, region, passes in cases:
        one = read_bandwidths(nbytes, passes, 1, region)
        two = read_bandwidths(nbytes, passes, 2, region)
        print(f"  {label:24s} {nbytes >> 20:4d} MiB per pass: 1 thread {one[0]:5.1f} / {one[1]:5.1f}   "
              f"2 threads {two[0]:5.1f} / {two[1]:5.1f}   ratio {two[0] / one[0]:.2f} / {two[1] / one[1]:.2f}"
              f"   (helper read {100 * two[2]:.0f}% of the chunks)")
    others, wall = cpu_seconds_of_others() - others, time.perf_counter() - wall
    print(f"other processes used {others:.1f} CPU-s in these {wall:.1f} s "
          f"({others / wall:.2f} cores busy besides this run; 2-thread numbers need ~0)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
