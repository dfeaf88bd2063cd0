"""The verification ops: validate once in Python, then one call into the compiled kernels.

Terms (as in vLLM's rejection sampler): position ``i`` of a round holds the draft token ``t_i``;
it is *accepted* or not; at the first rejection the *recovered* token is drawn from the residual;
if all K drafts are accepted, a *bonus* token is drawn from the last target row.  The token a
call returns as ``next_token`` is the recovered or bonus token: the *emitted* stream of a round is
``draft_tokens[:n_accepted] + [next_token]``.
"""

import functools
import math
import numbers

import numpy as np

from . import _inputs, _kernels
from .reference_warp import min_p_threshold, temperature_scale

__all__ = ["verify_greedy", "accept", "accept_from_uniforms", "accept_block", "accept_block_from_uniforms",
           "verify_tree_greedy", "accept_tree", "accept_tree_from_uniforms", "verify_batch",
           "BATCH_METHODS", "warp", "accept_logits", "accept_logits_from_uniforms", "accept_block_logits",
           "accept_block_logits_from_uniforms"]

# Per-request verification methods of verify_batch; a method's integer code is its index here.
BATCH_METHODS = _kernels.BATCH_METHODS


def _require_uniforms(uniforms, count):
    """The ``*_from_uniforms`` entries take their uniforms explicitly: None is a caller's mistake."""
    if uniforms is None:
        raise TypeError(f"uniforms must be the {count} float64 uniforms of the call, got None")


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
    _require_uniforms(uniforms, "K + 1")
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
    _require_uniforms(uniforms, "K + 1")
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
    _require_uniforms(uniforms, "N + 1")
    return _kernels.accept_tree(target_probs, draft_probs, draft_tokens, parents, None, uniforms, replacement)


def verify_batch(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, *, method="token",
                 has_draft_probs=None, generator=None, generators=None, uniforms=None,
                 num_threads=None):
    """Verify a batch of R requests in one call: ragged drafts, per-request methods and streams.

    Layout (vLLM model runner V2's; ``specverify.batch`` converts vLLM V1's and FlashInfer's):
    request ``r`` owns the draft tokens ``draft_tokens[cu[r]:cu[r+1]]`` (``K_r = cu[r+1] - cu[r]``,
    0 allowed), the target rows ``target_probs[cu[r] + r : cu[r+1] + r + 1]`` (``K_r + 1`` rows, the
    last its bonus row) and, when it has them, the draft rows ``draft_probs[cu[r]:cu[r+1]]``.
    Request ``r`` gets exactly what the single-request op of its method returns on its own rows:

    - ``"greedy"``: ``verify_greedy`` (target rows are scores; negative values and -inf allowed);
    - ``"token"``: ``accept`` (token-wise speculative sampling), with the request's draft rows, or
      a point-mass draft (``accept(p, None, t)``) when ``has_draft_probs[r]`` is False;
    - ``"block"``: ``accept_block`` (block verification), likewise with or without draft rows.

    Randomness: a sampled request uses ``K_r + 1`` float64 uniforms, exactly the single op's; a
    greedy one uses none.  They come, concatenated in request order (``sum over sampled r of
    K_r + 1`` in all), from exactly one of:

    - ``uniforms``: given explicitly (each in ``[0, 1)``);
    - ``generators``: a list of R generators; request ``r`` draws its ``K_r + 1`` from
      ``generators[r]`` in one call, exactly as ``accept(..., generator=generators[r])`` would
      (greedy requests draw nothing: their entry may be None and is never advanced);
    - ``generator``: one generator (or None: torch's default) drawing the whole batch's uniforms
      in one call, i.e. the same as passing ``uniforms=`` that draw.

    Whatever the batch composition and the thread count, request ``r``'s output is bit for bit the
    single-request op's on the same uniforms (tested): requests are independent, each writes
    only its own output row, and its sums follow the fixed order of ``_primitives.pxd``.

    Args:
        target_probs: ``[sum(K_r) + R, V]`` float rows (float32 read in place, others converted).
        draft_probs: ``[sum(K_r), V]`` float rows aligned with ``draft_tokens``, or None (every
            sampled request has a point-mass draft).  Rows of requests that do not read them
            (greedy, or ``has_draft_probs[r]`` False) are never read or validated.
        draft_tokens: ``[sum(K_r)]`` integer token ids, every one in ``[0, V)`` (-1 padding is
            rejected: a shorter draft is a smaller ``K_r``).
        cu_num_draft_tokens: ``[R + 1]`` integer offsets: a leading 0, non-decreasing, ending at
            ``len(draft_tokens)``.
        method: ``"greedy"``, ``"token"`` or ``"block"`` for every request, or per request
            ``[R]``: a sequence of those names or an integer array of codes
            (``BATCH_METHODS.index(name)``).
        has_draft_probs: ``[R]`` booleans, or None (all True if ``draft_probs`` is given, else all
            False).
        generator, generators, uniforms: the randomness, as above (at most one of them).
        num_threads: threads to spread the requests over (at most R, at most 64): the calling
            thread and helper threads (started once, kept) claim requests one at a time, largest
            first (rows read), so that the threads end together; the call waits only for
            requests a helper has claimed, never for a helper that is late to run (a fork-join
            barrier costs scheduler slices on a loaded machine).  Idle helpers poll for 50 us
            before they sleep, so calls in quick succession find them awake.  1 runs on the
            calling thread alone; so does a call made while another call holds the helpers.
            None: ``OMP_NUM_THREADS`` if set, else the CPUs this process may use (read once), but
            only one thread per 2^19 target elements the batch may read (``(sum(K_r) + R) * V``):
            a sleeping helper takes 20-50 us to start, longer than a smaller batch lasts.

    Returns:
        ``(output_token_ids, num_accepted)``: ``[R, K_max + 1]`` int64 NumPy array (``K_max =
        max K_r``) holding request ``r``'s emitted tokens ``draft_tokens[cu[r]:][:n] + [next]`` in
        its row, padded with -1; and ``[R]`` int64 accepted counts ``n``.

    Raises:
        TypeError, ValueError, IndexError: as the single ops, and for offsets that do not start at
        0, decrease, or disagree with ``draft_tokens`` or the row counts; a token outside
        ``[0, V)`` (the message names the request and position); a generator count other than R;
        a bad value or zero mass in a row a request reads (the message names the request and the
        row, globally and within the request).  Nothing is returned when any request fails.
    """
    return _kernels.verify_batch(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens,
                                 method, has_draft_probs, generator, generators, uniforms,
                                 num_threads)


@functools.lru_cache(maxsize=64, typed=True)  # typed: True and 1 are different settings
def _warp_settings(temperature, top_k, top_p, min_p):
    """Validated settings as the kernel takes them: ``(scale, top_k, top_p, min_p threshold)``
    (cached: a decoder calls with the same few settings every round; NaN never hits the cache,
    since NaN != NaN)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0 (greedy decoding: verify_greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be an integer (0 = off), got {type(top_k).__name__}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be a number in (0, 1] (1 = off), got {top_p!r}")
    if isinstance(min_p, bool) or not isinstance(min_p, numbers.Real) or not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be a number in [0, 1] (0 = off), got {min_p!r}")
    threshold = min_p_threshold(min_p) if min_p > 0 else np.float32(0.0)
    return temperature_scale(temperature), min(int(top_k), 2**62), float(top_p), threshold


def warp(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, out=None):
    """Sampling probabilities from logits: temperature, then top-k, top-p and min-p, in O(V).

    For each row ``x`` (``-inf`` entries are masks), with ``w = exp((x - max x) / temperature)``
    (so ``w = 1`` at the maximum) and the *rank order* ``w`` descending, ties by lower token id:

    - ``top_k > 0`` keeps the first ``top_k`` tokens of the rank order (exactly ``top_k``: a tie
      at the cut is resolved by token id, where ``transformers`` keeps every tied token);
    - ``top_p < 1`` then keeps the shortest rank-order prefix holding at least ``top_p`` of the
      remaining mass: a token stays iff the tokens before it hold less than ``top_p`` (as
      ``transformers.TopPLogitsWarper``);
    - ``min_p > 0`` then keeps the tokens with ``w >= min_p`` (probability at least ``min_p``
      times the largest, as ``transformers.MinPLogitsWarper``);
    - the kept ``w`` are normalized: rows sum to 1 (float64) up to float32 rounding.

    The most likely token (the first maximum) always stays.  ``top_k = 0``, ``top_p = 1`` and
    ``min_p = 0`` switch the cuts off.  The float32 arithmetic (an own vectorized exp, within 1
    ulp of exp; top-p masses in exact 2**-40 fixed point; the fixed summation order) is stated
    in ``specverify.reference_warp``, whose sorting reference gives the same bits.  No sort: a
    max pass, an exp pass, a radix select per cut over the weights' bits, a sum and a scaling.

    Args:
        logits: ``[n, V]`` (or ``[V]``) float scores, finite or ``-inf``; float32 is read in
            place, other float dtypes are converted.  An ndarray or a CPU tensor.
        temperature: finite, > 0.
        top_k: integer >= 0.  top_p: in (0, 1].  min_p: in [0, 1].
        out: optional float32 ``[n, V]`` (or ``[V]``) C-contiguous array or tensor to write;
            may be ``logits`` itself (in place).

    Returns:
        float32 probabilities of the logits' shape: ``out``, else a new array (a tensor if
        ``logits`` is one).

    Raises:
        TypeError, ValueError: bad settings (the message names the argument), non-float logits,
            a row holding NaN or +inf, a row that is -inf everywhere, a bad ``out``.
    """
    scale, top_k, top_p, min_p = _warp_settings(temperature, top_k, top_p, min_p)
    return _kernels.warp(logits, out, scale, top_k, top_p, min_p)


def accept_logits(target_logits, draft_logits, draft_tokens, generator=None, *, temperature=1.0,
                  top_k=0, top_p=1.0, min_p=0.0):
    """``accept`` straight from logits: both sides warped by :func:`warp` with the same settings
    inside the kernel module (no probability rows in Python), then verified.

    Equal, given the same uniforms, to ``accept(warp(target_logits, ...), warp(draft_logits,
    ...), draft_tokens)``; randomness as for ``accept`` (``K + 1`` float64 uniforms, one call).

    Args:
        target_logits: ``[K+1, V]`` target logits.  draft_logits: ``[K, V]`` logits the draft
            sampled ``draft_tokens`` from *after warping them with the same settings*, or None
            for a deterministic draft.  draft_tokens: ``[K]`` token ids.  generator: as for
            ``accept``.  temperature, top_k, top_p, min_p: as for :func:`warp`.

    Returns:
        ``(n_accepted, next_token)`` as Python ints.
    """
    return _accept_logits(target_logits, draft_logits, draft_tokens, generator, None,
                          temperature, top_k, top_p, min_p)


def accept_logits_from_uniforms(target_logits, draft_logits, draft_tokens, uniforms, *,
                                temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """:func:`accept_logits` with its ``K + 1`` uniforms given explicitly (float64 in [0, 1))."""
    _require_uniforms(uniforms, "K + 1")
    return _accept_logits(target_logits, draft_logits, draft_tokens, None, uniforms,
                          temperature, top_k, top_p, min_p)


def accept_block_logits(target_logits, draft_logits, draft_tokens, generator=None, *, temperature=1.0,
                        top_k=0, top_p=1.0, min_p=0.0):
    """:func:`accept_block` straight from logits, as :func:`accept_logits` is to :func:`accept`:
    equal, given the same uniforms, to ``accept_block(warp(target_logits, ...),
    warp(draft_logits, ...), draft_tokens)``."""
    return _accept_logits(target_logits, draft_logits, draft_tokens, generator, None,
                          temperature, top_k, top_p, min_p, _kernels.accept_block_logits)


def accept_block_logits_from_uniforms(target_logits, draft_logits, draft_tokens, uniforms, *,
                                      temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """:func:`accept_block_logits` with its ``K + 1`` uniforms given explicitly."""
    _require_uniforms(uniforms, "K + 1")
    return _accept_logits(target_logits, draft_logits, draft_tokens, None, uniforms,
                          temperature, top_k, top_p, min_p, _kernels.accept_block_logits)


def _accept_logits(target_logits, draft_logits, draft_tokens, generator, uniforms,
                   temperature, top_k, top_p, min_p, entry=None):
    scale, top_k, top_p, min_p = _warp_settings(temperature, top_k, top_p, min_p)
    return (entry or _kernels.accept_logits)(target_logits, draft_logits, draft_tokens, generator,
                                             uniforms, scale, top_k, top_p, min_p)


def linear(x, weight, bias=None, out=None, *, num_threads=1):
    """``y = x @ weight.T + bias`` for the few rows a target pass scores, reading the weights once.

    ``y[..., o] = sum_k x[..., k] * weight[o, k] (+ bias[o])`` in float32, in a fixed order that
    does not depend on the number of rows, on which rows share the call, or on the CPU: 16 lanes,
    lane ``l`` summing the products of the columns ``k = l (mod 16)`` in increasing ``k`` (the
    columns padded with zeros to a multiple of 16), the lanes added as a halving tree, the bias
    last; every product and sum rounded to float32 on its own (``specverify.reference.linear``
    restates it).  A token's output is therefore the same bits whether it is scored alone or
    with a whole draft tree.  NaN and infinities propagate as in any matrix product.

    torch's CPU matmul reads the weights once per row for such shapes (with torch 2.13 on one
    thread, a 49152 x 576 output layer takes 9.5 ms for 1 row and 16-24 ms for 2-16 rows); this
    kernel reads them once per call.  ``specverify.integrations.transformers.use_fast_linears``
    puts it under a model's ``nn.Linear`` layers.

    Args:
        x: ``[..., in]`` float array or CPU tensor (float32 is read in place).
        weight: ``[out, in]`` float array or CPU tensor (an ``nn.Parameter`` is read without
            its autograd).
        bias: optional ``[out]``.
        out: optional float32 C-contiguous ``[..., out]`` to write (must not overlap the inputs).
        num_threads: threads to spread the weight rows over (the calling thread and helpers of
            the pool ``verify_batch`` uses); fewer for small weights (one per 256 KiB).  The
            result's bits do not depend on it.

    Returns:
        float32 ``[..., out]``: ``out``, else a new array (a tensor if x is one).
    """
    threads = _inputs.thread_count(num_threads)
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) <= 2:
        return _kernels.linear(x, weight, bias, out, threads)
    rows = x.reshape(-1, shape[-1])  # [..., in] -> [n, in]
    if out is None:
        y = _kernels.linear(rows, weight, bias, None, threads)
        return y.reshape(*shape[:-1], y.shape[-1])
    contiguous = out.is_contiguous() if _inputs.is_tensor(out) else isinstance(out, np.ndarray) and out.flags.c_contiguous
    if not contiguous or tuple(out.shape[:-1]) != tuple(shape[:-1]):
        raise ValueError(f"out must be a C-contiguous [..., out] array of x's leading shape {list(shape[:-1])}")
    _kernels.linear(rows, weight, bias, out.reshape(-1, out.shape[-1]), threads)  # a view of out's memory
    return out
