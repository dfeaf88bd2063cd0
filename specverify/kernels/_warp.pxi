# Logits warping family (included by _kernels.pyx): warp, accept_logits, accept_block_logits.
#
# Logits warping (temperature, top-k, top-p, min-p) in O(V), and verification from logits.
#
# The semantics, step by step, are those of ``specverify.reference.warp`` (the NumPy reference that
# sorts); this module returns the same float32 bits without sorting:
#
# - one pass finds the row maximum (``_row_argmax``, which also rejects NaN, +inf and rows that are
#   -inf everywhere), one vectorized pass writes ``w = exp32((x - max) * c)`` into the output;
# - a cut in the rank order (``w`` descending, ties by lower index) is found by a radix select over
#   the bits of ``w`` (non-negative floats order like their bits): a histogram of the top 12 bits
#   locates the bucket holding the cut, its tokens are listed in index order, and two more
#   10-bit levels over that list leave the tokens whose bits equal the cut value; those ties are
#   kept in index order.  Top-k counts tokens (weight 1 each); top-p adds the fixed-point weights
#   ``trunc(w * 2**40)`` in int64, whose sums are exact in any order, so the histogram gives the
#   reference's prefix sums exactly;
# - min-p is a compare against a float32 threshold, and the mass of what is left is summed in the
#   project's fixed order (``_row_mass``) before one scaling pass.
#
# Tokens with ``w = 0`` never change a cut's output (they rank after every positive weight and
# weigh nothing), so a cut after top-k only lists the tokens top-k left.


from libc.string cimport memset

# exp32's constants as float32 values (a double literal rounded once, as NumPy's np.float32 does).
cdef extern from *:
    """
    #define SV_EXP_CUTOFF_BITS 0xC2AC0000u  /* the bits of (float) -86.0 */
    #define SV_LOG2E ((float) 1.44269504088896341)
    #define SV_ROUND_MAGIC ((float) 12582912.0)
    #define SV_LN2_HI ((float) 0.693359375)
    #define SV_LN2_LO ((float) -2.12194440e-4)
    #define SV_P0 ((float) 1.9875691500e-4)
    #define SV_P1 ((float) 1.3981999507e-3)
    #define SV_P2 ((float) 8.3334519073e-3)
    #define SV_P3 ((float) 4.1665795894e-2)
    #define SV_P4 ((float) 1.6666665459e-1)
    #define SV_P5 ((float) 5.0000001201e-1)
    #define SV_ONE ((float) 1.0)
    #define SV_ZERO ((float) 0.0)
    #define SV_FIXED_ONE ((float) 1099511627776.0)
    """
    const uint32_t EXP_CUTOFF_BITS "SV_EXP_CUTOFF_BITS"
    const float LOG2E "SV_LOG2E"
    const float ROUND_MAGIC "SV_ROUND_MAGIC"
    const float LN2_HI "SV_LN2_HI"
    const float LN2_LO "SV_LN2_LO"
    const float EXP_P0 "SV_P0"
    const float EXP_P1 "SV_P1"
    const float EXP_P2 "SV_P2"
    const float EXP_P3 "SV_P3"
    const float EXP_P4 "SV_P4"
    const float EXP_P5 "SV_P5"
    const float F32_ONE "SV_ONE"
    const float F32_ZERO "SV_ZERO"
    const float FIXED_ONE "SV_FIXED_ONE"  # 2**40: top-p's fixed-point unit

cdef enum:
    RADIX = 1024          # buckets per level; level shifts 20, 10, 0 (w <= 1: bits >> 20 < 1024)
    SUBHISTOGRAMS = 4     # interleaved histograms: a run of equal buckets is not one serial chain
    CHUNK = 128           # tokens per range test in _list_range

cdef union FloatBits:
    float f
    uint32_t u


cdef inline float _exp32(float z) noexcept nogil:
    """exp(z) for z <= 0 (Cephes' expf, float32 operations in the order stated in
    ``reference_warp.exp32``); 0 below -86, 1 at 0.

    Branch-free so that the loops calling it vectorize on x86-64 and NEON alike: for z <= 0 the
    test z >= -86 is an unsigned compare of the bits (larger magnitudes of negative floats have
    larger bits), and the clamp and the final zeroing are integer selects.  (A float compare
    feeding a select is control flow to gcc's NEON vectorizer, which may not speculate
    possibly trapping float operations.)"""
    cdef FloatBits bits, clamped, scale, result
    bits.f = z
    cdef uint32_t keep = bits.u <= EXP_CUTOFF_BITS
    clamped.u = bits.u if keep else EXP_CUTOFF_BITS
    cdef float zc = clamped.f
    cdef float n = (zc * LOG2E + ROUND_MAGIC) - ROUND_MAGIC
    cdef float r = (zc - n * LN2_HI) - n * LN2_LO
    cdef float poly = ((((EXP_P0 * r + EXP_P1) * r + EXP_P2) * r + EXP_P3) * r + EXP_P4) * r + EXP_P5
    cdef float y = ((poly * r) * r + r) + F32_ONE
    scale.u = (<uint32_t> (<int32_t> n + 127)) << 23
    result.f = y * scale.f
    result.u &= -keep  # 0.0 below the cutoff
    return result.f


cdef struct WarpScratch:
    double* block_sums   # [ceil(V / BLOCK)]
    int32_t* listed      # [V] token ids of the current cut's bucket, in index order
    int32_t* domain      # [V] token ids a cut looks at (NULL: the whole row)
    int64_t* counts      # [SUBHISTOGRAMS * RADIX]
    int64_t* masses      # [SUBHISTOGRAMS * RADIX]


cdef int _warp_scratch_alloc(WarpScratch* s, Py_ssize_t v) noexcept nogil:
    s.block_sums = <double*> malloc(((v + BLOCK - 1) // BLOCK) * sizeof(double))
    s.listed = <int32_t*> malloc(2 * v * sizeof(int32_t))
    s.domain = s.listed + v
    s.counts = <int64_t*> malloc(2 * SUBHISTOGRAMS * RADIX * sizeof(int64_t))
    s.masses = s.counts + SUBHISTOGRAMS * RADIX
    if s.block_sums == NULL or s.listed == NULL or s.counts == NULL:
        _warp_scratch_free(s)
        return NO_MEMORY
    return OK


cdef void _warp_scratch_free(WarpScratch* s) noexcept nogil:
    free(s.block_sums)
    free(s.listed)
    free(s.counts)
    s.block_sums, s.listed, s.counts = NULL, NULL, NULL


cdef inline int64_t _fixed(float w) noexcept nogil:
    """Top-p's fixed-point weight trunc(w * 2**40) (the product is exact for w <= 1)."""
    return <int64_t> (w * FIXED_ONE)


cdef inline Py_ssize_t _walk(const int64_t* counts, const int64_t* weights, int64_t* before,
                             double threshold) noexcept nogil:
    """The bucket holding the cut: walking buckets from the top (largest bits), the last non-empty
    one whose first token has ``float64(before) < threshold``, where ``before`` (in: the weight
    above every bucket of this level; out: the weight above the chosen bucket) grows by each
    bucket's weight.  ``threshold > before`` on entry, so the top non-empty bucket qualifies."""
    cdef int64_t above = before[0]
    cdef Py_ssize_t b, chosen = RADIX - 1
    for b in range(RADIX - 1, -1, -1):
        if counts[b] == 0:
            continue
        if not <double> above < threshold:
            break
        chosen, before[0] = b, above
        above += weights[b]
    return chosen


cdef inline void _fold(int64_t* h) noexcept nogil:
    """Sum the SUBHISTOGRAMS interleaved histograms of ``h`` into its first RADIX entries."""
    cdef Py_ssize_t b, s
    for s in range(1, SUBHISTOGRAMS):
        for b in range(RADIX):
            h[b] += h[s * RADIX + b]


cdef inline void _row_histogram(const float* w, Py_ssize_t v, bint by_mass, int64_t* counts,
                                int64_t* masses) noexcept nogil:
    """Counts (and fixed-point masses) of bits >> 20 over w[0:v], into SUBHISTOGRAMS = 4
    interleaved histograms (element j into histogram j % 4): a run of tokens in one bucket is
    then four independent chains of increments, not one serial chain through memory.

    Weights in [0, 1] have bits >> 20 <= 1016 < RADIX; the bucket is still masked to RADIX, so
    a weight some other thread overwrites meanwhile (warp in place on memory the caller changes
    during the call) can only miscount, never write outside the histograms."""
    cdef const uint32_t* bits = <const uint32_t*> w
    cdef Py_ssize_t i, j, l, stop = v // SUBHISTOGRAMS
    cdef uint32_t b
    if by_mass:
        for i in range(stop):
            j = i * SUBHISTOGRAMS
            for l in range(SUBHISTOGRAMS):
                b = l * RADIX + ((bits[j + l] >> 20) & (RADIX - 1))
                check_index(b, SUBHISTOGRAMS * RADIX)
                counts[b] += 1
                masses[b] += _fixed(w[j + l])
    else:
        for i in range(stop):
            j = i * SUBHISTOGRAMS
            for l in range(SUBHISTOGRAMS):
                b = l * RADIX + ((bits[j + l] >> 20) & (RADIX - 1))
                check_index(b, SUBHISTOGRAMS * RADIX)
                counts[b] += 1
    for j in range(stop * SUBHISTOGRAMS, v):
        b = (bits[j] >> 20) & (RADIX - 1)
        check_index(b, RADIX)
        counts[b] += 1
        if by_mass:
            masses[b] += _fixed(w[j])


cdef inline Py_ssize_t _list_range(const uint32_t* bits, Py_ssize_t v, uint32_t lo, uint32_t hi,
                                   int32_t* listed) noexcept nogil:
    """The ids j with lo <= bits[j] <= hi, in index order, into ``listed``; returns their number.
    Chunks of CHUNK tokens are first counted (a vectorized compare and sum) and only chunks
    holding some are scanned: what a cut lists is usually a small part of the row."""
    cdef Py_ssize_t c, start, stop, j, n = 0
    cdef uint32_t hits, width = hi - lo
    for c in range((v + CHUNK - 1) // CHUNK):
        start = c * CHUNK
        stop = min(start + CHUNK, v)
        hits = 0
        # hot loop: range test
        for j in range(start, stop):
            hits += bits[j] - lo <= width
        if hits:
            for j in range(start, stop):
                check_index(n, v)
                listed[n] = <int32_t> j
                n += bits[j] - lo <= width
    return n


cdef Py_ssize_t _cut(float* w, Py_ssize_t v, const int32_t* domain, Py_ssize_t n_domain,
                     bint by_mass, double limit, WarpScratch* s) noexcept nogil:
    """Zero every weight after the cut: the tokens kept are the rank-order prefix whose tokens
    have ``float64(weight before them) < threshold``; weight 1 per token and threshold ``limit``
    (top-k) or fixed-point masses and threshold ``limit * total`` (top-p, total = the domain's
    mass, i.e. the row's).

    w: [v] float32 weights, changed in place.  domain: ids in index order (n_domain of them)
    holding every positive weight, or NULL for the whole row.
    Returns the number of tokens kept."""
    cdef const uint32_t* bits = <const uint32_t*> w
    cdef int64_t* counts = s.counts
    cdef int64_t* masses = s.masses
    cdef int64_t* weights = masses if by_mass else counts
    cdef int64_t before = 0, total = 0, q = 1
    cdef int32_t* listed = s.listed
    cdef Py_ssize_t j, i, b, n, n_listed, kept, n_above, level
    cdef uint32_t prefix, cut_bits
    cdef int shift
    cdef double threshold = limit
    memset(counts, 0, 2 * SUBHISTOGRAMS * RADIX * sizeof(int64_t))
    # Level 1: histogram of bits >> 20 over the domain.
    if domain == NULL:
        _row_histogram(w, v, by_mass, counts, masses)
    else:
        for i in range(n_domain):
            j = domain[i]
            check_index(j, v)
            b = (bits[j] >> 20) & (RADIX - 1)  # (masked as in _row_histogram)
            check_index(b, RADIX)
            counts[b] += 1
            if by_mass:
                masses[b] += _fixed(w[j])
    _fold(counts)
    if by_mass:
        _fold(masses)
        for b in range(RADIX):
            total += masses[b]
        threshold = limit * <double> total
    prefix = <uint32_t> _walk(counts, weights, &before, threshold)
    # The chosen bucket's tokens, in index order.
    if domain == NULL:
        n_listed = _list_range(bits, v, prefix << 20, (prefix << 20) | 0xFFFFF, listed)
    else:
        n_listed = 0
        for i in range(n_domain):
            check_index(domain[i], v)
            listed[n_listed] = domain[i]
            n_listed += (bits[domain[i]] >> 20) == prefix
    # Levels 2 and 3: the next 10 bits, over the listed tokens only.
    for level in range(2):
        shift = 10 - 10 * level
        memset(counts, 0, RADIX * sizeof(int64_t))
        memset(masses, 0, RADIX * sizeof(int64_t))
        for i in range(n_listed):
            check_index(listed[i], v)
            b = (bits[listed[i]] >> shift) & (RADIX - 1)
            counts[b] += 1
            if by_mass:
                masses[b] += _fixed(w[listed[i]])
        b = _walk(counts, weights, &before, threshold)
        prefix = (prefix << 10) | <uint32_t> b
        n = n_listed
        n_listed = 0
        for i in range(n):
            listed[n_listed] = listed[i]
            n_listed += ((bits[listed[i]] >> shift) & (RADIX - 1)) == <uint32_t> b
    # The listed tokens all have bits == cut_bits: keep them in index order while the weight
    # before each stays under the threshold (at least the first: _walk chose their bucket so).
    cut_bits = prefix
    if by_mass and n_listed > 0:  # (the chosen bucket is never empty: _walk picks a counted one)
        check_index(listed[0], v)
        q = _fixed(w[listed[0]])
    kept = 0
    while kept < n_listed and <double> before < threshold:
        before += q
        kept += 1
    n_above = 0
    if domain == NULL:
        # hot loop: cut mask
        for j in range(v):
            n_above += bits[j] > cut_bits
            w[j] = w[j] if bits[j] >= cut_bits else F32_ZERO
    else:
        for i in range(n_domain):
            j = domain[i]
            check_index(j, v)
            n_above += bits[j] > cut_bits
            w[j] = w[j] if bits[j] >= cut_bits else F32_ZERO
    for i in range(kept, n_listed):
        check_index(listed[i], v)
        w[listed[i]] = F32_ZERO
    return n_above + kept


cdef int _warp_row(const float* x, Py_ssize_t v, float scale, Py_ssize_t top_k, double top_p,
                   float min_p, float* out, WarpScratch* s) noexcept nogil:
    """One row of logits x [v] -> probabilities out [v] (steps 1-7 of ``reference_warp``).
    out may be x itself: x is read only before out is written (the argmax, then element j of
    the exp pass before element j is written)."""
    cdef int status
    cdef Py_ssize_t j, best, n_domain = v
    cdef float top, inverse
    cdef double mass
    cdef uint32_t max_bits
    best = _row_argmax(x, v, &status)
    if status != OK:  # BAD_SCORES (NaN or +inf) or NO_FINITE_SCORE
        return status
    check_index(best, v)
    top = x[best]
    # hot loop: weights
    for j in range(v):
        out[j] = _exp32((x[j] - top) * scale)
    if 0 < top_k < v:
        n_domain = _cut(out, v, NULL, v, False, <double> top_k, s)
    if top_p < 1.0:
        if n_domain < v:  # top-k left few tokens: list them once (w > 0: bits >= 1)
            n_domain = _list_range(<const uint32_t*> out, v, 1, 0xFFFFFFFFu, s.domain)
            _cut(out, v, s.domain, n_domain, True, top_p, s)
        else:
            _cut(out, v, NULL, v, True, top_p, s)
    if min_p > F32_ZERO:
        # hot loop: min-p mask
        for j in range(v):
            out[j] = out[j] if out[j] >= min_p else F32_ZERO
    mass = _row_mass(out, v, s.block_sums, &max_bits)
    if max_bits >= FLOAT_INF_BITS or not mass > 0.0:
        # Weights lie in [0, 1] with a 1 at the maximum: this only happens when x changed
        # between the argmax pass and the exp pass (another thread writing the logits).
        return BAD_SCORES
    inverse = <float> (1.0 / mass)
    # hot loop: normalize
    for j in range(v):
        out[j] = out[j] * inverse
    return OK


# ---------------------------------------------------------------------------------------------
# Entries.  specverify.verify validates the scalar settings; rows and out are checked here.
# ---------------------------------------------------------------------------------------------

cdef int _warp_rows(const float* x, Py_ssize_t x_stride, Py_ssize_t n, Py_ssize_t v,
                    float scale, Py_ssize_t top_k, double top_p, float min_p, float* out,
                    Py_ssize_t out_stride, Py_ssize_t* bad_row) noexcept nogil:
    """Rows x [n, v] (x_stride floats apart) -> out [n, v] (out_stride apart)."""
    cdef WarpScratch s
    cdef Py_ssize_t i
    cdef int status = _warp_scratch_alloc(&s, v)
    if status != OK:
        return status
    for i in range(n):
        status = _warp_row(x + i * x_stride, v, scale, top_k, top_p, min_p,
                           out + i * out_stride, &s)
        if status != OK:
            bad_row[0] = i
            break
    _warp_scratch_free(&s)
    return status


cdef object _raise_row_status(int status, str name, object rows, Py_ssize_t row):
    if status == BAD_SCORES:
        raise ValueError(_inputs.describe_bad_values(_inputs.row_copy(rows, row), name, row,
                                                     allow_negative=True)
                         + " (logits must be finite or -inf)")
    if status == NO_FINITE_SCORE:
        raise ValueError(f"{name}[{row}] is -inf everywhere: no token can be sampled")
    if status == NO_MEMORY:
        raise MemoryError("specverify: could not allocate the warp kernel's scratch memory")
    if status in (BAD_TARGET_VALUES, BAD_DRAFT_VALUES, ZERO_TARGET_MASS, ZERO_DRAFT_MASS):
        # The verify kernel flagged a warped row: only a caller writing the logits during the
        # call (after the warp pass validated them) gets here.
        raise ValueError(f"{name}[{row}] changed during the call: its warped probabilities are invalid")
    raise RuntimeError(f"specverify warp kernel returned unknown status {status}")


def warp(logits, out, float scale, Py_ssize_t top_k, double top_p, float min_p):
    """Kernel entry of ``specverify.warp`` (the settings already validated and converted:
    ``scale = temperature_scale(T)``, ``min_p = min_p_threshold(min_p)`` or 0)."""
    return _warp_entry(logits, out, scale, top_k, top_p, min_p, True, False)


def convert_only_warp(logits, out=None, float scale=1.0, Py_ssize_t top_k=0, double top_p=1.0,
                      float min_p=0.0):
    """warp without its kernel: the argument handling alone (call-overhead benchmark)."""
    return _warp_entry(logits, out, scale, top_k, top_p, min_p, False, False)


cdef object _np_empty = np.empty
cdef object _np_float32 = np.float32


cdef object _warp_entry(object logits, object out, float scale, Py_ssize_t top_k, double top_p,
                        float min_p, bint run, bint converted):
    """One call of ``warp``: logits ``[n, V]`` (or ``[V]``) -> float32 probabilities in out
    (given, or a new array of the logits' kind and shape).

    The common case is read here in C: float32 logits (an exact ndarray or CPU tensor, unit inner
    stride) and, if given, out of the same shape, float32, C-contiguous and writable, either
    disjoint from the logits or the logits themselves (in place).  Anything else goes through
    ``_inputs.warp_arrays``, which converts or names the problem, and whose C-contiguous arrays
    then take the same road (``converted``: these are they)."""
    cdef _Held held = _Held()
    cdef Rows x, o
    cdef bint x_vector, o_vector
    cdef Py_ssize_t bad_row = -1
    cdef int status
    cdef object result = out
    _torch_seen()
    # (Rows, not typed memoryviews: those bring atomic reference counts, i.e. ARMv8.1 code.)
    if not (_read_float32(logits, &x, held, True, False, &x_vector) and x.cols > 0
            and (x.stride >= 0 or x.rows <= 1)):
        if converted:
            _unreadable("logits")
        return _warp_converted(logits, out, scale, top_k, top_p, min_p, run)
    if out is None:  # float32 of the logits' shape, compact (torch.empty_like: no dtype argument
        #               to parse, which costs torch.empty(shape, dtype=...) another ~0.6 µs)
        result = (_np_empty(<object> (x.cols,) if x_vector else (x.rows, x.cols), dtype=_np_float32)
                  if type(logits) is _ndarray else _torch_empty_like(logits))
        if not (_read_float32(result, &o, held, True, True, &o_vector) and (o.rows <= 1 or o.stride == o.cols)):
            _unreadable("out")
    elif not (_read_float32(out, &o, held, x_vector, True, &o_vector) and o.rows == x.rows
              and o.cols == x.cols and (o.rows <= 1 or o.stride == o.cols)
              and not (type(out) is _tensor and out.requires_grad)):  # (DLPack describes those too)
        if converted:
            _unreadable("out")
        return _warp_converted(logits, out, scale, top_k, top_p, min_p, run)
    if x.rows == 0:
        return result
    if _overlap(&x, &o) and not (x.data == o.data and (x.stride == o.stride or x.rows == 1)):
        if x.rows > 1 and x.stride != x.cols and not converted:
            # Rows apart in memory that out overlaps: the conversion reads them as a compact copy.
            return _warp_converted(logits, out, scale, top_k, top_p, min_p, run)
        raise ValueError("out overlaps logits without being the same memory (in place needs out=logits)")
    if not run:
        return None
    with nogil:
        status = _warp_rows(<const float*> x.data, x.stride, x.rows, x.cols, scale, top_k, top_p,
                            min_p, <float*> o.data, o.stride, &bad_row)
    if status != OK:
        _raise_row_status(status, "logits", logits[None] if x_vector else logits, bad_row)
    return result


cdef object _warp_converted(object logits, object out, float scale, Py_ssize_t top_k,
                            double top_p, float min_p, bint run):
    """The slow road: ``_inputs.warp_arrays`` validates and converts (C-contiguous float32
    ndarrays ``rows`` and ``target``), then the common case takes them."""
    rows, target, result = _inputs.warp_arrays(logits, out)
    _warp_entry(rows, target, scale, top_k, top_p, min_p, run, True)
    return result if run else None


cdef object _warp_per_thread = threading.local()


cdef object _scratch_rows(Py_ssize_t rows, Py_ssize_t v, float** data):
    """This thread's float32 scratch of at least [rows, v] (rows v floats apart), reused from
    call to call (a fresh multi-megabyte allocation per call would cost its page faults every
    time), and its address in ``data``.

    The caller keeps the returned array until its kernel has finished: Python code that runs on
    this thread meanwhile (a conversion's ``__array__``, a finalizer) may call an op that replaces
    the thread's scratch with a larger one, and only that reference then keeps this memory alive."""
    cdef object scratch = getattr(_warp_per_thread, "rows", None)
    cdef Rows view
    if scratch is None or scratch.shape[1] < rows * v:
        scratch = _warp_per_thread.rows = np.empty((1, max(rows * v, 1)), dtype=np.float32)
    if not _read_rows(scratch, &view, _Held()):
        _unreadable("the warp scratch")
    check_index(rows * v - 1, view.cols)
    data[0] = <float*> view.data
    return scratch


def accept_logits(target_logits, draft_logits, draft_tokens, generator, uniforms, float scale,
                  Py_ssize_t top_k, double top_p, float min_p):
    """Kernel entry of ``specverify.accept_logits`` (uniforms None: drawn from generator), the
    settings validated and converted as for ``warp``."""
    return _logits_entry(_accept, target_logits, draft_logits, draft_tokens, generator, uniforms,
                         scale, top_k, top_p, min_p)


def accept_block_logits(target_logits, draft_logits, draft_tokens, generator, uniforms, float scale,
                        Py_ssize_t top_k, double top_p, float min_p):
    """Kernel entry of ``specverify.accept_block_logits``: as ``accept_logits`` with the block
    verification kernel."""
    return _logits_entry(_accept_block, target_logits, draft_logits, draft_tokens, generator,
                         uniforms, scale, top_k, top_p, min_p)


cdef object _logits_entry(SamplingKernel kernel, object target_logits, object draft_logits,
                          object draft_tokens, object generator, object uniforms, float scale,
                          Py_ssize_t top_k, double top_p, float min_p):
    """Both sides warped into this thread's scratch rows, then verified by ``kernel`` (a
    sampling kernel of the chain or block family, which reads rows, tokens and uniforms as
    ``_accept`` does)."""
    cdef _Held held = _Held()
    cdef Rows target, draft
    cdef const int64_t* tokens
    cdef const double* u
    cdef Py_ssize_t k, v, n_accepted = 0, bad_row = -1
    cdef int64_t next_token = -1
    cdef float* warped
    cdef float* warped_draft = NULL
    cdef int status
    cdef bint draft_failed = False
    _torch_seen()
    # The ids are the call's own copy (``_tokens``): what is range-checked is what the kernel reads.
    draft_tokens = _tokens(draft_tokens, "draft_tokens", &tokens, &k, held)
    target_logits = _rows(target_logits, "target_logits", k + 1, -1, &target, held)
    v = target.cols
    if draft_logits is not None:
        draft_logits = _rows(draft_logits, "draft_logits", k, v, &draft, held)
    _check_token_range("draft_tokens", tokens, k, v)
    uniforms = _uniforms(generator, uniforms, k + 1, &u, held)
    # Last before the kernels, and held until they finish (see _scratch_rows).
    scratch = _scratch_rows(2 * k + 1 if draft_logits is not None else k + 1, v, &warped)
    if draft_logits is not None and k > 0:
        warped_draft = warped + (k + 1) * v
    with nogil:
        status = _warp_rows(<const float*> target.data, target.stride, k + 1, v, scale, top_k,
                            top_p, min_p, warped, v, &bad_row)
        if status == OK and warped_draft != NULL:
            status = _warp_rows(<const float*> draft.data, draft.stride, k, v, scale, top_k,
                                top_p, min_p, warped_draft, v, &bad_row)
            draft_failed = status != OK
        if status == OK:
            status = kernel(warped, v, warped_draft, v, tokens, k, v, u, &n_accepted,
                            &next_token, &bad_row)
    if status != OK:
        if draft_failed or status == BAD_DRAFT_VALUES or status == ZERO_DRAFT_MASS:
            _raise_row_status(status, "draft_logits", draft_logits, bad_row)
        _raise_row_status(status, "target_logits", target_logits, bad_row)
    return n_accepted, next_token
