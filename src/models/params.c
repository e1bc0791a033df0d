/* The module table and the parameter table derived from it.  This file is
 * the one place where a module or parameter name is spelled: loading,
 * make-model and the TP plan all walk tp_model_params, which walks the
 * module table built here. */
#include "tp_module.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    tp_module *v;
    size_t n, cap;
} table;

/* Appends a module under `parent` (-1: a root), named "<parent>.<suffix>"
 * (a root: "<suffix>"), and links it as the parent's last child; *index
 * receives its position. */
static tp_status add_module(table *t, int parent, tp_module_type type, int64_t layer, int *index,
                            const char *suffix)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        tp_module *nv = realloc(t->v, cap * sizeof *nv);
        if (!nv) return tp_fail(TP_ERR_NOMEM, "out of memory");
        t->v = nv;
        t->cap = cap;
    }
    tp_module *mod = &t->v[t->n];
    memset(mod, 0, sizeof *mod);
    int len = parent >= 0 ? snprintf(mod->name, sizeof mod->name, "%s.%s", t->v[parent].name, suffix)
                          : snprintf(mod->name, sizeof mod->name, "%s", suffix);
    if (len < 0 || (size_t)len >= sizeof mod->name)
        return tp_fail(TP_ERR_INTERNAL, "the module name %s... is too long", mod->name);
    mod->type = type;
    mod->layer = layer;
    mod->parent = parent;
    mod->first_child = mod->next_sibling = -1;
    mod->ops = tp_module_ops_of(type);
    *index = (int)t->n++;
    if (parent >= 0) {
        int *link = &t->v[parent].first_child;
        while (*link >= 0) link = &t->v[*link].next_sibling;
        *link = *index;
    }
    return TP_OK;
}

tp_status tp_module_add_param(tp_module *mod, const char *suffix, tp_param_kind kind, int ndim,
                              const int64_t *shape)
{
    if (mod->n_params == TP_MODULE_MAX_PARAMS || ndim < 1 || ndim > TP_MAX_DIMS)
        return tp_fail(TP_ERR_INTERNAL, "%s: a parameter of %d dimensions does not fit (%d parameters)",
                       mod->name, ndim, mod->n_params);
    tp_module_param *p = &mod->params[mod->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->suffix, sizeof p->suffix, "%s", suffix);
    p->kind = kind;
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
    p->slice.dim = -1;
    p->slice.ndim = ndim;
    memcpy(p->slice.local_shape, shape, (size_t)ndim * sizeof *shape);
    p->placement = tp_replicate();
    p->tied_to = -1;
    return TP_OK;
}

static tp_status add_linear(table *t, int parent, int64_t layer, int bias, int64_t out, int64_t in, int *index,
                            const char *name)
{
    tp_status s = add_module(t, parent, TP_MT_LINEAR, layer, index, name);
    if (!s) s = tp_module_add_param(&t->v[*index], "weight", TP_PARAM_WEIGHT, 2, (int64_t[2]){out, in});
    if (!s && bias) s = tp_module_add_param(&t->v[*index], "bias", TP_PARAM_BIAS, 1, &out);
    return s;
}

static tp_status add_norm(table *t, int parent, int64_t layer, int64_t width, int *index, const char *name)
{
    tp_status s = add_module(t, parent, TP_MT_NORM, layer, index, name);
    return s ? s : tp_module_add_param(&t->v[*index], "weight", TP_PARAM_NORM, 1, &width);
}

/* DeepSeek's self_attn in DeepseekV2Attention's order: q_proj or q_a_proj,
 * q_a_layernorm, q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj;
 * o_proj.  It runs through tp_mla_ops (module_mla.c). */
static tp_status add_mla(table *t, const tp_model_config *c, tp_layer_modules *L, int64_t l)
{
    int64_t H = c->hidden_size, nh = c->num_attention_heads, R = c->kv_lora_rank;
    int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    int a;
    tp_status s = add_module(t, L->layer, TP_MT_ATTENTION, l, &a, "self_attn");
    if (s) return s;
    L->self_attn = a;
    t->v[a].ops = &tp_mla_ops;
    if (c->q_lora_rank > 0) {
        if ((s = add_linear(t, a, l, 0, c->q_lora_rank, H, &L->q_a_proj, "q_a_proj")) ||
            (s = add_norm(t, a, l, c->q_lora_rank, &L->q_a_layernorm, "q_a_layernorm")) ||
            (s = add_linear(t, a, l, 0, nh * qk, c->q_lora_rank, &L->q_b_proj, "q_b_proj")))
            return s;
    } else if ((s = add_linear(t, a, l, 0, nh * qk, H, &L->q_proj, "q_proj"))) {
        return s;
    }
    if ((s = add_linear(t, a, l, 0, R + c->qk_rope_head_dim, H, &L->kv_a_proj, "kv_a_proj_with_mqa")) ||
        (s = add_norm(t, a, l, R, &L->kv_a_layernorm, "kv_a_layernorm")) ||
        (s = add_linear(t, a, l, 0, nh * (c->qk_nope_head_dim + c->v_head_dim), R, &L->kv_b_proj, "kv_b_proj")))
        return s;
    return add_linear(t, a, l, 0, H, nh * c->v_head_dim, &L->o_proj, "o_proj");
}

static tp_status add_attention(table *t, const tp_model_config *c, tp_layer_modules *L, int64_t l)
{
    if (c->mla) return add_mla(t, c, L, l);
    int64_t H = c->hidden_size, D = c->head_dim;
    int64_t qdim = c->num_attention_heads * D, kvdim = c->num_key_value_heads * D;
    int qkv_bias = c->attention_bias || c->qkv_bias;
    int a;
    tp_status s = add_module(t, L->layer, TP_MT_ATTENTION, l, &a, "self_attn");
    if (s) return s;
    L->self_attn = a;
    if ((s = add_linear(t, a, l, qkv_bias, qdim, H, &L->q_proj, "q_proj")) ||
        (s = add_linear(t, a, l, qkv_bias, kvdim, H, &L->k_proj, "k_proj")) ||
        (s = add_linear(t, a, l, qkv_bias, kvdim, H, &L->v_proj, "v_proj")) ||
        (s = add_linear(t, a, l, c->attention_bias, H, qdim, &L->o_proj, "o_proj")))
        return s;
    if (c->qk_norm && ((s = add_norm(t, a, l, D, &L->q_norm, "q_norm")) || (s = add_norm(t, a, l, D, &L->k_norm, "k_norm"))))
        return s;
    /* gpt_oss: one learned sink logit per query head, a bare parameter of
     * self_attn that the attention's own code reads */
    if (c->arch == TP_ARCH_GPT_OSS)
        return tp_module_add_param(&t->v[a], "sinks", TP_PARAM_OTHER, 1, &c->num_attention_heads);
    return TP_OK;
}

/* The feed-forward block's name: Llama 4 calls it feed_forward. */
static const char *ffn_name(const tp_model_config *c) { return c->llama4 ? "feed_forward" : "mlp"; }

/* A gated MLP `name` under parent, I wide: gate_proj, up_proj [I, H],
 * down_proj [H, I] (a dense layer's, DeepSeek's shared experts, Llama 4's
 * shared expert). */
static tp_status add_gated_mlp(table *t, int parent, int64_t l, const char *name, int64_t I, int64_t H, int *mlp,
                               int *gate, int *up, int *down)
{
    tp_status s = add_module(t, parent, TP_MT_MLP, l, mlp, name);
    if (!s) s = add_linear(t, *mlp, l, 0, I, H, gate, "gate_proj");
    if (!s) s = add_linear(t, *mlp, l, 0, I, H, up, "up_proj");
    if (!s) s = add_linear(t, *mlp, l, 0, H, I, down, "down_proj");
    return s;
}

static tp_status add_mlp(table *t, const tp_model_config *c, tp_layer_modules *L, int64_t l)
{
    int64_t I = c->llama4 ? c->intermediate_size_mlp : c->intermediate_size;
    return add_gated_mlp(t, L->layer, l, ffn_name(c), I, c->hidden_size, &L->mlp, &L->gate_proj, &L->up_proj,
                         &L->down_proj);
}

/* A sparse layer's mlp (qwen3_moe, mixtral, as Transformers builds them
 * after the checkpoint conversion of §6.1): the router `gate` [E, H] and
 * the experts' stacked tensors. */
static tp_status add_moe(table *t, const tp_model_config *c, tp_layer_modules *L, int64_t l)
{
    int64_t H = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
    tp_status s = add_module(t, L->layer, TP_MT_MOE, l, &L->mlp, "mlp");
    if (!s) s = add_linear(t, L->mlp, l, 0, E, H, &L->router, "gate");
    if (!s) s = add_module(t, L->mlp, TP_MT_EXPERTS, l, &L->experts, "experts");
    if (!s) s = tp_module_add_param(&t->v[L->experts], "gate_up_proj", TP_PARAM_WEIGHT, 3, (int64_t[3]){E, 2 * I, H});
    if (!s) s = tp_module_add_param(&t->v[L->experts], "down_proj", TP_PARAM_WEIGHT, 3, (int64_t[3]){E, H, I});
    /* DeepSeek: V3's router carries the bias its choice adds (a buffer of
     * the checkpoint), and n_shared_experts dense experts run as one MLP. */
    if (!s && c->arch == TP_ARCH_DEEPSEEK_V3)
        s = tp_module_add_param(&t->v[L->router], "e_score_correction_bias", TP_PARAM_BIAS, 1, &E);
    if (!s && c->mla && c->n_shared_experts > 0)
        s = add_gated_mlp(t, L->mlp, l, "shared_experts", I * c->n_shared_experts, H, &L->shared_experts,
                          &L->shared_gate, &L->shared_up, &L->shared_down);
    return s;
}

/* gpt_oss's mlp (GptOssMLP) as its checkpoint stores it: the router, a
 * Linear [E, H] with a bias, and the experts in Transformers' own layout —
 * gate_up_proj [E, H, 2I] (gate and up interleaved along the last
 * dimension) with gate_up_proj_bias [E, 2I], down_proj [E, I, H] with
 * down_proj_bias [E, H]; no conversion at load or save. */
static tp_status add_gpt_oss_moe(table *t, const tp_model_config *c, tp_layer_modules *L, int64_t l)
{
    int64_t H = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
    tp_status s = add_module(t, L->layer, TP_MT_MOE, l, &L->mlp, "mlp");
    if (!s) s = add_linear(t, L->mlp, l, 1, E, H, &L->router, "router");
    if (!s) s = add_module(t, L->mlp, TP_MT_EXPERTS, l, &L->experts, "experts");
    tp_module *x = s ? NULL : &t->v[L->experts];
    if (!s) s = tp_module_add_param(x, "gate_up_proj", TP_PARAM_WEIGHT, 3, (int64_t[3]){E, H, 2 * I});
    if (!s) s = tp_module_add_param(x, "gate_up_proj_bias", TP_PARAM_BIAS, 2, (int64_t[2]){E, 2 * I});
    if (!s) s = tp_module_add_param(x, "down_proj", TP_PARAM_WEIGHT, 3, (int64_t[3]){E, I, H});
    if (!s) s = tp_module_add_param(x, "down_proj_bias", TP_PARAM_BIAS, 2, (int64_t[2]){E, H});
    return s;
}

/* Llama 4's feed_forward in Llama4TextMoe's order: the bmm-style experts
 * (gate_up_proj [E, H, 2I] used as x @ W, down_proj [E, I, H]), the
 * router [E, H] and the shared expert, a dense MLP of width I. */
static tp_status add_llama4_moe(table *t, const tp_model_config *c, tp_layer_modules *L, int64_t l)
{
    int64_t H = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
    tp_status s = add_module(t, L->layer, TP_MT_MOE, l, &L->mlp, "feed_forward");
    if (!s) s = add_module(t, L->mlp, TP_MT_EXPERTS, l, &L->experts, "experts");
    if (!s) s = tp_module_add_param(&t->v[L->experts], "gate_up_proj", TP_PARAM_WEIGHT, 3, (int64_t[3]){E, H, 2 * I});
    if (!s) s = tp_module_add_param(&t->v[L->experts], "down_proj", TP_PARAM_WEIGHT, 3, (int64_t[3]){E, I, H});
    if (!s) s = add_linear(t, L->mlp, l, 0, E, H, &L->router, "router");
    if (!s)
        s = add_gated_mlp(t, L->mlp, l, "shared_expert", I, H, &L->shared_experts, &L->shared_gate, &L->shared_up,
                          &L->shared_down);
    return s;
}

/* model.layers.l: input_layernorm, self_attn, post_attention_layernorm,
 * mlp — the order of the checkpoint's tensors and of the forward pass. */
static tp_status add_layer(table *t, const tp_model_config *c, int model, int64_t l, tp_layer_modules *L)
{
    char name[32];
    snprintf(name, sizeof name, "layers.%lld", (long long)l);
    memset(L, -1, sizeof *L);
    tp_status s = add_module(t, model, TP_MT_DECODER_LAYER, l, &L->layer, name);
    if (!s) s = add_norm(t, L->layer, l, c->hidden_size, &L->input_layernorm, "input_layernorm");
    if (!s) s = add_attention(t, c, L, l);
    if (!s) s = add_norm(t, L->layer, l, c->hidden_size, &L->post_attention_layernorm, "post_attention_layernorm");
    if (!s && c->arch == TP_ARCH_GPT_OSS) s = add_gpt_oss_moe(t, c, L, l);
    else if (!s) s = !tp_config_layer_is_sparse(c, l) ? add_mlp(t, c, L, l)
                    : c->llama4 ? add_llama4_moe(t, c, L, l) : add_moe(t, c, L, l);
    return s;
}

/* The whole table; layers (optional) receives each layer's indices and
 * top[3] the embedding, final norm and lm_head. */
static tp_status build(const tp_model_config *c, table *t, tp_layer_modules *layers, int top[3])
{
    int model, emb, norm, head;
    int64_t V = c->vocab_size, H = c->hidden_size;
    tp_status s = add_module(t, -1, TP_MT_CONTAINER, -1, &model, "model");
    if (!s) s = add_module(t, model, TP_MT_EMBEDDING, -1, &emb, "embed_tokens");
    if (!s) s = tp_module_add_param(&t->v[emb], "weight", TP_PARAM_EMBEDDING, 2, (int64_t[2]){V, H});
    for (int64_t l = 0; !s && l < c->num_hidden_layers; l++) {
        tp_layer_modules scratch;
        s = add_layer(t, c, model, l, layers ? &layers[l] : &scratch);
    }
    if (!s) s = add_norm(t, model, -1, H, &norm, "norm");
    if (!s) s = add_module(t, -1, TP_MT_LINEAR, -1, &head, "lm_head");
    if (!s) s = tp_module_add_param(&t->v[head], "weight", TP_PARAM_WEIGHT, 2, (int64_t[2]){V, H});
    /* Tied: the head runs on the embedding's tensor, no parameter of its own. */
    if (!s && c->tie_word_embeddings) t->v[head].params[TP_MODULE_WEIGHT].tied_to = emb;
    if (!s && top) { top[0] = emb; top[1] = norm; top[2] = head; }
    return s;
}

tp_status tp_module_table_build(const tp_model_config *cfg, tp_module **out, size_t *n)
{
    table t = {0};
    tp_status s = build(cfg, &t, NULL, NULL);
    if (s) { free(t.v); return s; }
    *out = t.v;
    *n = t.n;
    return TP_OK;
}

tp_status tp_model_build_modules(tp_model *m)
{
    table t = {0};
    int top[3];
    m->layers = calloc((size_t)(m->cfg.num_hidden_layers > 0 ? m->cfg.num_hidden_layers : 1), sizeof *m->layers);
    if (!m->layers) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = build(&m->cfg, &t, m->layers, top);
    if (s) { free(t.v); return s; }
    m->modules = t.v;
    m->n_modules = t.n;
    m->embed_tokens = top[0], m->norm = top[1], m->lm_head = top[2];
    return TP_OK;
}

void tp_module_table_free(tp_module *mods, size_t n)
{
    for (size_t i = 0; mods && i < n; i++)
        for (int j = 0; j < mods[i].n_params; j++) {
            tp_tensor_release(&mods[i].params[j].local);
            tp_tensor_release(&mods[i].params[j].grad);
        }
    free(mods);
}

/* One record per parameter of the table that the checkpoint holds. */
static tp_status describe(tp_module *mods, size_t n, int with_slots, tp_param_desc **out, size_t *count)
{
    size_t total = 0, k = 0;
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < mods[i].n_params; j++) total += mods[i].params[j].tied_to < 0;
    tp_param_desc *d = calloc(total ? total : 1, sizeof *d);
    if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        for (int j = 0; j < mods[i].n_params; j++) {
            tp_module_param *p = &mods[i].params[j];
            if (p->tied_to >= 0) continue;
            tp_param_desc *e = &d[k++];
            snprintf(e->name, sizeof e->name, "%s.%s", mods[i].name, p->suffix);
            e->kind = p->kind;
            e->ndim = p->ndim;
            memcpy(e->shape, p->shape, sizeof e->shape);
            e->slot = with_slots ? &p->local : NULL;
            e->module = with_slots ? &mods[i] : NULL;
            e->module_index = (int)i;
            e->param_index = j;
        }
    }
    *out = d;
    *count = total;
    return TP_OK;
}

tp_status tp_model_params(const tp_model_config *c, tp_model *m, tp_param_desc **out, size_t *n)
{
    if (m) return describe(m->modules, m->n_modules, 1, out, n);
    tp_module *mods;
    size_t count;
    tp_status s = tp_module_table_build(c, &mods, &count);
    if (s) return s;
    s = describe(mods, count, 0, out, n);
    tp_module_table_free(mods, count);
    return s;
}

size_t tp_model_module_count(const tp_model *m) { return m->n_modules; }

const tp_module *tp_model_module_at(const tp_model *m, size_t i)
{
    return i < m->n_modules ? &m->modules[i] : NULL;
}

int tp_model_module_find(const tp_model *m, const char *name)
{
    for (size_t i = 0; i < m->n_modules; i++)
        if (!strcmp(m->modules[i].name, name)) return (int)i;
    return -1;
}

const char *tp_module_type_name(tp_module_type t)
{
    static const char *const names[TP_MT_COUNT] = {"container", "decoder_layer", "embedding", "linear", "norm",
                                                   "attention", "mlp", "experts", "adapter", "moe"};
    return t >= 0 && t < TP_MT_COUNT ? names[t] : "?";
}
