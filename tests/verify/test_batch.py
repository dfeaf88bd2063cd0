"""Tests of verify_batch (batched, ragged verification) and the layout converters.

- Bit for bit: on random ragged batches (K_r = 0 included, mixed methods: greedy, token-wise and
  block; mixed draft_probs presence, scores for greedy requests), every request's output equals
  the single-request op's on its own rows and uniforms, on 1, 2 and 3 threads; and equals the
  slow reference.
- Schedule: threads claim the requests largest first (rows read; ties in request order).
- Randomness: per-request generators draw exactly what the single ops draw (numpy and torch),
  greedy requests leave theirs untouched, one generator equals the same draw given as uniforms.
- Law: per-request accepted-length histograms (and emitted tokens) of the batched op against the
  analytic law, chi-square on counts at ALPHA = 1e-6 (Bonferroni over every sub-test), plus the
  joint histogram of two requests against the product of their laws (independent streams).
  Power: the same test rejects four broken batchers (target rows without the +r bonus shift,
  draft presence ignored, every request reading the first request's uniforms, block requests
  verified token-wise).
- Bad input: offsets, token ids (-1 padding included), generator counts, uniforms, methods,
  presence mask, NaN / zero mass in one request's rows (named by request and row, nothing
  returned), thread counts.
- Converters: vLLM V1 and FlashInfer layouts round trip, outputs in both conventions.
"""

import numpy as np
import pytest

import specverify as sv
from specverify import law, stats
from specverify.reference import batch as reference_batch
from specverify.verify import batch

from conftest import EMULATED, random_probability_rows, scaled, softmax_rows
from test_ops_statistics import ALPHA, law_pvalues, pmf_pvalues

VOCABS = (1, 5, 257, 1000, 4099)
METHODS = ("greedy", "token", "block")
SAMPLERS = {"token": sv.accept, "block": sv.accept_block}                 # generator drawn
FROM_UNIFORMS = {"token": sv.accept_from_uniforms, "block": sv.accept_block_from_uniforms}


# ------------------------------------------------------------------------------------------
# Random ragged batches and the single-op expectation
# ------------------------------------------------------------------------------------------

def random_batch(rng, n_requests, vocab, k_max=8):
    """A ragged batch: dict of verify_batch's arguments plus the per-request uniforms."""
    k = rng.integers(0, k_max + 1, n_requests)
    k[rng.random(n_requests) < 0.2] = 0
    cu = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    n_tokens = int(cu[-1])
    methods = rng.choice(METHODS, n_requests).tolist()
    has_draft = rng.random(n_requests) < 0.6
    target = random_probability_rows(rng, n_tokens + n_requests, vocab)
    draft = (random_probability_rows(rng, n_tokens, vocab) if n_tokens
             else np.zeros((0, vocab), np.float32))
    tokens = rng.integers(0, vocab, n_tokens)
    for r in range(n_requests):
        rows = slice(cu[r] + r, cu[r + 1] + r + 1)
        if methods[r] == "greedy":
            if rng.random() < 0.5:  # scores, not probabilities: allowed for greedy requests
                target[rows] = rng.standard_normal((k[r] + 1, vocab)).astype(np.float32)
            # Mostly the argmax, so that greedy requests accept long runs.
            best = np.argmax(target[rows][:-1], axis=1)
            keep = rng.random(k[r]) < 0.8
            tokens[cu[r]:cu[r + 1]] = np.where(keep, best, tokens[cu[r]:cu[r + 1]])
    total = int(batch.uniform_counts(cu, methods).sum())
    u = rng.random(total)
    u[rng.random(total) < 0.05] = 0.0
    return dict(target_probs=target, draft_probs=draft, draft_tokens=tokens, cu_num_draft_tokens=cu,
                method=methods, has_draft_probs=has_draft, uniforms=u)


def request_rows(args, r):
    cu = args["cu_num_draft_tokens"]
    return (args["target_probs"][cu[r] + r:cu[r + 1] + r + 1],
            args["draft_probs"][cu[r]:cu[r + 1]] if args["has_draft_probs"][r] else None,
            args["draft_tokens"][cu[r]:cu[r + 1]])


def single_op_results(args):
    """Every request through the single-request op of its method: [(n, next_token)]."""
    counts = batch.uniform_counts(args["cu_num_draft_tokens"], args["method"])
    starts = np.concatenate([[0], np.cumsum(counts)])
    results = []
    for r, name in enumerate(args["method"]):
        target, draft, tokens = request_rows(args, r)
        if name == "greedy":
            results.append(sv.verify_greedy(target, tokens))
        else:
            results.append(FROM_UNIFORMS[name](target, draft, tokens,
                                               args["uniforms"][starts[r]:starts[r + 1]]))
    return results


def assert_matches_single_ops(args, output, accepted, expected):
    cu = args["cu_num_draft_tokens"]
    k_max = int(np.diff(cu).max()) if len(cu) > 1 else 0
    assert output.dtype == np.int64 and accepted.dtype == np.int64
    assert output.shape == (len(cu) - 1, k_max + 1) and accepted.shape == (len(cu) - 1,)
    for r, (n, token) in enumerate(expected):
        tokens = args["draft_tokens"][cu[r]:cu[r + 1]]
        row = np.full(k_max + 1, -1)
        row[:n], row[n] = tokens[:n], token
        assert accepted[r] == n, (r, accepted[r], n)
        np.testing.assert_array_equal(output[r], row, err_msg=f"request {r}")


# ------------------------------------------------------------------------------------------
# Bit for bit
# ------------------------------------------------------------------------------------------

@pytest.mark.emulated
def test_batch_equals_single_ops_on_any_thread_count():
    rng = np.random.default_rng(18)
    for case in range(scaled(150, 12)):
        args = random_batch(rng, int(rng.integers(0, 13)), int(rng.choice(VOCABS)))
        expected = single_op_results(args)
        for threads in (1, 2, 3):
            output, accepted = sv.verify_batch(**args, num_threads=threads)
            assert_matches_single_ops(args, output, accepted, expected)


@pytest.mark.emulated
def test_request_result_does_not_depend_on_the_batch_around_it():
    # One fixed request embedded at different places in different batches, many threads.
    rng = np.random.default_rng(19)
    probe = random_batch(rng, 1, 300)
    probe["method"], probe["has_draft_probs"] = ["token"], np.array([True])
    probe["uniforms"] = rng.random(int(batch.uniform_counts(probe["cu_num_draft_tokens"], "token").sum()))
    (want_n, want_token), = single_op_results(probe)
    for case in range(scaled(20, 4)):
        before, after = random_batch(rng, int(rng.integers(0, 6)), 300), random_batch(rng, 3, 300)
        parts = [before, probe, after]
        args = concatenate_batches(parts)
        output, accepted = sv.verify_batch(**args, num_threads=rng.integers(1, 4))  # a NumPy integer is an integer
        r = len(before["method"])
        assert accepted[r] == want_n and output[r, want_n] == want_token


def concatenate_batches(parts):
    cu, offset = [0], 0
    for p in parts:
        cu.extend(offset + np.asarray(p["cu_num_draft_tokens"][1:]))
        offset += int(p["cu_num_draft_tokens"][-1])
    return dict(
        target_probs=np.concatenate([p["target_probs"] for p in parts]),
        draft_probs=np.concatenate([p["draft_probs"] for p in parts]),
        draft_tokens=np.concatenate([p["draft_tokens"] for p in parts]),
        cu_num_draft_tokens=np.array(cu, dtype=np.int64),
        method=sum((list(p["method"]) for p in parts), []),
        has_draft_probs=np.concatenate([p["has_draft_probs"] for p in parts]),
        uniforms=np.concatenate([p["uniforms"] for p in parts]),
    )


@pytest.mark.emulated
def test_concurrent_callers_and_a_forked_child():
    # Python threads calling at once (one holds the helpers, the others run on their own
    # thread), then a child forked after the helpers started: all give the single-op answers.
    import os
    import threading
    rng = np.random.default_rng(26)
    cases = [random_batch(rng, 16, 2000) for _ in range(4)]
    expected = [single_op_results(args) for args in cases]
    failures = []

    def work(i):
        try:
            for _ in range(scaled(20, 3)):
                output, accepted = sv.verify_batch(**cases[i], num_threads=2)
                assert_matches_single_ops(cases[i], output, accepted, expected[i])
        except AssertionError as error:  # pragma: no cover - reported below
            failures.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    if not hasattr(os, "fork"):
        return
    pid = os.fork()
    if pid == 0:  # the child: no helper threads exist; the first call must start its own
        try:
            output, accepted = sv.verify_batch(**cases[0], num_threads=2)
            assert_matches_single_ops(cases[0], output, accepted, expected[0])
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.emulated
@pytest.mark.parametrize("spin_ns", [0, None, 2 * 10**7], ids=["sleep at once", "default spin", "spin 20 ms"])
def test_same_results_whatever_the_threads_the_repeats_and_the_pauses(spin_ns):
    # The helper found asleep, spinning or busy with the previous job (back-to-back calls, calls
    # after a pause longer than the spin window), on 1-3 threads: every call gives the single-op
    # answers.  spin 20 ms: the helper never sleeps in the test.
    import time
    from specverify.kernels import _kernels
    rng = np.random.default_rng(28)
    # The last batch's requests last tens of us: a caller that did not wait for a helper's
    # request in flight would return its output row unwritten.
    cases = [random_batch(rng, n, v) for n, v in ((0, 700), (1, 700), (2, 700), (40, 700), (12, 30000))]
    expected = [single_op_results(args) for args in cases]
    previous = _kernels._pool_spin_ns(spin_ns)
    try:
        for call in range(scaled(60, 12)):
            if call % 5 == 4:
                time.sleep(0.001)
            i = call % len(cases)
            output, accepted = sv.verify_batch(**cases[i], num_threads=1 + call % 3)
            assert_matches_single_ops(cases[i], output, accepted, expected[i])
    finally:
        _kernels._pool_spin_ns(previous)


@pytest.mark.parametrize("spin_ns", [0, None], ids=["sleep at once", "default spin"])
def test_many_python_threads_calling_at_once_never_deadlock(spin_ns):
    # Eight Python threads, each calling back to back on 2-3 threads (so calls find the pool
    # busy, helpers mid-spin or asleep): every call returns, with the single-op answers.
    import threading
    from specverify.kernels import _kernels
    rng = np.random.default_rng(29)
    cases = [random_batch(rng, n, 300) for n in (1, 5, 12, 30)]
    expected = [single_op_results(args) for args in cases]
    failures, done = [], []

    def work(i):
        try:
            for call in range(scaled(40, 5)):
                c = (i + call) % len(cases)
                output, accepted = sv.verify_batch(**cases[c], num_threads=2 + (i + call) % 2)
                assert_matches_single_ops(cases[c], output, accepted, expected[c])
            done.append(i)
        except AssertionError as error:  # pragma: no cover - reported below
            failures.append(error)

    previous = _kernels._pool_spin_ns(spin_ns)
    try:
        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        _kernels._pool_spin_ns(previous)
    assert not failures, failures[0]
    assert sorted(done) == list(range(8)), f"threads {set(range(8)) - set(done)} never returned"


def test_pool_probes_see_a_helper_and_read_every_word():
    from specverify.kernels import _kernels
    assert _kernels._pool_wake_latency_ns(timeout_s=5.0)[0] >= 0   # a helper started the job
    rng = np.random.default_rng(30)
    data = (np.uint32(1) << rng.integers(0, 20, 100_003).astype(np.uint32)).astype(np.uint32)
    data[-1] = np.uint32(1 << 31)   # in the last, partial chunk
    for threads in (1, 2, 3):
        ns, bits, helper_chunks = _kernels._pool_read_ns(data, threads, chunk_bytes=4096)
        assert ns > 0 and 0 <= helper_chunks <= (0 if threads == 1 else 98)
        assert bits == int(np.bitwise_or.reduce(data)) == (1 << 31) | ((1 << 20) - 1)


@pytest.mark.emulated
def test_threads_claim_the_largest_requests_first():
    from specverify.kernels import _kernels
    rng = np.random.default_rng(31)
    for _ in range(scaled(200)):
        r = int(rng.integers(0, 40))
        k = rng.integers(0, 12, r)
        has_draft = rng.random(r) < 0.5
        codes = rng.integers(0, len(sv.BATCH_METHODS), r)
        order = _kernels._claim_order(np.concatenate([[0], np.cumsum(k)]), has_draft, codes)
        rows = k + 1 + np.where(has_draft & (codes != sv.BATCH_METHODS.index("greedy")), k, 0)
        # decreasing rows read, ties in request order: a stable sort of -rows
        assert np.array_equal(order, np.argsort(-rows, kind="stable")), (k, has_draft, codes)


@pytest.mark.emulated
def test_batch_equals_the_reference():
    rng = np.random.default_rng(20)
    for case in range(scaled(25, 5)):
        args = random_batch(rng, int(rng.integers(1, 8)), int(rng.choice((3, 257, 600))))
        want = reference_batch.verify_batch(**args)
        got = sv.verify_batch(**args, num_threads=2)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_reference_methods_are_the_kernels():
    # the reference reads integer methods as indices of its own METHODS: the kernel's order
    assert reference_batch.METHODS == sv.BATCH_METHODS
    rng = np.random.default_rng(22)
    args = random_batch(rng, 5, 40)
    codes = [sv.BATCH_METHODS.index(m) for m in args["method"]]
    want = reference_batch.verify_batch(**args)
    got = reference_batch.verify_batch(**{**args, "method": codes})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.emulated
def test_methods_as_codes_and_defaults():
    rng = np.random.default_rng(21)
    args = random_batch(rng, 6, 50)
    want = sv.verify_batch(**args)
    codes = np.array([sv.BATCH_METHODS.index(m) for m in args["method"]], dtype=np.int32)
    got = sv.verify_batch(**{**args, "method": codes})
    np.testing.assert_array_equal(got[0], want[0])
    # draft_probs=None: every sampled request has a point-mass draft.
    args["has_draft_probs"][:] = False
    want = sv.verify_batch(**args)
    got = sv.verify_batch(**{**args, "draft_probs": None, "has_draft_probs": None})
    np.testing.assert_array_equal(got[0], want[0])
    # A batch of no requests.
    output, accepted = sv.verify_batch(np.zeros((0, 5), np.float32), None, [], [0], uniforms=[])
    assert output.shape == (0, 1) and accepted.shape == (0,)


# ------------------------------------------------------------------------------------------
# Randomness: generators
# ------------------------------------------------------------------------------------------

@pytest.mark.emulated
def test_per_request_numpy_generators_draw_what_the_single_ops_draw():
    rng = np.random.default_rng(22)
    for case in range(scaled(20, 4)):
        args = random_batch(rng, int(rng.integers(1, 9)), 257)
        del args["uniforms"]
        seeds = rng.integers(0, 2**32, len(args["method"]))
        gens = [np.random.default_rng(s) for s in seeds]
        output, accepted = sv.verify_batch(**args, generators=gens, num_threads=2)
        for r, name in enumerate(args["method"]):
            target, draft, tokens = request_rows(args, r)
            twin = np.random.default_rng(seeds[r])
            if name == "greedy":
                want = sv.verify_greedy(target, tokens)
            else:
                want = SAMPLERS[name](target, draft, tokens, twin)
            assert (accepted[r], output[r, accepted[r]]) == want
            # Same advancement as the single op; greedy requests leave theirs untouched.
            assert gens[r].random() == twin.random()


def test_per_request_torch_generators_and_the_default_generator():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(23)
    args = random_batch(rng, 10, 1000)
    del args["uniforms"]
    gens = [torch.Generator().manual_seed(100 + r) for r in range(10)]
    output, accepted = sv.verify_batch(**args, generators=gens, num_threads=2)
    for r, name in enumerate(args["method"]):
        target, draft, tokens = request_rows(args, r)
        twin = torch.Generator().manual_seed(100 + r)
        want = (sv.verify_greedy(target, tokens) if name == "greedy"
                else SAMPLERS[name](target, draft, tokens, twin))
        assert (accepted[r], output[r, accepted[r]]) == want
        assert gens[r].get_state().equal(twin.get_state())
    # generator=None: one draw from torch's default generator, like the single ops.
    total = int(batch.uniform_counts(args["cu_num_draft_tokens"], args["method"]).sum())
    torch.manual_seed(5)
    got = sv.verify_batch(**args)
    torch.manual_seed(5)
    want = sv.verify_batch(**args, uniforms=torch.rand(total, dtype=torch.float64))
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.emulated
def test_one_generator_draws_the_batch_in_one_call():
    rng = np.random.default_rng(24)
    args = random_batch(rng, 12, 100)
    total = args.pop("uniforms").size
    got = sv.verify_batch(**args, generator=np.random.default_rng(9))
    want = sv.verify_batch(**args, uniforms=np.random.default_rng(9).random(total))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_torch_tensors_in():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(25)
    args = random_batch(rng, 9, 333)
    want = sv.verify_batch(**args)
    tensors = {name: torch.from_numpy(np.asarray(args[name])) for name in
               ("target_probs", "draft_probs", "draft_tokens", "cu_num_draft_tokens", "uniforms",
                "has_draft_probs")}
    got = sv.verify_batch(**{**args, **tensors}, num_threads=2)
    np.testing.assert_array_equal(got[0], want[0])
    # float64 rows are converted, like the single ops
    got = sv.verify_batch(**{**args, "target_probs": tensors["target_probs"].double()})
    np.testing.assert_array_equal(got[0], want[0])


# ------------------------------------------------------------------------------------------
# The law, through the batched op; and its power
# ------------------------------------------------------------------------------------------

LAW_ROUNDS = 3_000 if EMULATED else 20_000


def law_batch():
    """Seven requests over V = 10: two identical sampled ones (K = 3, for the joint test), a
    point-mass draft (K = 2), a greedy one (K = 2), K = 0, a sampled K = 4 and a block one (K = 4,
    drafts whose ratios spread around 1, where block verification gains the most)."""
    rng = np.random.default_rng(30)
    v = 10
    p0, q0 = softmax_rows(1.5 * rng.standard_normal((4, v))), softmax_rows(1.5 * rng.standard_normal((3, v)))
    p5, q5 = softmax_rows(1.5 * rng.standard_normal((5, v))), softmax_rows(1.5 * rng.standard_normal((4, v)))
    p2, p3, p4 = (softmax_rows(1.5 * rng.standard_normal((n, v))) for n in (3, 3, 1))
    requests = [  # (method, target rows, draft rows or None, fixed tokens or None)
        ("token", p0, q0, None), ("token", p0, q0, None),
        ("token", p2, None, np.array([1, 4])), ("greedy", p3, None, np.argmax(p3[:2], axis=1)),
        ("token", p4, np.zeros((0, v), np.float32), None), ("token", p5, q5, None),
        ("block", p5, softmax_rows(np.log(p5[:4]) + 0.8 * rng.standard_normal((4, v))), None),
    ]
    return requests


def draw_tokens(rng, draft, rounds):
    """[rounds, K] tokens, row i of the draft sampled independently per round."""
    if draft.shape[0] == 0:
        return np.zeros((rounds, 0), dtype=np.int64)
    cdf = np.cumsum(draft.astype(np.float64), axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random((rounds, draft.shape[0]))
    return np.stack([np.minimum(np.searchsorted(cdf[i], u[:, i], side="right"), draft.shape[1] - 1)
                     for i in range(draft.shape[0])], axis=1).reshape(rounds, draft.shape[0])


def run_law_batch(batcher, requests, rounds, seed):
    """Every round's batch through ``batcher``; returns accepted [rounds, R], emitted list."""
    rng = np.random.default_rng(seed)
    k = np.array([r[1].shape[0] - 1 for r in requests])
    cu = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    target = np.concatenate([r[1] for r in requests]).astype(np.float32)
    v = target.shape[1]
    draft = np.concatenate([r[2] if r[2] is not None else np.zeros((kk, v), np.float32)
                            for r, kk in zip(requests, k)]).astype(np.float32)
    has_draft = np.array([r[2] is not None for r in requests])
    methods = [r[0] for r in requests]
    per_request_tokens = [np.broadcast_to(r[3], (rounds, kk)) if r[3] is not None
                          else draw_tokens(rng, r[2], rounds) for r, kk in zip(requests, k)]
    tokens = np.ascontiguousarray(np.concatenate(per_request_tokens, axis=1), dtype=np.int64)
    generator = np.random.default_rng(seed + 1)
    accepted = np.empty((rounds, len(requests)), dtype=np.int64)
    emitted = [np.full((rounds, kk + 1), -1) for kk in k]
    for i in range(rounds):
        output, n = batcher(target, draft, tokens[i], cu, methods, has_draft, generator)
        accepted[i] = n
        for r in range(len(requests)):
            emitted[r][i, :n[r] + 1] = output[r, :n[r] + 1]
    return accepted, emitted


def law_test_pvalues(batcher, requests, rounds=LAW_ROUNDS, seed=0):
    """{name: p} over every sampled request's sub-tests and the joint test of requests 0 and 1;
    greedy requests must be deterministic (p = 0 otherwise)."""
    accepted, emitted = run_law_batch(batcher, requests, rounds, seed)
    pvalues = {}
    for r, (name, target, draft, fixed) in enumerate(requests):
        if name == "greedy":
            want = sv.verify_greedy(target, fixed)
            ok = np.all(accepted[:, r] == want[0]) and np.all(emitted[r][:, want[0]] == want[1])
            pvalues[f"r{r}:greedy"] = 1.0 if ok else 0.0
            continue
        if name == "block":
            sub_pvalues = pmf_pvalues(law.block_survival(target, draft).pmf, target, accepted[:, r], emitted[r])
        else:
            sub_pvalues = law_pvalues(target, draft, accepted[:, r], emitted[r], point_mass_tokens=fixed)
        for sub, p in sub_pvalues.items():
            if sub != "mean":
                pvalues[f"r{r}:{sub}"] = p
    pmf = law.accepted_length_pmf(law.acceptance_rates(requests[0][1], requests[0][2]))
    joint = np.bincount(accepted[:, 0] * pmf.size + accepted[:, 1], minlength=pmf.size ** 2)
    pvalues["joint r0 r1"] = stats.chisquare_counts(joint, np.outer(pmf, pmf).ravel()).pvalue
    return pvalues


def passes(pvalues):
    return all(p > ALPHA / len(pvalues) for p in pvalues.values())


def real_batcher(target, draft, tokens, cu, methods, has_draft, generator):
    # One thread: results do not depend on the thread count (shown bit for bit above), and a
    # fork-join per tiny batch costs a scheduler slice on a loaded 2-core machine.
    return sv.verify_batch(target, draft, tokens, cu, method=methods, has_draft_probs=has_draft,
                           generator=generator, num_threads=1)


def broken_batcher(defect):
    """verify_batch rebuilt from the single ops, with one layout defect switched on."""

    def batcher(target, draft, tokens, cu, methods, has_draft, generator):
        counts = batch.uniform_counts(cu, methods)
        u = generator.random(int(counts.sum()))
        starts = np.concatenate([[0], np.cumsum(counts)])
        n_requests = len(methods)
        output = np.full((n_requests, int(np.diff(cu).max()) + 1), -1)
        accepted = np.zeros(n_requests, dtype=np.int64)
        for r in range(n_requests):
            shift = 0 if defect == "no bonus shift" else r   # V1-style rows: forgets the bonus rows
            rows = target[cu[r] + shift:cu[r + 1] + shift + 1]
            t = tokens[cu[r]:cu[r + 1]]
            name = "token" if defect == "block as token" and methods[r] == "block" else methods[r]
            if name == "greedy":
                n, token = sv.verify_greedy(rows, t)
            else:
                d = draft[cu[r]:cu[r + 1]] if has_draft[r] and defect != "presence ignored" else None
                start = 0 if defect == "uniforms not advanced" else starts[r]
                n, token = FROM_UNIFORMS[name](rows, d, t, u[start:start + counts[r]])
            accepted[r] = n
            output[r, :n], output[r, n] = t[:n], token
        return output, accepted

    return batcher


@pytest.mark.emulated
def test_batched_op_follows_the_law():
    pvalues = law_test_pvalues(real_batcher, law_batch())
    assert passes(pvalues), pvalues


@pytest.mark.parametrize("defect", ["no bonus shift", "presence ignored", "uniforms not advanced",
                                    "block as token"])
def test_law_test_rejects_broken_batchers(defect):
    pvalues = law_test_pvalues(broken_batcher(defect), law_batch())
    assert not passes(pvalues), pvalues


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------

def small_batch():
    """Three requests, K = 2, 0, 3, V = 6: all sampled with draft rows, explicit uniforms."""
    rng = np.random.default_rng(40)
    cu = np.array([0, 2, 2, 5])
    return dict(target_probs=softmax_rows(rng.standard_normal((8, 6))),
                draft_probs=softmax_rows(rng.standard_normal((5, 6))),
                draft_tokens=np.array([1, 2, 3, 4, 5]), cu_num_draft_tokens=cu,
                method="token", uniforms=np.full(3 + 1 + 4, 0.5))


BAD = {
    "cu not starting at 0": (dict(cu_num_draft_tokens=np.array([1, 2, 2, 5])), ValueError, "start at 0"),
    "cu not monotone": (dict(cu_num_draft_tokens=np.array([0, 3, 2, 5])), ValueError,
                        r"non-decreasing: cu_num_draft_tokens\[2\] = 2 < cu_num_draft_tokens\[1\] = 3 \(request 1\)"),
    "cu against tokens": (dict(cu_num_draft_tokens=np.array([0, 2, 2, 4])), ValueError, "draft_tokens holds 5"),
    "cu empty": (dict(cu_num_draft_tokens=np.array([], dtype=np.int64)), ValueError, "R \\+ 1 offsets"),
    "cu float": (dict(cu_num_draft_tokens=np.array([0.0, 2, 2, 5])), TypeError, "cu_num_draft_tokens"),
    "cu 2-D": (dict(cu_num_draft_tokens=np.array([[0, 2], [2, 5]])), ValueError, "cu_num_draft_tokens"),
    "target rows against cu": (dict(target_probs=np.ones((7, 6), np.float32)), ValueError,
                               r"target_probs has 7 rows but cu_num_draft_tokens implies sum\(K_r\) \+ R = 8"),
    "draft rows against cu": (dict(draft_probs=np.ones((6, 6), np.float32)), ValueError,
                              r"draft_probs has 6 rows but .* sum\(K_r\) = 5"),
    "draft columns": (dict(draft_probs=np.ones((5, 7), np.float32)), ValueError, "V = 6"),
    "-1 padding": (dict(draft_tokens=np.array([1, 2, 3, -1, 5])), IndexError,
                   r"draft_tokens\[3\] = -1 \(request 2, position 1\).*padding"),
    "token = V": (dict(draft_tokens=np.array([1, 6, 3, 4, 5])), IndexError,
                  r"draft_tokens\[1\] = 6 \(request 0, position 1\)"),
    "token = V, greedy": (dict(draft_tokens=np.array([1, 2, 3, 4, 6]), method="greedy", uniforms=None),
                          IndexError, r"request 2, position 2"),
    "generator count": (dict(uniforms=None, generators=[np.random.default_rng(0)] * 2), ValueError,
                        r"one generator per request \(R = 3\), got 2"),
    "generators not a list": (dict(uniforms=None, generators=np.random.default_rng(0)), ValueError,
                              "one generator per request"),
    "generator type": (dict(uniforms=None, generators=[np.random.default_rng(0), "seed", 3]), TypeError,
                       r"generators\[1\]"),
    "two sources": (dict(generator=np.random.default_rng(0)), TypeError, "at most one"),
    "uniform count": (dict(uniforms=np.full(7, 0.5)), ValueError, r"\[8\] \(K_r \+ 1 per sampled request"),
    "uniform range": (dict(uniforms=np.full(8, 1.0)), ValueError, r"\[0, 1\)"),
    "uniform NaN": (dict(uniforms=np.array([0.5] * 7 + [np.nan])), ValueError, r"\[0, 1\)"),
    "method name": (dict(method="block!"), ValueError, "method must be one of"),
    "method per request": (dict(method=["token", "greedy", "typical"]), ValueError, r"method\[2\] = 'typical'"),
    "method count": (dict(method=["token", "greedy"]), ValueError, r"one entry per request \(R = 3\)"),
    "method code": (dict(method=np.array([0, 1, 7])), ValueError, r"method\[2\] = 7"),
    "presence without rows": (dict(draft_probs=None, has_draft_probs=[True, False, False]), ValueError,
                              r"has_draft_probs\[0\] is True but draft_probs is None"),
    "presence count": (dict(has_draft_probs=[True, False]), ValueError, "has_draft_probs must have one entry"),
    "presence dtype": (dict(has_draft_probs=[1, 0, 1]), TypeError, "has_draft_probs must hold booleans"),
    "threads zero": (dict(num_threads=0), ValueError, "num_threads"),
    "threads float": (dict(num_threads=1.5), ValueError, "num_threads"),
    "threads bool": (dict(num_threads=True), ValueError, "num_threads"),
}


@pytest.mark.emulated
@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_raises_naming_the_argument(name):
    change, error, match = BAD[name]
    with pytest.raises(error, match=match):
        sv.verify_batch(**{**small_batch(), **change})


def poisoned(row_kind, request, row, value=np.nan, method="token"):
    args = small_batch()
    args["method"] = method
    if method == "greedy":
        args["uniforms"] = None
    cu = args["cu_num_draft_tokens"]
    name = "target_probs" if row_kind == "target" else "draft_probs"
    rows = args[name].copy()
    global_row = (cu[request] + request + row) if row_kind == "target" else cu[request] + row
    rows[global_row, 3] = value
    if value == 0.0:
        rows[global_row] = 0.0
    args[name] = rows
    # Every position accepts (u = 0 accepts any token with p > 0), so every row is read.
    if args["uniforms"] is not None:
        args["uniforms"] = np.zeros_like(args["uniforms"])
    return args, global_row


@pytest.mark.emulated
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind, req, row, value, method, message", [
    ("target", 2, 1, np.nan, "token", r"request 2 \(row 1 of its 4 target rows\): target_probs\[5\] contains NaN"),
    ("target", 1, 0, np.inf, "token", r"request 1 \(row 0 of its 1 target rows\): target_probs\[3\] contains inf"),
    ("draft", 0, 1, -1.0, "token", r"request 0 \(row 1 of its 2 draft rows\): draft_probs\[1\] contains a negative"),
    ("target", 2, 3, 0.0, "token", r"request 2 \(row 3 of its 4 target rows\): target_probs\[7\] has zero mass"),
    ("draft", 2, 0, 0.0, "token", r"request 2 \(row 0 of its 3 draft rows\): draft_probs\[2\] has zero mass"),
    ("target", 2, 2, np.nan, "greedy", r"request 2 \(row 2 of its 4 target rows\): target_probs\[6\] contains NaN"),
])
def test_bad_values_name_the_request_and_row(kind, req, row, value, method, message, threads):
    args, _ = poisoned(kind, req, row, value, method)
    if method == "greedy":  # make the greedy requests accept every draft so every row is read
        t, cu = args["target_probs"], args["cu_num_draft_tokens"]
        for r in range(3):
            rows = t[cu[r] + r:cu[r + 1] + r]
            args["draft_tokens"][cu[r]:cu[r + 1]] = np.argmax(np.nan_to_num(rows, nan=-1), axis=1)
    with pytest.raises(ValueError, match=message + ".*no output returned"):
        sv.verify_batch(**args, num_threads=threads)


@pytest.mark.emulated
def test_first_failing_request_is_named_whatever_the_threads():
    args = small_batch()
    target = args["target_probs"].copy()
    target[0, 0] = target[6, 0] = np.nan   # requests 0 and 2
    args["target_probs"] = target
    for threads in (1, 2, 3):
        with pytest.raises(ValueError, match=r"^request 0 "):
            sv.verify_batch(**args, num_threads=threads)


@pytest.mark.emulated
def test_rows_a_request_never_reads_are_not_validated():
    # Draft rows of a request without draft probabilities, and of a greedy request.
    args = small_batch()
    draft = args["draft_probs"].copy()
    draft[0:2] = np.nan                 # request 0's rows
    args.update(draft_probs=draft, method=["greedy", "token", "token"], has_draft_probs=[True, True, True],
                uniforms=np.full(1 + 4, 0.5))
    sv.verify_batch(**args)
    args.update(method="token", has_draft_probs=[False, True, True], uniforms=np.full(8, 0.5))
    sv.verify_batch(**args)


# ------------------------------------------------------------------------------------------
# Converters
# ------------------------------------------------------------------------------------------

def to_vllm_v1_layout(rng, args):
    """specverify's layout -> vLLM V1's: rows scattered in a permuted logits buffer, an inclusive
    cumsum, separate target and bonus row indices."""
    cu = args["cu_num_draft_tokens"]
    n_requests, n_tokens = cu.size - 1, int(cu[-1])
    target = args["target_probs"]
    place = rng.permutation(target.shape[0] + 3)[:target.shape[0]]   # where each row goes
    buffer = rng.random((target.shape[0] + 3, target.shape[1])).astype(np.float32)
    buffer[place] = target
    request_of_token = np.repeat(np.arange(n_requests), np.diff(cu))
    target_index = place[np.arange(n_tokens) + request_of_token]
    bonus_index = place[cu[1:] + np.arange(n_requests)]
    return buffer, args["draft_tokens"], cu[1:], target_index, bonus_index


@pytest.mark.emulated
def test_vllm_v1_layout_round_trip():
    rng = np.random.default_rng(50)
    for case in range(10):
        args = random_batch(rng, int(rng.integers(1, 9)), 40)
        buffer, tokens, cu_inclusive, target_index, bonus_index = to_vllm_v1_layout(rng, args)
        target, draft, got_tokens, cu = batch.from_vllm_v1(buffer, tokens, cu_inclusive, target_index,
                                                           bonus_index, args["draft_probs"])
        np.testing.assert_array_equal(target, args["target_probs"])
        np.testing.assert_array_equal(cu, args["cu_num_draft_tokens"])
        np.testing.assert_array_equal(got_tokens, args["draft_tokens"])
        assert draft is args["draft_probs"]
    # Rows already in order (vLLM's usual logits layout): no copy.
    n = args["target_probs"].shape[0]
    cu = args["cu_num_draft_tokens"]
    request_of_token = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    target, *_ = batch.from_vllm_v1(args["target_probs"], args["draft_tokens"], cu[1:],
                                    np.arange(cu[-1]) + request_of_token, cu[1:] + np.arange(cu.size - 1))
    assert target is args["target_probs"] and n == target.shape[0]
    with pytest.raises(IndexError, match="bonus_logits_indices"):
        batch.from_vllm_v1(args["target_probs"], args["draft_tokens"], cu[1:],
                           np.arange(cu[-1]) + request_of_token, np.full(cu.size - 1, n))
    with pytest.raises(ValueError, match="inclusive cumsum"):
        batch.from_vllm_v1(args["target_probs"], args["draft_tokens"], cu[1:] - 1,
                           np.arange(cu[-1]) + request_of_token, cu[1:] + np.arange(cu.size - 1))


def to_flashinfer_layout(args):
    """specverify's layout -> FlashInfer's dense one, padding drafts with -1 and the unused rows
    with NaN (never read: the converter drops them)."""
    cu = args["cu_num_draft_tokens"]
    k = np.diff(cu)
    n_requests, n, v = k.size, int(k.max()), args["target_probs"].shape[1]
    ids = np.full((n_requests, n), -1, dtype=np.int64)
    target = np.full((n_requests, n + 1, v), np.nan, dtype=np.float32)
    draft = np.full((n_requests, n, v), np.nan, dtype=np.float32)
    for r in range(n_requests):
        ids[r, :k[r]] = args["draft_tokens"][cu[r]:cu[r + 1]]
        target[r, :k[r] + 1] = args["target_probs"][cu[r] + r:cu[r + 1] + r + 1]
        draft[r, :k[r]] = args["draft_probs"][cu[r]:cu[r + 1]]
    return draft, ids, target


@pytest.mark.emulated
def test_flashinfer_layout_round_trip_and_outputs():
    rng = np.random.default_rng(51)
    for case in range(10):
        args = random_batch(rng, int(rng.integers(1, 9)), 40)
        if args["cu_num_draft_tokens"][-1] == 0:
            continue
        dense = to_flashinfer_layout(args)
        target, draft, tokens, cu = batch.from_flashinfer(*dense)
        np.testing.assert_array_equal(target, args["target_probs"])
        np.testing.assert_array_equal(draft, args["draft_probs"])
        np.testing.assert_array_equal(tokens, args["draft_tokens"])
        np.testing.assert_array_equal(cu, args["cu_num_draft_tokens"])
        output, accepted = sv.verify_batch(**args)
        n = dense[1].shape[1]
        ids, emitted = batch.to_flashinfer_output(output, accepted, n)
        assert ids.dtype == np.int32 and ids.shape == (len(accepted), n + 1)
        np.testing.assert_array_equal(emitted, accepted)
        for r in range(len(accepted)):   # emitted tokens, then -1: FlashInfer's docstring example
            np.testing.assert_array_equal(ids[r, :accepted[r] + 1], output[r, :accepted[r] + 1])
            assert np.all(ids[r, accepted[r] + 1:] == -1)
        v1 = batch.to_vllm_v1_output(output, accepted, max_spec_len=12)
        assert v1.dtype == np.int32 and v1.shape == (len(accepted), 13)
        parsed = [[t for t in row if t != -1] for row in v1]   # vLLM's parse_output
        assert parsed == [list(output[r, :accepted[r] + 1]) for r in range(len(accepted))]
    with pytest.raises(ValueError, match="holds more tokens"):
        batch.to_vllm_v1_output(output, accepted, max_spec_len=int(accepted.max()) - 1)


@pytest.mark.emulated
def test_flashinfer_padding_must_trail():
    draft, ids, target = np.ones((2, 3, 4), np.float32), np.array([[1, -1, 2], [0, 0, 0]]), np.ones((2, 4, 4), np.float32)
    with pytest.raises(ValueError, match=r"draft_token_ids\[0, 2\] = 2 follows padding"):
        batch.from_flashinfer(draft, ids, target)
    # No padding at all: views, no copy.
    ids[0] = [1, 2, 3]
    t, d, tokens, cu = batch.from_flashinfer(draft, ids, target)
    assert np.shares_memory(t, target) and np.shares_memory(d, draft)
    np.testing.assert_array_equal(cu, [0, 3, 6])


def test_flashinfer_converter_takes_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(52)
    args = random_batch(rng, 5, 30)
    args["cu_num_draft_tokens"] = np.array([0, 2, 2, 5, 6, 8])
    args["draft_tokens"] = rng.integers(0, 30, 8)
    args["target_probs"] = random_probability_rows(rng, 13, 30)
    args["draft_probs"] = random_probability_rows(rng, 8, 30)
    dense = [torch.from_numpy(x) for x in to_flashinfer_layout(args)]
    target, draft, tokens, cu = batch.from_flashinfer(*dense)
    assert isinstance(target, torch.Tensor)
    np.testing.assert_array_equal(target.numpy(), args["target_probs"])
    np.testing.assert_array_equal(tokens, args["draft_tokens"])


def test_thread_probe_quick_run(capsys):
    # tools/thread_probe.py (wake latency, posting cost, 1- vs 2-thread read bandwidth) runs.
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    if not (root / "tools" / "thread_probe.py").exists():
        pytest.skip("no tools/ in this copy of the tests (e.g. tools/sanitize.sh's scratch tree)")
    sys.path.insert(0, str(root))
    from tools import thread_probe
    assert thread_probe.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "wake latency" in out and "read bandwidth" in out and "helper read" in out
