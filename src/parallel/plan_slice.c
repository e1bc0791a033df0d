/* Which global indices each rank holds (§1.2, §6.2, §8.3): the loader reads
 * exactly these ranges, and reports derive shapes and bytes from them.
 * Splits use the chunk rule only (tp_chunk_range). */
#include "parallel_internal.h"

#include <string.h>

tp_status tp_plan_slice_of(const tp_plan_resolution *r, const tp_param_plan *p, int rank,
                           tp_param_slice *out)
{
    memset(out, 0, sizeof *out);
    if (rank < 0 || rank >= r->tp_size)
        return tp_fail(TP_ERR_INVALID, "rank %d is outside a tensor parallel group of %d", rank, r->tp_size);
    out->ndim = p->ndim;
    memcpy(out->local_shape, p->shape, sizeof out->local_shape);
    out->dim = -1;
    tp_placement pl = p->placement;
    if (!r->applied || pl.kind == TP_REPLICATE || pl.kind == TP_PARTIAL) return TP_OK;
    int d = pl.dim;
    out->dim = d;
    int64_t n = p->shape[d], start, size;
    if (p->kv_rep > 1) {
        /* One whole KV head per rank: head floor(r / n_rep) (§8.3). */
        int64_t head = rank / p->kv_rep;
        out->n = 1;
        out->start[0] = head * p->head_dim;
        out->len[0] = p->head_dim;
    } else if (pl.kind == TP_SHARD) {
        tp_chunk_range(n, r->tp_size, rank, &start, &size);
        out->n = 1;
        out->start[0] = start;
        out->len[0] = size;
    } else {
        /* StridedShard: the chunk of every packed block, in block order. */
        int64_t m = n / pl.split;
        tp_chunk_range(m, r->tp_size, rank, &start, &size);
        out->n = pl.split;
        for (int j = 0; j < pl.split; j++) {
            out->start[j] = j * m + start;
            out->len[j] = size;
        }
    }
    int64_t local = 0;
    for (int j = 0; j < out->n; j++) local += out->len[j];
    out->local_shape[d] = local;
    return TP_OK;
}

tp_status tp_plan_param_slice(const tp_plan_resolution *r, size_t i, int rank, tp_param_slice *out)
{
    if (i < r->n_params) return tp_plan_slice_of(r, &r->params[i], rank, out);
    if (i == r->n_params && r->has_tied_head) return tp_plan_slice_of(r, &r->tied_head, rank, out);
    return tp_fail(TP_ERR_INVALID, "parameter index %zu is out of range (%zu parameters)", i, r->n_params);
}

void tp_plan_q_heads(const tp_plan_resolution *r, int rank, int64_t *first, int64_t *count)
{
    int64_t H = r->cfg.num_attention_heads;
    if (r->applied && r->heads_sharded) {
        *first = rank * (H / r->tp_size);
        *count = H / r->tp_size;
    } else {
        *first = 0;
        *count = H;
    }
}

void tp_plan_kv_heads(const tp_plan_resolution *r, int rank, int64_t *first, int64_t *count)
{
    int64_t K = r->cfg.num_key_value_heads;
    if (!r->applied || r->kv_heads_per_rank == K) { *first = 0; *count = K; }
    else if (r->kv_rep > 1) { *first = rank / r->kv_rep; *count = 1; }
    else { *first = rank * r->kv_heads_per_rank; *count = r->kv_heads_per_rank; }
}

void tp_plan_vocab_range(const tp_plan_resolution *r, int rank, int64_t *start, int64_t *count)
{
    tp_chunk_range(r->cfg.vocab_size, r->tp_size, rank, start, count);
}

/* FNV-1a: small, stable across platforms, enough to tell two plans apart. */
static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static uint64_t fnv_param(uint64_t h, const tp_param_plan *p)
{
    int32_t v[4] = {(int32_t)p->placement.kind, p->placement.dim, p->placement.split, p->kv_rep};
    h = fnv(h, p->name, strlen(p->name) + 1);
    return fnv(h, v, sizeof v);
}

uint64_t tp_plan_digest(const tp_plan_resolution *r)
{
    uint64_t h = 1469598103934665603ull;
    int32_t P = r->tp_size;
    h = fnv(h, &P, sizeof P);
    for (size_t i = 0; i < r->n_params; i++) h = fnv_param(h, &r->params[i]);
    if (r->has_tied_head) h = fnv_param(h, &r->tied_head);
    for (size_t i = 0; i < r->n_modules; i++) {
        h = fnv(h, r->modules[i].name, strlen(r->modules[i].name) + 1);
        h = fnv(h, r->modules[i].style->name, strlen(r->modules[i].style->name) + 1);
    }
    return h;
}

tp_status tp_plan_fail_disagree(int rank_a, int rank_b)
{
    return tp_fail(TP_ERR_INVALID, "Ranks disagree on the tensor parallel plan (rank %d and rank %d resolved "
                   "different plans); register the same styles and pass the same plan on every rank.", rank_a, rank_b);
}

tp_status tp_plan_check_training(const tp_plan_resolution *r)
{
    for (size_t i = 0; i < r->n_params; i++)
        if (r->params[i].style && r->params[i].style->inference_only)
            return tp_fail(TP_ERR_UNSUPPORTED, "The legacy tensor parallel style '%s' is inference-only and "
                           "cannot be used for training.", r->params[i].style->name);
    for (size_t i = 0; i < r->n_modules; i++)
        if (r->modules[i].style->inference_only)
            return tp_fail(TP_ERR_UNSUPPORTED, "The legacy tensor parallel style '%s' is inference-only and "
                           "cannot be used for training.", r->modules[i].style->name);
    return TP_OK;
}

void tp_plan_log_pattern_warnings(const tp_plan_resolution *r, int global_rank)
{
    if (global_rank != 0) return;
    for (size_t i = 0; i < r->n_pattern_warnings; i++) tp_log(TP_LOG_WARN, "%s", r->pattern_warnings[i]);
}

void tp_plan_log_coverage(const tp_plan_resolution *r, int global_rank)
{
    if (global_rank != 0) return;
    if (r->not_applied_warning) tp_log(TP_LOG_WARN, "%s", r->not_applied_warning);
    if (r->not_sharded_warning) tp_log(TP_LOG_WARN, "%s", r->not_sharded_warning);
}

const char *tp_plan_placement_str(tp_placement p, char *buf, size_t cap)
{
    return tp_placement_str(p, buf, cap);
}
