/* Waiting for peers in the shm backend.
 *
 * A wait pauses as wait.c says (spin, yield, then sleep; 100 us and 50 ms
 * when every rank has a core, 5 us and 2 ms otherwise, see tp_shm_attach).
 * Every 50 ms it checks that the awaited peer still exists, that its
 * heartbeat runs (shm_heartbeat.c) and that no other rank has reported a
 * failure, so a dead or frozen peer is noticed within a fraction of a
 * second, or TENSORPAR_HANG_TIMEOUT, instead of at the timeout. */
#include "shm.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

uint64_t tp_shm_proc_start(int pid, char *state)
{
    char path[64], buf[1024];
    /* The main thread's task entry holds the same fields as /proc/<pid>/stat.
     * It is read because user-mode emulators (qemu-user) rewrite
     * /proc/<own pid>/stat for the program they run, with a start time of
     * their own making, so a rank would disagree with its peers about it. */
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, pid);
    *state = '?';
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields start after
     * the last ')'.  Then: state (3), ... starttime (22). */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22 && *p; p++)
        if (*p == ' ') field++;
    unsigned long long t = 0;
    if (sscanf(p, "%llu", &t) != 1) return 0;
    return t;
}

int tp_shm_rank_alive(shm_world *w, int r)
{
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + r;
    int pid = atomic_load_explicit(&ri->pid, memory_order_acquire);
    if (pid <= 0) return 1;                       /* not attached yet */
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char state;
    uint64_t start = tp_shm_proc_start(pid, &state);
    if (start == 0) return state == '?' ? 0 : 1;  /* vanished meanwhile */
    /* A zombie has died but its parent has not reaped it yet; a different
     * start time means the pid now belongs to another process. */
    return state != 'Z' && state != 'X' && start == ri->start_time;
}

void tp_shm_backoff_init(shm_backoff *b, const shm_world *w)
{
    tp_backoff_init(&b->pause, w->spin_s, w->yield_s);
    tp_silence_init(&b->silence, b->pause.start);
}

/* Tells the other ranks, so that those waiting on someone else stop too. */
static void flag_failure(shm_world *w, int peer, int why)
{
    int expected = -1;
    if (atomic_compare_exchange_strong(&w->h->failed_rank, &expected, peer)) {
        atomic_store(&w->h->failed_why, why);
        atomic_store_explicit(&w->h->failed_by, w->me, memory_order_release);
    }
}

static tp_status report_dead(shm_world *w, int peer, const char *what)
{
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + peer;
    flag_failure(w, peer, FAIL_DIED);
    return tp_fail(TP_ERR_COMM, "rank %d (pid %d) died while rank %d waited for %s", peer,
                   (int)atomic_load(&ri->pid), w->me, what);
}

static tp_status report_silent(shm_world *w, int peer, double silent, const char *what)
{
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + peer;
    flag_failure(w, peer, FAIL_SILENT);
    return tp_fail(TP_ERR_COMM, "rank %d (pid %d) stopped responding (no heartbeat for %.1f s) while rank %d "
                   "waited for %s (TENSORPAR_HANG_TIMEOUT sets the limit)", peer, (int)atomic_load(&ri->pid),
                   silent, w->me, what);
}

static tp_status report_flagged(shm_world *w, int failed, const char *what)
{
    /* The flagging rank writes failed_by last; it is a few stores behind. */
    int by = -1;
    for (int i = 0; i < 1000 && (by = atomic_load_explicit(&w->h->failed_by, memory_order_acquire)) < 0; i++)
        tp_cpu_relax();
    int silent = by >= 0 && atomic_load(&w->h->failed_why) == FAIL_SILENT;
    return tp_fail(TP_ERR_COMM, "rank %d %s (noticed by rank %d) while rank %d waited for %s", failed,
                   silent ? "stopped responding" : "died", by, w->me, what);
}

/* A peer that runs beats; one whose heartbeat is silent for hang_s of our
 * own running time is frozen.  Before it attaches it has no heartbeat yet
 * and may legitimately be busy for long (starting up, importing): then only
 * a stopped process counts as silent. */
static tp_status check_silence(shm_backoff *b, shm_world *w, int peer, double now, const char *what)
{
    if (w->hang_s <= 0) return TP_OK;
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + peer;
    int pid = atomic_load_explicit(&ri->pid, memory_order_acquire);
    if (pid <= 0) return TP_OK;
    uint64_t beat = atomic_load_explicit(&ri->beat, memory_order_acquire);
    if (beat == 0) {
        char state;
        tp_shm_proc_start(pid, &state);
        if (state != 'T' && state != 't') {
            tp_silence_init(&b->silence, now);
            return TP_OK;
        }
    }
    double silent = tp_silence_seconds(&b->silence, peer, beat, now);
    return silent > w->hang_s ? report_silent(w, peer, silent, what) : TP_OK;
}

tp_status tp_shm_check_peer(shm_world *w, int peer, const char *what)
{
    int failed = atomic_load_explicit(&w->h->failed_rank, memory_order_acquire);
    if (failed >= 0 && failed != w->me) return report_flagged(w, failed, what);
    if (peer < 0 || peer == w->me) return TP_OK;
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + peer;
    if (atomic_load_explicit(&ri->state, memory_order_acquire) == RANK_LEFT)
        return tp_fail(TP_ERR_COMM, "rank %d has already left the job while rank %d waited for %s",
                       peer, w->me, what);
    if (!tp_shm_rank_alive(w, peer)) return report_dead(w, peer, what);
    return TP_OK;
}

tp_status tp_shm_backoff(shm_backoff *b, shm_world *w, const tp_group *g, int peer, const char *what)
{
    double now;
    if (!tp_backoff_pause(&b->pause, &now)) return TP_OK;
    if (tp_backoff_check_due(&b->pause, now)) {
        tp_status st = tp_shm_check_peer(w, peer, what);
        if (st == TP_OK && peer >= 0 && peer != w->me) st = check_silence(b, w, peer, now, what);
        if (st) return st;
    }
    if (now - b->pause.start > g->timeout_s)
        return tp_fail(TP_ERR_TIMEOUT,
                       "rank %d did not answer within %g s while rank %d waited for %s "
                       "(TENSORPAR_COMM_TIMEOUT sets the limit)",
                       peer, g->timeout_s, w->me, what);
    return TP_OK;
}

tp_status tp_shm_wait_ge(shm_world *w, const tp_group *g, _Atomic uint64_t *c, uint64_t target,
                         int peer, const char *what)
{
    if (atomic_load_explicit(c, memory_order_acquire) >= target) return TP_OK;
    shm_backoff b;
    tp_shm_backoff_init(&b, w);
    while (atomic_load_explicit(c, memory_order_acquire) < target) {
        tp_status st = tp_shm_backoff(&b, w, g, peer, what);
        /* The peer may have published, finished and left between our last
         * look and its liveness check: what it published still counts. */
        if (st) return atomic_load_explicit(c, memory_order_acquire) >= target ? TP_OK : st;
    }
    return TP_OK;
}
