/* y = x @ W for expert weights stored [in, out] (Llama 4's bmm-style
 * experts, gpt_oss's): the product tp_matmul_backward_ex forms for an input
 * gradient (dx = dy · W), except for a few rows (a decoded token), where
 * the packed GEMM packs all of W for every call and costs more than the
 * product (3.4x a GEMV at H 2048, I 1024, bf16).  A few rows instead stream
 * W once, and each thread reads its part of W as one stream: W's rows one
 * after another, y[r] += x[r, i] · W[i, :] for every row r of x while row
 * i is in cache.  The core's prefetchers follow one stream, not several:
 * the form that read 8 rows side by side (8 streams a row apart) ran at
 * 0.74 of the GEMV of the same bytes stored [out, in] on Zen 5 (bench
 * kernels --moe, 1 thread), as the dense GEMV did before it moved to one
 * stream per thread (gemm_avx512.c gemv_row).  On the SIMD paths the
 * threads split W's rows, not its columns (a column range is a strided
 * stream, and at 2 threads it ran at 0.6-0.8 of the [out, in] GEMV where
 * row ranges ran at 0.9-1.0): the rows in fixed chunks, each chunk summed
 * apart and the sums added in chunk order, so the bits do not depend on
 * the thread count (chunk_worker). */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <string.h>

#define XW_MAX_ROWS 4      /* rows of x that take the streaming loop */
/* Software prefetch distance along a thread's stream of W: on Zen 5 (one
 * thread, cold bf16 experts at Qwen3-30B-A3B's shapes) 2 KiB reached 0.88-0.90
 * of the [out, in] GEMV, 4 KiB 1.00-1.03, 8 KiB 1.07-1.10, 16 KiB 1.06-1.11. */
#define XW_PF_BYTES 8192
#define XW_COLS 32         /* the scalar path: columns a thread's range is made of */
/* Rows of W summed apart, then added in order (SIMD paths): at least
 * XW_CHUNK_MIN, and at most XW_CHUNKS chunks.  A chunk's n × out sums are
 * read back once to be added (~n/32 of its weights' bytes at 64 rows);
 * more chunks split more evenly over the threads (Qwen3-30B-A3B's down,
 * 768 rows: 12, 6 + 6 on 2 threads). */
#define XW_CHUNK_MIN 64
#define XW_CHUNKS 32

typedef struct {
    float *y;
    const float *x;
    int64_t n, in, out;
    const void *w;
    int bf16;
    tp_kernel_path path;
    float *part;            /* the chunks' sums (chunk_worker), part_stride floats apart */
    int64_t chunks, chunk_rows, part_stride;
} xw_job;

static inline float w_at(const void *w, int bf16, int64_t i)
{
    if (!bf16) return ((const float *)w)[i];
    uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* y[0..n) += Σ_q a[q] · W[q, 0..n) for the 4 rows of W from w (element
 * offset off), stride apart: the scalar path. */
static void axpy4(float *restrict y, const void *w, int bf16, int64_t off, int64_t stride, const float *a, int64_t n)
{
    for (int64_t c = 0; c < n; c++)
        y[c] += a[0] * w_at(w, bf16, off + c) + a[1] * w_at(w, bf16, off + stride + c) +
                a[2] * w_at(w, bf16, off + 2 * stride + c) + a[3] * w_at(w, bf16, off + 3 * stride + c);
}

#if TP_KERNELS_X86
#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx2")))

/* 8 weights from element i as f32 */
TAVX2 static inline __m256 load8(const void *w, int bf16, int64_t i)
{
    if (!bf16) return _mm256_loadu_ps((const float *)w + i);
    return tp_bf16x8_to_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
}

/* One pass of the thread's stream: rows i..i+R of W (R = 1 or 2; W from
 * element off, rows `out` apart), y[r][c] += x[r][i] · W[i, c] for the n
 * rows of x (xs apart) and all out columns of y, row after row, V-wide
 * vectors (__m256 on AVX2, __m512 on AVX-512: SET1, FMA, ADD, LOADU,
 * STOREU and LOADW, the weights widened to f32), a step of 32 columns, the
 * last < 32 one vector or one column at a time.  Each line of W is
 * prefetched pf elements ahead along the stream: pa + c in row i + q + dr,
 * or pb + c in the row after it once c passes out - dc (the last row at the
 * end).  A step's y rows are all loaded before any is stored: rows of y
 * 4 KiB apart alias, and a load after a store to the same 4 KiB offset
 * waits for it.  The stream's first pass (i = 0) starts y from zero instead
 * of loading it, and where fin is given its last pass adds the finished
 * sums to fin instead of storing them: no separate passes to clear a
 * chunk's sums and add them to the output, which would idle the stream. */
#define XW_PASS(VT, V, SET1, FMA, ADD, LOADU, STOREU, LOADW, R)                                            \
    do {                                                                                              \
        const char *pa[R], *pb[R];                                                                     \
        VT av[R][XW_MAX_ROWS];                                                                         \
        for (int q = 0; q < R; q++) {                                                                  \
            int64_t ra = i + q + dr < lim ? i + q + dr : lim - 1, rb = ra + 1 < lim ? ra + 1 : lim - 1; \
            pa[q] = wb + (off + ra * out + dc) * esz;                                                  \
            pb[q] = wb + (off + rb * out + dc - out) * esz;                                            \
            for (int r = 0; r < n; r++) av[q][r] = SET1(x[r * xs + i + q]);                            \
        }                                                                                              \
        const int64_t o = off + i * out;                                                               \
        const int first = i == 0;                                                                      \
        float *to = i + R == in ? fin : NULL;                                                          \
        int64_t c = 0;                                                                                 \
        for (; c + 32 <= out; c += 32) {                                                               \
            VT wv[R][32 / V], yv[XW_MAX_ROWS][32 / V];                                                 \
            for (int q = 0; q < R; q++) {                                                              \
                for (int64_t l = 0; l < 32; l += line)                                                 \
                    _mm_prefetch((c + l < out - dc ? pa[q] : pb[q]) + (c + l) * esz, _MM_HINT_T0);     \
                for (int u = 0; u < 32 / V; u++) wv[q][u] = LOADW(w, bf16, o + q * out + c + u * V);   \
            }                                                                                          \
            for (int r = 0; r < n; r++)                                                                \
                for (int u = 0; u < 32 / V; u++) yv[r][u] = first ? SET1(0.0f) : LOADU(y + r * out + c + u * V); \
            for (int q = 0; q < R; q++)                                                                \
                for (int r = 0; r < n; r++)                                                            \
                    for (int u = 0; u < 32 / V; u++) yv[r][u] = FMA(av[q][r], wv[q][u], yv[r][u]);     \
            if (to)                                                                                    \
                for (int r = 0; r < n; r++)                                                            \
                    for (int u = 0; u < 32 / V; u++) {                                                 \
                        float *tp = to + r * out + c + u * V;                                          \
                        STOREU(tp, ADD(LOADU(tp), yv[r][u]));                                          \
                    }                                                                                  \
            else                                                                                       \
                for (int r = 0; r < n; r++)                                                            \
                    for (int u = 0; u < 32 / V; u++) STOREU(y + r * out + c + u * V, yv[r][u]);        \
        }                                                                                              \
        for (int q = 0; q < R; q++) {   /* the tail: y itself, cleared at the start, added to fin at the end */ \
            int64_t t = c;                                                                             \
            if (first && q == 0)                                                                       \
                for (int r = 0; r < n; r++) memset(y + r * out + t, 0, (size_t)(out - t) * sizeof(float)); \
            for (; t + V <= out; t += V) {                                                             \
                VT wv = LOADW(w, bf16, o + q * out + t);                                               \
                for (int r = 0; r < n; r++) STOREU(y + r * out + t, FMA(av[q][r], wv, LOADU(y + r * out + t))); \
            }                                                                                          \
            for (; t < out; t++)                                                                       \
                for (int r = 0; r < n; r++) y[r * out + t] += x[r * xs + i + q] * w_at(w, bf16, o + q * out + t); \
            if (to && q == R - 1)                                                                      \
                for (int r = 0; r < n; r++)                                                            \
                    for (t = c; t < out; t++) to[r * out + t] += y[r * out + t];                       \
        }                                                                                              \
    } while (0)

/* The thread's stream: the rows of W in order, two a pass for 3 or 4 rows
 * of x (half the y traffic; the sum per element stays one FMA per row in
 * row order, so the bits do not depend on the pass). */
#define XW_STREAM_BODY(VT, V, SET1, FMA, ADD, LOADU, STOREU, LOADW)                                           \
    do {                                                                                              \
        const int esz = bf16 ? 2 : 4;                                                                  \
        const int64_t line = 64 / esz, dr = pf / out, dc = pf % out;                                   \
        const char *wb = (const char *)w;                                                              \
        int64_t i = 0;                                                                                 \
        if (n >= 3)                                                                                    \
            for (; i + 2 <= in; i += 2) XW_PASS(VT, V, SET1, FMA, ADD, LOADU, STOREU, LOADW, 2);            \
        for (; i < in; i++) XW_PASS(VT, V, SET1, FMA, ADD, LOADU, STOREU, LOADW, 1);                        \
    } while (0)

TAVX2 static inline __attribute__((always_inline)) void
stream_avx2(float *restrict y, const float *restrict x, int64_t xs, const int n, const void *w, const int bf16,
            int64_t off, int64_t out, int64_t in, int64_t lim, int64_t pf, float *fin)
{
    XW_STREAM_BODY(__m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_loadu_ps, _mm256_storeu_ps, load8);
}

/* 16 weights from element i as f32 */
T512 static inline __m512 load16(const void *w, int bf16, int64_t i)
{
    if (!bf16) return _mm512_loadu_ps((const float *)w + i);
    return tp_bf16x16_to_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
}

T512 static inline __attribute__((always_inline)) void
stream_avx512(float *restrict y, const float *restrict x, int64_t xs, const int n, const void *w, const int bf16,
              int64_t off, int64_t out, int64_t in, int64_t lim, int64_t pf, float *fin)
{
    XW_STREAM_BODY(__m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                   load16);
}

/* the stream with n (1-4) and the dtype as constants, so that the loops over
 * them unroll and av stays in registers */
#define XW_DISPATCH(FN)                                                                                       \
    do {                                                                                                      \
        switch (n * 2 + bf16) {                                                                               \
        case 2: FN(y, x, xs, 1, w, 0, off, out, in, lim, pf, fin); break;                                     \
        case 3: FN(y, x, xs, 1, w, 1, off, out, in, lim, pf, fin); break;                                     \
        case 4: FN(y, x, xs, 2, w, 0, off, out, in, lim, pf, fin); break;                                     \
        case 5: FN(y, x, xs, 2, w, 1, off, out, in, lim, pf, fin); break;                                     \
        case 6: FN(y, x, xs, 3, w, 0, off, out, in, lim, pf, fin); break;                                     \
        case 7: FN(y, x, xs, 3, w, 1, off, out, in, lim, pf, fin); break;                                     \
        case 8: FN(y, x, xs, 4, w, 0, off, out, in, lim, pf, fin); break;                                     \
        default: FN(y, x, xs, 4, w, 1, off, out, in, lim, pf, fin); break;                                    \
        }                                                                                                     \
    } while (0)

TAVX2 static void run_avx2(float *y, const float *x, int64_t xs, int64_t n, const void *w, int bf16, int64_t off,
                           int64_t out, int64_t in, int64_t lim, int64_t pf, float *fin)
{
    XW_DISPATCH(stream_avx2);
}

T512 static void run_avx512(float *y, const float *x, int64_t xs, int64_t n, const void *w, int bf16, int64_t off,
                            int64_t out, int64_t in, int64_t lim, int64_t pf, float *fin)
{
    XW_DISPATCH(stream_avx512);
}
#endif

/* The scalar path: each thread over its own columns, 4 rows of W a pass. */
static void scalar_worker(void *p, int ti, int nt)
{
    const xw_job *j = p;
    int64_t c0, c1;
    tp_split_range((j->out + XW_COLS - 1) / XW_COLS, ti, nt, &c0, &c1);
    c0 *= XW_COLS, c1 = c1 * XW_COLS < j->out ? c1 * XW_COLS : j->out;
    if (c1 <= c0) return;
    for (int64_t r = 0; r < j->n; r++) memset(j->y + r * j->out + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    for (int64_t i = 0; i < j->in; i += 4) {
        /* a last pass of fewer than 4 rows takes the 4 last rows of W
         * (in >= 4), the ones already added with weight 0 */
        int64_t base = j->in - i < 4 ? j->in - 4 : i;
        for (int64_t r = 0; r < j->n; r++) {
            float a[4];
            for (int q = 0; q < 4; q++) a[q] = base + q >= i ? j->x[r * j->in + base + q] : 0.0f;
            axpy4(j->y + r * j->out + c0, j->w, j->bf16, base * j->out + c0, j->out, a, c1 - c0);
        }
    }
}

#if TP_KERNELS_X86
/* The SIMD paths: W's rows in fixed chunks (of chunk_rows), each thread a
 * run of whole chunks, so that its part of W is one stream.  Chunk k's sum
 * p_k = Σ x[i]·W[i, :] over its rows starts from zero, and y = ((p_0 + p_1)
 * + p_2) + ... in chunk order, whatever the thread count: thread 0 sums
 * chunk 0 into y and each further chunk of its run into part[0], added to
 * y with its last row; the other threads leave chunk k in part[k], added
 * by the caller after the region, in order. */
static void chunk_worker(void *p, int ti, int nt)
{
    const xw_job *j = p;
    int64_t k0, k1, pf = XW_PF_BYTES / (j->bf16 ? 2 : 4);
    tp_split_range(j->chunks, ti, nt, &k0, &k1);
    int64_t ch = j->chunk_rows, lim = k1 * ch < j->in ? k1 * ch : j->in;   /* the run's end: prefetches stop there */
    for (int64_t k = k0; k < k1; k++) {
        int64_t i0 = k * ch, rows = i0 + ch < j->in ? ch : j->in - i0;
        float *dst = ti == 0 && k == 0 ? j->y : j->part + (ti == 0 ? 0 : k) * j->part_stride;
        float *fin = ti == 0 && k > 0 ? j->y : NULL;   /* thread 0 adds its chunk to y as it ends */
        if (j->path >= TP_KERNEL_AVX512)
            run_avx512(dst, j->x + i0, j->in, j->n, j->w, j->bf16, i0 * j->out, j->out, rows, lim - i0, pf, fin);
        else
            run_avx2(dst, j->x + i0, j->in, j->n, j->w, j->bf16, i0 * j->out, j->out, rows, lim - i0, pf, fin);
    }
}

static tp_status run_chunks(xw_job *j, tp_threadpool *pool)
{
    int64_t in = j->in, sz = j->n * j->out, k0, first_end;
    j->chunk_rows = (in + XW_CHUNKS - 1) / XW_CHUNKS;
    if (j->chunk_rows < XW_CHUNK_MIN) j->chunk_rows = XW_CHUNK_MIN;
    j->chunks = (in + j->chunk_rows - 1) / j->chunk_rows;
    tp_split_range(j->chunks, 0, tp_threadpool_size(pool), &k0, &first_end);   /* thread 0's run */
    /* part[0]: thread 0's chunk in progress; part[k], k >= first_end: the
     * other threads' chunks, a whole number of lines apart */
    j->part_stride = (sz + 15) / 16 * 16;
    size_t bytes = (size_t)((first_end < j->chunks ? j->chunks : 1) * j->part_stride) * sizeof(float);
    void *own;
    j->part = tp_kernel_scratch(pool, bytes, &own);
    if (!j->part) return tp_fail(TP_ERR_NOMEM, "tp_expert_xw: out of memory for the chunk sums");
    tp_parallel_run(pool, chunk_worker, j);
    for (int64_t k = first_end; k < j->chunks; k++)
        for (int64_t e = 0; e < sz; e++) j->y[e] += j->part[k * j->part_stride + e];
    tp_free(own);
    return TP_OK;
}
#endif

tp_status tp_expert_xw(float *y, const float *x, int64_t n, const tp_tensor *w, tp_threadpool *pool,
                       const tp_matmul_opts *opts)
{
    int64_t in = w->shape[0], out = w->shape[1];
    if (n <= XW_MAX_ROWS && in >= 4 && (w->dtype == TP_F32 || w->dtype == TP_BF16)) {
        tp_kernel_path path = tp_kernel_resolve(opts ? opts->path : TP_KERNEL_AUTO);
        xw_job j = {y, x, n, in, out, w->data, w->dtype == TP_BF16, path, NULL, 0, 0, 0};
#if TP_KERNELS_X86
        if (path >= TP_KERNEL_AVX2) return run_chunks(&j, pool);
#endif
        tp_parallel_run(pool, scalar_worker, &j);
        return TP_OK;
    }
    memset(y, 0, (size_t)(n * out) * sizeof(float));
    return tp_matmul_backward_ex(y, NULL, NULL, x, NULL, n, w, pool, opts);
}
