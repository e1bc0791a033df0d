/* The AdamW update of one range of elements, in torch 1.13's single-tensor
 * arithmetic (each operation rounded to f32 on its own, in torch's order):
 *   p = p·(1 - lr·wd)                       (decoupled decay, when asked)
 *   m = m·β1 + (1-β1)·g
 *   v = v·β2 + ((1-β2)·g)·g
 *   p = p + (-lr/bc1)·m / (sqrt(v)/sqrt(bc2) + eps)
 * The scalar loop is the reference.  It does not vectorize by itself (sqrtf
 * sets errno, and p, g, m, v may alias), and one thread then spends several
 * seconds a step on a 0.6B model, more than the four streams take at memory
 * speed.  The AVX2 path does the same operations eight lanes at a time;
 * sqrt and division are correctly rounded and it is compiled without FMA,
 * so nothing can fuse a product into a sum: its bits equal the scalar's. */
#include "kernels/kern_internal.h"

#include <math.h>

static void adamw_scalar(const tp_adamw_consts *c, int decay, float *p, const float *g, float *m, float *v,
                         int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (decay) p[i] = p[i] * c->decay;
        m[i] = m[i] * c->beta1;
        m[i] = m[i] + c->one_minus_beta1 * g[i];
        v[i] = v[i] * c->beta2;
        v[i] = v[i] + c->one_minus_beta2 * g[i] * g[i];
        float denom = sqrtf(v[i]) / c->bc2_sqrt + c->eps;
        p[i] = p[i] + c->neg_step_size * m[i] / denom;
    }
}

#if TP_KERNELS_X86
#include <immintrin.h>

/* avx2 without fma on purpose: see the top of the file. */
__attribute__((target("avx2"))) static void adamw_avx2(const tp_adamw_consts *c, int decay, float *p,
                                                        const float *g, float *m, float *v, int64_t n)
{
    const __m256 wd = _mm256_set1_ps(c->decay), b1 = _mm256_set1_ps(c->beta1);
    const __m256 omb1 = _mm256_set1_ps(c->one_minus_beta1), b2 = _mm256_set1_ps(c->beta2);
    const __m256 omb2 = _mm256_set1_ps(c->one_minus_beta2), bc2 = _mm256_set1_ps(c->bc2_sqrt);
    const __m256 eps = _mm256_set1_ps(c->eps), step = _mm256_set1_ps(c->neg_step_size);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pi = _mm256_loadu_ps(p + i), gi = _mm256_loadu_ps(g + i);
        if (decay) pi = _mm256_mul_ps(pi, wd);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1), _mm256_mul_ps(omb1, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        pi = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), denom));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
    }
    adamw_scalar(c, decay, p + i, g + i, m + i, v + i, n - i);
}
#endif

void tp_adamw_update_path(tp_kernel_path path, const tp_adamw_consts *c, int decay, float *p, const float *g,
                          float *m, float *v, int64_t n)
{
    switch (tp_kernel_resolve(path)) {
#if TP_KERNELS_X86
    case TP_KERNEL_AVX512:   /* memory-bound: eight lanes keep up with the four streams */
    case TP_KERNEL_AVX2: adamw_avx2(c, decay, p, g, m, v, n); break;
#endif
    default: adamw_scalar(c, decay, p, g, m, v, n); break;
    }
}

void tp_adamw_update(const tp_adamw_consts *c, int decay, float *p, const float *g, float *m, float *v, int64_t n)
{
    tp_adamw_update_path(TP_KERNEL_AUTO, c, decay, p, g, m, v, n);
}
