/* Resolving a plan against a model's parameter table (§4.4, §4.5): which
 * rule and style each parameter and module gets, with every check that can
 * be made before a weight is read, in §4.4's order. */
#include "parallel_internal.h"

#include <stdlib.h>
#include <string.h>

/* The module tree, derived from the parameter names: every dotted prefix of
 * a parameter name is a module, listed in pre-order (checkpoint order
 * visits parents before children). */
typedef struct {
    char name[96];
    tp_module_kind kind;
} module_info;

typedef struct {
    tp_plan_resolution *r;
    const tp_style_registry *view;
    module_info *mods;
    size_t n_mods;
} ctx;

static tp_status add_module(ctx *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->n_mods; i++)
        if (strlen(c->mods[i].name) == len && !strncmp(c->mods[i].name, name, len)) return TP_OK;
    module_info *nv = realloc(c->mods, (c->n_mods + 1) * sizeof *nv);
    if (!nv) return tp_fail(TP_ERR_NOMEM, "out of memory");
    c->mods = nv;
    module_info *m = &c->mods[c->n_mods++];
    snprintf(m->name, sizeof m->name, "%.*s", (int)len, name);
    m->kind = TP_MODULE_OTHER;
    return TP_OK;
}

static module_info *find_module(ctx *c, const char *name)
{
    for (size_t i = 0; i < c->n_mods; i++)
        if (!strcmp(c->mods[i].name, name)) return &c->mods[i];
    return NULL;
}

/* The module kind follows from the parameters a module owns (§2.3). */
static tp_module_kind kind_of(const tp_param_plan *p)
{
    if (p->kind == TP_PARAM_EMBEDDING) return TP_MODULE_EMBEDDING;
    if (p->ndim == 3) return TP_MODULE_EXPERTS;   /* [E, out, in] expert stacks */
    if (p->kind == TP_PARAM_WEIGHT || p->kind == TP_PARAM_BIAS) return TP_MODULE_LINEAR;
    return TP_MODULE_OTHER;
}

static tp_status build_modules(ctx *c)
{
    tp_plan_resolution *r = c->r;
    size_t n = r->n_params + (r->has_tied_head ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        const tp_param_plan *p = i < r->n_params ? &r->params[i] : &r->tied_head;
        for (const char *d = strchr(p->name, '.'); d; d = strchr(d + 1, '.')) {
            tp_status s = add_module(c, p->name, (size_t)(d - p->name));
            if (s) return s;
        }
        char parent[96];
        tp_par_parent_name(p->name, parent, sizeof parent);
        module_info *m = find_module(c, parent);
        if (m && m->kind == TP_MODULE_OTHER) m->kind = kind_of(p);
    }
    return TP_OK;
}

/* ---- step 2: style names ---------------------------------------------- */

static tp_status check_style_names(const tp_plan *plan, const tp_style_registry *view)
{
    tp_par_buf b = {0};
    size_t bad = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const tp_plan_entry *e = &plan->v[i];
        if (e->style && tp_style_registry_get(view, e->style)) continue;
        tp_par_buf_puts(&b, bad++ ? ", " : "");
        tp_par_buf_printf(&b, "%s for layer ", e->value_json);
        tp_par_buf_pyrepr(&b, e->key);
    }
    char *list = tp_par_buf_take(&b);
    if (!bad) { free(list); return TP_OK; }
    char *names = tp_style_registry_names_repr(view);
    tp_status s = (!list || !names)
        ? tp_fail(TP_ERR_NOMEM, "out of memory")
        : tp_fail(TP_ERR_INVALID, "Unsupported tensor parallel style%s %s. Supported styles are %s",
                  bad > 1 ? "s" : "", list, names);
    free(list);
    free(names);
    return s;
}

/* ---- step 3: keys that match nothing ----------------------------------- */

static int name_matches_key(const char *name, const char *key)
{
    if (!strcmp(name, key)) return 1;
    char norm[256];
    tp_plan_normalize(name, norm, sizeof norm);
    return !strcmp(norm, key);
}

static int key_matches_anything(ctx *c, const char *key)
{
    tp_plan_resolution *r = c->r;
    for (size_t i = 0; i < c->n_mods; i++)
        if (name_matches_key(c->mods[i].name, key)) return 1;
    for (size_t i = 0; i < r->n_params; i++)
        if (name_matches_key(r->params[i].name, key)) return 1;
    return r->has_tied_head && name_matches_key(r->tied_head.name, key);
}

static tp_status collect_pattern_warnings(ctx *c)
{
    tp_plan_resolution *r = c->r;
    if (!r->plan.is_user) return TP_OK;
    for (size_t i = 0; i < r->plan.n; i++) {
        if (key_matches_anything(c, r->plan.v[i].key)) continue;
        tp_par_buf b = {0};
        tp_par_buf_printf(&b, "Layer pattern '%s' does not match any parameters in the model. This rule may "
                              "not be applied during tensor parallelization, or may lead to dimension mismatches",
                          r->plan.v[i].key);
        char *w = tp_par_buf_take(&b), **nv = realloc(r->pattern_warnings, (r->n_pattern_warnings + 1) * sizeof *nv);
        if (!w || !nv) { free(w); if (nv) r->pattern_warnings = nv; return tp_fail(TP_ERR_NOMEM, "out of memory"); }
        r->pattern_warnings = nv;
        r->pattern_warnings[r->n_pattern_warnings++] = w;
    }
    return TP_OK;
}

/* ---- step 4: parameters ------------------------------------------------ */

static tp_status refuse_not_yet(const tp_style *st, const char *key, const char *what, const char *name)
{
    return tp_fail(TP_ERR_UNSUPPORTED,
                   "Tensor parallel style '%s' (%s, rule '%s' for %s `%s`) is not supported for this model yet: "
                   "tensorpar implements it only for MoE, expert-parallel and MLA model types, which this model is not.",
                   st->name, st->impl, key, what, name);
}

static tp_status resolve_param(ctx *c, tp_param_plan *p)
{
    tp_plan_resolution *r = c->r;
    p->placement = tp_replicate();
    p->rule = tp_plan_match_param(&r->plan, p->name, &p->via_module);
    if (p->rule < 0) return TP_OK;
    const tp_plan_entry *e = &r->plan.v[p->rule];
    p->style = tp_style_registry_get(c->view, e->style);
    r->entry_used[p->rule] = 1;
    if (p->style->support == TP_STYLE_NOT_YET) return refuse_not_yet(p->style, e->key, "parameter", p->name);
    char parent[96];
    tp_par_parent_name(p->name, parent, sizeof parent);
    module_info *m = find_module(c, parent);
    tp_module_ctx mod = {parent, m ? m->kind : TP_MODULE_OTHER, r->tp_size, 0, &r->cfg, NULL, NULL};
    tp_param_ctx pc = {p->name, strrchr(p->name, '.') ? strrchr(p->name, '.') + 1 : p->name,
                       p->kind, p->ndim, p->shape};
    tp_status s = tp_style_validate_param(p->style, &mod, &pc, p->name);
    if (!s) s = tp_style_shard_param(p->style, &mod, &pc, &p->placement);
    if (!s && p->placement.kind == TP_STRIDED_SHARD && p->placement.split > TP_PLAN_MAX_RANGES)
        s = tp_fail(TP_ERR_UNSUPPORTED, "`%s`: split factor %d is above tensorpar's limit of %d",
                    p->name, p->placement.split, TP_PLAN_MAX_RANGES);
    if (!s && p->placement.kind == TP_STRIDED_SHARD && p->shape[p->placement.dim] % p->placement.split)
        s = tp_fail(TP_ERR_INVALID, "The packed dimension of `%s` (%lld) is not divisible by split_factor (%d).",
                    p->name, (long long)p->shape[p->placement.dim], p->placement.split);
    if (!s && p->placement.kind == TP_PARTIAL)
        s = tp_fail(TP_ERR_INVALID, "style '%s' gave parameter `%s` a Partial placement, which a loaded "
                    "parameter cannot have", p->style->name, p->name);
    return s;
}

/* ---- modules ----------------------------------------------------------- */

static int64_t module_width(ctx *c, const module_info *m)
{
    const tp_plan_resolution *r = c->r;
    size_t len = strlen(m->name);
    size_t n = r->n_params + (r->has_tied_head ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        const tp_param_plan *p = i < r->n_params ? &r->params[i] : &r->tied_head;
        if (strncmp(p->name, m->name, len) || p->name[len] != '.' || strchr(p->name + len + 1, '.')) continue;
        if (m->kind == TP_MODULE_EMBEDDING) return p->shape[1];
        if (m->kind == TP_MODULE_LINEAR && p->ndim == 2) return p->shape[0];
    }
    return r->cfg.hidden_size;
}

static tp_status resolve_modules(ctx *c)
{
    tp_plan_resolution *r = c->r;
    r->modules = calloc(c->n_mods ? c->n_mods : 1, sizeof *r->modules);
    if (!r->modules) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < c->n_mods; i++) {
        const module_info *m = &c->mods[i];
        int rule = tp_plan_match_module(&r->plan, m->name);
        if (rule < 0) continue;
        const tp_style *st = tp_style_registry_get(c->view, r->plan.v[rule].style);
        r->entry_used[rule] = 1;
        if (st->support == TP_STYLE_NOT_YET) return refuse_not_yet(st, r->plan.v[rule].key, "module", m->name);
        tp_module_plan *mp = &r->modules[r->n_modules++];
        snprintf(mp->name, sizeof mp->name, "%s", m->name);
        mp->kind = m->kind;
        mp->rule = rule;
        mp->style = st;
        mp->out_features = module_width(c, m);
        tp_module_ctx mod = {mp->name, m->kind, r->tp_size, 0, &r->cfg, NULL, NULL};
        tp_status s = tp_style_install_forward(st, &mod, &mp->fwd);
        if (s) return tp_fail_context(s, "Tensor parallel style '%s' on `%s`", st->name, mp->name);
    }
    return TP_OK;
}

/* ---- step 5: heads (§8.2, §8.3) ---------------------------------------- */

static tp_param_plan *param_named(tp_plan_resolution *r, const char *name)
{
    return (tp_param_plan *)tp_plan_find_param(r, name);
}

/* Split along the head dimension (dim 0 of a q/k/v weight or bias): only
 * then do the head counts of §8.2 matter.  A split of the input features
 * (rowwise) keeps every head whole; whether such a plan fits is
 * tp_plan_check_flow's question. */
static int sharded(const tp_param_plan *p)
{
    return p && (p->placement.kind == TP_SHARD || p->placement.kind == TP_STRIDED_SHARD) && p->placement.dim == 0;
}

static tp_status check_kv(tp_plan_resolution *r, int64_t layer)
{
    int64_t K = r->cfg.num_key_value_heads, P = r->tp_size;
    static const char *const parts[] = {"k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"};
    int any = 0;
    for (int j = 0; j < 4; j++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.%s", (long long)layer, parts[j]);
        tp_param_plan *p = param_named(r, name);
        if (!sharded(p)) continue;
        any = 1;
        if (K % P == 0) continue;
        if (K < P && P % K == 0 && p->placement.kind == TP_SHARD && p->placement.dim == 0) {
            /* Replicate each KV head over P/K consecutive ranks (§8.3). */
            p->kv_rep = (int)(P / K);
            p->head_dim = r->cfg.head_dim;
            continue;
        }
        if (K < P && P % K == 0)
            return tp_fail(TP_ERR_UNSUPPORTED, "`%s`: KV-head replication needs the head dimension split "
                           "(Shard(0)), not %s", name, tp_placement_str(p->placement, (char[48]){0}, 48));
        if (K < P)
            return tp_fail(TP_ERR_INVALID, "Cannot use tensor parallelism with tp_size=%lld for a model with "
                           "num_key_value_heads=%lld: when there are fewer KV heads than ranks, `num_key_value_heads` "
                           "must divide `tp_size` so that KV heads can be replicated.", (long long)P, (long long)K);
        return tp_fail(TP_ERR_INVALID, "Cannot use tensor parallelism with tp_size=%lld for a model with "
                       "num_key_value_heads=%lld: `num_key_value_heads` must be divisible by `tp_size`, or divide "
                       "it so that KV heads can be replicated.", (long long)P, (long long)K);
    }
    if (any && layer == 0) {
        r->kv_rep = K % P == 0 ? 1 : (int)(P / K);
        r->kv_heads_per_rank = K % P == 0 ? K / P : 1;
    }
    return TP_OK;
}

static tp_status check_heads(tp_plan_resolution *r)
{
    int64_t H = r->cfg.num_attention_heads, P = r->tp_size;
    r->q_heads_per_rank = H;
    r->kv_heads_per_rank = r->cfg.num_key_value_heads;
    r->kv_rep = 1;
    for (int64_t l = 0; l < r->cfg.num_hidden_layers; l++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.q_proj.weight", (long long)l);
        int split = sharded(param_named(r, name));
        /* MLA (§8.5): q_b_proj and kv_b_proj split the heads too. */
        static const char *const mla_parts[] = {"q_b_proj", "kv_b_proj"};
        for (int j = 0; j < 2 && r->cfg.mla; j++) {
            snprintf(name, sizeof name, "model.layers.%lld.self_attn.%s.weight", (long long)l, mla_parts[j]);
            split |= sharded(param_named(r, name));
        }
        if (split) {
            if (H % P)
                return tp_fail(TP_ERR_INVALID, "Cannot use tensor parallelism with tp_size=%lld for a model with "
                               "num_attention_heads=%lld: `num_attention_heads` must be divisible by `tp_size`.",
                               (long long)P, (long long)H);
            if (l == 0) { r->q_heads_per_rank = H / P; r->heads_sharded = 1; }
        }
        tp_status s = check_kv(r, l);
        if (s) return s;
    }
    /* MLA's keys and values are per query head after kv_b_proj, split with them */
    if (r->cfg.mla) r->kv_heads_per_rank = r->q_heads_per_rank;
    return TP_OK;
}

/* ---- step 8: tied parameters ------------------------------------------- */

static tp_status check_tied(tp_plan_resolution *r)
{
    if (!r->has_tied_head) return TP_OK;
    const tp_param_plan *a = &r->params[r->tied_head.tied_to], *b = &r->tied_head;
    if (tp_placement_equal(a->placement, b->placement, a->ndim)) return TP_OK;
    char pa[48], pb[48];
    return tp_fail(TP_ERR_INVALID,
                   "Tied parameters `%s` and `%s` resolve to different tensor parallel placements (%s and %s); "
                   "give them matching styles, e.g. `embed_tokens: embedding_rowwise` with `lm_head: "
                   "colwise_gather_output`.", a->name, b->name, tp_placement_str(a->placement, pa, sizeof pa),
                   tp_placement_str(b->placement, pb, sizeof pb));
}

/* ---- coverage (§4.6) --------------------------------------------------- */

static tp_status build_coverage(tp_plan_resolution *r)
{
    int unused = 0;
    for (size_t i = 0; i < r->plan.n; i++) unused |= !r->entry_used[i];
    if (unused) {
        unsigned char *only = malloc(r->plan.n);
        if (!only) return tp_fail(TP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < r->plan.n; i++) only[i] = !r->entry_used[i];
        char *rules = tp_plan_repr(&r->plan, only);
        free(only);
        tp_par_buf b = {0};
        tp_par_buf_printf(&b, "The following TP rules were not applied on any of the layers: %s", rules ? rules : "");
        free(rules);
        if (!(r->not_applied_warning = tp_par_buf_take(&b))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    tp_par_buf b = {0};
    size_t listed = 0;
    char **seen = calloc(r->n_params + 1, sizeof *seen);
    if (!seen) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < r->n_params; i++) {
        if (r->params[i].rule >= 0) continue;
        char norm[256];
        tp_plan_normalize(r->params[i].name, norm, sizeof norm);
        int dup = 0;
        for (size_t k = 0; k < listed && !dup; k++) dup = !strcmp(seen[k], norm);
        if (dup) continue;
        if (!(seen[listed] = strdup(norm))) break;
        if (listed++ == 0) tp_par_buf_puts(&b, "The following layers were not sharded: ");
        else tp_par_buf_puts(&b, ", ");
        tp_par_buf_puts(&b, norm);
    }
    for (size_t k = 0; k < listed; k++) free(seen[k]);
    free(seen);
    if (listed && !(r->not_sharded_warning = tp_par_buf_take(&b))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    free(b.s);
    return TP_OK;
}

/* ---- the whole resolution ---------------------------------------------- */

static tp_status load_params(tp_plan_resolution *r)
{
    tp_param_desc *d;
    size_t n;
    tp_status s = tp_model_params(&r->cfg, NULL, &d, &n);
    if (s) return s;
    r->params = calloc(n ? n : 1, sizeof *r->params);
    if (!r->params) { free(d); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    r->n_params = n;
    for (size_t i = 0; i < n; i++) {
        tp_param_plan *p = &r->params[i];
        snprintf(p->name, sizeof p->name, "%s", d[i].name);
        p->kind = d[i].kind;
        p->ndim = d[i].ndim;
        memcpy(p->shape, d[i].shape, sizeof p->shape);
        p->rule = -1;
        p->kv_rep = 1;
        p->tied_to = -1;
        p->placement = tp_replicate();
    }
    free(d);
    if (r->cfg.tie_word_embeddings) {
        /* lm_head.weight is the embedding (§6.3): not in the table, but its
         * module still runs and its placement must agree. */
        tp_param_plan *t = &r->tied_head;
        *t = r->params[0];
        snprintf(t->name, sizeof t->name, "lm_head.weight");
        t->kind = TP_PARAM_WEIGHT;
        t->tied_to = 0;
        r->has_tied_head = 1;
    }
    return TP_OK;
}

static tp_status resolve(ctx *c)
{
    tp_plan_resolution *r = c->r;
    tp_status s = check_style_names(&r->plan, c->view);     /* steps 1-2 */
    if (s || !r->applied) return s;                          /* tp_size = 1: validate only */
    if ((s = build_modules(c)) || (s = collect_pattern_warnings(c))) return s;
    for (size_t i = 0; i < r->n_params; i++)
        if ((s = resolve_param(c, &r->params[i]))) return s;
    if (r->has_tied_head && (s = resolve_param(c, &r->tied_head))) return s;
    if ((s = resolve_modules(c)) || (s = check_heads(r)) || (s = check_tied(r))) return s;
    return build_coverage(r);
}

tp_status tp_plan_resolve(const tp_model_config *cfg, const tp_plan *plan, int tp_size,
                          const tp_style_registry *view, tp_plan_resolution **out)
{
    *out = NULL;
    if (tp_size < 1) return tp_fail(TP_ERR_INVALID, "Parallelism sizes must be >= 1, got %d.", tp_size);
    tp_plan_resolution *r = calloc(1, sizeof *r);
    if (!r) return tp_fail(TP_ERR_NOMEM, "out of memory");
    r->tp_size = tp_size;
    r->applied = tp_size > 1;
    r->cfg = *cfg;
    r->q_heads_per_rank = cfg->num_attention_heads;
    r->kv_heads_per_rank = cfg->num_key_value_heads;
    r->kv_rep = 1;
    ctx c = {r, view, NULL, 0};
    tp_status s = tp_plan_copy(&r->plan, plan);
    if (!s && !(r->entry_used = calloc(plan->n + 1, 1))) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) s = load_params(r);
    if (!s) s = resolve(&c);
    free(c.mods);
    if (s) { tp_plan_resolution_free(r); return s; }
    *out = r;
    return TP_OK;
}

void tp_plan_resolution_free(tp_plan_resolution *r)
{
    if (!r) return;
    tp_plan_free(&r->plan);
    free(r->params);
    free(r->modules);
    free(r->entry_used);
    for (size_t i = 0; i < r->n_pattern_warnings; i++) free(r->pattern_warnings[i]);
    free(r->pattern_warnings);
    free(r->not_applied_warning);
    free(r->not_sharded_warning);
    free(r);
}

const tp_param_plan *tp_plan_find_param(const tp_plan_resolution *r, const char *name)
{
    for (size_t i = 0; i < r->n_params; i++)
        if (!strcmp(r->params[i].name, name)) return &r->params[i];
    return r->has_tied_head && !strcmp(r->tied_head.name, name) ? &r->tied_head : NULL;
}

const tp_module_plan *tp_plan_find_module(const tp_plan_resolution *r, const char *name)
{
    for (size_t i = 0; i < r->n_modules; i++)
        if (!strcmp(r->modules[i].name, name)) return &r->modules[i];
    return NULL;
}
