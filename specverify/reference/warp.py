"""Slow, readable NumPy reference of ``specverify.warp``: logits -> sampling probabilities.

The compiled kernel (``specverify._warp``) returns the same float32 bits.  Every step is stated
in float32 (or int64, or float64) arithmetic below so both can follow it operation by operation;
this reference sorts where the kernel selects.

For one row ``x`` ``[V]`` float32 of logits (finite or -inf, at least one finite):

1. **Temperature.**  ``m = max(x)``; ``c = fl32(1 / temperature)`` (float64 division rounded to
   float32, then clamped to ``[2**-126, FLT_MAX]`` so a huge or tiny temperature stays usable);
   ``z = fl32(fl32(x - m) * c)`` ``[V]``, all ``<= 0`` (-inf stays -inf).  ``c == 1`` skips the
   product (same bits).  This is ``(x - max x) / temperature`` up to float32 rounding.
2. **Weights.**  ``w = exp32(z)`` ``[V]`` float32 in ``[0, 1]``, with ``w = 1`` exactly at the
   maximum: :func:`exp32` is this module's own exponential (Cephes' ``expf`` polynomial, every
   operation in float32, no FMA), identical in NumPy and in the vectorized kernel loop.
3. **The rank order** used by every cut: ``w`` descending, ties by lower token index.
4. **Top-k** (``0 < top_k < V``): keep the first ``top_k`` tokens of the rank order (exactly
   ``top_k``: a tie at the cut is resolved by token index); the others get ``w = 0``.
5. **Top-p** (``top_p < 1``): with the fixed-point weights ``q = trunc(w * 2**40)`` (int64; exact
   sums in any order, so no summation order to fix), keep a token iff the weight of the tokens
   before it in the rank order, ``Q_before``, satisfies ``float64(Q_before) < top_p *
   float64(Q_total)``: the shortest prefix whose mass reaches ``top_p``, as
   ``transformers.TopPLogitsWarper`` (a token whose predecessors hold less than ``top_p`` stays).
   The most likely token always stays.  Weights below ``2**-40`` count as 0 here (they add at most
   ``V * 2**-40`` to a mass, ~1e-7 at V = 128k).
6. **Min-p** (``min_p > 0``): keep a token iff ``w >= min_p`` (compared exactly: ``w`` is a
   float32, ``min_p`` a float64), i.e. its probability is at least ``min_p`` times the largest
   (which has ``w = 1``).
7. **Normalize.**  ``S`` = float64 mass of the kept ``w`` in the project's fixed summation order
   (:func:`specverify.reference.row_mass`); ``probs = fl32(w * fl32(1 / S))`` (0 where dropped).
   Rows sum to 1 in float64 up to float32 rounding.

At least one token (the first maximum) always survives every cut.  ``top_k = 0``, ``top_p = 1``
and ``min_p = 0`` switch their cuts off.
"""

import numpy as np

from .._math import min_p_threshold, temperature_scale
from .primitives import row_mass

# -- exp32: Cephes expf (S. Moshier), every operation a float32 IEEE operation ---------------
EXP_CUTOFF = np.float32(-86.0)  # exp32(z) = 0 below: keeps 2**n a normal float (n >= -124)
LOG2E = np.float32(1.44269504088896341)
ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: (t + M) - M rounds t to an integer (ties even)
LN2_HI = np.float32(0.693359375)  # ln 2 = LN2_HI + LN2_LO (Cody-Waite: n * LN2_HI is exact)
LN2_LO = np.float32(-2.12194440e-4)
EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                         4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
FIXED_ONE = 2.0 ** 40  # fixed-point unit of the top-p masses


def exp32(z):
    """``exp(z)`` for float32 ``z <= 0`` ``[...]`` (``-inf`` allowed), float32, in this order::

        zc = max(z, -86);  n = (zc * LOG2E + M) - M            # nearest integer, |n| <= 124
        r = (zc - n * LN2_HI) - n * LN2_LO                     # |r| <= ln(2) / 2
        y = ((poly(r) * r) * r + r) + 1                        # poly: Horner over EXP_POLY
        exp32(z) = y * 2**n  if z >= -86  else 0

    ``exp32(0) == 1`` exactly.  Accuracy against ``np.exp`` in float64, measured in the tests
    over every 1/1024 step of [-86, 0] and 10**6 random points: below 1 ulp (float32 units), monotone, and
    ``exp(z) < 2**-124`` is flushed to 0.
    """
    shape = np.shape(z)
    z = np.asarray(z, dtype=np.float32).reshape(-1)  # 1-D: no value-based casting (NumPy 1.x)
    with np.errstate(invalid="ignore", over="ignore"):
        zc = np.maximum(z, EXP_CUTOFF)
        n = (zc * LOG2E + ROUND_MAGIC) - ROUND_MAGIC
        r = (zc - n * LN2_HI) - n * LN2_LO
        poly = EXP_POLY[0]
        for coefficient in EXP_POLY[1:]:
            poly = poly * r + coefficient
        y = ((poly * r) * r + r) + np.float32(1.0)
        exponent = (n.astype(np.int32) + np.int32(127)).astype(np.int32)
        scale = (exponent << np.int32(23)).astype(np.int32).view(np.float32)
        return np.where(z >= EXP_CUTOFF, y * scale, np.float32(0.0)).astype(np.float32).reshape(shape)


def fixed_weights(w):
    """Top-p's fixed-point weights ``trunc(w * 2**40)`` ``[V]`` int64 (``w * 2**40`` is exact)."""
    return (np.asarray(w, dtype=np.float32) * np.float32(FIXED_ONE)).astype(np.int64)


def rank_order(w):
    """Token ids ``[V]`` in the rank order: ``w`` descending, ties by lower index."""
    w = np.asarray(w, dtype=np.float32)
    return np.lexsort((np.arange(w.size), -w.astype(np.float64)))


def weights(row, temperature=1.0):
    """Steps 1-2: ``w = exp32(fl32(x - max x) * c)`` ``[V]`` float32."""
    x = np.asarray(row, dtype=np.float32)
    c = temperature_scale(temperature)
    with np.errstate(invalid="ignore", over="ignore"):
        z = x - x.max()
        if c != np.float32(1.0):
            z = z * c
    return exp32(z)


def keep_prefix(order_weights, threshold):
    """Number of rank-order tokens kept by a cut: those whose predecessors' weight sum ``A``
    (int64) has ``float64(A) < threshold``; ``order_weights`` ``[V]`` int64 in rank order."""
    before = np.cumsum(order_weights) - order_weights  # exact int64
    return int(np.count_nonzero(before.astype(np.float64) < threshold))


def warp_row_mask(row, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """``(w, keep)``: the weights of steps 1-2 ``[V]`` float32 and the kept tokens ``[V]`` bool."""
    w = weights(row, temperature)
    v = w.size
    keep = np.ones(v, dtype=bool)
    if 0 < top_k < v:  # step 4: weight 1 per token, threshold k
        order = rank_order(w)
        keep[order[keep_prefix(np.ones(v, dtype=np.int64), float(top_k)):]] = False
    if top_p < 1.0:  # step 5, on the weights left by top-k
        left = np.where(keep, w, np.float32(0.0))
        order = rank_order(left)
        q = fixed_weights(left)[order]
        total = int(q.sum())
        keep[order[keep_prefix(q, float(top_p) * float(total)):]] = False
    if min_p > 0.0:  # step 6
        keep &= w >= min_p_threshold(min_p)
    return w, keep


def warp(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """Probabilities ``[n, V]`` float32 from logits ``[n, V]`` (steps 1-7 of the module doc)."""
    rows = np.atleast_2d(np.asarray(logits, dtype=np.float32))
    out = np.empty(rows.shape, dtype=np.float32)
    for i, row in enumerate(rows):
        w, keep = warp_row_mask(row, temperature, top_k, top_p, min_p)
        kept = np.where(keep, w, np.float32(0.0))
        out[i] = kept * np.float32(1.0 / row_mass(kept))
    return out
