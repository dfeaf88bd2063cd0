"""Reference of ``linear``: the fixed 16-lane order of its dot products."""

import numpy as np

from .primitives import _tree  # the halving tree that adds lanes


LINEAR_LANES = 16  # float32 lanes of a linear layer's dot products


def linear(x, weight, bias=None):
    """``x [n, in] @ weight [out, in]^T (+ bias [out])`` in ``linear``'s documented order.

    The inputs are padded with zeros to a multiple of 16 columns; lane l accumulates, from +0.0
    and in increasing k, the float32 products of the columns k = l (mod 16); the lanes are added
    as a halving tree, then the bias."""
    x = np.asarray(x, dtype=np.float32)
    weight = np.asarray(weight, dtype=np.float32)
    pad = (-x.shape[1]) % LINEAR_LANES
    x = np.pad(x, ((0, 0), (0, pad)))
    weight = np.pad(weight, ((0, 0), (0, pad)))
    lanes = np.zeros((x.shape[0], weight.shape[0], LINEAR_LANES), dtype=np.float32)
    for k in range(0, x.shape[1], LINEAR_LANES):
        chunk = slice(k, k + LINEAR_LANES)
        lanes = lanes + x[:, None, chunk] * weight[None, :, chunk]
    y = _tree(lanes)
    return y if bias is None else y + np.asarray(bias, dtype=np.float32)
