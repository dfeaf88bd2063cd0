"""Cross-architecture agreement of specverify's kernels.

    python tools/cross_agreement.py gen     --out cases.npz            # on x86 (fixed seed)
    python tools/cross_agreement.py run     --cases cases.npz --out x86.npz      # any arch
    python tools/cross_agreement.py compare --expected x86.npz --got arm.npz [--label a72]

``gen`` writes a fixed set of inputs and uniforms: many vocabulary sizes (around the 256-element
block and 16-lane boundaries, up to real vocabularies), K = 0..8, peaked / flat / sparse / tied /
wide-dynamic-range / unnormalized rows, drafts equal to, scaled from, near, or unrelated to the
target, and uniforms placed exactly on (and one ulp either side of) the acceptance thresholds and
inverse-CDF boundaries as computed in float64 by NumPy -- where any difference in summation order
between builds would flip a result.  ``run`` records ``(n_accepted, next_token)`` of
``verify_greedy``, ``accept_from_uniforms`` with the draft probs, and with ``draft_probs=None``,
and of the tree ops on the same rows read as a tree (``tree_parents``; the accepted path encoded
as one integer): ``verify_tree_greedy`` and ``accept_tree_from_uniforms`` with deterministic
children and with and without replacement, and ``accept_block_from_uniforms`` with the draft
probs and with ``draft_probs=None`` (exceptions are recorded as their type).  ``compare``
requires exact equality of every pair.

Runs under the host Python and under the emulated Debian python3 (NumPy >= 1.22, stdlib only).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SEED = 20261129
OPS = ("verify_greedy", "accept", "accept_none", "tree_greedy", "tree_none", "tree_without", "tree_with",
       "block", "block_none")
VOCABS = (1, 2, 3, 15, 16, 17, 31, 255, 256, 257, 300, 511, 512, 513, 1000, 4096, 4111, 32000, 50257)
BIG_VOCABS = (128256, 151936)


# ---------------------------------------------------------------------------------------------
# generation (host)
# ---------------------------------------------------------------------------------------------

def _row(rng, v, kind):
    if kind == "flat":
        x = rng.random(v)
    elif kind == "peaked":
        z = rng.standard_normal(v) * rng.uniform(2.0, 8.0)
        x = np.exp(z - z.max())
    elif kind == "sparse":
        x = rng.random(v) * (rng.random(v) < rng.uniform(0.01, 0.3))
        if not x.any():
            x[rng.integers(v)] = 1.0
    elif kind == "ties":
        x = rng.integers(0, 4, v).astype(np.float64)
        if not x.any():
            x[:] = 1.0
    elif kind == "dynamic":        # 30 decades: summation order matters most here
        x = 10.0 ** rng.uniform(-30, 0, v)
    elif kind == "unnormalized":
        x = rng.random(v) * 10.0 ** rng.uniform(-20, 20)
    elif kind == "onehot":
        x = np.zeros(v)
        x[rng.integers(v)] = 1.0
    else:
        raise ValueError(kind)
    x = x.astype(np.float32)
    if not (x > 0).any():       # float32 underflow of a whole row
        x[rng.integers(v)] = 1.0
    return x


def _rows(rng, n, v, kind):
    return np.stack([_row(rng, v, kind) for _ in range(n)]) if n else np.zeros((0, v), np.float32)


def _draft(rng, target_rows, how):
    k, v = target_rows.shape
    if how == "equal":
        return target_rows.copy()
    if how == "scaled":
        return (target_rows * np.float32(2.0)).astype(np.float32)
    if how == "near":
        noise = _rows(rng, k, v, "flat") * np.float32(rng.uniform(0.0, 0.5))
        d = (target_rows / np.maximum(target_rows.sum(1, keepdims=True), 1e-30) + noise).astype(np.float32)
        return d
    return _rows(rng, k, v, rng.choice(["flat", "peaked", "sparse", "dynamic"]))


def _sums(x):
    return x.astype(np.float64).sum(-1)


def _nudge(rng, u):
    u = float(u)
    r = rng.integers(3)
    if r == 1:
        u = float(np.nextafter(u, 2.0))
    elif r == 2:
        u = float(np.nextafter(u, -1.0))
    return min(max(u, 0.0), float(np.nextafter(1.0, 0.0)))


def _boundary_draw(rng, w):
    """A uniform on (or one ulp from) a boundary of the inverse CDF of weights w (float64)."""
    c = np.cumsum(w)
    total = c[-1]
    if not total > 0:
        return float(rng.random())
    pos = np.flatnonzero(w > 0)
    j = pos[rng.integers(len(pos))]
    return _nudge(rng, c[j] / total)


def _tokens(rng, target, draft, mode):
    k = draft.shape[0] if draft is not None else target.shape[0] - 1
    v = target.shape[1]
    out = np.empty(k, np.int64)
    for i in range(k):
        r = mode if mode != "mixed" else rng.choice(["argmax", "draft", "random", "zero"])
        if r == "argmax":
            out[i] = int(np.argmax(target[i]))
        elif r == "draft" and draft is not None and draft[i].sum() > 0:
            p = draft[i].astype(np.float64)
            out[i] = int(rng.choice(v, p=p / p.sum()))
        elif r == "zero" and (target[i] == 0).any():
            z = np.flatnonzero(target[i] == 0)
            out[i] = int(z[rng.integers(len(z))])
        else:
            out[i] = int(rng.integers(v))
    return out


def _uniforms(rng, target, draft, tokens, mode):
    k = len(tokens)
    u = rng.random(k + 1)
    if mode == "random":
        return u
    if mode == "extreme":
        return rng.choice([0.0, float(np.nextafter(1.0, 0.0)), 0.5], size=k + 1)
    # "boundary": acceptance thresholds and inverse-CDF boundaries, computed by NumPy in float64
    P = _sums(target)
    for i in range(k):
        t = tokens[i]
        pt = float(target[i, t])
        if draft is not None:
            Q = float(_sums(draft[i]))
            qt = float(draft[i, t])
            thr = (pt * Q) / (qt * P[i]) if qt > 0 and P[i] > 0 else rng.random()
        else:
            thr = pt / P[i] if P[i] > 0 else rng.random()
        u[i] = _nudge(rng, thr) if thr < 1.0 else rng.random()
    # the emitted draw: aim at the row where the first rejection is likely, else the bonus row
    i = int(rng.integers(k + 1))
    if i < k and draft is not None:
        Q = float(_sums(draft[i]))
        w = np.maximum(target[i].astype(np.float64) * Q - draft[i].astype(np.float64) * P[i], 0.0)
    elif i < k:
        w = target[i].astype(np.float64).copy()
        w[tokens[i]] = 0.0
    else:
        w = target[k].astype(np.float64)
    u[k] = _boundary_draw(rng, w)
    return u


def generate(n_cases: int, seed: int = SEED, big: int = 2):
    rng = np.random.default_rng(seed)
    cases = []
    kinds = ["flat", "peaked", "sparse", "ties", "dynamic", "unnormalized", "onehot"]
    for c in range(n_cases + big):
        v = int(BIG_VOCABS[c % len(BIG_VOCABS)]) if c >= n_cases else int(VOCABS[c % len(VOCABS)])
        k = int(rng.integers(0, 9)) if v < 20000 else int(rng.integers(0, 4))
        kind = kinds[int(rng.integers(len(kinds)))]
        target = _rows(rng, k + 1, v, kind)
        how = str(rng.choice(["equal", "scaled", "near", "near", "other"]))
        draft = _draft(rng, target[:k], how)
        tokens = _tokens(rng, target, draft, str(rng.choice(["argmax", "draft", "mixed", "mixed"])))
        umode = str(rng.choice(["boundary", "boundary", "boundary", "random", "extreme"]))
        u = _uniforms(rng, target, draft, tokens, umode)
        layout = str(rng.choice(["contiguous"] * 6 + ["strided", "float64", "float16"]))
        # greedy gets its own scores half of the time: logits with -inf masks and ties
        logits = None
        if rng.random() < 0.5:
            logits = (rng.standard_normal((k + 1, v)) * 3).astype(np.float32)
            if rng.random() < 0.5:
                logits[rng.random((k + 1, v)) < 0.3] = -np.inf
            if rng.random() < 0.3:
                logits = np.round(logits)
            for i in range(k):
                if rng.random() < 0.7:
                    row = logits[i]
                    tokens_i = int(np.argmax(row)) if np.isfinite(row).any() else 0
                    tokens[i] = tokens_i
        cases.append(dict(target=target, draft=draft, tokens=tokens, uniforms=u, logits=logits,
                          layout=layout, desc=f"V={v} K={k} rows={kind} draft={how} u={umode} {layout}"))
    return cases


def save_cases(path, cases):
    arrays = {"n_cases": np.array(len(cases))}
    for i, c in enumerate(cases):
        arrays[f"t{i}"] = c["target"]
        arrays[f"d{i}"] = c["draft"]
        arrays[f"k{i}"] = c["tokens"]
        arrays[f"u{i}"] = c["uniforms"]
        if c["logits"] is not None:
            arrays[f"g{i}"] = c["logits"]
        arrays[f"layout{i}"] = np.array(c["layout"])
        arrays[f"desc{i}"] = np.array(c["desc"])
    np.savez(path, **arrays)


# ---------------------------------------------------------------------------------------------
# running (any architecture)
# ---------------------------------------------------------------------------------------------

def _as_layout(x, layout):
    if x is None:
        return None
    if layout == "float64":
        return x.astype(np.float64)
    if layout == "float16":
        with np.errstate(over="ignore"):   # rows may saturate to inf: an error, the same everywhere
            return x.astype(np.float16)
    if layout == "strided":
        wide = np.zeros((x.shape[0], x.shape[1] + 7), np.float32)
        wide[:, 3:3 + x.shape[1]] = x
        return wide[:, 3:3 + x.shape[1]]
    return x


def tree_parents(k):
    """The K drafts of a case read as a tree: two children at the root, then two per node."""
    return np.array([-1 if i < 2 else (i - 2) // 2 for i in range(k)], dtype=np.int64)


def _tree_tokens(tokens, parents, v):
    """The case's tokens with repeated siblings moved to the next free id (distinct siblings are
    what two of the tree rules require; V = 1 keeps its repeats and errors alike everywhere)."""
    out = tokens.copy()
    for i in range(len(out)):
        siblings = {int(out[j]) for j in range(i) if parents[j] == parents[i]}
        while int(out[i]) in siblings and len(siblings) < v:
            out[i] = (out[i] + 1) % v
    return out


def _tree_result(path, next_token):
    """(path as one integer: base-(N+1) digits of node + 1, next_token)."""
    code = 0
    for node in path:
        code = code * 1000003 + int(node) + 1
    return code % (1 << 62), next_token


def run(cases_path):
    import specverify as sv
    data = np.load(cases_path)
    n = int(data["n_cases"])
    results = np.full((n, len(OPS), 2), -1, np.int64)
    errors = np.zeros((n, len(OPS)), dtype="U40")
    for i in range(n):
        layout = str(data[f"layout{i}"])
        t = _as_layout(data[f"t{i}"], layout)
        d = _as_layout(data[f"d{i}"], layout)
        k = data[f"k{i}"]
        u = data[f"u{i}"]
        g = _as_layout(data[f"g{i}"], layout) if f"g{i}" in data.files else t
        parents = tree_parents(len(k))
        tk = _tree_tokens(k, parents, t.shape[1])
        td = None if d is None else np.concatenate([d, t[-1:].astype(d.dtype)])  # [K+1, V]: a row per position
        calls = (
            lambda: sv.verify_greedy(g, k),
            lambda: sv.accept_from_uniforms(t, d, k, u),
            lambda: sv.accept_from_uniforms(t, None, k, u),
            lambda: _tree_result(*sv.verify_tree_greedy(g, tk, parents)),
            lambda: _tree_result(*sv.accept_tree_from_uniforms(t, None, tk, parents, u)),
            lambda: _tree_result(*sv.accept_tree_from_uniforms(t, td, tk, parents, u)),
            lambda: _tree_result(*sv.accept_tree_from_uniforms(t, td, tk, parents, u, replacement=True)),
            lambda: sv.accept_block_from_uniforms(t, d, k, u),
            lambda: sv.accept_block_from_uniforms(t, None, k, u),
        )
        for j, call in enumerate(calls):
            try:
                results[i, j] = call()
            except Exception as e:  # recorded, compared like any result
                errors[i, j] = type(e).__name__
    return results, errors


def compare(exp_path, got_path, cases_path=None, label="", dump=None):
    e, g = np.load(exp_path), np.load(got_path)
    er, ee, gr, ge = e["results"], e["errors"], g["results"], g["errors"]
    if er.shape != gr.shape:
        print(f"{label}FAIL: result shapes differ {er.shape} vs {gr.shape}")
        return 1
    same = (er == gr).all(-1) & (ee == ge)
    total, agree = same.size, int(same.sum())
    n_err = int((ee != "").sum())
    print(f"{label}agreement: {agree}/{total} (n_accepted, next_token) pairs identical "
          f"({er.shape[0]} cases x {len(OPS)} ops; {n_err} expected errors among them)")
    ok_per_op = (ee == "").sum(0)
    if n_err > 0.25 * total or (ok_per_op == 0).any():
        print(f"{label}FAIL: the x86-64 build raised on {n_err} of {total} calls "
              f"(successes per op: {dict(zip(OPS, ok_per_op.tolist()))}); the agreement would be vacuous")
        return 1
    if agree == total:
        return 0
    descs = None
    if cases_path:
        c = np.load(cases_path)
        descs = {i: str(c[f"desc{i}"]) for i in range(er.shape[0])}
    bad = np.argwhere(~same)
    for i, j in bad[:20]:
        print(f"{label}  MISMATCH case {i} op {OPS[j]}: expected {tuple(er[i, j])}{ee[i, j] or ''} "
              f"got {tuple(gr[i, j])}{ge[i, j] or ''}  [{descs[i] if descs else ''}]")
    if dump and cases_path:
        c = np.load(cases_path)
        keep = sorted({int(i) for i, _ in bad})
        arrays = {}
        for i in keep:
            for p in ("t", "d", "k", "u", "g", "layout", "desc"):
                if f"{p}{i}" in c.files:
                    arrays[f"{p}{i}"] = c[f"{p}{i}"]
        np.savez(dump, mismatched_cases=np.array(keep), **arrays)
        print(f"{label}  mismatching inputs written to {dump}")
    return 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("gen")
    a.add_argument("--out", required=True)
    a.add_argument("--cases", type=int, default=300)
    a.add_argument("--seed", type=int, default=SEED)
    a = sub.add_parser("run")
    a.add_argument("--cases", required=True)
    a.add_argument("--out", required=True)
    a = sub.add_parser("compare")
    a.add_argument("--expected", required=True)
    a.add_argument("--got", required=True)
    a.add_argument("--cases")
    a.add_argument("--label", default="")
    a.add_argument("--dump", help="write the mismatching inputs here (.npz)")
    a = ap.parse_args(argv)
    if a.cmd == "gen":
        t0 = time.time()
        cases = generate(a.cases, a.seed)
        save_cases(a.out, cases)
        print(f"wrote {len(cases)} cases to {a.out} in {time.time() - t0:.1f}s")
        return 0
    if a.cmd == "run":
        import platform
        t0 = time.time()
        results, errors = run(a.cases)
        np.savez(a.out, results=results, errors=errors)
        import specverify.kernels._kernels as k
        print(f"ran {results.shape[0]} cases x {len(OPS)} ops on {platform.machine()} "
              f"({k.__file__}) in {time.time() - t0:.1f}s")
        return 0
    return compare(a.expected, a.got, a.cases, f"[{a.label}] " if a.label else "", a.dump)


if __name__ == "__main__":
    sys.exit(main())
