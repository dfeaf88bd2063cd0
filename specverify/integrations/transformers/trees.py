"""Tree drafts: multi-candidate prompt lookup (:class:`PromptLookupTreeDraft`) and a causal LM's
EAGLE-2 top-k tree (:class:`CausalLMTreeDraft`), with the candidate-tree helpers the learned
draft shares (``_add_children``, ``_expand``, ``_rerank``, ``_check_tree_shape``)."""

from __future__ import annotations

from typing import List, Tuple

import torch

from ...decoding.tree_drafts import DraftTree, Trie
from .drafts import PromptLookupDraft, longest_match, suffix_matches
from .sampling import _check_warp
from .target import CachedCausalLM, _as_tokens, _ExclusiveUse


class PromptLookupTreeDraft:
    """Multi-candidate prompt lookup: the chain's proposal plus other earlier continuations, one tree.

    Candidates, best first: the chain :class:`PromptLookupDraft` proposal (longest suffix n-gram,
    ``max_ngram`` down to 1, earliest occurrence; so the tree's first root-to-leaf path is exactly
    the chain draft's and greedy never accepts less per pass than the chain), then, for ``n`` from
    ``max_ngram`` down to ``min_ngram``, the ``k`` tokens after every earlier occurrence of the
    sequence's last ``n`` tokens, earliest first. They are inserted into a
    :class:`~specverify.decoding.tree_drafts.Trie` (shared prefixes become one path) until ``node_budget``
    nodes are used. Children are deterministic (``probs=None``): verified exactly by
    sample-and-match, whatever decides what is proposed. Counters: ``candidates`` inserted,
    ``declined`` rounds with a match but no proposal.

    **When to propose** (on a CPU a pass that scores extra tokens costs 1.5-2x a one-token step,
    measured on SmolLM2-135M, so a mostly rejected draft is a loss): the longest match of order
    ``n`` (a unigram only when every earlier occurrence of the token is followed by the same
    token; an ambiguous unigram proposes nothing) proposes iff its *hindsight accuracy*
    ``(right_n + n) / (seen_n + n + 1)`` is at least ``threshold``. ``seen_n`` / ``right_n`` count
    the tokens committed since this draft first saw the sequence at which the longest match had
    order ``n`` and whether the chain's first proposed token was that token; ``n`` right and 1 wrong
    pseudo-observations are the prior (1/2 for a unigram, 2/3 for a bigram, 3/4 for a trigram).
    So a copy task proposes from its first shared token while open-ended text, whose matches miss,
    soon stops proposing after them. The decision depends only on the prefix (the counts restart when
    a prefix does not extend the previous one), so output stays exact in both modes.

    Thread-safety: the hindsight counts follow one sequence; a call entered while another thread
    is inside one raises a RuntimeError (give each thread its own draft).
    """

    def __init__(self, node_budget: int = 16, max_ngram: int = 3, min_ngram: int = 2, threshold: float = 0.4):
        if int(node_budget) != node_budget or node_budget < 1:
            raise ValueError(f"node_budget must be a positive integer, got {node_budget!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
        self.node_budget = int(node_budget)
        self.threshold = float(threshold)
        if int(min_ngram) != min_ngram or int(max_ngram) != max_ngram or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r}, {max_ngram!r}")
        self.chain = PromptLookupDraft(max_ngram, 1)
        self.min_ngram = int(min_ngram)
        self.candidates = 0
        self.declined = 0
        self._seen = None  # the last prefix seen; hindsight covers its tokens from index _start on
        self._start = 0
        self.seen = [0] * (max_ngram + 1)  # [order]: committed tokens whose longest match had this order
        self.right = [0] * (max_ngram + 1)  # [order]: ... and whose chain proposal started with them
        self._in_use = _ExclusiveUse(type(self).__name__)

    def _order(self, seq: torch.Tensor) -> Tuple[int, List[int]]:
        """The longest match ``(n, starts)`` a proposal would follow; ``(0, [])`` for none or an ambiguous unigram."""
        n, starts = longest_match(seq, self.chain.max_ngram)
        if n == 1 and len({int(seq[s + 1]) for s in starts}) > 1:
            return 0, []
        return n, starts

    def _update_hindsight(self, seq: torch.Tensor) -> None:
        done = -1 if self._seen is None else self._seen.numel()
        if not 0 <= done <= seq.numel() or not torch.equal(seq[:done], self._seen):  # a new sequence
            self._start = done = seq.numel()
            self.seen = [0] * len(self.seen)
            self.right = [0] * len(self.right)
        for t in range(max(done, self._start), seq.numel()):
            n, starts = self._order(seq[:t])
            if n:
                self.seen[n] += 1
                self.right[n] += int(seq[starts[0] + n] == seq[t])
        self._seen = seq.clone()

    def proposes(self, seq: torch.Tensor) -> bool:
        """Whether the longest match of ``seq`` ``[L]`` is trusted enough to propose (see the class doc)."""
        n, _ = self._order(seq)
        return n > 0 and (self.right[n] + n) / (self.seen[n] + n + 1) >= self.threshold

    def continuations(self, seq: torch.Tensor, k: int):
        """Yield candidate continuations (1-D tensors of at most ``k`` tokens), best first."""
        yield self.chain(seq, k)[0]
        for n in range(min(self.chain.max_ngram, seq.numel() - 1), self.min_ngram - 1, -1):
            for start in suffix_matches(seq, n):
                yield seq[start + n : start + n + k]

    def __call__(self, prefix: torch.Tensor, k: int) -> DraftTree:
        with self._in_use:
            return self._propose(_as_tokens(prefix), k)

    def _propose(self, seq: torch.Tensor, k: int) -> DraftTree:
        self._update_hindsight(seq)
        trie = Trie(self.node_budget)
        if not self.proposes(seq):
            self.declined += int(longest_match(seq, self.chain.max_ngram)[0] > 0)
            return trie.tree()
        for continuation in self.continuations(seq, k):
            if continuation.numel():
                trie.insert(continuation.tolist())
                self.candidates += 1
            if trie.full:
                break
        return trie.tree()


class CausalLMTreeDraft:
    """A causal LM's top-k tree, grown level by level and reranked (EAGLE-2, Li et al. 2024).

    At each depth the ``top_k`` most likely children of every frontier node are scored by the
    product of draft probabilities along their path; the ``beam`` best of them are expanded (one
    forward of only those nodes, :meth:`CachedCausalLM.tree_logits` growing the tree); after ``k``
    levels every candidate competes by that product and the best ``node_budget`` form the tree
    (ancestors score at least as high as their children, so the kept set is a tree). Children are
    deterministic (``probs=None``, verified by sample-and-match), so sampling stays exact whatever
    the draft. Probabilities are the draft's softmax at ``temperature`` (a ranking, not a law).
    Thread-safety, recovery: as :class:`CachedCausalLM`, for the whole call.
    """

    def __init__(self, model, node_budget: int = 16, top_k: int = 4, beam: int = 4, temperature: float = 1.0):
        _check_tree_shape(node_budget, top_k, beam, temperature)
        self.lm = CachedCausalLM(model)
        self.node_budget, self.top_k, self.beam, self.temperature = int(node_budget), int(top_k), int(beam), temperature

    def __call__(self, prefix: torch.Tensor, k: int) -> DraftTree:
        with self.lm.exclusive():  # held across the k levels' forwards
            return self._grow(_as_tokens(prefix), k)

    def _grow(self, prefix: torch.Tensor, k: int) -> DraftTree:
        tokens, parents, scores = [], [], []  # every candidate node: [C] token, parent, log path probability
        expanded = []  # candidates in the grown tree, in growth order (their index there = position here)
        rows = self.lm.tree_logits(prefix, prefix[:0], prefix[:0])  # [1, V]
        frontier = [(-1, 0.0, 0)]  # (candidate id, log path probability, row in `rows`)
        for depth in range(k):
            level = []
            for cand, score, row in frontier:
                logp = torch.log_softmax(rows[row] / self.temperature, dim=-1)
                level += _add_children(tokens, parents, scores, cand, score, logp, self.top_k)
            if depth == k - 1:
                break
            best, start, tree_parents = _expand(level, scores, parents, expanded, self.beam)
            rows = self.lm.tree_logits(prefix, torch.tensor([tokens[c] for c in expanded]), tree_parents)
            frontier = [(c, scores[c], start + i + 1) for i, c in enumerate(best)]
        return _rerank(tokens, parents, scores, self.node_budget)


def _add_children(tokens, parents, scores, cand, score, logp, top_k, ids=None) -> List[int]:
    """Append the ``top_k`` most likely children of candidate ``cand`` (log path probability
    ``score``; ``logp`` ``[W]`` its children's log probabilities, token ``ids[j]`` for entry ``j``,
    ``j`` itself when ``ids`` is None) to the candidate lists; return their candidate ids."""
    top = torch.topk(logp, min(top_k, logp.numel()))
    new = []
    for lp, j in zip(top.values.tolist(), top.indices.tolist()):
        tokens.append(j if ids is None else int(ids[j]))
        parents.append(cand)
        scores.append(score + lp)
        new.append(len(tokens) - 1)
    return new


def _expand(level, scores, parents, expanded, beam):
    """The ``beam`` best candidates of ``level`` appended to ``expanded`` (in place); returns
    ``(best, start, parents [E])``: them, their first index in ``expanded`` and the expanded tree's
    parents (indices into ``expanded``)."""
    best = sorted(level, key=lambda c: -scores[c])[:beam]
    start = len(expanded)
    expanded += best
    position = {c: i for i, c in enumerate(expanded)}
    return best, start, torch.tensor([position.get(parents[c], -1) for c in expanded], dtype=torch.int64)


def _check_tree_shape(node_budget, top_k, beam, temperature) -> None:
    """ValueError unless ``node_budget``, ``top_k``, ``beam`` are positive integers and ``temperature`` a valid one."""
    for name, value in (("node_budget", node_budget), ("top_k", top_k), ("beam", beam)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    _check_warp(temperature, 0, 1.0)


def _rerank(tokens: List[int], parents: List[int], scores: List[float], node_budget: int) -> DraftTree:
    """The EAGLE-2 rerank: the ``node_budget`` candidates of highest ``scores`` (log path
    probabilities, so a node scores at most its parent) and their ancestors, as a
    :class:`~specverify.decoding.tree_drafts.DraftTree`. ``tokens``, ``parents``, ``scores``: ``[C]`` per
    candidate, ``parents[c]`` a candidate id ``< c`` or -1 (candidates created after their parents).
    """
    keep = sorted(range(len(tokens)), key=lambda c: -scores[c])[:node_budget]
    keep = set(keep)
    for c in list(keep):  # ancestors of kept nodes (ties in the product could drop one)
        while parents[c] >= 0 and parents[c] not in keep:
            keep.add(parents[c])
            c = parents[c]
    order = sorted(keep)  # candidate ids are created after their parents: a topological order
    index = {c: i for i, c in enumerate(order)}
    return DraftTree(torch.tensor([tokens[c] for c in order], dtype=torch.int64),
                     torch.tensor([index.get(parents[c], -1) for c in order], dtype=torch.int64))

