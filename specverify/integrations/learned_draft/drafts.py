"""Drafting with a :class:`~.head.FeatureHead`: :class:`HiddenTap` (the target's hidden states, by
hooks), :class:`LearnedDraft` (a chain: greedy, or sampled with its rows) and
:class:`LearnedTreeDraft` (an EAGLE-2 dynamic tree, one batched draft call per level), both
keeping the draft's cache of true pairs across rounds and both gated (``min_confidence``)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ...decoding.tree_drafts import DraftTree, ancestor_mask, depths
from ..transformers.target import _common_prefix
from ..transformers.trees import _add_children, _check_tree_shape, _expand, _rerank
from .head import FeatureHead

__all__ = ["HiddenTap", "LearnedDraft", "LearnedTreeDraft"]


class HiddenTap:
    """The target's last-layer hidden states of the sequence its KV cache holds.

    Two hooks on the target model: a forward pre-hook on the model records where each forward
    starts (the length its cache already holds), the token ids it feeds and, for a forward with
    explicit positions (a tree forward of
    :meth:`~specverify.integrations.transformers.CachedCausalLM.tree_logits`), the tree its
    attention mask describes; one on its final norm keeps the norm's input ``[T, d]``.
    :meth:`features` applies the forwards in order and returns ``(hidden [M, d], tokens [M])``:
    ``hidden[t]`` is ``h_t`` of the sequence ``tokens`` (a function of ``tokens[: t + 1]`` only, so
    it holds for any sequence sharing that prefix). Only forwards over ``lm``'s own cache are
    taken: another user of the same model (``generate``, another target) is ignored, so it cannot
    make the tap forget the prefix ``lm``'s cache still holds (which would make the draft re-run
    the target over the whole prefix); a forward over a new cache of ``lm`` (after a reset)
    starts over. Batched forwards are ignored (``lm``'s forwards have batch 1).

    Trees: the fed rows of a tree forward (the fresh prefix tokens, then the nodes) form a tree
    below the held sequence: row ``r``'s parent is the deepest fed row it attends to, and the
    forward is taken only when row ``r`` attends to every held position, exactly its ancestors and
    itself, at position ``start + depth(r) - 1`` (what a plain forward over its path would see; any
    other mask keeps only the prefix before it). The tree's rows stay pending until
    :meth:`features` is given the sequence the decoder went on with: the rows of the path that
    sequence follows are appended (the cache's own compaction keeps the same path), so the next
    round's features need no recomputation. A later forward is checked against the tokens the
    cache then holds (``lm.tokens``): the tap keeps only what agrees with them.
    """

    def __init__(self, lm):
        self.lm = lm
        model = lm.model
        self.hidden = torch.empty(0, model.config.hidden_size)  # [M, d]
        self.tokens = torch.empty(0, dtype=torch.int64)  # [M]
        self.tree = None  # (ids [T], parents [T], rows [T, d]): a pending tree below self.tokens
        self._cache = None  # the cache of the forwards applied so far (by identity)
        self._pending = []  # [cache, start, ids [T], tree parents [T] / None / False, rows [T, d] / None, held] per forward
        self._handles = [model.register_forward_pre_hook(self._start, with_kwargs=True),
                         model.model.norm.register_forward_pre_hook(self._keep)]

    def _start(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if ids is None or ids.shape[0] != 1 or cache is not self.lm.cache:
            return  # another user of the model (a generate, another target's cache): not lm's sequence
        start = cache.get_seq_length() if cache is not None else 0
        tree = None
        if kwargs.get("position_ids") is not None:
            tree = _fed_tree(kwargs.get("attention_mask"), kwargs["position_ids"], start, ids.shape[1])
        held = self.lm.tokens.clone() if cache is not None and cache is self.lm.cache else None
        self._pending.append([cache, start, ids[0].detach().clone(), tree, None, held])

    def _keep(self, module, args) -> None:
        if self._pending and self._pending[-1][4] is None:  # the first norm call after the model's start
            self._pending[-1][4] = args[0][0].detach().float()

    def remove(self) -> None:
        """Take the hooks off the target."""
        for handle in self._handles:
            handle.remove()

    def _settle(self, seq: Optional[torch.Tensor]) -> None:
        """Append the pending tree's rows along the path ``seq`` ``[L]`` follows (none if ``seq`` is None)."""
        if self.tree is None:
            return
        ids, parents, rows = self.tree
        self.tree = None
        base = self.tokens.numel()
        if seq is None or _common_prefix(self.tokens, seq) < base:
            return
        children = {}
        for i, (p, t) in enumerate(zip(parents.tolist(), ids.tolist())):
            children.setdefault((p, t), i)
        node, path = -1, []
        for t in seq[base:].tolist():
            node = children.get((node, t))
            if node is None:
                break
            path.append(node)
        if path:
            self.hidden = torch.cat([self.hidden, rows[path]])
            self.tokens = torch.cat([self.tokens, ids[path]])

    def features(self, seq: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(hidden [M, d], tokens [M])`` after the target's forwards so far.

        ``seq`` ``[L]``: the sequence the decoder continues with; a pending tree (the last forward
        was a tree's) then contributes the rows of the path ``seq`` follows. Without it the tree
        stays pending and only what was known before its forward is returned (the prefix tokens
        fed with the tree are rows of that pending tree too).
        """
        for cache, start, ids, tree, rows, held in self._pending:
            same = cache is self._cache and cache is not None
            if held is not None and same:
                self._settle(held)  # the path the cache kept (it compacts before feeding)
            self.tree = None if not same else self.tree
            known = self.tokens.numel() if same else 0
            if held is not None:
                known = min(known, _common_prefix(self.tokens, held))
            self._cache = cache
            if rows is None or tree is False or start > known or rows.shape[0] != ids.numel():
                keep = min(known, start)  # what this forward did not touch
                self.hidden, self.tokens, self.tree = self.hidden[:keep], self.tokens[:keep], None
                continue
            self.hidden, self.tokens = self.hidden[:start], self.tokens[:start]
            if tree is None:  # a plain causal forward
                self.hidden, self.tokens, self.tree = torch.cat([self.hidden, rows]), torch.cat([self.tokens, ids]), None
            else:
                self.tree = (ids, tree, rows)
        self._pending = []
        if seq is not None:
            self._settle(torch.as_tensor(seq).reshape(-1))
        return self.hidden, self.tokens


def _fed_tree(mask, positions, start: int, n_fed: int):
    """The tree ``parents [T]`` of a forward's fed rows (the mask's view), or False when the mask is
    not a tree's: every row must attend to all ``start`` held positions, to exactly its ancestors
    and itself among the fed rows, and sit at ``start + depth - 1``. A row's parent is the deepest
    fed row it attends to. ``mask``: an additive ``[1, 1, T, start + T]`` mask (0 = attend) or a
    bool one, or None (causal); ``positions`` ``[1, T]``."""
    positions = positions.reshape(-1)
    if positions.numel() != n_fed:
        return False
    if mask is None:
        parents = torch.arange(-1, n_fed - 1, dtype=torch.int64)
    else:
        if mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (n_fed, start + n_fed):
            return False
        allowed = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0
        if not bool(allowed[:, :start].all()):
            return False
        fed = allowed[:, start:]  # [T, T]
        below = fed & torch.ones(n_fed, n_fed, dtype=torch.bool).tril(-1)
        idx = torch.arange(n_fed)
        parents = torch.where(below.any(1), (below * (idx[None, :] + 1)).max(1).values - 1, torch.tensor(-1))
        if not torch.equal(fed, ancestor_mask(parents)):
            return False
    if not torch.equal(positions, start - 1 + depths(parents)):
        return False
    return parents


class _PairCache:
    """What the learned drafts share: the target's hidden states (:class:`HiddenTap`), the
    draft's KV cache of the true pairs ``(h_t, x_{t+1})``, kept across rounds (only new pairs are
    fed), and the rows it proposes from. ``target``: the verifying
    :class:`~specverify.integrations.transformers.CausalLMTarget`.

    ``context_rows`` (default True): a call proposes from the head's trained rows and, after them,
    the target's LM-head rows of every token of its prefix outside them (``row_ids [V_r + C]``,
    the tokens of the rows in order; ``C`` was 1-16 on the held-out chat prompts). Answers copy their prompt
    -- a name, a listed word, an identifier -- and a reduced vocabulary chosen on the training
    answers misses such tokens (on the held-out prompts ~0.10 of the target's answer tokens lay
    outside the 12288 trained rows, three in four of them earlier in the context); their logits
    come from the same feature ``f``. Rows are fixed for a call: its law is a softmax over them."""

    def __init__(self, head: FeatureHead, target, context_rows: bool = True):
        if not isinstance(context_rows, bool):
            raise TypeError(f"context_rows must be True or False, got {context_rows!r}")
        self.context_rows = context_rows
        self.row_ids = head.vocab_ids  # [V_r + C]
        self._trained = torch.zeros(head.lm_head.shape[0], dtype=torch.bool)  # [V]: in the trained rows
        self._trained[head.vocab_ids] = True
        self._extra = head.vocab_ids[:0]  # [C] sorted: the context's tokens outside the trained rows
        self._extra_rows = head.head[:0]  # [C, d]
        self.head = head
        self.lm = target.lm
        self.sampling = target.sampling
        self.greedy = bool(self.sampling.greedy)
        self.vocab_size = int(head.embed.shape[0])
        self.tap = HiddenTap(self.lm)
        self._past = None  # (keys, values) [1, kv, P, hd] of the true pairs 0 .. P-1
        self._pair_tokens = torch.empty(0, dtype=torch.int64)  # tokens 0 .. P the pairs were built on
        self.steps = 0
        self.proposed = 0

    def _set_rows(self, seq: torch.Tensor) -> None:
        """``row_ids``: the trained rows, then (``context_rows``) the tokens of ``seq`` outside them."""
        if not self.context_rows:
            return
        # a mask lookup, not torch.isin against the 12288 ids (~0.45 ms a call, a tenth of a draft step)
        extra = torch.unique(seq[~self._trained[seq]])
        if not torch.equal(extra, self._extra):
            self._extra, self._extra_rows = extra, self.head.lm_head[extra]
            self.row_ids = torch.cat([self.head.vocab_ids, extra])

    def _sync(self, seq: torch.Tensor):
        """Set the rows (:meth:`_set_rows`) and feed the true pairs up to ``N - 2`` (``N =
        len(seq)``); return the last one's ``(f [d], logits [V_r + C])``."""
        self._set_rows(seq)
        n = seq.numel()
        hidden, known = self.tap.features(seq)
        if _common_prefix(known, seq) < n - 1:  # the target has not scored this prefix: let it
            self.lm.reset()  # (from scratch: positions its cache holds may be unknown to the tap)
            self.lm.logits(seq, 1)
            hidden, known = self.tap.features(seq)
        pairs = n - 1
        keep = max(0, min(_common_prefix(self._pair_tokens, seq) - 1, pairs - 1))
        past = None
        if keep and self._past is not None:
            past = (self._past[0][:, :, :keep], self._past[1][:, :, :keep])
        feats = hidden[keep:pairs][None]  # [1, T, d]
        f, logits, self._past = self.head(feats, seq[keep + 1 : pairs + 1][None], torch.arange(keep, pairs), past=past,
                                          last_only=True, extra=self._extra_rows)
        self._pair_tokens = seq[: pairs + 1].clone()
        self.steps += 1
        return f[0, -1], logits[0, -1]


def _check_gate(min_confidence) -> float:
    if isinstance(min_confidence, bool) or not isinstance(min_confidence, (int, float)) or not 0 <= min_confidence < 1:
        raise ValueError(f"min_confidence must be a number in [0, 1), got {min_confidence!r}")
    return float(min_confidence)


class LearnedDraft(_PairCache):
    """``draft_step(prefix, k, stop=None) -> (tokens [j], probs [j, V] or None)`` from a
    :class:`FeatureHead` reading the target's own hidden states (EAGLE), j <= k.

    ``target`` is the :class:`~specverify.integrations.transformers.CausalLMTarget` that verifies
    (its cache and hidden states are shared: the draft reads ``h_t`` of every position the target
    has scored). When the target has not seen the prefix yet (the first round), the draft runs it
    over the prefix first (the target's next call reuses that cache). The draft keeps its own
    cache of the true pairs ``(h_t, x_{t+1})`` across rounds and feeds only the new ones; drafted
    pairs are dropped after each round. Greedy (``sampling.greedy``): tokens are argmaxes over the
    rows (``row_ids``) and ``probs`` is None. Sampling: ``probs[i]`` is the draft's row ``q_i``
    ``[V]`` (``sampling``'s warp over its rows, zero outside them) and ``tokens[i]`` is
    drawn from it with ``generator``. ``stop(i, confidence)`` as in
    :class:`~specverify.integrations.transformers.CausalLMDraft`.

    ``min_confidence`` (the gate, 0 = off): position ``i`` is proposed only if
    ``c_i = q_1(t_1) ... q_{i-1}(t_{i-1}) * max q_i`` -- the draft's own estimate that the
    round reaches and accepts it -- is at least ``min_confidence``; the proposal ends at the
    first position that fails, and may be empty (the round is then a plain target step). ``q``
    is the draft's softmax over its rows (greedy) or its warped row (sampling).
    The decision reads the tokens before ``i`` and the row ``q_i``, never ``t_i`` itself, so
    verification stays exact (:mod:`specverify.decoding.adaptive`'s claim); unlike the policy's
    ``stop``, which keeps the token it stops after, the gate can leave a round without a draft,
    where a proposal that will most likely be rejected would cost more than it gains. ``gate(i,
    path, top) -> bool`` (a :class:`~specverify.decoding.planner.Planner`'s position-by-position
    rule, with ``path = q_1(t_1) ... q_{i-1}(t_{i-1})`` and ``top = max q_i``): asked before each
    ``t_i`` is drawn, the proposal ends where it says False, like ``min_confidence``. Counters:
    ``steps`` (draft forwards), ``proposed`` (tokens), ``empty`` (calls the gate left without a
    token); ``last_logits`` ``[j, V_r + C]`` of the latest proposal (over ``row_ids``). Not
    thread-safe (one decoder at a time, as the target).
    """

    def __init__(self, head: FeatureHead, target, generator: Optional[torch.Generator] = None,
                 min_confidence: float = 0.0, context_rows: bool = True):
        super().__init__(head, target, context_rows)
        self.generator = generator
        self.min_confidence = _check_gate(min_confidence)
        self.empty = 0

    @torch.inference_mode()
    def __call__(self, prefix: torch.Tensor, k: int, stop=None, gate=None):
        seq = torch.as_tensor(prefix).reshape(-1).to(torch.int64)
        n = seq.numel()
        if n < 2:  # a pair needs a token after a position
            return seq[:0], None
        f, z = self._sync(seq)
        past = self._past
        ids = self.row_ids
        tokens = torch.empty(k, dtype=torch.int64)
        probs = None if self.greedy else torch.zeros(k, self.vocab_size, dtype=torch.float32)
        logits = torch.empty(k, z.numel())
        floor = self.min_confidence
        tops = floor or gate is not None  # whether max q_i is needed
        path = 1.0  # q_1(t_1) ... q_i(t_i): the draft's probability of the tokens drafted so far
        drawn = k
        for i in range(k):
            logits[i] = z
            if self.greedy:
                j = int(torch.argmax(z))
                confidence = float(torch.softmax(z.double(), 0)[j]) if stop is not None or tops else 1.0
                top = confidence
            else:
                row = self.sampling.rows(z[None])[0]  # [V_r + C], warped like the target's rows
                total = row.sum()
                top = float(row.max() / total) if tops else 1.0
            if floor and path * top < floor or gate is not None and not gate(i, path, top):  # before t_i is drawn
                drawn = i
                break
            if not self.greedy:
                j = int(torch.multinomial(row, 1, generator=self.generator))
                probs[i, ids] = row
                confidence = float(row[j] / total)
            tokens[i] = ids[j]
            path *= confidence
            if stop is not None and stop(i, confidence):
                drawn = i + 1
                break
            if floor and path < floor:  # no later position can pass: skip the draft step
                drawn = i + 1
                break
            if i + 1 < k:  # the next pair: the draft's own feature and the token just drafted
                f3, z3, past = self.head(f[None, None], tokens[i : i + 1][None], torch.tensor([n - 1 + i]), past=past,
                                         extra=self._extra_rows)
                f, z = f3[0, -1], z3[0, -1]
                self.steps += 1
        self.proposed += drawn
        self.empty += drawn == 0
        self.last_logits = logits[:drawn]  # [j, V_r + C] (diagnostics; over row_ids)
        return tokens[:drawn].clone(), None if probs is None else probs[:drawn].clone()


class LearnedTreeDraft(_PairCache):
    """``draft_step(prefix, k) -> DraftTree``: an EAGLE-2 dynamic tree from the :class:`FeatureHead`.

    As :class:`~specverify.integrations.transformers.CausalLMTreeDraft`, with the learned draft's
    pairs in place of a draft model's tokens. After the true pairs are synced (as
    :class:`LearnedDraft`: the target's hidden states, the draft's cache of true pairs kept across
    rounds), the last true pair's logits give the root's children. At each depth the ``top_k``
    most likely children of every frontier node (softmax over its rows at
    ``temperature``) are scored by the product of draft probabilities along their path; the
    ``beam`` best are expanded by ONE :class:`FeatureHead` call over those nodes: node ``c``'s pair
    is ``(f_parent, token_c)`` (``f`` of the root is the last true pair's), at position
    ``N - 2 + depth(c)`` (``N = len(prefix)``), attending to every true pair, its expanded
    ancestors and itself (tree attention over the draft's own KV: ``[P + E, ...]``, the true
    pairs then the expanded nodes). After ``k`` levels every candidate competes by that product
    and the best ``node_budget`` form the tree (the same rerank as
    :class:`~specverify.integrations.transformers.CausalLMTreeDraft`: ancestors score at least as high as their children, so the kept set is a tree).

    ``children`` says how a node's children are chosen. ``"top_k"`` (the default): the ``top_k``
    most likely, deterministic (``probs=None``, verified by sample-and-match) in greedy and
    sampling mode alike, so the decoder's output law is the target's whatever the draft proposes.
    In sampling mode the children may instead be *drawn* from the node's warped row ``q`` (zero
    outside its rows) with ``generator``, and the tree carries the rows
    (``probs [N + 1, V]``) for :func:`specverify.accept_tree`'s stochastic rules:
    ``"without_replacement"`` (one after another, siblings distinct, by Gumbel-top-k: recursive
    rejection sampling, EAGLE / Jeon et al. 2024) or ``"with_replacement"`` (i.i.d.; SpecInfer's
    rule; :attr:`~specverify.decoding.tree_drafts.DraftTree.replacement` set). A drawn tree is never
    reranked (dropping a drawn child for its own probability would bias what is kept): each level
    expands the ``beam`` drawn nodes of highest path probability, which draw up to ``top_k``
    children each while ``node_budget`` lasts, best node first. Every choice of shape reads the
    path to a node (its own token included) and other nodes' draws, never the node's own
    children, so verification stays exact.
    Tree nodes' pairs are dropped after the call (the cache keeps the true pairs only); after the
    target scores the tree, :class:`HiddenTap` takes the hidden rows of the path the decoder
    accepted from that forward. Counters: ``steps`` (draft forwards), ``proposed`` (nodes);
    ``last_logits`` (diagnostics): ``{token path (tuple): logits [V_r + C]}`` (over ``row_ids``) of
    the root (``()``) and every expanded node of the latest call. Not thread-safe (one decoder at a
    time, as the target).

    ``temperature`` is the top-k ranking's softmax temperature (drawn children use ``sampling``'s
    warp, as the target's rows).

    ``min_confidence`` (the gate, 0 = off): only candidates whose path probability is at least
    ``min_confidence`` compete for the ``node_budget`` (a node's path probability is at most its
    parent's, so they still form a tree) and only they are expanded; the tree may be empty (a
    plain target step). Any rule that shapes a tree of deterministic children keeps verification
    exact. Drawn children: a node stops drawing before child ``j`` when its path probability
    times the largest probability left to draw (``max q`` without the children drawn before it,
    renormalized; ``max q`` with replacement) is below the gate, the chain's rule decided before
    the draw. ``empty`` counts the calls the gate left without a node.
    """

    CHILDREN = ("top_k", "without_replacement", "with_replacement")

    def __init__(self, head: FeatureHead, target, node_budget: int = 16, top_k: int = 4, beam: int = 4,
                 temperature: float = 1.0, min_confidence: float = 0.0, children: str = "top_k",
                 generator: Optional[torch.Generator] = None, context_rows: bool = True):
        _check_tree_shape(node_budget, top_k, beam, temperature)
        if children not in self.CHILDREN:
            raise ValueError(f"children must be one of {self.CHILDREN}, got {children!r}")
        super().__init__(head, target, context_rows)
        if children != "top_k" and self.greedy:
            raise ValueError(f"children={children!r} draws from the draft's rows: it needs a sampling target "
                             "(greedy verification matches tokens; use children='top_k')")
        self.node_budget, self.top_k, self.beam, self.temperature = int(node_budget), int(top_k), int(beam), temperature
        self.min_confidence = _check_gate(min_confidence)
        self.children, self.generator = children, generator
        self.empty = 0

    @torch.inference_mode()
    def __call__(self, prefix: torch.Tensor, k: int) -> DraftTree:
        seq = torch.as_tensor(prefix).reshape(-1).to(torch.int64)
        n = seq.numel()
        if n < 2 or k < 1:  # a pair needs a token after a position
            return DraftTree(seq[:0], seq[:0])
        f, z = self._sync(seq)
        if self.children != "top_k":
            return self._count(self._drawn_tree(n, f, z, k))
        ids = self.row_ids
        past = self._past  # the true pairs [1, kv, P, hd], then the expanded nodes
        n_pairs = past[0].shape[2]
        tokens, parents, scores = [], [], []  # every candidate: token, parent, log path probability
        expanded = []  # candidates expanded so far, in order (their draft KV follows the true pairs')
        frontier = [(-1, 0.0, f, z)]  # (candidate id, log path probability, feature [d], logits [V_r + C])
        paths, self.last_logits = {-1: ()}, {}
        log_gate = math.log(self.min_confidence) if self.min_confidence else -math.inf
        for depth in range(k):
            level = []
            for cand, score, _, logits in frontier:
                self.last_logits[paths[cand]] = logits
                logp = torch.log_softmax(logits / self.temperature, dim=-1)
                for c in _add_children(tokens, parents, scores, cand, score, logp, self.top_k, ids):
                    level.append(c)
                    paths[c] = paths[cand] + (tokens[c],)
            if self.min_confidence:  # a node's children score at most its own: only passing nodes grow
                level = [c for c in level if scores[c] >= log_gate]
            if depth == k - 1 or not level:
                break
            frontier, past = self._expand_level(level, frontier, tokens, parents, scores, expanded, past, n_pairs,
                                                n - 1 + depth)
        budget = min(self.node_budget, sum(score >= log_gate for score in scores))
        return self._count(_rerank(tokens, parents, scores, budget))

    def _expand_level(self, level, frontier, tokens, parents, scores, expanded, past, n_pairs: int, position: int):
        """Expand the ``beam`` best candidates of ``level`` (appended to ``expanded``) by ONE head
        call: candidate ``c``'s pair is ``(f of its parent, tokens[c])`` at ``position``, attending to
        the ``n_pairs`` true pairs, its expanded ancestors and itself. Returns the next frontier
        ``[(candidate, score, f [d], logits [V_r + C])]``, best first, and the draft's grown KV."""
        best, start, tree_parents = _expand(level, scores, parents, expanded, self.beam)
        feature = {c: feat for c, _, feat, _ in frontier}  # a candidate's pair reads its parent's f
        allowed = torch.ones(len(best), n_pairs + len(expanded), dtype=torch.bool)  # [B, P + E]
        allowed[:, n_pairs:] = ancestor_mask(tree_parents)[start:]
        feats = torch.stack([feature[parents[c]] for c in best])[None]  # [1, B, d]
        f3, z3, past = self.head(feats, torch.tensor([[tokens[c] for c in best]]), torch.tensor([position] * len(best)),
                                 past=past, mask=allowed, extra=self._extra_rows)
        self.steps += 1
        return [(c, scores[c], f3[0, i], z3[0, i]) for i, c in enumerate(best)], past

    def _count(self, tree: DraftTree) -> DraftTree:
        self.proposed += tree.n_nodes
        self.empty += tree.n_nodes == 0
        return tree

    def _draw(self, row: torch.Tensor, m: int) -> list:
        """``m`` entries of ``row`` ``[V_r + C]`` (a warped draft row), in draw order: one after another
        without replacement (Gumbel-top-k: the order of ``log q + Gumbel`` keys is a sequential
        draw without replacement, Kool et al. 2019) or i.i.d."""
        if self.children == "with_replacement":
            return torch.multinomial(row, m, replacement=True, generator=self.generator).tolist()
        u = torch.rand(row.numel(), dtype=torch.float64, generator=self.generator)
        keys = torch.log(row.double()) - torch.log(-torch.log1p(-u))  # -log(1 - u): u = 0 is drawn, 1 never
        return torch.topk(keys, m).indices.tolist()  # q = 0 entries have key -inf: m <= support

    def _gate_stops(self, score: float, q: torch.Tensor, drawn: list) -> int:
        """How many of ``drawn`` (a node's children, in draw order) pass the gate: child ``j`` is
        kept while ``exp(score) * max q^(j)`` is at least it (``q^(j)``: ``q`` without the
        children before ``j``, renormalized; ``q`` itself with replacement)."""
        if not self.min_confidence:
            return len(drawn)
        left, taken = q.clone(), 0
        for j in drawn:
            if math.exp(score) * float(left.max() / left.sum()) < self.min_confidence:
                break
            taken += 1
            if self.children == "without_replacement":
                left[j] = 0.0
        return taken

    def _drawn_tree(self, n: int, f: torch.Tensor, z: torch.Tensor, k: int) -> DraftTree:
        """The tree of drawn children (``children`` not ``"top_k"``); see the class docstring."""
        ids = self.row_ids
        past = self._past
        n_pairs = past[0].shape[2]
        tokens, parents, scores = [], [], []  # every node: token, parent, log path probability
        rows = {}  # node -> its warped row [V_r + C] (the law its children were drawn from); -1 the root
        expanded = []
        frontier = [(-1, 0.0, f, z)]
        paths, self.last_logits = {-1: ()}, {}
        log_gate = math.log(self.min_confidence) if self.min_confidence else -math.inf
        for depth in range(k):
            level = []
            for cand, score, _, logits in frontier:  # best path first: it draws first
                self.last_logits[paths[cand]] = logits
                row = self.sampling.rows(logits[None])[0]
                rows[cand] = row
                q = row / row.sum()
                m = min(self.top_k, self.node_budget - len(tokens), int((q > 0).sum()))
                drawn = self._draw(q, m) if m > 0 else []
                for j in drawn[: self._gate_stops(score, q, drawn)]:
                    tokens.append(int(ids[j]))
                    parents.append(cand)
                    scores.append(score + math.log(float(q[j])))
                    level.append(len(tokens) - 1)
                    paths[len(tokens) - 1] = paths[cand] + (int(ids[j]),)
            if self.min_confidence:  # a node below the gate has no child that passes: not worth a draft call
                level = [c for c in level if scores[c] >= log_gate]
            if depth == k - 1 or not level or len(tokens) >= self.node_budget:
                break
            frontier, past = self._expand_level(level, frontier, tokens, parents, scores, expanded, past, n_pairs,
                                                n - 1 + depth)  # best path first
        probs = torch.zeros(len(tokens) + 1, self.vocab_size, dtype=torch.float32)  # [N + 1, V]
        for r in range(len(tokens) + 1):  # a leaf's row is not read: the root's stands in
            probs[r, ids] = rows.get(r - 1, rows[-1])
        return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64), probs,
                         replacement=self.children == "with_replacement")
