/* What tests/unit/test_q4.c and test_q8.c check the same way for any
 * block-quantized weight dtype: every path against the scalar bits (or,
 * from the dtype's DEQUANT_MIN_T tokens on, its own f32 product's), a
 * token alone against the batch, the thread split gives one thread's
 * bits, and such a weight is for inference only.  Each test passes the two things
 * that are its own: how it makes a weight of its dtype and how it fills
 * (from its own seeded generator). */
#ifndef TP_TEST_QUANT_TEST_H
#define TP_TEST_QUANT_TEST_H

#include "check.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* a weight [n, k] of the test's dtype from random values, and (wd not NULL)
 * its dequantized values; nonzero when it could not be made */
typedef int (*quant_make_weight_fn)(tp_tensor *W, float *wd, int64_t n, int64_t k);
typedef void (*quant_fill_fn)(float *x, int64_t n, double scale);

static const tp_kernel_path QUANT_PATHS[] = {TP_KERNEL_SCALAR, TP_KERNEL_AVX2, TP_KERNEL_AVX512};

/* Which kernel the avx512 path runs for the dtype: vpdpbusd where the CPU
 * has AVX512_VNNI, else (Skylake-X, or TENSORPAR_NO_VNNI=1, which
 * scripts/test.sh sets for one run) the AVX2 kernel; the bits must be the
 * same either way. */
static inline void quant_print_vnni(const char *dtype)
{
    if (tp_kernel_path_supported(TP_KERNEL_AVX512))
        printf("%s on the avx512 path: %s\n", dtype,
               tp_kernel_has_vnni() ? "the AVX-512 VNNI kernel" : "the AVX2 kernel (no AVX512_VNNI, or TENSORPAR_NO_VNNI=1)");
}

/* Wider shapes through a pool: the rows split among threads (and the GEMMs'
 * chunks of tokens or panels) give the bits of one thread, for each token
 * count in ts (chosen by the test to reach each of its products). */
static inline void quant_check_threads(tp_threadpool *pool, quant_make_weight_fn make, quant_fill_fn fill,
                                       const int64_t *ts, size_t nts)
{
    int64_t T = 101, n = 1203, k = 512;   /* n: several GEMV chunks a thread */
    float *x = malloc((size_t)(T * k) * sizeof(float)), *y1 = malloc((size_t)(T * n) * sizeof(float));
    float *y3 = malloc((size_t)(T * n) * sizeof(float));
    tp_tensor W = {0};
    if (!x || !y1 || !y3 || make(&W, NULL, n, k)) { CHECK(!"out of memory"); goto done; }
    fill(x, T * k, 1.0);
    for (int pi = 0; pi < 3; pi++) {
        if (!tp_kernel_path_supported(QUANT_PATHS[pi])) continue;
        tp_matmul_opts o = {QUANT_PATHS[pi], 0, 0, 0};
        for (size_t ti = 0; ti < nts; ti++) {
            int64_t t = ts[ti];
            CHECK(tp_matmul_ex(y1, x, t, &W, NULL, NULL, &o) == TP_OK);
            CHECK(tp_matmul_ex(y3, x, t, &W, NULL, pool, &o) == TP_OK);
            CHECK_MSG(!memcmp(y1, y3, (size_t)(t * n) * sizeof(float)), "%s T=%lld: 1 and %d threads differ",
                      tp_kernel_path_name(QUANT_PATHS[pi]), (long long)t, tp_threadpool_size(pool));
        }
    }
done:
    tp_tensor_release(&W);
    free(x); free(y1); free(y3);
}

/* y (T × n, a quantized product of path `path`) holds the bits of the f32
 * product of x and the dequantized weights wd [n, k] on path f32_path: what
 * a product of the dtype's DEQUANT_MIN_T tokens or more gives. */
static inline void quant_check_dequant_bits(tp_threadpool *pool, const float *y, const float *x, int64_t T,
                                            const float *wd, int64_t n, int64_t k, tp_kernel_path path,
                                            tp_kernel_path f32_path)
{
    tp_tensor Wf = {0};
    float *yf = malloc((size_t)(T * n) * sizeof(float));
    if (!yf || tp_tensor_init(&Wf, TP_F32, 2, (int64_t[2]){n, k})) { CHECK(!"out of memory"); goto done; }
    memcpy(Wf.data, wd, (size_t)(n * k) * sizeof(float));
    tp_matmul_opts o = {f32_path, 0, 0, 0};
    CHECK(tp_matmul_ex(yf, x, T, &Wf, NULL, pool, &o) == TP_OK);
    CHECK_MSG(!memcmp(y, yf, (size_t)(T * n) * sizeof(float)), "%s T=%lld n=%lld k=%lld: not the f32 product's bits",
              tp_kernel_path_name(path), (long long)T, (long long)n, (long long)k);
done:
    tp_tensor_release(&Wf);
    free(yf);
}

/* Every path on the product of x [T, k] and W [n, k] (wd: W's dequantized
 * values): below the dtype's DEQUANT_MIN_T tokens (deq 0) the bits of yr,
 * the scalar path's; from there on (deq 1) each path's own f32 product's
 * bits.  Then each token alone (the GEMV): the batch's bits below, else
 * within xb (x's quantization) of the batch.  yr is overwritten, y is
 * scratch [T, n]. */
static inline void quant_check_paths(tp_threadpool *pool, const tp_tensor *W, const float *x, const float *wd,
                                     int64_t T, int64_t n, int64_t k, int deq, float *yr, float *y, const double *xb)
{
    for (int pi = 0; pi < 3; pi++) {
        if (!tp_kernel_path_supported(QUANT_PATHS[pi])) continue;
        tp_matmul_opts op = {QUANT_PATHS[pi], 0, 0, 0};
        memset(y, 0xff, (size_t)(T * n) * sizeof(float));
        CHECK(tp_matmul_ex(y, x, T, W, NULL, pool, &op) == TP_OK);
        /* each path its own GEMM: the AVX-512 one dequantizes in its packing */
        if (deq) quant_check_dequant_bits(pool, y, x, T, wd, n, k, QUANT_PATHS[pi], QUANT_PATHS[pi]);
        else
            CHECK_MSG(!memcmp(y, yr, (size_t)(T * n) * sizeof(float)), "%s T=%lld n=%lld k=%lld: not the scalar bits",
                      tp_kernel_path_name(QUANT_PATHS[pi]), (long long)T, (long long)n, (long long)k);
        memcpy(yr, y, (size_t)(T * n) * sizeof(float));
        /* each token alone (the GEMV): the batch's bits below the f32
         * product's T, else within x's quantization of it */
        for (int64_t t = 0; t < T; t += T > 4 ? 3 : 1) {
            CHECK(tp_matmul_ex(y, x + t * k, 1, W, NULL, pool, &op) == TP_OK);
            if (!deq) {
                CHECK_MSG(!memcmp(y, yr + t * n, (size_t)n * sizeof(float)), "%s T=%lld token %lld alone differs",
                          tp_kernel_path_name(QUANT_PATHS[pi]), (long long)T, (long long)t);
                continue;
            }
            for (int64_t r = 0; r < n; r++)
                CHECK_MSG(fabs(y[r] - yr[t * n + r]) <= xb[t * n + r], "%s T=%lld token %lld row %lld alone: %.6g vs %.6g",
                          tp_kernel_path_name(QUANT_PATHS[pi]), (long long)T, (long long)t, (long long)r, y[r],
                          yr[t * n + r]);
        }
    }
}

/* The f32 product of one dequantized row w and one row of x in double
 * (*f32), the sum of its terms' magnitudes (*mag), and how far x's 8-bit
 * quantization (block scales xd, one per 32 values; half a step a value)
 * can move it (*xbound). */
static inline void quant_f32_sums(const float *w, const float *x, const float *xd, int64_t k, double *f32,
                                  double *mag, double *xbound)
{
    *f32 = *mag = *xbound = 0;
    for (int64_t i = 0; i < k; i++) {
        *f32 += (double)w[i] * x[i];
        *mag += fabs((double)w[i] * x[i]);
        *xbound += fabs((double)w[i]) * xd[i / 32] / 2;
    }
}

/* check(pool, T, n, k) over the shapes that reach every kernel's edges:
 * T = 1..40 (every GEMV width, every integer GEMM tile tail — chunks of 48
 * tokens, tiles of 3 —, the switch to the f32 GEMM at 32); rows: the
 * AVX-512 kernels' pairs and an odd last row, the 4-row tiles' tails;
 * blocks: 1, 3, 10, 16, 17 (the 8-block scale chunks' tails); then longer
 * prompts, whole and partial GEMM tiles. */
static inline void quant_for_shapes(tp_threadpool *pool, void (*check)(tp_threadpool *, int64_t, int64_t, int64_t))
{
    static const int64_t ns[] = {1, 2, 3, 5, 6, 9, 37};
    static const int64_t ks[] = {32, 96, 320, 512, 544};
    for (int64_t T = 1; T <= 40; T++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) check(pool, T, ns[b], ks[c]);
    for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
        check(pool, 50, ns[b], 544);
        check(pool, 97, ns[b], 320);
    }
}

/* Inference only: the backward refuses the weight, naming its dtype;
 * tp_row_to_f32 (an embedding lookup) dequantizes; a bias is added. */
static inline void quant_check_refusals(quant_make_weight_fn make, quant_fill_fn fill, const char *dtype)
{
    tp_tensor W = {0}, B = {0};
    float wd[4 * 64], x[64], dy[4], dx[64], row[64], y[4];
    CHECK(make(&W, wd, 4, 64) == 0 && tp_tensor_init(&B, TP_F32, 1, (int64_t[1]){4}) == TP_OK);
    fill(x, 64, 1.0);
    fill(dy, 4, 1.0);
    memset(dx, 0, sizeof dx);
    CHECK(tp_matmul_backward(dx, NULL, NULL, dy, x, 1, &W, NULL) == TP_ERR_UNSUPPORTED &&
          strstr(tp_error(), dtype));
    tp_row_to_f32(row, &W, 2);
    CHECK(!memcmp(row, wd + 2 * 64, sizeof row));
    ((float *)B.data)[1] = 10.0f;
    float y0[4];
    CHECK(tp_matmul(y0, x, 1, &W, NULL, NULL) == TP_OK && tp_matmul(y, x, 1, &W, &B, NULL) == TP_OK);
    CHECK(y[1] == y0[1] + 10.0f && y[0] == y0[0]);
    tp_tensor_release(&W);
    tp_tensor_release(&B);
}

#endif
