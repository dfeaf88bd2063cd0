"""SpeculativeDecoder on Markov (bigram) models small enough to enumerate every continuation.

Sections: structure and bookkeeping; greedy mode == plain greedy decoding of the target; sampling
mode preserves the target's joint law over whole continuations (chi-square on counts of every
continuation against the exact enumerated law, alpha = 1e-6, seeds fixed), with power checks:
the same test must reject decoders with deliberately broken rules.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from experiments import stats as st  # noqa: E402
from experiments.law.synthetic import BigramModel, markov_callbacks, mix_bigram, random_bigram  # noqa: E402

ALPHA = 1e-6  # per law test; every test below is deterministic (fixed seeds)


def bigram_pair(seed, vocab, lam=0.5, concentration=1.0):
    """A target bigram and a draft that is the target mixed with an unrelated bigram (weight lam)."""
    rng = np.random.default_rng(seed)
    target = random_bigram(rng, vocab, concentration)
    other = random_bigram(rng, vocab, concentration)
    return BigramModel(target), BigramModel(mix_bigram(target, other, lam))


def recording(draft_step, target_step, log):
    def d(prefix, k):
        log.append(("draft", prefix.clone(), k))
        return draft_step(prefix, k)

    def t(prefix, proposed):
        log.append(("target", prefix.clone(), proposed.clone()))
        return target_step(prefix, proposed)

    return d, t


# ------------------------------------------------------------------------------------------
# structure and bookkeeping
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("k,max_new", [(1, 5), (3, 1), (3, 7), (4, 4), (5, 23)])
def test_length_prefix_and_stats(greedy, k, max_new):
    target, draft = bigram_pair(0, 6)
    log = []
    d, t = recording(*markov_callbacks(target, draft, np.random.default_rng(1), greedy=greedy), log)
    dec = sv.SpeculativeDecoder(d, t, k=k, greedy=greedy, generator=np.random.default_rng(2))
    prompt = torch.tensor([3, 1, 4], dtype=torch.int64)
    out = dec.generate(prompt, max_new=max_new)

    assert out.dtype == torch.int64 and out.ndim == 1
    assert out.numel() == prompt.numel() + max_new
    assert torch.equal(out[:3], prompt)
    s = dec.stats
    assert s.rounds == len(s.accepted) == len(s.drafted) == len(s.emitted) >= 1
    assert sum(s.emitted) == max_new
    assert all(e == a + 1 for a, e in zip(s.accepted, s.emitted))
    assert all(0 <= a <= m <= k for a, m in zip(s.accepted, s.drafted))
    assert s.accepted_histogram.sum() == s.rounds and s.accepted_histogram.shape == (min(k, max(s.drafted)) + 1,)
    assert s.tokens_per_round == pytest.approx(max_new / s.rounds)
    assert min(s.draft_time, s.target_time, s.verify_time) >= 0.0
    assert set(s.summary()) >= {"rounds", "mean_accepted", "acceptance_rate", "tokens_per_round"}

    # the draft is never asked for a token that cannot be used, and is asked for k when it can
    produced = prompt.numel()
    for entry in log:
        if entry[0] == "draft":
            remaining = max_new - (entry[1].numel() - prompt.numel())
            assert entry[2] == min(k, remaining - 1) >= 1
        else:
            _, prefix, proposed = entry
            assert prefix.dtype == torch.int64 and prefix.ndim == 1
            assert torch.equal(prefix, out[: prefix.numel()])  # the prefix is the sequence so far
            assert prefix.numel() >= produced
            produced = prefix.numel()
            assert proposed.numel() == min(k, max_new - (prefix.numel() - prompt.numel()) - 1)


def test_max_new_zero_and_no_draft_call_for_last_token():
    target, draft = bigram_pair(0, 5)
    log = []
    d, t = recording(*markov_callbacks(target, draft, np.random.default_rng(1), greedy=True), log)
    dec = sv.SpeculativeDecoder(d, t, k=4)
    assert torch.equal(dec.generate([2], max_new=0), torch.tensor([2]))
    assert log == [] and dec.stats.rounds == 0
    dec.generate([2], max_new=1)
    assert [e[0] for e in log] == ["target"] and dec.stats.drafted == [0]


def test_rejects_bad_arguments_and_callbacks():
    target, draft = bigram_pair(0, 5)
    d, t = markov_callbacks(target, draft, np.random.default_rng(1), greedy=True)
    with pytest.raises(ValueError, match="k must be"):
        sv.SpeculativeDecoder(d, t, k=0)
    with pytest.raises(ValueError, match="method must be one of"):
        sv.SpeculativeDecoder(d, t, k=2, method="tree")
    with pytest.raises(ValueError, match="max_new"):
        sv.SpeculativeDecoder(d, t, k=2).generate([1], max_new=-1)
    with pytest.raises(ValueError, match="draft_step returned 3 tokens, asked for at most 2"):
        sv.SpeculativeDecoder(lambda p, k: ([0, 0, 0], None), t, k=2).generate([1], max_new=5)
    with pytest.raises(ValueError, match="target_step returned"):
        sv.SpeculativeDecoder(d, lambda p, x: target.rows([0]), k=2).generate([1], max_new=5)


# ------------------------------------------------------------------------------------------
# greedy: token-for-token plain greedy decoding of the target
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("with_probs", [True, False])
def test_greedy_reproduces_plain_greedy(k, with_probs):
    accepted, rejected = 0, 0
    for seed in range(4):
        # concentration 0.3: peaked rows, so the draft's argmax often (not always) agrees
        target, draft = bigram_pair(seed, 11, lam=0.35, concentration=0.3)
        d, t = markov_callbacks(target, draft, None, greedy=True, pass_probs=with_probs)
        dec = sv.SpeculativeDecoder(d, t, k=k, greedy=True)
        for prompt in ([0], [5, 2], [10, 10, 3]):
            for max_new in (1, 2, k, k + 1, 37):
                out = dec.generate(torch.tensor(prompt), max_new=max_new)
                assert out[len(prompt):].tolist() == target.greedy(prompt, max_new)
                accepted += sum(dec.stats.accepted)
                rejected += sum(m - a for a, m in zip(dec.stats.accepted, dec.stats.drafted))
    assert accepted > 0 and rejected > 0  # both paths of the verifier were exercised


def short_proposals(draft_step):
    """A draft that sometimes proposes fewer tokens than asked (down to none), by its prefix."""

    def d(prefix, k):
        tokens, probs = draft_step(prefix, k)
        j = int(prefix.sum()) % (k + 1)
        return tokens[:j], None if probs is None else probs[:j]

    return d


def test_short_proposals_keep_greedy_exact():
    target, draft = bigram_pair(2, 9, lam=0.35, concentration=0.3)
    d, t = markov_callbacks(target, draft, None, greedy=True)
    dec = sv.SpeculativeDecoder(short_proposals(d), t, k=4, greedy=True)
    out = dec.generate(torch.tensor([3]), max_new=40)
    assert out[1:].tolist() == target.greedy([3], 40)
    assert 0 in dec.stats.drafted and max(dec.stats.drafted) > 1  # empty and partial proposals both ran


def test_greedy_stops_after_eos():
    target, draft = bigram_pair(3, 7, lam=0.3, concentration=0.3)
    d, t = markov_callbacks(target, draft, None, greedy=True)
    plain = target.greedy([0], 60)
    eos = plain[5]  # a token that plain greedy emits
    dec = sv.SpeculativeDecoder(d, t, k=3, greedy=True, eos_token_id=eos)
    out = dec.generate([0], max_new=60)[1:].tolist()
    assert out == plain[: plain.index(eos) + 1]
    assert sum(dec.stats.emitted) == len(out)


# ------------------------------------------------------------------------------------------
# sampling: the joint law of whole continuations
# ------------------------------------------------------------------------------------------
class BonusWrongRow(sv.SpeculativeDecoder):
    """Broken: the bonus token is drawn from row m-1 instead of row m."""

    def _verify(self, target_probs, draft_probs, tokens):
        m = tokens.numel()
        if m > 0:
            target_probs = np.concatenate([target_probs[:m], target_probs[m - 1 : m]])
        return super()._verify(target_probs, draft_probs, tokens)


class ResidualFromTarget(sv.SpeculativeDecoder):
    """Broken (a classic bug): after a rejection the token is redrawn from p_i, not norm(max(0, p_i - q_i))."""

    def _verify(self, target_probs, draft_probs, tokens):
        n, nxt = super()._verify(target_probs, draft_probs, tokens)
        if n < tokens.numel():
            row = np.asarray(target_probs[n], dtype=np.float64)
            nxt = int(np.searchsorted(np.cumsum(row / row.sum()), self.generator.random(), side="right"))
        return n, nxt


class CorrectionDropped(sv.SpeculativeDecoder):
    """Broken: a round that rejects emits only the accepted prefix (the recovered token is dropped)."""

    def _verify(self, target_probs, draft_probs, tokens):
        self._m = tokens.numel()
        return super()._verify(target_probs, draft_probs, tokens)

    def _emitted(self, tokens, n_accepted, next_token):
        if n_accepted < self._m:
            return tokens[:n_accepted].tolist()
        return super()._emitted(tokens, n_accepted, next_token)


class BonusDropped(sv.SpeculativeDecoder):
    """Wasteful but NOT biased: when all m drafts are accepted the bonus token is discarded.

    Each emitted token is still drawn from the target's conditional given everything before it
    (the round boundary is a stopping time), so the joint law is preserved: the law test must pass.
    """

    def _verify(self, target_probs, draft_probs, tokens):
        self._m = tokens.numel()
        return super()._verify(target_probs, draft_probs, tokens)

    def _emitted(self, tokens, n_accepted, next_token):
        if n_accepted == self._m > 0:
            return tokens[:n_accepted].tolist()
        return super()._emitted(tokens, n_accepted, next_token)


def continuation_test(cls, *, vocab, length, k, runs, seed, lam=0.5, pass_probs=True, torch_gen=False,
                      short=False, method="token"):
    """Chi-square of the counts of every whole continuation against the target's exact joint law."""
    target, draft = bigram_pair(seed, vocab, lam=lam)
    g_draft, g_verify = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    if torch_gen:
        g_verify = torch.Generator().manual_seed(seed)
    # a point-mass draft (no probs) must propose deterministically: its argmax
    d, t = markov_callbacks(target, draft, g_draft, greedy=not pass_probs, pass_probs=pass_probs)
    dec = cls(short_proposals(d) if short else d, t, k=k, greedy=False, generator=g_verify, method=method)
    return continuation_chisquare(dec, target, length, runs)


def continuation_chisquare(dec, target, length, runs):
    """``(chi-square of the counts of the continuations of [1, 2] against the target's joint law,
    mean rounds per run)`` over ``runs`` calls of ``dec.generate``."""
    prompt = torch.tensor([1, 2], dtype=torch.int64)
    counts = np.zeros(target.vocab**length, dtype=np.int64)
    rounds = 0
    for _ in range(runs):
        out = dec.generate(prompt, max_new=length)[2:]
        counts[target.continuation_index(out.tolist())] += 1
        rounds += dec.stats.rounds
    law = target.continuation_law(int(prompt[-1]), length)
    return st.chisquare_counts(counts, law), rounds / runs


CASES = [  # (vocab, length, k, runs, pass_probs, torch generator)
    (4, 3, 1, 4000, True, False),  # three rounds per run
    (4, 3, 2, 4000, True, True),  # rounds of 2 drafts, then the max_new boundary
    (4, 3, 5, 3000, True, False),  # k capped by max_new
    (3, 5, 3, 4000, True, False),  # 243 continuations across several rounds
    (4, 3, 2, 4000, False, False),  # deterministic (point-mass) draft: draft_probs=None
]


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("vocab,length,k,runs,pass_probs,torch_gen", CASES)
def test_sampling_preserves_joint_law(vocab, length, k, runs, pass_probs, torch_gen, method):
    res, rounds_per_run = continuation_test(sv.SpeculativeDecoder, vocab=vocab, length=length, k=k, runs=runs,
                                            seed=7, pass_probs=pass_probs, torch_gen=torch_gen, method=method)
    assert res.dof >= 10
    assert rounds_per_run > 1.2  # continuations really span several rounds
    assert res.pvalue > ALPHA, res


@pytest.mark.parametrize("method", ["token", "block"])
def test_short_proposals_preserve_joint_law(method):
    res, rounds_per_run = continuation_test(sv.SpeculativeDecoder, vocab=4, length=3, k=3, runs=4000, seed=5,
                                            short=True, method=method)
    assert rounds_per_run > 1.2 and res.pvalue > ALPHA, res


def test_sampling_is_seeded():
    a = continuation_test(sv.SpeculativeDecoder, vocab=4, length=3, k=2, runs=300, seed=11)
    b = continuation_test(sv.SpeculativeDecoder, vocab=4, length=3, k=2, runs=300, seed=11)
    assert a == b


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("broken", [BonusWrongRow, ResidualFromTarget, CorrectionDropped])
def test_law_test_rejects_broken_decoders(broken, method):
    """Power check: the same test, same sizes and seed, rejects each broken rule at ALPHA."""
    res, _ = continuation_test(broken, vocab=4, length=3, k=2, runs=4000, seed=7, method=method)
    assert res.pvalue < ALPHA, res


def test_dropping_the_bonus_keeps_the_law():
    res, _ = continuation_test(BonusDropped, vocab=4, length=3, k=2, runs=4000, seed=7)
    assert res.pvalue > ALPHA, res


def test_block_method_accepts_more_than_token_wise():
    """Same models, same seeds: block verification emits more tokens per round (K = 4)."""
    per_round = {}
    for method in ("token", "block"):
        target, draft = bigram_pair(3, 6, lam=0.3)
        d, t = markov_callbacks(target, draft, np.random.default_rng(1))
        dec = sv.SpeculativeDecoder(d, t, k=4, greedy=False, generator=np.random.default_rng(2), method=method)
        dec.generate([0], max_new=3000)
        per_round[method] = dec.stats.tokens_per_round
    assert per_round["block"] > per_round["token"], per_round
