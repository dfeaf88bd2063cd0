"""Bad input gets a clear exception naming the argument; nothing crashes, nothing is silently wrong."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import specverify as sv

K, V = 3, 10


def good():
    rng = np.random.default_rng(0)
    target = rng.random((K + 1, V)).astype(np.float32) + np.float32(0.01)
    draft = rng.random((K, V)).astype(np.float32) + np.float32(0.01)
    return target, draft, np.array([1, 2, 3])


def with_value(x, row, col, value):
    x = x.copy()
    x[row, col] = value
    return x


def bad_accept_inputs():
    """(id, target, draft, tokens, exception, message fragment)."""
    t, d, k = good()
    big = 2**70
    return [
        ("target_1d", t[0], d, k, ValueError, "target_probs must be 2-D"),
        ("target_3d", t[None], d, k, ValueError, "target_probs must be 2-D"),
        ("target_rows", t[:K], d, k, ValueError, "target_probs must have 4 rows"),
        ("draft_rows", t, d[:2], k, ValueError, "draft_probs must have 3 rows"),
        ("vocab_mismatch", t, d[:, :5], k, ValueError, "draft_probs must have V = 10"),
        ("empty_vocab", t[:, :0], d[:, :0], k, ValueError, "empty vocabulary"),
        ("int_target", t.astype(np.int64), d, k, TypeError, "target_probs must hold floating-point"),
        ("bool_draft", t, d > 0.5, k, TypeError, "draft_probs must hold floating-point"),
        ("complex_target", t.astype(np.complex64), d, k, TypeError, "target_probs"),
        ("float_tokens", t, d, np.array([1.0, 2.0, 3.0]), TypeError, "draft_tokens must hold integer"),
        ("bool_tokens", t, d, np.array([True, False, True]), TypeError, "draft_tokens must hold integer"),
        ("tokens_2d", t, d, k[None], ValueError, "draft_tokens must be 1-D"),
        ("negative_token", t, d, [1, -1, 2], IndexError, "draft_tokens[1] = -1"),
        ("token_eq_vocab", t, d, [1, 2, V], IndexError, "draft_tokens[2] = 10"),
        ("huge_token", t, d, [1, 2, 2**62], IndexError, "draft_tokens[2]"),
        ("beyond_int64_token", t, d, [1, 2, big], IndexError, "draft_tokens[2] = 1180591620717411303424 is outside the int64"),
        ("huge_uint_token", t, d, np.array([1, 2, 2**64 - 1], dtype=np.uint64), IndexError, "draft_tokens"),
        ("nan_target", with_value(t, 0, 4, np.nan), d, k, ValueError, "target_probs[0] contains NaN"),
        ("inf_target", with_value(t, 0, 4, np.inf), d, k, ValueError, "target_probs[0] contains inf"),
        ("neg_inf_target", with_value(t, 0, 4, -np.inf), d, k, ValueError, "target_probs[0] contains -inf"),
        ("negative_target", with_value(t, 0, 7, -0.5), d, k, ValueError, "target_probs[0] contains a negative value"),
        ("nan_draft", t, with_value(d, 0, 2, np.nan), k, ValueError, "draft_probs[0] contains NaN"),
        ("negative_draft", t, with_value(d, 0, 1, -1e-30), k, ValueError, "draft_probs[0] contains a negative"),
        ("zero_target_row", with_value(t, 0, slice(None), 0.0), d, k, ValueError, "target_probs[0] has zero mass"),
        ("zero_draft_row", t, with_value(d, 0, slice(None), 0.0), k, ValueError, "draft_probs[0] has zero mass"),
        ("ragged_list", [[0.1, 0.2], [0.3]], d, k, TypeError, "target_probs"),
        ("string_target", "abc", d, k, TypeError, "target_probs"),
    ]


@pytest.mark.emulated
@pytest.mark.parametrize("case", bad_accept_inputs(), ids=lambda c: c[0])
def test_accept_rejects_bad_input(case):
    _, target, draft, tokens, error, fragment = case
    with pytest.raises(error, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        sv.accept_from_uniforms(target, draft, tokens, np.full(K + 1, 0.5))


@pytest.mark.emulated
def test_bad_value_in_a_later_row_is_found_when_that_row_is_read():
    t, d, k = good()
    t = with_value(t, 2, 0, np.nan)
    # u = 0 accepts rows 0 and 1, so row 2 is read and its NaN reported by row.
    with pytest.raises(ValueError, match=r"target_probs\[2\] contains NaN \(first at column 0\)"):
        sv.accept_from_uniforms(t, d, k, np.zeros(K + 1))
    # A rejection at row 0 never reads row 2.
    t0 = with_value(t, 0, slice(None), 1.0)
    d0 = with_value(d, 0, slice(None), 1.0)
    d0[0, 1] = 1e6
    assert sv.accept_from_uniforms(t0, d0, k, np.full(K + 1, 0.9))[0] == 0


@pytest.mark.emulated
def test_uniforms_are_validated():
    t, d, k = good()
    for uniforms, fragment in [
        (np.full(K, 0.5), r"uniforms must have shape \[4\]"),
        (np.array([0.5, 0.5, 1.0, 0.5]), r"uniforms must lie in \[0, 1\)"),
        (np.array([0.5, np.nan, 0.5, 0.5]), r"uniforms must lie in \[0, 1\)"),
        (np.array([0.5, -0.1, 0.5, 0.5]), r"uniforms must lie in \[0, 1\)"),
        (np.array([0, 0, 0, 0]), "uniforms must be floating point"),
    ]:
        with pytest.raises((ValueError, TypeError), match=fragment):
            sv.accept_from_uniforms(t, d, k, uniforms)


@pytest.mark.emulated
def test_generator_type_is_checked():
    t, d, k = good()
    with pytest.raises(TypeError, match="generator must be"):
        sv.accept(t, d, k, generator=np.random.RandomState(0))


@pytest.mark.emulated
@pytest.mark.parametrize(
    "scores, tokens, error, fragment",
    [
        (np.zeros((2, 4), np.float32), [], ValueError, "target_probs must have 1 rows"),
        (np.zeros((1, 0), np.float32), [], ValueError, "empty vocabulary"),
        (np.array([[1, np.nan, 0]], np.float32), [], ValueError, r"target_probs\[0\] contains NaN"),
        (np.array([[1, np.inf, 0]], np.float32), [], ValueError, r"target_probs\[0\] contains inf"),
        (np.full((1, 3), -np.inf, np.float32), [], ValueError, r"target_probs\[0\] is -inf everywhere"),
        (np.array([[1, -np.nan, 0]], np.float32), [], ValueError, r"target_probs\[0\] contains NaN"),
        (np.array([[-1, -np.nan, -2]], np.float32), [], ValueError, r"target_probs\[0\] contains NaN"),
        (np.array([[-1, -2, np.nan]], np.float32), [], ValueError, r"target_probs\[0\] contains NaN"),
        (np.zeros((2, 3), np.int32), [0], TypeError, "floating-point"),
        (np.zeros((2, 3), np.float32), [3], IndexError, r"draft_tokens\[0\] = 3"),
    ],
)
def test_verify_greedy_rejects_bad_input(scores, tokens, error, fragment):
    with pytest.raises(error, match=fragment):
        sv.verify_greedy(scores, tokens)


@pytest.mark.emulated
def test_greedy_accepts_negative_scores_and_masked_logits():
    scores = np.array([[-5.0, -np.inf, -1.0], [-np.inf, -2.0, -np.inf]], dtype=np.float32)
    assert sv.verify_greedy(scores, [2]) == (1, 1)


@pytest.mark.emulated
def test_dtypes_and_layouts_are_converted_not_misread(rng):
    t, d, k = good()
    u = np.full(K + 1, 0.37)
    want = sv.accept_from_uniforms(t, d, k, u)
    # float64 / float16 rows are converted to float32 (float16 rounding may change the result,
    # so compare against the float32 values the conversion produces).
    assert sv.accept_from_uniforms(t.astype(np.float64), d.astype(np.float64), k, u) == want
    t16, d16 = t.astype(np.float16), d.astype(np.float16)
    assert sv.accept_from_uniforms(t16, d16, k, u) == sv.accept_from_uniforms(
        t16.astype(np.float32), d16.astype(np.float32), k, u)
    # Non-contiguous views: column-sliced, Fortran-ordered, every other row.
    wide = np.zeros((2 * (K + 1), 2 * V), dtype=np.float32)
    wide[::2, ::2] = t
    assert sv.accept_from_uniforms(wide[::2, ::2], d, k, u) == want
    assert sv.accept_from_uniforms(np.asfortranarray(t), np.asfortranarray(d), k, u) == want
    padded = np.zeros((K + 1, V + 7), dtype=np.float32)
    padded[:, :V] = t
    assert sv.accept_from_uniforms(padded[:, :V], d, k, u) == want  # row stride != V, no copy
    # Tokens: lists, int32, uint8, and a read-only array.
    for tokens in ([1, 2, 3], np.array(k, np.int32), np.array(k, np.uint8)):
        assert sv.accept_from_uniforms(t, d, tokens, u) == want
    t_ro = t.copy()
    t_ro.setflags(write=False)
    assert sv.accept_from_uniforms(t_ro, d, k, u) == want
    n, tok = want
    assert type(n) is int and type(tok) is int


@pytest.fixture(params=["exchange", "capsule"])
def tensor_route(request):
    """Run a test with each DLPack producer the kernels can describe tensors with."""
    pytest.importorskip("torch")
    from specverify.kernels import _kernels

    before = _kernels._tensor_route()
    if request.param == "exchange" and before != "exchange":
        pytest.skip("this torch has no DLPack exchange API")
    _kernels._tensor_route(request.param)
    yield request.param
    _kernels._tensor_route(before)


def test_torch_inputs_match_numpy_and_are_validated(tensor_route):
    import torch

    t, d, k = good()
    u = np.full(K + 1, 0.61)
    want = sv.accept_from_uniforms(t, d, k, u)
    tt, dt, kt = torch.from_numpy(t), torch.from_numpy(d), torch.from_numpy(k)
    assert sv.accept_from_uniforms(tt, dt, kt, torch.from_numpy(u)) == want
    assert sv.accept_from_uniforms(tt.double(), dt.double(), kt.int(), u) == want
    assert sv.accept_from_uniforms(tt.t().contiguous().t(), dt, kt, u) == want  # column-major view
    assert sv.accept_from_uniforms(tt.requires_grad_(True), dt, kt, u) == want
    bf = tt.detach().to(torch.bfloat16)
    assert sv.accept_from_uniforms(bf, dt, kt, u) == sv.accept_from_uniforms(bf.float(), dt, kt, u)
    assert sv.verify_greedy(tt.detach(), kt) == sv.verify_greedy(t, k)
    with pytest.raises(TypeError, match="target_probs must hold floating-point"):
        sv.accept(tt.detach().long(), dt, kt)
    with pytest.raises(TypeError, match="draft_tokens must hold integer"):
        sv.accept(tt.detach(), dt, kt.float())
    with pytest.raises(IndexError, match=r"draft_tokens\[0\] = 99"):
        sv.verify_greedy(tt.detach(), torch.tensor([99, 1, 2]))
    with pytest.raises(ValueError, match=r"target_probs\[0\] contains NaN"):
        sv.accept(torch.full((1, 4), float("nan")), None, torch.zeros(0, dtype=torch.long))
    # Views that start inside their storage (row and column offsets), read in place.
    wide = torch.zeros(K + 2, V + 3)
    wide[1:, 2:2 + V] = tt.detach()
    assert sv.accept_from_uniforms(wide[1:, 2:2 + V], dt, kt, u) == want
    assert sv.verify_greedy(wide[1:, 2:2 + V], kt) == sv.verify_greedy(t, k)
    # Lazily negated views (their memory holds the values' negatives) are read as their values.
    negated = torch._neg_view(tt.detach())
    assert sv.verify_greedy(negated, kt) == sv.verify_greedy(-t, k)
    with pytest.raises(ValueError, match=r"target_probs\[0\] contains a negative value"):
        sv.accept_from_uniforms(negated, dt, kt, u)
    with pytest.raises(IndexError, match=r"draft_tokens\[1\] = -2"):
        sv.verify_greedy(tt.detach(), torch._neg_view(torch.tensor([0, 2, 1])))
    with pytest.raises(ValueError, match="target_probs must be a CPU tensor"):
        sv.verify_greedy(torch.empty(K + 1, V, device="meta"), kt)


BAD_INPUT_SCRIPT = textwrap.dedent(
    """
    import numpy as np, specverify as sv
    import test_ops_validation as cases
    raised = 0
    for case in cases.bad_accept_inputs():
        _, target, draft, tokens, error, _ = case
        for op in (lambda: sv.accept_from_uniforms(target, draft, tokens, np.full(4, 0.5)),
                   lambda: sv.accept_from_uniforms(target, None, tokens, np.full(4, 0.5)),
                   lambda: sv.verify_greedy(target, tokens)):
            try:
                op()
            except (TypeError, ValueError, IndexError):
                raised += 1
    print("raised", raised)
    """
)


@pytest.mark.emulated
def test_bad_inputs_never_crash_the_process():
    # A segfault would kill the interpreter; run every bad input in a child process.
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, "-c", BAD_INPUT_SCRIPT], cwd=here, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "raised" in result.stdout
