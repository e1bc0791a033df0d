/* The source side that the block quantizers (quant_q8.c, quant_q4.c)
 * share: one block of 32 weights read as f32 from the stored dtype, and the
 * test that it holds only finite values. */
#ifndef TP_KERNELS_QBLOCK_SRC_H
#define TP_KERNELS_QBLOCK_SRC_H

#include "tensorpar/base.h"

#include <string.h>

/* Both formats' blocks are 32 values, so one reader serves them. */
#define TP_QBLOCK 32
_Static_assert(TP_Q8_BLOCK == TP_QBLOCK && TP_Q4_BLOCK == TP_QBLOCK, "q8_0 and q4_0 blocks of 32");

/* dst = values [off, off + 32) of src stored as st: f32, bf16 or f16 (the
 * quantizers refuse any other before reading). */
static inline void tp_qblock_load(float *dst, const void *src, tp_dtype st, int64_t off)
{
    if (st == TP_F32) {
        memcpy(dst, (const float *)src + off, TP_QBLOCK * sizeof(float));
    } else if (st == TP_BF16) {
        const uint16_t *h = (const uint16_t *)src + off;
        for (int i = 0; i < TP_QBLOCK; i++) dst[i] = tp_f32_from_bf16(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)src + off;
        for (int i = 0; i < TP_QBLOCK; i++) dst[i] = tp_f32_from_f16(h[i]);
    }
}

/* Whether the block's 32 values are all finite: x·0 is NaN for an inf or a
 * NaN, and a NaN makes the sum one. */
static inline int tp_qblock_finite(const float *x)
{
    float sum = 0.0f;
    for (int i = 0; i < TP_QBLOCK; i++) sum += x[i] * 0.0f;
    return sum == 0.0f;
}

#endif
