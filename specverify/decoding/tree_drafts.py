"""Draft trees: the structure a tree draft hands to the decoder, and the helpers that build and read it.

A draft tree of ``N`` nodes (the layout of :func:`specverify.verify_tree_greedy` and
:func:`specverify.accept_tree`)::

    tokens   [N]  int64   the token of each node
    parents  [N]  int64   parents[i] in {-1} U [0, i): -1 = a child of the root (the last
                          committed token); nodes are in topological order, siblings ordered by index
    probs    [N + 1, V]   optional: row r is the distribution the children of position r were
                          drawn from (row 0 = the root, row i + 1 = node i); None = deterministic
                          children (top-k, prompt-lookup candidates): verified by sample-and-match

A target scoring a tree returns ``[N + 1, V]`` rows: row 0 scores the position after the root, row
``i + 1`` the position after node ``i`` (the prefix, then node ``i``'s ancestors, then node ``i``).
A chain of ``k`` tokens is the tree ``parents = [-1, 0, 1, ..., k - 2]``.

:class:`Trie` merges several candidate continuations into a tree (shared prefixes become one path),
which is how the multi-candidate prompt lookup draft turns its matches into one tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

import torch

from ..kernels import _inputs

__all__ = ["DraftTree", "Trie", "check_parents", "depths", "ancestor_mask", "path_to", "chain_parents"]


@dataclass
class DraftTree:
    """What a tree draft returns: ``tokens [N]``, ``parents [N]`` and ``probs [N + 1, V]`` or None.

    ``probs[r]`` is the law the children of row ``r`` were drawn from (row 0 the root, row ``i + 1``
    node ``i``; a leaf's row is not read). ``replacement`` says how: one after another without
    replacement (False, siblings distinct; recursive rejection sampling) or i.i.d. (True;
    SpecInfer's rule), as :func:`specverify.accept_tree`'s argument of that name.
    """

    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64
    probs: Optional[object] = None  # [N + 1, V] or None (deterministic children)
    replacement: bool = False  # how children were drawn from probs (read only with probs)

    def __post_init__(self):
        # integer ids only, 1-D, as for chain drafts: floats and booleans are refused, not truncated
        self.tokens = torch.as_tensor(_inputs.tokens_int64(self.tokens, "DraftTree tokens"))
        self.parents = torch.as_tensor(_inputs.tokens_int64(self.parents, "DraftTree parents"))
        if self.tokens.numel() != self.parents.numel():
            raise ValueError(f"tree tokens [{self.tokens.numel()}] and parents [{self.parents.numel()}] differ in length")
        check_parents(self.parents)

    @property
    def n_nodes(self) -> int:
        return self.tokens.numel()

    def depth(self) -> int:
        """Longest root-to-leaf path in nodes (0 for an empty tree)."""
        d = depths(self.parents)
        return int(d.max()) if d.numel() else 0


def chain_parents(k: int) -> torch.Tensor:
    """``[-1, 0, 1, ..., k - 2]``: the tree of a chain of ``k`` tokens."""
    return torch.arange(-1, k - 1, dtype=torch.int64)


def check_parents(parents: torch.Tensor) -> None:
    """``ValueError`` naming the node unless ``parents[i]`` is in ``{-1} U [0, i)`` for every ``i``."""
    idx = torch.arange(parents.numel(), dtype=torch.int64)
    bad = torch.nonzero((parents < -1) | (parents >= idx))
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"parents[{i}] = {int(parents[i])}: must be -1 or a node index < {i} (topological order)")


def depths(parents: torch.Tensor) -> torch.Tensor:
    """``[N]`` int64: 1 for the root's children, 1 + the parent's depth otherwise."""
    d = torch.empty(parents.numel(), dtype=torch.int64)
    for i, p in enumerate(parents.tolist()):
        d[i] = 1 if p < 0 else d[p] + 1
    return d


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """``[N, N]`` bool: ``mask[i, j]`` iff node ``j`` is node ``i`` or one of its ancestors."""
    n = parents.numel()
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            mask[i] |= mask[p]  # topological order: the parent's row is complete
    return mask


def path_to(parents: Sequence[int], node: int) -> List[int]:
    """Node indices from the root's child down to ``node`` (inclusive); ``[]`` for ``node = -1``."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


class Trie:
    """Merge token sequences into a tree; shared prefixes become one path.

    Nodes are numbered in insertion order, which is a topological order (a node is created after
    its parent), and children keep the order in which their first sequence arrived, so a caller
    that inserts its best candidates first gets them as the first-tested siblings.
    ``max_nodes`` caps the tree: a sequence stops growing when the budget is spent.
    """

    def __init__(self, max_nodes: int):
        if int(max_nodes) != max_nodes or max_nodes < 0:
            raise ValueError(f"max_nodes must be a non-negative integer, got {max_nodes!r}")
        self.max_nodes = int(max_nodes)
        self.tokens: List[int] = []
        self.parents: List[int] = []
        self._child = {}  # (parent node, token) -> node

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.max_nodes

    def insert(self, sequence: Iterable[int]) -> int:
        """Add ``sequence`` below the root; returns the number of new nodes."""
        node, added = -1, 0
        for token in sequence:
            token = int(token)
            nxt = self._child.get((node, token))
            if nxt is None:
                if self.full:
                    break
                nxt = len(self.tokens)
                self.tokens.append(token)
                self.parents.append(node)
                self._child[(node, token)] = nxt
                added += 1
            node = nxt
        return added

    def tree(self) -> DraftTree:
        return DraftTree(torch.tensor(self.tokens, dtype=torch.int64), torch.tensor(self.parents, dtype=torch.int64))
