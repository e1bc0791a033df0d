/* Packing of the activation panel shared by the AVX2 and AVX-512 GEMMs:
 * plain loads and stores, so it needs no target attributes. */
#include "kern_internal.h"

void tp_gemm_pack_a(float *dst, const float *x, int64_t T, int64_t ldx, int64_t k0, int64_t kc, int mr)
{
    for (int64_t p = 0; p < T; p += mr) {
        for (int i = 0; i < mr; i++) {
            float *d = dst + p * kc + i;
            if (p + i < T) {
                const float *s = x + (p + i) * ldx + k0;
                for (int64_t k = 0; k < kc; k++) d[k * mr] = s[k];
            } else {
                for (int64_t k = 0; k < kc; k++) d[k * mr] = 0.0f;
            }
        }
    }
}
