"""Logits in: the exact warping (temperature, top-k, top-p, min-p) and verification from logits."""

import functools
import math
import numbers

import numpy as np

from .._math import min_p_threshold, temperature_scale
from ..kernels import _inputs, _kernels

__all__ = ["warp", "accept_logits", "accept_logits_from_uniforms", "accept_block_logits", "accept_block_logits_from_uniforms"]


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
    in ``specverify.reference.warp``, whose sorting reference gives the same bits.  No sort: a
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
    _inputs.require_uniforms(uniforms, "K + 1")
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
    _inputs.require_uniforms(uniforms, "K + 1")
    return _accept_logits(target_logits, draft_logits, draft_tokens, None, uniforms,
                          temperature, top_k, top_p, min_p, _kernels.accept_block_logits)


def _accept_logits(target_logits, draft_logits, draft_tokens, generator, uniforms,
                   temperature, top_k, top_p, min_p, entry=None):
    scale, top_k, top_p, min_p = _warp_settings(temperature, top_k, top_p, min_p)
    return (entry or _kernels.accept_logits)(target_logits, draft_logits, draft_tokens, generator,
                                             uniforms, scale, top_k, top_p, min_p)
