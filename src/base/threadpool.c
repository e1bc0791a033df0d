/* A fixed pool of worker threads that run one parallel function at a time.
 *
 * The caller participates as thread 0, so a pool of size 1 has no workers
 * and costs nothing.  Between jobs a worker first spins on the job counter
 * for a short while (spin_s), then sleeps on a condition variable; the
 * caller waits for the workers the same way.  A decode step runs ~10
 * parallel regions per layer a few microseconds apart, and a condvar round
 * trip (futex wake, reschedule) costs tens of microseconds each time, so
 * the spin is what makes short regions worth threading.  But ranks may
 * outnumber cores, and a spinning idle thread steals the core another rank
 * computes on: the spin is bounded, and 0 (sleep at once) where the caller
 * says the threads outnumber the cores (tp_threadpool_set_spin).
 *
 * A region's parts (the thread indices 0..n-1) are claimed, not assigned:
 * a worker claims its own part when it sees the job, and the caller, once
 * its own part is done, claims and runs every part whose worker has not
 * started yet.  A worker whose core is busy elsewhere (another process, or
 * a virtual CPU the host has descheduled) then costs the region nothing
 * instead of holding the caller until it wakes; a late worker finds its
 * part taken and goes back to waiting.  Every part still runs exactly once,
 * with its own index, so results do not depend on which thread ran it.
 * tp_parallel_run_each keeps every part on its own thread (pinning).
 * tp_parallel_for adds dynamic chunks on top: a thread that has finished
 * its share takes the chunks the others have not reached. */
#include "tensorpar/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* The default spin: long enough to bridge the serial gaps between the
 * parallel regions of a forward pass (norms, rope, a small all-reduce),
 * short enough that an idle pool stops costing CPU within 0.1 ms. */
#define DEFAULT_SPIN_S 100e-6

struct tp_threadpool {
    int n;
    pthread_t *threads;
    _Atomic double spin_s;         /* seconds an idle thread spins before sleeping */
    /* The job: fn and ctx are written before generation is bumped (release)
     * and read after it is seen (acquire). */
    tp_parallel_fn fn;
    void *ctx;
    _Atomic uint64_t generation;   /* bumped for each job */
    /* Part p of job g is claimed by moving claim[p] from g - 1 to g, so a
     * claim is for one job only: a late worker cannot claim a later job's
     * part by mistake, nor run a part twice. */
    _Atomic uint64_t *claim;
    atomic_int pending;            /* parts 1..n-1 of the current job not yet done */
    atomic_int sleepers;           /* workers inside (or entering) the condvar wait */
    atomic_int caller_sleeps;      /* the caller waits on `done` */
    atomic_int stop;
    /* The sleeping side.  A waker bumps the counter it publishes, then looks
     * at the sleeper count; a sleeper counts itself, then re-checks the
     * counter under the mutex: with sequentially consistent atomics one of
     * the two sees the other, so no wake-up is lost. */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    /* Scratch lent to the caller between regions (tp_threadpool_scratch). */
    void *scratch;
    size_t scratch_bytes;
    struct tp_chunk_cursor *cursors;   /* tp_parallel_for's, one per thread */
};

/* One thread's share of tp_parallel_for's chunks: the next one and the end,
 * on a cache line of its own, since its owner updates it per chunk. */
typedef struct tp_chunk_cursor {
    _Alignas(64) _Atomic int64_t next;
    int64_t end;
} tp_chunk_cursor;

typedef struct { tp_threadpool *pool; int index; } worker_arg;

/* Runs part ti of the current job (generation gen) if nobody has claimed it
 * yet; returns whether it did.  The claim comes before reading fn and ctx:
 * while part ti is unclaimed the job cannot end, so they are this job's. */
static int run_part(tp_threadpool *pool, uint64_t gen, int ti)
{
    uint64_t expect = gen - 1;
    if (!atomic_compare_exchange_strong(&pool->claim[ti], &expect, gen)) return 0;
    pool->fn(pool->ctx, ti, pool->n);
    return 1;
}

/* Spins until generation != seen or stop, for at most spin_s seconds;
 * returns whether it saw the change. */
static int spin_for_job(tp_threadpool *pool, uint64_t seen)
{
    double spin_s = atomic_load_explicit(&pool->spin_s, memory_order_relaxed);
    if (spin_s <= 0) return 0;
    double deadline = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&pool->generation, memory_order_acquire) != seen ||
            atomic_load_explicit(&pool->stop, memory_order_relaxed))
            return 1;
        tp_cpu_relax();
        if ((i & 63) == 63) {   /* the clock costs ~20 ns: read it now and then */
            double now = tp_now();
            if (deadline == 0) deadline = now + spin_s;
            else if (now > deadline) return 0;
        }
    }
}

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    free(p);
    tp_threadpool *pool = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_for_job(pool, seen)) {
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (!atomic_load(&pool->stop) && atomic_load(&pool->generation) == seen)
                pthread_cond_wait(&pool->wake, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) break;
        seen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (!run_part(pool, seen, arg.index)) continue;   /* the caller ran it */
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeps)) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
    return NULL;
}

tp_status tp_threadpool_create(tp_threadpool **out, int nthreads)
{
    *out = NULL;
    if (nthreads < 1) nthreads = 1;
    tp_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return tp_fail(TP_ERR_NOMEM, "out of memory creating thread pool");
    pool->n = nthreads;
    /* One process alone: spin when its threads fit on the cores it may use. */
    atomic_init(&pool->spin_s, nthreads <= tp_cpu_count() ? DEFAULT_SPIN_S : 0.0);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_sleeps, 0);
    atomic_init(&pool->stop, 0);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    pool->claim = calloc((size_t)nthreads, sizeof *pool->claim);
    pool->cursors = aligned_alloc(64, (size_t)nthreads * sizeof *pool->cursors);
    if (!pool->threads || !pool->claim || !pool->cursors) {
        free(pool->threads);
        free(pool->claim);
        free(pool->cursors);
        free(pool);
        return tp_fail(TP_ERR_NOMEM, "out of memory creating thread pool");
    }
    for (int i = 0; i < nthreads; i++) atomic_init(&pool->claim[i], 0);
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

void tp_threadpool_set_spin(tp_threadpool *pool, double seconds)
{
    if (pool) atomic_store(&pool->spin_s, seconds > 0 ? seconds : 0.0);
}

void tp_threadpool_destroy(tp_threadpool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    free(pool->threads);
    free(pool->claim);
    free(pool->cursors);
    tp_free(pool->scratch);
    free(pool);
}

/* Kept across calls because a prefill runs ~200 GEMMs of a few sizes: a
 * fresh multi-MiB buffer per call pays a page fault per 4 KiB on first
 * touch; this one is faulted in once and then reused. */
void *tp_threadpool_scratch(tp_threadpool *pool, size_t bytes)
{
    if (!pool) return NULL;
    if (bytes > pool->scratch_bytes) {
        tp_free(pool->scratch);
        pool->scratch = tp_alloc(bytes);
        pool->scratch_bytes = pool->scratch ? bytes : 0;
    }
    return pool->scratch;
}

int tp_threadpool_size(const tp_threadpool *pool) { return pool ? pool->n : 1; }

/* Publishes the job, runs part 0, then (unless each) the parts no worker
 * has claimed, and waits for the rest. */
static void run_job(tp_threadpool *pool, tp_parallel_fn fn, void *ctx, int each)
{
    if (!pool || pool->n == 1) { fn(ctx, 0, 1); return; }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n - 1);
    uint64_t gen = atomic_fetch_add(&pool->generation, 1) + 1;   /* publishes fn, ctx, pending */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mu);
    }
    run_part(pool, gen, 0);
    if (!each)
        for (int p = 1; p < pool->n; p++)
            if (run_part(pool, gen, p)) atomic_fetch_sub(&pool->pending, 1);
    /* Wait for the workers: spin (they usually finish within the spin),
     * then sleep until the last one signals. */
    double deadline = 0, spin_s = atomic_load_explicit(&pool->spin_s, memory_order_relaxed);
    for (unsigned i = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; i++) {
        tp_cpu_relax();
        if ((i & 63) != 63) continue;
        double now = tp_now();
        if (deadline == 0) { deadline = now + spin_s; continue; }
        if (now <= deadline) continue;
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->caller_sleeps, 1);
        while (atomic_load(&pool->pending) > 0) pthread_cond_wait(&pool->done, &pool->mu);
        atomic_store(&pool->caller_sleeps, 0);
        pthread_mutex_unlock(&pool->mu);
        break;
    }
}

void tp_parallel_run(tp_threadpool *pool, tp_parallel_fn fn, void *ctx) { run_job(pool, fn, ctx, 0); }

void tp_parallel_run_each(tp_threadpool *pool, tp_parallel_fn fn, void *ctx) { run_job(pool, fn, ctx, 1); }

typedef struct {
    tp_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    tp_chunk_cursor *cur;
} for_job;

/* Thread ti's own chunks in order, then the others' that are left, each
 * from the front of its owner's remaining share. */
static void for_worker(void *p, int ti, int nt)
{
    const for_job *j = p;
    for (int o = 0; o < nt; o++) {
        tp_chunk_cursor *c = &j->cur[(ti + o) % nt];
        for (;;) {
            int64_t i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
            if (i >= c->end) break;
            int64_t b = i * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
            j->fn(j->ctx, b, e, ti);
        }
    }
}

void tp_parallel_for(tp_threadpool *pool, int64_t n, int64_t chunk, tp_range_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    int nt = tp_threadpool_size(pool);
    int64_t chunks = (n + chunk - 1) / chunk;
    if (nt == 1 || chunks == 1) { fn(ctx, 0, n, 0); return; }
    for (int t = 0; t < nt; t++) {
        int64_t b, e;
        tp_split_range(chunks, t, nt, &b, &e);
        atomic_store_explicit(&pool->cursors[t].next, b, memory_order_relaxed);
        pool->cursors[t].end = e;
    }
    for_job j = {fn, ctx, n, chunk, pool->cursors};
    run_job(pool, for_worker, &j, 0);   /* publishing the job publishes the cursors */
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
