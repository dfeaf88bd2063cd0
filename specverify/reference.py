"""Slow, readable NumPy references for the ops.

They take the same uniforms as the kernels and return the same ``(n_accepted, next_token)`` bit
for bit: every sum follows the documented order (``specverify/_primitives.pxd``, numeric contract
v2: float32 lanes inside a block, float64 across blocks), every weight is computed with the same
IEEE operations.  NumPy's float32 element-wise operations round like C's ``float`` ones; its
``cumsum`` (an accumulate) is sequential, unlike ``np.sum``, whose pairwise order the kernels do
not follow.  No validation beyond what the math needs: pass valid inputs (the ops validate theirs).
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


def verify_greedy(target_probs, draft_tokens):
    """``(n_accepted, next_token)``: accept while the draft equals the row's argmax."""
    target = np.asarray(target_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    for i in range(tokens.size + 1):
        best = int(np.argmax(target[i]))
        if i == tokens.size or tokens[i] != best:
            return i, best


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
    2^-20 of 1 (the masses are only known to ~1e-6; see ``specverify/_primitives.pxd``)."""
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
            without_t = p.copy()
            without_t[t] = 0.0
            if ordered_total(block_sums(without_t)) > 0.0:
                return i, sample_index(without_t, u[k])
            return i, sample_index(p, u[k])
        q = np.asarray(draft_probs, dtype=np.float32)[i]
        q_mass = row_mass(q)
        if u[i] * (float(q[t]) * p_mass) < float(p[t]) * q_mass:
            continue
        residual = residual_weights(p, q, mass_ratio(p_mass, q_mass))
        if ordered_total(block_sums(residual)) > 0.0:
            return i, sample_index(residual, u[k])
        return i, sample_index(p, u[k])
    return k, sample_index(p_rows[k], u[k])


def block_survival_step(survival, p_t, q_t, p_mass, q_mass):
    """``(p_i, c, d)``: the capped cumulative ratio ``p_i = min(1, p_{i-1} * (p_t/P) / (q_t/Q))``.

    survival = ``p_{i-1}``; p_t, q_t the rows' float32 entries at the drafted token; P, Q their
    masses.  ``c = p_{i-1} * (p_t * Q)`` and ``d = q_t * P`` (float64), so ``p_i = min(1, c / d)``:
    1 when ``c >= d`` (this covers ``q_t = 0 < p_t``: ratio +inf), 0 when ``c == 0`` (``p_t = 0``
    or ``p_{i-1} = 0``: the walk never leaves 0), else ``c / d``.
    """
    c = survival * (float(p_t) * q_mass)
    d = float(q_t) * p_mass
    if c == 0.0:
        return 0.0, c, d
    return (1.0 if c >= d else c / d), c, d


def accept_block(target_probs, draft_probs, draft_tokens, uniforms):
    """Block verification (Sun et al. 2024) with explicit uniforms ``u`` (``[K+1]`` float64).

    target_probs ``[K+1, V]``, draft_probs ``[K, V]`` or None (one-hot draft: ``q_i`` the point
    mass on ``t_i``, i.e. a one-hot row of mass 1), draft_tokens ``[K]``.  ``u[i-1]`` is the coin of
    position ``i = 1..K``; ``u[K]`` draws the emitted token.

    With ``p_i`` from :func:`block_survival_step` and, for ``1 <= i < K``, the residual weights
    ``w_i = max(0, p - q * mass_ratio(P, Q) / p_i)`` (``~ max(0, p_i * P_i - Q_i) * P / p_i``:
    accept's residual with its mass ratio divided by ``p_i``; ``W_i`` their mass) so that
    ``Z_i = p_i * W_i / P``: coin ``i < K`` passes iff ``p_i >= 1`` or
    ``u * (p_i * W_i + (1 - p_i) * P) < p_i * W_i`` (``u < h_i = Z_i / (Z_i + 1 - p_i)``);
    coin ``K`` passes iff ``u * d_K < c_K`` (``u < p_K``, as accept tests).  ``tau`` is the
    largest passing ``i`` (0 if none).  Emit ``t_0..t_{tau-1}`` and a draw with ``u[K]`` from row
    ``K`` (``tau = K``) or from ``w_tau`` (``p_0 = 1``: accept's residual), or from row ``tau``
    itself if ``W_tau`` is 0 after rounding.  One-hot draft: ``w_i`` is row ``i`` with ``t_i``
    removed (the factor ``p_i`` cancels), exactly as accept's point-mass residual.
    """
    p_rows = np.asarray(target_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    u = np.asarray(uniforms, dtype=np.float64)
    k = tokens.size
    if draft_probs is None:
        q_rows = np.zeros((k, p_rows.shape[1]), dtype=np.float32)
        q_rows[np.arange(k), tokens] = 1.0
    else:
        q_rows = np.asarray(draft_probs, dtype=np.float32)

    survival = [1.0]  # p_0 .. p_K
    p_masses = [row_mass(p_rows[i]) for i in range(k + 1)]
    q_masses = [row_mass(q_rows[i]) for i in range(k)]
    c = d = 0.0
    for i in range(k):
        t = int(tokens[i])
        p_i, c, d = block_survival_step(survival[-1], p_rows[i, t], q_rows[i, t], p_masses[i], q_masses[i])
        survival.append(p_i)

    def residual(i):  # [V] weights w_i and their mass W_i
        if draft_probs is None:  # one-hot: any positive ratio zeroes t_i and keeps the rest
            weights = p_rows[i].astype(np.float64)
            weights[tokens[i]] = 0.0
        else:
            weights = residual_weights(p_rows[i], q_rows[i], mass_ratio(p_masses[i], q_masses[i]) / survival[i])
        return weights, ordered_total(block_sums(weights))

    if k > 0 and u[k - 1] * d < c:
        return k, sample_index(p_rows[k], u[k])
    tau = 0
    for i in range(k - 1, 0, -1):
        if survival[i] == 0.0:
            continue  # h_i = 0
        if survival[i] >= 1.0:
            tau = i
            break
        _, mass = residual(i)
        passed = survival[i] * mass
        if u[i - 1] * (passed + (1.0 - survival[i]) * p_masses[i]) < passed:
            tau = i
            break
    if tau == k:  # k == 0: the bonus row is row 0
        return k, sample_index(p_rows[k], u[k])
    weights, mass = residual(tau)
    if mass > 0.0:
        return tau, sample_index(weights, u[k])
    return tau, sample_index(p_rows[tau], u[k])


LINEAR_LANES = 16  # float32 lanes of a linear layer's dot products


def linear(x, weight, bias=None):
    """``x [n, in] @ weight [out, in]^T (+ bias [out])`` in ``linear``'s documented order.

    The inputs are padded with zeros to a multiple of 16 columns; lane l accumulates, from +0.0
    and in increasing k, the float32 products of the columns k = l (mod 16); the lanes are added
    as a halving tree, then the bias."""
    x = np.asarray(x, dtype=np.float32)
    weight = np.asarray(weight, dtype=np.float32)
    pad = (-x.shape[1]) % LINEAR_LANES
    x = np.pad(x, ((0, 0), (0, pad)))
    weight = np.pad(weight, ((0, 0), (0, pad)))
    lanes = np.zeros((x.shape[0], weight.shape[0], LINEAR_LANES), dtype=np.float32)
    for k in range(0, x.shape[1], LINEAR_LANES):
        chunk = slice(k, k + LINEAR_LANES)
        lanes = lanes + x[:, None, chunk] * weight[None, :, chunk]
    y = _tree(lanes)
    return y if bias is None else y + np.asarray(bias, dtype=np.float32)
