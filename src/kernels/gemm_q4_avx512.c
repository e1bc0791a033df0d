/* AVX-512 (BW + VNNI) kernels for Q4_0 weights: y = x·Wᵀ, x quantized per
 * row (gemm_q4.c), below TP_Q4_DEQUANT_MIN_T tokens.
 *
 * The bits are those of kern_q4.h's order: each (row, token) has 8 lanes,
 * lane l of a block the exact int32 sum of its elements 4l..4l+3, each lane
 * its own chain of one FMA per block by d_w·d_x, the 8 lanes added at the
 * end as tp_q8_hsum8 does.  A zmm holds the 16 lanes of two rows (a pair),
 * one 128-bit quarter each: [row a lanes 0-3 | row b lanes 0-3 | row a
 * lanes 4-7 | row b lanes 4-7], so every vector lane is one chain and the
 * blocks stay in order.  That layout is what the nibbles give for free:
 * the two rows' 16 bytes side by side, once as they are (the low nibbles,
 * elements 0..15) and once shifted right by 4 (the high ones, 16..31),
 * masked to 0..15.  x's block is laid out to match ([x0..15, x0..15,
 * x16..31, x16..31], one shuffle per block and token, shared by the
 * pairs), and vpdpbusd adds the unsigned nibbles times x's quants, four
 * products a lane, onto -8 times the lane's four quants (xs, negated): the
 * lane of (nibble - 8)·x, exactly, with no separate subtraction.
 *
 * The tile schedule is qgemm_tiles.h's (as gemm_q4_avx2.c): R rows by TT
 * tokens; R = 1 or 3 leave a pair half used (the second row repeats the
 * first and is dropped).  The threads split the rows of W. */
#include "kernels/kern_q4.h"

#include <immintrin.h>

#include "kernels/qgemm_tiles.h"

#define T512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

/* The nibbles of block b of rows a and c, unsigned, in the pair layout. */
static inline __attribute__((always_inline)) T512VNNI __m512i unpack_pair(const tp_q4_block *a,
                                                                          const tp_q4_block *c)
{
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a->qs)),
                                           _mm_loadu_si128((const __m128i *)c->qs), 1);
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(both), _mm256_srli_epi16(both, 4), 1);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

/* A 256-bit (32-byte) value broadcast to [q0, q0, q1, q1] by 128-bit
 * quarters: x's quants (elements 0..15, then 16..31) or -xs's lanes (0..3,
 * then 4..7) beside each row of the pair. */
static inline __attribute__((always_inline)) T512VNNI __m512i spread(const void *p)
{
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0));
}

/* The f32 scales of 8 consecutive blocks of rows a and c, [a's 8 | c's 8]:
 * vcvtph2ps (AVX-512F) is exact, tp_q8_scale's bits.  One conversion for
 * the 16 measured 1.07-1.2x faster on the GEMV (T = 1, hot) than two of 8
 * by integer shifts; a vpgatherdd of the 16 was 0.82x. */
static inline __attribute__((always_inline)) T512VNNI __m512 w_scales16(const tp_q4_block *a, const tp_q4_block *c)
{
    __m256i h = _mm256_setr_epi16((short)a[0].d, (short)a[1].d, (short)a[2].d, (short)a[3].d, (short)a[4].d,
                                  (short)a[5].d, (short)a[6].d, (short)a[7].d, (short)c[0].d, (short)c[1].d,
                                  (short)c[2].d, (short)c[3].d, (short)c[4].d, (short)c[5].d, (short)c[6].d,
                                  (short)c[7].d);
    return _mm512_cvtph_ps(h);
}

/* [lo | hi]: two 256-bit halves as one zmm (AVX-512F only, no DQ). */
static inline __attribute__((always_inline)) T512VNNI __m512 join(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* Row a's and row c's sums from a pair's accumulator: quarters 0 + 2 are
 * a's (s0..s3 of tp_q8_hsum8), 1 + 3 c's, then (s0 + s2) + (s1 + s3). */
static inline __attribute__((always_inline)) T512VNNI void hsum_pair(__m512 acc, float *ya, float *yc)
{
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(acc), hi);
    __m128 sa = _mm256_castps256_ps128(s), sc = _mm256_extractf128_ps(s, 1);
    sa = _mm_add_ps(sa, _mm_movehl_ps(sa, sa));
    sc = _mm_add_ps(sc, _mm_movehl_ps(sc, sc));
    *ya = _mm_cvtss_f32(_mm_add_ss(sa, _mm_movehdup_ps(sa)));
    *yc = _mm_cvtss_f32(_mm_add_ss(sc, _mm_movehdup_ps(sc)));
}

/* y[t0.., r0..] for R rows (P = (R + 1) / 2 pairs) and TT tokens over all
 * nb blocks, 8 at a time: first the scales d_w·d_x of each (pair, token)
 * for the 8 blocks, [row a's 8 | row c's 8], then the blocks, each
 * spreading its scale to the pair layout with one vpermps. */
static inline __attribute__((always_inline)) T512VNNI void
tile(const tp_q4_job *j, int64_t r0, const int R, int64_t t0, const int TT, const int pf)
{
    enum { PMAX = 2 };
    const int P = (R + 1) / 2;
    const int64_t nb = j->nb;
    const tp_q4_block *wa[PMAX], *wc[PMAX];
    for (int p = 0; p < P; p++) {
        wa[p] = j->w + (r0 + 2 * p) * nb;
        wc[p] = 2 * p + 1 < R ? wa[p] + nb : wa[p];
    }
    const int8_t *xq = j->xq + t0 * nb * TP_Q4_BLOCK;
    const int32_t *xs = j->xs + t0 * nb * 8;
    const float *xd = j->xd + t0 * nb;
    /* lane i of a pair's scale vector for block b: s[b] of row a (quarters
     * 0, 2) or s[8 + b] of row c (quarters 1, 3) */
    const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 0, 0, 8, 8, 8, 8);
    __m512 acc[PMAX][TP_GEMV_MAX_T];
    for (int p = 0; p < P; p++)
        for (int t = 0; t < TT; t++) acc[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 8) {
        int nbk = nb - b < 8 ? (int)(nb - b) : 8;
        __m512 s[PMAX][TP_GEMV_MAX_T];
        for (int p = 0; p < P; p++) {
            if (pf) {
                /* the 144 bytes of these 8 blocks of each row, TP_QTILE_PF_BYTES on */
                const char *pa = (const char *)(wa[p] + b) + TP_QTILE_PF_BYTES;
                const char *pc = (const char *)(wc[p] + b) + TP_QTILE_PF_BYTES;
                _mm_prefetch(pa, _MM_HINT_T0);
                _mm_prefetch(pa + 64, _MM_HINT_T0);
                _mm_prefetch(pa + 128, _MM_HINT_T0);
                if (2 * p + 1 < R) {
                    _mm_prefetch(pc, _MM_HINT_T0);
                    _mm_prefetch(pc + 64, _MM_HINT_T0);
                    _mm_prefetch(pc + 128, _MM_HINT_T0);
                }
            }
            if (nbk == 8) {
                __m512 dw = w_scales16(wa[p] + b, wc[p] + b);
                for (int t = 0; t < TT; t++) {
                    __m256 dx = _mm256_loadu_ps(xd + t * nb + b);
                    s[p][t] = _mm512_mul_ps(dw, join(dx, dx));
                }
            } else {
                float sv[16] __attribute__((aligned(64))) = {0};
                for (int t = 0; t < TT; t++) {
                    for (int i = 0; i < nbk; i++) {
                        sv[i] = tp_q8_scale(wa[p][b + i].d) * xd[t * nb + b + i];
                        sv[8 + i] = tp_q8_scale(wc[p][b + i].d) * xd[t * nb + b + i];
                    }
                    s[p][t] = _mm512_load_ps(sv);
                }
            }
        }
        for (int i = 0; i < nbk; i++) {
            __m512i xv[TP_GEMV_MAX_T], nx[TP_GEMV_MAX_T];
            const __m512i idx = _mm512_add_epi32(sidx, _mm512_set1_epi32(i));
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                xv[t] = spread(xq + (t * nb + b + i) * TP_Q4_BLOCK);
                nx[t] = _mm512_sub_epi32(_mm512_setzero_si512(), spread(xs + (t * nb + b + i) * 8));
            }
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) {
                __m512i wv = unpack_pair(wa[p] + b + i, wc[p] + b + i);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m512i lane = _mm512_dpbusd_epi32(nx[t], wv, xv[t]);
                    acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lane), _mm512_permutexvar_ps(idx, s[p][t]),
                                                acc[p][t]);
                }
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < TT; t++) {
            float ya, yc;
            hsum_pair(acc[p][t], &ya, &yc);
            float *y = j->y + (t0 + t) * j->n + r0 + 2 * p;
            y[0] = ya;
            if (2 * p + 1 < R) y[1] = yc;
        }
}

TP_QTILE_TABLE(tp_q4_job, T512VNNI)

TP_QTILE_MATMUL(tp_q4_matmul_avx512, tp_q4_job, tp_q4_block)
