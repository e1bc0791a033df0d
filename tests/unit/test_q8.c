/* Q8_0 weights (kernels/quant_q8.c, gemm_q8.c, gemm_q8_avx2.c, gemm_q8_avx512.c): the blocks
 * hold what llama.cpp's Q8_0 holds; the scalar product equals the exact
 * (double) sum of the quantized values to within its f32 roundings; every
 * SIMD path, thread count, tile and GEMV/GEMM split gives the scalar
 * path's bits below TP_Q8_DEQUANT_MIN_T tokens; from there on every path
 * gives the bits of its f32 product with the dequantized weights; a q8_0
 * product stays close to the f32 one; the backward
 * and element-wise conversions refuse q8_0. */
#include "check.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"
#include "quant_test.h"
#include "skip_paths.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tp_rng rng;

static void fill(float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * tp_rng_normal(&rng));
}

/* Each block: d is amax/127 rounded to f16, |x - d·q| <= d/2 (plus the f16
 * rounding of d times |q|), |q| <= 127 and the largest |q| is 126 or 127. */
static void test_quantize(void)
{
    enum { R = 5, K = 96 };
    float x[R * K], back[K];
    tp_q8_block q[R * K / TP_Q8_BLOCK];
    fill(x, R * K, 0.7);
    for (int i = 0; i < TP_Q8_BLOCK; i++) x[K + i] = 0.0f;   /* row 1, block 0: all zero */
    x[2 * K + 5] = 1e-6f;                                      /* a block of tiny values and one large */
    x[2 * K + 6] = 300.0f;
    CHECK(tp_q8_quantize_rows(q, x, TP_F32, R, K) == TP_OK);
    double worst = 0;
    for (int r = 0; r < R; r++) {
        tp_q8_dequantize_row(back, q + r * (K / TP_Q8_BLOCK), K);
        for (int b = 0; b < K / TP_Q8_BLOCK; b++) {
            const tp_q8_block *blk = &q[r * (K / TP_Q8_BLOCK) + b];
            const float *xb = x + r * K + b * TP_Q8_BLOCK;
            float amax = 0;
            int qmax = 0;
            for (int i = 0; i < TP_Q8_BLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
            for (int i = 0; i < TP_Q8_BLOCK; i++) qmax = abs(blk->q[i]) > qmax ? abs(blk->q[i]) : qmax;
            CHECK(blk->d == tp_f16_from_f32(amax / 127.0f));
            CHECK_MSG(amax == 0 ? qmax == 0 : qmax >= 126 && qmax <= 127, "row %d block %d: largest |q| %d", r,
                      b, qmax);
            double d = tp_f32_from_f16(blk->d);
            for (int i = 0; i < TP_Q8_BLOCK; i++) {
                double e = fabs((double)back[b * TP_Q8_BLOCK + i] - xb[i]);
                CHECK_MSG(e <= d / 2 * (1 + 1e-6) + 1e-30, "row %d block %d [%d]: |x - d·q| %.3g > d/2 %.3g", r, b,
                          i, e, d / 2);
                if (amax > 0 && e / amax > worst) worst = e / amax;
            }
        }
    }
    printf("q8_0 round trip: max |x - d·q| / amax = %.3g (bound 1/254 = %.3g)\n", worst, 1.0 / 254);
    /* bf16 and f16 sources quantize to the same blocks as their f32 values. */
    uint16_t hb[K], hh[K];
    float xr[K];
    for (int i = 0; i < K; i++) xr[i] = tp_f32_from_f16(tp_f16_from_f32(x[i]));
    for (int i = 0; i < K; i++) hh[i] = tp_f16_from_f32(xr[i]);
    for (int i = 0; i < K; i++) { hb[i] = tp_bf16_from_f32(x[i]); }
    tp_q8_block a[K / TP_Q8_BLOCK], b[K / TP_Q8_BLOCK];
    CHECK(tp_q8_quantize_rows(a, hh, TP_F16, 1, K) == TP_OK && tp_q8_quantize_rows(b, xr, TP_F32, 1, K) == TP_OK);
    CHECK(!memcmp(a, b, sizeof a));
    for (int i = 0; i < K; i++) xr[i] = tp_f32_from_bf16(hb[i]);
    CHECK(tp_q8_quantize_rows(a, hb, TP_BF16, 1, K) == TP_OK && tp_q8_quantize_rows(b, xr, TP_F32, 1, K) == TP_OK);
    CHECK(!memcmp(a, b, sizeof a));
    /* refusals: a row that is not whole blocks, a NaN, an integer source */
    CHECK(tp_q8_quantize_rows(a, x, TP_F32, 1, 48) == TP_ERR_INVALID && strstr(tp_error(), "48"));
    float bad[TP_Q8_BLOCK] = {0};
    bad[3] = NAN;
    CHECK(tp_q8_quantize_rows(a, bad, TP_F32, 1, TP_Q8_BLOCK) == TP_ERR_INVALID);
    CHECK(tp_q8_quantize_rows(a, bad, TP_I32, 1, TP_Q8_BLOCK) == TP_ERR_UNSUPPORTED);
    CHECK(tp_convert(a, TP_Q8_0, x, TP_F32, TP_Q8_BLOCK) == TP_ERR_UNSUPPORTED);
    /* a q8_0 tensor's size is per block, and its rows must be whole blocks */
    tp_tensor t;
    CHECK(tp_tensor_init(&t, TP_Q8_0, 2, (int64_t[2]){3, 64}) == TP_OK && tp_tensor_nbytes(&t) == 3 * 2 * 34);
    tp_tensor_release(&t);
    CHECK(tp_tensor_init(&t, TP_Q8_0, 2, (int64_t[2]){3, 40}) == TP_ERR_INVALID);
    tp_dtype dt;
    CHECK(tp_dtype_parse("q8_0", &dt) == TP_OK && dt == TP_Q8_0 && !strcmp(tp_dtype_name(dt), "q8_0"));
}

/* A q8_0 weight [n, k] from random values; also its dequantized values. */
static int make_weight(tp_tensor *W, float *wd, int64_t n, int64_t k)
{
    float *w = malloc((size_t)(n * k) * sizeof(float));
    if (!w || tp_tensor_init(W, TP_Q8_0, 2, (int64_t[2]){n, k})) { free(w); return -1; }
    fill(w, n * k, 0.05);
    int st = tp_q8_quantize_rows(W->data, w, TP_F32, n, k) != TP_OK;
    for (int64_t r = 0; r < n && wd; r++) tp_q8_dequantize_row(wd + r * k, (tp_q8_block *)W->data + r * (k / 32), k);
    free(w);
    return st;
}

static double worst_ref, worst_f32;

/* Below TP_Q8_DEQUANT_MIN_T tokens: the scalar path against the exact sum
 * of the quantized products, every other path against the scalar path's
 * bits, each token alone (the GEMV) against the batch's bits, and the
 * product against the f32 product of the dequantized weights and x.  From
 * TP_Q8_DEQUANT_MIN_T on: every path gives its f32 product's bits, within
 * f32 rounding of the exact one; a token alone (the quantized GEMV) stays
 * within x's quantization of it. */
static void check_product(tp_threadpool *pool, int64_t T, int64_t n, int64_t k)
{
    int64_t nb = k / TP_Q8_BLOCK;
    int deq = T >= TP_Q8_DEQUANT_MIN_T;
    float *x = malloc((size_t)(T * k) * sizeof(float)), *wd = malloc((size_t)(n * k) * sizeof(float));
    float *yr = malloc((size_t)(T * n) * sizeof(float)), *y = malloc((size_t)(T * n) * sizeof(float));
    int8_t *xq = malloc((size_t)(T * k));
    float *xd = malloc((size_t)(T * nb) * sizeof(float));
    double *xb = malloc((size_t)(T * n) * sizeof(double));
    tp_tensor W = {0};
    if (!x || !wd || !yr || !y || !xq || !xd || !xb || make_weight(&W, wd, n, k)) {
        CHECK(!"out of memory");
        goto done;
    }
    fill(x, T * k, 1.0);
    if (T > 2) x[k + 3] = 40.0f;   /* one block with an outlier */
    tp_q8_quantize_act(xq, xd, x, T, k);
    tp_matmul_opts o = {TP_KERNEL_SCALAR, 0, 0, 0};
    CHECK(tp_matmul_ex(yr, x, T, &W, NULL, pool, &o) == TP_OK);
    const tp_q8_block *wb = W.data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < n; r++) {
            double exact = 0, mag = 0, f32 = 0, f32mag = 0, xbound = 0;
            for (int64_t b = 0; b < nb; b++) {
                const tp_q8_block *w = &wb[r * nb + b];
                const int8_t *a = xq + (t * nb + b) * TP_Q8_BLOCK;
                double s = (double)tp_f32_from_f16(w->d) * xd[t * nb + b];
                for (int l = 0; l < 8; l++) {
                    long lane = 0;
                    for (int i = 4 * l; i < 4 * l + 4; i++) lane += (long)w->q[i] * a[i];
                    exact += s * (double)lane;
                    mag += fabs(s * (double)lane);
                }
            }
            quant_f32_sums(wd + r * k, x + t * k, xd + t * nb, k, &f32, &f32mag, &xbound);
            /* nb + 3 roundings of at most 2^-24 each, and the scale's own */
            double bound = (double)(nb + 5) * 0x1p-24 * mag;
            xb[t * n + r] = xbound * (1 + 1e-5) + bound;
            double ef = fabs(yr[t * n + r] - f32);
            if (deq) {   /* k roundings of a sum in order */
                double fb = (double)k * 0x1p-24 * f32mag;
                CHECK_MSG(ef <= fb, "T=%lld [%lld, %lld]: scalar %.9g f32 %.9g (bound %.3g)", (long long)T,
                          (long long)t, (long long)r, yr[t * n + r], f32, fb);
                continue;
            }
            double e = fabs(yr[t * n + r] - exact);
            CHECK_MSG(e <= bound, "T=%lld n=%lld k=%lld [%lld, %lld]: scalar %.9g exact %.9g (bound %.3g)",
                      (long long)T, (long long)n, (long long)k, (long long)t, (long long)r, yr[t * n + r], exact,
                      bound);
            if (mag > 0 && e / mag > worst_ref) worst_ref = e / mag;
            /* against the f32 product with the same (dequantized) weights:
             * x's quantization moves each value by at most half its
             * block's d_x */
            CHECK_MSG(ef <= xb[t * n + r], "T=%lld [%lld, %lld]: q8 %.6g f32 %.6g (bound %.3g)", (long long)T,
                      (long long)t, (long long)r, yr[t * n + r], f32, xbound);
            if (!(T > 2 && t == 1) && f32mag > 0 && ef / f32mag > worst_f32) worst_f32 = ef / f32mag;
        }
    quant_check_paths(pool, &W, x, wd, T, n, k, deq, yr, y, xb);
done:
    tp_tensor_release(&W);
    free(x); free(wd); free(yr); free(y); free(xq); free(xd); free(xb);
}

static void test_products(tp_threadpool *pool)
{
    quant_for_shapes(pool, check_product);
    printf("q8_0 products (%d threads): scalar vs exact %.2g of sum|terms|, vs f32 (no outlier) %.2g of sum|terms|\n",
           tp_threadpool_size(pool), worst_ref, worst_f32);
}

int main(void)
{
    tp_rng_seed(&rng, 8);
    tp_threadpool *pool3 = NULL;
    if (tp_threadpool_create(&pool3, 3)) { fprintf(stderr, "no pool: %s\n", tp_error()); return 1; }
    print_skipped_paths("test_q8");
    quant_print_vnni("q8_0");
    test_quantize();
    test_products(NULL);
    test_products(pool3);
    static const int64_t ts[] = {1, 3, 20, 101};   /* GEMV (4- and 2-row tiles), integer GEMM, f32 GEMM */
    quant_check_threads(pool3, make_weight, fill, ts, sizeof ts / sizeof *ts);
    quant_check_refusals(make_weight, fill, "q8_0");
    tp_threadpool_destroy(pool3);
    return check_summary();
}
