# cython: language_level=3
"""specverify's compiled kernels: one extension, one source file per op family.

- ``_primitives.pxd``: the numeric contract (documented there, once) and the per-row primitives
  every op reuses (block sums, residual block sums, validation max, blocked argmax, inverse-CDF
  draw), as ``inline`` nogil loops;
- ``_args.pxi``: the argument readers every entry point validates through;
- one ``_<family>.pxi`` per op family (``_chain.pxi``: ``verify_greedy`` and ``accept``;
  ``_tree.pxi``: ``verify_tree_greedy`` and ``accept_tree``; ``_block.pxi``: ``accept_block``;
  ``_batch.pxi``: ``verify_batch``;
  ``_warp.pxi``: ``warp`` and ``accept_logits``; ``_linear.pxi``: ``linear``, the target's
  multi-token pass), holding its nogil kernels and its entry points.

A new op family is a new ``.pxi`` included below, built from the primitives.  The families share
one extension module rather than one each: Cython links separate modules through imports by
absolute name (``specverify.kernels._args``), which the Hugging Face ``kernels`` loader cannot satisfy,
since it registers this package under a hashed name (see ``specverify.integrations.hub``).
"""

cimport cython
from cpython.buffer cimport PyBUF_RECORDS_RO, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, strcmp

import sys
import threading

import numpy as np

from . import _inputs
from ._primitives cimport *

include "_args.pxi"
include "_chain.pxi"
include "_tree.pxi"
include "_block.pxi"
include "_batch.pxi"
include "_warp.pxi"
include "_linear.pxi"


def block_size():
    """Elements per summation block (see ``_primitives.pxd``)."""
    return BLOCK


def lane_count():
    """Lanes per block (see ``_primitives.pxd``)."""
    return LANES


def bounds_checked():
    """Whether this build checks every computed index (SV_CHECK_INDEX; see ``_primitives.pxd``)."""
    return bool(BOUNDSCHECKED)


def _check_index(Py_ssize_t i, Py_ssize_t n):
    """SV_CHECK_INDEX(i, n) from Python: in a bounds-checked build an index outside [0, n) aborts
    the process with a message (the test that the checks are compiled in); else a no-op."""
    check_index(i, n)


def row_masses(rows):
    """Masses of a float32 [rows, V] matrix in the documented order (tests, cross-arch checks)."""
    cdef _Held held = _Held()
    cdef Rows m
    cdef uint32_t bits
    cdef Py_ssize_t i
    rows = _inputs.float_rows(rows, "rows")
    _read_rows(rows, &m, held)
    cdef double* scratch = <double*> malloc(((m.cols + BLOCK - 1) // BLOCK) * sizeof(double))
    if scratch == NULL:
        raise MemoryError()
    try:
        return [_row_mass(<const float*> m.data + i * m.stride, m.cols, scratch, &bits)
                for i in range(m.rows)]
    finally:
        free(scratch)
