/* kernels/gemm_amx.c: the AMX-BF16 GEMM against a double reference on
 * awkward sizes (T, n, k not multiples of the 32×32 block or 32-wide k step,
 * odd k, several K blocks, row groups and column groups), for each split of x:
 *   3 parts: products exact, error of f32 accumulation (the exact bound);
 *   2 parts: products off by <= 2^-18 relative;
 *   1 part:  x rounded to bf16, products off by <= 2^-9 (the bf16-dot bound).
 * And tp_matmul_ex's dispatch: amx = 1 runs the three-part GEMM (bitwise the
 * same output), bf16_dot with amx the one-part one.  Machines without AMX
 * print "skipped: no AMX" and pass; so do builds for other architectures,
 * which have no AMX code at all. */
#include "check.h"
#include "matmul_err.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if TP_KERNELS_X86
static tp_rng rng;


static const double BOUND[4] = {0, 0x1p-8 + 1e-6, 0x1p-17 + 1e-6, 1e-6};
static double worst[4];

static void check_amx(tp_threadpool *pool, int64_t T, int64_t n, int64_t k)
{
    float *x = malloc((size_t)(T * k) * sizeof(float));
    float *wf = malloc((size_t)(n * k) * sizeof(float));
    float *y = malloc((size_t)(T * n) * sizeof(float));
    float *y2 = malloc((size_t)(T * n) * sizeof(float));
    float *b = malloc((size_t)n * sizeof(float));
    tp_tensor W = {0}, B = {0};
    int64_t ws[2] = {n, k}, bs[1] = {n};
    if (!x || !wf || !y || !y2 || !b || tp_tensor_init(&W, TP_BF16, 2, ws) || tp_tensor_init(&B, TP_F32, 1, bs)) {
        CHECK(!"out of memory");
        goto done;
    }
    for (int64_t i = 0; i < T * k; i++) x[i] = (float)tp_rng_normal(&rng);
    for (int64_t i = 0; i < n; i++) ((float *)B.data)[i] = b[i] = (float)tp_rng_normal(&rng);
    uint16_t *w = W.data;
    for (int64_t i = 0; i < n * k; i++) {   /* the reference uses the exact bf16 values */
        w[i] = tp_bf16_from_f32((float)(0.5 * tp_rng_normal(&rng)));
        wf[i] = tp_f32_from_bf16(w[i]);
    }
    for (int passes = 1; passes <= 3; passes++) {
        for (int64_t i = 0; i < T * n; i++) y[i] = NAN;
        CHECK(tp_gemm_amx(y, x, T, w, n, k, passes, pool) == TP_OK);
        double e = matmul_err(y, x, wf, NULL, T, n, k);
        if (e > worst[passes]) worst[passes] = e;
        CHECK_MSG(e <= BOUND[passes], "amx x%d T=%lld n=%lld k=%lld err %.3g", passes, (long long)T,
                  (long long)n, (long long)k, e);
    }
    /* Dispatch: exact AMX = the three-part GEMM, bitwise. */
    tp_matmul_opts o = {TP_KERNEL_AVX512, 0, 0, 1};
    CHECK(tp_gemm_amx(y, x, T, w, n, k, 3, pool) == TP_OK);
    CHECK(tp_matmul_ex(y2, x, T, &W, NULL, pool, &o) == TP_OK);
    CHECK_MSG(memcmp(y, y2, (size_t)(T * n) * sizeof(float)) == 0, "dispatch amx=1 T=%lld n=%lld k=%lld",
              (long long)T, (long long)n, (long long)k);
    /* With bias, and the bf16-dot (one-part) variant. */
    for (int dot = 0; dot < 2; dot++) {
        o.bf16_dot = dot;
        CHECK(tp_matmul_ex(y2, x, T, &W, &B, pool, &o) == TP_OK);
        double e = matmul_err(y2, x, wf, b, T, n, k);
        CHECK_MSG(e <= BOUND[dot ? 1 : 3], "matmul amx dot=%d T=%lld n=%lld k=%lld err %.3g", dot, (long long)T,
                  (long long)n, (long long)k, e);
    }
done:
    tp_tensor_release(&W);
    tp_tensor_release(&B);
    free(x); free(wf); free(y); free(y2); free(b);
}

/* Infinite activations (an overflowed layer) give what the f32 path gives:
 * ±inf where the weight is non-zero, NaN where it is 0 (inf · 0), and the
 * other rows finite.  The three-part split used to turn every infinity into
 * NaN (its residual inf - inf). */
static void test_amx_inf(tp_threadpool *pool)
{
    enum { T = 37, N = 40, K = 70 };
    float *x = malloc(sizeof(float) * T * K), *ya = malloc(sizeof(float) * T * N);
    float *yf = malloc(sizeof(float) * T * N);
    tp_tensor W = {0};
    int64_t ws[2] = {N, K};
    if (!x || !ya || !yf || tp_tensor_init(&W, TP_BF16, 2, ws)) {
        CHECK(!"out of memory");
    } else {
        uint16_t *w = W.data;
        for (int64_t i = 0; i < N * K; i++) w[i] = tp_bf16_from_f32((float)tp_rng_normal(&rng));
        for (int64_t c = 0; c < N; c += 7) w[c * K + 3] = 0;   /* inf · 0 = NaN in some columns */
        for (int64_t i = 0; i < T * K; i++) x[i] = (float)tp_rng_normal(&rng);
        x[2 * K + 3] = INFINITY;
        x[20 * K + 3] = -INFINITY;
        tp_matmul_opts amx = {TP_KERNEL_AVX512, 0, 0, 1}, f32 = {TP_KERNEL_AVX512, 0, 0, 0};
        CHECK(tp_matmul_ex(ya, x, T, &W, NULL, pool, &amx) == TP_OK);
        CHECK(tp_matmul_ex(yf, x, T, &W, NULL, pool, &f32) == TP_OK);
        int same = 1;
        for (int64_t i = 0; i < T * N; i++) {
            if (isnan(yf[i]) || isinf(yf[i])) same &= isnan(yf[i]) ? isnan(ya[i]) != 0 : ya[i] == yf[i];
            else same &= fabsf(ya[i] - yf[i]) <= 1e-4f * (1 + fabsf(yf[i]));
        }
        CHECK_MSG(same, "AMX with infinite inputs differs from the f32 path");
        CHECK(isinf(ya[2 * N + 1]) && isinf(ya[20 * N + 1]) && isnan(ya[2 * N + 0]) && isfinite(ya[3 * N + 1]));
    }
    tp_tensor_release(&W);
    free(x); free(ya); free(yf);
}

static void test_amx(tp_threadpool *pool)
{
    static const int64_t Ts[] = {5, 17, 64, 129};
    static const int64_t NK[][2] = {{1, 1}, {7, 129}, {129, 7}, {33, 31}, {40, 1025}, {65, 300}, {3, 513}, {97, 261}};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t c = 0; c < sizeof NK / sizeof *NK; c++) check_amx(pool, Ts[a], NK[c][0], NK[c][1]);
    /* The blocked paths (gemm_amx.c "Blocking"), at 3 parts: */
    check_amx(pool, 129, 50, 2100);   /* split x past L2: 11 K blocks of 6 k steps  */
    check_amx(pool, 512, 64, 1024);   /* 16 row blocks, 6 K blocks                  */
    check_amx(pool, 200, 600, 1100);  /* K blocks of 5 and 6 steps, 2 column groups */
    check_amx(pool, 545, 40, 1100);   /* 2 row groups (512 + 33 rows)               */
    check_amx(pool, 64, 300, 1030);   /* x fits L2: one K block, 4 column groups    */
}

#endif /* TP_KERNELS_X86 */

int main(void)
{
#if !TP_KERNELS_X86
    printf("skipped: AMX is x86-64 code; this build has the portable C path only\n");
    return check_summary();
#else
    if (!tp_kernel_has_amx()) {
        printf("skipped: %s\n", tp_isa_cpu_has(TP_ISA_AMX) ? "TENSORPAR_ISA chose a path without AMX"
                                 : "this CPU has no AMX (or Linux did not grant the tile state)");
        return check_summary();
    }
    tp_rng_seed(&rng, 99);
    tp_threadpool *pool3 = NULL;
    CHECK(tp_threadpool_create(&pool3, 3) == TP_OK);
    test_amx(NULL);
    test_amx(pool3);
    test_amx_inf(NULL);
    test_amx_inf(pool3);
    tp_threadpool_destroy(pool3);
    printf("amx max |err| / sum|x*w|: x3 %.2g (bound %.2g), x2 %.2g (%.2g), x1 %.2g (%.2g)\n", worst[3], BOUND[3],
           worst[2], BOUND[2], worst[1], BOUND[1]);
    return check_summary();
#endif
}
