"""Sampling glue: logits to the rows target and draft share (:class:`Sampling`, through
:func:`specverify.warp`), the same warping as a ``transformers`` ``LogitsProcessor``, and the
sort-based torch :func:`warp` kept as the reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ... import verify as ops
from ...kernels import _inputs


def warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution from logits: ``softmax(mask(logits / temperature))``, in torch with
    a sort (the reference for :func:`specverify.warp`, which :class:`Sampling` uses).

    ``logits`` is ``[n, V]`` (or ``[V]``); returns float32 probabilities of the same shape.
    Masking, in ``transformers``' order: ``top_k > 0`` keeps the ``top_k`` largest logits (ties
    with the k-th are kept); ``top_p < 1`` then keeps the smallest set of most likely tokens whose
    probability reaches ``top_p`` (always at least the most likely one), as in
    ``transformers.TopPLogitsWarper``. ``top_k = 0`` and ``top_p = 1`` switch the masks off.
    """
    _check_warp(temperature, top_k, top_p)
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1.0 - top_p
        drop_sorted[..., -1] = False  # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def _check_warp(temperature, top_k, top_p):
    if not temperature > 0 or temperature != temperature or temperature == float("inf"):
        raise ValueError(f"temperature must be finite and > 0 (use greedy=True for 0), got {temperature!r}")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")


@dataclass(frozen=True)
class Sampling:
    """How rows are made from logits and tokens picked from rows; shared by target and draft.

    ``greedy=True``: rows are the raw float32 logits and the pick is their argmax (ties to the
    lowest index, as ``torch.argmax`` and :func:`specverify.verify_greedy`). Otherwise rows are
    ``specverify.warp(logits, temperature, top_k, top_p, min_p)`` and the pick is a draw from them.
    """

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        _inputs.flag(self.greedy, "greedy")  # a string such as "False" would be truthy
        ops.logits._warp_settings(self.temperature, self.top_k, self.top_p, self.min_p)  # raises if bad

    def rows(self, logits: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` logits -> ``[n, V]`` float32 rows (logits if greedy, else probabilities)."""
        if self.greedy:
            return logits.float()
        return ops.warp(logits, self.temperature, self.top_k, self.top_p, self.min_p)

    def pick(self, row: torch.Tensor, generator: Optional[torch.Generator] = None) -> int:
        """One token from a ``[V]`` row made by :meth:`rows`."""
        if self.greedy:
            return int(torch.argmax(row))
        return int(torch.multinomial(row, 1, generator=generator))


def transformers_warpers(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0):
    """transformers' own warpers for these settings in ``generate``'s order, as one
    ``LogitsProcessorList`` (the reference :class:`WarpLogitsProcessor` is compared with)."""
    from transformers.generation import logits_process as lp

    warpers = [lp.TemperatureLogitsWarper(float(temperature))]
    if top_k:
        warpers.append(lp.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(lp.TopPLogitsWarper(top_p))
    if min_p > 0.0:
        warpers.append(lp.MinPLogitsWarper(min_p))
    return lp.LogitsProcessorList(warpers)


class WarpLogitsProcessor:
    """:func:`specverify.warp` as a ``transformers`` ``LogitsProcessor``.

    ``processor(input_ids, scores)`` returns ``log(warp(scores, ...))`` ``[batch, V]`` float32:
    ``-inf`` for dropped tokens, and for kept ones log-probabilities whose softmax is the warped
    distribution (up to float32 rounding). Use it in place of ``generate``'s own warpers, which
    must then be switched off (``generate`` adds them from the generation config, whose default
    has ``top_k=50``)::

        model.generate(ids, do_sample=True, logits_processor=[WarpLogitsProcessor(top_p=0.9)],
                       temperature=1.0, top_k=0, top_p=1.0)
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0):
        self.sampling = Sampling(greedy=False, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.log(self.sampling.rows(scores.detach()))
