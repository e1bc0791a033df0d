/* Q4_0 weights (kernels/quant_q4.c, gemm_q4.c, gemm_q4_avx2.c): the blocks
 * hold what llama.cpp's reference quantizer makes (a block worked out by
 * hand, a plain re-statement of its rule, the nibble order); the scalar
 * product equals the exact (double) sum of the quantized values to within
 * its f32 roundings; every SIMD path, thread count, tile and GEMV/GEMM
 * split gives the scalar path's bits below TP_Q4_DEQUANT_MIN_T tokens; from
 * there on every path gives the bits of its f32 product with the
 * dequantized weights; the backward and element-wise conversions refuse
 * q4_0. */
#include "check.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_q4.h"
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

/* x[i] = i - 16: the largest magnitude is x[0] = -16 (x[31] = 15), so
 * d = -16/-8 = 2 (f16 0x4000) and nibble i = floor((i - 16)/2 + 8.5), the
 * last one (16) clamped to 15; byte j holds nibbles j (low) and j + 16. */
static void test_known_block(void)
{
    float x[TP_Q4_BLOCK], back[TP_Q4_BLOCK];
    for (int i = 0; i < TP_Q4_BLOCK; i++) x[i] = (float)(i - 16);
    tp_q4_block b;
    CHECK(tp_q4_quantize_rows(&b, x, TP_F32, 1, TP_Q4_BLOCK) == TP_OK);
    CHECK_MSG(b.d == 0x4000, "d bits 0x%04x", b.d);
    for (int j = 0; j < 16; j++) {
        int lo = (j + 1) / 2, hi = (j + 16 + 1) / 2 > 15 ? 15 : (j + 16 + 1) / 2;
        CHECK_MSG(b.qs[j] == (lo | hi << 4), "byte %d: 0x%02x, expected 0x%02x", j, b.qs[j], lo | hi << 4);
    }
    tp_q4_dequantize_row(back, &b, 1, TP_Q4_BLOCK, 0);
    CHECK(back[0] == -16.0f && back[16] == 0.0f && back[31] == 14.0f && back[1] == -14.0f);
    /* a positive extreme gives a negative d; ties keep the first */
    for (int i = 0; i < TP_Q4_BLOCK; i++) x[i] = 0.0f;
    x[3] = 4.0f;
    x[9] = -4.0f;
    CHECK(tp_q4_quantize_rows(&b, x, TP_F32, 1, TP_Q4_BLOCK) == TP_OK);
    CHECK(b.d == tp_f16_from_f32(-0.5f) && (b.qs[3] & 0x0f) == 0 && (b.qs[9] & 0x0f) == 15);
    /* all zero: d = 0/-8 = -0 (f16 0x8000, as ggml stores it), every nibble 8 */
    x[3] = x[9] = 0.0f;
    CHECK(tp_q4_quantize_rows(&b, x, TP_F32, 1, TP_Q4_BLOCK) == TP_OK);
    CHECK(b.d == 0x8000);
    for (int j = 0; j < 16; j++) CHECK(b.qs[j] == 0x88);
}

/* llama.cpp's rule written out once more, value by value. */
static void reference_block(tp_q4_block *o, const float *x)
{
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); m = x[i]; }
    float d = m / -8.0f;
    volatile float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int i = 0; i < 32; i++) {
        volatile float p = x[i] * id;
        float v = p + 8.5f;
        q[i] = (uint8_t)((int)v > 15 ? 15 : (int)v);
    }
    o->d = tp_f16_from_f32(d);
    for (int j = 0; j < 16; j++) o->qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* The repacked layout, built here from the reference's blocks as
 * kern_q4.h describes it (groups of 4 rows, the last of n % 4; chunks of 8
 * blocks, the last of nb % 8; per chunk the scales block-major, then the
 * nibble arrays in the same order), equals what tp_q4_quantize_rows
 * writes, for shapes with and without the short group and chunk. */
static void test_layout(void)
{
    static const int64_t shapes[][2] = {{8, 256}, {5, 288}, {7, 96}, {1, 64}, {3, 32}, {12, 544}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int64_t n = shapes[si][0], k = shapes[si][1], nb = k / TP_Q4_BLOCK;
        size_t bytes = (size_t)(n * nb) * sizeof(tp_q4_block);
        float *x = malloc((size_t)(n * k) * sizeof(float));
        unsigned char *got = malloc(bytes), *want = malloc(bytes);
        if (!x || !got || !want) { CHECK(!"out of memory"); free(x); free(got); free(want); return; }
        fill(x, n * k, 0.3);
        CHECK(tp_q4_quantize_rows(got, x, TP_F32, n, k) == TP_OK);
        size_t o = 0;
        for (int64_t g0 = 0; g0 < n; g0 += 4) {
            int64_t g = n - g0 < 4 ? n - g0 : 4;
            for (int64_t c0 = 0; c0 < nb; c0 += 8) {
                int64_t m = nb - c0 < 8 ? nb - c0 : 8;
                tp_q4_block ref[8][4];
                for (int64_t i = 0; i < m; i++)
                    for (int64_t r = 0; r < g; r++) reference_block(&ref[i][r], x + (g0 + r) * k + (c0 + i) * 32);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t r = 0; r < g; r++, o += 2) memcpy(want + o, &ref[i][r].d, 2);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t r = 0; r < g; r++, o += 16) memcpy(want + o, ref[i][r].qs, 16);
            }
        }
        CHECK_MSG(o == bytes && !memcmp(got, want, bytes), "layout of [%lld, %lld] differs", (long long)n,
                  (long long)k);
        free(x); free(got); free(want);
    }
}

/* Random rows: the blocks equal the reference's; |x - (q - 8)·d| is at
 * most |d|/2 (|d| where the nibble was clamped at 15), plus 8 times the f16
 * rounding of d. */
static void test_quantize(void)
{
    enum { R = 7, K = 128 };
    float x[R * K], back[K];
    tp_q4_block q[R * K / TP_Q4_BLOCK];
    fill(x, R * K, 0.7);
    x[2 * K + 5] = 1e-6f;
    x[2 * K + 6] = 300.0f;
    CHECK(tp_q4_quantize_rows(q, x, TP_F32, R, K) == TP_OK);
    double worst = 0;
    for (int r = 0; r < R; r++) {
        tp_q4_dequantize_row(back, q, R, K, r);
        for (int b = 0; b < K / TP_Q4_BLOCK; b++) {
            const tp_q4_block at = tp_q4_block_at(q, R, K, r, b), *blk = &at;
            const float *xb = x + r * K + b * TP_Q4_BLOCK;
            tp_q4_block ref;
            reference_block(&ref, xb);
            CHECK_MSG(!memcmp(&ref, blk, sizeof ref), "row %d block %d: not the reference's block", r, b);
            float amax = 0;
            for (int i = 0; i < TP_Q4_BLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
            double d = fabs((double)amax / 8), dh = fabs((double)tp_f32_from_f16(blk->d));
            for (int i = 0; i < TP_Q4_BLOCK; i++) {
                int nib = i < 16 ? blk->qs[i] & 0x0f : blk->qs[i - 16] >> 4;
                double e = fabs((double)back[b * TP_Q4_BLOCK + i] - xb[i]);
                double bound = (nib == 15 ? d : d / 2) * (1 + 1e-6) + 8 * fabs(dh - d) + 1e-30;
                CHECK_MSG(e <= bound, "row %d block %d [%d]: |x - d·q| %.3g > %.3g", r, b, i, e, bound);
                if (amax > 0 && e / amax > worst) worst = e / amax;
            }
        }
    }
    printf("q4_0 round trip: max |x - (q - 8)·d| / amax = %.3g (1/16 = %.3g; 1/8 where clamped)\n", worst,
           1.0 / 16);
    /* bf16 and f16 sources quantize to the same blocks as their f32 values. */
    uint16_t hb[K], hh[K];
    float xr[K];
    for (int i = 0; i < K; i++) xr[i] = tp_f32_from_f16(tp_f16_from_f32(x[i]));
    for (int i = 0; i < K; i++) hh[i] = tp_f16_from_f32(xr[i]);
    for (int i = 0; i < K; i++) hb[i] = tp_bf16_from_f32(x[i]);
    tp_q4_block a[K / TP_Q4_BLOCK], b[K / TP_Q4_BLOCK];
    CHECK(tp_q4_quantize_rows(a, hh, TP_F16, 1, K) == TP_OK && tp_q4_quantize_rows(b, xr, TP_F32, 1, K) == TP_OK);
    CHECK(!memcmp(a, b, sizeof a));
    for (int i = 0; i < K; i++) xr[i] = tp_f32_from_bf16(hb[i]);
    CHECK(tp_q4_quantize_rows(a, hb, TP_BF16, 1, K) == TP_OK && tp_q4_quantize_rows(b, xr, TP_F32, 1, K) == TP_OK);
    CHECK(!memcmp(a, b, sizeof a));
    /* refusals: a row that is not whole blocks, a NaN, an inf, an integer source */
    CHECK(tp_q4_quantize_rows(a, x, TP_F32, 1, 48) == TP_ERR_INVALID && strstr(tp_error(), "48"));
    float bad[TP_Q4_BLOCK] = {0};
    bad[3] = NAN;
    CHECK(tp_q4_quantize_rows(a, bad, TP_F32, 1, TP_Q4_BLOCK) == TP_ERR_INVALID);
    bad[3] = INFINITY;
    CHECK(tp_q4_quantize_rows(a, bad, TP_F32, 1, TP_Q4_BLOCK) == TP_ERR_INVALID);
    CHECK(tp_q4_quantize_rows(a, bad, TP_I32, 1, TP_Q4_BLOCK) == TP_ERR_UNSUPPORTED);
    CHECK(tp_convert(a, TP_Q4_0, x, TP_F32, TP_Q4_BLOCK) == TP_ERR_UNSUPPORTED);
    /* a q4_0 tensor's size is per block, and its rows must be whole blocks */
    tp_tensor t;
    CHECK(tp_tensor_init(&t, TP_Q4_0, 2, (int64_t[2]){3, 64}) == TP_OK && tp_tensor_nbytes(&t) == 3 * 2 * 18);
    tp_tensor_release(&t);
    CHECK(tp_tensor_init(&t, TP_Q4_0, 2, (int64_t[2]){3, 40}) == TP_ERR_INVALID && strstr(tp_error(), "q4_0"));
    tp_dtype dt;
    CHECK(tp_dtype_parse("q4_0", &dt) == TP_OK && dt == TP_Q4_0 && !strcmp(tp_dtype_name(dt), "q4_0"));
    CHECK(tp_dtype_row_bytes(TP_Q4_0, 96) == 54);
}

/* A q4_0 weight [n, k] from random values; also its dequantized values. */
static int make_weight(tp_tensor *W, float *wd, int64_t n, int64_t k)
{
    float *w = malloc((size_t)(n * k) * sizeof(float));
    if (!w || tp_tensor_init(W, TP_Q4_0, 2, (int64_t[2]){n, k})) { free(w); return -1; }
    fill(w, n * k, 0.05);
    int st = tp_q4_quantize_rows(W->data, w, TP_F32, n, k) != TP_OK;
    for (int64_t r = 0; r < n && wd; r++) tp_q4_dequantize_row(wd + r * k, W->data, n, k, r);
    free(w);
    return st;
}

static double worst_ref;

/* Below TP_Q4_DEQUANT_MIN_T tokens: the scalar path against the exact sum
 * of the quantized products, every other path against the scalar path's
 * bits, each token alone (the GEMV) against the batch.  From
 * TP_Q4_DEQUANT_MIN_T on: the scalar path within f32 rounding of the exact
 * product of x and the dequantized weights, every path the bits of its f32
 * product, a token alone (the quantized GEMV) within x's quantization of
 * it. */
static void check_product(tp_threadpool *pool, int64_t T, int64_t n, int64_t k)
{
    int64_t nb = k / TP_Q4_BLOCK;
    int deq = T >= TP_Q4_DEQUANT_MIN_T;
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
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < n; r++) {
            double exact = 0, mag = 0, f32 = 0, f32mag = 0, xbound = 0;
            for (int64_t b = 0; b < nb; b++) {
                /* the dequantized weight is (q - 8)·d exactly in f32 */
                double dw = tp_f32_from_f16(tp_q4_block_at(W.data, n, k, r, b).d);
                double s = dw * xd[t * nb + b];
                for (int l = 0; l < 8; l++) {
                    long lane = 0;
                    for (int i = 4 * l; i < 4 * l + 4; i++) {
                        int64_t e = b * TP_Q4_BLOCK + i;
                        lane += dw != 0 ? lround(wd[r * k + e] / dw) * xq[t * k + e] : 0;
                    }
                    exact += s * (double)lane;
                    mag += fabs(s * (double)lane);
                }
            }
            quant_f32_sums(wd + r * k, x + t * k, xd + t * nb, k, &f32, &f32mag, &xbound);
            double bound = (double)(nb + 5) * 0x1p-24 * mag;
            xb[t * n + r] = xbound * (1 + 1e-5) + bound;
            if (deq) {   /* k roundings of a sum in order */
                double ef = fabs(yr[t * n + r] - f32), fb = (double)k * 0x1p-24 * f32mag;
                CHECK_MSG(ef <= fb, "T=%lld [%lld, %lld]: scalar %.9g f32 %.9g (bound %.3g)", (long long)T,
                          (long long)t, (long long)r, yr[t * n + r], f32, fb);
                continue;
            }
            double e = fabs(yr[t * n + r] - exact);
            CHECK_MSG(e <= bound, "T=%lld n=%lld k=%lld [%lld, %lld]: scalar %.9g exact %.9g (bound %.3g)",
                      (long long)T, (long long)n, (long long)k, (long long)t, (long long)r, yr[t * n + r], exact,
                      bound);
            if (mag > 0 && e / mag > worst_ref) worst_ref = e / mag;
        }
    quant_check_paths(pool, &W, x, wd, T, n, k, deq, yr, y, xb);
done:
    tp_tensor_release(&W);
    free(x); free(wd); free(yr); free(y); free(xq); free(xd); free(xb);
}

static void test_products(tp_threadpool *pool)
{
    quant_for_shapes(pool, check_product);
    printf("q4_0 products (%d threads): scalar vs exact %.2g of sum|terms|\n", tp_threadpool_size(pool), worst_ref);
}

int main(void)
{
    tp_rng_seed(&rng, 4);
    tp_threadpool *pool3 = NULL;
    if (tp_threadpool_create(&pool3, 3)) { fprintf(stderr, "no pool: %s\n", tp_error()); return 1; }
    print_skipped_paths("test_q4");
    quant_print_vnni("q4_0");
    test_known_block();
    test_layout();
    test_quantize();
    test_products(NULL);
    test_products(pool3);
    static const int64_t ts[] = {1, 3, 20, 101};   /* GEMV (4- and 2-row tiles), integer GEMM, f32 GEMM */
    quant_check_threads(pool3, make_weight, fill, ts, sizeof ts / sizeof *ts);
    quant_check_refusals(make_weight, fill, "q4_0");
    tp_threadpool_destroy(pool3);
    return check_summary();
}
