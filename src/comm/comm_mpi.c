/* The mpi backend: OpenMPI behind the tp_group interface, a communicator
 * per group.
 *
 * MPI's own reductions may sum in any order (ring, tree, recursive
 * halving), which gives different bits on different ranks and differs from
 * the shm backend.  So reductions move raw bytes with MPI and sum locally
 * with tp_comm_reduce_ordered: small all-reduces gather every input and
 * reduce on each rank (one-shot); large ones send share q of every input to
 * rank q (all-to-all), which reduces it, and gather the shares (two-shot).
 * The results are then bitwise equal to the shm backend's (§1.4, §5.4).
 *
 * Every operation is started in its non-blocking form and waited for in
 * wait_for, which polls it and can therefore give up: when a member of the
 * group stops beating (mpi_heartbeat.c) for TENSORPAR_HANG_TIMEOUT, or the
 * operation takes longer than TENSORPAR_COMM_TIMEOUT.  The rank then fails
 * with TP_ERR_COMM and leaves without MPI_Finalize (which would wait for
 * the frozen rank), so mpirun sees it exit and ends the job. */
#include "comm_internal.h"
#include "mpi_heartbeat.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define ONESHOT_MAX_BYTES (64u << 10)
#define CHUNK_BYTES ((size_t)256 << 20)   /* all-reduce works in chunks */

/* Point-to-point tags: tp_comm_send/recv/sendrecv's, exchange's. */
enum { TAG_P2P = 0, TAG_EXCHANGE = 1 };

/* Shared by all groups of the process: who finalizes MPI, how to wait. */
typedef struct {
    int refs;
    int we_initialized;
    int failed;             /* a wait gave up: operations are left pending  */
    double spin_s, yield_s; /* tp_wait_limits' for the ranks on this host  */
    double hang_s;          /* TENSORPAR_HANG_TIMEOUT; 0: off               */
    tp_mpi_beat *beat;      /* NULL: no heartbeat (off, or no THREAD_MULTIPLE) */
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

/* ---- waiting ----------------------------------------------------------- */

/* The first member of g whose heartbeat has been silent for hang_s, or -1;
 * sil holds one watcher per member. */
static int silent_member(tp_group *g, const mpi_job *job, tp_silence *sil, double now, double *silent)
{
    for (int i = 0; i < g->size; i++) {
        if (i == g->rank) continue;
        uint64_t heard = tp_mpi_beat_heard(job->beat, g->global[i]);
        if (heard == UINT64_MAX) continue;          /* it left on purpose */
        *silent = tp_silence_seconds(&sil[i], i, heard, now);
        if (*silent > job->hang_s) return i;
    }
    return -1;
}

/* Waits until the n requests are done, pausing between tests as the shm
 * backend does (wait.c: spin, yield, then sleep, so a waiting rank does not
 * keep a core for long), and every TP_WAIT_CHECK_S checks the members'
 * heartbeats and the group's timeout.  `op` and `bytes` name what is
 * awaited. */
static tp_status wait_for(tp_group *g, int n, MPI_Request *reqs, MPI_Status *sts, const char *op, size_t bytes)
{
    int done = 0;
    int rc = MPI_Testall(n, reqs, &done, sts ? sts : MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_err(rc, op);
    if (done) return TP_OK;
    mpi_job *job = ((mpi_group *)g->impl)->job;
    tp_backoff pause;
    tp_backoff_init(&pause, job->spin_s, job->yield_s);
    tp_silence *sil = NULL;
    tp_status st = TP_OK;
    while (!done) {
        double now;
        if (tp_backoff_pause(&pause, &now) && tp_backoff_check_due(&pause, now)) {
            int who = -1;
            double silent = 0, waited = now - pause.start;
            if (job->beat && job->hang_s > 0) {
                if (!sil && (sil = malloc((size_t)g->size * sizeof *sil)) != NULL)
                    for (int i = 0; i < g->size; i++) tp_silence_init(&sil[i], now);
                if (sil) who = silent_member(g, job, sil, now, &silent);
            }
            if (who >= 0) {
                st = tp_fail(TP_ERR_COMM, "rank %d stopped responding (no heartbeat for %.1f s) while rank %d "
                             "waited for %s of %zu bytes: some rank of the group stopped responding "
                             "(TENSORPAR_HANG_TIMEOUT=%g s sets the limit)", g->global[who], silent,
                             g->global[g->rank], op, bytes, job->hang_s);
                break;
            }
            if (waited > g->timeout_s) {
                st = tp_fail(TP_ERR_TIMEOUT, "rank %d waited %.1f s for %s of %zu bytes without completion: "
                             "some rank of the group stopped responding (TENSORPAR_COMM_TIMEOUT=%g s sets the "
                             "limit)", g->global[g->rank], waited, op, bytes, g->timeout_s);
                break;
            }
        }
        rc = MPI_Testall(n, reqs, &done, sts ? sts : MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            st = mpi_err(rc, op);
            break;
        }
    }
    free(sil);
    /* The requests stay pending: nothing may wait for them again. */
    if (st && !done) job->failed = 1;
    return st;
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
    MPI_Request *req;       /* 2 n */
    char *tmp;
} mpi_scratch;

static tp_status scratch_init(mpi_scratch *s, int n, size_t tmp_bytes)
{
    memset(s, 0, sizeof *s);
    s->sc = malloc(4 * (size_t)n * sizeof(int));
    s->src = malloc((size_t)n * sizeof(void *));
    s->req = malloc(2 * (size_t)n * sizeof(MPI_Request));
    s->tmp = malloc(tmp_bytes ? tmp_bytes : 1);
    if (!s->sc || !s->src || !s->req || !s->tmp) {
        free(s->sc); free(s->src); free(s->req); free(s->tmp);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    s->sd = s->sc + n;
    s->rc = s->sd + n;
    s->rd = s->rc + n;
    return TP_OK;
}

/* After a wait gave up, the pending operation may still write into the
 * scratch: it is left allocated (the process is about to leave). */
static void scratch_free(tp_group *g, mpi_scratch *s)
{
    if (((mpi_group *)g->impl)->job->failed) return;
    free(s->sc); free(s->src); free(s->req); free(s->tmp);
}

/* ---- moving bytes ------------------------------------------------------ */

/* What MPI_Alltoallv does: piece p of send (sc[p] bytes at sd[p]) goes to
 * rank p, which finds it at rd[me] of its recv; the piece from rank p lands
 * at rd[p] (rc[p] bytes).  sc NULL: the same sbytes at send go to every
 * rank (an all-gather).  The own piece is copied unless it is in place or
 * rc[me] is 0.  As point-to-point messages: OpenMPI's non-blocking
 * collectives (libnbc) took 1.2 to 1.8 times as long as the blocking ones
 * (4 KiB to 4 MiB, two ranks); these are as fast.  `op` and `bytes` name
 * the operation in errors. */
static tp_status exchange(tp_group *g, mpi_scratch *s, const char *send, const int *sc, const int *sd, int sbytes,
                          char *recv, const int *rc, const int *rd, const char *op, size_t bytes)
{
    int n = g->size, me = g->rank, k = 0, err = MPI_SUCCESS;
    /* Each rank starts with its next neighbour, so the peers' first
     * messages do not all go to one rank. */
    for (int i = 1; i < n && err == MPI_SUCCESS; i++) {
        int p = (me + n - i) % n;
        if (rc[p] > 0) err = MPI_Irecv(recv + rd[p], rc[p], MPI_BYTE, p, TAG_EXCHANGE, comm_of(g), &s->req[k++]);
    }
    for (int i = 1; i < n && err == MPI_SUCCESS; i++) {
        int p = (me + i) % n, c = sc ? sc[p] : sbytes;
        if (c > 0) err = MPI_Isend(send + (sc ? sd[p] : 0), c, MPI_BYTE, p, TAG_EXCHANGE, comm_of(g), &s->req[k++]);
    }
    if (err != MPI_SUCCESS) {
        /* Operations already started would touch the buffers later. */
        if (k) ((mpi_group *)g->impl)->job->failed = 1;
        return mpi_err(err, op);
    }
    const char *own = send + (sc ? sd[me] : 0);
    if (rc[me] > 0 && own != recv + rd[me]) memmove(recv + rd[me], own, (size_t)rc[me]);
    return wait_for(g, k, s->req, NULL, op, bytes);
}

/* ---- all-reduce ------------------------------------------------------- */

static tp_status oneshot(tp_group *g, const char *send, char *recv, size_t m, tp_dtype dt,
                         tp_reduce_op op, mpi_scratch *s)
{
    size_t bytes = m * tp_dtype_size(dt);
    int n = g->size, me = g->rank;
    for (int p = 0; p < n; p++) {
        s->rc[p] = p == me ? 0 : (int)bytes;    /* the own input is read in place */
        s->rd[p] = (int)((size_t)p * bytes);
    }
    tp_status st = exchange(g, s, send, NULL, NULL, (int)bytes, s->tmp, s->rc, s->rd, "all_reduce", bytes);
    if (st) return st;
    for (int p = 0; p < n; p++) s->src[p] = p == me ? send : s->tmp + (size_t)p * bytes;
    tp_comm_reduce_ordered(recv, s->src, n, m, dt, op);
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
    s->rc[me] = 0;                              /* the own share is read in place */
    tp_status st = exchange(g, s, send, s->sc, s->sd, 0, s->tmp, s->rc, s->rd, "all_reduce", m * es);
    if (st) return st;
    for (int p = 0; p < n; p++) s->src[p] = p == me ? send + lo * es : s->tmp + (size_t)p * mine;
    tp_comm_reduce_ordered(recv + lo * es, s->src, n, hi - lo, dt, op);
    /* Then every rank's reduced share to every rank, in place. */
    return exchange(g, s, recv + lo * es, NULL, NULL, (int)mine, recv, s->sc, s->sd, "all_reduce", m * es);
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
    scratch_free(g, &s);
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
        st = exchange(g, &s, send, NULL, NULL, s.rc[g->rank], recv, s.rc, s.rd, "all_gather", total);
    }
    scratch_free(g, &s);
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
        st = exchange(g, &s, send, s.sc, s.sd, 0, s.tmp, s.rc, s.rd, "reduce_scatter", total);
    }
    if (st == TP_OK) {
        for (int p = 0; p < n; p++) s.src[p] = s.tmp + (size_t)p * mine;
        tp_comm_reduce_ordered(recv, s.src, n, counts[me], dt, op);
    }
    scratch_free(g, &s);
    return st;
}

static tp_status mpi_broadcast(tp_group *g, void *buf, size_t bytes, int root)
{
    for (size_t off = 0; off < bytes; off += CHUNK_BYTES) {
        size_t b = bytes - off < CHUNK_BYTES ? bytes - off : CHUNK_BYTES;
        MPI_Request r;
        int rc = MPI_Ibcast((char *)buf + off, (int)b, MPI_BYTE, root, comm_of(g), &r);
        tp_status st = rc == MPI_SUCCESS ? wait_for(g, 1, &r, NULL, "broadcast", b) : mpi_err(rc, "broadcast");
        if (st) return st;
    }
    return TP_OK;
}

static tp_status mpi_barrier(tp_group *g)
{
    MPI_Request r;
    int rc = MPI_Ibarrier(comm_of(g), &r);
    return rc == MPI_SUCCESS ? wait_for(g, 1, &r, NULL, "barrier", 0) : mpi_err(rc, "barrier");
}

/* Every rank checks that what others send it is what it expects, and all
 * agree on the outcome, so a mismatch fails everywhere instead of hanging. */
static tp_status check_counts(tp_group *g, const size_t *sc, const size_t *rc_expected)
{
    int n = g->size;
    unsigned long long *out = malloc(2 * (size_t)n * sizeof *out), *in = out ? out + n : NULL;
    if (!out) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int q = 0; q < n; q++) out[q] = sc[q];
    MPI_Request r;
    int rc = MPI_Ialltoall(out, 1, MPI_UNSIGNED_LONG_LONG, in, 1, MPI_UNSIGNED_LONG_LONG, comm_of(g), &r);
    tp_status st = rc == MPI_SUCCESS ? wait_for(g, 1, &r, NULL, "all_to_all (counts)", (size_t)n * sizeof *out)
                                     : mpi_err(rc, "all_to_all");
    if (st) {
        /* A wait that gave up leaves the operation pending on the buffer. */
        if (!((mpi_group *)g->impl)->job->failed) free(out);
        return st;
    }
    int bad = -1, any;
    for (int p = 0; p < n && bad < 0; p++)
        if (in[p] != rc_expected[p]) bad = p;
    unsigned long long got = bad >= 0 ? in[bad] : 0;
    free(out);
    int flag = bad >= 0;
    rc = MPI_Iallreduce(&flag, &any, 1, MPI_INT, MPI_MAX, comm_of(g), &r);
    st = rc == MPI_SUCCESS ? wait_for(g, 1, &r, NULL, "all_reduce (verdict)", sizeof flag) : mpi_err(rc, "all_reduce");
    if (st) return st;
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
        st = exchange(g, &s, send, s.sc, s.sd, 0, recv, s.rc, s.rd, "all_to_all", t1 > t2 ? t1 : t2);
    }
    scratch_free(g, &s);
    return st;
}

static tp_status mpi_sendrecv(tp_group *g, const void *send, size_t send_bytes, int dst,
                              void *recv, size_t recv_bytes, int src)
{
    tp_status st;
    if ((st = fits(send_bytes, "send")) || (st = fits(recv_bytes, "recv"))) return st;
    /* reqs[0] receives, reqs[1] sends; a null request counts as done. */
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Status status[2];
    int rc = MPI_SUCCESS;
    if (src >= 0) rc = MPI_Irecv(recv, (int)recv_bytes, MPI_BYTE, src, TAG_P2P, comm_of(g), &reqs[0]);
    if (rc == MPI_SUCCESS && dst >= 0) rc = MPI_Isend(send, (int)send_bytes, MPI_BYTE, dst, TAG_P2P, comm_of(g), &reqs[1]);
    if (rc != MPI_SUCCESS) {
        /* A receive already posted would write into recv later. */
        if (reqs[0] != MPI_REQUEST_NULL) ((mpi_group *)g->impl)->job->failed = 1;
        return mpi_err(rc, "send/recv");
    }
    st = wait_for(g, 2, reqs, status, "send/recv", send_bytes > recv_bytes ? send_bytes : recv_bytes);
    if (st) return st;
    if (src >= 0) {
        int got = 0;
        MPI_Get_count(&status[0], MPI_BYTE, &got);
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
    mpi_job *job = m->job;
    /* After a wait gave up, an operation is pending on the communicators and
     * some rank may never take part again: MPI_Comm_free and MPI_Finalize
     * could wait for it forever.  Leaving without them makes mpirun end the
     * job (a rank exited without finalizing). */
    if (!job->failed) MPI_Comm_free(&m->comm);
    if (--job->refs == 0) {
        tp_mpi_beat_stop(job->beat, !job->failed);
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (job->we_initialized && !finalized && !job->failed) MPI_Finalize();
        free(job);
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
        /* MULTIPLE for the heartbeat thread (mpi_heartbeat.c). */
        if (MPI_Init_thread(NULL, NULL, e->hang_s > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided) !=
            MPI_SUCCESS)
            return tp_fail(TP_ERR_COMM, "MPI_Init failed");
    }
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    mpi_job *job = calloc(1, sizeof *job);
    if (!job) return tp_fail(TP_ERR_NOMEM, "out of memory");
    job->we_initialized = !inited;
    tp_wait_limits(e->local_size, &job->spin_s, &job->yield_s);
    /* Without MULTIPLE (MPI started by the program with less) there is no
     * heartbeat: only TENSORPAR_COMM_TIMEOUT ends a wait for a frozen rank. */
    job->hang_s = level == MPI_THREAD_MULTIPLE ? e->hang_s : 0;
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
        /* Starting the heartbeat is collective: only if every rank can. */
        int can = job->hang_s > 0, all = 0;
        if (MPI_Allreduce(&can, &all, 1, MPI_INT, MPI_MIN, world) != MPI_SUCCESS) all = 0;
        if (all && (st = tp_mpi_beat_start(world, &job->beat)) != TP_OK) MPI_Comm_free(&world);
    }
    if (st == TP_OK) st = wrap(g, world, job);
    if (st) {
        tp_mpi_beat_stop(job->beat, 1);
        if (job->we_initialized) MPI_Finalize();
        free(job);
    }
    return st;
}
