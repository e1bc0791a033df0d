/* The error measure the matmul tests share: the largest over outputs of
 * |y - ref| / Σ|x·w| (bias included), with ref and Σ computed in double. */
#ifndef TP_TEST_MATMUL_ERR_H
#define TP_TEST_MATMUL_ERR_H

#include <math.h>
#include <stdint.h>

static inline double matmul_err(const float *y, const float *x, const float *wf, const float *b,
                                int64_t T, int64_t n, int64_t k)
{
    double worst = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < n; r++) {
            double ref = b ? b[r] : 0, mag = b ? fabs(b[r]) : 0;
            for (int64_t i = 0; i < k; i++) {
                double pr = (double)x[t * k + i] * wf[r * k + i];
                ref += pr;
                mag += fabs(pr);
            }
            double e = fabs(y[t * n + r] - ref) / (mag > 0 ? mag : 1);
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
    return worst;
}

#endif
