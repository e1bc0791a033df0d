/* The packed GEMM (kernels/gemm_packed.c) in the three layouts a Linear
 * needs — forward y = x·Wᵀ, dx += dy·W, dW += dyᵀ·x — on every path the
 * CPU runs, against double-precision loops, f32 and bf16 weights, awkward
 * sizes (T = 1..7, k = 1, nothing a multiple of a tile); and the results
 * bitwise equal on 1, 2 and 3 threads. */
#include "check.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"
#include "skip_paths.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tp_rng rng;
static const tp_kernel_path PATHS[] = {TP_KERNEL_SCALAR, TP_KERNEL_AVX2, TP_KERNEL_AVX512};

static void fill(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)tp_rng_normal(&rng);
}

enum { FWD, DX, DW, NLAYOUT };
static const char *const LAYOUT[NLAYOUT] = {"forward", "dx", "dW"};

typedef struct {
    int64_t T, n, k;
    tp_tensor W;
    float *wf;          /* W's values as f32 (bf16 ones exactly) */
    float *x, *dy;      /* x [T, k], dy [T, n] */
    float *init;        /* what dx / dW hold before the accumulation */
} problem;

static int problem_init(problem *p, int64_t T, int64_t n, int64_t k, tp_dtype wt)
{
    memset(p, 0, sizeof *p);
    p->T = T, p->n = n, p->k = k;
    int64_t s[2] = {n, k}, big = n * k > T * k ? n * k : T * k;
    p->wf = malloc((size_t)(n * k) * sizeof(float));
    p->x = malloc((size_t)(T * k) * sizeof(float));
    p->dy = malloc((size_t)(T * n) * sizeof(float));
    p->init = malloc((size_t)big * sizeof(float));
    if (!p->wf || !p->x || !p->dy || !p->init || tp_tensor_init(&p->W, wt, 2, s)) return 0;
    fill(p->wf, n * k);
    fill(p->x, T * k);
    fill(p->dy, T * n);
    fill(p->init, big);
    for (int64_t i = 0; i < n * k; i++) {
        if (wt == TP_BF16) {
            ((uint16_t *)p->W.data)[i] = tp_bf16_from_f32(p->wf[i]);
            p->wf[i] = tp_f32_from_bf16(((uint16_t *)p->W.data)[i]);
        } else {
            ((float *)p->W.data)[i] = p->wf[i];
        }
    }
    return 1;
}

static void problem_free(problem *p)
{
    tp_tensor_release(&p->W);
    free(p->wf); free(p->x); free(p->dy); free(p->init);
}

static int64_t out_size(const problem *p, int layout)
{
    return layout == FWD ? p->T * p->n : layout == DX ? p->T * p->k : p->n * p->k;
}

/* One layout on one path: out gets the result. */
static tp_status run(const problem *p, int layout, tp_kernel_path path, tp_threadpool *pool, float *out)
{
    tp_matmul_opts o = {path, 0, 0, 0};
    if (layout == FWD) return tp_matmul_ex(out, p->x, p->T, &p->W, NULL, pool, &o);
    memcpy(out, p->init, (size_t)out_size(p, layout) * sizeof(float));
    if (layout == DX) return tp_matmul_backward_ex(out, NULL, NULL, p->dy, p->x, p->T, &p->W, pool, &o);
    return tp_matmul_backward_ex(NULL, out, NULL, p->dy, p->x, p->T, &p->W, pool, &o);
}

/* The largest |got − exact| / (Σ|terms| + |initial value|) over out. */
static double rel_error(const problem *p, int layout, const float *out)
{
    int64_t T = p->T, n = p->n, k = p->k;
    int64_t rows = layout == DW ? n : T, cols = layout == FWD ? n : k, depth = layout == FWD ? k : layout == DX ? n : T;
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double s = layout == FWD ? 0 : p->init[r * cols + c], mag = fabs(s);
            for (int64_t d = 0; d < depth; d++) {
                double t = layout == FWD ? (double)p->x[r * k + d] * p->wf[c * k + d]
                         : layout == DX  ? (double)p->dy[r * n + d] * p->wf[d * k + c]
                                         : (double)p->dy[d * n + r] * p->x[d * k + c];
                s += t;
                mag += fabs(t);
            }
            double e = fabs(out[r * cols + c] - s) / (mag > 0 ? mag : 1);
            if (!(e <= worst)) worst = e;   /* NaN counts as the worst */
        }
    return worst;
}

static void check_shape(tp_threadpool *pools[3], int64_t T, int64_t n, int64_t k, tp_dtype wt)
{
    problem p;
    if (!problem_init(&p, T, n, k, wt)) { CHECK(!"out of memory"); problem_free(&p); return; }
    int64_t big = T * n > T * k ? T * n : T * k;
    if (n * k > big) big = n * k;
    float *out[3] = {malloc((size_t)big * sizeof(float)), malloc((size_t)big * sizeof(float)),
                     malloc((size_t)big * sizeof(float))};
    for (int pi = 0; pi < 3 && out[0] && out[1] && out[2]; pi++) {
        if (!tp_kernel_path_supported(PATHS[pi])) continue;
        for (int l = 0; l < NLAYOUT; l++) {
            for (int th = 0; th < 3; th++) CHECK(run(&p, l, PATHS[pi], pools[th], out[th]) == TP_OK);
            double e = rel_error(&p, l, out[0]);
            CHECK_MSG(e <= 1e-6, "%s %s %s T=%lld n=%lld k=%lld rel err %.3g", tp_kernel_path_name(PATHS[pi]),
                      LAYOUT[l], tp_dtype_name(wt), (long long)T, (long long)n, (long long)k, e);
            size_t bytes = (size_t)out_size(&p, l) * sizeof(float);
            for (int th = 1; th < 3; th++)
                CHECK_MSG(!memcmp(out[0], out[th], bytes), "%s %s %s T=%lld n=%lld k=%lld: %d threads differ from 1",
                          tp_kernel_path_name(PATHS[pi]), LAYOUT[l], tp_dtype_name(wt), (long long)T, (long long)n,
                          (long long)k, th + 1);
        }
    }
    for (int i = 0; i < 3; i++) free(out[i]);
    problem_free(&p);
}

static void test_layouts(tp_threadpool *pools[3])
{
    static const int64_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 13, 40};
    static const int64_t NK[][2] = {{1, 1}, {5, 1}, {17, 1}, {3, 9}, {37, 19}, {16, 16}, {50, 300}, {130, 517}};
    for (size_t t = 0; t < sizeof Ts / sizeof *Ts; t++)
        for (size_t s = 0; s < sizeof NK / sizeof *NK; s++)
            for (int bf = 0; bf < 2; bf++) check_shape(pools, Ts[t], NK[s][0], NK[s][1], bf ? TP_BF16 : TP_F32);
    check_shape(pools, 70, 301, 600, TP_F32);   /* several KC blocks */
}

#if TP_KERNELS_X86
/* The driver with tiny blocks, so that every loop (NC, KC, MC) runs several
 * times on small sizes; each element must still match the big blocks'
 * result bitwise, since only the order within KC decides the sum. */
static void test_small_blocks(tp_threadpool *pools[3])
{
    if (!tp_kernel_path_supported(TP_KERNEL_AVX2)) return;
    tp_gemm_ukernel small = tp_gemm_ukernel_avx2;
    small.mc = 12, small.nc = 32, small.nc_l2 = 0;   /* the jc-outer loop order */
    int64_t m = 45, n = 77, k = 70;
    float *a = malloc((size_t)(m * k) * sizeof(float)), *b = malloc((size_t)(k * n) * sizeof(float));
    float *c[4];
    for (int i = 0; i < 4; i++) c[i] = malloc((size_t)(m * n) * sizeof(float));
    if (!a || !b || !c[0] || !c[1] || !c[2] || !c[3]) { CHECK(!"out of memory"); goto done; }
    fill(a, m * k);
    fill(b, k * n);
    tp_gemm_operand oa = {a, TP_F32, k, 1, 0}, ob = {b, TP_F32, n, 1, 0};
    CHECK(tp_gemm_packed(&tp_gemm_ukernel_avx2, c[3], n, 0, m, n, k, &oa, &ob, NULL) == TP_OK);
    for (int th = 0; th < 3; th++) {
        CHECK(tp_gemm_packed(&small, c[th], n, 0, m, n, k, &oa, &ob, pools[th]) == TP_OK);
        CHECK(!memcmp(c[th], c[3], (size_t)(m * n) * sizeof(float)));
    }
    /* A packed whole per KC block (pc outermost), B panels of 32 columns. */
    small.nc_l2 = 32;
    for (int th = 0; th < 3; th++) {
        CHECK(tp_gemm_packed(&small, c[th], n, 0, m, n, k, &oa, &ob, pools[th]) == TP_OK);
        CHECK(!memcmp(c[th], c[3], (size_t)(m * n) * sizeof(float)));
    }
    small.nc_l2 = 0;
    /* The AVX2 packing of A (6-row panels by 8 × 8 transposes, k = 70 has a
     * tail of 6) gives the generic packing's values: the same bits. */
    tp_gemm_ukernel generic = tp_gemm_ukernel_avx2;
    generic.pack_a = NULL;
    CHECK(tp_gemm_packed(&generic, c[0], n, 0, m, n, k, &oa, &ob, pools[1]) == TP_OK);
    CHECK(!memcmp(c[0], c[3], (size_t)(m * n) * sizeof(float)));
    /* kc = 7 changes the order (10 blocks), so compare with a tolerance. */
    small.kc = 7;
    CHECK(tp_gemm_packed(&small, c[0], n, 0, m, n, k, &oa, &ob, pools[2]) == TP_OK);
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
                s += (double)a[i * k + p] * b[p * n + j];
                mag += fabs((double)a[i * k + p] * b[p * n + j]);
            }
            double e = fabs(c[0][i * n + j] - s) / mag;
            if (!(e <= worst)) worst = e;
        }
    CHECK_MSG(worst <= 1e-6, "kc = 7: rel err %.3g", worst);
done:
    free(a); free(b);
    for (int i = 0; i < 4; i++) free(c[i]);
}
#endif

int main(void)
{
    tp_rng_seed(&rng, 1234);
    print_skipped_paths("test_gemm");
    tp_threadpool *pools[3] = {NULL, NULL, NULL};
    if (tp_threadpool_create(&pools[1], 2) || tp_threadpool_create(&pools[2], 3)) {
        CHECK(!"thread pools");
        return check_summary();
    }
    test_layouts(pools);
#if TP_KERNELS_X86
    test_small_blocks(pools);
#endif
    tp_threadpool_destroy(pools[1]);
    tp_threadpool_destroy(pools[2]);
    return check_summary();
}
