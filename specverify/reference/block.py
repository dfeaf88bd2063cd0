"""Reference of ``accept_block`` (block verification)."""

import numpy as np

from .primitives import block_sums, mass_ratio, ordered_total, residual_weights, row_mass, sample_index


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
