"""Reference of ``verify_greedy`` and ``accept`` (token-wise speculative sampling)."""

import numpy as np

from .primitives import block_sums, mass_ratio, ordered_total, residual_weights, row_mass, sample_index


def verify_greedy(target_probs, draft_tokens):
    """``(n_accepted, next_token)``: accept while the draft equals the row's argmax."""
    target = np.asarray(target_probs, dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    for i in range(tokens.size + 1):
        best = int(np.argmax(target[i]))
        if i == tokens.size or tokens[i] != best:
            return i, best


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
