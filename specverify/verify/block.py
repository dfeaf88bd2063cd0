"""Block verification (Sun et al., ICLR 2025): the whole draft block judged at once."""

from ..kernels import _inputs, _kernels

__all__ = ["accept_block", "accept_block_from_uniforms"]


def accept_block(target_probs, draft_probs, draft_tokens, generator=None):
    """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block
    Verification Accelerates Speculative Decoding", ICLR 2025, arXiv:2403.10444).

    Same arguments, validation, randomness and return value as :func:`accept`; the draft block is
    judged as a whole instead of token by token.  The emitted tokens are distributed exactly as
    the target's, and the expected number accepted is never smaller than :func:`accept`'s
    (equal for K = 1 and for one-hot drafts; larger for stochastic drafts with K >= 2).

    With ``P_i``, ``Q_i`` the rows normalized by their float64 masses and ``t_i = draft_tokens[i]``:

    - ``p_0 = 1``, ``p_i = min(1, p_{i-1} P_{i-1}(t_{i-1}) / Q_{i-1}(t_{i-1}))``, i = 1..K;
    - for ``1 <= i < K``: ``Z_i = sum_v max(p_i P_i(v) - Q_i(v), 0)``,
      ``h_i = Z_i / (Z_i + 1 - p_i)`` (``h_i = 1`` when ``p_i = 1``); ``h_K = p_K``;
    - coin ``i`` passes iff ``u[i-1] < h_i``; the accepted length ``tau`` is the LARGEST passing
      ``i`` (0 if none), not the first failure;
    - emitted: ``t_0 .. t_{tau-1}``, then a draw with ``u[K]`` from ``P_K`` (bonus, ``tau = K``)
      or from ``norm(max(p_tau P_tau - Q_tau, 0))`` (for ``tau = 0`` accept's residual).

    Computed without normalizing: ``p_i = min(1, c / d)`` with ``c = p_{i-1} p(t) Q``,
    ``d = q(t) P`` on the raw rows (masses ``P``, ``Q``); coin K is ``u * d < c``, which for
    K = 1 is bit for bit accept's test; the residual weights are ``max(0, p - q (P / Q) / p_tau)``,
    accept's with its mass ratio (1 when within 2^-20 of 1) divided by ``p_tau``.  Edges, all exact:

    - ``q_i(t_i) = 0 < p_i(t_i)`` (a token the draft gives no mass): ratio +inf, ``p_{i+1} = 1``
      (as accept accepts it); such paths have draft probability 0, so the law is unaffected.
    - ``p_i(t_i) = 0``: ``p_{i+1} = 0`` and every later ``p_j = 0``: no coin after ``i`` can pass.
    - ``p_i = 0``: ``h_i = 0``; its residual is never needed.
    - a residual whose mass is 0 after rounding: only reachable through rounding (in exact
      arithmetic ``W_i = 0`` with ``p_i < 1`` gives ``h_i = 0``, and with ``p_i = 1`` every later
      coin passes); the token is then drawn from ``P_tau`` itself, as accept does.
    - ``p_i`` so small (< ~1e-290) that ``(P / Q) / p_i`` passes 2^300: the ratio is clamped
      there, so the residual keeps only tokens with ``q = 0``, and the coin nearly always fails;
      the error is bounded by ``p_i`` itself.
    - ``draft_probs=None`` (a deterministic draft): ``Q_i`` is the point mass on ``t_i``, so
      ``p_i = prod_{j<i} P_j(t_j)`` and the residual is ``P_tau`` without ``t_tau`` (the factor
      ``p_tau`` cancels): the law of ``tau`` equals accept's (block verification helps only
      stochastic drafts).

    Every target row 0..K and draft row 0..K-1 is read once in a fused mass + validation pass
    and validated whatever the uniforms, so bad input always raises.  ``tau`` is then found from
    the top: coin K needs nothing more, coin ``i < K`` one residual pass over row pair ``i``
    (the one that decides ``tau`` also serves the final draw), so rows ``tau..K-1`` are read
    once more (none when coin K passes).

    Randomness: exactly ``K + 1`` float64 uniforms drawn in one call, as :func:`accept`:
    ``u[i - 1]`` is the coin of position ``i = 1..K`` and ``u[K]`` the final draw (inverse CDF
    over token ids in increasing order).

    Returns:
        ``(n_accepted, next_token)`` as Python ints.

    Raises:
        TypeError, ValueError, IndexError: as :func:`accept`, for every row.
    """
    return _kernels.accept_block(target_probs, draft_probs, draft_tokens, generator)


def accept_block_from_uniforms(target_probs, draft_probs, draft_tokens, uniforms):
    """``accept_block`` with its ``K + 1`` uniforms given explicitly (float64, each in ``[0, 1)``)."""
    _inputs.require_uniforms(uniforms, "K + 1")
    return _kernels.accept_block(target_probs, draft_probs, draft_tokens, None, uniforms)
