# cython: language_level=3
# specverify's per-row primitives and the numeric contract they implement, documented once.
#
# Every op family (``_chain.pxi``, and each new one, all included by ``_kernels.pyx``) builds
# on these ``inline`` loops: pure functions of raw float32 rows and explicit uniforms that trust
# their callers.  The entry points validate first (``_args.pxi`` for the common case,
# ``specverify._inputs`` for everything else): shapes, dtypes, strides and token ids are checked before any pointer reaches
# a loop, and the per-element checks (NaN, Inf, negative values, zero mass) are folded into the
# single pass that reads each row.  Directives live in ``setup.py``.
#
# Summation order (fixed and explicit, so x86-64 and aarch64 agree bit for bit and
# ``specverify.reference`` can reproduce it):
#
# - a row is cut into blocks of ``BLOCK = 256`` elements (the last one may be short);
# - inside a block, element ``j`` goes to lane ``j % 8``; each lane is a float64 accumulator
#   summed in increasing ``j``;
# - the 8 lanes are combined by a pairwise tree: ``h[l] = a[l] + a[l+4]``, ``g[l] = h[l] + h[l+2]``,
#   ``block = g[0] + g[1]``;
# - the row total is the left-to-right float64 sum of its block sums, starting from 0.0.
#
# No reassociation flags are used: the lanes are written out, so the compiler vectorizes them as
# they stand, and ``-ffp-contract=off`` keeps every product rounded on its own.

from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t

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


cdef inline double _row_mass(const float* x, Py_ssize_t n, double* block_sums,
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


cdef inline double _residual_block_sums(const float* p, const float* q, Py_ssize_t n,
                                        double mass_ratio, double* block_sums) noexcept nogil:
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


cdef inline Py_ssize_t _first_zero(const float* x, Py_ssize_t n) noexcept nogil:
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


cdef inline Py_ssize_t _row_argmax(const float* x, Py_ssize_t n, int* status) noexcept nogil:
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

