"""Shared fixtures and case generators for the specverify tests."""

import os

import numpy as np
import pytest

# Under qemu (the aarch64 proof) Python runs 10-30x slower: the same tests run fewer cases.
EMULATED = os.environ.get("SPECVERIFY_EMULATED", "0") == "1"


def scaled(n, emulated_n=None):
    """Case count for a test: ``n`` natively, ``emulated_n`` (default n // 10) under emulation."""
    if EMULATED:
        return emulated_n if emulated_n is not None else max(1, n // 10)
    return n


def softmax_rows(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def random_probability_rows(rng, rows, vocab, kind=None):
    """[rows, vocab] float32 non-negative rows of a randomly chosen family (not normalized)."""
    kind = kind or rng.choice(["softmax", "peaked", "sparse", "wide", "uniform", "scaled"])
    if kind == "softmax":
        x = softmax_rows(rng.standard_normal((rows, vocab)))
    elif kind == "peaked":
        x = softmax_rows(4.0 * rng.standard_normal((rows, vocab)))
    elif kind == "sparse":
        x = rng.random((rows, vocab)).astype(np.float32)
        x[rng.random((rows, vocab)) < 0.8] = 0.0
        x[np.arange(rows), rng.integers(0, vocab, rows)] = 1.0  # keep every row's mass positive
    elif kind == "wide":
        # Entries spanning ~30 orders of magnitude inside a row.
        x = (10.0 ** rng.uniform(-30, 0, (rows, vocab))).astype(np.float32)
    elif kind == "uniform":
        x = np.ones((rows, vocab), dtype=np.float32)
    else:
        x = softmax_rows(rng.standard_normal((rows, vocab)))
        x *= (10.0 ** rng.uniform(-25, 25, (rows, 1))).astype(np.float32)
        x[x == 0] = 0.0
        x = np.where(np.sum(x, axis=1, keepdims=True) > 0, x, 1.0).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def draw_from_rows(rng, rows):
    """One token per row, drawn from the normalized row (float64 inverse CDF)."""
    rows = np.asarray(rows, dtype=np.float64)
    cdf = np.cumsum(rows, axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random(rows.shape[0])
    return np.array([min(int(np.searchsorted(c, x, side="right")), rows.shape[1] - 1) for c, x in zip(cdf, u)],
                    dtype=np.int64)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
