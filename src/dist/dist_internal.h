/* Internal helpers shared by the files of src/dist. */
#ifndef TP_DIST_INTERNAL_H
#define TP_DIST_INTERNAL_H

#include "tensorpar/dist.h"

/* Copies the box of shape `box` from src (row-major, shape sshape) at offset
 * soff to dst (shape dshape) at offset doff; ndim 0..4, es bytes/element. */
void tp_dist_copy_box(void *dst, const int64_t *dshape, const int64_t *doff,
                      const void *src, const int64_t *sshape, const int64_t *soff,
                      const int64_t *box, int ndim, size_t es);

int64_t tp_dist_numel(int ndim, const int64_t *shape);

/* One step of a redistribution: the group of the mesh dimension that
 * changes, and the local shapes involved.  F is the local shape with that
 * mesh dimension replicated: the tensor the group's shards are pieces of. */
typedef struct {
    tp_group *group;
    int P, r;                 /* group size and this rank's position */
    tp_dtype dtype;
    size_t es;
    int ndim;
    int64_t F[TP_MAX_DIMS];
    int64_t in_shape[TP_MAX_DIMS], out_shape[TP_MAX_DIMS];
} tp_dist_step_ctx;

/* Runs one 1-D transition (transition.c); `in` and `out` may be equal only
 * for all_reduce, zero_nonroot and none. */
tp_status tp_dist_run_step(const tp_dist_step_ctx *c, const tp_redist_step *s,
                           const void *in, void *out);
int tp_dist_step_in_place_ok(tp_collective c);

#endif
