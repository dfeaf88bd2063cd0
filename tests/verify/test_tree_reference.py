"""Tree ops: chains give the chain ops' answers bit for bit; the kernels match the reference."""

import numpy as np
import pytest

from specverify import reference
from specverify.reference import tree as reference_tree

from conftest import draw_from_rows, random_probability_rows, scaled

pytestmark = pytest.mark.emulated

VOCABS = [1, 2, 3, 17, 255, 256, 257, 513, 1023]


def chain_case(rng):
    v = int(rng.choice(VOCABS))
    k = int(rng.integers(0, 6))
    target = random_probability_rows(rng, k + 1, v)
    draft = random_probability_rows(rng, k + 1, v)
    if rng.random() < 0.2:
        draft[:k] = target[:k] * np.float32(rng.choice([1, 2, 3]))  # p == q up to scale
    tokens = draw_from_rows(rng, draft[:k]) if k else np.zeros(0, dtype=np.int64)
    if rng.random() < 0.3:
        tokens = rng.integers(0, v, k).astype(np.int64)
    uniforms = rng.random(k + 1)
    if rng.random() < 0.3:
        uniforms = rng.choice([0.0, 0.5, np.nextafter(1.0, 0.0)], k + 1)
    return target, draft, tokens, uniforms


def test_reference_chains_are_the_chain_references(rng):
    # Mapping: node i is the draft at position i, its coin is u[i]; draft_probs[:K] are accept's
    # draft rows and row K (a leaf's) is never read; u[K] draws the recovered or bonus token.
    for _ in range(scaled(1500, 150)):
        target, draft, tokens, uniforms = chain_case(rng)
        k = tokens.size
        parents = np.arange(k) - 1
        for with_draft in (True, False):
            n, next_token = reference.accept(target, draft[:k] if with_draft else None, tokens, uniforms)
            for replacement in (False, True):
                path, tree_next = reference_tree.accept_tree(target, draft if with_draft else None, tokens,
                                                             parents, uniforms, replacement=replacement)
                assert list(path) == list(range(n)) and tree_next == next_token
        n, next_token = reference.verify_greedy(target, tokens)
        path, tree_next = reference_tree.verify_tree_greedy(target, tokens, parents)
        assert list(path) == list(range(n)) and tree_next == next_token
