"""experiments.end_to_end.lookup_bound's greedy replays, on hand-checkable token sequences (no model)."""

import pytest

torch = pytest.importorskip("torch")

from experiments.end_to_end import lookup_bound as lb  # noqa: E402


def flat(n, is_tree):
    return 1.0  # every pass costs the same: tok/s = tokens per pass


def test_accepted_depth_follows_the_agreeing_branch():
    # root children 5 (node 0) and 7 (node 1); node 2 = 8 under node 1; node 3 = 9 under node 2
    tokens, parents = [5, 7, 8, 9], [-1, -1, 1, 2]
    assert lb.accepted_depth(tokens, parents, torch.tensor([7, 8, 9, 1])) == 3
    assert lb.accepted_depth(tokens, parents, torch.tensor([7, 8, 4])) == 2
    assert lb.accepted_depth(tokens, parents, torch.tensor([5, 8])) == 1
    assert lb.accepted_depth(tokens, parents, torch.tensor([6])) == 0
    assert lb.accepted_depth([], [], torch.tensor([6])) == 0
    assert lb.accepted_depth(tokens, parents, torch.tensor([7])) == 1  # the text ends


def test_replay_counts_rounds_and_charges_scored_tokens():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1]
    text = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # a copy of the prompt, then a new token
    plain = lb.replay(prompt, text, lambda s, r: ([], []), flat)
    assert plain["tokens_per_pass"] == 1.0
    chain = lb.replay(prompt, text, lb.chain_draft(4), flat)
    # rounds: 2-5 accepted + 6; 7-10 accepted + 11: two passes
    assert chain["tokens_per_pass"] == 5.0
    seconds = []
    lb.replay(prompt, text, lb.chain_draft(4), lambda n, is_tree: seconds.append((n, is_tree)) or 1.0)
    assert seconds == [(5, False), (5, False)]


def test_oracle_drops_proposals_whose_first_token_fails():
    prompt, text = [1, 2, 3, 1], [9, 9, 9]
    charged = []
    lb.replay(prompt, text, lb.chain_draft(2), lambda n, t: charged.append(n) or 1.0)
    assert charged[0] == 3  # the chain proposed 2, 3 and paid for them
    charged.clear()
    lb.replay(prompt, text, lb.chain_draft(2), lambda n, t: charged.append(n) or 1.0, oracle=True)
    assert charged[0] == 1


def test_path_oracle_picks_the_continuation_the_text_follows():
    # the last token 1 (no longer match) was followed by 2, 3 and by 4, 5, 6; the text follows the second
    prompt, text = [7, 1, 2, 3, 8, 1, 4, 5, 6, 9, 1], [4, 5, 6, 7]
    chain = lb.replay(prompt, text, lb.chain_draft(3), flat)  # earliest occurrence: 2, 3 ... rejected
    path = lb.replay(prompt, text, lb.path_oracle(), flat)
    assert path["tokens_per_pass"] == 4.0 > chain["tokens_per_pass"]
    tokens, parents = lb.path_oracle()(torch.tensor(prompt), torch.tensor(text))
    assert tokens == [4, 5, 6] and parents == [-1, 0, 1]


def test_trie_draft_merges_every_continuation():
    # the chain's proposal first (after the bigram 0 1: 4, 5), then every unigram continuation
    prompt = torch.tensor([1, 2, 3, 0, 1, 4, 5, 0, 1])
    assert lb.trie_draft(budget=8, depth=2, min_ngram=1)(prompt, None) == ([4, 5, 2, 3], [-1, 0, -1, 2])
    assert lb.trie_draft(budget=8, depth=2, min_ngram=2)(prompt, None) == ([4, 5], [-1, 0])
    assert lb.trie_draft(budget=3, depth=2, min_ngram=1)(prompt, None) == ([4, 5, 2], [-1, 0, -1])


def test_analyse_and_table_on_a_small_prompt_set():
    prompts = {"copy": ([1, 2, 3, 4, 5, 6, 1], [2, 3, 4, 5, 6, 9]),
               "branch": ([1, 2, 3, 0, 1, 4, 5, 6, 0, 1], [4, 5, 6, 7])}
    result = lb.analyse(prompts, lambda n, is_tree: 1.0 + 0.1 * (n - 1))
    assert set(result["drafts"]) == {"chain", "tree", "first-token oracle", "path oracle"}
    for res in result["drafts"].values():
        assert set(res) == set(prompts)
    path, chain = result["drafts"]["path oracle"], result["drafts"]["chain"]
    assert all(path[n]["tokens_per_s"] >= chain[n]["tokens_per_s"] for n in prompts)
    text = lb.table(result)
    assert "path oracle" in text and "mean x chain" in text
