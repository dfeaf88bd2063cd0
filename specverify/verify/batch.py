"""Batched, ragged verification: ``verify_batch``, its layouts and converters.

specverify's layout (vLLM model runner V2's), for R requests with K_r drafts each:

- ``cu_num_draft_tokens [R + 1]``: a leading 0, then inclusive cumulative draft counts;
- ``draft_tokens [sum K_r]``: request r's drafts at ``[cu[r], cu[r+1])``;
- ``target_probs [sum K_r + R, V]``: request r's K_r + 1 rows at ``[cu[r] + r, cu[r+1] + r + 1)``,
  the last its bonus row;
- ``draft_probs [sum K_r, V]`` or None: aligned with the draft tokens;
- output ``[R, K_max + 1]`` int64, request r's emitted tokens padded with -1, and
  ``num_accepted [R]``.

Converters (sections E.1-E.3 of the shared notes):

- ``from_vllm_v1``: vLLM V1's ``SpecDecodeMetadata`` layout (an inclusive cumsum without the
  leading 0, and separate ``target_logits_indices`` / ``bonus_logits_indices`` into the rows);
- ``from_flashinfer``: FlashInfer's dense ``[B, n(+1), V]`` layout with drafts padded by -1
  (a request's K_r is the length of its drafts before the first -1);
- ``to_vllm_v1_output`` / ``to_flashinfer_output``: the output in those engines' conventions.

Converters copy rows only when the rows are not already in specverify's order. The slow reference
is :func:`specverify.reference.batch.verify_batch`.
"""

import numpy as np

from ..kernels import _inputs, _kernels

# Per-request verification methods of verify_batch; a method's integer code is its index here.
BATCH_METHODS = _kernels.BATCH_METHODS

__all__ = [
    "verify_batch",
    "BATCH_METHODS",
    "uniform_counts",
    "from_vllm_v1",
    "from_flashinfer",
    "to_vllm_v1_output",
    "to_flashinfer_output",
]


def verify_batch(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, *, method="token",
                 has_draft_probs=None, generator=None, generators=None, uniforms=None,
                 num_threads=None):
    """Verify a batch of R requests in one call: ragged drafts, per-request methods and streams.

    Layout (vLLM model runner V2's; ``specverify.verify.batch`` converts vLLM V1's and FlashInfer's):
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


def _numpy_int64(x, name):
    x = _inputs.tokens_int64(x, name)
    return x.numpy() if _inputs.is_tensor(x) else x


def _method_codes(method, n_requests):
    codes = {name: code for code, name in enumerate(BATCH_METHODS)}
    if isinstance(method, str):
        if method not in codes:
            raise ValueError(f"method must be one of {BATCH_METHODS}, got {method!r}")
        return np.full(n_requests, codes[method], dtype=np.uint8)
    return _inputs.batch_methods(method, n_requests, codes)


def uniform_counts(cu_num_draft_tokens, method="token"):
    """``[R]`` int64: how many uniforms each request of a ``verify_batch`` call uses.

    ``K_r + 1`` for a sampled request (``"token"`` or ``"block"``), 0 for a greedy one.  Request r's uniforms
    are ``uniforms[start[r]:start[r] + counts[r]]`` with ``start = cumsum(counts) - counts``.
    """
    cu = _numpy_int64(cu_num_draft_tokens, "cu_num_draft_tokens")
    k = np.diff(cu)
    codes = _method_codes(method, k.size)
    return np.where(codes == BATCH_METHODS.index("greedy"), 0, k + 1).astype(np.int64)


def _take_rows(x, index):
    """``x[index]`` for a 2-D ndarray or tensor, without a copy when index is 0..len-1."""
    if index.size == x.shape[0] and np.array_equal(index, np.arange(index.size)):
        return x
    if _inputs.is_tensor(x):
        torch = _inputs.loaded_torch()
        return x.index_select(0, torch.from_numpy(index))
    return np.asarray(x)[index]


def from_vllm_v1(probs, draft_token_ids, cu_num_draft_tokens, target_logits_indices,
                 bonus_logits_indices, draft_probs=None):
    """vLLM V1's layout -> ``(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens)``.

    Args:
        probs: ``[N, V]`` rows (vLLM's processed target probabilities, in its ``logits`` order).
        draft_token_ids: ``[sum K_r]``.
        cu_num_draft_tokens: ``[R]`` inclusive cumulative sum, no leading 0 (vLLM V1's).
        target_logits_indices: ``[sum K_r]`` row of ``probs`` verifying each draft token.
        bonus_logits_indices: ``[R]`` row of ``probs`` holding each request's bonus distribution.
        draft_probs: ``[sum K_r, V]`` or None; already aligned with the draft tokens.

    Returns the arguments of ``verify_batch`` in specverify's layout; ``target_probs`` is
    ``probs`` itself when its rows are already in that order (vLLM's usual case), else a copy.
    """
    cu_inclusive = _numpy_int64(cu_num_draft_tokens, "cu_num_draft_tokens")
    target_index = _numpy_int64(target_logits_indices, "target_logits_indices")
    bonus_index = _numpy_int64(bonus_logits_indices, "bonus_logits_indices")
    tokens = _inputs.tokens_int64(draft_token_ids, "draft_token_ids")
    n_requests, n_tokens = cu_inclusive.size, tokens.shape[0]
    cu = np.concatenate([[0], cu_inclusive]).astype(np.int64)
    if np.any(np.diff(cu) < 0) or cu[-1] != n_tokens:
        raise ValueError(f"cu_num_draft_tokens must be a non-decreasing inclusive cumsum ending at "
                         f"len(draft_token_ids) = {n_tokens}, got {cu_inclusive.tolist()}")
    if target_index.size != n_tokens:
        raise ValueError(f"target_logits_indices must have one entry per draft token ({n_tokens}), "
                         f"got {target_index.size}")
    if bonus_index.size != n_requests:
        raise ValueError(f"bonus_logits_indices must have one entry per request ({n_requests}), "
                         f"got {bonus_index.size}")
    n_rows = probs.shape[0]
    for name, index in (("target_logits_indices", target_index), ("bonus_logits_indices", bonus_index)):
        bad = np.flatnonzero((index < 0) | (index >= n_rows))
        if bad.size:
            raise IndexError(f"{name}[{bad[0]}] = {index[bad[0]]} is not a row of probs ([0, {n_rows}))")
    # Draft token i of request r verifies on row i + r; request r's bonus row is cu[r+1] + r.
    request_of_token = np.repeat(np.arange(n_requests), np.diff(cu))
    rows = np.empty(n_tokens + n_requests, dtype=np.int64)
    rows[np.arange(n_tokens) + request_of_token] = target_index
    rows[cu[1:] + np.arange(n_requests)] = bonus_index
    return _take_rows(probs, rows), draft_probs, tokens, cu


def from_flashinfer(draft_probs, draft_token_ids, target_probs, padding=-1):
    """FlashInfer's dense layout -> ``(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens)``.

    Args:
        draft_probs: ``[B, n, V]`` or None (point-mass drafts).
        draft_token_ids: ``[B, n]``; request b's drafts are those before its first ``padding``
            (-1); every later entry must be padding too.
        target_probs: ``[B, n + 1, V]``; request b keeps rows ``0..K_b`` (row ``K_b`` is the
            distribution after its last real draft: its bonus row).

    The -1 padding never reaches a kernel (FlashInfer #879 read it as a token id): it only sets
    K_b.  Rows are copied unless no request is padded (then they are reshaped views).
    """
    ids = np.asarray(draft_token_ids.numpy() if _inputs.is_tensor(draft_token_ids) else draft_token_ids)
    if ids.ndim != 2:
        raise ValueError(f"draft_token_ids must be [B, n], got shape {list(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"draft_token_ids must hold integer token ids, got dtype {ids.dtype}")
    n_requests, n = ids.shape
    if tuple(target_probs.shape[:2]) != (n_requests, n + 1) or len(target_probs.shape) != 3:
        raise ValueError(f"target_probs must be [B, n + 1, V] = [{n_requests}, {n + 1}, V], "
                         f"got shape {list(target_probs.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (n_requests, n, target_probs.shape[2]):
        raise ValueError(f"draft_probs must be [B, n, V] = [{n_requests}, {n}, {target_probs.shape[2]}], "
                         f"got shape {list(draft_probs.shape)}")
    is_pad = ids == padding
    k = np.where(is_pad.any(axis=1), is_pad.argmax(axis=1), n).astype(np.int64)
    after = np.arange(n)[None, :] >= k[:, None]
    late = np.argwhere(after & ~is_pad)
    if late.size:
        b, j = (int(x) for x in late[0])
        raise ValueError(f"draft_token_ids[{b}, {j}] = {int(ids[b, j])} follows padding ({padding}) "
                         f"at position {int(k[b])}: padding must only trail")
    cu = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    keep_draft = ~after                                               # [B, n]: j < K_b
    keep_target = np.arange(n + 1)[None, :] <= k[:, None]             # [B, n + 1]: j <= K_b
    tokens = np.ascontiguousarray(ids[keep_draft], dtype=np.int64)
    v = target_probs.shape[2]
    target = _take_rows(target_probs.reshape(n_requests * (n + 1), v), np.flatnonzero(keep_target))
    draft = None
    if draft_probs is not None:
        draft = _take_rows(draft_probs.reshape(n_requests * n, v), np.flatnonzero(keep_draft))
    return target, draft, tokens, cu


def _output_arrays(output_token_ids, num_accepted):
    out = np.asarray(output_token_ids)
    accepted = np.asarray(num_accepted)
    if out.ndim != 2 or accepted.shape != (out.shape[0],):
        raise ValueError(f"output_token_ids [R, K_max + 1] and num_accepted [R] expected, got "
                         f"{list(out.shape)} and {list(accepted.shape)}")
    return out, accepted


def _widen(out, width, name):
    if out.shape[1] > width and np.any(out[:, width:] != -1):
        raise ValueError(f"an output holds more tokens than {name} allows ({width})")
    wide = np.full((out.shape[0], width), -1, dtype=np.int32)
    keep = min(width, out.shape[1])
    wide[:, :keep] = out[:, :keep]
    return wide


def to_vllm_v1_output(output_token_ids, num_accepted, max_spec_len):
    """vLLM V1's rejection-sampler output: ``[R, max_spec_len + 1]`` int32, -1 placeholders.

    vLLM's ``parse_output`` drops the -1s; its model runner V2 reports ``num_sampled =
    num_accepted + 1`` beside the same rows.
    """
    out, _ = _output_arrays(output_token_ids, num_accepted)
    return _widen(out, int(max_spec_len) + 1, "max_spec_len + 1")


def to_flashinfer_output(output_token_ids, num_accepted, n):
    """FlashInfer's ``chain_speculative_sampling`` output convention for drafts padded to ``n``.

    Returns ``(output_token_ids [B, n + 1] int32, output_emitted_draft_token_num [B] int32)``:
    the emitted tokens then -1, and the accepted count (tau, bonus excluded).  FlashInfer's
    ``output_accepted_token_num`` (positions passing the ratio test independently, accumulated in
    place) is a different statistic and is not produced.
    """
    out, accepted = _output_arrays(output_token_ids, num_accepted)
    return _widen(out, int(n) + 1, "n + 1"), accepted.astype(np.int32)
