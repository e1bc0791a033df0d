/* Loading a model: config.json, the module table, then every parameter of
 * the parameter table read from the checkpoint with its shape checked
 * against the config. */
#include "tensorpar/models.h"
#include "tensorpar/kernels.h"
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

/* q8_0 and q4_0: Linear weights quantized in blocks at load. */
static int is_quantized(tp_dtype t)
{
    return t == TP_Q8_0 || t == TP_Q4_0;
}

static tp_status quantize_rows(tp_dtype dt, void *dst, const void *src, tp_dtype st, int64_t rows, int64_t k)
{
    return dt == TP_Q4_0 ? tp_q4_quantize_rows(dst, src, st, rows, k) : tp_q8_quantize_rows(dst, src, st, rows, k);
}

static tp_dtype choose_weight_dtype(const tp_model_config *cfg, const tp_model_options *opt)
{
    if (opt && (opt->weight_dtype == TP_F32 || opt->weight_dtype == TP_BF16 || is_quantized(opt->weight_dtype)))
        return opt->weight_dtype;
    return cfg->dtype == TP_BF16 ? TP_BF16 : TP_F32;
}

/* What a q8_0 or q4_0 model keeps unquantized (the embedding, read a row
 * at a time) is held as stored: bf16 for a bf16 checkpoint, else f32. */
static tp_dtype unquantized_dtype(const tp_model *m)
{
    return m->cfg.dtype == TP_BF16 ? TP_BF16 : TP_F32;
}

/* The Linear weights that q8_0 and q4_0 quantize: attention, dense MLP, an
 * untied lm_head (as llama.cpp's Q8_0 does); not an MoE router (a small matrix
 * whose error would move tokens between experts) nor the experts' stacked
 * tensors (their grouped GEMM takes f32/bf16 only, for now). */
static int quantized(const tp_model *m, const tp_param_desc *p)
{
    const tp_module *mod = p->module;
    if (!is_quantized(m->weight_dtype) || p->kind != TP_PARAM_WEIGHT || p->ndim != 2 || mod->type != TP_MT_LINEAR)
        return 0;
    return !(mod->parent >= 0 && m->modules[mod->parent].type == TP_MT_MOE);
}

/* Matrices keep the chosen weight dtype; norms and biases are tiny and are
 * kept in f32 (the conversion from bf16 is exact).  Under q8_0/q4_0 what is not
 * quantized (the embedding, read a row at a time) is kept as stored. */
static tp_dtype param_dtype(const tp_model *m, const tp_param_desc *p)
{
    if (p->kind != TP_PARAM_WEIGHT && p->kind != TP_PARAM_EMBEDDING) return TP_F32;
    if (!is_quantized(m->weight_dtype)) return m->weight_dtype;
    return quantized(m, p) ? m->weight_dtype : unquantized_dtype(m);
}

/* Reads the ranges of a slice along dimension 1: each range arrives as a
 * [rows, len] block and is placed at its column offset (StridedShard). */
static tp_status read_columns(tp_checkpoint *ck, const tp_param_desc *p, const tp_param_slice *sl,
                              tp_dtype dt, tp_tensor *t)
{
    size_t es = tp_dtype_size(dt);
    int64_t rows = p->shape[0], width = t->shape[1], col = 0;
    for (int i = 0; i < sl->n; i++) {
        void *tmp = malloc((size_t)(rows * sl->len[i]) * es + 1);
        if (!tmp) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s", p->name);
        tp_status s = tp_checkpoint_read_slice(ck, p->name, 1, sl->start[i], sl->len[i], dt, tmp);
        for (int64_t r = 0; !s && r < rows; r++)
            memcpy((char *)t->data + (size_t)(r * width + col) * es, (char *)tmp + (size_t)(r * sl->len[i]) * es,
                   (size_t)sl->len[i] * es);
        free(tmp);
        if (s) return s;
        col += sl->len[i];
    }
    return TP_OK;
}

/* A Linear weight in q8_0 or q4_0 (dt): this rank's shard is read as
 * stored (f32 or bf16, shard-on-read as any other), then quantized a row at a time, so
 * that each rank quantizes only its slice.  A row-parallel shard splits
 * the rows into pieces that must still be whole blocks. */
static tp_status quantize_param(tp_tensor *slot, const char *name, int64_t full_k, tp_dtype src_dt, tp_dtype dt)
{
    int64_t rows = slot->shape[0], k = slot->shape[1];
    if (k % TP_Q8_BLOCK)
        return tp_fail(TP_ERR_INVALID, "--dtype %s: %s has rows of %lld values on this rank (%lld in all), "
                       "not a multiple of the block of %d: use f32 or bf16, or a TP size that splits the rows "
                       "into whole blocks", tp_dtype_name(dt), name, (long long)k, (long long)full_k, TP_Q8_BLOCK);
    tp_tensor q;
    tp_status s = tp_tensor_init(&q, dt, 2, slot->shape);
    if (!s) s = quantize_rows(dt, q.data, slot->data, src_dt, rows, k);
    if (s) { tp_tensor_release(&q); return tp_fail_context(s, "%s", name); }
    tp_tensor_release(slot);
    *slot = q;
    return TP_OK;
}

/* Shard-on-read (tp-semantics.md §6.2): only this rank's ranges of the
 * tensor are read; along dimension 0 they are consecutive in the buffer. */
static tp_status load_param(tp_checkpoint *ck, const tp_model_config *c, const tp_param_desc *param,
                            const tp_param_slice *sl, tp_dtype dt, tp_dtype read_dt)
{
    if (is_quantized(dt)) {
        tp_status s = load_param(ck, c, param, sl, read_dt, read_dt);
        return s ? s : quantize_param(param->slot, param->name, param->shape[1], read_dt, dt);
    }
    /* gpt_oss's expert tensors are whole or split by expert only: read as any parameter */
    if (param->module->type == TP_MT_EXPERTS && c->arch != TP_ARCH_GPT_OSS)
        return tp_moe_load_experts(ck, c, param, sl, dt);
    tp_param_desc stored = *param;
    const tp_param_desc *p = &stored;
    tp_checkpoint_name_of(c, param->name, stored.name, sizeof stored.name);
    char blocks[200];
    snprintf(blocks, sizeof blocks, "%s_blocks", p->name);
    if (!tp_checkpoint_find(ck, p->name) && tp_checkpoint_find(ck, blocks))
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: the checkpoint stores %s (MXFP4 blocks and scales) instead of %s; "
                       "tensorpar reads the dequantized bf16/f32 layout only: save the model once with Transformers' "
                       "Mxfp4Config(dequantize=True) and load that", tp_checkpoint_file_path(ck, 0), blocks, p->name);
    tp_status s = tp_checkpoint_expect_weight(ck, p->name, p->ndim, p->shape);
    if (s) return s;
    if ((s = tp_tensor_init(p->slot, dt, sl->ndim, sl->local_shape))) return s;
    if (sl->dim < 0) return tp_checkpoint_read(ck, p->name, dt, p->slot->data);
    if (sl->dim == 1) return read_columns(ck, p, sl, dt, p->slot);
    size_t row_bytes = tp_dtype_size(dt);   /* one index of dimension 0 */
    for (int d = 1; d < p->ndim; d++) row_bytes *= (size_t)p->shape[d];
    char *dst = p->slot->data;
    for (int i = 0; i < sl->n && !s; i++) {
        s = tp_checkpoint_read_slice(ck, p->name, 0, sl->start[i], sl->len[i], dt, dst);
        dst += (size_t)sl->len[i] * row_bytes;
    }
    return s;
}

/* The module's record of the parameter says which part of it this rank holds. */
static void record_slice(tp_model *m, size_t i, const tp_param_desc *p, const tp_param_slice *sl)
{
    tp_module_param *rec = &p->module->params[p->param_index];
    rec->slice = *sl;
    rec->placement = m->tp && m->tp->res->applied ? m->tp->res->params[i].placement : tp_replicate();
}

static void warn_unused(const tp_checkpoint *ck, const tp_model_config *c)
{
    tp_param_desc *params;
    size_t n, unused = 0;
    if (tp_model_checkpoint_params(c, &params, &n)) { tp_clear_error(); return; }
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
    free(params);
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
        tp_param_slice sl;
        s = tp_model_param_slice(m, i, &params[i], &sl);
        if (!s) s = load_param(ck, &m->cfg, &params[i], &sl, param_dtype(m, &params[i]), unquantized_dtype(m));
        if (!s) record_slice(m, i, &params[i], &sl);
        if (show_progress) tp_progress_advance(&bar, 1);
    }
    if (show_progress) tp_progress_end(&bar);
    m->bytes_read = tp_checkpoint_bytes_read(ck);
    if (!s) warn_unused(ck, &m->cfg);
    tp_checkpoint_close(ck);
    free(params);
    return s;
}

/* A tied lm_head gets a q8_0 (q4_0) copy of the embedding's shard: the product
 * over the vocabulary is the largest of a decode step, and the lookup
 * keeps the unquantized rows. */
static tp_status quantize_tied_head(tp_module_param *head, tp_dtype dt)
{
    tp_tensor *t = &head->local;
    if (t->shape[1] % TP_Q8_BLOCK)
        return quantize_param(t, "lm_head.weight (tied)", t->shape[1], t->dtype, dt);
    tp_tensor q;
    tp_status s = tp_tensor_init(&q, dt, 2, t->shape);
    if (!s) s = quantize_rows(dt, q.data, t->data, t->dtype, t->shape[0], t->shape[1]);
    if (s) { tp_tensor_release(&q); return tp_fail_context(s, "lm_head.weight (tied)"); }
    *t = q;   /* the embedding's buffer stays the embedding's */
    return TP_OK;
}

/* The load report of --dtype q8_0/q4_0: what was quantized and what was not. */
static void log_q8(const tp_model *m)
{
    uint64_t q8 = 0, other = 0;
    int n = 0;
    for (size_t i = 0; i < m->n_modules; i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            const tp_tensor *t = &m->modules[i].params[j].local;
            if (!t->data || (m->modules[i].params[j].tied_to >= 0 && t->dtype != m->weight_dtype)) continue;
            if (t->dtype == m->weight_dtype) q8 += tp_tensor_nbytes(t), n++;
            else other += tp_tensor_nbytes(t);
        }
    tp_log(TP_LOG_INFO, "%s: %d Linear weights quantized (%.1f MB on this rank); the embedding (%s), norms and "
           "biases kept unquantized (%.1f MB)", tp_dtype_name(m->weight_dtype), n, (double)q8 / 1e6,
           tp_dtype_name(unquantized_dtype(m)),
           (double)other / 1e6);
}

/* --matmul bf16 (kernels.bf16_dot) where it is not what a user expects: no
 * bf16 weights, or no vdpbf16ps on this path.  Once per job. */
static void log_bf16_matmul(const tp_model *m)
{
    if (m->tp && m->tp->mesh && tp_mesh_world_rank(m->tp->mesh) != 0) return;
    if (m->weight_dtype != TP_BF16)
        tp_log(TP_LOG_INFO, "matmul bf16: bf16 weights only; the %s weights multiply as before",
               tp_dtype_name(m->weight_dtype));
    else if (!tp_kernel_has_bf16_dot())
        tp_log(TP_LOG_INFO, "matmul bf16: emulated on the %s path (vdpbf16ps needs avx512 and AVX512_BF16): the activations are "
               "rounded to bf16 as with vdpbf16ps, but no faster than exact", tp_isa_name(tp_isa_selected()));
}

tp_status tp_model_load(tp_model **out, const char *model_dir, const tp_model_options *opt)
{
    *out = NULL;
    /* A refused TENSORPAR_ISA (the process's kernel path) stops us before
     * any file is read; the other settings arrive in *opt. */
    tp_status s = tp_isa_check();
    if (s) return s;
    if (opt && opt->plan && opt->tp_plan)
        return tp_fail(TP_ERR_INVALID, "tp_model_options: give the plan as an object (plan) or as a name "
                       "(tp_plan), not both");
    tp_model *m = calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory");
    s = tp_config_load(&m->cfg, model_dir);
    if (s) { free(m); return s; }
    const tp_model_config *c = &m->cfg;
    m->weight_dtype = choose_weight_dtype(c, opt);
    if ((s = tp_model_build_modules(m))) { tp_model_free(m); return s; }
    m->inv_freq = calloc((size_t)(c->head_dim / 2), sizeof(double));
    if (!m->inv_freq) { tp_model_free(m); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    m->fuse_norm = tp_switch_on(opt ? opt->fuse_norm : TP_DEFAULT, 1);
    tp_matmul_opts_init(&m->matmul, opt ? &opt->kernels : NULL);
    const tp_rope_scaling *rs = &c->rope_scaling;
    if (rs->kind == TP_ROPE_YARN)
        tp_rope_inv_freq_yarn(m->inv_freq, c->head_dim, c->rope_theta, rs->yarn_factor, rs->beta_fast, rs->beta_slow,
                              rs->yarn_original, rs->yarn_truncate);
    else
        tp_rope_inv_freq(m->inv_freq, c->head_dim, c->rope_theta, (int)rs->kind, rs->factor,
                         rs->low_freq_factor, rs->high_freq_factor, rs->original_max_position_embeddings);
    /* The plan is resolved and checked before any weight is read. */
    if ((s = tp_model_tp_setup(m, opt))) { tp_model_free(m); return s; }
    if ((s = load_weights(m, model_dir, opt && opt->show_progress))) { tp_model_free(m); return s; }
    if (c->tie_word_embeddings) {
        tp_module_param *head = &m->modules[m->lm_head].params[TP_MODULE_WEIGHT];
        const tp_module_param *emb = &m->modules[m->embed_tokens].params[TP_MODULE_WEIGHT];
        head->local = emb->local;
        head->local.owns_data = 0;
        head->slice = emb->slice;
        head->placement = emb->placement;
        if (is_quantized(m->weight_dtype) && (s = quantize_tied_head(head, m->weight_dtype))) {
            tp_model_free(m);
            return s;
        }
    }
    if (is_quantized(m->weight_dtype)) log_q8(m);
    if (m->matmul.bf16_dot) log_bf16_matmul(m);
    if ((s = tp_act_arena_init(m))) { tp_model_free(m); return s; }
    if (m->tp) tp_plan_log_coverage(m->tp->res, m->tp->mesh ? tp_mesh_world_rank(m->tp->mesh) : 0);
    int threads = opt && opt->threads > 0 ? opt->threads : 1;
    if ((s = tp_threadpool_create(&m->pool, threads))) { tp_model_free(m); return s; }
    /* Idle threads spin only while every rank's threads have a core of
     * their own (ranks of one TP group share a host). */
    if (m->tp && (int64_t)m->tp->size * threads > tp_cpu_count()) tp_threadpool_set_spin(m->pool, 0);
    /* Pinning is a speed matter only: a refusal (a narrower cpuset than
     * expected, a sandbox) leaves the threads where the scheduler puts them. */
    if (opt && opt->pin_threads && tp_threadpool_pin(m->pool, opt->first_cpu))
        tp_log(TP_LOG_WARN, "threads not pinned: %s", tp_error());
    *out = m;
    return TP_OK;
}

uint64_t tp_model_bytes_read(const tp_model *m) { return m->bytes_read; }

void tp_model_free(tp_model *m)
{
    if (!m) return;
    tp_lora_free(m->lora);
    tp_module_table_free(m->modules, m->n_modules);
    free(m->layers);
    tp_model_tp_free(m);
    tp_act_arena_free(m);
    tp_model_train_ws_free(m);
    free(m->inv_freq);
    tp_threadpool_destroy(m->pool);
    if (m->on_free) m->on_free(m->on_free_ctx);
    free(m);
}
