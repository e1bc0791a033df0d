/* Linear layers: y = x·Wᵀ + b, W f32, bf16, q8_0 or q4_0 [out, in], x f32 [T, in].
 *
 * Dispatch by shape and path:
 *   T <= 4 (decode): a GEMV that streams W exactly once at memory bandwidth;
 *                    the threads split the rows of W.
 *   T > 4 (prefill): a tiled, packed GEMM (gemm_avx512.c, gemm_avx2.c), or
 *                    OpenBLAS when opts->blas asks for it; bf16 weights on
 *                    CPUs with AMX: the tile GEMM (gemm_amx.c, opts->amx).
 *   an MoE expert's rows (tp_matmul_rows, 5..TP_ROWS_MAX_T on the AVX-512
 *                    GEMM's path): W read in place (gemm_rows_avx512.c).
 *   SCALAR:          the plain loops below — the reference the tests use.
 *   q8_0 weights:    gemm_q8.c, on every path (forward only).
 *   q4_0 weights:    gemm_q4.c, likewise.
 *   opts->bf16_dot:  bf16 weights, x rounded to bf16: vdpbf16ps on the
 *                    AVX-512 path of an AVX512_BF16 CPU (AMX: one part);
 *                    elsewhere x rounded here, then the exact product.
 * The bias is added in one pass at the end. */
#include "kernels/kern_internal.h"
#include "kernels/kern_q4.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#define BF16_BLOCK_ROWS 256

void tp_row_to_f32(float *dst, const tp_tensor *m, int64_t row)
{
    int64_t n = m->shape[m->ndim - 1];
    if (m->dtype == TP_F32) {
        memcpy(dst, (const float *)m->data + row * n, (size_t)n * sizeof(float));
    } else if (m->dtype == TP_Q8_0) {
        tp_q8_dequantize_row(dst, (const tp_q8_block *)m->data + row * (n / TP_Q8_BLOCK), n);
    } else if (m->dtype == TP_Q4_0) {
        tp_q4_dequantize_row(dst, m->data, m->shape[0], n, row);
    } else {
        const uint16_t *src = (const uint16_t *)m->data + row * n;
        for (int64_t i = 0; i < n; i++) dst[i] = tp_f32_from_bf16(src[i]);
    }
}

/* ---- scalar reference ------------------------------------------------- */

typedef struct {
    float *y;
    const float *x;
    const void *w;
    tp_dtype wt;
    int64_t T, n, k;
} mm_job;

static void scalar_worker(void *p, int ti, int nt)
{
    const mm_job *j = p;
    int64_t r0, r1;
    tp_split_range(j->n, ti, nt, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t = 0; t < j->T; t++) {
            const float *x = j->x + t * j->k;
            float acc = 0;
            if (j->wt == TP_F32) {
                const float *w = (const float *)j->w + r * j->k;
                for (int64_t i = 0; i < j->k; i++) acc += x[i] * w[i];
            } else if (j->wt == TP_Q8_0) {   /* d·q is exact: the dequantized weight */
                const tp_q8_block *w = (const tp_q8_block *)j->w + r * (j->k / TP_Q8_BLOCK);
                for (int64_t i = 0; i < j->k; i++)
                    acc += x[i] * (tp_q8_scale(w[i / TP_Q8_BLOCK].d) * (float)w[i / TP_Q8_BLOCK].q[i % TP_Q8_BLOCK]);
            } else if (j->wt == TP_Q4_0) {   /* d·(nibble - 8) is exact too */
                int8_t q[TP_Q4_BLOCK];
                for (int64_t b = 0; b < j->k / TP_Q4_BLOCK; b++) {
                    tp_q4_block w = tp_q4_get(j->w, j->n, j->k / TP_Q4_BLOCK, r, b);
                    float d = tp_q8_scale(w.d);
                    tp_q4_unpack(q, &w);
                    for (int i = 0; i < TP_Q4_BLOCK; i++) acc += x[b * TP_Q4_BLOCK + i] * (d * (float)q[i]);
                }
            } else {
                const uint16_t *w = (const uint16_t *)j->w + r * j->k;
                for (int64_t i = 0; i < j->k; i++) acc += x[i] * tp_f32_from_bf16(w[i]);
            }
            j->y[t * j->n + r] = acc;
        }
    }
}

void tp_matmul_scalar(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                      int64_t n, int64_t k, tp_threadpool *pool)
{
    mm_job j = {y, x, W, wt, T, n, k};
    tp_parallel_run(pool, scalar_worker, &j);
}

tp_status tp_matmul_dequant(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                            tp_threadpool *pool)
{
    int64_t n = W->shape[0], k = W->shape[1];
#if TP_KERNELS_X86
    if (path == TP_KERNEL_AVX512) return tp_gemm_avx512(y, x, T, W->data, W->dtype, n, k, 0, pool);
    if (path != TP_KERNEL_SCALAR) return tp_gemm_avx2(y, x, T, W->data, W->dtype, n, k, pool);
#else
    (void)path;
#endif
    tp_matmul_scalar(y, x, T, W->data, W->dtype, n, k, pool);
    return TP_OK;
}

/* ---- shared by every path ------------------------------------------- */

static tp_status add_bias(float *y, int64_t T, int64_t out, const tp_tensor *bias)
{
    float *b = malloc((size_t)out * sizeof(float));
    if (!b) return tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the bias");
    tp_row_to_f32(b, bias, 0);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++) y[t * out + o] += b[o];
    free(b);
    return TP_OK;
}

static tp_status check_weight(const tp_tensor *W, int64_t T, int backward)
{
    if (W->ndim != 2) return tp_fail(TP_ERR_INTERNAL, "tp_matmul: weight must be 2-D");
    if ((W->dtype == TP_Q8_0 || W->dtype == TP_Q4_0) && backward)
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_matmul_backward: %s weights are for inference only (train with "
                       "f32 or bf16 weights)", tp_dtype_name(W->dtype));
    if (W->dtype != TP_F32 && W->dtype != TP_BF16 && W->dtype != TP_Q8_0 && W->dtype != TP_Q4_0)
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_matmul: weights of dtype %s", tp_dtype_name(W->dtype));
    if (W->shape[1] > INT32_MAX / 16 || T > INT32_MAX || W->shape[0] > INT32_MAX)
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_matmul: matrix too large");
    return TP_OK;
}

/* A refused TENSORPAR_ISA, or a path above the process's, is an error
 * here rather than a quiet fallback: the caller asked for something else. */
static tp_status check_path(const tp_matmul_opts *opts)
{
    tp_status st = tp_isa_check();
    if (st) return st;
    if (!tp_kernel_path_supported(opts->path))
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_matmul: the %s path is not available (this process runs %s: "
                       "TENSORPAR_ISA or the CPU)", tp_kernel_path_name(opts->path),
                       tp_isa_name(tp_isa_selected()));
    return TP_OK;
}

/* ---- the x86-64 SIMD paths ------------------------------------------ */

#if TP_KERNELS_X86
/* ---- OpenBLAS --------------------------------------------------------- */

/* bf16 weights: each thread widens its own blocks of rows and hands them to
 * sgemm, so no f32 copy of the whole matrix ever exists. */
static void blas_bf16_worker(void *p, int ti, int nt)
{
    const mm_job *j = p;
    int64_t nblocks = (j->n + BF16_BLOCK_ROWS - 1) / BF16_BLOCK_ROWS, b0, b1;
    tp_split_range(nblocks, ti, nt, &b0, &b1);
    float *wf = malloc((size_t)BF16_BLOCK_ROWS * (size_t)j->k * sizeof(float));
    if (!wf) return;
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * BF16_BLOCK_ROWS;
        int64_t rows = j->n - r0 < BF16_BLOCK_ROWS ? j->n - r0 : BF16_BLOCK_ROWS;
        const uint16_t *src = (const uint16_t *)j->w + r0 * j->k;
        for (int64_t i = 0; i < rows * j->k; i++) wf[i] = tp_f32_from_bf16(src[i]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->T, (int)rows, (int)j->k,
                    1.0f, j->x, (int)j->k, wf, (int)j->k, 0.0f, j->y + r0, (int)j->n);
    }
    free(wf);
}

static void matmul_blas(float *y, const float *x, int64_t T, const void *W, tp_dtype wt,
                        int64_t n, int64_t k, tp_threadpool *pool)
{
    if (wt == TP_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)n, (int)k,
                    1.0f, x, (int)k, W, (int)k, 0.0f, y, (int)n);
    } else {
        mm_job j = {y, x, W, wt, T, n, k};
        tp_parallel_run(pool, blas_bf16_worker, &j);
    }
}

/* The AVX-512 path's kernel for a product of T rows with these f32/bf16
 * weights: decode's GEMV (T <= TP_GEMV_MAX_T, whatever opts->blas says),
 * else the AMX GEMM or the AVX-512 GEMM; KIND_OTHER off that path and for
 * OpenBLAS. */
typedef enum { KIND_OTHER, KIND_GEMV, KIND_GEMM, KIND_AMX } simd_kind;

static simd_kind avx512_kind(tp_kernel_path path, int64_t T, tp_dtype wt, int bf16_dot, const tp_matmul_opts *opts)
{
    if (path != TP_KERNEL_AVX512) return KIND_OTHER;
    if (T <= TP_GEMV_MAX_T) return KIND_GEMV;
    if (opts->blas && !bf16_dot) return KIND_OTHER;
    return opts->amx && wt == TP_BF16 && tp_kernel_has_amx() ? KIND_AMX : KIND_GEMM;
}

/* x split into 3 bf16 parts keeps products exact; bf16_dot: 1 part. */
static int amx_passes(int bf16_dot, const tp_matmul_opts *opts)
{
    return bf16_dot ? 1 : opts->amx == 2 ? 2 : 3;
}

/* The SIMD paths of tp_matmul_ex (k > 0, the path is not SCALAR). */
static tp_status matmul_simd(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                             tp_threadpool *pool, const tp_matmul_opts *opts)
{
    int64_t n = W->shape[0], k = W->shape[1];
    int bf16_dot = opts->bf16_dot && W->dtype == TP_BF16 && tp_kernel_has_bf16_dot();
    switch (avx512_kind(path, T, W->dtype, bf16_dot, opts)) {
    case KIND_GEMV: return tp_gemv_avx512(y, x, T, W->data, W->dtype, n, k, bf16_dot, pool);
    case KIND_GEMM: return tp_gemm_avx512(y, x, T, W->data, W->dtype, n, k, bf16_dot, pool);
    case KIND_AMX: return tp_gemm_amx(y, x, T, W->data, n, k, amx_passes(bf16_dot, opts), pool);
    case KIND_OTHER: break;
    }
    if (T <= TP_GEMV_MAX_T) return tp_gemv_avx2(y, x, T, W->data, W->dtype, n, k, pool);
    if (opts->blas && !bf16_dot) {
        matmul_blas(y, x, T, W->data, W->dtype, n, k, pool);
        return TP_OK;
    }
    return tp_gemm_avx2(y, x, T, W->data, W->dtype, n, k, pool);
}

/* The weights can go through one AVX-512 GEMM, AMX GEMM or GEMV call (the
 * GEMV: decode's q/k/v or gate/up in one parallel region instead of one
 * each): same input width, same dtype, and nothing empty.  KIND_OTHER: no. */
static simd_kind groupable(const tp_matmul_out *outs, int count, int64_t T, tp_kernel_path path, int bf16_dot,
                           const tp_matmul_opts *opts)
{
    if (count < 2 || count > TP_GEMM_GROUP_MAX) return KIND_OTHER;
    const tp_tensor *w0 = outs[0].w;
    simd_kind kind = avx512_kind(path, T, w0->dtype, bf16_dot, opts);
    if (kind == KIND_OTHER || w0->shape[1] == 0 || w0->dtype == TP_Q8_0 || w0->dtype == TP_Q4_0) return KIND_OTHER;
    for (int i = 0; i < count; i++)
        if (outs[i].w->dtype != w0->dtype || outs[i].w->shape[1] != w0->shape[1] || outs[i].w->shape[0] == 0)
            return KIND_OTHER;
    return kind;
}

/* The grouped GEMM of tp_matmul_group, where the weights can share one:
 * *done = 1 and the outputs (without bias), else *done = 0. */
static tp_status group_simd(const tp_matmul_out *outs, int count, const float *x, int64_t T, tp_threadpool *pool,
                            const tp_matmul_opts *opts, int *done)
{
    tp_kernel_path path = tp_kernel_resolve(opts->path);
    const tp_tensor *w0 = outs[0].w;
    int bf16_dot = opts->bf16_dot && w0->dtype == TP_BF16 && tp_kernel_has_bf16_dot();
    simd_kind kind = groupable(outs, count, T, path, bf16_dot, opts);
    *done = kind != KIND_OTHER;
    if (kind == KIND_OTHER) return TP_OK;
    tp_gemm_part parts[TP_GEMM_GROUP_MAX];
    for (int i = 0; i < count; i++) parts[i] = (tp_gemm_part){outs[i].y, outs[i].w->data, outs[i].w->shape[0]};
    int64_t k = w0->shape[1];
    if (kind == KIND_GEMV) return tp_gemv_avx512_group(parts, count, x, T, w0->dtype, k, bf16_dot, pool);
    if (kind == KIND_AMX) return tp_gemm_amx_group(parts, count, x, T, k, amx_passes(bf16_dot, opts), pool);
    return tp_gemm_avx512_group(parts, count, x, T, w0->dtype, k, bf16_dot, pool);
}
#else
/* Other architectures have only the SCALAR path (cpu.c), so tp_kernel_resolve
 * never hands out another one and these are never reached. */
static tp_status matmul_simd(float *y, const float *x, int64_t T, const tp_tensor *W, tp_kernel_path path,
                             tp_threadpool *pool, const tp_matmul_opts *opts)
{
    (void)y, (void)x, (void)T, (void)W, (void)pool, (void)opts;
    return tp_fail(TP_ERR_INTERNAL, "tp_matmul: the %s path is x86-64 code", tp_kernel_path_name(path));
}

static tp_status group_simd(const tp_matmul_out *outs, int count, const float *x, int64_t T, tp_threadpool *pool,
                            const tp_matmul_opts *opts, int *done)
{
    (void)outs, (void)count, (void)x, (void)T, (void)pool, (void)opts;
    *done = 0;
    return TP_OK;
}
#endif /* TP_KERNELS_X86 */

/* ---- bf16_dot without vdpbf16ps ---------------------------------------
 * opts->bf16_dot means one thing on every path: x rounded to bf16 (round to
 * nearest even, as vcvtne2ps2bf16), times the bf16 weights.  A bf16 × bf16
 * product is exact in f32, so where vdpbf16ps is missing (scalar, avx2, an
 * AVX-512 CPU without AVX512_BF16) rounding x first and running the path's
 * exact bf16 product gives the same numerics, up to the order of the sums
 * (as between any two paths) and vdpbf16ps's flushing of denormals.  It is
 * no faster than exact there; it exists so that the option's results can be
 * had, and tested, on every machine. */

static int bf16_emulated(const tp_matmul_opts *opts, tp_dtype wt, tp_kernel_path path)
{
    return opts->bf16_dot && wt == TP_BF16 && !(path == TP_KERNEL_AVX512 && tp_kernel_has_bf16_dot());
}

/* x[T, k] rounded to bf16 and widened back, in a new buffer (free it). */
static float *round_to_bf16(const float *x, int64_t T, int64_t k)
{
    size_t count = (size_t)T * (size_t)k;
    float *r = malloc(count * sizeof(float));
    if (!r) {
        tp_fail(TP_ERR_NOMEM, "tp_matmul: out of memory for the bf16-rounded activations");
        return NULL;
    }
    for (size_t i = 0; i < count; i++) r[i] = tp_f32_from_bf16(tp_bf16_from_f32(x[i]));
    return r;
}

/* Every weight bf16 and of one input width, and bf16_dot emulated: else
 * each weight's own tp_matmul_ex decides (and rounds x for itself). */
static int group_emulated(const tp_matmul_out *outs, int count, const tp_matmul_opts *opts)
{
    if (count < 1 || !bf16_emulated(opts, outs[0].w->dtype, tp_kernel_resolve(opts->path))) return 0;
    for (int i = 0; i < count; i++)
        if (outs[i].w->dtype != TP_BF16 || outs[i].w->shape[1] != outs[0].w->shape[1]) return 0;
    return outs[0].w->shape[1] > 0;
}

/* ---- entry points ----------------------------------------------------- */

tp_status tp_matmul_ex(float *y, const float *x, int64_t T, const tp_tensor *W,
                       const tp_tensor *bias, tp_threadpool *pool, const tp_matmul_opts *opts)
{
    tp_status st = check_path(opts);
    if (!st) st = check_weight(W, T, 0);
    if (st) return st;
    int64_t n = W->shape[0], k = W->shape[1];
    if (T == 0 || n == 0) return TP_OK;
    tp_kernel_path path = tp_kernel_resolve(opts->path);
    if (k > 0 && bf16_emulated(opts, W->dtype, path)) {   /* a group of one rounds x (tp_matmul_group) */
        tp_matmul_out one = {y, W, bias};
        return tp_matmul_group(&one, 1, x, T, pool, opts);
    }
    if (k == 0) memset(y, 0, (size_t)(T * n) * sizeof(float));
    else if (W->dtype == TP_Q8_0) st = tp_q8_matmul(y, x, T, W, path, pool);
    else if (W->dtype == TP_Q4_0) st = tp_q4_matmul(y, x, T, W, path, pool);
    else if (path == TP_KERNEL_SCALAR) tp_matmul_scalar(y, x, T, W->data, W->dtype, n, k, pool);
    else st = matmul_simd(y, x, T, W, path, pool, opts);
    if (!st && bias && bias->data) st = add_bias(y, T, n, bias);
    return st;
}

/* An MoE expert's few rows (grouped_gemm.c): on the AVX-512 GEMM's path,
 * for f32 or bf16 weights, the exact product (not bf16_dot) and
 * TP_GEMV_MAX_T < T <= TP_ROWS_MAX_T, the product that reads W in place
 * (gemm_rows_avx512.c) — the packed GEMM packs each slice of W for a few
 * rows only there; else tp_matmul_ex. */
tp_status tp_matmul_rows(float *y, const float *x, int64_t T, const tp_tensor *W, tp_threadpool *pool,
                         const tp_matmul_opts *opts)
{
#if TP_KERNELS_X86
    tp_status st = check_path(opts);
    if (!st) st = check_weight(W, T, 0);
    if (st) return st;
    int64_t n = W->shape[0], k = W->shape[1];
    /* bf16_dot (vdpbf16ps, or x rounded first where it is emulated) stays
     * tp_matmul_ex's: the rows kernel is the exact product only. */
    int bf16_dot = opts->bf16_dot && W->dtype == TP_BF16;
    if (T <= TP_ROWS_MAX_T && n > 0 && k > 0 && !bf16_dot && (W->dtype == TP_F32 || W->dtype == TP_BF16) &&
        avx512_kind(tp_kernel_resolve(opts->path), T, W->dtype, 0, opts) == KIND_GEMM)
        return tp_gemm_rows_avx512(y, x, T, W->data, W->dtype, n, k, pool);
#endif
    return tp_matmul_ex(y, x, T, W, NULL, pool, opts);
}

tp_status tp_matmul_group(const tp_matmul_out *outs, int count, const float *x, int64_t T, tp_threadpool *pool,
                          const tp_matmul_opts *opts)
{
    tp_status st0 = check_path(opts);
    if (st0) return st0;
    for (int i = 0; i < count; i++) {
        tp_status st = check_weight(outs[i].w, T, 0);
        if (st) return st;
    }
    if (count < 1 || T == 0) return TP_OK;
    if (group_emulated(outs, count, opts)) {   /* x rounded once for all the weights */
        float *xr = round_to_bf16(x, T, outs[0].w->shape[1]);
        if (!xr) return TP_ERR_NOMEM;
        tp_matmul_opts exact = *opts;
        exact.bf16_dot = 0;
        st0 = tp_matmul_group(outs, count, xr, T, pool, &exact);
        free(xr);
        return st0;
    }
    int grouped = 0;
    tp_status st = group_simd(outs, count, x, T, pool, opts, &grouped);
    if (!grouped) {
        for (int i = 0; i < count && !st; i++) st = tp_matmul_ex(outs[i].y, x, T, outs[i].w, outs[i].bias, pool, opts);
        return st;
    }
    for (int i = 0; i < count && !st; i++)
        if (outs[i].bias && outs[i].bias->data) st = add_bias(outs[i].y, T, outs[i].w->shape[0], outs[i].bias);
    return st;
}

tp_status tp_matmul(float *y, const float *x, int64_t T, const tp_tensor *W,
                    const tp_tensor *bias, tp_threadpool *pool)
{
    tp_matmul_opts o;
    tp_matmul_opts_default(&o);
    return tp_matmul_ex(y, x, T, W, bias, pool, &o);
}

/* ---- backward ---------------------------------------------------------
 * y = x·Wᵀ + b gives, with dy the gradient of y:
 *   dx += dy·W          [T, in]  = [T, out]·[out, in]
 *   dW += dyᵀ·x         [out, in] = [out, T]·[T, in]
 *   db += Σ_t dy[t]
 * The SIMD paths run the two products through the packed GEMM
 * (gemm_packed.c) on the pool's threads: bitwise the same for any thread
 * count, bf16 weights widened while packing.  opts->blas hands them to
 * OpenBLAS instead (its own threads; its sums depend on their number).  The
 * SCALAR path runs the plain loops below, the reference.  dW is always f32
 * (the gradient of a bf16 weight is kept, and applied to its master copy,
 * in f32). */

typedef struct {
    float *out;
    const float *dy, *x;
    const void *w;
    tp_dtype wt;
    int64_t T, n, k;
    float *scratch;     /* k floats per thread */
} bwd_job;

/* As the packed GEMM: each element's products are summed from zero, in
 * order, and the sum is then added to the gradient — so a second call adds
 * the same bits again. */
static void add_row(float *d, const float *sum, int64_t k)
{
    for (int64_t i = 0; i < k; i++) d[i] += sum[i];
}

/* dW[o, :] += Σ_t dy[t, o]·x[t, :]; threads split o. */
static void scalar_dw_worker(void *p, int ti, int nt)
{
    const bwd_job *j = p;
    float *sum = j->scratch + (size_t)ti * (size_t)j->k;
    int64_t o0, o1;
    tp_split_range(j->n, ti, nt, &o0, &o1);
    for (int64_t o = o0; o < o1; o++) {
        memset(sum, 0, (size_t)j->k * sizeof(float));
        for (int64_t t = 0; t < j->T; t++) {
            float g = j->dy[t * j->n + o];
            const float *xt = j->x + t * j->k;
            for (int64_t i = 0; i < j->k; i++) sum[i] += g * xt[i];
        }
        add_row(j->out + o * j->k, sum, j->k);
    }
}

/* The depth of one summed piece of dx, as the packed GEMM's KC: dx adds
 * its sum every SCALAR_KC rows of W, so a product split over row blocks
 * that are multiples of it (lm_head in vocabulary blocks, head_blocks.c)
 * adds the same pieces, in the same order, as the whole product. */
#define SCALAR_KC 256

/* dx[t, :] += Σ_o dy[t, o]·W[o, :]; threads split t. */
static void scalar_dx_worker(void *p, int ti, int nt)
{
    const bwd_job *j = p;
    float *sum = j->scratch + (size_t)ti * (size_t)j->k;
    int64_t t0, t1;
    tp_split_range(j->T, ti, nt, &t0, &t1);
    for (int64_t t = t0; t < t1; t++)
        for (int64_t o0 = 0; o0 < j->n; o0 += SCALAR_KC) {
            int64_t o1 = o0 + SCALAR_KC < j->n ? o0 + SCALAR_KC : j->n;
            memset(sum, 0, (size_t)j->k * sizeof(float));
            for (int64_t o = o0; o < o1; o++) {
                float g = j->dy[t * j->n + o];
                if (j->wt == TP_F32) {
                    const float *w = (const float *)j->w + o * j->k;
                    for (int64_t i = 0; i < j->k; i++) sum[i] += g * w[i];
                } else {
                    const uint16_t *w = (const uint16_t *)j->w + o * j->k;
                    for (int64_t i = 0; i < j->k; i++) sum[i] += g * tp_f32_from_bf16(w[i]);
                }
            }
            add_row(j->out + t * j->k, sum, j->k);
        }
}

static tp_status backward_scalar(float *dx, float *dw, const float *dy, const float *x, int64_t T,
                                 const tp_tensor *W, tp_threadpool *pool)
{
    bwd_job j = {dw, dy, x, W->data, W->dtype, T, W->shape[0], W->shape[1], NULL};
    j.scratch = malloc((size_t)tp_threadpool_size(pool) * (size_t)j.k * sizeof(float));
    if (!j.scratch) return tp_fail(TP_ERR_NOMEM, "tp_matmul_backward: out of memory for the scalar sums");
    if (dw) tp_parallel_run(pool, scalar_dw_worker, &j);
    j.out = dx;
    if (dx) tp_parallel_run(pool, scalar_dx_worker, &j);
    free(j.scratch);
    return TP_OK;
}

#if TP_KERNELS_X86
typedef struct {
    float *dst;
    const uint16_t *src;
    int64_t count;
} widen_job;

static void widen_worker(void *p, int ti, int nt)
{
    const widen_job *j = p;
    int64_t b, e;
    tp_split_range(j->count, ti, nt, &b, &e);
    for (int64_t i = b; i < e; i++) j->dst[i] = tp_f32_from_bf16(j->src[i]);
}

/* OpenBLAS, called from this thread so that it runs its own threads and
 * picks its kernels from cpuid.  bf16 weights are widened a block of rows
 * at a time (no f32 copy of the whole matrix): dx is then the sum over
 * blocks of dy[:, rows]·W[rows, :]. */
static tp_status backward_blas(float *dx, float *dw, const float *dy, const float *x, int64_t T,
                               const tp_tensor *W, tp_threadpool *pool)
{
    int64_t n = W->shape[0], k = W->shape[1];
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)k, (int)T,
                    1.0f, dy, (int)n, x, (int)k, 1.0f, dw, (int)k);
    if (!dx) return TP_OK;
    if (W->dtype == TP_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)k, (int)n,
                    1.0f, dy, (int)n, W->data, (int)k, 1.0f, dx, (int)k);
        return TP_OK;
    }
    float *wf = malloc((size_t)BF16_BLOCK_ROWS * (size_t)k * sizeof(float));
    if (!wf) return tp_fail(TP_ERR_NOMEM, "tp_matmul_backward: out of memory for a block of the weight");
    for (int64_t r0 = 0; r0 < n; r0 += BF16_BLOCK_ROWS) {
        int64_t rows = n - r0 < BF16_BLOCK_ROWS ? n - r0 : BF16_BLOCK_ROWS;
        widen_job wj = {wf, (const uint16_t *)W->data + r0 * k, rows * k};
        tp_parallel_run(pool, widen_worker, &wj);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)k, (int)rows,
                    1.0f, dy + r0, (int)n, wf, (int)k, 1.0f, dx, (int)k);
    }
    free(wf);
    return TP_OK;
}

/* The packed GEMM: dW = dyᵀ (read by columns) · x, dx = dy · W. */
static tp_status backward_packed(float *dx, float *dw, const float *dy, const float *x, int64_t T,
                                 const tp_tensor *W, tp_kernel_path path, tp_threadpool *pool)
{
    int64_t n = W->shape[0], k = W->shape[1];
    const tp_gemm_ukernel *uk = path == TP_KERNEL_AVX512 ? &tp_gemm_ukernel_avx512 : &tp_gemm_ukernel_avx2;
    tp_status st = TP_OK;
    if (dw) {
        tp_gemm_operand a = {dy, TP_F32, 1, n, 0}, b = {x, TP_F32, k, 1, 0};
        st = tp_gemm_packed(uk, dw, k, 1, n, k, T, &a, &b, pool);
    }
    if (!st && dx) {
        tp_gemm_operand a = {dy, TP_F32, n, 1, 0}, b = {W->data, W->dtype, k, 1, 0};
        st = tp_gemm_packed(uk, dx, k, 1, T, k, n, &a, &b, pool);
    }
    return st;
}
#endif

tp_status tp_matmul_backward_ex(float *dx, float *dw, float *db, const float *dy, const float *x,
                                int64_t T, const tp_tensor *W, tp_threadpool *pool, const tp_matmul_opts *opts)
{
    tp_status st = check_path(opts);
    if (!st) st = check_weight(W, T, 1);
    if (st) return st;
    int64_t n = W->shape[0], k = W->shape[1];
    if (T == 0 || n == 0) return TP_OK;
    if (db)
        for (int64_t t = 0; t < T; t++)
            for (int64_t o = 0; o < n; o++) db[o] += dy[t * n + o];
    if (k == 0 || (!dx && !dw)) return TP_OK;
    tp_kernel_path path = tp_kernel_resolve(opts->path);
    if (path == TP_KERNEL_SCALAR) return backward_scalar(dx, dw, dy, x, T, W, pool);
#if TP_KERNELS_X86
    if (opts->blas) return backward_blas(dx, dw, dy, x, T, W, pool);
    return backward_packed(dx, dw, dy, x, T, W, path, pool);
#else
    return tp_fail(TP_ERR_INTERNAL, "tp_matmul_backward: the %s path is x86-64 code", tp_kernel_path_name(path));
#endif
}

tp_status tp_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                             int64_t T, const tp_tensor *W, tp_threadpool *pool)
{
    tp_matmul_opts o;
    tp_matmul_opts_default(&o);
    return tp_matmul_backward_ex(dx, dw, db, dy, x, T, W, pool, &o);
}
