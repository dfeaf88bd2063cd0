"""accept_block: bit for bit the reference, accept where they must agree, and accept's validation."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import specverify as sv
from specverify import reference

from conftest import draw_from_rows, random_probability_rows, scaled
from test_ops_reference import accept_case, accepted_lengths_matching_reference
from test_ops_validation import K, V, bad_accept_inputs, good, with_value

pytestmark = pytest.mark.emulated


# ------------------------------------------------------------------------------------------
# The kernel is the reference, bit for bit.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "one_hot"])
def test_accept_block_matches_reference_bit_for_bit(rng, point_mass):
    outcomes = accepted_lengths_matching_reference(sv.accept_block_from_uniforms, reference.accept_block, rng,
                                                   point_mass, scaled(1000, 60))
    assert outcomes[0] > 0 and outcomes[2:].sum() > 0


@pytest.mark.parametrize("v", [255, 256, 257, 511, 1023, 1024, 1025, 4096 + 3])
def test_sizes_straddling_block_multiples(rng, v):
    # Drafts close to the target (deep acceptance, every residual pass visited) and far from it.
    for _ in range(scaled(40, 4)):
        k = int(rng.integers(1, 9))
        target = random_probability_rows(rng, k + 1, v, kind="softmax")
        w = rng.random()
        draft = (w * target[:k] / target[:k].sum(axis=1, keepdims=True)
                 + (1 - w) * random_probability_rows(rng, k, v, kind="softmax")).astype(np.float32)
        tokens = draw_from_rows(rng, draft)
        uniforms = rng.random(k + 1)
        for d in (draft, None):
            want = reference.accept_block(target, d, tokens, uniforms)
            assert sv.accept_block_from_uniforms(target, d, tokens, uniforms) == want


def test_at_the_seed_sizes(rng):
    for v, k in [(32000, 4), (128256, 3)]:
        for _ in range(scaled(4, 1)):
            target = random_probability_rows(rng, k + 1, v, kind="softmax")
            draft = (0.5 * target[:k] + 0.5 * random_probability_rows(rng, k, v, kind="softmax")).astype(np.float32)
            tokens = draw_from_rows(rng, draft)
            uniforms = rng.random(k + 1)
            want = reference.accept_block(target, draft, tokens, uniforms)
            assert sv.accept_block_from_uniforms(target, draft, tokens, uniforms) == want


def test_k_up_to_one_is_accept_bit_for_bit(rng):
    # K = 1: h_1 = p_1 and the residual at 0 is accept's, tested with the same operations.
    for _ in range(scaled(2000, 100)):
        target, draft, tokens, uniforms = accept_case(rng, rng.random() < 0.3)
        k = min(tokens.size, 1)
        args = (target[: k + 1], None if draft is None else draft[:k], tokens[:k], uniforms[: k + 1])
        assert sv.accept_block_from_uniforms(*args) == sv.accept_from_uniforms(*args)


def test_edge_cases():
    nearly_one = np.nextafter(1.0, 0.0)
    # q(t) = 0 < p(t): ratio +inf, p_1 = 1, always accepted.
    target = np.array([[1, 1, 0], [1, 1, 1]], dtype=np.float32)
    draft = np.array([[0, 1, 1]], dtype=np.float32)
    assert sv.accept_block_from_uniforms(target, draft, [0], [nearly_one, 0.5])[0] == 1
    # p(t) = 0 at position 0: p_i = 0 for every i >= 1, so no coin passes, even u = 0.
    target = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=np.float32)
    draft = np.array([[1, 1, 1], [1, 1, 1]], dtype=np.float32)
    for u1 in [0.0, 0.5]:
        n, tok = sv.accept_block_from_uniforms(target, draft, [2, 0], [0.0, u1, 0.3])
        assert n == 0 and tok != 2
    # p = q at different scales everywhere: p_i = 1, every coin passes.
    draft = np.array([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]], dtype=np.float32)
    target = np.vstack([draft * np.float32(8.0), [[1, 0, 0]]]).astype(np.float32)
    for u in [0.0, 0.5, nearly_one]:
        assert sv.accept_block_from_uniforms(target, draft, [2, 1], [u, u, 0.3]) == (2, 0)
    # A later coin passing accepts the whole prefix, whatever the earlier coin says: position 1
    # rejects under accept (u = 0.99 > ratio) but block verification still accepts both.
    target = np.array([[0.5, 0.5], [0.5, 0.5], [1, 1]], dtype=np.float32)
    draft = np.array([[0.9, 0.1], [0.5, 0.5]], dtype=np.float32)
    u = [0.99, 0.0, 0.5]
    assert sv.accept_from_uniforms(target, draft, [0, 0], u)[0] == 0
    assert sv.accept_block_from_uniforms(target, draft, [0, 0], u)[0] == 2
    # One-hot draft: the residual never returns the rejected token.
    target = np.ones((3, 3), dtype=np.float32)
    for u in np.linspace(0, 1, 30, endpoint=False):
        n, tok = sv.accept_block_from_uniforms(target, None, [1, 1], [0.99, 0.99, u])
        assert n == 0 and tok != 1


# ------------------------------------------------------------------------------------------
# Validation: accept's cases and messages.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", bad_accept_inputs(), ids=lambda c: c[0])
def test_rejects_bad_input_as_accept_does(case):
    _, target, draft, tokens, error, fragment = case
    with pytest.raises(error, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        sv.accept_block_from_uniforms(target, draft, tokens, np.full(K + 1, 0.5))


def test_every_row_is_validated_whatever_the_uniforms():
    t, d, k = good()
    for row, col in [(3, 0), (2, 5)]:
        bad = with_value(t, row, col, np.nan)
        for u in (np.zeros(K + 1), np.full(K + 1, 0.99)):
            with pytest.raises(ValueError, match=rf"target_probs\[{row}\] contains NaN"):
                sv.accept_block_from_uniforms(bad, d, k, u)
    with pytest.raises(ValueError, match=r"draft_probs\[2\] has zero mass"):
        sv.accept_block_from_uniforms(t, with_value(d, 2, slice(None), 0.0), k, np.full(K + 1, 0.99))


def test_uniforms_and_generators_are_checked():
    t, d, k = good()
    with pytest.raises(ValueError, match=r"uniforms must have shape \[4\]"):
        sv.accept_block_from_uniforms(t, d, k, np.full(K, 0.5))
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        sv.accept_block_from_uniforms(t, d, k, np.array([0.5, 1.0, 0.5, 0.5]))
    with pytest.raises(TypeError, match="uniforms must be the K"):
        sv.accept_block_from_uniforms(t, d, k, None)
    with pytest.raises(TypeError, match="generator must be"):
        sv.accept_block(t, d, k, generator=np.random.RandomState(0))


def test_generator_contract():
    torch = pytest.importorskip("torch")
    t, d, k = good()
    g1, g2 = np.random.default_rng(4), np.random.default_rng(4)
    for _ in range(50):
        assert sv.accept_block(t, d, k, g1) == sv.accept_block_from_uniforms(t, d, k, g2.random(K + 1))
    t1, t2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(50):
        u = torch.rand(K + 1, dtype=torch.float64, generator=t2).numpy()
        assert sv.accept_block(t, d, k, t1) == sv.accept_block_from_uniforms(t, d, k, u)
    assert torch.equal(t1.get_state(), t2.get_state())
    tt = torch.from_numpy(t)
    u = np.full(K + 1, 0.37)
    assert sv.accept_block_from_uniforms(tt, torch.from_numpy(d), torch.from_numpy(k), u) == \
        sv.accept_block_from_uniforms(t, d, k, u)
    assert sv.accept_block_from_uniforms(tt.double(), d.astype(np.float16), [1, 2, 3], u) == \
        sv.accept_block_from_uniforms(t, d.astype(np.float16).astype(np.float32), k, u)


BAD_INPUT_SCRIPT = textwrap.dedent(
    """
    import numpy as np, specverify as sv
    import test_ops_validation as cases
    raised = 0
    for case in cases.bad_accept_inputs():
        _, target, draft, tokens, error, _ = case
        for d in (draft, None):
            try:
                sv.accept_block_from_uniforms(target, d, tokens, np.full(4, 0.5))
            except (TypeError, ValueError, IndexError):
                raised += 1
    print("raised", raised)
    """
)


def test_bad_inputs_never_crash_the_process():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, here]))  # this tree's specverify
    result = subprocess.run([sys.executable, "-c", BAD_INPUT_SCRIPT], cwd=here, capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "raised" in result.stdout
