/* Q4_0 quantization of the weights at load: llama.cpp's block_q4_0 made as
 * its reference quantizer (ggml-quants.c, quantize_row_q4_0_ref) makes it,
 * so that a GGUF written by bench/llamacpp/convert.py and a tensorpar load
 * of the same values hold the same blocks.  The activations of a q4_0
 * product are quantized as for q8_0 (tp_q8_quantize_act). */
#include "kernels/kern_q4.h"
#include "kernels/qblock_src.h"

#include <math.h>
#include <string.h>

/* 32 values of src from element off on, as f32. */
/* One nibble: x·id lies in [-8, 8], so x·id + 8.5 is positive and the
 * conversion to int is the floor; 16 (the far end of the range) becomes
 * 15.  Two statements, so that the product is rounded before the sum
 * (C11 forbids contracting across them), as ggml's is. */
static uint8_t nibble(float x, float id)
{
    float p = x * id;
    float v = p + 8.5f;
    int q = (int)v;
    return (uint8_t)(q > 15 ? 15 : q);
}

/* The block's d: the value of largest magnitude (the first of equals, as
 * ggml's strict comparison keeps it) over -8. */
static float block_d(const float *x)
{
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < TP_Q4_BLOCK; i++)
        if (amax < fabsf(x[i])) amax = fabsf(x[i]), m = x[i];
    return m / -8.0f;
}

static void quantize_block(tp_q4_block *o, const float *x)
{
    float d = block_d(x);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    o->d = tp_f16_from_f32(d);
    for (int j = 0; j < TP_Q4_BLOCK / 2; j++)
        o->qs[j] = (uint8_t)(nibble(x[j], id) | nibble(x[j + TP_Q4_BLOCK / 2], id) << 4);
}

/* Each block goes straight to its place in the repacked layout (kern_q4.h). */
tp_status tp_q4_quantize_rows(void *dst, const void *src, tp_dtype st, int64_t rows, int64_t k)
{
    if (st != TP_F32 && st != TP_BF16 && st != TP_F16)
        return tp_fail(TP_ERR_UNSUPPORTED, "q4_0: cannot quantize %s values", tp_dtype_name(st));
    if (k % TP_Q4_BLOCK)
        return tp_fail(TP_ERR_INVALID, "q4_0: rows of %lld values do not divide into blocks of %d",
                       (long long)k, TP_Q4_BLOCK);
    int64_t nb = k / TP_Q4_BLOCK;
    float x[TP_Q4_BLOCK];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            tp_qblock_load(x, src, st, r * k + b * TP_Q4_BLOCK);
            if (!tp_qblock_finite(x))
                return tp_fail(TP_ERR_INVALID, "q4_0: row %lld holds a value that is not finite", (long long)r);
            tp_q4_block o;
            quantize_block(&o, x);
            int64_t qs, d = tp_q4_locate(rows, nb, r, b, &qs);
            memcpy((char *)dst + d, &o.d, sizeof o.d);
            memcpy((char *)dst + qs, o.qs, sizeof o.qs);
        }
    return TP_OK;
}

tp_q4_block tp_q4_block_at(const void *w, int64_t rows, int64_t k, int64_t r, int64_t b)
{
    return tp_q4_get(w, rows, k / TP_Q4_BLOCK, r, b);
}

void tp_q4_dequantize_row(float *dst, const void *w, int64_t rows, int64_t k, int64_t r)
{
    int8_t q[TP_Q4_BLOCK];
    for (int64_t b = 0; b < k / TP_Q4_BLOCK; b++) {
        tp_q4_block blk = tp_q4_get(w, rows, k / TP_Q4_BLOCK, r, b);
        float d = tp_q8_scale(blk.d);
        tp_q4_unpack(q, &blk);
        for (int i = 0; i < TP_Q4_BLOCK; i++) dst[b * TP_Q4_BLOCK + i] = d * (float)q[i];
    }
}
