/* Mixture-of-experts module styles (§2.14, §2.15).  moe_tp_experts sits on
 * the expert container (`mlp.experts`): its parameters are placed by their
 * own rules (packed_colwise / rowwise in TP mode, grouped_gemm in EP mode)
 * and its forward runs on local shards.  Each rank's result is a partial
 * sum — over its slice of I, or over its own experts — which post_forward
 * all-reduces; the model labels its output Replicate instead when no
 * parameter of the module is sharded (nothing to sum). */
#include "parallel_internal.h"

static tp_status moe_experts_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st; (void)mod;
    *d = tp_par_desc_passthrough();        /* hidden states and routing: Replicate */
    d->local_output = tp_partial();
    d->output = tp_replicate();
    d->allreduce_backward_input = 1;
    return TP_OK;
}

const tp_style tp_par_moe_tp_experts = {
    .name = "moe_tp_experts", .impl = "MoeExpertsParallel", .install_forward = moe_experts_forward};

/* moe_identity_expert (§2.15): an identity expert's input divided by P, so
 * that the surrounding all-reduce sums P copies back to one.  No model type
 * tensorpar builds has identity experts: a plan that names one is refused
 * by the flow check (no module runs it). */
const tp_style tp_par_moe_identity_expert = {
    .name = "moe_identity_expert", .impl = "MoeIdentityParallel", .install_forward = tp_par_forward_local};
