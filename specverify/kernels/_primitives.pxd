# cython: language_level=3
# specverify's per-row primitives and the numeric contract they implement, documented once.
#
# Every op family (``_chain.pxi``, and each new one, all included by ``_kernels.pyx``) builds
# on these ``inline`` loops: pure functions of raw float32 rows and explicit uniforms that trust
# their callers.  The entry points validate first (``_args.pxi`` for the common case,
# ``specverify.kernels._inputs`` for everything else): shapes, dtypes, strides and token ids are checked before any pointer reaches
# a loop, and the per-element checks (NaN, Inf, negative values, zero mass) are folded into the
# single pass that reads each row.  Directives live in ``setup.py``.
#
# Numeric contract (v2: float32 lanes inside a block).  Fixed and written out, so x86-64 (SSE,
# AVX2 or AVX-512) and aarch64 (NEON) give the same bits and ``specverify.reference`` reproduces
# them with NumPy float32 arithmetic.  u = 2^-24 is float32's unit roundoff.
#
# Block sums of a row of float32 weights w[0:n]:
# - the row is cut into blocks of BLOCK = 256 elements (the last one may be short: it is summed
#   as if zero-padded, which changes nothing);
# - inside a block, element j goes to lane j % LANES (LANES = 64, whatever the vector width: four
#   AVX-512 vectors, eight AVX2, sixteen NEON; each step reads 256 contiguous bytes); each lane is
#   a float32 accumulator starting at +0.0 and summed in increasing j (4 elements per lane);
# - the 64 lanes are combined in float32 by halving: lane l + half is added to lane l for
#   half = 32, 16, 8, 4, 2, 1 (``sv_lane_tree``); lane 0 is the block sum;
# - a block whose float32 sum overflows (only when its values add up past 3.4e38) is summed again
#   in the same order with each element multiplied by 2^-32 first, and the sum multiplied by 2^32
#   in float64 (exact for every element >= 2^-117; the rest lie 2^-240 below the block's sum);
# - each block sum is converted to float64 (exactly); the row total is the left-to-right float64
#   sum of its block sums, starting from 0.0.
#
# Mass ratios: the quotient of two masses (P/Q for accept's residual) is formed in float64 and
# taken as exactly 1 when within 2^-20 of 1 (``_mass_ratio``); a rule that scales it (block
# verification divides by p_i, the tree rules add quotients) does so after that.
#
# Residual weights for a target row p, draft row q and ratio r (P/Q for accept): in float32,
#   w = max(0, p - x),  x = ((q * a) * b) * c,  each product rounded to float32,
# with (a, b, c) = _ratio_factors(r): c = float32(r) and a = b = 1 (so x = q * float32(r)) when
# 2^-101 <= r < 2^100; beyond that, a and b are powers of two carrying the excess exponent (half
# each) and c = float32(r / (a * b)), so that x overflows only where q * r > 3.4e38 >= p (w = 0
# either way) and no factor is Inf or 0 (q = 0 gives x = 0, w = p).  r is clamped to
# [2^-300, 2^300] first, which changes no weight (every q > 0 then overflows, or underflows to 0).
# Why the snap to 1: two masses are each known to a relative ~gamma_9 (below), so a quotient
# within 2^-20 ~ 9.5e-7 of 1 is 1 to the accuracy it has.  Rows normalized to the same mass (every
# softmax) land there, so the residual's ratio is known before the rows are read (1 for accept,
# 1/p_i for block verification) and can be summed in the same read as the masses
# (``_row_pair_masses``): a rejection reads its rows once, not twice.
#
# Draws (inverse CDF) from weights with a uniform v: the block is the first whose running float64
# sum of block sums exceeds v * total; f = (v * total - sum before it) / its block sum, in [0, 1).
# Inside the block, the same float32 weights are summed in float64 (SCAN_LANES = 8 lanes, j % 8,
# halving tree) into S, and the element drawn is the first with positive
# weight whose running float64 sum (increasing j) exceeds f * S; if rounding lets the running sum
# fall short, the block's last positive weight.  So the block is chosen with its float32-lane sum
# and the element inside it with probability w[j] / S, exact up to float64 roundings.  (A scan
# accumulating in float32, or not rescaled to the block sum, would end up to ~10 u of the block
# away from the block sum and hand that difference to the block's last positive element, however
# small its weight.)
#
# Error bounds.  In a full block each element meets at most 3 float32 additions in its lane and 6
# in the tree, all of non-negative values, so (Higham, Accuracy and Stability of Numerical
# Algorithms, 2nd ed., (4.4)) a block sum has relative error <= gamma_9 = 9 u / (1 - 9 u)
# ~ 5.4e-7 (sums whose partial sums stay subnormal are exact); the float64 combination adds at
# most (B - 1) * 2^-53 for B blocks (5.6e-14 at V = 128256).  Hence:
# - a row mass has relative error <= ~gamma_9; a mass ratio P/Q and an acceptance probability
#   min(1, p_t Q / (q_t P)) (decided in float64 from them) <= ~2 gamma_9 ~ 1.1e-6;
# - a draw picks index j with probability w_j / sum(w) times a factor in 1 +- 2 gamma_9 (block b
#   carries its float32 sum over its float64 sum, within 1 +- gamma_9);
# - a residual weight carries, besides the mass ratio's error and its snap to 1, at most 3
#   float32 roundings: an error <= ~(2 gamma_9 + 2^-20 + 3 u) q_j P/Q + u w_j, relative to w_j
#   except where p_j and q_j P/Q agree to ~2e-6 (there float32 cannot resolve the difference;
#   such tokens reach the residual only as often as p and q disagree, ~2e-6 of the rounds they
#   appear in).
# So each emitted token's probability is within a relative ~4 gamma_9 + 2^-20 ~ 3e-6 of the exact
# law of the float32 inputs, away from that near-cancellation.  A chi-square test of N rounds
# against a relative bias eps has noncentrality <= N * eps^2: 0.01 for N = 1e9, so its power stays
# at its level; a test needs N ~ 1e11 rounds to see it.
#
# Exact edges: p == q gives P == Q, r = 1, w = 0 everywhere (so p is drawn: a zero residual falls
# back to p); p = 2^k q (exactly, no partial sum subnormal) gives P = 2^k Q and w = 0 too; the
# snap moves no edge: it touches only the residual weights, never the accept test; the
# accept test u * (q_t * P) < p_t * Q stays float64, so p == q (at any power-of-two scale) always
# accepts, q_t = 0 accepts iff p_t > 0, p_t = 0 never does, and w_j = 0 wherever p_j = 0.
#
# No reassociation flags are used: the lanes are written out, so the compiler vectorizes them as
# they stand, and ``-ffp-contract=off`` keeps every product rounded on its own.

from libc.float cimport DBL_MAX, FLT_MAX
from libc.math cimport frexp, ldexp
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t

cdef enum:
    LANES = 64          # float32 lanes per block: four AVX-512 vectors, eight AVX2, sixteen NEON
    BLOCK = 256
    STEPS = BLOCK // LANES
    SIGN_LANES = 16     # lanes of the validation's OR of bits (a quarter of LANES: one vector)
    SCAN_LANES = 8      # float64 lanes of a draw's in-block total
    ARGMAX_BLOCK = 512  # argmax blocks: no summation order to keep, so larger (fewer reductions)
    CACHE_LINE = 64
    RATIO_EXPONENT = 100  # mass ratios in [2^-101, 2^100) enter as one float32 factor

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

# Constants of the contract (C99 hexadecimal literals: exact powers of two).
cdef extern from *:
    """
    #define SV_RESCUE_DOWN 0x1p-32f
    #define SV_RESCUE_UP 0x1p32
    #define SV_RATIO_LOWEST 0x1p-300
    #define SV_RATIO_HIGHEST 0x1p300
    #define SV_RATIO_LOW 0x1p-101
    #define SV_RATIO_HIGH 0x1p100
    #define SV_RATIO_SNAP 0x1p-20
    """
    const float RESCUE_DOWN "SV_RESCUE_DOWN"      # overflowed block: elements scaled by 2^-32
    const double RESCUE_UP "SV_RESCUE_UP"         # and its sum scaled back by 2^32
    const double RATIO_LOWEST "SV_RATIO_LOWEST"   # mass ratios are clamped to [2^-300, 2^300]
    const double RATIO_HIGHEST "SV_RATIO_HIGHEST"
    const double RATIO_LOW "SV_RATIO_LOW"         # ratios in [2^-101, 2^100): one factor
    const double RATIO_HIGH "SV_RATIO_HIGH"
    const double RATIO_SNAP "SV_RATIO_SNAP"       # ratios within 2^-20 of 1 are taken as exactly 1

# The lane tree of a block, in C: lane l + half folds into lane l for half = 32, 16, 8, 4, 2, 1.
# GCC/Clang vector types spell the first four levels as whole-vector adds of the two halves,
# which every target lowers to its own shuffles (AVX-512: two zmm adds, then extracts; NEON: q
# registers); written as Cython loops, gcc scalarizes the tree wherever it inlines it into a row
# loop (~60 scalar adds per block, a quarter of the pass).  Same IEEE adds, same order: same bits.
cdef extern from *:
    """
    #if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
    typedef float sv_f32x16 __attribute__((vector_size(64)));
    typedef float sv_f32x8 __attribute__((vector_size(32)));
    typedef float sv_f32x4 __attribute__((vector_size(16)));
    static inline float sv_lane_tree(const float* a) {
        sv_f32x16 v0, v1, v2, v3, g;
        sv_f32x8 f;
        sv_f32x4 e;
        memcpy(&v0, a, 64);
        memcpy(&v1, a + 16, 64);
        memcpy(&v2, a + 32, 64);
        memcpy(&v3, a + 48, 64);
        g = (v0 + v2) + (v1 + v3);                 /* half = 32 (lanes 0-15, 16-31), then 16 */
        f = __builtin_shufflevector(g, g, 0, 1, 2, 3, 4, 5, 6, 7)
            + __builtin_shufflevector(g, g, 8, 9, 10, 11, 12, 13, 14, 15);   /* half = 8 */
        e = __builtin_shufflevector(f, f, 0, 1, 2, 3)
            + __builtin_shufflevector(f, f, 4, 5, 6, 7);                      /* half = 4 */
        return (e[0] + e[2]) + (e[1] + e[3]);      /* half = 2, then 1 */
    }
    #endif
    /* _lane_sum's loop for AVX-512 (four 16-float vectors per 256-byte step, each loaded once,
       feeding the lane sums and the OR of the elements' bits).  Written as Cython loops, gcc
       loads every element twice on x86-64, once as a memory operand of each use, and those
       loads bound the pass; the empty asm pins each loaded vector in its register.  AVX2 has
       its own version below; other targets (NEON has no memory operands) keep the portable
       loop; SV_PORTABLE_LOOPS forces it (tools/check_vectorization.py checks those loops). */
    #if defined(__AVX512F__) && !defined(SV_PORTABLE_LOOPS) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
    #define SV_WIDE_LANE_SUM 1
    #include <immintrin.h>
    typedef unsigned int sv_u32x16 __attribute__((vector_size(64)));
    /* One 256-byte step x[0:64] into four vectors, each pinned in its register. */
    #define SV_LOAD_STEP(x, v0, v1, v2, v3) do {                          \
            memcpy(&(v0), (x), 64);                                          \
            memcpy(&(v1), (x) + 16, 64);                                     \
            memcpy(&(v2), (x) + 32, 64);                                     \
            memcpy(&(v3), (x) + 48, 64);                                     \
            __asm__("" : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3));            \
        } while (0)
    static inline float sv_lane_sum(const float* x, Py_ssize_t steps, unsigned int* signs) {
        sv_f32x16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, v0, v1, v2, v3;
        sv_u32x16 bits;
        float lanes[64];
        Py_ssize_t step;
        memcpy(&bits, signs, 64);
        /* Not unrolled: gcc would unroll a block's four steps and hoist all their loads; in
           the row-pair loop below that spilled a dozen vectors to the stack per block
           (accept_block 1.1-1.3x slower warm). */
        #pragma GCC unroll 1
        for (step = 0; step < steps; step++) {
            SV_LOAD_STEP(x + 64 * step, v0, v1, v2, v3);
            s0 += v0; s1 += v1; s2 += v2; s3 += v3;   /* lanes 0-15, 16-31, 32-47, 48-63 */
            bits |= ((sv_u32x16) v0 | (sv_u32x16) v1) | ((sv_u32x16) v2 | (sv_u32x16) v3);
        }
        memcpy(signs, &bits, 64);
        memcpy(lanes, &s0, 64);
        memcpy(lanes + 16, &s1, 64);
        memcpy(lanes + 32, &s2, 64);
        memcpy(lanes + 48, &s3, 64);
        return sv_lane_tree(lanes);
    }
    /* The same for a row pair p, q: sums[0:3] = the lane sums of p, of q and of the residual
       weights max(0, p - q * c), the bits of both rows OR-ed into one mask.  The positive part
       is a signed 32-bit integer max of d's bits with 0 (SV_POSITIVE_PART): for every d that is
       not NaN it is the scalar d > 0 ? d : 0 exactly (negative values, -Inf and -0.0 have the
       sign bit set, so they give +0.0), and it runs on the vector integer pipes, leaving Zen 4's
       two float-add pipes, which bound this loop, to the 16 subtractions and 48 sums of a
       block (max_ps shares those pipes: accept_block worst warm was 6-11% slower).  d is never
       NaN in a valid row (p and q finite, q * c finite or +Inf); a row holding a NaN or Inf is
       rejected through the bits this pass ORs, whatever its sums.  With c == 1 (accept's ratio)
       the product is skipped (q * 1 == q), so that case compiles without it. */
    #define SV_POSITIVE_PART(d) ((sv_f32x16) _mm512_max_epi32((__m512i) (d), _mm512_setzero_si512()))
    static inline __attribute__((always_inline)) void sv_pair_steps(
            const float* p, const float* q, float c, int scaled, Py_ssize_t steps,
            unsigned int* signs, float* sums) {
        sv_f32x16 cv = {c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c};
        sv_f32x16 sp0 = {0}, sp1 = {0}, sp2 = {0}, sp3 = {0}, sq0 = {0}, sq1 = {0}, sq2 = {0}, sq3 = {0};
        sv_f32x16 sw0 = {0}, sw1 = {0}, sw2 = {0}, sw3 = {0};
        sv_f32x16 p0, p1, p2, p3, q0, q1, q2, q3, x0, x1, x2, x3;
        sv_u32x16 bits;
        float lanes[64];
        Py_ssize_t step;
        memcpy(&bits, signs, 64);
        #pragma GCC unroll 1  /* as in sv_lane_sum: one step's vectors at a time stay in registers */
        for (step = 0; step < steps; step++) {
            SV_LOAD_STEP(p + 64 * step, p0, p1, p2, p3);
            SV_LOAD_STEP(q + 64 * step, q0, q1, q2, q3);
            sp0 += p0; sp1 += p1; sp2 += p2; sp3 += p3;
            sq0 += q0; sq1 += q1; sq2 += q2; sq3 += q3;
            if (scaled) {
                x0 = q0 * cv; x1 = q1 * cv; x2 = q2 * cv; x3 = q3 * cv;
            } else {
                x0 = q0; x1 = q1; x2 = q2; x3 = q3;
            }
            sw0 += SV_POSITIVE_PART(p0 - x0);
            sw1 += SV_POSITIVE_PART(p1 - x1);
            sw2 += SV_POSITIVE_PART(p2 - x2);
            sw3 += SV_POSITIVE_PART(p3 - x3);
            bits |= (((sv_u32x16) p0 | (sv_u32x16) p1) | ((sv_u32x16) p2 | (sv_u32x16) p3))
                    | (((sv_u32x16) q0 | (sv_u32x16) q1) | ((sv_u32x16) q2 | (sv_u32x16) q3));
        }
        memcpy(signs, &bits, 64);
        memcpy(lanes, &sp0, 64); memcpy(lanes + 16, &sp1, 64);
        memcpy(lanes + 32, &sp2, 64); memcpy(lanes + 48, &sp3, 64);
        sums[0] = sv_lane_tree(lanes);
        memcpy(lanes, &sq0, 64); memcpy(lanes + 16, &sq1, 64);
        memcpy(lanes + 32, &sq2, 64); memcpy(lanes + 48, &sq3, 64);
        sums[1] = sv_lane_tree(lanes);
        memcpy(lanes, &sw0, 64); memcpy(lanes + 16, &sw1, 64);
        memcpy(lanes + 32, &sw2, 64); memcpy(lanes + 48, &sw3, 64);
        sums[2] = sv_lane_tree(lanes);
    }
    #elif defined(__AVX2__) && !defined(SV_PORTABLE_LOOPS) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
    /* The same loops for AVX2 (eight-float vectors, sixteen registers): the same lanes in the
       same order, so the same bits.  The portable loops compiled for AVX2 loaded most elements
       two or three times (as memory operands of the sum, the minimum and the product), took the
       positive part as a compare and a mask and multiplied by c == 1; on a Zen 3 accept ran at
       1.9-2.3x its warm floor at V = 32000. */
    #define SV_WIDE_LANE_SUM 1
    #include <immintrin.h>
    typedef unsigned int sv_u32x8 __attribute__((vector_size(32)));
    /* Eight floats at x into v, pinned in a register (one load for all of its uses). */
    #define SV_LOAD8(x, v) do { memcpy(&(v), (x), 32); __asm__("" : "+x"(v)); } while (0)
    /* One vector of a step: lanes 8i..8i+7 of the 64. */
    #define SV_SUM8(i) do {                                            \
            SV_LOAD8(x + 64 * step + 8 * (i), v);                      \
            s##i += v;                                                 \
            bits |= (sv_u32x8) v;                                      \
        } while (0)
    static inline float sv_lane_sum(const float* x, Py_ssize_t steps, unsigned int* signs) {
        sv_f32x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0}, v;
        sv_u32x8 bits;
        float lanes[64];
        Py_ssize_t step;
        memcpy(&bits, signs, 32);   /* the first 8 of the SIGN_LANES words carry the bits */
        #pragma GCC unroll 1
        for (step = 0; step < steps; step++) {
            SV_SUM8(0); SV_SUM8(1); SV_SUM8(2); SV_SUM8(3);
            SV_SUM8(4); SV_SUM8(5); SV_SUM8(6); SV_SUM8(7);
        }
        memcpy(signs, &bits, 32);
        memcpy(lanes, &s0, 32); memcpy(lanes + 8, &s1, 32);
        memcpy(lanes + 16, &s2, 32); memcpy(lanes + 24, &s3, 32);
        memcpy(lanes + 32, &s4, 32); memcpy(lanes + 40, &s5, 32);
        memcpy(lanes + 48, &s6, 32); memcpy(lanes + 56, &s7, 32);
        return sv_lane_tree(lanes);
    }
    #undef SV_SUM8
    /* The row pair, a quarter of the lanes (16: two vectors of each row) at a time, each lane
       still in increasing j: 48 accumulators do not fit sixteen registers, 6 do.  The positive
       part is vpmaxsd of d's bits with 0, as with AVX-512 (see there), and c == 1 skips the
       product. */
    #define SV_POSITIVE_PART8(d) \
        ((sv_f32x8) _mm256_max_epi32((__m256i) (d), _mm256_setzero_si256()))
    static inline __attribute__((always_inline)) void sv_pair_steps(
            const float* p, const float* q, float c, int scaled, Py_ssize_t steps,
            unsigned int* signs, float* sums) {
        sv_f32x8 cv = {c, c, c, c, c, c, c, c};
        sv_f32x8 p0, p1, q0, q1, x0, x1;
        sv_u32x8 bits;
        float lanes_p[64], lanes_q[64], lanes_w[64];
        Py_ssize_t step, quarter, j;
        memcpy(&bits, signs, 32);
        for (quarter = 0; quarter < 4; quarter++) {
            sv_f32x8 sp0 = {0}, sp1 = {0}, sq0 = {0}, sq1 = {0}, sw0 = {0}, sw1 = {0};
            #pragma GCC unroll 1
            for (step = 0; step < steps; step++) {
                j = 64 * step + 16 * quarter;
                SV_LOAD8(p + j, p0); SV_LOAD8(p + j + 8, p1);
                SV_LOAD8(q + j, q0); SV_LOAD8(q + j + 8, q1);
                sp0 += p0; sp1 += p1;
                sq0 += q0; sq1 += q1;
                if (scaled) {
                    x0 = q0 * cv; x1 = q1 * cv;
                } else {
                    x0 = q0; x1 = q1;
                }
                sw0 += SV_POSITIVE_PART8(p0 - x0);
                sw1 += SV_POSITIVE_PART8(p1 - x1);
                bits |= ((sv_u32x8) p0 | (sv_u32x8) p1) | ((sv_u32x8) q0 | (sv_u32x8) q1);
            }
            memcpy(lanes_p + 16 * quarter, &sp0, 32); memcpy(lanes_p + 16 * quarter + 8, &sp1, 32);
            memcpy(lanes_q + 16 * quarter, &sq0, 32); memcpy(lanes_q + 16 * quarter + 8, &sq1, 32);
            memcpy(lanes_w + 16 * quarter, &sw0, 32); memcpy(lanes_w + 16 * quarter + 8, &sw1, 32);
        }
        memcpy(signs, &bits, 32);
        sums[0] = sv_lane_tree(lanes_p);
        sums[1] = sv_lane_tree(lanes_q);
        sums[2] = sv_lane_tree(lanes_w);
    }
    #else
    #define SV_WIDE_LANE_SUM 0
    static inline float sv_lane_sum(const float* x, Py_ssize_t steps, unsigned int* signs) {
        (void) x; (void) steps; (void) signs;
        return 0.0f;   /* never called: SV_WIDE_LANE_SUM is 0 */
    }
    static inline void sv_pair_lane_sums(const float* p, const float* q, float c, Py_ssize_t steps,
                                         unsigned int* signs, float* sums) {
        (void) p; (void) q; (void) c; (void) steps; (void) signs; (void) sums;   /* never called */
    }
    #endif
    #if SV_WIDE_LANE_SUM
    /* Either wide sv_pair_steps, with the product compiled out for accept's ratio c == 1. */
    static inline void sv_pair_lane_sums(const float* p, const float* q, float c, Py_ssize_t steps,
                                         unsigned int* signs, float* sums) {
        if (c == 1.0f)
            sv_pair_steps(p, q, 1.0f, 0, steps, signs, sums);
        else
            sv_pair_steps(p, q, c, 1, steps, signs, sums);
    }
    #endif
    #if !(defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
    static inline float sv_lane_tree(const float* a) {
        float t[64];
        int half, l;
        for (l = 0; l < 64; l++) t[l] = a[l];
        for (half = 32; half > 0; half /= 2)
            for (l = 0; l < half; l++) t[l] = t[l] + t[l + half];
        return t[0];
    }
    #endif
    """
    float lane_tree "sv_lane_tree"(const float* a) noexcept nogil
    const bint WIDE_LANE_SUM "SV_WIDE_LANE_SUM"
    float lane_sum "sv_lane_sum"(const float* x, Py_ssize_t steps, uint32_t* signs) noexcept nogil
    void pair_lane_sums "sv_pair_lane_sums"(const float* p, const float* q, float c, Py_ssize_t steps,
                                            uint32_t* signs, float* sums) noexcept nogil


# Index checks for debug builds (setup.py: SPECVERIFY_BUILD=debug or asan, or
# SPECVERIFY_BOUNDSCHECK=1, define SV_BOUNDSCHECK): every index the loops compute from data (token
# ids, picked blocks, scan results, argmax block starts) is checked against its bound, and a
# miss aborts with a message.  Cython's own boundscheck cannot see these: the kernels index raw
# pointers.  In release builds the macro is nothing at all.
cdef extern from *:
    """
    #ifdef SV_BOUNDSCHECK
    #include <stdio.h>
    #include <stdlib.h>
    static void sv_index_error(long long i, long long n, const char* what, int line) {
        fprintf(stderr, "specverify: index %s = %lld outside [0, %lld) at line %d of %s\\n",
                what, i, n, line, __FILE__);
        abort();
    }
    #define SV_CHECK_INDEX(i, n) ((size_t) (i) >= (size_t) (n) ? sv_index_error((i), (n), #i, __LINE__) : (void) 0)
    #define SV_BOUNDSCHECKED 1
    #else
    #define SV_CHECK_INDEX(i, n) ((void) 0)
    #define SV_BOUNDSCHECKED 0
    #endif
    """
    void check_index "SV_CHECK_INDEX"(Py_ssize_t i, Py_ssize_t n) noexcept nogil
    const bint BOUNDSCHECKED "SV_BOUNDSCHECKED"


# ---------------------------------------------------------------------------------------------
# Per-row primitives.  Reused by every op; each reads its row(s) exactly once.
# ---------------------------------------------------------------------------------------------

cdef inline bint _all_valid(const float* x, Py_ssize_t n) noexcept nogil:
    """True iff every element is finite and non-negative, -0.0 allowed.

    Only called when a row pass flagged the row (``_row_mass``'s max_bits): that cheap test (a
    sign bit riding on the sums) also fires on -0.0, which this slower scan lets through.
    """
    cdef const uint32_t* xb = <const uint32_t*> x
    cdef Py_ssize_t j
    for j in range(n):
        if xb[j] >= FLOAT_INF_BITS and xb[j] != NEGATIVE_ZERO_BITS:
            return False
    return True


cdef inline Py_ssize_t _steps(Py_ssize_t n) noexcept nogil:
    """Lane steps covering n <= BLOCK elements (a short block is zero-padded to them)."""
    return (n + LANES - 1) // LANES


cdef inline void _copy_block(const float* x, Py_ssize_t n, float* w) noexcept nogil:
    """w[0:n] = x[0:n], zero-padded to _steps(n) * LANES elements."""
    cdef Py_ssize_t j
    for j in range(n):
        w[j] = x[j]
    for j in range(n, _steps(n) * LANES):
        w[j] = 0.0


cdef union FloatBits32:
    float f
    uint32_t u


cdef inline float _lane_sum(const float* x, Py_ssize_t steps, uint32_t* signs) noexcept nogil:
    """float32 sum of x[0:steps * LANES] (steps <= STEPS: a block, zero-padded if short) in the
    documented lane order (Inf if it overflows), OR-ing into ``signs`` ([SIGN_LANES], a local
    array of the caller carried across a row's blocks) bits whose sign bit is set if some element
    is negative or -Inf (a -0.0 or a NaN may set it too; the caller's slower scan decides then).

    A lane is a chain of dependent float32 adds; 64 lanes are four independent AVX-512 vectors
    (eight AVX2, sixteen NEON), read from one contiguous 256-byte step, so the adders stay busy
    and the hardware prefetcher sees one stream.  The validation rides on the same loads (NaN
    and +Inf show in the sum).  With AVX-512 or AVX2, ``sv_lane_sum`` (C vector types) ORs the
    elements' bits, one load per element; elsewhere the portable loop below keeps a float
    minimum per lane (exact in any order; NaN may be skipped: the sum catches it) and ORs its
    bits into ``signs`` at the end of the block.
    """
    cdef float acc[LANES]
    cdef float low[SIGN_LANES]
    cdef FloatBits32 lowest
    cdef Py_ssize_t j, l, s
    if WIDE_LANE_SUM:
        return lane_sum(x, steps, signs)
    for l in range(LANES):
        acc[l] = 0.0
    for l in range(SIGN_LANES):
        low[l] = 0.0
    # hot loop: block sum
    for s in range(steps):
        j = s * LANES
        for l in range(LANES):
            acc[l] += x[j + l]
        for l in range(SIGN_LANES):
            low[l] = min(low[l], min(min(x[j + l], x[j + l + 16]), min(x[j + l + 32], x[j + l + 48])))
    # A minimum below zero has its sign bit set, as the OR of the bits would.
    for l in range(SIGN_LANES):
        lowest.f = low[l]
        signs[l] |= lowest.u
    return lane_tree(acc)


cdef inline double _rescued_sum(const float* x, Py_ssize_t steps) noexcept nogil:
    """Sum of a block x[0:steps * LANES] whose float32 lane sum overflowed: the same order on
    x * 2^-32, then * 2^32 in float64."""
    cdef float scaled[BLOCK]
    cdef uint32_t signs[SIGN_LANES]
    cdef Py_ssize_t j
    for j in range(SIGN_LANES):
        signs[j] = 0
    for j in range(steps * LANES):
        scaled[j] = x[j] * RESCUE_DOWN
    return <double> _lane_sum(scaled, steps, signs) * RESCUE_UP


cdef inline double _block_sum_signs(const float* x, Py_ssize_t n, uint32_t* signs) noexcept nogil:
    """Sum of x[0:n], n <= BLOCK, in the documented order (float32 lanes, halving tree, rescued if
    it overflows), OR-ing the elements' bits into ``signs`` (see ``_lane_sum``).  A short block
    is summed as a zero-padded copy: adding +0.0 to a lane changes nothing, nor does OR-ing 0.
    NaN (invalid rows only) goes the rescue way and stays NaN."""
    cdef float padded[BLOCK]
    cdef float s
    if n < BLOCK:
        _copy_block(x, n, padded)
        x = padded
    s = _lane_sum(x, _steps(n), signs)
    if s <= FLT_MAX:
        return <double> s
    return _rescued_sum(x, _steps(n))


cdef inline double _block_sum(const float* x, Py_ssize_t n) noexcept nogil:
    """Sum of x[0:n], n <= BLOCK, in the documented order."""
    cdef uint32_t signs[SIGN_LANES]
    cdef Py_ssize_t l
    for l in range(SIGN_LANES):
        signs[l] = 0
    return _block_sum_signs(x, n, signs)


cdef inline double _row_mass(const float* x, Py_ssize_t n, double* block_sums,
                             uint32_t* max_bits) noexcept nogil:
    """Mass of one row in the documented order; block sums written to ``block_sums``.

    x: [n] float32.  block_sums: [ceil(n / BLOCK)] float64 (output).
    max_bits: output, below FLOAT_INF_BITS when every element is surely finite and non-negative,
    else FLOAT_INF_BITS: then ``_all_valid`` decides (-0.0 is allowed but flagged here).  The pass
    folds validation into the loads of the sums: a sign bit (negative values, -Inf, -0.0) shows
    in the OR of the elements' bits, a NaN or +Inf in the total (an overflowing block is rescued,
    so a valid row's total is finite).
    """
    cdef uint32_t signs[SIGN_LANES]
    cdef uint32_t any_sign = 0
    cdef double total = 0.0
    cdef float s
    cdef Py_ssize_t b, l
    for l in range(SIGN_LANES):
        signs[l] = 0
    for b in range(n // BLOCK):  # full blocks: _lane_sum inlined, no call per block
        s = _lane_sum(x + b * BLOCK, STEPS, signs)
        block_sums[b] = <double> s if s <= FLT_MAX else _rescued_sum(x + b * BLOCK, STEPS)
        total += block_sums[b]
    if n % BLOCK:
        b = n // BLOCK
        block_sums[b] = _block_sum_signs(x + b * BLOCK, n % BLOCK, signs)
        total += block_sums[b]
    for l in range(SIGN_LANES):
        any_sign |= signs[l]
    max_bits[0] = 0 if any_sign < NEGATIVE_ZERO_BITS and total <= DBL_MAX else FLOAT_INF_BITS
    return total


cdef inline double _mass_ratio(double numerator, double denominator) noexcept nogil:
    """The quotient of two masses as the residual takes it: numerator / denominator in float64,
    exactly 1 if within 2^-20 of 1 (see the contract)."""
    cdef double r = numerator / denominator
    return 1.0 if -RATIO_SNAP <= r - 1.0 <= RATIO_SNAP else r


cdef inline void _ratio_factors(double mass_ratio, float* factors) noexcept nogil:
    """factors[0:3] = (a, b, c) of the contract: q * mass_ratio is evaluated as ((q * a) * b) * c.

    mass_ratio = P / Q > 0, clamped to [2^-300, 2^300].  With mass_ratio in [2^(e-1), 2^e): a = b = 1
    and c = float32(mass_ratio) if |e| <= 100; else the excess exponent e - clamp(e, -100, 100) is
    split into a = 2^(excess >> 1) and b = 2^(excess - (excess >> 1)), and c = float32(mass_ratio /
    (a * b)) lies in [2^-101, 2^100).  All three are normal float32 numbers.
    """
    cdef int e, excess, half
    cdef double r = min(max(mass_ratio, RATIO_LOWEST), RATIO_HIGHEST)
    if RATIO_LOW <= r < RATIO_HIGH:  # |e| <= 100: the common case, without libm calls
        factors[0] = 1.0
        factors[1] = 1.0
        factors[2] = <float> r
        return
    frexp(r, &e)
    excess = e - min(max(e, -RATIO_EXPONENT), RATIO_EXPONENT)
    half = excess >> 1
    factors[0] = <float> ldexp(1.0, half)
    factors[1] = <float> ldexp(1.0, excess - half)
    factors[2] = <float> ldexp(r, -excess)


cdef inline float _positive_part(float d) noexcept nogil:
    """max(0, d), NaN giving 0."""
    return d if d > 0.0 else 0.0


cdef inline float _weight(float p, float q, float a, float b, float c) noexcept nogil:
    """Residual weight max(0, p - ((q * a) * b) * c) in float32 (see ``_ratio_factors``)."""
    return _positive_part(p - ((q * a) * b) * c)


cdef inline double _residual_weight(float p, float q, double mass_ratio) noexcept nogil:
    """Unnormalized residual max(0, p/P - q/Q) * P = max(0, p - q * (P/Q)) as the contract
    computes it (float32), returned as float64.  mass_ratio = P / Q.  p == q at any power-of-two
    scale gives exactly 0.  (Loops hoist ``_ratio_factors`` and call ``_weight``.)"""
    cdef float f[3]
    _ratio_factors(mass_ratio, f)
    return _weight(p, q, f[0], f[1], f[2])


cdef inline void _residual_weights(const float* p, const float* q, Py_ssize_t n, const float* f,
                                   float* w) noexcept nogil:
    """w[0:n] = the residual weights of p, q[0:n] (n <= BLOCK), zero-padded to _steps(n) * LANES."""
    cdef Py_ssize_t j
    for j in range(n):
        w[j] = _weight(p[j], q[j], f[0], f[1], f[2])
    for j in range(n, _steps(n) * LANES):
        w[j] = 0.0


cdef inline double _residual_block_sum(const float* p, const float* q, Py_ssize_t n,
                                       const float* f) noexcept nogil:
    """Sum of the residual weights of p[0:n], q[0:n], n <= BLOCK, in the documented order;
    f = ``_ratio_factors(mass_ratio)``.  Same bits as ``_block_sum`` of the weights (a short or
    overflowing block is summed as exactly that)."""
    cdef float acc[LANES]
    cdef float w[BLOCK]
    cdef float a = f[0], b = f[1], c = f[2], s
    cdef Py_ssize_t j, l, k
    if n == BLOCK:
        for l in range(LANES):
            acc[l] = 0.0
        # hot loop: residual block sums
        for k in range(STEPS):
            j = k * LANES
            for l in range(LANES):
                acc[l] += _weight(p[j + l], q[j + l], a, b, c)
        s = lane_tree(acc)
        if s <= FLT_MAX:
            return <double> s
    _residual_weights(p, q, n, f, w)
    return _block_sum(w, n)


cdef inline double _residual_block_sums(const float* p, const float* q, Py_ssize_t n,
                                        double mass_ratio, double* block_sums) noexcept nogil:
    """Block sums and total of the residual weights of one row pair (documented order).
    mass_ratio = P / Q."""
    cdef float f[3]
    cdef Py_ssize_t b, start
    cdef double total = 0.0
    _ratio_factors(mass_ratio, f)
    for b in range((n + BLOCK - 1) // BLOCK):
        start = b * BLOCK
        block_sums[b] = _residual_block_sum(p + start, q + start, min(BLOCK, n - start), f)
        total += block_sums[b]
    return total


cdef inline void _pair_lane_sums(const float* p, const float* q, float c, Py_ssize_t steps,
                                 uint32_t* signs, float* sums) noexcept nogil:
    """sums[0:3] = the float32 lane sums (``_lane_sum``'s order) of p, of q and of the residual
    weights max(0, p - q * c), of one full block pair p, q[0:steps * LANES], in one read of each
    element; the bits of both rows are OR-ed into ``signs`` (see ``_lane_sum``).  With AVX-512 or
    AVX2, ``sv_pair_lane_sums`` (C vector types).

    Same bits as ``_lane_sum`` of p, of q and ``_residual_block_sum`` with factors (1, 1, c).  The
    portable loop takes the lanes a quarter (SIGN_LANES) at a time, each lane still in increasing
    j: 48 accumulators do not fit NEON's or AVX2's registers, 12 do.
    """
    cdef float acc_p[LANES]
    cdef float acc_q[LANES]
    cdef float acc_w[LANES]
    cdef float sp[SIGN_LANES]
    cdef float sq[SIGN_LANES]
    cdef float sw[SIGN_LANES]
    cdef float low[SIGN_LANES]
    cdef FloatBits32 lowest
    cdef Py_ssize_t j, l, s, quarter
    if WIDE_LANE_SUM:
        pair_lane_sums(p, q, c, steps, signs, sums)
        return
    for l in range(SIGN_LANES):
        low[l] = 0.0
    for quarter in range(LANES // SIGN_LANES):
        for l in range(SIGN_LANES):
            sp[l] = 0.0
            sq[l] = 0.0
            sw[l] = 0.0
        # hot loop: row-pair sums
        for s in range(steps):
            j = s * LANES + quarter * SIGN_LANES
            for l in range(SIGN_LANES):
                sp[l] += p[j + l]
                sq[l] += q[j + l]
                sw[l] += _positive_part(p[j + l] - q[j + l] * c)
                low[l] = min(low[l], min(p[j + l], q[j + l]))
        for l in range(SIGN_LANES):
            acc_p[quarter * SIGN_LANES + l] = sp[l]
            acc_q[quarter * SIGN_LANES + l] = sq[l]
            acc_w[quarter * SIGN_LANES + l] = sw[l]
    for l in range(SIGN_LANES):
        lowest.f = low[l]
        signs[l] |= lowest.u
    sums[0] = lane_tree(acc_p)
    sums[1] = lane_tree(acc_q)
    sums[2] = lane_tree(acc_w)


cdef inline double _row_pair_masses(const float* p, const float* q, Py_ssize_t n, double ratio,
                                    double* p_blocks, double* q_blocks, double* residual_blocks,
                                    double* masses, uint32_t* max_bits) noexcept nogil:
    """``_row_mass`` of p and of q, and ``_residual_block_sums(p, q, n, ratio)``, in one read of
    the two rows: the residual a rejection will need if the rows' masses give that ratio (1 for
    accept when P/Q snaps to 1; the caller checks, and sums the residual again otherwise).

    p, q: [n] float32.  p_blocks, q_blocks, residual_blocks: [ceil(n / BLOCK)] float64 (outputs).
    masses[0:2] = (P, Q); returns the residual total.  max_bits: as ``_row_mass``'s, for both rows
    at once (the slower scan of each row decides which is bad).
    """
    cdef uint32_t signs[SIGN_LANES]
    cdef uint32_t any_sign = 0
    cdef float sums[3]
    cdef float f[3]
    cdef double p_total = 0.0, q_total = 0.0, residual_total = 0.0
    cdef Py_ssize_t b, l, start
    cdef bint one_factor
    for l in range(SIGN_LANES):
        signs[l] = 0
    _ratio_factors(ratio, f)
    one_factor = f[0] == 1.0 and f[1] == 1.0  # else (|log2 ratio| > 100) a separate residual read
    for b in range(n // BLOCK):
        start = b * BLOCK
        _pair_lane_sums(p + start, q + start, f[2], STEPS, signs, sums)
        p_blocks[b] = <double> sums[0] if sums[0] <= FLT_MAX else _rescued_sum(p + start, STEPS)
        q_blocks[b] = <double> sums[1] if sums[1] <= FLT_MAX else _rescued_sum(q + start, STEPS)
        residual_blocks[b] = (<double> sums[2] if one_factor and sums[2] <= FLT_MAX
                              else _residual_block_sum(p + start, q + start, BLOCK, f))
        p_total += p_blocks[b]
        q_total += q_blocks[b]
        residual_total += residual_blocks[b]
    if n % BLOCK:
        b = n // BLOCK
        start = b * BLOCK
        p_blocks[b] = _block_sum_signs(p + start, n % BLOCK, signs)
        q_blocks[b] = _block_sum_signs(q + start, n % BLOCK, signs)
        residual_blocks[b] = _residual_block_sum(p + start, q + start, n % BLOCK, f)
        p_total += p_blocks[b]
        q_total += q_blocks[b]
        residual_total += residual_blocks[b]
    for l in range(SIGN_LANES):
        any_sign |= signs[l]
    masses[0] = p_total
    masses[1] = q_total
    max_bits[0] = (0 if any_sign < NEGATIVE_ZERO_BITS and p_total <= DBL_MAX and q_total <= DBL_MAX
                   else FLOAT_INF_BITS)
    return residual_total


cdef inline Py_ssize_t _pick_block(const double* block_sums, Py_ssize_t n_blocks, double target,
                                   double* fraction) noexcept nogil:
    """First block whose running sum (left to right, as for the total) exceeds ``target``.

    Requires 0 <= target < total, so some block is found; ``fraction`` is target minus the sum of
    the blocks before it, divided by the block's sum: the share of the block left for the element
    (in [0, 1)), which the ``_scan_*`` functions take.  Empty blocks are never picked.
    """
    cdef double cumulative = 0.0
    cdef Py_ssize_t b
    for b in range(n_blocks):
        if cumulative + block_sums[b] > target:
            fraction[0] = (target - cumulative) / block_sums[b]
            return b
        cumulative += block_sums[b]
    # Unreachable when target < total; keep the last non-empty block as a guard.
    for b in range(n_blocks - 1, -1, -1):
        if block_sums[b] > 0.0:
            fraction[0] = 0.0
            return b
    fraction[0] = 0.0
    return 0


cdef inline Py_ssize_t _scan_weights(const float* w, Py_ssize_t n, double fraction) noexcept nogil:
    """Inverse-CDF scan of one block's weights w[0:n] (zero-padded to a multiple of LANES), given
    the ``fraction`` of the block's sum left (see ``_pick_block``): the first j with positive
    weight whose running float64 sum exceeds fraction * (the block's float64 total, SCAN_LANES
    lanes, halving tree); if rounding lets the running sum fall short, the last j with positive
    weight (the block is known to have some)."""
    cdef double acc[SCAN_LANES]
    cdef double h[4]
    cdef double cumulative = 0.0, target
    cdef Py_ssize_t j, l, s, last = 0
    for l in range(SCAN_LANES):
        acc[l] = 0.0
    for s in range((n + SCAN_LANES - 1) // SCAN_LANES):
        for l in range(SCAN_LANES):
            acc[l] += <double> w[s * SCAN_LANES + l]
    for l in range(4):
        h[l] = acc[l] + acc[l + 4]
    target = fraction * ((h[0] + h[2]) + (h[1] + h[3]))
    for j in range(n):
        if w[j] > 0.0:
            cumulative += w[j]
            last = j
            if cumulative > target:
                return j
    return last


cdef inline Py_ssize_t _scan_target_block(const float* p, Py_ssize_t start, Py_ssize_t stop,
                                          double fraction, Py_ssize_t excluded) noexcept nogil:
    """Draw inside the block p[start:stop] with weights p[j] (p[excluded] counted as 0; -1: none),
    given ``fraction`` from ``_pick_block``."""
    cdef float w[BLOCK]
    _copy_block(p + start, stop - start, w)
    if start <= excluded < stop:
        w[excluded - start] = 0.0
    return start + _scan_weights(w, stop - start, fraction)


cdef inline Py_ssize_t _scan_residual_block(const float* p, const float* q, Py_ssize_t start,
                                            Py_ssize_t stop, double mass_ratio,
                                            double fraction) noexcept nogil:
    """As ``_scan_target_block`` with the residual weights max(0, p - q * P/Q); mass_ratio = P/Q."""
    cdef float f[3]
    cdef float w[BLOCK]
    _ratio_factors(mass_ratio, f)
    _residual_weights(p + start, q + start, stop - start, f, w)
    return start + _scan_weights(w, stop - start, fraction)


cdef inline Py_ssize_t _sample_target(const float* p, Py_ssize_t n, const double* block_sums,
                                      double mass, double u) noexcept nogil:
    """Draw from p / mass with the uniform u, given the row's block sums."""
    cdef double fraction
    cdef Py_ssize_t b = _pick_block(block_sums, (n + BLOCK - 1) // BLOCK, u * mass, &fraction)
    cdef Py_ssize_t start = b * BLOCK
    check_index(start, n)
    return _scan_target_block(p, start, min(start + BLOCK, n), fraction, -1)


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
    check_index(best_start, n)
    for j in range(best_start, min(best_start + ARGMAX_BLOCK, n)):
        if xi[j] == wanted:
            return j
    return best_start  # unreachable: the block holds its extreme


cdef inline double _block_sum_excluding(const float* p, Py_ssize_t start, Py_ssize_t stop,
                                        Py_ssize_t excluded) noexcept nogil:
    """``_block_sum`` of p[start:stop] with p[excluded] counted as 0 (on a copy: adding +0.0 to a
    lane changes nothing, so these are the bits of skipping it)."""
    cdef float w[BLOCK]
    _copy_block(p + start, stop - start, w)
    check_index(excluded - start, stop - start)
    w[excluded - start] = 0.0
    return _block_sum(w, stop - start)

