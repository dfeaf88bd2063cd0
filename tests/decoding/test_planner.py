"""The round planner (specverify.decoding.planner): its choices, and why they keep verification exact.

Exactness: the decoder's whole-continuation joint-law test (test_decoder.continuation_chisquare:
enumerable bigram models, chi-square on the counts of every continuation against the exact law,
alpha = 1e-6, fixed seeds) with the planner choosing each round among a stochastic gated chain (drawn
from the draft bigram, decided position by position on its rows), a deterministic point-mass chain
(prompt-lookup-like, with a context) and a deterministic tree, or nothing; token-wise and block
verification. Power: the same test, sizes and seeds reject a planner that keeps the drawn chain only
while the target would accept it (it reads the target's row of this round), and one that chooses
between candidates on the stochastic candidate's drawn token. Greedy: output equals plain greedy.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from experiments.law.synthetic import BigramModel, markov_callbacks  # noqa: E402
from specverify import law  # noqa: E402
from specverify.decoding.adaptive import FixedK, RoundRecord  # noqa: E402
from specverify.decoding.planner import Candidate, Planner, Reliability, _Choice  # noqa: E402

from test_decoder import ALPHA, bigram_pair, continuation_chisquare  # noqa: E402
from test_decoder_tree import markov_tree_draft, markov_tree_target  # noqa: E402


# ------------------------------------------------------------------------------------------
# candidates on bigram models
# ------------------------------------------------------------------------------------------
def gated_chain(draft: BigramModel, rng, greedy=False):
    """A stochastic chain drafted position by position: before drawing t_i it asks
    ``gate(i, path, top)`` with ``path = prod_{j<i} q_j(t_j)`` and ``top = max q_i``."""

    def step(prefix, k, gate=None):
        prev, path, tokens = int(prefix[-1]), 1.0, []
        for i in range(k):
            row = draft._p[prev]  # [V] normalized
            if gate is not None and not gate(i, path, float(row.max())):
                break
            t = int(np.argmax(row)) if greedy else draft.sample(prev, rng)
            tokens.append(t)
            path *= float(row[t])
            prev = t
        rows = None if greedy else draft.rows([int(prefix[-1])] + tokens[:-1])[: len(tokens)]
        return torch.tensor(tokens, dtype=torch.int64), rows

    return step


class LookupLike:
    """Deterministic: an argmax chain after the last token, as long as the prefix's sum says (0..k
    tokens), with a context as prompt lookup's: the last token's parity, which says whether the chain
    follows ``good`` (even) or ``poor`` (odd)."""

    def __init__(self, good, poor):
        self.tables = np.asarray(good), np.asarray(poor)

    def context(self, prefix):
        return int(prefix[-1]) % 2

    def __call__(self, prefix, k):
        prev, out, table = int(prefix[-1]), [], self.tables[self.context(prefix)]
        for _ in range(min(k, int(prefix.sum()) % (k + 2))):
            prev = int(np.argmax(table[prev]))
            out.append(prev)
        return torch.tensor(out, dtype=torch.int64), None


# costs under which every kind of round is chosen often (nothing where the draft's top row is low)
COSTS = law.MeasuredCosts((1.0, 1.3, 1.35, 1.4, 1.45), {"chain": (0.2, 0.4, 0.6, 0.8), "lookup": (0.0,) * 4,
                                                        "tree": (0.0,) * 4})  # a CPU's shape: 2 tokens dearest


CHEAP = law.MeasuredCosts((1.0, 1.05, 1.1, 1.15, 1.2), {"chain": (0.05, 0.1, 0.15, 0.2), "lookup": (0.0,) * 4,
                                                        "tree": (0.0,) * 4})


def planner_for(target, draft, rng, *, greedy=False, tree=False, cls=Planner, k_max=3, costs=COSTS, carry=0.0):
    other = BigramModel(np.roll(draft.table, 1, axis=1))  # right less often than the draft
    candidates = [Candidate("chain", gated_chain(draft, rng, greedy)),
                  Candidate("lookup", LookupLike(target.table, other.table), deterministic=True)]
    if tree:
        poorer = BigramModel(np.roll(draft.table, 2, axis=1))
        candidates.append(Candidate("tree", markov_tree_draft(poorer, (2, 1)), deterministic=True, k_max=2))
    # carry 0 by default here: each run starts from the prior, so that every kind of round is chosen
    return cls(candidates, costs, k_max=k_max, explore_every=5, decay=0.7, prior_rate=0.5, prior_strength=1.0,
               carry=carry)


def planned_decoder(seed, vocab, *, method="token", tree=False, cls=Planner, carry=0.0):
    target, draft = bigram_pair(seed, vocab)
    g_draft, g_verify = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    planner = planner_for(target, draft, g_draft, tree=tree, cls=cls, carry=carry)
    target_step = markov_tree_target(target) if tree else markov_callbacks(target, draft, None)[1]
    dec = sv.SpeculativeDecoder(planner, target_step, k="auto", greedy=False, generator=g_verify, method=method)
    return dec, target, planner


# ------------------------------------------------------------------------------------------
# exactness: the joint law of whole continuations
# ------------------------------------------------------------------------------------------
LAW_CASES = [(4, 3, 3000), (3, 5, 2000)]  # (vocab, length, runs)


@pytest.mark.parametrize("method,tree", [("token", False), ("block", False), ("token", True)],
                         ids=["token", "block", "token+tree"])
@pytest.mark.parametrize("vocab,length,runs", LAW_CASES)
def test_planner_preserves_joint_law(method, tree, vocab, length, runs):
    dec, target, planner = planned_decoder(7, vocab, method=method, tree=tree)
    res, rounds_per_run = continuation_chisquare(dec, target, length, runs)
    assert rounds_per_run > 1.2 and res.dof >= 10
    assert res.pvalue > ALPHA, res
    # the test means something only if the planner really chose every kind of round
    kinds = {None, "chain", "lookup"} | ({"tree"} if tree else set())
    assert set(planner.choices) == kinds and min(planner.choices.values()) > 0.005 * sum(planner.choices.values()), \
        planner.choices


@pytest.mark.parametrize("method", ["token", "block"])
def test_planner_carrying_its_draft_history_preserves_joint_law(method):
    """The default ``carry=1``: the chain's counts kept from run to run (lookup's reset), its
    exploration backing off. The choice still reads only the past, so the law holds."""
    dec, target, planner = planned_decoder(11, 4, method=method, carry=1.0)
    res, rounds_per_run = continuation_chisquare(dec, target, 3, 3000)
    assert rounds_per_run > 1.2 and res.dof >= 10
    assert res.pvalue > ALPHA, res
    assert planner.choices.get("chain", 0) > 0 and planner.choices.get(None, 0) > 0, planner.choices


class PeeksAtTarget(Planner):
    """Broken: the drawn chain is kept only up to the first token the target would likely reject
    (``p(t_i) < q(t_i)``, the target's row of this round), the lookup used when nothing is left."""

    target = None

    def _run(self, best, prefix, k, base, fallbacks):
        chain = self.candidates[0]
        tokens, rows = chain.draft(prefix.clone(), k)
        prev, keep = int(prefix[-1]), 0
        for t in tokens.tolist():
            if self.target._p[prev, t] < rows[keep, t] / rows[keep].sum():
                break
            keep, prev = keep + 1, t
        if keep == 0:
            return self._use(max(fallbacks, key=lambda ch: ch.rate))
        self._pending = {"candidate": chain, "asked": k, "context": None, "confidences": [0.5] * keep}
        self._note(_Choice(chain, keep, 1.0, 1.0))
        return tokens[:keep], rows[:keep]


class ChoosesOnTheDraw(Planner):
    """Broken: the stochastic chain is drawn, then kept only if its first token's draft probability is
    high (a draft-side criterion, but on the drawn value); otherwise the lookup's proposal is used."""

    def _run(self, best, prefix, k, base, fallbacks):
        chain = self.candidates[0]
        tokens, rows = chain.draft(prefix.clone(), k)
        if rows[0, tokens[0]] / rows[0].sum() < 0.4:
            return self._use(max(fallbacks[1:], key=lambda ch: ch.rate))  # the lookup, even empty
        self._pending = {"candidate": chain, "asked": k, "context": None, "confidences": [0.5] * len(tokens)}
        self._note(_Choice(chain, len(tokens), 1.0, 1.0))
        return tokens, rows


@pytest.mark.parametrize("seed,carry", [(7, 0.0), (11, 1.0)], ids=["carry0", "carry1"])
@pytest.mark.parametrize("broken", [PeeksAtTarget, ChoosesOnTheDraw])
def test_law_test_rejects_broken_planners(broken, seed, carry):
    """Power: the same test, sizes and seed reject a planner that reads the target's row of the round,
    and one that chooses between candidates on the stochastic candidate's drawn token (carry 1: at the
    carrying law test's seed)."""
    dec, target, planner = planned_decoder(seed, 4, cls=broken, carry=carry)
    planner.target = target
    res, _ = continuation_chisquare(dec, target, 3, 3000)
    assert res.pvalue < ALPHA, res


@pytest.mark.parametrize("tree", [False, True])
def test_greedy_planner_is_plain_greedy(tree):
    target, draft = bigram_pair(2, 9, lam=0.35, concentration=0.3)
    planner = planner_for(target, draft, None, greedy=True, tree=tree, costs=CHEAP)
    target_step = markov_tree_target(target) if tree else markov_callbacks(target, draft, None, greedy=True)[1]
    dec = sv.SpeculativeDecoder(planner, target_step, k="auto", greedy=True)
    for prompt in ([3], [5, 2], [8, 8, 1]):
        out = dec.generate(torch.tensor(prompt), max_new=60)
        assert out[len(prompt):].tolist() == target.greedy(prompt, 60)
    assert {"chain", "lookup"} <= set(planner.choices), planner.choices  # both kinds of proposal were verified


# ------------------------------------------------------------------------------------------
# the choice, on synthetic costs and confidences
# ------------------------------------------------------------------------------------------
def teach(planner, name, accepted, rounds=40, proposed=4, context=None):
    for _ in range(rounds):
        planner.history[name].observe(RoundRecord(proposed, proposed, accepted, math.nan, math.nan, None, context))


def confident_chain(top):
    """A gated chain whose every row has the given top probability (tokens 1, 2, 3, ...)."""

    def step(prefix, k, gate=None):
        tokens, path = [], 1.0
        for i in range(k):
            if gate is not None and not gate(i, path, top):
                break
            tokens.append(i + 1)
            path *= top
        return torch.tensor(tokens, dtype=torch.int64), None

    return step


def lookup_of(tokens):
    return lambda prefix, k: (torch.tensor(tokens[:k], dtype=torch.int64), None)


def test_planner_proposes_nothing_when_drafts_are_worthless():
    costs = law.MeasuredCosts((1.0, 1.3, 1.6, 1.9, 2.2), {"chain": (0.3, 0.6, 0.9, 1.2), "lookup": (0.0,) * 4})
    planner = Planner([Candidate("chain", confident_chain(0.1)), Candidate("lookup", lookup_of([5, 6, 7, 8]),
                                                                           deterministic=True)], costs, k_max=4,
                      explore_every=0)
    teach(planner, "lookup", accepted=0)
    teach(planner, "chain", accepted=0)
    tokens, probs = planner(torch.tensor([1, 2]), 4)
    assert tokens.numel() == 0 and planner.last_choice[0] is None


def test_planner_proposes_the_whole_reliable_lookup_and_a_short_cheap_chain():
    costs = law.MeasuredCosts((1.0, 1.1, 1.2, 1.3, 1.4), {"chain": (0.1, 0.2, 0.3, 0.4), "lookup": (0.0,) * 4})
    lookup = Candidate("lookup", lookup_of([5, 6, 7, 8]), deterministic=True)
    planner = Planner([Candidate("chain", confident_chain(0.9)), lookup], costs, k_max=4, explore_every=0)
    teach(planner, "lookup", accepted=4)
    tokens, _ = planner(torch.tensor([1, 2]), 4)
    assert tokens.tolist() == [5, 6, 7, 8] and planner.last_choice[:2] == ("lookup", 4)
    # lookup has nothing: the confident chain is drafted, and stopped by its own rows, not by k
    planner = Planner([Candidate("chain", confident_chain(0.6)),
                       Candidate("lookup", lookup_of([]), deterministic=True)], costs, k_max=4, explore_every=0)
    tokens, _ = planner(torch.tensor([1, 2]), 4)
    assert planner.last_choice[0] == "chain" and 1 <= tokens.numel() < 4
    expected = law.speedup([0.6, 0.6], c=[0.2, 0.3], target_cost=costs)  # the law's view of the length chosen
    assert expected > 1.0


def test_gated_chain_that_stops_at_once_falls_back_to_the_lookup():
    costs = law.MeasuredCosts((1.0, 1.1, 1.2), {"chain": (0.05, 0.1, 0.15), "lookup": (0.0,) * 3})
    planner = Planner([Candidate("chain", confident_chain(0.02)), Candidate("lookup", lookup_of([5, 6]),
                                                                            deterministic=True)], costs, k_max=2,
                      explore_every=0)
    teach(planner, "lookup", accepted=0, proposed=2)  # the lookup looks poor; the chain's prior looks good
    teach(planner, "lookup", accepted=1, proposed=2, rounds=8)
    tokens, _ = planner(torch.tensor([1, 2]), 2)
    assert planner.choices.get("chain") is None and planner.last_choice[0] in ("lookup", None)
    assert planner.history["chain"].proposal_rates()[0] < 0.95  # it learned that its gate stopped it


def test_gated_chain_is_priced_by_the_rows_its_gate_lets_it_compute():
    """A gated chain whose gate stops before its first token in 80 % of calls (one row computed)
    and proposes one accepted token otherwise (two rows): valued before its first forward at
    ``E[tokens] / (E[D(rows)] + E[T(M + 1)])`` from its history (a stopped call's round proposing
    the fallback instead), it beats proposing nothing and is run. Charged the rows of a full
    proposal on every call (the old pricing) it would not be: the draft would never be called
    again, its history never corrected."""
    costs = law.MeasuredCosts((1.0, 1.1, 1.2, 1.3, 1.4), {"chain": (0.1, 0.2, 0.3, 0.4)})
    calls = []
    chain = confident_chain(0.9)
    planner = Planner([Candidate("chain", lambda prefix, k, gate=None: calls.append(k) or chain(prefix, k, gate))],
                      costs, k_max=4, explore_every=0)
    for r in range(50):
        m = int(r % 5 == 0)  # 1 token proposed (and accepted) in one call of five, none in the others
        planner.history["chain"].observe(RoundRecord(4, m, m, math.nan, math.nan))
    survival, proposed = planner.history["chain"].survival(None)
    reach = [1.0, *proposed]  # P(M >= m), m = 0..4
    rows = sum((reach[m] - reach[m + 1]) * costs.draft_cost("chain", m + 1) for m in range(4))
    rows += reach[4] * costs.draft_cost("chain", 4)
    passes = 1.0 + sum(p * (costs(i + 1) - costs(i)) for i, p in enumerate(proposed, 1))
    nothing = _Choice(None, 0, 1.0, 1.0)
    choice = planner._history_choice(planner.candidates[0], 4, 0.0, nothing)
    assert (choice.k, choice.tokens, choice.cost) == (4, pytest.approx(1.0 + sum(survival)),
                                                      pytest.approx(rows + passes))
    assert choice.rate > 1.0  # better than a plain step ...
    # a call its gate stops at once proposes the fallback (here a 2-token copy expected to give
    # 1.8 tokens for a 1.2 pass): its tokens and pass replace a plain step's in P(M = 0) of the calls
    copy = _Choice(None, 2, 1.8, 1.2)
    with_copy = planner._history_choice(planner.candidates[0], 4, 0.0, copy)
    assert (with_copy.tokens, with_copy.cost) == (pytest.approx(choice.tokens + (1.0 - proposed[0]) * 0.8),
                                                  pytest.approx(choice.cost + (1.0 - proposed[0]) * 0.2))
    full = max((1.0 + sum(survival[:k])) / (costs.draft_cost("chain", min(k + 1, 4)) + 1.0
                                            + sum(p * (costs(i + 1) - costs(i)) for i, p in enumerate(proposed[:k], 1)))
               for k in range(1, 5))
    assert full < 1.0  # ... which a full proposal's rows on every call would not be
    planner(torch.tensor([1, 2]), 4)
    assert calls == [4]  # run, asked its longest length: its gate ends it


def test_reliability_curve_corrects_an_overconfident_draft():
    r = Reliability(bins=4, prior_strength=2.0, decay=1.0)
    assert r(0.9) == pytest.approx(r.mid[-1])  # believed at first
    for _ in range(200):
        r.observe([0.9, 0.85], accepted=0)
    assert r(0.9) < 0.05 and r(0.01) == pytest.approx(r.mid[0])


def test_unused_lookup_proposals_are_learned_in_hindsight():
    costs = law.MeasuredCosts((1.0, 5.0, 9.0), {"lookup": (0.0, 0.0)})
    planner = Planner([Candidate("lookup", lookup_of([7, 7]), deterministic=True)], costs, k_max=2)
    before = planner._rates(planner.candidates[0], None)[0]
    for n in range(3, 12):
        planner(torch.tensor([1] * n), 2)  # too dear to propose: nothing, then the next prefix shows 1, not 7
        planner.observe(RoundRecord(2, 0, 0, math.nan, 0.1))
    assert planner.choices == {None: 9} and planner._rates(planner.candidates[0], None)[0] < before


def test_online_costs_without_a_cache():
    target, draft = bigram_pair(0, 5)
    planner = Planner([Candidate("chain", gated_chain(draft, np.random.default_rng(0)))], None, k_max=3)
    ticks = iter(range(10**6))
    dec = sv.SpeculativeDecoder(planner, markov_callbacks(target, draft, None)[1], k="auto", greedy=False,
                                generator=np.random.default_rng(1), clock=lambda: float(next(ticks)))
    dec.generate([1], max_new=40)
    assert planner.target_fit.seen and planner.draft_fit["chain"].seen
    assert planner.target_cost(1) == 1.0 and planner.draft_cost(planner.candidates[0], 1) >= 0.0


def test_online_costs_skip_what_reads_the_prompt():
    """A sequence's first target pass and a candidate's first call catch up on the prompt: their
    seconds are not learned as the cost of their lengths. Here the first draft call and the first
    pass take 100 ticks, every later one 1: the learned costs must hold 1s only (with the first
    calls learned they would not)."""
    target, draft = bigram_pair(0, 5)
    step = gated_chain(draft, np.random.default_rng(0))
    now, calls = [0.0], {"draft": 0, "target": 0}
    target_step = markov_callbacks(target, draft, None)[1]

    def timed(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            now[0] += 100.0 if calls[name] == 1 else 1.0
            return fn(*args, **kwargs)
        return call

    planner = Planner([Candidate("chain", timed("draft", step))], None, k_max=3, explore_every=1,
                      clock=lambda: now[0])
    dec = sv.SpeculativeDecoder(planner, timed("target", target_step), k="auto", greedy=False,
                                generator=np.random.default_rng(1), clock=lambda: now[0])
    dec.generate([1], max_new=40)
    assert calls["draft"] > 2 and planner.target_fit.seen and planner.draft_fit["chain"].seen
    for fit in (planner.target_fit, planner.draft_fit["chain"]):
        seen = fit.w_at > 0
        np.testing.assert_allclose(fit.y_at[seen] / fit.w_at[seen], 1.0, rtol=1e-12)


def test_online_costs_skip_a_call_that_catches_up_on_rounds_sat_out():
    """A learned draft's call after rounds in which another proposal was used also feeds their
    tokens to its cache, so it takes longer the longer the draft sat out. Learned as the cost of its
    rows, that priced a draft out the more, the less it ran (the online planner's lock-out of the
    learned chain on held-out prompts). Here a call right after the draft's last round takes 1
    tick, one after rounds sat out 50: the learned draft cost must hold 1s only, while calls of
    both kinds were made."""
    target, draft = bigram_pair(3, 5)
    step = gated_chain(draft, np.random.default_rng(0), greedy=True)
    now, gaps = [0.0], []
    planner = None

    def chain(prefix, k, gate=None):
        gap = planner.rounds - chain.last_round
        chain.last_round = planner.rounds
        gaps.append(gap)
        now[0] += 1.0 if gap == 1 else 50.0
        return step(prefix, k, gate=gate)

    chain.last_round = -10
    lookup = LookupLike(target._p, target._p)  # the target's argmax (greedy: always right) when it has a proposal
    planner = Planner([Candidate("chain", chain), Candidate("lookup", lookup, deterministic=True)], None, k_max=3,
                      explore_every=1, clock=lambda: now[0])
    score = markov_callbacks(target, draft, None)[1]

    def target_step(*args):  # a pass: 10 ticks, whatever it scores
        now[0] += 10.0
        return score(*args)

    dec = sv.SpeculativeDecoder(planner, target_step, k="auto", greedy=True, clock=lambda: now[0])
    for _ in range(6):
        dec.generate([1], max_new=60)
    assert gaps.count(1) >= 20 and sum(g > 1 for g in gaps[1:]) >= 5  # both kinds of call, beyond the first
    fit = planner.draft_fit["chain"]
    seen = fit.w_at > 0
    assert seen.any()
    np.testing.assert_allclose(fit.y_at[seen] / fit.w_at[seen], 1.0, rtol=1e-12)


def test_bad_arguments_name_themselves():
    step = lookup_of([1])
    with pytest.raises(TypeError, match="name"):
        Candidate("", step)
    with pytest.raises(TypeError, match="draft of candidate 'x'"):
        Candidate("x", 3)
    with pytest.raises(ValueError, match="k_max of candidate 'x'"):
        Candidate("x", step, k_max=0)
    with pytest.raises(TypeError, match="deterministic"):
        Candidate("x", step, deterministic="yes")
    with pytest.raises(TypeError, match="candidates"):
        Planner([])
    with pytest.raises(ValueError, match="distinct names"):
        Planner([Candidate("x", step), Candidate("x", step)])
    with pytest.raises(TypeError, match="costs"):
        Planner([Candidate("x", step)], costs={"target": [1.0]})
    with pytest.raises(ValueError, match="k_max"):
        Planner([Candidate("x", step)], k_max=0)
    with pytest.raises(ValueError, match="explore_every"):
        Planner([Candidate("x", step)], explore_every=-1)
    with pytest.raises(ValueError, match="prior_rate"):
        Planner([Candidate("x", step)], prior_rate=1.5)
    with pytest.raises(ValueError, match="bins"):
        Reliability(bins=0)
    with pytest.raises(ValueError, match="candidate 'x' is deterministic but its draft returned probs"):
        Planner([Candidate("x", lambda p, k: ([1], [[0.5, 0.5]]), deterministic=True)])(torch.tensor([0]), 1)
    target, draft = bigram_pair(0, 5)
    with pytest.raises(ValueError, match="k must be 'auto' or an integer when draft_step is a Planner"):
        sv.SpeculativeDecoder(Planner([Candidate("x", step)]), markov_callbacks(target, draft, None)[1],
                              k=FixedK(4))
    for k in (0, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="k"):
            sv.SpeculativeDecoder(Planner([Candidate("x", step)]), markov_callbacks(target, draft, None)[1], k=k)


def test_an_integer_k_caps_the_planners_proposals():
    """``k=1`` with a planner of ``k_max`` 3 over 3 tokens (where ``k="auto"`` proposes 2 in the
    first round): the planner is still the policy (every kind of round is chosen), no round
    proposes more than 1 token, and the joint law holds."""
    target, draft = bigram_pair(7, 4)
    longest = {}
    for k in ("auto", 1):
        g_draft, g_verify = (np.random.default_rng(s) for s in np.random.SeedSequence(7).spawn(2))
        planner = planner_for(target, draft, g_draft)
        score = markov_callbacks(target, draft, None)[1]
        proposed = []

        def target_step(prefix, tokens):
            proposed.append(len(tokens))
            return score(prefix, tokens)

        dec = sv.SpeculativeDecoder(planner, target_step, k=k, greedy=False, generator=g_verify)
        assert dec.policy is planner
        res, _ = continuation_chisquare(dec, target, 3, 2000)
        assert res.pvalue > ALPHA, res
        assert {None, "chain", "lookup"} <= set(planner.choices), planner.choices
        longest[k] = max(proposed)
    assert longest == {"auto": 2, 1: 1}