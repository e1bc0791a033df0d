/* The experts of a mixture-of-experts block as grouped GEMMs.  The router
 * gave each token k (expert, weight) slots; the slots are sorted by expert
 * (a counting sort, stable, so each expert's rows keep token order) and
 * every expert with at least one row runs as two GEMMs on its rows only:
 * [gate; up] = X_e · gate_up[e]ᵀ, h = SiLU(gate) · up, Y_e = h · down[e]ᵀ.
 * A prompt is a handful of GEMMs instead of T·k GEMVs; a decoded token is
 * k GEMVs (one row per selected expert).  Each row of Y_e is added to its
 * token's output scaled by the slot's weight, experts in ascending order,
 * so every token's sum has one fixed order on any thread count. */
#include "kernels/kern_internal.h"

#include <stdlib.h>
#include <string.h>

int64_t tp_grouped_experts_scratch(int64_t T, int64_t H, int64_t I)
{
    return T * (H + 2 * I + I + H);
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

/* One expert's rows: gather, the two GEMMs with SwiGLU between, scatter-add. */
static tp_status run_expert(const tp_grouped_experts_args *a, int64_t e, const int64_t *slots, int64_t n,
                            float *scratch)
{
    int64_t H = a->H, k = a->k, I = a->gate_up->shape[1] / 2;
    float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I, *y = h + n * I;
    for (int64_t r = 0; r < n; r++) memcpy(xs + r * H, a->x + (slots[r] / k) * H, (size_t)H * sizeof(float));
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    tp_status s = tp_matmul_ex(gu, xs, n, &wgu, NULL, a->pool, a->opts);
    if (s) return s;
    for (int64_t r = 0; r < n; r++) {
        memcpy(h + r * I, gu + r * 2 * I, (size_t)I * sizeof(float));
        tp_silu_mul(h + r * I, gu + r * 2 * I + I, I);
    }
    if ((s = tp_matmul_ex(y, h, n, &wd, NULL, a->pool, a->opts))) return s;
    for (int64_t r = 0; r < n; r++) {
        float wt = a->weights[slots[r]], *o = a->out + (slots[r] / k) * H;
        const float *yr = y + r * H;
        for (int64_t i = 0; i < H; i++) o[i] += wt * yr[i];
    }
    return TP_OK;
}

tp_status tp_grouped_experts(const tp_grouped_experts_args *a, float *scratch)
{
    int64_t E = a->gate_up->shape[0], n = a->T * a->k;
    if (a->gate_up->ndim != 3 || a->down->ndim != 3 || a->down->shape[0] != E ||
        a->down->shape[1] != a->H || a->gate_up->shape[2] != a->H || a->down->shape[2] * 2 != a->gate_up->shape[1])
        return tp_fail(TP_ERR_INVALID, "grouped experts: gate_up_proj and down_proj shapes do not match [E, 2I, %lld] "
                       "and [E, %lld, I]", (long long)a->H, (long long)a->H);
    int64_t *start = malloc((size_t)(E + 1) * sizeof *start), *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    tp_status s = start && order ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)a->T);
    if (!s) s = tp_grouped_sort_slots(a->ids, n, E, start, order);
    memset(a->out, 0, (size_t)(a->T * a->H) * sizeof(float));
    for (int64_t e = 0; !s && e < E; e++)
        if (start[e + 1] > start[e]) s = run_expert(a, e, order + start[e], start[e + 1] - start[e], scratch);
    free(start);
    free(order);
    return s;
}

/* ---- the backward ----------------------------------------------------------
 * Each expert's rows again (the forward recomputed: nothing is kept from
 * it), then, with the slot's weight w and its token's output gradient dy:
 * d w = dy · y (y the expert's unweighted output), dY = w · dy,
 * d down[e] += dYᵀ · h, dh = dY · down[e], SwiGLU's backward to
 * d[gate; up], d gate_up[e] += d[gate; up]ᵀ · X_e, and dX_e = d[gate; up] ·
 * gate_up[e] scattered back to the tokens, experts in ascending order. */

static tp_status expert_backward(const tp_grouped_experts_args *a, const tp_grouped_experts_grads *g, int64_t e,
                                 const int64_t *slots, int64_t n, float *scratch)
{
    int64_t H = a->H, k = a->k, I = a->gate_up->shape[1] / 2;
    float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I, *y = h + n * I, *dyr = y + n * H;
    float *dh = dyr + n * H, *dgu = dh + n * I, *dxs = dgu + n * 2 * I;
    for (int64_t r = 0; r < n; r++) memcpy(xs + r * H, a->x + (slots[r] / k) * H, (size_t)H * sizeof(float));
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    tp_status s = tp_matmul_ex(gu, xs, n, &wgu, NULL, a->pool, a->opts);
    for (int64_t r = 0; !s && r < n; r++) {
        memcpy(h + r * I, gu + r * 2 * I, (size_t)I * sizeof(float));
        tp_silu_mul(h + r * I, gu + r * 2 * I + I, I);
    }
    if (!s) s = tp_matmul_ex(y, h, n, &wd, NULL, a->pool, a->opts);
    if (s) return s;
    for (int64_t r = 0; r < n; r++) {
        const float *dyt = g->dy + (slots[r] / k) * H;
        float wt = a->weights[slots[r]];
        double dot = 0;
        for (int64_t i = 0; i < H; i++) {
            dot += (double)dyt[i] * y[r * H + i];
            dyr[r * H + i] = wt * dyt[i];
        }
        g->dweights[slots[r]] = (float)dot;
    }
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

tp_status tp_grouped_experts_backward(const tp_grouped_experts_args *a, const tp_grouped_experts_grads *g)
{
    int64_t E = a->gate_up->shape[0], n = a->T * a->k, H = a->H, I = a->gate_up->shape[1] / 2;
    int64_t *start = malloc((size_t)(E + 1) * sizeof *start), *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    /* an expert has at most T rows (a token chooses it once) */
    float *scratch = malloc((size_t)(a->T ? a->T : 1) * (size_t)(4 * H + 8 * I) * sizeof(float));
    tp_status s = start && order && scratch ? TP_OK
                                            : tp_fail(TP_ERR_NOMEM, "out of memory for the experts' backward");
    if (!s) tp_grouped_sort_slots(a->ids, n, E, start, order);
    if (!s && start[E] < 0) s = tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)a->T);
    if (!s) memset(g->dweights, 0, (size_t)n * sizeof(float));
    for (int64_t e = 0; !s && e < E; e++)
        if (start[e + 1] > start[e]) s = expert_backward(a, g, e, order + start[e], start[e + 1] - start[e], scratch);
    free(start);
    free(order);
    free(scratch);
    return s;
}
