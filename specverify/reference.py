"""Slow, readable NumPy references for the ops.

They take the same uniforms as the kernels and return the same ``(n_accepted, next_token)`` bit
for bit: every float64 sum follows the documented order (``specverify/_primitives.pxd``), every
weight is computed with the same IEEE operations.  No validation beyond what the math needs: pass
valid inputs (the ops validate theirs).
"""

import numpy as np

BLOCK = 256  # elements per summation block
LANES = 8  # float64 lanes per block


def block_sums(weights):
    """Block sums of a row in the documented order.

    weights: ``[V]`` float64.  Returns ``[ceil(V / BLOCK)]`` float64.  Inside a block, element
    ``j`` goes to lane ``j % LANES``; each lane is summed left to right (``cumsum`` is sequential
    by definition; the zero padding adds nothing); the lanes are combined by a pairwise tree.
    """
    weights = np.asarray(weights, dtype=np.float64)
    n_blocks = -(-weights.size // BLOCK)
    padded = np.zeros(n_blocks * BLOCK)
    padded[: weights.size] = weights
    lanes = np.cumsum(padded.reshape(n_blocks, BLOCK // LANES, LANES), axis=1)[:, -1, :]
    while lanes.shape[1] > 1:  # pairwise tree: lane l + half folds into lane l
        half = lanes.shape[1] // 2
        lanes = lanes[:, :half] + lanes[:, half:]
    return lanes[:, 0]


def ordered_total(sums):
    """Left-to-right float64 sum starting from 0.0 (how a row total is formed from its blocks)."""
    total = 0.0
    for s in sums:
        total += s
    return total


def row_mass(row):
    """Mass of a float32 row in the documented order."""
    return ordered_total(block_sums(np.asarray(row, dtype=np.float64)))


def sample_index(weights, u):
    """Inverse-CDF draw of an index with probability ``weights / weights.sum()`` using ``u``.

    The block of the draw is the first whose running sum exceeds ``u * total``; inside it, the
    first index whose running sum exceeds what is left; if rounding lets that sum fall short,
    the block's last index with positive weight.
    """
    weights = np.asarray(weights, dtype=np.float64)
    sums = block_sums(weights)
    target = u * ordered_total(sums)
    cumulative = 0.0
    for b, s in enumerate(sums):
        if cumulative + s > target:
            remainder = target - cumulative
            running, last = 0.0, None
            for j in range(b * BLOCK, min((b + 1) * BLOCK, weights.size)):
                if weights[j] > 0.0:
                    running += weights[j]
                    last = j
                    if running > remainder:
                        return j
            return last
        cumulative += s
    return int(np.flatnonzero(weights > 0)[-1])  # unreachable for u < 1


def verify_greedy(target_probs, draft_tokens):
    """``(n_accepted, next_token)``: accept while the draft equals the row's argmax."""
    target = np.asarray(target_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    for i in range(tokens.size + 1):
        best = int(np.argmax(target[i]))
        if i == tokens.size or tokens[i] != best:
            return i, best


def residual_weights(p_row, q_row, p_mass, q_mass):
    """Unnormalized residual ``max(0, p/P - q/Q) * P = max(0, p - q * (P/Q))`` in float64."""
    d = np.asarray(p_row, dtype=np.float64) - np.asarray(q_row, dtype=np.float64) * (p_mass / q_mass)
    return np.where(d > 0.0, d, 0.0)


def accept(target_probs, draft_probs, draft_tokens, uniforms):
    """Speculative sampling with explicit uniforms ``u`` (``[K+1]`` float64).

    target_probs ``[K+1, V]``, draft_probs ``[K, V]`` or None (point-mass draft),
    draft_tokens ``[K]``.  ``u[i]`` decides position ``i``; ``u[K]`` draws the emitted token.
    """
    p_rows = np.asarray(target_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    u = np.asarray(uniforms, dtype=np.float64)
    k = tokens.size
    for i in range(k):
        p = p_rows[i]
        t = int(tokens[i])
        p_mass = row_mass(p)
        if draft_probs is None:
            # Point-mass draft: q_i(t) = 1.
            if u[i] * p_mass < float(p[t]):
                continue
            without_t = p.astype(np.float64)
            without_t[t] = 0.0
            if ordered_total(block_sums(without_t)) > 0.0:
                return i, sample_index(without_t, u[k])
            return i, sample_index(p, u[k])
        q = np.asarray(draft_probs, dtype=np.float32)[i]
        q_mass = row_mass(q)
        if u[i] * (float(q[t]) * p_mass) < float(p[t]) * q_mass:
            continue
        residual = residual_weights(p, q, p_mass, q_mass)
        if ordered_total(block_sums(residual)) > 0.0:
            return i, sample_index(residual, u[k])
        return i, sample_index(p, u[k])
    return k, sample_index(p_rows[k], u[k])
