/* y = x @ W for expert weights stored [in, out] (Llama 4's bmm-style
 * experts, gpt_oss's): the product tp_matmul_backward_ex forms for an input
 * gradient (dx = dy · W), except for a few rows (a decoded token), where
 * the packed GEMM packs all of W for every call and costs more than the
 * product (3.4x a GEMV at H 2048, I 1024, bf16).  A few rows instead stream
 * W once, a pass of R rows of W at a time (8 on the SIMD paths: half the
 * passes over y of 4), each thread over its own columns, every row of x
 * taking the pass while its rows of W are in cache: y += Σ_q x[q] ·
 * W[q, c0..c1).  Every output element is one thread's sum in the order of
 * W's rows, whatever the thread count.  On Zen 5 (bench_layouts, one
 * thread, cold weights) this runs at 0.9-1.0x the GEMV of the same expert
 * stored [out, in]; the first form (4 rows, one FMA chain, masked loads)
 * ran at ~0.55x. */
#include "kern_internal.h"

#include <string.h>

#define XW_MAX_ROWS 4      /* rows of x that take the streaming loop */
#define XW_PF_BYTES 1024   /* software prefetch distance along a row of W */

typedef struct {
    float *y;
    const float *x;
    int64_t n, in, out;
    const void *w;
    int bf16;
    int pass;               /* rows of W per pass: 8 on the SIMD paths (in >= 8), else 4 */
    tp_kernel_path path;
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
 * offset off), stride apart: the scalar path and the SIMD paths' tails. */
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
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* y[0..n) += Σ_q a[q] · W[q, 0..n) for R (4 or 8) rows of W, V-wide
 * vectors (__m256 on AVX2, __m512 on AVX-512: SET1, MUL, FMA, ADD, LOADU,
 * STOREU and LOADW, the weights widened to f32), the tail by axpy4.  No
 * masked loads or stores in the loop (on Zen 5 they halved the rate on
 * cold weights); each row prefetched XW_PF_BYTES ahead within the thread's
 * columns, one prefetch a line.  The R rows are summed as a tree of R/2
 * chains of two, not one chain of R FMAs: the iterations are independent,
 * but a long chain per iteration fills the scheduler before the next
 * iteration's loads issue. */
#define XW_AXPY_BODY(VT, V, SET1, MUL, FMA, ADD, LOADU, STOREU, LOADW)                                    \
    do {                                                                                              \
        const int esz = bf16 ? 2 : 4;                                                                  \
        const int64_t pf = XW_PF_BYTES / esz, line = 64 / esz > V ? 64 / esz : V;                      \
        const char *wb = (const char *)w;                                                              \
        VT av[8];                                                                                      \
        for (int q = 0; q < R; q++) av[q] = SET1(a[q]);                                                \
        int64_t c = 0;                                                                                 \
        for (; c + V <= n; c += V) {                                                                   \
            int64_t i = off + c;                                                                       \
            if (c % line == 0 && c + pf < n)                                                           \
                for (int q = 0; q < R; q++) _mm_prefetch(wb + (i + pf + q * stride) * esz, _MM_HINT_T0); \
            VT p[4];                                                                                   \
            for (int q = 0; q < R / 2; q++) p[q] = MUL(av[q], LOADW(w, bf16, i + q * stride));         \
            for (int q = 0; q < R / 2; q++)                                                            \
                p[q] = FMA(av[q + R / 2], LOADW(w, bf16, i + (q + R / 2) * stride), p[q]);             \
            VT acc = R == 8 ? ADD(ADD(p[0], p[1]), ADD(p[2], p[3])) : ADD(p[0], p[1]);                 \
            STOREU(y + c, ADD(LOADU(y + c), acc));                                                     \
        }                                                                                              \
        for (int q = 0; q < R; q += 4) axpy4(y + c, w, bf16, off + q * stride + c, stride, a + q, n - c); \
    } while (0)

TAVX2 static inline __attribute__((always_inline)) void
axpy_avx2(float *y, const void *w, int bf16, int64_t off, int64_t stride, const float *a, int64_t n, const int R)
{
    XW_AXPY_BODY(__m256, 8, _mm256_set1_ps, _mm256_mul_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_loadu_ps,
                 _mm256_storeu_ps, load8);
}

/* the pass for R = 4 or 8 (constants inside, so the loop is unrolled) */
TAVX2 static void pass_avx2(float *y, const void *w, int bf16, int64_t off, int64_t stride, const float *a, int64_t n,
                            int R)
{
    if (R == 8) axpy_avx2(y, w, bf16, off, stride, a, n, 8);
    else axpy_avx2(y, w, bf16, off, stride, a, n, 4);
}

/* 16 weights from element i as f32 */
T512 static inline __m512 load16(const void *w, int bf16, int64_t i)
{
    if (!bf16) return _mm512_loadu_ps((const float *)w + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T512 static inline __attribute__((always_inline)) void
axpy_avx512(float *y, const void *w, int bf16, int64_t off, int64_t stride, const float *a, int64_t n, const int R)
{
    XW_AXPY_BODY(__m512, 16, _mm512_set1_ps, _mm512_mul_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_loadu_ps,
                 _mm512_storeu_ps, load16);
}

T512 static void pass_avx512(float *y, const void *w, int bf16, int64_t off, int64_t stride, const float *a,
                             int64_t n, int R)
{
    if (R == 8) axpy_avx512(y, w, bf16, off, stride, a, n, 8);
    else axpy_avx512(y, w, bf16, off, stride, a, n, 4);
}
#endif

/* One pass: rows base..base+pass of W times a[0..pass) into y's columns
 * c0..c0+n. */
static void pass_rows(const xw_job *j, float *y, int64_t base, int64_t c0, const float *a, int64_t n)
{
    int64_t off = base * j->out + c0;
#if TP_KERNELS_X86
    if (j->path >= TP_KERNEL_AVX512) { pass_avx512(y, j->w, j->bf16, off, j->out, a, n, j->pass); return; }
    if (j->path >= TP_KERNEL_AVX2) { pass_avx2(y, j->w, j->bf16, off, j->out, a, n, j->pass); return; }
#endif
    axpy4(y, j->w, j->bf16, off, j->out, a, n);
}

static void xw_worker(void *p, int ti, int nt)
{
    const xw_job *j = p;
    int64_t c0, c1, R = j->pass;
    tp_split_range((j->out + 15) / 16, ti, nt, &c0, &c1);   /* blocks of 16 columns */
    c0 *= 16, c1 = c1 * 16 < j->out ? c1 * 16 : j->out;
    if (c1 <= c0) return;
    for (int64_t r = 0; r < j->n; r++) memset(j->y + r * j->out + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    for (int64_t i = 0; i < j->in; i += R) {
        /* a last pass of fewer than R rows takes the R last rows of W
         * (in >= R), the ones already added with weight 0 */
        int64_t base = j->in - i < R ? j->in - R : i;
        for (int64_t r = 0; r < j->n; r++) {   /* the pass's rows of W, still in cache, for every row of x */
            float a[8];
            for (int q = 0; q < R; q++) a[q] = base + q >= i ? j->x[r * j->in + base + q] : 0.0f;
            pass_rows(j, j->y + r * j->out + c0, base, c0, a, c1 - c0);
        }
    }
}

tp_status tp_expert_xw(float *y, const float *x, int64_t n, const tp_tensor *w, tp_threadpool *pool,
                       const tp_matmul_opts *opts)
{
    int64_t in = w->shape[0], out = w->shape[1];
    if (n <= XW_MAX_ROWS && in >= 4 && (w->dtype == TP_F32 || w->dtype == TP_BF16)) {
        tp_kernel_path path = tp_kernel_resolve(opts ? opts->path : TP_KERNEL_AUTO);
        int pass = TP_KERNELS_X86 && path >= TP_KERNEL_AVX2 && in >= 8 ? 8 : 4;
        xw_job j = {y, x, n, in, out, w->data, w->dtype == TP_BF16, pass, path};
        tp_parallel_run(pool, xw_worker, &j);
        return TP_OK;
    }
    memset(y, 0, (size_t)(n * out) * sizeof(float));
    return tp_matmul_backward_ex(y, NULL, NULL, x, NULL, n, w, pool, opts);
}
