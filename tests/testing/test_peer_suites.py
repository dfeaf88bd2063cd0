"""The scenarios and assertions of peer projects' verifier test suites, ported (not copied) and run
against specverify's ops through the adapters of ``specverify.testing.adapters`` and against the
peer re-implementations of ``specverify.testing.peers``.

- vLLM (``tests/v1/sample/test_rejection_sampler.py``): greedy perfect match, early mismatch,
  several sequences, one token, empty drafts, several mismatches (output ``[R, max_spec_len + 1]``,
  -1 placeholders); seeded determinism; top-k / top-p masking (a draft outside the warped
  target's support is always rejected, the recovered token stays inside it); the output law.
- FlashInfer (``tests/test_sampling.py``, ``chain_speculative_sampling``): output validity (the
  accepted prefix is the drafts, -1 only after the emitted tokens), emitted count = tau, accepted
  count >= emitted count, one-hot targets give the target's argmax chain, -1 padded drafts end a
  request's draft.
- transformers (``tests/generation/test_utils.py``, ``_speculative_sampling``): drafts of length
  1, 4 and 8 fully accepted when the target agrees, ``n_matches`` stops at a zero-probability
  draft, the validated tokens are the accepted drafts plus one; the output law (sampled mode).
- SGLang (tree verification tests): a tree with a one-hot target follows the target's path; the
  CDF boundary: a coin equal to the acceptance ratio rejects, a uniform on a CDF point draws the
  next token, coin 0 never accepts a zero-probability draft (SGLang #35771).

Conventions that differ (listed in docs/guide/testing.md): vLLM samples the bonus outside its
rejection sampler; FlashInfer's accepted count counts independent passes, not tau; FlashInfer
does not document which uniform slot draws after a rejection; transformers' function takes
logits, draws with torch's global generator and returns ``n_matches`` as a tensor.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specverify as sv  # noqa: E402
from specverify import testing  # noqa: E402
from specverify.testing import adapters, broken, peers  # noqa: E402

V = 12


def onehot(ids, vocab=V):
    return np.eye(vocab, dtype=np.float32)[list(ids)]


# ---------------------------------------------------------------------------------------------
# vLLM: greedy scenarios (the target rows are one-hot at the token the target's argmax picks).
# ---------------------------------------------------------------------------------------------

VLLM_GREEDY = {  # name: (drafts per request, target argmax per request (K_r rows + bonus), expected output)
    "perfect_match": ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    "early_mismatch": ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),
    "multiple_sequences": ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),
    "single_token": ([[1]], [[2, 3]], [[2, -1]]),
    "empty_drafts": ([[], [1]], [[5], [1, 6]], [[5, -1], [1, 6]]),
    "multiple_mismatches": ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]]),
}


def _vllm_batch(drafts, argmaxes):
    tokens = np.array([t for d in drafts for t in d], dtype=np.int64)
    cu = np.cumsum([len(d) for d in drafts]).astype(np.int64)
    rows = np.concatenate([onehot(a) for a in argmaxes])  # each request: K_r rows, then its bonus row
    verification = np.concatenate([onehot(a[:-1]) if len(a) > 1 else np.zeros((0, V), np.float32) for a in argmaxes])
    bonus = np.array([a[-1] for a in argmaxes], dtype=np.int64)
    return tokens, cu, rows, verification, bonus


@pytest.mark.parametrize("name", list(VLLM_GREEDY))
def test_vllm_greedy_scenarios_on_specverify(name):
    drafts, argmaxes, expected = VLLM_GREEDY[name]
    tokens, cu, rows, _, _ = _vllm_batch(drafts, argmaxes)
    out = adapters.specverify_as_vllm("greedy")(tokens, cu, None, rows, None, max(len(d) for d in drafts))
    assert out.tolist() == expected


@pytest.mark.parametrize("name", list(VLLM_GREEDY))
def test_vllm_greedy_scenarios_on_the_vllm_style_sampler(name):
    """One-hot targets make the sampled path greedy: p(x) in {0, 1} against a float64 uniform."""
    drafts, argmaxes, expected = VLLM_GREEDY[name]
    tokens, cu, _, verification, bonus = _vllm_batch(drafts, argmaxes)
    out = peers.vllm_v1_style_rejection_sample(tokens, cu, None, verification, bonus,
                                               torch.Generator().manual_seed(0))
    assert out.tolist() == expected


def test_vllm_seeded_runs_are_deterministic_and_seeds_matter():
    rng = np.random.default_rng(0)
    k, r = 3, 4
    target = rng.dirichlet(np.ones(V), size=r * (k + 1)).astype(np.float32)
    draft = rng.dirichlet(np.ones(V), size=r * k).astype(np.float32)
    tokens = rng.integers(V, size=r * k)
    cu = np.arange(0, r * k + 1, k)

    def run(seed):
        return sv.verify_batch(target, draft, tokens, cu, generator=torch.Generator().manual_seed(seed))[0]

    assert np.array_equal(run(7), run(7))
    assert any(not np.array_equal(run(7), run(s)) for s in range(8, 12))
    ver = target.reshape(r, k + 1, V)[:, :k].reshape(-1, V)
    bonus = np.zeros(r, dtype=np.int64)

    def run_peer(seed):
        return peers.vllm_v1_style_rejection_sample(tokens, cu[1:], draft, ver, bonus, torch.Generator().manual_seed(seed))

    assert torch.equal(run_peer(3), run_peer(3))


@pytest.mark.parametrize("warp", [{"top_k": 3}, {"top_p": 0.5}, {"temperature": 0.5, "top_k": 2}])
def test_vllm_top_k_top_p_masking_rejects_drafts_outside_the_warped_support(warp):
    rng = np.random.default_rng(1)
    target_logits = rng.standard_normal((2, V)).astype(np.float32) * 2
    draft_logits = rng.standard_normal((1, V)).astype(np.float32)
    support = np.flatnonzero(np.asarray(sv.warp(target_logits[:1], **warp))[0] > 0)
    outside = next(t for t in range(V) if t not in support)
    for u0 in (0.0, 1e-9, 0.5, 0.999):
        for u1 in (0.0, 0.3, 0.999):
            n, token = sv.accept_logits_from_uniforms(target_logits, draft_logits, np.array([outside]),
                                                      np.array([u0, u1]), **warp)
            assert n == 0 and token in support


def test_vllm_style_sampler_and_specverify_give_the_target_law():
    """vLLM's distribution test, through the harness: sampled mode on the vLLM-style sampler,
    exact mode on specverify behind vLLM's signature (alpha = 1e-6, fixed seed)."""
    report = testing.check_sampled(peers.vllm_v1_style_rejection_sample, kind="chain", layout="vllm", vocab=4, k=2,
                                   rounds=1500, seed=2)
    testing.assert_lossless(report)
    assert report.detectable_tv < 0.25


# ---------------------------------------------------------------------------------------------
# FlashInfer: chain_speculative_sampling's validity checks.
# ---------------------------------------------------------------------------------------------

def _flashinfer_case(rng, b, n, vocab, onehot_target):
    draft64 = rng.dirichlet(np.ones(vocab), size=(b, n))
    ids = np.array([[rng.choice(vocab, p=draft64[i, j]) for j in range(n)] for i in range(b)], dtype=np.int64)
    if onehot_target:  # most drafts agree with the one-hot target, so long accepted runs occur
        target = np.eye(vocab, dtype=np.float32)[rng.integers(vocab, size=(b, n + 1))]
        agree = rng.random((b, n)) < 0.7
        target[:, :n][agree] = np.eye(vocab, dtype=np.float32)[ids[agree]]
    else:
        target = rng.dirichlet(np.ones(vocab), size=(b, n + 1)).astype(np.float32)
    return draft64.astype(np.float32), ids, rng.random((b, n + 1)), target


FLASHINFER_IMPLS = {
    "specverify": lambda d, i, u, t: adapters.specverify_as_flashinfer()(d, i, u, t),
    "flashinfer_style": lambda d, i, u, t: (lambda o: (o[0].numpy(), o[2].numpy(), o[1].numpy()))(
        peers.flashinfer_style_chain(d, i, u, t)),
}


@pytest.mark.parametrize("impl", list(FLASHINFER_IMPLS))
@pytest.mark.parametrize("b,n,vocab", [(1, 1, 5), (3, 4, 8), (8, 6, 16)])
@pytest.mark.parametrize("onehot_target", [False, True])
def test_flashinfer_output_validity(impl, b, n, vocab, onehot_target):
    rng = np.random.default_rng(b * 100 + n + onehot_target)
    draft, ids, u, target = _flashinfer_case(rng, b, n, vocab, onehot_target)
    result = FLASHINFER_IMPLS[impl](draft, ids, u, target)
    out, emitted = np.asarray(result[0]), np.asarray(result[1])
    assert out.shape == (b, n + 1)
    for r in range(b):
        row = out[r].tolist()
        end = row.index(-1) if -1 in row else n + 1
        assert all(x == -1 for x in row[end:]), row  # -1 only after the emitted tokens
        assert emitted[r] == end - 1  # emitted draft count = tau
        assert row[: end - 1] == ids[r, : end - 1].tolist()  # the accepted prefix is the drafts
        assert 0 <= row[end - 1] < vocab
        if onehot_target:  # deterministic: the target's argmax chain
            want, i = [], 0
            while i < n and target[r, i, ids[r, i]] == 1.0:
                want.append(int(ids[r, i]))
                i += 1
            want.append(int(np.argmax(target[r, i])))
            assert row[:end] == want
    if impl == "flashinfer_style":  # output_accepted_token_num: independent passes, so >= tau
        accepted = np.asarray(result[2])
        assert np.all(accepted >= emitted)


@pytest.mark.parametrize("impl", list(FLASHINFER_IMPLS))
def test_flashinfer_minus_one_padding_ends_the_draft(impl):
    rng = np.random.default_rng(5)
    draft, ids, u, target = _flashinfer_case(rng, 4, 5, 8, True)
    lengths = [5, 3, 0, 1]
    for r, k in enumerate(lengths):
        ids[r, k:] = -1
    out, emitted = (np.asarray(x) for x in FLASHINFER_IMPLS[impl](draft, ids, u, target)[:2])
    for r, k in enumerate(lengths):
        assert emitted[r] <= k and -1 not in out[r, : emitted[r] + 1].tolist()


def test_flashinfer_unguarded_padding_is_reported_by_the_harness():
    report = testing.check_exact(broken.CATALOGUE["padding_read_as_token"].fn, kind="chain",
                                 layout="flashinfer", vocab=3, k=1, full_scan=False, reproducer=False)
    assert report.verdict == "error" and "-1" in report.summary
    testing.assert_lossless(testing.check_exact(peers.flashinfer_style_chain, kind="chain", layout="flashinfer",
                                                vocab=3, k=1, cuts="analytic"))


# ---------------------------------------------------------------------------------------------
# transformers: _speculative_sampling.
# ---------------------------------------------------------------------------------------------

HF_IMPLS = {"transformers": peers.transformers_speculative_sampling, "specverify": adapters.specverify_as_hf}


def _hf_impl(name):
    if name == "transformers":
        pytest.importorskip("transformers")
    return HF_IMPLS[name]()


@pytest.mark.parametrize("impl", list(HF_IMPLS))
@pytest.mark.parametrize("k", [1, 4, 8])
def test_transformers_agreeing_drafts_are_all_accepted(impl, k):
    fn = _hf_impl(impl)
    rng = np.random.default_rng(k)
    drafts = rng.integers(V, size=k)
    big = 30.0  # one token takes all the mass in float32 (softmax of a 30-logit gap)
    cand = torch.full((1, k, V), -big)
    cand[0, torch.arange(k), torch.from_numpy(drafts)] = big
    new = torch.full((1, k + 1, V), -big)
    new[0, torch.arange(k), torch.from_numpy(drafts)] = big
    new[0, k, 3] = big
    ids = torch.from_numpy(np.concatenate([[0, 1], drafts]))[None]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        valid, n = fn(ids, cand, k, new)
    assert int(n) == k and valid.reshape(-1).tolist() == drafts.tolist() + [3]


@pytest.mark.parametrize("impl", list(HF_IMPLS))
@pytest.mark.parametrize("k,stop", [(4, 0), (4, 2), (8, 7)])
def test_transformers_n_matches_stops_at_a_zero_probability_draft(impl, k, stop):
    fn = _hf_impl(impl)
    drafts = np.arange(k) % V
    cand = torch.zeros((1, k, V))
    new = torch.zeros((1, k + 1, V))
    new[0, stop, drafts[stop]] = -float("inf")  # the target gives the draft probability 0
    ids = torch.from_numpy(np.concatenate([[0], drafts]))[None]
    for seed in range(5):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            valid, n = fn(ids, cand, k, new)
        valid = valid.reshape(-1).tolist()
        assert int(n) <= stop and len(valid) == int(n) + 1 and valid[: int(n)] == drafts[: int(n)].tolist()
        assert int(n) < stop or valid[-1] != drafts[stop]


def test_transformers_installed_speculative_sampling_through_the_harness():
    """Sampled mode (alpha = 1e-6, fixed seed) on the installed function; the 1e5-round V = 32000
    verdict and timing are recorded by experiments/law/harness_peers.py."""
    fn = _hf_impl("transformers")
    report = testing.check_sampled(fn, kind="chain", layout="hf", vocab=4, k=2, rounds=3000, seed=3)
    testing.assert_lossless(report)
    assert 0 < report.detectable_tv < 0.2


# ---------------------------------------------------------------------------------------------
# SGLang: tree verification and the CDF boundary.
# ---------------------------------------------------------------------------------------------

def test_sglang_tree_with_a_one_hot_target_follows_the_target_path():
    # Root with children 2 and 5; node 0 (token 2) with children 7 and 1; node 3 (token 1) with child 4.
    parents = np.array([-1, -1, 0, 0, 3])
    tokens = np.array([2, 5, 7, 1, 4])
    target_path = [2, 1, 4, 9]  # the target's argmax chain from the root
    rows = onehot([target_path[0], target_path[1], 0, 0, target_path[2], target_path[3]])
    draft = np.full((6, V), 1.0 / V, dtype=np.float32)
    for u in (np.full(6, 0.5), np.full(6, 0.999), np.zeros(6)):
        for replacement in (False, True):
            path, nxt = sv.accept_tree_from_uniforms(rows, draft, tokens, parents, u, replacement=replacement)
            assert path.tolist() == [0, 3, 4] and nxt == 9
        path, nxt = sv.accept_tree_from_uniforms(rows, None, tokens, parents, u)
        assert path.tolist() == [0, 3, 4] and nxt == 9
    path, nxt = sv.verify_tree_greedy(rows, tokens, parents)
    assert path.tolist() == [0, 3, 4] and nxt == 9


def test_sglang_cdf_boundary():
    p = np.array([[0.5, 0.25, 0.25, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=np.float32)
    q = np.array([[0.25, 0.5, 0.25, 0.0]], dtype=np.float32)
    ratio = 0.25 / 0.5  # token 1: accepted iff u < p/q (strict)
    assert sv.accept_from_uniforms(p, q, np.array([1]), np.array([ratio, 0.5]))[0] == 0
    assert sv.accept_from_uniforms(p, q, np.array([1]), np.array([np.nextafter(ratio, 0), 0.5]))[0] == 1
    # residual max(p - q, 0) = (0.25, 0, 0, 0) -> token 0 for any final uniform
    assert sv.accept_from_uniforms(p, q, np.array([1]), np.array([0.9, 0.999]))[1] == 0
    # the bonus draw on a CDF point (0.25, 0.5, 0.75) takes the next token (inverse CDF, right side)
    p2 = np.array([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=np.float32)
    q2 = np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    for u, want in ((0.0, 0), (np.nextafter(0.25, 0), 0), (0.25, 1), (0.5, 2), (0.75, 3)):
        assert sv.accept_from_uniforms(p2, q2, np.array([0]), np.array([0.3, u])) == (1, want)
    # coin 0 never accepts a draft of target probability 0 (SGLang #35771 used coin <= ratio)
    p3 = np.array([[0.0, 1.0], [0.5, 0.5]], dtype=np.float32)
    q3 = np.array([[0.5, 0.5]], dtype=np.float32)
    assert sv.accept_from_uniforms(p3, q3, np.array([0]), np.array([0.0, 0.5])) == (0, 1)
