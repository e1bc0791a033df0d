/* ColwiseParallel (§2.4): each rank computes a slice of the output features.
 * colwise keeps the slice (Shard(-1)); colwise_gather_output and its legacy
 * alias colwise_rep all-gather it.  Any size works: slices follow the chunk
 * rule and the gather takes per-rank counts (§10.10), so there is nothing to
 * validate (Transformers refuses gathered sizes that do not divide). */
#include "parallel_internal.h"

#include <string.h>

/* Which dimension the colwise family cuts (§2.4 table). */
static int colwise_dim(const tp_module_ctx *mod, const tp_param_ctx *p)
{
    if (mod->kind == TP_MODULE_EMBEDDING) return 1;
    if (tp_param_is_bias_named(p->short_name)) return p->ndim - 1;
    return p->ndim >= 2 ? p->ndim - 2 : p->ndim - 1;
}

static tp_status colwise_shard(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                               tp_placement *out)
{
    (void)st;
    *out = tp_shard(colwise_dim(mod, p));
    return TP_OK;
}

static tp_status colwise_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    *d = tp_par_desc_passthrough();
    d->input = d->compute_input = st->opt.input_layout;
    d->local_output = tp_shard(-1);
    d->output = st->opt.output_layout;
    if (mod->kind == TP_MODULE_EMBEDDING) {
        d->ids_input = 1;          /* ids are never split or gathered (§10.9) */
        d->input = d->compute_input = tp_replicate();
    } else {
        d->allreduce_backward_input = 1;
    }
    return TP_OK;
}

#define COLWISE(var, nm, out_layout)                                                     \
    const tp_style var = {                                                               \
        .name = nm, .impl = "ColwiseParallel",                                           \
        .opt = {.input_layout = {TP_REPLICATE, 0, 0}, .output_layout = out_layout,       \
                .has_input_layout = 1, .has_output_layout = 1, .use_local_output = 1},   \
        .shard_param = colwise_shard,                                                    \
        .install_forward = colwise_forward}

COLWISE(tp_par_colwise_gather_output, "colwise_gather_output", ((tp_placement){TP_REPLICATE, 0, 0}));
COLWISE(tp_par_colwise_rep, "colwise_rep", ((tp_placement){TP_REPLICATE, 0, 0}));
COLWISE(tp_par_colwise, "colwise", ((tp_placement){TP_SHARD, -1, 0}));

/* local_colwise (legacy, §2.19): colwise placements, no forward
 * transformation; the enclosing module communicates. */
const tp_style tp_par_local_colwise = {
    .name = "local_colwise", .impl = "ColwiseParallel(local)", .inference_only = 1,
    .shard_param = colwise_shard, .install_forward = tp_par_forward_local};
