"""The KV-cached model (:class:`CachedCausalLM`: one cache that follows a sequence, rolled back
after a rejection; a whole draft tree scored in one forward) and the target callback
(:class:`CausalLMTarget`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
from typing import Optional

import torch

from ...decoding.tree_drafts import ancestor_mask, check_parents, depths, path_to
from .sampling import Sampling
from .speed import GROUPED_SDPA


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
