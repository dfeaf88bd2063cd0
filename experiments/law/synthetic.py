"""Synthetic target/draft distributions with documented knobs, and Markov "language models".

Row families (``[k+1, V]`` target rows, ``[k, V]`` draft rows)
---------------------------------------------------------------
Target row ``i``: ``p_i = softmax(z_i / T)`` with ``z_i ~ N(0, I_V)`` and temperature ``T``
(default 0.25: about 2.4 nats of entropy at V = 32000, peaked like a language model's next-token
distribution). The draft row ``q_i`` comes from one of three families, each with one knob that
moves it away from ``p_i`` (knob 0 = perfect draft):

``noise``   ``q_i = softmax((z_i + sigma * eps_i) / T)``, ``eps_i ~ N(0, I_V)``; knob ``sigma >= 0``.
``mixture`` ``q_i = (1 - lam) p_i + lam r_i`` with ``r_i`` an independent row of the same
            kind; knob ``lam`` in [0, 1]. Acceptance ``= 1 - lam * TV(p_i, r_i)``.
``argmax``  ``q_i = (1 - lam) onehot(argmax p_i) + lam r_i``; knob ``lam`` in [0, 1]. Made for
            greedy verification, where acceptance ``= q_i(argmax p_i) = 1 - lam + lam r_i(argmax p_i)``.

Acceptance of position ``i`` (the law's ``a_i``): ``sum_v min(p_i, q_i)`` for speculative
sampling (``mode="sample"``), ``q_i(argmax p_i)`` for greedy verification of sampled draft
tokens (``mode="greedy"``). :func:`pick_knob` bisects the knob for a requested mean acceptance
over the rows, on fixed underlying normals (common random numbers), so the answer is
deterministic given the seed.

Rows are handed to the ops as float32, and all laws are computed from those float32 values
(renormalized in float64), so the law describes exactly what the kernel sees.

Markov models
-------------
:class:`BigramModel` is a ``[V, V]`` next-token table (row = previous token), small enough that
the exact joint law of every continuation can be enumerated; :func:`markov_callbacks` wraps a
target and a draft bigram as ``SpeculativeDecoder`` callbacks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np

TEMPERATURE = 0.25
FAMILIES = ("noise", "mixture", "argmax")
MODES = ("sample", "greedy")


# ------------------------------------------------------------------------------------------
# row families
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BaseDraws:
    """The normals behind one target/draft pair (common random numbers for calibration)."""

    z: np.ndarray  # [k+1, V] target logits before temperature
    eps: np.ndarray  # [k, V] draft noise (family "noise")
    r: np.ndarray  # [k, V] logits of the independent rows r_i (families "mixture", "argmax")
    temperature: float

    @property
    def k(self) -> int:
        return self.eps.shape[0]


def base_draws(rng: np.random.Generator, k: int, vocab: int, temperature: float = TEMPERATURE) -> BaseDraws:
    if k < 1 or vocab < 2:
        raise ValueError(f"need k >= 1 and vocab >= 2, got k={k}, vocab={vocab}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = rng.standard_normal((k + 1, vocab))
    eps = rng.standard_normal((k, vocab))
    r = rng.standard_normal((k, vocab))
    return BaseDraws(z, eps, r, float(temperature))


def softmax(logits: np.ndarray) -> np.ndarray:
    x = logits - logits.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def _f32(p: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(p, dtype=np.float32)


def target_rows(base: BaseDraws) -> np.ndarray:
    """``[k+1, V]`` float32 target rows."""
    return _f32(softmax(base.z / base.temperature))


def draft_rows(base: BaseDraws, family: str, knob: float) -> np.ndarray:
    """``[k, V]`` float32 draft rows of ``family`` at ``knob`` (see the module docstring)."""
    t = base.temperature
    if family == "noise":
        if knob < 0:
            raise ValueError(f"noise knob sigma must be >= 0, got {knob}")
        return _f32(softmax((base.z[:-1] + knob * base.eps) / t))
    if not 0.0 <= knob <= 1.0:
        raise ValueError(f"{family} knob lam must be in [0, 1], got {knob}")
    r = softmax(base.r / t)
    if family == "mixture":
        p = softmax(base.z[:-1] / t)
    elif family == "argmax":
        p = np.zeros_like(r)
        p[np.arange(base.k), base.z[:-1].argmax(axis=1)] = 1.0
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return _f32((1.0 - knob) * p + knob * r)


def acceptance(target: np.ndarray, draft: np.ndarray, mode: str = "sample") -> np.ndarray:
    """Per-position acceptance ``a_i`` (``[k]``) of ``draft`` against ``target`` (rows float32)."""
    p = np.asarray(target, dtype=np.float64)[: draft.shape[0]]
    q = np.asarray(draft, dtype=np.float64)
    p = p / p.sum(axis=1, keepdims=True)
    q = q / q.sum(axis=1, keepdims=True)
    if mode == "sample":
        return np.minimum(p, q).sum(axis=1)
    if mode == "greedy":
        return q[np.arange(q.shape[0]), p.argmax(axis=1)]
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def pick_knob(base: BaseDraws, target_acceptance: float, family: str = "noise",
              mode: str = "sample", tol: float = 1e-5, max_iter: int = 80) -> float:
    """The knob at which the mean per-position acceptance of ``base``'s rows is the requested one.

    Bisection on the fixed normals of ``base``: acceptance falls as the knob grows. Raises
    ``ValueError`` when the request is outside what the family reaches in this mode.
    """
    if not 0.0 < target_acceptance < 1.0:
        raise ValueError(f"target acceptance must be in (0, 1), got {target_acceptance}")
    target = target_rows(base)

    def mean_acc(knob):
        return float(acceptance(target, draft_rows(base, family, knob), mode).mean())

    lo = 0.0
    hi = 1.0
    if family == "noise":
        while mean_acc(hi) > target_acceptance and hi < 1e4:
            lo, hi = hi, hi * 2.0
    a_lo, a_hi = mean_acc(lo), mean_acc(hi)
    if not a_hi <= target_acceptance <= a_lo:
        raise ValueError(
            f"acceptance {target_acceptance} is out of reach for family {family!r} in {mode} mode "
            f"(it spans {a_hi:.4f} .. {a_lo:.4f}); try another family (greedy: 'argmax')"
        )
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        a = mean_acc(mid)
        if abs(a - target_acceptance) < tol:
            return mid
        lo, hi = (mid, hi) if a > target_acceptance else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Pair:
    target: np.ndarray  # [k+1, V] float32
    draft: np.ndarray  # [k, V] float32
    family: str
    knob: float
    mode: str
    acceptance: np.ndarray  # [k], the law's a_i


def make_pair(rng: np.random.Generator, k: int, vocab: int, *, acceptance_target: Optional[float] = None,
              knob: Optional[float] = None, family: str = "noise", mode: str = "sample",
              temperature: float = TEMPERATURE) -> Pair:
    """Draw a target/draft pair; give either ``acceptance_target`` (knob calibrated) or ``knob``."""
    if (acceptance_target is None) == (knob is None):
        raise ValueError("give exactly one of acceptance_target and knob")
    base = base_draws(rng, k, vocab, temperature)
    if knob is None:
        knob = pick_knob(base, acceptance_target, family, mode)
    target = target_rows(base)
    draft = draft_rows(base, family, float(knob))
    return Pair(target, draft, family, float(knob), mode, acceptance(target, draft, mode))


def sample_tokens(draft: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, k]`` int64 draft tokens, column ``i`` i.i.d. from row ``i`` of ``draft`` (inverse CDF)."""
    k, vocab = draft.shape
    u = rng.random((n, k))
    out = np.empty((n, k), dtype=np.int64)
    for i in range(k):
        cdf = np.cumsum(draft[i], dtype=np.float64)
        # side="right": a token of zero mass owns an empty interval and is never drawn
        out[:, i] = np.minimum(np.searchsorted(cdf, u[:, i] * cdf[-1], side="right"), vocab - 1)
    return out


# ------------------------------------------------------------------------------------------
# Markov (bigram) models
# ------------------------------------------------------------------------------------------
def random_bigram(rng: np.random.Generator, vocab: int, concentration: float = 1.0) -> np.ndarray:
    """``[V, V]`` float32 table with Dirichlet(concentration) rows (row = previous token)."""
    return _f32(rng.dirichlet(np.full(vocab, float(concentration)), size=vocab))


def mix_bigram(a: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
    """``(1 - lam) a + lam b``, rows renormalized, float32."""
    m = (1.0 - lam) * np.asarray(a, np.float64) + lam * np.asarray(b, np.float64)
    return _f32(m / m.sum(axis=1, keepdims=True))


class BigramModel:
    """A next-token table ``[V, V]``: ``table[prev]`` is the distribution of the next token."""

    def __init__(self, table: np.ndarray):
        table = np.asarray(table)
        if table.ndim != 2 or table.shape[0] != table.shape[1]:
            raise ValueError(f"table must be [V, V], got {table.shape}")
        self.table = _f32(table)
        t64 = self.table.astype(np.float64)
        self._p = t64 / t64.sum(axis=1, keepdims=True)  # the law, from the float32 values
        self._cdf = np.cumsum(self.table, axis=1, dtype=np.float64)

    @property
    def vocab(self) -> int:
        return self.table.shape[0]

    def rows(self, prev_tokens) -> np.ndarray:
        """``[m, V]`` float32 rows for each previous token."""
        return self.table[np.asarray(prev_tokens, dtype=np.int64)]

    def sample(self, prev: int, rng: np.random.Generator) -> int:
        cdf = self._cdf[prev]
        return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), self.vocab - 1))

    def greedy(self, prompt, n: int) -> list:
        """Plain greedy decoding: ``n`` tokens after ``prompt`` (first argmax on ties)."""
        out = [int(x) for x in prompt]
        for _ in range(n):
            out.append(int(np.argmax(self.table[out[-1]])))
        return out[len(prompt):]

    def continuation_law(self, prev: int, length: int) -> np.ndarray:
        """Exact joint pmf of the next ``length`` tokens after ``prev``: shape ``[V] * length``."""
        law = self._p[prev]
        for _ in range(length - 1):
            # law[..., x] * P(y | x) -> law[..., x, y]
            law = law[..., :, None] * self._p
        return law

    def continuation_index(self, tokens) -> int:
        """Row-major index of a continuation into ``continuation_law(...).ravel()``."""
        idx = 0
        for t in tokens:
            idx = idx * self.vocab + int(t)
        return idx


def markov_callbacks(target: BigramModel, draft: BigramModel, rng: Optional[np.random.Generator],
                     greedy: bool = False, pass_probs: bool = True):
    """``(draft_step, target_step)`` for :class:`specverify.SpeculativeDecoder`.

    The draft samples its tokens from its own table with ``rng`` (or takes the argmax when
    ``greedy``) and returns the rows it sampled from (``None`` if ``pass_probs`` is false).
    The target returns its rows after ``prefix + proposed[:i]`` for ``i = 0..m``.
    """

    def draft_step(prefix, k):
        prev = int(prefix[-1])
        toks = []
        for _ in range(k):
            nxt = int(np.argmax(draft.table[prev])) if greedy else draft.sample(prev, rng)
            toks.append(nxt)
            prev = nxt
        probs = draft.rows([int(prefix[-1])] + toks[:-1]) if pass_probs else None
        return np.asarray(toks, dtype=np.int64), probs

    def target_step(prefix, proposed):
        prevs = [int(prefix[-1])] + [int(t) for t in proposed]
        return target.rows(prevs)

    return draft_step, target_step


def all_continuations(vocab: int, length: int):
    """Every continuation of ``length`` tokens, in row-major order."""
    return itertools.product(range(vocab), repeat=length)
