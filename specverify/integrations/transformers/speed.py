"""Speed switches made on a target model: its linear layers through :func:`specverify.linear`
(:func:`use_fast_linears`) and ``sdpa`` attention without copying grouped key/value heads
(:func:`use_grouped_attention`). Each returns a handle whose ``restore()`` undoes it."""

from __future__ import annotations

import functools
from typing import List, Optional

import torch

from ... import verify as ops

GROUPED_SDPA = "specverify_grouped_sdpa"  # use_grouped_attention's implementation: sdpa without repeat_kv


def kernel_linear_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`specverify.linear` may stand in for ``F.linear(x, weight)``: float32 on
    the CPU, no gradient wanted (the kernel has no backward)."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and weight.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def _fast_linear_forward(self, num_threads: Optional[int], x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` through :func:`specverify.linear` when no gradient is wanted."""
    if not kernel_linear_applies(x, self.weight):
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
