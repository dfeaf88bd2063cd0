"""sv.warp and sv.accept_logits: bit-for-bit against the NumPy reference, the reference against
its own definition, bad input, and the law of accept rerun from logits (with power checks).

Sections:
- exp32: accuracy against np.exp, exact values at 0 and -inf;
- the reference (``specverify.reference.warp``) against the definitions it states (cut sets are
  rank-order prefixes with the stated masses), so the bit-for-bit tests compare with the right
  thing;
- the kernel against the reference, bit for bit: random rows of several families and the edge
  cases (ties, -inf, all-equal rows, one finite logit, V = 1, huge and tiny temperatures,
  top_k >= V, top_p = 1, min_p edges), in place, 1-D, torch tensors;
- validation: every bad argument raises an exception that names it;
- accept_logits (accept_block_logits) equals accept(warp(target), warp(draft)) (accept_block
  of them) given the same uniforms, and accept_logits's
  outputs follow the law of the warped target (chi-square at ALPHA = 1e-6); the same test
  rejects a draft warped differently from the target and an unwarped target.
"""

import numpy as np
import pytest

import specverify as sv
from specverify import reference as ref
from specverify.reference import warp as rw

from conftest import scaled
from test_ops_statistics import ROUNDS, law_test_passes

SETTINGS = [
    dict(),
    dict(temperature=0.7),
    dict(top_k=1),
    dict(top_k=5),
    dict(top_k=50, temperature=1.3),
    dict(top_p=0.9),
    dict(top_p=0.5, temperature=0.6),
    dict(top_p=1e-9),
    dict(top_k=50, top_p=0.9),
    dict(top_k=3, top_p=0.999999),
    dict(min_p=0.05),
    dict(min_p=1.0),
    dict(top_k=20, top_p=0.8, min_p=0.1, temperature=0.9),
]


def logit_rows(rng, rows, vocab, kind):
    """[rows, vocab] float32 logits of one family."""
    if kind == "normal":
        x = rng.standard_normal((rows, vocab)) * rng.choice([0.1, 1.0, 4.0])
    elif kind == "ties":  # few distinct values: ties at every cut
        x = rng.integers(-3, 3, (rows, vocab)).astype(np.float64)
    elif kind == "masked":  # -inf masks, one finite logit guaranteed
        x = 3.0 * rng.standard_normal((rows, vocab))
        x[rng.random((rows, vocab)) < 0.6] = -np.inf
        x[np.arange(rows), rng.integers(0, vocab, rows)] = 0.5
    elif kind == "close":  # weights equal in their top bits: the radix's lower levels decide
        x = 1e-5 * rng.standard_normal((rows, vocab))
    elif kind == "zipf":  # model-like: a few large logits, a long flat tail
        x = -1.2 * np.log(rng.permuted(np.tile(np.arange(1, vocab + 1), (rows, 1)), axis=1))
        x += 0.3 * rng.standard_normal((rows, vocab))
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def assert_same_bits(got, want):
    got, want = np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape
    differ = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)).ravel())
    assert differ.size == 0, f"{differ.size} elements differ, first flat index {differ[:5]}"


# -- exp32 ------------------------------------------------------------------------------------
@pytest.mark.emulated
def test_exp32_is_within_one_ulp_and_exact_at_the_ends():
    grid = np.arange(-86 * 256, 1) / 256.0
    z = np.concatenate([grid, -86.0 * np.random.default_rng(0).random(scaled(200_000))]).astype(np.float32)
    got = rw.exp32(z).astype(np.float64)
    exact = np.exp(z.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) < 1.0
    assert np.all(np.diff(rw.exp32(np.sort(z))) >= 0)  # monotone on these points
    assert rw.exp32(np.float32(0.0)) == 1.0
    assert rw.exp32(np.float32(-np.inf)) == 0.0
    assert rw.exp32(np.float32(-86.0)) > 0.0 and rw.exp32(np.float32(-86.00001)) == 0.0


# -- the reference against its own definition ----------------------------------------------------
@pytest.mark.emulated
def test_reference_cuts_are_the_stated_prefixes():
    rng = np.random.default_rng(1)
    for trial in range(scaled(200, 40)):
        vocab = int(rng.integers(1, 60))
        x = logit_rows(rng, 1, vocab, rng.choice(["normal", "ties", "masked"]))[0]
        top_k, top_p = int(rng.integers(0, vocab + 2)), float(rng.choice([1.0, 0.3, 0.9]))
        w, keep = rw.warp_row_mask(x, 1.0, top_k, top_p, 0.0)
        order = rw.rank_order(w)
        kept = keep[order]
        n = int(kept.sum())
        assert kept[:n].all() and not kept[n:].any(), "the kept set is a rank-order prefix"
        assert kept[0], "the most likely token stays"
        after_k = min(top_k, vocab) if top_k else vocab
        if top_p == 1.0:
            assert n == after_k
        else:
            q = rw.fixed_weights(w)[order][:after_k]  # top-k kept the first after_k of the order
            total = float(int(q.sum()))
            assert float(int(q[: n - 1].sum())) < top_p * total  # the last kept token qualified
            if n < after_k:  # and the first dropped one did not
                assert not float(int(q[:n].sum())) < top_p * total


@pytest.mark.emulated
def test_reference_rows_sum_to_one_and_keep_the_first_maximum():
    rng = np.random.default_rng(2)
    x = logit_rows(rng, 50, 300, "ties")
    for settings in SETTINGS:
        p = rw.warp(x, **settings)
        assert np.allclose(p.astype(np.float64).sum(axis=1), 1.0, atol=1e-6)
        assert np.all(p[np.arange(50), np.argmax(x, axis=1)] > 0)


# -- the kernel against the reference, bit for bit ----------------------------------------------
@pytest.mark.emulated
@pytest.mark.parametrize("kind", ["normal", "ties", "masked", "close", "zipf"])
def test_warp_matches_the_reference_bit_for_bit(kind):
    rng = np.random.default_rng(["normal", "ties", "masked", "close", "zipf"].index(kind))
    for vocab in (1, 2, 7, 255, 257, 1000, 4099):
        x = logit_rows(rng, 3, vocab, kind)
        for settings in SETTINGS[:: 1 if vocab < 2000 else 3]:
            assert_same_bits(sv.warp(x, **settings), rw.warp(x, **settings))


@pytest.mark.emulated
def test_warp_matches_the_reference_at_a_real_vocabulary():
    rng = np.random.default_rng(3)
    x = np.vstack([logit_rows(rng, 1, 49152, "zipf"), logit_rows(rng, 1, 49152, "normal")])
    for settings in (dict(temperature=0.7), dict(top_k=50), dict(top_p=0.9), dict(top_k=50, top_p=0.9),
                     dict(min_p=0.05)):
        assert_same_bits(sv.warp(x, **settings), rw.warp(x, **settings))


@pytest.mark.emulated
@pytest.mark.parametrize("x", [
    np.zeros((2, 300)),                                     # all equal: every cut is a tie
    np.full((1, 5), -1e30),                                 # all equal and very negative
    np.array([[-np.inf, 3.0, -np.inf, -np.inf]]),           # a single finite logit
    np.array([[-np.inf, 2.0, 2.0, -np.inf, 2.0]]),          # tied maxima among masks
    np.array([[7.0]]),                                      # V = 1
    np.array([[3e38, -3e38, 0.0, 1.0]]),                    # x - max overflows to -inf
    np.array([[0.0, -85.9, -86.0, -86.1, -200.0]]),         # around exp32's cutoff
], ids=["all_equal", "all_equal_negative", "one_finite", "tied_maxima", "v1", "overflow", "cutoff"])
@pytest.mark.parametrize("settings", [
    dict(), dict(temperature=1e-30), dict(temperature=1e30), dict(temperature=1e-3),
    dict(top_k=1), dict(top_k=2), dict(top_k=10**9), dict(top_p=1.0), dict(top_p=0.5), dict(top_p=5e-324),
    dict(min_p=1.0), dict(min_p=1e-30), dict(min_p=0.5), dict(top_k=2, top_p=0.3, min_p=0.2),
])
def test_warp_edge_cases_match_the_reference(x, settings):
    x = x.astype(np.float32)
    got = sv.warp(x, **settings)
    assert_same_bits(got, rw.warp(x, **settings))
    assert np.all(np.isfinite(got)) and np.all(got >= 0)
    assert np.allclose(got.astype(np.float64).sum(axis=1), 1.0, atol=1e-6)
    assert np.all(got[np.isneginf(x)] == 0), "masked logits stay masked"


@pytest.mark.emulated
def test_top_k_ties_are_resolved_by_token_index():
    x = np.array([[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0]], dtype=np.float32)
    assert np.flatnonzero(sv.warp(x, top_k=3)[0]).tolist() == [1, 2, 3]
    assert np.flatnonzero(sv.warp(x, top_k=4)[0]).tolist() == [1, 2, 3, 4]


@pytest.mark.emulated
def test_warp_in_place_one_row_lists_and_out():
    rng = np.random.default_rng(4)
    x = logit_rows(rng, 3, 500, "normal")
    want = rw.warp(x, top_p=0.8)
    y = x.copy()
    assert sv.warp(y, top_p=0.8, out=y) is y
    assert_same_bits(y, want)
    assert_same_bits(sv.warp(x[1], top_p=0.8), want[1])
    assert_same_bits(sv.warp(x[1].tolist(), top_p=0.8), want[1])
    out = np.empty_like(x)
    assert sv.warp(x.astype(np.float64), top_p=0.8, out=out) is out  # float64 is converted first
    assert_same_bits(out, want)
    assert_same_bits(sv.warp(x[:, ::2], top_p=0.8), rw.warp(x[:, ::2], top_p=0.8))  # strided


def test_warp_on_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = logit_rows(rng, 3, 500, "zipf")
    got = sv.warp(torch.from_numpy(x), temperature=0.8, top_k=40, top_p=0.9)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert_same_bits(got.numpy(), rw.warp(x, temperature=0.8, top_k=40, top_p=0.9))
    out = torch.empty(3, 500)
    assert sv.warp(torch.from_numpy(x).to(torch.bfloat16), out=out) is out


@pytest.mark.emulated
def test_warp_reads_arrays_in_place_and_converts_the_rest():
    """The kernel entry reads the common arrays itself (1-D or 2-D float32, out disjoint or the
    logits themselves) and sends the rest through the conversion: the same bits either way."""
    rng = np.random.default_rng(6)
    settings = dict(temperature=0.8, top_p=0.9)
    x = logit_rows(rng, 4, 300, "zipf")
    want = rw.warp(x, **settings)
    assert sv.kernels._kernels.convert_only_warp(x) is None
    assert sv.kernels._kernels.convert_only_warp(x, np.empty_like(x)) is None
    for out in (np.empty((300,), np.float32), np.empty((1, 300), np.float32)):  # one row: [V] or [1, V]
        assert sv.warp(x[2], out=out, **settings) is out
        assert_same_bits(out.reshape(1, -1), want[2:3])
    wide = np.full((4, 400), 7.0, dtype=np.float32)
    wide[:, :300] = x
    assert_same_bits(sv.warp(wide[:, :300], **settings), want)            # rows apart in memory
    assert_same_bits(sv.warp(x[::-1], **settings), want[::-1])            # a negative row stride
    assert_same_bits(sv.warp(np.broadcast_to(x[1], (3, 300)), **settings), np.tile(want[1], (3, 1)))
    out = wide.reshape(-1)[:1200].reshape(4, 300)  # C-contiguous, overlapping wide's rows
    assert sv.warp(wide[:, :300], out=out, **settings) is out  # read as a copy first (as before)
    assert_same_bits(out, want)
    assert sv.warp(np.empty((0, 300), np.float32), **settings).shape == (0, 300)
    frozen = x.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="out must be C-contiguous, aligned and writable"):
        sv.warp(x, out=frozen)
    with pytest.raises(ValueError, match="out must have shape"):
        sv.warp(x[:1], out=np.empty(300, np.float32))  # [V] out only for [V] logits
    with pytest.raises(ValueError, match="out overlaps"):
        y = np.concatenate([[0.0], x.ravel()]).astype(np.float32)
        sv.warp(y[1:].reshape(4, 300), out=y[:-1].reshape(4, 300))  # one float apart


def test_warp_reads_tensors_in_place_and_converts_the_rest():
    torch = pytest.importorskip("torch")
    from specverify.kernels import _kernels
    rng = np.random.default_rng(7)
    settings = dict(top_k=40, top_p=0.9)
    x = logit_rows(rng, 3, 500, "zipf")
    want = rw.warp(x, **settings)
    route = _kernels._tensor_route()
    default = torch.get_default_dtype()
    try:
        for r in ("exchange", "capsule") if route == "exchange" else ("capsule",):
            _kernels._tensor_route(r)
            t = torch.from_numpy(x.copy())
            row = sv.warp(t[1], **settings)
            assert isinstance(row, torch.Tensor) and row.shape == (500,)
            assert_same_bits(row.numpy(), want[1])
            assert sv.warp(t, out=t, **settings) is t  # in place
            assert_same_bits(t.numpy(), want)
            shared = torch.from_numpy(x.copy())
            with pytest.raises(ValueError, match="out overlaps"):
                sv.warp(shared[:2], out=shared.numpy()[1:])  # a tensor and an ndarray of one memory
            assert_same_bits(sv.warp(torch.from_numpy(x).requires_grad_(), **settings).numpy(), want)
            with pytest.raises(ValueError, match="out must not require grad"):
                sv.warp(torch.from_numpy(x), out=torch.empty(3, 500, requires_grad=True))
            with pytest.raises(TypeError, match="out must be a CPU float32 tensor"):
                sv.warp(torch.from_numpy(x), out=torch.empty(3, 500, dtype=torch.float64))
            torch.set_default_dtype(torch.float64)
            assert sv.warp(torch.from_numpy(x), **settings).dtype == torch.float32
            torch.set_default_dtype(default)
            wide = torch.zeros(3, 600)
            wide[:, :500] = torch.from_numpy(x)
            assert_same_bits(sv.warp(wide[:, :500], **settings).numpy(), want)
    finally:
        torch.set_default_dtype(default)
        _kernels._tensor_route(route)


# -- validation ---------------------------------------------------------------------------------
@pytest.mark.emulated
@pytest.mark.parametrize("settings, error, words", [
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(temperature="hot"), TypeError, "temperature"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_k=1.5), TypeError, "top_k"),
    (dict(top_k=True), TypeError, "top_k"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(top_p=float("nan")), ValueError, "top_p"),
    (dict(min_p=-0.1), ValueError, "min_p"),
    (dict(min_p=1.01), ValueError, "min_p"),
    (dict(min_p=float("nan")), ValueError, "min_p"),
])
def test_bad_settings_name_the_argument(settings, error, words):
    x = np.zeros((1, 4), dtype=np.float32)
    with pytest.raises(error, match=words):
        sv.warp(x, **settings)
    with pytest.raises(error, match=words):
        sv.accept_logits_from_uniforms(x, None, [], [0.5], **settings)


@pytest.mark.emulated
def test_bad_logits_name_the_argument_and_row():
    x = np.zeros((3, 4), dtype=np.float32)
    for bad, words in [(np.nan, r"logits\[1\] contains NaN"), (np.inf, r"logits\[1\] contains inf")]:
        y = x.copy()
        y[1, 2] = bad
        with pytest.raises(ValueError, match=words):
            sv.warp(y)
    y = x.copy()
    y[2] = -np.inf
    with pytest.raises(ValueError, match=r"logits\[2\] is -inf everywhere"):
        sv.warp(y)
    with pytest.raises(TypeError, match="logits"):
        sv.warp(np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(ValueError, match="logits"):
        sv.warp(np.zeros((2, 0), dtype=np.float32))
    with pytest.raises(ValueError, match="out"):
        sv.warp(x, out=np.empty((3, 5), dtype=np.float32))
    with pytest.raises(TypeError, match="out"):
        sv.warp(x, out=np.empty((3, 4)))
    with pytest.raises(ValueError, match="out"):
        sv.warp(x, out=np.empty((3, 8), dtype=np.float32)[:, ::2])
    with pytest.raises(ValueError, match="out overlaps"):
        big = np.zeros((4, 4), dtype=np.float32)
        sv.warp(big[:3], out=big[1:])


def test_bad_out_tensors_name_out():
    """Found by the fuzz (issue 19): a negated view raised torch's RuntimeError from .numpy(), a
    sparse tensor torch's TypeError naming no argument."""
    torch = pytest.importorskip("torch")
    x = np.zeros((3, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="out must not be a negated view"):
        sv.warp(x, out=torch._neg_view(torch.zeros(3, 4)))
    with pytest.raises(TypeError, match="out must be a dense tensor"):
        sv.warp(x, out=torch.zeros(3, 4).to_sparse())
    with pytest.raises(ValueError, match="out must not require grad"):
        sv.warp(x, out=torch.zeros(3, 4, requires_grad=True))


@pytest.mark.emulated
def test_accept_logits_bad_input_names_the_argument():
    t, d = np.zeros((3, 5), dtype=np.float32), np.zeros((2, 5), dtype=np.float32)
    u = [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="target_logits"):
        sv.accept_logits_from_uniforms(t[:2], d, [1, 2], u)
    with pytest.raises(ValueError, match="draft_logits"):
        sv.accept_logits_from_uniforms(t, d[:, :4], [1, 2], u)
    with pytest.raises(IndexError, match="draft_tokens"):
        sv.accept_logits_from_uniforms(t, d, [1, 5], u)
    with pytest.raises(ValueError, match="uniforms"):
        sv.accept_logits_from_uniforms(t, d, [1, 2], [0.5, 0.5, 1.0])
    bad = t.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"target_logits\[1\]"):
        sv.accept_logits_from_uniforms(bad, d, [1, 2], u)
    bad = d.copy()
    bad[1] = -np.inf
    with pytest.raises(ValueError, match=r"draft_logits\[1\] is -inf everywhere"):
        sv.accept_logits_from_uniforms(t, bad, [1, 2], u)


# -- accept_logits ------------------------------------------------------------------------------
def logit_rounds(seed, count):
    """``count`` random rounds: (target logits [K+1, V], draft logits [K, V], settings, their
    warped rows p and q by the reference, draft tokens drawn from q [K], uniforms [K+1])."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        k, vocab = int(rng.integers(0, 5)), int(rng.choice([3, 50, 600]))
        kind = rng.choice(["normal", "ties", "masked", "zipf"])
        target, draft = logit_rows(rng, k + 1, vocab, kind), logit_rows(rng, k, vocab, kind)
        settings = SETTINGS[int(rng.integers(len(SETTINGS)))]
        p, q = rw.warp(target, **settings), rw.warp(draft, **settings)
        tokens = np.array([rng.choice(vocab, p=row / row.sum(dtype=np.float64)) for row in q.astype(np.float64)],
                          dtype=np.int64)
        yield target, draft, settings, p, q, tokens, rng.random(k + 1)


@pytest.mark.emulated
def test_accept_logits_equals_accept_of_warped_rows():
    for target, draft, settings, p, q, tokens, u in logit_rounds(6, scaled(300, 60)):
        want = ref.accept(p, q, tokens, u)
        assert sv.accept_logits_from_uniforms(target, draft, tokens, u, **settings) == want
        assert sv.accept_from_uniforms(sv.warp(target, **settings), sv.warp(draft, **settings), tokens, u) == want
        point = sv.accept_logits_from_uniforms(target, None, tokens, u, **settings)
        assert point == ref.accept(p, None, tokens, u)


@pytest.mark.emulated
def test_accept_block_logits_equals_accept_block_of_warped_rows():
    for target, draft, settings, p, q, tokens, u in logit_rounds(10, scaled(150, 30)):
        assert sv.accept_block_logits_from_uniforms(target, draft, tokens, u, **settings) == \
            ref.accept_block(p, q, tokens, u)
        assert sv.accept_block_logits_from_uniforms(target, None, tokens, u, **settings) == \
            ref.accept_block(p, None, tokens, u)


@pytest.mark.emulated
def test_accept_logits_generator_contract():
    rng = np.random.default_rng(7)
    target, draft = logit_rows(rng, 4, 100, "zipf"), logit_rows(rng, 3, 100, "zipf")
    tokens = np.array([0, 5, 9])
    g1, g2 = np.random.default_rng(8), np.random.default_rng(8)
    for _ in range(50):
        got = sv.accept_logits(target, draft, tokens, g1, top_p=0.9)
        assert got == sv.accept_logits_from_uniforms(target, draft, tokens, g2.random(4), top_p=0.9)
    assert g1.random() == g2.random()
    for _ in range(20):
        got = sv.accept_block_logits(target, draft, tokens, g1, top_k=30)
        assert got == sv.accept_block_logits_from_uniforms(target, draft, tokens, g2.random(4), top_k=30)


def law_case():
    """Small logits whose warped rows differ from the raw softmax (top-k and top-p both cut)."""
    rng = np.random.default_rng(9)
    target = (2.0 * rng.standard_normal((4, 8))).astype(np.float32)
    draft = (target[:3] + rng.standard_normal((3, 8))).astype(np.float32)
    return target, draft, dict(temperature=0.8, top_k=6, top_p=0.85)


def run_law_test(sampler, settings_for_law, seed):
    target_logits, draft_logits, settings = law_case()
    target, draft = rw.warp(target_logits, **settings_for_law), rw.warp(draft_logits, **settings)

    def from_logits(_target, _draft, tokens, u):
        return sampler(target_logits, draft_logits, tokens, u, settings)

    return law_test_passes(from_logits, target, draft, rounds=ROUNDS // 2, seed=seed)


@pytest.mark.emulated
def test_accept_logits_follows_the_law_of_the_warped_target():
    ok, pvalues = run_law_test(lambda t, d, k, u, s: sv.accept_logits_from_uniforms(t, d, k, u, **s),
                               law_case()[2], seed=31)
    assert ok, pvalues


def test_the_law_test_rejects_mismatched_warping():
    target_logits, draft_logits, settings = law_case()
    warped_target, plain_target = rw.warp(target_logits, **settings), rw.warp(target_logits)
    warped_draft, plain_draft = rw.warp(draft_logits, **settings), rw.warp(draft_logits)
    # The draft's tokens come from its warped rows, but verification sees it unwarped
    # (transformers #47932's bug) ...
    ok, pvalues = run_law_test(
        lambda t, d, k, u, s: sv.accept_from_uniforms(warped_target, plain_draft, k, u), settings, seed=32)
    assert not ok, pvalues
    # ... or the target is verified unwarped (vLLM #9834) while the law expects the warped one.
    ok, pvalues = run_law_test(
        lambda t, d, k, u, s: sv.accept_from_uniforms(plain_target, warped_draft, k, u), settings, seed=33)
    assert not ok, pvalues
