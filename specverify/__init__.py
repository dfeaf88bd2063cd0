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
the Hugging Face ``kernels`` build).  Each module has one name, the path of its file.
"""

from . import law, stats, verify
from .verify import (BATCH_METHODS, accept, accept_block, accept_block_from_uniforms, accept_block_logits,
                     accept_block_logits_from_uniforms, accept_from_uniforms, accept_logits,
                     accept_logits_from_uniforms, accept_tree, accept_tree_from_uniforms, linear,
                     verify_batch, verify_greedy, verify_tree_greedy, warp)

__version__ = "0.3.0"

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
    "__version__",
]


def __getattr__(name):
    # The decoder is imported on first use so `import specverify` stays light; the references on
    # first use, so that no production path loads them (tests/test_layout.py).
    if name == "SpeculativeDecoder":
        from .decoding.decoder import SpeculativeDecoder

        return SpeculativeDecoder
    if name == "reference":
        import importlib

        return importlib.import_module(".reference", __name__)
    raise AttributeError(f"module 'specverify' has no attribute {name!r}")
