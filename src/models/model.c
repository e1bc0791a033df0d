/* Loading a model: config.json, then every parameter of the parameter table
 * read from the checkpoint with its shape checked against the config. */
#include "tensorpar/models.h"
#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

static tp_dtype choose_weight_dtype(const tp_model_config *cfg, const tp_model_options *opt)
{
    if (opt && (opt->weight_dtype == TP_F32 || opt->weight_dtype == TP_BF16)) return opt->weight_dtype;
    return cfg->dtype == TP_BF16 ? TP_BF16 : TP_F32;
}

/* Matrices keep the chosen weight dtype; norms and biases are tiny and are
 * kept in f32 (the conversion from bf16 is exact). */
static tp_dtype param_dtype(const tp_param_desc *p, tp_dtype weight_dtype)
{
    return p->kind == TP_PARAM_WEIGHT || p->kind == TP_PARAM_EMBEDDING ? weight_dtype : TP_F32;
}

static tp_status load_param(tp_checkpoint *ck, const tp_param_desc *p, tp_dtype dt)
{
    tp_status s = tp_checkpoint_expect(ck, p->name, p->ndim, p->shape);
    if (s) return s;
    if ((s = tp_tensor_init(p->slot, dt, p->ndim, p->shape))) return s;
    return tp_checkpoint_read(ck, p->name, dt, p->slot->data);
}

static void warn_unused(const tp_checkpoint *ck, const tp_param_desc *params, size_t n)
{
    size_t unused = 0;
    const char *first = NULL;
    for (size_t i = 0; i < tp_checkpoint_count(ck); i++) {
        const char *name = tp_checkpoint_at(ck, i)->name;
        int found = 0;
        for (size_t j = 0; j < n && !found; j++) found = !strcmp(params[j].name, name);
        /* A tied checkpoint may carry lm_head.weight; Transformers ignores it. */
        if (!found && strcmp(name, "lm_head.weight")) { unused++; if (!first) first = name; }
    }
    if (unused)
        tp_log(TP_LOG_WARN, "%zu tensors of the checkpoint are not used by the model (e.g. '%s')", unused, first);
}

static tp_status load_weights(tp_model *m, const char *dir, int show_progress)
{
    tp_param_desc *params;
    size_t n;
    tp_status s = tp_model_params(&m->cfg, m, &params, &n);
    if (s) return s;
    tp_checkpoint *ck;
    if ((s = tp_checkpoint_open(&ck, dir))) { free(params); return s; }
    tp_progress bar;
    if (show_progress) tp_progress_begin(&bar, "loading", n);
    for (size_t i = 0; i < n && !s; i++) {
        s = load_param(ck, &params[i], param_dtype(&params[i], m->weight_dtype));
        if (show_progress) tp_progress_advance(&bar, 1);
    }
    if (show_progress) tp_progress_end(&bar);
    if (!s) warn_unused(ck, params, n);
    tp_checkpoint_close(ck);
    free(params);
    return s;
}

tp_status tp_model_load(tp_model **out, const char *model_dir, const tp_model_options *opt)
{
    *out = NULL;
    tp_model *m = calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = tp_config_load(&m->cfg, model_dir);
    if (s) { free(m); return s; }
    const tp_model_config *c = &m->cfg;
    m->weight_dtype = choose_weight_dtype(c, opt);
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    m->inv_freq = calloc((size_t)(c->head_dim / 2), sizeof(double));
    if (!m->layers || !m->inv_freq) { tp_model_free(m); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    const tp_rope_scaling *rs = &c->rope_scaling;
    tp_rope_inv_freq(m->inv_freq, c->head_dim, c->rope_theta, (int)rs->kind, rs->factor,
                     rs->low_freq_factor, rs->high_freq_factor, rs->original_max_position_embeddings);
    if ((s = load_weights(m, model_dir, opt && opt->show_progress))) { tp_model_free(m); return s; }
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed_tokens;
        m->lm_head.owns_data = 0;
    }
    int threads = opt && opt->threads > 0 ? opt->threads : 1;
    if ((s = tp_threadpool_create(&m->pool, threads))) { tp_model_free(m); return s; }
    *out = m;
    return TP_OK;
}

static void release_linear(tp_linear *l)
{
    tp_tensor_release(&l->weight);
    tp_tensor_release(&l->bias);
}

void tp_model_free(tp_model *m)
{
    if (!m) return;
    for (int64_t i = 0; m->layers && i < m->cfg.num_hidden_layers; i++) {
        tp_layer *L = &m->layers[i];
        release_linear(&L->q_proj); release_linear(&L->k_proj);
        release_linear(&L->v_proj); release_linear(&L->o_proj);
        release_linear(&L->gate_proj); release_linear(&L->up_proj); release_linear(&L->down_proj);
        tp_tensor_release(&L->input_layernorm); tp_tensor_release(&L->post_attention_layernorm);
        tp_tensor_release(&L->q_norm); tp_tensor_release(&L->k_norm);
    }
    free(m->layers);
    tp_tensor_release(&m->lm_head);
    tp_tensor_release(&m->embed_tokens);
    tp_tensor_release(&m->norm);
    free(m->inv_freq);
    tp_threadpool_destroy(m->pool);
    free(m);
}
