"""The target's multi-token linear layer: every weight read once per call."""

import numpy as np

from ..kernels import _inputs, _kernels

__all__ = ["linear"]


def linear(x, weight, bias=None, out=None, *, num_threads=1):
    """``y = x @ weight.T + bias`` for the few rows a target pass scores, reading the weights once.

    ``y[..., o] = sum_k x[..., k] * weight[o, k] (+ bias[o])`` in float32, in a fixed order that
    does not depend on the number of rows, on which rows share the call, or on the CPU: 16 lanes,
    lane ``l`` summing the products of the columns ``k = l (mod 16)`` in increasing ``k`` (the
    columns padded with zeros to a multiple of 16), the lanes added as a halving tree, the bias
    last; every product and sum rounded to float32 on its own (``specverify.reference.linear``
    restates it).  A token's output is therefore the same bits whether it is scored alone or
    with a whole draft tree.  NaN and infinities propagate as in any matrix product.

    torch's CPU matmul reads the weights once per row for such shapes (with torch 2.13 on one
    thread, a 49152 x 576 output layer takes 9.5 ms for 1 row and 16-24 ms for 2-16 rows); this
    kernel reads them once per call.  ``specverify.integrations.transformers.use_fast_linears``
    puts it under a model's ``nn.Linear`` layers.

    Args:
        x: ``[..., in]`` float array or CPU tensor (float32 is read in place).
        weight: ``[out, in]`` float array or CPU tensor (an ``nn.Parameter`` is read without
            its autograd).
        bias: optional ``[out]``.
        out: optional float32 C-contiguous ``[..., out]`` to write (must not overlap the inputs).
        num_threads: threads to spread the weight rows over (the calling thread and helpers of
            the pool ``verify_batch`` uses); fewer for small weights (one per 256 KiB).  The
            result's bits do not depend on it.

    Returns:
        float32 ``[..., out]``: ``out``, else a new array (a tensor if x is one).
    """
    threads = _inputs.thread_count(num_threads)
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) <= 2:
        return _kernels.linear(x, weight, bias, out, threads)
    rows = x.reshape(-1, shape[-1])  # [..., in] -> [n, in]
    if out is None:
        y = _kernels.linear(rows, weight, bias, None, threads)
        return y.reshape(*shape[:-1], y.shape[-1])
    contiguous = out.is_contiguous() if _inputs.is_tensor(out) else isinstance(out, np.ndarray) and out.flags.c_contiguous
    if not contiguous or tuple(out.shape[:-1]) != tuple(shape[:-1]):
        raise ValueError(f"out must be a C-contiguous [..., out] array of x's leading shape {list(shape[:-1])}")
    _kernels.linear(rows, weight, bias, out.reshape(-1, out.shape[-1]), threads)  # a view of out's memory
    return out
