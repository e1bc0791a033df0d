/* Multi-head latent attention (deepseek_v2, deepseek_v3), after
 * Transformers' DeepseekV2Attention / DeepseekV3Attention:
 *
 *   q      = q_proj(h), or q_b_proj(q_a_layernorm(q_a_proj(h)))   [T, nh, nope + rope]
 *   kv_a   = kv_a_proj_with_mqa(h)                                [T, kv_lora_rank + rope]
 *   k_pe   = rope(kv_a[:, kv_lora_rank:])     one rotary key shared by every head
 *   kv     = kv_b_proj(kv_a_layernorm(kv_a[:, :kv_lora_rank]))    [T, nh, nope + v]
 *   key    = [k_nope | k_pe], query = [q_nope | rope(q_pe)], value = v
 *   out    = o_proj(softmax(query · keyᵀ · scale) · value)
 *
 * The two latent norms use RMSNorm's default eps (1e-6), not
 * rms_norm_eps, as the modeling code builds them.  The rotation turns
 * interleaved pairs (DeepSeek-V2's complex product; V3's rope_interleave
 * permutes q and k alike before rotate_half, which gives the same dot
 * products) or halves (V3 without rope_interleave), with cos and sin
 * times YaRN's attention factor.  The softmax scale is
 * (nope + rope)^-1/2, times mscale(factor, mscale_all_dim)² for
 * deepseek_v3 under YaRN (DeepseekV2Attention has no such correction).
 *
 * The KV cache holds each local head's key and value after kv_b_proj (not
 * the latent): the attention kernel then runs on it unchanged.  Keys,
 * queries and values are padded with zeros to Dp = max(nope + rope, v)
 * (zeros change no dot product and no weighted sum), and the queries are
 * pre-scaled so that the kernel's 1/sqrt(Dp) gives the model's scale.
 *
 * Heads come from the local widths: under the built-in plan q (or q_b)
 * and kv_b_proj are colwise (whole heads per rank), kv_a_proj_with_mqa is
 * replicated (mla_kv_a_proj) and o_proj rowwise.
 *
 * Training keeps the latents before and after their norms, the padded
 * q/k/v the kernel read, its output and log-sum-exp, and o_proj's input;
 * the backward runs the steps in reverse.  The one collective of its own:
 * the rotary key is shared by every head, so with the heads split over the
 * ranks each rank's gradient of it is a partial sum, summed once here
 * (§2.13's AllReduceBackward on the rope part of kv_a_proj_with_mqa's
 * output); the latent's gradient arrives whole from kv_b_proj's colwise
 * backward, and q's path through q_b_proj's. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MLA_NORM_EPS 1e-6   /* DeepseekV2RMSNorm(q_lora_rank / kv_lora_rank): the default eps */

static int64_t qk_dim(const tp_model_config *c) { return c->qk_nope_head_dim + c->qk_rope_head_dim; }

int64_t tp_mla_head_dim(const tp_model_config *c)
{
    int64_t qk = qk_dim(c);
    return qk > c->v_head_dim ? qk : c->v_head_dim;
}

int64_t tp_mla_block_bound(const tp_model_config *c)
{
    int64_t nh = c->num_attention_heads;
    return c->kv_lora_rank + c->q_lora_rank + 2 * nh * tp_mla_head_dim(c) + nh * c->v_head_dim;
}

/* YaRN's attention factor on cos and sin (1 without YaRN); the softmax
 * mscale below reads the config's factor itself, as DeepseekV3Attention. */
float tp_rope_attention_factor(const tp_model_config *c)
{
    const tp_rope_scaling *rs = &c->rope_scaling;
    if (rs->kind != TP_ROPE_YARN) return 1.0f;
    if (rs->attention_factor > 0) return (float)rs->attention_factor;
    if (rs->mscale != 0 && rs->mscale_all_dim != 0)
        return (float)(tp_yarn_mscale(rs->yarn_factor, rs->mscale) / tp_yarn_mscale(rs->yarn_factor, rs->mscale_all_dim));
    return (float)tp_yarn_mscale(rs->yarn_factor, 1.0);
}

static double softmax_scale(const tp_model_config *c)
{
    double s = 1.0 / sqrt((double)qk_dim(c));
    const tp_rope_scaling *rs = &c->rope_scaling;
    if (c->arch == TP_ARCH_DEEPSEEK_V3 && rs->kind == TP_ROPE_YARN && rs->mscale_all_dim != 0) {
        double ms = tp_yarn_mscale(rs->factor, rs->mscale_all_dim);
        s *= ms * ms;
    }
    return s;
}

/* q [T, nh * qk] for this rank's heads: q_proj, or the low-rank path. */
static tp_status project_q(tp_model *m, const tp_layer_modules *L, const float *h, int64_t T, tp_act *q,
                           tp_train_acts *s, tp_saved_layer *sv)
{
    int64_t H = m->cfg.hidden_size, r = m->cfg.q_lora_rank;
    if (L->q_proj >= 0) return tp_module_linear(m, &m->modules[L->q_proj], h, T, H, q);
    tp_act qa = {0};
    tp_status st = tp_module_linear(m, &m->modules[L->q_a_proj], h, T, H, &qa);
    if (!st && qa.width != r)
        st = tp_fail(TP_ERR_UNSUPPORTED, "%s gives %lld of its %lld features on this rank; MLA needs it whole "
                     "(replicated)", m->modules[L->q_a_proj].name, (long long)qa.width, (long long)r);
    if (!st && sv && !(sv->q_lat = tp_train_save(s, qa.data, T * r))) st = TP_ERR_NOMEM;
    if (!st) tp_rmsnorm(qa.data, qa.data, tp_module_weight(&m->modules[L->q_a_layernorm]), T, r, MLA_NORM_EPS);
    if (!st && sv && !(sv->q_latn = tp_train_save(s, qa.data, T * r))) st = TP_ERR_NOMEM;
    if (!st) st = tp_module_linear(m, &m->modules[L->q_b_proj], qa.data, T, r, q);
    tp_act_release(m, &qa);
    return st;
}

/* kv_a [T, R + rope] and the normed latent c [T, R] it gives, then kv_b_proj(c). */
static tp_status project_kv(tp_model *m, const tp_layer_modules *L, const float *h, int64_t T, tp_act *kva,
                            tp_act *kv, tp_train_acts *s, tp_saved_layer *sv)
{
    const tp_model_config *c = &m->cfg;
    int64_t R = c->kv_lora_rank, W = R + c->qk_rope_head_dim;
    tp_status st = tp_module_linear(m, &m->modules[L->kv_a_proj], h, T, c->hidden_size, kva);
    if (!st && kva->width != W)
        st = tp_fail(TP_ERR_UNSUPPORTED, "%s gives %lld of its %lld features on this rank; MLA needs it whole "
                     "(replicated, mla_kv_a_proj)", m->modules[L->kv_a_proj].name, (long long)kva->width,
                     (long long)W);
    float *lat = st ? NULL : tp_act_alloc(m, T * R);
    if (!st && !lat) st = tp_fail(TP_ERR_NOMEM, "out of memory for the latent of %lld tokens", (long long)T);
    if (st) return st;
    for (int64_t t = 0; t < T; t++) memcpy(lat + t * R, kva->data + t * W, (size_t)R * sizeof(float));
    if (sv && !(sv->kv_lat = tp_train_save(s, lat, T * R))) return TP_ERR_NOMEM;
    tp_rmsnorm(lat, lat, tp_module_weight(&m->modules[L->kv_a_layernorm]), T, R, MLA_NORM_EPS);
    if (sv && !(sv->kv_latn = tp_train_save(s, lat, T * R))) return TP_ERR_NOMEM;
    return tp_module_linear(m, &m->modules[L->kv_b_proj], lat, T, R, kv);
}

/* The padded queries [T, nh, Dp] (pre-scaled) and the new cache rows. */
static void fill_heads(const tp_model_config *c, const tp_act *q, const tp_act *kva, const tp_act *kv, int64_t nh,
                       float qscale, float *Q, float *K, float *V, int64_t T)
{
    int64_t nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim, vd = c->v_head_dim;
    int64_t qk = nope + rope, Dp = tp_mla_head_dim(c), W = c->kv_lora_rank + rope;
    memset(Q, 0, (size_t)(T * nh * Dp) * sizeof(float));
    memset(K, 0, (size_t)(T * nh * Dp) * sizeof(float));
    memset(V, 0, (size_t)(T * nh * Dp) * sizeof(float));
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nh; h++) {
            const float *qs = q->data + (t * nh + h) * qk, *kvs = kv->data + (t * nh + h) * (nope + vd);
            float *qd = Q + (t * nh + h) * Dp, *kd = K + (t * nh + h) * Dp, *vdst = V + (t * nh + h) * Dp;
            for (int64_t i = 0; i < qk; i++) qd[i] = qs[i] * qscale;
            memcpy(kd, kvs, (size_t)nope * sizeof(float));
            memcpy(kd + nope, kva->data + t * W + c->kv_lora_rank, (size_t)rope * sizeof(float));
            memcpy(vdst, kvs + nope, (size_t)vd * sizeof(float));
        }
}

/* The attention of a training forward (from position 0): the kernel that
 * also gives each row's log-sum-exp, with the padded q/k/v, its output and
 * lse kept for the backward. */
static tp_status attend_train(tp_model *m, tp_train_acts *s, tp_saved_layer *sv, const float *Q,
                              const tp_kv_cache *cache, int64_t layer, float *out, int64_t T, int64_t nh)
{
    int64_t n = T * nh * tp_mla_head_dim(&m->cfg);
    sv->nq = sv->nkv = nh;
    if (!(sv->q = tp_train_save(s, Q, n)) || !(sv->k = tp_train_save(s, cache->k[layer], n)) ||
        !(sv->v = tp_train_save(s, cache->v[layer], n)) || !(sv->lse = tp_train_save(s, NULL, T * nh)))
        return TP_ERR_NOMEM;
    tp_status st = tp_attention_forward_lse(out, sv->lse, sv->q, sv->k, sv->v, T, 0, nh, nh, tp_mla_head_dim(&m->cfg),
                                            0, m->pool);
    if (!st && !(sv->o_pad = tp_train_save(s, out, n))) st = TP_ERR_NOMEM;
    return st;
}

/* f->sc.h holds input_layernorm(x); on return f->pending holds o_proj's
 * output, which post_attention_layernorm adds. */
static tp_status mla_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    const tp_model_config *c = &m->cfg;
    const tp_layer_modules *L = &m->layers[mod->layer];
    tp_kv_cache *cache = f->cache;
    int64_t T = f->T, layer = mod->layer, pos0 = cache->length, Dp = tp_mla_head_dim(c);
    int64_t qk = qk_dim(c), vd = c->v_head_dim;
    tp_saved_layer *sv = f->save ? &f->save->layers[layer] : NULL;
    if (sv && pos0 != 0) return tp_fail(TP_ERR_UNSUPPORTED, "a training forward starts at position 0");
    tp_act q = {0}, kva = {0}, kv = {0};
    tp_status st = project_q(m, L, f->sc.h, T, &q, f->save, sv);
    if (!st) st = project_kv(m, L, f->sc.h, T, &kva, &kv, f->save, sv);
    int64_t nh = q.width / qk;
    if (!st && (nh * qk != q.width || kv.width != nh * (c->qk_nope_head_dim + vd)))
        st = tp_fail(TP_ERR_UNSUPPORTED, "layer %lld: the query heads (%lld features) and kv_b_proj's heads (%lld "
                     "features) on this rank differ; shard q and kv_b_proj alike (colwise)", (long long)layer,
                     (long long)q.width, (long long)kv.width);
    if (!st && nh != cache->n_kv[layer])
        st = tp_fail(TP_ERR_INVALID, "layer %lld has %lld heads on this rank; the cache was made for %lld",
                     (long long)layer, (long long)nh, (long long)cache->n_kv[layer]);
    float *Q = st ? NULL : tp_act_alloc(m, T * nh * Dp), *out = st ? NULL : tp_act_alloc(m, T * nh * Dp);
    float *attn = st ? NULL : tp_act_alloc(m, T * nh * vd);
    if (!st && (!Q || !out || !attn)) st = tp_fail(TP_ERR_NOMEM, "out of memory for MLA of %lld tokens", (long long)T);
    if (!st) {
        float scale = tp_rope_attention_factor(c);
        tp_rope_apply_mla(q.data, T * nh, nh, qk, c->qk_nope_head_dim, c->qk_rope_head_dim, f->sc.rope, scale,
                          c->rope_interleave);
        tp_rope_apply_mla(kva.data, T, 1, kva.width, c->kv_lora_rank, c->qk_rope_head_dim, f->sc.rope, scale,
                          c->rope_interleave);
        size_t row = (size_t)(nh * Dp);
        float qscale = (float)(softmax_scale(c) * sqrt((double)Dp));
        fill_heads(c, &q, &kva, &kv, nh, qscale, Q, cache->k[layer] + (size_t)pos0 * row,
                   cache->v[layer] + (size_t)pos0 * row, T);
        if (sv) st = attend_train(m, f->save, sv, Q, cache, layer, out, T, nh);
        else tp_attention(out, Q, cache->k[layer], cache->v[layer], T, pos0, nh, nh, Dp, 0, m->pool);
        for (int64_t r = 0; r < T * nh; r++) memcpy(attn + r * vd, out + r * Dp, (size_t)vd * sizeof(float));
        if (!st && sv && !(sv->attn = tp_train_save(f->save, attn, T * nh * vd))) st = TP_ERR_NOMEM;
        if (!st) st = tp_module_linear_to_stream(m, f, &m->modules[L->o_proj], mod, attn, T, nh * vd, &f->pending);
    }
    tp_act_release(m, &kv);
    tp_act_release(m, &kva);
    tp_act_release(m, &q);
    return st;
}

/* ---- backward ------------------------------------------------------------ */

typedef struct {
    float *dattn, *dout, *dQ, *dK, *dV;   /* o_proj's input, the kernel's out, q, k, v (padded) */
    float *dq, *dkv, *dkva, *dpe;         /* the projections' outputs; the shared rotary key */
    float *dlat, *dlat_raw, *dqa, *dqa_raw, *dw;   /* the latents after / before their norms */
} mla_grads;

static void mla_grads_free(mla_grads *g)
{
    free(g->dattn); free(g->dout); free(g->dQ); free(g->dK); free(g->dV);
    free(g->dq); free(g->dkv); free(g->dkva); free(g->dpe);
    free(g->dlat); free(g->dlat_raw); free(g->dqa); free(g->dqa_raw); free(g->dw);
}

static tp_status mla_grads_alloc(const tp_model_config *c, int64_t T, int64_t nh, mla_grads *g)
{
    int64_t Dp = tp_mla_head_dim(c), qk = qk_dim(c), R = c->kv_lora_rank, r = c->q_lora_rank > 0 ? c->q_lora_rank : 1;
    int64_t wide = R > r ? R : r;
    memset(g, 0, sizeof *g);
    g->dattn = calloc((size_t)(T * nh * c->v_head_dim), sizeof(float));
    g->dout = calloc((size_t)(T * nh * Dp), sizeof(float));
    g->dQ = calloc((size_t)(T * nh * Dp), sizeof(float));
    g->dK = calloc((size_t)(T * nh * Dp), sizeof(float));
    g->dV = calloc((size_t)(T * nh * Dp), sizeof(float));
    g->dq = calloc((size_t)(T * nh * qk), sizeof(float));
    g->dkv = calloc((size_t)(T * nh * (c->qk_nope_head_dim + c->v_head_dim)), sizeof(float));
    g->dkva = calloc((size_t)(T * (R + c->qk_rope_head_dim)), sizeof(float));
    g->dpe = calloc((size_t)(T * c->qk_rope_head_dim), sizeof(float));
    g->dlat = calloc((size_t)(T * R), sizeof(float));
    g->dlat_raw = calloc((size_t)(T * R), sizeof(float));
    g->dqa = calloc((size_t)(T * r), sizeof(float));
    g->dqa_raw = calloc((size_t)(T * r), sizeof(float));
    g->dw = calloc((size_t)wide, sizeof(float));
    int ok = g->dattn && g->dout && g->dQ && g->dK && g->dV && g->dq && g->dkv && g->dkva && g->dpe && g->dlat &&
             g->dlat_raw && g->dqa && g->dqa_raw && g->dw;
    return ok ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory for the MLA backward of %lld tokens", (long long)T);
}

/* From the padded kernel gradients to those of q [T, nh * qk] (unscaled,
 * rotated back), kv_b_proj's output [T, nh * (nope + v)] and the shared
 * rotary key [T, rope] (this rank's heads' sum, rotated back). */
static void unpad_grads(const tp_model_config *c, int64_t T, int64_t nh, float qscale, const float *rope, mla_grads *g)
{
    int64_t nope = c->qk_nope_head_dim, rd = c->qk_rope_head_dim, vd = c->v_head_dim, qk = nope + rd;
    int64_t Dp = tp_mla_head_dim(c);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t at = (t * nh + h) * Dp;
            const float *dQ = g->dQ + at, *dK = g->dK + at, *dV = g->dV + at;
            float *dq = g->dq + (t * nh + h) * qk, *dkv = g->dkv + (t * nh + h) * (nope + vd);
            for (int64_t i = 0; i < qk; i++) dq[i] = dQ[i] * qscale;
            memcpy(dkv, dK, (size_t)nope * sizeof(float));
            memcpy(dkv + nope, dV, (size_t)vd * sizeof(float));
            for (int64_t i = 0; i < rd; i++) g->dpe[t * rd + i] += dK[nope + i];
        }
    float scale = tp_rope_attention_factor(c);
    tp_rope_backward_mla(g->dq, T * nh, nh, qk, nope, rd, rope, scale, c->rope_interleave);
    tp_rope_backward_mla(g->dpe, T, 1, rd, 0, rd, rope, scale, c->rope_interleave);
}

/* An MLA latent norm's backward: dy (after the norm) to dx (before), its
 * weight's gradient added. */
static tp_status latent_norm_backward(tp_model *m, const tp_module *norm, float *dx, float *dw, const float *dy,
                                      const float *x, int64_t T, int64_t n)
{
    memset(dw, 0, (size_t)n * sizeof(float));
    tp_status st = tp_rmsnorm_backward(dx, dw, dy, x, tp_module_weight(norm), T, n, MLA_NORM_EPS);
    return st ? st : tp_norm_add_weight_grad(m, norm, dw);
}

/* kv_a_proj_with_mqa's output gradient [T, R + rope]: the latent's from
 * kv_b_proj and kv_a_layernorm, the rotary key's from every head — summed
 * over the ranks when they split the heads (each holds its heads' part). */
static tp_status kv_a_grad(tp_model *m, const tp_layer_modules *L, const tp_saved_layer *sv, int64_t T, mla_grads *g)
{
    const tp_model_config *c = &m->cfg;
    int64_t R = c->kv_lora_rank, rd = c->qk_rope_head_dim, W = R + rd;
    tp_status st = tp_module_linear_backward(m, &m->modules[L->kv_b_proj], g->dkv, sv->kv_latn, T, g->dlat);
    if (!st)
        st = latent_norm_backward(m, &m->modules[L->kv_a_layernorm], g->dlat_raw, g->dw, g->dlat, sv->kv_lat, T, R);
    if (!st && sv->nq < c->num_attention_heads) {
        int64_t shape[2] = {T, rd};
        st = tp_sum_partial(m, 2, shape, g->dpe);
    }
    for (int64_t t = 0; !st && t < T; t++) {
        memcpy(g->dkva + t * W, g->dlat_raw + t * R, (size_t)R * sizeof(float));
        memcpy(g->dkva + t * W + R, g->dpe + t * rd, (size_t)rd * sizeof(float));
    }
    return st;
}

/* q's gradient into the input's: q_proj, or q_b_proj, q_a_layernorm and q_a_proj. */
static tp_status q_backward(tp_model *m, const tp_layer_modules *L, const tp_saved_layer *sv, const float *h,
                            int64_t T, mla_grads *g, float *dh)
{
    if (L->q_proj >= 0) return tp_module_linear_backward(m, &m->modules[L->q_proj], g->dq, h, T, dh);
    int64_t r = m->cfg.q_lora_rank;
    tp_status st = tp_module_linear_backward(m, &m->modules[L->q_b_proj], g->dq, sv->q_latn, T, g->dqa);
    if (!st) st = latent_norm_backward(m, &m->modules[L->q_a_layernorm], g->dqa_raw, g->dw, g->dqa, sv->q_lat, T, r);
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->q_a_proj], g->dqa_raw, h, T, dh);
    return st;
}

/* b->dx is the gradient of the attention's output: through the block's
 * rule (if any), o_proj, the attention kernel, the unpadding and rope,
 * then kv_b_proj / kv_a_layernorm / kv_a_proj_with_mqa and the q path,
 * whose input gradients (all read input_layernorm's output) are summed
 * into b->dh. */
static tp_status mla_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    const tp_model_config *c = &m->cfg;
    const tp_layer_modules *L = &m->layers[mod->layer];
    const tp_saved_layer *sv = &b->saved->layers[mod->layer];
    int64_t T = b->T, nh = sv->nq, Dp = tp_mla_head_dim(c), vd = c->v_head_dim;
    mla_grads g;
    tp_status st = mla_grads_alloc(c, T, nh, &g);
    tp_dtensor gy;
    int have = 0;
    if (!st) st = tp_module_block_output_backward(m, tp_module_block(m, mod), b->dx, T, c->hidden_size, &gy, &have);
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->o_proj], have ? gy.local.data : b->dx, sv->attn, T,
                                            g.dattn);
    if (have) tp_dtensor_release(&gy);
    for (int64_t r = 0; !st && r < T * nh; r++) memcpy(g.dout + r * Dp, g.dattn + r * vd, (size_t)vd * sizeof(float));
    if (!st) st = tp_attention_backward(g.dQ, g.dK, g.dV, g.dout, sv->q, sv->k, sv->v, sv->o_pad, sv->lse, T, 0, nh,
                                        nh, Dp, 0, m->pool);
    if (!st) {
        unpad_grads(c, T, nh, (float)(softmax_scale(c) * sqrt((double)Dp)), b->saved->rope, &g);
        st = kv_a_grad(m, L, sv, T, &g);
    }
    if (!st) {
        memset(b->dh, 0, (size_t)(T * c->hidden_size) * sizeof(float));
        st = tp_module_linear_backward(m, &m->modules[L->kv_a_proj], g.dkva, sv->h_attn, T, b->dh);
    }
    if (!st) st = q_backward(m, L, sv, sv->h_attn, T, &g, b->dh);
    mla_grads_free(&g);
    return st;
}

const tp_module_ops tp_mla_ops = {"mla", mla_forward, mla_backward};
