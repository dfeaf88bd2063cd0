"""The verification ops: validate once in Python, then one call into the compiled kernels.

Terms (as in vLLM's rejection sampler): position ``i`` of a round holds the draft token ``t_i``;
it is *accepted* or not; at the first rejection the *recovered* token is drawn from the residual;
if all K drafts are accepted, a *bonus* token is drawn from the last target row.  The token a
call returns as ``next_token`` is the recovered or bonus token: the *emitted* stream of a round is
``draft_tokens[:n_accepted] + [next_token]``.
"""

from . import _kernels

__all__ = ["verify_greedy", "accept", "accept_from_uniforms", "accept_block", "accept_block_from_uniforms",
           "verify_tree_greedy", "accept_tree", "accept_tree_from_uniforms"]


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
    ``specverify._primitives`` (``_primitives.pxd``)):

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
    if uniforms is None:
        raise TypeError("uniforms must be the K + 1 float64 uniforms of the call, got None")
    return _kernels.accept(target_probs, draft_probs, draft_tokens, None, uniforms)



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
    K = 1 is bit for bit accept's test; the residual weights are ``max(0, p - q P / (p_tau Q))``,
    accept's with its mass ratio divided by ``p_tau``.  Edges, all exact:

    - ``q_i(t_i) = 0 < p_i(t_i)`` (a token the draft gives no mass): ratio +inf, ``p_{i+1} = 1``
      (as accept accepts it); such paths have draft probability 0, so the law is unaffected.
    - ``p_i(t_i) = 0``: ``p_{i+1} = 0`` and every later ``p_j = 0``: no coin after ``i`` can pass.
    - ``p_i = 0``: ``h_i = 0``; its residual is never needed.
    - a residual whose mass is 0 after rounding: only reachable through rounding (in exact
      arithmetic ``W_i = 0`` with ``p_i < 1`` gives ``h_i = 0``, and with ``p_i = 1`` every later
      coin passes); the token is then drawn from ``P_tau`` itself, as accept does.
    - ``p_i`` so small (< ~1e-290) that ``p_i Q`` underflows: the residual is then empty and the
      coin fails; the error is bounded by ``p_i`` itself.
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
    if uniforms is None:
        raise TypeError("uniforms must be the K + 1 float64 uniforms of the call, got None")
    return _kernels.accept_block(target_probs, draft_probs, draft_tokens, None, uniforms)


# ---------------------------------------------------------------------------------------------
# Trees of drafts (several candidates per position, one target pass for the whole tree).
# ---------------------------------------------------------------------------------------------

def verify_tree_greedy(target_probs, draft_tokens, parents):
    """Greedy (temperature-0) verification of a draft tree.

    The tree: ``parents[i]`` is -1 (a child of the root, the last committed token) or an earlier
    node; *position* r is the root for r = 0 and node r - 1 otherwise; ``target_probs[r]`` scores
    the token after position r.  From the root, accept the child whose token equals the row's
    argmax (ties to the lowest token id; the first such child if siblings repeat a token), stop
    at a position with no matching child.  The emitted stream ``draft_tokens[path] + [next_token]``
    equals plain greedy decoding of the target.  Rows of positions never reached are not read.

    Args:
        target_probs: ``[N+1, V]`` float scores (as for ``verify_greedy``).
        draft_tokens: ``[N]`` integer token ids in ``[0, V)``.
        parents: ``[N]`` integers, ``parents[i]`` in ``[-1, i)`` (topological order).

    Returns:
        ``(path, next_token)``: ``path`` a 1-D int64 array of the accepted nodes, root first;
        ``next_token`` the argmax at the last accepted position (a Python int).

    Raises:
        TypeError, ValueError, IndexError: as ``verify_greedy``, plus parents of the wrong length,
        out of range or not topological (which also rules out cycles).
    """
    return _kernels.verify_tree_greedy(target_probs, draft_tokens, parents)


def accept_tree(target_probs, draft_probs, draft_tokens, parents, generator=None, *, replacement=False):
    """Multi-draft speculative sampling over a draft tree; the emitted tokens are distributed
    exactly as the target's.

    The tree as in ``verify_tree_greedy``; siblings in index order (for sampled children: their
    draw order).  ``draft_probs[r]`` is the law the children of position r were drawn from (rows
    of leaves are not read).  At each reached position with target p (mass P) and children
    c_1..c_k, one rule decides; R_0 = p:

    - ``draft_probs=None``, *deterministic children* (top-k, prompt lookup candidates, any draft
      process; sibling tokens distinct): accept c_j with probability
      ``p(c_j) / (1 - sum_{i<j} p(c_i))``; on total rejection draw from p without the children.
      A node is accepted with the product of the target probabilities along its path.
    - ``replacement=False``, *recursive rejection sampling without replacement* (children drawn
      one after another from q without replacement; Jeon et al. 2024, EAGLE-1; siblings
      distinct): accept c_j with probability ``min(1, R(c_j) / q^(j)(c_j))``, q^(j) = q without
      c_1..c_{j-1}, renormalized; on rejection ``R <- norm(max(R - q^(j), 0))``.
    - ``replacement=True``, *SpecInfer's multi-step speculative sampling* (children i.i.d. from
      q; repeated tokens allowed and never merged): the same with q^(j) = q.  A position
      accepts with ``1 - prod_j (1 - a_j)``, ``a_j = sum_v min(R_{j-1}, q)``.

    An accepted child's position is verified next; a leaf's row gives the bonus token; on total
    rejection the recovered token is drawn from the residual (p itself if rounding left it no
    mass).  On a chain ``parents = [-1, 0, ..., N-2]`` every rule is ``accept`` bit for bit with
    the same uniforms (draft_probs[:N] are accept's draft rows).  Float64 form of the residuals:
    ``specverify.reference_tree``; laws: ``specverify.law`` (``tree_node_probabilities``,
    ``tree_length_pmf``, ``rrs_acceptance``, ``optimal_multidraft_acceptance``).

    Randomness: exactly N + 1 float64 uniforms per call, drawn in one call (as ``accept``):
    ``u[i]`` is the coin of node i (read only if node i is tested), ``u[N]`` draws the recovered
    or bonus token by inverse CDF over token ids in increasing order.

    Args:
        target_probs: ``[N+1, V]`` non-negative float scores.
        draft_probs: ``[N+1, V]`` non-negative float scores, or None (deterministic children).
        draft_tokens: ``[N]`` integer token ids; parents: ``[N]`` as in ``verify_tree_greedy``.
        generator: ``torch.Generator`` (CPU), ``numpy.random.Generator``, or None.
        replacement: whether the children were drawn with replacement (ignored without draft_probs).

    Returns:
        ``(path, next_token)`` as ``verify_tree_greedy``.

    Raises:
        TypeError, ValueError, IndexError: as ``accept`` and ``verify_tree_greedy``, plus repeated
        sibling tokens under the deterministic or without-replacement rule (the message names the
        node), and a without-replacement draft row with no mass left for a later sibling.
    """
    return _kernels.accept_tree(target_probs, draft_probs, draft_tokens, parents, generator, None, replacement)


def accept_tree_from_uniforms(target_probs, draft_probs, draft_tokens, parents, uniforms, *, replacement=False):
    """``accept_tree`` with its ``N + 1`` uniforms given explicitly (float64, each in ``[0, 1)``)."""
    if uniforms is None:
        raise TypeError("uniforms must be the N + 1 float64 uniforms of the call, got None")
    return _kernels.accept_tree(target_probs, draft_probs, draft_tokens, parents, None, uniforms, replacement)
