"""Comparison implementations, inputs and the read-bandwidth probe for ``experiments.benchmarks.ops``.

Terms (Leviathan et al. 2023; Chen et al. 2023): position i < K holds draft token t_i; it is
*accepted* when the test passes; the first rejected position emits a *residual* (recovered) token
drawn from norm(max(0, p_i - q_i)); when all K are accepted the *bonus* token is drawn from p_K.
n_accepted is the length of the accepted prefix, next_token the emitted token.

Shapes: target [K+1, V] float32, draft [K, V] float32, tokens [K] int64, uniforms [K+1] float64
(u[i] is the acceptance test at position i < K, u[K] drives the emitted draw; the contract of
``specverify.accept_from_uniforms``).

Everything here is a plain, straightforward implementation "as a user would write it"; none of it
is tuned. Rows are normalized by their sums because the public contract does not require
normalized rows (the bench feeds softmax outputs, so the results agree either way).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

import torch

F32 = 4  # bytes per probability


# ---------------------------------------------------------------------------------------------
# Pure torch, in the style of Hugging Face transformers' `_speculative_sampling`
# (generation/utils.py): vectorized over rows, torch.argmax, torch.rand, torch.multinomial.
# ---------------------------------------------------------------------------------------------

def torch_verify_greedy(target, tokens):
    """target [K+1, V], tokens [K] int64 -> (n_accepted, next_token)."""
    k = tokens.shape[0]
    pred = torch.argmax(target, dim=-1)                # [K+1]
    n = int((pred[:k] == tokens).cumprod(0).sum())     # accepted prefix length
    return n, int(pred[n])


def torch_accept(target, draft, tokens, uniforms=None, generator=None):
    """target [K+1, V], draft [K, V], tokens [K] int64, uniforms [K+1] float64 or None.

    The acceptance tests use ``uniforms[:K]`` when given (so every implementation in the bench
    takes the same path), else ``torch.rand``. The emitted token is drawn with
    ``torch.multinomial`` (its own randomness), as transformers does.
    """
    k = tokens.shape[0]
    p = target / target.sum(dim=-1, keepdim=True)      # [K+1, V]
    q = draft / draft.sum(dim=-1, keepdim=True)        # [K, V]
    idx = torch.arange(k)
    p_i = p[idx, tokens]                               # [K]
    q_i = q[idx, tokens]                               # [K]
    ratio = p_i / q_i
    r = torch.rand(k, dtype=torch.float64, generator=generator) if uniforms is None else uniforms[:k]
    accepted = r <= ratio
    n = int(((~accepted).cumsum(dim=-1) < 1).sum())
    if n < k:
        p_prime = torch.clamp(p[n] - q[n], min=0)      # [V] residual
        p_prime.div_(p_prime.sum())
    else:
        p_prime = p[k]                                 # [V] bonus
    return n, int(torch.multinomial(p_prime, num_samples=1, generator=generator))


# ---------------------------------------------------------------------------------------------
# NumPy: the same algorithm; the emitted draw is inverse-CDF (cumsum + searchsorted) on u[K].
# ---------------------------------------------------------------------------------------------

def numpy_verify_greedy(target, tokens):
    """target [K+1, V], tokens [K] int64 -> (n_accepted, next_token)."""
    k = tokens.shape[0]
    pred = np.argmax(target, axis=-1)                  # [K+1]
    n = int(np.cumprod(pred[:k] == tokens).sum())
    return n, int(pred[n])


def numpy_accept(target, draft, tokens, uniforms):
    """target [K+1, V], draft [K, V], tokens [K] int64, uniforms [K+1] float64."""
    k = tokens.shape[0]
    p = target / target.sum(axis=-1, keepdims=True)    # [K+1, V]
    q = draft / draft.sum(axis=-1, keepdims=True)      # [K, V]
    idx = np.arange(k)
    accepted = uniforms[:k] * q[idx, tokens] < p[idx, tokens]   # accept w.p. min(1, p/q)
    n = k if accepted.all() else int(np.argmin(accepted))
    weights = np.maximum(p[n] - q[n], 0) if n < k else p[k]     # [V] residual or bonus
    cdf = np.cumsum(weights, dtype=np.float64)
    tok = int(np.searchsorted(cdf, uniforms[k] * cdf[-1], side="right"))
    return n, min(tok, weights.shape[0] - 1)


# ---------------------------------------------------------------------------------------------
# Block verification (Sun et al. 2024), the same rule as specverify.accept_block written plainly:
# capped cumulative ratios p_i, h_i = Z_i / (Z_i + 1 - p_i), tau = the LARGEST passing coin,
# residual norm(max(p_tau * p - q, 0)).
# ---------------------------------------------------------------------------------------------

def _block_thresholds(p_t, q_t, z_of):
    """Capped cumulative ratios [K+1] (from ratios p_t / q_t) and thresholds h [K]; z_of(s) gives
    Z_i for rows 1..K-1 given their survivals s [K-1]."""
    k = len(p_t)
    surv = [1.0]
    for a, b in zip(p_t, q_t):
        surv.append(0.0 if surv[-1] == 0.0 or a == 0.0 else (1.0 if b == 0.0 else min(1.0, surv[-1] * a / b)))
    z = z_of(surv[1:k])
    h = [1.0 if zi + 1.0 - s <= 0.0 else zi / (zi + 1.0 - s) for zi, s in zip(z, surv[1:k])] + [surv[k]]
    return surv, h


def torch_accept_block(target, draft, tokens, uniforms=None, generator=None):
    """target [K+1, V], draft [K, V], tokens [K] int64, uniforms [K+1] float64 or None."""
    k = tokens.shape[0]
    p = target / target.sum(dim=-1, keepdim=True)      # [K+1, V]
    q = draft / draft.sum(dim=-1, keepdim=True)        # [K, V]
    idx = torch.arange(k)
    p_t, q_t = p[idx, tokens].tolist(), q[idx, tokens].tolist()

    def z_of(s):  # [K-1] sum_v max(p_i p(v) - q(v), 0), rows 1..K-1
        s = torch.tensor(s, dtype=p.dtype)
        return torch.clamp(s[:, None] * p[1:k] - q[1:k], min=0).sum(dim=-1).tolist()

    surv, h = _block_thresholds(p_t, q_t, z_of)
    u = torch.rand(k, dtype=torch.float64, generator=generator) if uniforms is None else uniforms[:k]
    passed = (u < torch.tensor(h, dtype=torch.float64)).nonzero()
    n = int(passed[-1]) + 1 if passed.numel() else 0
    if n < k:
        weights = torch.clamp(surv[n] * p[n] - q[n], min=0)  # [V] block residual
        if not weights.sum() > 0:
            weights = p[n]
    else:
        weights = p[k]                                       # [V] bonus
    return n, int(torch.multinomial(weights, num_samples=1, generator=generator))


def numpy_accept_block(target, draft, tokens, uniforms):
    """target [K+1, V], draft [K, V], tokens [K] int64, uniforms [K+1] float64."""
    k = tokens.shape[0]
    p = target / target.sum(axis=-1, keepdims=True)    # [K+1, V]
    q = draft / draft.sum(axis=-1, keepdims=True)      # [K, V]
    idx = np.arange(k)
    surv, h = _block_thresholds(p[idx, tokens].tolist(), q[idx, tokens].tolist(),
                                lambda s: np.maximum(np.asarray(s, dtype=p.dtype)[:, None] * p[1:k] - q[1:k],
                                                     0).sum(axis=-1).tolist())
    passed = np.flatnonzero(uniforms[:k] < np.asarray(h))
    n = int(passed[-1]) + 1 if passed.size else 0
    weights = np.maximum(surv[n] * p[n] - q[n], 0) if n < k else p[k]   # [V] residual or bonus
    if not weights.sum() > 0:
        weights = p[n]
    cdf = np.cumsum(weights, dtype=np.float64)
    tok = int(np.searchsorted(cdf, uniforms[k] * cdf[-1], side="right"))
    return n, min(tok, weights.shape[0] - 1)


# ---------------------------------------------------------------------------------------------
# No-op baselines for the call-overhead measurement.
# ---------------------------------------------------------------------------------------------

def noop(*args):
    """A bare Python call: the floor of any Python-level API."""
    return 0, 0


def noop_convert(*args):
    """A no-op that does the argument handling a pointer-passing op cannot avoid: type and dtype
    checks, shape, contiguity and the data pointer of every array argument."""
    for a in args:
        if a is None:
            continue
        if isinstance(a, torch.Tensor):
            if a.dtype not in (torch.float32, torch.float64, torch.int64, torch.int32):
                raise TypeError(a.dtype)
            a.shape, a.is_contiguous(), a.data_ptr()
        else:
            a = np.asarray(a)
            if a.dtype.kind not in "fiu":
                raise TypeError(a.dtype)
            a.shape, a.flags.c_contiguous, a.ctypes.data
    return 0, 0


# ---------------------------------------------------------------------------------------------
# Bytes an op must read: every row it inspects is read in full (an argmax, or a row sum, since
# rows need not be normalized). Re-reads of a row already read (the residual pass) are not
# counted; the K tokens and K+1 uniforms are negligible and not counted.
# ---------------------------------------------------------------------------------------------

def bytes_read(op, v, k, n_accepted):
    if op == "verify_greedy":
        rows = n_accepted + 1                              # target rows 0..n
    elif op == "accept":
        rows = 2 * (n_accepted + 1) if n_accepted < k else 2 * k + 1   # target+draft 0..n (+p_K)
    elif op == "accept_block":
        rows = 2 * k + 1                                   # every target and draft row, always
    else:
        raise ValueError(f"op must be 'verify_greedy', 'accept' or 'accept_block', got {op!r}")
    return rows * v * F32


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

TARGET_LOGIT_SCALE = 4.0   # softmax(4 * N(0,1)) over 32000 tokens: entropy ~3.6 nats, max p ~0.33
ACCEPTANCE = 0.68          # per-position acceptance sum_v min(p, q) of the realistic draft


def _softmax_rows(z):
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def draft_noise_for_acceptance(v, alpha, rng, rows=16):
    """Scale tau of the Gaussian noise added to the target logits so that the draft's
    per-position acceptance sum_v min(p, q) is about alpha (bisection on `rows` sample rows)."""
    z = rng.standard_normal((rows, v), dtype=np.float32) * TARGET_LOGIT_SCALE
    e = rng.standard_normal((rows, v), dtype=np.float32)
    p = _softmax_rows(z.copy())
    lo, hi = 0.0, 8.0
    for _ in range(30):
        tau = 0.5 * (lo + hi)
        a = np.minimum(p, _softmax_rows(z + tau * e)).sum(axis=-1).mean()
        lo, hi = (tau, hi) if a > alpha else (lo, tau)
    return 0.5 * (lo + hi)


@dataclass
class RowPool:
    """Paired probability rows: target[r] = softmax(z_r), draft[r] = softmax(z_r + tau * e_r).

    A verification round at offset o reads target rows o..o+K and draft rows o..o+K-1 (views,
    row stride V). Rounds may overlap: the rows after a round's last read row are the next
    round's first rows, so a pool of rounds laid end to end reads every row exactly once.
    """
    v: int
    k: int
    target: np.ndarray      # [rows, V] float32
    draft: np.ndarray       # [rows, V] float32
    tau: float
    acceptance: np.ndarray  # [rows] sum_v min(target[r], draft[r])

    @property
    def rows(self):
        return self.target.shape[0]

    def round(self, offset):
        """(target [K+1, V], draft [K, V]) views of the round starting at row `offset`."""
        return self.target[offset:offset + self.k + 1], self.draft[offset:offset + self.k]


def make_row_pool(v, k, n_rows, rng, alpha=ACCEPTANCE, chunk=64):
    """n_rows rounds' worth of rows (plus K+1 so a round may start at any row < n_rows)."""
    tau = draft_noise_for_acceptance(v, alpha, rng)
    rows = n_rows + k + 1
    target = np.empty((rows, v), dtype=np.float32)
    draft = np.empty((rows, v), dtype=np.float32)
    for a in range(0, rows, chunk):   # in chunks, to bound the temporaries
        b = min(rows, a + chunk)
        z = rng.standard_normal((b - a, v), dtype=np.float32) * np.float32(TARGET_LOGIT_SCALE)
        draft[a:b] = _softmax_rows(z + np.float32(tau) * rng.standard_normal((b - a, v), dtype=np.float32))
        target[a:b] = _softmax_rows(z)
    acceptance = np.minimum(target, draft).sum(axis=-1)
    return RowPool(v, k, target, draft, tau, acceptance)


def realistic_greedy_tokens(target, rng, alpha=ACCEPTANCE):
    """Draft tokens that equal argmax(target_i) with probability alpha, else another token."""
    k = target.shape[0] - 1
    best = np.argmax(target[:k], axis=-1)
    other = (best + rng.integers(1, target.shape[1], size=k)) % target.shape[1]
    return np.where(rng.random(k) < alpha, best, other).astype(np.int64)


def worst_greedy_tokens(target):
    """All K accepted: t_i = argmax(target_i), so every one of the K+1 rows is read."""
    return np.argmax(target[:-1], axis=-1).astype(np.int64)


def realistic_accept_inputs(target, draft, rng):
    """Draft tokens sampled from the draft rows, uniforms from rng (float64 in [0, 1))."""
    k, v = draft.shape
    q = draft.astype(np.float64)
    cdf = np.cumsum(q / q.sum(axis=-1, keepdims=True), axis=-1)
    tokens = np.array([min(int(np.searchsorted(cdf[i], rng.random(), side="right")), v - 1)
                       for i in range(k)], dtype=np.int64)
    return tokens, rng.random(k + 1)


LAST_BELOW_ONE = math.nextafter(1.0, 0.0)


def worst_accept_inputs(target, draft):
    """Rejection at the last position, so every target and draft row 0..K-1 is read.

    Positions i < K-1: t_i = argmax(target_i) (p > 0) and u_i = 0, so the test u*q < p passes.
    Position K-1: t = argmax(q - p) (q > p, acceptance probability p/q < 1) and u = 1 - 2^-53,
    so the test fails. u[K] = 0.5 drives the residual draw.
    """
    k = draft.shape[0]
    tokens = np.argmax(target[:k], axis=-1).astype(np.int64)
    p = target[k - 1] / target[k - 1].sum(dtype=np.float64)
    q = draft[k - 1] / draft[k - 1].sum(dtype=np.float64)
    tokens[k - 1] = int(np.argmax(q - p))
    u = np.zeros(k + 1)
    u[k - 1] = LAST_BELOW_ONE
    u[k] = 0.5
    return tokens, u


def worst_block_inputs(target, draft):
    """The most work for accept_block: every ratio p_t / q_t in (0, 1) (t_i = argmax(q - p) over
    tokens with p > 0), so every p_i is positive and below 1 and each row 1..K-1 gets its residual
    pass; coins u = 1 - 2^-53 all fail, so tau = 0 and the draw scans row 0's residual."""
    k = draft.shape[0]
    p = target[:k] / target[:k].sum(axis=-1, keepdims=True, dtype=np.float64)
    q = draft / draft.sum(axis=-1, keepdims=True, dtype=np.float64)
    tokens = np.argmax(np.where(p > 0, q - p, -np.inf), axis=-1).astype(np.int64)
    u = np.full(k + 1, LAST_BELOW_ONE)
    u[k] = 0.5
    return tokens, u


# ---------------------------------------------------------------------------------------------
# Read-bandwidth probe
# ---------------------------------------------------------------------------------------------
#
# Warm: a buffer of exactly the working-set size is read repeatedly inside ONE reduction call,
# through a stride-0 view [R, n] of the buffer (R * n >= `min_total` bytes), so per-call
# overhead is amortized and the data stay in whichever cache level holds that size.
# Cold: the region (larger than twice the last-level cache plus all L2) is cut into chunks of the
# op's read size; one repetition reads every chunk once, in G = 8 calls, call g reading chunks
# g, g+G, g+2G, ... through a strided view, so consecutive chunks are never adjacent (no
# prefetching across them) and every chunk comes from DRAM (a repetition reads the whole region).
# Several reductions are tried (NumPy max, NumPy bitwise-or on uint32, torch sum, and an optional
# compiled `read_probe(buf, reps)` from specverify); the best bandwidth is used, and the floor is
# bytes / best bandwidth. NumPy's float32 sum is not used: it is compute-bound (pairwise
# summation, ~26 GB/s here) rather than bandwidth-bound.

def _numpy_max(view):
    return np.maximum.reduce(view, axis=1)


def _numpy_or(view):
    return np.bitwise_or.reduce(view.view(np.uint32), axis=1)


def _torch_sum(view):
    with warnings.catch_warnings():   # the view is read-only; torch warns about that, we only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(view).sum(dim=1)


PROBE_REDUCTIONS = {"numpy.max": _numpy_max, "numpy.bitwise_or": _numpy_or, "torch.sum": _torch_sum}


def compiled_probe():
    """{'specverify.read_probe': fn} if the kernels module offers a compiled read reduction
    ``read_probe(address, row_stride, rows, cols)`` (float32 elements; row_stride may be 0),
    else {}."""
    try:
        from specverify.kernels import _kernels
    except ImportError:
        return {}
    fn = getattr(_kernels, "read_probe", None)
    if fn is None:
        return {}

    def reduce(view):
        return fn(view.ctypes.data, view.strides[0] // F32, view.shape[0], view.shape[1])
    return {"specverify.read_probe": reduce}


def _best_ns(fn, reps, budget_ns):
    best = None
    start = time.perf_counter_ns()
    for i in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        dt = time.perf_counter_ns() - t0
        best = dt if best is None or dt < best else best
        if i >= 2 and time.perf_counter_ns() - start > budget_ns:
            break
    return best


class ReadProbe:
    """Single-thread read bandwidth (bytes/s) for a given read size, warm or cold."""

    def __init__(self, cold_region_bytes, extra=None, reps=15, budget_s=0.5, min_total=8 << 20):
        self.cold_region_bytes = int(cold_region_bytes)
        self.reductions = dict(PROBE_REDUCTIONS)
        self.reductions.update(compiled_probe() if extra is None else extra)
        self.reps, self.budget_ns, self.min_total = reps, int(budget_s * 1e9), min_total
        self._cache = {}
        self._cold_buf = None
        self.method = {}   # (kind, nbytes) -> name of the reduction that won

    def _views(self, kind, nbytes):
        n = max(1, nbytes // F32)
        if kind == "warm":
            buf = np.random.default_rng(0).random(n, dtype=np.float32)
            r = max(1, -(-self.min_total // (n * F32)))
            return [as_strided(buf, shape=(r, n), strides=(0, F32), writeable=False)]
        if self._cold_buf is None:
            self._cold_buf = np.random.default_rng(1).random(self.cold_region_bytes // F32,
                                                             dtype=np.float32)
        buf = self._cold_buf
        chunks = buf.shape[0] // n
        groups = min(self.COLD_GROUPS, chunks)
        views = []
        for g in range(groups):
            count = len(range(g, chunks, groups))
            views.append(as_strided(buf[g * n:], shape=(count, n), strides=(groups * n * F32, F32),
                                    writeable=False))
        return views

    COLD_GROUPS = 8

    def bandwidth(self, kind, nbytes):
        """Best bytes/s over the reductions for reading `nbytes` per call ('warm' or 'cold')."""
        key = (kind, int(nbytes))
        if key not in self._cache:
            views = self._views(kind, nbytes)
            total = sum(w.shape[0] * w.shape[1] for w in views) * F32
            best, name = 0.0, None
            for rname, red in self.reductions.items():
                def run(red=red):
                    for w in views:
                        red(w)
                run()   # warm-up (and for 'warm': bring the buffer into cache)
                ns = _best_ns(run, self.reps, self.budget_ns)
                bw = total / (ns * 1e-9)
                if bw > best:
                    best, name = bw, rname
            self._cache[key] = best
            self.method[key] = name
        return self._cache[key]

    def floor_ns(self, kind, nbytes):
        return nbytes / self.bandwidth(kind, nbytes) * 1e9


CONVERT_ONLY = {  # compiled no-ops specverify may offer: the op's argument handling, no kernel
    "verify_greedy": "convert_only_verify_greedy",        # (target_probs, draft_tokens)
    "accept_from_uniforms": "convert_only_accept",        # (target, draft, tokens, None, uniforms)
    "warp": "convert_only_warp",                          # (logits, out)
}


def specverify_conversion_noops(sv):
    """{'verify_greedy': fn, 'accept_from_uniforms': fn[, 'warp': fn]}: no-ops with exactly the
    argument handling of specverify's ops, if ``specverify.kernels._kernels`` offers them
    (``CONVERT_ONLY``; warp's only in builds that have it); else None."""
    try:
        from specverify.kernels import _kernels
    except ImportError:
        return None
    greedy = getattr(_kernels, CONVERT_ONLY["verify_greedy"], None)
    accept = getattr(_kernels, CONVERT_ONLY["accept_from_uniforms"], None)
    if greedy is None or accept is None:
        return None
    noops = {"verify_greedy": greedy,
             "accept_from_uniforms": lambda t, d, tok, u: accept(t, d, tok, None, u)}
    warp = getattr(_kernels, CONVERT_ONLY["warp"], None)
    if warp is not None:
        noops["warp"] = warp
    return noops


# ---------------------------------------------------------------------------------------------
# Warping (logits -> sampling probabilities): the sort-based torch path and transformers' warpers
# ---------------------------------------------------------------------------------------------

def torch_warp(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The adapter's torch warp (sort-based top-p), plus min-p as transformers states it."""
    from specverify.integrations.transformers import warp

    probs = warp(logits, temperature, top_k, top_p)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def transformers_warp(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """transformers' warpers in generate's order, then the softmax generate samples from."""
    from specverify.integrations.transformers import transformers_warpers

    return torch.softmax(transformers_warpers(temperature, top_k, top_p, min_p)(None, logits), dim=-1)


def model_like_logits(v, rows, rng):
    """[rows, V] float32 logits shaped like a language model's: N(0, 2.5^2) for the vocabulary,
    plus a head of 20 tokens lifted by 6..12 (a confident next-token distribution whose top-p
    0.9 set holds tens of tokens)."""
    x = 2.5 * rng.standard_normal((rows, v))
    n_head = min(20, v)
    for r in range(rows):
        head = rng.choice(v, n_head, replace=False)
        x[r, head] += rng.uniform(6.0, 12.0, n_head)
    return x.astype(np.float32)
