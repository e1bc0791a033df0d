/* AVX2 + FMA matmul: the same structure as gemm_avx512.c (read that first),
 * sized for 16 ymm registers: tiles of MR = 6 rows by NR = 16 columns, 12
 * accumulators.  W slices are packed with plain loops (AVX2 gathers are not
 * worth it); bf16 is widened to f32 while packing, so the products are exact.
 * There is no bf16-dot variant: AVX2 has no bf16 dot product. */
#include "kernels/kern_internal.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define MR 6
#define NR 16
#define KC 256       /* packed W slice KC×NR×4 B = 16 KiB */

#define TAVX2 __attribute__((target("avx2,fma")))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- packing ---------------------------------------------------------- */


/* W[n0:n0+NR, k0:k0+kc] → dst[kc][NR] f32, columns past n zero. */
static void pack_b(float *dst, const void *w, tp_dtype wt, int64_t n, int64_t ldw,
                   int64_t n0, int64_t k0, int64_t kc)
{
    for (int j = 0; j < NR; j++) {
        float *d = dst + j;
        if (n0 + j >= n) {
            for (int64_t k = 0; k < kc; k++) d[k * NR] = 0.0f;
        } else if (wt == TP_F32) {
            const float *s = (const float *)w + (n0 + j) * ldw + k0;
            for (int64_t k = 0; k < kc; k++) d[k * NR] = s[k];
        } else {
            const uint16_t *s = (const uint16_t *)w + (n0 + j) * ldw + k0;
            for (int64_t k = 0; k < kc; k++) d[k * NR] = tp_f32_from_bf16(s[k]);
        }
    }
}

/* ---- micro-kernel ----------------------------------------------------- */

/* Lane mask for columns c0..c0+7 of a tile with nr valid columns. */
TAVX2 static __m256i lane_mask(int valid)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lanes);
}

TAVX2 static void kernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                         int mr, int nr, int accumulate)
{
    __m256 acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    __m256i m0 = lane_mask(nr), m1 = lane_mask(nr - 8);
    for (int i = 0; i < MR && i < mr; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_maskload_ps(ci, m0));
            acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_maskload_ps(ci + 8, m1));
        }
        _mm256_maskstore_ps(ci, m0, acc[i][0]);
        _mm256_maskstore_ps(ci + 8, m1, acc[i][1]);
    }
}

/* ---- GEMM driver ------------------------------------------------------ */

typedef struct {
    float *y;
    const float *x;
    const void *w;
    tp_dtype wt;
    int64_t T, n, k;
    char *buf;
    size_t buf_stride, a_bytes;
} gemm_job;

static void gemm_worker(void *p, int ti, int nt)
{
    const gemm_job *j = p;
    int64_t b0, b1;
    tp_split_range((j->n + NR - 1) / NR, ti, nt, &b0, &b1);
    if (b0 == b1) return;
    float *ap = (float *)(j->buf + (size_t)ti * j->buf_stride);
    float *bp = (float *)(j->buf + (size_t)ti * j->buf_stride + j->a_bytes);
    for (int64_t k0 = 0; k0 < j->k; k0 += KC) {
        int64_t kc = min64(KC, j->k - k0);
        tp_gemm_pack_a(ap, j->x, j->T, j->k, k0, kc, MR);
        for (int64_t nb = b0; nb < b1; nb++) {
            int64_t n0 = nb * NR;
            pack_b(bp, j->w, j->wt, j->n, j->k, n0, k0, kc);
            for (int64_t t0 = 0; t0 < j->T; t0 += MR)
                kernel(kc, ap + t0 * kc, bp, j->y + t0 * j->n + n0, j->n, (int)min64(MR, j->T - t0),
                       (int)min64(NR, j->n - n0), k0 > 0);
        }
    }
}

tp_status tp_gemm_avx2(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                       int64_t n, int64_t k, tp_threadpool *pool)
{
    int nt = tp_threadpool_size(pool);
    int64_t tpad = (T + MR - 1) / MR * MR;
    gemm_job j = {y, x, W, wt, T, n, k, NULL, 0, 0};
    j.a_bytes = (size_t)tpad * KC * sizeof(float);
    j.buf_stride = (j.a_bytes + (size_t)KC * NR * sizeof(float) + 63) / 64 * 64;
    j.buf = tp_alloc(j.buf_stride * (size_t)nt);
    if (!j.buf) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for GEMM packing");
    tp_parallel_run(pool, gemm_worker, &j);
    tp_free(j.buf);
    return TP_OK;
}

/* ---- GEMV ------------------------------------------------------------- */

typedef struct {
    float *y;
    const float *x;      /* f32 W: x itself; bf16 W: x permuted in blocks of 16 */
    const void *w;
    tp_dtype wt;
    int64_t T, n, k, kp;
} gemv_job;

#define GEMV_ROWS 2

TAVX2 static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) TAVX2 void
gemv_block(const gemv_job *j, int64_t r0, const int R, const int T)
{
    __m256 acc[GEMV_ROWS][TP_GEMV_MAX_T];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = j->k, i = 0;
    if (j->wt == TP_F32) {
        const float *w = (const float *)j->w + r0 * k;
        for (; i + 8 <= k; i += 8)
            for (int r = 0; r < R; r++) {
                __m256 wv = _mm256_loadu_ps(w + r * k + i);
                for (int t = 0; t < T; t++)
                    acc[r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(j->x + t * k + i), acc[r][t]);
            }
        if (i < k) {
            __m256i m = lane_mask((int)(k - i));
            for (int r = 0; r < R; r++) {
                __m256 wv = _mm256_maskload_ps(w + r * k + i, m);
                for (int t = 0; t < T; t++)
                    acc[r][t] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(j->x + t * k + i, m), acc[r][t]);
            }
        }
    } else {
        /* 16 bf16 per 32-byte load: evens are lane << 16, odds lane & ~0xffff. */
        const uint16_t *w = (const uint16_t *)j->w + r0 * k;
        const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
        for (; i < k; i += 16) {
            for (int r = 0; r < R; r++) {
                __m256i v;
                if (k - i >= 16) {
                    v = _mm256_loadu_si256((const __m256i *)(w + r * k + i));
                } else {   /* tail: copy what exists, zeros after */
                    uint16_t tmp[16] = {0};
                    memcpy(tmp, w + r * k + i, (size_t)(k - i) * sizeof(uint16_t));
                    v = _mm256_loadu_si256((const __m256i *)tmp);
                }
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
                for (int t = 0; t < T; t++) {
                    acc[r][t] = _mm256_fmadd_ps(we, _mm256_load_ps(j->x + t * j->kp + i), acc[r][t]);
                    acc[r][t] = _mm256_fmadd_ps(wo, _mm256_load_ps(j->x + t * j->kp + i + 8), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) j->y[t * j->n + r0 + r] = hsum(acc[r][t]);
}

#define GEMV_CASES(R)                                  \
    switch (j->T) {                                    \
    case 1: gemv_block(j, r0, R, 1); break;            \
    case 2: gemv_block(j, r0, R, 2); break;            \
    case 3: gemv_block(j, r0, R, 3); break;            \
    default: gemv_block(j, r0, R, 4); break;           \
    }

TAVX2 static void gemv_worker(void *p, int ti, int nt)
{
    const gemv_job *j = p;
    int64_t g0, g1;
    tp_split_range((j->n + GEMV_ROWS - 1) / GEMV_ROWS, ti, nt, &g0, &g1);
    int64_t r1 = min64(g1 * GEMV_ROWS, j->n), r0 = g0 * GEMV_ROWS;
    for (; r0 + GEMV_ROWS <= r1; r0 += GEMV_ROWS) GEMV_CASES(GEMV_ROWS)
    for (; r0 < r1; r0++) GEMV_CASES(1)
}

tp_status tp_gemv_avx2(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                       int64_t n, int64_t k, tp_threadpool *pool)
{
    gemv_job j = {y, x, W, wt, T, n, k, k};
    float *tmp = NULL;
    if (wt == TP_BF16) {
        j.kp = (k + 15) / 16 * 16;
        tmp = tp_alloc((size_t)(T * j.kp) * sizeof(float));
        if (!tmp) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for GEMV");
        tp_gemv_permute_x(tmp, x, T, k, j.kp, 16);
        j.x = tmp;
    }
    tp_parallel_run(pool, gemv_worker, &j);
    tp_free(tmp);
    return TP_OK;
}
