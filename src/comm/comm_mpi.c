/* The mpi backend: OpenMPI behind the tp_group interface, a communicator
 * per group.
 *
 * MPI's own reductions may sum in any order (ring, tree, recursive
 * halving), which gives different bits on different ranks and differs from
 * the shm backend.  So reductions move raw bytes with MPI and sum locally
 * with tp_comm_reduce_ordered: small all-reduces gather every input and
 * reduce on each rank (one-shot); large ones send share q of every input to
 * rank q (all-to-all), which reduces it, and gather the shares (two-shot).
 * The results are then bitwise equal to the shm backend's (§1.4, §5.4). */
#include "comm_internal.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define ONESHOT_MAX_BYTES (64u << 10)
#define CHUNK_BYTES ((size_t)256 << 20)   /* all-reduce works in chunks */

/* Shared by all groups of the process: who finalizes MPI. */
typedef struct {
    int refs;
    int we_initialized;
} mpi_job;

typedef struct {
    MPI_Comm comm;
    mpi_job *job;
} mpi_group;

static MPI_Comm comm_of(tp_group *g) { return ((mpi_group *)g->impl)->comm; }

static tp_status mpi_err(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return tp_fail(TP_ERR_COMM, "MPI %s failed: %.*s", what, len, msg);
}

/* Byte counts must fit MPI's int. */
static tp_status fits(size_t bytes, const char *op)
{
    if (bytes > (size_t)INT_MAX)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s of %zu bytes exceeds what one MPI call moves (2 GiB)", op, bytes);
    return TP_OK;
}

static void share(size_t m, size_t es, int r, int n, size_t *lo, size_t *hi)
{
    size_t unit = es >= 64 ? 1 : 64 / es, units = (m + unit - 1) / unit;
    size_t a = units * (size_t)r / (size_t)n, b = units * (size_t)(r + 1) / (size_t)n;
    *lo = a * unit < m ? a * unit : m;
    *hi = b * unit < m ? b * unit : m;
}

/* int arrays of n counts/displacements, and n source pointers. */
typedef struct {
    int *sc, *sd, *rc, *rd;
    const void **src;
    char *tmp;
} mpi_scratch;

static tp_status scratch_init(mpi_scratch *s, int n, size_t tmp_bytes)
{
    memset(s, 0, sizeof *s);
    s->sc = malloc(4 * (size_t)n * sizeof(int));
    s->src = malloc((size_t)n * sizeof(void *));
    s->tmp = malloc(tmp_bytes ? tmp_bytes : 1);
    if (!s->sc || !s->src || !s->tmp) {
        free(s->sc); free(s->src); free(s->tmp);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    s->sd = s->sc + n;
    s->rc = s->sd + n;
    s->rd = s->rc + n;
    return TP_OK;
}

static void scratch_free(mpi_scratch *s) { free(s->sc); free(s->src); free(s->tmp); }

/* ---- all-reduce ------------------------------------------------------- */

static tp_status oneshot(tp_group *g, const char *send, char *recv, size_t m, tp_dtype dt,
                         tp_reduce_op op, mpi_scratch *s)
{
    size_t bytes = m * tp_dtype_size(dt);
    int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, s->tmp, (int)bytes, MPI_BYTE, comm_of(g));
    if (rc != MPI_SUCCESS) return mpi_err(rc, "all_gather");
    for (int p = 0; p < g->size; p++) s->src[p] = s->tmp + (size_t)p * bytes;
    tp_comm_reduce_ordered(recv, s->src, g->size, m, dt, op);
    return TP_OK;
}

static tp_status twoshot(tp_group *g, const char *send, char *recv, size_t m, tp_dtype dt,
                         tp_reduce_op op, mpi_scratch *s)
{
    int n = g->size, me = g->rank;
    size_t es = tp_dtype_size(dt), lo, hi;
    share(m, es, me, n, &lo, &hi);
    size_t mine = (hi - lo) * es;
    for (int p = 0; p < n; p++) {
        size_t plo, phi;
        share(m, es, p, n, &plo, &phi);
        s->sc[p] = (int)((phi - plo) * es);
        s->sd[p] = (int)(plo * es);
        s->rc[p] = (int)mine;
        s->rd[p] = (int)((size_t)p * mine);
    }
    int rc = MPI_Alltoallv(send, s->sc, s->sd, MPI_BYTE, s->tmp, s->rc, s->rd, MPI_BYTE, comm_of(g));
    if (rc != MPI_SUCCESS) return mpi_err(rc, "all_to_all");
    for (int p = 0; p < n; p++) s->src[p] = s->tmp + (size_t)p * mine;
    tp_comm_reduce_ordered(recv + lo * es, s->src, n, hi - lo, dt, op);
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recv, s->sc, s->sd, MPI_BYTE, comm_of(g));
    return rc == MPI_SUCCESS ? TP_OK : mpi_err(rc, "all_gather");
}

static tp_status mpi_all_reduce(tp_group *g, const void *send, void *recv, size_t count,
                                tp_dtype dt, tp_reduce_op op)
{
    size_t es = tp_dtype_size(dt), per = CHUNK_BYTES / es;
    int small = count * es <= ONESHOT_MAX_BYTES;
    size_t first = count < per ? count : per;
    mpi_scratch s;
    /* Two-shot shares are cut at 64-byte multiples: the largest of n shares
     * may exceed 1/n of the chunk by up to 64 bytes. */
    tp_status st = scratch_init(&s, g->size, small ? (size_t)g->size * first * es
                                                   : first * es + (size_t)g->size * 64);
    if (st) return st;
    for (size_t off = 0; off < count && st == TP_OK; off += per) {
        size_t m = count - off < per ? count - off : per;
        const char *in = (const char *)send + off * es;
        char *out = (char *)recv + off * es;
        st = small ? oneshot(g, in, out, m, dt, op, &s) : twoshot(g, in, out, m, dt, op, &s);
    }
    scratch_free(&s);
    return st;
}

/* ---- gathers and scatters -------------------------------------------- */

static tp_status byte_layout(const size_t *counts, size_t es, int n, int *c, int *d, size_t *total,
                             const char *op)
{
    size_t t = 0;
    for (int p = 0; p < n; p++) {
        c[p] = (int)(counts[p] * es);
        d[p] = (int)t;
        t += counts[p] * es;
        tp_status st = fits(t, op);
        if (st) return st;
    }
    *total = t;
    return TP_OK;
}

static tp_status mpi_all_gatherv(tp_group *g, const void *send, void *recv, const size_t *counts,
                                 tp_dtype dt)
{
    mpi_scratch s;
    size_t total;
    tp_status st = scratch_init(&s, g->size, 0);
    if (st == TP_OK) st = byte_layout(counts, tp_dtype_size(dt), g->size, s.rc, s.rd, &total, "all_gather");
    if (st == TP_OK) {
        int rc = MPI_Allgatherv(send, s.rc[g->rank], MPI_BYTE, recv, s.rc, s.rd, MPI_BYTE, comm_of(g));
        if (rc != MPI_SUCCESS) st = mpi_err(rc, "all_gather");
    }
    scratch_free(&s);
    return st;
}

static tp_status mpi_reduce_scatterv(tp_group *g, const void *send, void *recv, const size_t *counts,
                                     tp_dtype dt, tp_reduce_op op)
{
    int n = g->size, me = g->rank;
    size_t es = tp_dtype_size(dt), total, mine = counts[me] * es;
    mpi_scratch s;
    tp_status st = fits((size_t)n * mine, "reduce_scatter");
    if (st == TP_OK) st = scratch_init(&s, n, (size_t)n * mine);
    if (st) return st;
    st = byte_layout(counts, es, n, s.sc, s.sd, &total, "reduce_scatter");
    if (st == TP_OK) {
        for (int p = 0; p < n; p++) { s.rc[p] = (int)mine; s.rd[p] = (int)((size_t)p * mine); }
        int rc = MPI_Alltoallv(send, s.sc, s.sd, MPI_BYTE, s.tmp, s.rc, s.rd, MPI_BYTE, comm_of(g));
        if (rc != MPI_SUCCESS) st = mpi_err(rc, "all_to_all");
    }
    if (st == TP_OK) {
        for (int p = 0; p < n; p++) s.src[p] = s.tmp + (size_t)p * mine;
        tp_comm_reduce_ordered(recv, s.src, n, counts[me], dt, op);
    }
    scratch_free(&s);
    return st;
}

static tp_status mpi_broadcast(tp_group *g, void *buf, size_t bytes, int root)
{
    for (size_t off = 0; off < bytes; off += CHUNK_BYTES) {
        size_t b = bytes - off < CHUNK_BYTES ? bytes - off : CHUNK_BYTES;
        int rc = MPI_Bcast((char *)buf + off, (int)b, MPI_BYTE, root, comm_of(g));
        if (rc != MPI_SUCCESS) return mpi_err(rc, "broadcast");
    }
    return TP_OK;
}

static tp_status mpi_barrier(tp_group *g)
{
    int rc = MPI_Barrier(comm_of(g));
    return rc == MPI_SUCCESS ? TP_OK : mpi_err(rc, "barrier");
}

/* Every rank checks that what others send it is what it expects, and all
 * agree on the outcome, so a mismatch fails everywhere instead of hanging. */
static tp_status check_counts(tp_group *g, const size_t *sc, const size_t *rc_expected)
{
    int n = g->size;
    unsigned long long *out = malloc(2 * (size_t)n * sizeof *out), *in = out ? out + n : NULL;
    if (!out) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int q = 0; q < n; q++) out[q] = sc[q];
    int rc = MPI_Alltoall(out, 1, MPI_UNSIGNED_LONG_LONG, in, 1, MPI_UNSIGNED_LONG_LONG, comm_of(g));
    int bad = -1, any;
    for (int p = 0; rc == MPI_SUCCESS && p < n && bad < 0; p++)
        if (in[p] != rc_expected[p]) bad = p;
    unsigned long long got = bad >= 0 ? in[bad] : 0;
    free(out);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "all_to_all");
    int flag = bad >= 0;
    rc = MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, comm_of(g));
    if (rc != MPI_SUCCESS) return mpi_err(rc, "all_reduce");
    if (bad >= 0)
        return tp_fail(TP_ERR_INVALID, "rank %d sends %llu elements to rank %d, which expects %zu", bad, got,
                       g->rank, rc_expected[bad]);
    if (any) return tp_fail(TP_ERR_INVALID, "all_to_all counts disagree between ranks");
    return TP_OK;
}

static tp_status mpi_all_to_allv(tp_group *g, const void *send, const size_t *send_counts,
                                 void *recv, const size_t *recv_counts, tp_dtype dt)
{
    size_t es = tp_dtype_size(dt), t1, t2;
    mpi_scratch s;
    tp_status st = check_counts(g, send_counts, recv_counts);
    if (st == TP_OK) st = scratch_init(&s, g->size, 0);
    if (st) return st;
    if ((st = byte_layout(send_counts, es, g->size, s.sc, s.sd, &t1, "all_to_all")) == TP_OK &&
        (st = byte_layout(recv_counts, es, g->size, s.rc, s.rd, &t2, "all_to_all")) == TP_OK) {
        int rc = MPI_Alltoallv(send, s.sc, s.sd, MPI_BYTE, recv, s.rc, s.rd, MPI_BYTE, comm_of(g));
        if (rc != MPI_SUCCESS) st = mpi_err(rc, "all_to_all");
    }
    scratch_free(&s);
    return st;
}

static tp_status mpi_sendrecv(tp_group *g, const void *send, size_t send_bytes, int dst,
                              void *recv, size_t recv_bytes, int src)
{
    tp_status st;
    if ((st = fits(send_bytes, "send")) || (st = fits(recv_bytes, "recv"))) return st;
    MPI_Status status;
    int rc;
    if (dst >= 0 && src >= 0)
        rc = MPI_Sendrecv(send, (int)send_bytes, MPI_BYTE, dst, 0, recv, (int)recv_bytes, MPI_BYTE, src, 0,
                          comm_of(g), &status);
    else if (dst >= 0)
        rc = MPI_Send(send, (int)send_bytes, MPI_BYTE, dst, 0, comm_of(g));
    else
        rc = MPI_Recv(recv, (int)recv_bytes, MPI_BYTE, src, 0, comm_of(g), &status);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "send/recv");
    if (src >= 0) {
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if ((size_t)got != recv_bytes)
            return tp_fail(TP_ERR_COMM, "rank %d sent %d bytes but rank %d expects %zu", src, got, g->rank, recv_bytes);
    }
    return TP_OK;
}

/* ---- groups ----------------------------------------------------------- */

static tp_status mpi_new_sub(tp_group *parent, const int *ranks, int n, tp_group *child);
static void mpi_free(tp_group *g);

static const tp_comm_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gatherv = mpi_all_gatherv,
    .reduce_scatterv = mpi_reduce_scatterv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .all_to_allv = mpi_all_to_allv,
    .sendrecv = mpi_sendrecv,
    .new_sub = mpi_new_sub,
    .free = mpi_free,
};

static tp_status wrap(tp_group *g, MPI_Comm comm, mpi_job *job)
{
    mpi_group *m = calloc(1, sizeof *m);
    if (!m) { MPI_Comm_free(&comm); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    /* Errors come back as return codes; the default aborts the job. */
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    m->comm = comm;
    m->job = job;
    job->refs++;
    g->ops = &mpi_ops;
    g->impl = m;
    return TP_OK;
}

static tp_status mpi_new_sub(tp_group *parent, const int *ranks, int n, tp_group *child)
{
    MPI_Group pg, sub;
    MPI_Comm comm;
    int rc = MPI_Comm_group(comm_of(parent), &pg);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Group_incl(pg, n, ranks, &sub);
        MPI_Group_free(&pg);
    }
    if (rc != MPI_SUCCESS) return mpi_err(rc, "group creation");
    /* The tag tells apart concurrent creations over the same parent. */
    int tag = (int)(tp_comm_hash(child->global, (size_t)n * sizeof(int), 0) & 0x7fff);
    rc = MPI_Comm_create_group(comm_of(parent), sub, tag, &comm);
    MPI_Group_free(&sub);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "communicator creation");
    return wrap(child, comm, ((mpi_group *)parent->impl)->job);
}

static void mpi_free(tp_group *g)
{
    mpi_group *m = g->impl;
    if (!m) return;
    MPI_Comm_free(&m->comm);
    if (--m->job->refs == 0) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (m->job->we_initialized && !finalized) MPI_Finalize();
        free(m->job);
    }
    free(m);
    g->impl = NULL;
}

static void local_layout(tp_group *g, MPI_Comm world)
{
    MPI_Comm node;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return;
    MPI_Comm_rank(node, &g->local_rank);
    MPI_Comm_size(node, &g->local_size);
    MPI_Comm_free(&node);
}

tp_status tp_comm_mpi_init(tp_group *g, const tp_comm_env *e)
{
    int inited = 0, rank, size;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return tp_fail(TP_ERR_COMM, "MPI_Init failed");
    }
    mpi_job *job = calloc(1, sizeof *job);
    if (!job) return tp_fail(TP_ERR_NOMEM, "out of memory");
    job->we_initialized = !inited;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    tp_status st = TP_OK;
    if (size != e->world_size || rank != e->rank)
        st = tp_fail(TP_ERR_INVALID, "MPI says rank %d of %d, but the environment says RANK=%d, WORLD_SIZE=%d",
                     rank, size, e->rank, e->world_size);
    MPI_Comm world;
    if (st == TP_OK && MPI_Comm_dup(MPI_COMM_WORLD, &world) != MPI_SUCCESS)
        st = tp_fail(TP_ERR_COMM, "MPI_Comm_dup failed");
    if (st == TP_OK) {
        local_layout(g, world);
        st = wrap(g, world, job);
    }
    if (st) {
        if (job->we_initialized) MPI_Finalize();
        free(job);
    }
    return st;
}
