/* tensorpar/kernels.h — the numerical building blocks of a transformer layer.
 *
 * Activations are f32; weights are f32 or bf16 (tp_tensor).  Each kernel is
 * a plain loop that reads top to bottom; the speed issue adds SIMD paths
 * behind the same signatures, checked against these loops. */
#ifndef TENSORPAR_KERNELS_H
#define TENSORPAR_KERNELS_H

#include "tensorpar/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[T, out] = x[T, in] · W[out, in]ᵀ (+ bias[out] if bias != NULL).
 * W is f32 or bf16; bias is f32 or bf16 of length out. */
tp_status tp_matmul(float *y, const float *x, int64_t T, const tp_tensor *W,
                    const tp_tensor *bias, tp_threadpool *pool);

/* out[i] = x[i] / sqrt(mean(x²) + eps) * w[i] over rows of length n;
 * w is f32 or bf16.  out may alias x. */
void tp_rmsnorm(float *out, const float *x, const tp_tensor *w, int64_t rows, int64_t n, double eps);

/* Rotary embeddings, rotate_half convention (the first and second halves of
 * each head are the two components).  inv_freq has head_dim/2 entries. */
void tp_rope_inv_freq(double *inv_freq, int64_t head_dim, double theta, int kind,
                      double factor, double low_freq_factor, double high_freq_factor,
                      int64_t original_max_pos);
/* Rotates x[T, n_heads, head_dim] in place; row t is at position pos0 + t. */
void tp_rope_apply(float *x, int64_t T, int64_t n_heads, int64_t head_dim,
                   const double *inv_freq, int64_t pos0);

/* a[i] = silu(a[i]) * b[i] */
void tp_silu_mul(float *a, const float *b, int64_t n);

/* In-place softmax over n values. */
void tp_softmax(float *x, int64_t n);

/* Causal attention for T new queries at positions pos0..pos0+T-1 against a
 * cache holding keys/values for positions 0..pos0+T-1.
 * q[T, n_heads, d]; k, v: [*, n_kv, d] with row stride n_kv*d;
 * out[T, n_heads, d].  Query head h reads KV head h / (n_heads / n_kv).
 * window > 0 limits each query to keys with pos_q - pos_k < window. */
void tp_attention(float *out, const float *q, const float *k, const float *v,
                  int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                  int64_t window, tp_threadpool *pool);

/* Converts row `row` of an f32/bf16 matrix [rows, n] to f32. */
void tp_row_to_f32(float *dst, const tp_tensor *m, int64_t row);

#ifdef __cplusplus
}
#endif
#endif
