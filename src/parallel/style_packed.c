/* Packed styles (§2.8, §2.9) for fused tensors such as gate_up_proj =
 * [gate; up]: a StridedShard gives every rank matching slices of each
 * block, which a contiguous split would not. */
#include "parallel_internal.h"

static int split_of(const tp_style *st) { return st->opt.split_factor > 0 ? st->opt.split_factor : 2; }

static tp_status packed_colwise_shard(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                                      tp_placement *out)
{
    (void)mod;
    int d = (tp_param_is_bias_named(p->short_name) || p->ndim == 1) ? p->ndim - 1 : p->ndim - 2;
    *out = tp_strided_shard(d, split_of(st));
    return TP_OK;
}

static tp_status packed_rowwise_shard(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                                      tp_placement *out)
{
    (void)mod;
    *out = p->ndim >= 2 ? tp_strided_shard(p->ndim - 1, split_of(st)) : tp_replicate();
    return TP_OK;
}

/* The blocks must have equal sizes, or "matching slices" means nothing. */
static tp_status packed_validate(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                                 const char *qualified_name)
{
    tp_placement pl;
    tp_status s = st->shard_param(st, mod, p, &pl);
    if (s || pl.kind != TP_STRIDED_SHARD) return s;
    int64_t n = p->shape[pl.dim];
    if (n % pl.split == 0) return TP_OK;
    return tp_fail(TP_ERR_INVALID, "The packed dimension of `%s` (%lld) is not divisible by split_factor (%d).",
                   qualified_name, (long long)n, pl.split);
}

static tp_status packed_colwise_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)mod;
    *d = tp_par_desc_passthrough();
    /* The consumer splits the local [gate_r ; up_r] itself: nothing moves. */
    d->local_output = d->output = tp_strided_shard(-1, split_of(st));
    d->allreduce_backward_input = 1;
    return TP_OK;
}

const tp_style tp_par_packed_colwise = {
    .name = "packed_colwise", .impl = "PackedColwiseParallel",
    .opt = {.input_layout = {TP_REPLICATE, 0, 0}, .has_input_layout = 1, .use_local_output = 1, .split_factor = 2},
    .validate_param = packed_validate, .shard_param = packed_colwise_shard,
    .install_forward = packed_colwise_forward};

/* Parameter-only styles: the module's forward runs as it is. */
const tp_style tp_par_packed_rowwise = {
    .name = "packed_rowwise", .impl = "PackedRowwiseParallel",
    .opt = {.split_factor = 2},
    .validate_param = packed_validate, .shard_param = packed_rowwise_shard, .install_forward = tp_par_forward_local};

const tp_style tp_par_local_packed_rowwise = {
    .name = "local_packed_rowwise", .impl = "PackedRowwiseParallel(local)", .inference_only = 1,
    .opt = {.split_factor = 2},
    .validate_param = packed_validate, .shard_param = packed_rowwise_shard, .install_forward = tp_par_forward_local};
