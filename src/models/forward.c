/* The decoder forward pass, shared by the four model types: they differ only
 * in flags (q/k/v biases, q/k norms, sliding window) that the config sets.
 *
 * The pass walks the module table: the "model" container runs its children
 * (the embedding, each decoder layer's input_layernorm, self_attn,
 * post_attention_layernorm and mlp, the final norm) through their ops
 * tables (module_<kind>.c), then lm_head runs on the rows whose logits are
 * wanted.  Every Linear and the embedding apply their TP style; the code is
 * the same on one rank and on many. */
#include "tensorpar/kernels.h"
#include "tensorpar/models.h"
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

#define FUSE_MIN_ROWS 64   /* decode keeps the one small all-reduce */

/* A rule on self_attn or mlp whose post_forward changes the block's output. */
static int block_moves(const tp_model *m, int block)
{
    const tp_module_plan *b = tp_module_block(m, &m->modules[block]);
    return b && b->fwd.installed && !tp_placement_equal(b->fwd.local_output, b->fwd.output, 2);
}

/* Under TP, prompts of FUSE_MIN_ROWS tokens or more do the residual add and
 * norm inside the reduction of o_proj's and down_proj's outputs
 * (module_norm.c), when every such output is a plain sum. */
static int fuse_norm(const tp_model *m, int64_t T)
{
    if (!m->fuse_norm || !m->tp || m->tp->size < 2 || !m->tp->mesh || T < FUSE_MIN_ROWS) return 0;
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const tp_layer_modules *L = &m->layers[l];
        if (L->experts >= 0) return 0;   /* a sparse block's output is summed by its experts' rule */
        if (!tp_module_output_summed(m, &m->modules[L->o_proj]) ||
            !tp_module_output_summed(m, &m->modules[L->down_proj]) || block_moves(m, L->self_attn) ||
            block_moves(m, L->mlp))
            return 0;
    }
    return 1;
}

/* What the whole pass shares, from the activation arena (act_arena.c)
 * before the first block's mark; the rope table is computed once per pass
 * instead of once per layer and head. */
static tp_status scratch_init(fwd_scratch *s, tp_model *m, int64_t T, int64_t pos0)
{
    const tp_model_config *c = &m->cfg;
    s->h = tp_act_alloc(m, T * c->hidden_size);
    /* Local query heads never outnumber the global ones. */
    s->attn = tp_act_alloc(m, T * c->num_attention_heads * c->head_dim);
    s->rope = tp_act_alloc(m, T * c->head_dim);
    if (!s->h || !s->attn || !s->rope)
        return tp_fail(TP_ERR_NOMEM, "out of memory for activations of %lld tokens", (long long)T);
    tp_rope_table(s->rope, T, c->head_dim, m->inv_freq, pos0);
    /* YaRN outside MLA (gpt_oss): Transformers multiplies cos and sin by
     * the attention factor, so q and k are both scaled (MLA scales its own). */
    if (!c->mla && c->rope_scaling.kind == TP_ROPE_YARN) {
        float af = tp_rope_attention_factor(c);
        for (int64_t i = 0; i < T * c->head_dim; i++) s->rope[i] *= af;
    }
    s->fused = fuse_norm(m, T);
    return TP_OK;
}

/* A training forward keeps the whole stream on every rank (the backward
 * reads it), so the fused add+norm, which leaves each rank its own rows,
 * is off; the rope table is kept for the backward. */
static tp_status scratch_train(fwd_scratch *s, const tp_model *m, int64_t T, tp_train_acts *save)
{
    s->fused = 0;
    save->rope = tp_train_save(save, s->rope, T * m->cfg.head_dim);
    return save->rope ? TP_OK : TP_ERR_NOMEM;
}

/* f->sc.h holds norm(x): lm_head on its rows from `first` on; with local,
 * its column shard before the gather, written straight to logits
 * (tp_module_linear_local). */
static tp_status head(tp_model *m, tp_forward_pass *f, int64_t first, float *logits, int local)
{
    int64_t H = m->cfg.hidden_size, V = m->cfg.vocab_size, rows = f->T - first;
    const tp_module *lm_head = &m->modules[m->lm_head];
    f->in = f->sc.h + first * H;
    f->rows = rows;
    f->in_width = H;
    if (local) return tp_module_linear_local(m, lm_head, f->in, rows, H, logits);
    tp_status st = lm_head->ops->forward(m, lm_head, f);
    if (!st && (f->out.width != V || f->out.pl.kind != TP_REPLICATE))
        st = tp_fail(TP_ERR_INVALID, "lm_head gives %lld of %lld logits on this rank; the plan must gather them "
                     "(colwise_gather_output)", (long long)f->out.width, (long long)V);
    if (!st) memcpy(logits, f->out.data, (size_t)(rows * V) * sizeof(float));
    tp_act_release(m, &f->out);
    return st;
}

static tp_status run_forward(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T, float *logits,
                             int all_logits, tp_train_acts *save, int head_local)
{
    if (T <= 0) return tp_fail(TP_ERR_INVALID, "forward needs at least one token");
    if (cache->length + T > cache->capacity)
        return tp_fail(TP_ERR_INVALID, "the KV cache holds %lld positions; %lld are needed",
                       (long long)cache->capacity, (long long)(cache->length + T));
    tp_forward_pass f = {.cache = cache, .tokens = tokens, .T = T, .save = save};
    const tp_module *model = &m->modules[m->modules[m->embed_tokens].parent];
    /* Every activation below comes from the arena; tp_act_end frees them. */
    tp_status st = tp_act_begin(m, T, all_logits ? T : 1);
    if (st) return st;
    st = scratch_init(&f.sc, m, T, cache->length);
    if (!st && save) st = scratch_train(&f.sc, m, T, save);
    /* embed_tokens, the layers, the final norm: each residual add is fused
     * with the norm that follows it, so the stream is read and written once
     * per block.  The embedding marks the arena after the stream; each
     * stream norm rewinds to that mark, so the arena holds one block's
     * working set (module_norm.c). */
    if (!st) st = model->ops->forward(m, model, &f);
    /* logits NULL (training, vocabulary-parallel loss): the caller runs
     * lm_head on the saved final norm output. */
    if (!st && logits) st = head(m, &f, all_logits ? 0 : T - 1, logits, head_local);
    if (!st) {
        memcpy(cache->tokens + cache->length, tokens, (size_t)T * sizeof *tokens);
        cache->length += T;
    }
    tp_act_release(m, &f.pending);
    tp_act_release(m, &f.x);
    tp_act_end(m);
    return st;
}

tp_status tp_layer_recompute(tp_model *m, const tp_module *layer, tp_kv_cache *cache, const int64_t *tokens,
                             int64_t T, tp_train_acts *save)
{
    const tp_saved_layer *sl = &save->layers[layer->layer];
    int64_t H = m->cfg.hidden_size, len = cache->length;
    tp_forward_pass f = {.cache = cache, .tokens = tokens, .T = T, .save = save};
    tp_status st = tp_act_begin(m, T, T);
    if (st) return st;
    /* The training forward began at position 0 of a fresh cache: the keys
     * and values are written again where they were. */
    cache->length = 0;
    st = scratch_init(&f.sc, m, T, 0);
    f.sc.fused = 0;
    f.x = (tp_act){tp_act_alloc(m, T * H), T, H, H, tp_replicate()};
    if (!st && !f.x.data) st = tp_fail(TP_ERR_NOMEM, "out of memory recomputing %s", layer->name);
    if (!st) {
        memcpy(f.x.data, sl->x_attn, (size_t)(T * H) * sizeof(float));
        memcpy(f.sc.h, sl->h_attn, (size_t)(T * H) * sizeof(float));
        f.block_mark = tp_act_mark(m);
    }
    int first = m->layers[layer->layer].input_layernorm;
    for (int c = m->modules[first].next_sibling; !st && c >= 0; c = m->modules[c].next_sibling)
        st = m->modules[c].ops->forward(m, &m->modules[c], &f);
    tp_act_release(m, &f.pending);   /* the layer's output: the next layer's saved input has it */
    tp_act_release(m, &f.x);
    tp_act_end(m);
    cache->length = len;
    return st;
}

tp_status tp_model_forward(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T,
                           float *logits, int all_logits)
{
    return run_forward(m, cache, tokens, T, logits, all_logits, NULL, 0);
}

tp_status tp_model_forward_train(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T, float *logits,
                                 int head_local, tp_train_acts *save)
{
    return run_forward(m, cache, tokens, T, logits, 1, save, head_local);
}
