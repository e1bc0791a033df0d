/* kernels/kern_q4.h — the 4-bit weight kernels (quant_q4.c, gemm_q4.c,
 * gemm_q4_avx2.c), shared with matmul.c and tests/unit/test_q4.c.  Not
 * public API.
 *
 * y = x·Wᵀ with W in TP_Q4_0 blocks.  x is quantized per row as for q8_0
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

/* One product: W [n, nb·32] in q4_0, x [T, nb·32] quantized (xq, xd);
 * xs [T, nb, 8]: 8 times the sum of each lane's 4 quants of x (the AVX2
 * path multiplies the unsigned nibbles and takes 8·x away per lane). */
typedef struct {
    float *y;
    const int8_t *xq;
    const int32_t *xs;
    const float *xd;
    const tp_q4_block *w;
    int64_t T, n, nb;
} tp_q4_job;

void tp_q4_matmul_scalar(const tp_q4_job *j, tp_threadpool *pool);
#if TP_KERNELS_X86
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
