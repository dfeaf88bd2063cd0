"""The learned draft's module: :class:`FeatureHead` (one Llama layer over the target's features,
the reduced LM head) and its file: :func:`save`, :func:`load`, :func:`check_weights`,
:func:`metadata`, :data:`DEFAULT_WEIGHTS` (the shipped draft). The math is the package's
docstring (:mod:`specverify.integrations.learned_draft`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import nn

from ... import verify as ops
from ..transformers.speed import kernel_linear_applies

__all__ = ["FeatureHead", "DEFAULT_WEIGHTS", "load", "widened_rows", "save", "check_weights", "metadata"]

#: The shipped draft's file (:func:`load`'s default; :func:`metadata` reads how it was trained).
DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent / "data" / "smollm2_draft.safetensors"


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
        norm, ``lm_head`` ``[V, d]`` its LM head and ``head`` ``[V_r, d]`` a copy of its rows ``vocab_ids``.
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
        self.embed = self.norm_weight = self.head = self.lm_head = None  # set by attach()

    def attach(self, target) -> "FeatureHead":
        """Take the frozen parts from the target ``LlamaForCausalLM`` (a copy of the head's rows;
        the embeddings and norm are shared). Returns ``self``."""
        self.embed = target.model.embed_tokens.weight.detach()
        self.norm_weight = target.model.norm.weight.detach()
        self.lm_head = target.lm_head.weight.detach()  # [V, d] (shared: the drafts' context rows come from it)
        self.head = self.lm_head[self.vocab_ids].contiguous()  # [V_r, d]
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
                last_only: bool = False, extra: Optional[torch.Tensor] = None):
        """One pass over ``T`` new pairs: :meth:`layer`, then :meth:`logits` of its output
        (``extra``: more LM-head rows, as there).

        Returns:
            ``(f [B, T', d], logits [B, T', V_r + C], (keys, values) [B, kv_heads, S + T, hd])`` (see
            :meth:`layer`).
        """
        f, past = self.layer(features, tokens, positions, past=past, mask=mask, last_only=last_only)
        return f, self.logits(f, extra), past

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

    def logits(self, f: torch.Tensor, extra: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``W_r norm(f)``: ``[..., d]`` features -> ``[..., V_r]`` logits over the reduced vocabulary;
        with ``extra`` ``[C, d]`` (more rows of the target's LM head: the drafts' context rows),
        ``[..., V_r + C]``, those rows' logits after the reduced vocabulary's.

        Through :func:`specverify.linear` for the few rows of a draft step (at most
        :attr:`FAST_ROWS`, float32 on the CPU, no gradient wanted): torch's matmul (2.13, one
        thread) reads the ``V_r x d`` rows once per feature row, ~3 ms for one row of 12288, over
        half a draft step; the kernel reads them once (~1 ms), as
        :func:`~.transformers.use_fast_linears` does for the layer's own linears. Many rows (a
        prefix caught up, training) stay with torch's blocked matmul, faster there."""
        x = self.final_norm(f)
        z = self._linear(x, self.head)
        return z if extra is None or not extra.shape[0] else torch.cat([z, self._linear(x, extra)], dim=-1)

    def _linear(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if x.numel() > self.FAST_ROWS * self.d or not kernel_linear_applies(x, rows):
            return torch.nn.functional.linear(x, rows)
        return ops.linear(x, rows, None, num_threads=torch.get_num_threads())

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


def widened_rows(vocab_ids: torch.Tensor, rows: int, n_vocab: int) -> torch.Tensor:
    """``vocab_ids`` and, beyond them, the lowest ids not among them, up to ``rows`` ids, sorted.

    Why lowest: a BPE vocabulary numbers its merges in order, so a lower id is a commoner token
    of the tokenizer's corpus. The draft's logits for rows it was not trained on come from the same
    feature ``f`` (trained to be close to ``h``, whose LM-head product is the target's logits), so
    they rank such tokens usefully: the target's own answers hold tokens no training answer did."""
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise TypeError(f"rows must be an int, got {type(rows).__name__}")
    if not vocab_ids.numel() <= rows <= n_vocab:
        raise ValueError(f"rows must lie in [{vocab_ids.numel()}, {n_vocab}] (the file's {vocab_ids.numel()} "
                         f"trained rows up to the whole vocabulary), got {rows}")
    outside = torch.ones(n_vocab, dtype=torch.bool)
    outside[vocab_ids] = False
    extra = torch.nonzero(outside).flatten()[: rows - vocab_ids.numel()]
    return torch.sort(torch.cat([vocab_ids, extra])).values


def load(target, path=None, rows: Optional[int] = None) -> FeatureHead:
    """The draft stored at ``path`` (default :data:`DEFAULT_WEIGHTS`), attached to ``target``
    (a SmolLM2 ``LlamaForCausalLM``), float32, eval mode, linears on :func:`specverify.linear`.

    ``rows``: propose from this many LM-head rows, the file's ``vocab_ids`` (those it was trained
    on) widened by :func:`widened_rows` (``experiments.end_to_end.draft_rows`` judges widths);
    None: the file's own.

    The file is checked before use (:func:`check_weights`): one :class:`ValueError` naming the
    file and the problem, rather than a failure far from the cause (repeated vocabulary ids, say,
    would hand the verifier a row that is not the law the token was drawn from)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from ..transformers.speed import use_fast_linears

    path = Path(path) if path is not None else DEFAULT_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"no learned draft at {path}: train one with python -m experiments.end_to_end.train_draft")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    check_weights(tensors, target.config, path)
    if rows is not None:
        tensors["vocab_ids"] = widened_rows(tensors["vocab_ids"], rows, int(target.config.vocab_size))
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

