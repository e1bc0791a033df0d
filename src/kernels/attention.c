/* Causal scaled-dot-product attention over the KV cache.
 *
 * SCALAR: the reference, one (query, head) row at a time with one row of
 * scores and an exact softmax.
 * AVX-512 / AVX2: flash-style (attention_flash.h): blocks of VL queries of
 * one head (VL = the vector width in floats: 16, 8) against blocks of BK keys
 * with an online softmax, so no T×T (or T×keys) score matrix is ever formed
 * and each key block is reused from cache by the whole query block.  A full
 * block runs the lanes kernel (one query per vector lane, both products as
 * register-tiled GEMMs); a partial one (decode's single query, a prefill's
 * last rows) the rows kernel.  Threads take (query block, head) items
 * round-robin, which balances the causal triangle (later query blocks see
 * more keys); which kernel and which order of sums a block gets does not
 * depend on the thread count. */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BQ 16    /* the largest query block (VL of AVX-512) */
#define BK 64

typedef struct {
    float *out;
    const float *q, *k, *v;
    int64_t T, pos0, n_heads, n_kv, d, window;
    tp_kernel_path path;
    float *scratch;      /* per thread: see scratch_floats() */
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

TP_T512 static inline __m512 keep512(__m512 s, __m512 p, __m512 lo, __m512 hi)
{
    __mmask16 k = _mm512_cmp_ps_mask(p, lo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(p, hi, _CMP_LE_OQ);
    return _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), s);
}

#define FLASH_FN flash_avx512
#define LANES_FN lanes_avx512
#define FLASH_TARGET TP_T512
#define VDOT dot512
#define VAXPY axpy512
#define VSCALE scale512
#define VEXPSUM expsum512
#define VEC __m512
#define VL 16
#define VZERO _mm512_setzero_ps
#define VSET1 _mm512_set1_ps
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VMUL _mm512_mul_ps
#define VMAX _mm512_max_ps
#define VFMA _mm512_fmadd_ps
#define VEXP tp_exp512
#define VKEEP keep512
#define RB 16
#include "kernels/attention_flash.h"
#undef FLASH_FN
#undef LANES_FN
#undef FLASH_TARGET
#undef VDOT
#undef VAXPY
#undef VSCALE
#undef VEXPSUM
#undef VEC
#undef VL
#undef VZERO
#undef VSET1
#undef VLOAD
#undef VSTORE
#undef VADD
#undef VMUL
#undef VMAX
#undef VFMA
#undef VEXP
#undef VKEEP
#undef RB

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

TP_TAVX2 static inline __m256 keep256(__m256 s, __m256 p, __m256 lo, __m256 hi)
{
    __m256 k = _mm256_and_ps(_mm256_cmp_ps(p, lo, _CMP_GE_OQ), _mm256_cmp_ps(p, hi, _CMP_LE_OQ));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, k);
}

#define FLASH_FN flash_avx2
#define LANES_FN lanes_avx2
#define FLASH_TARGET TP_TAVX2
#define VDOT dot256
#define VAXPY axpy256
#define VSCALE scale256
#define VEXPSUM expsum256
#define VEC __m256
#define VL 8
#define VZERO _mm256_setzero_ps
#define VSET1 _mm256_set1_ps
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VMUL _mm256_mul_ps
#define VMAX _mm256_max_ps
#define VFMA _mm256_fmadd_ps
#define VEXP tp_exp256
#define VKEEP keep256
#define RB 8
#include "kernels/attention_flash.h"

/* ---- driver ----------------------------------------------------------- */

/* Floats of per-thread scratch: the rows kernel needs BQ·d outputs, BK
 * scores, BQ maxima and BQ sums; the lanes kernel Qt and Ot (d·VL each) and
 * BK·VL scores.  Rounded to 64 bytes per thread. */
static size_t scratch_floats(int64_t d)
{
    size_t rows = (size_t)(BQ * d + BK + 2 * BQ), lanes = (size_t)(2 * d * BQ + BK * BQ);
    return ((rows > lanes ? rows : lanes) + 15) / 16 * 16;
}

static void flash_worker(void *p, int ti, int nt)
{
    const attn_job *j = p;
    int vl = j->path == TP_KERNEL_AVX512 ? 16 : 8;
    float *o = j->scratch + (size_t)ti * j->scratch_stride;
    float *s = o + BQ * j->d, *m = s + BK, *l = m + BQ;     /* rows kernel */
    float *qt = o, *ot = o + j->d * vl, *ls = ot + j->d * vl; /* lanes kernel */
    int64_t nqb = (j->T + vl - 1) / vl, items = nqb * j->n_heads;
    for (int64_t r = ti; r < items; r += nt) {
        int64_t qb = r / j->n_heads, h = r % j->n_heads;
        int64_t t0 = qb * vl, t1 = t0 + vl < j->T ? t0 + vl : j->T;
        if (j->path == TP_KERNEL_AVX512) {
            if (t1 - t0 == 16) lanes_avx512(j, t0, h, qt, ot, ls);
            else flash_avx512(j, t0, t1, h, o, s, m, l);
        } else {
            if (t1 - t0 == 8) lanes_avx2(j, t0, h, qt, ot, ls);
            else flash_avx2(j, t0, t1, h, o, s, m, l);
        }
    }
}

void tp_attention_path(tp_kernel_path p, float *out, const float *q, const float *k,
                       const float *v, int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv,
                       int64_t d, int64_t window, tp_threadpool *pool)
{
    attn_job j = {out, q, k, v, T, pos0, n_heads, n_kv, d, window, tp_kernel_resolve(p), NULL, 0};
    if (j.path != TP_KERNEL_SCALAR) {
        int nt = tp_threadpool_size(pool);
        j.scratch_stride = scratch_floats(d);
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
