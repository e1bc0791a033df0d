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

#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))

/* Tokens per chunk of the GEMM: 48 rows of x (a multiple of the tile's
 * 3); 48 × 8192/32 × 36 bytes = 432 KiB at the widest K of a 1B model. */
#define GEMM_TOKENS 48
#define GEMM_ROWS 4
#define GEMM_TT 3

TAVX2 static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Software prefetch this far ahead of each row stream of W in the GEMV,
 * as gemm_avx2.c's bf16 GEMV does (16 KiB there; here 32 KiB measured
 * better on rows of 8192: 18.5 against 15 GB/s, bench/README.md). */
#define GEMV_PF_BYTES 32768

/* The f32 scales of 8 consecutive blocks of W: tp_q8_scale in 8 lanes
 * (the same bits). */
TAVX2 static inline __m256 w_scales8(const tp_q8_block *w)
{
    __m256i h = _mm256_setr_epi32(w[0].d, w[1].d, w[2].d, w[3].d, w[4].d, w[5].d, w[6].d, w[7].d);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
    __m256i mag = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)), 13);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(sign, mag)), _mm256_set1_ps(0x1p112f));
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
                if (pf) _mm_prefetch((const char *)wb + GEMV_PF_BYTES, _MM_HINT_T0);
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
        for (int t = 0; t < TT; t++) j->y[(t0 + t) * j->n + r0 + r] = hsum(acc[r][t]);
}

/* One function per tile shape, so that each gets its own unrolled code;
 * the GEMV's shapes prefetch, the GEMM's 4 × 2 and 4 × 3 do not (their
 * rows are reused from L1 by the next tokens). */
#define TILE_FN(R, TT) \
    TAVX2 static void tile_##R##_##TT(const tp_q8_job *j, int64_t r0, int64_t t0) { tile(j, r0, R, t0, TT, (TT) == 1 || (R) < 3); }
TILE_FN(1, 1) TILE_FN(1, 2) TILE_FN(1, 3) TILE_FN(1, 4)
TILE_FN(2, 1) TILE_FN(2, 2) TILE_FN(2, 3) TILE_FN(2, 4)
TILE_FN(3, 1) TILE_FN(3, 2) TILE_FN(3, 3) TILE_FN(3, 4)
TILE_FN(4, 1) TILE_FN(4, 2) TILE_FN(4, 3)
#undef TILE_FN

typedef void (*tile_fn)(const tp_q8_job *j, int64_t r0, int64_t t0);
/* [rows - 1][tokens - 1] */
static const tile_fn tiles[4][4] = {
    {tile_1_1, tile_1_2, tile_1_3, tile_1_4},
    {tile_2_1, tile_2_2, tile_2_3, tile_2_4},
    {tile_3_1, tile_3_2, tile_3_3, tile_3_4},
    {tile_4_1, tile_4_2, tile_4_3, NULL},
};

/* Rows [r0, r1) for tokens [t0, t0 + tt): blocks of R rows, then single
 * rows (R·tt <= 12). */
static void run_rows(const tp_q8_job *j, int64_t r0, int64_t r1, int R, int64_t t0, int tt)
{
    tile_fn f = tiles[R - 1][tt - 1], f1 = tiles[0][tt - 1];
    for (; r0 + R <= r1; r0 += R) f(j, r0, t0);
    for (; r0 < r1; r0++) f1(j, r0, t0);
}

static void worker(void *p, int ti, int nt)
{
    const tp_q8_job *j = p;
    int64_t r0, r1;
    int gemv = j->T <= TP_GEMV_MAX_T;
    int R = !gemv ? GEMM_ROWS : j->T > 1 ? 2 : 4;
    tp_gemv_thread_rows(j->n, j->nb * (int64_t)sizeof(tp_q8_block), R, ti, nt, &r0, &r1);
    if (r0 >= r1) return;
    if (gemv) { run_rows(j, r0, r1, R, 0, (int)j->T); return; }
    for (int64_t c0 = 0; c0 < j->T; c0 += GEMM_TOKENS) {
        int64_t c1 = c0 + GEMM_TOKENS < j->T ? c0 + GEMM_TOKENS : j->T;
        for (int64_t rb = r0; rb < r1; rb += GEMM_ROWS) {
            int64_t re = rb + GEMM_ROWS < r1 ? rb + GEMM_ROWS : r1;
            int64_t t = c0;
            for (; t + GEMM_TT <= c1; t += GEMM_TT) run_rows(j, rb, re, GEMM_ROWS, t, GEMM_TT);
            if (t < c1) run_rows(j, rb, re, GEMM_ROWS, t, (int)(c1 - t));
        }
    }
}

void tp_q8_matmul_avx2(const tp_q8_job *j, tp_threadpool *pool)
{
    tp_parallel_run(pool, worker, (void *)j);
}
