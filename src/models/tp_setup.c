/* Applying a TP plan to a model: resolve and validate the plan for this TP
 * size before any weight is read (tp-semantics.md §5.6), check that every
 * rank resolved the same plan, and bind the modules of the module table:
 * each Linear/Embedding its style and shard, each block and
 * sequence_parallel norm its rule. */
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

/* All ranks must have resolved the same plan (§4.4 step 9): the digests,
 * one per rank, as a [size] DTensor Shard(0) -> Replicate on the 1-D mesh. */
static tp_status check_same_plan(const struct tp_model_tp *tp)
{
    if (!tp->mesh || tp->size == 1) return TP_OK;
    uint64_t mine = tp_plan_digest(tp->res);
    uint64_t *all = calloc((size_t)tp->size, sizeof *all);
    if (!all) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_placement shard = tp_shard(0), rep = tp_replicate();
    int64_t n = tp->size;
    tp_status s = tp_redistribute_local(tp->mesh, TP_I64, 1, &n, &shard, &mine, &rep, all);
    for (int r = 1; !s && r < tp->size; r++)
        if (all[r] != all[0]) s = tp_plan_fail_disagree(0, r);
    free(all);
    return s;
}

static tp_status resolve(struct tp_model_tp *tp, const tp_model_config *cfg, const tp_model_options *opt)
{
    /* The caller's plan object, or the one its name loads; resolution
     * copies what it keeps. */
    tp_plan plan = {0};
    tp_status s = opt->plan ? TP_OK : tp_plan_load_mode(opt->tp_plan, cfg, opt->expert_parallel, &plan);
    if (!s) s = tp_plan_resolve(cfg, opt->plan ? opt->plan : &plan, tp->size, opt->styles, &tp->res);
    if (!s) s = tp_plan_check_flow(tp->res);
    tp_plan_free(&plan);
    if (s) return s;
    int global_rank = tp->mesh ? tp_mesh_world_rank(tp->mesh) : 0;
    tp_plan_log_pattern_warnings(tp->res, global_rank);
    return check_same_plan(tp);
}

static void module_name(const char *param, char *out, size_t cap)
{
    snprintf(out, cap, "%s", param);
    char *dot = strrchr(out, '.');
    if (dot) *dot = '\0';
}

/* The layout of a Linear's output [T, out] when it runs without hooks:
 * rows of the weight give columns of the output, a split of the input
 * features gives every rank a summand. */
static tp_placement output_layout(tp_placement w)
{
    if (w.kind == TP_REPLICATE || w.kind == TP_PARTIAL) return tp_replicate();
    if (w.dim != 0) return tp_partial();
    return w.kind == TP_SHARD ? tp_shard(1) : tp_strided_shard(1, w.split);
}

/* Fills a module's TP state from its weight's parameter record. */
static tp_status attach(tp_model *m, tp_module *mod, const tp_param_desc *p, const tp_param_plan *pp,
                        size_t param_index, struct tp_module_tp *mt)
{
    struct tp_model_tp *tp = m->tp;
    memset(mt, 0, sizeof *mt);
    module_name(p->name, mt->name, sizeof mt->name);
    mt->kind = p->kind == TP_PARAM_EMBEDDING ? TP_MODULE_EMBEDDING : TP_MODULE_LINEAR;
    mt->plan = tp->res->applied ? tp_plan_find_module(tp->res, mt->name) : NULL;
    mt->out_features = p->shape[0];
    mt->in_features = p->shape[1];
    mt->kv_rep = pp ? pp->kv_rep : 1;
    mt->out_pl = pp && tp->res->applied ? output_layout(pp->placement) : tp_replicate();
    tp_status s = tp->res->applied ? (pp == &tp->res->tied_head ? tp_plan_slice_of(tp->res, pp, tp->rank, &mt->weight_slice)
                                                               : tp_plan_param_slice(tp->res, param_index, tp->rank, &mt->weight_slice))
                                   : TP_OK;
    if (!tp->res->applied) {
        mt->weight_slice.dim = -1;
        mt->weight_slice.ndim = 2;
        mt->weight_slice.local_shape[0] = p->shape[0];
        mt->weight_slice.local_shape[1] = p->shape[1];
    }
    mod->tp = mt;
    return s;
}

static tp_status attach_modules(tp_model *m)
{
    struct tp_model_tp *tp = m->tp;
    tp_param_desc *params;
    size_t n;
    tp_status s = tp_model_params(&m->cfg, m, &params, &n);
    if (s) return s;
    tp->modules = calloc(n + 1, sizeof *tp->modules);
    if (!tp->modules) { free(params); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0; i < n && !s; i++) {
        tp_module *mod = params[i].module;
        if ((mod->type != TP_MT_LINEAR && mod->type != TP_MT_EMBEDDING) || params[i].param_index != TP_MODULE_WEIGHT)
            continue;
        s = attach(m, mod, &params[i], &tp->res->params[i], i, &tp->modules[tp->n_modules++]);
    }
    if (!s && m->cfg.tie_word_embeddings) {
        /* The tied head is no parameter of its own: it runs on the
         * embedding's shard, which the plan gave the same placement. */
        tp_module *lm_head = &m->modules[m->lm_head];
        const tp_module_param *w = &lm_head->params[TP_MODULE_WEIGHT];
        tp_param_desc head = {.kind = w->kind, .ndim = w->ndim, .module = lm_head};
        if (snprintf(head.name, sizeof head.name, "%s.%s", lm_head->name, w->suffix) >= (int)sizeof head.name)
            s = tp_fail(TP_ERR_INTERNAL, "%s: its name is too long", lm_head->name);
        memcpy(head.shape, w->shape, sizeof head.shape);
        const tp_param_plan *pp = tp->res->has_tied_head ? &tp->res->tied_head : NULL;
        if (!s) s = attach(m, lm_head, &head, pp, n, &tp->modules[tp->n_modules++]);
        if (!s && !pp) lm_head->tp->weight_slice = m->modules[m->embed_tokens].tp->weight_slice;
    }
    free(params);
    return s;
}

/* The rules on the blocks (self_attn, mlp), whose post_forward runs on the
 * block's output, and the sequence_parallel rules on the norms of the
 * residual stream: each module of the table keeps its own. */
static void attach_rules(tp_model *m)
{
    struct tp_model_tp *tp = m->tp;
    if (!tp->res->applied) return;
    for (size_t i = 0; i < m->n_modules; i++) {
        tp_module *mod = &m->modules[i];
        if (mod->type == TP_MT_ATTENTION || mod->type == TP_MT_MLP || mod->type == TP_MT_EXPERTS) {
            mod->plan = tp_plan_find_module(tp->res, mod->name);
        } else if (mod->type == TP_MT_NORM && mod->parent >= 0 && m->modules[mod->parent].type != TP_MT_ATTENTION) {
            const tp_module_plan *np = tp_plan_find_module(tp->res, mod->name);
            /* only a rule that moves the input runs through hooks; the others
             * leave the norm as it is (checked by tp_plan_check_flow) */
            if (np && np->fwd.installed && np->fwd.input.kind == TP_SHARD && np->fwd.input.dim == 0) mod->plan = np;
        }
    }
}

tp_status tp_model_tp_setup(tp_model *m, const tp_model_options *opt)
{
    if (!opt || (!opt->mesh && !opt->tp_plan && !opt->plan)) return TP_OK;
    struct tp_model_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return tp_fail(TP_ERR_NOMEM, "out of memory");
    m->tp = tp;
    tp->mesh = opt->mesh;
    tp->size = opt->mesh ? tp_mesh_size(opt->mesh, 0) : 1;
    tp->rank = opt->mesh ? tp_mesh_coord(opt->mesh, 0) : 0;
    if (opt->mesh && tp_mesh_ndim(opt->mesh) != 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "the model takes a 1-D tensor-parallel mesh");
    tp_status s = resolve(tp, &m->cfg, opt);
    if (!s) s = attach_modules(m);
    if (!s) attach_rules(m);
    return s;
}

void tp_model_tp_free(tp_model *m)
{
    if (!m->tp) return;
    tp_plan_resolution_free(m->tp->res);
    free(m->tp->modules);
    free(m->tp);
    m->tp = NULL;
}

tp_status tp_model_param_slice(const tp_model *m, size_t i, const tp_param_desc *p, tp_param_slice *out)
{
    if (m->tp && m->tp->res->applied) return tp_plan_param_slice(m->tp->res, i, m->tp->rank, out);
    memset(out, 0, sizeof *out);
    out->dim = -1;
    out->ndim = p->ndim;
    memcpy(out->local_shape, p->shape, (size_t)p->ndim * sizeof *p->shape);
    return TP_OK;
}
