"""specverify: the verification step of speculative decoding, on CPUs::

    import specverify as sv
    n_accepted, next_token = sv.verify_greedy(target_probs, draft_tokens)          # greedy
    n_accepted, next_token = sv.accept(target_probs, draft_probs, draft_tokens, g)  # sampling
    n_accepted, next_token = sv.accept_block(target_probs, draft_probs, draft_tokens, g)  # block
    path, next_token = sv.accept_tree(target_probs, draft_probs, draft_tokens, parents, g)  # trees
    probs = sv.warp(logits, temperature=0.7, top_p=0.9)                            # logits in
    n_accepted, next_token = sv.accept_logits(target_logits, draft_logits, draft_tokens, g,
                                              temperature=0.7, top_p=0.9)

``sv.law`` holds the analytic law of rejection sampling, ``sv.reference`` slow NumPy references
that the kernels match bit for bit, and ``sv.SpeculativeDecoder`` the draft/verify loop.

The package has a folder per job (``ARCHITECTURE.md`` in the repository says which way imports
go): ``verify`` (the validated entry points re-exported here), ``kernels`` (the Cython),
``reference``, ``law``, ``decoding`` (the decoder, draft-length policies, draft trees),
``testing`` (checking any verifier's losslessness) and ``integrations`` (transformers, SmolLM2,
the Hugging Face ``kernels`` build).  The old module paths (``specverify.ops``,
``specverify.batch``, ``specverify.adaptive``, ``specverify.decoder``, ``specverify.tree_drafts``,
``specverify.reference_tree``, ``specverify.reference_warp``, ``specverify.hub``) are aliases of
the new modules.
"""

from . import law, reference, stats, verify
from .reference import tree as reference_tree  # noqa: F401 (old name)
from .reference import warp as reference_warp  # noqa: F401 (old name)
from .verify import (BATCH_METHODS, accept, accept_block, accept_block_from_uniforms, accept_block_logits,
                     accept_block_logits_from_uniforms, accept_from_uniforms, accept_logits,
                     accept_logits_from_uniforms, accept_tree, accept_tree_from_uniforms, linear,
                     verify_batch, verify_greedy, verify_tree_greedy, warp)
from .verify import batch  # noqa: F401 (sv.batch: the layouts and converters)

ops = verify  # the old name of the ops module (specverify.ops)

__version__ = "0.2.0"

__all__ = [
    "verify_greedy",
    "accept",
    "accept_from_uniforms",
    "accept_block",
    "accept_block_from_uniforms",
    "verify_tree_greedy",
    "accept_tree",
    "accept_tree_from_uniforms",
    "verify_batch",
    "BATCH_METHODS",
    "warp",
    "accept_logits",
    "accept_logits_from_uniforms",
    "accept_block_logits",
    "accept_block_logits_from_uniforms",
    "linear",
    "SpeculativeDecoder",
    "law",
    "reference",
    "reference_tree",
    "__version__",
]


def __getattr__(name):
    # The decoder is imported on first use so `import specverify` stays light.
    if name == "SpeculativeDecoder":
        from .decoding.decoder import SpeculativeDecoder

        return SpeculativeDecoder
    raise AttributeError(f"module 'specverify' has no attribute {name!r}")
