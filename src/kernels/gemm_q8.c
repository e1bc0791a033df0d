/* y = x·Wᵀ with Q8_0 weights: the dispatch and the scalar path.
 *
 * From TP_Q8_DEQUANT_MIN_T tokens on (prefill) the product is the f32 one
 * with the dequantized weights: the path's packed f32 GEMM dequantizes W
 * while it packs (gemm_packed.c with gemm_avx2.c; gemm_avx512.c), and the
 * scalar path runs its f32 loop on d·q (matmul.c).  Below that (decode,
 * short prompts) x is quantized per row into Q8_0 blocks (quant_q8.c) once
 * per call, in the pool's scratch; the threads then split the rows of W.  The scalar
 * path computes exactly what the AVX2 code does, lane by lane (the order
 * is described in kern_internal.h), so it is the reference for the bits
 * and not only for the values.  The AVX-512 path (AMX included) runs
 * gemm_q8_avx512.c's VNNI kernel where the CPU has AVX512_VNNI — the same
 * bits — and the AVX2 kernel on an AVX-512 CPU without it; its prefill is
 * gemm_avx512.c's f32 GEMM, which dequantizes W in its packing: 1.07-1.34×
 * the VNNI integer tiles at T = 512 (bench/README.md, "8-bit weights"). */
#include "kernels/kern_internal.h"

#include <math.h>
#include <string.h>

/* One (row, token) pair: the block dot products in 8 lanes of 4. */
static float dot_row(const tp_q8_block *w, const int8_t *xq, const float *xd, int64_t nb)
{
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        float s = tp_q8_scale(w[b].d) * xd[b];
        const int8_t *x = xq + b * TP_Q8_BLOCK;
        for (int l = 0; l < 8; l++) {
            int32_t lane = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) lane += (int32_t)w[b].q[i] * (int32_t)x[i];
            acc[l] = fmaf((float)lane, s, acc[l]);
        }
    }
    return tp_q8_hsum8(acc);
}

static void scalar_worker(void *p, int ti, int nt)
{
    const tp_q8_job *j = p;
    int64_t r0, r1;
    tp_split_range(j->n, ti, nt, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < j->T; t++)
            j->y[t * j->n + r] = dot_row(j->w + r * j->nb, j->xq + t * j->nb * TP_Q8_BLOCK, j->xd + t * j->nb, j->nb);
}

void tp_q8_matmul_scalar(const tp_q8_job *j, tp_threadpool *pool)
{
    tp_parallel_run(pool, scalar_worker, (void *)j);
}

tp_status tp_q8_matmul(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                       tp_threadpool *pool)
{
    int64_t n = W->shape[0], k = W->shape[1], nb = k / TP_Q8_BLOCK;
    if (k % TP_Q8_BLOCK) return tp_fail(TP_ERR_INTERNAL, "tp_matmul: a q8_0 row of %lld values", (long long)k);
    if (T >= TP_Q8_DEQUANT_MIN_T) {
        return tp_matmul_dequant(y, x, T, W, path, pool);   /* prefill */
    }
    size_t qbytes = (size_t)(T * k + 63) / 64 * 64, bytes = qbytes + (size_t)(T * nb) * sizeof(float);
    void *own;
    char *mem = tp_kernel_scratch(pool, bytes, &own);
    if (!mem) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the quantized input (%zu bytes)", bytes);
    int8_t *xq = (int8_t *)mem;
    float *xd = (float *)(mem + qbytes);
    tp_q8_quantize_act(xq, xd, x, T, k);
    tp_q8_job j = {y, xq, xd, W->data, T, n, nb};
#if TP_KERNELS_X86
    if (path == TP_KERNEL_AVX512 && tp_kernel_has_vnni()) tp_q8_matmul_avx512(&j, pool);
    else if (path != TP_KERNEL_SCALAR) tp_q8_matmul_avx2(&j, pool);
    else tp_q8_matmul_scalar(&j, pool);
#else
    (void)path;
    tp_q8_matmul_scalar(&j, pool);
#endif
    tp_free(own);
    return TP_OK;
}
