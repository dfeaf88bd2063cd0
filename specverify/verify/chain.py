"""Token-wise chain verification: greedy and speculative sampling (one draft per position)."""

from ..kernels import _inputs, _kernels

__all__ = ["verify_greedy", "accept", "accept_from_uniforms"]


def verify_greedy(target_probs, draft_tokens):
    """Greedy (temperature-0) verification.

    Accept ``t_i = draft_tokens[i]`` while ``t_i == argmax(target_probs[i])``; at the first miss
    return ``(i, argmax(target_probs[i]))``; if all K match return ``(K, argmax(target_probs[K]))``.
    Ties break to the lowest index, as ``torch.argmax`` and ``numpy.argmax`` do; -0.0 equals 0.0.
    Rows after the first miss are never read, so the emitted stream equals plain greedy decoding
    of the target.

    Args:
        target_probs: ``[K+1, V]`` float scores: probabilities, logits, anything whose argmax is
            meant (negative values and -inf, e.g. masked logits, are fine).  float32 is read in
            place; float64/float16/bfloat16 are converted to float32 first (a copy).
        draft_tokens: ``[K]`` integer token ids in ``[0, V)``; K = 0 is allowed.

    Returns:
        ``(n_accepted, next_token)`` as Python ints.

    Raises:
        TypeError: non-float scores or non-integer tokens.
        ValueError: wrong rank/shape, empty vocabulary, a visited row holding NaN or +inf, or a
            visited row that is -inf everywhere.
        IndexError: a token outside ``[0, V)``.
    """
    return _kernels.verify_greedy(target_probs, draft_tokens)


def accept(target_probs, draft_probs, draft_tokens, generator=None):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    With ``p_i = target_probs[i] / P_i`` and ``q_i = draft_probs[i] / Q_i`` (rows normalized by
    their masses ``P_i``, ``Q_i``, summed in float64 in the order documented in
    ``specverify.kernels._primitives`` (``_primitives.pxd``)):

    - accept ``t_i`` with probability ``min(1, p_i(t_i) / q_i(t_i))``, tested as
      ``u_i * q_i(t_i) * P_i * Q_i < p_i(t_i) * P_i * Q_i`` (no division);
    - at the first rejection, the recovered token is drawn from ``norm(max(0, p_i - q_i))``;
    - if all K are accepted, the bonus token is drawn from ``p_K``.

    The emitted tokens are then distributed exactly as the target's.  Edges, handled exactly:

    - ``q_i(t_i) = 0`` (the draft proposed a token it gives no mass): the ratio is +inf, so
      ``t_i`` is accepted iff ``p_i(t_i) > 0``.
    - ``p_i(t_i) = 0``: never accepted, whatever ``u_i``.
    - ``p == q`` (identical rows, or rows scaled by a power of two, e.g. ``target = 2 * draft``):
      always accepted (``u_i < 1``).  Other scales agree up to float rounding of the masses.
    - a residual whose mass is 0 after rounding (``p_i <= q_i`` everywhere in float64): the
      recovered token is drawn from ``p_i`` itself.
    - ``draft_probs=None``: a deterministic draft (prompt lookup, n-gram) whose ``q_i`` is a point
      mass on ``t_i``: accept with probability ``p_i(t_i)``; on rejection draw from ``p_i`` with
      ``t_i`` removed and renormalized.  Exactly distribution preserving for any deterministic
      draft.

    Randomness: exactly ``K + 1`` float64 uniforms per call, drawn in one call before anything
    else (``torch.rand(K + 1, dtype=torch.float64, generator=generator)``, or
    ``generator.random(K + 1)`` for a ``numpy.random.Generator``): ``u[i]`` for the test at
    position ``i`` (those after the first rejection go unused) and ``u[K]`` for the recovered or
    bonus draw.  A fixed generator state therefore gives a fixed result, and the generator always
    advances by the same amount.

    Args:
        target_probs: ``[K+1, V]`` non-negative float scores (need not be normalized).
        draft_probs: ``[K, V]`` non-negative float scores from which ``draft_tokens`` were drawn,
            warped exactly as the target was; or None for a deterministic draft.
        draft_tokens: ``[K]`` integer token ids in ``[0, V)``.
        generator: ``torch.Generator`` (CPU), ``numpy.random.Generator``, or None for torch's
            default generator.

    Returns:
        ``(n_accepted, next_token)`` as Python ints.

    Raises:
        TypeError, ValueError, IndexError: as for ``verify_greedy``, plus NaN, Inf, negative
            values or zero mass in any row that is read (message names the argument and row).
    """
    return _kernels.accept(target_probs, draft_probs, draft_tokens, generator)


def accept_from_uniforms(target_probs, draft_probs, draft_tokens, uniforms):
    """``accept`` with its ``K + 1`` uniforms given explicitly (float64, each in ``[0, 1)``).

    ``accept(t, d, k, g)`` equals ``accept_from_uniforms(t, d, k, u)`` when ``u`` holds the
    draws ``accept`` documents; this is the entry the reference-agreement tests use.
    """
    _inputs.require_uniforms(uniforms, "K + 1")
    return _kernels.accept(target_probs, draft_probs, draft_tokens, None, uniforms)
