"""Child process of tests/kernels/test_reliability.py's mutation test (a crash must not take pytest down).

A writer thread flips a draft token between a valid id and out-of-range ones (2^40, V + 5000,
-3, -2^62), a uniform between 0.5 and NaN / 5.0 / -1.0, and a target entry between a valid
value and NaN, while this thread calls every op: a data race by the caller.  Every call must
return a result in range or raise a ValueError / IndexError naming the argument, and nothing may
crash.  Prints the per-op counts as JSON.

SPECVERIFY_MUTATION_SECONDS (default 3) bounds the run; SPECVERIFY_MUTATION_CALLS (default
10^5) bounds the calls per op.
"""
import json
import os
import sys
import threading
import time

import numpy as np

import specverify as sv

seconds = float(os.environ.get("SPECVERIFY_MUTATION_SECONDS", "3"))
max_calls = int(os.environ.get("SPECVERIFY_MUTATION_CALLS", "100000"))
sys.setswitchinterval(1e-6)  # hand the GIL to the writer as soon as a kernel releases it
K, V = 4, 32000
GOOD = 7
BAD_TOKENS = [2**40, V + 5000, -3, -(2**62)]
BAD_UNIFORMS = [float("nan"), 5.0, -1.0]
target = np.full((K + 1, V), 1e-6, dtype=np.float32)
target[:, GOOD] = 1.0              # the greedy argmax is GOOD in every row
draft = target[:K].copy()          # p == q: every position accepts while its token is GOOD
tokens = np.full(K, GOOD, dtype=np.int64)
uniforms = np.full(K + 1, 0.5)
generator = np.random.default_rng(0)
stop = threading.Event()


def writer():
    i = 0
    while not stop.is_set():
        tokens[1] = BAD_TOKENS[i % len(BAD_TOKENS)]
        uniforms[1] = BAD_UNIFORMS[i % len(BAD_UNIFORMS)]
        target[2, 12345] = np.nan
        tokens[1] = GOOD
        uniforms[1] = 0.5
        target[2, 12345] = 1e-6
        i += 1


def _path_end(result):
    """(accepted path length, next token) of a tree op, after checking the path's node ids."""
    path, token = result
    assert all(0 <= int(i) < K for i in path), path
    return len(path), token


# What a raised error may say: the argument the writer touched.
EXPECTED_ERRORS = {IndexError: ("draft_tokens[1] = ",),
                   ValueError: ("target_probs[2] ", "logits[2] ", "uniforms must lie")}

ops = {
    "accept": lambda: sv.accept(target, draft, tokens, generator),
    "accept_point_mass": lambda: sv.accept(target, None, tokens, generator),
    "accept_from_uniforms": lambda: sv.accept_from_uniforms(target, draft, tokens, uniforms),
    "verify_greedy": lambda: sv.verify_greedy(target, tokens),
}
if hasattr(sv, "accept_block"):
    ops.update({
        "accept_block": lambda: sv.accept_block(target, draft, tokens, generator),
        "accept_block_from_uniforms": lambda: sv.accept_block_from_uniforms(target, None, tokens, uniforms),
    })
if hasattr(sv, "accept_tree"):  # the tree ops, on a chain-shaped tree (rows [N+1, V])
    parents = np.arange(-1, K - 1)
    tree_draft = target.copy()
    ops.update({
        "verify_tree_greedy": lambda: _path_end(sv.verify_tree_greedy(target, tokens, parents)),
        "accept_tree": lambda: _path_end(sv.accept_tree(target, tree_draft, tokens, parents, generator)),
        "accept_tree_deterministic": lambda: _path_end(
            sv.accept_tree_from_uniforms(target, None, tokens, parents, uniforms)),
    })
if hasattr(sv, "verify_batch"):  # one request of a batch
    def _batch_end(result):
        out, num_accepted = result
        n = int(num_accepted[0])
        return n, int(out[0, n])

    ops["verify_batch"] = lambda: _batch_end(sv.verify_batch(target, draft, tokens, [0, K], method="token",
                                                             uniforms=uniforms))
if hasattr(sv, "accept_logits"):  # the target rows as logits: NaN stays NaN, tokens and uniforms as above
    ops["accept_logits_from_uniforms"] = lambda: sv.accept_logits_from_uniforms(
        target, draft, tokens, uniforms, temperature=0.8, top_p=0.9)
    ops["accept_block_logits_from_uniforms"] = lambda: sv.accept_block_logits_from_uniforms(
        target, None, tokens, uniforms, top_k=100, min_p=0.01)

    def _warp_end(probs):
        """(0, the most likely token of row 2) after checking warp's rows are probabilities."""
        assert probs.shape == (K + 1, V) and np.all(probs >= 0) and np.all(probs <= 1), "bad warp output"
        return 0, int(np.argmax(probs[2]))

    ops["warp"] = lambda: _warp_end(sv.warp(target, temperature=0.8, top_k=50, top_p=0.9))
thread = threading.Thread(target=writer, daemon=True)
thread.start()
counts = {}
try:
    for name, op in ops.items():
        ok = raised = 0
        deadline = time.monotonic() + seconds / len(ops)
        while ok + raised < max_calls and time.monotonic() < deadline:
            try:
                n, token = op()
            except (IndexError, ValueError) as error:
                fragments = EXPECTED_ERRORS[type(error)]
                assert any(f in str(error) for f in fragments), (name, repr(error))
                raised += 1
                continue
            assert type(n) is int and 0 <= n <= K and type(token) is int and 0 <= token < V, (name, n, token)
            ok += 1
        counts[name] = {"results": ok, "raised": raised}
finally:
    stop.set()
    thread.join()
print(json.dumps(counts))
