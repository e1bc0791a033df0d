/* Waiting for peers, the part both backends share (shm_wait.c,
 * comm_mpi.c's wait_for): how a waiting rank pauses, and the silence rule
 * by which it judges a peer's heartbeat.
 *
 * A wait spins first (the peer is usually a few hundred nanoseconds
 * behind), then yields the core (ranks may outnumber cores, and the peer
 * we wait for may need ours), then sleeps with a growing interval; the
 * caller looks at its peers every TP_WAIT_CHECK_S. */
#include "comm_internal.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#define SLEEP_MIN_NS 20000L
#define SLEEP_MAX_NS 500000L
/* Two looks at a counter further apart than this mean the watcher itself
 * did not run (it was stopped too, e.g. the whole job by Ctrl-Z, or starved):
 * its silence then proves nothing, and the count starts again. */
#define WATCH_GAP_S 0.5

void tp_wait_limits(int ranks_here, double *spin_s, double *yield_s)
{
    /* Spinning pays when every rank has a core; otherwise the peer we wait
     * for may need ours, and we yield early.  With a core each, a rank also
     * keeps polling (yielding to anything else runnable) for up to 50 ms
     * before it sleeps: ranks in lock step wait milliseconds for a peer that
     * was preempted, and waking from a sleep of up to 0.5 ms after the peer
     * is back cost both ranks that time again. */
    int own_core = sysconf(_SC_NPROCESSORS_ONLN) >= ranks_here;
    *spin_s = own_core ? 100e-6 : 5e-6;
    *yield_s = own_core ? 50e-3 : 2e-3;
}

void tp_backoff_init(tp_backoff *b, double spin_s, double yield_s)
{
    b->start = tp_now();
    b->next_check = b->start + TP_WAIT_CHECK_S;
    b->spin_s = spin_s;
    b->yield_s = yield_s;
    b->iter = 0;
    b->sleep_ns = SLEEP_MIN_NS;
}

int tp_backoff_pause(tp_backoff *b, double *now)
{
    if ((++b->iter & 63) != 0) {
        /* Cheap phase: most waits end here, without looking at the clock. */
        tp_cpu_relax();
        return 0;
    }
    *now = tp_now();
    double waited = *now - b->start;
    if (waited < b->spin_s) {
        tp_cpu_relax();
    } else if (waited < b->yield_s) {
        sched_yield();
    } else {
        struct timespec ts = {0, b->sleep_ns};
        nanosleep(&ts, NULL);
        if (b->sleep_ns < SLEEP_MAX_NS) b->sleep_ns *= 2;
    }
    return 1;
}

int tp_backoff_check_due(tp_backoff *b, double now)
{
    if (now < b->next_check) return 0;
    b->next_check = now + TP_WAIT_CHECK_S;
    return 1;
}

/* ---- the silence rule ------------------------------------------------- */

void tp_silence_init(tp_silence *s, double now)
{
    s->who = -1;
    s->seen = 0;
    s->since = now;
    s->last = now;
}

double tp_silence_seconds(tp_silence *s, int who, uint64_t value, double now)
{
    if (s->who != who || s->seen != value || now - s->last > WATCH_GAP_S) {
        s->who = who;
        s->seen = value;
        s->since = now;
    }
    s->last = now;
    return now - s->since;
}
