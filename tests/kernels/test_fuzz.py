"""Property-based fuzzing of every op: values, containers, layouts, bad token ids and uniforms.

Every public op has an entry in ``ALL_OPS`` (adding an op is adding an entry): the chain ops
(verify_greedy, accept, accept_block, with and without draft rows, explicit uniforms and both
generator kinds), the tree ops (verify_tree_greedy, accept_tree in its three rules), the logits
ops (warp, accept_logits, accept_block_logits) and verify_batch (one request per method, explicit
uniforms or per-request generators).  For each, hypothesis draws a case (K, V, rows from several
families with NaN of either sign, ±Inf, -0.0, denormals, 3e38, all-zero and all -inf rows
injected; warp settings for the logits ops), then hands every argument to the op in a drawn
container and layout (NumPy C/F order, negative, zero and padded strides, offset and unaligned
views, read-only, float64/float16, nested lists, object arrays, np.matrix; torch tensors:
transposed, offset, unaligned, lazily negated, requires_grad, nn.Parameter, bfloat16; warp's
``out``: new, in place, 1-D).  The oracle is ``specverify.reference`` (``reference_tree``,
``reference_warp``) run on the float32 values the op should read: the op must return exactly the
reference's result (warp: the same bits), or, where a row it reads is invalid, raise a
ValueError naming that argument and row.  A second property corrupts one thing (a token id, a
uniform, a shape, a dtype, one row's values, a warp setting, warp's ``out``, verify_batch's
offsets, methods, draft presence, generators or thread count) and requires the exception class
and a message naming the argument.

Seeded (``derandomize``) and bounded: SPECVERIFY_FUZZ_PROFILE=ci (default: 100 cases per op and
property, about 20 s on one core), ``sanitize`` (the sample tools/sanitize.sh runs) or ``long``;
SPECVERIFY_FUZZ_EXAMPLES overrides the number of cases per test.
"""

import os
import re
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import specverify as sv  # noqa: E402
from specverify import reference  # noqa: E402
from specverify.reference import tree as reference_tree, warp as reference_warp  # noqa: E402

torch = pytest.importorskip("torch")

PROFILES = {"ci": 100, "sanitize": 10, "long": 20000}  # cases per test (2 tests per op)
PROFILE = os.environ.get("SPECVERIFY_FUZZ_PROFILE", "ci")
EXAMPLES = int(os.environ.get("SPECVERIFY_FUZZ_EXAMPLES", PROFILES.get(PROFILE, PROFILES["ci"])))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

VOCABS = [1, 2, 3, 7, 17, 255, 256, 257, 600, 1025, 4099]
NEG_NAN = np.array([0xFFC00000], dtype=np.uint32).view(np.float32)[0]
SPECIALS = [np.float32(np.nan), NEG_NAN, np.float32(np.inf), np.float32(-np.inf), np.float32(-0.0),
            np.float32(0.0), np.float32(1e-45), np.float32(3e-39), np.float32(3e38), np.float32(-1.0)]
INT64_MAX = 2**63 - 1


# -- the values a case holds --------------------------------------------------------------------

def draw_rows(data, rows, v, kind):
    """[rows, v] float32: probabilities ("probs") or greedy scores / logits ("scores"), specials
    injected (NaN, Inf, negative values, whole rows of 0, -inf or denormals)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="row seed"))
    family = data.draw(st.sampled_from(["softmax", "sparse", "wide", "uniform", "huge", "identical", "ties"]))
    if family == "softmax":
        x = np.exp(rng.standard_normal((rows, v)) * 3)
    elif family == "sparse":
        x = rng.random((rows, v)) * (rng.random((rows, v)) < 0.2)
        x[:, rng.integers(0, v)] = 1.0
    elif family == "wide":
        x = 10.0 ** rng.uniform(-40, 38, (rows, v))
    elif family == "uniform":
        x = np.ones((rows, v))
    elif family == "huge":
        x = np.full((rows, v), 3e38) * rng.random((rows, v))
    elif family == "identical":
        x = np.repeat(rng.random((1, v)), rows, axis=0)
    else:
        x = rng.integers(0, 3, (rows, v)).astype(np.float64)
    x = x.astype(np.float32)
    if kind == "scores":
        x = np.where(rng.random((rows, v)) < 0.5, -x, x).astype(np.float32)
    if rows:
        for _ in range(data.draw(st.integers(0, 3), label="specials")):
            r, c = data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, v - 1))
            x[r, c] = data.draw(st.sampled_from(SPECIALS))
        whole = data.draw(st.sampled_from([None, None, None, 0.0, -np.inf, 1e-45]), label="whole row")
        if whole is not None:
            x[data.draw(st.integers(0, rows - 1))] = whole
    return x


def valid_probs(row):
    return bool(np.all(np.isfinite(row)) and np.all(row >= 0) and reference.row_mass(row) > 0.0)


def valid_scores(row):
    return not (np.any(np.isnan(row)) or np.any(np.isposinf(row)) or np.all(np.isneginf(row)))


# -- containers and layouts: each returns (what the op is given, the float32/int64/float64 values
# -- the op should read from it) ------------------------------------------------------------------

def _unaligned(a):
    a = np.ascontiguousarray(a)
    offset = 1 + int(a.nbytes) % 3
    x = np.frombuffer(bytearray(a.nbytes + offset), a.dtype, count=a.size, offset=offset).reshape(a.shape)
    x[...] = a
    return x


def _read_only(a):
    a = a.copy()
    a.setflags(write=False)
    return a


def _offset_view(a):
    buf = np.zeros((a.shape[0] + 1, a.shape[1] + 2), a.dtype)
    buf[1:, 2:] = a
    return buf[1:, 2:]


def _padded(a):
    buf = np.zeros((a.shape[0], a.shape[1] + 3), a.dtype)
    buf[:, :a.shape[1]] = a
    return buf[:, :a.shape[1]]


def _all_equal(a):
    return a.shape[0] > 0 and bool(np.all(a.view(np.uint8).reshape(a.shape[0], -1) == a.view(np.uint8).reshape(a.shape[0], -1)[0]))


def _through(dtype, torch_dtype=None):
    def convert(a):
        if torch_dtype is not None:
            t = torch.from_numpy(a).to(torch_dtype)
            return t, t.float().numpy()
        c = a.astype(dtype)
        return c, c.astype(np.float32)
    return convert


ROW_LAYOUTS = {
    "numpy": lambda a: (a, a),
    "fortran": lambda a: (np.asfortranarray(a), a),
    "negative_row_stride": lambda a: (a[::-1].copy()[::-1], a),
    "negative_col_stride": lambda a: (a[:, ::-1].copy()[:, ::-1], a),
    "zero_row_stride": lambda a: (np.broadcast_to(a[0], a.shape), a) if _all_equal(a) else (a, a),
    "padded": lambda a: (_padded(a), a),
    "offset": lambda a: (_offset_view(a), a),
    "unaligned": lambda a: (_unaligned(a), a),
    "read_only": lambda a: (_read_only(a), a),
    "list": lambda a: (a.tolist(), a) if a.shape[0] else (a, a),
    "matrix": lambda a: (np.asmatrix(a), a),
    "float64": _through(np.float64),
    "float16": _through(np.float16),
    "torch": lambda a: (torch.from_numpy(a), a),
    "torch_transposed": lambda a: (torch.from_numpy(np.asfortranarray(a)), a),
    "torch_offset": lambda a: (torch.from_numpy(_offset_view(a)), a),
    "torch_unaligned": lambda a: (torch.from_numpy(_unaligned(a)), a),
    "torch_neg_view": lambda a: (torch._neg_view(torch.from_numpy(-a)), a),
    "torch_requires_grad": lambda a: (torch.from_numpy(a.copy()).requires_grad_(True), a),
    "torch_parameter": lambda a: (torch.nn.Parameter(torch.from_numpy(a.copy()), requires_grad=False), a),
    "torch_bfloat16": _through(None, torch.bfloat16),
    "torch_float64": lambda a: (torch.from_numpy(a).double(), a),
}

VECTOR_LAYOUTS = {
    "numpy": lambda a: (a, a),
    "negative_stride": lambda a: (a[::-1].copy()[::-1], a),
    "zero_stride": lambda a: (np.broadcast_to(a[:1], a.shape), a) if a.size and np.all(a == a[0]) else (a, a),
    "strided": lambda a: (np.repeat(a, 2)[::2], a),
    "unaligned": lambda a: (_unaligned(a), a),
    "read_only": lambda a: (_read_only(a), a),
    "list": lambda a: (a.tolist(), a),
    "tuple": lambda a: (tuple(a.tolist()), a),
    "torch": lambda a: (torch.from_numpy(a.copy()), a),
    "torch_strided": lambda a: (torch.from_numpy(np.repeat(a, 2))[::2], a),
    "torch_unaligned": lambda a: (torch.from_numpy(_unaligned(a)), a),
    "torch_neg_view": lambda a: (torch._neg_view(torch.from_numpy(-a)), a),
}

TOKEN_LAYOUTS = dict(VECTOR_LAYOUTS, **{
    "int32": lambda a: (a.astype(np.int32), a),
    "uint16": lambda a: (a.astype(np.uint16), a) if np.all((a >= 0) & (a < 2**16)) else (a, a),
    "object": lambda a: (np.array(a.tolist(), dtype=object), a),
    "torch_int32": lambda a: (torch.from_numpy(a.astype(np.int32)), a),
})

UNIFORM_LAYOUTS = dict(VECTOR_LAYOUTS, **{
    "float32": lambda a: (a.astype(np.float32), a.astype(np.float32).astype(np.float64)),
    "torch_float32": lambda a: (torch.from_numpy(a.astype(np.float32)), a.astype(np.float32).astype(np.float64)),
})


def in_layout(data, layouts, value, label):
    name = data.draw(st.sampled_from(sorted(layouts)), label=f"{label} layout")
    return layouts[name](value)


# -- the ops -----------------------------------------------------------------------------------

@dataclass
class Case:
    k: int
    v: int
    target: np.ndarray                 # [K+1, V] float32 (logits for the logits ops and warp)
    draft: Optional[np.ndarray]        # [K, V] float32 ([N+1, V] for trees), or None
    tokens: np.ndarray                 # [K] int64
    uniforms: Optional[np.ndarray]     # [K+1] float64, or None
    parents: Optional[np.ndarray] = None  # tree ops: [N] int64 (N = K nodes), else None
    settings: Optional[dict] = None    # logits ops and warp: temperature, top_k, top_p, min_p


@dataclass
class Op:
    """One op under fuzz.  ``call(args)`` runs the public op on the arguments as given (a dict of
    target_probs, draft_probs, draft_tokens, uniforms, ... in their containers; the keys are the
    same for every op, ``names`` says what the op's messages call the rows); ``expected(case)``
    is ("ok", result) or ("error", exception class, message fragment) from the reference."""
    name: str
    scores: bool              # target rows are greedy scores or logits (negative values allowed)
    draft: bool               # takes draft rows
    uniforms: bool            # takes K + 1 uniforms (explicitly, or from ``generator``)
    call: Callable
    expected: Callable
    kind: str = "chain"       # "chain"; "tree" (parents [N], draft rows [N+1, V]); "batch"
                              # (verify_batch, one request); "logits" (rows are logits); "warp"
    names: tuple = ("target_probs", "draft_probs")
    generator: Optional[Callable] = None  # (seed, n) -> the n uniforms the op's generator draws
    method: Optional[str] = None          # verify_batch's method

    @property
    def tree(self):
        return self.kind == "tree"


def numpy_draws(seed, n):
    return np.random.default_rng(seed).random(n)


def torch_draws(seed, n):
    return torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).numpy()


def row_problem(case, i, scores, check_draft, names=("target_probs", "draft_probs")):
    """The argument an invalid visited row pair i is named by (None if both are valid), in the
    kernels' order: target values, draft values, target mass, draft mass."""
    valid = valid_scores if scores else valid_probs
    t_ok = valid(case.target[i])
    d_ok = not check_draft or valid_probs(case.draft[i])
    if t_ok and d_ok:
        return None
    t_values = not scores and not (np.all(np.isfinite(case.target[i])) and np.all(case.target[i] >= 0))
    d_values = check_draft and not (np.all(np.isfinite(case.draft[i])) and np.all(case.draft[i] >= 0))
    if scores or t_values or (not d_values and not t_ok):
        return names[0]
    return names[1]


def cleaned(case, scores):
    """The case with every invalid row replaced by ones: the path an op takes up to the first
    invalid row it visits is the same, and from there on the op raises."""
    def clean(rows, valid):
        keep = np.array([valid(r) for r in rows], dtype=bool).reshape(-1, 1)
        return np.where(keep, rows, np.float32(1))
    target = clean(case.target, valid_scores if scores else valid_probs)
    draft = None if case.draft is None else clean(case.draft, valid_probs)
    return Case(case.k, case.v, target, draft, case.tokens, case.uniforms, case.parents, case.settings)


def chain_expected(case, run_reference, scores, check_draft, reads_every_row=False):
    """The chain ops visit rows 0..n (n = n_accepted): a visited invalid row is an error naming it;
    unvisited rows are never read.  ``reads_every_row`` (block verification): every row is
    validated, whatever the uniforms."""
    bad = [(i, name) for i in range(case.k + 1)
           for name in [row_problem(case, i, scores, check_draft and i < case.k)] if name]
    n, token = run_reference(cleaned(case, scores))
    if bad and (reads_every_row or bad[0][0] <= n):
        i, name = bad[0]
        return ("error", ValueError, f"{name}[{i}]")
    return ("ok", (n, token))


def _greedy_reference(c):
    return reference.verify_greedy(c.target, c.tokens)


def _accept_reference(c):
    return reference.accept(c.target, c.draft, c.tokens, c.uniforms)


def _block_reference(c):
    return reference.accept_block(c.target, c.draft, c.tokens, c.uniforms)


OPS = [
    Op("verify_greedy", scores=True, draft=False, uniforms=False,
       call=lambda a: sv.verify_greedy(a["target_probs"], a["draft_tokens"]),
       expected=lambda c: chain_expected(c, _greedy_reference, True, False)),
    Op("accept_from_uniforms", scores=False, draft=True, uniforms=True,
       call=lambda a: sv.accept_from_uniforms(a["target_probs"], a["draft_probs"], a["draft_tokens"], a["uniforms"]),
       expected=lambda c: chain_expected(c, _accept_reference, False, True)),
    Op("accept_from_uniforms_point_mass", scores=False, draft=False, uniforms=True,
       call=lambda a: sv.accept_from_uniforms(a["target_probs"], None, a["draft_tokens"], a["uniforms"]),
       expected=lambda c: chain_expected(c, _accept_reference, False, False)),
    Op("accept_block_from_uniforms", scores=False, draft=True, uniforms=True,
       call=lambda a: sv.accept_block_from_uniforms(a["target_probs"], a["draft_probs"], a["draft_tokens"], a["uniforms"]),
       expected=lambda c: chain_expected(c, _block_reference, False, True, reads_every_row=True)),
    Op("accept_block_point_mass", scores=False, draft=False, uniforms=True,
       call=lambda a: sv.accept_block_from_uniforms(a["target_probs"], None, a["draft_tokens"], a["uniforms"]),
       expected=lambda c: chain_expected(c, _block_reference, False, False, reads_every_row=True)),
    # accept with a generator: the uniforms are the generator's next K + 1 draws.
    Op("accept_numpy_generator", scores=False, draft=True, uniforms=True, generator=numpy_draws,
       call=lambda a: sv.accept(a["target_probs"], a["draft_probs"], a["draft_tokens"],
                                np.random.default_rng(a["seed"])),
       expected=lambda c: chain_expected(c, _accept_reference, False, True)),
    Op("accept_torch_generator", scores=False, draft=False, uniforms=True, generator=torch_draws,
       call=lambda a: sv.accept(a["target_probs"], None, a["draft_tokens"], torch.Generator().manual_seed(a["seed"])),
       expected=lambda c: chain_expected(c, _accept_reference, False, False)),
]


def _tree_result(result):
    path, token = result
    return tuple(int(i) for i in path), token


def tree_expected(case, run_reference, scores):
    """Tree ops visit positions from the root along the accepted path (a position's draft row
    only if it has children): the first visited position with an invalid row is named; rows of
    positions never reached are not read.  The path comes from the reference on the cleaned rows
    (the same up to the first invalid visited row), or, when that raises (a without-replacement
    draft row with no mass left for a later sibling of node i), it ends at node i's parent."""
    parents = [int(x) for x in case.parents]
    try:
        path, token = _tree_result(run_reference(cleaned(case, scores)))
        want = ("ok", (path, token))
    except ValueError as error:
        node = int(re.search(r"node (\d+)", str(error)).group(1))
        path, a = [], parents[node]
        while a >= 0:
            path.insert(0, a)
            a = parents[a]
        want = ("error", ValueError, "no mass outside")
    has_children = {p + 1 for p in parents}
    for r in [0] + [i + 1 for i in path]:
        name = row_problem(case, r, scores, case.draft is not None and r in has_children)
        if name:
            return ("error", ValueError, f"{name}[{r}]")
    return want


def _tree_call(op, **options):
    def call(a):
        args = [a["target_probs"]] + ([a["draft_probs"]] if "draft_probs" in a else []) + [a["draft_tokens"], a["parents"]]
        return _tree_result(op(*args, **options))
    return call


OPS += [
    Op("verify_tree_greedy", scores=True, draft=False, uniforms=False, kind="tree",
       call=_tree_call(sv.verify_tree_greedy),
       expected=lambda c: tree_expected(c, lambda c: reference_tree.verify_tree_greedy(c.target, c.tokens, c.parents),
                                         True)),
    Op("accept_tree_deterministic", scores=False, draft=False, uniforms=True, kind="tree",
       call=lambda a: _tree_result(sv.accept_tree_from_uniforms(a["target_probs"], None, a["draft_tokens"], a["parents"],
                                                                a["uniforms"])),
       expected=lambda c: tree_expected(c, lambda c: reference_tree.accept_tree(c.target, None, c.tokens, c.parents,
                                                                                c.uniforms), False)),
    Op("accept_tree_numpy_generator", scores=False, draft=True, uniforms=True, kind="tree", generator=numpy_draws,
       call=lambda a: _tree_result(sv.accept_tree(a["target_probs"], a["draft_probs"], a["draft_tokens"], a["parents"],
                                                  np.random.default_rng(a["seed"]))),
       expected=lambda c: tree_expected(c, lambda c: reference_tree.accept_tree(c.target, c.draft, c.tokens, c.parents,
                                                                                c.uniforms), False)),
] + [
    Op(f"accept_tree_{'with' if replacement else 'without'}_replacement", scores=False, draft=True, uniforms=True,
       kind="tree",
       call=lambda a, r=replacement: _tree_result(sv.accept_tree_from_uniforms(
           a["target_probs"], a["draft_probs"], a["draft_tokens"], a["parents"], a["uniforms"], replacement=r)),
       expected=lambda c, r=replacement: tree_expected(c, lambda c: reference_tree.accept_tree(
           c.target, c.draft, c.tokens, c.parents, c.uniforms, replacement=r), False))
    for replacement in (False, True)
]


# -- logits warping: warp itself, and verification straight from logits -------------------------

def warp_expected(case):
    """warp validates every row (the first invalid one is named) and returns the reference's bits."""
    bad = [i for i in range(case.k + 1) if not valid_scores(case.target[i])]
    if bad:
        return ("error", ValueError, f"logits[{bad[0]}]")
    return ("ok", reference_warp.warp(case.target, **case.settings).tobytes())


def _warp_out(spec, logits):
    """The ``out`` a warp call gets: None, a new array or tensor, or the logits themselves (in
    place) when they are writable float32 C-contiguous memory."""
    if spec is None:
        return None
    shape = tuple(np.shape(logits))
    if spec == "numpy":
        return np.empty(shape, np.float32)
    if spec == "torch":
        return torch.empty(shape, dtype=torch.float32)
    if type(logits) is np.ndarray and logits.dtype == np.float32 and logits.flags.c_contiguous \
            and logits.flags.aligned and logits.flags.writeable:
        return logits
    if type(logits) is torch.Tensor and logits.dtype == torch.float32 and logits.is_contiguous() \
            and not logits.requires_grad and not logits.is_neg() and logits.data_ptr() % 4 == 0:
        return logits
    return None


def _warp_call(a):
    logits = a["target_probs"][0] if a["one_row"] else a["target_probs"]
    out = a["out"] if not isinstance(a["out"], (str, type(None))) else _warp_out(a["out"], logits)
    result = sv.warp(logits, out=out, **a["settings"])
    assert out is None or result is out, "warp must return the out it was given"
    assert tuple(result.shape) == tuple(np.shape(logits)), (result.shape, np.shape(logits))
    values = result.numpy() if isinstance(result, torch.Tensor) else np.asarray(result)
    return np.ascontiguousarray(values, dtype=np.float32).tobytes()


def logits_expected(case, run_reference):
    """The logits ops warp every target row, then every draft row (the first invalid one is
    named), then verify the warped rows: the reference on ``reference_warp.warp``'s rows."""
    names = ("target_logits", "draft_logits")
    for rows, name in zip((case.target, case.draft), names):
        bad = [] if rows is None else [i for i in range(len(rows)) if not valid_scores(rows[i])]
        if bad:
            return ("error", ValueError, f"{name}[{bad[0]}]")
    target = reference_warp.warp(case.target, **case.settings)
    draft = None if case.draft is None else reference_warp.warp(case.draft, **case.settings).reshape(case.k, case.v)
    return ("ok", run_reference(Case(case.k, case.v, target, draft, case.tokens, case.uniforms)))


def _logits_call(op, explicit_uniforms, with_draft, generator=None):
    def call(a):
        randomness = a["uniforms"] if explicit_uniforms else generator(a["seed"])
        return op(a["target_probs"], a["draft_probs"] if with_draft else None, a["draft_tokens"], randomness,
                  **a["settings"])
    return call


LOGITS = ("target_logits", "draft_logits")
WARP_OPS = [
    Op("warp", scores=True, draft=False, uniforms=False, kind="warp", names=("logits", None), call=_warp_call,
       expected=warp_expected),
    Op("accept_logits_from_uniforms", scores=True, draft=True, uniforms=True, kind="logits", names=LOGITS,
       call=_logits_call(sv.accept_logits_from_uniforms, True, True),
       expected=lambda c: logits_expected(c, _accept_reference)),
    Op("accept_logits_point_mass", scores=True, draft=False, uniforms=True, kind="logits", names=LOGITS,
       call=_logits_call(sv.accept_logits_from_uniforms, True, False),
       expected=lambda c: logits_expected(c, _accept_reference)),
    Op("accept_logits_torch_generator", scores=True, draft=True, uniforms=True, kind="logits", names=LOGITS,
       generator=torch_draws,
       call=_logits_call(sv.accept_logits, False, True, lambda seed: torch.Generator().manual_seed(seed)),
       expected=lambda c: logits_expected(c, _accept_reference)),
    Op("accept_block_logits_from_uniforms", scores=True, draft=True, uniforms=True, kind="logits", names=LOGITS,
       call=_logits_call(sv.accept_block_logits_from_uniforms, True, True),
       expected=lambda c: logits_expected(c, _block_reference)),
    Op("accept_block_logits_numpy_generator", scores=True, draft=False, uniforms=True, kind="logits", names=LOGITS,
       generator=numpy_draws, call=_logits_call(sv.accept_block_logits, False, False, np.random.default_rng),
       expected=lambda c: logits_expected(c, _block_reference)),
]


# -- verify_batch with one request equals its single op -----------------------------------------

def _batch_call(with_draft):
    """The op as one request of ``verify_batch``: ``(num_accepted, its next token)``."""
    def call(a):
        out, num_accepted = sv.verify_batch(
            a["target_probs"], a["draft_probs"] if with_draft else None, a["draft_tokens"],
            a["cu_num_draft_tokens"], method=a["method"], has_draft_probs=a.get("has_draft_probs"),
            uniforms=a.get("uniforms"), generators=a.get("generators"), num_threads=a.get("num_threads"))
        n = int(num_accepted[0])
        return n, int(out[0, n])
    return call


BATCH_OPS = [
    Op("verify_batch_greedy", scores=True, draft=False, uniforms=False, kind="batch", method="greedy",
       call=_batch_call(False), expected=lambda c: chain_expected(c, _greedy_reference, True, False)),
    Op("verify_batch_token", scores=False, draft=True, uniforms=True, kind="batch", method="token",
       call=_batch_call(True), expected=lambda c: chain_expected(c, _accept_reference, False, True)),
    Op("verify_batch_block_point_mass", scores=False, draft=False, uniforms=True, kind="batch", method="block",
       call=_batch_call(False),
       expected=lambda c: chain_expected(c, _block_reference, False, False, reads_every_row=True)),
    Op("verify_batch_token_generators", scores=False, draft=True, uniforms=True, kind="batch", method="token",
       generator=numpy_draws, call=_batch_call(True),
       expected=lambda c: chain_expected(c, _accept_reference, False, True)),
]
ALL_OPS = OPS + WARP_OPS + BATCH_OPS


def draw_tree(rng, target, n, v):
    """parents [N] (topological) and tokens [N], distinct among siblings, mostly the argmax of
    their parent position's row (so paths go deep)."""
    parents = np.array([rng.integers(-1, i) if i else -1 for i in range(n)], dtype=np.int64)
    tokens = np.zeros(n, dtype=np.int64)
    used = {}
    for i in range(n):
        siblings = used.setdefault(int(parents[i]), set())
        best = int(np.argmax(target[parents[i] + 1]))
        t = best if best not in siblings and rng.random() < 0.7 else int(rng.choice(sorted(set(range(v)) - siblings)))
        siblings.add(t)
        tokens[i] = t
    return parents, tokens


def draw_settings(data):
    """Warp settings: each cut off or on at a drawn strength (top_k may exceed V)."""
    return dict(temperature=data.draw(st.sampled_from([1.0, 0.7, 1.8, 1e-3, 1e4]), label="temperature"),
                top_k=data.draw(st.sampled_from([0, 0, 1, 2, 5, 300]), label="top_k"),
                top_p=data.draw(st.sampled_from([1.0, 1.0, 0.9, 0.5, 1e-9]), label="top_p"),
                min_p=data.draw(st.sampled_from([0.0, 0.0, 0.05, 0.5, 1.0]), label="min_p"))


def draw_case(data, op):
    k = data.draw(st.integers(0, 6), label="K")
    v = data.draw(st.sampled_from([x for x in VOCABS if x > k] if op.tree else VOCABS), label="V")
    target = draw_rows(data, k + 1, v, "scores" if op.scores else "probs")
    draft = draw_rows(data, k + 1 if op.tree else k, v, "scores" if op.kind == "logits" else "probs") \
        if op.draft else None
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="token seed"))
    parents = None
    if op.tree:
        parents, tokens = draw_tree(rng, target, k, v)
    # Tokens mostly agree with the target (argmax) so later rows get visited too.
    with np.errstate(invalid="ignore"):
        best = np.nanargmax(np.where(np.isnan(target[:k]), -np.inf, target[:k]), axis=1) if k else np.zeros(0, np.int64)
    if not op.tree:
        tokens = np.where(rng.random(k) < 0.7, best, rng.integers(0, v, k)).astype(np.int64)
    uniforms, seed = None, None
    if op.generator is not None:
        seed = data.draw(st.integers(0, 2**32 - 1), label="generator seed")
        uniforms = op.generator(seed, k + 1)
    elif op.uniforms:
        uniforms = np.array(data.draw(st.lists(
            st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 1.0 - 2.0**-53, 0.5])),
            min_size=k + 1, max_size=k + 1), label="uniforms"), dtype=np.float64)
    settings = draw_settings(data) if op.kind in ("logits", "warp") else None
    return Case(k, v, target, draft, tokens, uniforms, parents, settings), seed


def batch_method(data, name):
    """verify_batch's method for one request, in a drawn form: a name, a list of names, codes."""
    code = sv.BATCH_METHODS.index(name)
    forms = [name, [name], (name,), np.array([code], np.int64), np.array([code], np.uint8),
             torch.tensor([code])]
    return forms[data.draw(st.integers(0, len(forms) - 1), label="method form")]


def arguments_in_layouts(data, op, case, seed):
    """The op's arguments in drawn containers, and the case of the values it should read."""
    target, t_values = in_layout(data, ROW_LAYOUTS, case.target, "target_probs")
    args = {"target_probs": target, "seed": seed, "settings": case.settings}
    d_values = None
    if op.draft:
        args["draft_probs"], d_values = in_layout(data, ROW_LAYOUTS, case.draft, "draft_probs")
    args["draft_tokens"], tok_values = in_layout(data, TOKEN_LAYOUTS, case.tokens, "draft_tokens")
    u_values = case.uniforms
    if op.uniforms and op.generator is None:
        args["uniforms"], u_values = in_layout(data, UNIFORM_LAYOUTS, case.uniforms, "uniforms")
    p_values = None
    if op.tree:
        args["parents"], p_values = in_layout(data, TOKEN_LAYOUTS, case.parents, "parents")
    if op.kind == "batch":
        args["cu_num_draft_tokens"], _ = in_layout(data, TOKEN_LAYOUTS, np.array([0, case.k], np.int64),
                                                   "cu_num_draft_tokens")
        args["method"] = batch_method(data, op.method)
        if op.generator is not None:
            args["generators"] = [np.random.default_rng(seed)]
    if op.kind == "warp":
        # (in place overwrites the container's memory: the expected values are taken first)
        args["out"] = data.draw(st.sampled_from([None, "numpy", "torch", "in place"]), label="out")
        args["one_row"] = case.k == 0 and not isinstance(target, np.matrix) and data.draw(st.booleans(), label="1-D")
    return args, Case(case.k, case.v, t_values, d_values, tok_values, u_values, p_values, case.settings)


def outcome(call, args):
    try:
        return ("ok", call(args))
    except (TypeError, ValueError, IndexError) as error:
        return ("error", type(error), str(error))


def assert_matches(got, want):
    if want[0] == "ok":
        assert got == want, f"got {got}, expected {want}"
        if isinstance(got[1], tuple):  # (n or path, next token): Python ints
            n_or_path, token = got[1]
            assert type(token) is int and all(type(i) is int for i in (n_or_path if isinstance(n_or_path, tuple) else [n_or_path]))
    else:
        assert got[0] == "error" and got[1] is want[1] and want[2] in got[2], f"got {got}, expected {want}"


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.name)
@FUZZ
@given(data=st.data())
def test_any_values_in_any_layout_match_the_reference_or_name_the_bad_row(op, data):
    case, seed = draw_case(data, op)
    args, values = arguments_in_layouts(data, op, case, seed)
    if values.uniforms is not None and not np.all((values.uniforms >= 0) & (values.uniforms < 1)):
        want = ("error", ValueError, "uniforms must lie in [0, 1)")  # a float32 uniform rounded to 1.0
    else:
        want = op.expected(values)
    assert_matches(outcome(op.call, args), want)


# -- one thing corrupted: the error class and the argument it names ----------------------------

def _replaced(values, j, bad, as_list=False):
    def build():
        x = values.tolist() if as_list else values.copy()
        x[j] = bad
        return x
    return build


def _row_set(rows, j, bad):
    """rows with one entry of row j set to bad (NaN, inf, a negative value), or the whole row
    (bad = -inf for scores, 0.0 for probabilities)."""
    def build():
        x = rows.copy()
        if bad in (-np.inf, 0.0):
            x[j] = bad
        else:
            x[j, x.shape[1] // 2] = bad
        return x
    return build


def row_corruptions(name, rows, count, scores):
    """Invalid values in rows 0..count-1 of the argument ``name`` ("target_probs" or
    "draft_probs"): (label, argument, replacement, class, fragment naming the row).  Probability
    rows: NaN, inf, a negative value, zero mass; scores and logits: NaN, +inf, -inf everywhere."""
    bad_values = [np.nan, np.inf, -np.inf] if scores else [np.nan, np.inf, -1.0, 0.0]
    return [(f"{name}_{j}_{bad}", name, _row_set(rows, j, bad), ValueError, f"{name}[{j}]")
            for j in range(count) for bad in bad_values]


def settings_corruptions(settings):
    bad = [("temperature", 0.0, ValueError), ("temperature", np.nan, ValueError), ("temperature", -1.0, ValueError),
           ("temperature", "1", TypeError), ("temperature", True, TypeError), ("top_k", -1, ValueError),
           ("top_k", 1.5, TypeError), ("top_k", True, TypeError), ("top_p", 0.0, ValueError),
           ("top_p", 1.5, ValueError), ("top_p", np.nan, ValueError), ("min_p", -0.1, ValueError),
           ("min_p", 1.5, ValueError), ("min_p", np.nan, ValueError)]
    return [(f"{key}_{value}", "settings", {**settings, key: value}, error, f"{key} must")
            for key, value, error in bad]


def warp_corruptions(case):
    k, v, t = case.k, case.v, case.target
    out_torch = lambda **kw: torch.empty(t.shape, **kw)
    out = [
        ("logits_int", "target_probs", lambda: t.astype(np.int64), TypeError, "logits must hold floating-point"),
        ("logits_complex", "target_probs", lambda: t.astype(np.complex64), TypeError, "logits must hold floating-point"),
        ("logits_datetime", "target_probs", lambda: np.zeros(t.shape, "datetime64[s]"), TypeError, "logits"),
        ("logits_masked", "target_probs", lambda: np.ma.masked_array(t), TypeError, "logits is a numpy masked array"),
        ("logits_sparse", "target_probs", lambda: torch.from_numpy(t).to_sparse(), TypeError, "logits must be a dense"),
        ("logits_meta", "target_probs", lambda: torch.empty(t.shape, device="meta"), ValueError, "logits must be a CPU tensor"),
        ("logits_3d", "target_probs", t[None], ValueError, "logits must be 2-D"),
        ("logits_0d", "target_probs", np.float32(1.0), ValueError, "logits must be 2-D"),
        ("logits_no_vocab", "target_probs", np.zeros((k + 1, 0), np.float32), ValueError, "logits has an empty vocabulary"),
        ("out_shape", "out", lambda: np.empty((k + 2, v), np.float32), ValueError, "out must have shape"),
        ("out_float64", "out", lambda: np.empty(t.shape), TypeError, "out must be a float32"),
        ("out_list", "out", lambda: t.tolist(), TypeError, "out must be a float32"),
        ("out_read_only", "out", lambda: _read_only(np.empty(t.shape, np.float32)), ValueError, "out must be C-contiguous"),
        ("out_strided", "out", lambda: np.empty((k + 1, 2 * v), np.float32)[:, ::2], ValueError, "out must be C-contiguous"),
        ("out_unaligned", "out", lambda: _unaligned(np.empty(t.shape, np.float32)), ValueError, "out must be C-contiguous"),
        ("out_torch_float64", "out", lambda: out_torch(dtype=torch.float64), TypeError, "out must be a CPU float32 tensor"),
        ("out_torch_meta", "out", lambda: out_torch(device="meta"), TypeError, "out must be a CPU float32 tensor"),
        ("out_torch_grad", "out", lambda: out_torch(requires_grad=True), ValueError, "out must not require grad"),
        ("out_torch_neg", "out", lambda: torch._neg_view(out_torch()), ValueError, "out must not be a negated view"),
        ("out_torch_sparse", "out", lambda: out_torch().to_sparse(), TypeError, "out must be a dense"),
    ]
    def overlapping(args):  # out shifted one element against the logits in one buffer
        buf = np.zeros(t.size + 1, np.float32)
        buf[:-1] = t.reshape(-1)
        args.update(target_probs=buf[:-1].reshape(t.shape), out=buf[1:].reshape(t.shape), one_row=False)
    if t.size > 1:
        out.append(("out_overlaps", None, overlapping, ValueError, "out overlaps logits"))
    return out + row_corruptions("target_probs", t, k + 1, True) + settings_corruptions(case.settings)


def batch_corruptions(op, case):
    k = case.k
    code = sv.BATCH_METHODS.index(op.method)
    out = [
        ("cu_start", "cu_num_draft_tokens", np.array([1, k]), ValueError, "cu_num_draft_tokens must start at 0"),
        ("cu_decreasing", "cu_num_draft_tokens", np.array([0, k + 1, k]), ValueError, "must be non-decreasing"),
        ("cu_end", "cu_num_draft_tokens", np.array([0, k + 1]), ValueError, f"but draft_tokens holds {k} tokens"),
        ("cu_empty", "cu_num_draft_tokens", np.zeros(0, np.int64), ValueError, "R + 1 offsets"),
        ("cu_float", "cu_num_draft_tokens", np.array([0.0, k]), TypeError, "cu_num_draft_tokens must hold integer"),
        ("cu_2d", "cu_num_draft_tokens", np.array([[0, k]]), ValueError, "cu_num_draft_tokens must be 1-D"),
        ("cu_huge", "cu_num_draft_tokens", np.array([0, 2**40]), ValueError, "but draft_tokens holds"),
        ("method_name", "method", "typical", ValueError, "method must be one of"),
        ("method_names", "method", ["typical"], ValueError, "method[0] = 'typical'"),
        ("method_count", "method", [op.method] * 2, ValueError, "one entry per request (R = 1)"),
        ("method_code", "method", np.array([7]), ValueError, "method[0] = 7"),
        ("method_code_negative", "method", np.array([-1]), ValueError, "method[0] = -1"),
        ("method_code_count", "method", np.array([code, code]), ValueError, "one entry per request (R = 1)"),
        ("threads_zero", "num_threads", 0, ValueError, "num_threads"),
        ("threads_float", "num_threads", 1.5, ValueError, "num_threads"),
    ]
    if op.method != "greedy":
        out += [("presence_count", "has_draft_probs", [True, True], ValueError, "has_draft_probs must have one entry"),
                ("presence_dtype", "has_draft_probs", [1], TypeError, "has_draft_probs must hold booleans")]
        if not op.draft:
            out.append(("presence_without_rows", "has_draft_probs", [True], ValueError,
                        "has_draft_probs[0] is True but draft_probs is None"))
    if op.generator is not None:
        rng = np.random.default_rng(0)
        out += [("generators_count", "generators", [rng, rng], ValueError, "one generator per request (R = 1), got 2"),
                ("generators_not_a_list", "generators", rng, ValueError, "one generator per request"),
                ("generators_type", "generators", ["seed"], TypeError, "generators[0]")]
    return out


def corruptions(op, case):
    """(label, argument, replacement, exception class, message fragment) for this case; a
    replacement may be a callable that builds it (only the drawn one is built), and an argument
    None means the callable changes several arguments itself."""
    t_name, d_name = op.names
    out = warp_corruptions(case) if op.kind == "warp" else chain_corruptions(op, case)
    return [(label, name, bad, error, fragment.replace("target_probs[", f"{t_name}[").replace("draft_probs[", f"{d_name}["))
            for label, name, bad, error, fragment in out]


def chain_corruptions(op, case):
    """The corruptions of every op but warp (chain, tree, batch and logits ops)."""
    k, v = case.k, case.v
    t = case.target
    t_name, d_name = op.names
    rows = (f"{t_name} has {k} rows but cu_num_draft_tokens implies" if op.kind == "batch"
            else f"{t_name} must have {k + 1} rows")
    out = [
        ("target_rows", "target_probs", t[:k], ValueError, rows),
        ("target_1d", "target_probs", t[0], ValueError, f"{t_name} must be 2-D"),
        ("target_int", "target_probs", lambda: t.astype(np.int64), TypeError, f"{t_name} must hold floating-point"),
        ("target_datetime", "target_probs", lambda: np.zeros(t.shape, "datetime64[s]"), TypeError, t_name),
        ("target_masked", "target_probs", lambda: np.ma.masked_array(t), TypeError, f"{t_name} is a numpy masked array"),
        ("target_sparse", "target_probs", lambda: torch.from_numpy(t).to_sparse(), TypeError, f"{t_name} must be a dense"),
        ("target_meta", "target_probs", lambda: torch.empty(t.shape, device="meta"), ValueError, f"{t_name} must be a CPU tensor"),
        ("tokens_2d", "draft_tokens", case.tokens[None], ValueError, "draft_tokens must be 1-D"),
    ]
    if k:  # (no tokens is no tokens, whatever the dtype: np.asarray([]) is float64)
        out += [("tokens_float", "draft_tokens", lambda: case.tokens.astype(np.float64), TypeError, "draft_tokens must hold integer"),
                ("tokens_bool", "draft_tokens", lambda: torch.from_numpy(case.tokens > 0), TypeError, "draft_tokens must hold integer")]
    for j in range(k):
        for bad in (-1, v, v + 5000, 2**40, -(2**62), INT64_MAX):
            out.append((f"token_{j}_{bad}", "draft_tokens", _replaced(case.tokens, j, bad), IndexError,
                        f"draft_tokens[{j}] = {bad} "))
        out.append((f"token_{j}_beyond_int64", "draft_tokens", _replaced(case.tokens, j, 2**64 + 3, True), IndexError,
                    f"draft_tokens[{j}] = {2**64 + 3} is outside"))
    if op.tree:
        out.append(("parents_length", "parents", case.parents[:-1] if k else np.zeros(1, np.int64), ValueError,
                    "parents must have one entry per draft token"))
        out.append(("parents_float", "parents", lambda: case.parents.astype(np.float64), TypeError,
                    "parents must hold integer") if k else ("parents_2d", "parents", case.parents[None], ValueError,
                                                           "parents must be 1-D"))
        for j in range(k):
            for bad in (j, -2, 2**40):
                out.append((f"parent_{j}_{bad}", "parents", _replaced(case.parents, j, bad), ValueError,
                            f"parents[{j}] = {bad}: a node's parent must be -1"))
    if op.draft and k:
        out.append(("draft_cols", "draft_probs", case.draft[:, :v - 1], ValueError, d_name))
        out.append(("draft_complex", "draft_probs", lambda: case.draft.astype(np.complex64), TypeError,
                    f"{d_name} must hold floating-point"))
    if op.uniforms and op.generator is None:
        for j in range(k + 1):
            for bad in (np.nan, 1.0, -1e-300, np.inf, 7.0):
                out.append((f"uniform_{j}_{bad}", "uniforms", _replaced(case.uniforms, j, bad), ValueError,
                            "uniforms must lie in [0, 1)"))
        out.append(("uniforms_short", "uniforms", case.uniforms[:k], ValueError, f"uniforms must have shape [{k + 1}]"))
        out.append(("uniforms_int", "uniforms", lambda: np.zeros(k + 1, np.int64), TypeError, "uniforms must be floating point"))
        out.append(("uniforms_timedelta", "uniforms", lambda: np.zeros(k + 1, "timedelta64[s]"), TypeError,
                    "uniforms must be floating point"))
    if op.kind == "batch":
        out += batch_corruptions(op, case)
    if op.kind == "logits":  # every row is warped, so every row is validated
        out += row_corruptions("target_probs", t, k + 1, True) + settings_corruptions(case.settings)
        if op.draft:
            out += row_corruptions("draft_probs", case.draft, k, True)
    else:  # the first position's rows are always read (its draft row when it has a draft token)
        out += row_corruptions("target_probs", t, 1, op.scores)
        if op.draft and k:
            out += row_corruptions("draft_probs", case.draft, 1, False)
    return out


def valid_rows(x, scores):
    """x with every row made valid, in every container (float16 too: magnitudes below 6e4):
    logits/scores keep negative values and -inf (a row keeps at least one finite entry);
    probabilities become positive."""
    if scores:
        x = np.where(np.isnan(x) | np.isposinf(x), np.float32(1), np.clip(x, -6e4, 6e4)).astype(np.float32)
        x[np.all(np.isneginf(x), axis=1), 0] = 0.0
        return x
    return np.minimum(np.abs(np.nan_to_num(x, nan=1.0, posinf=1.0, neginf=1.0)), np.float32(6e4)) + np.float32(0.5)


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.name)
@FUZZ
@given(data=st.data())
def test_one_corrupted_argument_raises_naming_it(op, data):
    case, seed = draw_case(data, op)
    # Valid values throughout, so the corruption is the only thing wrong.
    case.target = valid_rows(case.target, op.scores)
    if case.draft is not None:
        case.draft = valid_rows(case.draft, op.kind == "logits")
    if case.uniforms is not None and op.generator is None:
        case.uniforms = np.minimum(case.uniforms, 0.75)  # (float32 would round 1 - 2**-53 to 1.0)
    label, name, bad, error, fragment = data.draw(st.sampled_from(corruptions(op, case)), label="corruption")
    args, _ = arguments_in_layouts(data, op, case, seed)
    if name is None:
        bad(args)
    else:
        args[name] = bad() if callable(bad) else bad
    if name == "target_probs" and op.kind == "warp":
        args["one_row"] = False  # the corrupted logits as they are (not their first row)
    got = outcome(op.call, args)
    assert got[0] == "error" and got[1] is error and fragment in got[2], (label, got)
