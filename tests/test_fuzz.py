"""Property-based fuzzing of every op: values, containers, layouts, bad token ids and uniforms.

For each op in ``OPS`` (one entry per op: adding an op is adding an entry), hypothesis draws a case
(K, V, rows from several families with NaN of either sign, ±Inf, -0.0, denormals, 3e38, all-zero
and all -inf rows injected), then hands every argument to the op in a drawn container and layout
(NumPy C/F order, negative, zero and padded strides, offset and unaligned views, read-only,
float64/float16, nested lists, object arrays, np.matrix; torch tensors: transposed, offset,
unaligned, lazily negated, requires_grad, nn.Parameter, bfloat16).  The oracle is
``specverify.reference`` run on the float32 values the op should read: the op must return exactly
the reference's result, or, where a row it reads is invalid, raise a ValueError naming that
argument and row.  A second property corrupts one thing (a token id, a uniform, a shape, a dtype)
and requires the exception class and a message naming the argument.

Seeded (``derandomize``) and bounded: SPECVERIFY_FUZZ_PROFILE=ci (default, about a minute),
``sanitize`` (the sample tools/sanitize.sh runs) or ``long``; SPECVERIFY_FUZZ_EXAMPLES overrides
the number of cases per test.
"""

import os
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import specverify as sv  # noqa: E402
from specverify import reference, reference_tree  # noqa: E402

torch = pytest.importorskip("torch")

PROFILES = {"ci": 200, "sanitize": 20, "long": 20000}  # cases per test (2 tests per op)
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

def draw_rows(data, rows, v, kind, specials=True):
    """[rows, v] float32: probabilities ("probs") or greedy scores ("scores"), specials injected
    (unless ``specials`` is False: then every row is valid)."""
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
    if not specials:
        return x if kind == "scores" else x + np.float32(1e-3)
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
    target: np.ndarray                 # [K+1, V] float32
    draft: Optional[np.ndarray]        # [K, V] float32, or None
    tokens: np.ndarray                 # [K] int64
    uniforms: Optional[np.ndarray]     # [K+1] float64, or None
    parents: Optional[np.ndarray] = None  # tree ops: [N] int64 (N = K nodes), else None


@dataclass
class Op:
    """One op under fuzz.  ``call(args)`` runs the public op on the arguments as given (a dict of
    target_probs, draft_probs, draft_tokens, uniforms in their containers); ``expected(case)`` is
    ("ok", result) or ("error", exception class, message fragment) from the reference."""
    name: str
    scores: bool              # rows are greedy scores (negative values allowed) rather than probabilities
    draft: bool               # takes draft_probs
    uniforms: bool            # takes explicit uniforms
    call: Callable
    expected: Callable
    tree: bool = False        # a draft tree (parents [N], draft rows [N+1, V]) instead of a chain
    specials: bool = True     # rows may hold invalid values (the oracle knows which rows are read)


def chain_expected(case, run_reference, scores, check_draft, reads_every_row=False):
    """The chain ops visit rows 0..n (n = n_accepted): a visited invalid row is an error naming it;
    unvisited rows are never read.  Rows are cleaned (invalid ones replaced by ones) to find n.
    ``reads_every_row`` (block verification): every row is validated, whatever the uniforms."""
    valid = valid_scores if scores else valid_probs

    def problem(i):
        t_ok = valid(case.target[i])
        d_ok = not check_draft or i >= case.k or valid_probs(case.draft[i])
        if t_ok and d_ok:
            return None
        t_values = not scores and not (np.all(np.isfinite(case.target[i])) and np.all(case.target[i] >= 0))
        d_values = (check_draft and i < case.k
                    and not (np.all(np.isfinite(case.draft[i])) and np.all(case.draft[i] >= 0)))
        # The kernels' order: target values, draft values, target mass, draft mass.
        if scores or t_values or (not d_values and not t_ok):
            return "target_probs"
        return "draft_probs"

    bad = [(i, problem(i)) for i in range(case.k + 1) if problem(i)]
    target = case.target.copy()
    draft = None if case.draft is None else case.draft.copy()
    for i, _ in bad:
        target[i] = 1.0
        if draft is not None and i < case.k:
            draft[i] = 1.0
    n, token = run_reference(Case(case.k, case.v, target, draft, case.tokens, case.uniforms))
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
    Op("accept_numpy_generator", scores=False, draft=True, uniforms=True,
       call=lambda a: sv.accept(a["target_probs"], a["draft_probs"], a["draft_tokens"],
                                np.random.default_rng(a["seed"])),
       expected=lambda c: chain_expected(c, _accept_reference, False, True)),
    Op("accept_torch_generator", scores=False, draft=False, uniforms=True,
       call=lambda a: sv.accept(a["target_probs"], None, a["draft_tokens"], torch.Generator().manual_seed(a["seed"])),
       expected=lambda c: chain_expected(c, _accept_reference, False, False)),
]


def _tree_result(result):
    path, token = result
    return tuple(int(i) for i in path), token


def tree_expected(case, run_reference, scores):
    """Tree ops: the reference's result, or its ValueError (a without-replacement draft row with no
    mass left for a later sibling).  Rows are valid as drawn, but a lossy container (float16,
    bfloat16) can overflow them: then either an error naming one of those rows or the reference's
    result on the rows with the invalid ones replaced (they were not read) is right."""
    valid = valid_scores if scores else valid_probs
    bad = [f"target_probs[{r}]" for r in range(case.k + 1) if not valid(case.target[r])]
    bad += [f"draft_probs[{r}]" for r in range(case.k + 1) if case.draft is not None and not valid_probs(case.draft[r])]
    if bad:
        case = Case(case.k, case.v, np.where([[valid(r)] for r in case.target], case.target, np.float32(1)),
                    None if case.draft is None else np.where([[valid_probs(r)] for r in case.draft], case.draft,
                                                             np.float32(1)),
                    case.tokens, case.uniforms, case.parents)
    try:
        want = ("ok", _tree_result(run_reference(case)))
    except ValueError as error:
        assert "no mass outside" in str(error), error
        want = ("error", ValueError, "no mass outside")
    return ("either", want, bad) if bad else want


def _tree_call(op, **options):
    def call(a):
        args = [a["target_probs"]] + ([a["draft_probs"]] if "draft_probs" in a else []) + [a["draft_tokens"], a["parents"]]
        return _tree_result(op(*args, **options))
    return call


OPS += [
    Op("verify_tree_greedy", scores=True, draft=False, uniforms=False, tree=True, specials=False,
       call=_tree_call(sv.verify_tree_greedy),
       expected=lambda c: tree_expected(c, lambda c: reference_tree.verify_tree_greedy(c.target, c.tokens, c.parents),
                                         True)),
    Op("accept_tree_deterministic", scores=False, draft=False, uniforms=True, tree=True, specials=False,
       call=lambda a: _tree_result(sv.accept_tree_from_uniforms(a["target_probs"], None, a["draft_tokens"], a["parents"],
                                                                a["uniforms"])),
       expected=lambda c: tree_expected(c, lambda c: reference_tree.accept_tree(c.target, None, c.tokens, c.parents,
                                                                                c.uniforms), False)),
] + [
    Op(f"accept_tree_{'with' if replacement else 'without'}_replacement", scores=False, draft=True, uniforms=True,
       tree=True, specials=False,
       call=lambda a, r=replacement: _tree_result(sv.accept_tree_from_uniforms(
           a["target_probs"], a["draft_probs"], a["draft_tokens"], a["parents"], a["uniforms"], replacement=r)),
       expected=lambda c, r=replacement: tree_expected(c, lambda c: reference_tree.accept_tree(
           c.target, c.draft, c.tokens, c.parents, c.uniforms, replacement=r), False))
    for replacement in (False, True)
]

GENERATOR_UNIFORMS = {
    "accept_numpy_generator": lambda seed, n: np.random.default_rng(seed).random(n),
    "accept_torch_generator": lambda seed, n: torch.rand(n, dtype=torch.float64,
                                                         generator=torch.Generator().manual_seed(seed)).numpy(),
}



def _batch_call(method, with_draft):
    """The op as one request of ``verify_batch``: ``(num_accepted, its next token)``."""
    def call(a):
        k = len(a["draft_tokens"])
        out, num_accepted = sv.verify_batch(
            a["target_probs"], a["draft_probs"] if with_draft else None, a["draft_tokens"], [0, k],
            method=method, uniforms=a.get("uniforms"))
        n = int(num_accepted[0])
        return n, int(out[0, n])
    return call


# verify_batch with one request equals its single op; only in the values property (its corrupted
# arguments are named per request, tests/test_batch.py checks those messages).
BATCH_OPS = [
    Op("verify_batch_greedy", scores=True, draft=False, uniforms=False, call=_batch_call("greedy", False),
       expected=lambda c: chain_expected(c, _greedy_reference, True, False)),
    Op("verify_batch_token", scores=False, draft=True, uniforms=True, call=_batch_call("token", True),
       expected=lambda c: chain_expected(c, _accept_reference, False, True)),
    Op("verify_batch_block_point_mass", scores=False, draft=False, uniforms=True, call=_batch_call("block", False),
       expected=lambda c: chain_expected(c, _block_reference, False, False, reads_every_row=True)),
]

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


def draw_case(data, op):
    k = data.draw(st.integers(0, 6), label="K")
    v = data.draw(st.sampled_from([x for x in VOCABS if x > k] if op.tree else VOCABS), label="V")
    target = draw_rows(data, k + 1, v, "scores" if op.scores else "probs", op.specials)
    draft = draw_rows(data, k + 1 if op.tree else k, v, "probs", op.specials) if op.draft else None
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
    if op.name in GENERATOR_UNIFORMS:
        seed = data.draw(st.integers(0, 2**32 - 1), label="generator seed")
        uniforms = GENERATOR_UNIFORMS[op.name](seed, k + 1)
    elif op.uniforms:
        uniforms = np.array(data.draw(st.lists(
            st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 1.0 - 2.0**-53, 0.5])),
            min_size=k + 1, max_size=k + 1), label="uniforms"), dtype=np.float64)
    return Case(k, v, target, draft, tokens, uniforms, parents), seed


def arguments_in_layouts(data, op, case, seed):
    """The op's arguments in drawn containers, and the case of the values it should read."""
    target, t_values = in_layout(data, ROW_LAYOUTS, case.target, "target_probs")
    args = {"target_probs": target, "seed": seed}
    d_values = None
    if op.draft:
        args["draft_probs"], d_values = in_layout(data, ROW_LAYOUTS, case.draft, "draft_probs")
    args["draft_tokens"], tok_values = in_layout(data, TOKEN_LAYOUTS, case.tokens, "draft_tokens")
    u_values = case.uniforms
    if op.uniforms and op.name not in GENERATOR_UNIFORMS:
        args["uniforms"], u_values = in_layout(data, UNIFORM_LAYOUTS, case.uniforms, "uniforms")
    if op.tree:
        args["parents"], p_values = in_layout(data, TOKEN_LAYOUTS, case.parents, "parents")
    else:
        p_values = None
    return args, Case(case.k, case.v, t_values, d_values, tok_values, u_values, p_values)


def outcome(call, args):
    try:
        return ("ok", call(args))
    except (TypeError, ValueError, IndexError) as error:
        return ("error", type(error), str(error))


def assert_matches(got, want):
    if want[0] == "either":  # the given outcome, or an error naming one of the listed rows
        _, want, rows = want
        if got[0] == "error" and got[1] is ValueError and any(got[2].startswith(r) for r in rows):
            return
    if want[0] == "ok":
        assert got == want, f"got {got}, expected {want}"
        n_or_path, token = got[1]
        assert type(token) is int and all(type(i) is int for i in (n_or_path if isinstance(n_or_path, tuple) else [n_or_path]))
    else:
        assert got[0] == "error" and got[1] is want[1] and want[2] in got[2], f"got {got}, expected {want}"


@pytest.mark.parametrize("op", OPS + BATCH_OPS, ids=lambda op: op.name)
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

def corruptions(op, case):
    """(label, argument, replacement, exception class, message fragment) for this case; a
    replacement may be a callable that builds it (only the drawn one is built)."""
    k, v = case.k, case.v
    t = case.target
    out = [
        ("target_rows", "target_probs", t[:k], ValueError, f"target_probs must have {k + 1} rows"),
        ("target_1d", "target_probs", t[0], ValueError, "target_probs must be 2-D"),
        ("target_int", "target_probs", lambda: t.astype(np.int64), TypeError, "target_probs must hold floating-point"),
        ("target_datetime", "target_probs", lambda: np.zeros(t.shape, "datetime64[s]"), TypeError, "target_probs"),
        ("target_masked", "target_probs", lambda: np.ma.masked_array(t), TypeError, "target_probs is a numpy masked array"),
        ("target_sparse", "target_probs", lambda: torch.from_numpy(t).to_sparse(), TypeError, "target_probs must be a dense"),
        ("target_meta", "target_probs", lambda: torch.empty(t.shape, device="meta"), ValueError, "target_probs must be a CPU tensor"),
        ("tokens_2d", "draft_tokens", case.tokens[None], ValueError, "draft_tokens must be 1-D"),
    ]
    if k:  # (no tokens is no tokens, whatever the dtype: np.asarray([]) is float64)
        out += [("tokens_float", "draft_tokens", lambda: case.tokens.astype(np.float64), TypeError, "draft_tokens must hold integer"),
                ("tokens_bool", "draft_tokens", lambda: torch.from_numpy(case.tokens > 0), TypeError, "draft_tokens must hold integer")]
    def replaced(values, j, bad, as_list=False):
        def build():
            x = values.tolist() if as_list else values.copy()
            x[j] = bad
            return x
        return build

    for j in range(k):
        for bad in (-1, v, v + 5000, 2**40, -(2**62), INT64_MAX):
            out.append((f"token_{j}_{bad}", "draft_tokens", replaced(case.tokens, j, bad), IndexError,
                        f"draft_tokens[{j}] = {bad} "))
        out.append((f"token_{j}_beyond_int64", "draft_tokens", replaced(case.tokens, j, 2**64 + 3, True), IndexError,
                    f"draft_tokens[{j}] = {2**64 + 3} is outside"))
    if op.tree:
        out.append(("parents_length", "parents", case.parents[:-1] if k else np.zeros(1, np.int64), ValueError,
                    "parents must have one entry per draft token"))
        out.append(("parents_float", "parents", lambda: case.parents.astype(np.float64), TypeError,
                    "parents must hold integer") if k else ("parents_2d", "parents", case.parents[None], ValueError,
                                                           "parents must be 1-D"))
        for j in range(k):
            for bad in (j, -2, 2**40):
                out.append((f"parent_{j}_{bad}", "parents", replaced(case.parents, j, bad), ValueError,
                            f"parents[{j}] = {bad}: a node's parent must be -1"))
    if op.draft and k:
        out.append(("draft_cols", "draft_probs", case.draft[:, :v - 1], ValueError, "draft_probs"))
        out.append(("draft_complex", "draft_probs", lambda: case.draft.astype(np.complex64), TypeError,
                    "draft_probs must hold floating-point"))
    if op.uniforms and op.name not in GENERATOR_UNIFORMS:
        for j in range(k + 1):
            for bad in (np.nan, 1.0, -1e-300, np.inf, 7.0):
                out.append((f"uniform_{j}_{bad}", "uniforms", replaced(case.uniforms, j, bad), ValueError,
                            "uniforms must lie in [0, 1)"))
        out.append(("uniforms_short", "uniforms", case.uniforms[:k], ValueError, f"uniforms must have shape [{k + 1}]"))
        out.append(("uniforms_int", "uniforms", lambda: np.zeros(k + 1, np.int64), TypeError, "uniforms must be floating point"))
        out.append(("uniforms_timedelta", "uniforms", lambda: np.zeros(k + 1, "timedelta64[s]"), TypeError,
                    "uniforms must be floating point"))
    return out


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@FUZZ
@given(data=st.data())
def test_one_corrupted_argument_raises_naming_it(op, data):
    case, seed = draw_case(data, op)
    # Valid values throughout, so the corruption is the only thing wrong.
    case.target = np.abs(np.nan_to_num(case.target, nan=1.0, posinf=1.0, neginf=1.0)) + np.float32(0.5)
    if case.draft is not None:
        case.draft = np.abs(np.nan_to_num(case.draft, nan=1.0, posinf=1.0, neginf=1.0)) + np.float32(0.5)
    label, name, bad, error, fragment = data.draw(st.sampled_from(corruptions(op, case)), label="corruption")
    args, _ = arguments_in_layouts(data, op, case, seed)
    args[name] = bad() if callable(bad) else bad
    got = outcome(op.call, args)
    assert got[0] == "error" and got[1] is error and fragment in got[2], (label, got)
