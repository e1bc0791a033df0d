/* A thread that calls a function every period until stopped: the body of
 * both backends' heartbeats (shm_heartbeat.c, mpi_heartbeat.c).  It blocks
 * every signal (they stay the main thread's business) and wakes at once
 * when stopped. */
#include "comm_internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tp_periodic {
    void (*fn)(void *);
    void *arg;
    double period_s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
};

static void deadline_after(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    long ns = ts->tv_nsec + (long)(s * 1e9);
    ts->tv_sec += ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

static void *periodic_main(void *arg)
{
    tp_periodic *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->mu);
        p->fn(p->arg);
        pthread_mutex_lock(&p->mu);
        struct timespec ts;
        deadline_after(&ts, p->period_s);
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) != ETIMEDOUT) {}
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

tp_status tp_periodic_start(double period_s, void (*fn)(void *), void *arg, const char *what, tp_periodic **out)
{
    *out = NULL;
    tp_periodic *p = calloc(1, sizeof *p);
    if (!p) return tp_fail(TP_ERR_NOMEM, "out of memory");
    p->fn = fn;
    p->arg = arg;
    p->period_s = period_s;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&p->mu, NULL);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&p->thread, NULL, periodic_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return tp_fail(TP_ERR_INTERNAL, "cannot start the %s thread: %s", what, strerror(rc));
    }
    *out = p;
    return TP_OK;
}

void tp_periodic_stop(tp_periodic *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
