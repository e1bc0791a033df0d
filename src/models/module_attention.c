/* The attention module (self_attn): q/k/v projections as one group, Qwen3's
 * per-head q/k norms, rotary embedding, the KV cache append, causal
 * attention over the cache, and o_proj, whose output joins the residual
 * stream (left pending for the next norm).  Head counts come from the width
 * of the local activations, not from the config, so a rank computes
 * exactly the heads its shards hold.  Backward (training): the
 * same steps in reverse, from what the training forward saved. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The first global head of a head-sliced activation (q, k or v). */
static int64_t first_head(const tp_model *m, const tp_module *proj, const tp_act *a, int64_t D)
{
    if (proj->tp && proj->tp->kv_rep > 1) return m->tp->rank / proj->tp->kv_rep;
    return tp_act_offset(m, a) / D;
}

/* Local query head h must read local KV head h / (nq / nkv), which is what
 * the attention kernel does; check that the plan's layout gives exactly
 * that (it does for colwise q/k/v, gathered q/k/v, and KV replication). */
static tp_status check_head_layout(const tp_model_config *c, int64_t q0, int64_t nq, int64_t k0, int64_t nkv,
                                   const char *layer)
{
    int64_t group = c->num_attention_heads / c->num_key_value_heads;
    int ok = nq > 0 && nkv > 0 && nq % nkv == 0;
    for (int64_t h = 0; ok && h < nq; h++) ok = (q0 + h) / group - k0 == h / (nq / nkv);
    if (!ok)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: this rank's query heads [%lld, %lld) do not line up with its "
                       "KV heads [%lld, %lld); shard q_proj, k_proj and v_proj alike",
                       layer, (long long)q0, (long long)(q0 + nq), (long long)k0, (long long)(k0 + nkv));
    return TP_OK;
}

typedef struct {
    tp_act q, k, v;
} qkv_acts;

static void qkv_release(tp_model *m, qkv_acts *a)
{
    tp_act_release(m, &a->q); tp_act_release(m, &a->k); tp_act_release(m, &a->v);
}

static tp_status project_qkv(tp_model *m, const tp_layer_modules *L, const float *h, int64_t T, qkv_acts *a)
{
    int64_t H = m->cfg.hidden_size;
    const tp_module *lins[3] = {&m->modules[L->q_proj], &m->modules[L->k_proj], &m->modules[L->v_proj]};
    tp_act out[3];
    tp_status s = tp_module_linear_group(m, lins, 3, h, T, H, out);
    if (s) return s;
    a->q = out[0], a->k = out[1], a->v = out[2];
    if (a->k.width != a->v.width)
        return tp_fail(TP_ERR_UNSUPPORTED, "k_proj and v_proj give %lld and %lld features on this rank; "
                       "shard them alike", (long long)a->k.width, (long long)a->v.width);
    return TP_OK;
}

/* ---- gpt_oss's attention sinks ------------------------------------------ */

/* This rank's sink logits, one per local query head (q0 the first), or NULL
 * for a model without sinks: the whole vector when replicated, the shard
 * when split with the heads (§2.16's colwise rule gives Shard(0)). */
static const float *local_sinks(const tp_model *m, const tp_module *attn, int64_t q0)
{
    if (m->cfg.arch != TP_ARCH_GPT_OSS) return NULL;
    const tp_module_param *p = &attn->params[0];
    const float *v = p->local.data;
    return p->placement.kind == TP_REPLICATE ? v + q0 : v;
}

/* A sink joins each row's softmax denominator and drops out of the output
 * (eager_attention_forward's cat, softmax, [..., :-1]): with the row's
 * log-sum-exp l of the scores and the sink s, the output scales by
 * e^l / (e^l + e^s) and the row's log-sum-exp becomes log(e^l + e^s),
 * which the backward then reads as any row's: its probabilities are the
 * ones the forward used. */
static void apply_sinks(float *out, float *lse, const float *sinks, int64_t T, int64_t nq, int64_t D)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nq; h++) {
            double l = lse[t * nq + h], sk = sinks[h], mx = l > sk ? l : sk;
            double total = mx + log(exp(l - mx) + exp(sk - mx));
            float w = (float)exp(l - total), *o = out + (t * nq + h) * D;
            for (int64_t i = 0; i < D; i++) o[i] *= w;
            lse[t * nq + h] = (float)total;
        }
}

/* The inference attention with sinks: the kernel that gives each row's
 * log-sum-exp, then the sinks. */
static tp_status attend_sinks(tp_model *m, const qkv_acts *a, tp_kv_cache *cache, int64_t layer, float *out,
                              int64_t T, int64_t pos0, int64_t nq, int64_t nkv, int64_t window, const float *sinks)
{
    int64_t D = m->cfg.head_dim;
    float *lse = malloc((size_t)(T * nq) * sizeof(float) + 1);
    if (!lse) return tp_fail(TP_ERR_NOMEM, "out of memory for the attention of %lld tokens", (long long)T);
    tp_status st = tp_attention_forward_lse(out, lse, a->q.data, cache->k[layer], cache->v[layer], T, pos0, nq, nkv,
                                            D, window, m->pool);
    if (!st) apply_sinks(out, lse, sinks, T, nq, D);
    free(lse);
    return st;
}

/* ---- Llama 4 ---------------------------------------------------------------- */

/* Llama4TextL2Norm: each head row x * rsqrt(mean(x²) + eps), no weight. */
static void l2_norm_rows(float *x, int64_t rows, int64_t D, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        float *v = x + r * D, ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += v[i] * v[i];
        float inv = 1.0f / sqrtf(ss / (float)D + (float)eps);
        for (int64_t i = 0; i < D; i++) v[i] *= inv;
    }
}

/* Llama 4's q and k: on RoPE layers the rotation of interleaved pairs (its
 * complex product) and the L2 norm after it (use_qk_norm); on NoPE
 * layers q times log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1
 * (attn_temperature_tuning). */
static float temperature(const tp_model_config *c, int64_t pos)
{
    return log1pf(floorf(((float)pos + 1.0f) / (float)c->floor_scale)) * (float)c->attn_scale + 1.0f;
}

/* sv (training): q and k after the rotation and before the L2 norm. */
static tp_status llama4_qk(const tp_model *m, int64_t layer, float *q, float *k, int64_t T, int64_t pos0,
                           int64_t nq, int64_t nkv, const float *rope, tp_train_acts *save, tp_saved_layer *sv)
{
    const tp_model_config *c = &m->cfg;
    int64_t D = c->head_dim;
    if (tp_config_layer_uses_rope(c, layer)) {
        tp_rope_apply_mla(q, T * nq, nq, D, 0, D, rope, 1.0f, 1);
        tp_rope_apply_mla(k, T * nkv, nkv, D, 0, D, rope, 1.0f, 1);
        if (sv && c->l2_qk_norm &&
            (!(sv->q_raw = tp_train_save(save, q, T * nq * D)) || !(sv->k_raw = tp_train_save(save, k, T * nkv * D))))
            return TP_ERR_NOMEM;
        if (c->l2_qk_norm) {
            l2_norm_rows(q, T * nq, D, c->rms_norm_eps);
            l2_norm_rows(k, T * nkv, D, c->rms_norm_eps);
        }
        return TP_OK;
    }
    if (!c->attn_temperature_tuning) return TP_OK;
    for (int64_t t = 0; t < T; t++) {
        float scale = temperature(c, pos0 + t);
        for (int64_t i = 0; i < nq * D; i++) q[t * nq * D + i] *= scale;
    }
    return TP_OK;
}

/* The backward of l2_norm_rows, in place: d (the output's gradient)
 * becomes the input's, x the input: dx = r·dy − x·r³·(dy·x)/D. */
static void l2_norm_backward(float *d, const float *x, int64_t rows, int64_t D, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * D;
        float *g = d + r * D, ss = 0.0f, dot = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += v[i] * v[i], dot += g[i] * v[i];
        float inv = 1.0f / sqrtf(ss / (float)D + (float)eps), c = inv * inv * inv * dot / (float)D;
        for (int64_t i = 0; i < D; i++) g[i] = inv * g[i] - v[i] * c;
    }
}

/* The backward of the interleaved rotation, in place: each pair turned
 * back by its angle. */
static void rope_interleaved_backward(float *d, int64_t T, int64_t heads, int64_t D, const float *table)
{
    int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = table + t * D, *s = c + half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = d + (t * heads + h) * D;
            for (int64_t i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * c[i] + b * s[i];
                v[2 * i + 1] = b * c[i] - a * s[i];
            }
        }
    }
}

/* From the gradients of q and k as attention read them to those of the
 * projections' outputs: the L2 norm and the rotation, or the temperature. */
static void llama4_qk_backward(const tp_model *m, int64_t layer, const tp_saved_layer *sv, float *dq, float *dk,
                               int64_t T, const float *rope)
{
    const tp_model_config *c = &m->cfg;
    int64_t D = c->head_dim, nq = sv->nq, nkv = sv->nkv;
    if (tp_config_layer_uses_rope(c, layer)) {
        if (c->l2_qk_norm) {
            l2_norm_backward(dq, sv->q_raw, T * nq, D, c->rms_norm_eps);
            l2_norm_backward(dk, sv->k_raw, T * nkv, D, c->rms_norm_eps);
        }
        rope_interleaved_backward(dq, T, nq, D, rope);
        rope_interleaved_backward(dk, T, nkv, D, rope);
        return;
    }
    if (!c->attn_temperature_tuning) return;
    for (int64_t t = 0; t < T; t++) {
        float scale = temperature(c, t);   /* a training forward starts at position 0 */
        for (int64_t i = 0; i < nq * D; i++) dq[t * nq * D + i] *= scale;
    }
}

/* ---- training: what the backward reads ---------------------------------- */

static tp_status save_raw(tp_train_acts *s, tp_saved_layer *sv, const tp_layer_modules *L, const qkv_acts *a,
                          int64_t T, int64_t nq, int64_t nkv, int64_t D)
{
    sv->nq = nq, sv->nkv = nkv;
    if (L->q_norm < 0) return TP_OK;
    sv->q_raw = tp_train_save(s, a->q.data, T * nq * D);
    sv->k_raw = tp_train_save(s, a->k.data, T * nkv * D);
    return sv->q_raw && sv->k_raw ? TP_OK : TP_ERR_NOMEM;
}

/* The attention of a training forward: the same result through the kernel
 * that also gives each row's log-sum-exp; q/k/v after the rotation, the
 * output and lse are kept.  Training runs from position 0. */
static tp_status attend_train(tp_model *m, tp_train_acts *s, tp_saved_layer *sv, const qkv_acts *a,
                              tp_kv_cache *cache, int64_t layer, float *out, int64_t T, int64_t pos0,
                              const float *sinks)
{
    const tp_model_config *c = &m->cfg;
    int64_t D = c->head_dim, nq = sv->nq, nkv = sv->nkv;
    if (pos0 != 0) return tp_fail(TP_ERR_UNSUPPORTED, "a training forward starts at position 0");
    if (!(sv->q = tp_train_save(s, a->q.data, T * nq * D)) || !(sv->k = tp_train_save(s, a->k.data, T * nkv * D)) ||
        !(sv->v = tp_train_save(s, a->v.data, T * nkv * D)) || !(sv->lse = tp_train_save(s, NULL, T * nq)))
        return TP_ERR_NOMEM;
    tp_status st = tp_attention_forward_lse(out, sv->lse, sv->q, cache->k[layer], cache->v[layer], T, pos0, nq,
                                            nkv, D, tp_config_layer_window(c, layer), m->pool);
    if (!st && sinks) apply_sinks(out, sv->lse, sinks, T, nq, D);
    if (!st && !(sv->attn = tp_train_save(s, out, T * nq * D))) st = TP_ERR_NOMEM;
    return st;
}

/* f->sc.h holds input_layernorm(x); on return f->pending holds the
 * attention output (o_proj's), which post_attention_layernorm adds. */
static tp_status attention_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    const tp_model_config *c = &m->cfg;
    const tp_layer_modules *L = &m->layers[mod->layer];
    tp_kv_cache *cache = f->cache;
    fwd_scratch *sc = &f->sc;
    int64_t D = c->head_dim, pos0 = cache->length, T = f->T, layer = mod->layer;
    qkv_acts a = {0};
    tp_status st = project_qkv(m, L, sc->h, T, &a);
    int64_t nq = a.q.width / D, nkv = a.k.width / D;
    char where[48];
    snprintf(where, sizeof where, "layer %lld", (long long)layer);
    int64_t q0 = st ? 0 : first_head(m, &m->modules[L->q_proj], &a.q, D), window = tp_config_layer_window(c, layer);
    const float *sinks = local_sinks(m, mod, q0);
    if (!st) st = check_head_layout(c, q0, nq, first_head(m, &m->modules[L->k_proj], &a.k, D), nkv, where);
    if (!st && nkv != cache->n_kv[layer])
        st = tp_fail(TP_ERR_INVALID, "%s has %lld KV heads on this rank; the cache was made for %lld",
                     where, (long long)nkv, (long long)cache->n_kv[layer]);
    tp_saved_layer *sv = f->save ? &f->save->layers[layer] : NULL;
    if (!st && sv) st = save_raw(f->save, sv, L, &a, T, nq, nkv, D);
    if (!st) {
        if (L->q_norm >= 0) {   /* Qwen3 normalises each head before the rotation */
            tp_par_rmsnorm(m, a.q.data, a.q.data, tp_module_weight(&m->modules[L->q_norm]), T * nq, D);
            tp_par_rmsnorm(m, a.k.data, a.k.data, tp_module_weight(&m->modules[L->k_norm]), T * nkv, D);
        }
        if (c->llama4) {
            st = llama4_qk(m, layer, a.q.data, a.k.data, T, pos0, nq, nkv, sc->rope, f->save, sv);
        } else {
            tp_par_rope(m, a.q.data, T, nq, D, sc->rope);
            tp_par_rope(m, a.k.data, T, nkv, D, sc->rope);
        }
        size_t row = (size_t)(nkv * D);
        if (st) { qkv_release(m, &a); return st; }
        memcpy(cache->k[layer] + (size_t)pos0 * row, a.k.data, (size_t)T * row * sizeof(float));
        memcpy(cache->v[layer] + (size_t)pos0 * row, a.v.data, (size_t)T * row * sizeof(float));
        if (sv) st = attend_train(m, f->save, sv, &a, cache, layer, sc->attn, T, pos0, sinks);
        else if (sinks) st = attend_sinks(m, &a, cache, layer, sc->attn, T, pos0, nq, nkv, window, sinks);
        else
            tp_attention(sc->attn, a.q.data, cache->k[layer], cache->v[layer], T, pos0, nq, nkv, D, window,
                         m->pool);
        if (!st) st = tp_module_linear_to_stream(m, f, &m->modules[L->o_proj], mod, sc->attn, T, nq * D, &f->pending);
    }
    qkv_release(m, &a);
    return st;
}

/* ---- backward ------------------------------------------------------------ */

#define TP_HEAD_DIM_MAX 1024

typedef struct {
    float *dattn, *dq, *dk, *dv, *draw;   /* draw: q or k before its norm */
} attn_grads;

static void attn_grads_free(attn_grads *g)
{
    free(g->dattn); free(g->dq); free(g->dk); free(g->dv); free(g->draw);
}

/* The gradient d of Qwen3's per-head norm's output, made the gradient of
 * its input (raw), in place. */
static tp_status head_norm_backward(tp_model *m, const tp_module *norm, float *d, float *scratch, const float *raw,
                                    int64_t rows)
{
    int64_t D = m->cfg.head_dim;
    float dw[TP_HEAD_DIM_MAX] = {0};
    if (D > TP_HEAD_DIM_MAX) return tp_fail(TP_ERR_UNSUPPORTED, "head_dim %lld > %d", (long long)D, TP_HEAD_DIM_MAX);
    memset(scratch, 0, (size_t)(rows * D) * sizeof(float));
    tp_status st = tp_rmsnorm_backward(scratch, dw, d, raw, tp_module_weight(norm), rows, D, m->cfg.rms_norm_eps);
    if (!st) st = tp_norm_add_weight_grad(m, norm, dw);
    if (!st) memcpy(d, scratch, (size_t)(rows * D) * sizeof(float));
    return st;
}

/* From the gradient of the attention output to those of q, k and v as the
 * projections gave them: attention, rope and (Qwen3) the q/k norms. */
static tp_status core_backward(tp_model *m, const tp_layer_modules *L, const tp_saved_layer *sv,
                               const float *rope, int64_t T, attn_grads *g, int64_t layer)
{
    int64_t D = m->cfg.head_dim, nq = sv->nq, nkv = sv->nkv;
    tp_status st = tp_attention_backward(g->dq, g->dk, g->dv, g->dattn, sv->q, sv->k, sv->v, sv->attn, sv->lse, T,
                                         0, nq, nkv, D, tp_config_layer_window(&m->cfg, layer), m->pool);
    if (st) return st;
    if (m->cfg.llama4) { llama4_qk_backward(m, layer, sv, g->dq, g->dk, T, rope); return TP_OK; }
    tp_rope_backward(g->dq, T, nq, D, rope);
    tp_rope_backward(g->dk, T, nkv, D, rope);
    if (L->q_norm < 0) return TP_OK;
    st = head_norm_backward(m, &m->modules[L->q_norm], g->dq, g->draw, sv->q_raw, T * nq);
    if (!st) st = head_norm_backward(m, &m->modules[L->k_norm], g->dk, g->draw, sv->k_raw, T * nkv);
    return st;
}

/* The sinks' gradient from that of the attention output dout: with the
 * sink's probability P_s = e^(s − lse') of each row (lse' the row's
 * log-sum-exp with the sink) and D = dout·out, ds = −Σ_rows P_s·D (the
 * softmax's backward on the sink's column, whose value column is zero).
 * A rank adds only its own heads' sums, so replicated sinks need the
 * heads whole. */
static tp_status sinks_backward(tp_model *m, const tp_module *mod, const tp_saved_layer *sv, const float *dout,
                                int64_t T)
{
    const tp_module_param *p = &mod->params[0];
    int64_t D = m->cfg.head_dim, nq = sv->nq;
    if (p->placement.kind == TP_REPLICATE && nq != m->cfg.num_attention_heads)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s.sinks: training with the query heads split needs the sinks split with "
                       "them (colwise with local_params on self_attn, §2.16); here they are replicated", mod->name);
    float *g;
    tp_status st = tp_module_grad(m, mod, 0, &g);
    if (st || !g) return st;   /* NULL: frozen (a LoRA run) */
    const float *sk = p->local.data;
    for (int64_t h = 0; h < nq; h++) {
        double sum = 0;
        for (int64_t t = 0; t < T; t++) {
            const float *o = sv->attn + (t * nq + h) * D, *d = dout + (t * nq + h) * D;
            double dot = 0;
            for (int64_t i = 0; i < D; i++) dot += (double)d[i] * o[i];
            sum += exp((double)sk[h] - sv->lse[t * nq + h]) * dot;
        }
        g[h] += (float)-sum;
    }
    return TP_OK;
}

/* b->dx is the gradient of the attention's output: through the block's
 * rule (if any), o_proj, the
 * attention, rope, the q/k norms and q/k/v, whose input gradients (all
 * three read input_layernorm's output) are summed into b->dh. */
static tp_status attention_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    const tp_layer_modules *L = &m->layers[mod->layer];
    const tp_saved_layer *sv = &b->saved->layers[mod->layer];
    int64_t T = b->T, D = m->cfg.head_dim, nq = sv->nq, nkv = sv->nkv;
    size_t qn = (size_t)(T * nq * D), kn = (size_t)(T * nkv * D);
    attn_grads g = {calloc(qn, sizeof(float)), calloc(qn, sizeof(float)), calloc(kn, sizeof(float)),
                    calloc(kn, sizeof(float)), calloc(qn, sizeof(float))};
    tp_status st = g.dattn && g.dq && g.dk && g.dv && g.draw ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_dtensor gy;
    int have = 0;
    if (!st) st = tp_module_block_output_backward(m, tp_module_block(m, mod), b->dx, T, m->cfg.hidden_size, &gy, &have);
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->o_proj], have ? gy.local.data : b->dx, sv->attn, T,
                                            g.dattn);
    if (have) tp_dtensor_release(&gy);
    if (!st && m->cfg.arch == TP_ARCH_GPT_OSS) st = sinks_backward(m, mod, sv, g.dattn, T);
    if (!st) st = core_backward(m, L, sv, b->saved->rope, T, &g, mod->layer);
    if (!st) {
        memset(b->dh, 0, (size_t)(T * m->cfg.hidden_size) * sizeof(float));
        st = tp_module_linear_backward(m, &m->modules[L->q_proj], g.dq, sv->h_attn, T, b->dh);
    }
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->k_proj], g.dk, sv->h_attn, T, b->dh);
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->v_proj], g.dv, sv->h_attn, T, b->dh);
    attn_grads_free(&g);
    return st;
}

const tp_module_ops tp_attention_ops = {"attention", attention_forward, attention_backward};
