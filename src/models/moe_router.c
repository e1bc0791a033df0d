/* The router of a sparse MoE block (Qwen3MoeSparseMoeBlock's and
 * MixtralSparseMoeBlock's routing): softmax over every expert in f32, the
 * top k, renormalised over the chosen ones when the model says so
 * (qwen3_moe's norm_topk_prob; Mixtral always).  Routers are small ([T, E]
 * with E ≤ a few hundred): a plain loop per token. */
#include "tp_module.h"

#include <math.h>
#include <stdlib.h>

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

void tp_moe_route_llama4(const float *logits, int64_t T, int64_t E, int64_t k, int32_t *ids, float *w)
{
    for (int64_t t = 0; t < T; t++) {
        const float *z = logits + t * E;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j && !taken; i++) taken = ids[t * k + i] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            ids[t * k + j] = (int32_t)best;
            w[t * k + j] = 1.0f / (1.0f + expf(-z[best]));
        }
    }
}

/* ---- DeepSeek (DeepseekV2Moe.route_tokens_to_experts, DeepseekV3TopkRouter) ----
 * torch.topk's order within the k does not matter: the experts' sum is
 * over the chosen set. */

/* kept[g] = 1 for the topk_group best groups of n_group, by score gs[g]
 * (the lower index first on a tie). */
static void choose_groups(const float *gs, int64_t G, int64_t keep, unsigned char *kept)
{
    for (int64_t g = 0; g < G; g++) kept[g] = 0;
    for (int64_t j = 0; j < keep; j++) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (!kept[g] && (best < 0 || gs[g] > gs[best])) best = g;
        if (best < 0) break;   /* keep <= G, which the config checks */
        kept[best] = 1;
    }
}

/* The experts of the groups not kept get `fill` in s (masked_fill), as the
 * modeling code does. */
static void mask_groups(float *s, const unsigned char *kept, int64_t E, int64_t G, float fill)
{
    for (int64_t e = 0; e < E; e++)
        if (!kept[e / (E / G)]) s[e] = fill;
}

/* V2's groups from the probabilities p (a group's score: its best one). */
static void v2_groups(const tp_model_config *c, const float *p, unsigned char *kept)
{
    int64_t E = c->num_experts, G = c->n_group, per = E / G;
    float gs[1024];
    for (int64_t g = 0; g < G; g++) {
        gs[g] = p[g * per];
        for (int64_t e = g * per; e < (g + 1) * per; e++) gs[g] = p[e] > gs[g] ? p[e] : gs[g];
    }
    choose_groups(gs, G, c->topk_group, kept);
}

/* The k largest of s[0..E) (the lower id first on a tie): ids only. */
static void top_ids(const float *s, int64_t E, int64_t k, int32_t *ids)
{
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j && !taken; i++) taken = ids[i] == e;
            if (!taken && (best < 0 || s[e] > s[best])) best = e;
        }
        ids[j] = (int32_t)best;
    }
}

/* V2: softmax in f32; greedy or group_limited_greedy; the chosen scores
 * times the scaling factor.  The weights are taken from the masked scores,
 * as torch.topk(tmp_scores) returns them: where fewer than k experts of the
 * kept groups have a probability above 0 (it underflows in f32 for router
 * logits ~104 below the best), the top k reach experts masked to 0, and
 * such a pick weighs 0, whichever of the tied experts it is. */
static void route_v2(const tp_model_config *c, float *p, float *choice, int32_t *ids, float *w)
{
    int64_t E = c->num_experts, k = c->num_experts_per_tok, G = c->n_group;
    softmax(p, E);
    for (int64_t e = 0; e < E; e++) choice[e] = p[e];
    if (c->group_limited) {
        unsigned char kept[1024];
        v2_groups(c, p, kept);
        mask_groups(choice, kept, E, G, 0.0f);
    }
    top_ids(choice, E, k, ids);
    for (int64_t j = 0; j < k; j++) w[j] = (float)(choice[ids[j]] * c->routed_scaling_factor);
}

/* V3: sigmoid scores; the choice on scores + bias, groups by the sum of
 * their two best; weights from the scores, renormalised (+1e-20) when
 * norm_topk_prob, times the scaling factor. */
static void route_v3(const tp_model_config *c, float *p, const float *bias, float *choice, int32_t *ids, float *w)
{
    int64_t E = c->num_experts, k = c->num_experts_per_tok, G = c->n_group, per = E / G;
    float gs[1024];
    for (int64_t e = 0; e < E; e++) {
        p[e] = 1.0f / (1.0f + expf(-p[e]));
        choice[e] = p[e] + (bias ? bias[e] : 0.0f);
    }
    for (int64_t g = 0; g < G; g++) {
        float a = -INFINITY, b = -INFINITY;   /* the two best of the group */
        for (int64_t e = g * per; e < (g + 1) * per; e++) {
            if (choice[e] > a) { b = a; a = choice[e]; }
            else if (choice[e] > b) b = choice[e];
        }
        gs[g] = a + b;
    }
    unsigned char kept[1024];
    choose_groups(gs, G, c->topk_group, kept);
    mask_groups(choice, kept, E, G, 0.0f);
    top_ids(choice, E, k, ids);
    float sum = 0;
    for (int64_t j = 0; j < k; j++) sum += (w[j] = p[ids[j]]);
    for (int64_t j = 0; j < k; j++) {
        if (c->norm_topk_prob) w[j] /= sum + 1e-20f;
        w[j] = (float)(w[j] * c->routed_scaling_factor);
    }
}

tp_status tp_moe_route_deepseek(const tp_model_config *c, float *logits, int64_t T, const float *bias, int32_t *ids,
                                float *w)
{
    int64_t E = c->num_experts, k = c->num_experts_per_tok;
    if (c->n_group > 1024) return tp_fail(TP_ERR_UNSUPPORTED, "n_group %lld > 1024", (long long)c->n_group);
    float *choice = malloc((size_t)E * sizeof *choice);
    if (!choice) return tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)T);
    for (int64_t t = 0; t < T; t++) {
        if (c->arch == TP_ARCH_DEEPSEEK_V3) route_v3(c, logits + t * E, bias, choice, ids + t * k, w + t * k);
        else route_v2(c, logits + t * E, choice, ids + t * k, w + t * k);
    }
    free(choice);
    return TP_OK;
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

/* ---- gpt_oss (GptOssTopKRouter) --------------------------------------------
 * The k largest logits (ties: the lower id), then a softmax over those k
 * values only; the unchosen experts get nothing. */

void tp_moe_route_topk_softmax(float *logits, int64_t T, int64_t E, int64_t k, int32_t *ids, float *w)
{
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        int32_t *id = ids + t * k;
        float *wt = w + t * k;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j && !taken; i++) taken = id[i] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            id[j] = (int32_t)best;
            wt[j] = l[best];
        }
        softmax(wt, k);
    }
}

/* The softmax's backward over the k chosen logits, dl_j = w_j·(dw_j −
 * Σ_i w_i·dw_i), zero elsewhere (none through the choice, as torch.topk);
 * w is recomputed from the logits. */
void tp_moe_route_topk_softmax_backward(const float *logits, int64_t T, int64_t E, int64_t k, const int32_t *ids,
                                        const float *dw, float *dlogits)
{
    float wt[256];
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        const int32_t *id = ids + t * k;
        float *dl = dlogits + t * E;
        for (int64_t j = 0; j < k; j++) wt[j] = l[id[j]];
        softmax(wt, k);
        double dot = 0;
        for (int64_t j = 0; j < k; j++) dot += (double)wt[j] * dw[t * k + j];
        for (int64_t e = 0; e < E; e++) dl[e] = 0.0f;
        for (int64_t j = 0; j < k; j++) dl[id[j]] = (float)(wt[j] * (dw[t * k + j] - dot));
    }
}

/* DeepSeek's backward, one token.  V2: w_j = p[id_j]·sf with p =
 * softmax(logits) (the constant 0 for a pick from a masked group), so dp
 * lands on the chosen experts and the softmax's backward spreads it.
 * V3: w_j = s_j / (Σ s + 1e-20) · sf (or s_j·sf) with s = sigmoid(logits):
 * ds_i = sf·(dw_i − Σ_j dw_j·s_j / D) / D under renormalisation, then
 * ds·s·(1 − s).  The bias only chose: no gradient
 * reaches it (a buffer in Transformers). */
static void deepseek_backward_token(const tp_model_config *c, const float *logit, const int32_t *ids,
                                    const float *dw, float *dl)
{
    int64_t E = c->num_experts, k = c->num_experts_per_tok;
    double sf = c->routed_scaling_factor;
    if (c->arch == TP_ARCH_DEEPSEEK_V3) {
        double S = 0, dot = 0;
        for (int64_t j = 0; j < k; j++) {
            double s = 1.0 / (1.0 + exp(-(double)logit[ids[j]]));
            S += s;
            dot += (double)dw[j] * s;
        }
        double D = S + 1e-20;
        for (int64_t e = 0; e < E; e++) dl[e] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            double s = 1.0 / (1.0 + exp(-(double)logit[ids[j]]));
            double ds = c->norm_topk_prob ? sf * (dw[j] - dot / D) / D : sf * dw[j];
            dl[ids[j]] = (float)(ds * s * (1.0 - s));
        }
        return;
    }
    for (int64_t e = 0; e < E; e++) dl[e] = logit[e];
    softmax(dl, E);   /* p, as the forward computed it; overwritten below */
    unsigned char kept[1024];
    if (c->group_limited) v2_groups(c, dl, kept);
    /* a pick from a masked group weighs the constant 0: no gradient */
#define LIVE(j) (!c->group_limited || kept[ids[j] / (E / c->n_group)])
    double pdp = 0;
    for (int64_t j = 0; j < k; j++)
        if (LIVE(j)) pdp += (double)dl[ids[j]] * sf * dw[j];
    for (int64_t e = 0; e < E; e++) {
        double dp = 0;   /* the ids are distinct */
        for (int64_t j = 0; j < k; j++)
            if (ids[j] == e && LIVE(j)) dp = sf * dw[j];
        dl[e] = (float)(dl[e] * (dp - pdp));
    }
#undef LIVE
}

void tp_moe_route_deepseek_backward(const tp_model_config *c, const float *logits, int64_t T, const int32_t *ids,
                                    const float *dw, float *dlogits)
{
    int64_t E = c->num_experts, k = c->num_experts_per_tok;
    for (int64_t t = 0; t < T; t++)
        deepseek_backward_token(c, logits + t * E, ids + t * k, dw + t * k, dlogits + t * E);
}
