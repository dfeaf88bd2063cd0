"""Reliability: what a hostile caller can do to the ops (issue 19).

Each test here is the regression test of a defect an independent probe found: a data race by the
caller that became memory corruption, valid inputs rejected with internal errors, wrong exception
classes, unaligned memory read in place, error messages that re-read the caller's memory, an
unbounded scratch cache.  Thread tests check that concurrent calls equal serial ones.  The
property-based fuzz is tests/kernels/test_fuzz.py; the sanitizer and bounds-checked builds are
tools/sanitize.sh.
"""

import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import specverify as sv
from specverify.kernels import _inputs, _kernels

K, V = 3, 10
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def good():
    rng = np.random.default_rng(0)
    target = rng.random((K + 1, V)).astype(np.float32) + np.float32(0.01)
    draft = rng.random((K, V)).astype(np.float32) + np.float32(0.01)
    return target, draft, np.array([1, 2, 3], dtype=np.int64), np.full(K + 1, 0.37)


def unaligned(a):
    """A copy of a whose data starts one byte past an aligned address (np.frombuffer at offset 1)."""
    a = np.ascontiguousarray(a)
    x = np.frombuffer(bytearray(a.nbytes + 1), a.dtype, count=a.size, offset=1).reshape(a.shape)
    x[...] = a
    assert not x.flags.aligned
    return x


# -- defect 1: a caller's thread writing the token ids (or uniforms) during the call -------------

def test_tokens_and_uniforms_written_during_the_call_never_corrupt_memory():
    """Every op under a writer thread flipping a token between valid and out-of-range ids (and a
    uniform and a target entry between valid and invalid values): no crash, every result in range,
    every error a ValueError/IndexError naming the argument.  The build before the fix segfaults
    here within a second.  SPECVERIFY_MUTATION_SECONDS (default 3) runs it longer."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, os.path.join(HERE, "mutation_child.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"accept", "accept_point_mass", "accept_from_uniforms", "verify_greedy"} <= set(counts)
    for name, c in counts.items():
        assert c["results"] > 0, (name, c)  # the loop ran (errors alone would prove little)


# -- defect 2: valid inputs that were rejected with an internal AssertionError -----------------

def _valid_variants():
    """(id, target, draft, tokens, uniforms, same-values plain arguments)."""
    torch = pytest.importorskip("torch")
    t, d, k, u = good()
    return [
        ("parameter", torch.nn.Parameter(torch.from_numpy(t), requires_grad=False), d, k, u),
        ("parameter_grad", torch.nn.Parameter(torch.from_numpy(t.copy()), requires_grad=True), d, k, u),
        ("unaligned_target", unaligned(t), d, k, u),
        ("unaligned_draft", t, unaligned(d), k, u),
        ("unaligned_tokens", t, d, unaligned(k), u),
        ("unaligned_uniforms", t, d, k, unaligned(u)),
        ("unaligned_torch_target", torch.from_numpy(unaligned(t)), d, k, u),
        ("unaligned_torch_tokens", t, d, torch.from_numpy(unaligned(k)), u),
        ("unaligned_torch_uniforms", t, d, k, torch.from_numpy(unaligned(u))),
        ("matrix_subclass", np.asmatrix(t), d, k, u),
        ("object_small_ints", t, d, np.array([1, 2, 3], dtype=object), u),
        ("uniforms_neg_view", t, d, k, torch._neg_view(torch.from_numpy(-u))),
        ("uniforms_bfloat16", t, d, k, torch.full((K + 1,), 0.375, dtype=torch.bfloat16)),
        ("uniforms_float32_tensor", t, d, k, torch.from_numpy(u).float()),
    ]


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("index", range(14))
def test_valid_inputs_are_accepted(index):
    case = _valid_variants()[index]
    name, target, draft, tokens, uniforms = case
    t, d, k, u = good()
    if name == "uniforms_bfloat16":
        u = np.full(K + 1, 0.375)
    if name == "uniforms_float32_tensor":
        u = u.astype(np.float32).astype(np.float64)
    want = sv.accept_from_uniforms(t, d, k, u)
    assert sv.accept_from_uniforms(target, draft, tokens, uniforms) == want
    assert sv.verify_greedy(target, tokens) == sv.verify_greedy(t, k)


def test_memmap_scores_are_read(tmp_path):
    t, d, k, u = good()
    mm = np.memmap(tmp_path / "scores.bin", dtype=np.float32, mode="w+", shape=t.shape)
    mm[:] = t
    assert sv.accept_from_uniforms(mm, d, k, u) == sv.accept_from_uniforms(t, d, k, u)
    assert sv.verify_greedy(mm, k) == sv.verify_greedy(t, k)
    ro = np.memmap(tmp_path / "scores.bin", dtype=np.float32, mode="r", shape=t.shape)
    assert sv.verify_greedy(ro, k) == sv.verify_greedy(t, k)


def test_empty_draft_with_any_strides_at_k0():
    torch = pytest.importorskip("torch")
    t, _, _, _ = good()
    empty = torch.from_numpy(np.zeros((0, V))).float()  # strides (0, 0)
    u = np.array([0.3])
    want = sv.accept_from_uniforms(t[:1], None, [], u)
    assert sv.accept_from_uniforms(t[:1], empty, [], u) == want
    assert sv.accept_from_uniforms(t[:1], np.empty((0, 2 * V), np.float32)[::-1, ::2], [], u) == want


def test_masked_arrays_are_refused_with_the_reason():
    t, d, k, u = good()
    for args, name in [((np.ma.masked_array(t), d, k, u), "target_probs"),
                       ((t, np.ma.masked_array(d, mask=d > 0.5), k, u), "draft_probs"),
                       ((t, d, np.ma.masked_array(k), u), "draft_tokens"),
                       ((t, d, k, np.ma.masked_array(u)), "uniforms")]:
        with pytest.raises(TypeError, match=f"{name} is a numpy masked array.*filled"):
            sv.accept_from_uniforms(*args)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_subclasses_and_unaligned_arrays_are_never_read_in_place():
    """Defect 4: an unaligned array (NumPy or torch) is copied, never read in place."""
    torch = pytest.importorskip("torch")
    t, d, k, u = good()
    assert _kernels._read_in_place(t) and _kernels._read_in_place(k) and _kernels._read_in_place(u)
    assert _kernels._read_in_place(torch.from_numpy(t))
    for x in (unaligned(t), unaligned(k), unaligned(u), torch.from_numpy(unaligned(t)),
              torch.from_numpy(unaligned(k)), torch.from_numpy(unaligned(u)),
              torch.nn.Parameter(torch.from_numpy(t), requires_grad=False), np.asmatrix(t)):
        assert not _kernels._read_in_place(x)
    # What the conversion returns is read in place (so no reader ever falls through).
    for x, convert in [(unaligned(t), lambda x: _inputs.float_rows(x, "x")),
                       (torch.from_numpy(unaligned(t)), lambda x: _inputs.float_rows(x, "x")),
                       (unaligned(k), lambda x: _inputs.tokens_int64(x, "x")),
                       (torch.from_numpy(unaligned(k)), lambda x: _inputs.tokens_int64(x, "x")),
                       (unaligned(u), lambda x: _inputs.uniforms_float64(x, K + 1))]:
        assert _kernels._read_in_place(convert(x))


# -- defect 3: wrong exception class, or a message naming no argument --------------------------

def _bad_variants():
    torch = pytest.importorskip("torch")
    t, d, k, u = good()
    nan_t = torch.from_numpy(t.copy())
    nan_t[1, 4] = float("nan")
    neg_d = torch.from_numpy(d.copy())
    neg_d[0, 2] = -1.0
    inf_greedy = torch.from_numpy(t.copy())
    inf_greedy[0, 3] = float("inf")
    dt = np.zeros(t.shape, "datetime64[s]")
    return [
        ("grad_nan_target", lambda: sv.accept_from_uniforms(nan_t.requires_grad_(True), d, k, np.zeros(K + 1)),
         ValueError, r"target_probs\[1\] contains NaN \(first at column 4\)"),
        ("grad_negative_draft", lambda: sv.accept_from_uniforms(t, neg_d.requires_grad_(True), k, u),
         ValueError, r"draft_probs\[0\] contains a negative value -1.0 at column 2"),
        ("grad_inf_greedy", lambda: sv.verify_greedy(inf_greedy.requires_grad_(True), k),
         ValueError, r"target_probs\[0\] contains inf"),
        ("uniforms_meta", lambda: sv.accept_from_uniforms(t, d, k, torch.empty(K + 1, dtype=torch.float64, device="meta")),
         ValueError, "uniforms must be a CPU tensor"),
        ("uniforms_int_tensor", lambda: sv.accept_from_uniforms(t, d, k, torch.zeros(K + 1, dtype=torch.int64)),
         TypeError, "uniforms must be floating point"),
        ("uniforms_sparse", lambda: sv.accept_from_uniforms(t, d, k, torch.from_numpy(u).to_sparse()),
         TypeError, "uniforms must be a dense tensor"),
        ("datetime_target", lambda: sv.accept_from_uniforms(dt, d, k, u), TypeError, "target_probs must hold floating-point"),
        ("datetime_draft", lambda: sv.accept_from_uniforms(t, dt[:K], k, u), TypeError, "draft_probs must hold floating-point"),
        ("timedelta_tokens", lambda: sv.accept_from_uniforms(t, d, k.astype("timedelta64[s]"), u),
         TypeError, "draft_tokens must hold integer"),
        ("datetime_uniforms", lambda: sv.accept_from_uniforms(t, d, k, np.zeros(K + 1, "datetime64[s]")),
         TypeError, "uniforms must be floating point"),
        ("datetime_greedy", lambda: sv.verify_greedy(dt, k), TypeError, "target_probs must hold floating-point"),
        ("object_huge_int", lambda: sv.verify_greedy(t, np.array([1, 2**63, 2], dtype=object)),
         IndexError, r"draft_tokens\[1\] = 9223372036854775808 is outside the int64 range"),
        ("object_float", lambda: sv.verify_greedy(t, np.array([1, 2.5, 2], dtype=object)),
         TypeError, r"draft_tokens must hold integer token ids, got float at draft_tokens\[1\]"),
        ("object_bool", lambda: sv.verify_greedy(t, np.array([1, True, 2], dtype=object)), TypeError,
         r"got bool at draft_tokens\[1\]"),
        ("sparse_target", lambda: sv.accept_from_uniforms(torch.from_numpy(t).to_sparse(), d, k, u),
         TypeError, "target_probs must be a dense tensor"),
        ("sparse_csr_draft", lambda: sv.accept_from_uniforms(t, torch.from_numpy(d).to_sparse_csr(), k, u),
         TypeError, "draft_probs must be a dense tensor"),
        ("sparse_tokens", lambda: sv.verify_greedy(t, torch.from_numpy(k).to_sparse()),
         TypeError, "draft_tokens must be a dense tensor"),
        ("meta_tokens", lambda: sv.verify_greedy(t, torch.empty(K, dtype=torch.int64, device="meta")),
         ValueError, "draft_tokens must be a CPU tensor"),
    ]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support:UserWarning")
@pytest.mark.parametrize("index", range(18))
def test_bad_inputs_raise_the_right_class_naming_the_argument(index):
    _, call, error, fragment = _bad_variants()[index]
    with pytest.raises(error, match=fragment):
        call()


# -- defect 5: error messages are worded from a copy, never by re-reading the caller's memory ---

class _ChangingRows:
    """Rows whose row i reads NaN the first time and clean afterwards (a caller's thread that
    fixes the row between the kernel's read and the message): the message must come from one copy."""

    def __init__(self, rows):
        self.rows, self.reads = rows, 0

    def __getitem__(self, i):
        self.reads += 1
        return self.rows[i]


def test_error_message_is_worded_from_one_copy():
    t, _, _, _ = good()
    rows = _ChangingRows(t)
    with pytest.raises(ValueError, match=r"target_probs\[1\] held an invalid value .* another thread"):
        _inputs.raise_kernel_status("bad_target_values", 1, rows, None)
    assert rows.reads == 1
    bad = t.copy()
    bad[1, 5] = -np.inf
    bad[1, 7] = np.inf
    with pytest.raises(ValueError, match=r"target_probs\[1\] contains inf \(first at column 7\)"):
        _inputs.raise_kernel_status("bad_scores", 1, bad, None)  # greedy: -inf is a valid score


# -- defect 6: the per-thread scratch tensors of drawn uniforms are bounded ---------------------

def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_scratch_cache_stays_bounded_over_4000_distinct_k():
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    target = np.ones((4001, 2), dtype=np.float32)
    tokens = np.zeros(4000, dtype=np.int64)
    sv.accept(target[:2], None, tokens[:1], generator)
    before = _rss_bytes()
    for k in range(1, 4001):
        n, token = sv.accept(target[:k + 1], None, tokens[:k], generator)
        assert 0 <= n <= k and token in (0, 1)
    grown = _rss_bytes() - before
    # (Under AddressSanitizer freed memory sits in its quarantine: RSS says nothing there.)
    under_asan = "libasan" in os.environ.get("LD_PRELOAD", "")
    assert grown < 16 * 2**20 or under_asan, f"RSS grew {grown / 2**20:.1f} MiB over 4000 distinct K"  # was 64
    sizes = _kernels._scratch_sizes()
    assert len(sizes) <= 8 and max(sizes) <= 4096, sizes
    # Draws still equal torch.rand's, through the cache and past it.
    for k in (3, 5000):
        state = generator.get_state()
        u = torch.rand(k + 1, dtype=torch.float64, generator=generator).numpy()
        generator.set_state(state)
        t = np.random.default_rng(k).random((k + 1, 7)).astype(np.float32) + np.float32(0.01)
        toks = np.arange(k) % 7
        assert sv.accept(t, None, toks, generator) == sv.accept_from_uniforms(t, None, toks, u)


# -- the memory a call reads stays owned until its kernel has finished -------------------------

class _ReentrantUniforms:
    """Uniforms whose conversion (``__array__``) first runs a larger accept_logits on the same
    thread, then collects garbage: that nested call replaces the thread's warp scratch."""

    def __init__(self, values, nested):
        self.values, self.nested = values, nested

    def __array__(self, dtype=None, copy=None):
        sv.accept_logits_from_uniforms(*self.nested)
        gc.collect()
        return np.asarray(self.values, dtype=dtype)


def test_warp_scratch_outlives_a_nested_call_that_replaces_it():
    """accept_logits took its thread's scratch rows, then converted its uniforms: a conversion
    running an op on the same thread replaced (and freed) that scratch, and the kernel wrote into
    freed memory (a segfault for scratch this large, which the allocator unmaps).  Now the scratch
    is taken last and held for the call.  Run on a new thread: its scratch starts empty."""
    rng = np.random.default_rng(3)
    k, v = 2, 100_000   # the outer call's scratch: (2K + 1) * V floats = 2 MB
    target = rng.standard_normal((k + 1, v)).astype(np.float32)
    draft = rng.standard_normal((k, v)).astype(np.float32)
    tokens, u = np.array([5, 7]), rng.random(k + 1)
    nested_v = 400_000  # 3 * 400k floats: more than the outer call's scratch
    nested = (rng.standard_normal((2, nested_v)).astype(np.float32),
              rng.standard_normal((1, nested_v)).astype(np.float32), np.array([3]), np.full(2, 0.5))
    want = sv.accept_logits_from_uniforms(target, draft, tokens, u, top_p=0.9)
    got = []
    thread = threading.Thread(target=lambda: got.append(sv.accept_logits_from_uniforms(
        target, draft, tokens, _ReentrantUniforms(u, nested), top_p=0.9)))
    thread.start()
    thread.join()
    assert got == [want]


def test_converted_arguments_live_until_the_kernel_ends():
    """Arguments each op converts into a temporary only the call holds (a float64 tensor's strided
    columns -> a float32 copy, int32 ids -> int64, float32 uniforms -> float64), while another
    thread collects garbage without pause: every result equals the op on plain arrays."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    k, v = 3, 4_000
    target = torch.from_numpy(rng.random((k + 1, 2 * v)) + 0.01)[:, ::2]  # [K+1, V] float64, strided
    draft = torch.from_numpy(rng.random((k + 1, 2 * v)) + 0.01)[:, ::2]
    tokens = torch.tensor([1, 2, 3], dtype=torch.int32)
    u = torch.tensor([0.3, 0.9, 0.1, 0.6], dtype=torch.float32)
    t32, d32 = target.float().numpy(), draft.float().numpy()
    tok64, u64 = tokens.numpy().astype(np.int64), u.numpy().astype(np.float64)
    chain = np.array([-1, 0, 1])
    cases = [
        (lambda: sv.verify_greedy(target, tokens), lambda: sv.verify_greedy(t32, tok64)),
        (lambda: sv.accept_from_uniforms(target, draft[:k], tokens, u),
         lambda: sv.accept_from_uniforms(t32, d32[:k], tok64, u64)),
        (lambda: sv.accept_block_from_uniforms(target, draft[:k], tokens, u),
         lambda: sv.accept_block_from_uniforms(t32, d32[:k], tok64, u64)),
        (lambda: sv.accept_tree_from_uniforms(target, draft, tokens, torch.from_numpy(chain).int(), u),
         lambda: sv.accept_tree_from_uniforms(t32, d32, tok64, chain, u64)),
        (lambda: sv.verify_batch(target, draft[:k], tokens, torch.tensor([0, k], dtype=torch.int32), uniforms=u),
         lambda: sv.verify_batch(t32, d32[:k], tok64, np.array([0, k]), uniforms=u64)),
        (lambda: sv.warp(target, top_p=0.9), lambda: torch.from_numpy(sv.warp(t32, top_p=0.9))),
        (lambda: sv.accept_logits_from_uniforms(target, draft[:k], tokens, u, top_k=50),
         lambda: sv.accept_logits_from_uniforms(t32, d32[:k], tok64, u64, top_k=50)),
    ]
    wants = [plain() for _, plain in cases]
    stop = threading.Event()

    def collect():
        # The youngest generation, where the call's temporaries live: a full collection of a
        # large test process's heap holds the GIL for a long while and the ops just wait for it.
        while not stop.is_set():
            gc.collect(0)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        for trial in range(5):
            for (op, _), want in zip(cases, wants):
                got = op()
                if isinstance(want, torch.Tensor):
                    assert torch.equal(got, want)
                else:
                    assert str(got) == str(want)  # tuples of ints, paths and output arrays
    finally:
        stop.set()
        collector.join()


# -- threads: concurrent calls on shared inputs equal serial calls ------------------------------

def test_threads_on_shared_inputs_equal_serial_results():
    rng = np.random.default_rng(5)
    k, v = 5, 4099
    target = rng.random((k + 1, v)).astype(np.float32)
    draft = rng.random((k, v)).astype(np.float32)
    tokens = rng.integers(0, v, k)
    target[np.arange(k), tokens] *= 50  # mixed accept/reject outcomes
    uniforms = rng.random((64, k + 1))

    parents = np.array([-1, 0, 0, 1, 2])  # a small tree over the same tokens and rows
    tree_draft = np.vstack([draft, draft[:1]])

    def tree(result):
        path, token = result
        return tuple(path.tolist()), token

    def batch(result):
        out, num_accepted = result
        return out.tobytes(), num_accepted.tobytes()

    logits, draft_logits = np.log(target), np.log(draft)

    def run(i):
        u = uniforms[i % len(uniforms)]
        return (sv.accept_from_uniforms(target, draft, tokens, u),
                sv.accept_from_uniforms(target, None, tokens, u),
                sv.verify_greedy(target, tokens),
                sv.accept(target, draft, tokens, np.random.default_rng(i)),
                sv.accept_block_from_uniforms(target, draft, tokens, u),
                tree(sv.verify_tree_greedy(target, tokens, parents)),
                tree(sv.accept_tree_from_uniforms(target, tree_draft, tokens, parents, u, replacement=True)),
                batch(sv.verify_batch(target, draft, tokens, [0, k], method="token", uniforms=u, num_threads=1)),
                sv.accept_logits_from_uniforms(logits, draft_logits, tokens, u, temperature=0.8, top_p=0.9),
                sv.accept_block_logits_from_uniforms(logits, draft_logits, tokens, u, min_p=0.05),
                sv.warp(logits, temperature=0.8, top_k=50).tobytes())

    calls = 400
    serial = [run(i) for i in range(calls)]
    results = [None] * calls
    errors = []

    def worker(start):
        try:
            for i in range(start, calls, 4):
                results[i] = run(i)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert results == serial


def test_threads_drawing_from_torch_generators_equal_serial_results():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    k, v = 4, 1000
    target = rng.random((k + 1, v)).astype(np.float32)
    draft = rng.random((k, v)).astype(np.float32)
    tokens = rng.integers(0, v, k)

    def run(seed, n):
        g = torch.Generator().manual_seed(seed)
        # K varies from call to call, so the per-thread scratch cache is exercised too.
        return [sv.accept(target[:j + 2], draft[:j + 1], tokens[:j + 1], g) for j in (i % k for i in range(n))]

    serial = {s: run(s, 200) for s in range(4)}
    out = {}
    threads = [threading.Thread(target=lambda s=s: out.__setitem__(s, run(s, 200))) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert out == serial


# -- defect 8: SpeculativeDecoder with hostile callbacks ----------------------------------------

def _decoder_callbacks(greedy):
    pytest.importorskip("torch")
    from experiments.law.synthetic import BigramModel, markov_callbacks, random_bigram

    rng = np.random.default_rng(3)
    target, draft = BigramModel(random_bigram(rng, 6, 1.0)), BigramModel(random_bigram(rng, 6, 1.0))
    return markov_callbacks(target, draft, np.random.default_rng(4), greedy=greedy)


def _hostile_drafts():
    torch = pytest.importorskip("torch")
    return [
        ("float_tokens", lambda p, k: ([1.7] * k, None), TypeError, r"draft_step returned unusable tokens \(list .*float64"),
        ("bool_tokens", lambda p, k: (torch.ones(k, dtype=torch.bool), None), TypeError, "torch.bool"),
        ("complex_tokens", lambda p, k: (np.ones(k, np.complex64), None), TypeError, "complex64"),
        ("tokens_2d", lambda p, k: (torch.zeros(1, k, dtype=torch.int64), None), ValueError, r"must be 1-D"),
        ("nested_tokens", lambda p, k: ([[1] * k], None), ValueError, r"must be 1-D"),
        ("string_tokens", lambda p, k: (["a"] * k, None), TypeError, "must hold integer token ids"),
        ("huge_ids", lambda p, k: ([2**63] * k, None), IndexError, "outside the int64 range"),
        ("returns_none", lambda p, k: None, TypeError, r"draft_step must return a pair \(tokens, probs or None\), got NoneType"),
        ("bare_tensor", lambda p, k: torch.zeros(k, dtype=torch.int64), TypeError, r"got Tensor of shape \[\d\]"),
        ("triple", lambda p, k: ([0] * k, None, None), TypeError, "got tuple"),
        ("probs_1d", lambda p, k: ([0] * k, np.ones(6)), ValueError, r"draft_step returned probs of shape \[6\]"),
        ("probs_string", lambda p, k: ([0] * k, "probs"), TypeError, "draft_step returned probs str"),
    ]


@pytest.mark.parametrize("index", range(12))
def test_hostile_draft_callbacks_get_a_clear_error(index):
    torch = pytest.importorskip("torch")
    _, draft_step, error, fragment = _hostile_drafts()[index]
    _, target_step = _decoder_callbacks(greedy=False)
    dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=False, generator=np.random.default_rng(0))
    with pytest.raises(error, match=fragment):
        dec.generate(torch.tensor([1, 2]), max_new=6)


def test_hostile_target_callbacks_get_a_clear_error():
    torch = pytest.importorskip("torch")
    draft_step, _ = _decoder_callbacks(greedy=True)
    for target_step, error, fragment in [
        (lambda p, t: None, TypeError, r"target_step returned target_probs NoneType None, expected \[\d, V\]"),
        (lambda p, t: "rows", TypeError, "target_step returned target_probs str 'rows'"),
        (lambda p, t: [[0.5, 0.5], [0.1]], TypeError, "target_step returned target_probs list"),
        (lambda p, t: torch.ones(6), ValueError, r"target_step returned target_probs of shape \[6\], expected"),
    ]:
        dec = sv.SpeculativeDecoder(draft_step, target_step, k=3, greedy=True)
        with pytest.raises(error, match=fragment):
            dec.generate(torch.tensor([1, 2]), max_new=6)


@pytest.mark.parametrize("greedy", [True, False])
def test_nested_lists_from_callbacks_are_accepted_like_the_ops_accept_them(greedy):
    torch = pytest.importorskip("torch")

    def as_lists(draft_step, target_step):
        def d(prefix, k):
            tokens, probs = draft_step(prefix, k)
            return np.asarray(tokens).tolist(), None if probs is None else np.asarray(probs).tolist()

        return d, lambda prefix, proposed: np.asarray(target_step(prefix, proposed)).tolist()

    outputs = []
    for wrap in (lambda d, t: (d, t), as_lists):
        d, t = wrap(*_decoder_callbacks(greedy))
        dec = sv.SpeculativeDecoder(d, t, k=3, greedy=greedy, generator=np.random.default_rng(9))
        outputs.append(dec.generate(torch.tensor([1, 2]), max_new=20))
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("greedy", [True, False])
def test_callbacks_writing_into_prefix_change_no_output(greedy):
    torch = pytest.importorskip("torch")

    def vandal(step):
        def wrapped(prefix, *args):
            result = step(prefix, *args)
            prefix.fill_(0)  # a callback that scribbles on its argument
            return result

        return wrapped

    outputs = []
    for wrap in (lambda f: f, vandal):
        d, t = _decoder_callbacks(greedy)
        dec = sv.SpeculativeDecoder(wrap(d), wrap(t), k=3, greedy=greedy, generator=np.random.default_rng(9))
        outputs.append(dec.generate(torch.tensor([1, 2, 3]), max_new=20))
    assert torch.equal(outputs[0], outputs[1])


# -- defect 7: bounds-checked builds check the kernels' computed indices -----------------------

def test_bounds_checked_build_aborts_on_a_bad_index():
    """In a bounds-checked build (SPECVERIFY_BUILD=debug/asan or SPECVERIFY_BOUNDSCHECK=1; CI's
    tools/sanitize.sh) SV_CHECK_INDEX is compiled in and aborts with a message; in a release build
    it is nothing."""
    code = "import specverify.kernels._kernels as k; k._check_index(2, 3); k._check_index(-1, 3); print('survived')"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if _kernels.bounds_checked():
        assert result.returncode != 0 and "survived" not in result.stdout
        assert "specverify: index" in result.stderr and "outside [0, 3)" in result.stderr, result.stderr
    else:
        assert result.returncode == 0 and "survived" in result.stdout, result.stderr
