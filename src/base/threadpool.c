/* A fixed pool of worker threads that run one parallel function at a time.
 *
 * The caller participates as thread 0, so a pool of size 1 has no workers
 * and costs nothing.  Workers wait on a condition variable between jobs:
 * ranks may outnumber cores, and spinning idle threads would steal the
 * cores that other ranks compute on. */
#include "tensorpar/base.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct tp_threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;   /* bumped for each job */
    int pending;           /* workers still running the current job */
    int stop;
    tp_parallel_fn fn;
    void *ctx;
};

typedef struct { tp_threadpool *pool; int index; } worker_arg;

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    free(p);
    tp_threadpool *pool = arg.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->stop) break;
        seen = pool->generation;
        tp_parallel_fn fn = pool->fn;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->mu);
        fn(ctx, arg.index, pool->n);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

tp_status tp_threadpool_create(tp_threadpool **out, int nthreads)
{
    *out = NULL;
    if (nthreads < 1) nthreads = 1;
    tp_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return tp_fail(TP_ERR_NOMEM, "out of memory creating thread pool");
    pool->n = nthreads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!pool->threads) { free(pool); return tp_fail(TP_ERR_NOMEM, "out of memory creating thread pool"); }
    for (int i = 1; i < nthreads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) { arg->pool = pool; arg->index = i; }
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n = i;   /* destroy joins only the threads that exist */
            tp_threadpool_destroy(pool);
            return tp_fail(TP_ERR_INTERNAL, "could not start worker thread %d", i);
        }
    }
    *out = pool;
    return TP_OK;
}

void tp_threadpool_destroy(tp_threadpool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    free(pool->threads);
    free(pool);
}

int tp_threadpool_size(const tp_threadpool *pool) { return pool ? pool->n : 1; }

void tp_parallel_run(tp_threadpool *pool, tp_parallel_fn fn, void *ctx)
{
    if (!pool || pool->n == 1) { fn(ctx, 0, 1); return; }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->pending = pool->n - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    fn(ctx, 0, pool->n);
    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

void tp_split_range(int64_t n, int ti, int nt, int64_t *begin, int64_t *end)
{
    int64_t chunk = n / nt, extra = n % nt;
    *begin = ti * chunk + (ti < extra ? ti : extra);
    *end = *begin + chunk + (ti < extra ? 1 : 0);
}

double tp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
