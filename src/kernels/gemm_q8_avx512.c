/* AVX-512 VNNI kernels for Q8_0 weights: y = x·Wᵀ, x quantized per row
 * (gemm_q8.c), fewer than TP_Q8_DEQUANT_MIN_T tokens.
 *
 * The same tiles, schedule (qgemm_tiles.h) and f32 order as the AVX2
 * kernel (gemm_q8_avx2.c), so the same bits: a block pair's 8 int32 lanes
 * of 4 products each come from one vpdpbusd (unsigned × signed bytes, 4
 * products summed into a lane) instead of vpmaddubsw + vpmaddwd, on
 * |a| and b with a's sign — the sign trick: |w| and x·sign(w) when a tile
 * has at least as many tokens as rows, |x| (once per block) and
 * w·sign(x) for the GEMV.  Products are at most 127·127, four of them
 * 64516: exact, as the AVX2 lanes are.  The lanes stay 8 wide (ymm, with
 * AVX512VL): a block's 32 quants are one ymm load, and two blocks lie 34
 * bytes apart, so a zmm of two blocks would cost a second load and an
 * insert for every pair — and would change the canonical 8-lane order
 * that the scalar path reproduces.  What AVX-512 adds besides vpdpbusd:
 * 32 vector registers, so the 4 × 3 tile's 12 accumulators, 3 activation
 * blocks and the temporaries stay in registers (the AVX2 build keeps some
 * on the stack), and vcvtph2ps turns 8 blocks' f16 scales into f32 in one
 * instruction (exact, as tp_q8_scale). */
#include "kernels/kern_internal.h"
#include "kernels/qgemm_tiles.h"
#include "kernels/vmath.h"

#include <immintrin.h>

#define T512Q __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,avx2,f16c")))

/* As gemm_q8_avx2.c: prefetch this far ahead of each row stream of W in
 * the GEMV. */
#define GEMV_PF_BYTES 32768

/* The f32 scales of 8 consecutive blocks of W (the bits of tp_q8_scale:
 * f16 to f32 is exact). */
T512Q static inline __m256 w_scales8(const tp_q8_block *w)
{
    __m128i h = _mm_setr_epi16((short)w[0].d, (short)w[1].d, (short)w[2].d, (short)w[3].d, (short)w[4].d,
                               (short)w[5].d, (short)w[6].d, (short)w[7].d);
    return _mm256_cvtph_ps(h);
}

/* y[t0.., r0..] for R rows and TT tokens over all nb blocks, 8 blocks at a
 * time, exactly as gemm_q8_avx2.c's tile: the 8 scales d_w·d_x of every
 * (row, token) first, then the blocks, one FMA each per (row, token). */
static inline __attribute__((always_inline)) T512Q void
tile(const tp_q8_job *j, int64_t r0, const int R, int64_t t0, const int TT, const int pf)
{
    const int64_t nb = j->nb;
    const tp_q8_block *w = j->w + r0 * nb;
    const int8_t *xq = j->xq + t0 * nb * TP_Q8_BLOCK;
    const float *xd = j->xd + t0 * nb;
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
                if (TT < R) ax[t] = _mm256_abs_epi8(xv[t]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const tp_q8_block *wb = w + r * nb + b + i;
                if (pf) _mm_prefetch((const char *)wb + GEMV_PF_BYTES, _MM_HINT_T0);
                __m256i wv = _mm256_loadu_si256((const __m256i *)wb->q);
                __m256i aw = TT < R ? wv : _mm256_abs_epi8(wv);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m256i p = TT < R ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax[t], _mm256_sign_epi8(wv, xv[t]))
                                       : _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(xv[t], wv));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[r][t][i]), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) j->y[(t0 + t) * j->n + r0 + r] = tp_hsum256(acc[r][t]);
}

TP_QTILE_TABLE(tp_q8_job, T512Q)

static void worker(void *p, int ti, int nt)
{
    const tp_q8_job *j = p;
    tp_qtile_worker(tiles, j, j->T, j->n, j->nb * (int64_t)sizeof(tp_q8_block), ti, nt);
}

void tp_q8_matmul_avx512(const tp_q8_job *j, tp_threadpool *pool)
{
    tp_parallel_run(pool, worker, (void *)j);
}
