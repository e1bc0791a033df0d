/* RMSNorm as Transformers computes it: x·rsqrt(mean(x²) + eps), then times
 * the weight.  The mean is accumulated in double so that the result does
 * not depend on the order of the sum (TP ranks must agree bit for bit). */
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>

void tp_rmsnorm(float *out, const float *x, const tp_tensor *w, int64_t rows, int64_t n, double eps)
{
    float *wf = malloc((size_t)n * sizeof(float));
    if (!wf) return;
    tp_row_to_f32(wf, w, 0);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
        float *o = out + r * n;
        for (int64_t i = 0; i < n; i++) o[i] = wf[i] * (xr[i] * inv);
    }
    free(wf);
}
