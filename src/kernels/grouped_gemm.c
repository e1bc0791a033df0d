/* The experts of a mixture-of-experts block as grouped GEMMs.  The router
 * gave each token k (expert, weight) slots; the slots are sorted by expert
 * (a counting sort, stable, so each expert's rows keep token order) and
 * every expert with at least one row runs as two GEMMs on its rows only:
 * [gate; up] = X_e · gate_up[e]ᵀ, h = SiLU(gate) · up, Y_e = h · down[e]ᵀ.
 * A prompt is a handful of GEMMs instead of T·k GEMVs; a decoded token is
 * k GEMVs (one row per selected expert).  Each row of Y_e is added to its
 * token's output scaled by the slot's weight, experts in ascending order,
 * so every token's sum has one fixed order on any thread count. */
#include "kern_internal.h"
#include "tensorpar/kernels.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Per thread: one expert's gathered rows, [gate; up] and h (at most T
 * rows: a token picks an expert once); then, shared, every slot's
 * unweighted output y [T·k, H] in the sorted slots' order. */
int64_t tp_grouped_experts_scratch(int64_t T, int64_t H, int64_t I, int64_t k, int threads)
{
    return (int64_t)(threads < 1 ? 1 : threads) * T * (H + 3 * I) + T * k * H;
}

tp_status tp_grouped_sort_slots(const int32_t *ids, int64_t n, int64_t E, int64_t *start, int64_t *order)
{
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < E) start[ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    int64_t *fill = malloc((size_t)(E ? E : 1) * sizeof *fill);
    if (!fill) return tp_fail(TP_ERR_NOMEM, "out of memory routing %lld slots", (long long)n);
    memcpy(fill, start, (size_t)E * sizeof *fill);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < E) order[fill[ids[i]]++] = i;
    free(fill);
    return TP_OK;
}

/* Expert e's [rows, cols] matrix inside a stacked [E, rows, cols] tensor. */
static tp_tensor expert_view(const tp_tensor *w, int64_t e)
{
    tp_tensor v = {.dtype = w->dtype, .ndim = 2, .shape = {w->shape[1], w->shape[2]}};
    v.data = (char *)w->data + (size_t)(e * w->shape[1] * w->shape[2]) * tp_dtype_size(w->dtype);
    return v;
}

static int64_t inter_of(const tp_grouped_experts_args *a)
{
    return a->bmm ? a->gate_up->shape[2] / 2 : a->gate_up->shape[1] / 2;
}

/* y [n, out] = x [n, in] times expert weight W: x · Wᵀ for a linear-style
 * W [out, in], x @ W for a bmm-style W [in, out] (expert_xw.c). */
static tp_status expert_matmul(const tp_grouped_experts_args *a, tp_threadpool *pool, float *y, const float *x,
                               int64_t n, const tp_tensor *w)
{
    if (!a->bmm) return tp_matmul_rows(y, x, n, w, pool, a->opts);
    return tp_expert_xw(y, x, n, w, pool, a->opts);
}

/* One expert's rows: gather, the two GEMMs with SwiGLU between; their
 * outputs to y (n rows). */
static tp_status run_expert(const tp_grouped_experts_args *a, int64_t e, const int64_t *slots, int64_t n,
                            float *scratch, float *y, tp_threadpool *pool)
{
    int64_t H = a->H, k = a->k, I = inter_of(a);
    float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I;
    for (int64_t r = 0; r < n; r++) {
        const float *xt = a->x + (slots[r] / k) * H;
        float wt = a->weights[slots[r]];
        if (!a->scale_input) memcpy(xs + r * H, xt, (size_t)H * sizeof(float));
        else
            for (int64_t i = 0; i < H; i++) xs[r * H + i] = xt[i] * wt;
    }
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    tp_status s = expert_matmul(a, pool, gu, xs, n, &wgu);
    if (s) return s;
    for (int64_t r = 0; r < n; r++) {
        memcpy(h + r * I, gu + r * 2 * I, (size_t)I * sizeof(float));
        tp_silu_mul(h + r * I, gu + r * 2 * I + I, I);
    }
    return expert_matmul(a, pool, y, h, n, &wd);
}

/* The experts with rows, shared out among the pool's threads one whole
 * expert at a time (each runs its GEMMs on one thread, with its own
 * one-thread pool for the packing buffers): a prompt's ~T·k/E rows per
 * expert make GEMMs too small to split well, and one parallel region per
 * block replaces two per expert, each of which waits for every thread. */
typedef struct {
    const tp_grouped_experts_args *a;
    const int64_t *start, *order, *active;
    int64_t n_active, per_thread;
    float *scratch, *ys;
    tp_threadpool **solo;
    atomic_llong next;
    atomic_int failed;
    tp_status status[TP_GROUPED_MAX_THREADS];
} expert_job;

static void experts_worker(void *p, int ti, int nt)
{
    (void)nt;
    expert_job *j = p;
    for (;;) {
        long long i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_active || atomic_load(&j->failed)) return;
        int64_t e = j->active[i], b = j->start[e];
        tp_status s = run_expert(j->a, e, j->order + b, j->start[e + 1] - b, j->scratch + ti * j->per_thread,
                                 j->ys + b * j->a->H, j->solo[ti]);
        if (s) {
            j->status[ti] = s;
            atomic_store(&j->failed, 1);
        }
    }
}

static tp_status over_experts(expert_job *j, tp_threadpool *pool)
{
    int nt = tp_threadpool_size(pool);
    tp_threadpool *solo[TP_GROUPED_MAX_THREADS] = {0};
    tp_status s = TP_OK;
    for (int t = 0; t < nt && !s; t++) s = tp_threadpool_create(&solo[t], 1);
    if (!s) {
        j->solo = solo;
        atomic_init(&j->next, 0);
        atomic_init(&j->failed, 0);
        tp_parallel_run(pool, experts_worker, j);
        for (int t = 0; t < nt && !s; t++)
            if (j->status[t]) s = tp_fail(j->status[t], "grouped experts: an expert's GEMM failed on thread %d", t);
    }
    for (int t = 0; t < nt; t++) tp_threadpool_destroy(solo[t]);
    return s;
}

tp_status tp_grouped_experts(const tp_grouped_experts_args *a, float *scratch)
{
    int64_t E = a->gate_up->shape[0], n = a->T * a->k, H = a->H;
    if (a->bmm && (a->gate_up->ndim != 3 || a->down->ndim != 3 || a->down->shape[0] != E ||
                   a->down->shape[2] != a->H || a->gate_up->shape[1] != a->H ||
                   a->down->shape[1] * 2 != a->gate_up->shape[2]))
        return tp_fail(TP_ERR_INVALID, "grouped experts: gate_up_proj and down_proj shapes do not match [E, %lld, 2I] "
                       "and [E, I, %lld]", (long long)a->H, (long long)a->H);
    if (!a->bmm && (a->gate_up->ndim != 3 || a->down->ndim != 3 || a->down->shape[0] != E ||
        a->down->shape[1] != a->H || a->gate_up->shape[2] != a->H || a->down->shape[2] * 2 != a->gate_up->shape[1]))
        return tp_fail(TP_ERR_INVALID, "grouped experts: gate_up_proj and down_proj shapes do not match [E, 2I, %lld] "
                       "and [E, %lld, I]", (long long)a->H, (long long)a->H);
    int64_t I = inter_of(a);
    int nt = tp_threadpool_size(a->pool);
    if (nt > TP_GROUPED_MAX_THREADS) nt = 1;   /* the split within each expert's GEMMs only */
    int64_t *start = malloc((size_t)(E + 1) * sizeof *start), *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    int64_t *active = malloc((size_t)(E ? E : 1) * sizeof *active), n_active = 0;
    expert_job *j = calloc(1, sizeof *j);
    tp_status s = start && order && active && j
                      ? TP_OK
                      : tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)a->T);
    if (!s) s = tp_grouped_sort_slots(a->ids, n, E, start, order);
    for (int64_t e = 0; !s && e < E; e++)
        if (start[e + 1] > start[e]) active[n_active++] = e;
    int64_t per_thread = a->T * (H + 3 * I);
    float *ys = scratch + (int64_t)tp_threadpool_size(a->pool) * per_thread;
    /* Whole experts per thread once there are enough of them to share out
     * evenly (a decoded token's k, a prompt's); else each expert's GEMMs
     * split over the threads.  The same bits either way: a GEMM's result
     * does not depend on its thread count. */
    if (!s && nt > 1 && n_active >= 2 * nt) {
        *j = (expert_job){a, start, order, active, n_active, per_thread, scratch, ys, NULL, 0, 0, {0}};
        s = over_experts(j, a->pool);
    } else {
        for (int64_t i = 0; !s && i < n_active; i++) {
            int64_t e = active[i];
            s = run_expert(a, e, order + start[e], start[e + 1] - start[e], scratch, ys + start[e] * H, a->pool);
        }
    }
    /* Each token's outputs weighted and summed, experts in ascending order. */
    if (!s) memset(a->out, 0, (size_t)(a->T * H) * sizeof(float));
    for (int64_t r = 0; !s && r < start[E]; r++) {
        float wt = a->scale_input ? 1.0f : a->weights[order[r]], *o = a->out + (order[r] / a->k) * H;
        const float *yr = ys + r * H;
        for (int64_t i = 0; i < H; i++) o[i] += wt * yr[i];
    }
    free(start);
    free(order);
    free(active);
    free(j);
    return s;
}

/* ---- the backward ----------------------------------------------------------
 * Each expert's rows again (the forward recomputed: nothing is kept from
 * it), then, with the slot's weight w and its token's output gradient dy:
 * d w = dy · y (y the expert's unweighted output), dY = w · dy,
 * d down[e] += dYᵀ · h, dh = dY · down[e], SwiGLU's backward to
 * d[gate; up], d gate_up[e] += d[gate; up]ᵀ · X_e, and dX_e = d[gate; up] ·
 * gate_up[e] scattered back to the tokens, experts in ascending order. */

void tp_grouped_slot_grads(const float *dy, const float *weights, const int64_t *slots, int64_t n, int64_t k,
                           int64_t H, const float *y, float *dyr, float *dweights)
{
    for (int64_t r = 0; r < n; r++) {
        const float *dyt = dy + (slots[r] / k) * H;
        float wt = weights[slots[r]];
        double dot = 0;
        for (int64_t i = 0; i < H; i++) {
            dot += (double)dyt[i] * y[r * H + i];
            dyr[r * H + i] = wt * dyt[i];
        }
        dweights[slots[r]] = (float)dot;
    }
}

static tp_status expert_backward(const tp_grouped_experts_args *a, const tp_grouped_experts_grads *g, int64_t e,
                                 const int64_t *slots, int64_t n, float *scratch)
{
    int64_t H = a->H, k = a->k, I = a->gate_up->shape[1] / 2;
    float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I, *y = h + n * I, *dyr = y + n * H;
    float *dh = dyr + n * H, *dgu = dh + n * I, *dxs = dgu + n * 2 * I;
    for (int64_t r = 0; r < n; r++) memcpy(xs + r * H, a->x + (slots[r] / k) * H, (size_t)H * sizeof(float));
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    tp_status s = tp_matmul_rows(gu, xs, n, &wgu, a->pool, a->opts);
    for (int64_t r = 0; !s && r < n; r++) {
        memcpy(h + r * I, gu + r * 2 * I, (size_t)I * sizeof(float));
        tp_silu_mul(h + r * I, gu + r * 2 * I + I, I);
    }
    if (!s) s = tp_matmul_rows(y, h, n, &wd, a->pool, a->opts);
    if (s) return s;
    tp_grouped_slot_grads(g->dy, a->weights, slots, n, k, H, y, dyr, g->dweights);
    memset(dh, 0, (size_t)(n * I) * sizeof(float));
    memset(dgu, 0, (size_t)(n * 2 * I) * sizeof(float));
    memset(dxs, 0, (size_t)(n * H) * sizeof(float));
    float *dwd = g->d_down ? g->d_down + e * H * I : NULL, *dwgu = g->d_gate_up ? g->d_gate_up + e * 2 * I * H : NULL;
    if ((s = tp_matmul_backward_ex(dh, dwd, NULL, dyr, h, n, &wd, a->pool, a->opts))) return s;
    for (int64_t r = 0; r < n; r++)
        tp_silu_mul_backward(dgu + r * 2 * I, dgu + r * 2 * I + I, dh + r * I, gu + r * 2 * I, gu + r * 2 * I + I, I);
    if ((s = tp_matmul_backward_ex(dxs, dwgu, NULL, dgu, xs, n, &wgu, a->pool, a->opts))) return s;
    for (int64_t r = 0; r < n; r++) {
        float *dx = g->dx + (slots[r] / k) * H;
        for (int64_t i = 0; i < H; i++) dx[i] += dxs[r * H + i];
    }
    return TP_OK;
}

/* Llama 4's experts (bmm-style, the weight scaling the input): with xs =
 * w · x, gu = xs @ Wgu, h = SiLU(g) · u, y = h @ Wd and the slot's output
 * gradient dy: d Wd += hᵀ · dy, dh = dy · Wdᵀ, SwiGLU's backward, d Wgu +=
 * xsᵀ · d[g | u], dxs = d[g | u] · Wguᵀ; then d w = dxs · x and dx += w ·
 * dxs.  The products are tp_matmul_ex / tp_matmul_backward_ex with the bmm
 * weight W [in, out] in the role of a Linear weight [out, in]. */
static tp_status expert_backward_bmm(const tp_grouped_experts_args *a, const tp_grouped_experts_grads *g, int64_t e,
                                     const int64_t *slots, int64_t n, float *scratch)
{
    int64_t H = a->H, k = a->k, I = inter_of(a);
    float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I, *dyr = h + n * I;
    float *dh = dyr + n * H, *dgu = dh + n * I, *dxs = dgu + n * 2 * I;
    for (int64_t r = 0; r < n; r++) {
        const float *xt = a->x + (slots[r] / k) * H;
        float wt = a->scale_input ? a->weights[slots[r]] : 1.0f;
        for (int64_t i = 0; i < H; i++) xs[r * H + i] = xt[i] * wt;
        memcpy(dyr + r * H, g->dy + (slots[r] / k) * H, (size_t)H * sizeof(float));
    }
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    tp_status s = expert_matmul(a, a->pool, gu, xs, n, &wgu);
    for (int64_t r = 0; !s && r < n; r++) {
        memcpy(h + r * I, gu + r * 2 * I, (size_t)I * sizeof(float));
        tp_silu_mul(h + r * I, gu + r * 2 * I + I, I);
    }
    float *dwd = g->d_down ? g->d_down + e * H * I : NULL, *dwgu = g->d_gate_up ? g->d_gate_up + e * 2 * I * H : NULL;
    if (!s && dwd) s = tp_matmul_backward_ex(NULL, dwd, NULL, h, dyr, n, &wd, a->pool, a->opts);
    if (!s) s = tp_matmul_ex(dh, dyr, n, &wd, NULL, a->pool, a->opts);
    if (s) return s;
    memset(dgu, 0, (size_t)(n * 2 * I) * sizeof(float));
    for (int64_t r = 0; r < n; r++)
        tp_silu_mul_backward(dgu + r * 2 * I, dgu + r * 2 * I + I, dh + r * I, gu + r * 2 * I, gu + r * 2 * I + I, I);
    if (dwgu && (s = tp_matmul_backward_ex(NULL, dwgu, NULL, xs, dgu, n, &wgu, a->pool, a->opts))) return s;
    if ((s = tp_matmul_ex(dxs, dgu, n, &wgu, NULL, a->pool, a->opts))) return s;
    for (int64_t r = 0; r < n; r++) {
        const float *xt = a->x + (slots[r] / k) * H;
        float *dx = g->dx + (slots[r] / k) * H, wt = a->scale_input ? a->weights[slots[r]] : 1.0f;
        double dot = 0;
        for (int64_t i = 0; i < H; i++) {
            dot += (double)dxs[r * H + i] * xt[i];
            dx[i] += wt * dxs[r * H + i];
        }
        g->dweights[slots[r]] = a->scale_input ? (float)dot : 0.0f;
    }
    return TP_OK;
}

tp_status tp_grouped_experts_backward(const tp_grouped_experts_args *a, const tp_grouped_experts_grads *g)
{
    if (a->bmm != a->scale_input)
        return tp_fail(TP_ERR_UNSUPPORTED, "grouped experts: the backward takes bmm-style experts with the input "
                       "scaled (Llama 4) or linear-style ones with the output scaled, not a mix");
    int64_t E = a->gate_up->shape[0], n = a->T * a->k, H = a->H, I = inter_of(a);
    int64_t *start = malloc((size_t)(E + 1) * sizeof *start), *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    /* an expert has at most T rows (a token chooses it once) */
    float *scratch = malloc((size_t)(a->T ? a->T : 1) * (size_t)(4 * H + 8 * I) * sizeof(float));
    tp_status s = start && order && scratch ? TP_OK
                                            : tp_fail(TP_ERR_NOMEM, "out of memory for the experts' backward");
    if (!s) tp_grouped_sort_slots(a->ids, n, E, start, order);
    if (!s && start[E] < 0) s = tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)a->T);
    if (!s) memset(g->dweights, 0, (size_t)n * sizeof(float));
    for (int64_t e = 0; !s && e < E; e++)
        if (start[e + 1] > start[e])
            s = (a->bmm ? expert_backward_bmm : expert_backward)(a, g, e, order + start[e], start[e + 1] - start[e],
                                                                 scratch);
    free(start);
    free(order);
    free(scratch);
    return s;
}
