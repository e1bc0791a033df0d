/* tensorpar/kernels.h — the numerical building blocks of a transformer layer.
 *
 * Activations are f32; weights are f32 or bf16 (tp_tensor).  Each kernel is
 * a plain loop that reads top to bottom; the SIMD paths (AVX2, AVX-512, AMX)
 * sit behind the same signatures, checked against these loops. */
#ifndef TENSORPAR_KERNELS_H
#define TENSORPAR_KERNELS_H

#include "tensorpar/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernel paths ----------------------------------------------------
 * Every kernel has a plain scalar reference and SIMD paths compiled with
 * function-level target attributes, so the library builds for any x86-64
 * and picks a path at run time from cpuid. */
typedef enum {
    TP_KERNEL_AUTO = 0,   /* tp_kernel_path_default()                      */
    TP_KERNEL_SCALAR,     /* the plain loops (the reference)               */
    TP_KERNEL_AVX2,       /* AVX2 + FMA                                    */
    TP_KERNEL_AVX512      /* AVX-512 F/BW (+ BF16 where the CPU has it)    */
} tp_kernel_path;

/* ---- instruction-set paths (TENSORPAR_ISA) ------------------------------
 * What the kernels may use, in increasing order; each includes the ones
 * before it.  The process runs the best one the CPU has, or the one the
 * environment variable TENSORPAR_ISA names (scalar|avx2|avx512|amx). */
typedef enum {
    TP_ISA_SCALAR = 0,   /* the plain loops (x86-64 baseline, SSE2)          */
    TP_ISA_AVX2,         /* + AVX2 and FMA                                   */
    TP_ISA_AVX512,       /* + AVX-512 F/BW, and AVX512_BF16 where the CPU has
                            it (bf16_dot); never AMX                         */
    TP_ISA_AMX,          /* + the AMX-BF16 tile GEMM for bf16 weights        */
    TP_ISA_COUNT
} tp_isa;

const char *tp_isa_name(tp_isa isa);
/* "scalar", "avx2", "avx512" or "amx". */
tp_status tp_isa_parse(const char *s, tp_isa *out);
/* TENSORPAR_ISA's rule, for a CPU that can run the paths i with has[i] != 0
 * (has[TP_ISA_SCALAR] is 1): request NULL or "" gives the best of them;
 * a name gives that path.  An unknown name, or a path has[] lacks, is
 * refused (TP_ERR_INVALID) with a message naming the value, the valid
 * names and the paths has[] holds. */
tp_status tp_isa_choose(const char *request, const int has[TP_ISA_COUNT], tp_isa *out);
/* "scalar, avx2": the paths has[] holds, for messages. */
void tp_isa_list(char *buf, size_t cap, const int has[TP_ISA_COUNT]);

/* Whether this CPU can run isa (AMX: and Linux granted the tile state). */
int tp_isa_cpu_has(tp_isa isa);
/* The process's path: tp_isa_choose(TENSORPAR_ISA from the settings table, the CPU),
 * decided once (pthread_once); later changes to the environment are not
 * seen.  tp_isa_check fails when TENSORPAR_ISA was refused, or when a knob
 * it replaced (TENSORPAR_KERNEL, TENSORPAR_AMX) is set; tp_matmul_ex,
 * tp_matmul_group, tp_model_load and the benchmarks then fail with that
 * message, and tp_isa_selected() is scalar, so nothing runs an instruction
 * the user did not allow. */
tp_status tp_isa_check(void);
tp_isa tp_isa_selected(void);

/* The kernel path of the process's ISA (AMX runs on the AVX-512 path). */
tp_kernel_path tp_kernel_path_default(void);
/* Whether this process may run path p: p is no higher than
 * tp_kernel_path_default() (AUTO and SCALAR: always). */
int tp_kernel_path_supported(tp_kernel_path p);
/* Whether vdpbf16ps may run: the CPU has AVX512_BF16 and the ISA is
 * avx512 or amx. */
int tp_kernel_has_bf16_dot(void);
/* Whether the AMX bf16 GEMM may run: the ISA is amx (so the CPU has
 * AMX-TILE, AMX-BF16 and AVX512_BF16, and Linux granted the tile state to
 * this process).  It runs on the AVX-512 path only. */
int tp_kernel_has_amx(void);
const char *tp_kernel_path_name(tp_kernel_path p);

/* How tp_matmul_ex multiplies. */
typedef struct {
    tp_kernel_path path; /* AUTO: tp_kernel_path_default(); a path this
                            process may not run (tp_kernel_path_supported)
                            is refused with TP_ERR_UNSUPPORTED */
    int bf16_dot;        /* bf16 weights only: round the activations to
                            bf16 (NOT exact: products carry x's bf16
                            rounding, ~2^-9 relative; logits ~1e-2).  On the
                            AVX-512 path of an AVX512_BF16 CPU vdpbf16ps
                            (about 2x the f32 rate; AMX: one part); on any
                            other path x is rounded first and the exact
                            product runs: the same numerics, no faster.
                            0 = exact: weights are widened to f32 in
                            registers, products exact. */
    int blas;            /* 1: T > 4, and the backward's dX and dW, go to
                            OpenBLAS sgemm (bf16 widened by blocks) instead
                            of the own GEMM. */
    int amx;             /* bf16 weights, T > 4, AVX-512 path, where
                            tp_kernel_has_amx(): 1 = the AMX tile GEMM.  x is
                            split into three bf16 parts, so products stay
                            exact (the exact path's error class); with
                            bf16_dot one part (x rounded to bf16, fastest).
                            2 = two parts (~2^-18 per product; experiment).
                            0 = the AVX-512 GEMM.  blas takes precedence. */
} tp_matmul_opts;

/* The kernel choices a caller makes (the model keeps them from
 * tp_model_options.kernels).  They choose numerics and a library, not an
 * ISA, so TENSORPAR_ISA leaves them alone: bf16_dot gives the same
 * numerics on every path (vdpbf16ps only where tp_kernel_has_bf16_dot()),
 * and OpenBLAS picks its own kernels from cpuid.  Zero-initialised: both
 * off. */
typedef struct {
    tp_switch bf16_dot;  /* tp_matmul_opts.bf16_dot (the CLI's --matmul
                            bf16, TENSORPAR_BF16_DOT=1); default off  */
    tp_switch blas;      /* tp_matmul_opts.blas; default off            */
} tp_kernel_options;

/* Fills *o from the settings table: TENSORPAR_BF16_DOT, TENSORPAR_BLAS (an
 * unset variable gives its default).  A bad value is TP_ERR_INVALID naming
 * the variable; *o then holds the defaults. */
tp_status tp_kernel_options_from_env(tp_kernel_options *o);

/* path from tp_kernel_path_default(), bf16_dot and blas from k (NULL: the
 * defaults, both 0), amx 1 (used where tp_kernel_has_amx()). */
void tp_matmul_opts_init(tp_matmul_opts *o, const tp_kernel_options *k);
/* tp_matmul_opts_init(o, NULL): the defaults; no environment is read. */
void tp_matmul_opts_default(tp_matmul_opts *o);

/* y[T, out] = x[T, in] · W[out, in]ᵀ (+ bias[out] if bias != NULL).
 * W is f32 or bf16; bias is f32 or bf16 of length out.  T <= 4 runs a GEMV
 * that streams W once (threads split the rows of W); larger T a tiled GEMM
 * (threads split the columns of y).  tp_matmul uses tp_matmul_opts_default. */
tp_status tp_matmul(float *y, const float *x, int64_t T, const tp_tensor *W,
                    const tp_tensor *bias, tp_threadpool *pool);
tp_status tp_matmul_ex(float *y, const float *x, int64_t T, const tp_tensor *W,
                       const tp_tensor *bias, tp_threadpool *pool, const tp_matmul_opts *opts);

/* Several Linear layers on one input (q, k and v; gate and up): outs[i].y =
 * x · outs[i].w ᵀ (+ outs[i].bias).  The weights must share the input
 * width; for a prefill the GEMM packs (or, with AMX, splits) x once for all
 * of them instead of once per weight.  Results are bitwise those of one
 * tp_matmul_ex per weight. */
typedef struct {
    float *y;
    const tp_tensor *w;
    const tp_tensor *bias;   /* NULL: none */
} tp_matmul_out;
tp_status tp_matmul_group(const tp_matmul_out *outs, int count, const float *x, int64_t T, tp_threadpool *pool,
                          const tp_matmul_opts *opts);

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

/* ---- mixture-of-experts experts as grouped GEMMs (grouped_gemm.c) ------ */

typedef struct {
    float *out;                    /* [T, H], overwritten: Σ over slots of weight · expert(x) */
    const float *x;                /* [T, H] */
    int64_t T, H, k;
    const int32_t *ids;            /* [T, k] expert of each slot; outside [0, E): skipped */
    const float *weights;          /* [T, k] */
    const tp_tensor *gate_up;      /* [E, 2I, H]: [gate; up] of each expert */
    const tp_tensor *down;         /* [E, H, I] */
    tp_threadpool *pool;
    const tp_matmul_opts *opts;
    /* Llama 4 (Llama4TextExperts): bmm-style tensors, gate_up [E, H, 2I]
     * ([gate | up] along the last dimension) and down [E, I, H], used as
     * x @ W; and the weight scales each slot's input, expert(w · x), not
     * its output. */
    int bmm, scale_input;
} tp_grouped_experts_args;

/* SwiGLU experts (h = SiLU(x·gateᵀ) ⊙ x·upᵀ, y = h·downᵀ): the slots
 * sorted by expert, one GEMM pair per expert with at least one row (never a
 * per-token loop for a prompt).  With at least two such experts per thread
 * the pool's threads take whole experts each (one parallel region for the
 * block), else each expert's GEMMs are split over the threads; the bits are
 * the same.  scratch holds tp_grouped_experts_scratch(T, H, I, k, threads
 * of a->pool) floats. */
tp_status tp_grouped_experts(const tp_grouped_experts_args *a, float *scratch);
int64_t tp_grouped_experts_scratch(int64_t T, int64_t H, int64_t I, int64_t k, int threads);
/* Pools larger than this split each expert's GEMMs instead. */
#define TP_GROUPED_MAX_THREADS 64

/* The experts' backward on the forward's arguments (out unused): dy [T, H]
 * the output gradient; dx [T, H] += the input gradient; dweights [T, k]
 * the gradient of each slot's weight (0 for a skipped slot); d_gate_up
 * [E, 2I, H] and d_down [E, H, I] (f32, NULL: not wanted) += the weight
 * gradients.  The forward is recomputed expert by expert. */
typedef struct {
    const float *dy;
    float *dx, *dweights, *d_gate_up, *d_down;
} tp_grouped_experts_grads;
tp_status tp_grouped_experts_backward(const tp_grouped_experts_args *a, const tp_grouped_experts_grads *g);

/* gpt_oss's experts (GptOssExperts), in Transformers' layout: gate_up
 * [E, H, 2I] (x·gate_up[e], no transpose) with gate and up interleaved
 * along the last dimension (gate the even columns, up the odd), plus
 * gate_up_bias [E, 2I]; the clamped SwiGLU h = (clamp(up, ±limit) + 1) ·
 * g·σ(alpha·g) with g = min(gate, limit); y = h·down[e] + down_bias[e],
 * down [E, I, H].  Weights f32 or bf16, biases f32.  Routing, sorting,
 * sentinel and scatter order as tp_grouped_experts; scratch holds
 * tp_grouped_experts_scratch floats. */
typedef struct {
    float *out;                     /* [T, H], overwritten */
    const float *x;                 /* [T, H] */
    int64_t T, H, k;
    const int32_t *ids;
    const float *weights;
    const tp_tensor *gate_up, *gate_up_bias, *down, *down_bias;
    double alpha, limit;
    tp_threadpool *pool;
    const tp_matmul_opts *opts;
} tp_oss_experts_args;
tp_status tp_oss_experts(const tp_oss_experts_args *a, float *scratch);
/* Its backward (out unused; the forward recomputed expert by expert): as
 * tp_grouped_experts_backward, the weight gradients in the weights' own
 * layouts, d_*_bias += the bias gradients (each may be NULL); the clamps
 * pass no gradient where they cut (torch's clamp: inclusive bounds pass). */
typedef struct {
    const float *dy;
    float *dx, *dweights, *d_gate_up, *d_gate_up_bias, *d_down, *d_down_bias;
} tp_oss_experts_grads;
tp_status tp_oss_experts_backward(const tp_oss_experts_args *a, const tp_oss_experts_grads *g);

/* In-place softmax over n values. */
void tp_softmax(float *x, int64_t n);

/* The AdamW update of n elements (train/optim.c's step, torch 1.13's
 * single-tensor arithmetic: see kernels/adamw.c), with the per-step
 * scalars already rounded to f32. */
typedef struct {
    float decay;                          /* 1 - lr·weight_decay          */
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float bc2_sqrt;                       /* sqrt(1 - beta2^t)            */
    float eps, neg_step_size;             /* -lr / (1 - beta1^t)          */
} tp_adamw_consts;
/* decay != 0 applies the decoupled weight decay.  Every path gives the
 * scalar loop's bits. */
void tp_adamw_update(const tp_adamw_consts *c, int decay, float *p, const float *g, float *m, float *v, int64_t n);

/* Fused residual add + RMSNorm: x += y (rows × n), then out = rmsnorm(x).
 * Saves one pass over the residual stream.  out may be y (each row of y is
 * read before that row of out is written), not x. */
void tp_add_rmsnorm(float *x, const float *y, float *out, const tp_tensor *w,
                    int64_t rows, int64_t n, double eps);

/* RoPE with a table computed once per forward: table[T][head_dim] holds, for
 * row t (position pos0 + t), cos(pos·f_i) at [i] and sin(pos·f_i) at
 * [half + i], i < half = head_dim/2 (rounded to f32 from double, as
 * tp_rope_apply does).  tp_rope_apply_table then rotates q and k of every
 * head with it; the result equals tp_rope_apply's. */
void tp_rope_table(float *table, int64_t T, int64_t head_dim, const double *inv_freq, int64_t pos0);
void tp_rope_apply_table(float *x, int64_t T, int64_t n_heads, int64_t head_dim, const float *table);
/* DeepSeek's rotary part: x holds rows of stride `stride`, the rotary part
 * at offset `off`, head_dim wide, row r at position r / per_t of the table.
 * interleaved: the pairs (x[2i], x[2i+1]) turn by angle i (DeepSeek-V2's
 * complex product, V3's rope_interleave; the pair stays in place — q and
 * k alike, so their dot products are Transformers'); else the pairs
 * (x[i], x[i + half]) as rotate_half.  Each result is times `scale`
 * (YaRN's attention factor, by which Transformers multiplies cos and sin). */
void tp_rope_apply_mla(float *x, int64_t rows, int64_t per_t, int64_t stride, int64_t off, int64_t head_dim,
                       const float *table, float scale, int interleaved);
/* YaRN (modeling_rope_utils' _compute_yarn_parameters): the blend of
 * interpolated and extrapolated frequencies over the ramp between the
 * dimensions of beta_fast and beta_slow rotations at original_max_pos,
 * floored and ceiled when truncate (Transformers' default; gpt_oss: not). */
void tp_rope_inv_freq_yarn(double *inv_freq, int64_t head_dim, double theta, double factor, double beta_fast,
                           double beta_slow, int64_t original_max_pos, int truncate);
/* YaRN's get_mscale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1. */
double tp_yarn_mscale(double scale, double mscale);

/* Causal attention for T new queries at positions pos0..pos0+T-1 against a
 * cache holding keys/values for positions 0..pos0+T-1.
 * q[T, n_heads, d]; k, v: [*, n_kv, d] with row stride n_kv*d;
 * out[T, n_heads, d].  Query head h reads KV head h / (n_heads / n_kv).
 * window > 0 limits each query to keys with pos_q - pos_k < window;
 * window < 0 to keys of the query's chunk of -window positions
 * (pos_k / -window = pos_q / -window: Llama 4's chunked attention). */
void tp_attention(float *out, const float *q, const float *k, const float *v,
                  int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                  int64_t window, tp_threadpool *pool);

/* ---- backward (training) ----------------------------------------------
 * The gradient of each kernel above, f32, written next to its forward
 * (llm.c style).  Convention: a backward ADDS into its gradient outputs
 * (dx += …, dW += …), so that a tensor used twice — the residual stream,
 * the input of q/k/v or gate/up, tied embeddings, the k/v of a GQA group —
 * collects its gradients without a temporary; the caller zeroes them first.
 * The exceptions say so (tp_rope_backward: in place; tp_cross_entropy:
 * writes, it starts the chain).  A NULL gradient output is not computed. */

/* RMSNorm: dx += ∂/∂x, dw += ∂/∂w (summed over the rows) of the forward
 * tp_rmsnorm(·, x, w, rows, n, eps) given dy; x is the forward's input.
 * Qwen3's per-head q/k norms are rows = T·heads, n = head_dim.  The fused
 * tp_add_rmsnorm needs nothing more: with dr the gradient of the residual
 * after the add, tp_rmsnorm_backward(dr, dw, dout, x_after_add, …) makes dr
 * the gradient of both addends.  Fails only for a weight that is neither
 * f32 nor bf16, or out of memory. */
tp_status tp_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const tp_tensor *w,
                              int64_t rows, int64_t n, double eps);

/* RoPE: the gradient of tp_rope_apply_table (same table), in place:
 * dx[T, n_heads, head_dim] becomes the gradient before the rotation, i.e.
 * rotated by −θ.  Covers every inv_freq schedule (default, linear, llama3). */
void tp_rope_backward(float *dx, int64_t T, int64_t n_heads, int64_t head_dim, const float *table);
/* The gradient of tp_rope_apply_mla (same arguments), in place: each pair
 * turned back by −θ and times the same scale. */
void tp_rope_backward_mla(float *dx, int64_t rows, int64_t per_t, int64_t stride, int64_t off, int64_t head_dim,
                          const float *table, float scale, int interleaved);

/* SwiGLU: for y = silu(a)·b (tp_silu_mul), da += dy·b·silu'(a), db += dy·silu(a).
 * a is the gate as it was before the in-place forward. */
void tp_silu_mul_backward(float *da, float *db, const float *dy, const float *a, const float *b, int64_t n);

/* Linear, for y[T, out] = x[T, in]·Wᵀ (+ b): dx[T, in] += dy·W,
 * dw[out, in] += dyᵀ·x, db[out] += Σ_t dy[t].  W is f32 or bf16 (widened
 * while packing; dw is f32 either way).  dx, dw, db may each be NULL.  The
 * products run on opts->path: the SIMD paths through the own packed GEMM on
 * pool's threads, bitwise the same for any thread count (opts->blas:
 * OpenBLAS from the calling thread, its own threads); SCALAR the plain
 * loops.  Fails as tp_matmul_ex for a refused TENSORPAR_ISA, a path the
 * process may not run or a bad weight, or out of memory.
 * tp_matmul_backward uses tp_matmul_opts_default. */
tp_status tp_matmul_backward_ex(float *dx, float *dw, float *db, const float *dy, const float *x,
                                int64_t T, const tp_tensor *W, tp_threadpool *pool, const tp_matmul_opts *opts);
tp_status tp_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                             int64_t T, const tp_tensor *W, tp_threadpool *pool);

/* Embedding over the rows of the table this rank holds, vocabulary ids
 * [row0, row0 + rows): forward y[t] = W[ids[t] − row0] (zeros for an id
 * outside, the masked lookup of embedding_rowwise; W f32 or bf16), and
 * backward dw[ids[t] − row0] += dy[t] for the ids inside (dw [rows, width],
 * f32), added in order of t: bitwise the same for any thread count. */
void tp_embedding_forward(float *y, const tp_tensor *W, int64_t row0, const int64_t *ids, int64_t T);
void tp_embedding_backward(float *dw, int64_t row0, int64_t rows, int64_t width, const int64_t *ids,
                           const float *dy, int64_t T, tp_threadpool *pool);

/* The label that tp_cross_entropy (like PyTorch's ignore_index) skips. */
#define TP_IGNORE_INDEX (-100)

/* Cross-entropy of logits[T, V] against labels[T] (already aligned: row t
 * predicts labels[t]; the causal-LM shift is the caller's), rows labelled
 * TP_IGNORE_INDEX skipped.  *loss_sum = Σ over counted rows of
 * logsumexp(z) − z[label] (double); dlogits (NULL: loss only; may be
 * logits itself) = (softmax(z) − onehot(label)) / count on counted rows and
 * 0 on ignored ones — count is the number of tokens the loss is averaged
 * over, those of the whole accumulated batch when accumulating gradients.
 * Fails (nothing written) for a label outside [0, V) other than -100, or a
 * count <= 0 while some row counts. */
/* The checks of the loss's inputs, shared by tp_cross_entropy and the
 * vocabulary-parallel loss (train.h): every label in [0, V) or
 * TP_IGNORE_INDEX, and a positive count when any token is counted.  `who`
 * starts the message; *counted (may be NULL) gets the counted rows. */
tp_status tp_cross_entropy_check_labels(const int64_t *labels, int64_t T, int64_t V, double count, const char *who,
                                        int64_t *counted);
tp_status tp_cross_entropy(double *loss_sum, float *dlogits, const float *logits, const int64_t *labels,
                           int64_t T, int64_t V, double count, tp_threadpool *pool);
/* The two halves of tp_cross_entropy, for a caller that holds whole rows
 * but not all of them (the row-parallel loss, train.h): row_loss[t] =
 * logsumexp − z[label] (0 on ignored rows) and dlogits as above, with
 * inv_count = 1 / count (0 when no row of the whole batch counts); labels
 * unchecked.  Then tp_cross_entropy_sum adds the T row losses in row
 * order, the one order in which tp_cross_entropy adds them. */
tp_status tp_cross_entropy_rows(double *row_loss, float *dlogits, const float *logits, const int64_t *labels,
                                int64_t T, int64_t V, double inv_count, tp_threadpool *pool);
double tp_cross_entropy_sum(const double *row_loss, int64_t T);
/* The pieces of one row's loss, for a caller that sees the row's columns
 * in parts (blocks of the vocabulary in order, or a rank's shard): each is
 * the very arithmetic of tp_cross_entropy on those columns, so a row fed
 * its blocks in column order gives tp_cross_entropy's bits.
 *   tp_cross_entropy_max: the largest of mx and z[0..n) (take mx = z[0] and
 *     the rest of the first block for tp_cross_entropy's scan);
 *   tp_cross_entropy_sum_exp: sum + Σ expf(z_i − mx), added in order in
 *     double; logsumexp is then mx + log(sum);
 *   tp_cross_entropy_grad: dz_i = softmax_i / count for these columns, and
 *     at column y (-1: none here) the label's term; dz may be z. */
float tp_cross_entropy_max(const float *z, int64_t n, float mx);
double tp_cross_entropy_sum_exp(const float *z, int64_t n, float mx, double sum);
void tp_cross_entropy_grad(float *dz, const float *z, int64_t n, double lse, double inv_count, int64_t y);

/* Causal attention for training: tp_attention's result (same arguments;
 * its own blocked kernel, portable C whose loops also have an AVX2 build)
 * plus lse[T, n_heads], the log-sum-exp of each row's scaled scores — all
 * the backward needs besides q, k, v and out (no T × keys matrix is
 * stored).  Fails for n_heads not a multiple of n_kv, or out of memory. */
tp_status tp_attention_forward_lse(float *out, float *lse, const float *q, const float *k, const float *v,
                                   int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                                   int64_t window, tp_threadpool *pool);
/* Its backward, flash-style (the probabilities recomputed from lse, key
 * block by key block): dq[T, n_heads, d] += …, and dk, dv (both or
 * neither; layout of k and v, row stride n_kv·d, rows 0 .. pos0 + T − 1,
 * so a cached prefix gets its gradient too) += …, each KV head's summed
 * over the query heads of its group.  The window is respected.  Bitwise
 * the same for any thread count. */
tp_status tp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, const float *out, const float *lse,
                                int64_t T, int64_t pos0, int64_t n_heads, int64_t n_kv, int64_t d,
                                int64_t window, tp_threadpool *pool);

/* Micro-benchmarks for `tensorpar bench`: FMA peak, read bandwidth, GEMM
 * GFLOP/s at the qwen3-0.6b shapes for each path, GEMV GB/s.  Prints a
 * table to `out`.  pool supplies the threads (NULL: one).  quick != 0 uses
 * fewer repetitions.  Takes ~1 minute on 2 cores. */
tp_status tp_kernel_bench(FILE *out, tp_threadpool *pool, int quick);
/* The widths of one model's Linears: tp_kernel_bench_dims times its
 * shapes (q_proj [q_width x hidden], k/v_proj [kv_width x hidden], o_proj,
 * gate/up [intermediate x hidden], down, lm_head [vocab x hidden]). */
typedef struct {
    const char *name;
    int64_t hidden, q_width, kv_width, intermediate, vocab;
} tp_bench_dims;
extern const tp_bench_dims tp_bench_dims_qwen3_06b;   /* tp_kernel_bench's */
tp_status tp_kernel_bench_dims(FILE *out, tp_threadpool *pool, int quick, const tp_bench_dims *d);

/* The experts of an MoE prefill (bench_moe.c): the grouped kernel
 * (tp_grouped_experts, T tokens routed uniformly at random to k of E
 * experts) against one dense GEMM pair over the same T·k rows, bf16
 * weights, alternated and timed side by side; GFLOP/s of each and the
 * median of the repetitions' ratios grouped / dense.  Prints a summary to
 * out (NULL: none).  quick as tp_kernel_bench. */
typedef struct {
    const char *name;
    int64_t hidden, intermediate, experts, top_k, tokens;   /* intermediate: one expert's width */
} tp_bench_moe_dims;
typedef struct {
    double grouped_gflops, dense_gflops, ratio;
    /* decode: one token's k experts, weight GB/s of the stacked layout
     * [E, 2I, H] / [E, H, I] (x·Wᵀ, the GEMV) and of the same bytes as
     * [E, H, 2I] / [E, I, H] (x @ W: Llama 4's and gpt_oss's layout,
     * expert_xw.c), and the median of the reps' ratios [in, out] / stacked */
    double decode_stacked_gbs, decode_inout_gbs, decode_ratio;
} tp_bench_moe_result;
tp_status tp_kernel_bench_moe(FILE *out, tp_threadpool *pool, int quick, const tp_bench_moe_dims *d,
                              tp_bench_moe_result *res);

/* The machine's own limits, the first part of tp_kernel_bench, measured
 * with the instructions of the process's kernel path: the compute peak
 * (registers only; FMA on the AVX-512 and AVX2 paths, the baseline's
 * 4-lane multiply and add on the scalar one) and read bandwidth over 1 GiB
 * of 2 MiB pages, on one thread and on the pool's threads; medians; and
 * the lockstep scaling of that compute work over the pool's threads.  ~2 s
 * with quick != 0.  Fails as tp_isa_check() does. */
typedef struct {
    double fma_gflops_1, fma_gflops_n;   /* GFLOP/s */
    double read_gbs_1, read_gbs_n;       /* GB/s */
    double read_huge_share;              /* of the read buffer in 2 MiB pages, 0..1 */
    /* threads × t(1 thread) ÷ t(all threads) for chunks of FMA work run
     * in lockstep (a barrier after each): `threads` when the host leaves
     * every core alone, less when it slows one. */
    double lockstep_scaling;
    int threads;                         /* the pool's size */
    tp_kernel_path path;                 /* the instructions measured with */
} tp_machine_peaks;
tp_status tp_machine_peaks_measure(tp_machine_peaks *out, tp_threadpool *pool, int quick);

/* Converts row `row` of an f32/bf16/q8_0/q4_0 matrix [rows, n] to f32. */
void tp_row_to_f32(float *dst, const tp_tensor *m, int64_t row);

/* ---- 8-bit weights (kernels/quant_q8.c) -------------------------------
 * rows × k values of src (f32, bf16 or f16) into rows·k/32 Q8_0 blocks:
 * per block d = amax/127 stored as f16, q = round(x/d) in [-127, 127].
 * k must be a multiple of 32; a value that is not finite is refused. */
tp_status tp_q8_quantize_rows(tp_q8_block *dst, const void *src, tp_dtype st, int64_t rows, int64_t k);
/* d·q for the k values of one row (k a multiple of 32). */
void tp_q8_dequantize_row(float *dst, const tp_q8_block *src, int64_t k);

/* ---- 4-bit weights (kernels/quant_q4.c) -------------------------------
 * rows × k values of src (f32, bf16 or f16) into rows·k/32 Q4_0 blocks as
 * llama.cpp's reference quantizer makes them: per block m = the value of
 * largest magnitude (the first of equals), d = m/-8 stored as f16, nibble =
 * min(15, floor(x·(1/d) + 8.5)) with 1/d of the unrounded d.  k must be a
 * multiple of 32; a value that is not finite is refused.  dst (rows·k/32·18
 * bytes, the size of the plain blocks) gets them in tensorpar's repacked
 * layout (kern_q4.h: 4 rows interleaved, scales together), the layout
 * every q4_0 tensor has in memory; tp_q4_block_at reads one block back. */
tp_status tp_q4_quantize_rows(void *dst, const void *src, tp_dtype st, int64_t rows, int64_t k);
/* Block b of row r of a repacked q4_0 tensor of rows × k values, as
 * llama.cpp's block_q4_0. */
tp_q4_block tp_q4_block_at(const void *w, int64_t rows, int64_t k, int64_t r, int64_t b);
/* (nibble - 8)·d for the k values of row r of a repacked q4_0 tensor of
 * rows × k values (k a multiple of 32). */
void tp_q4_dequantize_row(float *dst, const void *w, int64_t rows, int64_t k, int64_t r);

#ifdef __cplusplus
}
#endif
#endif
