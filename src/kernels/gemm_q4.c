/* y = x·Wᵀ with Q4_0 weights: the dispatch and the scalar path.
 *
 * As for q8_0 (gemm_q8.c): from TP_Q4_DEQUANT_MIN_T tokens on (prefill)
 * the product is the f32 one with the dequantized weights, d·(nibble - 8)
 * being exact in f32: the path's f32 GEMM dequantizes W while it packs
 * (gemm_packed.c with gemm_avx2.c; gemm_avx512.c), the scalar path runs
 * its f32 loop (matmul.c).  Below that x is quantized per row into 8-bit blocks once
 * per call, in the pool's scratch, and the threads split the rows of W.
 * The scalar path computes exactly what the AVX2 code does, lane by lane
 * (the order is described in kern_q4.h), so it is the reference for the
 * bits.  The AVX-512 path runs gemm_q4_avx512.c's kernels where the CPU
 * has VNNI, else the AVX2 ones. */
#include "kernels/kern_q4.h"

#include "kernels/qgemm_tiles.h"

#include <math.h>

/* One (row, token) pair: the block dot products in 8 lanes of 4. */
static float dot_row(const tp_q4_job *j, int64_t r, const int8_t *xq, const float *xd)
{
    float acc[8] = {0};
    int8_t q[TP_Q4_BLOCK];
    for (int64_t b = 0; b < j->nb; b++) {
        tp_q4_block w = tp_q4_get(j->w, j->n, j->nb, r, b);
        float s = tp_q8_scale(w.d) * xd[b];
        const int8_t *x = xq + b * TP_Q4_BLOCK;
        tp_q4_unpack(q, &w);
        for (int l = 0; l < 8; l++) {
            int32_t lane = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) lane += (int32_t)q[i] * (int32_t)x[i];
            acc[l] = fmaf((float)lane, s, acc[l]);
        }
    }
    return tp_q8_hsum8(acc);
}

void tp_q4_rows_scalar(const tp_q4_job *j, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < j->T; t++)
            j->y[t * j->n + r] = dot_row(j, r, j->xq + t * j->nb * TP_Q4_BLOCK, j->xd + t * j->nb);
}

static void scalar_worker(void *p, int ti, int nt)
{
    const tp_q4_job *j = p;
    int64_t r0, r1;
    tp_split_range(j->n, ti, nt, &r0, &r1);
    tp_q4_rows_scalar(j, r0, r1);
}

void tp_q4_matmul_scalar(const tp_q4_job *j, tp_threadpool *pool)
{
    tp_parallel_run(pool, scalar_worker, (void *)j);
}

#if TP_KERNELS_X86
typedef struct {
    const tp_q4_job *j;
    const tp_q4_tile_fn (*tiles)[TP_GEMV_MAX_T];
} tile_run;

/* Groups [r0, r1) of a GEMV (T <= 4), r0 a multiple of 4 (a chunk of
 * tp_parallel_for): each group for all its tokens, two at a time where it
 * can (T <= 2: four independent FMA chains per token, not two); a last
 * group of fewer than 4 rows the scalar way.  A row's bits do not depend on which chunk or thread runs it. */
static void gemv_groups(void *p, int64_t r0, int64_t r1, int ti)
{
    (void)ti;
    const tile_run *run = p;
    const tp_q4_job *j = run->j;
    int tt = (int)j->T;
    int64_t full = r1 - (r1 - r0) % TP_Q4_ROWS, g = r0;
    if (tt <= 2)
        for (; g + 2 * TP_Q4_ROWS <= full; g += 2 * TP_Q4_ROWS) run->tiles[1][tt - 1](j, g, 0);
    for (; g < full; g += TP_Q4_ROWS) run->tiles[0][tt - 1](j, g, 0);
    if (full < r1) tp_q4_rows_scalar(j, full, r1);
}

/* A GEMM: thread ti's whole groups of 4 rows (tp_gemv_thread_rows splits at
 * multiples of 4), TP_QTILE_GEMM_TOKENS tokens at a time (x stays in cache)
 * in tiles of 4 tokens, and the last group of fewer rows the scalar way. */
static void gemm_worker(void *p, int ti, int nt)
{
    const tile_run *run = p;
    const tp_q4_job *j = run->j;
    int64_t r0, r1;
    tp_gemv_thread_rows(j->n, j->nb * (int64_t)sizeof(tp_q4_block), TP_Q4_ROWS, ti, nt, &r0, &r1);
    if (r0 >= r1) return;
    int64_t full = r1 - (r1 - r0) % TP_Q4_ROWS;
    for (int64_t c0 = 0; c0 < j->T; c0 += TP_QTILE_GEMM_TOKENS) {
        int64_t c1 = c0 + TP_QTILE_GEMM_TOKENS < j->T ? c0 + TP_QTILE_GEMM_TOKENS : j->T;
        for (int64_t g = r0; g < full; g += TP_Q4_ROWS)
            for (int64_t t = c0; t < c1; t += TP_GEMV_MAX_T) {
                int tt = c1 - t < TP_GEMV_MAX_T ? (int)(c1 - t) : TP_GEMV_MAX_T;
                run->tiles[0][tt - 1](j, g, t);
            }
    }
    if (full < r1) tp_q4_rows_scalar(j, full, r1);
}

void tp_q4_run_tiles(const tp_q4_job *j, const tp_q4_tile_fn tiles[2][TP_GEMV_MAX_T], tp_threadpool *pool)
{
    tile_run run = {j, tiles};
    if (j->T > TP_GEMV_MAX_T) { tp_parallel_run(pool, gemm_worker, &run); return; }
    /* The GEMV in dynamic chunks of ~64 KiB of W, whole pairs of groups, so
     * that a thread the OS or the host stops hands its rows over. */
    int64_t rows = tp_gemv_chunk_rows(j->nb * (int64_t)sizeof(tp_q4_block), 2 * TP_Q4_ROWS);
    tp_parallel_for(pool, j->n, rows, gemv_groups, &run);
}
#endif

tp_status tp_q4_matmul(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                       tp_threadpool *pool)
{
    int64_t n = W->shape[0], k = W->shape[1], nb = k / TP_Q4_BLOCK;
    if (k % TP_Q4_BLOCK) return tp_fail(TP_ERR_INTERNAL, "tp_matmul: a q4_0 row of %lld values", (long long)k);
    if (T >= TP_Q4_DEQUANT_MIN_T) {
        return tp_matmul_dequant(y, x, T, W, path, pool);   /* prefill */
    }
    size_t qbytes = (size_t)(T * k + 63) / 64 * 64, sbytes = (size_t)(T * nb) * 8 * sizeof(int32_t);
    size_t bytes = qbytes + sbytes + (size_t)(T * nb) * sizeof(float);
    void *own;
    char *mem = tp_kernel_scratch(pool, bytes, &own);
    if (!mem) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the quantized input (%zu bytes)", bytes);
    int8_t *xq = (int8_t *)mem;
    int32_t *nxs = (int32_t *)(mem + qbytes);
    float *xd = (float *)(mem + qbytes + sbytes);
    tp_q8_quantize_act(xq, xd, x, T, k);
    for (int64_t l = 0; l < T * nb * 8; l++)
        nxs[l] = -8 * ((int32_t)xq[4 * l] + xq[4 * l + 1] + xq[4 * l + 2] + xq[4 * l + 3]);
    tp_q4_job j = {y, xq, nxs, xd, W->data, T, n, nb};
#if TP_KERNELS_X86
    if (path == TP_KERNEL_AVX512 && tp_kernel_has_vnni()) tp_q4_matmul_avx512(&j, pool);
    else if (path != TP_KERNEL_SCALAR) tp_q4_matmul_avx2(&j, pool);
    else tp_q4_matmul_scalar(&j, pool);
#else
    (void)path;
    tp_q4_matmul_scalar(&j, pool);
#endif
    tp_free(own);
    return TP_OK;
}
