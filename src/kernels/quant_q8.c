/* Q8_0 quantization: the weights at load (blocks of 32 with an f16 scale,
 * the layout of llama.cpp's Q8_0) and the activations before each product
 * (the same blocks with an f32 scale).  Plain C, shared by every kernel
 * path, so that the quantized values never depend on the path. */
#include "kernels/kern_internal.h"
#include "kernels/qblock_src.h"

#include <math.h>
#include <string.h>

/* Scale and quants of 32 values with the scale `d` (0: all zero). */
static void quantize_block(int8_t *q, const float *x, float d)
{
    /* Adding and taking away 1.5·2^23 rounds to the nearest integer, ties
     * to even, without a libm call (decode quantizes every activation);
     * the product is its own statement so that no compiler fuses it into
     * the addition.  The clamp catches x/d a hair above 127. */
    const float magic = 12582912.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < TP_Q8_BLOCK; i++) {
        float p = x[i] * id;
        float v = (p + magic) - magic;
        q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
    }
}

static float block_amax(const float *x)
{
    float m = 0.0f;
    for (int i = 0; i < TP_Q8_BLOCK; i++) {
        float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

/* 32 values of src from element off on, as f32 (one dtype test a block). */
tp_status tp_q8_quantize_rows(tp_q8_block *dst, const void *src, tp_dtype st, int64_t rows, int64_t k)
{
    if (st != TP_F32 && st != TP_BF16 && st != TP_F16)
        return tp_fail(TP_ERR_UNSUPPORTED, "q8_0: cannot quantize %s values", tp_dtype_name(st));
    if (k % TP_Q8_BLOCK)
        return tp_fail(TP_ERR_INVALID, "q8_0: rows of %lld values do not divide into blocks of %d",
                       (long long)k, TP_Q8_BLOCK);
    int64_t nb = k / TP_Q8_BLOCK;
    float x[TP_Q8_BLOCK];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            tp_qblock_load(x, src, st, r * k + b * TP_Q8_BLOCK);
            float amax = block_amax(x);
            if (!tp_qblock_finite(x))
                return tp_fail(TP_ERR_INVALID, "q8_0: row %lld holds a value that is not finite", (long long)r);
            /* The quants are taken against the scale as stored (f16), so
             * that d·q is the closest the block can hold. */
            uint16_t h = tp_f16_from_f32(amax / 127.0f);
            tp_q8_block *o = &dst[r * nb + b];
            o->d = h;
            quantize_block(o->q, x, tp_q8_scale(h));
        }
    return TP_OK;
}

void tp_q8_dequantize_row(float *dst, const tp_q8_block *src, int64_t k)
{
    for (int64_t b = 0; b < k / TP_Q8_BLOCK; b++) {
        float d = tp_q8_scale(src[b].d);
        for (int i = 0; i < TP_Q8_BLOCK; i++) dst[b * TP_Q8_BLOCK + i] = d * (float)src[b].q[i];
    }
}

void tp_q8_quantize_act(int8_t *q, float *d, const float *x, int64_t T, int64_t k)
{
    for (int64_t b = 0; b < T * (k / TP_Q8_BLOCK); b++) {
        const float *s = x + b * TP_Q8_BLOCK;
        d[b] = block_amax(s) / 127.0f;
        quantize_block(q + b * TP_Q8_BLOCK, s, d[b]);
    }
}
