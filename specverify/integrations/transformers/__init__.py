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

One module per job, every public name importable from here: :mod:`~.sampling` (``Sampling``,
``WarpLogitsProcessor``, ``warp``), :mod:`~.target` (``CachedCausalLM``, ``CausalLMTarget``),
:mod:`~.drafts` (``CausalLMDraft``, ``PromptLookupDraft``, ``early_exit``), :mod:`~.trees`
(``PromptLookupTreeDraft``, ``CausalLMTreeDraft``), :mod:`~.speed` (``use_fast_linears``,
``use_grouped_attention``) and :mod:`~.callbacks` (``speculative_callbacks``). The package
imports the Hugging Face ``transformers`` library by its absolute name only (``from
transformers import ...``), so this package's own name never shadows it.

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

from .callbacks import speculative_callbacks
from .drafts import CausalLMDraft, PromptLookupDraft, early_exit, longest_match, suffix_matches
from .sampling import Sampling, WarpLogitsProcessor, transformers_warpers, warp
from .speed import GROUPED_SDPA, FastLinears, GroupedAttention, use_fast_linears, use_grouped_attention
from .target import TREE_ATTENTION, CachedCausalLM, CausalLMTarget, PositionLimitWarning
from .trees import CausalLMTreeDraft, PromptLookupTreeDraft

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
