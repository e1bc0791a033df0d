/* Liveness of shm ranks: the silence rule (how long a watcher has seen a
 * heartbeat stand still, restarting after the watcher itself was away), the
 * heartbeat thread, and TENSORPAR_HANG_TIMEOUT. */
#include "check.h"
#include "tensorpar/settings.h"
#include "comm/shm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int near(double a, double b) { return fabs(a - b) < 1e-9; }

static void test_silence_rule(void)
{
    tp_silence s;
    tp_silence_init(&s, 10.0);
    CHECK(near(tp_silence_seconds(&s, 1, 5, 10.1), 0.0));   /* first look at rank 1 */
    double t = 10.1, got = 0;
    for (int i = 0; i < 20; i++) got = tp_silence_seconds(&s, 1, 5, t += 0.1);
    CHECK(near(got, 2.0));                               /* 2 s without a beat */
    CHECK(near(tp_silence_seconds(&s, 1, 6, t += 0.1), 0.0)); /* a beat */
    CHECK(near(tp_silence_seconds(&s, 1, 6, t += 0.4), 0.4));
    /* The watcher was away 0.6 s (stopped with the job): count again. */
    CHECK(near(tp_silence_seconds(&s, 1, 6, t += 0.6), 0.0));
    CHECK(near(tp_silence_seconds(&s, 1, 6, t += 0.3), 0.3));
    /* Another rank's counter, even with the same value, starts afresh. */
    CHECK(near(tp_silence_seconds(&s, 2, 6, t += 0.1), 0.0));
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void test_beat_thread(void)
{
    _Atomic uint64_t counter = 0;
    tp_shm_beat *b = NULL;
    CHECK(tp_shm_beat_start(&counter, &b) == TP_OK);
    double t0 = tp_now();
    sleep_s(0.4);
    uint64_t v = atomic_load(&counter);
    double took = tp_now() - t0;
    /* One beat at once, then one per 50 ms, never faster; a loaded machine
     * may run the thread late, and the sleep may last longer than asked. */
    CHECK_MSG(v >= 2 && (double)v <= 2 + took / 0.05, "%llu beats in %.3f s", (unsigned long long)v, took);
    tp_shm_beat_stop(b);
    v = atomic_load(&counter);
    sleep_s(0.15);
    CHECK(atomic_load(&counter) == v);                  /* stopped for good */
}

/* TENSORPAR_HANG_TIMEOUT through tp_comm_options: the table's value, its
 * "0: no check" as a negative field, and what each field means. */
static tp_status env_hang(double *h)
{
    tp_comm_options o;
    tp_status st = tp_comm_options_from_env(&o);
    *h = tp_comm_hang_of(&o);
    return st;
}

static void test_hang_timeout_env(void)
{
    double h = -1;
    unsetenv("TENSORPAR_HANG_TIMEOUT"); tp_settings_reload();
    CHECK(env_hang(&h) == TP_OK && near(h, 2.0));
    setenv("TENSORPAR_HANG_TIMEOUT", "0.5", 1); tp_settings_reload();
    CHECK(env_hang(&h) == TP_OK && near(h, 0.5));
    setenv("TENSORPAR_HANG_TIMEOUT", "0", 1); tp_settings_reload();
    CHECK(env_hang(&h) == TP_OK && near(h, 0.0));
    setenv("TENSORPAR_HANG_TIMEOUT", "-1", 1); tp_settings_reload();
    CHECK(env_hang(&h) == TP_ERR_INVALID && strstr(tp_error(), "TENSORPAR_HANG_TIMEOUT"));
    setenv("TENSORPAR_HANG_TIMEOUT", "2s", 1); tp_settings_reload();
    CHECK(env_hang(&h) == TP_ERR_INVALID);
    unsetenv("TENSORPAR_HANG_TIMEOUT"); tp_settings_reload();
    tp_comm_options o = {0};
    CHECK(near(tp_comm_hang_of(&o), 2.0) && near(tp_comm_hang_of(NULL), 2.0));
    o.hang_timeout_s = 3;
    CHECK(near(tp_comm_hang_of(&o), 3.0));
    o.hang_timeout_s = -1;
    CHECK(near(tp_comm_hang_of(&o), 0.0));
}

int main(void)
{
    test_silence_rule();
    test_beat_thread();
    test_hang_timeout_env();
    return check_summary();
}
