"""Hugging Face ``transformers`` causal LMs as :class:`specverify.SpeculativeDecoder` callbacks.

Terms (as in :mod:`specverify.decoder`)::

    prefix      [L]       int64, the whole sequence so far (prompt + emitted tokens)
    draft_step(prefix, k)         -> tokens [k] int64, probs [k, V] float32 or None
    target_step(prefix, proposed) -> rows [m + 1, V] float32, proposed [m] (0 <= m <= k);
                                     row i scores the position after prefix + proposed[:i]

Pieces:

- :class:`Sampling` turns logits into the sampling distribution with :func:`specverify.warp`
  (temperature, then top-k, top-p and min-p, the order ``transformers``' ``generate`` uses; O(V),
  no sort). It is handed to *both* the target and the draft by :func:`speculative_callbacks`, so
  the two are warped by one function with one set of parameters: speculative sampling then
  preserves the *warped* target distribution exactly. In greedy mode the target returns raw
  logits (only the argmax is read; a float32 softmax could merge near-ties that the logits keep
  apart). :func:`warp` is the sort-based torch version, kept as the reference in tests and
  benchmarks.
- :class:`WarpLogitsProcessor`: the same warping as a ``transformers`` ``LogitsProcessor``, for
  plain ``model.generate(do_sample=True, logits_processor=[...])``.
- :class:`CachedCausalLM` keeps one KV cache per model across rounds. Each call compares the
  sequence it is asked about with the tokens the cache holds, crops the cache back to the common
  prefix (the rollback after a rejection) and feeds only the new tokens.
- :class:`CausalLMTarget`, :class:`CausalLMDraft`: the two callbacks over a causal LM.
- :class:`PromptLookupDraft`: a deterministic draft with no distribution (``probs=None``): it copies
  the continuation of an earlier occurrence of the sequence's last n-gram (Saxena 2023, "prompt
  lookup decoding"), verified with ``sv.accept(target_probs, None, tokens, generator)``.
- :func:`early_exit`: a draft model made of the target's first N decoder layers plus its final
  norm and ``lm_head``, sharing the weights (no copy).

Example::

    import specverify as sv
    from specverify.integrations.transformers import speculative_callbacks
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=True,
                                eos_token_id=tokenizer.eos_token_id)
    ids = dec.generate(prompt_ids, max_new=128)      # == model.generate(do_sample=False)
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .. import ops

__all__ = [
    "warp",
    "Sampling",
    "WarpLogitsProcessor",
    "transformers_warpers",
    "CachedCausalLM",
    "CausalLMTarget",
    "CausalLMDraft",
    "PromptLookupDraft",
    "early_exit",
    "speculative_callbacks",
]


# -- warping ----------------------------------------------------------------------------------
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
        ops._warp_settings(self.temperature, self.top_k, self.top_p, self.min_p)  # raises if bad

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


# -- KV-cached forward passes ------------------------------------------------------------------
def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    m = min(a.numel(), b.numel())
    differ = torch.nonzero(a[:m] != b[:m])
    return int(differ[0, 0]) if differ.numel() else m


def _as_tokens(x) -> torch.Tensor:
    return torch.as_tensor(x).reshape(-1).to(torch.int64)


class CachedCausalLM:
    """A causal LM and one KV cache that follows a sequence which may be rolled back.

    :meth:`logits` is asked about a whole sequence; it keeps the cached entries of the longest
    prefix that the sequence shares with the tokens already fed, crops the rest (after a rejected
    draft) and feeds only what is new. Counters: ``forward_calls``, ``forward_tokens`` (tokens fed),
    ``rolled_back`` (cache entries cropped).
    """

    def __init__(self, model):
        self.model = model
        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed past_key_values= to cache=; accept both.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = next((a for a in ("logits_to_keep", "num_logits_to_keep") if a in params), None)
        self.reset()

    def reset(self) -> None:
        """Forget the cache (the next call feeds its whole sequence)."""
        self.cache = None
        self.tokens = torch.empty(0, dtype=torch.int64)  # [cached] tokens the cache holds
        self.forward_calls = 0
        self.forward_tokens = 0
        self.rolled_back = 0

    def _new_cache(self):
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # transformers 4.x
            return DynamicCache()

    def _crop(self, keep: int) -> None:
        drop = self.tokens.numel() - keep
        names = list(inspect.signature(self.cache.crop).parameters)
        if names and names[0] == "max_length":  # transformers 4.x: crop(final length)
            self.cache.crop(keep)
        else:  # transformers 5.x: crop(-tokens to remove)
            self.cache.crop(-drop)
        self.rolled_back += drop

    @torch.inference_mode()
    def logits(self, seq: torch.Tensor, n_last: int) -> torch.Tensor:
        """Float32 logits ``[n_last, V]`` of the last ``n_last`` positions of ``seq`` ``[L]``.

        Row ``j`` predicts the token after ``seq[: L - n_last + j + 1]``.
        """
        seq = _as_tokens(seq)
        length = seq.numel()
        if not 1 <= n_last <= length:
            raise ValueError(f"n_last must be in [1, {length}] for a sequence of {length} tokens, got {n_last}")
        keep = min(_common_prefix(self.tokens, seq), length - n_last)
        if self.cache is None or keep == 0:
            self.cache = self._new_cache()
            keep = 0
        elif keep < self.tokens.numel():
            self._crop(keep)
        kwargs = {self._cache_arg: self.cache, "use_cache": True}
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = n_last
        out = self.model(input_ids=seq[keep:][None, :], **kwargs)
        held = self.cache.get_seq_length()
        if held != length:
            raise RuntimeError(f"KV cache holds {held} positions after feeding a {length}-token sequence")
        self.tokens = seq.clone()  # seq may view the decoder's buffer
        self.forward_calls += 1
        self.forward_tokens += length - keep
        return out.logits[0, -n_last:].float()


# -- the callbacks ---------------------------------------------------------------------------------
class CausalLMTarget:
    """``target_step(prefix, proposed) -> rows [m + 1, V]`` over a causal LM, in one forward pass."""

    def __init__(self, model, sampling: Sampling = Sampling()):
        self.lm = CachedCausalLM(model)
        self.sampling = sampling

    def __call__(self, prefix: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
        proposed = _as_tokens(proposed)  # [m]
        seq = torch.cat([_as_tokens(prefix), proposed])
        return self.sampling.rows(self.lm.logits(seq, proposed.numel() + 1))  # [m + 1, V]


class CausalLMDraft:
    """``draft_step(prefix, k) -> (tokens [k], probs [k, V] or None)`` over a causal LM.

    Tokens are drawn one at a time (k forward passes, the KV cache carried between them and
    across rounds). In sampling mode ``probs[i]`` is the warped row ``tokens[i]`` was drawn from
    with ``generator``; in greedy mode tokens are argmaxes and ``probs`` is ``None``.
    """

    def __init__(self, model, sampling: Sampling = Sampling(), generator: Optional[torch.Generator] = None):
        self.lm = CachedCausalLM(model)
        self.sampling = sampling
        self.generator = generator

    def __call__(self, prefix: torch.Tensor, k: int, stop=None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``stop(i, confidence) -> bool`` (a draft-side rule, see :mod:`specverify.adaptive`): after
        drawing token ``i``, with ``confidence`` its probability under the draft (softmax of the
        logits in greedy mode), stop drafting if it says so; the token is kept."""
        seq = _as_tokens(prefix)
        tokens = torch.empty(k, dtype=torch.int64)  # [k]
        probs = None  # [k, V]
        drawn = k
        for i in range(k):
            row = self.sampling.rows(self.lm.logits(seq, 1))[0]  # [V]
            tokens[i] = self.sampling.pick(row, self.generator)
            if not self.sampling.greedy:
                if probs is None:
                    probs = torch.empty(k, row.numel(), dtype=torch.float32)
                probs[i] = row
            seq = torch.cat([seq, tokens[i : i + 1]])
            if stop is not None:
                dist = torch.softmax(row.double(), 0) if self.sampling.greedy else row.double() / row.double().sum()
                if stop(i, float(dist[tokens[i]])):
                    drawn = i + 1
                    break
        return tokens[:drawn], None if probs is None else probs[:drawn]


class PromptLookupDraft:
    """Deterministic n-gram draft: copy what followed an earlier occurrence of the last n-gram.

    For ``n`` from ``max_ngram`` down to ``min_ngram``, find the *earliest* earlier occurrence of
    the sequence's last ``n`` tokens and propose the tokens that followed it (as ``transformers``'
    ``prompt_lookup_num_tokens`` does). A continuation shorter than ``k`` is extended by looking
    up again after it; when nothing matches, fewer than ``k`` tokens (possibly none) are proposed,
    and the round verifies just those. ``probs`` is always ``None`` (a point mass): any
    deterministic proposal is verified exactly. Counter: ``matched`` tokens proposed.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if int(min_ngram) != min_ngram or int(max_ngram) != max_ngram or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r}, {max_ngram!r}")
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)
        self.matched = 0

    def lookup(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        """Up to ``k`` tokens that followed the earliest earlier match of ``seq``'s last n-gram."""
        length = seq.numel()
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            windows = seq[: length - 1].unfold(0, n, 1)  # [length - n, n]: starts with >= 1 token after
            hits = torch.nonzero((windows == seq[length - n :]).all(dim=1))
            if hits.numel():
                start = int(hits[0, 0]) + n
                return seq[start : start + k]
        return seq[:0]

    def __call__(self, prefix: torch.Tensor, k: int) -> Tuple[torch.Tensor, None]:
        seq = _as_tokens(prefix)
        base = seq.numel()
        while seq.numel() - base < k:
            more = self.lookup(seq, k - (seq.numel() - base))
            if not more.numel():
                break
            self.matched += more.numel()
            seq = torch.cat([seq, more])
        return seq[base : base + k].clone(), None


# -- drafts made from the target ---------------------------------------------------------------
def early_exit(model, n_layers: int):
    """A draft LM running only the first ``n_layers`` decoder layers of ``model``.

    The returned model (same class as ``model``, e.g. ``LlamaForCausalLM``) shares ``model``'s
    embedding, first ``n_layers`` layers, final norm, rotary embedding and ``lm_head``: no weight
    is copied. Works for the ``model.model.layers`` / ``model.model.norm`` / ``model.lm_head``
    layout of Llama-family models in ``transformers``.
    """
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "norm") or not hasattr(model, "lm_head"):
        raise TypeError(f"{type(model).__name__} does not have the model.layers / model.norm / lm_head layout")
    if int(n_layers) != n_layers or not 1 <= n_layers <= len(layers):
        raise ValueError(f"n_layers must be in [1, {len(layers)}], got {n_layers!r}")
    n_layers = int(n_layers)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = n_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:n_layers]
    with torch.device("meta"):  # build the skeleton without allocating weights
        draft = type(model)(config)
    draft.model.embed_tokens = base.embed_tokens
    draft.model.layers = torch.nn.ModuleList(list(layers[:n_layers]))
    draft.model.norm = base.norm
    if hasattr(base, "rotary_emb"):
        draft.model.rotary_emb = base.rotary_emb
    draft.lm_head = model.lm_head
    leftover = [name for name, t in list(draft.named_parameters()) + list(draft.named_buffers()) if t.is_meta]
    if leftover:
        raise TypeError(f"early_exit could not share these tensors of {type(model).__name__}: {leftover[:5]}")
    return draft.eval()


def speculative_callbacks(
    target_model,
    draft,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: Optional[torch.Generator] = None,
):
    """``(draft_step, target_step)`` for :class:`specverify.SpeculativeDecoder`.

    ``draft`` is a causal LM (``torch.nn.Module``, e.g. a smaller model or :func:`early_exit`),
    the string ``"prompt_lookup"``, or any ``draft_step`` callable (used as is). One
    :class:`Sampling` built from ``greedy, temperature, top_k, top_p, min_p`` is shared by the target
    and a model draft. ``generator`` drives the draft's own draws (not the verification's: give
    the decoder its own generator).
    """
    sampling = Sampling(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    target_step = CausalLMTarget(target_model, sampling)
    if isinstance(draft, torch.nn.Module):
        draft_step = CausalLMDraft(draft, sampling, generator)
    elif isinstance(draft, str):
        if draft != "prompt_lookup":
            raise ValueError(f"unknown draft {draft!r}: pass a model, 'prompt_lookup' or a callable")
        draft_step = PromptLookupDraft()
    elif callable(draft):
        draft_step = draft
    else:
        raise TypeError(f"draft must be a model, 'prompt_lookup' or a callable, got {type(draft).__name__}")
    return draft_step, target_step
