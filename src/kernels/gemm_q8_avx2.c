/* AVX2 kernels for Q8_0 weights: y = x·Wᵀ, x quantized per row (gemm_q8.c).
 *
 * A block pair's dot product is exact in integers: |w| (vpsignb w, w) times
 * x with w's sign (vpsignb x, w) by vpmaddubsw (pairs of at most
 * 2·127·127 < 2^15, no saturation), then vpmaddwd with ones: 8 int32 lanes
 * of 4 products each.  A tile with fewer tokens than rows (the GEMV of one
 * token) swaps the roles — |x| once per block, w with x's sign per row —
 * one vpsignb per row and block fewer, the same products.  The lanes are
 * converted (exactly: below 2^24) and accumulated with one FMA by the
 * block's d_w·d_x; the 8 lanes are added once at the end.  The scalar path (gemm_q8.c) does the same lane by lane.
 *
 * One tile is R rows of W by TT tokens, R·TT accumulators: the GEMV
 * (T <= 4) runs tiles of all its tokens; the GEMM of 5 to 31 tokens
 * (TP_Q8_DEQUANT_MIN_T; more run the f32 GEMM, gemm_q8.c) runs 4 × 3
 * tiles over chunks of tokens whose quantized rows stay in L2 while a
 * tile's 4 rows of W stay in L1.  The threads split the rows of W. */
#include "kernels/kern_internal.h"
#include "kernels/qgemm_tiles.h"
#include "kernels/vmath.h"

#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))

/* The f32 scales of 8 consecutive blocks of W: tp_q8_scale in 8 lanes
 * (the same bits). */
TAVX2 static inline __m256 w_scales8(const tp_q8_block *w)
{
    __m256i h = _mm256_setr_epi32(w[0].d, w[1].d, w[2].d, w[3].d, w[4].d, w[5].d, w[6].d, w[7].d);
    return tp_f16x8_to_ps(h);
}

/* y[t0.., r0..] for R rows and TT tokens over all nb blocks, 8 blocks at a
 * time: first the 8 scales d_w·d_x of every (row, token) in vectors, then
 * the blocks.  pf: prefetch W ahead (the GEMV streams it from memory). */
static inline __attribute__((always_inline)) TAVX2 void
tile(const tp_q8_job *j, int64_t r0, const int R, int64_t t0, const int TT, const int pf)
{
    const int64_t nb = j->nb;
    const tp_q8_block *w = j->w + r0 * nb;
    const int8_t *xq = j->xq + t0 * nb * TP_Q8_BLOCK;
    const float *xd = j->xd + t0 * nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][TP_GEMV_MAX_T];
    float s[4][TP_GEMV_MAX_T][8] __attribute__((aligned(32)));
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 8) {
        int nbk = nb - b < 8 ? (int)(nb - b) : 8;
        for (int r = 0; r < R; r++) {
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
            __m256i xv[TP_GEMV_MAX_T], ax[TP_GEMV_MAX_T];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                xv[t] = _mm256_loadu_si256((const __m256i *)(xq + (t * nb + b + i) * TP_Q8_BLOCK));
                if (TT < R) ax[t] = _mm256_sign_epi8(xv[t], xv[t]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const tp_q8_block *wb = w + r * nb + b + i;
                /* every block, not every other one: the branch made gcc keep an
                 * accumulator in memory (5-7 % of the GEMV, per CPU-second) */
                if (pf) _mm_prefetch((const char *)wb + TP_QTILE_PF_BYTES, _MM_HINT_T0);
                __m256i wv = _mm256_loadu_si256((const __m256i *)wb->q);
                __m256i aw = TT < R ? wv : _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m256i u = TT < R ? _mm256_maddubs_epi16(ax[t], _mm256_sign_epi8(wv, xv[t]))
                                       : _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv));
                    __m256i p = _mm256_madd_epi16(u, ones);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[r][t][i]), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) j->y[(t0 + t) * j->n + r0 + r] = tp_hsum256(acc[r][t]);
}

TP_QTILE_TABLE(tp_q8_job, TAVX2)

TP_QTILE_MATMUL(schedule, tp_q8_job, tp_q8_block)

void tp_q8_matmul_avx2(const tp_q8_job *j, tp_threadpool *pool) { schedule(j, pool); }
