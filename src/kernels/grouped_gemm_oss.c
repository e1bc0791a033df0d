/* gpt_oss's experts (GptOssExperts) as grouped GEMMs: the routing's slots
 * sorted by expert as in grouped_gemm.c, and each expert with rows runs on
 * them only.  The weights stay in the checkpoint's layout — gate_up [E, H,
 * 2I] and down [E, I, H], multiplied without a transpose — so loading and
 * saving need no conversion: x·W[e] is tp_expert_xw (a decode's few rows
 * stream W; more rows: the "dx = dy·W" product of the packed GEMM, W viewed
 * as [H, 2I]), and the backward's dy·W[e]ᵀ is its forward product.  Gate and up are interleaved
 * columns (gate_up[..., ::2], gate_up[..., 1::2]). */
#include "kernels/kern_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tp_tensor expert_view(const tp_tensor *w, int64_t e)
{
    tp_tensor v = {.dtype = w->dtype, .ndim = 2, .shape = {w->shape[1], w->shape[2]}};
    v.data = (char *)w->data + (size_t)(e * w->shape[1] * w->shape[2]) * tp_dtype_size(w->dtype);
    return v;
}

static const float *bias_row(const tp_tensor *b, int64_t e) { return (const float *)b->data + e * b->shape[1]; }

/* rows of x·W (W [in, out]; a decode's few rows streamed, else the packed
 * GEMM's dx = dy·W product: tp_expert_xw) into y, plus the bias */
static tp_status times(float *y, const float *x, int64_t n, const tp_tensor *W, const float *bias,
                       const tp_oss_experts_args *a)
{
    int64_t out = W->shape[1];
    tp_status s = tp_expert_xw(y, x, n, W, a->pool, a->opts);
    for (int64_t r = 0; !s && r < n; r++)
        for (int64_t i = 0; i < out; i++) y[r * out + i] += bias[i];
    return s;
}

static float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/* h [n, I] from the interleaved [gate, up] pairs of gu [n, 2I] */
static void clamped_swiglu(float *h, const float *gu, int64_t n, int64_t I, float alpha, float limit)
{
    for (int64_t i = 0; i < n * I; i++) {
        float g = gu[2 * i], u = gu[2 * i + 1];
        g = g > limit ? limit : g;
        u = u > limit ? limit : u < -limit ? -limit : u;
        h[i] = (u + 1.0f) * (g * sigmoid(alpha * g));
    }
}

/* d[gate, up] (interleaved, overwritten) from dh and the forward's gu */
static void clamped_swiglu_backward(float *dgu, const float *dh, const float *gu, int64_t n, int64_t I, float alpha,
                                    float limit)
{
    for (int64_t i = 0; i < n * I; i++) {
        float g0 = gu[2 * i], u0 = gu[2 * i + 1];
        float g = g0 > limit ? limit : g0, u = u0 > limit ? limit : u0 < -limit ? -limit : u0;
        float sg = sigmoid(alpha * g), glu = g * sg;
        dgu[2 * i] = g0 <= limit ? dh[i] * (u + 1.0f) * (sg + g * alpha * sg * (1.0f - sg)) : 0.0f;
        dgu[2 * i + 1] = u0 >= -limit && u0 <= limit ? dh[i] * glu : 0.0f;
    }
}

/* One expert's rows: gather, [gate, up] = x·gate_up[e] + b, the clamped
 * SwiGLU, y = h·down[e] + b; gu, h and y left in the scratch. */
static tp_status expert_rows(const tp_oss_experts_args *a, int64_t e, const int64_t *slots, int64_t n, float *xs,
                             float *gu, float *h, float *y)
{
    int64_t H = a->H, I = a->gate_up->shape[2] / 2;
    for (int64_t r = 0; r < n; r++) memcpy(xs + r * H, a->x + (slots[r] / a->k) * H, (size_t)H * sizeof(float));
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    tp_status s = times(gu, xs, n, &wgu, bias_row(a->gate_up_bias, e), a);
    if (s) return s;
    clamped_swiglu(h, gu, n, I, (float)a->alpha, (float)a->limit);
    return times(y, h, n, &wd, bias_row(a->down_bias, e), a);
}

static tp_status check(const tp_oss_experts_args *a)
{
    const tp_tensor *gu = a->gate_up, *d = a->down;
    int64_t E = gu->shape[0];
    if (gu->ndim != 3 || d->ndim != 3 || d->shape[0] != E || gu->shape[1] != a->H || d->shape[2] != a->H ||
        d->shape[1] * 2 != gu->shape[2] || a->gate_up_bias->dtype != TP_F32 || a->down_bias->dtype != TP_F32 ||
        a->gate_up_bias->shape[0] != E || a->gate_up_bias->shape[1] != gu->shape[2] || a->down_bias->shape[0] != E ||
        a->down_bias->shape[1] != a->H)
        return tp_fail(TP_ERR_INVALID, "gpt_oss experts: gate_up_proj, down_proj and their biases do not match "
                       "[E, %lld, 2I], [E, I, %lld], [E, 2I] and [E, %lld]", (long long)a->H, (long long)a->H,
                       (long long)a->H);
    return TP_OK;
}

typedef struct {
    int64_t *start, *order;
} slot_sort;

static tp_status sort(const tp_oss_experts_args *a, slot_sort *o)
{
    int64_t E = a->gate_up->shape[0], n = a->T * a->k;
    o->start = malloc((size_t)(E + 1) * sizeof *o->start);
    o->order = malloc((size_t)(n ? n : 1) * sizeof *o->order);
    if (!o->start || !o->order) return tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)a->T);
    return tp_grouped_sort_slots(a->ids, n, E, o->start, o->order);
}

tp_status tp_oss_experts(const tp_oss_experts_args *a, float *scratch)
{
    int64_t E = a->gate_up->shape[0], H = a->H, I = a->gate_up->shape[2] / 2;
    slot_sort o = {0};
    tp_status s = check(a);
    if (!s) s = sort(a, &o);
    memset(a->out, 0, (size_t)(a->T * H) * sizeof(float));
    for (int64_t e = 0; !s && e < E; e++) {
        int64_t n = o.start[e + 1] - o.start[e];
        const int64_t *slots = o.order + o.start[e];
        if (n == 0) continue;
        float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I, *y = h + n * I;
        s = expert_rows(a, e, slots, n, xs, gu, h, y);
        for (int64_t r = 0; !s && r < n; r++) {
            float wt = a->weights[slots[r]], *out = a->out + (slots[r] / a->k) * H;
            for (int64_t i = 0; i < H; i++) out[i] += wt * y[r * H + i];
        }
    }
    free(o.start);
    free(o.order);
    return s;
}

/* ---- the backward ---------------------------------------------------------
 * Per expert, with w the slot's weight and dy its token's output gradient:
 * d w = dy·y, dY = w·dy, d down_bias += Σ dY, d down += hᵀ·dY, dh = dY·downᵀ,
 * the clamped SwiGLU's backward to d[gate, up], d gate_up_bias += its sum,
 * d gate_up += xᵀ·d[gate, up], dx = d[gate, up]·gate_upᵀ scattered back. */

static void add_rows(float *acc, const float *rows, int64_t n, int64_t w)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < w; i++) acc[i] += rows[r * w + i];
}

static tp_status expert_backward(const tp_oss_experts_args *a, const tp_oss_experts_grads *g, int64_t e,
                                 const int64_t *slots, int64_t n, float *scratch)
{
    int64_t H = a->H, k = a->k, I = a->gate_up->shape[2] / 2;
    float *xs = scratch, *gu = xs + n * H, *h = gu + n * 2 * I, *y = h + n * I, *dyr = y + n * H;
    float *dh = dyr + n * H, *dgu = dh + n * I, *dxs = dgu + n * 2 * I;
    tp_status s = expert_rows(a, e, slots, n, xs, gu, h, y);
    if (s) return s;
    tp_grouped_slot_grads(g->dy, a->weights, slots, n, k, H, y, dyr, g->dweights);
    tp_tensor wgu = expert_view(a->gate_up, e), wd = expert_view(a->down, e);
    if (g->d_down_bias) add_rows(g->d_down_bias + e * H, dyr, n, H);
    if ((s = tp_matmul_ex(dh, dyr, n, &wd, NULL, a->pool, a->opts))) return s;
    float *dwd = g->d_down ? g->d_down + e * I * H : NULL, *dwgu = g->d_gate_up ? g->d_gate_up + e * H * 2 * I : NULL;
    /* d down[e] [I, H] += hᵀ·dY: the weight gradient of a Linear [I, H] whose dy is h and x is dY */
    if (dwd && (s = tp_matmul_backward_ex(NULL, dwd, NULL, h, dyr, n, &wd, a->pool, a->opts))) return s;
    clamped_swiglu_backward(dgu, dh, gu, n, I, (float)a->alpha, (float)a->limit);
    if (g->d_gate_up_bias) add_rows(g->d_gate_up_bias + e * 2 * I, dgu, n, 2 * I);
    if (dwgu && (s = tp_matmul_backward_ex(NULL, dwgu, NULL, xs, dgu, n, &wgu, a->pool, a->opts))) return s;
    if ((s = tp_matmul_ex(dxs, dgu, n, &wgu, NULL, a->pool, a->opts))) return s;
    for (int64_t r = 0; r < n; r++) {
        float *dx = g->dx + (slots[r] / k) * H;
        for (int64_t i = 0; i < H; i++) dx[i] += dxs[r * H + i];
    }
    return TP_OK;
}

tp_status tp_oss_experts_backward(const tp_oss_experts_args *a, const tp_oss_experts_grads *g)
{
    int64_t E = a->gate_up->shape[0], H = a->H, I = a->gate_up->shape[2] / 2;
    slot_sort o = {0};
    /* an expert has at most T rows (a token chooses it once) */
    float *scratch = malloc((size_t)(a->T ? a->T : 1) * (size_t)(4 * H + 8 * I) * sizeof(float));
    tp_status s = check(a);
    if (!s && !scratch) s = tp_fail(TP_ERR_NOMEM, "out of memory for the experts' backward");
    if (!s) s = sort(a, &o);
    if (!s) memset(g->dweights, 0, (size_t)(a->T * a->k) * sizeof(float));
    for (int64_t e = 0; !s && e < E; e++)
        if (o.start[e + 1] > o.start[e])
            s = expert_backward(a, g, e, o.order + o.start[e], o.start[e + 1] - o.start[e], scratch);
    free(o.start);
    free(o.order);
    free(scratch);
    return s;
}
