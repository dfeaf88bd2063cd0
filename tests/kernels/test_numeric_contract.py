"""The numeric contract (specverify/kernels/_primitives.pxd): float32 lanes inside a block.

Row masses stay within the documented error bound of the exact (``math.fsum``) mass on adversarial
rows, blocks that overflow float32 are rescued, extreme mass ratios keep the residual weights right,
the exact edges stay exact, and a draw never hands a block's rounding error to its last element.
Kernels and reference agree bit for bit on all of it.
"""

import math

import numpy as np
import pytest

import specverify as sv
from specverify import reference
from specverify.reference import tree as reference_tree
from specverify.kernels import _kernels

pytestmark = pytest.mark.emulated

U32 = 2.0 ** -24  # float32 unit roundoff
U64 = 2.0 ** -53
ALMOST_ONE = float(np.nextafter(1.0, 0.0))


def gamma(n, u):
    return n * u / (1 - n * u)


def mass_bound(v):
    """Relative error bound of a row mass (the contract's derivation): each element meets at most
    15 float32 lane additions and 4 tree additions; the float64 combination of B blocks adds B - 1."""
    n_blocks = -(-v // reference.BLOCK)
    steps = reference.BLOCK // reference.LANES
    depth = (steps - 1) + int(math.log2(reference.LANES))
    return (1 + gamma(depth, U32)) * (1 + gamma(max(n_blocks - 1, 0), U64)) - 1


def adversarial_rows(rng):
    """(name, [V] float32 row) pairs built to stress float32 accumulation."""
    v = 128256
    rows = [("60 orders of magnitude", (10.0 ** rng.uniform(-30, 30, v)).astype(np.float32))]
    tiny_after_huge = np.full(v, 1e-30, dtype=np.float32)
    tiny_after_huge[0] = 1e30
    rows.append(("one huge value, then 128255 tiny ones", tiny_after_huge))
    # Every lane starts at 1.0 and then gets 3 values just under half an ulp of it: float32 drops
    # every one of them (the worst case of lane accumulation, ~3 u of the mass).
    dropped = np.full(v, np.float32(2.0 ** -24 * (1 - 2.0 ** -10)), dtype=np.float32)
    dropped.reshape(-1, reference.BLOCK)[:, :reference.LANES] = 1.0
    rows.append(("lane heads 1.0, tails under half an ulp", dropped[:v]))
    # Tails of 0.75 ulp: every addition rounds up (by 0.25 ulp).
    rounded_up = np.full(v, np.float32(2.0 ** -23 * 0.75), dtype=np.float32)
    rounded_up.reshape(-1, reference.BLOCK)[:, :reference.LANES] = 1.0
    rows.append(("lane heads 1.0, tails rounding up", rounded_up[:v]))
    denormal = (rng.integers(0, 2 ** 15, v) * 2.0 ** -149).astype(np.float32)  # sums stay exact
    rows.append(("subnormals only", denormal))
    mixed = denormal.copy()
    mixed[:: 97] = (10.0 ** rng.uniform(-20, 30, mixed[:: 97].size)).astype(np.float32)
    rows.append(("subnormals among values up to 1e30", mixed))
    rows.append(("4096 values spanning 60 orders", (10.0 ** rng.uniform(-30, 30, 4096)).astype(np.float32)))
    return rows


def test_row_mass_is_within_the_documented_bound_of_fsum(rng):
    worst = {}
    for name, row in adversarial_rows(rng):
        got = _kernels.row_masses(row[None, :])[0]
        assert got == reference.row_mass(row), name
        exact = math.fsum(row.astype(np.float64))
        error = abs(got - exact) / exact
        assert error <= mass_bound(row.size), (name, error / U32)
        worst[name] = error
    assert worst["subnormals only"] == 0.0  # sums of subnormals are exact in float32
    # The rows come within a factor 3 of the bound (the lanes' share of it):
    assert worst["lane heads 1.0, tails under half an ulp"] > 2.9 * U32
    assert mass_bound(128256) < 10 * U32


def test_overflowing_blocks_are_rescued(rng):
    # Blocks of values near float32's maximum: their float32 sums overflow and are summed again
    # scaled by 2^-32; the mass stays finite and within the bound.
    for v in [256, 300, 4 * 256, 4 * 256 + 5, 4096]:
        row = np.full(v, 3.0e38, dtype=np.float32)
        row[rng.integers(0, v, v // 3)] = 1e-40  # subnormals in overflowing blocks
        row[:: 7] = 1.0
        got = _kernels.row_masses(row[None, :])[0]
        assert math.isfinite(got) and got == reference.row_mass(row)
        exact = math.fsum(row.astype(np.float64))
        assert abs(got - exact) <= mass_bound(v) * exact
    # The ops take such rows like any other: a huge target against a normal draft (mass ratio
    # ~1e41: the residual's factors leave float32's range and are split) and the reverse.
    v, k = 1000, 2
    huge = np.full((k + 1, v), 3.0e38, dtype=np.float32)
    huge[:, rng.integers(0, v, 200)] = 0.0
    normal = (rng.random((k, v)) ** 4).astype(np.float32)
    for target, draft in [(huge, normal), (np.vstack([normal, normal[:1]]), huge[:k])]:
        for trial in range(20):
            tokens = rng.integers(0, v, k)
            uniforms = rng.random(k + 1)
            uniforms[trial % k] = ALMOST_ONE  # reject there: the residual is drawn
            want = reference.accept(target, draft, tokens, uniforms)
            assert sv.accept_from_uniforms(target, draft, tokens, uniforms) == want


def test_ratio_factors_are_normal_and_multiply_to_the_ratio():
    for log2_ratio in np.linspace(-320, 320, 2001):
        ratio = 2.0 ** log2_ratio * 1.37
        a, b, c = reference.ratio_factors(ratio)
        for f in (a, b, c):
            assert np.isfinite(f) and f >= np.finfo(np.float32).tiny
        clamped = min(max(ratio, 2.0 ** -300), 2.0 ** 300)
        assert abs(float(a) * float(b) * float(c) / clamped - 1) <= U32
        if 2.0 ** -101 <= ratio < 2.0 ** 100:
            assert (a, b, c) == (1, 1, np.float32(ratio))


@pytest.mark.parametrize("p_scale, q_scale", [(0, -140), (0, -90), (0, 0), (0, 60), (0, 120), (120, -140),
                                              (-140, 120), (-60, 60)])
def test_residual_weights_at_extreme_mass_ratios(rng, p_scale, q_scale):
    # Rows scaled far apart (mass ratios up to ~2^260 and down to ~2^-260): q * P/Q must still be
    # evaluated without overflow to Inf (where it is finite) and without underflow to 0 (where it
    # matters).
    v = 1000
    p = (rng.random(v) ** 3 * 2.0 ** p_scale).astype(np.float32)
    q = (rng.random(v) ** 3 * 2.0 ** q_scale).astype(np.float32)
    q[:: 11] = 0.0
    p[:: 13] = 0.0
    p_mass, q_mass = reference.row_mass(p), reference.row_mass(q)
    got = reference.residual_weights(p, q, reference.mass_ratio(p_mass, q_mass)).astype(np.float64)
    exact = np.maximum(0.0, p.astype(np.float64) - q.astype(np.float64) * (p_mass / q_mass))
    scale = p.astype(np.float64) + q.astype(np.float64) * (p_mass / q_mass)
    assert np.all(np.abs(got - exact) <= 5 * U32 * scale + 2.0 ** -148)
    assert np.all(got[q == 0] == p[q == 0]) and np.all(got[p == 0] == 0)
    # The kernel draws from the same weights: reject at position 0, then draw.
    target, draft = np.vstack([p, p]), q[None, :]
    token = int(np.argmax(q.astype(np.float64) * (p_mass / q_mass) - p))  # q > p there
    for w in np.linspace(0, 1, 40, endpoint=False):
        want = reference.accept(target, draft, [token], [ALMOST_ONE, w])
        assert want[0] == 0 and sv.accept_from_uniforms(target, draft, [token], [ALMOST_ONE, w]) == want


@pytest.mark.parametrize("k", [-120, -101, -60, 0, 60, 100, 110])
def test_power_of_two_scaled_rows_always_accept(rng, k):
    # p = 2^k q exactly, also beyond the mass ratios that enter as one float32 factor: P = 2^k Q,
    # every residual weight is exactly 0, and every draft token is accepted.
    for v in [3, 300, 4096]:
        q = (rng.random(v) + 0.5).astype(np.float32)  # p stays normal at k = -120
        q[rng.integers(0, v)] = 0.0
        p = (q.astype(np.float64) * 2.0 ** k).astype(np.float32)
        assert np.array_equal(p.astype(np.float64), q.astype(np.float64) * 2.0 ** k)
        p_mass, q_mass = reference.row_mass(p), reference.row_mass(q)
        assert p_mass == q_mass * 2.0 ** k
        assert not reference.residual_weights(p, q, reference.mass_ratio(p_mass, q_mass)).any()
        target = np.vstack([p, q])
        for t in rng.choice(np.flatnonzero(q > 0), 5):
            assert sv.accept_from_uniforms(target, q[None, :], [t], [ALMOST_ONE, 0.5])[0] == 1


def scan_without_rescaling(weights, u):
    """A broken draw: the block picked as in the contract, but the scan compares its float64
    running sum with the float32-lane remainder directly (falls back to the last positive weight)."""
    sums = reference.block_sums(weights)
    target = u * reference.ordered_total(sums)
    cumulative = 0.0
    for b, s in enumerate(sums):
        if cumulative + s > target:
            remainder, running, last = target - cumulative, 0.0, None
            for j in range(b * reference.BLOCK, min((b + 1) * reference.BLOCK, weights.size)):
                if weights[j] > 0:
                    running += float(weights[j])
                    last = j
                    if running > remainder:
                        return j
            return last
        cumulative += s


def test_a_draw_never_hands_the_blocks_rounding_to_its_last_element():
    # One block: lane 0 holds 1.0 and 3 additions of 0.75 ulp that each round up (the block's
    # float32 sum exceeds the exact one by 0.75 ulp, ~9e-8 of it), and the last element has weight
    # 1e-30.  Drawn with probability ~1e-30, it must never come out; a scan that is not rescaled
    # to the block's float32 sum returns it for every u in the top ~9e-8.
    row = np.zeros(reference.BLOCK, dtype=np.float32)
    row[:: reference.LANES] = np.float32(2.0 ** -23 * 0.75)
    row[0] = 1.0
    row[-1] = 1e-30
    assert reference.block_sums(row)[0] > math.fsum(row.astype(np.float64)) * (1 + 5e-8)
    top = [1 - 2.0 ** -e for e in range(20, 54)] + [ALMOST_ONE]
    broken = [u for u in top if scan_without_rescaling(row, u) == row.size - 1]
    assert len(broken) >= 25  # power check: the test tells the broken scan apart
    for u in top:
        assert reference.sample_index(row, u) != row.size - 1
        assert sv.accept_from_uniforms(row[None, :], None, [], [u]) == (0, reference.sample_index(row, u))


def test_mass_quotients_within_2_pow_minus_20_of_one_are_one():
    for offset in (0.0, 2.0 ** -40, 2.0 ** -21, 2.0 ** -20):
        for ratio in (1.0 + offset, 1.0 - offset):
            assert reference.mass_ratio(3.0 * ratio, 3.0) == 1.0
    for ratio in (1.0 + 2.0 ** -19, 1.0 - 2.0 ** -19, 1.0 + 2.0 ** -20 + 2.0 ** -52):
        assert reference.mass_ratio(ratio, 1.0) == ratio


def _rows_with_mass_ratio(rng, v, n, ratio, scale=1.0):
    """(target [n, V], draft [n, V]) float32 rows: draft normalized to mass ``scale``, target a mix of
    the draft and noise with mass about ``ratio * scale``; zeros in both."""
    q = rng.random((n, v)) ** 4
    p = 0.6 * q + 0.4 * rng.random((n, v)) ** 4
    q[:, ::7] = 0.0
    p[:, ::11] = 0.0
    q *= scale / q.sum(axis=1, keepdims=True)
    p *= ratio * scale / p.sum(axis=1, keepdims=True)
    return p.astype(np.float32), q.astype(np.float32)


# Mass ratios P/Q the residual may see: normalized rows (snapped to 1), just inside and just
# outside the snap, and far from 1 (the residual then needs its own pass).
RATIOS = (1.0, 1.0 + 0.9 * 2.0 ** -20, 1.0 - 1.2 * 2.0 ** -20, 1.0 + 2.0 ** -18, 0.5, 2.0)


@pytest.mark.parametrize("v", [100, 256, 1000, 4096 + 17])
@pytest.mark.parametrize("ratio", RATIOS)
def test_residual_summed_with_the_masses_has_the_reference_bits(rng, v, ratio):
    # A position whose test looks lost (u q_t >= p_t) sums its residual at ratio 1 in the masses'
    # read, and keeps it when P/Q snaps to 1; every path must give the reference's bits: the
    # prediction right or wrong, the ratio snapped or not, for accept, accept_block and the
    # sampled tree rules.
    k = 4
    for trial in range(24):
        target, draft = _rows_with_mass_ratio(rng, v, k + 1, ratio, scale=10.0 ** rng.uniform(-3, 3))
        tokens = np.array([rng.choice(np.flatnonzero(draft[i])) for i in range(k)], dtype=np.int64)
        if trial % 3 == 0:  # the first position's ratio p_t / q_t just below 1: predicted wrongly
            target[0, tokens[0]] = np.nextafter(draft[0, tokens[0]], np.float32(0))
        uniforms = rng.random(k + 1)
        uniforms[trial % k] = ALMOST_ONE if trial % 2 else uniforms[trial % k]
        want = reference.accept(target, draft[:k], tokens, uniforms)
        assert sv.accept_from_uniforms(target, draft[:k], tokens, uniforms) == want
        want = reference.accept_block(target, draft[:k], tokens, uniforms)
        assert sv.accept_block_from_uniforms(target, draft[:k], tokens, uniforms) == want
        parents = np.array([-1, -1, 0, 0], dtype=np.int64)  # two children at the root and at node 0
        tree_tokens = np.array([tokens[0], tokens[1] if tokens[1] != tokens[0] else (tokens[0] + 1) % v,
                                tokens[2], (tokens[2] + 3) % v], dtype=np.int64)
        for replacement in (False, True):
            want = reference_tree.accept_tree(target, draft, tree_tokens, parents, uniforms,
                                              replacement=replacement)
            path, next_token = sv.accept_tree_from_uniforms(target, draft, tree_tokens, parents, uniforms,
                                                            replacement=replacement)
            assert (list(np.asarray(path)), int(next_token)) == (list(np.asarray(want[0])), int(want[1]))


def test_residual_summed_with_the_masses_rescues_overflowing_blocks(rng):
    # Blocks whose float32 sums overflow, in the target, the draft and the residual.
    v = 1000
    target, draft = _rows_with_mass_ratio(rng, v, 3, 1.0)
    draft[:, :256] = 3e36
    target[:, 256:512] = 3e36
    tokens = np.array([0, 1], dtype=np.int64)  # q_t > p_t: the residual is read with the masses
    uniforms = np.array([ALMOST_ONE, ALMOST_ONE, 0.3])
    assert sv.accept_from_uniforms(target, draft[:2], tokens, uniforms) == reference.accept(
        target, draft[:2], tokens, uniforms)
    assert sv.accept_block_from_uniforms(target, draft[:2], tokens, uniforms) == reference.accept_block(
        target, draft[:2], tokens, uniforms)


@pytest.mark.parametrize("bad_row, bad_value, name", [("target", np.nan, "target_probs"),
                                                      ("target", -1.0, "target_probs"),
                                                      ("draft", np.inf, "draft_probs"),
                                                      ("draft", -1e-30, "draft_probs")])
def test_residual_summed_with_the_masses_still_validates_both_rows(rng, bad_row, bad_value, name):
    target, draft = _rows_with_mass_ratio(rng, 600, 2, 1.0)
    tokens = np.array([int(np.argmax(draft[0] - target[0]))], dtype=np.int64)
    uniforms = np.array([ALMOST_ONE, 0.5])
    (target if bad_row == "target" else draft)[0, 517] = bad_value
    for op in (sv.accept_from_uniforms, sv.accept_block_from_uniforms):
        with pytest.raises(ValueError, match=name):
            op(target, draft[:1], tokens, uniforms)
    target[0, 517] = draft[0, 517] = -0.0  # allowed
    assert sv.accept_from_uniforms(target, draft[:1], tokens, uniforms) == reference.accept(
        target, draft[:1], tokens, uniforms)
