# The chain ops: greedy verification and token-wise speculative sampling (included by
# _kernels.pyx).  Kernels take addresses of validated memory; rows are ``row_stride`` floats
# apart.  Entry points validate through the readers of _args.pxi first.

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
        check_index(best, v)
        if i == k or tokens[i] != best:
            n_accepted[0] = i
            next_token[0] = best
            return OK
    return OK


cdef int _accept(const float* target, Py_ssize_t target_stride, const float* draft,
                 Py_ssize_t draft_stride, const int64_t* tokens, Py_ssize_t k, Py_ssize_t v,
                 const double* uniforms, Py_ssize_t* n_accepted, int64_t* next_token,
                 Py_ssize_t* bad_row) noexcept nogil:
    """Speculative sampling over validated rows; ``draft`` NULL means a point-mass draft.

    A position with a draft row reads its two rows together, once, for their masses and their
    residual at ratio 1 (``_row_pair_masses``), which is the residual whenever P/Q snaps to 1
    (``_mass_ratio``); any other rejection sums its residual in a second pass.  Both give the same
    bits.  (Reading the pair in one pass, even for a position that will be accepted and never
    needs the residual, was 4-5 % faster than reading the two rows one after the other, warm and
    cold, on a Zen 5: experiments.benchmarks.batch, V = 32000 and 128256.)
    """
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK
    cdef double* target_blocks = <double*> malloc(3 * n_blocks * sizeof(double))
    cdef double* draft_blocks = target_blocks + n_blocks
    cdef double* residual_blocks = draft_blocks + n_blocks
    cdef const float* p
    cdef const float* q
    cdef double p_mass, q_mass, residual_mass, ratio, fraction
    cdef double masses[2]
    cdef uint32_t p_bits = 0, q_bits = 0
    cdef Py_ssize_t i, t = 0, b, start, stop
    cdef bint residual_ready
    cdef int status = OK
    if target_blocks == NULL:
        return NO_MEMORY
    for i in range(k + 1):
        p = target + i * target_stride
        q = draft + i * draft_stride if draft != NULL and i < k else NULL
        residual_ready = False
        if i < k:
            t = tokens[i]
            check_index(t, v)
        if q != NULL:
            residual_mass = _row_pair_masses(p, q, v, 1.0, target_blocks, draft_blocks,
                                             residual_blocks, masses, &p_bits)
            p_mass, q_mass, q_bits = masses[0], masses[1], p_bits
            residual_ready = True
        else:
            p_mass = _row_mass(p, v, target_blocks, &p_bits)
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
        if q != NULL:
            # Accept iff u < (p_t / P) / (q_t / Q), written without division.
            if uniforms[i] * (<double> q[t] * p_mass) < <double> p[t] * q_mass:
                continue
            ratio = _mass_ratio(p_mass, q_mass)
            if not (residual_ready and ratio == 1.0):
                residual_mass = _residual_block_sums(p, q, v, ratio, residual_blocks)
            n_accepted[0] = i
            if residual_mass > 0.0:
                b = _pick_block(residual_blocks, n_blocks, uniforms[k] * residual_mass, &fraction)
                check_index(b, n_blocks)
                start = b * BLOCK
                next_token[0] = _scan_residual_block(p, q, start, min(start + BLOCK, v),
                                                     ratio, fraction)
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
        check_index(b, n_blocks)
        residual_blocks[b] = _block_sum_excluding(p, b * BLOCK, min(b * BLOCK + BLOCK, v), t)
        residual_mass = 0.0
        for b in range(n_blocks):
            residual_mass += residual_blocks[b]
        if residual_mass > 0.0:
            b = _pick_block(residual_blocks, n_blocks, uniforms[k] * residual_mass, &fraction)
            check_index(b, n_blocks)
            start = b * BLOCK
            next_token[0] = _scan_target_block(p, start, min(start + BLOCK, v), fraction, t)
        else:
            next_token[0] = _sample_target(p, v, target_blocks, p_mass, uniforms[k])
        break
    free(target_blocks)
    if status == OK:
        check_index(next_token[0], v)  # every scan returns an index inside its block
    return status


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
    draft_tokens = _tokens(draft_tokens, "draft_tokens", &tokens, &k, held)
    target_probs = _rows(target_probs, "target_probs", k + 1, -1, &target, held)
    _check_token_range("draft_tokens", tokens, k, target.cols)
    if not run:
        return None
    with nogil:
        status = _verify_greedy(<const float*> target.data, target.stride, tokens, k, target.cols,
                                &n_accepted, &next_token, &bad_row)
    if status != OK:
        _raise_status(status, bad_row, target_probs, None)
    return n_accepted, next_token


def accept(target_probs, draft_probs, draft_tokens, generator=None, uniforms=None):
    """See specverify.accept / specverify.accept_from_uniforms (uniforms given: no generator)."""
    return _sampling_entry(_accept, target_probs, draft_probs, draft_tokens, generator, uniforms, True)


def convert_only_accept(target_probs, draft_probs, draft_tokens, generator=None, uniforms=None):
    """accept without its kernel: the argument handling and uniform draws alone (benchmark)."""
    return _sampling_entry(_accept, target_probs, draft_probs, draft_tokens, generator, uniforms, False)


# A sampling verifier over validated rows: (target, target_stride, draft or NULL, draft_stride,
# tokens, k, v, uniforms [K+1], &n_accepted, &next_token, &bad_row) -> status.
ctypedef int (*SamplingKernel)(const float*, Py_ssize_t, const float*, Py_ssize_t, const int64_t*,
                               Py_ssize_t, Py_ssize_t, const double*, Py_ssize_t*, int64_t*,
                               Py_ssize_t*) noexcept nogil


cdef object _sampling_entry(SamplingKernel kernel, object target_probs, object draft_probs,
                            object draft_tokens, object generator, object uniforms, bint run):
    """The entry of every sampling verifier (accept, accept_block): the same readers, checks, K + 1
    uniforms and error messages, then ``kernel`` without the GIL."""
    cdef _Held held = _Held()
    cdef Rows target, draft
    cdef const int64_t* tokens
    cdef const double* u
    cdef Py_ssize_t k, n_accepted = 0, bad_row = -1
    cdef int64_t next_token = -1
    cdef int status
    _torch_seen()
    draft_tokens = _tokens(draft_tokens, "draft_tokens", &tokens, &k, held)
    target_probs = _rows(target_probs, "target_probs", k + 1, -1, &target, held)
    if draft_probs is not None:
        draft_probs = _rows(draft_probs, "draft_probs", k, target.cols, &draft, held)
    else:
        draft.data, draft.stride = NULL, 0
    _check_token_range("draft_tokens", tokens, k, target.cols)
    uniforms = _uniforms(generator, uniforms, k + 1, &u, held)
    if not run:
        return None
    with nogil:
        status = kernel(<const float*> target.data, target.stride, <const float*> draft.data,
                        draft.stride, tokens, k, target.cols, u, &n_accepted, &next_token, &bad_row)
    if status != OK:
        _raise_status(status, bad_row, target_probs, draft_probs)
    return n_accepted, next_token
