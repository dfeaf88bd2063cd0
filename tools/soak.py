"""Memory soak: call every op many times and report the process's resident memory (not in CI).

    python -m tools.soak                      # 10^6 calls per op, V = 256, K = 4
    python -m tools.soak --calls 100000 --vocab 32000
    python -m tools.soak --only warp,batch    # the variants whose name contains a word

Each op variant (every public op: the chain, block, tree, logits-warping and batched families)
runs ``--calls`` times on fixed inputs (NumPy and torch containers, both generator kinds,
explicit uniforms, K varying call to call so the uniform and warp scratch caches churn, and calls
that raise); RSS is read from /proc/self/statm at ten checkpoints.  After the first checkpoint (warm-up:
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
    logits, draft_logits = np.log(target), np.log(draft)
    logits_t = torch.from_numpy(logits)
    # verify_batch: three requests (K, K - 1 and 0 drafts) in every method, ragged.
    cu = np.array([0, k, 2 * k - 1, 2 * k - 1])
    batch_target = rng.random((2 * k - 1 + 3, v)).astype(np.float32)
    batch_draft = rng.random((2 * k - 1, v)).astype(np.float32)
    batch_tokens = rng.integers(0, v, 2 * k - 1)
    methods = ["token", "block", "greedy"]
    batch_uniforms = rng.random(k + 1 + k)
    numpy_gens = [np.random.default_rng(i) for i in range(3)]
    nan_batch_target = batch_target.copy()
    nan_batch_target[k + 1, v // 2] = np.nan  # request 1's first row
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
        "accept_block torch, K varies": lambda i: sv.accept_block(
            target_t[:ks[i % 1000] + 1], draft_t[:ks[i % 1000]], tokens_t[:ks[i % 1000]], torch_gen),
        "accept_block_from_uniforms point mass": lambda i: sv.accept_block_from_uniforms(target, None, tokens, uniforms),
        "verify_tree_greedy (chain tree)": lambda i: sv.verify_tree_greedy(target, tokens, chain),
        "accept_tree torch generator": lambda i: sv.accept_tree(target_t, tree_draft_t, tokens_t, chain, torch_gen),
        "accept_tree_from_uniforms deterministic": lambda i: sv.accept_tree_from_uniforms(
            target, None, tokens, chain, uniforms),
        "accept_tree with replacement, numpy": lambda i: sv.accept_tree(
            target, tree_draft_t.numpy(), tokens, chain, numpy_gen, replacement=True),
        "warp numpy, top-p": lambda i: sv.warp(logits, top_p=0.9),
        "warp torch, in place": lambda i: (lambda x: sv.warp(x, temperature=0.7, top_k=20, out=x))(logits_t.clone()),
        "warp 1-D row, min-p": lambda i: sv.warp(logits[i % (k + 1)], min_p=0.05),
        "accept_logits_from_uniforms": lambda i: sv.accept_logits_from_uniforms(
            logits, draft_logits, tokens, uniforms, top_k=50, top_p=0.9),
        "accept_logits torch, K varies": lambda i: sv.accept_logits(
            logits_t[:ks[i % 1000] + 1], None, tokens_t[:ks[i % 1000]], torch_gen, temperature=0.8),
        "accept_block_logits numpy generator": lambda i: sv.accept_block_logits(
            logits, draft_logits, tokens, numpy_gen, min_p=0.1),
        "verify_batch uniforms, 1 thread": lambda i: sv.verify_batch(
            batch_target, batch_draft, batch_tokens, cu, method=methods, uniforms=batch_uniforms, num_threads=1),
        "verify_batch generators, 2 threads": lambda i: sv.verify_batch(
            batch_target, batch_draft, batch_tokens, cu, method=methods, generators=numpy_gens, num_threads=2),
        "verify_batch greedy, torch": lambda i: sv.verify_batch(
            torch.from_numpy(batch_target), None, torch.from_numpy(batch_tokens), cu, method="greedy"),
        "out-of-range token (raises)": lambda i: _raises(IndexError, sv.verify_greedy, target, bad_tokens),
        "NaN row (raises)": lambda i: _raises(ValueError, sv.accept_from_uniforms, nan_target, draft, tokens, uniforms),
        "NaN logits (raises)": lambda i: _raises(ValueError, sv.accept_logits_from_uniforms, nan_target, None,
                                                 tokens, uniforms),
        "NaN row in a tree (raises)": lambda i: _raises(ValueError, sv.accept_tree_from_uniforms, nan_target, None,
                                                        tokens, chain, uniforms),
        "NaN row in a batch (raises)": lambda i: _raises(ValueError, sv.verify_batch, nan_batch_target, batch_draft,
                                                         batch_tokens, cu, method=methods, uniforms=batch_uniforms),
    }


def _raises(error, op, *args, **kwargs):
    try:
        op(*args, **kwargs)
    except error:
        return
    raise AssertionError(f"{op.__name__} did not raise {error.__name__}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tolerance-mib", type=float, default=4.0)
    ap.add_argument("--only", default="", help="comma-separated words: run the variants whose name holds one")
    a = ap.parse_args(argv)
    if a.k < 2:
        ap.error("--k must be at least 2 (the batch variants hold a request of K - 1 drafts)")
    checkpoints = 10
    failed = []
    words = [w.strip() for w in a.only.split(",") if w.strip()]
    chosen = {name: call for name, call in variants(a.k, a.vocab).items()
              if not words or any(w in name for w in words)}
    width = max(map(len, chosen), default=2)
    print(f"{'op':{width}s} {'calls':>9s} {'s':>6s} {'RSS start':>10s} {'after warm-up':>14s} {'end':>8s} {'growth':>8s}")
    for name, call in chosen.items():
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
        print(f"{name:{width}s} {a.calls:9d} {elapsed:6.1f} {start_rss:9.1f}M {warm:13.1f}M {end:7.1f}M {growth:+7.2f}M")
        if growth > a.tolerance_mib:
            failed.append(name)
    if failed:
        print(f"RSS grew more than {a.tolerance_mib} MiB after warm-up: {', '.join(failed)}")
        return 1
    print(f"flat: no op grew more than {a.tolerance_mib} MiB after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
