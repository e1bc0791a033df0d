/* The backward hooks of a style (§3.4) and their defaults: a style states
 * its layouts once, in the forward description, and the backward follows.
 *
 *   forward                                  backward (reverse order)
 *   pre_forward:  input -> compute_input     post_backward: the input gradient,
 *                                            as the local backward left it, goes
 *                                            back to `input`
 *   (local computation)                      (local backward)
 *   post_forward: local_output -> output     pre_backward: the output gradient,
 *                                            placed `output`, goes to what the
 *                                            local backward consumes
 *   parameters                               param_grads: a Partial contribution
 *                                            summed once (param_grad_allreduce)
 *
 * Each default is tp_redistribute_backward of the matching forward move, so
 * the collective comes from dist's one rule.  The local backward of an
 * input replicated into a sharded computation (colwise: allreduce_backward_
 * input) leaves a partial sum: the gradient is labelled Partial and the
 * conjugate move becomes the all-reduce of §1.6's AllReduceBackward.
 *
 * Nothing calls these in the forward path; training will, in reverse module
 * order. */
#include "parallel_internal.h"

/* Relabels g as `from` (a declaration, as the forward's move does) and
 * applies the backward of the forward move `fwd_src -> ...`, replacing g. */
static tp_status move_back(tp_dtensor *g, tp_placement from, tp_placement fwd_src)
{
    if (!g->mesh) return tp_fail(TP_ERR_INVALID, "backward hook: the gradient has no mesh");
    if ((from.kind == TP_SHARD || from.kind == TP_STRIDED_SHARD) && from.dim < 0) from.dim += g->ndim;
    if ((fwd_src.kind == TP_SHARD || fwd_src.kind == TP_STRIDED_SHARD) && fwd_src.dim < 0) fwd_src.dim += g->ndim;
    g->placements[0] = from;
    tp_placement dst;
    tp_redistribute_backward_placements(1, &fwd_src, &from, &dst);
    if (tp_placement_equal(from, dst, g->ndim)) return TP_OK;
    tp_dtensor out;
    tp_status s = tp_redistribute_backward(g, &fwd_src, &out);
    if (s) return s;
    tp_dtensor_release(g);
    *g = out;
    return TP_OK;
}

tp_status tp_style_pre_backward(const tp_style *st, const tp_module_ctx *mod,
                                const tp_forward_desc *d, tp_dtensor *gy)
{
    if (st->transform_grad_output_pre_backward) return st->transform_grad_output_pre_backward(st, mod, d, gy);
    if (!d->installed) return TP_OK;
    return move_back(gy, d->output, d->local_output);
}

tp_placement tp_style_local_input_grad_layout(const tp_forward_desc *d)
{
    return d->allreduce_backward_input ? tp_partial() : d->compute_input;
}

tp_status tp_style_post_backward(const tp_style *st, const tp_module_ctx *mod,
                                 const tp_forward_desc *d, tp_dtensor *gx)
{
    if (st->transform_grad_input_post_backward) return st->transform_grad_input_post_backward(st, mod, d, gx);
    if (!d->installed || d->ids_input) return TP_OK;   /* token ids have no gradient */
    return move_back(gx, tp_style_local_input_grad_layout(d), d->input);
}

tp_status tp_style_param_grad(const tp_style *st, const tp_module_ctx *mod,
                              const tp_forward_desc *d, tp_dtensor *gw)
{
    if (st->reduce_param_grad_post_backward) return st->reduce_param_grad_post_backward(st, mod, d, gw);
    if (!d->installed || !d->param_grad_allreduce) return TP_OK;
    /* The parameter is Replicate and each rank saw part of the batch: its
     * gradient is a partial sum, reduced exactly once (§2.10, §2.11). */
    gw->placements[0] = tp_partial();
    tp_placement rep = tp_replicate();
    tp_dtensor out;
    tp_status s = tp_redistribute(gw, &rep, &out);
    if (s) return s;
    tp_dtensor_release(gw);
    *gw = out;
    return TP_OK;
}
