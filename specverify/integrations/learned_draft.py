"""A learned draft for SmolLM2-135M: one decoder layer reading the target's own features (EAGLE).

The draft (Li et al. 2024, "EAGLE"; reduced vocabulary as in FR-Spec, Zhao et al. 2025)::

    pair t      (h_t, x_{t+1})            h_t [d] the target's last-layer state at position t
                                          (the input of its final norm), x_{t+1} the next token
    input       a_t = fc([n_h(h_t) ; n_e(E[x_{t+1}])])        fc: [2d] -> [d], E the target's embeddings,
                                                              n_h, n_e two RMSNorms of the draft's own
    layer       f_t = DecoderLayer(a_0 .. a_t)                one Llama layer (SmolLM2's shape), own KV cache
    output      z_t = W_r norm(f_t)                            [V_r] logits over the reduced vocabulary
    law         q_t(v) = softmax(z_t)[v] for v in vocab_ids, 0 elsewhere   (a law over all V tokens)

``f_t`` stands in for ``h_{t+1}`` (trained to be close to it) and ``q_t`` for the target's
distribution of ``x_{t+2}``. Why the two norms (as EAGLE-3's): ``h_t`` has an RMS of ~30 with
channels up to ~4400 while ``E[x]`` has ~0.11, so without them the token reaches the layer as ~3 %
of its input and the head learns to ignore it (a Medusa head two tokens ahead: a random token in
place of the true one left its top-1 nearly unchanged); and a fed-back ``f`` is free in scale (the
feature loss compares normalized features), so later draft steps would see ever larger inputs.
Normalized, both halves enter at unit RMS at every step.

``norm`` is the target's frozen final RMSNorm and ``W_r`` its LM-head rows for the ``V_r`` tokens
most frequent in the target's own answers (``vocab_ids``): both are taken from the target when the
draft is built, so the shipped file holds only ``n_h``, ``n_e``, ``fc``, the layer and
``vocab_ids``. A drafted token outside the reduced vocabulary has draft probability 0: the draft's
rows are true distributions over the full vocabulary, and verification stays exact.

Drafting after a committed sequence ``x_0 .. x_{N-1}``: the target's hidden states ``h_0 ..
h_{N-2}`` are known from its last pass (:class:`~specverify.integrations.transformers.CachedCausalLM`
with ``keep_hidden=True``), so the pairs ``0 .. N-2`` are fed with true features (only the new
ones: the draft keeps its cache of true pairs across rounds); drafted token ``d_1`` then comes from
``q_{N-2}``, and every later draft step feeds ``(f, d_i)``, the draft's own feature in place of the
target's.

Pieces: :class:`FeatureHead` (the module; training and inference), :func:`load` /
:func:`save` (safetensors), :class:`HiddenTap` (the target's hidden states, by hooks),
:class:`LearnedDraft` (chain ``draft_step``: greedy, or sampled with its rows), :class:`HybridDraft`
(a trusted prompt-lookup match first, the learned draft otherwise), :class:`LearnedTreeDraft`
(an EAGLE-2 dynamic tree from the draft's probabilities, one batched draft call per level),
:func:`planned_draft` (the planner over prompt lookup and the learned drafts), :func:`learned_callbacks`
(the decoder's callbacks; the planner by default). Both drafts take a gate (``min_confidence``): a position is proposed
only while the draft's own estimate that it is reached and accepted stays above it, so a round
the draft is unsure of costs a plain step instead of a losing proposal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Optional, Tuple

import torch
from torch import nn

from .. import verify as ops
from ..decoding.tree_drafts import DraftTree, ancestor_mask, chain_parents, depths
from .transformers.speed import kernel_linear_applies
from .transformers import _add_children, _check_tree_shape, _common_prefix, _expand, _rerank

__all__ = ["FeatureHead", "DEFAULT_WEIGHTS", "DEFAULT_MIN_CONFIDENCE", "load", "save", "check_weights", "metadata", "HiddenTap", "LearnedDraft", "LearnedTreeDraft", "HybridDraft", "COMBINE", "planned_draft", "learned_callbacks"]

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "data" / "smollm2_draft.safetensors"


# -- the module ------------------------------------------------------------------------------
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: ``weight * x / sqrt(mean(x^2) + eps)`` over the last axis (in float32)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class FeatureHead(nn.Module):
    """fc + one Llama decoder layer over the target's features, then the target's frozen norm and
    reduced LM head.

    Args:
        config: the target's ``LlamaConfig`` (hidden size, heads, key/value heads, MLP width,
            rope theta, norm eps are read from it).
        vocab_ids: ``[V_r]`` int64, the full-vocabulary ids of the reduced head's rows (sorted).
    Frozen parts, not parameters (not saved; :meth:`attach` sets them from the target):
        ``embed`` ``[V, d]`` the target's input embeddings, ``norm_weight`` ``[d]`` its final
        norm, ``head`` ``[V_r, d]`` its LM-head rows ``vocab_ids``.
    """

    #: :meth:`logits` computes at most this many rows with :func:`specverify.linear`.
    FAST_ROWS = 16

    def __init__(self, config, vocab_ids: torch.Tensor):
        super().__init__()
        d = config.hidden_size
        self.d = d
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or d // self.n_heads
        self.eps = float(config.rms_norm_eps)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim),
                             persistent=False)
        self.register_buffer("vocab_ids", torch.as_tensor(vocab_ids, dtype=torch.int64).clone())
        self.feature_norm = nn.Parameter(torch.ones(d))  # n_h
        self.embed_norm = nn.Parameter(torch.ones(d))  # n_e
        self.fc = nn.Linear(2 * d, d, bias=True)
        self.input_norm = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.post_norm = nn.Parameter(torch.ones(d))
        self.gate_proj = nn.Linear(d, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, d, bias=False)
        self.embed = self.norm_weight = self.head = None  # set by attach()

    def attach(self, target) -> "FeatureHead":
        """Take the frozen parts from the target ``LlamaForCausalLM`` (a copy of the head's rows;
        the embeddings and norm are shared). Returns ``self``."""
        self.embed = target.model.embed_tokens.weight.detach()
        self.norm_weight = target.model.norm.weight.detach()
        self.head = target.lm_head.weight.detach()[self.vocab_ids].contiguous()  # [V_r, d]
        return self

    def init_from_layer(self, layer) -> None:
        """Start from a target decoder layer's weights (``fc`` as ``n_h(h) + n_e(E[x])``)."""
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(self, name).weight.copy_(getattr(layer.self_attn, name).weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(self, name).weight.copy_(getattr(layer.mlp, name).weight)
            self.input_norm.copy_(layer.input_layernorm.weight)
            self.post_norm.copy_(layer.post_attention_layernorm.weight)
            eye = torch.eye(self.d)
            self.fc.weight.copy_(torch.cat([eye, eye], dim=1))
            self.fc.bias.zero_()

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The target's final RMSNorm (frozen) of features ``[..., d]``."""
        return _rms_norm(x, self.norm_weight, self.eps)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x [B, heads, T, hd], positions [T]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return x * emb.cos() + _rotate_half(x) * emb.sin()

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                past: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, mask: Optional[torch.Tensor] = None,
                last_only: bool = False):
        """One pass over ``T`` new pairs: :meth:`layer`, then :meth:`logits` of its output.

        Returns:
            ``(f [B, T', d], logits [B, T', V_r], (keys, values) [B, kv_heads, S + T, hd])`` (see
            :meth:`layer`).
        """
        f, past = self.layer(features, tokens, positions, past=past, mask=mask, last_only=last_only)
        return f, self.logits(f), past

    def layer(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
              past: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, mask: Optional[torch.Tensor] = None,
              last_only: bool = False):
        """The draft's features over ``T`` new pairs, without the LM head (training takes the
        logits of the labelled rows only).

        Args:
            features: ``[B, T, d]`` float32, ``h_t`` (or the draft's own ``f``) of each pair.
            tokens: ``[B, T]`` int64, ``x_{t+1}`` of each pair.
            positions: ``[T]`` int64 rotary positions.
            past: ``(keys, values)`` ``[B, kv_heads, S, hd]`` of earlier pairs, or None.
            mask: ``[T, S + T]`` bool, True where a pair may attend; None = causal after all of past.
            last_only: ``f`` of the last pair only (``T' = 1``): catching the cache up needs every
                pair's keys and values but only the last pair's output, so the attention rows and
                the MLP of the others are skipped (and, in :meth:`forward`, their LM head, alone
                ~2/3 of a pair's work).
        Returns:
            ``(f [B, T', d], (keys, values) [B, kv_heads, S + T, hd])``, ``T' = T`` (or 1).
        """
        batch, t_new, _ = features.shape
        a = self.fc(torch.cat([_rms_norm(features, self.feature_norm, self.eps),
                               _rms_norm(self.embed[tokens], self.embed_norm, self.eps)], dim=-1))  # [B, T, d]
        x = _rms_norm(a, self.input_norm, self.eps)
        q = self.q_proj(x).view(batch, t_new, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, t_new, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, t_new, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = self._rope(q, positions), self._rope(k, positions)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if mask is None:
            s = k.shape[2] - t_new
            mask = torch.ones(t_new, s + t_new, dtype=torch.bool)
            mask[:, s:] = torch.ones(t_new, t_new, dtype=torch.bool).tril()
        if last_only:  # the last query row only
            q, mask, a, t_new = q[:, :, -1:], mask[-1:], a[:, -1:], 1
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        a = a + self.o_proj(att.transpose(1, 2).reshape(batch, t_new, -1))
        x = _rms_norm(a, self.post_norm, self.eps)
        f = a + self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))  # [B, T, d]
        return f, (k, v)

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        """``W_r norm(f)``: ``[..., d]`` features -> ``[..., V_r]`` logits over the reduced vocabulary.

        Through :func:`specverify.linear` for the few rows of a draft step (at most
        :attr:`FAST_ROWS`, float32 on the CPU, no gradient wanted): torch's matmul (2.13, one
        thread) reads the ``V_r x d`` rows once per feature row, ~3 ms for one row of 12288, over
        half a draft step; the kernel reads them once (~1 ms), as
        :func:`~.transformers.use_fast_linears` does for the layer's own linears. Many rows (a
        prefix caught up, training) stay with torch's blocked matmul, faster there."""
        x = self.final_norm(f)
        if x.numel() > self.FAST_ROWS * self.d or not kernel_linear_applies(x, self.head):
            return torch.nn.functional.linear(x, self.head)
        return ops.linear(x, self.head, None, num_threads=torch.get_num_threads())

    def own_state(self) -> dict:
        """The draft's own tensors (what is saved): fc, the layer, ``vocab_ids``."""
        return {k: v for k, v in self.state_dict().items()}


def save(head: FeatureHead, path, dtype=torch.bfloat16, meta: Optional[dict] = None) -> Path:
    """Write the draft's own tensors (floats as ``dtype``) and ``meta`` (JSON) to a safetensors file."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in head.own_state().items()}
    save_file(tensors, str(path), metadata={"specverify": json.dumps(meta or {}, sort_keys=True, default=str)})
    return path


def load(target, path=None) -> FeatureHead:
    """The draft stored at ``path`` (default :data:`DEFAULT_WEIGHTS`), attached to ``target``
    (a SmolLM2 ``LlamaForCausalLM``), float32, eval mode, linears on :func:`specverify.linear`.

    The file is checked before use (:func:`check_weights`): one :class:`ValueError` naming the
    file and the problem, rather than a failure far from the cause (repeated vocabulary ids, say,
    would hand the verifier a row that is not the law the token was drawn from)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .transformers import use_fast_linears

    path = Path(path) if path is not None else DEFAULT_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"no learned draft at {path}: train one with python -m experiments.end_to_end.train_draft")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    check_weights(tensors, target.config, path)
    head = FeatureHead(target.config, tensors["vocab_ids"])
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
    head.attach(target).eval().requires_grad_(False)
    use_fast_linears(head)
    return head


def check_weights(tensors: dict, config, path="the draft file") -> None:
    """Raise a ValueError naming ``path`` unless ``tensors`` hold exactly a :class:`FeatureHead`
    for ``config``: every expected tensor with its shape, floating weights that are finite, and
    ``vocab_ids`` a non-empty, strictly increasing int64 vector of ids in ``[0, V)``."""
    if not isinstance(tensors.get("vocab_ids"), torch.Tensor):
        raise ValueError(f"{path} does not hold a learned draft: no 'vocab_ids' tensor")
    ids = tensors["vocab_ids"]
    n_vocab = int(config.vocab_size)
    if ids.dtype != torch.int64 or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"{path}: vocab_ids must be a non-empty 1-D int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= n_vocab:
        raise ValueError(f"{path}: vocab_ids must lie in [0, {n_vocab}), got ids from {int(ids.min())} to {int(ids.max())}")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError(f"{path}: vocab_ids must be strictly increasing (sorted, no id twice): a repeated id "
                         "would give a drafted token two rows and break exact verification")
    with torch.device("meta"):
        expected = FeatureHead(config, torch.zeros(ids.numel(), dtype=torch.int64)).state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path} does not hold this FeatureHead: missing {missing}, unexpected {unexpected}"
                         + (" (a draft from before the normalized inputs: retrain it)"
                            if set(missing) <= {"feature_norm", "embed_norm"} else ""))
    for name, want in expected.items():
        have = tensors[name]
        if tuple(have.shape) != tuple(want.shape):
            raise ValueError(f"{path}: {name} has shape {tuple(have.shape)}, expected {tuple(want.shape)}")
        if name != "vocab_ids":
            if not have.is_floating_point():
                raise ValueError(f"{path}: {name} must be a floating tensor, got {have.dtype}")
            if not bool(torch.isfinite(have).all()):
                raise ValueError(f"{path}: {name} holds non-finite values (NaN or inf)")


def metadata(path=None) -> dict:
    """The JSON metadata stored with a draft file (training parameters, data, losses)."""
    from safetensors import safe_open

    with safe_open(str(Path(path) if path is not None else DEFAULT_WEIGHTS), "pt") as f:
        return json.loads((f.metadata() or {}).get("specverify", "{}"))


# -- drafting ------------------------------------------------------------------------------------
class HiddenTap:
    """The target's last-layer hidden states of the sequence its KV cache holds.

    Two hooks on the target model: a forward pre-hook on the model records where each forward
    starts (the length its cache already holds), the token ids it feeds and, for a forward with
    explicit positions (a tree forward of
    :meth:`~specverify.integrations.transformers.CachedCausalLM.tree_logits`), the tree its
    attention mask describes; one on its final norm keeps the norm's input ``[T, d]``.
    :meth:`features` applies the forwards in order and returns ``(hidden [M, d], tokens [M])``:
    ``hidden[t]`` is ``h_t`` of the sequence ``tokens`` (a function of ``tokens[: t + 1]`` only, so
    it holds for any sequence sharing that prefix). Only forwards over ``lm``'s own cache are
    taken: another user of the same model (``generate``, another target) is ignored, so it cannot
    make the tap forget the prefix ``lm``'s cache still holds (which would make the draft re-run
    the target over the whole prefix); a forward over a new cache of ``lm`` (after a reset)
    starts over. Batched forwards are ignored (``lm``'s forwards have batch 1).

    Trees: the fed rows of a tree forward (the fresh prefix tokens, then the nodes) form a tree
    below the held sequence: row ``r``'s parent is the deepest fed row it attends to, and the
    forward is taken only when row ``r`` attends to every held position, exactly its ancestors and
    itself, at position ``start + depth(r) - 1`` (what a plain forward over its path would see; any
    other mask keeps only the prefix before it). The tree's rows stay pending until
    :meth:`features` is given the sequence the decoder went on with: the rows of the path that
    sequence follows are appended (the cache's own compaction keeps the same path), so the next
    round's features need no recomputation. A later forward is checked against the tokens the
    cache then holds (``lm.tokens``): the tap keeps only what agrees with them.
    """

    def __init__(self, lm):
        self.lm = lm
        model = lm.model
        self.hidden = torch.empty(0, model.config.hidden_size)  # [M, d]
        self.tokens = torch.empty(0, dtype=torch.int64)  # [M]
        self.tree = None  # (ids [T], parents [T], rows [T, d]): a pending tree below self.tokens
        self._cache = None  # the cache of the forwards applied so far (by identity)
        self._pending = []  # [cache, start, ids [T], tree parents [T] / None / False, rows [T, d] / None, held] per forward
        self._handles = [model.register_forward_pre_hook(self._start, with_kwargs=True),
                         model.model.norm.register_forward_pre_hook(self._keep)]

    def _start(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if ids is None or ids.shape[0] != 1 or cache is not self.lm.cache:
            return  # another user of the model (a generate, another target's cache): not lm's sequence
        start = cache.get_seq_length() if cache is not None else 0
        tree = None
        if kwargs.get("position_ids") is not None:
            tree = _fed_tree(kwargs.get("attention_mask"), kwargs["position_ids"], start, ids.shape[1])
        held = self.lm.tokens.clone() if cache is not None and cache is self.lm.cache else None
        self._pending.append([cache, start, ids[0].detach().clone(), tree, None, held])

    def _keep(self, module, args) -> None:
        if self._pending and self._pending[-1][4] is None:  # the first norm call after the model's start
            self._pending[-1][4] = args[0][0].detach().float()

    def remove(self) -> None:
        """Take the hooks off the target."""
        for handle in self._handles:
            handle.remove()

    def _settle(self, seq: Optional[torch.Tensor]) -> None:
        """Append the pending tree's rows along the path ``seq`` ``[L]`` follows (none if ``seq`` is None)."""
        if self.tree is None:
            return
        ids, parents, rows = self.tree
        self.tree = None
        base = self.tokens.numel()
        if seq is None or _common_prefix(self.tokens, seq) < base:
            return
        children = {}
        for i, (p, t) in enumerate(zip(parents.tolist(), ids.tolist())):
            children.setdefault((p, t), i)
        node, path = -1, []
        for t in seq[base:].tolist():
            node = children.get((node, t))
            if node is None:
                break
            path.append(node)
        if path:
            self.hidden = torch.cat([self.hidden, rows[path]])
            self.tokens = torch.cat([self.tokens, ids[path]])

    def features(self, seq: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(hidden [M, d], tokens [M])`` after the target's forwards so far.

        ``seq`` ``[L]``: the sequence the decoder continues with; a pending tree (the last forward
        was a tree's) then contributes the rows of the path ``seq`` follows. Without it the tree
        stays pending and only what was known before its forward is returned (the prefix tokens
        fed with the tree are rows of that pending tree too).
        """
        for cache, start, ids, tree, rows, held in self._pending:
            same = cache is self._cache and cache is not None
            if held is not None and same:
                self._settle(held)  # the path the cache kept (it compacts before feeding)
            self.tree = None if not same else self.tree
            known = self.tokens.numel() if same else 0
            if held is not None:
                known = min(known, _common_prefix(self.tokens, held))
            self._cache = cache
            if rows is None or tree is False or start > known or rows.shape[0] != ids.numel():
                keep = min(known, start)  # what this forward did not touch
                self.hidden, self.tokens, self.tree = self.hidden[:keep], self.tokens[:keep], None
                continue
            self.hidden, self.tokens = self.hidden[:start], self.tokens[:start]
            if tree is None:  # a plain causal forward
                self.hidden, self.tokens, self.tree = torch.cat([self.hidden, rows]), torch.cat([self.tokens, ids]), None
            else:
                self.tree = (ids, tree, rows)
        self._pending = []
        if seq is not None:
            self._settle(torch.as_tensor(seq).reshape(-1))
        return self.hidden, self.tokens


def _fed_tree(mask, positions, start: int, n_fed: int):
    """The tree ``parents [T]`` of a forward's fed rows (the mask's view), or False when the mask is
    not a tree's: every row must attend to all ``start`` held positions, to exactly its ancestors
    and itself among the fed rows, and sit at ``start + depth - 1``. A row's parent is the deepest
    fed row it attends to. ``mask``: an additive ``[1, 1, T, start + T]`` mask (0 = attend) or a
    bool one, or None (causal); ``positions`` ``[1, T]``."""
    positions = positions.reshape(-1)
    if positions.numel() != n_fed:
        return False
    if mask is None:
        parents = torch.arange(-1, n_fed - 1, dtype=torch.int64)
    else:
        if mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (n_fed, start + n_fed):
            return False
        allowed = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0
        if not bool(allowed[:, :start].all()):
            return False
        fed = allowed[:, start:]  # [T, T]
        below = fed & torch.ones(n_fed, n_fed, dtype=torch.bool).tril(-1)
        idx = torch.arange(n_fed)
        parents = torch.where(below.any(1), (below * (idx[None, :] + 1)).max(1).values - 1, torch.tensor(-1))
        if not torch.equal(fed, ancestor_mask(parents)):
            return False
    if not torch.equal(positions, start - 1 + depths(parents)):
        return False
    return parents


class _PairCache:
    """What the learned drafts share: the target's hidden states (:class:`HiddenTap`) and the
    draft's KV cache of the true pairs ``(h_t, x_{t+1})``, kept across rounds (only new pairs are
    fed). ``target``: the verifying
    :class:`~specverify.integrations.transformers.CausalLMTarget`."""

    def __init__(self, head: FeatureHead, target):
        self.head = head
        self.lm = target.lm
        self.sampling = target.sampling
        self.greedy = bool(self.sampling.greedy)
        self.vocab_size = int(head.embed.shape[0])
        self.tap = HiddenTap(self.lm)
        self._past = None  # (keys, values) [1, kv, P, hd] of the true pairs 0 .. P-1
        self._pair_tokens = torch.empty(0, dtype=torch.int64)  # tokens 0 .. P the pairs were built on
        self.steps = 0
        self.proposed = 0

    def _sync(self, seq: torch.Tensor):
        """Feed the true pairs up to ``N - 2`` (``N = len(seq)``); return the last one's ``(f [d], logits [V_r])``."""
        n = seq.numel()
        hidden, known = self.tap.features(seq)
        if _common_prefix(known, seq) < n - 1:  # the target has not scored this prefix: let it
            self.lm.reset()  # (from scratch: positions its cache holds may be unknown to the tap)
            self.lm.logits(seq, 1)
            hidden, known = self.tap.features(seq)
        pairs = n - 1
        keep = max(0, min(_common_prefix(self._pair_tokens, seq) - 1, pairs - 1))
        past = None
        if keep and self._past is not None:
            past = (self._past[0][:, :, :keep], self._past[1][:, :, :keep])
        feats = hidden[keep:pairs][None]  # [1, T, d]
        f, logits, self._past = self.head(feats, seq[keep + 1 : pairs + 1][None], torch.arange(keep, pairs), past=past,
                                          last_only=True)
        self._pair_tokens = seq[: pairs + 1].clone()
        self.steps += 1
        return f[0, -1], logits[0, -1]


#: The gate :func:`learned_callbacks` sets (``min_confidence``) per mode, ``{"greedy": c, "sample": c}``,
#: as chosen for the draft before the normalized inputs (not yet retuned for the shipped one).
#: A drafted token costs ~0.1 of a plain step on SmolLM2 (a draft step 0.073, its row in the target
#: pass ~0.03), so a position pays when it is reached and accepted more often than that. Chosen on
#: prompts of the training kind the draft never saw (``python -m experiments.end_to_end.draft_eval
#: --prompt-sets tuning --skip-speed``: the gate statistic's calibration), never on the held-out sets:
#: greedy positions with ``c_i`` in [0.05, 0.1) were reached and accepted at 0.08, in [0.1, 0.2) at
#: 0.21; sampling ones (reached x overlap) in [0.2, 0.3) at 0.08, in [0.3, 0.5) at 0.16.
DEFAULT_MIN_CONFIDENCE = {"greedy": 0.1, "sample": 0.3}


def _mode_gate(min_confidence, greedy: bool):
    """The gate of one mode from a number, a ``{"greedy": c, "sample": c}`` mapping, or None
    (:data:`DEFAULT_MIN_CONFIDENCE`); a mapping's unknown or missing key is named."""
    gates = DEFAULT_MIN_CONFIDENCE if min_confidence is None else min_confidence
    if not isinstance(gates, Mapping):
        return gates
    mode = "greedy" if greedy else "sample"
    unknown = sorted(map(repr, set(gates) - set(DEFAULT_MIN_CONFIDENCE)))
    if unknown or mode not in gates:
        problem = f"unknown key {', '.join(unknown)}" if unknown else f"no {mode!r} key (the gate of this mode)"
        raise ValueError(f"min_confidence as a mapping takes the keys 'greedy' and 'sample': {problem}, "
                         f"got {dict(gates)!r}")
    return gates[mode]


def _check_callbacks(head, tree, generator) -> None:
    """learned_callbacks' own arguments, checked before anything is built (the sampling ones are
    :class:`Sampling`'s, the gate :func:`_mode_gate`'s and :func:`_check_gate`'s)."""
    from ..kernels import _inputs

    _inputs.flag(tree, "tree")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__} {generator!r}")
    if head is not None and (not isinstance(head, FeatureHead) or head.head is None):
        raise ValueError("head must be a FeatureHead attached to the target (head.attach(target_model); load() "
                         f"attaches), got {'an unattached FeatureHead' if isinstance(head, FeatureHead) else repr(head)}")


def _check_gate(min_confidence) -> float:
    if isinstance(min_confidence, bool) or not isinstance(min_confidence, (int, float)) or not 0 <= min_confidence < 1:
        raise ValueError(f"min_confidence must be a number in [0, 1), got {min_confidence!r}")
    return float(min_confidence)


class LearnedDraft(_PairCache):
    """``draft_step(prefix, k, stop=None) -> (tokens [j], probs [j, V] or None)`` from a
    :class:`FeatureHead` reading the target's own hidden states (EAGLE), j <= k.

    ``target`` is the :class:`~specverify.integrations.transformers.CausalLMTarget` that verifies
    (its cache and hidden states are shared: the draft reads ``h_t`` of every position the target
    has scored). When the target has not seen the prefix yet (the first round), the draft runs it
    over the prefix first (the target's next call reuses that cache). The draft keeps its own
    cache of the true pairs ``(h_t, x_{t+1})`` across rounds and feeds only the new ones; drafted
    pairs are dropped after each round. Greedy (``sampling.greedy``): tokens are argmaxes over the
    reduced vocabulary and ``probs`` is None. Sampling: ``probs[i]`` is the draft's row ``q_i``
    ``[V]`` (``sampling``'s warp over the reduced vocabulary, zero outside it) and ``tokens[i]`` is
    drawn from it with ``generator``. ``stop(i, confidence)`` as in
    :class:`~specverify.integrations.transformers.CausalLMDraft`.

    ``min_confidence`` (the gate, 0 = off): position ``i`` is proposed only if
    ``c_i = q_1(t_1) ... q_{i-1}(t_{i-1}) * max q_i`` -- the draft's own estimate that the
    round reaches and accepts it -- is at least ``min_confidence``; the proposal ends at the
    first position that fails, and may be empty (the round is then a plain target step). ``q``
    is the draft's softmax over the reduced vocabulary (greedy) or its warped row (sampling).
    The decision reads the tokens before ``i`` and the row ``q_i``, never ``t_i`` itself, so
    verification stays exact (:mod:`specverify.decoding.adaptive`'s claim); unlike the policy's
    ``stop``, which keeps the token it stops after, the gate can leave a round without a draft,
    where a proposal that will most likely be rejected would cost more than it gains. ``gate(i,
    path, top) -> bool`` (a :class:`~specverify.decoding.planner.Planner`'s position-by-position
    rule, with ``path = q_1(t_1) ... q_{i-1}(t_{i-1})`` and ``top = max q_i``): asked before each
    ``t_i`` is drawn, the proposal ends where it says False, like ``min_confidence``. Counters:
    ``steps`` (draft forwards), ``proposed`` (tokens), ``empty`` (calls the gate left without a
    token); ``last_logits`` ``[j, V_r]`` of the latest proposal. Not thread-safe (one decoder at
    a time, as the target).
    """

    def __init__(self, head: FeatureHead, target, generator: Optional[torch.Generator] = None,
                 min_confidence: float = 0.0):
        super().__init__(head, target)
        self.generator = generator
        self.min_confidence = _check_gate(min_confidence)
        self.empty = 0

    @torch.inference_mode()
    def __call__(self, prefix: torch.Tensor, k: int, stop=None, gate=None):
        seq = torch.as_tensor(prefix).reshape(-1).to(torch.int64)
        n = seq.numel()
        if n < 2:  # a pair needs a token after a position
            return seq[:0], None
        f, z = self._sync(seq)
        past = self._past
        ids = self.head.vocab_ids
        tokens = torch.empty(k, dtype=torch.int64)
        probs = None if self.greedy else torch.zeros(k, self.vocab_size, dtype=torch.float32)
        logits = torch.empty(k, z.numel())
        floor = self.min_confidence
        tops = floor or gate is not None  # whether max q_i is needed
        path = 1.0  # q_1(t_1) ... q_i(t_i): the draft's probability of the tokens drafted so far
        drawn = k
        for i in range(k):
            logits[i] = z
            if self.greedy:
                j = int(torch.argmax(z))
                confidence = float(torch.softmax(z.double(), 0)[j]) if stop is not None or tops else 1.0
                top = confidence
            else:
                row = self.sampling.rows(z[None])[0]  # [V_r], warped like the target's rows
                total = row.sum()
                top = float(row.max() / total) if tops else 1.0
            if floor and path * top < floor or gate is not None and not gate(i, path, top):  # before t_i is drawn
                drawn = i
                break
            if not self.greedy:
                j = int(torch.multinomial(row, 1, generator=self.generator))
                probs[i, ids] = row
                confidence = float(row[j] / total)
            tokens[i] = ids[j]
            path *= confidence
            if stop is not None and stop(i, confidence):
                drawn = i + 1
                break
            if floor and path < floor:  # no later position can pass: skip the draft step
                drawn = i + 1
                break
            if i + 1 < k:  # the next pair: the draft's own feature and the token just drafted
                f3, z3, past = self.head(f[None, None], tokens[i : i + 1][None], torch.tensor([n - 1 + i]), past=past)
                f, z = f3[0, -1], z3[0, -1]
                self.steps += 1
        self.proposed += drawn
        self.empty += drawn == 0
        self.last_logits = logits[:drawn]  # [j, V_r] (diagnostics)
        return tokens[:drawn].clone(), None if probs is None else probs[:drawn].clone()


class LearnedTreeDraft(_PairCache):
    """``draft_step(prefix, k) -> DraftTree``: an EAGLE-2 dynamic tree from the :class:`FeatureHead`.

    As :class:`~specverify.integrations.transformers.CausalLMTreeDraft`, with the learned draft's
    pairs in place of a draft model's tokens. After the true pairs are synced (as
    :class:`LearnedDraft`: the target's hidden states, the draft's cache of true pairs kept across
    rounds), the last true pair's logits give the root's children. At each depth the ``top_k``
    most likely children of every frontier node (softmax over the reduced vocabulary at
    ``temperature``) are scored by the product of draft probabilities along their path; the
    ``beam`` best are expanded by ONE :class:`FeatureHead` call over those nodes: node ``c``'s pair
    is ``(f_parent, token_c)`` (``f`` of the root is the last true pair's), at position
    ``N - 2 + depth(c)`` (``N = len(prefix)``), attending to every true pair, its expanded
    ancestors and itself (tree attention over the draft's own KV: ``[P + E, ...]``, the true
    pairs then the expanded nodes). After ``k`` levels every candidate competes by that product
    and the best ``node_budget`` form the tree (the same rerank as
    :class:`~specverify.integrations.transformers.CausalLMTreeDraft`: ancestors score at least as high as their children, so the kept set is a tree).

    ``children`` says how a node's children are chosen. ``"top_k"`` (the default): the ``top_k``
    most likely, deterministic (``probs=None``, verified by sample-and-match) in greedy and
    sampling mode alike, so the decoder's output law is the target's whatever the draft proposes.
    In sampling mode the children may instead be *drawn* from the node's warped row ``q`` (zero
    outside the reduced vocabulary) with ``generator``, and the tree carries the rows
    (``probs [N + 1, V]``) for :func:`specverify.accept_tree`'s stochastic rules:
    ``"without_replacement"`` (one after another, siblings distinct, by Gumbel-top-k: recursive
    rejection sampling, EAGLE / Jeon et al. 2024) or ``"with_replacement"`` (i.i.d.; SpecInfer's
    rule; :attr:`~specverify.decoding.tree_drafts.DraftTree.replacement` set). A drawn tree is never
    reranked (dropping a drawn child for its own probability would bias what is kept): each level
    expands the ``beam`` drawn nodes of highest path probability, which draw up to ``top_k``
    children each while ``node_budget`` lasts, best node first. Every choice of shape reads the
    path to a node (its own token included) and other nodes' draws, never the node's own
    children, so verification stays exact.
    Tree nodes' pairs are dropped after the call (the cache keeps the true pairs only); after the
    target scores the tree, :class:`HiddenTap` takes the hidden rows of the path the decoder
    accepted from that forward. Counters: ``steps`` (draft forwards), ``proposed`` (nodes);
    ``last_logits`` (diagnostics): ``{token path (tuple): logits [V_r]}`` of the root (``()``) and
    every expanded node of the latest call. Not thread-safe (one decoder at a time, as the target).

    ``temperature`` is the top-k ranking's softmax temperature (drawn children use ``sampling``'s
    warp, as the target's rows).

    ``min_confidence`` (the gate, 0 = off): only candidates whose path probability is at least
    ``min_confidence`` compete for the ``node_budget`` (a node's path probability is at most its
    parent's, so they still form a tree) and only they are expanded; the tree may be empty (a
    plain target step). Any rule that shapes a tree of deterministic children keeps verification
    exact. Drawn children: a node stops drawing before child ``j`` when its path probability
    times the largest probability left to draw (``max q`` without the children drawn before it,
    renormalized; ``max q`` with replacement) is below the gate, the chain's rule decided before
    the draw. ``empty`` counts the calls the gate left without a node.
    """

    CHILDREN = ("top_k", "without_replacement", "with_replacement")

    def __init__(self, head: FeatureHead, target, node_budget: int = 16, top_k: int = 4, beam: int = 4,
                 temperature: float = 1.0, min_confidence: float = 0.0, children: str = "top_k",
                 generator: Optional[torch.Generator] = None):
        _check_tree_shape(node_budget, top_k, beam, temperature)
        if children not in self.CHILDREN:
            raise ValueError(f"children must be one of {self.CHILDREN}, got {children!r}")
        super().__init__(head, target)
        if children != "top_k" and self.greedy:
            raise ValueError(f"children={children!r} draws from the draft's rows: it needs a sampling target "
                             "(greedy verification matches tokens; use children='top_k')")
        self.node_budget, self.top_k, self.beam, self.temperature = int(node_budget), int(top_k), int(beam), temperature
        self.min_confidence = _check_gate(min_confidence)
        self.children, self.generator = children, generator
        self.empty = 0

    @torch.inference_mode()
    def __call__(self, prefix: torch.Tensor, k: int) -> DraftTree:
        seq = torch.as_tensor(prefix).reshape(-1).to(torch.int64)
        n = seq.numel()
        if n < 2 or k < 1:  # a pair needs a token after a position
            return DraftTree(seq[:0], seq[:0])
        f, z = self._sync(seq)
        if self.children != "top_k":
            return self._count(self._drawn_tree(n, f, z, k))
        ids = self.head.vocab_ids
        past = self._past  # the true pairs [1, kv, P, hd], then the expanded nodes
        n_pairs = past[0].shape[2]
        tokens, parents, scores = [], [], []  # every candidate: [C] token, parent, log path probability
        expanded = []  # candidates expanded so far, in order (their draft KV follows the true pairs')
        frontier = [(-1, 0.0, f, z)]  # (candidate id, log path probability, feature [d], logits [V_r])
        paths, self.last_logits = {-1: ()}, {}
        log_gate = math.log(self.min_confidence) if self.min_confidence else -math.inf
        for depth in range(k):
            level = []
            for cand, score, _, logits in frontier:
                self.last_logits[paths[cand]] = logits
                logp = torch.log_softmax(logits / self.temperature, dim=-1)
                for c in _add_children(tokens, parents, scores, cand, score, logp, self.top_k, ids):
                    level.append(c)
                    paths[c] = paths[cand] + (tokens[c],)
            if self.min_confidence:  # a node's children score at most its own: only passing nodes grow
                level = [c for c in level if scores[c] >= log_gate]
            if depth == k - 1 or not level:
                break
            frontier, past = self._expand_level(level, frontier, tokens, parents, scores, expanded, past, n_pairs,
                                                n - 1 + depth)
        budget = min(self.node_budget, sum(score >= log_gate for score in scores))
        return self._count(_rerank(tokens, parents, scores, budget))

    def _expand_level(self, level, frontier, tokens, parents, scores, expanded, past, n_pairs: int, position: int):
        """Expand the ``beam`` best candidates of ``level`` (appended to ``expanded``) by ONE head
        call: candidate ``c``'s pair is ``(f of its parent, tokens[c])`` at ``position``, attending to
        the ``n_pairs`` true pairs, its expanded ancestors and itself. Returns the next frontier
        ``[(candidate, score, f [d], logits [V_r])]``, best first, and the draft's grown KV."""
        best, start, tree_parents = _expand(level, scores, parents, expanded, self.beam)
        feature = {c: feat for c, _, feat, _ in frontier}  # a candidate's pair reads its parent's f
        allowed = torch.ones(len(best), n_pairs + len(expanded), dtype=torch.bool)  # [B, P + E]
        allowed[:, n_pairs:] = ancestor_mask(tree_parents)[start:]
        feats = torch.stack([feature[parents[c]] for c in best])[None]  # [1, B, d]
        f3, z3, past = self.head(feats, torch.tensor([[tokens[c] for c in best]]), torch.tensor([position] * len(best)),
                                 past=past, mask=allowed)
        self.steps += 1
        return [(c, scores[c], f3[0, i], z3[0, i]) for i, c in enumerate(best)], past

    def _count(self, tree: DraftTree) -> DraftTree:
        self.proposed += tree.n_nodes
        self.empty += tree.n_nodes == 0
        return tree

    def _draw(self, row: torch.Tensor, m: int) -> list:
        """``m`` entries of ``row`` ``[V_r]`` (a warped draft row), in draw order: one after another
        without replacement (Gumbel-top-k: the order of ``log q + Gumbel`` keys is a sequential
        draw without replacement, Kool et al. 2019) or i.i.d."""
        if self.children == "with_replacement":
            return torch.multinomial(row, m, replacement=True, generator=self.generator).tolist()
        u = torch.rand(row.numel(), dtype=torch.float64, generator=self.generator)
        keys = torch.log(row.double()) - torch.log(-torch.log1p(-u))  # -log(1 - u): u = 0 is drawn, 1 never
        return torch.topk(keys, m).indices.tolist()  # q = 0 entries have key -inf: m <= support

    def _gate_stops(self, score: float, q: torch.Tensor, drawn: list) -> int:
        """How many of ``drawn`` (a node's children, in draw order) pass the gate: child ``j`` is
        kept while ``exp(score) * max q^(j)`` is at least it (``q^(j)``: ``q`` without the
        children before ``j``, renormalized; ``q`` itself with replacement)."""
        if not self.min_confidence:
            return len(drawn)
        left, taken = q.clone(), 0
        for j in drawn:
            if math.exp(score) * float(left.max() / left.sum()) < self.min_confidence:
                break
            taken += 1
            if self.children == "without_replacement":
                left[j] = 0.0
        return taken

    def _drawn_tree(self, n: int, f: torch.Tensor, z: torch.Tensor, k: int) -> DraftTree:
        """The tree of drawn children (``children`` not ``"top_k"``); see the class docstring."""
        ids = self.head.vocab_ids
        past = self._past
        n_pairs = past[0].shape[2]
        tokens, parents, scores = [], [], []  # every node: token, parent, log path probability
        rows = {}  # node -> its warped row [V_r] (the law its children were drawn from); -1 the root
        expanded = []
        frontier = [(-1, 0.0, f, z)]
        paths, self.last_logits = {-1: ()}, {}
        log_gate = math.log(self.min_confidence) if self.min_confidence else -math.inf
        for depth in range(k):
            level = []
            for cand, score, _, logits in frontier:  # best path first: it draws first
                self.last_logits[paths[cand]] = logits
                row = self.sampling.rows(logits[None])[0]
                rows[cand] = row
                q = row / row.sum()
                m = min(self.top_k, self.node_budget - len(tokens), int((q > 0).sum()))
                drawn = self._draw(q, m) if m > 0 else []
                for j in drawn[: self._gate_stops(score, q, drawn)]:
                    tokens.append(int(ids[j]))
                    parents.append(cand)
                    scores.append(score + math.log(float(q[j])))
                    level.append(len(tokens) - 1)
                    paths[len(tokens) - 1] = paths[cand] + (int(ids[j]),)
            if self.min_confidence:  # a node below the gate has no child that passes: not worth a draft call
                level = [c for c in level if scores[c] >= log_gate]
            if depth == k - 1 or not level or len(tokens) >= self.node_budget:
                break
            frontier, past = self._expand_level(level, frontier, tokens, parents, scores, expanded, past, n_pairs,
                                                n - 1 + depth)  # best path first
        probs = torch.zeros(len(tokens) + 1, self.vocab_size, dtype=torch.float32)  # [N + 1, V]
        for r in range(len(tokens) + 1):  # a leaf's row is not read: the root's stands in
            probs[r, ids] = rows.get(r - 1, rows[-1])
        return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64), probs,
                         replacement=self.children == "with_replacement")


class HybridDraft:
    """A trusted prompt-lookup match first, the learned draft otherwise.

    ``lookup`` is a :class:`~specverify.integrations.transformers.PromptLookupDraft`; its proposal
    is taken when its match is of order at least ``min_ngram`` and not contradicted
    (:meth:`~specverify.integrations.transformers.PromptLookupDraft.context`: the n-gram's latest
    earlier occurrence was followed by the same token as the copied one); otherwise ``learned``
    drafts. Why single tokens count (``min_ngram = 1``): a lookup proposal costs nothing to
    draft, and on SmolLM2's greedy texts an uncontradicted one-token match was right 36 times in
    104, above the learned draft's first-position rate (0.19 on the held-out prompts), while a
    contradicted match was right 8 times in 114, below it. Both proposals verify exactly (a
    lookup proposal is a point mass). With a :class:`LearnedTreeDraft` the lookup's chain is
    returned as a tree (a chain is the tree ``parents = [-1, 0, ..., j - 2]``, deterministic
    children), so every round is a tree round.

    :meth:`context` tells a policy (:class:`~specverify.decoding.adaptive.AdaptiveK`) which of the two
    drafts the round's proposal comes from: the lookup's match context, or :data:`LEARNED_CONTEXT`.
    Without it a policy pools the two, and the learned draft's rejections price the lookup's
    copies out as well (a hybrid under ``AdaptiveK`` drafted 0.42 tokens per pass where lookup
    alone drafted 2.62). Counters: ``lookup_rounds``, ``learned_rounds``.
    """

    #: :meth:`context` of a prefix the learned draft proposes from (lookup's contexts are >= 0).
    LEARNED_CONTEXT = -1

    def __init__(self, learned, lookup, min_ngram: int = 1):
        if isinstance(min_ngram, bool) or int(min_ngram) != min_ngram or not 1 <= min_ngram <= lookup.max_ngram:
            raise ValueError(f"min_ngram must be an integer in [1, {lookup.max_ngram}], got {min_ngram!r}")
        self.learned = learned
        self.lookup = lookup
        self.min_ngram = int(min_ngram)
        self.greedy = learned.greedy
        self.vocab_size = learned.vocab_size
        self.lookup_rounds = 0
        self.learned_rounds = 0

    def _trusted(self, context: int) -> bool:
        return self.min_ngram <= context <= self.lookup.max_ngram

    def context(self, prefix: torch.Tensor) -> int:
        """The lookup's context of ``prefix`` when its match is trusted, else :data:`LEARNED_CONTEXT`."""
        context = self.lookup.context(prefix)
        return context if self._trusted(context) else self.LEARNED_CONTEXT

    def first_token(self, prefix: torch.Tensor) -> Optional[int]:
        """The lookup's first token when its match is trusted (for a policy's hindsight); None
        when the learned draft would propose (its first token needs a draft forward)."""
        return self.lookup.first_token(prefix) if self._trusted(self.lookup.context(prefix)) else None

    def __call__(self, prefix: torch.Tensor, k: int, stop=None):
        if self._trusted(self.lookup.context(prefix)):
            tokens, _ = self.lookup(prefix, k)
            if tokens.numel():
                self.lookup_rounds += 1
                if isinstance(self.learned, LearnedTreeDraft):
                    return DraftTree(tokens, chain_parents(tokens.numel()))
                return tokens, None  # a point mass: verified exactly in either mode
        self.learned_rounds += 1
        if isinstance(self.learned, LearnedTreeDraft):
            return self.learned(prefix, k)
        return self.learned(prefix, k, stop=stop)


#: How :func:`learned_callbacks` combines the learned draft with prompt lookup.
COMBINE = ("planned", "hybrid", "alone")


def planned_draft(head: FeatureHead, target, *, costs=None, generator: Optional[torch.Generator] = None,
                  tree: bool = False, node_budget: int = 16, tree_top_k: int = 4, beam: int = 4, k_max: int = 8,
                  k_learned: int = 4, lookup=None, **planner_args):
    """A :class:`~specverify.decoding.planner.Planner` over ``lookup`` (default
    :class:`~.transformers.PromptLookupDraft`, deterministic: drafted every round), the
    :class:`LearnedDraft` of ``head`` reading ``target`` (a
    :class:`~.transformers.CausalLMTarget`; gated by the planner, its own ``min_confidence``
    off) and, ``tree=True``, a :class:`LearnedTreeDraft` with deterministic top-k children
    (valued from its history: run only in rounds that choose it). Each round it proposes the
    trusted lookup copy, the learned chain (drafted position by position while its rows say it
    pays), the learned tree, or nothing, whichever has the most expected tokens per unit of
    ``costs`` (:class:`specverify.law.MeasuredCosts`, whose draft names are the candidates':
    ``"lookup"``, ``"learned"``, ``"learned_tree"``, as ``python -m
    specverify.integrations.calibrate --learned`` measures them; None: learned from the decoder's
    timings). ``k_max``: the longest proposal (a lookup copy); ``k_learned``: the learned chain's
    (the tree's depth), whose positions beyond the first few rarely pay. ``planner_args`` go to
    the planner (``explore_every``, ``carry``, ``prior_rate``, ...). Decode with
    ``SpeculativeDecoder(planner, target, k="auto")`` (or an integer ``k`` capping ``k_max``)."""
    from ..decoding.planner import Candidate, Planner
    from .transformers import PromptLookupDraft

    for name, value in (("k_max", k_max), ("k_learned", k_learned)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    k_learned = min(k_learned, k_max)
    candidates = [Candidate("lookup", lookup if lookup is not None else PromptLookupDraft(), deterministic=True,
                            k_max=k_max),
                  Candidate("learned", LearnedDraft(head, target, generator=generator), k_max=k_learned)]
    if tree:
        candidates.append(Candidate("learned_tree", LearnedTreeDraft(head, target, node_budget=node_budget,
                                                                     top_k=tree_top_k, beam=beam), k_max=k_learned))
    return Planner(candidates, costs, k_max=k_max, **planner_args)


def learned_callbacks(target_model, head: Optional[FeatureHead] = None, *, combine: str = "planned",
                      greedy: bool = True, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      min_p: float = 0.0, generator: Optional[torch.Generator] = None, tree: bool = False,
                      node_budget: int = 16, tree_top_k: int = 4, beam: int = 4, tree_children: str = "top_k",
                      min_confidence=None, costs=None):
    """``(draft_step, target_step)`` for :class:`specverify.SpeculativeDecoder` with the learned
    draft (``head``, default :func:`load` of the shipped weights) and prompt lookup, combined as
    ``combine`` says:

    - ``"planned"`` (default): :func:`planned_draft`, the planner choosing each round between
      lookup's copy, the learned chain (with ``tree=True`` also the learned tree) and nothing by
      expected tokens per unit of ``costs`` (:class:`specverify.law.MeasuredCosts`, or None:
      learned from the decoder's timings). The planner is also the draft-length policy: decode
      with ``k="auto"`` (its ``k_max``, 8) or an integer ``k`` (the longest proposal).
    - ``"hybrid"``: :class:`HybridDraft`, the fixed rule (a trusted lookup match first, the
      learned draft otherwise, gated by ``min_confidence``).
    - ``"alone"``: the learned draft only (gated by ``min_confidence``).

    Sampling arguments as in :func:`~specverify.integrations.transformers.speculative_callbacks`.
    ``tree=True``: the learned draft is a :class:`LearnedTreeDraft` of up to ``node_budget`` nodes,
    ``tree_top_k`` children per expanded node and ``beam`` expanded nodes per level (the decoder's
    ``k`` is then the tree's depth); ``tree_children``: how a node's children are chosen
    (:class:`LearnedTreeDraft`'s ``children``: ``"top_k"``, deterministic, in which case
    ``generator`` is unused; ``"without_replacement"`` or ``"with_replacement"``, drawn with
    ``generator``, sampling only; the planner's tree has top-k children). ``min_confidence``: the
    learned draft's gate of the fixed rules (:class:`LearnedDraft`, :class:`LearnedTreeDraft`; 0:
    off; a ``{"greedy": c, "sample": c}`` mapping: the mode's; None: :data:`DEFAULT_MIN_CONFIDENCE`'s);
    the planner gates on its own estimates and takes none."""
    from ..law.costs import MeasuredCosts
    from .transformers import CausalLMTarget, PromptLookupDraft, Sampling

    if not isinstance(combine, str) or combine not in COMBINE:
        raise ValueError(f"combine must be one of {', '.join(map(repr, COMBINE))}, got {combine!r}")
    _check_callbacks(head, tree, generator)
    if combine == "planned":
        for name, value, default in (("min_confidence", min_confidence, None), ("tree_children", tree_children, "top_k")):
            if value != default:
                raise ValueError(f"{name} is not used by combine='planned' (the planner gates the learned draft on "
                                 f"its own estimates; its tree has top-k children), got {value!r}: leave it out, "
                                 f"or use combine='hybrid' or 'alone'")
        MeasuredCosts.check(costs)  # before the model and head are loaded
    elif costs is not None:
        raise ValueError(f"costs are used by combine='planned' only, got combine={combine!r} with costs")
    sampling = Sampling(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    gate = None if combine == "planned" else _check_gate(_mode_gate(min_confidence, greedy))
    head = head if head is not None else load(target_model)
    target_step = CausalLMTarget(target_model, sampling)
    if combine == "planned":
        return planned_draft(head, target_step, costs=costs, generator=generator, tree=tree, node_budget=node_budget,
                             tree_top_k=tree_top_k, beam=beam), target_step
    if tree:
        draft_step = LearnedTreeDraft(head, target_step, node_budget=node_budget, top_k=tree_top_k, beam=beam,
                                      min_confidence=gate, children=tree_children, generator=generator)
    else:
        draft_step = LearnedDraft(head, target_step, generator=generator, min_confidence=gate)
    if combine == "hybrid":
        draft_step = HybridDraft(draft_step, PromptLookupDraft())
    return draft_step, target_step
