/* The gated MLP's activation and the softmax, each as the scalar reference
 * and AVX-512 / AVX2 paths (exp from vmath.h, ~1 ulp). */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <math.h>

/* ---- silu(a) * b ------------------------------------------------------ */

static void silu_mul_scalar(float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

#if TP_KERNELS_X86
TP_T512 static void silu_mul_avx512(float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tp_mask16(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, a + i);
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), tp_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, b + i)));
    }
}

TP_TAVX2 static void silu_mul_avx2(float *a, const float *b, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), tp_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(b + i)));
    }
    silu_mul_scalar(a + i, b + i, n - i);
}
#endif

void tp_silu_mul_path(tp_kernel_path p, float *a, const float *b, int64_t n)
{
    switch (tp_kernel_resolve(p)) {
#if TP_KERNELS_X86
    case TP_KERNEL_AVX512: silu_mul_avx512(a, b, n); break;
    case TP_KERNEL_AVX2: silu_mul_avx2(a, b, n); break;
#endif
    default: silu_mul_scalar(a, b, n); break;
    }
}

void tp_silu_mul(float *a, const float *b, int64_t n) { tp_silu_mul_path(TP_KERNEL_AUTO, a, b, n); }

/* ---- softmax ---------------------------------------------------------- */
/* max, then exp(x - max) summed in double (as the reference does), then
 * one scale. */

static void softmax_scalar(float *x, int64_t n)
{
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) { x[i] = expf(x[i] - mx); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

#if TP_KERNELS_X86
TP_T512 static void softmax_avx512(float *x, int64_t n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tp_mask16(n - i), x + i));
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tp_mask16(n - i);
        __m512 e = _mm512_maskz_mov_ps(k, tp_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m)));
        _mm512_mask_storeu_ps(x + i, k, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tp_mask16(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
    }
}

TP_TAVX2 static void softmax_avx2(float *x, int64_t n)
{
    int64_t n8 = n / 8 * 8;
    float mxs = x[0];
    __m256 mx = _mm256_set1_ps(x[0]);
    for (int64_t i = 0; i < n8; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
    if (n8) mxs = tp_hmax256(mx);
    for (int64_t i = n8; i < n; i++) if (x[i] > mxs) mxs = x[i];
    __m256 m = _mm256_set1_ps(mxs);
    __m256d s = _mm256_setzero_pd();
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 e = tp_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_pd(s, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                           _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
    }
    double sum = tp_hsum256d(s);
    for (int64_t i = n8; i < n; i++) { x[i] = expf(x[i] - mxs); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    __m256 iv = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
    for (int64_t i = n8; i < n; i++) x[i] *= inv;
}
#endif

void tp_softmax_path(tp_kernel_path p, float *x, int64_t n)
{
    if (n <= 0) return;
    switch (tp_kernel_resolve(p)) {
#if TP_KERNELS_X86
    case TP_KERNEL_AVX512: softmax_avx512(x, n); break;
    case TP_KERNEL_AVX2: softmax_avx2(x, n); break;
#endif
    default: softmax_scalar(x, n); break;
    }
}

void tp_softmax(float *x, int64_t n) { tp_softmax_path(TP_KERNEL_AUTO, x, n); }

/* ---- silu(a) * b backward ------------------------------------------------
 * With σ = sigmoid(a), silu(a) = a·σ and silu'(a) = σ·(1 + a·(1 − σ)), so
 * for y = silu(a)·b:
 *   da += dy·b·σ·(1 + a·(1 − σ)),   db += dy·a·σ.
 * a and b are the forward's inputs (the gate before the in-place forward
 * overwrote it).  σ is formed as 1/(1 + e^−a), which is exact enough at
 * both tails in f32 (e^−a overflows to inf and σ becomes 0, correctly). */
void tp_silu_mul_backward(float *da, float *db, const float *dy, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-a[i]));
        float g = dy[i];
        if (da) da[i] += g * b[i] * sig * (1.0f + a[i] * (1.0f - sig));
        if (db) db[i] += g * a[i] * sig;
    }
}
