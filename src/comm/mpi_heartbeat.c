/* Liveness of the mpi backend's ranks: a heartbeat over MPI.
 *
 * The mpi backend waits for its collectives by polling (comm_mpi.c), so a
 * waiting rank can give up; but on what evidence?  A peer that computes for
 * seconds and one that is frozen (SIGSTOP, a frozen cgroup, a debugger)
 * look alike from inside a collective, and the ranks may be on different
 * hosts, so the shm backend's counters in shared memory (shm_heartbeat.c)
 * cannot be read.  So each rank runs a thread that, every BEAT_PERIOD_S,
 * sends a one-int message to every other rank on a communicator of its own
 * and receives the beats sent to it, counting them per sender.  It runs
 * independently of compute, loading and page faults; only a process that
 * does not run at all (or cannot reach its peers) stops beating.  A waiting
 * rank applies the silence rule both backends share (wait.c) to the counts.
 *
 * A rank that finishes sends a farewell before it stops beating: it may
 * leave while a peer still waits for a collective it has done its part of,
 * and its silence then is no hang. */
#include "mpi_heartbeat.h"
#include "comm_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define BEAT_PERIOD_S 0.1
/* How long a farewell may take to leave before the rank goes on without it. */
#define FAREWELL_WAIT_S 1.0

enum { TAG_BEAT = 1, TAG_FAREWELL = 2 };

struct tp_mpi_beat {
    MPI_Comm comm;
    int n, me;
    _Atomic uint64_t *heard;        /* beats received from each rank       */
    MPI_Request *sent;              /* the latest beat to each rank        */
    int token;                      /* what a beat carries (nothing)       */
    tp_periodic *thread;
};

/* Errors are ignored: a peer that cannot be reached stops being heard,
 * which is the evidence a waiting rank needs. */
static void send_beats(tp_mpi_beat *b)
{
    for (int p = 0; p < b->n; p++) {
        if (p == b->me) continue;
        int done = 1;
        /* A beat still in flight (the peer does not take it): no pile-up. */
        if (b->sent[p] != MPI_REQUEST_NULL && MPI_Test(&b->sent[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            continue;
        if (done) MPI_Isend(&b->token, 1, MPI_INT, p, TAG_BEAT, b->comm, &b->sent[p]);
    }
}

static void receive_beats(tp_mpi_beat *b)
{
    /* Bounded, so that a flood cannot keep the thread from sending. */
    for (int i = 0; i < 4 * b->n; i++) {
        int flag = 0, v;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, b->comm, &flag, &st) != MPI_SUCCESS || !flag) return;
        if (MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, st.MPI_TAG, b->comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        _Atomic uint64_t *h = &b->heard[st.MPI_SOURCE];
        if (st.MPI_TAG == TAG_FAREWELL)
            atomic_store_explicit(h, UINT64_MAX, memory_order_release);
        else if (atomic_load_explicit(h, memory_order_relaxed) != UINT64_MAX)
            atomic_fetch_add_explicit(h, 1, memory_order_release);
    }
}

static void beat(void *arg)
{
    send_beats(arg);
    receive_beats(arg);
}

static void beat_free(tp_mpi_beat *b)
{
    free((void *)b->heard);
    free(b->sent);
    free(b);
}

tp_status tp_mpi_beat_start(MPI_Comm world, tp_mpi_beat **out)
{
    *out = NULL;
    tp_mpi_beat *b = calloc(1, sizeof *b);
    if (!b) return tp_fail(TP_ERR_NOMEM, "out of memory");
    MPI_Comm_rank(world, &b->me);
    MPI_Comm_size(world, &b->n);
    b->heard = calloc((size_t)b->n, sizeof *b->heard);
    b->sent = malloc((size_t)b->n * sizeof *b->sent);
    if (!b->heard || !b->sent) {
        beat_free(b);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    for (int p = 0; p < b->n; p++) b->sent[p] = MPI_REQUEST_NULL;
    if (MPI_Comm_dup(world, &b->comm) != MPI_SUCCESS) {
        beat_free(b);
        return tp_fail(TP_ERR_COMM, "MPI_Comm_dup for the heartbeat failed");
    }
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    tp_status st = tp_periodic_start(BEAT_PERIOD_S, beat, b, "heartbeat", &b->thread);
    if (st) {
        MPI_Comm_free(&b->comm);
        beat_free(b);
        return st;
    }
    *out = b;
    return TP_OK;
}

/* Sends the farewell to every peer and waits (boundedly) for it to leave,
 * then lets go of the beats still in flight. */
static void farewell(tp_mpi_beat *b)
{
    MPI_Request *bye = malloc((size_t)b->n * sizeof *bye);
    if (!bye) return;
    for (int p = 0; p < b->n; p++) {
        bye[p] = MPI_REQUEST_NULL;
        if (p != b->me) MPI_Isend(&b->token, 1, MPI_INT, p, TAG_FAREWELL, b->comm, &bye[p]);
    }
    double until = tp_now() + FAREWELL_WAIT_S;
    int done = 0;
    while (MPI_Testall(b->n, bye, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !done && tp_now() < until) {
        struct timespec ts = {0, 200000L};
        nanosleep(&ts, NULL);
    }
    for (int p = 0; p < b->n; p++) {
        if (bye[p] != MPI_REQUEST_NULL) MPI_Request_free(&bye[p]);
        if (b->sent[p] != MPI_REQUEST_NULL) MPI_Request_free(&b->sent[p]);
    }
    free(bye);
    MPI_Comm_free(&b->comm);
}

void tp_mpi_beat_stop(tp_mpi_beat *b, int say_farewell)
{
    if (!b) return;
    tp_periodic_stop(b->thread);
    if (say_farewell) farewell(b);
    beat_free(b);
}

uint64_t tp_mpi_beat_heard(const tp_mpi_beat *b, int r)
{
    return atomic_load_explicit(&b->heard[r], memory_order_acquire);
}
