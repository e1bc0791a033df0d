/* AVX2 kernels for Q4_0 weights: y = x·Wᵀ, x quantized per row (gemm_q4.c).
 *
 * The structure of gemm_q8_avx2.c with 4-bit weights.  A block's 16 bytes
 * are unpacked into its 32 nibbles q (unsigned, 0..15), which vpmaddubsw
 * takes as they are: q times x's quants in pairs (at most 2·15·127, no
 * saturation), vpmaddwd with ones into 8 int32 lanes of 4 products; each
 * lane less 8 times its 4 x quants (xs, summed once per block of x) is
 * the lane of (q - 8)·x, exactly.  The lanes are converted (exactly) and
 * accumulated with one FMA by d_w·d_x.  The scalar path (gemm_q4.c) gives
 * the same bits lane by lane.
 *
 * One tile is R rows of W by TT tokens: the GEMV (T <= 4) runs tiles of
 * all its tokens; the GEMM (prefill) runs 4 × 3 tiles over chunks of
 * tokens.  The threads split the rows of W. */
#include "kernels/kern_q4.h"
#include "kernels/qgemm_tiles.h"
#include "kernels/vmath.h"

#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))

/* The f32 scales of 8 consecutive blocks of W: tp_q8_scale in 8 lanes
 * (the same bits). */
TAVX2 static inline __m256 w_scales8(const tp_q4_block *w)
{
    __m256i h = _mm256_setr_epi32(w[0].d, w[1].d, w[2].d, w[3].d, w[4].d, w[5].d, w[6].d, w[7].d);
    return tp_f16x8_to_ps(h);
}

/* The block's 32 nibbles (unsigned, 0..15), in element order: the 16
 * bytes in both halves, the upper half shifted right by 4 (one variable
 * shift), then the low 4 bits of each byte. */
TAVX2 static inline __m256i unpack(const tp_q4_block *b)
{
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b->qs));
    __m256i v = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* y[t0.., r0..] for R rows and TT tokens over all nb blocks, 8 blocks at a
 * time: first the 8 scales d_w·d_x of every (row, token) in vectors, then
 * the blocks.  pf: prefetch W ahead (the GEMV streams it from memory). */
static inline __attribute__((always_inline)) TAVX2 void
tile(const tp_q4_job *j, int64_t r0, const int R, int64_t t0, const int TT, const int pf)
{
    const int64_t nb = j->nb;
    const tp_q4_block *w = j->w + r0 * nb;
    const int8_t *xq = j->xq + t0 * nb * TP_Q4_BLOCK;
    const int32_t *xs = j->xs + t0 * nb * 8;
    const float *xd = j->xd + t0 * nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][TP_GEMV_MAX_T];
    float s[4][TP_GEMV_MAX_T][8] __attribute__((aligned(32)));
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 8) {
        int nbk = nb - b < 8 ? (int)(nb - b) : 8;
        for (int r = 0; r < R; r++) {
            if (pf) {
                /* the 144 bytes of these 8 blocks, TP_QTILE_PF_BYTES on */
                const char *p = (const char *)(w + r * nb + b) + TP_QTILE_PF_BYTES;
                _mm_prefetch(p, _MM_HINT_T0);
                _mm_prefetch(p + 64, _MM_HINT_T0);
                _mm_prefetch(p + 128, _MM_HINT_T0);
            }
            if (nbk == 8) {
                __m256 dw = w_scales8(w + r * nb + b);
                for (int t = 0; t < TT; t++)
                    _mm256_store_ps(s[r][t], _mm256_mul_ps(dw, _mm256_loadu_ps(xd + t * nb + b)));
            } else {
                for (int t = 0; t < TT; t++)
                    for (int i = 0; i < nbk; i++) s[r][t][i] = tp_q8_scale(w[r * nb + b + i].d) * xd[t * nb + b + i];
            }
        }
        for (int i = 0; i < nbk; i++) {
            __m256i xv[TP_GEMV_MAX_T], x8[TP_GEMV_MAX_T];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                xv[t] = _mm256_loadu_si256((const __m256i *)(xq + (t * nb + b + i) * TP_Q4_BLOCK));
                x8[t] = _mm256_loadu_si256((const __m256i *)(xs + (t * nb + b + i) * 8));
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const tp_q4_block *wb = w + r * nb + b + i;
                __m256i wv = unpack(wb);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv[t]), ones);
                    p = _mm256_sub_epi32(p, x8[t]);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[r][t][i]), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) j->y[(t0 + t) * j->n + r0 + r] = tp_hsum256(acc[r][t]);
}

TP_QTILE_TABLE(tp_q4_job, TAVX2)

TP_QTILE_MATMUL(tp_q4_matmul_avx2, tp_q4_job, tp_q4_block)
