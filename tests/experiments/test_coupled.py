"""experiments.end_to_end.coupled: the coupled verifier (draw from the target, accept the equal draft).

Law: the decoder's whole-continuation joint-law test (enumerable bigram models, chi-square on
counts, alpha = 1e-6, fixed seeds) with chain and tree drafts of deterministic candidates, and its
power: the same test rejects the rule with one uniform reused for a whole round and with the
bonus drawn from the wrong row. Coupling: plain decoding, the chain and the tree sample the same
text from one seed.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from experiments.end_to_end import coupled  # noqa: E402
from experiments.end_to_end.choose_k import PlainDecoding  # noqa: E402
from experiments.law.synthetic import markov_callbacks  # noqa: E402
from test_decoder import ALPHA, bigram_pair, continuation_chisquare  # noqa: E402
from test_decoder_tree import markov_tree_draft, markov_tree_target  # noqa: E402

VOCAB, LENGTH, RUNS, SEED = 4, 4, 4000, 7


def test_inverse_cdf_draws_by_cumulative_mass():
    row = np.array([0.0, 0.25, 0.0, 0.5, 0.25])  # cumulative 0, .25, .25, .75, 1
    assert [coupled.inverse_cdf(row, u) for u in (0.0, 0.2, 0.25, 0.5, 0.74, 0.75, 0.99)] == [1, 1, 3, 3, 3, 4, 4]
    assert coupled.inverse_cdf(2 * row, 0.5) == 3  # unnormalized rows
    assert coupled.inverse_cdf(np.array([0.3, 0.7, 0.0]), 1.0 - 1e-17) == 1  # rounding short: the last positive


def decoders(seed=SEED):
    """``{name: decoder}``: plain decoding, a chain (the draft's argmax, k = 3) and a tree (widths
    2, 2, 1), all coupled to one stream seed."""
    target, draft = bigram_pair(seed, VOCAB, lam=0.5)
    chain_draft, target_step = markov_callbacks(target, draft, None, greedy=True, pass_probs=False)
    return target, {
        "plain": coupled.coupled_decoder(chain_draft, target_step, PlainDecoding(), seed),
        "chain": coupled.coupled_decoder(chain_draft, target_step, 3, seed),
        "tree": coupled.coupled_decoder(markov_tree_draft(draft, (2, 2, 1)), markov_tree_target(target), 3, seed),
    }


@pytest.mark.parametrize("name", ["plain", "chain", "tree"])
def test_coupled_verification_preserves_joint_law(name):
    target, decs = decoders()
    res, rounds_per_run = continuation_chisquare(decs[name], target, LENGTH, RUNS)
    assert res.dof >= 10 and (name == "plain" or rounds_per_run < LENGTH)  # drafts were accepted
    assert res.pvalue > ALPHA, res


def test_plain_chain_and_tree_sample_the_same_text():
    _, decs = decoders(seed=3)
    prompt = torch.tensor([1, 2])
    for _ in range(50):
        outs = {name: dec.generate(prompt, max_new=12).tolist() for name, dec in decs.items()}
        assert outs["plain"] == outs["chain"] == outs["tree"], outs
    assert decs["tree"].stats.rounds < decs["plain"].stats.rounds  # the same text in fewer passes


def _reused_uniform(dec):
    """Broken: one uniform per round, reused at every position of it."""
    verify = dec._verify

    def broken(target_probs, draft_probs, tokens):
        u = float(dec.stream.random())
        dec._draw = lambda row: coupled.inverse_cdf(row, u)
        return verify(target_probs, draft_probs, tokens)

    dec._verify = broken


def _bonus_from_previous_row(dec):
    """Broken: when every draft matches, the next token is drawn from the last draft's row."""
    verify = dec._verify

    def broken(target_probs, draft_probs, tokens):
        rows = torch.as_tensor(target_probs)
        if tokens.numel():
            rows = torch.cat([rows[:-1], rows[-2:-1]])
        return verify(rows, draft_probs, tokens)

    dec._verify = broken


@pytest.mark.parametrize("breaker", [_reused_uniform, _bonus_from_previous_row])
def test_law_test_rejects_broken_coupled_rules(breaker):
    """Power check: the same test, sizes and seed reject each broken variant at ALPHA."""
    target, decs = decoders()
    breaker(decs["chain"])
    res, _ = continuation_chisquare(decs["chain"], target, LENGTH, RUNS)
    assert res.pvalue < ALPHA, res


def test_summary_reports_ratios_and_same_texts():
    rows = []
    for seed in range(2):
        for prompt, speed in (("a", 1.0), ("b", 2.0)):
            for config, tps, passes in (("plain", 10.0, 20), ("chain", 15.0, 10), ("tree", 18.0, 8)):
                rows.append(dict(prompt=prompt, seed=seed, config=config, new_tokens=20, seconds=20 / (tps * speed),
                                 target_passes=passes, text_hash=seed))
    text = coupled.summary(rows)
    assert "| a | 10.0 | 15.0 | 18.0 | 2.00 / 2.50 | 1.500 | 1.800 | 1.200 | 2/2 |" in text
    assert "| **mean over prompts** | | | | | 1.500 | 1.800 | 1.200 | |" in text
