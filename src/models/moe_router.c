/* The router of a sparse MoE block (Qwen3MoeSparseMoeBlock's and
 * MixtralSparseMoeBlock's routing): softmax over every expert in f32, the
 * top k, renormalised over the chosen ones when the model says so
 * (qwen3_moe's norm_topk_prob; Mixtral always).  Routers are small ([T, E]
 * with E ≤ a few hundred): a plain loop per token. */
#include "tp_module.h"

#include <math.h>

/* x[0..E) becomes its softmax, in place. */
static void softmax(float *x, int64_t E)
{
    float mx = x[0];
    for (int64_t e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    double sum = 0;
    for (int64_t e = 0; e < E; e++) sum += (x[e] = expf(x[e] - mx));
    for (int64_t e = 0; e < E; e++) x[e] = (float)(x[e] / sum);
}

/* The k largest of p[0..E) in descending order, the lower id first on a
 * tie; each chosen one is marked by a negative value. */
static void top_k(float *p, int64_t E, int64_t k, int32_t *ids, float *w)
{
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (p[e] >= 0 && (best < 0 || p[e] > p[best])) best = e;
        ids[j] = (int32_t)best;
        w[j] = p[best];
        p[best] = -1.0f;
    }
}

void tp_moe_route(float *logits, int64_t T, int64_t E, int64_t k, int renorm, int32_t *ids, float *w)
{
    for (int64_t t = 0; t < T; t++) {
        float *p = logits + t * E;
        softmax(p, E);
        top_k(p, E, k, ids + t * k, w + t * k);
        if (!renorm) continue;
        double sum = 0;
        for (int64_t j = 0; j < k; j++) sum += w[t * k + j];
        for (int64_t j = 0; j < k; j++) w[t * k + j] = (float)(w[t * k + j] / sum);
    }
}

/* With p = softmax(logits), s_j = p[ids_j] and w_j = s_j / Σ s (or s_j):
 * ds_j = (dw_j − Σ_i dw_i·w_i) / Σ s under renormalisation (else dw_j),
 * which lands on the chosen experts only (no gradient through the choice
 * itself, as torch.topk), then the softmax's backward
 * dlogit_e = p_e·(dp_e − Σ_j ds_j·s_j). */
static void route_backward_token(const float *logit, int64_t E, int64_t k, int renorm, const int32_t *ids,
                                 const float *dw, float *dl)
{
    float mx = logit[0];
    for (int64_t e = 1; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
    double sum = 0, S = 0, dot = 0, sds = 0;
    for (int64_t e = 0; e < E; e++) sum += (dl[e] = expf(logit[e] - mx));
    for (int64_t e = 0; e < E; e++) dl[e] = (float)(dl[e] / sum);   /* p, overwritten in place below */
    for (int64_t j = 0; j < k; j++) S += dl[ids[j]];
    for (int64_t j = 0; j < k; j++) dot += (double)dw[j] * (dl[ids[j]] / S);
#define DS(j) (renorm ? (dw[j] - dot) / S : (double)dw[j])
    for (int64_t j = 0; j < k; j++) sds += DS(j) * dl[ids[j]];
    for (int64_t e = 0; e < E; e++) {
        double dp = 0;   /* zero off the chosen experts (the ids are distinct) */
        for (int64_t j = 0; j < k; j++)
            if (ids[j] == e) dp = DS(j);
        dl[e] = (float)(dl[e] * (dp - sds));
    }
#undef DS
}

void tp_moe_route_backward(const float *logits, int64_t T, int64_t E, int64_t k, int renorm, const int32_t *ids,
                           const float *dw, float *dlogits)
{
    for (int64_t t = 0; t < T; t++)
        route_backward_token(logits + t * E, E, k, renorm, ids + t * k, dw + t * k, dlogits + t * E);
}
