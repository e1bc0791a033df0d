/* Causal scaled-dot-product attention over the KV cache.
 *
 * SCALAR: the reference, one (query, head) row at a time with one row of
 * scores and an exact softmax.
 * AVX-512 / AVX2: flash-style (attention_flash.h): blocks of BQ queries of
 * one head against blocks of BK keys with an online softmax, so no T×T (or
 * T×keys) score matrix is ever formed and each key block is reused from
 * cache by BQ queries.  Threads take (query block, head) items round-robin,
 * which balances the causal triangle (later query blocks see more keys). */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BQ 16
#define BK 64

typedef struct {
    float *out;
    const float *q, *k, *v;
    int64_t T, pos0, n_heads, n_kv, d, window;
    tp_kernel_path path;
    float *scratch;      /* per thread: BQ·d outputs, BK scores, BQ max, BQ sum */
    size_t scratch_stride;
} attn_job;

/* The first key position that query position pos may see. */
static int64_t first_key(const attn_job *j, int64_t pos)
{
    return j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
}

/* ---- scalar reference ------------------------------------------------- */

static void attend_row(const attn_job *j, int64_t t, int64_t h, float *scores)
{
    int64_t pos = j->pos0 + t;
    int64_t first = first_key(j, pos);
    int64_t kvh = h / (j->n_heads / j->n_kv), kv_stride = j->n_kv * j->d;
    const float *q = j->q + (t * j->n_heads + h) * j->d;
    float scale = 1.0f / sqrtf((float)j->d);
    for (int64_t p = first; p <= pos; p++) {
        const float *k = j->k + p * kv_stride + kvh * j->d;
        float dot = 0;
        for (int64_t i = 0; i < j->d; i++) dot += q[i] * k[i];
        scores[p - first] = dot * scale;
    }
    tp_softmax_path(TP_KERNEL_SCALAR, scores, pos - first + 1);
    float *o = j->out + (t * j->n_heads + h) * j->d;
    memset(o, 0, (size_t)j->d * sizeof(float));
    for (int64_t p = first; p <= pos; p++) {
        const float *v = j->v + p * kv_stride + kvh * j->d;
        float w = scores[p - first];
        for (int64_t i = 0; i < j->d; i++) o[i] += w * v[i];
    }
}

static void scalar_worker(void *p, int ti, int nt)
{
    const attn_job *j = p;
    int64_t b, e;
    tp_split_range(j->T * j->n_heads, ti, nt, &b, &e);
    float *scores = malloc((size_t)(j->pos0 + j->T) * sizeof(float));
    if (!scores) return;
    for (int64_t r = b; r < e; r++) attend_row(j, r / j->n_heads, r % j->n_heads, scores);
    free(scores);
}

/* ---- AVX-512 helpers -------------------------------------------------- */

TP_T512 static inline float dot512(const float *a, const float *b, int64_t d)
{
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
        __mmask16 m = tp_mask16(d - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

TP_T512 static inline void axpy512(float *o, float p, const float *v, int64_t d)
{
    __m512 pv = _mm512_set1_ps(p);
    for (int64_t i = 0; i < d; i += 16) {
        __mmask16 m = tp_mask16(d - i);
        _mm512_mask_storeu_ps(o + i, m, _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, v + i), _mm512_maskz_loadu_ps(m, o + i)));
    }
}

TP_T512 static inline void scale512(float *o, float c, int64_t d)
{
    __m512 cv = _mm512_set1_ps(c);
    for (int64_t i = 0; i < d; i += 16) {
        __mmask16 m = tp_mask16(d - i);
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(m, o + i)));
    }
}

TP_T512 static inline float expsum512(float *s, int64_t n, float mx)
{
    __m512 sum = _mm512_setzero_ps(), mv = _mm512_set1_ps(mx);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tp_mask16(n - i);
        __m512 e = _mm512_maskz_mov_ps(m, tp_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), mv)));
        _mm512_mask_storeu_ps(s + i, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

#define FLASH_FN flash_avx512
#define FLASH_TARGET TP_T512
#define VDOT dot512
#define VAXPY axpy512
#define VSCALE scale512
#define VEXPSUM expsum512
#include "kernels/attention_flash.h"
#undef FLASH_FN
#undef FLASH_TARGET
#undef VDOT
#undef VAXPY
#undef VSCALE
#undef VEXPSUM

/* ---- AVX2 helpers ----------------------------------------------------- */

TP_TAVX2 static inline float dot256(const float *a, const float *b, int64_t d)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        __m256i m = tp_mask256(d - i);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc);
    }
    return tp_hsum256(acc);
}

TP_TAVX2 static inline void axpy256(float *o, float p, const float *v, int64_t d)
{
    __m256 pv = _mm256_set1_ps(p);
    for (int64_t i = 0; i < d; i += 8) {
        __m256i m = tp_mask256(d - i);
        _mm256_maskstore_ps(o + i, m, _mm256_fmadd_ps(pv, _mm256_maskload_ps(v + i, m), _mm256_maskload_ps(o + i, m)));
    }
}

TP_TAVX2 static inline void scale256(float *o, float c, int64_t d)
{
    __m256 cv = _mm256_set1_ps(c);
    for (int64_t i = 0; i < d; i += 8) {
        __m256i m = tp_mask256(d - i);
        _mm256_maskstore_ps(o + i, m, _mm256_mul_ps(cv, _mm256_maskload_ps(o + i, m)));
    }
}

TP_TAVX2 static inline float expsum256(float *s, int64_t n, float mx)
{
    __m256 sum = _mm256_setzero_ps(), mv = _mm256_set1_ps(mx);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tp_mask256(n - i);
        __m256 e = _mm256_and_ps(_mm256_castsi256_ps(m), tp_exp256(_mm256_sub_ps(_mm256_maskload_ps(s + i, m), mv)));
        _mm256_maskstore_ps(s + i, m, e);
        sum = _mm256_add_ps(sum, e);
    }
    return tp_hsum256(sum);
}

#define FLASH_FN flash_avx2
#define FLASH_TARGET TP_TAVX2
#define VDOT dot256
#define VAXPY axpy256
#define VSCALE scale256
#define VEXPSUM expsum256
#include "kernels/attention_flash.h"

/* ---- driver ----------------------------------------------------------- */

static void flash_worker(void *p, int ti, int nt)
{
    const attn_job *j = p;
    float *o = j->scratch + (size_t)ti * j->scratch_stride;
    float *s = o + BQ * j->d, *m = s + BK, *l = m + BQ;
    int64_t nqb = (j->T + BQ - 1) / BQ, items = nqb * j->n_heads;
    for (int64_t r = ti; r < items; r += nt) {
        int64_t qb = r / j->n_heads, h = r % j->n_heads;
        int64_t t0 = qb * BQ, t1 = t0 + BQ < j->T ? t0 + BQ : j->T;
        if (j->path == TP_KERNEL_AVX512) flash_avx512(j, t0, t1, h, o, s, m, l);
        else flash_avx2(j, t0, t1, h, o, s, m, l);
    }
}

void tp_attention_path(tp_kernel_path p, float *out, const float *q, const float *k,
                       const float *v, int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv,
                       int64_t d, int64_t window, tp_threadpool *pool)
{
    attn_job j = {out, q, k, v, T, pos0, n_heads, n_kv, d, window, tp_kernel_resolve(p), NULL, 0};
    if (j.path != TP_KERNEL_SCALAR) {
        int nt = tp_threadpool_size(pool);
        j.scratch_stride = ((size_t)(BQ * d + BK + 2 * BQ) + 15) / 16 * 16;
        j.scratch = malloc(j.scratch_stride * (size_t)nt * sizeof(float));
    }
    if (j.scratch) {
        tp_parallel_run(pool, flash_worker, &j);
        free(j.scratch);
    } else {
        tp_parallel_run(pool, scalar_worker, &j);   /* scalar, or no memory for the scratch */
    }
}

void tp_attention(float *out, const float *q, const float *k, const float *v,
                  int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                  int64_t window, tp_threadpool *pool)
{
    tp_attention_path(TP_KERNEL_AUTO, out, q, k, v, T, pos0, n_heads, n_kv, d, window, pool);
}
