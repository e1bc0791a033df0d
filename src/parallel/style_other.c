/* The styles that place no sharded parameters: they mark gradient
 * reductions, synchronise outputs, or run a module on local shards
 * (§2.10–§2.12, §2.16, and the legacy gather / local / replicate, §2.19). */
#include "parallel_internal.h"

/* replicated_with_grad_allreduce (§2.11): forward unchanged; the backward
 * sums each parameter-gradient contribution over the group exactly once. */
static tp_status rwga_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st; (void)mod;
    *d = tp_par_desc_local();          /* input as received, output unchanged */
    d->param_grad_allreduce = 1;
    return TP_OK;
}

const tp_style tp_par_replicated_with_grad_allreduce = {
    .name = "replicated_with_grad_allreduce", .impl = "ReplicatedWithGradAllReduce",
    .install_forward = rwga_forward};

/* sequence_parallel (§2.10): per-token modules on a Shard(1) activation. */
static tp_status sp_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)mod;
    *d = tp_par_desc_passthrough();
    /* tensorpar's activations are [T, width], the batch folded into the
     * rows: [B, T, H]'s sequence dim 1 is dim 0 here. */
    tp_placement seq = tp_shard(st->opt.sequence_dim - 1);
    d->input = d->compute_input = d->local_output = d->output = seq;
    d->param_grad_allreduce = 1;
    return TP_OK;
}

const tp_style tp_par_sequence_parallel = {
    .name = "sequence_parallel", .impl = "SequenceParallel",
    .opt = {.sequence_dim = 1, .use_local_output = 1}, .install_forward = sp_forward};

/* all_reduce (§2.12): the module's output is a partial sum; its input is
 * used as it comes ("any"). */
static tp_status ar_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st; (void)mod;
    *d = tp_par_desc_passthrough();
    d->input_from_model = 1;
    d->local_output = tp_partial();
    d->output = tp_replicate();
    return TP_OK;
}

const tp_style tp_par_all_reduce = {
    .name = "all_reduce", .impl = "AllReduceParallel", .install_forward = ar_forward};

/* local_params (§2.16, §10.5): the module's parameters are placed by their
 * own rules; its forward sees local shards and nothing moves. */
const tp_style tp_par_local_params = {
    .name = "local_params", .impl = "LocalParamsParallel", .install_forward = tp_par_forward_local};

/* Legacy gather (GatherParallel): output all-reduced, no backward. */
const tp_style tp_par_gather = {
    .name = "gather", .impl = "GatherParallel", .inference_only = 1, .install_forward = ar_forward};

/* Legacy local (IsolatedParallel): parameters used ÷ P, since the parent
 * (typically `gather`) sums P copies. */
static tp_status isolated_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st; (void)mod;
    *d = tp_par_desc_local();
    d->divide_params_by_p = 1;
    return TP_OK;
}

const tp_style tp_par_local = {
    .name = "local", .impl = "IsolatedParallel", .inference_only = 1, .install_forward = isolated_forward};

/* Legacy replicate (ReplicateParallel): Replicate in, local out, no comm. */
const tp_style tp_par_replicate = {
    .name = "replicate", .impl = "ReplicateParallel",
    .opt = {.input_layout = {TP_REPLICATE, 0, 0}, .output_layout = {TP_REPLICATE, 0, 0},
            .has_input_layout = 1, .has_output_layout = 1, .use_local_output = 1}};
