"""Tree ops: bit for bit with the references, chains equal the chain ops, bad input named."""

import numpy as np
import pytest

import specverify as sv
from specverify.reference import tree as reference_tree

from conftest import random_probability_rows, scaled

pytestmark = pytest.mark.emulated

VOCABS = [1, 2, 3, 17, 255, 256, 257, 511, 512, 513, 1030]


def random_parents(rng, n, max_children):
    """Topological parents: mostly any earlier node (bushy), else the previous one (deep); no
    position gets more than max_children children."""
    parents, counts = [], np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        parent = int(rng.integers(-1, i)) if i and rng.random() < 0.6 else i - 1
        if counts[parent + 1] >= max_children:
            parent = i - 1  # a fresh node: no children yet
        counts[parent + 1] += 1
        parents.append(parent)
    return np.array(parents, dtype=np.int64)


def tree_case(rng, distinct, vocab=None):
    v = vocab or (int(rng.choice([4096, 32000])) if rng.random() < 0.05 else int(rng.choice(VOCABS)))
    n = int(rng.integers(0, 12))
    parents = random_parents(rng, n, v if distinct else n)
    target = random_probability_rows(rng, n + 1, v)
    draft = random_probability_rows(rng, n + 1, v)
    if rng.random() < 0.2:
        draft = target * np.float32(rng.choice([1, 2, 3]))  # p == q up to scale
    tokens = np.zeros(n, dtype=np.int64)
    for r, kids in enumerate(reference_tree.tree_children(parents)):
        if not kids:
            continue
        weights = draft[r].astype(np.float64) + (1e-3 if distinct else 0.0)  # distinct draws need room
        tokens[kids] = rng.choice(v, len(kids), replace=not distinct, p=weights / weights.sum())
    uniforms = rng.random(n + 1)
    if rng.random() < 0.2:
        uniforms = rng.choice([0.0, 0.5, np.nextafter(1.0, 0.0)], n + 1)
    return target, draft, tokens, parents, uniforms


def as_tuple(result):
    path, next_token = result
    assert isinstance(path, np.ndarray) and path.dtype == np.int64 and path.ndim == 1
    return tuple(path.tolist()), next_token


@pytest.mark.parametrize("rule", ["deterministic", "without_replacement", "with_replacement"])
def test_accept_tree_matches_reference(rng, rule):
    for _ in range(scaled(1500, 150)):
        target, draft, tokens, parents, u = tree_case(rng, distinct=rule != "with_replacement")
        draft_probs = None if rule == "deterministic" else draft
        replacement = rule == "with_replacement"
        try:
            expected = as_tuple(reference_tree.accept_tree(target, draft_probs, tokens, parents, u,
                                                           replacement=replacement))
        except ValueError:  # only a draft row with no mass left outside earlier siblings
            with pytest.raises(ValueError, match="without replacement"):
                sv.accept_tree_from_uniforms(target, draft_probs, tokens, parents, u, replacement=replacement)
            continue
        got = as_tuple(sv.accept_tree_from_uniforms(target, draft_probs, tokens, parents, u,
                                                    replacement=replacement))
        assert got == expected


def test_verify_tree_greedy_matches_reference(rng):
    for _ in range(scaled(1500, 150)):
        target, _, tokens, parents, _ = tree_case(rng, distinct=False)
        if rng.random() < 0.5:
            target = np.round(target * 4) / 4  # ties, which break to the lowest token id
        best = np.argmax(target, axis=1)
        follow = rng.random(tokens.size) < 0.6  # drafts that match the argmax, so paths get long
        tokens = np.where(follow, best[parents + 1], tokens)
        expected = as_tuple(reference_tree.verify_tree_greedy(target, tokens, parents))
        assert as_tuple(sv.verify_tree_greedy(target, tokens, parents)) == expected


def test_chains_are_the_chain_ops_bit_for_bit(rng):
    # Node i is the draft at position i with coin u[i]; draft_probs[:K] are accept's draft rows.
    for _ in range(scaled(1500, 150)):
        v = int(rng.choice(VOCABS + [32000]))
        k = int(rng.integers(0, 7))
        target, draft = random_probability_rows(rng, k + 1, v), random_probability_rows(rng, k + 1, v)
        best = np.argmax(draft, axis=1)[:k]
        tokens = np.where(rng.random(k) < 0.7, best, rng.integers(0, v, k)).astype(np.int64)
        u, parents = rng.random(k + 1), np.arange(k, dtype=np.int64) - 1
        for with_draft in (True, False):
            n, next_token = sv.accept_from_uniforms(target, draft[:k] if with_draft else None, tokens, u)
            for replacement in (False, True):
                path, tree_next = sv.accept_tree_from_uniforms(target, draft if with_draft else None, tokens,
                                                               parents, u, replacement=replacement)
                assert path.tolist() == list(range(n)) and tree_next == next_token
        n, next_token = sv.verify_greedy(target, tokens)
        path, tree_next = sv.verify_tree_greedy(target, tokens, parents)
        assert path.tolist() == list(range(n)) and tree_next == next_token


def test_generators_draw_n_plus_one_uniforms():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    target, draft = random_probability_rows(rng, 6, 300), random_probability_rows(rng, 6, 300)
    tokens, parents = np.array([1, 2, 3, 4, 5]), np.array([-1, -1, 0, 0, 2])
    for make, draw in ((lambda: np.random.default_rng(7), lambda g: g.random(6)),
                       (lambda: torch.Generator().manual_seed(7),
                        lambda g: torch.rand(6, dtype=torch.float64, generator=g).numpy())):
        for replacement in (False, True):
            got = as_tuple(sv.accept_tree(target, draft, tokens, parents, make(), replacement=replacement))
            expected = as_tuple(sv.accept_tree_from_uniforms(target, draft, tokens, parents, draw(make()),
                                                             replacement=replacement))
            assert got == expected
    expected = as_tuple(sv.accept_tree(target, draft, tokens, parents, torch.Generator().manual_seed(3)))
    tensors = [torch.from_numpy(x) for x in (target, draft, tokens, parents)]
    assert as_tuple(sv.accept_tree(*tensors, torch.Generator().manual_seed(3))) == expected
    # Converted on the way in (a copy that must outlive its use): other integer dtypes, lists.
    converted = (tensors[0], tensors[1], tensors[2].to(torch.int32), tensors[3].to(torch.int16))
    assert as_tuple(sv.accept_tree(*converted, torch.Generator().manual_seed(3))) == expected
    assert as_tuple(sv.accept_tree(target.astype(np.float64), draft, tokens.tolist(), parents.astype(np.int32),
                                   torch.Generator().manual_seed(3))) == expected


def test_rows_never_reached_are_not_read():
    target = np.full((4, 5), np.nan, dtype=np.float32)
    target[0] = [0, 0, 1, 0, 0]  # the root's children: tokens 2 (node 0) and 3 (node 1)
    target[1] = [0, 1, 0, 0, 0]  # node 0's position: its child (node 2) has token 4
    draft = np.full((4, 5), np.nan, dtype=np.float32)
    draft[0] = 1.0
    draft[1] = [0, 0, 0, 0, 1]
    tokens, parents = np.array([2, 3, 4]), np.array([-1, -1, 0])
    u = np.full(4, 0.5)
    assert as_tuple(sv.verify_tree_greedy(target, tokens, parents)) == ((0,), 1)
    for draft_probs, replacement in ((None, False), (draft, False), (draft, True)):
        path, next_token = sv.accept_tree_from_uniforms(target, draft_probs, tokens, parents, u,
                                                        replacement=replacement)
        assert path.tolist() == [0] and next_token == 1


# --- Bad input --------------------------------------------------------------------------------

def good_args():
    target = np.full((4, 5), 0.2, dtype=np.float32)
    return target, target.copy(), np.array([0, 1, 2]), np.array([-1, -1, 0])


@pytest.mark.parametrize("parents,message", [
    ([-1, 2, 0], r"parents\[1\] = 2"),  # not topological
    ([1, 0, 0], r"parents\[0\] = 1"),  # a cycle: 0 -> 1 -> 0
    ([-1, -1, 2], r"parents\[2\] = 2"),  # its own parent
    ([-2, -1, 0], r"parents\[0\] = -2"),
    ([-1, -1, 3], r"parents\[2\] = 3"),
    ([-1, -1], "one entry per draft token"),
    ([-1, -1, 0, 0], "one entry per draft token"),
])
def test_bad_parents(parents, message):
    target, draft, tokens, _ = good_args()
    u = np.full(4, 0.5)
    with pytest.raises(ValueError, match=message):
        sv.verify_tree_greedy(target, tokens, parents)
    for draft_probs in (None, draft):
        with pytest.raises(ValueError, match=message):
            sv.accept_tree_from_uniforms(target, draft_probs, tokens, parents, u)


def test_bad_shapes_types_and_values():
    target, draft, tokens, parents = good_args()
    u = np.full(4, 0.5)
    with pytest.raises(TypeError, match="parents"):
        sv.verify_tree_greedy(target, tokens, np.array([-1.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="parents"):
        sv.verify_tree_greedy(target, tokens, np.array([[-1, -1, 0]]))
    with pytest.raises(ValueError, match="target_probs must have 4 rows"):
        sv.verify_tree_greedy(target[:3], tokens, parents)
    with pytest.raises(ValueError, match="draft_probs must have 4 rows"):
        sv.accept_tree_from_uniforms(target, draft[:3], tokens, parents, u)
    with pytest.raises(IndexError, match=r"draft_tokens\[2\] = 5"):
        sv.accept_tree_from_uniforms(target, draft, [0, 1, 5], parents, u)
    with pytest.raises(ValueError, match="uniforms"):
        sv.accept_tree_from_uniforms(target, draft, tokens, parents, np.full(3, 0.5))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sv.accept_tree_from_uniforms(target, draft, tokens, parents, [0.5, 0.5, 1.0, 0.5])
    with pytest.raises(TypeError, match="uniforms"):
        sv.accept_tree_from_uniforms(target, draft, tokens, parents, None)
    for bad, message in ((np.nan, "NaN"), (-1.0, "negative"), (np.inf, "inf")):
        t = target.copy()
        t[0, 3] = bad
        with pytest.raises(ValueError, match=rf"target_probs\[0\].*{message}"):
            sv.accept_tree_from_uniforms(t, draft, tokens, parents, u)
        d = draft.copy()
        d[1, 3] = bad
        d[0] = [1, 0, 0, 0, 0]  # node 0 (token 0) accepted surely: row 1 is read
        t = target.copy()
        t[0] = [1, 0, 0, 0, 0]
        with pytest.raises(ValueError, match=rf"draft_probs\[1\].*{message}"):
            sv.accept_tree_from_uniforms(t, d, tokens, parents, u)
    t = target.copy()
    t[0] = 0.0
    with pytest.raises(ValueError, match=r"target_probs\[0\] has zero mass"):
        sv.accept_tree_from_uniforms(t, None, tokens, parents, u)
    d = draft.copy()
    d[0] = 0.0
    with pytest.raises(ValueError, match=r"draft_probs\[0\] has zero mass"):
        sv.accept_tree_from_uniforms(target, d, tokens, parents, u)
    t = target.copy()
    t[0] = np.nan
    with pytest.raises(ValueError, match=r"target_probs\[0\]"):
        sv.verify_tree_greedy(t, tokens, parents)


def test_duplicate_siblings_where_not_allowed():
    target, draft, _, parents = good_args()
    tokens = np.array([3, 3, 1])  # nodes 0 and 1 are both children of the root
    u = np.full(4, 0.5)
    with pytest.raises(ValueError, match=r"draft_tokens\[1\] = 3 repeats its sibling draft_tokens\[0\]"):
        sv.accept_tree_from_uniforms(target, None, tokens, parents, u)
    with pytest.raises(ValueError, match=r"draft_tokens\[1\] = 3 repeats.*without replacement"):
        sv.accept_tree_from_uniforms(target, draft, tokens, parents, u)
    # With replacement repeated siblings are what i.i.d. draws give; greedy takes the first match.
    sv.accept_tree_from_uniforms(target, draft, tokens, parents, u, replacement=True)
    t = target.copy()
    t[0] = [0, 0, 0, 1, 0]
    assert as_tuple(sv.verify_tree_greedy(t, tokens, parents)) == ((0,), 0)  # node 0, not node 1


def test_draft_exhausted_without_replacement():
    target, draft, tokens, parents = good_args()
    draft[0] = [1, 0, 0, 0, 0]  # only token 0 can be drawn: node 1 (token 1) cannot follow it
    target[0] = [0, 1, 1, 1, 1]  # so node 0 is rejected
    with pytest.raises(ValueError, match=r"draft_probs\[0\] has no mass .* node 1"):
        sv.accept_tree_from_uniforms(target, draft, tokens, parents, np.full(4, 0.5))


def test_the_call_works_on_its_own_copy_of_the_tree():
    # Validation then use must see the same tree: the op copies parents and tokens first.
    target, draft, tokens, parents = good_args()
    tokens, parents = tokens.copy(), parents.copy()
    u = np.full(4, 0.5)
    before = as_tuple(sv.accept_tree_from_uniforms(target, draft, tokens, parents, u))
    assert as_tuple(sv.accept_tree_from_uniforms(target, draft, tokens, parents, u)) == before
    readonly = parents.copy()
    readonly.setflags(write=False)
    assert as_tuple(sv.accept_tree_from_uniforms(target, draft, tokens, readonly, u)) == before
