/* What `tensorpar plan` prints: the resolved plan, each parameter's
 * placement and local shape, bytes per rank, and the collectives of one
 * token's forward, derived from the modules' forward descriptions (a
 * placement change is a collective, §1.5). */
#include "parallel_internal.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int64_t numel(const tp_param_slice *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->local_shape[d];
    return n;
}

uint64_t tp_plan_rank_bytes(const tp_plan_resolution *r, int rank, size_t dtype_size)
{
    uint64_t total = 0;
    for (size_t i = 0; i < r->n_params; i++) {
        tp_param_slice s;
        if (tp_plan_param_slice(r, i, rank, &s) == TP_OK) total += (uint64_t)numel(&s) * dtype_size;
    }
    return total;   /* the tied lm_head shares the embedding's bytes */
}

/* The collectives that turn layout `from` into `to`, as tp_redistribute
 * performs them (tp_placement_step decides; a pair may take two steps, of
 * which only the communicating ones are listed).  Activations are
 * [batch, seq, hidden]: 3 dims, so Shard(-1) is the hidden dim and Shard(1)
 * the sequence. */
static void add_comms(tp_plan_comm *v, size_t *n, const char *module, tp_placement from, tp_placement to,
                      int64_t elements)
{
    for (int k = 0; k < 2 && !tp_placement_equal(from, to, 3); k++) {
        tp_placement via;
        tp_collective c = tp_placement_step(from, to, 3, &via);
        if (tp_collective_communicates(c)) v[(*n)++] = (tp_plan_comm){module, c, elements};
        from = via;
    }
}

tp_status tp_plan_comms(const tp_plan_resolution *r, tp_plan_comm **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    tp_plan_comm *v = calloc(4 * r->n_modules + 1, sizeof *v);
    if (!v) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < r->n_modules; i++) {
        const tp_module_plan *m = &r->modules[i];
        const tp_forward_desc *d = &m->fwd;
        if (!d->installed) continue;
        /* Input widths are not tracked; dense plans never communicate there. */
        if (!d->ids_input) add_comms(v, n, m->name, d->input, d->compute_input, r->cfg.hidden_size);
        add_comms(v, n, m->name, d->local_output, d->output, m->out_features);
    }
    *out = v;
    return TP_OK;
}

static const char *coll_name(tp_collective c)
{
    switch (c) {
    case TP_COLL_ALL_REDUCE: return "all-reduce";
    case TP_COLL_ALL_GATHER: return "all-gather";
    case TP_COLL_REDUCE_SCATTER: return "reduce-scatter";
    case TP_COLL_ALL_TO_ALL: return "all-to-all";
    case TP_COLL_LOCAL_SLICE: return "local slice";
    default: return "none";
    }
}

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    return tp_shape_str(ndim, shape, buf, cap);
}

/* 1 when some rank's local shape differs from rank 0's. */
static int ranks_differ(const tp_plan_resolution *r, const tp_param_plan *p)
{
    tp_param_slice s0, s;
    tp_plan_slice_of(r, p, 0, &s0);
    for (int k = 1; k < r->tp_size; k++) {
        tp_plan_slice_of(r, p, k, &s);
        if (memcmp(s.local_shape, s0.local_shape, sizeof s.local_shape)) return 1;
    }
    return 0;
}

static void print_ranges(FILE *f, const tp_param_slice *s)
{
    if (s->dim < 0) { fprintf(f, "all"); return; }
    fprintf(f, "dim %d:", s->dim);
    for (int j = 0; j < s->n; j++)
        fprintf(f, " [%" PRId64 ", %" PRId64 ")", s->start[j], s->start[j] + s->len[j]);
}

static void print_param(FILE *f, const tp_plan_resolution *r, const tp_param_plan *p)
{
    char pl[48], g[48], l[48];
    tp_param_slice s;
    tp_plan_slice_of(r, p, 0, &s);
    const char *rule = p->rule >= 0 ? r->plan.v[p->rule].key : "-";
    fprintf(f, "  %s\n      rule %s%s  style %s  %s%s  global %s  rank 0 %s  (",
            p->name, rule, p->via_module ? " (module)" : "", p->style ? p->style->name : "-",
            tp_placement_str(p->placement, pl, sizeof pl), p->kv_rep > 1 ? " per KV head" : "",
            shape_str(p->ndim, p->shape, g, sizeof g), shape_str(s.ndim, s.local_shape, l, sizeof l));
    print_ranges(f, &s);
    fprintf(f, ")");
    if (p->tied_to >= 0) fprintf(f, "  tied to %s", r->params[p->tied_to].name);
    if (ranks_differ(r, p)) {
        fprintf(f, "\n      ranks differ:");
        for (int k = 0; k < r->tp_size; k++) {
            tp_plan_slice_of(r, p, k, &s);
            fprintf(f, " %d=%s", k, shape_str(s.ndim, s.local_shape, l, sizeof l));
        }
    }
    fprintf(f, "\n");
}

static size_t stored_size(const tp_plan_resolution *r)
{
    return tp_dtype_size(r->cfg.dtype == TP_BF16 || r->cfg.dtype == TP_F16 ? r->cfg.dtype : TP_F32);
}

static void print_heads(FILE *f, const tp_plan_resolution *r)
{
    int64_t qf, qc, kf, kc;
    tp_plan_q_heads(r, 0, &qf, &qc);
    tp_plan_kv_heads(r, 0, &kf, &kc);
    fprintf(f, "heads: %" PRId64 " attention heads, %" PRId64 " per rank; %" PRId64 " KV heads, %" PRId64 " per rank",
            r->cfg.num_attention_heads, qc, r->cfg.num_key_value_heads, kc);
    if (r->kv_rep > 1) {
        fprintf(f, " (each KV head replicated on %d consecutive ranks:", r->kv_rep);
        for (int k = 0; k < r->tp_size; k++) {
            tp_plan_kv_heads(r, k, &kf, &kc);
            fprintf(f, " rank %d->head %" PRId64, k, kf);
        }
        fprintf(f, ")");
    }
    fprintf(f, "\n");
}

tp_status tp_plan_report_text(const tp_plan_resolution *r, FILE *f)
{
    fprintf(f, "model: %s (%s), %s weights\n", r->cfg.model_type, tp_arch_class_name(r->cfg.arch),
            tp_dtype_name(r->cfg.dtype));
    fprintf(f, "tensor parallel: %s; tp_size %d\n",
            tp_plan_supports_tp(&r->cfg) ? "supported (built-in plan)" : "no built-in plan", r->tp_size);
    fprintf(f, "\nplan (%zu rules, %s):\n", r->plan.n, r->plan.is_user ? "user plan" : "auto");
    for (size_t i = 0; i < r->plan.n; i++)
        fprintf(f, "  %-40s %s\n", r->plan.v[i].key, r->plan.v[i].style ? r->plan.v[i].style : r->plan.v[i].value_json);
    if (!r->applied) {
        fprintf(f, "\ntp_size 1: the plan is validated but not applied; every parameter is replicated.\n");
        fprintf(f, "bytes per rank: %" PRIu64 "\n", tp_plan_rank_bytes(r, 0, stored_size(r)));
        return TP_OK;
    }
    fprintf(f, "\n");
    print_heads(f, r);
    fprintf(f, "\nparameters (placement and local shape of rank 0 of %d):\n", r->tp_size);
    for (size_t i = 0; i < r->n_params; i++) print_param(f, r, &r->params[i]);
    if (r->has_tied_head) print_param(f, r, &r->tied_head);
    uint64_t full = 0;
    for (size_t i = 0; i < r->n_params; i++)
    {
        uint64_t n = 1;
        for (int d = 0; d < r->params[i].ndim; d++) n *= (uint64_t)r->params[i].shape[d];
        full += n * stored_size(r);
    }
    fprintf(f, "\nbytes per rank (%s; unsplit %" PRIu64 "):", tp_dtype_name(r->cfg.dtype), full);
    for (int k = 0; k < r->tp_size; k++) fprintf(f, " rank %d %" PRIu64 ";", k, tp_plan_rank_bytes(r, k, stored_size(r)));
    fprintf(f, "\n\nforward collectives per token (f32 activations):\n");
    tp_plan_comm *c;
    size_t nc;
    tp_status s = tp_plan_comms(r, &c, &nc);
    if (s) return s;
    uint64_t bytes = 0;
    for (size_t i = 0; i < nc; i++) {
        fprintf(f, "  %-40s %-22s %-10s %" PRId64 " x f32 = %" PRId64 " bytes\n", c[i].module,
                tp_plan_find_module(r, c[i].module)->style->name, coll_name(c[i].coll), c[i].elements, c[i].elements * 4);
        bytes += (uint64_t)c[i].elements * 4;
    }
    fprintf(f, "  total: %zu collectives, %" PRIu64 " bytes per token\n", nc, bytes);
    free(c);
    fprintf(f, "\nwarnings:%s\n", r->n_pattern_warnings || r->not_applied_warning || r->not_sharded_warning ? "" : " none");
    for (size_t i = 0; i < r->n_pattern_warnings; i++) fprintf(f, "  %s\n", r->pattern_warnings[i]);
    if (r->not_applied_warning) fprintf(f, "  %s\n", r->not_applied_warning);
    if (r->not_sharded_warning) fprintf(f, "  %s\n", r->not_sharded_warning);
    return TP_OK;
}

/* ---- JSON -------------------------------------------------------------- */

static cJSON *shape_json(int ndim, const int64_t *shape)
{
    cJSON *a = cJSON_CreateArray();
    for (int d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
    return a;
}

static cJSON *placement_json(tp_placement p)
{
    char buf[48];
    return cJSON_CreateString(tp_placement_str(p, buf, sizeof buf));
}

static cJSON *param_json(const tp_plan_resolution *r, const tp_param_plan *p)
{
    cJSON *o = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "name", p->name);
    if (p->rule >= 0) cJSON_AddStringToObject(o, "rule", r->plan.v[p->rule].key);
    else cJSON_AddNullToObject(o, "rule");
    cJSON_AddBoolToObject(o, "via_module", p->via_module);
    if (p->style) cJSON_AddStringToObject(o, "style", p->style->name);
    else cJSON_AddNullToObject(o, "style");
    cJSON_AddItemToObject(o, "placement", placement_json(p->placement));
    cJSON_AddNumberToObject(o, "kv_replication", p->kv_rep);
    if (p->tied_to >= 0) cJSON_AddStringToObject(o, "tied_to", r->params[p->tied_to].name);
    cJSON_AddItemToObject(o, "global_shape", shape_json(p->ndim, p->shape));
    for (int k = 0; k < r->tp_size; k++) {
        tp_param_slice s;
        tp_plan_slice_of(r, p, k, &s);
        if (k == 0) cJSON_AddItemToObject(o, "local_shape", shape_json(s.ndim, s.local_shape));
        cJSON *rk = cJSON_CreateObject(), *rg = cJSON_CreateArray();
        cJSON_AddNumberToObject(rk, "rank", k);
        cJSON_AddItemToObject(rk, "local_shape", shape_json(s.ndim, s.local_shape));
        cJSON_AddNumberToObject(rk, "dim", s.dim);
        for (int j = 0; j < s.n; j++) {
            int64_t range[2] = {s.start[j], s.start[j] + s.len[j]};
            cJSON_AddItemToArray(rg, shape_json(2, range));
        }
        cJSON_AddItemToObject(rk, "ranges", rg);
        cJSON_AddItemToArray(ranks, rk);
    }
    cJSON_AddBoolToObject(o, "ranks_differ", ranks_differ(r, p));
    cJSON_AddItemToObject(o, "ranks", ranks);
    return o;
}

static cJSON *module_json(const tp_module_plan *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->name);
    cJSON_AddStringToObject(o, "kind", tp_module_kind_name(m->kind));
    cJSON_AddStringToObject(o, "style", m->style->name);
    cJSON_AddStringToObject(o, "input", m->fwd.ids_input ? "ids" : "");
    if (!m->fwd.ids_input) cJSON_ReplaceItemInObject(o, "input", placement_json(m->fwd.input));
    cJSON_AddItemToObject(o, "compute_input", placement_json(m->fwd.compute_input));
    cJSON_AddItemToObject(o, "local_output", placement_json(m->fwd.local_output));
    cJSON_AddItemToObject(o, "output", placement_json(m->fwd.output));
    cJSON_AddBoolToObject(o, "bias_after_reduce", m->fwd.bias_after_reduce);
    cJSON_AddBoolToObject(o, "mask_vocab", m->fwd.mask_vocab);
    return o;
}

static cJSON *heads_json(const tp_plan_resolution *r)
{
    cJSON *o = cJSON_CreateObject(), *kv = cJSON_CreateArray();
    int64_t f, c;
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)r->cfg.num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)r->cfg.num_key_value_heads);
    tp_plan_q_heads(r, 0, &f, &c);
    cJSON_AddNumberToObject(o, "q_heads_per_rank", (double)c);
    tp_plan_kv_heads(r, 0, &f, &c);
    cJSON_AddNumberToObject(o, "kv_heads_per_rank", (double)c);
    cJSON_AddNumberToObject(o, "kv_replication", r->kv_rep);
    for (int k = 0; k < r->tp_size; k++) {
        tp_plan_kv_heads(r, k, &f, &c);
        int64_t range[2] = {f, f + c};
        cJSON_AddItemToArray(kv, shape_json(2, range));
    }
    cJSON_AddItemToObject(o, "kv_heads_by_rank", kv);
    return o;
}

static cJSON *comms_json(const tp_plan_resolution *r)
{
    cJSON *o = cJSON_CreateObject(), *list = cJSON_CreateArray();
    tp_plan_comm *c;
    size_t nc;
    double bytes = 0;
    if (tp_plan_comms(r, &c, &nc) == TP_OK) {
        for (size_t i = 0; i < nc; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "module", c[i].module);
            cJSON_AddStringToObject(e, "collective", coll_name(c[i].coll));
            cJSON_AddNumberToObject(e, "elements", (double)c[i].elements);
            cJSON_AddNumberToObject(e, "bytes", (double)c[i].elements * 4);
            cJSON_AddItemToArray(list, e);
            bytes += (double)c[i].elements * 4;
        }
        free(c);
    }
    cJSON_AddNumberToObject(o, "count", (double)cJSON_GetArraySize(list));
    cJSON_AddNumberToObject(o, "bytes", bytes);
    cJSON_AddItemToObject(o, "list", list);
    return o;
}

char *tp_plan_report_json(const tp_plan_resolution *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_type", r->cfg.model_type);
    cJSON_AddStringToObject(o, "architecture", tp_arch_class_name(r->cfg.arch));
    cJSON_AddBoolToObject(o, "supports_tp", tp_plan_supports_tp(&r->cfg));
    cJSON_AddNumberToObject(o, "tp_size", r->tp_size);
    cJSON_AddBoolToObject(o, "applied", r->applied);
    cJSON_AddStringToObject(o, "plan_source", r->plan.is_user ? "user" : "auto");
    char *pj = tp_plan_to_json(&r->plan);
    cJSON_AddItemToObject(o, "plan", pj ? cJSON_Parse(pj) : cJSON_CreateNull());
    free(pj);
    cJSON_AddItemToObject(o, "heads", heads_json(r));
    cJSON *params = cJSON_AddArrayToObject(o, "parameters");
    for (size_t i = 0; i < r->n_params; i++) cJSON_AddItemToArray(params, param_json(r, &r->params[i]));
    if (r->has_tied_head) cJSON_AddItemToObject(o, "tied_lm_head", param_json(r, &r->tied_head));
    cJSON *mods = cJSON_AddArrayToObject(o, "modules");
    for (size_t i = 0; i < r->n_modules; i++) cJSON_AddItemToArray(mods, module_json(&r->modules[i]));
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes_per_rank");
    for (int k = 0; k < r->tp_size; k++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((double)tp_plan_rank_bytes(r, k, stored_size(r))));
    cJSON_AddItemToObject(o, "collectives_per_token", comms_json(r));
    cJSON *w = cJSON_AddArrayToObject(o, "warnings");
    for (size_t i = 0; i < r->n_pattern_warnings; i++) cJSON_AddItemToArray(w, cJSON_CreateString(r->pattern_warnings[i]));
    if (r->not_applied_warning) cJSON_AddItemToArray(w, cJSON_CreateString(r->not_applied_warning));
    if (r->not_sharded_warning) cJSON_AddItemToArray(w, cJSON_CreateString(r->not_sharded_warning));
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
