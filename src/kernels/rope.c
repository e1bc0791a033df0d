/* Rotary position embeddings with Transformers' frequency schedules:
 * default, "linear" (positions divided by factor) and "llama3" (long
 * wavelengths divided by factor, short ones kept, a smooth blend between). */
#include "tensorpar/kernels.h"

#include <math.h>

enum { ROPE_DEFAULT = 0, ROPE_LLAMA3 = 1, ROPE_LINEAR = 2 };

void tp_rope_inv_freq(double *inv_freq, int64_t head_dim, double theta, int kind,
                      double factor, double low_freq_factor, double high_freq_factor,
                      int64_t original_max_pos)
{
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)head_dim);
        if (kind == ROPE_LINEAR) {
            f /= factor;
        } else if (kind == ROPE_LLAMA3) {
            double low_wavelen = (double)original_max_pos / low_freq_factor;
            double high_wavelen = (double)original_max_pos / high_freq_factor;
            double wavelen = 2 * pi / f;
            if (wavelen > low_wavelen) {
                f /= factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = ((double)original_max_pos / wavelen - low_freq_factor) /
                                (high_freq_factor - low_freq_factor);
                f = (1 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

void tp_rope_apply(float *x, int64_t T, int64_t n_heads, int64_t head_dim,
                   const double *inv_freq, int64_t pos0)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        double pos = (double)(pos0 + t);
        for (int64_t i = 0; i < half; i++) {
            float c = (float)cos(pos * inv_freq[i]), s = (float)sin(pos * inv_freq[i]);
            for (int64_t h = 0; h < n_heads; h++) {
                float *v = x + (t * n_heads + h) * head_dim;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}
