"""Statistical tests of accept: its outputs follow the analytic law and the target's distribution.

Each test runs R rounds with fixed seeds (deterministic), counts, and applies chi-square
goodness-of-fit tests on counts (small-expectation bins pooled) at ALPHA = 1e-6, Bonferroni
corrected over the sub-tests of a case:

- the accepted-length histogram against the law P(N = n) = (prod_{j<n} a_j)(1 - a_n);
- for every position j, the emitted token at j (accepted draft, recovered or bonus) among the
  rounds that reach j, against the normalized target row j;
- the mean accepted length within 3 standard errors of the law's mean.

Power: the very same test must reject deliberately broken samplers (residual replaced by p,
the acceptance uniform reused for the residual draw, normalization ignored, bonus from the wrong
row, point-mass residual keeping the rejected token).  A test that cannot fail is a defect.
"""

import numpy as np
import pytest

import specverify as sv
from specverify import law, stats

from conftest import EMULATED, softmax_rows

ALPHA = 1e-6
ROUNDS = 4_000 if EMULATED else 30_000


# ------------------------------------------------------------------------------------------
# The law test, applied to any sampler(target, draft, tokens, uniforms) -> (n, token).
# ------------------------------------------------------------------------------------------

def simulate(sampler, target, draft, rounds, seed, point_mass_tokens=None):
    """Run ``rounds`` verification rounds; draft tokens drawn from the normalized draft rows.

    Returns (accepted [R], emitted [R, K+1] with -1 past the round's end).
    """
    rng = np.random.default_rng(seed)
    k = target.shape[0] - 1
    accepted = np.empty(rounds, dtype=np.int64)
    emitted = np.full((rounds, k + 1), -1, dtype=np.int64)
    if draft is not None:
        cdf = np.cumsum(draft.astype(np.float64), axis=1)
        cdf /= cdf[:, -1:]
    for r in range(rounds):
        if draft is not None:
            tokens = np.array([np.searchsorted(cdf[i], rng.random(), side="right") for i in range(k)],
                              dtype=np.int64)
        else:
            tokens = point_mass_tokens
        n, token = sampler(target, draft, tokens, rng.random(k + 1))
        accepted[r] = n
        emitted[r, :n] = tokens[:n]
        emitted[r, n] = token
    return accepted, emitted


def law_pvalues(target, draft, accepted, emitted, point_mass_tokens=None):
    """Every sub-test's p-value for a simulated run: {name: p}."""
    k = target.shape[0] - 1
    if draft is None:
        p_hat = target.astype(np.float64) / target.astype(np.float64).sum(axis=1, keepdims=True)
        rates = p_hat[np.arange(k), point_mass_tokens] if k else np.zeros(0)
    else:
        rates = law.acceptance_rates(target, draft)
    return pmf_pvalues(law.accepted_length_pmf(rates), target, accepted, emitted)


def pmf_pvalues(pmf, target, accepted, emitted):
    """Sub-test p-values against an accepted-length law ``pmf`` ``[K+1]`` and the target rows."""
    k = pmf.size - 1
    p_hat = target.astype(np.float64) / target.astype(np.float64).sum(axis=1, keepdims=True)
    pvalues = {"length": stats.chisquare_counts(np.bincount(accepted, minlength=k + 1), pmf).pvalue}
    for j in range(k + 1):
        reached = accepted >= j
        if reached.sum() >= 50:
            counts = np.bincount(emitted[reached, j], minlength=target.shape[1])
            pvalues[f"token@{j}"] = stats.chisquare_counts(counts, p_hat[j]).pvalue
    n = np.arange(k + 1)
    mean = float(n @ pmf)
    z = stats.mean_z_score(accepted.mean(), mean, float((n - mean) ** 2 @ pmf), accepted.size)
    # Report the 3-standard-error rule on the same scale as the chi-square p-values.
    pvalues["mean"] = 1.0 if abs(z) <= 3.0 else 0.0
    return pvalues


def passes(pvalues):
    """Every chi-square test above ALPHA / (their number) (Bonferroni) and the mean within 3 s.e."""
    chi_square = {name: p for name, p in pvalues.items() if name != "mean"}
    threshold = ALPHA / len(chi_square)
    return all(p > threshold for p in chi_square.values()) and pvalues["mean"] == 1.0


def law_test_passes(sampler, target, draft, rounds=ROUNDS, seed=0, point_mass_tokens=None):
    accepted, emitted = simulate(sampler, target, draft, rounds, seed, point_mass_tokens)
    pvalues = law_pvalues(target, draft, accepted, emitted, point_mass_tokens)
    return passes(pvalues), pvalues


# ------------------------------------------------------------------------------------------
# Adversarial cases.
# ------------------------------------------------------------------------------------------

def case_mismatch():
    rng = np.random.default_rng(1)
    target = softmax_rows(1.5 * rng.standard_normal((4, 6)))
    draft = softmax_rows(1.5 * rng.standard_normal((3, 6)))
    return target, draft


def case_zero_mass_disagreements():
    # The draft has zero mass where the target has mass, and the reverse.
    target = np.array([[0.5, 0.3, 0.2, 0.0, 0.0],
                       [0.0, 0.1, 0.4, 0.5, 0.0],
                       [0.2, 0.2, 0.2, 0.2, 0.2]], dtype=np.float32)
    draft = np.array([[0.0, 0.3, 0.3, 0.4, 0.0],
                      [0.6, 0.1, 0.0, 0.2, 0.1]], dtype=np.float32)
    return target, draft


def case_same_law_different_scales():
    rng = np.random.default_rng(2)
    draft = softmax_rows(rng.standard_normal((3, 7)))
    target = np.vstack([draft * np.float32(3.0), softmax_rows(rng.standard_normal((1, 7))) * 1e-3])
    return target.astype(np.float32), draft


def case_nearly_disjoint():
    target = np.array([[0.98, 0.01, 0.01, 0.0], [0.0, 0.0, 0.02, 0.98], [0.25] * 4], dtype=np.float32)
    draft = np.array([[0.0, 0.01, 0.01, 0.98], [0.98, 0.01, 0.01, 0.0]], dtype=np.float32)
    return target, draft


def case_unnormalized_wide_range():
    rng = np.random.default_rng(3)
    target = softmax_rows(rng.standard_normal((4, 6))) * (10.0 ** np.array([[-20], [15], [-3], [30]]))
    draft = softmax_rows(rng.standard_normal((3, 6))) * (10.0 ** np.array([[25], [-25], [0]]))
    target[0, 0] *= 1e-6  # entries spanning orders of magnitude inside a row too
    return target.astype(np.float32), draft.astype(np.float32)


CASES = {
    "mismatch": case_mismatch,
    "zero_mass_disagreements": case_zero_mass_disagreements,
    "same_law_different_scales": case_same_law_different_scales,
    "nearly_disjoint": case_nearly_disjoint,
    "unnormalized_wide_range": case_unnormalized_wide_range,
}


@pytest.mark.emulated
@pytest.mark.parametrize("name", list(CASES))
def test_accept_follows_the_law(name):
    target, draft = CASES[name]()
    ok, pvalues = law_test_passes(sv.accept_from_uniforms, target, draft, seed=11)
    assert ok, pvalues


@pytest.mark.emulated
def test_point_mass_draft_follows_the_law():
    target, _ = case_mismatch()
    tokens = np.array([0, 3, 5])
    ok, pvalues = law_test_passes(sv.accept_from_uniforms, target, None, seed=12, point_mass_tokens=tokens)
    assert ok, pvalues


def test_accept_with_a_generator_follows_the_law():
    # The public entry with a numpy generator, at a realistic vocabulary size.
    rng = np.random.default_rng(5)
    target = softmax_rows(2.0 * rng.standard_normal((5, 300)))
    draft = softmax_rows(np.log(target[:4] + 1e-9) + rng.standard_normal((4, 300)))
    gen = np.random.default_rng(6)
    ok, pvalues = law_test_passes(lambda t, d, k, u: sv.accept(t, d, k, gen), target, draft, seed=13,
                                  rounds=20_000)
    assert ok, pvalues


# ------------------------------------------------------------------------------------------
# Power: deliberately broken samplers, each rejected by the same test.
# ------------------------------------------------------------------------------------------

def inverse_cdf(weights, u):
    weights = np.asarray(weights, dtype=np.float64)
    c = np.cumsum(weights)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), weights.size - 1))


def broken_sampler(*, residual="residual", uniform_for_draw="own", normalize=True, bonus_row=0,
                   keep_rejected=False):
    """A readable rejection sampler with one deliberate defect switched on."""

    def sampler(target, draft, tokens, u):
        k = tokens.size
        p_rows = target.astype(np.float64)
        q_rows = None if draft is None else draft.astype(np.float64)
        if normalize:
            p_rows = p_rows / p_rows.sum(axis=1, keepdims=True)
            if q_rows is not None:
                q_rows = q_rows / q_rows.sum(axis=1, keepdims=True)
        for i in range(k):
            p, t = p_rows[i], tokens[i]
            q = np.eye(p.size)[t] if q_rows is None else q_rows[i]
            if u[i] * q[t] < p[t]:
                continue
            weights = np.maximum(p - q, 0.0) if residual == "residual" else p
            if keep_rejected:
                weights = p
            if weights.sum() <= 0:
                weights = p
            draw_u = u[i] if uniform_for_draw == "reused" else u[k]
            return i, inverse_cdf(weights, draw_u)
        return k, inverse_cdf(p_rows[k - bonus_row], u[k])

    return sampler


def test_the_readable_sampler_itself_passes():
    # Sanity for the power checks below: with no defect switched on, the same sampler passes.
    target, draft = case_mismatch()
    assert law_test_passes(broken_sampler(), target, draft, seed=21, rounds=ROUNDS // 2)[0]


@pytest.mark.parametrize(
    "defect, case",
    [
        ({"residual": "target"}, "mismatch"),
        ({"uniform_for_draw": "reused"}, "mismatch"),
        ({"normalize": False}, "unnormalized_wide_range"),
        ({"bonus_row": 1}, "same_law_different_scales"),
    ],
    ids=["residual_replaced_by_p", "uniform_reused", "normalization_ignored", "bonus_from_wrong_row"],
)
def test_the_law_test_rejects_broken_samplers(defect, case):
    target, draft = CASES[case]()
    ok, pvalues = law_test_passes(broken_sampler(**defect), target, draft, seed=22, rounds=ROUNDS // 2)
    assert not ok, (defect, pvalues)


def test_the_law_test_rejects_a_point_mass_sampler_that_keeps_the_rejected_token():
    target, _ = case_mismatch()
    tokens = np.array([0, 3, 5])
    ok, pvalues = law_test_passes(broken_sampler(keep_rejected=True), target, None, seed=23,
                                  rounds=ROUNDS // 2, point_mass_tokens=tokens)
    assert not ok, pvalues


# ------------------------------------------------------------------------------------------
# Determinism and the uniform contract.
# ------------------------------------------------------------------------------------------

@pytest.mark.emulated
def test_same_seed_same_results_different_seed_different_results():
    target, draft = case_mismatch()
    tokens = np.array([1, 2, 3])

    def run(seed):
        gen = np.random.default_rng(seed)
        return [sv.accept(target, draft, tokens, gen) for _ in range(200)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_torch_generator_contract():
    torch = pytest.importorskip("torch")
    target, draft = case_mismatch()
    tokens = np.array([1, 2, 3])
    g1 = torch.Generator().manual_seed(3)
    g2 = torch.Generator().manual_seed(3)
    for _ in range(100):
        got = sv.accept(target, draft, tokens, g1)
        # accept draws exactly K + 1 float64 uniforms in one call, then uses them as documented.
        u = torch.rand(4, dtype=torch.float64, generator=g2).numpy()
        assert got == sv.accept_from_uniforms(target, draft, tokens, u)
    assert torch.equal(g1.get_state(), g2.get_state())
    # None means torch's default generator.
    torch.manual_seed(9)
    a = [sv.accept(target, draft, tokens) for _ in range(20)]
    torch.manual_seed(9)
    assert a == [sv.accept(target, draft, tokens) for _ in range(20)]


@pytest.mark.emulated
def test_numpy_generator_contract():
    target, draft = case_mismatch()
    tokens = np.array([4, 0, 2])
    g1, g2 = np.random.default_rng(4), np.random.default_rng(4)
    for _ in range(100):
        assert sv.accept(target, draft, tokens, g1) == sv.accept_from_uniforms(target, draft, tokens, g2.random(4))
    assert g1.random() == g2.random()
