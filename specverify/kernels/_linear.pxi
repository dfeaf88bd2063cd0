# Linear layers for the target's multi-token pass (included by _kernels.pyx): linear.
#
# y[m, o] = sum_k x[m, k] * w[o, k] (+ bias[o]) for the few rows (1-17) a speculative round
# scores.  torch's CPU matmul reads the weight matrix once per row for such shapes (a 49152 x 576
# output layer: 9.5 ms for one row, 16-24 ms for 2-16 rows with torch 2.13, one thread), so a
# target pass that scores K + 1 tokens costs 1.6-2x a one-token pass.  Here the weights are read
# from memory once per call, whatever the row count.
#
# Summation order (the contract ``reference.linear`` restates): k is padded with zeros to a
# multiple of 16; lane l (0..15) of an accumulator that starts at +0.0 adds the products
# x[m, k] * w[o, k] for k = l, l + 16, l + 32, ... in increasing k, each product rounded to
# float32 on its own (no fused multiply-add: -ffp-contract=off); the 16 lanes are then added as a
# fixed tree (lane i + lane i+8, then i + i+4, i + i+2, i + i+1), and the bias last.  The order
# does not depend on the row count, on which rows share a call, or on the ISA: a token's output
# is the same bits whether it is scored alone or in a tree of 16 (GCC's generic vectors lower the
# 16 lanes to one AVX-512 register, two AVX2 registers or four NEON registers).
#
# Loop structure (speed only; the bits are those of the order above): the weight rows are walked
# in tiles of SV_TILE_W, each against the rows of x in groups of up to SV_TILE_X (with AVX-512
# 4 x 4 accumulators: a quarter of the loads of one dot product at a time; up to SV_DOT_ROWS rows
# of x are plain dot products, weight row after weight row), while the weight rows
# SV_PREFETCH_ROWS ahead are prefetched into L2: while a tile computes, the hardware prefetcher
# alone keeps too few lines in flight (without the prefetch the tiles ran at half the read
# bandwidth).  The last n_out % SV_TILE_W weight rows are single dot products.  From about 6
# rows of x on, the multiplies and adds (16 + 16 per cycle with AVX-512 on Zen 4), not the
# reads, bound the time.
#
# Without AVX-512 (AVX2, SSE, NEON) a 16-lane accumulator is SV_PARTS native vectors (two AVX2,
# four NEON registers) and the tiles are 2 x 2, so that accumulators and operands fit the
# registers (16 AVX2, 32 NEON): the 4 x 4 tile of generic 64-byte vectors needed 32 AVX2
# registers of accumulators alone, and gcc kept them (and the dot product's, and the lane trees'
# shuffles) on the stack: on a Zen 3, sv.linear ran at 3-58x its read floor, 1.2-8x slower than
# torch.

cdef extern from *:
    """
    #include <string.h>
    #define SV_DOT_ROWS 2  /* up to this many rows of x: dot products, not tiles */
    #define SV_PREFETCH_ROWS 16  /* how far ahead the weight rows are prefetched */

    #if defined(__AVX512F__)
    /* A 16-lane accumulator is one register: GCC's generic vectors, 4 x 4 tiles. */
    typedef float sv_f32x16 __attribute__((vector_size(64)));
    typedef int32_t sv_i32x16 __attribute__((vector_size(64)));
    #define SV_TILE_W 4
    #define SV_TILE_X 4
    #define SV_TILE SV_TILE_W

    static inline sv_f32x16 sv_load16(const float* p) {
        sv_f32x16 v;
        memcpy(&v, p, sizeof v);
        return v;
    }

    /* The last k % 16 elements of a row, zero-padded to 16. */
    static inline sv_f32x16 sv_load_tail(const float* p, Py_ssize_t tail) {
        float lanes[16] = {0};
        memcpy(lanes, p, (size_t) tail * sizeof(float));
        return sv_load16(lanes);
    }

    #if defined(__clang__)
    #define SV_SHUFFLE16(a, ...) __builtin_shufflevector(a, a, __VA_ARGS__)
    #else
    #define SV_SHUFFLE16(a, ...) __builtin_shuffle(a, (sv_i32x16){__VA_ARGS__})
    #endif

    /* (l0 + l8), then + 4, + 2, + 1 apart: lane 0 ends with the sum (shuffles, not a store and
       16 scalar loads, which stall on store forwarding). */
    static inline float sv_lane_tree16(sv_f32x16 a) {
        a = a + SV_SHUFFLE16(a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
        a = a + SV_SHUFFLE16(a, 4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15);
        a = a + SV_SHUFFLE16(a, 2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        a = a + SV_SHUFFLE16(a, 1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        return a[0];
    }

    #if defined(__AVX512F__)
    #include <immintrin.h>
    /* The sixteen lane trees of a 4 x 4 tile at once: out[4 b + a] = sv_lane_tree16(acc[a][b]),
       bit for bit (every addition pairs the same two lanes, in the same operand order), with 15
       vector additions instead of 64: each level adds the halves of two vectors packed into one
       (128-bit blocks for the + 8 and + 4 levels, lanes within a block for + 2 and + 1).  The
       tile's epilogue, 16 trees of 4 dependent shuffle-adds, cost ~14% of a compute-bound tile. */
    static inline void sv_lane_trees4x4(sv_f32x16 acc[4][4], float out[16]) {
        __m512 half[8], quarter[4], eighth[2], sums;
        for (int i = 0; i < 8; i++) {   /* v[2i], v[2i + 1] with v[4 a + b] = acc[a][b]: l + (l + 8) */
            __m512 u = (__m512) acc[i >> 1][2 * (i & 1)], v = (__m512) acc[i >> 1][2 * (i & 1) + 1];
            half[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0x44), _mm512_shuffle_f32x4(u, v, 0xEE));
        }
        for (int i = 0; i < 4; i++)     /* l + (l + 4) */
            quarter[i] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0x88),
                                       _mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0xDD));
        for (int i = 0; i < 2; i++)     /* l + (l + 2) */
            eighth[i] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0x44),
                                      _mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0xEE));
        sums = _mm512_add_ps(_mm512_shuffle_ps(eighth[0], eighth[1], 0x88),   /* l + (l + 1) */
                             _mm512_shuffle_ps(eighth[0], eighth[1], 0xDD));
        _mm512_storeu_ps(out, sums);
    }
    #endif

    static inline float sv_dot16(const float* x, const float* w, Py_ssize_t full, Py_ssize_t tail) {
        sv_f32x16 acc = {0};
        for (Py_ssize_t k = 0; k < full; k += 16)
            acc = acc + sv_load16(w + k) * sv_load16(x + k);
        if (tail)
            acc = acc + sv_load_tail(w + full, tail) * sv_load_tail(x + full, tail);
        return sv_lane_tree16(acc);
    }

    /* dot(x0, w) and dot(x1, w), each in sv_dot16's order (the same bits), each w vector loaded
       once for both: two independent sums in flight. */
    static inline void sv_dot16x2(const float* x0, const float* x1, const float* w, Py_ssize_t full,
                                  Py_ssize_t tail, float* s0, float* s1) {
        sv_f32x16 a0 = {0}, a1 = {0};
        for (Py_ssize_t k = 0; k < full; k += 16) {
            sv_f32x16 wk = sv_load16(w + k);
            a0 = a0 + wk * sv_load16(x0 + k);
            a1 = a1 + wk * sv_load16(x1 + k);
        }
        if (tail) {
            sv_f32x16 wk = sv_load_tail(w + full, tail);
            a0 = a0 + wk * sv_load_tail(x0 + full, tail);
            a1 = a1 + wk * sv_load_tail(x1 + full, tail);
        }
        *s0 = sv_lane_tree16(a0);
        *s1 = sv_lane_tree16(a1);
    }

    /* Keeps a loaded vector in a register: without it gcc folds each load into the multiply
       that uses it, and a 4 x 4 step issues 32 loads instead of 8 (load-bound, 2x the time,
       measured with AVX-512).  An empty asm: no instruction, no effect on the values. */
    #define SV_IN_REGISTER(v) __asm__("" : "+v"(v))

    /* One 16-column step of a tile: acc[a][b] += w row a * x row b, for b < live. */
    #define SV_TILE_STEP(load, k)                                                            \
        do {                                                                                 \
            sv_f32x16 xs[SV_TILE];                                                           \
            for (int b = 0; b < live; b++) {                                                 \
                xs[b] = load(x[b] + (k), tail);                                              \
                SV_IN_REGISTER(xs[b]);                                                       \
            }                                                                                \
            for (int a = 0; a < SV_TILE; a++) {                                              \
                sv_f32x16 wa = load(w + a * w_stride + (k), tail);                           \
                SV_IN_REGISTER(wa);                                                          \
                for (int b = 0; b < live; b++)                                               \
                    acc[a][b] = acc[a][b] + wa * xs[b];                                      \
            }                                                                                \
        } while (0)
    #define SV_LOAD_FULL(p, tail) sv_load16(p)

    /* sums[a][b] = dot(w row a, x[b]) for a in 0..3, b < live (1..4): four weight rows against
       live x rows; w_next (or NULL): a later tile's rows, prefetched meanwhile.  Always inlined
       with a constant live, so each width gets its own fully unrolled loop. */
    static inline __attribute__((always_inline)) void sv_tile(
            const float* const x[SV_TILE], int live, const float* w, Py_ssize_t w_stride,
            const float* w_next, Py_ssize_t full, Py_ssize_t tail, float sums[SV_TILE][SV_TILE]) {
        sv_f32x16 acc[SV_TILE][SV_TILE];
        memset(acc, 0, sizeof acc);
        for (Py_ssize_t k = 0; k < full; k += 16) {
            if (w_next)  /* into L2 (locality 2): measured 1.6x faster than into L1 */
                for (int a = 0; a < SV_TILE; a++)
                    __builtin_prefetch(w_next + a * w_stride + k, 0, 2);
            SV_TILE_STEP(SV_LOAD_FULL, k);
        }
        if (tail)
            SV_TILE_STEP(sv_load_tail, full);
        float trees[16];
        sv_lane_trees4x4(acc, trees);   /* the unused columns b >= live hold zeros: harmless */
        for (int a = 0; a < SV_TILE; a++)
            for (int b = 0; b < live; b++)
                sums[a][b] = trees[4 * b + a];
    }

    #else
    /* No AVX-512: a 16-lane accumulator is SV_PARTS native vectors (part p holds lanes
       p * SV_NATIVE ..), 2 x 2 tiles. */
    #if defined(__AVX__)
    #define SV_NATIVE 8
    #define SV_IN_REGISTER(v) __asm__("" : "+x"(v))
    #elif defined(__aarch64__)
    #define SV_NATIVE 4
    #define SV_IN_REGISTER(v) __asm__("" : "+w"(v))
    #elif defined(__SSE2__)
    #define SV_NATIVE 4
    #define SV_IN_REGISTER(v) __asm__("" : "+x"(v))
    #else
    #define SV_NATIVE 4
    #define SV_IN_REGISTER(v) ((void) 0)
    #endif
    #define SV_PARTS (16 / SV_NATIVE)
    #define SV_TILE_W 2
    #define SV_TILE_X 2
    typedef float sv_native __attribute__((vector_size(4 * SV_NATIVE)));

    static inline sv_native sv_load_native(const float* p) {
        sv_native v;
        memcpy(&v, p, sizeof v);
        return v;
    }

    /* The lane tree of acc[0:SV_PARTS] (lanes l = p * SV_NATIVE + i): l + (l + 8), then + 4,
       + 2, + 1, the same additions as sv_lane_tree16 (IEEE addition commutes: the operand
       order within one addition does not matter, the pairing does). */
    static inline float sv_native_tree(const sv_native* acc) {
        float h[8];
    #if SV_NATIVE == 8
        sv_native v = acc[0] + acc[1];            /* lane i: l_i + l_(i+8) */
        memcpy(h, &v, sizeof h);
    #else
        sv_native lo = acc[0] + acc[2], hi = acc[1] + acc[3];   /* lanes 0-3, 4-7 of that */
        memcpy(h, &lo, sizeof lo);
        memcpy(h + 4, &hi, sizeof hi);
    #endif
        float q0 = h[0] + h[4], q1 = h[1] + h[5], q2 = h[2] + h[6], q3 = h[3] + h[7];
        return (q0 + q2) + (q1 + q3);
    }

    static inline float sv_dot16(const float* x, const float* w, Py_ssize_t full, Py_ssize_t tail) {
        sv_native acc[SV_PARTS];
        float xt[16] = {0}, wt[16] = {0};
        memset(acc, 0, sizeof acc);
        for (Py_ssize_t k = 0; k < full; k += 16)
            for (int q = 0; q < SV_PARTS; q++)
                acc[q] = acc[q] + sv_load_native(w + k + q * SV_NATIVE)
                                  * sv_load_native(x + k + q * SV_NATIVE);
        if (tail) {
            memcpy(xt, x + full, (size_t) tail * sizeof(float));
            memcpy(wt, w + full, (size_t) tail * sizeof(float));
            for (int q = 0; q < SV_PARTS; q++)
                acc[q] = acc[q] + sv_load_native(wt + q * SV_NATIVE)
                                  * sv_load_native(xt + q * SV_NATIVE);
        }
        return sv_native_tree(acc);
    }

    /* dot(x0, w) and dot(x1, w), as the AVX-512 sv_dot16x2. */
    static inline void sv_dot16x2(const float* x0, const float* x1, const float* w, Py_ssize_t full,
                                  Py_ssize_t tail, float* s0, float* s1) {
        sv_native a0[SV_PARTS], a1[SV_PARTS];
        float x0t[16] = {0}, x1t[16] = {0}, wt[16] = {0};
        memset(a0, 0, sizeof a0);
        memset(a1, 0, sizeof a1);
        for (Py_ssize_t k = 0; k < full; k += 16)
            for (int q = 0; q < SV_PARTS; q++) {
                sv_native wq = sv_load_native(w + k + q * SV_NATIVE);
                a0[q] = a0[q] + wq * sv_load_native(x0 + k + q * SV_NATIVE);
                a1[q] = a1[q] + wq * sv_load_native(x1 + k + q * SV_NATIVE);
            }
        if (tail) {
            memcpy(x0t, x0 + full, (size_t) tail * sizeof(float));
            memcpy(x1t, x1 + full, (size_t) tail * sizeof(float));
            memcpy(wt, w + full, (size_t) tail * sizeof(float));
            for (int q = 0; q < SV_PARTS; q++) {
                sv_native wq = sv_load_native(wt + q * SV_NATIVE);
                a0[q] = a0[q] + wq * sv_load_native(x0t + q * SV_NATIVE);
                a1[q] = a1[q] + wq * sv_load_native(x1t + q * SV_NATIVE);
            }
        }
        *s0 = sv_native_tree(a0);
        *s1 = sv_native_tree(a1);
    }

    /* One 16-column step of a tile, part by part: acc[a][b][q] += w row a * x row b on the
       part's lanes, each operand loaded once (acc 8 + 2 + 1 + a product: 12 AVX2 registers;
       16 + 2 + 1 + 1 of NEON's 32). */
    #define SV_NARROW_STEP(xp, wp, w_step)                                                   \
        do {                                                                                 \
            for (int q = 0; q < SV_PARTS; q++) {                                             \
                sv_native xs[SV_TILE_X];                                                     \
                for (int b = 0; b < live; b++) {                                             \
                    xs[b] = sv_load_native((xp)[b] + q * SV_NATIVE);                         \
                    SV_IN_REGISTER(xs[b]);                                                   \
                }                                                                            \
                for (int a = 0; a < SV_TILE_W; a++) {                                        \
                    sv_native wa = sv_load_native((wp) + a * (w_step) + q * SV_NATIVE);      \
                    SV_IN_REGISTER(wa);                                                      \
                    for (int b = 0; b < live; b++)                                           \
                        acc[a][b][q] = acc[a][b][q] + wa * xs[b];                            \
                }                                                                            \
            }                                                                                \
        } while (0)

    /* sums[a][b] = dot(w row a, x[b]) for a in 0..1, b < live (1..2), as the AVX-512 sv_tile. */
    static inline __attribute__((always_inline)) void sv_tile(
            const float* const x[SV_TILE_X], int live, const float* w, Py_ssize_t w_stride,
            const float* w_next, Py_ssize_t full, Py_ssize_t tail, float sums[SV_TILE_W][SV_TILE_X]) {
        sv_native acc[SV_TILE_W][SV_TILE_X][SV_PARTS];
        memset(acc, 0, sizeof acc);
        for (Py_ssize_t k = 0; k < full; k += 16) {
            const float* xk[SV_TILE_X];
            if (w_next)
                for (int a = 0; a < SV_TILE_W; a++)
                    __builtin_prefetch(w_next + a * w_stride + k, 0, 2);
            for (int b = 0; b < live; b++)
                xk[b] = x[b] + k;
            SV_NARROW_STEP(xk, w + k, w_stride);
        }
        if (tail) {
            float xt[SV_TILE_X][16] = {{0}}, wt[SV_TILE_W][16] = {{0}};
            const float* xk[SV_TILE_X];
            for (int b = 0; b < live; b++) {
                memcpy(xt[b], x[b] + full, (size_t) tail * sizeof(float));
                xk[b] = xt[b];
            }
            for (int a = 0; a < SV_TILE_W; a++)
                memcpy(wt[a], w + a * w_stride + full, (size_t) tail * sizeof(float));
            SV_NARROW_STEP(xk, wt[0], 16);
        }
        for (int a = 0; a < SV_TILE_W; a++)
            for (int b = 0; b < live; b++)
                sums[a][b] = sv_native_tree(acc[a][b]);
    }
    #endif

    /* y [n, n_out] (y_stride apart) = x [n, n_in] (x_stride apart) @ w [n_out, n_in]^T (+ bias). */
    static void sv_linear(const float* x, Py_ssize_t x_stride, Py_ssize_t n, const float* w,
                          Py_ssize_t w_stride, Py_ssize_t n_out, Py_ssize_t n_in,
                          const float* bias, float* y, Py_ssize_t y_stride) {
        Py_ssize_t full = n_in & ~(Py_ssize_t) 15, tail = n_in - full;
        /* One or two rows of x: plain dot products, one weight row after the other (from DRAM,
           the tile's four concurrent weight streams measured 1.25-1.4x slower for so few rows);
           two rows share each weight load and keep two sums in flight (sv_dot16x2: one after the
           other, each waiting on its own additions, two rows took 1.45x one row's time with AVX2,
           more than three rows' tiles; fused, 1.15x: a 2-token pass no dearer than a 3-token one). */
        Py_ssize_t tiled = n <= SV_DOT_ROWS ? 0 : n_out & ~(Py_ssize_t) (SV_TILE_W - 1);
        float sums[SV_TILE_W][SV_TILE_X];
        for (Py_ssize_t o0 = 0; o0 < tiled; o0 += SV_TILE_W) {
            const float* w_tile = w + o0 * w_stride;
            const float* w_next = o0 + SV_PREFETCH_ROWS + SV_TILE_W <= n_out
                                  ? w_tile + SV_PREFETCH_ROWS * w_stride : NULL;
            for (Py_ssize_t m0 = 0; m0 < n; m0 += SV_TILE_X) {
                const float* rows_x[SV_TILE_X];
                int live = n - m0 < SV_TILE_X ? (int) (n - m0) : SV_TILE_X;
                for (int b = 0; b < live; b++)
                    rows_x[b] = x + (m0 + b) * x_stride;
                /* each width its own fully unrolled tile */
                if (live == 1)
                    sv_tile(rows_x, 1, w_tile, w_stride, w_next, full, tail, sums);
    #if SV_TILE_X == 4
                else if (live == 2)
                    sv_tile(rows_x, 2, w_tile, w_stride, w_next, full, tail, sums);
                else if (live == 3)
                    sv_tile(rows_x, 3, w_tile, w_stride, w_next, full, tail, sums);
    #endif
                else
                    sv_tile(rows_x, SV_TILE_X, w_tile, w_stride, w_next, full, tail, sums);
                for (int b = 0; b < live; b++)
                    for (int a = 0; a < SV_TILE_W; a++)
                        y[(m0 + b) * y_stride + o0 + a] = bias ? sums[a][b] + bias[o0 + a] : sums[a][b];
            }
        }
        for (Py_ssize_t o = tiled; o < n_out; o++) {  /* the last n_out % SV_TILE_W rows (or all) */
            const float* wo = w + o * w_stride;
            Py_ssize_t m = 0;
            for (; m + 1 < n; m += 2) {
                float s0, s1;
                sv_dot16x2(x + m * x_stride, x + (m + 1) * x_stride, wo, full, tail, &s0, &s1);
                y[m * y_stride + o] = bias ? s0 + bias[o] : s0;
                y[(m + 1) * y_stride + o] = bias ? s1 + bias[o] : s1;
            }
            if (m < n) {
                float s = sv_dot16(x + m * x_stride, wo, full, tail);
                y[m * y_stride + o] = bias ? s + bias[o] : s;
            }
        }
    }

    /* Threads: the weight rows are cut into chunks (a multiple of the tile), which the caller
       and the pool's helpers claim (sv_parallel_for, _batch.pxi); each output is still one
       thread's dot product in the stated order, so the bits do not depend on the threads. */
    typedef struct {
        const float* x; Py_ssize_t x_stride, n; const float* w; Py_ssize_t w_stride, n_out, n_in;
        const float* bias; float* y; Py_ssize_t y_stride, chunk;
    } sv_linear_job;

    static void sv_linear_chunk(void* context, Py_ssize_t index) {
        const sv_linear_job* j = (const sv_linear_job*) context;
        Py_ssize_t o0 = index * j->chunk;
        Py_ssize_t rows = j->n_out - o0 < j->chunk ? j->n_out - o0 : j->chunk;
        sv_linear(j->x, j->x_stride, j->n, j->w + o0 * j->w_stride, j->w_stride, rows, j->n_in,
                  j->bias ? j->bias + o0 : NULL, j->y + o0, j->y_stride);
    }
    """
    void sv_linear(const float* x, Py_ssize_t x_stride, Py_ssize_t n, const float* w,
                   Py_ssize_t w_stride, Py_ssize_t n_out, Py_ssize_t n_in, const float* bias,
                   float* y, Py_ssize_t y_stride) nogil
    ctypedef struct sv_linear_job:
        const float* x
        Py_ssize_t x_stride, n
        const float* w
        Py_ssize_t w_stride, n_out, n_in
        const float* bias
        float* y
        Py_ssize_t y_stride, chunk
    void sv_linear_chunk(void* context, Py_ssize_t index) noexcept nogil


# Below this many weight bytes a call stays on one thread: a helper needs 0.1-75 us to start
# (tools/thread_probe.py), against ~10 us to read 256 KiB from memory.
cdef Py_ssize_t LINEAR_MIN_BYTES_PER_THREAD = 256 * 1024
# Chunks per thread: the threads claim them one at a time, so a slow start evens out.
cdef Py_ssize_t LINEAR_CHUNKS_PER_THREAD = 4


cdef void _linear_rows(sv_linear_job* job, int threads) noexcept nogil:
    """job's y = x @ w^T (+ bias) on up to ``threads`` threads (fewer for small weights)."""
    cdef Py_ssize_t weight_bytes = 4 * job.n_out * job.n_in
    cdef Py_ssize_t chunks
    if threads > 1 and job.n > 0:
        threads = <int> min(<Py_ssize_t> threads, max(1, weight_bytes // LINEAR_MIN_BYTES_PER_THREAD))
    if threads > 1:
        chunks = threads * LINEAR_CHUNKS_PER_THREAD
        job.chunk = (job.n_out + chunks - 1) // chunks
        job.chunk = (job.chunk + 3) // 4 * 4  # whole tiles
        chunks = (job.n_out + job.chunk - 1) // job.chunk
        if sv_parallel_for(<sv_task> sv_linear_chunk, job, chunks, threads) == 0:
            return
    sv_linear(job.x, job.x_stride, job.n, job.w, job.w_stride, job.n_out, job.n_in, job.bias,
              job.y, job.y_stride)


def linear(x, weight, bias, out, int num_threads=1):
    """Kernel entry of ``specverify.linear``: x ``[n, in]`` (or ``[in]``), weight ``[out, in]``,
    bias ``[out]`` or None, out ``[n, out]`` (or ``[out]``) or None -> out, or a new array of
    x's kind; on up to num_threads threads (validated by the caller)."""
    return _linear_entry(x, weight, bias, out, False, min(num_threads, MAX_THREADS))


cdef object _linear_entry(object x, object weight, object bias, object out, bint converted,
                          int threads):
    """The common case read in C: float32 ndarrays or CPU tensors with unit inner stride and
    non-negative row strides; out C-contiguous and writable.  Anything else goes through
    ``_inputs.linear_arrays``, which converts or raises an error naming the argument."""
    cdef _Held held = _Held()
    cdef Rows xr, wr, br, yr
    cdef bint x_vector, w_vector, b_vector, y_vector
    cdef object result = out
    cdef const float* bias_data = NULL
    _torch_seen()
    if not (_read_float32(x, &xr, held, True, False, &x_vector) and xr.stride >= 0
            and _read_float32(weight, &wr, held, False, False, &w_vector) and wr.stride >= 0
            and wr.cols == xr.cols
            and (bias is None or (_read_float32(bias, &br, held, True, False, &b_vector)
                                  and b_vector and br.cols == wr.rows))):
        if converted:
            _unreadable("x")
        return _linear_converted(x, weight, bias, out, threads)
    if out is None:
        result = (_np_empty(<object> (wr.rows,) if x_vector else (xr.rows, wr.rows), dtype=_np_float32)
                  if type(x) is _ndarray
                  else x.new_empty(<object> (wr.rows,) if x_vector else (xr.rows, wr.rows)))
        if not _read_float32(result, &yr, held, True, True, &y_vector):
            _unreadable("out")
    elif not (_read_float32(out, &yr, held, x_vector, True, &y_vector) and yr.rows == xr.rows
              and yr.cols == wr.rows and (yr.rows <= 1 or yr.stride == yr.cols)
              and not (type(out) is _tensor and out.requires_grad)):
        if converted:
            _unreadable("out")
        return _linear_converted(x, weight, bias, out, threads)
    if _overlap(&yr, &xr) or _overlap(&yr, &wr) or (bias is not None and _overlap(&yr, &br)):
        raise ValueError("out overlaps x, weight or bias: linear cannot write its inputs")
    if bias is not None:
        bias_data = <const float*> br.data
    cdef sv_linear_job job
    job.x, job.x_stride, job.n = <const float*> xr.data, xr.stride, xr.rows
    job.w, job.w_stride, job.n_out, job.n_in = <const float*> wr.data, wr.stride, wr.rows, wr.cols
    job.bias, job.y, job.y_stride = bias_data, <float*> yr.data, yr.cols if yr.rows <= 1 else yr.stride
    with nogil:
        _linear_rows(&job, threads)
    return result


cdef object _linear_converted(object x, object weight, object bias, object out, int threads):
    """The slow road: ``_inputs.linear_arrays`` validates and converts, then the common case
    takes the C-contiguous float32 ndarrays it returns."""
    rows, w, b, target, result = _inputs.linear_arrays(x, weight, bias, out)
    _linear_entry(rows, w, b, target, True, threads)
    return result
