"""SpeculativeDecoder with tree drafts, on Markov (bigram) models small enough to enumerate.

Sections: structure and bookkeeping of tree rounds; greedy mode == plain greedy decoding of the
target; sampling mode with deterministic children (sample-and-match) preserves the target's joint
law over whole continuations (chi-square on counts against the enumerated law, alpha = 1e-6, fixed
seeds), and the same test rejects broken tree rules (power check): a node rule of section B.5 and
a residual that keeps the rejected children (written with ``tests/tree_rules.walk``), and rows
aligned to each node's parent instead of the node (an off-by-one of the tree row layout). Drawn
children (``DraftTree.probs``, without or with replacement) keep the law; draws without
replacement flagged as i.i.d. are rejected, i.i.d. draws flagged as distinct raise.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from experiments import stats as st  # noqa: E402
from experiments.law.synthetic import BigramModel  # noqa: E402
from specverify import law  # noqa: E402
from specverify.decoding.tree_drafts import DraftTree, Trie, ancestor_mask, chain_parents, depths, path_to  # noqa: E402
from test_decoder import bigram_pair, continuation_chisquare  # noqa: E402
from tree_rules import target_only_not_renormalized, walk  # noqa: E402

ALPHA = 1e-6  # per law test; every test below is deterministic (fixed seeds)


# ------------------------------------------------------------------------------------------
# tree drafts and a tree-scoring target on bigrams
# ------------------------------------------------------------------------------------------
def markov_tree_draft(draft: BigramModel, widths=(2, 2, 1), reverse=False, log=None):
    """Deterministic children: at depth d every node gets the top widths[d] tokens of the draft's row
    (``reverse``: tested least likely first). Depth is capped by the decoder's k."""

    def step(prefix, k):
        if log is not None:
            log.append(("draft", prefix.clone(), k))
        trie_tokens, parents, frontier = [], [], [(-1, int(prefix[-1]))]
        for width in widths[:k]:
            nxt = []
            for node, prev in frontier:
                top = np.argsort(-draft.table[prev], kind="stable")[:width]
                for tok in (top[::-1] if reverse else top):
                    parents.append(node)
                    trie_tokens.append(int(tok))
                    nxt.append((len(trie_tokens) - 1, int(tok)))
            frontier = nxt
        return DraftTree(trie_tokens, parents)

    return step


def drawn_markov_tree_draft(draft: BigramModel, widths=(2, 2), replacement=False, seed=0, flag=None):
    """Drawn children: at depth d every node draws widths[d] children from the draft's row, one
    after another without replacement (Gumbel-top-k) or i.i.d. (``replacement``); the tree carries
    the rows (``probs [N + 1, V]``) and says how they were drawn (``flag``, default ``replacement``:
    a wrong flag is the broken variant)."""
    rng = np.random.default_rng(seed)

    def step(prefix, k):
        tokens, parents, rows, frontier = [], [], [draft.table[int(prefix[-1])]], [(-1, int(prefix[-1]))]
        for width in widths[:k]:
            nxt = []
            for node, prev in frontier:
                q = draft.table[prev]
                if replacement:
                    drawn = rng.choice(q.size, size=width, p=q)
                else:
                    keys = np.log(q) + rng.gumbel(size=q.size)  # zeros: -inf, never drawn
                    drawn = np.argsort(-keys, kind="stable")[: min(width, int((q > 0).sum()))]
                for tok in drawn:
                    parents.append(node)
                    tokens.append(int(tok))
                    rows.append(draft.table[int(tok)])  # node's row: the law of its children
                    nxt.append((len(tokens) - 1, int(tok)))
            frontier = nxt
        return DraftTree(tokens, parents, np.array(rows), replacement=replacement if flag is None else flag)

    return step


def markov_tree_target(target: BigramModel, log=None):
    """Row 0 after the prefix, row i + 1 after node i: a bigram only needs each node's own token."""

    def step(prefix, proposed, parents=None):
        if log is not None:
            log.append(("target", prefix.clone(), proposed.clone(), None if parents is None else parents.clone()))
        return target.rows([int(prefix[-1])] + [int(t) for t in proposed])

    return step


# ------------------------------------------------------------------------------------------
# structure and bookkeeping
# ------------------------------------------------------------------------------------------
def test_tree_helpers():
    parents = torch.tensor([-1, -1, 0, 0, 2, 1])
    assert depths(parents).tolist() == [1, 1, 2, 2, 3, 2]
    assert path_to(parents.tolist(), 4) == [0, 2, 4] and path_to(parents.tolist(), -1) == []
    mask = ancestor_mask(parents)
    assert mask[4].nonzero().flatten().tolist() == [0, 2, 4] and mask[5].nonzero().flatten().tolist() == [1, 5]
    assert chain_parents(4).tolist() == [-1, 0, 1, 2]
    trie = Trie(max_nodes=6)
    assert trie.insert([5, 6, 7]) == 3 and trie.insert([5, 6, 8]) == 1 and trie.insert([9, 5, 6, 1]) == 2
    tree = trie.tree()
    assert tree.tokens.tolist() == [5, 6, 7, 8, 9, 5] and tree.parents.tolist() == [-1, 0, 1, 1, -1, 4]
    assert tree.depth() == 3 and trie.full
    for bad in ([0], [-1, 1], [-1, -2]):
        with pytest.raises(ValueError, match="parents"):
            DraftTree([1] * len(bad), bad)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("k,max_new", [(1, 5), (3, 1), (3, 7), (4, 23)])
def test_tree_rounds_length_prefix_and_stats(greedy, k, max_new):
    target, draft = bigram_pair(0, 6)
    log = []
    dec = sv.SpeculativeDecoder(markov_tree_draft(draft, (3, 2, 1, 1), log=log), markov_tree_target(target, log),
                                k=k, greedy=greedy, generator=np.random.default_rng(2))
    prompt = torch.tensor([3, 1, 4])
    out = dec.generate(prompt, max_new=max_new)
    assert out.numel() == prompt.numel() + max_new and torch.equal(out[:3], prompt)
    s = dec.stats
    assert sum(s.emitted) == max_new and all(e == a + 1 for a, e in zip(s.accepted, s.emitted))
    assert s.tree_rounds == sum(1 for m in s.drafted if m > 0)
    for entry in log:
        if entry[0] == "draft":
            remaining = max_new - (entry[1].numel() - prompt.numel())
            assert entry[2] == min(k, remaining - 1) >= 1
        else:
            _, prefix, proposed, parents = entry
            assert torch.equal(prefix, out[: prefix.numel()])
            if proposed.numel():
                assert parents is not None and int(depths(parents).max()) <= min(k, max_new - 1)
    assert all(a <= min(k, m) for a, m in zip(s.accepted, s.drafted))


def test_tree_deeper_than_asked_is_an_error():
    target, draft = bigram_pair(0, 5)
    dec = sv.SpeculativeDecoder(lambda p, k: DraftTree([1, 2, 3], [-1, 0, 1]), markov_tree_target(target), k=2)
    with pytest.raises(ValueError, match="tree of depth 3, asked for at most 2"):
        dec.generate([1], max_new=5)


# ------------------------------------------------------------------------------------------
# greedy: token-for-token plain greedy decoding of the target
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("widths", [(1, 1, 1), (2, 2, 1), (3, 1, 2, 1)])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_tree_reproduces_plain_greedy(widths, k):
    accepted = side = 0
    for seed in range(3):
        target, draft = bigram_pair(seed, 11, lam=0.35, concentration=0.3)
        dec = sv.SpeculativeDecoder(markov_tree_draft(draft, widths), markov_tree_target(target), k=k, greedy=True)
        for prompt in ([0], [5, 2]):
            for max_new in (1, 2, k + 1, 37):
                out = dec.generate(torch.tensor(prompt), max_new=max_new)
                assert out[len(prompt):].tolist() == target.greedy(prompt, max_new)
                accepted += sum(dec.stats.accepted)
    assert accepted > 0


def test_wider_trees_accept_more_per_pass():
    target, draft = bigram_pair(1, 11, lam=0.6, concentration=0.3)
    per_pass = []
    for widths in ((1, 1, 1), (3, 2, 2)):
        dec = sv.SpeculativeDecoder(markov_tree_draft(draft, widths), markov_tree_target(target), k=3, greedy=True)
        dec.generate(torch.tensor([0]), max_new=200)
        per_pass.append(dec.stats.tokens_per_round)
    assert per_pass[1] > per_pass[0] * 1.1, per_pass


# ------------------------------------------------------------------------------------------
# sampling: the joint law of whole continuations
# ------------------------------------------------------------------------------------------
class BrokenTreeRule(sv.SpeculativeDecoder):
    """A tree verifier written from a (broken) node rule; N + 1 uniforms per round, as the op draws."""

    node_rule = None

    def _verify_tree(self, target_probs, draft_probs, tokens, parents, replacement=False):
        u = self.generator.random(tokens.numel() + 1)
        rows = np.asarray(target_probs, dtype=np.float64)
        return walk(rows, rows, tokens.tolist(), parents.tolist(), u, type(self).node_rule)


def _children_kept(p, q, tokens):
    accept, _ = law.node_rule(p, q, tokens, "deterministic")
    return accept, p / p.sum()


class WalkedRule(BrokenTreeRule):
    """Not broken: the harness's own walk with the correct rule must pass (the power checks test the rules)."""

    node_rule = staticmethod(lambda p, q, tokens: law.node_rule(p, q, tokens, "deterministic"))


class UnconditionedSiblings(BrokenTreeRule):
    """Broken (B.5): sibling j accepted w.p. P(c_j), not P(c_j) over the mass its earlier siblings left."""

    node_rule = staticmethod(target_only_not_renormalized)


class ChildrenKeptInFinalDraw(BrokenTreeRule):
    """Broken: on total rejection the next token is drawn from P with the rejected children still in."""

    node_rule = staticmethod(_children_kept)


class RowsOfTheParent(sv.SpeculativeDecoder):
    """Broken layout: row i + 1 taken from node i's parent position (the chain's off-by-one, in trees)."""

    def _verify_tree(self, target_probs, draft_probs, tokens, parents, replacement=False):
        rows = np.asarray(target_probs)
        shifted = np.concatenate([rows[:1], rows[parents.numpy() + 1]])
        return super()._verify_tree(shifted, draft_probs, tokens, parents, replacement)


def tree_continuation_test(cls, *, vocab, length, k, runs, seed, widths, reverse=False, lam=0.5):
    target, draft = bigram_pair(seed, vocab, lam=lam)
    dec = cls(markov_tree_draft(draft, widths, reverse), markov_tree_target(target), k=k, greedy=False,
              generator=np.random.default_rng(seed))
    return continuation_chisquare(dec, target, length, runs)


TREE_CASES = [  # (vocab, length, k, widths, reverse)
    (4, 3, 2, (2, 2), False),  # two siblings at each of two levels
    (4, 3, 2, (3, 1), True),  # three root children, tested least likely first
    (3, 5, 3, (2, 1, 2), False),  # 243 continuations across several rounds
    (4, 3, 3, (1, 1, 1), False),  # a chain handed over as a tree
]


@pytest.mark.parametrize("vocab,length,k,widths,reverse", TREE_CASES)
def test_tree_sampling_preserves_joint_law(vocab, length, k, widths, reverse):
    res, rounds_per_run = tree_continuation_test(sv.SpeculativeDecoder, vocab=vocab, length=length, k=k,
                                                 runs=4000, seed=7, widths=widths, reverse=reverse)
    assert res.dof >= 10 and rounds_per_run > 1.2
    assert res.pvalue > ALPHA, res


def test_tree_sampling_with_an_adaptive_depth_preserves_joint_law():
    """AdaptiveK choosing each round's tree depth from past rounds (a cost model, no clock): the
    joint law holds (the proof in specverify.decoding.adaptive covers trees: the depth is decided before
    drafting, from the past only), and the depth really varied from round to round."""
    from specverify.decoding.adaptive import AdaptiveK

    asked = []

    class Recorded(AdaptiveK):
        def draft_length(self, limit):
            k = super().draft_length(limit)
            asked.append((k, limit))
            return k

    target, draft = bigram_pair(7, 4, lam=0.5)
    policy = Recorded(k_max=3, decay=0.9, draft_cost=0.02, target_cost=lambda n: 1.0 + 0.1 * (n - 1),
                      explore_every=3, carry=1.0)
    dec = sv.SpeculativeDecoder(markov_tree_draft(draft, (2, 2, 1)), markov_tree_target(target), k=policy,
                                greedy=False, generator=np.random.default_rng(7))
    res, rounds_per_run = continuation_chisquare(dec, target, 4, 4000)
    assert policy.tree_draft and res.dof >= 10 and rounds_per_run > 1.2
    assert len({k for k, limit in asked if limit >= 3}) >= 3, sorted(set(asked))
    assert res.pvalue > ALPHA, res


# A draft far from the target (lam 0.9) with wide levels, where the two stochastic rules differ most.
DRAWN = dict(lam=0.9, widths=(3, 2))


@pytest.mark.parametrize("replacement", [False, True])
def test_drawn_tree_sampling_preserves_joint_law(replacement):
    """Children drawn from the draft's rows (without replacement: recursive rejection sampling;
    with: SpecInfer's rule, chosen by DraftTree.replacement): the joint law holds."""
    target, draft = bigram_pair(7, 4, lam=DRAWN["lam"])
    dec = sv.SpeculativeDecoder(drawn_markov_tree_draft(draft, DRAWN["widths"], replacement, seed=3),
                                markov_tree_target(target), k=2, greedy=False, generator=np.random.default_rng(7))
    res, rounds_per_run = continuation_chisquare(dec, target, 4, 4000)  # 4 tokens: at least two rounds
    assert res.dof >= 10 and rounds_per_run > 2.0
    assert res.pvalue > ALPHA, res


def test_drawn_tree_law_test_rejects_draws_without_replacement_verified_as_iid():
    """Power check: siblings drawn without replacement but flagged ``replacement=True`` (SpecInfer's
    rule on draws it was not made for) -- a silent bias the same test, sizes and seed reject."""
    target, draft = bigram_pair(7, 4, lam=DRAWN["lam"])
    dec = sv.SpeculativeDecoder(drawn_markov_tree_draft(draft, DRAWN["widths"], False, seed=3, flag=True),
                                markov_tree_target(target), k=2, greedy=False, generator=np.random.default_rng(7))
    res, _ = continuation_chisquare(dec, target, 4, 4000)
    assert res.pvalue < ALPHA, res


def test_iid_draws_flagged_without_replacement_are_refused():
    """The other way round is not silent: repeated siblings under ``replacement=False`` raise."""
    target, draft = bigram_pair(7, 4, lam=1.0)
    dec = sv.SpeculativeDecoder(drawn_markov_tree_draft(draft, (3, 2), True, seed=3, flag=False),
                                markov_tree_target(target), k=2, greedy=False, generator=np.random.default_rng(7))
    with pytest.raises(ValueError, match="repeats its sibling"):
        for _ in range(50):
            dec.generate(torch.tensor([1, 2]), max_new=4)


@pytest.mark.parametrize("broken", [UnconditionedSiblings, ChildrenKeptInFinalDraw, RowsOfTheParent])
def test_tree_law_test_rejects_broken_rules(broken):
    """Power check: the same test, sizes and seed as the first case reject each broken rule at ALPHA."""
    res, _ = tree_continuation_test(broken, vocab=4, length=3, k=2, runs=4000, seed=7, widths=(2, 2))
    assert res.pvalue < ALPHA, res


def test_the_walked_correct_rule_keeps_the_law():
    res, _ = tree_continuation_test(WalkedRule, vocab=4, length=3, k=2, runs=4000, seed=7, widths=(2, 2))
    assert res.pvalue > ALPHA, res
