# Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, ICLR 2025), included
# by _kernels.pyx.
#
# The kernel is a pure function of validated float32 rows and K + 1 explicit uniforms; it sums in
# the documented order (``specverify.kernels._primitives``) through the shared primitives, so
# ``specverify.reference.accept_block`` reproduces it bit for bit.  The math and the edges are
# stated in ``specverify.verify.accept_block``.
#
# Reads: one fused pass (mass + validation) over every target row 0..K and draft row 0..K-1, in
# order, whatever the uniforms (so a bad row always raises); then residual passes over row pairs
# K-1, K-2, ... only as far down as the decision needs (down to tau; none when coin K passes; each
# pass's block sums serve the final draw when it decides tau).  When coin K looks set to fail
# (``_rows_needing_residuals``), the forward pass also sums the residuals of the rows the rule may
# read, at ratio 1 / p_i, which is their ratio when P_i / Q_i snaps to 1 (rows normalized alike):
# then no row is read twice.  The final draw scans one block.
#

cdef int _accept_block(const float* target, Py_ssize_t target_stride, const float* draft,
                       Py_ssize_t draft_stride, const int64_t* tokens, Py_ssize_t k, Py_ssize_t v,
                       const double* uniforms, Py_ssize_t* n_accepted, int64_t* next_token,
                       Py_ssize_t* bad_row) noexcept nogil:
    """Block verification over validated rows; ``draft`` NULL means a one-hot draft.

    target: [K+1, v] rows ``target_stride`` floats apart; draft: [K, v] or NULL; tokens: [K] in
    [0, v); uniforms: [K+1].  Outputs n_accepted (tau) and next_token; on a bad row returns its
    status and sets bad_row.

    Forward, every row once: masses, validation, the capped ratios p_1..p_K.  Then tau is found
    from the top (the largest passing coin): coin K needs nothing more; coin i < K needs Z_i, the
    residual of row pair i (summed in the forward pass, or one more pass if P_i / Q_i did not snap
    to 1), only when every coin above i has failed.  Row tau's residual gives the final draw.
    """
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK
    # [K+1, n_blocks] target block sums, [K, n_blocks] residual block sums (row i's in slot i),
    # [n_blocks] draft scratch, then per row: masses P_i, Q_i, capped ratios p_0..p_K and the
    # residual mass summed in the forward pass (-1: not summed there).
    cdef double* memory = <double*> malloc(((2 * k + 2) * n_blocks + 4 * k + 2) * sizeof(double))
    cdef double* target_blocks = memory
    cdef double* residual_blocks = target_blocks + (k + 1) * n_blocks
    cdef double* draft_blocks = residual_blocks + k * n_blocks
    cdef double* p_mass = draft_blocks + n_blocks
    cdef double* q_mass = p_mass + k + 1
    cdef double* survival = q_mass + k
    cdef double* forward_residual_mass = survival + k + 1
    cdef const float* p
    cdef const float* q
    cdef double c = 0.0, d = 0.0, residual_mass = 0.0, passed, fraction
    cdef double masses[2]
    cdef uint32_t p_bits = 0, q_bits = 0
    cdef Py_ssize_t i, t = 0, tau, b, start, fuse_from
    cdef int status = OK
    if memory == NULL:
        return NO_MEMORY
    survival[0] = 1.0
    fuse_from = _rows_needing_residuals(target, target_stride, draft, draft_stride, tokens, k,
                                        uniforms[k - 1] if k > 0 else 0.0)
    for i in range(k + 1):
        p = target + i * target_stride
        q = draft + i * draft_stride if draft != NULL and i < k else NULL
        q_bits = 0
        if i < k:
            t = tokens[i]
            check_index(t, v)
            forward_residual_mass[i] = -1.0
        if q != NULL and i >= fuse_from and survival[i] > 0.0:
            # Row i's residual has ratio (P_i / Q_i) / p_i: 1 / p_i, known before the read,
            # whenever P_i / Q_i snaps to 1.  Summed with the masses, it spares the residual pass.
            forward_residual_mass[i] = _row_pair_masses(p, q, v, 1.0 / survival[i],
                                                        target_blocks + i * n_blocks, draft_blocks,
                                                        residual_blocks + i * n_blocks, masses, &p_bits)
            p_mass[i], q_mass[i], q_bits = masses[0], masses[1], p_bits
        else:
            p_mass[i] = _row_mass(p, v, target_blocks + i * n_blocks, &p_bits)
            if i < k:
                q_mass[i] = _row_mass(q, v, draft_blocks, &q_bits) if q != NULL else 1.0
        bad_row[0] = i
        if p_bits >= FLOAT_INF_BITS and not _all_valid(p, v):
            status = BAD_TARGET_VALUES
        elif q_bits >= FLOAT_INF_BITS and not _all_valid(q, v):
            status = BAD_DRAFT_VALUES
        elif not p_mass[i] > 0.0:
            status = ZERO_TARGET_MASS
        elif i < k and not q_mass[i] > 0.0:
            status = ZERO_DRAFT_MASS
        if status != OK:
            free(memory)
            return status
        if i < k:
            survival[i + 1] = _survival_step(survival[i], p[t], q[t] if q != NULL else 1.0,
                                             p_mass[i], q_mass[i], &c, &d)

    # tau: the largest i whose coin passes.  Coin K: u < p_K, tested as accept tests it.
    tau = k
    if k > 0 and not uniforms[k - 1] * d < c:
        tau = 0
        for i in range(k - 1, 0, -1):
            if survival[i] == 0.0:  # h_i = 0
                continue
            if survival[i] >= 1.0:  # h_i = 1
                tau = i
                break
            residual_mass = _row_residual(target, target_stride, draft, draft_stride, tokens, v, i,
                                          p_mass[i], q_mass[i], survival[i], target_blocks,
                                          forward_residual_mass[i], residual_blocks + i * n_blocks)
            # u < h_i = Z_i / (Z_i + 1 - p_i) with Z_i = p_i * W_i / P_i, times P_i
            passed = survival[i] * residual_mass
            if uniforms[i - 1] * (passed + (1.0 - survival[i]) * p_mass[i]) < passed:
                tau = i
                break
        if survival[tau] >= 1.0:  # tau decided without its residual (p_0 = 1 too): the draw needs it
            residual_mass = _row_residual(target, target_stride, draft, draft_stride, tokens, v, tau,
                                          p_mass[tau], q_mass[tau], survival[tau], target_blocks,
                                          forward_residual_mass[tau], residual_blocks + tau * n_blocks)
    n_accepted[0] = tau
    p = target + tau * target_stride
    if tau == k or not residual_mass > 0.0:
        # The bonus row, or a residual empty after rounding (only reachable through rounding:
        # p_tau * P_tau <= Q_tau everywhere): row tau itself, as accept does.
        next_token[0] = _sample_target(p, v, target_blocks + tau * n_blocks, p_mass[tau], uniforms[k])
    else:
        b = _pick_block(residual_blocks + tau * n_blocks, n_blocks, uniforms[k] * residual_mass, &fraction)
        check_index(b, n_blocks)
        start = b * BLOCK
        if draft != NULL:
            next_token[0] = _scan_residual_block(p, draft + tau * draft_stride, start, min(start + BLOCK, v),
                                                 _mass_ratio(p_mass[tau], q_mass[tau]) / survival[tau],
                                                 fraction)
        else:
            next_token[0] = _scan_target_block(p, start, min(start + BLOCK, v), fraction, tokens[tau])
    free(memory)
    check_index(next_token[0], v)
    return OK


cdef inline double _survival_step(double survival, double p_t, double q_t, double p_mass,
                                  double q_mass, double* c, double* d) noexcept nogil:
    """p_{i+1} = min(1, c / d) with c = p_i * (p_t * Q), d = q_t * P (reference.block_survival_step):
    0 when c == 0, 1 when c >= d; c and d are kept for coin K's test (u * d < c)."""
    c[0] = survival * (p_t * q_mass)
    d[0] = q_t * p_mass
    return 0.0 if c[0] == 0.0 else (1.0 if c[0] >= d[0] else c[0] / d[0])


cdef inline Py_ssize_t _rows_needing_residuals(const float* target, Py_ssize_t target_stride,
                                               const float* draft, Py_ssize_t draft_stride,
                                               const int64_t* tokens, Py_ssize_t k,
                                               double last_coin) noexcept nogil:
    """The first row whose residual the forward pass should sum (K: none), from the drafted
    tokens' probabilities alone (p_i predicted with P = Q, before any row is read): none if coin K
    looks set to pass (u < p_K: no residual is read then); else rows m..K-1, m the last row with
    p_i = 1 (tau >= m, so rows below m are never needed; the rule reads the others' residuals
    whenever the coins above them fail).  A wrong guess costs time, never bits."""
    cdef double predicted = 1.0, c, d
    cdef Py_ssize_t i, t, last_certain = 0
    if draft == NULL or k == 0:
        return k
    for i in range(k):
        if predicted >= 1.0:
            last_certain = i
        t = tokens[i]  # checked against V by the entry
        predicted = _survival_step(predicted, target[i * target_stride + t],
                                   draft[i * draft_stride + t], 1.0, 1.0, &c, &d)
    if last_coin < predicted:
        return k
    return last_certain


cdef inline double _row_residual(const float* target, Py_ssize_t target_stride, const float* draft,
                                 Py_ssize_t draft_stride, const int64_t* tokens, Py_ssize_t v,
                                 Py_ssize_t i, double p_mass, double q_mass, double survival,
                                 const double* target_blocks, double forward_mass,
                                 double* residual_blocks) noexcept nogil:
    """W_i, with the block sums of row pair i's residual in residual_blocks [n_blocks]: weights
    max(0, p - q * r), r = _mass_ratio(P, Q) / p_i (accept's residual, its ratio divided by
    p_i > 0).  Those the forward pass summed at r = 1 / p_i (forward_mass >= 0) stand when
    P / Q snapped to 1; otherwise the row pair is read again.

    A one-hot draft (``draft`` NULL) on t: the weights are row i with p[t] counted as 0 (any
    positive ratio zeroes it), so the target's block sums (target_blocks, [K+1, n_blocks]) are
    reused and only t's block is summed again.
    """
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK, b, t = tokens[i]
    cdef const float* p = target + i * target_stride
    cdef double total = 0.0, ratio
    if draft != NULL:
        ratio = _mass_ratio(p_mass, q_mass)
        if forward_mass >= 0.0 and ratio == 1.0:
            return forward_mass
        return _residual_block_sums(p, draft + i * draft_stride, v, ratio / survival, residual_blocks)
    for b in range(n_blocks):
        residual_blocks[b] = target_blocks[i * n_blocks + b]
    b = t // BLOCK
    check_index(b, n_blocks)
    residual_blocks[b] = _block_sum_excluding(p, b * BLOCK, min(b * BLOCK + BLOCK, v), t)
    for b in range(n_blocks):
        total += residual_blocks[b]
    return total


# ---------------------------------------------------------------------------------------------
# Entry points: the same readers, checks and uniforms as accept (_sampling_entry, _chain.pxi).
# ---------------------------------------------------------------------------------------------

def accept_block(target_probs, draft_probs, draft_tokens, generator=None, uniforms=None):
    """See specverify.accept_block / specverify.accept_block_from_uniforms."""
    return _sampling_entry(_accept_block, target_probs, draft_probs, draft_tokens, generator, uniforms, True)


def convert_only_accept_block(target_probs, draft_probs, draft_tokens, generator=None, uniforms=None):
    """accept_block without its kernel: the argument handling and uniform draws alone (benchmark)."""
    return _sampling_entry(_accept_block, target_probs, draft_probs, draft_tokens, generator, uniforms, False)
