/* Ending a collective step with one verdict on every rank: a rank's
 * failure (a full disk while writing its part of a checkpoint) must stop
 * all of them at the same point, with the failing rank's own message, so
 * no rank goes on to the next collective alone and the report names the
 * real cause instead of "another rank failed". */
#include "tensorpar/comm.h"

#include <stdio.h>
#include <string.h>

tp_status tp_comm_agree(tp_group *g, tp_status mine)
{
    if (!g || tp_group_size(g) <= 1) return mine;
    int64_t code = mine ? (int64_t)tp_group_size(g) - tp_group_rank(g) : 0, worst = 0;
    tp_status s = tp_comm_all_reduce(g, &code, &worst, 1, TP_I64, TP_REDUCE_MAX);
    if (s) return s;
    if (!worst) return TP_OK;
    /* The lowest failing rank (highest code) tells its message. */
    int root = tp_group_size(g) - (int)worst;
    char msg[2048] = {0};
    int64_t kind = mine;
    if (tp_group_rank(g) == root) snprintf(msg, sizeof msg, "%s", tp_error());
    if ((s = tp_comm_broadcast(g, msg, sizeof msg, TP_U8, root))) return s;
    if ((s = tp_comm_broadcast(g, &kind, 1, TP_I64, root))) return s;
    msg[sizeof msg - 1] = 0;
    if (tp_group_rank(g) == root) return mine;
    return tp_fail((tp_status)kind, "rank %d: %s", root, msg);
}
