/* The parameter table: every tensor a model has, with its Hugging Face name,
 * kind and global shape.  Loading, make-model and (later) the TP plan all
 * walk this one table, so a name is spelled in exactly one place. */
#include "tensorpar/models.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    tp_param_desc *v;
    size_t n, cap;
} table;

static tp_status add(table *t, tp_tensor *slot, tp_linear *module, tp_param_kind kind, int64_t d0, int64_t d1,
                     const char *fmt, ...)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        tp_param_desc *nv = realloc(t->v, cap * sizeof *nv);
        if (!nv) return tp_fail(TP_ERR_NOMEM, "out of memory");
        t->v = nv;
        t->cap = cap;
    }
    tp_param_desc *p = &t->v[t->n++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->kind = kind;
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->slot = slot;
    p->module = module;
    return TP_OK;
}

#define SLOT(expr) (m ? &(expr) : NULL)

static tp_status add_linear(table *t, tp_model *m, tp_linear *lin, int bias, int64_t out, int64_t in,
                            int64_t layer, const char *name)
{
    tp_status s = add(t, lin ? &lin->weight : NULL, lin, TP_PARAM_WEIGHT, out, in,
                      "model.layers.%lld.%s.weight", (long long)layer, name);
    if (!s && bias)
        s = add(t, lin ? &lin->bias : NULL, lin, TP_PARAM_BIAS, out, 0,
                "model.layers.%lld.%s.bias", (long long)layer, name);
    (void)m;
    return s;
}

static tp_status add_layer(table *t, const tp_model_config *c, tp_model *m, int64_t i)
{
    tp_layer *L = m ? &m->layers[i] : NULL;
    int64_t H = c->hidden_size, D = c->head_dim, I = c->intermediate_size;
    int64_t qdim = c->num_attention_heads * D, kvdim = c->num_key_value_heads * D;
    int qkv_bias = c->attention_bias || c->qkv_bias;
    tp_status s;
    if ((s = add(t, L ? &L->input_layernorm : NULL, NULL, TP_PARAM_NORM, H, 0,
                 "model.layers.%lld.input_layernorm.weight", (long long)i)) ||
        (s = add_linear(t, m, L ? &L->q_proj : NULL, qkv_bias, qdim, H, i, "self_attn.q_proj")) ||
        (s = add_linear(t, m, L ? &L->k_proj : NULL, qkv_bias, kvdim, H, i, "self_attn.k_proj")) ||
        (s = add_linear(t, m, L ? &L->v_proj : NULL, qkv_bias, kvdim, H, i, "self_attn.v_proj")) ||
        (s = add_linear(t, m, L ? &L->o_proj : NULL, c->attention_bias, H, qdim, i, "self_attn.o_proj")))
        return s;
    if (c->qk_norm &&
        ((s = add(t, L ? &L->q_norm : NULL, NULL, TP_PARAM_NORM, D, 0, "model.layers.%lld.self_attn.q_norm.weight", (long long)i)) ||
         (s = add(t, L ? &L->k_norm : NULL, NULL, TP_PARAM_NORM, D, 0, "model.layers.%lld.self_attn.k_norm.weight", (long long)i))))
        return s;
    if ((s = add(t, L ? &L->post_attention_layernorm : NULL, NULL, TP_PARAM_NORM, H, 0,
                 "model.layers.%lld.post_attention_layernorm.weight", (long long)i)) ||
        (s = add_linear(t, m, L ? &L->gate_proj : NULL, 0, I, H, i, "mlp.gate_proj")) ||
        (s = add_linear(t, m, L ? &L->up_proj : NULL, 0, I, H, i, "mlp.up_proj")) ||
        (s = add_linear(t, m, L ? &L->down_proj : NULL, 0, H, I, i, "mlp.down_proj")))
        return s;
    return TP_OK;
}

tp_status tp_model_params(const tp_model_config *c, tp_model *m, tp_param_desc **out, size_t *n)
{
    table t = {0};
    tp_status s = add(&t, SLOT(m->embed_tokens.weight), m ? &m->embed_tokens : NULL, TP_PARAM_EMBEDDING,
                      c->vocab_size, c->hidden_size, "model.embed_tokens.weight");
    for (int64_t i = 0; !s && i < c->num_hidden_layers; i++) s = add_layer(&t, c, m, i);
    if (!s) s = add(&t, SLOT(m->norm), NULL, TP_PARAM_NORM, c->hidden_size, 0, "model.norm.weight");
    if (!s && !c->tie_word_embeddings)
        s = add(&t, SLOT(m->lm_head.weight), m ? &m->lm_head : NULL, TP_PARAM_WEIGHT, c->vocab_size,
                c->hidden_size, "lm_head.weight");
    if (s) { free(t.v); return s; }
    *out = t.v;
    *n = t.n;
    return TP_OK;
}
