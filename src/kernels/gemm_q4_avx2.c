/* AVX2 kernels for Q4_0 weights: y = x·Wᵀ, x quantized per row (gemm_q4.c),
 * on the repacked layout (kern_q4.h).
 *
 * A block's 64 bytes for a group of 4 rows are two pairs of rows, 32 bytes
 * each: [row a's 16 | row c's 16].  AND 0x0f gives the pair's elements
 * 0..15 by 128-bit half (lanes 0-3 of a, then of c after vpmaddubsw +
 * vpmaddwd), a shift and AND their elements 16..31 (lanes 4-7).
 * vpmaddubsw takes the unsigned nibbles times x's quants in pairs (at most
 * 2·15·127, no saturation), vpmaddwd with ones sums them into 8 int32 lanes
 * of 4 products; adding -8 times the lane's 4 x quants (nxs) makes each the
 * lane of (nibble - 8)·x, exactly.  The lanes are converted (exactly) and
 * accumulated with one FMA by d_w·d_x, each vector lane its own chain in
 * block order, and the 8 lanes of a row added at the end in tp_q8_hsum8's
 * order: the scalar path's bits (gemm_q4.c).
 *
 * Tiles (gemm_q4.c's tp_q4_run_tiles): G = 1 or 2 groups by TT tokens, run
 * as passes over the blocks of as many pairs as keep the accumulators (2
 * per pair and token) within 8 registers. */
#include "kernels/kern_q4.h"
#include "kernels/qgemm_tiles.h"
#include "kernels/vmath.h"

#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))

/* Row a's and row c's sums from a pair's two accumulators: s_i = lane i +
 * lane i + 4 per half, then (s0 + s2) + (s1 + s3). */
static inline __attribute__((always_inline)) TAVX2 void hsum_pair(__m256 lo, __m256 hi, float *ya, float *yc)
{
    __m256 s = _mm256_add_ps(lo, hi);
    __m256 t = _mm256_add_ps(s, _mm256_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
    __m256 u = _mm256_add_ps(t, _mm256_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
    *ya = _mm256_cvtss_f32(u);
    *yc = _mm_cvtss_f32(_mm256_extractf128_ps(u, 1));
}

/* NP pairs from pair p0 of the tile (pair p: rows 2p, 2p + 1 from g0, in
 * group p / 2) for TT tokens, over all blocks. */
static inline __attribute__((always_inline)) TAVX2 void
pass(const tp_q4_job *j, int64_t g0, int p0, const int NP, int64_t t0, const int TT)
{
    enum { PMAX = 4 };
    const int64_t nb = j->nb;
    const int64_t gbytes = TP_Q4_ROWS * nb * (int64_t)sizeof(tp_q4_block);
    const char *wg = (const char *)j->w + g0 * nb * (int64_t)sizeof(tp_q4_block);
    const int8_t *xq = j->xq + t0 * nb * TP_Q4_BLOCK;
    const int32_t *nxs = j->nxs + t0 * nb * 8;
    const float *xd = j->xd + t0 * nb;
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 lo[PMAX][TP_GEMV_MAX_T], hi[PMAX][TP_GEMV_MAX_T];
    for (int p = 0; p < NP; p++)
        for (int t = 0; t < TT; t++) lo[p][t] = hi[p][t] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < nb; c0 += TP_Q4_CHUNK) {
        const int m = nb - c0 < TP_Q4_CHUNK ? (int)(nb - c0) : TP_Q4_CHUNK;
        const char *ch[PMAX];
        for (int p = 0; p < NP; p++) {
            int g = (p0 + p) / 2;
            ch[p] = wg + g * gbytes + TP_Q4_ROWS * c0 * (int64_t)sizeof(tp_q4_block);
            if ((p0 + p) % 2 == 0 || p == 0)   /* the group's chunk, TP_QTILE_PF_BYTES on */
                for (int l = 0; l < TP_Q4_CHUNK_LINES; l++) _mm_prefetch(ch[p] + TP_QTILE_PF_BYTES + 64 * l, _MM_HINT_T0);
        }
        for (int i = 0; i < m; i++) {
            __m256i xl[TP_GEMV_MAX_T], xh[TP_GEMV_MAX_T];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xb = xq + (t * nb + c0 + i) * TP_Q4_BLOCK;
                xl[t] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb));
                xh[t] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb + 16)));
            }
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                int rp = 2 * ((p0 + p) % 2);   /* the pair's first row in its group */
                /* blocks i & ~1 and i | 1, rows 0..3 each: 8 scales */
                __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(ch[p] + 8 * (i & ~1))));
                __m256 dw = _mm256_permutevar8x32_ps(
                    tp_f16x8_to_ps(h), _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_set1_epi32(4 * (i % 2) + rp)));
                __m256i v = _mm256_loadu_si256((const __m256i *)(ch[p] + 2 * TP_Q4_ROWS * m + 64 * i + 16 * rp));
                __m256i vl = _mm256_and_si256(v, low4), vh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    const int32_t *n8 = nxs + (t * nb + c0 + i) * 8;
                    __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + c0 + i]));
                    __m256i pl = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(vl, xl[t]), ones),
                                                  _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)n8)));
                    __m256i ph = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(vh, xh[t]), ones),
                                                  _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(n8 + 4))));
                    lo[p][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl), s, lo[p][t]);
                    hi[p][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ph), s, hi[p][t]);
                }
            }
        }
    }
    for (int p = 0; p < NP; p++)
        for (int t = 0; t < TT; t++) {
            float *y = j->y + (t0 + t) * j->n + g0 + 2 * (p0 + p);
            hsum_pair(lo[p][t], hi[p][t], &y[0], &y[1]);
        }
}

/* G groups (2G pairs) by TT tokens: all pairs in one pass where 2 accumulators
 * per pair and token fit in 8 registers, else several passes. */
static inline __attribute__((always_inline)) TAVX2 void tile(const tp_q4_job *j, int64_t g0, const int G,
                                                             int64_t t0, const int TT)
{
    const int np = 4 / TT < 2 * G ? 4 / TT : 2 * G;   /* TT <= 4: at least 1 */
    for (int p = 0; p < 2 * G; p += np) pass(j, g0, p, np, t0, TT);
}

TP_Q4_TILES(TAVX2)

void tp_q4_matmul_avx2(const tp_q4_job *j, tp_threadpool *pool)
{
    tp_q4_run_tiles(j, tiles, pool);
}
