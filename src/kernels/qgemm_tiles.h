/* What the kernels of the block-quantized weights share.  The constants
 * (prefetch distance, tokens per GEMM chunk) serve every q8_0/q4_0 kernel.
 * The tile schedule below them (which R rows × TT tokens tile runs where,
 * how rows and tokens split among threads) drives both q8_0 kernels,
 * gemm_q8_avx2.c and gemm_q8_avx512.c (whose decode GEMV at T = 1 runs
 * 8-row tiles of its own); the q4_0 kernels read the repacked layout of
 * kern_q4.h in group tiles of their own (gemm_q4.c).  Only the tile itself,
 * the block dot products, is each ISA's own; the schedule decides no
 * arithmetic, so sharing it leaves every result's bits as they were. */
#ifndef TP_KERNELS_QGEMM_TILES_H
#define TP_KERNELS_QGEMM_TILES_H

#include "kernels/kern_internal.h"

/* Software prefetch this far ahead of each row stream of W in the
 * quantized GEMVs (every dtype and path): 32 KiB measured better than the
 * bf16 GEMV's 16 KiB on rows of 8192 (18.5 against 15 GB/s; 64 KiB the
 * same as 32; bench/README.md, "8-bit weights"). */
#define TP_QTILE_PF_BYTES 32768

/* Tokens per chunk of the GEMM: 48 rows of x (a multiple of the tile's
 * 3); 48 × 8192/32 × 36 bytes = 432 KiB at the widest K of a 1B model. */
#define TP_QTILE_GEMM_TOKENS 48
#define TP_QTILE_GEMM_ROWS 4
#define TP_QTILE_GEMM_TT 3

/* Rows per GEMV tile (T <= TP_GEMV_MAX_T tokens at once). */
#define TP_QTILE_GEMV_R(T) ((T) > 1 ? 2 : 4)

/* One tile: rows [r0, r0 + R) for tokens [t0, t0 + TT) of the dtype's job. */
typedef void (*tp_qtile_fn)(const void *job, int64_t r0, int64_t t0);

/* One function per tile shape, so that each gets its own unrolled code;
 * the GEMV's shapes prefetch, the GEMM's 4 × 2 and 4 × 3 do not (their
 * rows are reused from L1 by the next tokens).  Needs the file's
 * `tile(job, r0, R, t0, TT, prefetch)`; TARGET is the attribute its tiles
 * are compiled for (the AVX2 files' and the AVX-512 files' own), so the
 * one schedule serves every ISA; defines `tiles`, indexed
 * [rows - 1][tokens - 1]. */
#define TP_QTILE_FN(JOB, R, TT, TARGET)                                           \
    TARGET static void tile_##R##_##TT(const void *j, int64_t r0, int64_t t0)     \
    {                                                                             \
        tile((const JOB *)j, r0, R, t0, TT, (TT) == 1 || (R) < 3);                \
    }
#define TP_QTILE_TABLE(JOB, T)                                                    \
    TP_QTILE_FN(JOB, 1, 1, T) TP_QTILE_FN(JOB, 1, 2, T)                           \
    TP_QTILE_FN(JOB, 1, 3, T) TP_QTILE_FN(JOB, 1, 4, T)                           \
    TP_QTILE_FN(JOB, 2, 1, T) TP_QTILE_FN(JOB, 2, 2, T)                           \
    TP_QTILE_FN(JOB, 2, 3, T) TP_QTILE_FN(JOB, 2, 4, T)                           \
    TP_QTILE_FN(JOB, 3, 1, T) TP_QTILE_FN(JOB, 3, 2, T)                           \
    TP_QTILE_FN(JOB, 3, 3, T) TP_QTILE_FN(JOB, 3, 4, T)                           \
    TP_QTILE_FN(JOB, 4, 1, T) TP_QTILE_FN(JOB, 4, 2, T)                           \
    TP_QTILE_FN(JOB, 4, 3, T)                                                     \
    static const tp_qtile_fn tiles[4][4] = {                                      \
        {tile_1_1, tile_1_2, tile_1_3, tile_1_4},                                 \
        {tile_2_1, tile_2_2, tile_2_3, tile_2_4},                                 \
        {tile_3_1, tile_3_2, tile_3_3, tile_3_4},                                 \
        {tile_4_1, tile_4_2, tile_4_3, NULL},                                     \
    };

/* The schedule NAME(job, pool), a static function, rows of nb BLOCKs: a
 * GEMV's (T <= TP_GEMV_MAX_T) rows in dynamic chunks of TP_QTILE_GEMV_R(T)
 * row tiles (tp_parallel_for; a tile's bits do not depend on which thread
 * runs it or which tiles share its chunk), a GEMM's through
 * tp_qtile_worker, over `tiles` (TP_QTILE_TABLE above).  The file's entry
 * point calls it. */
#define TP_QTILE_MATMUL(NAME, JOB, BLOCK)                                         \
    static void qtile_run(void *p, int ti, int nt)                                \
    {                                                                             \
        const JOB *j = p;                                                         \
        tp_qtile_worker(tiles, j, j->T, j->n, j->nb * (int64_t)sizeof(BLOCK), ti, nt); \
    }                                                                             \
    static void qtile_gemv_rows(void *p, int64_t r0, int64_t r1, int ti)          \
    {                                                                             \
        (void)ti;                                                                 \
        const JOB *j = p;                                                         \
        tp_qtile_rows(tiles, j, r0, r1, TP_QTILE_GEMV_R(j->T), 0, (int)j->T);     \
    }                                                                             \
    static void NAME(const JOB *j, tp_threadpool *pool)                           \
    {                                                                             \
        if (j->T > TP_GEMV_MAX_T) { tp_parallel_run(pool, qtile_run, (void *)j); return; } \
        int64_t rows = tp_gemv_chunk_rows(j->nb * (int64_t)sizeof(BLOCK), TP_QTILE_GEMV_R(j->T)); \
        tp_parallel_for(pool, j->n, rows, qtile_gemv_rows, (void *)j);            \
    }

/* Rows [r0, r1) for tokens [t0, t0 + tt): blocks of R rows, then single
 * rows (R·tt <= 12). */
static inline void tp_qtile_rows(const tp_qtile_fn tiles[4][4], const void *j, int64_t r0, int64_t r1, int R,
                                 int64_t t0, int tt)
{
    tp_qtile_fn f = tiles[R - 1][tt - 1], f1 = tiles[0][tt - 1];
    for (; r0 + R <= r1; r0 += R) f(j, r0, t0);
    for (; r0 < r1; r0++) f1(j, r0, t0);
}

/* Thread ti of nt on a GEMM of T tokens by n rows of row_bytes: its rows,
 * in chunks of tokens and rows that stay in cache. */
static inline void tp_qtile_worker(const tp_qtile_fn tiles[4][4], const void *j, int64_t T, int64_t n,
                                   int64_t row_bytes, int ti, int nt)
{
    int64_t r0, r1;
    tp_gemv_thread_rows(n, row_bytes, TP_QTILE_GEMM_ROWS, ti, nt, &r0, &r1);
    if (r0 >= r1) return;
    for (int64_t c0 = 0; c0 < T; c0 += TP_QTILE_GEMM_TOKENS) {
        int64_t c1 = c0 + TP_QTILE_GEMM_TOKENS < T ? c0 + TP_QTILE_GEMM_TOKENS : T;
        for (int64_t rb = r0; rb < r1; rb += TP_QTILE_GEMM_ROWS) {
            int64_t re = rb + TP_QTILE_GEMM_ROWS < r1 ? rb + TP_QTILE_GEMM_ROWS : r1;
            int64_t t = c0;
            for (; t + TP_QTILE_GEMM_TT <= c1; t += TP_QTILE_GEMM_TT)
                tp_qtile_rows(tiles, j, rb, re, TP_QTILE_GEMM_ROWS, t, TP_QTILE_GEMM_TT);
            if (t < c1) tp_qtile_rows(tiles, j, rb, re, TP_QTILE_GEMM_ROWS, t, (int)(c1 - t));
        }
    }
}

#endif
