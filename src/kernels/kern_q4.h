/* kernels/kern_q4.h — the 4-bit weight kernels (quant_q4.c, gemm_q4.c,
 * gemm_q4_avx2.c, gemm_q4_avx512.c), shared with matmul.c, the f32 GEMMs'
 * packers (dequantize-while-packing) and tests/unit/test_q4.c.  Not public
 * API.
 *
 * The layout.  A q4_0 tensor [n, nb·32] holds llama.cpp's blocks (an f16
 * scale d, 16 bytes of nibbles: byte j = element j low, element j + 16
 * high), n·nb·18 bytes as the plain blocks would, but repacked at load
 * (tp_q4_quantize_rows writes it so, once per rank, from its own shard):
 * rows go in groups of TP_Q4_ROWS (4; the last group holds the n % 4 rows
 * left, if any), a group's blocks in chunks of TP_Q4_CHUNK (8; the last
 * chunk the nb % 8 left), and a chunk of m blocks of a group of g rows is
 *     the m·g scales, block-major ([block 0: row 0..g-1][block 1: ...]),
 *     then the m·g 16-byte nibble arrays in the same order.
 * So one 64-byte load is the nibbles of one block of 4 rows, which split
 * into the 4 rows' lanes 0-3 (low nibbles) and 4-7 (high ones) with an
 * AND and a shift, and a chunk's 32 scales are one 64-byte load converted
 * in two instructions; a group of 4 rows is one stream in memory.  (The
 * plain blocks cost the AVX-512 kernel two 16-byte loads and two inserts
 * per pair of rows, and a 16-word gather of the scales per 8 blocks.)
 * tp_q4_locate finds any block, which is how the scalar path and the f32
 * GEMMs' packers read it.
 *
 * y = x·Wᵀ with W in q4_0.  x is quantized per row as for q8_0
 * (tp_q8_quantize_act: blocks of 32 int8 with an f32 scale); each pair of
 * blocks gives an exact int32 dot product of the signed weights (nibble - 8)
 * and x's quants, and the f32 sums keep q8_0's order: lane l of a block is
 * the sum of its elements 4l..4l+3, each lane accumulates lane·(d_w·d_x)
 * with one fused multiply-add per block, and the 8 lanes are added at the
 * end as tp_q8_hsum8 does.  The scalar path does exactly that in C, so
 * every path gives the same bits, whatever the thread count, the tile a
 * row falls in, or whether it runs as a GEMV or a GEMM. */
#ifndef TP_KERN_Q4_H
#define TP_KERN_Q4_H

#include "kernels/kern_internal.h"

#include <string.h>

#define TP_Q4_ROWS 4
#define TP_Q4_CHUNK 8
/* The 64-byte lines of a whole chunk of a group (4 × 8 blocks of 18 bytes:
 * 9), which the SIMD kernels prefetch per chunk. */
#define TP_Q4_CHUNK_LINES ((int)((TP_Q4_ROWS * TP_Q4_CHUNK * sizeof(tp_q4_block) + 63) / 64))

/* Byte offsets, in a repacked tensor of n rows of nb blocks, of block b of
 * row r: the return value its f16 scale's, *qs its 16 bytes of nibbles. */
static inline int64_t tp_q4_locate(int64_t n, int64_t nb, int64_t r, int64_t b, int64_t *qs)
{
    int64_t g0 = r - r % TP_Q4_ROWS, g = n - g0 < TP_Q4_ROWS ? n - g0 : TP_Q4_ROWS;
    int64_t c0 = b - b % TP_Q4_CHUNK, m = nb - c0 < TP_Q4_CHUNK ? nb - c0 : TP_Q4_CHUNK;
    int64_t base = (int64_t)sizeof(tp_q4_block) * (g0 * nb + g * c0), i = (b - c0) * g + (r - g0);
    *qs = base + 2 * m * g + (TP_Q4_BLOCK / 2) * i;
    return base + 2 * i;
}

/* Block b of row r as a plain block (a copy: the scale and the nibbles lie
 * apart). */
static inline tp_q4_block tp_q4_get(const void *w, int64_t n, int64_t nb, int64_t r, int64_t b)
{
    int64_t qs, d = tp_q4_locate(n, nb, r, b, &qs);
    tp_q4_block o;
    memcpy(&o.d, (const char *)w + d, sizeof o.d);
    memcpy(o.qs, (const char *)w + qs, sizeof o.qs);
    return o;
}

/* The 32 signed values (nibble - 8) of a block, in element order. */
static inline void tp_q4_unpack(int8_t q[TP_Q4_BLOCK], const tp_q4_block *b)
{
    for (int j = 0; j < TP_Q4_BLOCK / 2; j++) {
        q[j] = (int8_t)((b->qs[j] & 0x0f) - 8);
        q[j + TP_Q4_BLOCK / 2] = (int8_t)((b->qs[j] >> 4) - 8);
    }
}

/* From this many tokens on, the product is the f32 one of x and the
 * dequantized weights (gemm_q4.c), not the integer one described above. */
#define TP_Q4_DEQUANT_MIN_T 32

/* One product: W [n, nb·32] in q4_0 (repacked), x [T, nb·32] quantized
 * (xq, xd); nxs [T, nb, 8]: -8 times the sum of each lane's 4 quants of x
 * (the SIMD paths multiply the unsigned nibbles and add it per lane). */
typedef struct {
    float *y;
    const int8_t *xq;
    const int32_t *nxs;
    const float *xd;
    const void *w;
    int64_t T, n, nb;
} tp_q4_job;

/* Rows [r0, r1) of the product the scalar way (also the SIMD paths' last
 * group of fewer than 4 rows). */
void tp_q4_rows_scalar(const tp_q4_job *j, int64_t r0, int64_t r1);
void tp_q4_matmul_scalar(const tp_q4_job *j, tp_threadpool *pool);
#if TP_KERNELS_X86
/* A SIMD tile: the full group of 4 rows from row g0 (G groups of them,
 * G = 1 or 2) for tokens [t0, t0 + TT); indexed [G - 1][TT - 1]. */
typedef void (*tp_q4_tile_fn)(const tp_q4_job *j, int64_t g0, int64_t t0);
/* The file's tp_q4_tile_fn functions, one per shape so that each gets its
 * own unrolled code, and their table `tiles`: needs the file's
 * `tile(job, g0, G, t0, TT)`; TARGET is its target attribute. */
#define TP_Q4_TILE(G, TT, TARGET)                                               \
    TARGET static void tile_##G##_##TT(const tp_q4_job *j, int64_t g0, int64_t t0) \
    {                                                                           \
        tile(j, g0, G, t0, TT);                                                 \
    }
#define TP_Q4_TILES(TARGET)                                                     \
    TP_Q4_TILE(1, 1, TARGET) TP_Q4_TILE(1, 2, TARGET)                           \
    TP_Q4_TILE(1, 3, TARGET) TP_Q4_TILE(1, 4, TARGET)                           \
    TP_Q4_TILE(2, 1, TARGET) TP_Q4_TILE(2, 2, TARGET)                           \
    TP_Q4_TILE(2, 3, TARGET) TP_Q4_TILE(2, 4, TARGET)                           \
    static const tp_q4_tile_fn tiles[2][TP_GEMV_MAX_T] = {                      \
        {tile_1_1, tile_1_2, tile_1_3, tile_1_4},                               \
        {tile_2_1, tile_2_2, tile_2_3, tile_2_4},                               \
    };
/* The threads split the groups; each runs the tiles (gemm_q4.c). */
void tp_q4_run_tiles(const tp_q4_job *j, const tp_q4_tile_fn tiles[2][TP_GEMV_MAX_T], tp_threadpool *pool);
void tp_q4_matmul_avx2(const tp_q4_job *j, tp_threadpool *pool);
/* AVX-512BW + VNNI (gemm_q4_avx512.c): the same bits; needs
 * tp_kernel_has_vnni(). */
void tp_q4_matmul_avx512(const tp_q4_job *j, tp_threadpool *pool);
#endif
/* x quantized, then the path's kernel (gemm_q4.c).  k = W's row length, a
 * multiple of 32. */
tp_status tp_q4_matmul(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                       tp_threadpool *pool);

#endif
