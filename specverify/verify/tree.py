"""Trees of drafts: several candidates per position, one target pass for the whole tree."""

from ..kernels import _inputs, _kernels

__all__ = ["verify_tree_greedy", "accept_tree", "accept_tree_from_uniforms"]


def verify_tree_greedy(target_probs, draft_tokens, parents):
    """Greedy (temperature-0) verification of a draft tree.

    The tree: ``parents[i]`` is -1 (a child of the root, the last committed token) or an earlier
    node; *position* r is the root for r = 0 and node r - 1 otherwise; ``target_probs[r]`` scores
    the token after position r.  From the root, accept the child whose token equals the row's
    argmax (ties to the lowest token id; the first such child if siblings repeat a token), stop
    at a position with no matching child.  The emitted stream ``draft_tokens[path] + [next_token]``
    equals plain greedy decoding of the target.  Rows of positions never reached are not read.

    Args:
        target_probs: ``[N+1, V]`` float scores (as for ``verify_greedy``).
        draft_tokens: ``[N]`` integer token ids in ``[0, V)``.
        parents: ``[N]`` integers, ``parents[i]`` in ``[-1, i)`` (topological order).

    Returns:
        ``(path, next_token)``: ``path`` a 1-D int64 array of the accepted nodes, root first;
        ``next_token`` the argmax at the last accepted position (a Python int).

    Raises:
        TypeError, ValueError, IndexError: as ``verify_greedy``, plus parents of the wrong length,
            out of range or not topological (which also rules out cycles).
    """
    return _kernels.verify_tree_greedy(target_probs, draft_tokens, parents)


def accept_tree(target_probs, draft_probs, draft_tokens, parents, generator=None, *, replacement=False):
    """Multi-draft speculative sampling over a draft tree; the emitted tokens are distributed
    exactly as the target's.

    The tree as in ``verify_tree_greedy``; siblings in index order (for sampled children: their
    draw order).  ``draft_probs[r]`` is the law the children of position r were drawn from (rows
    of leaves are not read).  At each reached position with target p (mass P) and children
    c_1..c_k, one rule decides; R_0 = p:

    - ``draft_probs=None``, *deterministic children* (top-k, prompt lookup candidates, any draft
      process; sibling tokens distinct): accept c_j with probability
      ``p(c_j) / (1 - sum_{i<j} p(c_i))``; on total rejection draw from p without the children.
      A node is accepted with the product of the target probabilities along its path.
    - ``replacement=False``, *recursive rejection sampling without replacement* (children drawn
      one after another from q without replacement; Jeon et al. 2024, EAGLE-1; siblings
      distinct): accept c_j with probability ``min(1, R(c_j) / q^(j)(c_j))``, q^(j) = q without
      c_1..c_{j-1}, renormalized; on rejection ``R <- norm(max(R - q^(j), 0))``.
    - ``replacement=True``, *SpecInfer's multi-step speculative sampling* (children i.i.d. from
      q; repeated tokens allowed and never merged): the same with q^(j) = q.  A position
      accepts with ``1 - prod_j (1 - a_j)``, ``a_j = sum_v min(R_{j-1}, q)``.

    An accepted child's position is verified next; a leaf's row gives the bonus token; on total
    rejection the recovered token is drawn from the residual (p itself if rounding left it no
    mass).  On a chain ``parents = [-1, 0, ..., N-2]`` every rule is ``accept`` bit for bit with
    the same uniforms (draft_probs[:N] are accept's draft rows).  Float64 form of the residuals:
    ``specverify.reference.tree``; laws: ``specverify.law`` (``tree_node_probabilities``,
    ``tree_length_pmf``, ``rrs_acceptance``, ``optimal_multidraft_acceptance``).

    Randomness: exactly N + 1 float64 uniforms per call, drawn in one call (as ``accept``):
    ``u[i]`` is the coin of node i (read only if node i is tested), ``u[N]`` draws the recovered
    or bonus token by inverse CDF over token ids in increasing order.

    Args:
        target_probs: ``[N+1, V]`` non-negative float scores.
        draft_probs: ``[N+1, V]`` non-negative float scores, or None (deterministic children).
        draft_tokens: ``[N]`` integer token ids; parents: ``[N]`` as in ``verify_tree_greedy``.
        generator: ``torch.Generator`` (CPU), ``numpy.random.Generator``, or None.
        replacement: whether the children were drawn with replacement (ignored without draft_probs).

    Returns:
        ``(path, next_token)`` as ``verify_tree_greedy``.

    Raises:
        TypeError, ValueError, IndexError: as ``accept`` and ``verify_tree_greedy``, plus repeated
            sibling tokens under the deterministic or without-replacement rule (the message names the
            node), and a without-replacement draft row with no mass left for a later sibling.
    """
    return _kernels.accept_tree(target_probs, draft_probs, draft_tokens, parents, generator, None, replacement)


def accept_tree_from_uniforms(target_probs, draft_probs, draft_tokens, parents, uniforms, *, replacement=False):
    """``accept_tree`` with its ``N + 1`` uniforms given explicitly (float64, each in ``[0, 1)``)."""
    _inputs.require_uniforms(uniforms, "N + 1")
    return _kernels.accept_tree(target_probs, draft_probs, draft_tokens, parents, None, uniforms, replacement)
