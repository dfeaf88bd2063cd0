"""The decoder under bad arguments and odd callbacks (issue 43, the decoder's side).

Each test checks a behaviour that was silently wrong, or an error that did not name its cause,
before: a batched prompt decoded as one sequence, ids cast instead of checked, strings taken as
booleans, list-valued eos refused, huge caps allocated up front, statistics sized by the cap.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from experiments.law.synthetic import markov_callbacks  # noqa: E402
from specverify.decoding.adaptive import AdaptiveK, FixedK  # noqa: E402
from test_decoder import bigram_pair  # noqa: E402

VOCAB = 6


def decoder(greedy=True, **kw):
    target, draft = bigram_pair(0, VOCAB)
    d, t = markov_callbacks(target, draft, np.random.default_rng(1), greedy=greedy)
    return sv.SpeculativeDecoder(d, t, greedy=greedy, generator=np.random.default_rng(2), **kw)


def test_one_row_prompt_equals_flat_prompt():
    flat = decoder(k=3).generate(torch.tensor([3, 1, 4]), 9)
    row = decoder(k=3).generate(torch.tensor([[3, 1, 4]]), 9)
    assert torch.equal(torch.as_tensor(flat).reshape(-1), torch.as_tensor(row).reshape(-1))


def test_batched_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt_ids"):
        decoder().generate(torch.tensor([[3, 1, 4], [2, 2, 2]]), 4)


@pytest.mark.parametrize("prompt", [torch.tensor([3.0, 1.7]), torch.tensor([True, False]), np.array([1.5, 2.0])],
                         ids=["float tensor", "bool tensor", "float array"])
def test_non_integer_prompt_ids_are_refused(prompt):
    with pytest.raises(TypeError, match="prompt_ids"):
        decoder().generate(prompt, 4)


def test_negative_prompt_id_is_refused():
    with pytest.raises((ValueError, IndexError), match="prompt_ids"):
        decoder().generate(torch.tensor([3, -1, 4]), 4)


def test_empty_prompt_is_refused_before_any_callback():
    calls = []
    dec = sv.SpeculativeDecoder(lambda p, k: calls.append(p), lambda p, t: calls.append(p), k=2)
    with pytest.raises(ValueError, match="prompt_ids"):
        dec.generate(torch.tensor([], dtype=torch.int64), 4)
    assert calls == []


@pytest.mark.parametrize("greedy", ["False", 1, None])
def test_greedy_must_be_a_bool(greedy):
    with pytest.raises(TypeError, match="greedy"):
        decoder(greedy=greedy)


@pytest.mark.parametrize("eos", [2.9, "2", True])
def test_eos_must_be_integer_ids(eos):
    with pytest.raises(TypeError, match="eos_token_id"):
        decoder(eos_token_id=eos)


def test_eos_may_be_a_list_and_stops_at_any_of_them():
    full = torch.as_tensor(decoder(k=2).generate(torch.tensor([3, 1]), 30)).reshape(-1)
    new = full[2:].tolist()
    first, second = new[0], next((t for t in new if t != new[0]), None)
    out = torch.as_tensor(decoder(k=2, eos_token_id=[VOCAB + 10, first]).generate(torch.tensor([3, 1]), 30))
    assert out.reshape(-1).tolist() == [3, 1, first]  # stopped at the first eos of the list
    if second is not None:
        out = torch.as_tensor(decoder(k=2, eos_token_id=[second]).generate(torch.tensor([3, 1]), 30)).reshape(-1)
        assert out[-1].item() == second and second not in out[2:-1].tolist()


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), None, 4.5])
@pytest.mark.parametrize("name", ["k", "max_new"])
def test_k_and_max_new_must_be_whole_numbers(name, bad):
    with pytest.raises((TypeError, ValueError), match=name):
        if name == "k":
            decoder(k=bad)
        else:
            decoder(k=2).generate(torch.tensor([3, 1]), bad)


def test_huge_max_new_means_until_eos_without_allocating_it():
    full = torch.as_tensor(decoder(k=2).generate(torch.tensor([3, 1]), 6)).reshape(-1)
    eos = full[2].item()
    out = decoder(k=2, eos_token_id=eos).generate(torch.tensor([3, 1]), 10**11)  # 800 GB if allocated
    assert torch.as_tensor(out).reshape(-1).tolist() == [3, 1, eos]


def test_huge_k_sizes_statistics_by_what_was_drafted():
    dec = decoder(k=10**12)
    _, stats = dec.generate(torch.tensor([3, 1]), 5, return_stats=True)
    assert len(stats.accepted_histogram) <= 6  # at most max_new drafts were ever proposed


def test_stats_belong_to_each_call():
    dec = decoder(k=3)
    _, first = dec.generate(torch.tensor([3, 1]), 12, return_stats=True)
    _, second = dec.generate(torch.tensor([3, 1]), 2, return_stats=True)
    assert first is not second and dec.stats is second
    assert sum(first.emitted) == 12 and sum(second.emitted) == 2


def test_policy_returning_none_names_the_policy():
    class NonePolicy(sv.decoding.FixedK):
        def draft_length(self, *args, **kwargs):
            return None

    with pytest.raises(TypeError, match="draft_length|policy"):
        decoder(k=NonePolicy(2)).generate(torch.tensor([3, 1]), 4)


def test_clock_returning_none_names_the_clock():
    with pytest.raises(TypeError, match="clock"):
        decoder(k=2, clock=lambda: None).generate(torch.tensor([3, 1]), 4)


def test_out_of_vocabulary_draft_token_names_draft_step_before_the_target_runs():
    target, draft = bigram_pair(0, VOCAB)
    d, t = markov_callbacks(target, draft, np.random.default_rng(1), greedy=False)
    calls = []

    def bad_draft(prefix, k):
        tokens, probs = d(prefix, k)
        tokens = np.array(tokens)
        tokens[0] = VOCAB + 3
        return tokens, probs

    def counting_target(prefix, proposed):
        calls.append(1)
        return t(prefix, proposed)

    dec = sv.SpeculativeDecoder(bad_draft, counting_target, k=2, greedy=False, generator=np.random.default_rng(2))
    with pytest.raises((ValueError, IndexError), match="draft_step"):
        dec.generate(torch.tensor([3, 1]), 4)
    assert calls == []


# -- item 7: a confidence threshold reads the draft's output only after it is validated ---------------
def _rows(k):
    return np.full((k, VOCAB), 1.0 / VOCAB, dtype=np.float32)  # k valid draft rows


MALFORMED_DRAFTS = {  # what a draft asked for k tokens returns (a policy may ask for fewer than k_max)
    "not a pair": lambda k: np.arange(k),
    "nested tokens": lambda k: ([list(range(k))], _rows(k)),
    "string tokens": lambda k: (["a"] * k, _rows(k)),
    "float tokens": lambda k: (np.arange(k) + 0.5, _rows(k)),
    "token out of vocabulary": lambda k: (np.full(k, VOCAB + 2), _rows(k)),
    "negative token": lambda k: (np.full(k, -1), _rows(k)),
    "too few rows": lambda k: (np.arange(k), _rows(k)[:-1]),
    "3-D probs": lambda k: (np.arange(k), _rows(k)[None]),
    "string probs": lambda k: (np.arange(k), np.full((k, VOCAB), "x")),
    "probs a string": lambda k: (np.arange(k), "probs"),
    "more tokens than asked": lambda k: (np.arange(k + 1), _rows(k + 1)),
}


def _failure(policy, malformed):
    """``(type, message)`` of the error a sampling decoder with ``policy`` raises on ``malformed``'s output."""
    target, _ = bigram_pair(0, VOCAB)
    _, target_step = markov_callbacks(target, target, np.random.default_rng(1))
    dec = sv.SpeculativeDecoder(lambda prefix, k: malformed(k), target_step, k=policy, greedy=False,
                                generator=np.random.default_rng(2))
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the type itself is what is compared
        dec.generate(torch.tensor([3, 1]), 6)
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("case", sorted(MALFORMED_DRAFTS))
def test_malformed_draft_output_gets_the_same_error_with_a_confidence_threshold(case):
    malformed = MALFORMED_DRAFTS[case]
    plain = _failure(FixedK(1), malformed)  # AdaptiveK's first round asks for one token
    assert issubclass(plain[0], (TypeError, ValueError, IndexError)) and "draft_step" in plain[1], plain
    for policy in (FixedK(1, confidence_threshold=0.5), AdaptiveK(k_max=2, confidence_threshold=0.5)):
        assert _failure(policy, malformed) == plain, policy
