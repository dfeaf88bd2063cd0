"""specverify: the verification step of speculative decoding, on CPUs.

    import specverify as sv
    n_accepted, next_token = sv.verify_greedy(target_probs, draft_tokens)          # greedy
    n_accepted, next_token = sv.accept(target_probs, draft_probs, draft_tokens, g)  # sampling
    n_accepted, next_token = sv.accept_block(target_probs, draft_probs, draft_tokens, g)  # block
    path, next_token = sv.accept_tree(target_probs, draft_probs, draft_tokens, parents, g)  # trees

``sv.law`` holds the analytic law of rejection sampling, ``sv.reference`` slow NumPy references
that the kernels match bit for bit, and ``sv.SpeculativeDecoder`` the draft/verify loop.
"""

from . import law, reference, reference_tree, stats
from .ops import (accept, accept_block, accept_block_from_uniforms, accept_from_uniforms, accept_tree,
                  accept_tree_from_uniforms, verify_greedy, verify_tree_greedy)

__version__ = "0.1.0"

__all__ = [
    "verify_greedy",
    "accept",
    "accept_from_uniforms",
    "accept_block",
    "accept_block_from_uniforms",
    "verify_tree_greedy",
    "accept_tree",
    "accept_tree_from_uniforms",
    "SpeculativeDecoder",
    "law",
    "reference",
    "reference_tree",
    "__version__",
]


def __getattr__(name):
    # The decoder is imported on first use so `import specverify` stays light.
    if name == "SpeculativeDecoder":
        from .decoder import SpeculativeDecoder

        return SpeculativeDecoder
    raise AttributeError(f"module 'specverify' has no attribute {name!r}")
