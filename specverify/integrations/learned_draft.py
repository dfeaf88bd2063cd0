"""A learned draft for SmolLM2-135M: one decoder layer reading the target's own features (EAGLE).

The draft (Li et al. 2024, "EAGLE"; reduced vocabulary as in FR-Spec, Zhao et al. 2025)::

    pair t      (h_t, x_{t+1})            h_t [d] the target's last-layer state at position t
                                          (the input of its final norm), x_{t+1} the next token
    input       a_t = fc([h_t ; E[x_{t+1}]])                  fc: [2d] -> [d], E the target's embeddings
    layer       f_t = DecoderLayer(a_0 .. a_t)                one Llama layer (SmolLM2's shape), own KV cache
    output      z_t = W_r norm(f_t)                            [V_r] logits over the reduced vocabulary
    law         q_t(v) = softmax(z_t)[v] for v in vocab_ids, 0 elsewhere   (a law over all V tokens)

``f_t`` stands in for ``h_{t+1}`` (trained to be close to it) and ``q_t`` for the target's
distribution of ``x_{t+2}``. ``norm`` is the target's frozen final RMSNorm and ``W_r`` its LM-head
rows for the ``V_r`` most frequent tokens of the training text (``vocab_ids``): both are taken from
the target when the draft is built, so the shipped file holds only ``fc``, the layer and
``vocab_ids``. A drafted token outside the reduced vocabulary has draft probability 0: the draft's
rows are true distributions over the full vocabulary, and verification stays exact.

Drafting after a committed sequence ``x_0 .. x_{N-1}``: the target's hidden states ``h_0 ..
h_{N-2}`` are known from its last pass (:class:`~specverify.integrations.transformers.CachedCausalLM`
with ``keep_hidden=True``), so the pairs ``0 .. N-2`` are fed with true features (only the new
ones: the draft keeps its cache of true pairs across rounds); drafted token ``d_1`` then comes from
``q_{N-2}``, and every later draft step feeds ``(f, d_i)``, the draft's own feature in place of the
target's.

Pieces: :class:`FeatureHead` (the module; training and inference), :func:`load` /
:func:`save` (safetensors), :class:`LearnedDraft` (chain ``draft_step``: greedy, or sampled with
its rows), :class:`LearnedTreeDraft` (EAGLE-2 dynamic tree), :class:`HybridDraft` (a trusted
prompt-lookup match first, the learned draft otherwise).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import nn

__all__ = ["FeatureHead", "DEFAULT_WEIGHTS", "load", "save", "LearnedDraft", "LearnedTreeDraft", "HybridDraft"]

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
        """Start from a target decoder layer's weights (``fc`` as ``h + E[x]``)."""
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

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x [B, heads, T, hd], positions [T]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return x * emb.cos() + _rotate_half(x) * emb.sin()

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                past: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, mask: Optional[torch.Tensor] = None):
        """One pass over ``T`` new pairs.

        Args:
            features: ``[B, T, d]`` float32, ``h_t`` (or the draft's own ``f``) of each pair.
            tokens: ``[B, T]`` int64, ``x_{t+1}`` of each pair.
            positions: ``[T]`` int64 rotary positions.
            past: ``(keys, values)`` ``[B, kv_heads, S, hd]`` of earlier pairs, or None.
            mask: ``[T, S + T]`` bool, True where a pair may attend; None = causal after all of past.
        Returns:
            ``(f [B, T, d], logits [B, T, V_r], (keys, values) [B, kv_heads, S + T, hd])``.
        """
        batch, t_new, _ = features.shape
        a = self.fc(torch.cat([features, self.embed[tokens]], dim=-1))  # [B, T, d]
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
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        a = a + self.o_proj(att.transpose(1, 2).reshape(batch, t_new, -1))
        x = _rms_norm(a, self.post_norm, self.eps)
        f = a + self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))  # [B, T, d]
        logits = torch.nn.functional.linear(_rms_norm(f, self.norm_weight, self.eps), self.head)  # [B, T, V_r]
        return f, logits, (k, v)

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
    (a SmolLM2 ``LlamaForCausalLM``), float32, eval mode, linears on :func:`specverify.linear`."""
    from safetensors.torch import load_file

    from .transformers import use_fast_linears

    path = Path(path) if path is not None else DEFAULT_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"no learned draft at {path}: train one with python -m experiments.train_draft")
    tensors = load_file(str(path))
    head = FeatureHead(target.config, tensors["vocab_ids"])
    missing, unexpected = head.load_state_dict({k: v.float() if v.is_floating_point() else v
                                                for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path} does not hold a FeatureHead: missing {missing}, unexpected {unexpected}")
    head.attach(target).eval().requires_grad_(False)
    use_fast_linears(head)
    return head


def metadata(path=None) -> dict:
    """The JSON metadata stored with a draft file (training parameters, data, losses)."""
    from safetensors import safe_open

    with safe_open(str(Path(path) if path is not None else DEFAULT_WEIGHTS), "pt") as f:
        return json.loads((f.metadata() or {}).get("specverify", "{}"))
