/* RowwiseParallel (§2.5): each rank holds a slice of the input features and
 * computes a partial sum; the output is all-reduced and the bias (kept
 * replicated) added once, after the reduction. */
#include "parallel_internal.h"

static tp_status rowwise_shard(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                               tp_placement *out)
{
    (void)st;
    if (mod->kind == TP_MODULE_EMBEDDING) *out = tp_shard(0);       /* = embedding_rowwise */
    else if (tp_param_is_bias_named(p->short_name)) *out = tp_replicate();
    else *out = tp_shard(p->ndim - 1);
    return TP_OK;
}

static tp_status rowwise_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    *d = tp_par_desc_passthrough();
    d->local_output = tp_partial();
    d->output = st->opt.output_layout;
    if (mod->kind == TP_MODULE_EMBEDDING) {
        /* Token ids stay replicated: a vocabulary-parallel lookup (§10.9). */
        d->ids_input = 1;
        d->mask_vocab = 1;
        return TP_OK;
    }
    d->input = st->opt.input_layout;          /* Shard(-1), or Replicate split locally */
    d->compute_input = tp_shard(-1);
    d->bias_after_reduce = 1;
    return TP_OK;
}

#define ROWWISE(var, nm, in_layout)                                                      \
    const tp_style var = {                                                               \
        .name = nm, .impl = "RowwiseParallel",                                           \
        .opt = {.input_layout = in_layout, .output_layout = {TP_REPLICATE, 0, 0},        \
                .has_input_layout = 1, .has_output_layout = 1, .use_local_output = 1},   \
        .shard_param = rowwise_shard, .install_forward = rowwise_forward}

ROWWISE(tp_par_rowwise, "rowwise", ((tp_placement){TP_SHARD, -1, 0}));
ROWWISE(tp_par_rowwise_split_input, "rowwise_split_input", ((tp_placement){TP_REPLICATE, 0, 0}));
ROWWISE(tp_par_rowwise_rep, "rowwise_rep", ((tp_placement){TP_REPLICATE, 0, 0}));

/* local_rowwise (legacy): weight Shard(-1), bias Replicate, no transformation. */
const tp_style tp_par_local_rowwise = {
    .name = "local_rowwise", .impl = "RowwiseParallel(local)", .inference_only = 1,
    .shard_param = rowwise_shard, .install_forward = tp_par_forward_local};
