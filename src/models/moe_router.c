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
