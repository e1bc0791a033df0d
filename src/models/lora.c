/* LoRA adapters on the Linear modules of a loaded model (tp-semantics.md
 * §9.6): reading PEFT's adapter_model.safetensors shard-on-read with the
 * placements that follow the base's style, the adapter's term in each
 * targeted module's local computation, and merging it into the weights.
 *
 * The term is added to the module's local output before its
 * post_forward, so the base's own hooks carry it: under colwise, x is
 * replicated and B's rows are the base's rows, so scale·(x·Aᵀ)·B_rᵀ is this
 * rank's column block of the output; under rowwise, x and A are split on
 * the same columns, so scale·(x_r·A_rᵀ)·Bᵀ is this rank's partial sum and
 * the base's all-reduce adds them: B(all_reduce(A_r x_r)) by linearity,
 * with no collective of its own. */
#include "lora_internal.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

void tp_lora_free(struct tp_lora *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) {
        if (!l->by_module[i]) continue;
        tp_tensor_release(&l->by_module[i]->A);
        tp_tensor_release(&l->by_module[i]->B);
        tp_tensor_release(&l->by_module[i]->gA);
        tp_tensor_release(&l->by_module[i]->gB);
        free(l->by_module[i]);
    }
    free(l->by_module);
    free(l->saved);
    free(l->saved_keys);
    tp_lora_config_free(&l->cfg);
    free(l);
}

/* The name of the module's style when its plan splits it, else NULL. */
static const char *style_name(const tp_model *m, const tp_module *lin)
{
    if (!m->tp || !m->tp->res || !m->tp->res->applied || !lin->tp || !lin->tp->plan || !lin->tp->plan->style)
        return NULL;
    return lin->tp->plan->style->name;
}

tp_status tp_lora_read_into(tp_checkpoint *ck, const char *name, int64_t rows, int64_t cols, const tp_param_slice *sl,
                            int split, const int64_t local[2], float *dst)
{
    int64_t shape[2] = {rows, cols};
    tp_status s = tp_checkpoint_expect_weight(ck, name, 2, shape);
    if (s) return s;
    int dim = split ? sl->dim : -1;
    if (dim < 0) return tp_checkpoint_read(ck, name, TP_F32, dst);
    int64_t off = 0;
    for (int i = 0; i < sl->n && !s; i++) {
        float *tmp = malloc((size_t)(dim == 0 ? sl->len[i] * cols : rows * sl->len[i]) * sizeof(float) + 1);
        if (!tmp) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s", name);
        s = tp_checkpoint_read_slice(ck, name, dim, sl->start[i], sl->len[i], TP_F32, tmp);
        if (!s && dim == 0) memcpy(dst + off * cols, tmp, (size_t)(sl->len[i] * cols) * sizeof(float));
        for (int64_t r = 0; !s && dim == 1 && r < rows; r++)
            memcpy(dst + r * local[1] + off, tmp + r * sl->len[i], (size_t)sl->len[i] * sizeof(float));
        free(tmp);
        off += sl->len[i];
    }
    return s;
}

/* The shape of the part of [rows, cols] that sl keeps (split) or all. */
static void local_shape(int64_t rows, int64_t cols, const tp_param_slice *sl, int split, int64_t local[2])
{
    local[0] = rows;
    local[1] = cols;
    if (!split || sl->dim < 0) return;
    local[sl->dim] = 0;
    for (int i = 0; i < sl->n; i++) local[sl->dim] += sl->len[i];
}

tp_status tp_lora_read_shard(tp_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                             const tp_param_slice *sl, int split, tp_tensor *t)
{
    int64_t local[2];
    local_shape(rows, cols, sl, split, local);
    tp_status s = tp_tensor_init(t, TP_F32, 2, local);
    return s ? s : tp_lora_read_into(ck, name, rows, cols, sl, split, local, t->data);
}

tp_status tp_model_lora_read_tensor(const tp_model *m, size_t k, tp_checkpoint *ck, const char *name, float *dst)
{
    size_t i;
    int is_a;
    size_t adapters = tp_model_lora_count(m) - tp_lora_saved_count(m);
    if (k >= adapters) return tp_lora_saved_read(m, k - adapters, ck, name, dst);   /* then the saved ones */
    const lora_entry *e = tp_lora_entry_at(m->lora, k, &i, &is_a);
    if (!e) return tp_fail(TP_ERR_INVALID, "no adapter tensor %zu", k);
    int64_t shape[2], local[2];
    tp_lora_global_shape(m, i, e, is_a, shape);
    const tp_param_slice *sl = is_a ? &e->a_slice : &e->b_slice;
    local_shape(shape[0], shape[1], sl, sl->dim >= 0, local);
    return tp_lora_read_into(ck, name, shape[0], shape[1], sl, sl->dim >= 0, local, dst);
}

tp_status tp_lora_placement(const tp_model *m, const tp_module *lin, int *a_split, int *b_split)
{
    const char *style = style_name(m, lin);
    const tp_module_param *w = &lin->params[TP_MODULE_WEIGHT];
    *a_split = *b_split = 0;
    if (!style) return TP_OK;
    /* lm_head's colwise_gather_output splits its rows as colwise does: B
     * follows them and the gather after the local output carries the term */
    int colwise = !strcmp(style, "colwise") || !strcmp(style, "colwise_gather_output");
    if (!colwise && strcmp(style, "rowwise"))
        return tp_fail(TP_ERR_UNSUPPORTED, "Unsupported tensor parallel plan '%s' for LoRA state dict sharding.",
                       style);
    *b_split = colwise && w->slice.dim == 0;
    *a_split = !strcmp(style, "rowwise") && w->slice.dim == 1;
    if (w->slice.dim >= 0 && !*a_split && !*b_split)
        return tp_fail(TP_ERR_INTERNAL, "%s: its weight is split along dimension %d under '%s'", lin->name,
                       w->slice.dim, style);
    return TP_OK;
}

/* lin's adapter into e, with §9.6's placements for its style. */
static tp_status read_entry(tp_model *m, tp_checkpoint *ck, const tp_module *lin, int64_t r, lora_entry *e)
{
    int row, col;
    tp_status s = tp_lora_placement(m, lin, &row, &col);
    if (s) return s;
    const tp_module_param *w = &lin->params[TP_MODULE_WEIGHT];
    snprintf(e->a_name, sizeof e->a_name, "base_model.model.%s.lora_A.weight", lin->name);
    snprintf(e->b_name, sizeof e->b_name, "base_model.model.%s.lora_B.weight", lin->name);
    e->a_slice = w->slice;
    e->b_slice = w->slice;
    if (!row) e->a_slice.dim = -1;
    if (!col) e->b_slice.dim = -1;
    s = tp_lora_read_shard(ck, e->a_name, r, w->shape[1], &w->slice, row, &e->A);
    if (!s) s = tp_lora_read_shard(ck, e->b_name, w->shape[0], r, &w->slice, col, &e->B);
    return s;
}

/* An embedding's adapter: lora_embedding_A [r, V] split on V like the base
 * table's rows under embedding_rowwise (§9.6), lora_embedding_B [H, r]
 * replicated. */
tp_status tp_lora_embedding_placement(const tp_model *m, const tp_module *emb, lora_entry *e)
{
    const char *style = style_name(m, emb);
    if (style && strcmp(style, "embedding_rowwise"))
        return tp_fail(TP_ERR_UNSUPPORTED, "Unsupported tensor parallel plan '%s' for LoRA state dict sharding.",
                       style);
    const tp_module_param *w = &emb->params[TP_MODULE_WEIGHT];
    int split = style && w->slice.dim == 0;
    e->embedding = 1;
    e->vocab = w->slice;
    e->vocab.dim = split ? 1 : -1;
    snprintf(e->a_name, sizeof e->a_name, "base_model.model.%s.lora_embedding_A", emb->name);
    snprintf(e->b_name, sizeof e->b_name, "base_model.model.%s.lora_embedding_B", emb->name);
    e->a_slice = e->vocab;
    e->b_slice = e->vocab;
    e->b_slice.dim = -1;
    return TP_OK;
}

static tp_status read_embedding_entry(tp_model *m, tp_checkpoint *ck, const tp_module *emb, int64_t r,
                                      lora_entry *e)
{
    tp_status s = tp_lora_embedding_placement(m, emb, e);
    if (s) return s;
    const tp_module_param *w = &emb->params[TP_MODULE_WEIGHT];
    int split = e->vocab.dim >= 0;
    s = tp_lora_read_shard(ck, e->a_name, r, w->shape[0], &e->vocab, split, &e->A);
    if (!s) s = tp_lora_read_shard(ck, e->b_name, w->shape[1], r, &e->vocab, 0, &e->B);
    return s;
}

int64_t tp_lora_vocab_column(const lora_entry *e, int64_t v)
{
    if (e->vocab.dim < 0) return v;
    int64_t base = 0;
    for (int i = 0; i < e->vocab.n; base += e->vocab.len[i], i++)
        if (v >= e->vocab.start[i] && v < e->vocab.start[i] + e->vocab.len[i]) return base + v - e->vocab.start[i];
    return -1;
}

/* W [V_local, H] += scale · (B·A)ᵀ: the embedding's merge. */
static tp_status merge_embedding(const tp_model *m, tp_tensor *W, const lora_entry *e, float scale, const char *name)
{
    if (m->cfg.tie_word_embeddings)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: --merge-adapter would change the tied lm_head too", name);
    int64_t V = W->shape[0], H = W->shape[1], r = e->A.shape[0];
    float *w = W->data;
    const float *A = e->A.data, *B = e->B.data;
    for (int64_t v = 0; v < V; v++)
        for (int64_t h = 0; h < H; h++) {
            float acc = 0;
            for (int64_t k = 0; k < r; k++) acc += B[h * r + k] * A[k * V + v];
            w[v * H + h] += scale * acc;
        }
    return TP_OK;
}

/* W += scale · B·A on the local shards (f32 weights that the module owns). */
static tp_status merge_entry(tp_model *m, const tp_module *lin, const lora_entry *e, float scale)
{
    tp_tensor *W = &((tp_module *)lin)->params[TP_MODULE_WEIGHT].local;
    if (W->dtype != TP_F32 || !W->owns_data)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: --merge-adapter needs f32 weights the module owns (load with "
                       "--dtype f32; a tied weight cannot be merged)", lin->name);
    if (e->embedding) return merge_embedding(m, W, e, scale, lin->name);
    int64_t out = W->shape[0], in = W->shape[1], r = e->A.shape[0];
    float *w = W->data;
    const float *A = e->A.data, *B = e->B.data;
    for (int64_t o = 0; o < out; o++)
        for (int64_t k = 0; k < r; k++) {
            float c = scale * B[o * r + k];
            for (int64_t i = 0; i < in; i++) w[o * in + i] += c * A[k * in + i];
        }
    return TP_OK;
}

static tp_status attach(tp_model *m, tp_checkpoint *ck, const tp_lora_config *c, int merge, struct tp_lora *l)
{
    size_t used = 0;
    /* the adapters first: a module both targeted and saved is refused */
    for (size_t i = 0; i < m->n_modules; i++) {
        const tp_module *mod = &m->modules[i];
        int hit = tp_lora_config_matches(c, mod->name);
        if (hit < 0) return TP_ERR_FORMAT;
        if (!hit || (mod->type != TP_MT_LINEAR && mod->type != TP_MT_EMBEDDING)) continue;
        lora_entry *e = calloc(1, sizeof *e);
        if (!e) return tp_fail(TP_ERR_NOMEM, "out of memory");
        tp_status s = mod->type == TP_MT_EMBEDDING ? read_embedding_entry(m, ck, mod, c->r, e)
                                                   : read_entry(m, ck, mod, c->r, e);
        if (!s && merge) s = merge_entry(m, mod, e, l->scale);
        if (s || merge) {
            tp_tensor_release(&e->A);
            tp_tensor_release(&e->B);
            free(e);
            if (s) return tp_fail_context(s, "the adapter of %s", mod->name);
        } else {
            l->by_module[i] = e;
        }
        used += 2;
    }
    if (!used) return tp_fail(TP_ERR_INVALID, "the adapter's target_modules match no Linear of the model");
    tp_status s = tp_lora_saved_attach(m, l, ck, &used);
    if (s) return s;
    if (used != tp_checkpoint_count(ck))
        tp_log(TP_LOG_WARN, "%zu tensors of the adapter are not used", tp_checkpoint_count(ck) - used);
    return TP_OK;
}

tp_status tp_lora_new(tp_model *m, tp_lora_config *cfg, struct tp_lora **out)
{
    struct tp_lora *l = calloc(1, sizeof *l);
    *out = l;
    if (!l || !(l->by_module = calloc(m->n_modules ? m->n_modules : 1, sizeof *l->by_module)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    l->n = m->n_modules;
    l->scale = (float)tp_lora_config_scale(cfg);
    l->r = cfg->r;
    l->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    return TP_OK;
}

tp_status tp_model_load_adapter(tp_model *m, const char *dir, int merge)
{
    if (m->lora) return tp_fail(TP_ERR_INVALID, "the model already has an adapter");
    tp_lora_config c;
    tp_status s = tp_lora_config_load(&c, dir);
    if (s) return s;
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    tp_checkpoint *ck = NULL;
    struct tp_lora *l = NULL;
    s = tp_lora_new(m, &c, &l);
    if (!s) s = tp_checkpoint_open(&ck, path);
    /* the adapter's directory, for the refusals that name only a key */
    if (!s && (s = attach(m, ck, &l->cfg, merge, l))) s = tp_fail_context(s, "adapter %s", dir);
    if (ck) tp_checkpoint_close(ck);
    tp_lora_config_free(&c);
    if (s || merge) { tp_lora_free(l); return s; }
    m->lora = l;
    return TP_OK;
}

/* y[T, out] += scale · a·Bᵀ: the adapter's second half, the same for a Linear
 * and an embedding once a[T, r] (x·Aᵀ, or A's looked-up columns) is made. */
static tp_status add_up_projection(tp_model *m, const lora_entry *e, const float *a, int64_t T, float *y)
{
    int64_t out = e->B.shape[0];
    float *d = malloc((size_t)(T * out) * sizeof(float));
    if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = tp_matmul_ex(d, a, T, &e->B, NULL, m->pool, &m->matmul);
    float scale = m->lora->scale;
    for (int64_t i = 0; !s && i < T * out; i++) y[i] += scale * d[i];
    free(d);
    return s;
}

tp_status tp_lora_apply(tp_model *m, const tp_module *lin, const float *x, int64_t T, float *y)
{
    if (!m->lora) return TP_OK;
    const lora_entry *e = m->lora->by_module[lin - m->modules];
    if (!e) return TP_OK;
    int64_t r = e->A.shape[0];
    float *a = malloc((size_t)(T * r) * sizeof(float)), *xd = NULL;
    tp_status s = a ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    /* training with lora_dropout: A reads the masked input, the base x */
    if (!s && tp_lora_dropping(m)) {
        xd = malloc((size_t)(T * e->A.shape[1]) * sizeof(float));
        s = xd ? tp_lora_dropout(m, lin, e, x, T, xd) : tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    if (!s) s = tp_matmul_ex(a, xd ? xd : x, T, &e->A, NULL, m->pool, &m->matmul);
    if (!s) s = add_up_projection(m, e, a, T, y);
    free(a);
    free(xd);
    return s;
}

tp_status tp_lora_apply_embedding(tp_model *m, const tp_module *emb, const int64_t *ids, int64_t T, float *y)
{
    if (!m->lora) return TP_OK;
    const lora_entry *e = m->lora->by_module[emb - m->modules];
    if (!e) return TP_OK;
    int64_t r = e->A.shape[0], Vl = e->A.shape[1];
    float *a = malloc((size_t)(T * r) * sizeof(float));
    tp_status s = a ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    const float *A = e->A.data;
    /* the masked lookup of A's transposed table: ids on another rank give
     * zeros, and the base's all-reduce adds the ranks' terms */
    for (int64_t t = 0; !s && t < T; t++) {
        int64_t col = tp_lora_vocab_column(e, ids[t]);
        for (int64_t k = 0; k < r; k++) a[t * r + k] = col < 0 ? 0.0f : A[k * Vl + col];
    }
    if (!s) s = add_up_projection(m, e, a, T, y);
    free(a);
    return s;
}
