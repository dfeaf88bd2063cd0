"""Hugging Face ``transformers`` causal LMs as :class:`specverify.SpeculativeDecoder` callbacks.

Terms (as in :mod:`specverify.decoding.decoder`)::

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
- :func:`use_fast_linears`: a model's ``nn.Linear`` layers computed by :func:`specverify.linear`,
  which reads the weights once per call whatever the number of tokens (torch's CPU matmul reads
  them once per token for a few tokens): the multi-token passes that score drafts, and plain
  decoding's one-token passes, get cheaper.
- :func:`use_grouped_attention`: ``sdpa`` attention that does not copy grouped key/value heads
  out to every query head in multi-token passes (same bits, less time at long contexts).

Threads, interruptions, arguments (every callback over a model, and the tree drafts):

- **One sequence per callbacks pair.** Each :class:`CachedCausalLM` follows one sequence's KV
  cache. A call entered while another thread is inside one of the same callback raises a
  RuntimeError at once ("each thread needs its own callbacks"), rather than waiting: two
  threads taking turns would recompute each other's prefix every round. Build one pair (and one
  decoder) per thread with :func:`speculative_callbacks`; the pairs may share the models.
- **Interruption.** A call that does not complete (an exception or ``KeyboardInterrupt`` in a
  forward, which may leave the cache's layers at different lengths) drops the cache; the next
  call rebuilds it from its whole sequence, so a rerun gives what an uninterrupted run gives.
- **Arguments.** Sequences are 1-D integer token ids (lists, arrays or tensors);
  :class:`CausalLMTarget` carries ``vocab_size`` and ``greedy`` so that the decoder checks token
  ids and its mode before the first forward. Past ``max_position_embeddings`` a
  :class:`PositionLimitWarning` is issued (once per cache).

Example::

    import specverify as sv
    from specverify.integrations.transformers import speculative_callbacks
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=True,
                                eos_token_id=tokenizer.eos_token_id)
    ids = dec.generate(prompt_ids, max_new=128)      # == model.generate(do_sample=False)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import threading
import warnings
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from .. import verify as ops
from ..kernels import _inputs
from ..decoding.tree_drafts import DraftTree, Trie, ancestor_mask, check_parents, depths, path_to

__all__ = [
    "warp",
    "Sampling",
    "WarpLogitsProcessor",
    "transformers_warpers",
    "CachedCausalLM",
    "PositionLimitWarning",
    "CausalLMTarget",
    "CausalLMDraft",
    "PromptLookupDraft",
    "PromptLookupTreeDraft",
    "CausalLMTreeDraft",
    "early_exit",
    "use_fast_linears",
    "FastLinears",
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


# -- KV-cached forward passes ------------------------------------------------------------------
def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    m = min(a.numel(), b.numel())
    differ = torch.nonzero(a[:m] != b[:m])
    return int(differ[0, 0]) if differ.numel() else m


def _as_tokens(x) -> torch.Tensor:
    return torch.as_tensor(x).reshape(-1).to(torch.int64)


class PositionLimitWarning(UserWarning):
    """A sequence went past the model's ``max_position_embeddings``: its outputs there are
    extrapolation (``generate`` warns likewise). Issued once per :class:`CachedCausalLM`."""


class _ExclusiveUse:
    """A re-entrant lock taken without waiting: a second thread entering raises at once.

    Why not wait: a callbacks pair follows one sequence's KV cache, so two threads taking turns
    would recompute each other's whole prefix every round; they need a pair each, and say so.
    """

    def __init__(self, owner: str):
        self.owner = owner
        self._lock = threading.RLock()

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                f"{self.owner} is in use by another thread: a callbacks pair follows one sequence's KV cache, "
                f"so each thread needs its own callbacks (call speculative_callbacks once per thread; the "
                f"models' weights may be shared)")
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def _exclusive(method):
    """Run a :class:`CachedCausalLM` method under :meth:`CachedCausalLM.exclusive`."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self.exclusive():
            return method(self, *args, **kwargs)
    return guarded


class CachedCausalLM:
    """A causal LM and one KV cache that follows a sequence which may be rolled back.

    :meth:`logits` is asked about a whole sequence; it keeps the cached entries of the longest
    prefix that the sequence shares with the tokens already fed, crops the rest (after a rejected
    draft) and feeds only what is new. :meth:`tree_logits` scores a whole draft tree in one forward
    (a tree attention mask, depth-based positions); the tree's entries stay in the cache after the
    prefix until the next call, which keeps only the root-to-node path that the new sequence
    continues with (:meth:`compact`: the accepted path's entries move into place, the rejected
    branches are dropped) and so continues without recomputing it. Counters: ``forward_calls``,
    ``forward_tokens`` (tokens fed), ``rolled_back`` (cache entries dropped), ``reused_tree``
    (tree entries kept by compaction), ``dropped`` (caches dropped after an interrupted call).

    Recovery after interruption: a call that does not complete (an exception or
    ``KeyboardInterrupt`` inside the model's forward, or anywhere else in the call) drops the
    cache, whose layers may then hold different lengths; the next call rebuilds it from its
    whole sequence, so its output is what an uninterrupted run gives.

    Thread-safety: one sequence at a time. A call entered while another thread is inside one
    raises a RuntimeError at once (nothing waits, nothing is corrupted); give each thread its own
    instance (instances may share one model).

    Sequences are 1-D integer token ids (a list, array or tensor, ``[L]``; the decoder checks
    them, and this class reads them with ``reshape(-1)``). Past ``model.config.max_position_embeddings``
    positions a :class:`PositionLimitWarning` is issued, once per instance.
    """

    def __init__(self, model):
        self.model = model
        self.max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self._warned_positions = False
        self._in_use = _ExclusiveUse(f"{type(self).__name__} over {type(model).__name__}")
        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed past_key_values= to cache=; accept both.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = next((a for a in ("logits_to_keep", "num_logits_to_keep") if a in params), None)
        self.reset()

    def reset(self) -> None:
        """Forget the cache (the next call feeds its whole sequence)."""
        self.cache = None
        self.tokens = torch.empty(0, dtype=torch.int64)  # [cached] committed tokens the cache holds, in order
        self.tree = None  # (tokens [N], parents [N], rows [N + 1, V]): a scored tree whose entries follow self.tokens
        self.forward_calls = 0
        self.forward_tokens = 0
        self.rolled_back = 0
        self.reused_tree = 0
        self.dropped = 0

    @contextlib.contextmanager
    def exclusive(self):
        """Hold this cache for one call (or one callback's several calls): a RuntimeError if
        another thread holds it; if the block does not complete, the cache is dropped."""
        with self._in_use:  # refused before the try: a refused thread must not drop the holder's cache
            try:
                yield self
            except BaseException:
                self._drop_cache()
                raise

    def _drop_cache(self) -> None:
        """Forget the cache but keep the counters: an interrupted forward may have grown some
        layers and not others, and a pending tree's entries may be half compacted."""
        if self.cache is None and self.tree is None:
            return  # nothing held (or dropped already, by a nested block)
        self.cache = None
        self.tokens = self.tokens[:0]
        self.tree = None
        self.dropped += 1

    def _check_positions(self, n_positions: int) -> None:
        """Warn (once) when the forward reaches past ``max_position_embeddings``."""
        limit = self.max_positions
        if self._warned_positions or not isinstance(limit, int) or n_positions <= limit:
            return
        self._warned_positions = True
        warnings.warn(
            f"the sequence reaches {n_positions} positions, past the model's max_position_embeddings "
            f"({limit}): outputs past it are extrapolation and may be unreliable (warned once per cache)",
            PositionLimitWarning, stacklevel=2)

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
        self.tokens = self.tokens[:keep]
        self.rolled_back += drop

    @_exclusive
    @torch.inference_mode()
    def compact(self, path) -> None:
        """Keep the pending tree's nodes ``path`` (root first, a root-to-node path) and drop the rest.

        The cache holds ``[committed, tree nodes]``; afterwards it holds ``[committed, path nodes]``,
        exactly the entries a plain forward over ``committed + tokens[path]`` would have made (each
        path node attended to the committed prefix and its ancestors only, at its depth's position).
        """
        if self.tree is None:
            raise RuntimeError("compact() needs a tree scored by tree_logits()")
        tree_tokens, parents, _ = self.tree
        path = _as_tokens(path)
        expected = torch.tensor(path_to(parents.tolist(), int(path[-1])) if path.numel() else [], dtype=torch.int64)
        if not torch.equal(path, expected):
            raise ValueError(f"path {path.tolist()} is not a root-to-node path of the tree {parents.tolist()}")
        base, n_tree = self.tokens.numel(), tree_tokens.numel()
        for layer in _cache_layers(self.cache):
            # gather first (a copy), then write into place: the path's indices are >= their new slots
            for name in ("keys", "values"):
                x = getattr(layer, name)  # [batch, heads, base + n_tree, head_dim]
                x[..., base : base + path.numel(), :] = x[..., base + path, :]
                setattr(layer, name, x[..., : base + path.numel(), :])
        self.tokens = torch.cat([self.tokens, tree_tokens[path]])
        self.tree = None
        self.rolled_back += n_tree - path.numel()
        self.reused_tree += path.numel()

    def _settle_tree(self, seq: torch.Tensor) -> None:
        """Resolve a pending tree against the sequence now asked about: keep the path ``seq`` follows."""
        tree_tokens, parents, _ = self.tree
        base = self.tokens.numel()
        path = []
        if _common_prefix(self.tokens, seq) == base:
            children = {}
            for i, (p, t) in enumerate(zip(parents.tolist(), tree_tokens.tolist())):
                children.setdefault((p, t), i)  # duplicate siblings: the first one (its entries are equal)
            node = -1
            for t in seq[base:].tolist():
                node = children.get((node, t))
                if node is None:
                    break
                path.append(node)
        self.compact(path)

    def _sync(self, seq: torch.Tensor, limit: int) -> int:
        """Make the cache hold ``seq[:keep]`` for the longest reusable ``keep <= limit``; return ``keep``."""
        if self.tree is not None:
            self._settle_tree(seq)
        keep = min(_common_prefix(self.tokens, seq), limit)
        if self.cache is None or keep == 0:
            self.cache = self._new_cache()
            self.tokens = self.tokens[:0]
            keep = 0
        elif keep < self.tokens.numel():
            self._crop(keep)
        return keep

    def _forward(self, fed: torch.Tensor, n_rows: int, expect_held: int, **kwargs) -> torch.Tensor:
        kwargs.update({self._cache_arg: self.cache, "use_cache": True})
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = n_rows
        out = self.model(input_ids=fed[None, :], **kwargs)
        held = self.cache.get_seq_length()
        if held != expect_held:
            raise RuntimeError(f"KV cache holds {held} positions, expected {expect_held}")
        self.forward_calls += 1
        self.forward_tokens += fed.numel()
        return out.logits[0, -n_rows:].float()

    @_exclusive
    @torch.inference_mode()
    def logits(self, seq: torch.Tensor, n_last: int) -> torch.Tensor:
        """Float32 logits ``[n_last, V]`` of the last ``n_last`` positions of ``seq`` ``[L]``.

        Row ``j`` predicts the token after ``seq[: L - n_last + j + 1]``.
        """
        seq = _as_tokens(seq)
        length = seq.numel()
        if not 1 <= n_last <= length:
            raise ValueError(f"n_last must be in [1, {length}] for a sequence of {length} tokens, got {n_last}")
        self._check_positions(length)
        keep = self._sync(seq, length - n_last)
        rows = self._forward(seq[keep:], n_last, length)
        self.tokens = seq.clone()  # seq may view the decoder's buffer
        return rows

    @_exclusive
    @torch.inference_mode()
    def tree_logits(self, prefix: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N + 1, V]`` of a draft tree after ``prefix`` ``[L]``, in one forward.

        ``tokens [N]``, ``parents [N]`` as in :mod:`specverify.decoding.tree_drafts`. Row 0 predicts the
        token after ``prefix``, row ``i + 1`` the token after ``prefix`` + node ``i``'s path. The
        fed block is ``prefix[keep:]`` (at least its last token) followed by the ``N`` nodes;
        its mask lets the prefix tokens attend causally and each node attend to the whole prefix,
        its ancestors and itself; node ``i`` sits at position ``L - 1 + depth(i)``. When the tree
        extends the one scored last after the same prefix (its first nodes are that tree's), only the
        new nodes are fed and the earlier rows are reused: a draft grows its tree level by level at
        the cost of the new nodes only.
        """
        _check_tree_attention(self.model)
        prefix, tokens, parents = _as_tokens(prefix), _as_tokens(tokens), _as_tokens(parents)
        length, n_nodes = prefix.numel(), tokens.numel()
        if length < 1:
            raise ValueError("tree_logits needs a non-empty prefix")
        if parents.numel() != n_nodes:
            raise ValueError(f"tokens [{n_nodes}] and parents [{parents.numel()}] differ in length")
        check_parents(parents)
        grown = self._grown_tree(prefix, tokens, parents)
        if grown:  # the pending tree's nodes come first: feed only the new ones (a draft growing its tree)
            old, keep, old_rows = self.tree[0].numel(), length, self.tree[2]
            if old == n_nodes:
                return old_rows
        else:
            old, keep, old_rows = 0, self._sync(prefix, length - 1), None
        fresh = length - keep  # prefix tokens to feed: >= 1 unless the tree grows (the root row is known)
        new = n_nodes - old
        # cache columns: [keep cached prefix][fresh prefix][old nodes][new nodes]; fresh = 0 or old = 0
        allowed = torch.zeros(fresh + new, length + n_nodes, dtype=torch.bool)  # [q, kv]
        allowed[:, :keep] = True
        allowed[:fresh, keep:length] = torch.ones(fresh, fresh, dtype=torch.bool).tril()  # causal
        allowed[fresh:, keep:length] = True  # every node sees the whole prefix
        allowed[fresh:, length:] = ancestor_mask(parents)[old:]  # ... and its ancestors and itself
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        positions = torch.cat([torch.arange(keep, length), length - 1 + depths(parents)[old:]])
        self._check_positions(int(positions.max()) + 1 if positions.numel() else length)
        rows = self._forward(torch.cat([prefix[keep:], tokens[old:]]), new + (not grown),
                             length + n_nodes, attention_mask=mask[None, None], position_ids=positions[None])
        if grown:
            rows = torch.cat([old_rows, rows])
        self.tokens = prefix.clone()
        self.tree = (tokens.clone(), parents.clone(), rows)
        return rows

    def _grown_tree(self, prefix, tokens, parents) -> bool:
        """Whether ``tokens, parents`` extend the pending tree (possibly empty) after the same prefix."""
        if self.tree is None or not torch.equal(prefix, self.tokens):
            return False
        old_tokens, old_parents, _ = self.tree
        old = old_tokens.numel()
        return old <= tokens.numel() and torch.equal(tokens[:old], old_tokens) and torch.equal(parents[:old], old_parents)


GROUPED_SDPA = "specverify_grouped_sdpa"  # use_grouped_attention's implementation: sdpa without repeat_kv
TREE_ATTENTION = ("eager", "sdpa", GROUPED_SDPA)  # implementations that take an arbitrary additive 4D mask


def _check_tree_attention(model) -> None:
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in TREE_ATTENTION:
        raise ValueError(
            f"tree scoring needs an attention implementation that takes a custom 4D mask ({', '.join(TREE_ATTENTION)}); "
            f"this model uses {impl!r}: call model.set_attn_implementation('sdpa') first, or use chain drafts")


def _cache_layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"{type(cache).__name__} has no per-layer key/value tensors (transformers >= 5 DynamicCache needed)")
    for layer in layers:
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise TypeError(f"cannot compact a {type(layer).__name__} cache layer (sliding window or not key/value)")
    return layers


# -- the callbacks ---------------------------------------------------------------------------------
class CausalLMTarget:
    """``target_step(prefix, proposed, parents=None) -> rows [m + 1, V]`` over a causal LM, in one forward pass.

    ``parents=None``: ``proposed`` is a chain. Otherwise ``proposed [N]`` and ``parents [N]`` are a
    draft tree, scored by :meth:`CachedCausalLM.tree_logits` (rows ``[N + 1, V]``, row ``i + 1``
    after node ``i``); the next call keeps the cache entries of the path it continues with.
    ``prefix``, ``proposed`` and ``parents`` are 1-D integer sequences (lists, arrays or tensors).

    Attributes the decoder reads: ``vocab_size`` (the width of the rows, the model's output
    layer: token ids are checked against it before any forward) and ``greedy`` (the mode its
    :class:`Sampling` makes rows for: raw logits when True, probabilities when False; a decoder
    of the other mode refuses it). Thread-safety, recovery: as :class:`CachedCausalLM`.
    """

    def __init__(self, model, sampling: Sampling = Sampling()):
        self.lm = CachedCausalLM(model)
        self.sampling = sampling
        self.vocab_size = _output_width(model)

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def __call__(self, prefix: torch.Tensor, proposed: torch.Tensor, parents=None) -> torch.Tensor:
        with self.lm.exclusive():
            proposed = _as_tokens(proposed)  # [m]
            if parents is not None:
                return self.sampling.rows(self.lm.tree_logits(prefix, proposed, parents))  # [N + 1, V]
            seq = torch.cat([_as_tokens(prefix), proposed])
            return self.sampling.rows(self.lm.logits(seq, proposed.numel() + 1))  # [m + 1, V]


def _output_width(model) -> Optional[int]:
    """The number of logits a forward returns per position: the output layer's width, else the
    config's ``vocab_size`` (``None`` if neither is known)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    width = getattr(head, "out_features", None)
    if width is None:
        width = getattr(getattr(model, "config", None), "vocab_size", None)
    return width if isinstance(width, int) and width > 0 else None


class CausalLMDraft:
    """``draft_step(prefix, k) -> (tokens [k], probs [k, V] or None)`` over a causal LM.

    Tokens are drawn one at a time (k forward passes, the KV cache carried between them and
    across rounds). In sampling mode ``probs[i]`` is the warped row ``tokens[i]`` was drawn from
    with ``generator``; in greedy mode tokens are argmaxes and ``probs`` is ``None``.
    ``greedy`` (read by the decoder, which refuses a draft of the other mode) is its
    :class:`Sampling`'s. Thread-safety, recovery: as :class:`CachedCausalLM`, for the whole call
    (its ``k`` forwards).
    """

    def __init__(self, model, sampling: Sampling = Sampling(), generator: Optional[torch.Generator] = None):
        self.lm = CachedCausalLM(model)
        self.sampling = sampling
        self.generator = generator

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def __call__(self, prefix: torch.Tensor, k: int, stop=None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``stop(i, confidence) -> bool`` (a draft-side rule, see :mod:`specverify.decoding.adaptive`): after
        drawing token ``i``, with ``confidence`` its probability under the draft (softmax of the
        logits in greedy mode), stop drafting if it says so; the token is kept."""
        with self.lm.exclusive():  # held across the k forwards: another thread would refetch the prefix each time
            return self._draw(_as_tokens(prefix), k, stop)

    def _draw(self, seq: torch.Tensor, k: int, stop) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
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


def suffix_matches(seq: torch.Tensor, n: int) -> List[int]:
    """Start indices, ascending, of the earlier occurrences of ``seq``'s last ``n`` tokens that have at
    least one token after them (``seq [L]``); ``[]`` when ``n`` is not in ``[1, L - 1]``."""
    length = seq.numel()
    if not 1 <= n < length:
        return []
    windows = seq[: length - 1].unfold(0, n, 1)  # [length - n, n]: starts with >= 1 token after
    return torch.nonzero((windows == seq[length - n :]).all(dim=1)).flatten().tolist()


def longest_match(seq: torch.Tensor, max_ngram: int, min_ngram: int = 1) -> Tuple[int, List[int]]:
    """``(n, starts)`` for the longest ``n`` in ``[min_ngram, max_ngram]`` whose suffix n-gram of
    ``seq`` occurred earlier (:func:`suffix_matches`); ``(0, [])`` when none did."""
    for n in range(min(max_ngram, seq.numel() - 1), min_ngram - 1, -1):
        starts = suffix_matches(seq, n)
        if starts:
            return n, starts
    return 0, []


class PromptLookupDraft:
    """Deterministic n-gram draft: copy what followed an earlier occurrence of the last n-gram.

    For ``n`` from ``max_ngram`` down to ``min_ngram``, find the *earliest* earlier occurrence of
    the sequence's last ``n`` tokens and propose the tokens that followed it (as ``transformers``'
    ``prompt_lookup_num_tokens`` does). A continuation shorter than ``k`` is extended by looking
    up again after it; when nothing matches, fewer than ``k`` tokens (possibly none) are proposed,
    and the round verifies just those. ``probs`` is always ``None`` (a point mass): any
    deterministic proposal is verified exactly. Counter: ``matched`` tokens proposed.
    It keeps no per-sequence state, so threads may share it (the counter may then miss counts).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if int(min_ngram) != min_ngram or int(max_ngram) != max_ngram or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r}, {max_ngram!r}")
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)
        self.matched = 0

    def context(self, prefix: torch.Tensor) -> int:
        """What kind of proposal comes next, known from the prefix alone: the draft-side context
        :class:`specverify.decoding.adaptive.AdaptiveK` estimates the first draft's rates by.

        ``n``, the order of the match the proposal copies from (0: none, nothing proposed), plus
        ``max_ngram`` when the match is *contradicted*: the n-gram's most recent earlier
        occurrence was followed by another token than the earliest one, whose continuation is
        copied. A longer match is a better one, and a contradicted one a much worse one: on
        SmolLM2-135M's greedy texts (12 prompts, 316 proposing rounds) the first copied token was
        right after 42 of 43 uncontradicted 3-gram matches and 0 of 17 contradicted ones, after
        36 of 104 uncontradicted single tokens and 8 of 114 contradicted ones (a common token
        such as " the" matches early in the prompt, and what followed it there was overruled
        since)."""
        seq = _as_tokens(prefix)
        n, starts = longest_match(seq, self.max_ngram, self.min_ngram)
        if not n:
            return 0
        return n + self.max_ngram * int(seq[starts[-1] + n] != seq[starts[0] + n])

    def first_token(self, prefix: torch.Tensor) -> Optional[int]:
        """The token a proposal from ``prefix`` would start with, without drafting (``None``:
        nothing to propose). The decoder asks it in rounds that draft nothing, so that a policy
        still learns, in hindsight, whether the draft would have been right there
        (:attr:`specverify.decoding.adaptive.RoundRecord.hindsight`)."""
        seq = _as_tokens(prefix)
        n, starts = longest_match(seq, self.max_ngram, self.min_ngram)
        return int(seq[starts[0] + n]) if n else None

    def lookup(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        """Up to ``k`` tokens that followed the earliest earlier match of ``seq``'s last n-gram."""
        n, hits = longest_match(seq, self.max_ngram, self.min_ngram)
        return seq[hits[0] + n : hits[0] + n + k] if n else seq[:0]

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


class PromptLookupTreeDraft:
    """Multi-candidate prompt lookup: the chain's proposal plus other earlier continuations, one tree.

    Candidates, best first: the chain :class:`PromptLookupDraft` proposal (longest suffix n-gram,
    ``max_ngram`` down to 1, earliest occurrence; so the tree's first root-to-leaf path is exactly
    the chain draft's and greedy never accepts less per pass than the chain), then, for ``n`` from
    ``max_ngram`` down to ``min_ngram``, the ``k`` tokens after every earlier occurrence of the
    sequence's last ``n`` tokens, earliest first. They are inserted into a
    :class:`~specverify.decoding.tree_drafts.Trie` (shared prefixes become one path) until ``node_budget``
    nodes are used. Children are deterministic (``probs=None``): verified exactly by
    sample-and-match, whatever decides what is proposed. Counters: ``candidates`` inserted,
    ``declined`` rounds with a match but no proposal.

    **When to propose** (on a CPU a pass that scores extra tokens costs 1.5-2x a one-token step,
    measured on SmolLM2-135M, so a mostly rejected draft is a loss): the longest match of order
    ``n`` (a unigram only when every earlier occurrence of the token is followed by the same
    token; an ambiguous unigram proposes nothing) proposes iff its *hindsight accuracy*
    ``(right_n + n) / (seen_n + n + 1)`` is at least ``threshold``. ``seen_n`` / ``right_n`` count
    the tokens committed since this draft first saw the sequence at which the longest match had
    order ``n`` and whether the chain's first proposed token was that token; ``n`` right and 1 wrong
    pseudo-observations are the prior (1/2 for a unigram, 2/3 for a bigram, 3/4 for a trigram).
    So a copy task proposes from its first shared token while open-ended text, whose matches miss,
    soon stops proposing after them. The decision depends only on the prefix (the counts restart when
    a prefix does not extend the previous one), so output stays exact in both modes.

    Thread-safety: the hindsight counts follow one sequence; a call entered while another thread
    is inside one raises a RuntimeError (give each thread its own draft).
    """

    def __init__(self, node_budget: int = 16, max_ngram: int = 3, min_ngram: int = 2, threshold: float = 0.4):
        if int(node_budget) != node_budget or node_budget < 1:
            raise ValueError(f"node_budget must be a positive integer, got {node_budget!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
        self.node_budget = int(node_budget)
        self.threshold = float(threshold)
        if int(min_ngram) != min_ngram or int(max_ngram) != max_ngram or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r}, {max_ngram!r}")
        self.chain = PromptLookupDraft(max_ngram, 1)
        self.min_ngram = int(min_ngram)
        self.candidates = 0
        self.declined = 0
        self._seen = None  # the last prefix seen; hindsight covers its tokens from index _start on
        self._start = 0
        self.seen = [0] * (max_ngram + 1)  # [order]: committed tokens whose longest match had this order
        self.right = [0] * (max_ngram + 1)  # [order]: ... and whose chain proposal started with them
        self._in_use = _ExclusiveUse(type(self).__name__)

    def _order(self, seq: torch.Tensor) -> Tuple[int, List[int]]:
        """The longest match ``(n, starts)`` a proposal would follow; ``(0, [])`` for none or an ambiguous unigram."""
        n, starts = longest_match(seq, self.chain.max_ngram)
        if n == 1 and len({int(seq[s + 1]) for s in starts}) > 1:
            return 0, []
        return n, starts

    def _update_hindsight(self, seq: torch.Tensor) -> None:
        done = -1 if self._seen is None else self._seen.numel()
        if not 0 <= done <= seq.numel() or not torch.equal(seq[:done], self._seen):  # a new sequence
            self._start = done = seq.numel()
            self.seen = [0] * len(self.seen)
            self.right = [0] * len(self.right)
        for t in range(max(done, self._start), seq.numel()):
            n, starts = self._order(seq[:t])
            if n:
                self.seen[n] += 1
                self.right[n] += int(seq[starts[0] + n] == seq[t])
        self._seen = seq.clone()

    def proposes(self, seq: torch.Tensor) -> bool:
        """Whether the longest match of ``seq`` ``[L]`` is trusted enough to propose (see the class doc)."""
        n, _ = self._order(seq)
        return n > 0 and (self.right[n] + n) / (self.seen[n] + n + 1) >= self.threshold

    def continuations(self, seq: torch.Tensor, k: int):
        """Yield candidate continuations (1-D tensors of at most ``k`` tokens), best first."""
        yield self.chain(seq, k)[0]
        for n in range(min(self.chain.max_ngram, seq.numel() - 1), self.min_ngram - 1, -1):
            for start in suffix_matches(seq, n):
                yield seq[start + n : start + n + k]

    def __call__(self, prefix: torch.Tensor, k: int) -> DraftTree:
        with self._in_use:
            return self._propose(_as_tokens(prefix), k)

    def _propose(self, seq: torch.Tensor, k: int) -> DraftTree:
        self._update_hindsight(seq)
        trie = Trie(self.node_budget)
        if not self.proposes(seq):
            self.declined += int(longest_match(seq, self.chain.max_ngram)[0] > 0)
            return trie.tree()
        for continuation in self.continuations(seq, k):
            if continuation.numel():
                trie.insert(continuation.tolist())
                self.candidates += 1
            if trie.full:
                break
        return trie.tree()


class CausalLMTreeDraft:
    """A causal LM's top-k tree, grown level by level and reranked (EAGLE-2, Li et al. 2024).

    At each depth the ``top_k`` most likely children of every frontier node are scored by the
    product of draft probabilities along their path; the ``beam`` best of them are expanded (one
    forward of only those nodes, :meth:`CachedCausalLM.tree_logits` growing the tree); after ``k``
    levels every candidate competes by that product and the best ``node_budget`` form the tree
    (ancestors score at least as high as their children, so the kept set is a tree). Children are
    deterministic (``probs=None``, verified by sample-and-match), so sampling stays exact whatever
    the draft. Probabilities are the draft's softmax at ``temperature`` (a ranking, not a law).
    Thread-safety, recovery: as :class:`CachedCausalLM`, for the whole call.
    """

    def __init__(self, model, node_budget: int = 16, top_k: int = 4, beam: int = 4, temperature: float = 1.0):
        _check_tree_shape(node_budget, top_k, beam, temperature)
        self.lm = CachedCausalLM(model)
        self.node_budget, self.top_k, self.beam, self.temperature = int(node_budget), int(top_k), int(beam), temperature

    def __call__(self, prefix: torch.Tensor, k: int) -> DraftTree:
        with self.lm.exclusive():  # held across the k levels' forwards
            return self._grow(_as_tokens(prefix), k)

    def _grow(self, prefix: torch.Tensor, k: int) -> DraftTree:
        tokens, parents, scores = [], [], []  # every candidate node: [C] token, parent, log path probability
        expanded = []  # candidates in the grown tree, in growth order (their index there = position here)
        rows = self.lm.tree_logits(prefix, prefix[:0], prefix[:0])  # [1, V]
        frontier = [(-1, 0.0, 0)]  # (candidate id, log path probability, row in `rows`)
        for depth in range(k):
            level = []
            for cand, score, row in frontier:
                logp = torch.log_softmax(rows[row] / self.temperature, dim=-1)
                level += _add_children(tokens, parents, scores, cand, score, logp, self.top_k)
            if depth == k - 1:
                break
            best, start, tree_parents = _expand(level, scores, parents, expanded, self.beam)
            rows = self.lm.tree_logits(prefix, torch.tensor([tokens[c] for c in expanded]), tree_parents)
            frontier = [(c, scores[c], start + i + 1) for i, c in enumerate(best)]
        return _rerank(tokens, parents, scores, self.node_budget)


def _add_children(tokens, parents, scores, cand, score, logp, top_k, ids=None) -> List[int]:
    """Append the ``top_k`` most likely children of candidate ``cand`` (log path probability
    ``score``; ``logp`` ``[W]`` its children's log probabilities, token ``ids[j]`` for entry ``j``,
    ``j`` itself when ``ids`` is None) to the candidate lists; return their candidate ids."""
    top = torch.topk(logp, min(top_k, logp.numel()))
    new = []
    for lp, j in zip(top.values.tolist(), top.indices.tolist()):
        tokens.append(j if ids is None else int(ids[j]))
        parents.append(cand)
        scores.append(score + lp)
        new.append(len(tokens) - 1)
    return new


def _expand(level, scores, parents, expanded, beam):
    """The ``beam`` best candidates of ``level`` appended to ``expanded`` (in place); returns
    ``(best, start, parents [E])``: them, their first index in ``expanded`` and the expanded tree's
    parents (indices into ``expanded``)."""
    best = sorted(level, key=lambda c: -scores[c])[:beam]
    start = len(expanded)
    expanded += best
    position = {c: i for i, c in enumerate(expanded)}
    return best, start, torch.tensor([position.get(parents[c], -1) for c in expanded], dtype=torch.int64)


def _check_tree_shape(node_budget, top_k, beam, temperature) -> None:
    """ValueError unless ``node_budget``, ``top_k``, ``beam`` are positive integers and ``temperature`` a valid one."""
    for name, value in (("node_budget", node_budget), ("top_k", top_k), ("beam", beam)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    _check_warp(temperature, 0, 1.0)


def _rerank(tokens: List[int], parents: List[int], scores: List[float], node_budget: int) -> DraftTree:
    """The EAGLE-2 rerank: the ``node_budget`` candidates of highest ``scores`` (log path
    probabilities, so a node scores at most its parent) and their ancestors, as a
    :class:`~specverify.decoding.tree_drafts.DraftTree`. ``tokens``, ``parents``, ``scores``: ``[C]`` per
    candidate, ``parents[c]`` a candidate id ``< c`` or -1 (candidates created after their parents).
    """
    keep = sorted(range(len(tokens)), key=lambda c: -scores[c])[:node_budget]
    keep = set(keep)
    for c in list(keep):  # ancestors of kept nodes (ties in the product could drop one)
        while parents[c] >= 0 and parents[c] not in keep:
            keep.add(parents[c])
            c = parents[c]
    order = sorted(keep)  # candidate ids are created after their parents: a topological order
    index = {c: i for i, c in enumerate(order)}
    return DraftTree(torch.tensor([tokens[c] for c in order], dtype=torch.int64),
                     torch.tensor([index.get(parents[c], -1) for c in order], dtype=torch.int64))


# -- the target's linear layers --------------------------------------------------------------
def _fast_linear_forward(self, num_threads: Optional[int], x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` through :func:`specverify.linear` when no gradient is wanted."""
    if (x.dtype != torch.float32 or x.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
        return torch.nn.functional.linear(x, self.weight, self.bias)
    bias = None if self.bias is None else self.bias.detach()
    return ops.linear(x, self.weight.detach(), bias, num_threads=num_threads or torch.get_num_threads())


class _Switch:
    """A switch made on a model: ``restore()`` undoes it, and so does leaving a ``with`` block."""

    def restore(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


class FastLinears(_Switch):
    """The layers :func:`use_fast_linears` switched; ``restore()`` (or leaving the ``with``
    block) gives them back their own ``forward``."""

    def __init__(self, modules: List[torch.nn.Linear]):
        self.modules = modules

    def restore(self) -> None:
        for module in self.modules:
            module.__dict__.pop("forward", None)
        self.modules = []


def use_fast_linears(model: torch.nn.Module, num_threads: Optional[int] = None) -> FastLinears:
    """Compute ``model``'s float32 CPU ``nn.Linear`` layers with :func:`specverify.linear`.

    Why: for the 1-17 tokens a decoding step feeds, torch's CPU matmul (2.13, one thread) reads
    a layer's weights once per token: SmolLM2-135M's 49152 x 576 output layer takes 9.5 ms for
    one token and 16-24 ms for 2-16, so a target pass scoring K + 1 drafts costs 1.6-2x a
    one-token pass.  ``specverify.linear`` reads them once per call.

    What changes: each output is summed in ``linear``'s fixed order, the same bits whether a
    token is scored alone or in a tree, but not the bits of torch's own matmul; compare a
    speculative decoder with plain ``generate`` on the same switched model.  Only instances of
    ``nn.Linear`` itself with float32 CPU weights are switched (subclasses, quantized or other
    layers keep theirs), and only under ``torch.no_grad()`` or for inputs and weights that need
    no gradient: training goes through torch.  ``num_threads``: the threads each layer may use
    (see :func:`specverify.linear`); None follows ``torch.get_num_threads()`` at each call.

    Returns:
        a :class:`FastLinears` handle: ``restore()`` undoes the switch (also a context manager).
    """
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise ValueError(f"num_threads must be None or a positive integer, got {num_threads!r}")
    switched = []
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
                and module.weight.device.type == "cpu" and "forward" not in module.__dict__
                and (module.bias is None or module.bias.dtype == torch.float32)):
            module.forward = functools.partial(_fast_linear_forward, module, num_threads)
            switched.append(module)
    return FastLinears(switched)


# -- the target's attention --------------------------------------------------------------------
def _grouped_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                            **kwargs):
    """``transformers``' ``sdpa`` attention, except that a CPU pass scoring several tokens hands
    grouped key/value heads to torch's SDPA (``enable_gqa=True``) instead of copying them out to
    every query head (``repeat_kv``, a copy of the layer's whole cache). Shapes as ``sdpa``'s:
    ``query [b, H, q, d]``, ``key``/``value [b, H / g, kv, d]`` -> ``([b, q, H, d], None)``.
    Anything else (one query, no grouping, other devices, position biases, an unmasked pass whose
    causal alignment needs ``sdpa``'s cropping) goes to ``sdpa`` itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    if (getattr(module, "num_key_value_groups", 1) == 1 or q_len == 1 or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or (attention_mask is None and q_len != kv_len)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = attention_mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=causal,
                                                           enable_gqa=True)  # [b, H, q, d]
    return out.transpose(1, 2).contiguous(), None


class GroupedAttention(_Switch):
    """What :func:`use_grouped_attention` switched; ``restore()`` (or leaving the ``with`` block)
    gives the model its previous attention implementation back."""

    def __init__(self, model, previous: Optional[str]):
        self.model, self.previous = model, previous

    def restore(self) -> None:
        if self.model is not None and self.previous is not None:
            self.model.set_attn_implementation(self.previous)
        self.model = None


def use_grouped_attention(model) -> GroupedAttention:
    """Run ``model``'s attention as ``sdpa`` without copying grouped key/value heads.

    Why: with grouped-query attention (SmolLM2: 9 query heads share 3 key/value heads),
    ``transformers`` 5.24's ``sdpa`` copies each layer's cached keys and values out to every query
    head in a pass that scores several tokens under a mask, as every chain and tree round does (a
    one-token pass skips the copy); the copy grows with the context. torch's SDPA takes the grouped
    heads itself (``enable_gqa=True``). On the CPU the logits are the same bits (tested), so greedy
    output and every comparison with ``generate`` on the same model are unchanged. The setting is
    the model's own (``model.set_attn_implementation``), not the process's, as the
    ``TRANSFORMERS_SDPA_FORCE_GQA=1`` environment variable would be; tree scoring accepts it.

    Returns:
        a :class:`GroupedAttention` handle: ``restore()`` sets the previous implementation back.
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, _grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    previous = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation(GROUPED_SDPA)
    return GroupedAttention(model, previous)


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
    tree: bool = False,
    node_budget: int = 16,
):
    """``(draft_step, target_step)`` for :class:`specverify.SpeculativeDecoder`.

    ``draft`` is a causal LM (``torch.nn.Module``, e.g. a smaller model or :func:`early_exit`),
    the string ``"prompt_lookup"``, or any ``draft_step`` callable (used as is). ``tree=True``
    makes the model or prompt-lookup draft propose trees of up to ``node_budget`` nodes
    (:class:`CausalLMTreeDraft`, :class:`PromptLookupTreeDraft`; the decoder's ``k`` is then
    their depth) and the target score them in one forward. One
    :class:`Sampling` built from ``greedy, temperature, top_k, top_p, min_p`` is shared by the target
    and a model draft. ``generator`` drives the draft's own draws (not the verification's: give
    the decoder its own generator).

    Accepted types: ``target_model`` a ``transformers`` causal LM; ``greedy`` and ``tree`` bools
    (a string such as ``"False"`` raises a TypeError); ``temperature > 0``, ``top_k >= 0``,
    ``0 < top_p <= 1`` and ``0 <= min_p < 1`` numbers; ``generator`` a ``torch.Generator`` or
    ``None``; ``node_budget`` a positive integer. The target carries ``vocab_size`` and both model
    callbacks ``greedy``: a decoder whose ``greedy`` differs refuses them when it is built.

    Thread-safety: the pair follows one sequence; a second thread calling a callback while the
    first is inside it gets a RuntimeError saying each thread needs its own callbacks. Call this
    function once per thread (the models' weights are shared, not copied).

    Recovery: an exception or ``KeyboardInterrupt`` inside a callback (in a forward, say) drops
    that callback's KV cache; the next call rebuilds it, and its output is an uninterrupted run's.
    """
    _inputs.flag(tree, "tree")
    sampling = Sampling(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    target_step = CausalLMTarget(target_model, sampling)
    if isinstance(draft, torch.nn.Module):
        draft_step = CausalLMTreeDraft(draft, node_budget) if tree else CausalLMDraft(draft, sampling, generator)
    elif isinstance(draft, str):
        if draft != "prompt_lookup":
            raise ValueError(f"unknown draft {draft!r}: pass a model, 'prompt_lookup' or a callable")
        draft_step = PromptLookupTreeDraft(node_budget) if tree else PromptLookupDraft()
    elif callable(draft):
        draft_step = draft
    else:
        raise TypeError(f"draft must be a model, 'prompt_lookup' or a callable, got {type(draft).__name__}")
    return draft_step, target_step
