/* The gated MLP's activation and the softmax. */
#include "tensorpar/kernels.h"

#include <math.h>

void tp_silu_mul(float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

void tp_softmax(float *x, int64_t n)
{
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) { x[i] = expf(x[i] - mx); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
