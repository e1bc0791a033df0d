/* tp_kernel_bench_moe: the grouped expert kernel of an MoE prefill against
 * the dense GEMM at the same shapes.  Both compute T·k rows of SwiGLU
 * experts (x·gate_upᵀ, SiLU(gate)·up, ·downᵀ): the grouped kernel as the
 * model runs it (tokens routed to E experts, one GEMM pair per expert on
 * its ~T·k/E rows), the dense side as one GEMM pair over all T·k rows with
 * one expert's weights.  Same FLOPs, so the ratio of the rates is what
 * splitting the rows over E experts costs.  Each repetition times the two
 * back to back (alternating which goes first); the ratio is the median of
 * the repetitions' own ratios, since the machine drifts.  Then a decode:
 * one token's k experts in the stacked layout against the same bytes read
 * as [in, out] matrices (Llama 4's and gpt_oss's x @ W), alternated too. */
#include "kernels/kern_internal.h"

#include <stdlib.h>
#include <string.h>

#define MOE_REPS_MAX 15
#define DECODE_TOKENS 8   /* decoded tokens per timed sample */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Stacked bf16 expert weights [E, rows, cols]: expert 0 N(0, 0.02), the
 * others its copies (the values do not change the time; drawing 600 M
 * normals did take a minute). */
static tp_status expert_weights(tp_tensor *w, int64_t E, int64_t rows, int64_t cols, tp_rng *rng)
{
    int64_t s[3] = {E, rows, cols}, one = rows * cols;
    tp_status st = tp_tensor_init(w, TP_BF16, 3, s);
    if (st) return st;
    uint16_t *d = w->data;
    for (int64_t i = 0; i < one; i++) d[i] = tp_bf16_from_f32((float)(0.02 * tp_rng_normal(rng)));
    for (int64_t e = 1; e < E; e++) memcpy(d + e * one, d, (size_t)one * sizeof *d);
    return TP_OK;
}

/* Each token's k distinct experts, uniformly at random (a trained router
 * balances its experts about so), with weights 1/k. */
static void route(int32_t *ids, float *w, int64_t T, int64_t k, int64_t E, tp_rng *rng)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(tp_rng_next(rng) % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
            w[t * k + j] = 1.0f / (float)k;
        }
}

typedef struct {
    tp_grouped_experts_args g;
    float *scratch;
    /* dense: the T·k rows, one expert's weights */
    float *xd, *gu, *h, *yd;
    tp_tensor wgu, wd;
    int64_t n, I;
} moe_bufs;

static tp_status run_dense(const moe_bufs *b)
{
    const tp_grouped_experts_args *g = &b->g;
    tp_status s = tp_matmul_ex(b->gu, b->xd, b->n, &b->wgu, NULL, g->pool, g->opts);
    for (int64_t r = 0; !s && r < b->n; r++) {
        memcpy(b->h + r * b->I, b->gu + r * 2 * b->I, (size_t)b->I * sizeof(float));
        tp_silu_mul(b->h + r * b->I, b->gu + r * 2 * b->I + b->I, b->I);
    }
    return s ? s : tp_matmul_ex(b->yd, b->h, b->n, &b->wd, NULL, g->pool, g->opts);
}

static tp_status time_one(const moe_bufs *b, int dense, double *secs)
{
    double t0 = tp_now();
    tp_status s = dense ? run_dense(b) : tp_grouped_experts(&b->g, b->scratch);
    *secs = tp_now() - t0;
    return s;
}

static tp_status measure(const moe_bufs *b, int reps, double flops, tp_bench_moe_result *r)
{
    double tg[MOE_REPS_MAX], td[MOE_REPS_MAX], ratio[MOE_REPS_MAX], w;
    tp_status s = time_one(b, 0, &w);   /* warm-up: first touches, the pool's scratch */
    if (!s) s = time_one(b, 1, &w);
    for (int i = 0; i < reps && !s; i++) {
        int first = i % 2;
        s = time_one(b, first, first ? &td[i] : &tg[i]);
        if (!s) s = time_one(b, !first, first ? &tg[i] : &td[i]);
        ratio[i] = td[i] / tg[i];
    }
    if (s) return s;
    r->grouped_gflops = flops / median(tg, reps) / 1e9;
    r->dense_gflops = flops / median(td, reps) / 1e9;
    r->ratio = median(ratio, reps);
    return TP_OK;
}

/* Decode: one token (its own k experts each repetition, so the weights
 * come from memory) through the stacked layout and through the same bytes
 * read as [in, out] matrices (bmm: Llama 4's form; the values do not
 * change the time), alternated; GB/s of the k experts' weights. */
static tp_status measure_decode(const moe_bufs *b, const tp_tensor *gate_up, const tp_tensor *down, int reps,
                                tp_rng *rng, tp_bench_moe_result *r)
{
    const tp_grouped_experts_args *g = &b->g;
    int64_t H = g->H, I = b->I, E = gate_up->shape[0], k = g->k;
    tp_tensor gu_io = *gate_up, dn_io = *down;   /* [E, H, 2I], [E, I, H] over the same bytes */
    gu_io.shape[1] = H, gu_io.shape[2] = 2 * I;
    dn_io.shape[1] = I, dn_io.shape[2] = H;
    double ts[MOE_REPS_MAX], ti[MOE_REPS_MAX], ratio[MOE_REPS_MAX];
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    float *w = malloc((size_t)k * sizeof *w);
    tp_status s = ids && w ? TP_OK : tp_fail(TP_ERR_NOMEM, "tp_kernel_bench_moe: no memory");
    for (int i = -1; i < reps && !s; i++) {   /* i = -1: warm-up */
        for (int q = 0; q < 2 && !s; q++) {
            int inout = (q + i + 1) % 2;
            tp_grouped_experts_args a = *g;
            a.T = 1, a.ids = ids, a.weights = w;
            if (inout) a.gate_up = &gu_io, a.down = &dn_io, a.bmm = 1, a.scale_input = 1;
            double t = 0;
            for (int tok = 0; tok < DECODE_TOKENS && !s; tok++) {   /* each its own experts */
                route(ids, w, 1, k, E, rng);
                double t0 = tp_now();
                s = tp_grouped_experts(&a, b->scratch);
                t += tp_now() - t0;
            }
            if (i >= 0) (inout ? ti : ts)[i] = t;
        }
        if (!s && i >= 0) ratio[i] = ts[i] / ti[i];
    }
    free(ids);
    free(w);
    if (s) return s;
    double bytes = DECODE_TOKENS * (double)k * 3.0 * (double)(H * I) * 2.0;
    r->decode_stacked_gbs = bytes / median(ts, reps) / 1e9;
    r->decode_inout_gbs = bytes / median(ti, reps) / 1e9;
    r->decode_ratio = median(ratio, reps);
    return TP_OK;
}

tp_status tp_kernel_bench_moe(FILE *out, tp_threadpool *pool, int quick, const tp_bench_moe_dims *d,
                              tp_bench_moe_result *res)
{
    tp_status st = tp_isa_check();
    if (st) return st;
    int reps = quick > 1 ? 1 : quick ? 3 : 7;
    int64_t T = d->tokens, H = d->hidden, I = d->intermediate, E = d->experts, k = d->top_k, n = T * k;
    if (T < 1 || H < 1 || I < 1 || k < 1 || E < k)
        return tp_fail(TP_ERR_INVALID, "tp_kernel_bench_moe: needs tokens, hidden, intermediate >= 1 and "
                       "experts >= top_k >= 1");
    tp_matmul_opts opts;
    tp_matmul_opts_default(&opts);
    tp_rng rng;
    tp_rng_seed(&rng, 11);
    moe_bufs b;
    memset(&b, 0, sizeof b);
    tp_tensor gate_up = {0}, down = {0};
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *wts = malloc((size_t)n * sizeof *wts), *x = malloc((size_t)(T * H) * sizeof *x);
    float *y = malloc((size_t)(T * H) * sizeof *y);
    b.scratch = malloc((size_t)tp_grouped_experts_scratch(T, H, I, k, tp_threadpool_size(pool)) * sizeof(float));
    b.xd = malloc((size_t)(n * H) * sizeof(float));
    b.gu = malloc((size_t)(n * 2 * I) * sizeof(float));
    b.h = malloc((size_t)(n * I) * sizeof(float));
    b.yd = malloc((size_t)(n * H) * sizeof(float));
    if (!ids || !wts || !x || !y || !b.scratch || !b.xd || !b.gu || !b.h || !b.yd)
        st = tp_fail(TP_ERR_NOMEM, "tp_kernel_bench_moe: no memory");
    if (!st) st = expert_weights(&gate_up, E, 2 * I, H, &rng);
    if (!st) st = expert_weights(&down, E, H, I, &rng);
    if (!st) {
        for (int64_t i = 0; i < T * H; i++) x[i] = (float)tp_rng_normal(&rng);
        for (int64_t r = 0; r < n; r++) memcpy(b.xd + r * H, x + (r / k) * H, (size_t)H * sizeof(float));
        route(ids, wts, T, k, E, &rng);
        b.g = (tp_grouped_experts_args){y, x, T, H, k, ids, wts, &gate_up, &down, pool, &opts, 0, 0};
        /* expert 0's matrices as the dense side's weights */
        b.wgu = (tp_tensor){.dtype = TP_BF16, .ndim = 2, .shape = {2 * I, H}, .data = gate_up.data};
        b.wd = (tp_tensor){.dtype = TP_BF16, .ndim = 2, .shape = {H, I}, .data = down.data};
        b.n = n;
        b.I = I;
        double flops = 2.0 * (double)n * (double)(3 * H * I);
        st = measure(&b, reps, flops, res);
        if (!st) st = measure_decode(&b, &gate_up, &down, reps, &rng, res);
    }
    if (!st && out)
        fprintf(out, "MoE experts, %s shapes (hidden %lld, expert width %lld, %lld experts, top-%lld), prefill of "
                "%lld tokens, bf16 weights, %d thread(s), median of %d:\n"
                "  grouped (%lld rows over %lld experts, ~%.0f each) %8.1f GFLOP/s\n"
                "  dense (one GEMM pair over the %lld rows)          %8.1f GFLOP/s\n"
                "  grouped / dense %.3f (issue 16 target >= 0.5)\n"
                "decode of one token's %lld experts, weight GB/s: stacked [E, 2I, H] %.1f, the same bytes as "
                "[E, H, 2I] (Llama 4, gpt_oss) %.1f, ratio %.3f\n",
                d->name, (long long)H, (long long)I, (long long)E, (long long)k, (long long)T,
                tp_threadpool_size(pool), reps, (long long)n, (long long)E, (double)n / (double)E,
                res->grouped_gflops, (long long)n, res->dense_gflops, res->ratio, (long long)k,
                res->decode_stacked_gbs, res->decode_inout_gbs, res->decode_ratio);
    tp_tensor_release(&gate_up);
    tp_tensor_release(&down);
    free(ids); free(wts); free(x); free(y);
    free(b.scratch); free(b.xd); free(b.gu); free(b.h); free(b.yd);
    return st;
}
