/* Linear layers: y = x·Wᵀ + b.
 *
 * f32 weights go straight to OpenBLAS.  bf16 weights are widened to f32 one
 * block of rows at a time and then handed to OpenBLAS, so prefill runs at
 * BLAS speed without ever holding an f32 copy of the whole matrix.  (The
 * speed issue replaces this with native bf16 kernels.) */
#include "tensorpar/kernels.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#define BF16_BLOCK_ROWS 256

void tp_row_to_f32(float *dst, const tp_tensor *m, int64_t row)
{
    int64_t n = m->shape[m->ndim - 1];
    if (m->dtype == TP_F32) {
        memcpy(dst, (const float *)m->data + row * n, (size_t)n * sizeof(float));
    } else {
        const uint16_t *src = (const uint16_t *)m->data + row * n;
        for (int64_t i = 0; i < n; i++) dst[i] = tp_f32_from_bf16(src[i]);
    }
}

static void add_bias(float *y, int64_t T, int64_t out, const tp_tensor *bias)
{
    float *b = malloc((size_t)out * sizeof(float));
    if (!b) return;
    tp_row_to_f32(b, bias, 0);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++) y[t * out + o] += b[o];
    free(b);
}

typedef struct {
    float *y;
    const float *x;
    int64_t T, in, out;
    const uint16_t *w;
} bf16_job;

/* Each thread widens its own blocks of rows and multiplies them. */
static void bf16_worker(void *p, int ti, int nt)
{
    bf16_job *j = p;
    int64_t nblocks = (j->out + BF16_BLOCK_ROWS - 1) / BF16_BLOCK_ROWS, b0, b1;
    tp_split_range(nblocks, ti, nt, &b0, &b1);
    float *wf = malloc((size_t)BF16_BLOCK_ROWS * (size_t)j->in * sizeof(float));
    if (!wf) return;
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * BF16_BLOCK_ROWS;
        int64_t rows = j->out - r0 < BF16_BLOCK_ROWS ? j->out - r0 : BF16_BLOCK_ROWS;
        const uint16_t *src = j->w + r0 * j->in;
        for (int64_t i = 0; i < rows * j->in; i++) wf[i] = tp_f32_from_bf16(src[i]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->T, (int)rows, (int)j->in,
                    1.0f, j->x, (int)j->in, wf, (int)j->in, 0.0f, j->y + r0, (int)j->out);
    }
    free(wf);
}

tp_status tp_matmul(float *y, const float *x, int64_t T, const tp_tensor *W,
                    const tp_tensor *bias, tp_threadpool *pool)
{
    if (W->ndim != 2) return tp_fail(TP_ERR_INTERNAL, "tp_matmul: weight must be 2-D");
    int64_t out = W->shape[0], in = W->shape[1];
    if (T == 0 || out == 0) return TP_OK;
    if (in == 0) {
        memset(y, 0, (size_t)(T * out) * sizeof(float));
    } else if (W->dtype == TP_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)out, (int)in,
                    1.0f, x, (int)in, W->data, (int)in, 0.0f, y, (int)out);
    } else if (W->dtype == TP_BF16) {
        bf16_job j = {y, x, T, in, out, W->data};
        tp_parallel_run(pool, bf16_worker, &j);
    } else {
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_matmul: weights of dtype %s", tp_dtype_name(W->dtype));
    }
    if (bias && bias->data) add_bias(y, T, out, bias);
    return TP_OK;
}
