/* AVX-512 VNNI kernels for Q8_0 weights: y = x·Wᵀ, x quantized per row
 * (gemm_q8.c), fewer than TP_Q8_DEQUANT_MIN_T tokens; run where the CPU
 * has AVX512_VNNI (tp_kernel_has_vnni).
 *
 * The same tiles and schedule (qgemm_tiles.h) and the same f32 order as
 * the AVX2 kernel (gemm_q8_avx2.c), so the same bits.  A block pair's 8
 * int32 lanes of 4 products come from one vpdpbusd (unsigned × signed
 * bytes, 4 products summed into a lane) on |x| and w·sign(x) — products of
 * at most 127·127, four of them 64516: exact, the lanes vpmaddubsw +
 * vpmaddwd give.  Two rows of W share one zmm (see tile), which halves
 * the instructions per block and row; the lanes of each row stay 8 wide
 * in the canonical order.  A zmm of two *blocks* of one row would not
 * keep that order, and costs as much: blocks lie 34 bytes apart, so it
 * takes two loads and an insert just as a pair of rows does.  The GEMV
 * computes 29–43 GB/s of blocks per core from cache on a Zen 5 class CPU,
 * above what one core reads from memory (bench/README.md, "8-bit
 * weights"). */
#include "kernels/kern_internal.h"
#include "kernels/qgemm_tiles.h"
#include "kernels/vmath.h"

#include <immintrin.h>

#define T512Q __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,avx2,f16c")))

/* The f32 scales of 8 consecutive blocks of W (the bits of tp_q8_scale:
 * f16 to f32 is exact).  Block i's scale is 16-bit word 17·i of the 272
 * bytes: four 64-byte loads (all inside the 8 blocks) and two word
 * permutes pick them, instead of eight loads and inserts. */
T512Q static inline __m256 w_scales8(const tp_q8_block *w)
{
    const __m512i *p = (const __m512i *)w;
    const __m512i lo = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 51, 34, 17, 0);
    const __m512i hi = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 55,
                                        38, 21, 4, 0, 0, 0, 0);
    __m512i a = _mm512_permutex2var_epi16(_mm512_loadu_si512(p), lo, _mm512_loadu_si512(p + 1));
    __m512i b = _mm512_permutex2var_epi16(_mm512_loadu_si512(p + 2), hi, _mm512_loadu_si512(p + 3));
    __m512i h = _mm512_mask_blend_epi16(0xf0, a, b);
    return _mm256_cvtph_ps(_mm512_castsi512_si128(h));
}

/* Two rows' blocks i of a pair, in the two halves of a zmm. */
T512Q static inline __m512i w_pair(const tp_q8_block *w0, const tp_q8_block *w1)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w0->q)),
                              _mm256_loadu_si256((const __m256i *)w1->q), 1);
}

/* y[t0.., r0..] for R rows and TT tokens over all nb blocks, 8 blocks at a
 * time: the 8 scales d_w·d_x of every (row, token) first, then the blocks.
 * Rows go in pairs, one per half of a zmm: for each token, |x| of the
 * block in both halves, and per pair the two rows' w negated where x is
 * negative (vpsubb under x's sign mask: vpsignb has no EVEX form), so one
 * vpdpbusd gives both rows' 8 lanes, and one FMA by the pair's scales
 * (lanes 0-7 row 2p's d_w·d_x of the block, 8-15 row 2p+1's: a vpermps of
 * the 8 blocks' scales) adds them — lane by lane the AVX2 order.  An odd
 * last row runs 8 lanes wide, as the AVX2 kernel does.  R <= 8 (the
 * decode GEMV's tile; the schedule's go to 4).  pf: prefetch W ahead (the
 * GEMV streams it from memory): 0 not, PF_ROWS TP_QTILE_PF_BYTES ahead of
 * each row stream (any true value: qgemm_tiles.h's GEMV shapes), PF_TILES
 * TP_QTILE_PF_BYTES ahead in the order the thread reads its W. */
#define PF_ROWS 1
#define PF_TILES 2
static inline __attribute__((always_inline)) T512Q void
tile(const tp_q8_job *j, int64_t r0, const int R, int64_t t0, const int TT, const int pf)
{
    const int64_t nb = j->nb;
    const int P = R / 2, odd = R & 1;
    const tp_q8_block *w = j->w + r0 * nb;
    const int8_t *xq = j->xq + t0 * nb * TP_Q8_BLOCK;
    const float *xd = j->xd + t0 * nb;
    __m512 acc[4][TP_GEMV_MAX_T];
    __m256 acc1[TP_GEMV_MAX_T];
    /* [token][row][block]: a pair's 16 scales are contiguous */
    float s[TP_GEMV_MAX_T][8][8] __attribute__((aligned(64)));
    for (int t = 0; t < TT; t++) {
        for (int p = 0; p < P; p++) acc[p][t] = _mm512_setzero_ps();
        if (odd) acc1[t] = _mm256_setzero_ps();
    }
    /* PF_TILES: the thread reads its rows R at a time, so TP_QTILE_PF_BYTES
     * of its W later each row stream is D block steps on: m0 tiles further
     * at block b + r0 while that is inside the row (pf_near bytes on), else
     * one tile more, past the row's start (pf_far). */
    const int64_t bs = (int64_t)sizeof(tp_q8_block), rb = nb * bs, D = TP_QTILE_PF_BYTES / (R * bs);
    const int64_t pf_m0 = nb ? D / nb : 0, pf_r0 = nb ? D % nb : 0;   /* k = 0: no blocks, no division */
    const int64_t pf_near = pf_m0 * R * rb + pf_r0 * bs, pf_far = (pf_m0 + 1) * R * rb + (pf_r0 - nb) * bs;
    for (int64_t b = 0; b < nb; b += 8) {
        int nbk = nb - b < 8 ? (int)(nb - b) : 8;
        for (int r = 0; r < R; r++) {
            if (nbk == 8) {
                __m256 dw = w_scales8(w + r * nb + b);
                for (int t = 0; t < TT; t++)
                    _mm256_store_ps(s[t][r], _mm256_mul_ps(dw, _mm256_loadu_ps(xd + t * nb + b)));
            } else {
                for (int t = 0; t < TT; t++)
                    for (int i = 0; i < nbk; i++) s[t][r][i] = tp_q8_scale(w[r * nb + b + i].d) * xd[t * nb + b + i];
            }
        }
        __m512 sp[4][TP_GEMV_MAX_T];
        for (int t = 0; t < TT; t++)
            for (int p = 0; p < P; p++) sp[p][t] = _mm512_load_ps(s[t][2 * p]);
        for (int i = 0; i < nbk; i++) {
            const __m512i sel = _mm512_add_epi32(_mm512_set1_epi32(i), _mm512_set_epi32(8, 8, 8, 8, 8, 8, 8, 8, 0,
                                                                                       0, 0, 0, 0, 0, 0, 0));
            __m512i ax[TP_GEMV_MAX_T];
            __mmask64 neg[TP_GEMV_MAX_T];
            const int64_t pfd = b + i + pf_r0 < nb ? pf_near : pf_far;   /* PF_TILES */
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + (t * nb + b + i) * TP_Q8_BLOCK)));
                ax[t] = _mm512_abs_epi8(xv);
                neg[t] = _mm512_movepi8_mask(xv);
            }
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                const tp_q8_block *wb = w + 2 * p * nb + b + i;
                if (pf == PF_ROWS) {
                    _mm_prefetch((const char *)wb + TP_QTILE_PF_BYTES, _MM_HINT_T0);
                    _mm_prefetch((const char *)(wb + nb) + TP_QTILE_PF_BYTES, _MM_HINT_T0);
                }
                if (pf == PF_TILES) {
                    _mm_prefetch((const char *)wb + pfd, _MM_HINT_T0);
                    _mm_prefetch((const char *)(wb + nb) + pfd, _MM_HINT_T0);
                }
                __m512i wv = w_pair(wb, wb + nb);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m512i ws = _mm512_mask_sub_epi8(wv, neg[t], _mm512_setzero_si512(), wv);
                    __m512i q = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax[t], ws);
                    acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_permutexvar_ps(sel, sp[p][t]), acc[p][t]);
                }
            }
            if (odd) {
                const tp_q8_block *wb = w + (R - 1) * nb + b + i;
                if (pf == PF_ROWS) _mm_prefetch((const char *)wb + TP_QTILE_PF_BYTES, _MM_HINT_T0);
                if (pf == PF_TILES) _mm_prefetch((const char *)wb + pfd, _MM_HINT_T0);
                __m256i wv = _mm256_loadu_si256((const __m256i *)wb->q);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    __m256i ws = _mm256_mask_sub_epi8(wv, (__mmask32)neg[t], _mm256_setzero_si256(), wv);
                    __m256i q = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(ax[t]), ws);
                    acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(s[t][R - 1][i]), acc1[t]);
                }
            }
        }
    }
    for (int t = 0; t < TT; t++) {
        float *y = j->y + (t0 + t) * j->n + r0;
        for (int p = 0; p < P; p++) {
            y[2 * p] = tp_hsum256(_mm512_castps512_ps256(acc[p][t]));
            y[2 * p + 1] = tp_hsum256(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][t]), 1)));
        }
        if (odd) y[R - 1] = tp_hsum256(acc1[t]);
    }
}

TP_QTILE_TABLE(tp_q8_job, T512Q)

/* The decode GEMV (T = 1): tiles of 8 rows (4 pairs), then the schedule's
 * 4-row and single-row tiles for the thread's last rows.  8 rows share |x|
 * and its sign mask among 4 pairs and keep 4 FMA chains in flight where
 * the 4-row tile has 2; prefetched along the tile sequence.  Measured
 * against the 4-row tile (bench/README.md, "8-bit weights"). */
#define GEMV_ROWS 8

T512Q static void tile_8_1(const void *j, int64_t r0, int64_t t0)
{
    tile((const tp_q8_job *)j, r0, GEMV_ROWS, t0, 1, PF_TILES);
}

static void gemv_worker(void *p, int ti, int nt)
{
    const tp_q8_job *j = p;
    int64_t r0, r1;
    tp_gemv_thread_rows(j->n, j->nb * (int64_t)sizeof(tp_q8_block), GEMV_ROWS, ti, nt, &r0, &r1);
    for (; r0 + GEMV_ROWS <= r1; r0 += GEMV_ROWS) tile_8_1(j, r0, 0);
    if (r0 < r1) tp_qtile_rows(tiles, j, r0, r1, 4, 0, 1);
}

TP_QTILE_MATMUL(schedule, tp_q8_job, tp_q8_block)

/* T = 1: the 8-row tiles above; T = 2..4 and the GEMM: the schedule's
 * tiles, as on AVX2. */
void tp_q8_matmul_avx512(const tp_q8_job *j, tp_threadpool *pool)
{
    if (j->T == 1) tp_parallel_run(pool, gemv_worker, (void *)j);
    else schedule(j, pool);
}
