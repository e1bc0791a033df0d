/* AVX-512 product of a few rows with W read in place: y[T, n] = x[T, k] ·
 * W[n, k]ᵀ, W f32 or bf16, for the rows of one MoE expert in a prefill
 * (grouped_gemm.c, through tp_matmul_rows in matmul.c: 5 to TP_ROWS_MAX_T
 * rows, typically ~16–64).
 *
 * Why not the GEMM of gemm_avx512.c: it transposes each 32-column slice of
 * W into a packed buffer (and widens bf16 to f32) before its 12×32
 * micro-kernel runs; a dense prefill reuses each packed slice for all its
 * rows, an expert's ~32 rows only three times.  At those shapes the packing
 * cost as much as the FMAs (perf, bench kernels --moe: pack_b_f32 ~0.5 of
 * kernel_f32) and the grouped GEMMs ran at ~half the dense rate.  Here
 * nothing is packed: a tile of y (RB rows × CB columns, one zmm accumulator
 * per element) is a set of dot products along k, read straight from the
 * rows of x and of W, 16 lanes of k per vector and one horizontal sum per
 * element at the end.  W's bf16 lanes are widened in registers with the
 * GEMV's trick: one 64-byte load is 32 weights, (lane << 16) the even ones
 * and (lane & 0xffff0000) the odd ones, so x is permuted once per call to
 * match (tp_permute_x_avx512).  Each W vector is used by the tile's RB rows
 * from registers; the tile's CB rows of W (CB·2k bytes) stay in L1/L2 for
 * the next tiles down, and the next CB rows are prefetched into L2 while
 * the current ones are in use.
 *
 * Every element of y is summed in one fixed order — per lane along k, then
 * _mm512_reduce_add_ps — whichever tile, edge or thread computes it: the
 * threads split the columns, edge tiles clamp to the last row of W (the
 * surplus columns are computed and not stored), so the bits do not depend
 * on the thread count.  They differ from the packed GEMM's (another order
 * of the same sums), within float rounding. */
#include "kernels/kern_internal.h"

#include <immintrin.h>

#define RB 4 /* rows of x per tile */
#define CB 5 /* rows of W (columns of y) per tile: 20 accumulators, 4 + 4
                x registers for bf16's even and odd halves, 3 temporaries */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx2")))

typedef struct {
    float *y;
    const float *x; /* bf16 W: x permuted in blocks of 32, rows of kp */
    const void *w;
    tp_dtype wt;
    int64_t T, n, k, kp;
} rows_job;

/* One tile: rows t0..t0+R of y, columns c (CB rows of W, wr[c], clamped at
 * the end of W; nc of them stored).  pf: the CB rows of W of the thread's
 * next tile column (NULL past its end), prefetched into L2 while this
 * column's nrb row tiles run: row tile rb takes pf[q] for q = rb, rb + nrb,
 * ..., one line per k step, so the row tiles share the work. */
static inline __attribute__((always_inline)) T512 void tile(const rows_job *j, int64_t t0, const int R,
                                                            const char *const wr[CB], int nc,
                                                            const char *const pf[CB], int rb, int nrb)
{
    __m512 acc[RB][CB];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < CB; c++) acc[r][c] = _mm512_setzero_ps();
    const int64_t k = j->k, kp = j->kp;
    const float *x = j->x + t0 * kp;
    int64_t i = 0;
    if (j->wt == TP_BF16) {
        /* Whole blocks of 32 unmasked: masked loads of cold bf16 weights
         * ran at about half rate on Zen 5 (gemm_avx512.c's load_w16). */
        for (; i + 32 <= k; i += 32) {
            __m512 xe[RB], xo[RB];
            for (int r = 0; r < R; r++) {
                xe[r] = _mm512_load_ps(x + r * kp + i);
                xo[r] = _mm512_load_ps(x + r * kp + i + 16);
            }
            for (int q = rb; q < CB; q += nrb)
                if (pf[q]) _mm_prefetch(pf[q] + 2 * i, _MM_HINT_T1);
            for (int c = 0; c < CB; c++) {
                __m512i v = _mm512_loadu_si512(wr[c] + 2 * i);
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_maskz_mov_epi16(0xaaaaaaaau, v));
                for (int r = 0; r < R; r++) {
                    acc[r][c] = _mm512_fmadd_ps(we, xe[r], acc[r][c]);
                    acc[r][c] = _mm512_fmadd_ps(wo, xo[r], acc[r][c]);
                }
            }
        }
        if (i < k) {   /* x is zero past k in its padded rows; W masked there */
            __mmask32 m = (__mmask32)((1u << (k - i)) - 1);
            for (int c = 0; c < CB; c++) {
                __m512i v = _mm512_maskz_loadu_epi16(m, wr[c] + 2 * i);
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_maskz_mov_epi16(0xaaaaaaaau, v));
                for (int r = 0; r < R; r++) {
                    acc[r][c] = _mm512_fmadd_ps(we, _mm512_load_ps(x + r * kp + i), acc[r][c]);
                    acc[r][c] = _mm512_fmadd_ps(wo, _mm512_load_ps(x + r * kp + i + 16), acc[r][c]);
                }
            }
        }
    } else {
        for (; i + 16 <= k; i += 16) {
            __m512 xv[RB];
            for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(x + r * kp + i);
            for (int q = rb; q < CB; q += nrb)
                if (pf[q]) _mm_prefetch(pf[q] + 4 * i, _MM_HINT_T1);
            for (int c = 0; c < CB; c++) {
                __m512 w = _mm512_loadu_ps((const float *)wr[c] + i);
                for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(w, xv[r], acc[r][c]);
            }
        }
        if (i < k) {
            __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
            for (int c = 0; c < CB; c++) {
                __m512 w = _mm512_maskz_loadu_ps(m, (const float *)wr[c] + i);
                for (int r = 0; r < R; r++)
                    acc[r][c] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x + r * kp + i), acc[r][c]);
            }
        }
    }
    float *y = j->y + t0 * j->n;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < nc; c++) y[r * j->n + c] = _mm512_reduce_add_ps(acc[r][c]);
}

T512 static void rows_worker(void *p, int ti, int nt)
{
    const rows_job *j = p;
    int64_t nblk = (j->n + CB - 1) / CB, b0, b1;
    tp_split_range(nblk, ti, nt, &b0, &b1);
    int64_t row_bytes = j->k * (j->wt == TP_F32 ? 4 : 2);
    const char *w = j->w;
    int nrb = (int)((j->T + RB - 1) / RB);
    for (int64_t b = b0; b < b1; b++) {
        const char *wr[CB], *pf[CB];
        int64_t c0 = b * CB;
        for (int c = 0; c < CB; c++) {
            int64_t col = c0 + c < j->n ? c0 + c : j->n - 1, next = c0 + CB + c;
            wr[c] = w + col * row_bytes;
            pf[c] = b + 1 < b1 && next < j->n ? w + next * row_bytes : NULL;
        }
        int nc = (int)(j->n - c0 < CB ? j->n - c0 : CB);
        rows_job jb = *j;
        jb.y = j->y + c0;
        for (int64_t t0 = 0, rb = 0; t0 < j->T; t0 += RB, rb++) {
            switch (j->T - t0 < RB ? j->T - t0 : RB) {
            case 1: tile(&jb, t0, 1, wr, nc, pf, (int)rb, nrb); break;
            case 2: tile(&jb, t0, 2, wr, nc, pf, (int)rb, nrb); break;
            case 3: tile(&jb, t0, 3, wr, nc, pf, (int)rb, nrb); break;
            default: tile(&jb, t0, RB, wr, nc, pf, (int)rb, nrb); break;
            }
        }
    }
}

tp_status tp_gemm_rows_avx512(float *y, const float *x, int64_t T, const void *W, tp_dtype wt, int64_t n, int64_t k,
                              tp_threadpool *pool)
{
    rows_job j = {y, x, W, wt, T, n, k, k};
    void *own = NULL;
    if (wt == TP_BF16) {
        j.kp = (k + 31) / 32 * 32;
        float *xp = tp_kernel_scratch(pool, (size_t)(T * j.kp) * sizeof(float), &own);
        if (!xp) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the rows' x");
        tp_permute_x_avx512(xp, x, T, k, j.kp);
        j.x = xp;
    }
    tp_parallel_run(pool, rows_worker, &j);
    tp_free(own);
    return TP_OK;
}
