/* The backward of a redistribute (tp-semantics.md §1.5, as DTensor's
 * Redistribute.backward).
 *
 * A redistribute leaves the global value unchanged, so its adjoint leaves
 * the gradient's global value unchanged too: the backward is itself a
 * redistribute of the gradient, from the placement the gradient arrives in
 * back to the forward's source placement.  One exception: a gradient never
 * goes Replicate/Shard -> Partial.  Splitting a summed gradient into
 * summands only to sum it again later costs a reduction for nothing, so
 * where the forward source was Partial and the gradient is not, it lands on
 * Replicate ("the replicated gradient goes to every summand").
 *
 * Per mesh dimension, with the gradient arriving in the forward's output
 * placement (the usual case) or as Partial (each rank's local backward
 * produced a partial sum, e.g. colwise's input gradient):
 *
 *   forward                  forward op       grad in   backward op
 *   Replicate -> Shard(d)    local slice      Shard(d)  all-gather
 *   Shard(d) -> Replicate    all-gather       Replicate local slice (keep own chunk)
 *                                             Partial   reduce-scatter
 *   Partial -> Replicate     all-reduce       Replicate none (lands on Replicate)
 *                                             Partial   none (stays Partial)
 *   Partial -> Shard(d)      reduce-scatter   Shard(d)  all-gather (lands on Replicate)
 *   Replicate -> Partial     zero non-root    Partial   all-reduce
 *   Replicate -> Replicate   none             Partial   all-reduce (Megatron's "f")
 *   Shard(i) -> Shard(j)     all-to-all       Shard(j)  all-to-all back
 *   StridedShard -> Repl.    all-gather       Replicate local slice (own strided part)
 *
 * Which collective runs is decided by tp_placement_step, as for every
 * redistribute. */
#include "tensorpar/dist.h"

#include <string.h>

void tp_redistribute_backward_placements(int mesh_ndim, const tp_placement *fwd_src,
                                         const tp_placement *grad_pl, tp_placement *out)
{
    for (int g = 0; g < mesh_ndim; g++)
        out[g] = fwd_src[g].kind == TP_PARTIAL && grad_pl[g].kind != TP_PARTIAL ? tp_replicate() : fwd_src[g];
}

tp_status tp_redistribute_backward_local(const tp_mesh *mesh, tp_dtype dtype, int ndim, const int64_t *gshape,
                                         const tp_placement *grad_pl, const void *grad_local,
                                         const tp_placement *fwd_src_pl, void *grad_in_local)
{
    tp_placement dst[TP_MESH_MAX_DIMS];
    tp_redistribute_backward_placements(tp_mesh_ndim(mesh), fwd_src_pl, grad_pl, dst);
    return tp_redistribute_local(mesh, dtype, ndim, gshape, grad_pl, grad_local, dst, grad_in_local);
}

tp_status tp_redistribute_backward(const tp_dtensor *grad_out, const tp_placement *fwd_src_pl,
                                   tp_dtensor *grad_in)
{
    tp_placement dst[TP_MESH_MAX_DIMS];
    tp_redistribute_backward_placements(tp_mesh_ndim(grad_out->mesh), fwd_src_pl, grad_out->placements, dst);
    return tp_redistribute(grad_out, dst, grad_in);
}
