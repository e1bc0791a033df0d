/* kernels/: every fast path against the scalar reference (or a double
 * reference) on random inputs with awkward sizes.  Each path the CPU can
 * run is forced in turn through the *_path functions and tp_matmul_ex. */
#include "check.h"
#include "matmul_err.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"
#include "skip_paths.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tp_rng rng;

static void fill(float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * tp_rng_normal(&rng));
}

static const tp_kernel_path PATHS[] = {TP_KERNEL_SCALAR, TP_KERNEL_AVX2, TP_KERNEL_AVX512};

/* ---- matmul ----------------------------------------------------------- */


static double worst_exact[4], worst_dot[4];

/* bf16_dot where the path has no vdpbf16ps: x rounded to bf16 first, then
 * the exact product (matmul.c), so y must be bitwise the exact product of
 * the rounded x. */
static int dot_emulated(tp_kernel_path p)
{
    return p != TP_KERNEL_AVX512 || !tp_kernel_has_bf16_dot();
}

static void check_emulated(tp_threadpool *pool, const float *y, const float *x, int64_t T, const tp_tensor *W,
                           const tp_tensor *B, tp_kernel_path path)
{
    int64_t n = W->shape[0], k = W->shape[1];
    float *xr = malloc((size_t)(T * k + 1) * sizeof(float)), *ye = malloc((size_t)(T * n + 1) * sizeof(float));
    if (!xr || !ye) {
        CHECK(!"out of memory");
    } else {
        for (int64_t i = 0; i < T * k; i++) xr[i] = tp_f32_from_bf16(tp_bf16_from_f32(x[i]));
        tp_matmul_opts exact = {path, 0, 0, 0};
        CHECK(tp_matmul_ex(ye, xr, T, W, B, pool, &exact) == TP_OK);
        CHECK_MSG(!memcmp(y, ye, (size_t)(T * n) * sizeof(float)), "%s bf16-dot T=%lld n=%lld k=%lld: not the exact "
                  "product of x rounded to bf16", tp_kernel_path_name(path), (long long)T, (long long)n, (long long)k);
    }
    free(xr);
    free(ye);
}

static void check_matmul(tp_threadpool *pool, int64_t T, int64_t n, int64_t k, tp_dtype wt, int with_bias)
{
    float *x = malloc((size_t)(T * k + 1) * sizeof(float));
    float *wf = malloc((size_t)(n * k + 1) * sizeof(float));
    float *y = malloc((size_t)(T * n + 1) * sizeof(float));
    float *b = malloc((size_t)n * sizeof(float));
    tp_tensor W = {0}, B = {0};
    int64_t ws[2] = {n, k}, bs[1] = {n};
    if (!x || !wf || !y || !b || tp_tensor_init(&W, wt, 2, ws) || tp_tensor_init(&B, TP_F32, 1, bs)) {
        CHECK(!"out of memory");
        goto done;
    }
    fill(x, T * k, 1.0);
    fill(wf, n * k, 0.5);
    fill(b, n, 1.0);
    if (wt == TP_BF16) {   /* the reference uses the exact bf16 values */
        for (int64_t i = 0; i < n * k; i++) {
            ((uint16_t *)W.data)[i] = tp_bf16_from_f32(wf[i]);
            wf[i] = tp_f32_from_bf16(((uint16_t *)W.data)[i]);
        }
    } else {
        memcpy(W.data, wf, (size_t)(n * k) * sizeof(float));
    }
    memcpy(B.data, b, (size_t)n * sizeof(float));
    for (int pi = 0; pi < 3; pi++) {
        if (!tp_kernel_path_supported(PATHS[pi])) continue;
        for (int dot = 0; dot < 2; dot++) {
            if (dot && wt != TP_BF16) continue;   /* bf16_dot leaves f32 weights alone (below) */
            tp_matmul_opts o = {PATHS[pi], dot, 0, 0};
            for (int64_t i = 0; i < T * n; i++) y[i] = NAN;
            CHECK(tp_matmul_ex(y, x, T, &W, with_bias ? &B : NULL, pool, &o) == TP_OK);
            double e = matmul_err(y, x, wf, with_bias ? b : NULL, T, n, k);
            if (dot) {
                /* x rounded to bf16 (8 significant bits): each product off by <= 2^-8 relative. */
                if (e > worst_dot[PATHS[pi]]) worst_dot[PATHS[pi]] = e;
                if (dot_emulated(PATHS[pi])) check_emulated(pool, y, x, T, &W, with_bias ? &B : NULL, PATHS[pi]);
                if (getenv("TK_DEBUG")) printf("dot T=%lld n=%lld k=%lld err %.3g\n", (long long)T, (long long)n, (long long)k, e);
                CHECK_MSG(e <= 0x1p-8 + 1e-6, "bf16-dot T=%lld n=%lld k=%lld err %.3g", (long long)T, (long long)n, (long long)k, e);
            } else {
                if (e > worst_exact[PATHS[pi]]) worst_exact[PATHS[pi]] = e;
                CHECK_MSG(e <= 1e-6, "%s %s T=%lld n=%lld k=%lld bias=%d err %.3g", tp_kernel_path_name(PATHS[pi]),
                          tp_dtype_name(wt), (long long)T, (long long)n, (long long)k, with_bias, e);
            }
            if (!dot && wt == TP_F32) {   /* f32 weights: bf16_dot changes nothing */
                float *y2 = malloc((size_t)(T * n + 1) * sizeof(float));
                tp_matmul_opts od = {PATHS[pi], 1, 0, 0};
                CHECK(y2 && tp_matmul_ex(y2, x, T, &W, with_bias ? &B : NULL, pool, &od) == TP_OK);
                CHECK_MSG(y2 && !memcmp(y, y2, (size_t)(T * n) * sizeof(float)), "%s f32 weights: bf16_dot changed y",
                          tp_kernel_path_name(PATHS[pi]));
                free(y2);
            }
        }
    }
done:
    tp_tensor_release(&W);
    tp_tensor_release(&B);
    free(x); free(wf); free(y); free(b);
}

static void test_matmul(tp_threadpool *pool)
{
    static const int64_t Ts[] = {1, 2, 3, 4, 5, 7, 13, 17, 64};
    static const int64_t NK[][2] = {{1, 1}, {7, 129}, {129, 7}, {33, 31}, {40, 1025}, {65, 300}, {3, 513}};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t c = 0; c < sizeof NK / sizeof *NK; c++)
            for (int wt = 0; wt < 2; wt++)
                check_matmul(pool, Ts[a], NK[c][0], NK[c][1], wt ? TP_BF16 : TP_F32, (int)((a + c) & 1));
    check_matmul(pool, 1, 1025, 64, TP_BF16, 1);
    check_matmul(pool, 129, 97, 260, TP_F32, 0);
    check_matmul(pool, 129, 97, 261, TP_BF16, 1);
    /* The AVX-512 GEMM's packing: several panels and slices per thread, K
     * blocks with a short last one (kc 8, then 1: below one 16-wide step of
     * the transposes and one 8-step of the kernel), a single column, more
     * rows than one pass takes.  On a stream of their own, so the tests
     * after these see the inputs they always saw. */
    tp_rng saved = rng;
    tp_rng_seed(&rng, 99);
    check_matmul(pool, 37, 300, 520, TP_F32, 1);
    check_matmul(pool, 37, 300, 520, TP_BF16, 0);
    check_matmul(pool, 129, 65, 1025, TP_F32, 0);
    check_matmul(pool, 25, 1, 7, TP_F32, 0);
    check_matmul(pool, 1100, 33, 300, TP_F32, 1);   /* two passes over the rows */
    rng = saved;
    printf("matmul max |err| / sum|x*w|:");
    for (int pi = 0; pi < 3; pi++)
        if (tp_kernel_path_supported(PATHS[pi])) printf(" %s %.2g", tp_kernel_path_name(PATHS[pi]), worst_exact[PATHS[pi]]);
    printf("; bf16-dot:");
    for (int pi = 0; pi < 3; pi++)
        if (tp_kernel_path_supported(PATHS[pi]))
            printf(" %s%s %.2g", tp_kernel_path_name(PATHS[pi]), dot_emulated(PATHS[pi]) ? " (emulated)" : "",
                   worst_dot[PATHS[pi]]);
    printf(" (other paths not run)\n");
}

/* The GEMM's threads split the columns of y, so every element is summed in
 * the same order on any number of threads: the bits must match (f32
 * weights on each SIMD path; bf16 weights through vdpbf16ps where the CPU
 * has it, k odd so that the last K block ends on half a pair). */
static void test_matmul_threads_bitwise(tp_threadpool *pool)
{
    int64_t T = 53, n = 200, k = 777;
    float *x = malloc((size_t)(T * k) * sizeof(float)), *y1 = malloc((size_t)(T * n) * sizeof(float));
    float *y3 = malloc((size_t)(T * n) * sizeof(float));
    tp_tensor W = {0}, Wb = {0};
    int64_t ws[2] = {n, k};
    tp_rng saved = rng;   /* as in test_matmul: leave the shared stream alone */
    tp_rng_seed(&rng, 98);
    if (!x || !y1 || !y3 || tp_tensor_init(&W, TP_F32, 2, ws) || tp_tensor_init(&Wb, TP_BF16, 2, ws)) {
        CHECK(!"out of memory");
    } else {
        fill(x, T * k, 1.0);
        fill(W.data, n * k, 0.5);
        for (int64_t i = 0; i < n * k; i++) ((uint16_t *)Wb.data)[i] = tp_bf16_from_f32(((float *)W.data)[i]);
        for (int pi = 1; pi < 4; pi++) {   /* 3: AVX-512 with bf16_dot (emulated without AVX512_BF16) */
            tp_kernel_path path = PATHS[pi < 3 ? pi : 2];
            int dot = pi == 3;
            if (!tp_kernel_path_supported(path)) continue;
            tp_matmul_opts o = {path, dot, 0, 0};
            const tp_tensor *w = dot ? &Wb : &W;
            CHECK(tp_matmul_ex(y1, x, T, w, NULL, NULL, &o) == TP_OK);
            CHECK(tp_matmul_ex(y3, x, T, w, NULL, pool, &o) == TP_OK);
            CHECK_MSG(!memcmp(y1, y3, (size_t)(T * n) * sizeof(float)), "%s%s GEMM: 1 and %d threads differ",
                      tp_kernel_path_name(path), dot ? " bf16-dot" : "", tp_threadpool_size(pool));
        }
    }
    rng = saved;
    tp_tensor_release(&W);
    tp_tensor_release(&Wb);
    free(x); free(y1); free(y3);
}

/* The GEMV's threads take chunks of rows as they come (tp_parallel_for), so
 * which thread sums a row changes from call to call, never how: the bits
 * of 1 and of several threads, repeated, on rows enough for many chunks
 * (decode's k; a remainder of rows after the last whole chunk). */
static void test_gemv_threads_bitwise(tp_threadpool *pool)
{
    int64_t n = 1100, k = 2048;
    float *x = malloc((size_t)(TP_GEMV_MAX_T * k) * sizeof(float));
    float *y1 = malloc((size_t)(TP_GEMV_MAX_T * n) * sizeof(float));
    float *yn = malloc((size_t)(TP_GEMV_MAX_T * n) * sizeof(float));
    tp_tensor W = {0}, Wb = {0};
    int64_t ws[2] = {n, k};
    tp_rng saved = rng;
    tp_rng_seed(&rng, 99);
    if (!x || !y1 || !yn || tp_tensor_init(&W, TP_F32, 2, ws) || tp_tensor_init(&Wb, TP_BF16, 2, ws)) {
        CHECK(!"out of memory");
    } else {
        fill(x, TP_GEMV_MAX_T * k, 1.0);
        fill(W.data, n * k, 0.5);
        for (int64_t i = 0; i < n * k; i++) ((uint16_t *)Wb.data)[i] = tp_bf16_from_f32(((float *)W.data)[i]);
        for (int pi = 0; pi < 4; pi++)
            for (int bf = 0; bf < 2; bf++)
                for (int64_t T = 1; T <= TP_GEMV_MAX_T; T += 2) {
                    tp_kernel_path path = PATHS[pi < 3 ? pi : 2];
                    int dot = pi == 3;
                    if (!tp_kernel_path_supported(path) || (dot && (!bf || !tp_kernel_has_bf16_dot()))) continue;
                    tp_matmul_opts o = {path, dot, 0, 0};
                    const tp_tensor *w = bf ? &Wb : &W;
                    CHECK(tp_matmul_ex(y1, x, T, w, NULL, NULL, &o) == TP_OK);
                    int same = 1;
                    for (int rep = 0; rep < 5; rep++) {
                        memset(yn, 0xff, (size_t)(T * n) * sizeof(float));
                        CHECK(tp_matmul_ex(yn, x, T, w, NULL, pool, &o) == TP_OK);
                        same &= !memcmp(y1, yn, (size_t)(T * n) * sizeof(float));
                    }
                    CHECK_MSG(same, "%s%s %s GEMV T=%lld: 1 and %d threads differ", tp_kernel_path_name(path),
                              dot ? " bf16-dot" : "", bf ? "bf16" : "f32", (long long)T, tp_threadpool_size(pool));
                }
    }
    rng = saved;
    tp_tensor_release(&W);
    tp_tensor_release(&Wb);
    free(x); free(y1); free(yn);
}

/* tp_matmul_group packs x once for several weights; each output must be
 * bitwise what tp_matmul_ex gives for its weight alone, on every path and
 * dtype (AMX for bf16 where the CPU has it), for prompts of one row pass
 * and of several (T > 1032), with a bias on one weight, and for a group
 * whose input widths differ (computed one by one). */
static void check_group(tp_threadpool *pool, const tp_matmul_opts *o, tp_dtype wt, int64_t T, int64_t k,
                        int64_t k_last)
{
    enum { NW = 3 };
    const int64_t ns[NW] = {40, 17, 200};
    tp_tensor W[NW] = {{0}}, B = {0};
    float *x = malloc((size_t)(T * (k > k_last ? k : k_last)) * sizeof(float)), *yg[NW], *y1[NW];
    int ok = x != NULL && tp_tensor_init(&B, TP_F32, 1, &ns[1]) == TP_OK;
    for (int i = 0; i < NW; i++) {
        int64_t shape[2] = {ns[i], i == NW - 1 ? k_last : k}, numel = ns[i] * shape[1];
        yg[i] = malloc((size_t)(T * ns[i]) * sizeof(float));
        y1[i] = malloc((size_t)(T * ns[i]) * sizeof(float));
        float *wf = malloc((size_t)numel * sizeof(float));
        ok = ok && yg[i] && y1[i] && wf && tp_tensor_init(&W[i], wt, 2, shape) == TP_OK;
        if (ok) fill(wf, numel, 0.5);
        for (int64_t e = 0; ok && e < numel; e++) {
            if (wt == TP_BF16) ((uint16_t *)W[i].data)[e] = tp_bf16_from_f32(wf[e]);
            else ((float *)W[i].data)[e] = wf[e];
        }
        free(wf);
    }
    if (!ok) {
        CHECK(!"out of memory");
    } else {
        fill(x, T * (k > k_last ? k : k_last), 1.0);
        fill(B.data, ns[1], 1.0);
        tp_matmul_out outs[NW];
        for (int i = 0; i < NW; i++) {
            const tp_tensor *bias = i == 1 ? &B : NULL;
            outs[i] = (tp_matmul_out){yg[i], &W[i], bias};
            CHECK(tp_matmul_ex(y1[i], x, T, &W[i], bias, pool, o) == TP_OK);
        }
        CHECK(tp_matmul_group(outs, NW, x, T, pool, o) == TP_OK);
        for (int i = 0; i < NW; i++)
            CHECK_MSG(!memcmp(yg[i], y1[i], (size_t)(T * ns[i]) * sizeof(float)),
                      "%s %s amx=%d dot=%d T=%lld k=%lld/%lld: weight %d of the group differs from its own call",
                      tp_kernel_path_name(o->path), tp_dtype_name(wt), o->amx, o->bf16_dot, (long long)T, (long long)k,
                      (long long)k_last, i);
    }
    for (int i = 0; i < NW; i++) { tp_tensor_release(&W[i]); free(yg[i]); free(y1[i]); }
    tp_tensor_release(&B);
    free(x);
}

static void test_matmul_group(tp_threadpool *pool)
{
    tp_rng saved = rng;
    tp_rng_seed(&rng, 77);
    const int64_t Ts[] = {1, 3, 7, 53, 1100};
    for (int pi = 0; pi < 3; pi++) {
        if (!tp_kernel_path_supported(PATHS[pi])) continue;
        for (int amx = 0; amx < 2; amx++)
            for (int d = 0; d < 3; d++) {   /* f32, bf16, bf16 with bf16_dot (vdpbf16ps, or emulated) */
                for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
                    tp_matmul_opts o = {PATHS[pi], d == 2, 0, amx};
                    check_group(pool, &o, d ? TP_BF16 : TP_F32, Ts[t], 129, 129);
                    if (t == 3) check_group(pool, &o, d ? TP_BF16 : TP_F32, Ts[t], 129, 64);
                }
            }
    }
    rng = saved;
}

/* GEMV shapes that the small ones above miss: enough rows for the thread
 * split to cut at 4 KiB pages (rows of 2304 bytes: a block of rows is not a
 * whole number of pages), a remainder of single rows after the blocks, and
 * decode's k. */
static void test_gemv_split(tp_threadpool *pool)
{
    for (int64_t T = 1; T <= TP_GEMV_MAX_T; T++) {
        check_matmul(pool, T, 803, 1152, TP_BF16, (int)(T & 1));
        check_matmul(pool, T, 803, 576, TP_F32, 0);
        check_matmul(pool, T, 517, 1024, TP_BF16, 0);
    }
    /* T = 1 reads 4 lines of a row per step (AVX-512: 64 f32, 128 bf16) and
     * masks the rest: rows just under, at and over whole steps. */
    static const int64_t ks[] = {63, 127, 128, 191, 255, 256, 257, 383};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        check_matmul(pool, 1, 37, ks[i], TP_F32, (int)(i & 1));
        check_matmul(pool, 1, 37, ks[i], TP_BF16, (int)(~i & 1));
    }
}

/* ---- element-wise ----------------------------------------------------- */

static const int64_t SIZES[] = {1, 7, 15, 16, 17, 129, 1025};
#define NSIZES (sizeof SIZES / sizeof *SIZES)

static double max_rel(const float *a, const float *ref, int64_t n, double floor)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / (fabs(ref[i]) > floor ? fabs(ref[i]) : floor);
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

static void test_elementwise(void)
{
    float *a = malloc(4 * 1025 * sizeof(float)), *b = malloc(4 * 1025 * sizeof(float));
    float *r = malloc(4 * 1025 * sizeof(float)), *o = malloc(4 * 1025 * sizeof(float));
    float *w = malloc(1025 * sizeof(float));
    if (!a || !b || !r || !o || !w) { CHECK(!"oom"); goto done; }
    for (size_t si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        for (int pi = 1; pi < 3; pi++) {
            tp_kernel_path p = PATHS[pi];
            if (!tp_kernel_path_supported(p)) continue;
            /* silu·mul, including large |a| where exp over/underflows.  At
             * a = -100 the scalar reference is -0 (expf(100) = inf) and the
             * AVX2 path ~6e-37 (its exp saturates at e^88): 6e-7 against
             * the 1e-30 floor, times b — so b is 1 there, or the check
             * would depend on the random b (2.07e-6 with |b| = 3.5). */
            fill(a, n, 4.0);
            fill(b, n, 1.0);
            if (n > 3) { a[0] = 100.0f; a[1] = -100.0f; a[2] = 0.0f; b[0] = b[1] = b[2] = 1.0f; }
            memcpy(r, a, (size_t)n * sizeof(float));
            memcpy(o, a, (size_t)n * sizeof(float));
            tp_silu_mul_path(TP_KERNEL_SCALAR, r, b, n);
            tp_silu_mul_path(p, o, b, n);
            double e = max_rel(o, r, n, 1e-30);
            CHECK_MSG(e <= 2e-6, "silu_mul %s n=%lld err %.3g", tp_kernel_path_name(p), (long long)n, e);
            /* softmax */
            fill(a, n, 5.0);
            memcpy(r, a, (size_t)n * sizeof(float));
            memcpy(o, a, (size_t)n * sizeof(float));
            tp_softmax_path(TP_KERNEL_SCALAR, r, n);
            tp_softmax_path(p, o, n);
            e = max_rel(o, r, n, 1e-30);
            CHECK_MSG(e <= 2e-6, "softmax %s n=%lld err %.3g", tp_kernel_path_name(p), (long long)n, e);
            /* rmsnorm over 3 rows */
            fill(a, 3 * n, 2.0);
            fill(w, n, 1.0);
            tp_rmsnorm_path(TP_KERNEL_SCALAR, r, a, w, 3, n, 1e-6);
            tp_rmsnorm_path(p, o, a, w, 3, n, 1e-6);
            e = max_rel(o, r, 3 * n, 1e-30);
            CHECK_MSG(e <= 1e-6, "rmsnorm %s n=%lld err %.3g", tp_kernel_path_name(p), (long long)n, e);
        }
    }
    /* tp_add_rmsnorm == add, then tp_rmsnorm (bf16 weight) */
    {
        int64_t n = 129;
        tp_tensor wt = {0};
        int64_t s[1] = {n};
        if (tp_tensor_init(&wt, TP_BF16, 1, s) == TP_OK) {
            for (int64_t i = 0; i < n; i++) ((uint16_t *)wt.data)[i] = tp_bf16_from_f32((float)tp_rng_normal(&rng));
            fill(a, 2 * n, 1.0);
            fill(b, 2 * n, 1.0);
            memcpy(r, a, (size_t)(2 * n) * sizeof(float));
            for (int64_t i = 0; i < 2 * n; i++) r[i] += b[i];
            float *ref = malloc((size_t)(2 * n) * sizeof(float));
            if (ref) {
                tp_rmsnorm(ref, r, &wt, 2, n, 1e-5);
                tp_add_rmsnorm(a, b, o, &wt, 2, n, 1e-5);
                CHECK(memcmp(a, r, (size_t)(2 * n) * sizeof(float)) == 0);
                CHECK(memcmp(o, ref, (size_t)(2 * n) * sizeof(float)) == 0);
                free(ref);
            }
            tp_tensor_release(&wt);
        }
    }
done:
    free(a); free(b); free(r); free(o); free(w);
}

static void test_rope(void)
{
    static const int64_t dims[] = {2, 16, 18, 64, 128};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        int64_t D = dims[di], T = 17, H = 3, pos0 = 5;
        double inv[64];
        tp_rope_inv_freq(inv, D, 10000.0, 0, 1, 1, 4, 8192);
        float *x = malloc((size_t)(T * H * D) * sizeof(float)), *ref = malloc((size_t)(T * H * D) * sizeof(float));
        float *y = malloc((size_t)(T * H * D) * sizeof(float)), *tab = malloc((size_t)(T * D) * sizeof(float));
        if (!x || !ref || !y || !tab) { CHECK(!"oom"); free(x); free(ref); free(y); free(tab); return; }
        fill(x, T * H * D, 1.0);
        memcpy(ref, x, (size_t)(T * H * D) * sizeof(float));
        tp_rope_apply(ref, T, H, D, inv, pos0);
        tp_rope_table(tab, T, D, inv, pos0);
        for (int pi = 0; pi < 3; pi++) {
            if (!tp_kernel_path_supported(PATHS[pi])) continue;
            memcpy(y, x, (size_t)(T * H * D) * sizeof(float));
            tp_rope_apply_table_path(PATHS[pi], y, T, H, D, tab);
            CHECK_MSG(memcmp(y, ref, (size_t)(T * H * D) * sizeof(float)) == 0, "rope %s D=%lld not bit-exact",
                      tp_kernel_path_name(PATHS[pi]), (long long)D);
        }
        free(x); free(ref); free(y); free(tab);
    }
}

/* YaRN by hand (theta 1e4, dim 8, factor 4 over 512 positions, betas 32
 * and 1): the ramp runs over pair indices [0, 2], so the frequencies are
 * 1, (1/40 + 1/10) / 2, 1/400 and 1/4000.  DeepSeek's rotation turns the
 * pair (x[2i], x[2i+1]) (interleaved) or (x[i], x[i+half]) by angle i,
 * times the scale. */
static void test_rope_deepseek(void)
{
    double inv[4];
    tp_rope_inv_freq_yarn(inv, 8, 10000.0, 4.0, 32.0, 1.0, 512, 1);
    const double want[4] = {1.0, 0.0625, 0.0025, 0.00025};
    for (int i = 0; i < 4; i++) CHECK_MSG(fabs(inv[i] - want[i]) < 1e-15 * want[i] + 1e-18, "yarn inv_freq[%d] %g", i, inv[i]);
    CHECK(fabs(tp_yarn_mscale(40.0, 0.707) - (0.0707 * log(40.0) + 1)) < 1e-15 && tp_yarn_mscale(1.0, 5.0) == 1.0);
    /* one row of 6: a 2-wide prefix left alone, then a rotary part of 4, at position 1 */
    double f[2] = {0.5, 0.25};
    float tab[2 * 4], x[6] = {9, 9, 1, 2, 3, 4}, y[6];
    tp_rope_table(tab, 2, 4, f, 0);
    memcpy(y, x, sizeof x);
    tp_rope_apply_mla(y, 1, 1, 6, 2, 4, tab + 4, 2.0f, 1);   /* position 1, interleaved */
    float c0 = cosf(0.5f) * 2, s0 = sinf(0.5f) * 2, c1 = cosf(0.25f) * 2, s1 = sinf(0.25f) * 2;
    CHECK(y[0] == 9 && y[1] == 9);
    CHECK(fabsf(y[2] - (1 * c0 - 2 * s0)) < 1e-6f && fabsf(y[3] - (2 * c0 + 1 * s0)) < 1e-6f);
    CHECK(fabsf(y[4] - (3 * c1 - 4 * s1)) < 1e-6f && fabsf(y[5] - (4 * c1 + 3 * s1)) < 1e-6f);
    memcpy(y, x, sizeof x);
    tp_rope_apply_mla(y, 1, 1, 6, 2, 4, tab + 4, 2.0f, 0);   /* halves: pairs (1, 3) and (2, 4) */
    CHECK(fabsf(y[2] - (1 * c0 - 3 * s0)) < 1e-6f && fabsf(y[4] - (3 * c0 + 1 * s0)) < 1e-6f);
    CHECK(fabsf(y[3] - (2 * c1 - 4 * s1)) < 1e-6f && fabsf(y[5] - (4 * c1 + 2 * s1)) < 1e-6f);
}

static void test_attention(tp_threadpool *pool)
{
    static const int64_t Ts[] = {1, 3, 17, 64, 100};
    static const int64_t Ds[] = {16, 7, 64};
    double worst = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
        for (size_t di = 0; di < sizeof Ds / sizeof *Ds; di++)
            for (int pc = 0; pc < 2; pc++)
                for (int win = 0; win < 2; win++) {
                    int64_t T = Ts[ti], D = Ds[di], pos0 = pc ? 70 : 0, nh = 4, nkv = 2;
                    int64_t window = win ? 9 : 0, L = pos0 + T;
                    float *q = malloc((size_t)(T * nh * D) * sizeof(float));
                    float *k = malloc((size_t)(L * nkv * D) * sizeof(float));
                    float *v = malloc((size_t)(L * nkv * D) * sizeof(float));
                    float *r = malloc((size_t)(T * nh * D) * sizeof(float));
                    float *o = malloc((size_t)(T * nh * D) * sizeof(float));
                    if (!q || !k || !v || !r || !o) { CHECK(!"oom"); goto next; }
                    fill(q, T * nh * D, 1.0);
                    fill(k, L * nkv * D, 1.0);
                    fill(v, L * nkv * D, 1.0);
                    tp_attention_path(TP_KERNEL_SCALAR, r, q, k, v, T, pos0, nh, nkv, D, window, pool);
                    for (int pi = 1; pi < 3; pi++) {
                        if (!tp_kernel_path_supported(PATHS[pi])) continue;
                        tp_attention_path(PATHS[pi], o, q, k, v, T, pos0, nh, nkv, D, window, pool);
                        /* outputs are convex combinations of v (|v| ~ 1): absolute error */
                        double e = 0;
                        for (int64_t i = 0; i < T * nh * D; i++) {
                            double d = fabs((double)o[i] - r[i]);
                            if (!(d <= e)) e = isnan(d) ? INFINITY : d;
                        }
                        if (e > worst) worst = e;
                        CHECK_MSG(e <= 2e-6, "attention %s T=%lld D=%lld pos0=%lld window=%lld err %.3g",
                                  tp_kernel_path_name(PATHS[pi]), (long long)T, (long long)D, (long long)pos0,
                                  (long long)window, e);
                    }
                next:
                    free(q); free(k); free(v); free(r); free(o);
                }
    printf("attention max |flash - reference| %.2g\n", worst);
}

static void test_paths(void)
{
    CHECK(tp_kernel_path_supported(TP_KERNEL_SCALAR));
    CHECK(tp_kernel_resolve(TP_KERNEL_AUTO) == tp_kernel_path_default());
    printf("kernel path: ISA %s, default %s (avx2 %s, avx512 %s, bf16 dot %s)\n", tp_isa_name(tp_isa_selected()),
           tp_kernel_path_name(tp_kernel_path_default()),
           tp_kernel_path_supported(TP_KERNEL_AVX2) ? "yes" : "no",
           tp_kernel_path_supported(TP_KERNEL_AVX512) ? "yes" : "no",
           tp_kernel_has_bf16_dot() ? "yes" : "no");
    print_skipped_paths("test_kernels");
}

/* The AdamW update: every path gives the scalar loop's bits (with and
 * without decay, odd lengths, tiny and large gradients), and the scalar
 * loop equals the update written out in double-free f32 steps. */
static void test_adamw(void)
{
    enum { N = 1031 };
    float g[N], p0[N], m0[N], v0[N], pr[N], mr[N], vr[N], po[N], mo[N], vo[N];
    fill(g, N, 1e-3);
    fill(p0, N, 0.5);
    fill(m0, N, 1e-3);
    for (int i = 0; i < N; i++) v0[i] = (float)fabs(1e-6 * tp_rng_normal(&rng));
    g[0] = 0.0f, g[1] = 1e30f, g[2] = -1e-30f, v0[3] = 0.0f;
    tp_adamw_consts c = {.decay = 1.0f - 1e-3f * 0.1f, .beta1 = 0.9f, .one_minus_beta1 = 0.1f, .beta2 = 0.999f,
                         .one_minus_beta2 = (float)(1 - 0.999), .bc2_sqrt = (float)sqrt(1 - 0.999 * 0.999),
                         .eps = 1e-8f, .neg_step_size = (float)-(1e-3 / (1 - 0.9 * 0.9))};
    for (int decay = 0; decay < 2; decay++)
        for (int pi = 0; pi < 3; pi++) {
            tp_kernel_path path = PATHS[pi];
            if (!tp_kernel_path_supported(path)) continue;
            for (int64_t n = 1; n <= N; n += n < 20 ? 1 : 337) {
                memcpy(pr, p0, sizeof pr), memcpy(mr, m0, sizeof mr), memcpy(vr, v0, sizeof vr);
                memcpy(po, p0, sizeof po), memcpy(mo, m0, sizeof mo), memcpy(vo, v0, sizeof vo);
                for (int64_t i = 0; i < n; i++) {   /* the formula, one rounding per operation */
                    volatile float pi_ = decay ? pr[i] * c.decay : pr[i];
                    volatile float a = mr[i] * c.beta1, b = c.one_minus_beta1 * g[i];
                    mr[i] = a + b;
                    volatile float d = vr[i] * c.beta2, e = c.one_minus_beta2 * g[i];
                    volatile float f = e * g[i];
                    vr[i] = d + f;
                    volatile float q = sqrtf(vr[i]) / c.bc2_sqrt;
                    volatile float den = q + c.eps, num = c.neg_step_size * mr[i];
                    volatile float upd = num / den;
                    pr[i] = pi_ + upd;
                }
                tp_adamw_update_path(path, &c, decay, po, g, mo, vo, n);
                CHECK_MSG(!memcmp(po, pr, sizeof po) && !memcmp(mo, mr, sizeof mo) && !memcmp(vo, vr, sizeof vo),
                          "adamw %s n=%lld decay=%d differs from the formula's bits", tp_kernel_path_name(path),
                          (long long)n, decay);
            }
        }
}

int main(void)
{
    tp_rng_seed(&rng, 1234);
    tp_threadpool *pool3 = NULL;
    CHECK(tp_threadpool_create(&pool3, 3) == TP_OK);
    test_paths();
    test_matmul(NULL);
    test_matmul(pool3);
    test_matmul_threads_bitwise(pool3);
    test_gemv_threads_bitwise(pool3);
    test_matmul_group(NULL);
    test_matmul_group(pool3);
    test_gemv_split(NULL);
    test_gemv_split(pool3);
    test_elementwise();
    test_adamw();
    test_rope();
    test_rope_deepseek();
    test_attention(NULL);
    test_attention(pool3);
    tp_threadpool_destroy(pool3);
    return check_summary();
}
