"""A learned draft for SmolLM2-135M: one decoder layer reading the target's own features (EAGLE).

The draft (Li et al. 2024, "EAGLE"; reduced vocabulary as in FR-Spec, Zhao et al. 2025)::

    pair t      (h_t, x_{t+1})            h_t [d] the target's last-layer state at position t
                                          (the input of its final norm), x_{t+1} the next token
    input       a_t = fc([n_h(h_t) ; n_e(E[x_{t+1}])])        fc: [2d] -> [d], E the target's embeddings,
                                                              n_h, n_e two RMSNorms of the draft's own
    layer       f_t = DecoderLayer(a_0 .. a_t)                one Llama layer (SmolLM2's shape), own KV cache
    output      z_t = W_c norm(f_t)                            [V_r + C] logits over the reduced vocabulary
                                                              and the call's context rows
    law         q_t(v) = softmax(z_t)[v] for v in row_ids, 0 elsewhere   (a law over all V tokens)

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
``vocab_ids``. In decoding a call also proposes from the LM-head rows of the tokens of its prefix
outside ``vocab_ids`` (context rows, ``C`` of them: answers copy names and listed words;
``row_ids`` = ``vocab_ids`` then those; ``W_c`` their rows). A drafted token outside the rows has
draft probability 0: the draft's rows are true distributions over the full vocabulary, and
verification stays exact.

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

from .callbacks import COMBINE, DEFAULT_MIN_CONFIDENCE, HybridDraft, learned_callbacks, planned_draft
from .drafts import HiddenTap, LearnedDraft, LearnedTreeDraft
from .head import DEFAULT_WEIGHTS, FeatureHead, check_weights, load, metadata, save, widened_rows

__all__ = ["FeatureHead", "DEFAULT_WEIGHTS", "DEFAULT_MIN_CONFIDENCE", "load", "widened_rows", "save", "check_weights",
           "metadata", "HiddenTap", "LearnedDraft", "LearnedTreeDraft", "HybridDraft", "COMBINE", "planned_draft",
           "learned_callbacks"]
