# cython: language_level=3
"""Compiled loops of specverify: pure functions of raw float32 rows and explicit uniforms.

The loops trust their callers.  The entry points at the bottom of this file validate first:
shapes, dtypes, strides and token ids are checked (here for the common case, in
``specverify._inputs`` for everything else) before any pointer reaches a loop, and the
per-element checks (NaN, Inf, negative values, zero mass) are folded into the single pass that
reads each row.  Directives live in ``setup.py`` (``SPECVERIFY_BOUNDSCHECK=1`` turns bounds
checking back on for debugging).

Summation order (fixed and explicit, so x86-64 and aarch64 agree bit for bit and
``specverify.reference`` can reproduce it):

- a row is cut into blocks of ``BLOCK = 256`` elements (the last one may be short);
- inside a block, element ``j`` goes to lane ``j % 8``; each lane is a float64 accumulator
  summed in increasing ``j``;
- the 8 lanes are combined by a pairwise tree: ``h[l] = a[l] + a[l+4]``, ``g[l] = h[l] + h[l+2]``,
  ``block = g[0] + g[1]``;
- the row total is the left-to-right float64 sum of its block sums, starting from 0.0.

No reassociation flags are used: the lanes are written out, so the compiler vectorizes them as
they stand, and ``-ffp-contract=off`` keeps every product rounded on its own.
"""

from cpython.buffer cimport PyBUF_RECORDS_RO, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport strcmp

import sys
import threading

import numpy as np

from . import _inputs

cdef enum:
    LANES = 8           # one 512-bit vector of float64, fed by one 256-bit load of float32
    BLOCK = 256
    STEPS = BLOCK // LANES
    WIDE = 4            # full blocks summed side by side (see _wide_block_sums)
    ARGMAX_BLOCK = 512  # argmax blocks: no summation order to keep, so larger (fewer reductions)
    CACHE_LINE = 64

# Status codes returned by the kernels.  Positive codes come with the offending row index.
cdef enum:
    OK = 0
    BAD_TARGET_VALUES = 1     # NaN, Inf or a negative value in a target row
    BAD_DRAFT_VALUES = 2      # the same in a draft row
    ZERO_TARGET_MASS = 3
    ZERO_DRAFT_MASS = 4
    BAD_SCORES = 5            # verify_greedy: NaN or +Inf in a score row
    NO_FINITE_SCORE = 6       # verify_greedy: a row that is -Inf everywhere
    NO_MEMORY = 7

STATUS_NAMES = {
    BAD_TARGET_VALUES: "bad_target_values",
    BAD_DRAFT_VALUES: "bad_draft_values",
    ZERO_TARGET_MASS: "zero_target_mass",
    ZERO_DRAFT_MASS: "zero_draft_mass",
    BAD_SCORES: "bad_scores",
    NO_FINITE_SCORE: "no_finite_score",
    NO_MEMORY: "no_memory",
}

# Bit patterns: a float32 is non-negative and finite iff its bits, read as uint32, are below
# FLOAT_INF_BITS, or it is -0.0 (NEGATIVE_ZERO_BITS), which is allowed.
cdef extern from *:
    """
    #define SV_FLOAT_INF_BITS 0x7F800000u
    #define SV_NEGATIVE_ZERO_BITS 0x80000000u
    #define SV_NEGATIVE_INF_BITS 0xFF800000u
    """
    const uint32_t FLOAT_INF_BITS "SV_FLOAT_INF_BITS"
    const uint32_t NEGATIVE_ZERO_BITS "SV_NEGATIVE_ZERO_BITS"
    const uint32_t NEGATIVE_INF_BITS "SV_NEGATIVE_INF_BITS"

# A read hint (no fault past the end of a row; a no-op where the compiler has none).
cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define SV_PREFETCH(address) __builtin_prefetch((address), 0, 1)
    #else
    #define SV_PREFETCH(address) ((void) (address))
    #endif
    """
    void prefetch "SV_PREFETCH"(const void* address) noexcept nogil


def block_size():
    """Elements per summation block (see the module docstring)."""
    return BLOCK


def lane_count():
    """float64 lanes per block (see the module docstring)."""
    return LANES


# ---------------------------------------------------------------------------------------------
# Per-row primitives.  Reused by every op; each reads its row(s) exactly once.
# ---------------------------------------------------------------------------------------------

cdef inline double _combine_lanes(const double* a) noexcept nogil:
    """Pairwise tree over the 8 lanes, in the documented order.  Written as loops: spelled out as
    one expression, gcc vectorizes it across the blocks of ``_wide_block_sums`` and then keeps
    that loop's accumulators transposed, which halves its speed."""
    cdef double h[4]
    cdef double g[2]
    cdef Py_ssize_t l
    for l in range(4):
        h[l] = a[l] + a[l + 4]
    for l in range(2):
        g[l] = h[l] + h[l + 2]
    return g[0] + g[1]


cdef inline bint _all_valid(const float* x, Py_ssize_t n) noexcept nogil:
    """True iff every element is finite and non-negative, -0.0 allowed.

    Only called when a fused pass saw bits >= FLOAT_INF_BITS: that cheap test (one unsigned max
    per element) also fires on -0.0 (0x80000000), which this slower scan lets through.
    """
    cdef const uint32_t* xb = <const uint32_t*> x
    cdef Py_ssize_t j
    for j in range(n):
        if xb[j] >= FLOAT_INF_BITS and xb[j] != NEGATIVE_ZERO_BITS:
            return False
    return True


cdef inline double _block_sum(const float* x, Py_ssize_t n) noexcept nogil:
    """Sum of x[0:n], n <= BLOCK, in the documented lane order (float64 lanes, pairwise tree)."""
    cdef double acc[LANES]
    cdef Py_ssize_t j, l, s
    for l in range(LANES):
        acc[l] = 0.0
    if n == BLOCK:
        # hot loop: block sum
        for s in range(STEPS):
            for l in range(LANES):
                acc[l] += <double> x[s * LANES + l]
    else:
        for j in range(n):
            acc[j % LANES] += <double> x[j]
    return _combine_lanes(acc)


cdef inline uint32_t _max_bits(const uint32_t* xb, Py_ssize_t n, uint32_t m) noexcept nogil:
    """max(m, largest bit pattern of x[0:n] read as uint32): the cheap half of validation (a plain
    integer max reduction, which vectorizes as it stands)."""
    cdef Py_ssize_t j
    # hot loop: validation
    for j in range(n):
        m = max(m, xb[j])
    return m


cdef inline uint32_t _wide_block_sums(const float* x, double* block_sums, uint32_t m) noexcept nogil:
    """Sums of the WIDE = 4 full blocks of x[0:4 * BLOCK] into block_sums[0:4], each in the
    documented lane order, and max(m, the largest bit pattern read as uint32).

    Same bits as four calls of ``_block_sum``.  A lane is a chain of dependent float64 adds; the
    four blocks' lanes are independent, so running them side by side keeps the adder busy, and
    one step of a block (8 floats) is one vector load converted to one float64 vector.  The
    validation max rides along on the same loads.
    """
    cdef double a0[LANES]
    cdef double a1[LANES]
    cdef double a2[LANES]
    cdef double a3[LANES]
    cdef uint32_t m0[LANES]
    cdef uint32_t m1[LANES]
    cdef uint32_t m2[LANES]
    cdef uint32_t m3[LANES]
    cdef const uint32_t* xb = <const uint32_t*> x
    cdef Py_ssize_t s, j, l
    for l in range(LANES):
        a0[l] = 0.0
        a1[l] = 0.0
        a2[l] = 0.0
        a3[l] = 0.0
        m0[l] = m
        m1[l] = m
        m2[l] = m
        m3[l] = m
    # hot loop: wide block sums
    for s in range(STEPS):
        j = s * LANES
        for l in range(LANES):
            a0[l] += <double> x[j + l]
            a1[l] += <double> x[BLOCK + j + l]
            a2[l] += <double> x[2 * BLOCK + j + l]
            a3[l] += <double> x[3 * BLOCK + j + l]
        # Four blocks read side by side look like four short streams to the hardware
        # prefetcher, which then stalls on memory; ask for the group after next instead
        # (two 64-byte lines per step, 64 lines per group).
        prefetch(x + 2 * WIDE * BLOCK + 4 * j)
        prefetch(x + 2 * WIDE * BLOCK + 4 * j + 16)
        for l in range(LANES):
            m0[l] = max(m0[l], xb[j + l])
            m1[l] = max(m1[l], xb[BLOCK + j + l])
            m2[l] = max(m2[l], xb[2 * BLOCK + j + l])
            m3[l] = max(m3[l], xb[3 * BLOCK + j + l])
    block_sums[0] = _combine_lanes(a0)
    block_sums[1] = _combine_lanes(a1)
    block_sums[2] = _combine_lanes(a2)
    block_sums[3] = _combine_lanes(a3)
    for l in range(LANES):
        m = max(m, max(max(m0[l], m1[l]), max(m2[l], m3[l])))
    return m


cdef double _row_mass(const float* x, Py_ssize_t n, double* block_sums,
                      uint32_t* max_bits) noexcept nogil:
    """Mass of one row in the documented order; block sums written to ``block_sums``.

    x: [n] float32.  block_sums: [ceil(n / BLOCK)] float64 (output).
    max_bits: output, the row's largest bit pattern read as uint32: below FLOAT_INF_BITS iff every
    element is finite and non-negative, -0.0 excepted (see ``_all_valid``).
    """
    cdef Py_ssize_t start, width, b = 0, w
    cdef double total = 0.0
    cdef uint32_t m = 0
    while (b + WIDE) * BLOCK <= n:
        m = _wide_block_sums(x + b * BLOCK, block_sums + b, m)
        for w in range(WIDE):
            total += block_sums[b + w]
        b += WIDE
    while b * BLOCK < n:
        start = b * BLOCK
        width = min(BLOCK, n - start)
        block_sums[b] = _block_sum(x + start, width)
        m = _max_bits(<const uint32_t*> x + start, width, m)  # the block is in L1 now
        total += block_sums[b]
        b += 1
    max_bits[0] = m
    return total


cdef inline double _residual_weight(float p, float q, double mass_ratio) noexcept nogil:
    """Unnormalized residual max(0, p/P - q/Q) * P = max(0, p - q * (P/Q)), in float64.

    mass_ratio = P / Q.  p == q at any power-of-two scale gives exactly 0."""
    cdef double d = <double> p - <double> q * mass_ratio
    return d if d > 0.0 else 0.0


cdef inline double _residual_block_sum(const float* p, const float* q, Py_ssize_t n,
                                       double mass_ratio) noexcept nogil:
    """Sum of the residual weights of p[0:n], q[0:n], n <= BLOCK, in the documented lane order."""
    cdef double acc[LANES]
    cdef Py_ssize_t j, l, s
    for l in range(LANES):
        acc[l] = 0.0
    if n == BLOCK:
        # hot loop: residual block sums
        for s in range(STEPS):
            for l in range(LANES):
                acc[l] += _residual_weight(p[s * LANES + l], q[s * LANES + l], mass_ratio)
    else:
        for j in range(n):
            acc[j % LANES] += _residual_weight(p[j], q[j], mass_ratio)
    return _combine_lanes(acc)


cdef inline void _wide_residual_block_sums(const float* p, const float* q, double mass_ratio,
                                           double* block_sums) noexcept nogil:
    """Residual weight sums of the WIDE = 4 full blocks of p, q[0:4 * BLOCK] into block_sums[0:4];
    same bits as four calls of ``_residual_block_sum`` (side by side as in ``_wide_block_sums``)."""
    cdef double a0[LANES]
    cdef double a1[LANES]
    cdef double a2[LANES]
    cdef double a3[LANES]
    cdef Py_ssize_t s, j, l
    for l in range(LANES):
        a0[l] = 0.0
        a1[l] = 0.0
        a2[l] = 0.0
        a3[l] = 0.0
    # hot loop: wide residual block sums
    for s in range(STEPS):
        j = s * LANES
        prefetch(p + 2 * WIDE * BLOCK + 4 * j)  # as in _wide_block_sums
        prefetch(p + 2 * WIDE * BLOCK + 4 * j + 16)
        prefetch(q + 2 * WIDE * BLOCK + 4 * j)
        prefetch(q + 2 * WIDE * BLOCK + 4 * j + 16)
        for l in range(LANES):
            a0[l] += _residual_weight(p[j + l], q[j + l], mass_ratio)
            a1[l] += _residual_weight(p[BLOCK + j + l], q[BLOCK + j + l], mass_ratio)
            a2[l] += _residual_weight(p[2 * BLOCK + j + l], q[2 * BLOCK + j + l], mass_ratio)
            a3[l] += _residual_weight(p[3 * BLOCK + j + l], q[3 * BLOCK + j + l], mass_ratio)
    block_sums[0] = _combine_lanes(a0)
    block_sums[1] = _combine_lanes(a1)
    block_sums[2] = _combine_lanes(a2)
    block_sums[3] = _combine_lanes(a3)


cdef double _residual_block_sums(const float* p, const float* q, Py_ssize_t n, double mass_ratio,
                                 double* block_sums) noexcept nogil:
    """Block sums and total of the residual weights of one row pair (documented order)."""
    cdef Py_ssize_t start, b = 0
    cdef double total = 0.0
    while (b + WIDE) * BLOCK <= n:
        _wide_residual_block_sums(p + b * BLOCK, q + b * BLOCK, mass_ratio, block_sums + b)
        b += WIDE
    while b * BLOCK < n:
        start = b * BLOCK
        block_sums[b] = _residual_block_sum(p + start, q + start, min(BLOCK, n - start),
                                            mass_ratio)
        b += 1
    for b in range((n + BLOCK - 1) // BLOCK):
        total += block_sums[b]
    return total


cdef inline Py_ssize_t _pick_block(const double* block_sums, Py_ssize_t n_blocks, double target,
                                   double* remainder) noexcept nogil:
    """First block whose running sum (left to right, as for the total) exceeds ``target``.

    Requires 0 <= target < total, so some block is found; ``remainder`` is target minus the sum
    of the blocks before it.  Empty blocks are never picked.
    """
    cdef double cumulative = 0.0
    cdef Py_ssize_t b
    for b in range(n_blocks):
        if cumulative + block_sums[b] > target:
            remainder[0] = target - cumulative
            return b
        cumulative += block_sums[b]
    # Unreachable when target < total; keep the last non-empty block as a guard.
    for b in range(n_blocks - 1, -1, -1):
        if block_sums[b] > 0.0:
            remainder[0] = 0.0
            return b
    remainder[0] = 0.0
    return 0


cdef inline Py_ssize_t _scan_target_block(const float* p, Py_ssize_t start, Py_ssize_t stop,
                                          double remainder, Py_ssize_t excluded) noexcept nogil:
    """Inverse-CDF scan of one block with weights p[j] (p[excluded] counted as 0).

    Returns the first j whose running sum exceeds ``remainder``; if rounding lets the running sum
    fall short, the last j with positive weight (the block is known to have some).
    """
    cdef double cumulative = 0.0, w
    cdef Py_ssize_t j, last = start
    for j in range(start, stop):
        w = <double> p[j]
        if w > 0.0 and j != excluded:
            cumulative += w
            last = j
            if cumulative > remainder:
                return j
    return last


cdef inline Py_ssize_t _scan_residual_block(const float* p, const float* q, Py_ssize_t start,
                                            Py_ssize_t stop, double mass_ratio,
                                            double remainder) noexcept nogil:
    """As ``_scan_target_block`` with the residual weights max(0, p - q * P/Q)."""
    cdef double cumulative = 0.0, w
    cdef Py_ssize_t j, last = start
    for j in range(start, stop):
        w = _residual_weight(p[j], q[j], mass_ratio)
        if w > 0.0:
            cumulative += w
            last = j
            if cumulative > remainder:
                return j
    return last


cdef inline Py_ssize_t _sample_target(const float* p, Py_ssize_t n, const double* block_sums,
                                      double mass, double u) noexcept nogil:
    """Draw from p / mass with the uniform u, given the row's block sums."""
    cdef double remainder
    cdef Py_ssize_t b = _pick_block(block_sums, (n + BLOCK - 1) // BLOCK, u * mass, &remainder)
    cdef Py_ssize_t start = b * BLOCK
    return _scan_target_block(p, start, min(start + BLOCK, n), remainder, -1)


cdef Py_ssize_t _first_zero(const float* x, Py_ssize_t n) noexcept nogil:
    """First j with x[j] == 0.0 (so -0.0 too): the argmax when the row's maximum is zero."""
    cdef Py_ssize_t j
    for j in range(n):
        if x[j] == 0.0:
            return j
    return 0


cdef inline int32_t _shifted(uint32_t bits) noexcept nogil:
    """bits - 0x7F800001 as int32: negative floats map, in order of increasing magnitude, to
    0x007FFFFF (-0.0) .. 0x7FFFFFFF (-Inf); non-negative floats, +Inf and positive NaNs to
    _shifted(+0.0) = -0x7F800001 and above; negative NaNs below that, to the very bottom."""
    return <int32_t> (bits - 0x7F800001u)


cdef Py_ssize_t _row_argmax(const float* x, Py_ssize_t n, int* status) noexcept nogil:
    """First index of the row's maximum (what torch.argmax / numpy.argmax return; -0.0 == 0.0).

    Reads the bits.  As int32, non-negative floats are ordered like their values, so the signed
    max of the raw bits is the positive maximum (and catches +Inf and positive NaNs above
    0x7F800000).  For rows with no non-negative value the maximum is the negative float of
    smallest magnitude: the signed min of ``_shifted`` bits, which also puts every negative NaN
    below _shifted(+0.0).  Two integer reductions per block, one pass: they vectorize as they
    stand, where a float max would need -ffinite-math-only and so be blind to NaN.  Only the
    winning block is read again.  status: OK, BAD_SCORES (NaN or +Inf) or NO_FINITE_SCORE.
    """
    cdef const int32_t* xi = <const int32_t*> x
    cdef const uint32_t* xu = <const uint32_t*> x
    cdef int32_t hi, lo, best_hi = -0x7FFFFFFF - 1, best_lo = 0x7FFFFFFF, wanted
    cdef Py_ssize_t start = 0, stop, j, hi_start = 0, lo_start = 0, best_start
    # Blocks start on 64-byte boundaries: a first, short block runs up to the first boundary.
    # (Rows from NumPy often start 16 bytes past one; every wide load then straddles two cache
    # lines, which costs a third of the speed from L2 and L3.)
    stop = ((CACHE_LINE - <uintptr_t> x % CACHE_LINE) % CACHE_LINE) // 4 or ARGMAX_BLOCK
    while start < n:
        stop = min(stop, n)
        hi, lo = -0x7FFFFFFF - 1, 0x7FFFFFFF
        # hot loop: blocked argmax
        for j in range(start, stop):
            hi = max(hi, xi[j])
            lo = min(lo, _shifted(xu[j]))
        if hi > best_hi:
            best_hi, hi_start = hi, start
        if lo < best_lo:
            best_lo, lo_start = lo, start
        start, stop = stop, stop + ARGMAX_BLOCK
    if best_hi >= <int32_t> FLOAT_INF_BITS or best_lo < _shifted(0u):  # +Inf or a NaN
        status[0] = BAD_SCORES
        return -1
    status[0] = OK
    if best_hi > 0:  # a positive maximum
        wanted, best_start = best_hi, hi_start
    elif best_hi == 0 or best_lo == _shifted(NEGATIVE_ZERO_BITS):  # the maximum is zero
        return _first_zero(x, n)
    elif best_lo == _shifted(NEGATIVE_INF_BITS):
        status[0] = NO_FINITE_SCORE
        return -1
    else:  # every value negative: the maximum has the smallest magnitude
        wanted, best_start = <int32_t> (<uint32_t> best_lo + 0x7F800001u), lo_start
    for j in range(best_start, min(best_start + ARGMAX_BLOCK, n)):
        if xi[j] == wanted:
            return j
    return best_start  # unreachable: the block holds its extreme


cdef inline double _block_sum_excluding(const float* p, Py_ssize_t start, Py_ssize_t stop,
                                        Py_ssize_t excluded) noexcept nogil:
    """``_block_sum`` of p[start:stop] with p[excluded] counted as 0 (adding +0.0 to a lane
    changes nothing, so this is the same order and the same bits as skipping it)."""
    cdef float block[BLOCK]
    cdef Py_ssize_t j
    for j in range(start, stop):
        block[j - start] = p[j]
    block[excluded - start] = 0.0
    return _block_sum(block, stop - start)


# ---------------------------------------------------------------------------------------------
# The ops.  Arguments are addresses of validated memory; rows are ``row_stride`` floats apart.
# ---------------------------------------------------------------------------------------------

cdef int _verify_greedy(const float* target, Py_ssize_t target_stride, const int64_t* tokens,
                        Py_ssize_t k, Py_ssize_t v, Py_ssize_t* n_accepted,
                        int64_t* next_token, Py_ssize_t* bad_row) noexcept nogil:
    cdef Py_ssize_t i, best
    cdef int status = OK
    for i in range(k + 1):
        best = _row_argmax(target + i * target_stride, v, &status)
        if status != OK:
            bad_row[0] = i
            return status
        if i == k or tokens[i] != best:
            n_accepted[0] = i
            next_token[0] = best
            return OK
    return OK


cdef int _accept(const float* target, Py_ssize_t target_stride, const float* draft,
                 Py_ssize_t draft_stride, const int64_t* tokens, Py_ssize_t k, Py_ssize_t v,
                 const double* uniforms, Py_ssize_t* n_accepted, int64_t* next_token,
                 Py_ssize_t* bad_row) noexcept nogil:
    """Speculative sampling over validated rows; ``draft`` NULL means a point-mass draft."""
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK
    cdef double* target_blocks = <double*> malloc(2 * n_blocks * sizeof(double))
    cdef double* residual_blocks = target_blocks + n_blocks
    cdef const float* p
    cdef const float* q
    cdef double p_mass, q_mass, residual_mass, remainder
    cdef uint32_t p_bits = 0, q_bits = 0
    cdef Py_ssize_t i, t, b, start, stop
    cdef int status = OK
    if target_blocks == NULL:
        return NO_MEMORY
    for i in range(k + 1):
        p = target + i * target_stride
        q = draft + i * draft_stride if draft != NULL and i < k else NULL
        p_mass = _row_mass(p, v, target_blocks, &p_bits)
        if q != NULL:
            # residual_blocks is free until a rejection: scratch for the draft's block sums
            q_mass = _row_mass(q, v, residual_blocks, &q_bits)
        else:
            q_mass = 1.0
            q_bits = 0
        bad_row[0] = i
        if p_bits >= FLOAT_INF_BITS and not _all_valid(p, v):
            status = BAD_TARGET_VALUES
        elif q_bits >= FLOAT_INF_BITS and not _all_valid(q, v):
            status = BAD_DRAFT_VALUES
        elif not p_mass > 0.0:
            status = ZERO_TARGET_MASS
        elif not q_mass > 0.0:
            status = ZERO_DRAFT_MASS
        if status != OK:
            break
        if i == k:
            # Every draft accepted: the bonus token comes from the last target row.
            n_accepted[0] = k
            next_token[0] = _sample_target(p, v, target_blocks, p_mass, uniforms[k])
            break
        t = tokens[i]
        if q != NULL:
            # Accept iff u < (p_t / P) / (q_t / Q), written without division.
            if uniforms[i] * (<double> q[t] * p_mass) < <double> p[t] * q_mass:
                continue
            residual_mass = _residual_block_sums(p, q, v, p_mass / q_mass, residual_blocks)
            n_accepted[0] = i
            if residual_mass > 0.0:
                b = _pick_block(residual_blocks, n_blocks, uniforms[k] * residual_mass, &remainder)
                start = b * BLOCK
                next_token[0] = _scan_residual_block(p, q, start, min(start + BLOCK, v),
                                                     p_mass / q_mass, remainder)
            else:
                # p <= q everywhere after rounding: p itself is the only sensible residual.
                next_token[0] = _sample_target(p, v, target_blocks, p_mass, uniforms[k])
            break
        # Point-mass draft: accept iff u < p_t / P; else draw from p without t.
        if uniforms[i] * p_mass < <double> p[t]:
            continue
        n_accepted[0] = i
        for b in range(n_blocks):
            residual_blocks[b] = target_blocks[b]
        b = t // BLOCK
        residual_blocks[b] = _block_sum_excluding(p, b * BLOCK, min(b * BLOCK + BLOCK, v), t)
        residual_mass = 0.0
        for b in range(n_blocks):
            residual_mass += residual_blocks[b]
        if residual_mass > 0.0:
            b = _pick_block(residual_blocks, n_blocks, uniforms[k] * residual_mass, &remainder)
            start = b * BLOCK
            next_token[0] = _scan_target_block(p, start, min(start + BLOCK, v), remainder, t)
        else:
            next_token[0] = _sample_target(p, v, target_blocks, p_mass, uniforms[k])
        break
    free(target_blocks)
    return status


# ---------------------------------------------------------------------------------------------
# Entry points.  The common case (float32 ndarray or CPU tensor with unit inner stride, int64
# tokens, a numpy or torch generator) is recognized here from C descriptions of the arguments
# (the buffer protocol for ndarrays, DLPack for tensors); everything else goes through
# specverify._inputs, which validates with messages that name the argument and converts, and
# whose result then takes the same road.  One mechanism, no copy unless needed.
# ---------------------------------------------------------------------------------------------

# DLPack's C description of a tensor (the layout of dlpack.h, which torch ships; only the fields
# read here are named).  A tensor attribute costs ~50-90 ns through Python; DLPack gives them all
# in one C call.
cdef extern from *:
    """
    typedef struct { int32_t device_type; int32_t device_id; } sv_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } sv_DLDataType;
    typedef struct {
        void* data; sv_DLDevice device; int32_t ndim; sv_DLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } sv_DLTensor;
    typedef struct {
        sv_DLTensor dl_tensor; void* manager_ctx; void (*deleter)(void* self);
    } sv_DLManagedTensor;
    typedef int (*sv_DLTensorFromPyObject)(void* py_object, sv_DLTensor* out);
    typedef struct {
        uint32_t major; uint32_t minor; void* prev_api;
        void* managed_tensor_allocator; void* managed_tensor_from_py_object_no_sync;
        void* managed_tensor_to_py_object_no_sync;
        sv_DLTensorFromPyObject dltensor_from_py_object_no_sync;
        void* current_work_stream;
    } sv_DLPackExchangeAPI;
    #define SV_DLPACK_CPU 1
    #define SV_DLPACK_CUDA_HOST 3
    #define SV_DLPACK_INT 0
    #define SV_DLPACK_FLOAT 2
    """
    ctypedef struct DLDevice "sv_DLDevice":
        int32_t device_type
    ctypedef struct DLDataType "sv_DLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor "sv_DLTensor":
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor "sv_DLManagedTensor":
        DLTensor dl_tensor
    ctypedef int (*DLTensorFromPyObject "sv_DLTensorFromPyObject")(void* py_object, DLTensor* out)
    ctypedef struct DLPackExchangeAPI "sv_DLPackExchangeAPI":
        uint32_t major
        DLTensorFromPyObject dltensor_from_py_object_no_sync
    enum:
        DLPACK_CPU "SV_DLPACK_CPU"
        DLPACK_CUDA_HOST "SV_DLPACK_CUDA_HOST"
        DLPACK_INT "SV_DLPACK_INT"
        DLPACK_FLOAT "SV_DLPACK_FLOAT"


# What the readers need of a tensor of rank <= 2 (shape and strides in elements).
cdef struct TensorView:
    const char* data
    int ndim
    uint8_t code       # DLPack dtype code: DLPACK_INT, DLPACK_FLOAT, ...
    uint8_t bits
    Py_ssize_t shape[2]
    Py_ssize_t strides[2]


cdef struct Rows:
    const char* data
    Py_ssize_t rows
    Py_ssize_t cols
    Py_ssize_t stride  # elements between rows


cdef object _ndarray = np.ndarray
cdef object _numpy_generator = np.random.Generator
cdef object _tensor = None  # torch.Tensor, torch.float64, ... once the caller has imported torch
cdef object _torch_float64 = None
cdef object _torch_generator = None
cdef object _torch_empty = None
cdef object _to_dlpack = None  # torch.utils.dlpack.to_dlpack, where the exchange API is missing
cdef DLTensorFromPyObject _dltensor_from_tensor = NULL  # torch's DLPack exchange API (torch >= 2.10)
cdef object _per_thread = threading.local()  # scratch tensors for drawn uniforms


cdef inline bint _torch_seen():
    """Cache torch's types once the caller has imported torch (we never import it here)."""
    global _tensor, _torch_float64, _torch_generator, _torch_empty
    if _tensor is not None:
        return True
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return False
    _torch_float64 = torch.float64
    _torch_generator, _torch_empty = torch.Generator, torch.empty
    _tensor = torch.Tensor
    _tensor_route("exchange" if _exchange_api_reader() != NULL else "capsule")
    return True


def _tensor_route(route=None):
    """Which DLPack producer describes tensors: "exchange" (torch's C exchange API, no allocation)
    or "capsule" (torch.utils.dlpack.to_dlpack, every torch version).  With ``route`` given, use
    that one from now on (tests run both).  None until torch has been seen."""
    global _to_dlpack, _dltensor_from_tensor
    if not _torch_seen():
        return None
    if route == "capsule":
        from torch.utils.dlpack import to_dlpack as _to_dlpack
        _dltensor_from_tensor = NULL
    elif route == "exchange":
        _dltensor_from_tensor = _exchange_api_reader()
        if _dltensor_from_tensor == NULL:
            raise RuntimeError("this torch has no DLPack exchange API")
    elif route is not None:
        raise ValueError(f"route must be 'exchange' or 'capsule', got {route!r}")
    return "exchange" if _dltensor_from_tensor != NULL else "capsule"


cdef DLTensorFromPyObject _exchange_api_reader():
    """torch's dltensor_from_py_object_no_sync (DLPack 1.x exchange API), or NULL."""
    cdef DLPackExchangeAPI* api
    capsule = getattr(_tensor, "__dlpack_c_exchange_api__", None)
    if capsule is None or not PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
        return NULL
    api = <DLPackExchangeAPI*> PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
    return api.dltensor_from_py_object_no_sync if api.major == 1 else NULL


cdef bint _copy_view(const DLTensor* t, TensorView* out) noexcept:
    cdef int i
    if t.ndim > 2 or t.dtype.lanes != 1 or not (t.device.device_type == DLPACK_CPU
                                                or t.device.device_type == DLPACK_CUDA_HOST):
        return False
    out.data = <const char*> t.data + t.byte_offset
    out.ndim, out.code, out.bits = t.ndim, t.dtype.code, t.dtype.bits
    for i in range(t.ndim):
        out.shape[i] = t.shape[i]
    for i in reversed(range(t.ndim)):  # NULL strides (DLPack < 1.2): compact row-major
        out.strides[i] = (t.strides[i] if t.strides != NULL
                          else 1 if i == t.ndim - 1 else out.strides[i + 1] * out.shape[i + 1])
    return True


cdef bint _view_tensor(object x, TensorView* out) except -1:
    """Describe x, a torch.Tensor, if it is a CPU tensor of rank <= 2 whose memory holds its
    values as they read (no lazy negation: torch exports a negative view's memory as it is)."""
    cdef DLTensor described
    cdef bint ok
    if _dltensor_from_tensor != NULL:
        if _dltensor_from_tensor(<void*> x, &described) != 0:
            PyErr_Clear()  # e.g. a meta tensor: _inputs names the problem
            return False
        ok = _copy_view(&described, out)
    else:
        try:
            capsule = _to_dlpack(x)
        except Exception:
            return False
        ok = _copy_view(&(<DLManagedTensor*> PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor, out)
    return ok and not x.is_neg()


cdef class _Held:
    """Buffers acquired for one call, released when the call ends."""
    cdef Py_buffer views[8]  # 4 arguments, each possibly tried once before conversion
    cdef int count

    def __dealloc__(self):
        cdef int i
        for i in range(self.count):
            PyBuffer_Release(&self.views[i])


cdef bint _read_rows(object x, Rows* out, _Held held) except -1:
    """Fill ``out`` if x is a 2-D float32 ndarray or CPU tensor with unit inner stride."""
    cdef Py_buffer* view
    cdef TensorView tensor
    if type(x) is _ndarray and held.count < 8:
        view = &held.views[held.count]
        if PyObject_GetBuffer(x, view, PyBUF_RECORDS_RO) < 0:
            return False
        held.count += 1
        if (view.ndim != 2 or view.format == NULL or strcmp(view.format, b"f") != 0
                or (view.shape[1] > 1 and view.strides[1] != 4) or view.strides[0] % 4 != 0):
            return False
        out.data, out.rows, out.cols = <const char*> view.buf, view.shape[0], view.shape[1]
        out.stride = view.strides[0] // 4
        return True
    if _tensor is not None and type(x) is _tensor:
        if (not _view_tensor(x, &tensor) or tensor.ndim != 2 or tensor.code != DLPACK_FLOAT
                or tensor.bits != 32 or (tensor.shape[1] > 1 and tensor.strides[1] != 1)):
            return False
        out.data, out.rows, out.cols = tensor.data, tensor.shape[0], tensor.shape[1]
        out.stride = tensor.strides[0]
        return True
    return False


cdef object _rows(object x, str name, Py_ssize_t rows, Py_ssize_t cols, Rows* out, _Held held):
    """Validated float32 rows of x (converted by _inputs when needed); returns what owns them."""
    if _read_rows(x, out, held) and out.cols > 0 and out.rows == rows and (cols < 0 or out.cols == cols):
        return x
    x = _inputs.float_rows(x, name, rows=rows, cols=None if cols < 0 else cols)
    if not _read_rows(x, out, held):
        raise AssertionError(f"{name}: conversion produced an unreadable array")
    return x


cdef bint _read_vector(object x, char kind, Py_ssize_t itemsize, const char** data, Py_ssize_t* n,
                       _Held held) except -1:
    """1-D contiguous ndarray or CPU tensor of int64 (kind 'i') or float64 (kind 'f')."""
    cdef Py_buffer* view
    cdef TensorView tensor
    if type(x) is _ndarray and held.count < 8:
        view = &held.views[held.count]
        if PyObject_GetBuffer(x, view, PyBUF_RECORDS_RO) < 0:
            return False
        held.count += 1
        if view.ndim != 1 or view.itemsize != itemsize or view.format == NULL:
            return False
        if (view.shape[0] > 1 and view.strides[0] != itemsize):
            return False
        if kind == b'i' and not (strcmp(view.format, b"l") == 0 or strcmp(view.format, b"q") == 0):
            return False
        if kind == b'f' and strcmp(view.format, b"d") != 0:
            return False
        data[0], n[0] = <const char*> view.buf, view.shape[0]
        return True
    if _tensor is not None and type(x) is _tensor:
        if (not _view_tensor(x, &tensor) or tensor.ndim != 1 or tensor.bits != 8 * itemsize
                or tensor.code != (DLPACK_INT if kind == b'i' else DLPACK_FLOAT)
                or (tensor.shape[0] > 1 and tensor.strides[0] != 1)):
            return False
        data[0], n[0] = tensor.data, tensor.shape[0]
        return True
    return False


cdef object _tokens(object x, const int64_t** data, Py_ssize_t* k, _Held held):
    cdef const char* raw
    if not _read_vector(x, b'i', 8, &raw, k, held):
        x = _inputs.tokens_int64(x)
        if not _read_vector(x, b'i', 8, &raw, k, held):
            raise AssertionError("draft_tokens: conversion produced an unreadable array")
    data[0] = <const int64_t*> raw
    return x


cdef int _check_token_range(object tokens, const int64_t* data, Py_ssize_t k, Py_ssize_t v) except -1:
    cdef Py_ssize_t i
    for i in range(k):
        if data[i] < 0 or data[i] >= v:
            raise IndexError(f"draft_tokens[{i}] = {data[i]} is not a token id in [0, {v})")
    return 0


cdef class _Scratch:
    """A float64 tensor the module owns, with its address read once."""
    cdef object tensor
    cdef const double* data


cdef _Scratch _torch_scratch(Py_ssize_t count):
    """This thread's float64 tensor of ``count`` elements, reused from call to call.

    Filling it with ``uniform_`` draws the same numbers as ``torch.rand(count, dtype=float64)`` and
    moves the generator the same way, without allocating a tensor per call.  Per thread, because
    torch releases the GIL while it draws and the kernel runs without it.
    """
    cdef dict scratches = getattr(_per_thread, "scratches", None)
    cdef _Scratch scratch
    cdef const char* raw
    cdef Py_ssize_t n
    if scratches is None:
        scratches = _per_thread.scratches = {}
    scratch = scratches.get(count)
    if scratch is None:
        scratch = _Scratch()
        scratch.tensor = _torch_empty(count, dtype=_torch_float64)
        if not _read_vector(scratch.tensor, b'f', 8, &raw, &n, _Held()):
            raise AssertionError("torch.empty produced an unreadable tensor")
        scratch.data = <const double*> raw
        scratches[count] = scratch
    return scratch


cdef object _uniforms(object generator, object uniforms, Py_ssize_t count, const double** data,
                      _Held held):
    """The call's K + 1 uniforms: drawn from the generator in one call, or given explicitly."""
    cdef const char* raw
    cdef Py_ssize_t n, i
    cdef const double* u
    cdef _Scratch scratch
    if uniforms is None:
        if type(generator) is _numpy_generator:
            uniforms = generator.random(count)
        elif _torch_seen() and (generator is None or type(generator) is _torch_generator):
            scratch = _torch_scratch(count)
            try:
                scratch.tensor.uniform_(generator=generator)
            except RuntimeError:  # e.g. a CUDA generator: let _inputs name the problem
                uniforms = _inputs.draw_uniforms(generator, count)
            else:
                data[0] = scratch.data
                return scratch.tensor
        else:
            uniforms = _inputs.draw_uniforms(generator, count)  # raises the right TypeError
        if not _read_vector(uniforms, b'f', 8, &raw, &n, held):
            raise AssertionError("generator produced unreadable uniforms")
        data[0] = <const double*> raw
        return uniforms
    if not _read_vector(uniforms, b'f', 8, &raw, &n, held) or n != count:
        uniforms = _inputs.uniforms_float64(uniforms, count)
        if not _read_vector(uniforms, b'f', 8, &raw, &n, held):
            raise AssertionError("uniforms: conversion produced an unreadable array")
    u = <const double*> raw
    for i in range(count):
        if not (0.0 <= u[i] < 1.0):  # also catches NaN
            raise ValueError("uniforms must lie in [0, 1)")
    data[0] = u
    return uniforms


def verify_greedy(target_probs, draft_tokens):
    """See specverify.verify_greedy."""
    return _verify_greedy_entry(target_probs, draft_tokens, True)


def convert_only_verify_greedy(target_probs, draft_tokens):
    """verify_greedy without its kernel: the argument handling alone (call-overhead benchmark)."""
    return _verify_greedy_entry(target_probs, draft_tokens, False)


cdef object _verify_greedy_entry(object target_probs, object draft_tokens, bint run):
    cdef _Held held = _Held()
    cdef Rows target
    cdef const int64_t* tokens
    cdef Py_ssize_t k, n_accepted = 0, bad_row = -1
    cdef int64_t next_token = -1
    cdef int status
    _torch_seen()
    draft_tokens = _tokens(draft_tokens, &tokens, &k, held)
    target_probs = _rows(target_probs, "target_probs", k + 1, -1, &target, held)
    _check_token_range(draft_tokens, tokens, k, target.cols)
    if not run:
        return None
    with nogil:
        status = _verify_greedy(<const float*> target.data, target.stride, tokens, k, target.cols,
                                &n_accepted, &next_token, &bad_row)
    if status != OK:
        _inputs.raise_kernel_status(STATUS_NAMES[status], bad_row, target_probs, None)
    return n_accepted, next_token


def accept(target_probs, draft_probs, draft_tokens, generator=None, uniforms=None):
    """See specverify.accept / specverify.accept_from_uniforms (uniforms given: no generator)."""
    return _accept_entry(target_probs, draft_probs, draft_tokens, generator, uniforms, True)


def convert_only_accept(target_probs, draft_probs, draft_tokens, generator=None, uniforms=None):
    """accept without its kernel: the argument handling and uniform draws alone (benchmark)."""
    return _accept_entry(target_probs, draft_probs, draft_tokens, generator, uniforms, False)


cdef object _accept_entry(object target_probs, object draft_probs, object draft_tokens,
                          object generator, object uniforms, bint run):
    cdef _Held held = _Held()
    cdef Rows target, draft
    cdef const int64_t* tokens
    cdef const double* u
    cdef Py_ssize_t k, n_accepted = 0, bad_row = -1
    cdef int64_t next_token = -1
    cdef int status
    _torch_seen()
    draft_tokens = _tokens(draft_tokens, &tokens, &k, held)
    target_probs = _rows(target_probs, "target_probs", k + 1, -1, &target, held)
    if draft_probs is not None:
        draft_probs = _rows(draft_probs, "draft_probs", k, target.cols, &draft, held)
    else:
        draft.data, draft.stride = NULL, 0
    _check_token_range(draft_tokens, tokens, k, target.cols)
    uniforms = _uniforms(generator, uniforms, k + 1, &u, held)
    if not run:
        return None
    with nogil:
        status = _accept(<const float*> target.data, target.stride, <const float*> draft.data,
                         draft.stride, tokens, k, target.cols, u, &n_accepted, &next_token,
                         &bad_row)
    if status != OK:
        _inputs.raise_kernel_status(STATUS_NAMES[status], bad_row, target_probs, draft_probs)
    return n_accepted, next_token


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
