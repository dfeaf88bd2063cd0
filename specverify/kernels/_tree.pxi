# Tree and multi-draft verification (included by _kernels.pyx): pure functions of raw float32
# rows, a validated tree and explicit uniforms (the rules and their float64 form:
# ``specverify.reference.tree``).
#
# The tree arrives as ``parents [N]`` and ``draft_tokens [N]``; the entry points copy both into the
# call's own memory, validate the copies (range, topological order — which also rules out cycles
# —, node count against the rows, distinct siblings where the rule needs them, token ids) and
# derive ``first_child [N+1]`` / ``next_sibling [N]`` (position r = root for r = 0, node r - 1
# otherwise; siblings in index order), so the loops below follow children without searching.
#
# Rows are read as the chain ops read them: a visited position's target row, and, if it has
# children and a draft law is given, its draft row with it, in one pass (``_row_pair_masses``:
# both masses and the residual's block sums at ratio 1, which are the first child's residual when
# P/Q snaps to 1); every other rejected child costs one pass over the position's target and draft
# rows (the next residual's block sums).  A masked row (children removed) re-sums
# only the blocks holding removed tokens; a draw scans one block.  Rows of positions never
# reached, and leaves' draft rows, are not read.

from libc.string cimport memcpy

cdef enum:
    # Statuses of this family (the shared ones come from _primitives).  Above theirs.
    NO_DRAFT_LEFT = 100  # without replacement: the draft law has no mass outside earlier siblings


# ---------------------------------------------------------------------------------------------
# Masked rows: a row with a few token ids counted as 0.
# ---------------------------------------------------------------------------------------------

cdef inline Py_ssize_t _masked_block(const float* x, Py_ssize_t b, Py_ssize_t v,
                                     const int64_t* removed, Py_ssize_t n_removed,
                                     float* out) noexcept nogil:
    """Copy block b of x into out (``[BLOCK]``) with the removed ids that fall in it set to 0;
    returns its width.  Summing or scanning the copy is summing or scanning x with those entries
    counted as 0: the same elements in the same lanes, a +0.0 where they were."""
    cdef Py_ssize_t start = b * BLOCK, width = min(BLOCK, v - b * BLOCK), j
    memcpy(out, x + start, width * sizeof(float))
    for j in range(n_removed):
        if start <= removed[j] < start + width:
            out[removed[j] - start] = 0.0
    return width


cdef inline double _ordered_total(const double* block_sums, Py_ssize_t n_blocks) noexcept nogil:
    """Left-to-right sum of block sums from 0.0: how ``_row_mass`` forms a row's total."""
    cdef double total = 0.0
    cdef Py_ssize_t b
    for b in range(n_blocks):
        total += block_sums[b]
    return total


cdef inline double _remove_token(const float* x, Py_ssize_t v, int64_t t, const int64_t* removed,
                                 Py_ssize_t n_removed, double* block_sums) noexcept nogil:
    """Re-sum the block of token t of x with every removed id counted as 0 (t among them) and
    return the row's new total."""
    cdef float block[BLOCK]
    cdef Py_ssize_t b = t // BLOCK
    cdef Py_ssize_t width
    check_index(t, v)
    width = _masked_block(x, b, v, removed, n_removed, block)
    block_sums[b] = _block_sum(block, width)
    return _ordered_total(block_sums, (v + BLOCK - 1) // BLOCK)


cdef inline double _residual_sums(const float* p, const float* q, Py_ssize_t v, double ratio,
                                  const int64_t* zeroed, Py_ssize_t n_zeroed,
                                  double* block_sums) noexcept nogil:
    """Block sums and total of max(0, p - q * ratio) with p counted as 0 at the zeroed ids: one
    pass over p and q, then the blocks holding zeroed ids summed again from masked copies."""
    cdef float block[BLOCK]
    cdef Py_ssize_t j, b, width
    cdef double total = _residual_block_sums(p, q, v, ratio, block_sums)
    if n_zeroed == 0:
        return total
    for j in range(n_zeroed):
        check_index(zeroed[j], v)
        b = zeroed[j] // BLOCK
        width = _masked_block(p, b, v, zeroed, n_zeroed, block)
        _residual_block_sums(block, q + b * BLOCK, width, ratio, block_sums + b)
    return _ordered_total(block_sums, (v + BLOCK - 1) // BLOCK)


# ---------------------------------------------------------------------------------------------
# One position's rules.  Return the accepted child, or -1 with the recovered token drawn.
# ---------------------------------------------------------------------------------------------

cdef int64_t _sample_and_match(const float* p, Py_ssize_t v, const double* target_blocks,
                               double p_mass, int64_t child, const int64_t* next_sibling,
                               const int64_t* tokens, const double* uniforms, double final_u,
                               int64_t* removed, double* blocks, int64_t* next_token) noexcept nogil:
    """Deterministic children: accept child j iff u_j * (P - sum_{i<j} p(c_i)) < p(c_j), the
    remaining mass summed from the row with the earlier children removed; on total rejection
    draw from p without the children (from p itself if that has no mass after rounding)."""
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK, n_removed = 0, b
    cdef double mass = p_mass, fraction
    cdef float block[BLOCK]
    cdef int64_t t
    memcpy(blocks, target_blocks, n_blocks * sizeof(double))
    while child >= 0:
        t = tokens[child]
        check_index(t, v)
        if uniforms[child] * mass < <double> p[t]:
            return child
        removed[n_removed] = t
        n_removed += 1
        mass = _remove_token(p, v, t, removed, n_removed, blocks)
        child = next_sibling[child]
    if mass > 0.0:
        b = _pick_block(blocks, n_blocks, final_u * mass, &fraction)
        check_index(b, n_blocks)
        _masked_block(p, b, v, removed, n_removed, block)
        next_token[0] = b * BLOCK + _scan_target_block(block, 0, min(BLOCK, v - b * BLOCK), fraction, -1)
    else:
        next_token[0] = _sample_target(p, v, target_blocks, p_mass, final_u)
    return -1


cdef int64_t _recursive_rejection(const float* p, const float* q, Py_ssize_t v,
                                  const double* target_blocks, double p_mass,
                                  const double* draft_blocks, double q_mass, bint replacement,
                                  int64_t child, const int64_t* next_sibling, const int64_t* tokens,
                                  const double* uniforms, double final_u, int64_t* rejected,
                                  double* residual_blocks, double first_residual_mass,
                                  double* masked_draft_blocks, int64_t* next_token,
                                  int* status) noexcept nogil:
    """Recursive rejection sampling (with replacement: SpecInfer; without: Jeon et al. 2024).

    R_0 = p.  Child j (token t) is accepted iff u_j * (q(t) * M) < R(t) * Q_j, M the residual's
    mass and Q_j the draft mass (without replacement: q without the earlier children).  On
    rejection A += M / Q_j and R = max(0, p - q * A), p counted as 0 at the children rejected
    before this one (without replacement; see ``specverify.reference.tree``); one pass each,
    except the first when ``first_residual_mass`` >= 0: residual_blocks already hold R's block
    sums at ratio 1 (``_row_pair_masses``), which are the first's when P/Q snaps to 1.  (A is a
    sum of mass quotients M / Q_j, each formed by ``_mass_ratio``.)
    """
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK, n_rejected = 0, n_zeroed, b, start, width
    cdef double residual_mass = p_mass, draft_mass = q_mass, ratio = 0.0, residual_t, fraction
    cdef float block[BLOCK]
    cdef int64_t t
    cdef bint have_residual = False
    if not replacement:
        memcpy(masked_draft_blocks, draft_blocks, n_blocks * sizeof(double))
    while child >= 0:
        t = tokens[child]
        check_index(t, v)
        if not replacement and n_rejected > 0:
            draft_mass = _remove_token(q, v, rejected[n_rejected - 1], rejected, n_rejected,
                                       masked_draft_blocks)
            if not draft_mass > 0.0:
                status[0] = NO_DRAFT_LEFT
                return child
        residual_t = _residual_weight(p[t], q[t], ratio) if have_residual else <double> p[t]
        # Accept iff u < (R(t) / M) / (q(t) / Q), written without division.
        if uniforms[child] * (<double> q[t] * residual_mass) < residual_t * draft_mass:
            return child
        ratio = ratio + _mass_ratio(residual_mass, draft_mass)
        if n_rejected == 0 and first_residual_mass >= 0.0 and ratio == 1.0:
            residual_mass = first_residual_mass  # no earlier child zeroed: the ratio-1 residual
        else:
            n_zeroed = 0 if replacement else n_rejected
            residual_mass = _residual_sums(p, q, v, ratio, rejected, n_zeroed, residual_blocks)
        rejected[n_rejected] = t
        n_rejected += 1
        have_residual = True
        child = next_sibling[child]
    if residual_mass > 0.0:
        n_zeroed = 0 if replacement else n_rejected - 1
        b = _pick_block(residual_blocks, n_blocks, final_u * residual_mass, &fraction)
        check_index(b, n_blocks)
        start = b * BLOCK
        width = _masked_block(p, b, v, rejected, n_zeroed, block)
        next_token[0] = start + _scan_residual_block(block, q + start, 0, width, ratio, fraction)
    else:
        # p <= q everywhere after rounding: p itself, as chain accept does.
        next_token[0] = _sample_target(p, v, target_blocks, p_mass, final_u)
    return -1


# ---------------------------------------------------------------------------------------------
# The ops.  Arguments are addresses of validated memory; rows are ``stride`` floats apart.
# ---------------------------------------------------------------------------------------------

cdef int _verify_tree_greedy(const float* target, Py_ssize_t target_stride, const int64_t* tokens,
                             const int64_t* first_child, const int64_t* next_sibling, Py_ssize_t v,
                             int64_t* path, Py_ssize_t* path_length, int64_t* next_token,
                             Py_ssize_t* bad_row) noexcept nogil:
    """Walk from the root: at each position take the first child whose token is the row's argmax."""
    cdef Py_ssize_t r = 0, length = 0
    cdef int64_t best, child
    cdef int status = OK
    while True:
        best = _row_argmax(target + r * target_stride, v, &status)
        if status != OK:
            bad_row[0] = r
            return status
        child = first_child[r]
        while child >= 0 and tokens[child] != best:
            child = next_sibling[child]
        if child < 0:
            path_length[0] = length
            next_token[0] = best
            return OK
        path[length] = child
        length += 1
        r = child + 1


cdef int _accept_tree(const float* target, Py_ssize_t target_stride, const float* draft,
                      Py_ssize_t draft_stride, bint replacement, const int64_t* tokens,
                      const int64_t* first_child, const int64_t* next_sibling, Py_ssize_t n,
                      Py_ssize_t v, const double* uniforms, int64_t* path, Py_ssize_t* path_length,
                      int64_t* next_token, Py_ssize_t* bad_row) noexcept nogil:
    """Multi-draft speculative sampling over a validated tree; ``draft`` NULL: deterministic
    children.  ``bad_row``: the offending row (a status from _primitives) or node (NO_DRAFT_LEFT)."""
    cdef Py_ssize_t n_blocks = (v + BLOCK - 1) // BLOCK, r = 0, length = 0
    cdef double* scratch = <double*> malloc(4 * n_blocks * sizeof(double))
    cdef int64_t* rejected = <int64_t*> malloc((n + 1) * sizeof(int64_t))
    cdef double* target_blocks = scratch
    cdef double* draft_blocks = scratch + n_blocks
    cdef double* residual_blocks = scratch + 2 * n_blocks
    cdef double* masked_draft_blocks = scratch + 3 * n_blocks
    cdef const float* p
    cdef const float* q
    cdef double p_mass, q_mass, first_residual_mass
    cdef double masses[2]
    cdef uint32_t p_bits = 0, q_bits = 0
    cdef int64_t child, accepted, t
    cdef int status = OK
    if scratch == NULL or rejected == NULL:
        free(scratch)
        free(rejected)
        return NO_MEMORY
    while True:
        p = target + r * target_stride
        child = first_child[r]
        q = draft + r * draft_stride if draft != NULL and child >= 0 else NULL
        first_residual_mass = -1.0
        t = tokens[child] if child >= 0 else 0
        check_index(t, v)
        if q != NULL:
            # As in _accept: the pair is read together, its residual at ratio 1 summed in the
            # same read as the masses.
            first_residual_mass = _row_pair_masses(p, q, v, 1.0, target_blocks, draft_blocks,
                                                   residual_blocks, masses, &p_bits)
            p_mass, q_mass, q_bits = masses[0], masses[1], p_bits
        else:
            p_mass = _row_mass(p, v, target_blocks, &p_bits)
            q_mass, q_bits = 1.0, 0
        bad_row[0] = r
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
        if child < 0:
            # A leaf: the bonus token comes from its target row.
            next_token[0] = _sample_target(p, v, target_blocks, p_mass, uniforms[n])
            break
        if q == NULL:
            accepted = _sample_and_match(p, v, target_blocks, p_mass, child, next_sibling, tokens,
                                         uniforms, uniforms[n], rejected, residual_blocks, next_token)
        else:
            accepted = _recursive_rejection(p, q, v, target_blocks, p_mass, draft_blocks, q_mass,
                                            replacement, child, next_sibling, tokens, uniforms,
                                            uniforms[n], rejected, residual_blocks,
                                            first_residual_mass, masked_draft_blocks, next_token,
                                            &status)
            if status != OK:
                bad_row[0] = accepted
                break
        if accepted < 0:
            break
        path[length] = accepted
        length += 1
        r = accepted + 1
    path_length[0] = length
    free(scratch)
    free(rejected)
    return status


# ---------------------------------------------------------------------------------------------
# Entry points: the tree is copied into the call's own memory, then validated.
# ---------------------------------------------------------------------------------------------

cdef class _Tree:
    """A validated copy of a draft tree: tokens, parents, first_child, next_sibling, path."""
    cdef int64_t* memory
    cdef int64_t* tokens        # [N]
    cdef int64_t* parents       # [N]
    cdef int64_t* first_child   # [N + 1]
    cdef int64_t* next_sibling  # [N]
    cdef Py_ssize_t n

    def __dealloc__(self):
        free(self.memory)


cdef _Tree _copy_tree(object draft_tokens, object parents, _Held held):
    """Copy both arrays into the call's memory (the caller may change theirs while we run),
    check the parents and derive the child lists.  Token ids are checked once V is known."""
    cdef const int64_t* data
    cdef Py_ssize_t n, n_parents, i
    cdef int64_t parent
    cdef int64_t* last_child
    cdef _Tree tree = _Tree()
    draft_tokens = _tokens(draft_tokens, "draft_tokens", &data, &n, held)
    tree.memory = <int64_t*> malloc((5 * n + 2) * sizeof(int64_t))
    if tree.memory == NULL:
        raise MemoryError()
    tree.n = n
    tree.tokens, tree.parents = tree.memory, tree.memory + n
    tree.first_child, tree.next_sibling = tree.memory + 2 * n, tree.memory + 3 * n + 1
    last_child = tree.memory + 4 * n + 1  # [N + 1]
    memcpy(tree.tokens, data, n * sizeof(int64_t))
    parents = _tokens(parents, "parents", &data, &n_parents, held)  # keeps a converted copy alive
    if n_parents != n:
        raise ValueError(f"parents must have one entry per draft token ({n}), got {n_parents}")
    memcpy(tree.parents, data, n * sizeof(int64_t))
    for i in range(n + 1):
        tree.first_child[i] = -1
        last_child[i] = -1
    for i in range(n):
        parent = tree.parents[i]
        if not -1 <= parent < i:
            raise ValueError(
                f"parents[{i}] = {parent}: a node's parent must be -1 (the root) or an earlier node "
                f"(nodes in topological order), so it must lie in [-1, {i})")
        tree.next_sibling[i] = -1
        if last_child[parent + 1] < 0:
            tree.first_child[parent + 1] = i
        else:
            tree.next_sibling[last_child[parent + 1]] = i
        last_child[parent + 1] = i
    return tree


cdef int _check_distinct_siblings(_Tree tree, str rule) except -1:
    cdef Py_ssize_t i
    cdef int64_t j
    for i in range(tree.n):
        j = tree.next_sibling[i]
        while j >= 0:
            if tree.tokens[j] == tree.tokens[i]:
                raise ValueError(
                    f"draft_tokens[{j}] = {tree.tokens[j]} repeats its sibling draft_tokens[{i}]: {rule} "
                    "needs distinct sibling tokens")
            j = tree.next_sibling[j]
    return 0


cdef object _new_path(Py_ssize_t n, int64_t** data, _Held held):
    """A new int64 array of n elements for the accepted path, and its address (read through the
    buffer protocol, which costs far less than a typed memoryview; the array is ours to fill)."""
    cdef const char* raw
    cdef Py_ssize_t count
    path = np.empty(n, np.int64)
    if not _read_vector(path, b'i', 8, &raw, &count, held):
        _unreadable("the accepted path")
    data[0] = <int64_t*> raw
    return path


def verify_tree_greedy(target_probs, draft_tokens, parents):
    """See specverify.verify_tree_greedy."""
    cdef _Held held = _Held()
    cdef Rows target
    cdef Py_ssize_t length = 0, bad_row = -1
    cdef int64_t next_token = -1
    cdef int64_t* path_data
    cdef int status
    _torch_seen()
    cdef _Tree tree = _copy_tree(draft_tokens, parents, held)
    target_probs = _rows(target_probs, "target_probs", tree.n + 1, -1, &target, held)
    _check_token_range("draft_tokens", tree.tokens, tree.n, target.cols)
    path = _new_path(tree.n, &path_data, held)
    with nogil:
        status = _verify_tree_greedy(<const float*> target.data, target.stride, tree.tokens,
                                     tree.first_child, tree.next_sibling, target.cols, path_data,
                                     &length, &next_token, &bad_row)
    if status != OK:
        _raise_status(status, bad_row, target_probs, None)
    return path[:length], next_token


def accept_tree(target_probs, draft_probs, draft_tokens, parents, generator=None, uniforms=None,
                bint replacement=False):
    """See specverify.accept_tree / accept_tree_from_uniforms (uniforms given: no generator)."""
    cdef _Held held = _Held()
    cdef Rows target, draft
    cdef const double* u
    cdef Py_ssize_t length = 0, bad_row = -1
    cdef int64_t next_token = -1
    cdef int64_t* path_data
    cdef int status
    _torch_seen()
    cdef _Tree tree = _copy_tree(draft_tokens, parents, held)
    target_probs = _rows(target_probs, "target_probs", tree.n + 1, -1, &target, held)
    if draft_probs is not None:
        draft_probs = _rows(draft_probs, "draft_probs", tree.n + 1, target.cols, &draft, held)
    else:
        draft.data, draft.stride = NULL, 0
    _check_token_range("draft_tokens", tree.tokens, tree.n, target.cols)
    if draft_probs is None:
        _check_distinct_siblings(tree, "the deterministic-children rule (draft_probs=None)")
    elif not replacement:
        _check_distinct_siblings(tree, "sampling without replacement (replacement=False)")
    uniforms = _uniforms(generator, uniforms, tree.n + 1, &u, held)
    path = _new_path(tree.n, &path_data, held)
    with nogil:
        status = _accept_tree(<const float*> target.data, target.stride, <const float*> draft.data,
                              draft.stride, replacement, tree.tokens, tree.first_child,
                              tree.next_sibling, tree.n, target.cols, u, path_data, &length,
                              &next_token, &bad_row)
    if status == NO_DRAFT_LEFT:
        raise ValueError(
            f"draft_probs[{tree.parents[bad_row] + 1}] has no mass outside the tokens of the earlier "
            f"siblings of node {bad_row}: it cannot have been drawn without replacement")
    if status != OK:
        _raise_status(status, bad_row, target_probs, draft_probs)
    return path[:length], next_token
