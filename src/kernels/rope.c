/* Rotary position embeddings with Transformers' frequency schedules:
 * default, "linear" (positions divided by factor) and "llama3" (long
 * wavelengths divided by factor, short ones kept, a smooth blend between). */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

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

/* ---- YaRN (DeepSeek) ---------------------------------------------------- */

double tp_yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* The dimension at which a wavelength makes num_rotations turns over max_pos. */
static double correction_dim(double num_rotations, int64_t dim, double theta, int64_t max_pos)
{
    const double pi = 3.14159265358979323846;
    return (double)dim * log((double)max_pos / (num_rotations * 2 * pi)) / (2 * log(theta));
}

void tp_rope_inv_freq_yarn(double *inv_freq, int64_t head_dim, double theta, double factor, double beta_fast,
                           double beta_slow, int64_t original_max_pos, int truncate)
{
    double low = correction_dim(beta_fast, head_dim, theta, original_max_pos);
    double high = correction_dim(beta_slow, head_dim, theta, original_max_pos);
    if (truncate) { low = floor(low); high = ceil(high); }
    if (low < 0) low = 0;
    if (high > (double)(head_dim - 1)) high = (double)(head_dim - 1);
    if (low == high) high += 0.001;   /* the ramp never divides by zero */
    for (int64_t i = 0; i < head_dim / 2; i++) {
        double pos_freq = pow(theta, (double)(2 * i) / (double)head_dim);
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrapolate = 1 - ramp;   /* 1: the original frequency is kept */
        inv_freq[i] = (1 / (factor * pos_freq)) * (1 - extrapolate) + (1 / pos_freq) * extrapolate;
    }
}

void tp_rope_apply_mla(float *x, int64_t rows, int64_t per_t, int64_t stride, int64_t off, int64_t head_dim,
                       const float *table, float scale, int interleaved)
{
    int64_t half = head_dim / 2;
    /* element i of a pair is at ia * i, its partner ib away */
    int64_t ia = interleaved ? 2 : 1, ib = interleaved ? 1 : half;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = table + (r / per_t) * head_dim, *s = c + half;
        float *v = x + r * stride + off;
        for (int64_t i = 0; i < half; i++) {
            float cs = c[i] * scale, sn = s[i] * scale;
            float a = v[ia * i], b = v[ia * i + ib];
            v[ia * i] = a * cs - b * sn;
            v[ia * i + ib] = b * cs + a * sn;
        }
    }
}

/* The transpose of tp_rope_apply_mla's rotation: each pair turned by −θ,
 * times the same scale (the forward is scale·R(θ), R orthogonal). */
void tp_rope_backward_mla(float *dx, int64_t rows, int64_t per_t, int64_t stride, int64_t off, int64_t head_dim,
                          const float *table, float scale, int interleaved)
{
    int64_t half = head_dim / 2;
    int64_t ia = interleaved ? 2 : 1, ib = interleaved ? 1 : half;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = table + (r / per_t) * head_dim, *s = c + half;
        float *v = dx + r * stride + off;
        for (int64_t i = 0; i < half; i++) {
            float cs = c[i] * scale, sn = s[i] * scale;
            float a = v[ia * i], b = v[ia * i + ib];
            v[ia * i] = a * cs + b * sn;
            v[ia * i + ib] = b * cs - a * sn;
        }
    }
}

/* ---- RoPE with a per-forward table ------------------------------------ */

void tp_rope_table(float *table, int64_t T, int64_t head_dim, const double *inv_freq, int64_t pos0)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        double pos = (double)(pos0 + t);
        float *row = table + t * head_dim;
        for (int64_t i = 0; i < half; i++) {
            row[i] = (float)cos(pos * inv_freq[i]);
            row[half + i] = (float)sin(pos * inv_freq[i]);
        }
    }
}

/* Each rotated value is a·c − b·s (or b·c + a·s) with two roundings and no
 * FMA, like the scalar loop, so every path gives the same bits. */
static void rope_table_scalar(float *x, int64_t T, int64_t n_heads, int64_t head_dim, const float *table)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = table + t * head_dim, *s = c + half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (t * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
                v[i] = ac - bs;
                v[i + half] = bc + as;
            }
        }
    }
}

#if TP_KERNELS_X86
TP_T512 static void rope_table_avx512(float *x, int64_t T, int64_t n_heads, int64_t head_dim, const float *table)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = table + t * head_dim, *sn = cs + half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (t * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; i += 16) {
                __mmask16 m = tp_mask16(half - i);
                __m512 a = _mm512_maskz_loadu_ps(m, v + i), b = _mm512_maskz_loadu_ps(m, v + half + i);
                __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, sn + i);
                _mm512_mask_storeu_ps(v + i, m, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
                _mm512_mask_storeu_ps(v + half + i, m, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
            }
        }
    }
}

TP_TAVX2 static void rope_table_avx2(float *x, int64_t T, int64_t n_heads, int64_t head_dim, const float *table)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = table + t * head_dim, *sn = cs + half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (t * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; i += 8) {
                __m256i m = tp_mask256(half - i);
                __m256 a = _mm256_maskload_ps(v + i, m), b = _mm256_maskload_ps(v + half + i, m);
                __m256 c = _mm256_maskload_ps(cs + i, m), s = _mm256_maskload_ps(sn + i, m);
                _mm256_maskstore_ps(v + i, m, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
                _mm256_maskstore_ps(v + half + i, m, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
            }
        }
    }
}
#endif

void tp_rope_apply_table_path(tp_kernel_path p, float *x, int64_t T, int64_t n_heads,
                              int64_t head_dim, const float *table)
{
    switch (tp_kernel_resolve(p)) {
#if TP_KERNELS_X86
    case TP_KERNEL_AVX512: rope_table_avx512(x, T, n_heads, head_dim, table); break;
    case TP_KERNEL_AVX2: rope_table_avx2(x, T, n_heads, head_dim, table); break;
#endif
    default: rope_table_scalar(x, T, n_heads, head_dim, table); break;
    }
}

void tp_rope_apply_table(float *x, int64_t T, int64_t n_heads, int64_t head_dim, const float *table)
{
    tp_rope_apply_table_path(TP_KERNEL_AUTO, x, T, n_heads, head_dim, table);
}

/* ---- backward ---------------------------------------------------------
 * The forward multiplies each pair (a, b) = (v[i], v[half + i]) by the
 * rotation R(θ) = [c −s; s c], θ = pos·inv_freq[i].  A rotation is
 * orthogonal, so the gradient goes back through its transpose R(−θ):
 *   da = c·ga + s·gb,   db = c·gb − s·ga.
 * The same table serves the default, linear and llama3 schedules: they
 * differ only in inv_freq, which the table already holds as cos and sin.
 * In place on the gradient, like the forward on the activations. */
void tp_rope_backward(float *dx, int64_t T, int64_t n_heads, int64_t head_dim, const float *table)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = table + t * head_dim, *s = c + half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *g = dx + (t * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float ga = g[i], gb = g[i + half];
                g[i] = ga * c[i] + gb * s[i];
                g[i + half] = gb * c[i] - ga * s[i];
            }
        }
    }
}
