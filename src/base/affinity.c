/* Pinning a rank's threads to cores.  Ranks on one host that float freely
 * share caches badly and get migrated onto each other's cores by the
 * scheduler; with N ranks of T threads, rank r's threads take the r-th run
 * of T cores, so that neighbouring ranks never compete for a core unless
 * there are more threads than cores. */
#include "tensorpar/base.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

/* The CPUs this process may run on (its affinity mask, which a container's
 * cpuset narrows), in increasing order; returns their count. */
static int allowed_cpus(int *cpus, int cap)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
        if (CPU_ISSET(c, &set)) cpus[n++] = c;
    return n;
}

int tp_cpu_count(void)
{
    int cpus[CPU_SETSIZE];
    int n = allowed_cpus(cpus, CPU_SETSIZE);
    return n > 0 ? n : 1;
}

typedef struct {
    int cpus[CPU_SETSIZE];
    int ncpus, first;
    int failed[CPU_SETSIZE];   /* per thread: errno of pthread_setaffinity_np */
} pin_job;

static int pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void pin_worker(void *p, int ti, int nt)
{
    (void)nt;
    pin_job *j = p;
    j->failed[ti % CPU_SETSIZE] = pin_to(j->cpus[(j->first + ti) % j->ncpus]);
}

tp_status tp_pin_thread(int index)
{
    int cpus[CPU_SETSIZE];
    int n = allowed_cpus(cpus, CPU_SETSIZE);
    if (n <= 0) return tp_fail(TP_ERR_INTERNAL, "sched_getaffinity: %s", strerror(errno));
    int err = pin_to(cpus[(index < 0 ? 0 : index) % n]);
    return err ? tp_fail(TP_ERR_INTERNAL, "pthread_setaffinity_np: %s", strerror(err)) : TP_OK;
}

tp_status tp_threadpool_pin(tp_threadpool *pool, int first)
{
    pin_job j;
    j.ncpus = allowed_cpus(j.cpus, CPU_SETSIZE);
    if (j.ncpus <= 0) return tp_fail(TP_ERR_INTERNAL, "sched_getaffinity: %s", strerror(errno));
    j.first = first < 0 ? 0 : first % j.ncpus;
    memset(j.failed, 0, sizeof j.failed);
    /* Every thread of the pool (the caller is thread 0) pins itself. */
    tp_parallel_run_each(pool, pin_worker, &j);
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (j.failed[i]) return tp_fail(TP_ERR_INTERNAL, "pthread_setaffinity_np: %s", strerror(j.failed[i]));
    return TP_OK;
}
