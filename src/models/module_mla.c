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
 * replicated (mla_kv_a_proj) and o_proj rowwise.  Training is refused. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <math.h>
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
static tp_status project_q(tp_model *m, const tp_layer_modules *L, const float *h, int64_t T, tp_act *q)
{
    int64_t H = m->cfg.hidden_size, r = m->cfg.q_lora_rank;
    if (L->q_proj >= 0) return tp_module_linear(m, &m->modules[L->q_proj], h, T, H, q);
    tp_act qa = {0};
    tp_status st = tp_module_linear(m, &m->modules[L->q_a_proj], h, T, H, &qa);
    if (!st && qa.width != r)
        st = tp_fail(TP_ERR_UNSUPPORTED, "%s gives %lld of its %lld features on this rank; MLA needs it whole "
                     "(replicated)", m->modules[L->q_a_proj].name, (long long)qa.width, (long long)r);
    if (!st) {
        tp_rmsnorm(qa.data, qa.data, tp_module_weight(&m->modules[L->q_a_layernorm]), T, r, MLA_NORM_EPS);
        st = tp_module_linear(m, &m->modules[L->q_b_proj], qa.data, T, r, q);
    }
    tp_act_release(m, &qa);
    return st;
}

/* kv_a [T, R + rope] and the normed latent c [T, R] it gives, then kv_b_proj(c). */
static tp_status project_kv(tp_model *m, const tp_layer_modules *L, const float *h, int64_t T, tp_act *kva,
                            tp_act *kv)
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
    tp_rmsnorm(lat, lat, tp_module_weight(&m->modules[L->kv_a_layernorm]), T, R, MLA_NORM_EPS);
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

/* f->sc.h holds input_layernorm(x); on return f->pending holds o_proj's
 * output, which post_attention_layernorm adds. */
static tp_status mla_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    const tp_model_config *c = &m->cfg;
    const tp_layer_modules *L = &m->layers[mod->layer];
    tp_kv_cache *cache = f->cache;
    int64_t T = f->T, layer = mod->layer, pos0 = cache->length, Dp = tp_mla_head_dim(c);
    int64_t qk = qk_dim(c), vd = c->v_head_dim;
    if (f->save)
        return tp_fail(TP_ERR_UNSUPPORTED, "training %s (multi-head latent attention) is not supported yet",
                       c->model_type);
    tp_act q = {0}, kva = {0}, kv = {0};
    tp_status st = project_q(m, L, f->sc.h, T, &q);
    if (!st) st = project_kv(m, L, f->sc.h, T, &kva, &kv);
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
        tp_attention(out, Q, cache->k[layer], cache->v[layer], T, pos0, nh, nh, Dp, 0, m->pool);
        for (int64_t r = 0; r < T * nh; r++) memcpy(attn + r * vd, out + r * Dp, (size_t)vd * sizeof(float));
        st = tp_module_linear_to_stream(m, f, &m->modules[L->o_proj], mod, attn, T, nh * vd, &f->pending);
    }
    tp_act_release(m, &kv);
    tp_act_release(m, &kva);
    tp_act_release(m, &q);
    return st;
}

static tp_status mla_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    (void)mod; (void)b;
    return tp_fail(TP_ERR_UNSUPPORTED, "training %s (multi-head latent attention) is not supported yet",
                   m->cfg.model_type);
}

const tp_module_ops tp_mla_ops = {"mla", mla_forward, mla_backward};
