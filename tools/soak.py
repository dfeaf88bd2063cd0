"""Memory soak: call every op many times and report the process's resident memory (not in CI).

    python -m tools.soak                      # 10^6 calls per op, V = 256, K = 4
    python -m tools.soak --calls 100000 --vocab 32000

Each op variant runs ``--calls`` times on fixed inputs (NumPy and torch containers, both
generator kinds, explicit uniforms, K varying call to call so the uniform scratch cache churns);
RSS is read from /proc/self/statm at ten checkpoints.  After the first checkpoint (warm-up:
allocator pools, torch's lazy initialization) RSS must stay within ``--tolerance-mib``; the exit
status is 1 if any op grew more.
"""

import argparse
import os
import sys
import time

import numpy as np

import specverify as sv


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def variants(k, v):
    import torch

    rng = np.random.default_rng(0)
    target = rng.random((k + 1, v)).astype(np.float32)
    draft = rng.random((k, v)).astype(np.float32)
    tokens = rng.integers(0, v, k)
    target_t, draft_t, tokens_t = torch.from_numpy(target), torch.from_numpy(draft), torch.from_numpy(tokens)
    uniforms = rng.random(k + 1)
    numpy_gen, torch_gen = np.random.default_rng(1), torch.Generator().manual_seed(1)
    ks = [1 + i % k for i in range(1000)]  # K changes from call to call
    chain = np.arange(-1, k - 1)  # parents of a chain-shaped tree
    tree_draft_t = torch.from_numpy(rng.random((k + 1, v)).astype(np.float32))
    bad_tokens = np.full(k, v, dtype=np.int64)
    nan_target = target.copy()
    nan_target[0, v // 2] = np.nan
    return {
        "verify_greedy numpy": lambda i: sv.verify_greedy(target, tokens),
        "verify_greedy torch": lambda i: sv.verify_greedy(target_t, tokens_t),
        "accept_from_uniforms": lambda i: sv.accept_from_uniforms(target, draft, tokens, uniforms),
        "accept numpy generator": lambda i: sv.accept(target, draft, tokens, numpy_gen),
        "accept torch generator, K varies": lambda i: sv.accept(
            target_t[:ks[i % 1000] + 1], draft_t[:ks[i % 1000]], tokens_t[:ks[i % 1000]], torch_gen),
        "accept point mass, torch": lambda i: sv.accept(target_t, None, tokens_t, torch_gen),
        "accept_block numpy generator": lambda i: sv.accept_block(target, draft, tokens, numpy_gen),
        "verify_tree_greedy (chain tree)": lambda i: sv.verify_tree_greedy(target, tokens, chain),
        "accept_tree torch generator": lambda i: sv.accept_tree(target_t, tree_draft_t, tokens_t, chain, torch_gen),
        "out-of-range token (raises)": lambda i: _raises(IndexError, sv.verify_greedy, target, bad_tokens),
        "NaN row (raises)": lambda i: _raises(ValueError, sv.accept_from_uniforms, nan_target, draft, tokens, uniforms),
    }


def _raises(error, op, *args):
    try:
        op(*args)
    except error:
        return
    raise AssertionError(f"{op.__name__} did not raise {error.__name__}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tolerance-mib", type=float, default=4.0)
    a = ap.parse_args(argv)
    checkpoints = 10
    failed = []
    print(f"{'op':36s} {'calls':>9s} {'s':>6s} {'RSS start':>10s} {'after warm-up':>14s} {'end':>8s} {'growth':>8s}")
    for name, call in variants(a.k, a.vocab).items():
        start_rss, t0 = rss_mib(), time.perf_counter()
        marks = []
        step = max(1, a.calls // checkpoints)
        for i in range(a.calls):
            call(i)
            if (i + 1) % step == 0:
                marks.append(rss_mib())
        elapsed = time.perf_counter() - t0
        warm, end = marks[0], marks[-1]
        growth = max(marks) - warm
        print(f"{name:36s} {a.calls:9d} {elapsed:6.1f} {start_rss:9.1f}M {warm:13.1f}M {end:7.1f}M {growth:+7.2f}M")
        if growth > a.tolerance_mib:
            failed.append(name)
    if failed:
        print(f"RSS grew more than {a.tolerance_mib} MiB after warm-up: {', '.join(failed)}")
        return 1
    print(f"flat: no op grew more than {a.tolerance_mib} MiB after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
