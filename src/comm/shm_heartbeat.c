/* Liveness of the shm backend's ranks: a heartbeat, and the rule that says a
 * rank stopped responding.
 *
 * A rank that is alive but frozen (SIGSTOP, a debugger, a frozen cgroup)
 * looks like a slow one to its peers, and TENSORPAR_COMM_TIMEOUT is long on
 * purpose (a peer may legitimately compute for many seconds).  So each rank
 * runs a thread that only bumps a counter in its rank slot every
 * BEAT_PERIOD_S: it runs independently of compute, loading and page faults,
 * so a rank that works, however long, keeps beating, and only a process
 * that does not run at all goes silent.  A counter silent for
 * TENSORPAR_HANG_TIMEOUT seconds (default 2) of the watcher's own running
 * time means the rank stopped responding.
 *
 * The watchers are the peers (while they wait for it, shm_wait.c) and the
 * launcher (always): the latter also catches a rank frozen where no peer
 * waits for it, e.g. after the others have finished.  Before a rank beats
 * and after it has left, a stopped process is what counts as silent.  The
 * silence rule itself is wait.c's, shared with the mpi backend. */
#include "shm.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#define BEAT_PERIOD_S 0.05

struct tp_shm_beat {
    _Atomic uint64_t *counter;
    tp_periodic *thread;
};

static void beat(void *arg)
{
    tp_shm_beat *b = arg;
    atomic_fetch_add_explicit(b->counter, 1, memory_order_release);
}

tp_status tp_shm_beat_start(_Atomic uint64_t *counter, tp_shm_beat **out)
{
    *out = NULL;
    tp_shm_beat *b = calloc(1, sizeof *b);
    if (!b) return tp_fail(TP_ERR_NOMEM, "out of memory");
    b->counter = counter;
    tp_status st = tp_periodic_start(BEAT_PERIOD_S, beat, b, "heartbeat", &b->thread);
    if (st) {
        free(b);
        return st;
    }
    *out = b;
    return TP_OK;
}

void tp_shm_beat_stop(tp_shm_beat *b)
{
    if (!b) return;
    tp_periodic_stop(b->thread);
    free(b);
}

/* ---- the launcher's view ---------------------------------------------- */

struct tp_shm_watch {
    shm_header *h;
    size_t bytes;
    shm_rank_info *ri;
    int n;
    tp_silence *silence;
};

tp_status tp_shm_watch_open(int fd, int n, tp_shm_watch **out)
{
    *out = NULL;
    tp_shm_watch *w = calloc(1, sizeof *w);
    tp_silence *sil = calloc((size_t)n, sizeof *sil);
    if (!w || !sil) {
        free(w);
        free(sil);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    /* Only the header and the rank table: the areas are none of our business. */
    shm_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
    size_t bytes = h == MAP_FAILED ? 0 : h->areas_off;
    if (h != MAP_FAILED) munmap(h, sizeof *h);
    void *p = bytes ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED) {
        free(w);
        free(sil);
        return tp_fail(TP_ERR_IO, "mmap of the job's shared memory: %s", strerror(errno));
    }
    w->h = p;
    w->bytes = bytes;
    w->ri = (shm_rank_info *)((char *)p + w->h->ranks_off);
    w->n = n;
    w->silence = sil;
    double now = tp_now();
    for (int r = 0; r < n; r++) tp_silence_init(&sil[r], now);
    *out = w;
    return TP_OK;
}

void tp_shm_watch_close(tp_shm_watch *w)
{
    if (!w) return;
    munmap(w->h, w->bytes);
    free(w->silence);
    free(w);
}

void tp_shm_watch_announce(tp_shm_watch *w, int rank, int pid)
{
    /* The same values the rank writes when it attaches; written here too so
     * that peers can tell a rank that died or froze before it attached. */
    if (!w || rank < 0 || rank >= w->n || pid <= 0) return;
    char state;
    w->ri[rank].start_time = tp_shm_proc_start(pid, &state);
    atomic_store_explicit(&w->ri[rank].pid, (int32_t)pid, memory_order_release);
}

double tp_shm_watch_silent(tp_shm_watch *w, int rank, int pid, double now)
{
    if (!w || rank < 0 || rank >= w->n) return 0;
    uint64_t beat = atomic_load_explicit(&w->ri[rank].beat, memory_order_acquire);
    /* A rank that has not started beating may be any program, busy before
     * it joins; one that has left stops beating on purpose, but must still
     * exit.  For those only a stopped process counts as silent (and its
     * "counter" stands still for as long as it stays stopped). */
    if (beat == 0 || atomic_load_explicit(&w->ri[rank].state, memory_order_acquire) == RANK_LEFT) {
        char state;
        tp_shm_proc_start(pid, &state);
        if (state != 'T' && state != 't') {
            tp_silence_init(&w->silence[rank], now);
            return 0;
        }
        beat = UINT64_MAX;
    }
    return tp_silence_seconds(&w->silence[rank], rank, beat, now);
}
