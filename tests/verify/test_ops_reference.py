"""The kernels agree with specverify.reference exactly, given the same uniforms."""

import math

import numpy as np
import pytest

import specverify as sv
from specverify import reference

from conftest import draw_from_rows, random_probability_rows, scaled

pytestmark = pytest.mark.emulated

ODD_VOCABS = [1, 2, 3, 17, 255, 256, 257, 1023]
LARGE_VOCABS = [4096, 32000, 128256]


def pick_vocab(rng):
    return int(rng.choice(LARGE_VOCABS)) if rng.random() < 0.08 else int(rng.choice(ODD_VOCABS))


def greedy_case(rng):
    v = pick_vocab(rng)
    k = int(rng.integers(0, 9))
    if rng.random() < 0.5:
        # Integer scores in a tiny range: many ties, which must break to the lowest index.
        scores = rng.integers(-3, 3, (k + 1, v)).astype(np.float32)
    else:
        scores = rng.standard_normal((k + 1, v)).astype(np.float32) * np.float32(10.0 ** rng.uniform(-3, 3))
    if rng.random() < 0.2:
        scores[rng.random(scores.shape) < 0.3] = -np.inf  # masked logits
        scores[:, rng.integers(0, v)] = 0.0
    if rng.random() < 0.1:
        scores[rng.random(scores.shape) < 0.2] = -0.0
    if rng.random() < 0.3:
        # Log-probabilities: every score negative (the maximum is the smallest magnitude).
        scores = np.where(scores == 0, -0.0, -np.abs(scores)).astype(np.float32)
    best = np.argmax(scores, axis=1)
    # Drafts agree with the argmax with high probability, so later rows get visited too.
    tokens = np.where(rng.random(k) < 0.8, best[:k], rng.integers(0, v, k)).astype(np.int64)
    return scores, tokens


def test_greedy_matches_reference(rng):
    for _ in range(scaled(3000, 200)):
        scores, tokens = greedy_case(rng)
        assert sv.verify_greedy(scores, tokens) == reference.verify_greedy(scores, tokens)


def test_greedy_ties_break_to_lowest_index():
    scores = np.array([[0.0, 3.0, 3.0, 1.0], [-0.0, 0.0, -1.0, 0.0]], dtype=np.float32)
    assert sv.verify_greedy(scores, [1]) == (1, 0)  # -0.0 and 0.0 are equal: index 0 wins
    assert sv.verify_greedy(scores, [2]) == (0, 1)
    assert sv.verify_greedy(scores[:1], []) == (0, 1)


def test_greedy_argmax_at_every_row_alignment():
    # The argmax kernel starts its blocks at 64-byte boundaries; rows can start anywhere. Place
    # the maximum (and a tie after it) around the block boundaries, for every start in a line.
    buffer = np.zeros(1200 + 16, dtype=np.float32)
    for offset in range(16):
        for v in (1, 5, 16, 17, 511, 1200):
            row = buffer[offset:offset + v]
            for first in sorted({0, 1, 15 - offset, 16 - offset, 527 - offset, 528 - offset, v - 1}):
                if not 0 <= first < v:
                    continue
                ramp = np.linspace(0.5, 1.0, v, dtype=np.float32)
                for negative in (False, True):  # log-probabilities: the maximum is the smallest magnitude
                    row[:] = -ramp[::-1] if negative else ramp
                    row[first] = -0.25 if negative else 4.0
                    row[v - 1 - (v - 1 - first) // 2] = row[first]  # a tie at or after it
                    scores = row[None, :]
                    assert sv.verify_greedy(scores, []) == (0, first) == (0, int(np.argmax(scores)))


def test_greedy_reads_no_row_after_the_first_miss():
    scores = np.zeros((3, 5), dtype=np.float32)
    scores[0, 2] = 1.0
    scores[1:] = np.nan  # never read: the draft misses at row 0
    assert sv.verify_greedy(scores, [4, 0]) == (0, 2)


def accept_case(rng, point_mass=False):
    v = pick_vocab(rng)
    k = int(rng.integers(0, 9))
    target = random_probability_rows(rng, k + 1, v)
    draft_kind = rng.choice(["independent", "same", "scaled_same", "mixture"])
    if draft_kind == "same":
        draft = target[:k].copy()
    elif draft_kind == "scaled_same":
        draft = (target[:k] * np.float32(2.0 ** rng.integers(-20, 20))).astype(np.float32)
    elif draft_kind == "mixture":
        noise = random_probability_rows(rng, k, v, kind="softmax")
        w = rng.random()
        norm = target[:k] / target[:k].sum(axis=1, keepdims=True)
        draft = (w * norm + (1 - w) * noise).astype(np.float32)
    else:
        draft = random_probability_rows(rng, k, v)
    if k and rng.random() < 0.2:
        # Draft tokens the target gives no mass (and, for the draft, none either).
        draft[:, rng.integers(0, v)] = 0.0
        target[:k, rng.integers(0, v)] = 0.0
        target[:k] = np.where(target[:k].sum(axis=1, keepdims=True) > 0, target[:k], 1.0)
        draft = np.where(draft.sum(axis=1, keepdims=True) > 0, draft, 1.0).astype(np.float32)
    tokens = draw_from_rows(rng, draft) if k else np.zeros(0, dtype=np.int64)
    if k and rng.random() < 0.1:
        tokens = rng.integers(0, v, k)  # tokens not drawn from q (q(t) may be 0): still defined
    uniforms = rng.random(k + 1)
    if rng.random() < 0.1:
        uniforms[rng.integers(0, k + 1)] = rng.choice([0.0, np.nextafter(1.0, 0.0)])
    return target, None if point_mass else draft, tokens, uniforms


def accepted_lengths_matching_reference(op, reference_op, rng, point_mass, cases):
    """Run ``cases`` random accept_case inputs through the op and its reference; every result must
    agree bit for bit.  Returns the histogram of accepted lengths ``[9]``."""
    outcomes = np.zeros(10, dtype=int)
    for _ in range(cases):
        target, draft, tokens, uniforms = accept_case(rng, point_mass)
        got = op(target, draft, tokens, uniforms)
        assert got == reference_op(target, draft, tokens, uniforms), (target.shape, uniforms)
        outcomes[got[0]] += 1
    return outcomes


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_accept_matches_reference_bit_for_bit(rng, point_mass):
    outcomes = accepted_lengths_matching_reference(sv.accept_from_uniforms, reference.accept, rng, point_mass,
                                                   scaled(3000, 150))
    # The cases exercise early rejections and full acceptance alike.
    assert outcomes[0] > 0 and outcomes[1:].sum() > 0


def test_accept_at_the_seed_sizes_matches_reference(rng):
    for v, k in [(32000, 4), (128256, 5)]:
        for _ in range(scaled(10, 2)):
            target = random_probability_rows(rng, k + 1, v, kind="softmax")
            draft = random_probability_rows(rng, k, v, kind="softmax")
            tokens = draw_from_rows(rng, draft)
            uniforms = rng.random(k + 1)
            want = reference.accept(target, draft, tokens, uniforms)
            assert sv.accept_from_uniforms(target, draft, tokens, uniforms) == want


def documented_block_sums(x):
    """The block sums as the contract's text describes them, one float32 scalar operation at a time."""
    sums = []
    for start in range(0, x.size, reference.BLOCK):
        lanes = [np.float32(0.0)] * reference.LANES
        for j in range(start, min(start + reference.BLOCK, x.size)):
            lanes[(j - start) % reference.LANES] = lanes[(j - start) % reference.LANES] + x[j]
        while len(lanes) > 1:  # halving tree: lane l + half folds into lane l
            half = len(lanes) // 2
            lanes = [lanes[l] + lanes[l + half] for l in range(half)]
        sums.append(float(lanes[0]))
    return sums


def test_summation_order_is_the_documented_one(rng):
    # reference.block_sums (vectorized cumsum) equals the plain float32 loop the contract describes.
    x = (rng.random(1000) * 10.0 ** rng.uniform(-20, 20, 1000)).astype(np.float32)
    want = documented_block_sums(x)
    assert list(reference.block_sums(x)) == want
    # ... and the test can tell orders apart: sequential float32 sums, or float64 lanes, differ.
    sequential = [float(np.cumsum(x[s:s + reference.BLOCK], dtype=np.float32)[-1])
                  for s in range(0, x.size, reference.BLOCK)]
    float64_blocks = [math.fsum(x[s:s + reference.BLOCK].astype(np.float64))
                      for s in range(0, x.size, reference.BLOCK)]
    assert sequential != want and float64_blocks != want
    from specverify.kernels import _kernels

    assert (_kernels.block_size(), _kernels.lane_count()) == (reference.BLOCK, reference.LANES)


def test_edge_cases_are_exact():
    # q(t) = 0 and p(t) > 0: the ratio is +inf, always accepted.
    target = np.array([[1, 1, 0], [1, 1, 1]], dtype=np.float32)
    draft = np.array([[0, 1, 1]], dtype=np.float32)
    assert sv.accept_from_uniforms(target, draft, [0], [np.nextafter(1.0, 0.0), 0.5])[0] == 1
    # p(t) = 0: never accepted, even with u = 0; the recovered token is never t.
    assert sv.accept_from_uniforms(target, draft, [2], [0.0, 0.0]) == (0, 0)
    # p == q at different scales: always accepted.
    draft = np.array([[0.2, 0.3, 0.5]], dtype=np.float32)
    target = np.vstack([draft * np.float32(8.0), [[1, 0, 0]]]).astype(np.float32)
    for u in [0.0, 0.5, np.nextafter(1.0, 0.0)]:
        assert sv.accept_from_uniforms(target, draft, [2], [u, 0.3]) == (1, 0)
    # Point-mass draft with p(t) = 1: always accepted.
    target = np.array([[0, 0, 1], [0, 1, 0]], dtype=np.float32)
    assert sv.accept_from_uniforms(target, None, [2], [np.nextafter(1.0, 0.0), 0.9]) == (1, 1)
    # Point-mass rejection never returns the rejected token.
    target = np.array([[1, 1, 1], [1, 1, 1]], dtype=np.float32)
    for u in np.linspace(0, 1, 50, endpoint=False):
        n, tok = sv.accept_from_uniforms(target, None, [1], [0.99, u])
        assert (n, tok != 1) == (0, True)


def test_kernel_masses_equal_the_reference_bit_for_bit(rng):
    # Entries spanning many orders of magnitude make every change of summation order visible.
    from specverify.kernels import _kernels

    for v in [1, 15, 16, 17, 255, 256, 257, 1000, 32000]:
        rows = (10.0 ** rng.uniform(-30, 30, (6, v))).astype(np.float32)
        got = _kernels.row_masses(rows)
        assert got == [reference.row_mass(r) for r in rows]
        naive = [float(np.sum(r.astype(np.float64))) for r in rows]
        if v >= 1000:
            assert got != naive  # the check can tell orders apart
