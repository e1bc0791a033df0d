/* Causal scaled-dot-product attention over the KV cache.
 *
 * SCALAR: the reference, one (query, head) row at a time with one row of
 * scores and an exact softmax.
 * AVX-512 / AVX2: flash-style (attention_flash.h): blocks of VL queries
 * (VL = the vector width in floats: 16, 8) of the heads that share a KV head
 * (two at a time where the GQA group size is even) against blocks of BK keys
 * with an online softmax, so no T×T (or T×keys) score matrix is ever formed
 * and each key block is reused from cache by the whole query block and both
 * heads.  A full block runs the lanes kernel (one query per vector lane, both
 * products as register-tiled GEMMs); a partial one (decode's single query, a
 * prefill's last rows) the rows kernel.  Threads take (head group, query
 * block) items from per-group counters (see flash_worker), so that a KV
 * head's keys stay in cache, latest (largest) query block first so that the
 * small ones even out the end; which kernel and which order of sums a
 * (query, head) gets depends on neither the thread count nor the schedule. */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
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
    float *pack;         /* per thread 2·(pos0 + T)·d floats, or NULL: see kv_pack */
    atomic_llong *next;  /* per head group: its next query block (flash_worker) */
} attn_job;

/* Where a kernel reads one KV head's keys and values: row p (a position)
 * at k + p·stride and v + p·stride. */
typedef struct {
    const float *k, *v;
    int64_t stride;
} kv_rows;

/* A thread's packed copy of one KV head's rows [lo, hi), for the lanes
 * kernel.  In the cache a KV head's rows lie n_kv·d floats apart (4 KiB for
 * 8 heads of 128): every row then falls into the same few cache sets, so
 * the L1 cache holds a dozen rows instead of a block and the L2 cache an
 * eighth of what it could.  Packed, the rows are contiguous; the copy costs
 * one pass and is reused by every query block of the head group. */
typedef struct {
    float *k, *v;            /* [pos0 + T][d] each; NULL: read the cache in place */
    int64_t kvh, lo, hi;     /* kvh = -1: nothing packed yet */
} kv_pack;

/* The first key position that query position pos may see. */
static int64_t first_key(const attn_job *j, int64_t pos)
{
    if (j->window < 0) return pos / -j->window * -j->window;   /* Llama 4's chunk: its first position */
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

/* The flash kernels below are AVX-512 and AVX2 code (x86-64 only). */
#if TP_KERNELS_X86

/* All the cache lines of one row of d floats, into L1.  For rows that lie
 * a page or so apart, which no hardware prefetcher follows. */
static inline void prefetch_row(const float *row, int64_t d)
{
    for (int64_t i = 0; i < d; i += 16) _mm_prefetch((const char *)(row + i), _MM_HINT_T0);
}

#define PACK_AHEAD 4   /* rows prefetched ahead of the copy */

/* Copy rows [lo, hi) of KV head kvh into the pack. */
static void pack_rows(const attn_job *j, kv_pack *pk, int64_t kvh, int64_t lo, int64_t hi)
{
    int64_t d = j->d, stride = j->n_kv * d;
    const float *k = j->k + kvh * d, *v = j->v + kvh * d;
    for (int64_t p = lo; p < hi; p++) {
        if (p + PACK_AHEAD < hi) {
            prefetch_row(k + (p + PACK_AHEAD) * stride, d);
            prefetch_row(v + (p + PACK_AHEAD) * stride, d);
        }
        memcpy(pk->k + p * d, k + p * stride, (size_t)d * sizeof(float));
        memcpy(pk->v + p * d, v + p * stride, (size_t)d * sizeof(float));
    }
}

/* The rows [lo, hi) of KV head kvh, packed where there is a pack: a
 * thread's items of one head group come in a row with shrinking key
 * ranges, so mostly the first item of a group packs, the others reuse. */
static kv_rows kv_for(const attn_job *j, kv_pack *pk, int64_t kvh, int64_t lo, int64_t hi)
{
    if (!pk->k) return (kv_rows){j->k + kvh * j->d, j->v + kvh * j->d, j->n_kv * j->d};
    if (pk->kvh != kvh || hi <= pk->lo || lo >= pk->hi) {
        pack_rows(j, pk, kvh, lo, hi);
        pk->kvh = kvh, pk->lo = lo, pk->hi = hi;
    } else {
        if (lo < pk->lo) pack_rows(j, pk, kvh, lo, pk->lo), pk->lo = lo;
        if (hi > pk->hi) pack_rows(j, pk, kvh, pk->hi, hi), pk->hi = hi;
    }
    return (kv_rows){pk->k, pk->v, j->d};
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
        __m512 e = _mm512_maskz_mov_ps(m, tp_exp512_ftz(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), mv)));
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
#define LANES_BODY lanes_body_avx512
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
#define VEXP tp_exp2_512_ftz   /* masked lanes: no denormal assists */
#define VKEEP keep512
#define VTRANSPOSE tp_transpose16x16
/* 32 registers: one head 8 keys / 16 rows (a V row's whole cache line),
 * two heads 8 × 2 = 16 accumulators for both products */
#define KR1 8
#define RB1 16
#define KR2 8
#define RB2 8
#include "kernels/attention_flash.h"
#undef FLASH_FN
#undef LANES_FN
#undef LANES_BODY
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
#undef VTRANSPOSE
#undef KR1
#undef RB1
#undef KR2
#undef RB2

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

/* r[i][c] -> r[c][i] for an 8×8 block, as tp_transpose16x16 with 2 lanes. */
TP_TAVX2 static inline void transpose256(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 2; m++) {
            __m256d a = _mm256_castps_pd(t[4 * k + m]), b = _mm256_castps_pd(t[4 * k + m + 2]);
            u[4 * k + 2 * m] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
            u[4 * k + 2 * m + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
        }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
        r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
}

TP_TAVX2 static inline __m256 keep256(__m256 s, __m256 p, __m256 lo, __m256 hi)
{
    __m256 k = _mm256_and_ps(_mm256_cmp_ps(p, lo, _CMP_GE_OQ), _mm256_cmp_ps(p, hi, _CMP_LE_OQ));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, k);
}

#define FLASH_FN flash_avx2
#define LANES_FN lanes_avx2
#define LANES_BODY lanes_body_avx2
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
#define VEXP tp_exp2_256_ftz
#define VKEEP keep256
#define VTRANSPOSE transpose256
/* 16 registers: one head 8 keys / 8 rows, two heads 4 × 2 */
#define KR1 8
#define RB1 8
#define KR2 4
#define RB2 4
#include "kernels/attention_flash.h"

/* ---- driver ----------------------------------------------------------- */

/* Heads per work item: two where the heads of a KV group pair up. */
static int heads_per_item(const attn_job *j)
{
    return (j->n_heads / j->n_kv) % 2 == 0 ? 2 : 1;
}

/* Floats of per-thread scratch for nh = 2 heads: the rows kernel needs
 * 2·BQ·d outputs, BK scores, 2·BQ maxima and 2·BQ sums; the lanes kernel
 * Qt and Ot (2·d·BQ each) and 2·BK·BQ scores.  Rounded to 64 bytes per
 * thread. */
static size_t scratch_floats(int64_t d)
{
    size_t rows = (size_t)(2 * BQ * d + BK + 4 * BQ), lanes = (size_t)(4 * d * BQ + 2 * BK * BQ);
    return ((rows > lanes ? rows : lanes) + 15) / 16 * 16;
}

/* Query block qb of the heads h0..h0+nh-1, with thread scratch o. */
static void run_item(const attn_job *j, kv_pack *pk, float *o, int64_t h0, int nh, int64_t qb)
{
    int vl = j->path == TP_KERNEL_AVX512 ? 16 : 8;
    int64_t t0 = qb * vl, t1 = t0 + vl < j->T ? t0 + vl : j->T;
    if (t1 - t0 < vl) {
        float *s = o + 2 * BQ * j->d, *m = s + BK, *l = m + 2 * BQ;
        if (j->path == TP_KERNEL_AVX512) flash_avx512(j, t0, t1, h0, nh, o, s, m, l);
        else flash_avx2(j, t0, t1, h0, nh, o, s, m, l);
        return;
    }
    float *qt = o, *ot = o + 2 * j->d * vl, *ls = ot + 2 * j->d * vl;
    kv_rows kv = kv_for(j, pk, h0 / (j->n_heads / j->n_kv), first_key(j, j->pos0 + t0), j->pos0 + t1);
    if (j->path == TP_KERNEL_AVX512) lanes_avx512(j, kv, t0, h0, nh, qt, ot, ls);
    else lanes_avx2(j, kv, t0, h0, nh, qt, ot, ls);
}

/* Each head group's query blocks are taken from its own counter, latest
 * (largest) first.  Thread ti starts at its own share of the groups, so
 * that the threads mostly pack and read different KV heads, then helps
 * with the groups still open. */
static void flash_worker(void *p, int ti, int nt)
{
    attn_job *j = p;
    int vl = j->path == TP_KERNEL_AVX512 ? 16 : 8, nh = heads_per_item(j);
    float *o = j->scratch + (size_t)ti * j->scratch_stride;
    int64_t nqb = (j->T + vl - 1) / vl, groups = j->n_heads / nh, L = j->pos0 + j->T;
    kv_pack pk = {NULL, NULL, -1, 0, 0};
    if (j->pack) pk.k = j->pack + (size_t)ti * (size_t)(2 * L * j->d), pk.v = pk.k + L * j->d;
    int64_t g0 = groups * ti / nt;
    for (int64_t gi = 0; gi < groups; gi++) {
        int64_t g = (g0 + gi) % groups;
        for (;;) {
            int64_t r = atomic_fetch_add_explicit(&j->next[g], 1, memory_order_relaxed);
            if (r >= nqb) break;
            run_item(j, &pk, o, g * nh, nh, nqb - 1 - r);
        }
    }
}
#endif /* TP_KERNELS_X86 */

void tp_attention_path(tp_kernel_path p, float *out, const float *q, const float *k,
                       const float *v, int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv,
                       int64_t d, int64_t window, tp_threadpool *pool)
{
    attn_job j = {out, q, k, v, T, pos0, n_heads, n_kv, d, window, tp_kernel_resolve(p), NULL, 0, NULL, NULL};
#if TP_KERNELS_X86
    if (j.path != TP_KERNEL_SCALAR) {
        int nt = tp_threadpool_size(pool);
        int64_t groups = n_heads / heads_per_item(&j);
        j.next = malloc((size_t)groups * sizeof *j.next);
        for (int64_t g = 0; j.next && g < groups; g++) atomic_init(&j.next[g], 0);
        j.scratch_stride = scratch_floats(d);
        j.scratch = j.next ? malloc(j.scratch_stride * (size_t)nt * sizeof(float)) : NULL;
        /* Packing pays where a KV head serves several query blocks (and
         * the cache's rows lie apart); without memory for it, read in place. */
        int vl = j.path == TP_KERNEL_AVX512 ? 16 : 8;
        if (T >= 2 * vl && n_kv > 1)
            j.pack = malloc((size_t)nt * (size_t)(2 * (pos0 + T) * d) * sizeof(float));
    }
    if (j.scratch) tp_parallel_run(pool, flash_worker, &j);
    else tp_parallel_run(pool, scalar_worker, &j);   /* scalar, or no memory for the scratch */
#else
    tp_parallel_run(pool, scalar_worker, &j);
#endif
    free(j.scratch);
    free(j.pack);
    free(j.next);
}

void tp_attention(float *out, const float *q, const float *k, const float *v,
                  int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                  int64_t window, tp_threadpool *pool)
{
    tp_attention_path(TP_KERNEL_AUTO, out, q, k, v, T, pos0, n_heads, n_kv, d, window, pool);
}

/* ---- training: the forward that keeps the logsumexp, and the backward ----
 * Portable C, threads over independent work items, so every result is
 * bitwise the same for any thread count.
 *
 * Per (query t, head h), with scores s_p = q·k_p/√d over the keys p the
 * query sees (causal, window) and lse = log Σ_p exp(s_p):
 *   P_p = exp(s_p − lse),  out = Σ_p P_p·v_p.
 * The forward saves lse per row ([T, n_heads] floats) and nothing of size
 * T × keys.  The backward recomputes each P_p from q, k and lse — the
 * flash-attention trade, a second pass over the scores instead of storing
 * them — and uses
 *   D      = Σ_i dout_i·out_i            (= Σ_p P_p·(dout·v_p))
 *   dv_p  += P_p·dout
 *   ds_p   = P_p·(dout·v_p − D)          (softmax's backward)
 *   dq    += ds_p·k_p/√d,   dk_p += ds_p·q/√d.
 * dk and dv of a KV head sum over the query heads of its group.  Two passes
 * keep every sum free of races without atomics: the first owns blocks of
 * keys (dk, dv), the second blocks of queries (dq); each recomputes the P
 * it needs.
 *
 * Everything runs over blocks of KB keys whose k (and v) are first copied
 * transposed, [d][KB], and over RB query rows at a time: the scores of the
 * RB rows for the block are then KB-wide multiply-adds, a_i times a row of
 * the copy, which the compiler vectorizes (instead of dot products, each a
 * serial chain of adds), and every row of the copy, of dk, dv or of a key,
 * is read once for RB rows. */

#define KB 32    /* keys per block */
#define QB 16    /* queries per work item of the forward and the dq pass */
#define RB 4     /* query rows per step */

typedef struct {
    const float *q, *k, *v, *out, *dout, *lse, *D;
    float *o_or_dq, *lse_out, *dk, *dv;
    int64_t T, pos0, H, KV, d, window;
    float *scratch;      /* per thread: see grad_scratch() */
    size_t scratch_stride;
    void (*rows_times_t)(float *restrict s, const float *const *a, const float *restrict t, int64_t d);
    void (*axpy_rows)(float *restrict o, const float *w, const float *const *x, int64_t d);
    void (*axpy_each)(float *const *o, const float *w, const float *restrict x, int64_t d);
} grad_job;

/* The per-thread scratch of every pass: the two transposed copies, the
 * dk/dv block sums, 2·RB rows of KB values, RB sink rows of d, and for QB
 * queries of every head of a group an output row plus its maximum and
 * sum. */
static size_t grad_scratch(int64_t d, int64_t grp)
{
    size_t f = (size_t)(4 * d * KB + 2 * RB * KB + RB * d + QB * grp * (d + 2));
    return (f + 15) / 16 * 16;
}

static int64_t key_lo(int64_t pos, int64_t window)
{
    if (window < 0) return pos / -window * -window;
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

static const float *kv_row(const grad_job *j, const float *base, int64_t p, int64_t g)
{
    return base + (p * j->KV + g) * j->d;
}

/* dst[i][c] = row p0 + c of KV head g, element i; columns past nk zero. */
static void pack_t(float *restrict dst, const grad_job *j, const float *base, int64_t g, int64_t p0, int64_t nk)
{
    for (int64_t c = 0; c < KB; c++) {
        const float *src = c < nk ? kv_row(j, base, p0 + c, g) : NULL;
        for (int64_t i = 0; i < j->d; i++) dst[i * KB + c] = src ? src[i] : 0.0f;
    }
}

/* The loops the passes spend their time in, compiled twice from one body:
 * portable C (4 wide on baseline x86-64), and for the AVX2 and AVX-512
 * paths with AVX2 + FMA (8 wide).  Each output element gets the same
 * operations in the same order either way — the sum over i, or over the
 * rows r, in order — so gcc in ISO C mode, which fuses nothing, gives the
 * same bits on both; a compiler that contracts a·b + c into an FMA may
 * not.  Within one path the forward and the backward run the same code,
 * hence the same scores.
 *   rows_times_t: s[r][c] = Σ_i a[r][i]·t[i][c], RB rows, KB columns.
 *   axpy_rows:    o += Σ_r w[r]·x[r]  (r in order: one output, RB inputs).
 *   axpy_each:    o[r] += w[r]·x      (RB outputs, one input). */
#define DEFINE_GRAD_LOOPS(sfx, attr)                                                              \
    attr static void rows_times_t_##sfx(float *restrict s, const float *const *a,                 \
                                        const float *restrict t, int64_t d)                       \
    {                                                                                             \
        for (int c = 0; c < RB * KB; c++) s[c] = 0.0f;                                            \
        for (int64_t i = 0; i < d; i++) {                                                         \
            const float *restrict ti = t + i * KB;                                                \
            for (int r = 0; r < RB; r++) {                                                        \
                float ai = a[r][i];                                                               \
                float *restrict sr = s + r * KB;                                                  \
                for (int c = 0; c < KB; c++) sr[c] += ai * ti[c];                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    attr static void axpy_rows_##sfx(float *restrict o, const float *w, const float *const *x,    \
                                     int64_t d)                                                   \
    {                                                                                             \
        const float *restrict x0 = x[0], *restrict x1 = x[1], *restrict x2 = x[2],                \
                              *restrict x3 = x[3];                                                \
        float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];                                         \
        for (int64_t i = 0; i < d; i++) o[i] = o[i] + w0 * x0[i] + w1 * x1[i] + w2 * x2[i] + w3 * x3[i]; \
    }                                                                                             \
    attr static void axpy_each_##sfx(float *const *o, const float *w, const float *restrict x,    \
                                     int64_t d)                                                   \
    {                                                                                             \
        float *restrict o0 = o[0], *restrict o1 = o[1], *restrict o2 = o[2], *restrict o3 = o[3]; \
        float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];                                         \
        for (int64_t i = 0; i < d; i++) {                                                         \
            float xi = x[i];                                                                      \
            o0[i] += w0 * xi, o1[i] += w1 * xi, o2[i] += w2 * xi, o3[i] += w3 * xi;               \
        }                                                                                         \
    }

#if RB != 4
#error "axpy_rows and axpy_each are written out for RB = 4"
#endif
DEFINE_GRAD_LOOPS(c, )
#if TP_KERNELS_X86
DEFINE_GRAD_LOOPS(avx2, TP_TAVX2)
#endif

/* The loops of the process's path (decided once per call). */
static void grad_pick_ops(grad_job *j)
{
    j->rows_times_t = rows_times_t_c, j->axpy_rows = axpy_rows_c, j->axpy_each = axpy_each_c;
#if TP_KERNELS_X86
    if (tp_kernel_resolve(TP_KERNEL_AUTO) != TP_KERNEL_SCALAR)
        j->rows_times_t = rows_times_t_avx2, j->axpy_rows = axpy_rows_avx2, j->axpy_each = axpy_each_avx2;
#endif
}

/* A step of up to RB query rows (t, h) of one KV group: row r is
 * (t0 + (r0 + r) / grp, g·grp + (r0 + r) % grp), the order of the work
 * item's rows.  Missing rows (past n) read the first one's inputs, with
 * weight 0, and write to sink rows of their own (axpy_each's outputs are
 * restrict: they must not alias). */
typedef struct {
    int n;
    int64_t row[RB];          /* index into [T·H] */
    int64_t pos[RB];
} row_step;

static row_step step_rows(const grad_job *j, int64_t g, int64_t t0, int64_t r0, int64_t rows)
{
    int64_t grp = j->H / j->KV;
    row_step s = {0, {0}, {0}};
    s.n = rows - r0 < RB ? (int)(rows - r0) : RB;
    for (int r = 0; r < RB; r++) {
        int64_t rr = r0 + (r < s.n ? r : 0), t = t0 + rr / grp;
        s.row[r] = t * j->H + g * grp + rr % grp;
        s.pos[r] = j->pos0 + t;
    }
    return s;
}

/* The key columns [*c0, *c1) of the block at p0 (nk keys) that position
 * pos sees; empty when *c0 >= *c1. */
static void seen_cols(const grad_job *j, int64_t pos, int64_t p0, int64_t nk, int64_t *c0, int64_t *c1)
{
    int64_t lo = key_lo(pos, j->window) - p0, hi = pos + 1 - p0;
    *c0 = lo > 0 ? lo : 0;
    *c1 = hi < nk ? hi : nk;
}

/* The union of the step's seen columns; 0 when none. */
static int step_cols(const grad_job *j, const row_step *s, int64_t p0, int64_t nk, int64_t c0[RB],
                     int64_t c1[RB], int64_t *lo, int64_t *hi)
{
    *lo = nk, *hi = 0;
    for (int r = 0; r < RB; r++) {
        if (r < s->n) seen_cols(j, s->pos[r], p0, nk, &c0[r], &c1[r]);
        else c0[r] = 0, c1[r] = 0;
        if (c0[r] < c1[r] && c0[r] < *lo) *lo = c0[r];
        if (c0[r] < c1[r] && c1[r] > *hi) *hi = c1[r];
    }
    return *lo < *hi;
}

/* ---- forward with lse: online softmax over key blocks ---------------- */

/* One row's online-softmax step over a key block: the row's scores s
 * (unscaled) become exp(score − new maximum) on its columns [c0, c1) and 0
 * elsewhere; its maximum *m, sum *l and unnormalised output o are
 * rescaled to the new maximum.  The caller then adds Σ_c s[c]·v_c to o. */
static void online_step(float *s, int64_t c0, int64_t c1, float scale, float *m, float *l, float *o, int64_t d)
{
    float mx = *m, sum = 0;
    for (int64_t c = c0; c < c1; c++) mx = fmaxf(mx, s[c] * scale);
    for (int64_t c = 0; c < KB; c++) {
        s[c] = c >= c0 && c < c1 ? expf(s[c] * scale - mx) : 0.0f;
        sum += s[c];
    }
    if (c0 >= c1) return;
    float corr = expf(*m - mx);   /* 0 on the row's first block */
    for (int64_t i = 0; i < d; i++) o[i] *= corr;
    *l = *l * corr + sum;
    *m = mx;
}

/* Item: KV head g, queries [t0, t1), every head of the group. */
static void lse_forward_item(const grad_job *j, int64_t g, int64_t t0, int64_t t1, float *w)
{
    int64_t d = j->d, grp = j->H / j->KV, rows = (t1 - t0) * grp;
    float *kt = w, *s = w + 4 * d * KB, *sink = s + 2 * RB * KB, *o = sink + RB * d, *m = o + QB * grp * d;
    float *l = m + QB * grp;
    float scale = 1.0f / sqrtf((float)d);
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    memset(o, 0, (size_t)(rows * d) * sizeof(float));
    int64_t k_lo = key_lo(j->pos0 + t0, j->window), k_hi = j->pos0 + t1;
    for (int64_t p0 = k_lo; p0 < k_hi; p0 += KB) {
        int64_t nk = k_hi - p0 < KB ? k_hi - p0 : KB;
        pack_t(kt, j, j->k, g, p0, nk);
        for (int64_t r0 = 0; r0 < rows; r0 += RB) {
            row_step st = step_rows(j, g, t0, r0, rows);
            int64_t c0[RB], c1[RB], lo, hi;
            if (!step_cols(j, &st, p0, nk, c0, c1, &lo, &hi)) continue;
            const float *a[RB];
            float *orow[RB];
            for (int r = 0; r < RB; r++) a[r] = j->q + st.row[r] * d, orow[r] = r < st.n ? o + (r0 + r) * d : sink + r * d;
            j->rows_times_t(s, a, kt, d);
            for (int r = 0; r < st.n; r++) online_step(s + r * KB, c0[r], c1[r], scale, m + r0 + r, l + r0 + r, orow[r], d);
            for (int r = st.n; r < RB; r++) memset(s + r * KB, 0, KB * sizeof(float));
            for (int64_t c = lo; c < hi; c++) {
                float wc[RB] = {s[c], s[KB + c], s[2 * KB + c], s[3 * KB + c]};
                j->axpy_each(orow, wc, kv_row(j, j->v, p0 + c, g), d);
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = (t0 + r / grp) * j->H + g * grp + r % grp;
        float inv = 1.0f / l[r];
        for (int64_t i = 0; i < d; i++) j->o_or_dq[row * d + i] = o[r * d + i] * inv;
        j->lse_out[row] = m[r] + logf(l[r]);
    }
}

/* Items (g, query block) dealt round-robin, latest blocks (the most keys)
 * first, so that the short ones even out the end. */
static void deal_query_blocks(const grad_job *j, int ti, int nt,
                              void (*item)(const grad_job *, int64_t, int64_t, int64_t, float *))
{
    int64_t nqb = (j->T + QB - 1) / QB, items = j->KV * nqb;
    float *w = j->scratch + (size_t)ti * j->scratch_stride;
    for (int64_t i = ti; i < items; i += nt) {
        int64_t g = i % j->KV, qb = nqb - 1 - i / j->KV, t0 = qb * QB;
        item(j, g, t0, t0 + QB < j->T ? t0 + QB : j->T, w);
    }
}

static void lse_forward_worker(void *p, int ti, int nt)
{
    deal_query_blocks(p, ti, nt, lse_forward_item);
}

static tp_status attn_grad_check(int64_t n_heads, int64_t n_kv, int64_t d)
{
    if (n_kv <= 0 || n_heads % n_kv != 0 || d <= 0)
        return tp_fail(TP_ERR_INVALID, "attention: %lld query heads, %lld KV heads of size %lld (the query heads "
                       "must be a multiple of the KV heads)", (long long)n_heads, (long long)n_kv, (long long)d);
    return TP_OK;
}

static tp_status grad_run(grad_job *j, tp_parallel_fn fn, tp_threadpool *pool, const char *who)
{
    int nt = tp_threadpool_size(pool);
    grad_pick_ops(j);
    j->scratch_stride = grad_scratch(j->d, j->H / j->KV);
    j->scratch = malloc(j->scratch_stride * (size_t)(nt > 0 ? nt : 1) * sizeof(float));
    if (!j->scratch) return tp_fail(TP_ERR_NOMEM, "%s: out of memory", who);
    tp_parallel_run(pool, fn, j);
    free(j->scratch);
    j->scratch = NULL;
    return TP_OK;
}

tp_status tp_attention_forward_lse(float *out, float *lse, const float *q, const float *k, const float *v,
                                   int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                                   int64_t window, tp_threadpool *pool)
{
    tp_status st = attn_grad_check(n_heads, n_kv, d);
    if (st || T == 0) return st;
    grad_job j = {.q = q, .k = k, .v = v, .o_or_dq = out, .lse_out = lse, .T = T, .pos0 = pos0,
                  .H = n_heads, .KV = n_kv, .d = d, .window = window};
    return grad_run(&j, lse_forward_worker, pool, "tp_attention_forward_lse");
}

/* ---- backward ---------------------------------------------------------- */

/* P and ds·scale of the step's rows over the block (zero on the columns a
 * row does not see, and on missing rows), from the transposed k and v. */
static void step_prob_and_ds(const grad_job *j, const row_step *st, const int64_t c0[RB], const int64_t c1[RB],
                             const float *kt, const float *vt, float *P, float *ds)
{
    int64_t d = j->d;
    float scale = 1.0f / sqrtf((float)d);
    const float *a[RB];
    for (int r = 0; r < RB; r++) a[r] = j->q + st->row[r] * d;
    j->rows_times_t(P, a, kt, d);
    for (int r = 0; r < RB; r++) a[r] = j->dout + st->row[r] * d;
    j->rows_times_t(ds, a, vt, d);
    for (int r = 0; r < RB; r++) {
        float lse = j->lse[st->row[r]], D = j->D[st->row[r]];
        for (int c = 0; c < KB; c++) {
            float e = c >= c0[r] && c < c1[r] ? expf(P[r * KB + c] * scale - lse) : 0.0f;
            ds[r * KB + c] = e * (ds[r * KB + c] - D) * scale;
            P[r * KB + c] = e;
        }
    }
}

/* Item: KV head g, keys [p0, p0 + nk).  Query t sees key p when
 * pos0 + t >= p and (with a window) pos0 + t − p < window.  Its rows are
 * those queries of every head of the group, in order (t, h). */
static void grad_kv_item(const grad_job *j, int64_t g, int64_t p0, int64_t nk, float *w)
{
    int64_t d = j->d, grp = j->H / j->KV;
    float *kt = w, *vt = kt + d * KB, *dk = vt + d * KB, *dv = dk + KB * d, *P = dv + KB * d, *ds = P + RB * KB;
    memset(dk, 0, (size_t)(2 * KB * d) * sizeof(float));
    pack_t(kt, j, j->k, g, p0, nk);
    pack_t(vt, j, j->v, g, p0, nk);
    int64_t t_lo = p0 - j->pos0 > 0 ? p0 - j->pos0 : 0, t_hi = j->T;   /* [t_lo, t_hi) */
    if (j->window > 0 && p0 + nk - 1 + j->window - j->pos0 < t_hi) t_hi = p0 + nk - 1 + j->window - j->pos0;
    /* a chunk's keys are seen only by the queries of their chunk */
    int64_t chunk_end = j->window < 0 ? ((p0 + nk - 1) / -j->window + 1) * -j->window : 0;
    if (j->window < 0 && chunk_end - j->pos0 < t_hi) t_hi = chunk_end - j->pos0;
    if (t_hi < t_lo) t_hi = t_lo;
    int64_t rows = (t_hi - t_lo) * grp;
    for (int64_t r0 = 0; r0 < rows; r0 += RB) {
        row_step st = step_rows(j, g, t_lo, r0, rows);
        int64_t c0[RB], c1[RB], lo, hi;
        if (!step_cols(j, &st, p0, nk, c0, c1, &lo, &hi)) continue;
        step_prob_and_ds(j, &st, c0, c1, kt, vt, P, ds);
        const float *qs[RB], *gos[RB];
        for (int r = 0; r < RB; r++) qs[r] = j->q + st.row[r] * d, gos[r] = j->dout + st.row[r] * d;
        for (int64_t c = lo; c < hi; c++) {
            float pc[RB] = {P[c], P[KB + c], P[2 * KB + c], P[3 * KB + c]};
            float dc[RB] = {ds[c], ds[KB + c], ds[2 * KB + c], ds[3 * KB + c]};
            j->axpy_rows(dv + c * d, pc, gos, d);
            j->axpy_rows(dk + c * d, dc, qs, d);
        }
    }
    for (int64_t c = 0; c < nk; c++) {
        float *dkr = j->dk + ((p0 + c) * j->KV + g) * d, *dvr = j->dv + ((p0 + c) * j->KV + g) * d;
        for (int64_t i = 0; i < d; i++) dkr[i] += dk[c * d + i], dvr[i] += dv[c * d + i];
    }
}

static void grad_kv_worker(void *p, int ti, int nt)
{
    const grad_job *j = p;
    int64_t L = j->pos0 + j->T, nkb = (L + KB - 1) / KB, items = j->KV * nkb;
    float *w = j->scratch + (size_t)ti * j->scratch_stride;
    for (int64_t i = ti; i < items; i += nt) {
        int64_t g = i % j->KV, p0 = i / j->KV * KB;
        grad_kv_item(j, g, p0, L - p0 < KB ? L - p0 : KB, w);
    }
}

/* Item: KV head g, queries [t0, t1), every head of the group. */
static void grad_q_item(const grad_job *j, int64_t g, int64_t t0, int64_t t1, float *w)
{
    int64_t d = j->d, grp = j->H / j->KV, rows = (t1 - t0) * grp;
    float *kt = w, *vt = kt + d * KB, *P = w + 4 * d * KB, *ds = P + RB * KB, *sink = ds + RB * KB;
    float *acc = sink + RB * d;
    memset(acc, 0, (size_t)(rows * d) * sizeof(float));
    int64_t k_lo = key_lo(j->pos0 + t0, j->window), k_hi = j->pos0 + t1;
    for (int64_t p0 = k_lo; p0 < k_hi; p0 += KB) {
        int64_t nk = k_hi - p0 < KB ? k_hi - p0 : KB;
        pack_t(kt, j, j->k, g, p0, nk);
        pack_t(vt, j, j->v, g, p0, nk);
        for (int64_t r0 = 0; r0 < rows; r0 += RB) {
            row_step st = step_rows(j, g, t0, r0, rows);
            int64_t c0[RB], c1[RB], lo, hi;
            if (!step_cols(j, &st, p0, nk, c0, c1, &lo, &hi)) continue;
            step_prob_and_ds(j, &st, c0, c1, kt, vt, P, ds);
            float *accs[RB];
            for (int r = 0; r < RB; r++) accs[r] = r < st.n ? acc + (r0 + r) * d : sink + r * d;
            for (int64_t c = lo; c < hi; c++) {
                float dc[RB] = {ds[c], ds[KB + c], ds[2 * KB + c], ds[3 * KB + c]};
                j->axpy_each(accs, dc, kv_row(j, j->k, p0 + c, g), d);
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float *dq = j->o_or_dq + ((t0 + r / grp) * j->H + g * grp + r % grp) * d;
        for (int64_t i = 0; i < d; i++) dq[i] += acc[r * d + i];
    }
}

static void grad_q_worker(void *p, int ti, int nt)
{
    deal_query_blocks(p, ti, nt, grad_q_item);
}

tp_status tp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, const float *out, const float *lse,
                                int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                                int64_t window, tp_threadpool *pool)
{
    tp_status st = attn_grad_check(n_heads, n_kv, d);
    if (st) return st;
    /* One pass computes dk and dv together (they share every P). */
    if (!dk != !dv) return tp_fail(TP_ERR_INVALID, "tp_attention_backward: dk and dv are both given or both NULL");
    if (T == 0) return TP_OK;
    float *D = malloc((size_t)(T * n_heads) * sizeof(float));
    if (!D) return tp_fail(TP_ERR_NOMEM, "tp_attention_backward: out of memory");
    for (int64_t r = 0; r < T * n_heads; r++) {
        double s = 0;
        for (int64_t i = 0; i < d; i++) s += (double)dout[r * d + i] * out[r * d + i];
        D[r] = (float)s;
    }
    grad_job j = {.q = q, .k = k, .v = v, .out = out, .dout = dout, .lse = lse, .D = D, .o_or_dq = dq,
                  .dk = dk, .dv = dv, .T = T, .pos0 = pos0, .H = n_heads, .KV = n_kv, .d = d, .window = window};
    if (dk) st = grad_run(&j, grad_kv_worker, pool, "tp_attention_backward");
    if (!st && dq) st = grad_run(&j, grad_q_worker, pool, "tp_attention_backward");
    free(D);
    return st;
}
