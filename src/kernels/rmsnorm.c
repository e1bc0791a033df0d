/* RMSNorm as Transformers computes it: x·rsqrt(mean(x²) + eps), then times
 * the weight.  The mean is accumulated in double on every path so that the
 * result barely depends on the order of the sum (TP ranks must agree bit for
 * bit: they run the same path on the same data, hence the same order); the
 * scaling is (x·inv)·w in f32 without FMA, exactly as the scalar loop. */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <math.h>
#include <stdlib.h>

static void rmsnorm_scalar(float *out, const float *x, const float *w, int64_t rows, int64_t n, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
        float *o = out + r * n;
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

#if TP_KERNELS_X86
TP_T512 static void rmsnorm_avx512(float *out, const float *x, const float *w, int64_t rows, int64_t n, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
        for (int64_t i = 0; i < n; i += 16) {
            __m512 v = _mm512_maskz_loadu_ps(tp_mask16(n - i), xr + i);
            __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
            s0 = _mm512_fmadd_pd(lo, lo, s0);
            s1 = _mm512_fmadd_pd(hi, hi, s1);
        }
        double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
        __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt(ss / (double)n + eps)));
        float *o = out + r * n;
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = tp_mask16(n - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv);
            _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v));
        }
    }
}

TP_TAVX2 static void rmsnorm_avx2(float *out, const float *x, const float *w, int64_t rows, int64_t n, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            s0 = _mm256_fmadd_pd(lo, lo, s0);
            s1 = _mm256_fmadd_pd(hi, hi, s1);
        }
        double ss = tp_hsum256d(_mm256_add_pd(s0, s1));
        for (; i < n; i++) ss += (double)xr[i] * xr[i];
        float invs = (float)(1.0 / sqrt(ss / (double)n + eps));
        __m256 inv = _mm256_set1_ps(invs);
        float *o = out + r * n;
        for (i = 0; i + 8 <= n; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv)));
        for (; i < n; i++) o[i] = w[i] * (xr[i] * invs);
    }
}
#endif

void tp_rmsnorm_path(tp_kernel_path p, float *out, const float *x, const float *w,
                     int64_t rows, int64_t n, double eps)
{
    switch (tp_kernel_resolve(p)) {
#if TP_KERNELS_X86
    case TP_KERNEL_AVX512: rmsnorm_avx512(out, x, w, rows, n, eps); break;
    case TP_KERNEL_AVX2: rmsnorm_avx2(out, x, w, rows, n, eps); break;
#endif
    default: rmsnorm_scalar(out, x, w, rows, n, eps); break;
    }
}

/* The weight as f32: on the stack when it is small (the usual case: hidden
 * size or head_dim), else from malloc. */
#define W_STACK 8192

void tp_rmsnorm(float *out, const float *x, const tp_tensor *w, int64_t rows, int64_t n, double eps)
{
    float stack[W_STACK], *wf = stack;
    if (w->dtype == TP_F32) {
        wf = w->data;
    } else {
        if (n > W_STACK && !(wf = malloc((size_t)n * sizeof(float)))) return;
        tp_row_to_f32(wf, w, 0);
    }
    tp_rmsnorm_path(TP_KERNEL_AUTO, out, x, wf, rows, n, eps);
    if (wf != stack && wf != w->data) free(wf);
}

void tp_add_rmsnorm(float *x, const float *y, float *out, const tp_tensor *w,
                    int64_t rows, int64_t n, double eps)
{
    float stack[W_STACK], *wf = stack;
    if (w->dtype == TP_F32) {
        wf = w->data;
    } else {
        if (n > W_STACK && !(wf = malloc((size_t)n * sizeof(float)))) return;
        tp_row_to_f32(wf, w, 0);
    }
    /* Row by row, so the freshly added row is still in L1 when it is normed. */
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * n;
        const float *yr = y + r * n;
        for (int64_t i = 0; i < n; i++) xr[i] += yr[i];
        tp_rmsnorm_path(TP_KERNEL_AUTO, out + r * n, xr, wf, 1, n, eps);
    }
    if (wf != stack && wf != w->data) free(wf);
}

/* ---- backward ---------------------------------------------------------
 * With r = 1/sqrt(mean(x²) + eps) and y_i = w_i·x_i·r, per row:
 *   dw_i += dy_i·x_i·r
 *   dx_j += r·w_j·dy_j − x_j·r³/n · Σ_i w_i·dy_i·x_i
 * (r depends on every x_j, hence the second term, a projection that
 * removes the part of the gradient along x).  The row sums run in double,
 * like the forward's mean; each row's terms are added in index order, so
 * the result depends on neither the path nor the thread count.  dw is
 * summed over the rows in row order, which is what makes Qwen3's per-head
 * q/k norms (rows = T·heads, n = head_dim) collect one gradient. */
static void rmsnorm_backward_rows(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                  int64_t rows, int64_t n, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n, *g = dy + r * n;
        double ss = 0, dot = 0;
        for (int64_t i = 0; i < n; i++) {
            ss += (double)xr[i] * xr[i];
            dot += (double)w[i] * g[i] * xr[i];
        }
        double inv = 1.0 / sqrt(ss / (double)n + eps);
        double c = dot * inv * inv * inv / (double)n;
        if (dx) {
            float *o = dx + r * n;
            for (int64_t i = 0; i < n; i++) o[i] += (float)(inv * w[i] * g[i] - c * xr[i]);
        }
        if (dw)
            for (int64_t i = 0; i < n; i++) dw[i] += (float)((double)g[i] * xr[i] * inv);
    }
}

tp_status tp_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const tp_tensor *w,
                              int64_t rows, int64_t n, double eps)
{
    if (w->dtype != TP_F32 && w->dtype != TP_BF16)
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_rmsnorm_backward: weight of dtype %s", tp_dtype_name(w->dtype));
    float stack[W_STACK], *wf = stack;
    if (w->dtype == TP_F32) {
        wf = w->data;
    } else {
        if (n > W_STACK && !(wf = malloc((size_t)n * sizeof(float))))
            return tp_fail(TP_ERR_NOMEM, "tp_rmsnorm_backward: out of memory");
        tp_row_to_f32(wf, w, 0);
    }
    rmsnorm_backward_rows(dx, dw, dy, x, wf, rows, n, eps);
    if (wf != stack && wf != w->data) free(wf);
    return TP_OK;
}
