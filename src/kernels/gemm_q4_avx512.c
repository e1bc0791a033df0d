/* AVX-512 (BW + VNNI) kernels for Q4_0 weights: y = x·Wᵀ, x quantized per
 * row (gemm_q4.c), below TP_Q4_DEQUANT_MIN_T tokens, on the repacked layout
 * (kern_q4.h).
 *
 * The bits are those of kern_q4.h's order: each (row, token) has 8 lanes,
 * lane l of a block the exact int32 sum of its elements 4l..4l+3, each lane
 * its own chain of one FMA per block by d_w·d_x, the 8 lanes added at the
 * end as tp_q8_hsum8 does.  A group's 64 bytes of one block are, by 128-bit
 * quarters, its 4 rows' nibble arrays; their low nibbles (AND 0x0f) are
 * the rows' elements 0..15, i.e. lanes 0-3 of each row by quarter, their
 * high ones (shift, AND) elements 16..31, lanes 4-7.  So two zmm
 * accumulators per token hold a group's 32 lanes, each vector lane one
 * chain, the blocks in order.  x's 16 quants of each half are broadcast to
 * the 4 quarters, and vpdpbusd adds the unsigned nibbles times x's quants,
 * four products a lane, onto -8 times the lane's four quants (nxs): the
 * lane of (nibble - 8)·x, exactly, with no separate subtraction.  The
 * scale of a block, d_w of each quarter's row times d_x, comes from the
 * chunk's 32 scales (one load, two vcvtph2ps, exact) by one vpermps.
 *
 * Tiles (gemm_q4.c's tp_q4_run_tiles): G = 1 or 2 groups by TT tokens. */
#include "kernels/kern_q4.h"

#include <immintrin.h>

#include "kernels/qgemm_tiles.h"

#define T512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

/* The 4 row sums of a group from its two accumulators: s_i = lane i + lane
 * i + 4 per quarter (row), then (s0 + s2) + (s1 + s3) (tp_q8_hsum8's
 * order), the 4 results in lanes 0, 4, 8, 12, stored to y[0..3]. */
static inline __attribute__((always_inline)) T512VNNI void hsum4(__m512 lo, __m512 hi, float *y)
{
    __m512 s = _mm512_add_ps(lo, hi);
    __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
    __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
    __m512 r = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u);
    _mm_storeu_ps(y, _mm512_castps512_ps128(r));
}

/* y[t0.., g0..] for G groups of 4 rows from row g0 and TT tokens. */
static inline __attribute__((always_inline)) T512VNNI void
tile(const tp_q4_job *j, int64_t g0, const int G, int64_t t0, const int TT)
{
    enum { GMAX = 2 };
    const int64_t nb = j->nb;
    const int64_t gbytes = TP_Q4_ROWS * nb * (int64_t)sizeof(tp_q4_block);
    const char *wg = (const char *)j->w + g0 * nb * (int64_t)sizeof(tp_q4_block);
    const int8_t *xq = j->xq + t0 * nb * TP_Q4_BLOCK;
    const int32_t *nxs = j->nxs + t0 * nb * 8;
    const float *xd = j->xd + t0 * nb;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    /* lane i of block b's scales: row i / 4 of block b % 4 of a conversion */
    const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 lo[GMAX][TP_GEMV_MAX_T], hi[GMAX][TP_GEMV_MAX_T];
    for (int g = 0; g < G; g++)
        for (int t = 0; t < TT; t++) lo[g][t] = hi[g][t] = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < nb; c0 += TP_Q4_CHUNK) {
        const int m = nb - c0 < TP_Q4_CHUNK ? (int)(nb - c0) : TP_Q4_CHUNK;
        const __mmask32 sm = m == TP_Q4_CHUNK ? 0xffffffffu : (__mmask32)((1u << (4 * m)) - 1);
        __m512 d[GMAX][2];
        const char *ch[GMAX];
        for (int g = 0; g < G; g++) {
            ch[g] = wg + g * gbytes + TP_Q4_ROWS * c0 * (int64_t)sizeof(tp_q4_block);
            /* the lines of this chunk, TP_QTILE_PF_BYTES on (the stream of the group) */
            for (int l = 0; l < TP_Q4_CHUNK_LINES; l++) _mm_prefetch(ch[g] + TP_QTILE_PF_BYTES + 64 * l, _MM_HINT_T0);
            __m512i h = _mm512_maskz_loadu_epi16(sm, ch[g]);
            d[g][0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
            d[g][1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
        }
        for (int i = 0; i < m; i++) {
            const __m512i idx = _mm512_add_epi32(sidx, _mm512_set1_epi32(4 * (i % 4)));
            __m512i xl[TP_GEMV_MAX_T], xh[TP_GEMV_MAX_T], nl[TP_GEMV_MAX_T], nh[TP_GEMV_MAX_T];
            __m512 dx[TP_GEMV_MAX_T];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xb = xq + (t * nb + c0 + i) * TP_Q4_BLOCK;
                const int32_t *nb8 = nxs + (t * nb + c0 + i) * 8;
                xl[t] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb));
                xh[t] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb + 16)));
                nl[t] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nb8));
                nh[t] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(nb8 + 4)));
                dx[t] = _mm512_set1_ps(xd[t * nb + c0 + i]);
            }
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) {
                __m512i v = _mm512_loadu_si512(ch[g] + 2 * TP_Q4_ROWS * m + 64 * i);
                __m512i vl = _mm512_and_si512(v, low4), vh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                __m512 dw = _mm512_permutexvar_ps(idx, d[g][i / 4]);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m512 s = _mm512_mul_ps(dw, dx[t]);
                    lo[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nl[t], vl, xl[t])), s, lo[g][t]);
                    hi[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nh[t], vh, xh[t])), s, hi[g][t]);
                }
            }
        }
    }
    for (int g = 0; g < G; g++)
        for (int t = 0; t < TT; t++) hsum4(lo[g][t], hi[g][t], j->y + (t0 + t) * j->n + g0 + TP_Q4_ROWS * g);
}

TP_Q4_TILES(T512VNNI)

void tp_q4_matmul_avx512(const tp_q4_job *j, tp_threadpool *pool)
{
    tp_q4_run_tiles(j, tiles, pool);
}
