"""The numeric contract in NumPy: block sums, masses, ratios, residual weights and the draw.

Each function restates, operation by operation, a primitive of ``specverify/kernels/_primitives.pxd``.
"""

import math

import numpy as np

BLOCK = 256  # elements per summation block
LANES = 64  # float32 lanes per block
SCAN_LANES = 8  # float64 lanes of a draw's in-block total
RESCUE_EXPONENT = 32  # a block whose float32 sum overflows is summed again scaled by 2^-32
RATIO_EXPONENT = 100  # mass ratios in [2^-101, 2^100) enter the residual as one float32 factor
RATIO_SNAP = 2.0 ** -20  # quotients of masses within this of 1 are taken as exactly 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_float32_weights(weights):
    """``weights`` as float32, refusing values float32 cannot hold exactly (a float64 residual
    computed the old way would otherwise be rounded silently and disagree with the kernels)."""
    weights = np.asarray(weights)
    weights32 = weights.astype(np.float32)
    if weights.dtype != np.float32 and not np.array_equal(weights32.astype(weights.dtype), weights):
        raise ValueError("weights must be float32 values (the contract computes weights in float32)")
    return weights32


def _tree(lanes):
    """Pairwise tree over the last axis, halving: lane l + half folds into lane l."""
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    return lanes[..., 0]


def _lane_sums(blocks):
    """float32 lane sums of ``[n_blocks, BLOCK]`` float32 blocks, in the documented order."""
    lanes = np.cumsum(blocks.reshape(-1, BLOCK // LANES, LANES), axis=1, dtype=np.float32)[:, -1, :]
    return _tree(lanes)


def block_sums(weights):
    """Block sums of a row of float32 weights in the documented order.

    weights: ``[V]`` float32 (or float64 holding float32 values).  Returns ``[ceil(V / BLOCK)]``
    float64.  Inside a block, element ``j`` goes to float32 lane ``j % LANES``; each lane is summed
    left to right (``cumsum`` is sequential; the zero padding adds nothing); the lanes are combined
    by a halving tree in float32.  A block whose float32 sum overflows is summed again with its
    elements scaled by 2^-32 and the result scaled back by 2^32 in float64.
    """
    weights = as_float32_weights(weights)
    n_blocks = -(-weights.size // BLOCK)
    padded = np.zeros(n_blocks * BLOCK, dtype=np.float32)
    padded[: weights.size] = weights
    blocks = padded.reshape(n_blocks, BLOCK)
    with np.errstate(over="ignore", invalid="ignore"):
        sums32 = _lane_sums(blocks)
        sums = sums32.astype(np.float64)
        overflowed = ~(sums32 <= FLOAT32_MAX)
        if overflowed.any():
            scaled = blocks[overflowed] * np.float32(2.0 ** -RESCUE_EXPONENT)
            sums[overflowed] = _lane_sums(scaled).astype(np.float64) * 2.0 ** RESCUE_EXPONENT
    return sums


def ordered_total(sums):
    """Left-to-right float64 sum starting from 0.0 (how a row total is formed from its blocks)."""
    total = 0.0
    for s in sums:
        total += s
    return total


def row_mass(row):
    """Mass of a float32 row in the documented order."""
    return ordered_total(block_sums(row))


def scan_total(block):
    """float64 total of a block's float32 weights that a draw rescales by: ``SCAN_LANES`` float64
    lanes (element ``j`` to lane ``j % 8``, summed left to right), pairwise tree."""
    padded = np.zeros(BLOCK)
    padded[: block.size] = block
    return _tree(np.cumsum(padded.reshape(BLOCK // SCAN_LANES, SCAN_LANES), axis=0)[-1])


def sample_index(weights, u):
    """Inverse-CDF draw of an index with probability ``weights / weights.sum()`` using ``u``.

    weights: ``[V]`` float32.  The block of the draw is the first whose running float64 sum of
    block sums exceeds ``u * total``; ``f`` is the part of that block's sum left, as a fraction of
    it.  Inside the block: the first index with positive weight whose running float64 sum exceeds
    ``f * scan_total(block)``; if rounding lets that sum fall short, the block's last index with
    positive weight.
    """
    weights = as_float32_weights(weights)
    sums = block_sums(weights)
    target = u * ordered_total(sums)
    cumulative = 0.0
    for b, s in enumerate(sums):
        if cumulative + s > target:
            fraction = (target - cumulative) / s
            block = weights[b * BLOCK:(b + 1) * BLOCK].astype(np.float64)
            remainder = fraction * scan_total(block)
            running, last = 0.0, None
            for j, w in enumerate(block):
                if w > 0.0:
                    running += w
                    last = j
                    if running > remainder:
                        return b * BLOCK + j
            return b * BLOCK + last
        cumulative += s
    return int(np.flatnonzero(weights > 0)[-1])  # unreachable for u < 1


def ratio_factors(mass_ratio):
    """``(a, b, c)`` float32 with ``q * mass_ratio`` evaluated as ``((q * a) * b) * c``.

    mass_ratio clamped to [2^-300, 2^300]; with it in [2^(e-1), 2^e): ``a = b = 1`` and
    ``c = float32(mass_ratio)`` if ``|e| <= 100``, else the excess exponent is split between ``a``
    and ``b`` and ``c = float32(mass_ratio / (a * b))``.
    """
    r = min(max(mass_ratio, 2.0 ** -300), 2.0 ** 300)
    e = math.frexp(r)[1]
    excess = e - min(max(e, -RATIO_EXPONENT), RATIO_EXPONENT)
    half = excess >> 1
    return np.float32(2.0 ** half), np.float32(2.0 ** (excess - half)), np.float32(math.ldexp(r, -excess))


def mass_ratio(numerator, denominator):
    """The quotient of two masses as the residual takes it: float64, and exactly 1 when within
    2^-20 of 1 (the masses are only known to ~1e-6; see ``specverify/kernels/_primitives.pxd``)."""
    ratio = numerator / denominator
    return 1.0 if abs(ratio - 1.0) <= RATIO_SNAP else ratio


def residual_weights(p_row, q_row, ratio):
    """Unnormalized residual ``max(0, p - q * ratio)`` in float32 as the contract computes it:
    ``max(0, p - ((q * a) * b) * c)`` with ``ratio_factors(ratio)``; accept's residual
    ``max(0, p/P - q/Q) * P`` has ``ratio = mass_ratio(P, Q)``.  Returns ``[V]`` float32."""
    a, b, c = ratio_factors(ratio)
    p = np.asarray(p_row, dtype=np.float32)
    q = np.asarray(q_row, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        d = p - ((q * a) * b) * c
    return np.where(d > 0, d, np.float32(0.0)).astype(np.float32)
