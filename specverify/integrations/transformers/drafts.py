"""Chain drafts: a causal LM drawing token by token (:class:`CausalLMDraft`, or the target's
first layers, :func:`early_exit`) and prompt lookup (:class:`PromptLookupDraft`)."""

from __future__ import annotations

import copy
from typing import List, Optional, Tuple

import torch

from .sampling import Sampling
from .target import CachedCausalLM, _as_tokens


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
