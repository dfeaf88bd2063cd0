"""Scalar math shared by the entry points and the references (one definition, no layer above it).

The warping settings become float32 numbers the kernel and :mod:`specverify.reference.warp` use
alike: ``verify.logits`` passes them to the kernel, the reference computes with them.
"""

import numpy as np

MIN_SCALE = np.float32(2.0 ** -126)
MAX_SCALE = np.float32(np.finfo(np.float32).max)


def temperature_scale(temperature):
    """``c = fl32(1 / temperature)`` clamped to ``[2**-126, FLT_MAX]`` (float32)."""
    with np.errstate(over="ignore"):
        c = np.float32(1.0 / float(temperature))
    return np.float32(min(max(c, MIN_SCALE), MAX_SCALE))


def min_p_threshold(min_p):
    """The smallest float32 ``f`` with ``float64(f) >= min_p``: ``w >= f`` iff ``w >= min_p``."""
    f = np.float32(min_p)
    if float(f) < float(min_p):
        f = np.nextafter(f, np.float32(np.inf))
    return f
