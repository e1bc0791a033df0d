/* The public process-group API: backend selection, argument checks, and
 * dispatch to the backend.  Equal-count collectives become their "v" forms
 * here, so each backend implements one general algorithm per collective. */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- backends --------------------------------------------------------- */

const char *tp_backend_name(tp_backend b)
{
    switch (b) {
    case TP_BACKEND_AUTO: return "auto";
    case TP_BACKEND_SELF: return "self";
    case TP_BACKEND_SHM: return "shm";
    case TP_BACKEND_MPI: return "mpi";
    }
    return "?";
}

tp_status tp_backend_parse(const char *s, tp_backend *out)
{
    static const tp_backend all[] = {TP_BACKEND_AUTO, TP_BACKEND_SELF, TP_BACKEND_SHM, TP_BACKEND_MPI};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, tp_backend_name(all[i]))) { *out = all[i]; return TP_OK; }
    return tp_fail(TP_ERR_INVALID, "unknown backend '%s' (expected shm, mpi or self)", s);
}

int tp_backend_available(tp_backend b)
{
#ifdef TP_HAVE_MPI
    return b >= TP_BACKEND_AUTO && b <= TP_BACKEND_MPI;
#else
    return b >= TP_BACKEND_AUTO && b <= TP_BACKEND_SHM;
#endif
}

/* ---- groups ----------------------------------------------------------- */

static tp_group *group_alloc(int size)
{
    tp_group *g = calloc(1, sizeof *g);
    if (g) g->global = calloc((size_t)size, sizeof(int));
    if (!g || !g->global) {
        if (g) free(g);
        tp_fail(TP_ERR_NOMEM, "out of memory creating a process group");
        return NULL;
    }
    g->size = size;
    return g;
}

static void group_release(tp_group *g)
{
    free(g->global);
    free(g);
}

tp_status tp_comm_init(tp_group **world, const tp_comm_options *opts)
{
    *world = NULL;
    tp_comm_env e;
    tp_status st = tp_comm_env_read(&e, opts);
    if (st == TP_OK) {
        tp_group *g = group_alloc(e.world_size);
        if (!g) return TP_ERR_NOMEM;
        g->rank = e.rank;
        g->backend = e.backend;
        g->timeout_s = e.timeout_s;
        g->local_rank = e.local_rank;
        g->local_size = e.local_size;
        for (int r = 0; r < e.world_size; r++) g->global[r] = r;
        switch (e.backend) {
        case TP_BACKEND_SHM: st = tp_comm_shm_init(g, &e); break;
#ifdef TP_HAVE_MPI
        case TP_BACKEND_MPI: st = tp_comm_mpi_init(g, &e); break;
#endif
        default: st = tp_comm_self_init(g); break;
        }
        if (st == TP_OK) { *world = g; return TP_OK; }
        group_release(g);
    }
    /* Transformers' sentence with tensorpar's advice (§5.3). */
    char reason[1024];
    snprintf(reason, sizeof reason, "%s", tp_error());
    size_t len = strlen(reason);
    if (len && reason[len - 1] == '.') reason[len - 1] = '\0';
    return tp_fail(st, "We tried to initialize the process group for you, but it failed: %s. Launch one process "
                   "per rank with RANK, WORLD_SIZE and LOCAL_RANK set (torchrun-style), or with mpirun.", reason);
}

void tp_group_free(tp_group *g)
{
    if (!g) return;
    if (g->ops && g->ops->free) g->ops->free(g);
    group_release(g);
}

int tp_group_rank(const tp_group *g) { return g->rank; }
int tp_group_size(const tp_group *g) { return g->size; }
int tp_group_global_rank(const tp_group *g, int r) { return r >= 0 && r < g->size ? g->global[r] : -1; }
int tp_group_local_rank(const tp_group *g) { return g->local_rank; }
int tp_group_local_size(const tp_group *g) { return g->local_size; }
tp_backend tp_group_backend(const tp_group *g) { return g->backend; }
double tp_group_timeout(const tp_group *g) { return g->timeout_s; }
void tp_group_set_timeout(tp_group *g, double seconds) { if (seconds > 0) g->timeout_s = seconds; }

static tp_status check_members(const tp_group *parent, const int *ranks, int n, int *my_index)
{
    *my_index = -1;
    if (n < 1 || n > parent->size)
        return tp_fail(TP_ERR_INVALID, "a sub-group needs 1 to %d ranks, got %d", parent->size, n);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return tp_fail(TP_ERR_INVALID, "sub-group rank %d is outside the group of %d", ranks[i], parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) return tp_fail(TP_ERR_INVALID, "sub-group lists rank %d twice", ranks[i]);
        if (ranks[i] == parent->rank) *my_index = i;
    }
    if (*my_index < 0)
        return tp_fail(TP_ERR_INVALID, "rank %d creates a sub-group it is not a member of", parent->rank);
    return TP_OK;
}

tp_status tp_group_new_sub(tp_group *parent, const int *ranks, int n, tp_group **out)
{
    *out = NULL;
    int me;
    tp_status st = check_members(parent, ranks, n, &me);
    if (st) return st;
    tp_group *g = group_alloc(n);
    if (!g) return TP_ERR_NOMEM;
    g->rank = me;
    g->backend = parent->backend;
    g->timeout_s = parent->timeout_s;
    g->local_rank = parent->local_rank;
    g->local_size = parent->local_size;
    for (int i = 0; i < n; i++) g->global[i] = parent->global[ranks[i]];
    st = parent->ops->new_sub(parent, ranks, n, g);
    if (st) { group_release(g); return tp_fail_context(st, "creating a sub-group"); }
    *out = g;
    return TP_OK;
}

tp_status tp_group_split(tp_group *parent, int color, int key, tp_group **out)
{
    *out = NULL;
    int n = parent->size;
    int64_t mine[3] = {color, key, parent->rank};
    int64_t *all = malloc((size_t)n * sizeof mine);
    int *members = malloc((size_t)n * sizeof(int));
    tp_status st = all && members ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (st == TP_OK) st = tp_comm_all_gather(parent, mine, all, 3, TP_I64);
    int m = 0;
    if (st == TP_OK && color >= 0) {
        /* Members of my color, ordered by (key, parent rank): insertion sort,
         * groups are small. */
        for (int r = 0; r < n; r++) {
            if (all[3 * r] != color) continue;
            int i = m++;
            while (i > 0 && all[3 * members[i - 1] + 1] > all[3 * r + 1]) { members[i] = members[i - 1]; i--; }
            members[i] = r;
        }
        st = tp_group_new_sub(parent, members, m, out);
    }
    free(all);
    free(members);
    return st;
}

/* ---- argument checks -------------------------------------------------- */

static tp_status usable(tp_group *g, const char *op)
{
    if (!g) return tp_fail(TP_ERR_INVALID, "%s: no process group", op);
    if (g->failed)
        return tp_fail(TP_ERR_COMM, "%s: the process group failed earlier and cannot be used", op);
    return TP_OK;
}

static tp_status check_dtype(tp_dtype dt, int reduce, const char *op)
{
    if ((unsigned)dt >= TP_DTYPE_COUNT) return tp_fail(TP_ERR_INVALID, "%s: bad dtype", op);
    if (reduce && !tp_comm_reducible(dt))
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: cannot reduce %s tensors", op, tp_dtype_name(dt));
    return TP_OK;
}

static tp_status check_rank(const tp_group *g, int r, const char *what, const char *op)
{
    if (r < 0 || r >= g->size)
        return tp_fail(TP_ERR_INVALID, "%s: %s rank %d is outside the group of %d", op, what, r, g->size);
    return TP_OK;
}

/* Records a failure so that later calls refuse instead of hanging. */
static tp_status done(tp_group *g, tp_status st, const char *op)
{
    if (st == TP_OK) return TP_OK;
    if (st == TP_ERR_COMM || st == TP_ERR_TIMEOUT || st == TP_ERR_INTERNAL) g->failed = 1;
    return tp_fail_context(st, "%s (global rank %d)", op, g->global[g->rank]);
}

/* counts[] for the equal-count forms: on the stack for the usual sizes. */
#define STACK_RANKS 64

typedef struct { size_t stack[STACK_RANKS]; size_t *p; } counts_buf;

static tp_status counts_fill(counts_buf *c, int n, size_t count)
{
    c->p = n <= STACK_RANKS ? c->stack : malloc((size_t)n * sizeof(size_t));
    if (!c->p) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) c->p[i] = count;
    return TP_OK;
}

static void counts_free(counts_buf *c) { if (c->p != c->stack) free(c->p); }

/* ---- collectives ------------------------------------------------------ */

tp_status tp_comm_all_reduce(tp_group *g, const void *send, void *recv, size_t count,
                             tp_dtype dt, tp_reduce_op op)
{
    tp_status st;
    if ((st = usable(g, "all_reduce")) || (st = check_dtype(dt, 1, "all_reduce"))) return st;
    return done(g, g->ops->all_reduce(g, send, recv, count, dt, op), "all_reduce");
}

tp_status tp_comm_all_gatherv(tp_group *g, const void *send, void *recv, const size_t *counts, tp_dtype dt)
{
    tp_status st;
    if ((st = usable(g, "all_gather")) || (st = check_dtype(dt, 0, "all_gather"))) return st;
    return done(g, g->ops->all_gatherv(g, send, recv, counts, dt), "all_gather");
}

tp_status tp_comm_all_gather(tp_group *g, const void *send, void *recv, size_t count, tp_dtype dt)
{
    tp_status st = usable(g, "all_gather");
    counts_buf c;
    if (st || (st = counts_fill(&c, g->size, count))) return st;
    st = tp_comm_all_gatherv(g, send, recv, c.p, dt);
    counts_free(&c);
    return st;
}

tp_status tp_comm_reduce_scatterv(tp_group *g, const void *send, void *recv, const size_t *counts,
                                  tp_dtype dt, tp_reduce_op op)
{
    tp_status st;
    if ((st = usable(g, "reduce_scatter")) || (st = check_dtype(dt, 1, "reduce_scatter"))) return st;
    return done(g, g->ops->reduce_scatterv(g, send, recv, counts, dt, op), "reduce_scatter");
}

tp_status tp_comm_reduce_scatter(tp_group *g, const void *send, void *recv, size_t count,
                                 tp_dtype dt, tp_reduce_op op)
{
    tp_status st = usable(g, "reduce_scatter");
    counts_buf c;
    if (st || (st = counts_fill(&c, g->size, count))) return st;
    st = tp_comm_reduce_scatterv(g, send, recv, c.p, dt, op);
    counts_free(&c);
    return st;
}

tp_status tp_comm_all_reduce_rows_steps(tp_group *g, const float *send, float *recv, const size_t *row_counts,
                                        size_t row_len, tp_comm_rows_fn fn, void *ctx)
{
    counts_buf c;
    tp_status st = counts_fill(&c, g->size, 0);
    if (st) return st;
    size_t first = 0;
    for (int p = 0; p < g->size; p++) {
        c.p[p] = row_counts[p] * row_len;
        if (p < g->rank) first += row_counts[p];
    }
    size_t mine = c.p[g->rank];
    float *own = malloc((mine ? mine : 1) * sizeof(float));
    if (!own) st = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!st) st = g->ops->reduce_scatterv(g, send, own, c.p, TP_F32, TP_REDUCE_SUM);
    if (!st && fn && mine) fn(ctx, (int64_t)first, (int64_t)row_counts[g->rank], own);
    if (!st) st = g->ops->all_gatherv(g, own, recv, c.p, TP_F32);
    free(own);
    counts_free(&c);
    return st;
}

tp_status tp_comm_all_reduce_rows(tp_group *g, const float *send, float *recv, const size_t *row_counts,
                                  size_t row_len, tp_comm_rows_fn fn, void *ctx)
{
    tp_status st = usable(g, "all_reduce_rows");
    if (st) return st;
    if (g->ops->all_reduce_rows) st = g->ops->all_reduce_rows(g, send, recv, row_counts, row_len, fn, ctx);
    else st = tp_comm_all_reduce_rows_steps(g, send, recv, row_counts, row_len, fn, ctx);
    return done(g, st, "all_reduce_rows");
}

tp_status tp_comm_broadcast(tp_group *g, void *buf, size_t count, tp_dtype dt, int root)
{
    tp_status st;
    if ((st = usable(g, "broadcast")) || (st = check_dtype(dt, 0, "broadcast")) ||
        (st = check_rank(g, root, "root", "broadcast")))
        return st;
    return done(g, g->ops->broadcast(g, buf, count * tp_dtype_size(dt), root), "broadcast");
}

tp_status tp_comm_barrier(tp_group *g)
{
    tp_status st = usable(g, "barrier");
    if (st) return st;
    return done(g, g->ops->barrier(g), "barrier");
}

tp_status tp_comm_all_to_allv(tp_group *g, const void *send, const size_t *send_counts,
                              void *recv, const size_t *recv_counts, tp_dtype dt)
{
    tp_status st;
    if ((st = usable(g, "all_to_all")) || (st = check_dtype(dt, 0, "all_to_all"))) return st;
    return done(g, g->ops->all_to_allv(g, send, send_counts, recv, recv_counts, dt), "all_to_all");
}

tp_status tp_comm_all_to_all(tp_group *g, const void *send, void *recv, size_t count, tp_dtype dt)
{
    tp_status st = usable(g, "all_to_all");
    counts_buf c;
    if (st || (st = counts_fill(&c, g->size, count))) return st;
    st = tp_comm_all_to_allv(g, send, c.p, recv, c.p, dt);
    counts_free(&c);
    return st;
}

tp_status tp_comm_sendrecv(tp_group *g, const void *send, size_t send_count, int dst,
                           void *recv, size_t recv_count, int src, tp_dtype dt)
{
    tp_status st;
    if ((st = usable(g, "sendrecv")) || (st = check_dtype(dt, 0, "sendrecv"))) return st;
    if (dst >= 0 && (st = check_rank(g, dst, "destination", "send"))) return st;
    if (src >= 0 && (st = check_rank(g, src, "source", "recv"))) return st;
    size_t es = tp_dtype_size(dt);
    return done(g, g->ops->sendrecv(g, send, send_count * es, dst, recv, recv_count * es, src),
                dst >= 0 && src >= 0 ? "sendrecv" : dst >= 0 ? "send" : "recv");
}

tp_status tp_comm_send(tp_group *g, const void *buf, size_t count, tp_dtype dt, int dst)
{
    if (dst < 0) return tp_fail(TP_ERR_INVALID, "send: destination rank %d is negative", dst);
    return tp_comm_sendrecv(g, buf, count, dst, NULL, 0, -1, dt);
}

tp_status tp_comm_recv(tp_group *g, void *buf, size_t count, tp_dtype dt, int src)
{
    if (src < 0) return tp_fail(TP_ERR_INVALID, "recv: source rank %d is negative", src);
    return tp_comm_sendrecv(g, NULL, 0, -1, buf, count, src, dt);
}
