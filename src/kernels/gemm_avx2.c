/* AVX2 + FMA matmul, sized for 16 ymm registers.
 *
 * GEMM (prefill): the packed driver of gemm_packed.c with the micro-kernel
 * below (tiles of MR = 6 rows by NR = 16 columns, 12 accumulators); the
 * same kernel runs the training backward (matmul.c).  bf16 weights are
 * widened to f32 while packing, so the products are exact.  There is no
 * bf16-dot variant: AVX2 has no bf16 dot product.
 *
 * GEMV (decode, T <= 4): as gemm_avx512.c's (read that first). */
#include "kernels/kern_internal.h"
#include "kernels/kern_q4.h"
#include "kernels/vmath.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define MR 6
#define NR 16

#define TAVX2 __attribute__((target("avx2,fma")))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Lane mask for columns c0..c0+7 of a tile with nr valid columns. */
TAVX2 static __m256i lane_mask(int valid)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lanes);
}

/* ---- micro-kernel for the packed GEMM (gemm_packed.c) -----------------
 * 12 ymm accumulators, 2 for B and 1 for the broadcast of A: 15 of 16.
 * Per k: 2 loads of B, 6 broadcasts, 12 FMAs — within two loads and two
 * FMAs per cycle.  Edge tiles go through a scratch tile and the same adds,
 * so an element's bits do not depend on where in a tile it lies. */
TAVX2 static void ukernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                          int accumulate)
{
    /* Named accumulators: an array indexed by the edge loops below would
     * live on the stack and be stored back at every step. */
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int i = 0; i < mr; i++) _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
#define UK_ROW(i, r0, r1)                                  \
    do {                                                   \
        __m256 ai = _mm256_broadcast_ss(a + (i));          \
        r0 = _mm256_fmadd_ps(ai, b0, r0);                  \
        r1 = _mm256_fmadd_ps(ai, b1, r1);                  \
    } while (0)
    /* Edge tiles of 1-2 or 3-4 rows run only those rows' FMAs: an MoE
     * prompt gives each expert ~32 rows, and a full 6-row pass over the
     * last few of them cost ~10 % of its GEMMs.  Each element's chain of
     * operations is the same in every variant. */
    if (mr <= 2) {
#pragma GCC unroll 4
        for (int64_t k = 0; k < kc; k++) {
            __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
            UK_ROW(0, c00, c01);
            UK_ROW(1, c10, c11);
            a += MR;
            b += NR;
        }
    } else if (mr <= 4) {
#pragma GCC unroll 4
        for (int64_t k = 0; k < kc; k++) {
            __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
            if ((k & 3) == 0) _mm_prefetch((const char *)(a + 8 * MR), _MM_HINT_T0);
            UK_ROW(0, c00, c01);
            UK_ROW(1, c10, c11);
            UK_ROW(2, c20, c21);
            UK_ROW(3, c30, c31);
            a += MR;
            b += NR;
        }
    } else {
#pragma GCC unroll 4
        for (int64_t k = 0; k < kc; k++) {
            __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
            if ((k & 3) == 0) _mm_prefetch((const char *)(a + 8 * MR), _MM_HINT_T0);
            UK_ROW(0, c00, c01);
            UK_ROW(1, c10, c11);
            UK_ROW(2, c20, c21);
            UK_ROW(3, c30, c31);
            UK_ROW(4, c40, c41);
            UK_ROW(5, c50, c51);
            a += MR;
            b += NR;
        }
    }
#undef UK_ROW
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            float *ci = c + i * ldc;
            if (accumulate) {
                acc[i][0] = _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]);
                acc[i][1] = _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]);
            }
            _mm256_storeu_ps(ci, acc[i][0]);
            _mm256_storeu_ps(ci + 8, acc[i][1]);
        }
        return;
    }
    __m256i m0 = lane_mask(nr), m1 = lane_mask(nr - 8);
    for (int i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            acc[i][0] = _mm256_add_ps(_mm256_maskload_ps(ci, m0), acc[i][0]);
            acc[i][1] = _mm256_add_ps(_mm256_maskload_ps(ci + 8, m1), acc[i][1]);
        }
        _mm256_maskstore_ps(ci, m0, acc[i][0]);
        _mm256_maskstore_ps(ci + 8, m1, acc[i][1]);
    }
}

/* ---- packing B = Wᵀ for the packed GEMM -------------------------------
 * A micro-panel is NR rows of W, kc long, laid out k-major: an 8 × 8
 * transpose per 8 rows × 8 k (bf16 widened by a shift on the way: its bits
 * are the top half of the f32), so the values are those of the generic
 * packing.  The SSE 4 × 4 version of gemm_packed.c took 5–6 % of a
 * prefill, most of it on bf16 weights. */
TAVX2 static __m256 load8_w(const tp_gemm_operand *b, int64_t off)
{
    if (b->dt == TP_F32) return _mm256_loadu_ps((const float *)b->p + off);
    return tp_bf16x8_to_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)b->p + off)));
}

/* v[q] = (v0[q], ..., v7[q]) for q < 8: an 8 × 8 transpose in registers. */
static inline __attribute__((always_inline)) TAVX2 void transpose8(__m256 v[8])
{
    __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(s0, s4, 0x20), v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    v[2] = _mm256_permute2f128_ps(s2, s6, 0x20), v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    v[4] = _mm256_permute2f128_ps(s0, s4, 0x31), v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    v[6] = _mm256_permute2f128_ps(s2, s6, 0x31), v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* 8 values of a block from element e (a multiple of 8) times its scale d,
 * exact in f32: q8_0's d·q (q: the block's quants); q4_0's d·(nibble - 8)
 * (q: its 16 bytes), elements 0..15 the low nibbles of bytes 0..15, 16..31
 * the high ones. */
static inline __attribute__((always_inline)) TAVX2 __m256 dequant8(const char *q, tp_dtype dt, int e, __m256 d)
{
    __m256i v;
    if (dt == TP_Q8_0) {
        v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)q + e)));
    } else {
        v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + e % 16)));
        v = e < 16 ? _mm256_and_si256(v, _mm256_set1_epi32(0x0f)) : _mm256_srli_epi32(v, 4);
        v = _mm256_sub_epi32(v, _mm256_set1_epi32(8));
    }
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), d);
}

/* q8_0 or q4_0 rows (b->cs = k, whole blocks of 32; p0 and kc multiples of
 * 32): per 8 rows, one block of each at a time — its scale read once — as
 * 4 transposes of 8 × 8 dequantized values.  A q8_0 row is its blocks in
 * order; a q4_0 block is found in the repacked layout (kern_q4.h).  The
 * values are the generic packing's (gemm_packed.c load_q8, load_q4). */
static inline __attribute__((always_inline)) TAVX2 void
pack_bt_blocks(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0, tp_dtype dt)
{
    _Static_assert(TP_Q8_BLOCK == 32 && TP_Q4_BLOCK == 32, "blocks of 32");
    const size_t bsz = dt == TP_Q8_0 ? sizeof(tp_q8_block) : sizeof(tp_q4_block);
    const int64_t nb = b->cs / 32;
    const char *w = b->p;
    for (int h = 0; h < NR; h += 8) {
        for (int64_t p = 0; p < kc; p += 32) {
            int64_t blk = (p0 + p) / 32, gds = 0, gqs = 0;
            const char *q[8];
            __m256 d[8];
            for (int r = 0; r < 8; r++) {
                int64_t row = j0 + h + r, ds, qs;
                if (dt == TP_Q8_0) {
                    ds = (row * nb + blk) * (int64_t)bsz;
                    qs = ds + 2;
                } else {
                    /* j0 + h is a multiple of 4 and the panel's groups are
                     * whole (j0 + NR <= rows): a group is located once a
                     * block, its rows 2 (scale) and 16 bytes apart */
                    if (r % TP_Q4_ROWS == 0) gds = tp_q4_locate(b->rows, nb, row, blk, &gqs);
                    ds = gds + 2 * (r % TP_Q4_ROWS);
                    qs = gqs + 16 * (r % TP_Q4_ROWS);
                }
                /* the next panel's rows lie NR·nb blocks on in either layout (a
                 * q4_0 group past the last row: an address for a prefetch only) */
                int64_t nqs = qs + NR * nb * (int64_t)bsz;
                /* the same block of the next panel's rows, as pack_bt does */
                _mm_prefetch((const char *)((uintptr_t)w + (uintptr_t)nqs), _MM_HINT_T0);
                uint16_t h16;
                memcpy(&h16, w + ds, sizeof h16);
                d[r] = _mm256_set1_ps(tp_q8_scale(h16));
                q[r] = w + qs;
            }
            for (int e = 0; e < 32; e += 8) {
                __m256 v[8];
                for (int r = 0; r < 8; r++) v[r] = dequant8(q[r], dt, e, d[r]);
                transpose8(v);
                for (int q8 = 0; q8 < 8; q8++) _mm256_storeu_ps(dst + (p + e + q8) * NR + h, v[q8]);
            }
        }
    }
}

TAVX2 static void pack_bt_q8(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0)
{
    pack_bt_blocks(dst, b, p0, kc, j0, TP_Q8_0);
}

TAVX2 static void pack_bt_q4(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0)
{
    pack_bt_blocks(dst, b, p0, kc, j0, TP_Q4_0);
}

TAVX2 static void pack_bt(float *dst, const tp_gemm_operand *b, int64_t p0, int64_t kc, int64_t j0)
{
    if (b->dt == TP_Q8_0) {
        pack_bt_q8(dst, b, p0, kc, j0);
        return;
    }
    if (b->dt == TP_Q4_0) {
        pack_bt_q4(dst, b, p0, kc, j0);
        return;
    }
    int64_t cs = b->cs, esz = b->dt == TP_F32 ? 4 : 2, line = 64 / esz;
    const char *w = b->p;
    for (int h = 0; h < NR; h += 8) {
        int64_t o = (j0 + h) * cs + p0, p = 0;
        for (; p + 8 <= kc; p += 8) {
            /* Each row is a short stream (kc elements) that the hardware
             * prefetchers barely pick up before it ends: fetch the same
             * stretch of the next panel's rows (NR rows on) meanwhile. */
            if (p % line == 0)
                for (int r = 0; r < 8; r++)   /* past the last panel too: a prefetch never faults */
                    _mm_prefetch((const char *)((uintptr_t)w + (uintptr_t)((o + (NR + r) * cs + p) * esz)), _MM_HINT_T0);
            __m256 v[8];
            for (int r = 0; r < 8; r++) v[r] = load8_w(b, o + r * cs + p);
            transpose8(v);
            for (int q = 0; q < 8; q++) _mm256_storeu_ps(dst + (p + q) * NR + h, v[q]);
        }
        for (; p < kc; p++)
            for (int j = 0; j < 8; j++) {
                int64_t off = o + j * cs + p;
                float v;
                if (b->dt == TP_F32) {
                    v = ((const float *)b->p)[off];
                } else {
                    uint32_t u = (uint32_t)((const uint16_t *)b->p)[off] << 16;
                    memcpy(&v, &u, sizeof v);
                }
                dst[p * NR + h + j] = v;
            }
    }
}

/* ---- packing A = x for the packed GEMM -------------------------------
 * A micro-panel is MR = 6 rows of x, kc long, laid out k-major (6 floats
 * per k).  Per 8 k: the 6 rows and 2 zero rows transposed 8 × 8, each
 * column stored unaligned 6 floats after the previous one, so the next
 * store overwrites its 2 spare lanes; the last is masked to 6.  The
 * generic packing did 2 of the 6 rows element by element: 4 % of a
 * prefill's samples, on every thread (each packs all of x). */
TAVX2 static void pack_a(float *dst, const tp_gemm_operand *a, int64_t i0, int64_t p0, int64_t kc)
{
    const float *s = (const float *)a->p + i0 * a->rs + p0;
    const __m256i last = lane_mask(MR);
    int64_t rs = a->rs, p = 0;
    for (; p + 8 <= kc; p += 8) {
        __m256 v[8];
        for (int r = 0; r < MR; r++) v[r] = _mm256_loadu_ps(s + r * rs + p);
        v[6] = v[7] = _mm256_setzero_ps();
        transpose8(v);
        for (int q = 0; q < 7; q++) _mm256_storeu_ps(dst + (p + q) * MR, v[q]);
        _mm256_maskstore_ps(dst + (p + 7) * MR, last, v[7]);
    }
    for (; p < kc; p++)
        for (int r = 0; r < MR; r++) dst[p * MR + r] = s[r * rs + p];
}

/* Blocks for a core with 32 KiB L1d and 512 KiB - 2 MiB L2: the B
 * micro-panel KC×NR×4 = 16 KiB, the A block MC×KC×4 = 168 KiB, a B panel
 * KC×NC×4 = 2 MiB; with A packed whole (a prefill's 512 rows), B panels of
 * 256 columns, 256 KiB: with the A block that is L2 on Zen 2 (512 KiB).
 * There, with both cores busy, the micro-kernel ran at 0.82-0.93 of the
 * FMA peak on 2 MiB panels (read from the shared L3) and 0.95 on 256 KiB
 * ones (alone on one core: 0.92-0.94 and 0.95). */
const tp_gemm_ukernel tp_gemm_ukernel_avx2 = {MR, NR, 168, 256, 2048, ukernel, pack_bt, pack_a, 256};

/* ---- GEMM: y = x·Wᵀ through the packed driver ------------------------- */

tp_status tp_gemm_avx2(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                       int64_t n, int64_t k, tp_threadpool *pool)
{
    tp_gemm_operand a = {x, TP_F32, k, 1, 0}, b = {W, wt, 1, k, n};
    return tp_gemm_packed(&tp_gemm_ukernel_avx2, y, n, 0, T, n, k, &a, &b, pool);
}

/* ---- GEMV ------------------------------------------------------------- */

typedef struct {
    float *y;
    const float *x;      /* f32 W: x itself; bf16 W: x permuted in blocks of 16 */
    const void *w;
    tp_dtype wt;
    int64_t T, n, k, kp;
} gemv_job;

/* Rows per block: 4 for T = 1, 2 for T > 1 (R·T accumulators of 16 ymm). */
#define GEMV_ROWS_T1 4
#define GEMV_ROWS 2
#define GEMV_MAX_ROWS 4

/* Software prefetch GEMV_PF_BYTES of W ahead of every row stream, as in
 * gemm_avx512.c (read the reasons and the offsets there). */
#define GEMV_PF_BYTES 16384
#define GEMV_PREFETCH(r, pos)                                                        \
    do {                                                                             \
        int64_t o_ = (r) * kb + (pos) + ((pos) + pf_rem < kb ? pf_near : pf_far);    \
        _mm_prefetch(wb + (o_ < lim ? o_ : lim), _MM_HINT_T0);                       \
    } while (0)

/* lim: the byte offset of W's last byte, from row r0 (prefetches stop
 * there). */
static inline __attribute__((always_inline)) TAVX2 void
gemv_block(const gemv_job *j, int64_t r0, const int R, const int T, int64_t lim)
{
    __m256 acc[GEMV_MAX_ROWS][TP_GEMV_MAX_T];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = j->k, i = 0;
    const int64_t kb = k * (j->wt == TP_F32 ? 4 : 2);
    const char *wb = (const char *)j->w + r0 * kb;
    const int64_t pf_row = GEMV_PF_BYTES / R, pf_blocks = pf_row / kb, pf_rem = pf_row - pf_blocks * kb;
    const int64_t pf_near = pf_blocks * R * kb + pf_rem, pf_far = pf_near + (R - 1) * kb;
    if (j->wt == TP_F32) {
        const float *w = (const float *)j->w + r0 * k;
        for (; i + 8 <= k; i += 8)
            for (int r = 0; r < R; r++) {
                if (i % 16 == 0) GEMV_PREFETCH(r, 4 * i);   /* once per 64-byte line */
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
                    if (i % 32 == 0) GEMV_PREFETCH(r, 2 * i);
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
        for (int t = 0; t < T; t++) j->y[t * j->n + r0 + r] = tp_hsum256(acc[r][t]);
}

/* All blocks of R rows in [r0, r1), then single rows. */
#define GEMV_RUN(R, T)                                                                    \
    do {                                                                                  \
        for (; r0 + (R) <= r1; r0 += (R)) gemv_block(j, r0, (R), (T), last - r0 * row_bytes); \
        for (; r0 < r1; r0++) gemv_block(j, r0, 1, (T), last - r0 * row_bytes);           \
    } while (0)

/* Rows [r0, r1) (a chunk of tp_parallel_for): each row's sum is the same
 * whoever computes it and whatever rows share its block, so the dynamic
 * split keeps the bits of any thread count.  Prefetches may run into the
 * rest of W (usually this thread's next chunk), never past its end. */
TAVX2 static void gemv_chunk(void *p, int64_t r0, int64_t r1, int ti)
{
    (void)ti;
    const gemv_job *j = p;
    int64_t row_bytes = j->k * (j->wt == TP_F32 ? 4 : 2);
    int64_t last = j->n * row_bytes - 1;
    switch (j->T) {
    case 1: GEMV_RUN(GEMV_ROWS_T1, 1); break;
    case 2: GEMV_RUN(GEMV_ROWS, 2); break;
    case 3: GEMV_RUN(GEMV_ROWS, 3); break;
    default: GEMV_RUN(GEMV_ROWS, 4); break;
    }
}

/* x permuted as tp_permute_x_avx512 (kern_internal.h) does, in blocks of
 * 16 for the 32-byte loads of 16 bf16 weights: shufps picks the evens
 * (odds) of each 128-bit half, vpermpd puts the halves in order. */
TAVX2 static void permute_x(float *dst, const float *x, int64_t T, int64_t k, int64_t kp)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < kp; i += 16) {
            const float *s = x + t * k + i;
            __m256 a = _mm256_maskload_ps(s, lane_mask((int)min64(k - i, 8)));
            __m256 b = _mm256_maskload_ps(s + 8, lane_mask((int)min64(k - i - 8, 8)));
            __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
            __m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
            _mm256_store_ps(dst + t * kp + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xd8)));
            _mm256_store_ps(dst + t * kp + i + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xd8)));
        }
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
        permute_x(tmp, x, T, k, j.kp);
        j.x = tmp;
    }
    int64_t rows = tp_gemv_chunk_rows(k * (wt == TP_F32 ? 4 : 2), T == 1 ? GEMV_ROWS_T1 : GEMV_ROWS);
    tp_parallel_for(pool, n, rows, gemv_chunk, &j);
    tp_free(tmp);
    return TP_OK;
}
