/* The self backend: a group of one rank.  Every collective is a copy (or
 * nothing): the ordered sum of a single source is that source, bit for bit. */
#include "comm_internal.h"

#include <string.h>

static void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static tp_status self_all_reduce(tp_group *g, const void *send, void *recv, size_t count,
                                 tp_dtype dt, tp_reduce_op op)
{
    (void)g;
    (void)op;
    copy(recv, send, count * tp_dtype_size(dt));
    return TP_OK;
}

static tp_status self_all_gatherv(tp_group *g, const void *send, void *recv,
                                  const size_t *counts, tp_dtype dt)
{
    (void)g;
    copy(recv, send, counts[0] * tp_dtype_size(dt));
    return TP_OK;
}

static tp_status self_reduce_scatterv(tp_group *g, const void *send, void *recv,
                                      const size_t *counts, tp_dtype dt, tp_reduce_op op)
{
    (void)op;
    return self_all_gatherv(g, send, recv, counts, dt);
}

static tp_status self_broadcast(tp_group *g, void *buf, size_t bytes, int root)
{
    (void)g; (void)buf; (void)bytes; (void)root;
    return TP_OK;
}

static tp_status self_barrier(tp_group *g)
{
    (void)g;
    return TP_OK;
}

static tp_status self_all_to_allv(tp_group *g, const void *send, const size_t *send_counts,
                                  void *recv, const size_t *recv_counts, tp_dtype dt)
{
    (void)g;
    if (send_counts[0] != recv_counts[0])
        return tp_fail(TP_ERR_INVALID, "rank 0 sends %zu elements to itself but expects %zu",
                       send_counts[0], recv_counts[0]);
    copy(recv, send, send_counts[0] * tp_dtype_size(dt));
    return TP_OK;
}

static tp_status self_sendrecv(tp_group *g, const void *send, size_t send_bytes, int dst,
                               void *recv, size_t recv_bytes, int src)
{
    (void)g;
    /* A rank may only talk to itself, and only both ways at once. */
    if (dst < 0 || src < 0)
        return tp_fail(TP_ERR_INVALID, "a one-rank group can only send to itself with sendrecv");
    if (send_bytes != recv_bytes)
        return tp_fail(TP_ERR_INVALID, "message of %zu bytes received into %zu bytes", send_bytes, recv_bytes);
    copy(recv, send, send_bytes);
    return TP_OK;
}

static tp_status self_new_sub(tp_group *parent, const int *ranks, int n, tp_group *child);

static const tp_comm_ops self_ops = {
    .name = "self",
    .all_reduce = self_all_reduce,
    .all_gatherv = self_all_gatherv,
    .reduce_scatterv = self_reduce_scatterv,
    .broadcast = self_broadcast,
    .barrier = self_barrier,
    .all_to_allv = self_all_to_allv,
    .sendrecv = self_sendrecv,
    .new_sub = self_new_sub,
    .free = NULL,
};

static tp_status self_new_sub(tp_group *parent, const int *ranks, int n, tp_group *child)
{
    (void)parent; (void)ranks; (void)n;
    child->ops = &self_ops;
    return TP_OK;
}

/* Used for the world of a one-rank job, and by other backends for their
 * one-member sub-groups. */
tp_status tp_comm_self_init(tp_group *g)
{
    g->ops = &self_ops;
    g->backend = TP_BACKEND_SELF;
    g->impl = NULL;
    return TP_OK;
}
