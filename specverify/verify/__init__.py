"""The verification ops: validate once in Python, then one call into the compiled kernels.

Terms (as in vLLM's rejection sampler): position ``i`` of a round holds the draft token ``t_i``;
it is *accepted* or not; at the first rejection the *recovered* token is drawn from the residual;
if all K drafts are accepted, a *bonus* token is drawn from the last target row.  The token a
call returns as ``next_token`` is the recovered or bonus token: the *emitted* stream of a round is
``draft_tokens[:n_accepted] + [next_token]``.

One module per op family: :mod:`~specverify.verify.chain` (greedy and token-wise sampling),
:mod:`~specverify.verify.block` (block verification), :mod:`~specverify.verify.tree` (draft
trees), :mod:`~specverify.verify.batch` (ragged batches and their layouts),
:mod:`~specverify.verify.logits` (warping, logits in), :mod:`~specverify.verify.linear` (the
target's linear layers).  Each is a thin validated entry point over ``specverify.kernels``.
"""

from .batch import BATCH_METHODS, verify_batch
from .block import accept_block, accept_block_from_uniforms
from .chain import accept, accept_from_uniforms, verify_greedy
from .linear import linear
from .logits import accept_block_logits, accept_block_logits_from_uniforms, accept_logits, accept_logits_from_uniforms, warp
from .tree import accept_tree, accept_tree_from_uniforms, verify_tree_greedy

__all__ = ["verify_greedy", "accept", "accept_from_uniforms", "accept_block", "accept_block_from_uniforms",
           "verify_tree_greedy", "accept_tree", "accept_tree_from_uniforms", "verify_batch",
           "BATCH_METHODS", "warp", "accept_logits", "accept_logits_from_uniforms", "accept_block_logits",
           "accept_block_logits_from_uniforms", "linear"]
