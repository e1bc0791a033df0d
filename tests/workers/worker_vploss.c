/* worker_vploss: the rank program of tests/e2e/test_vocab_parallel_loss.py.
 *
 * Run as every rank of a job (`tensorpar launch -n P -- worker_vploss`).
 * For each case (vocabularies not divisible by P, one smaller than P so a
 * shard is empty, large logits, ignored rows, a row set that is all
 * ignored) every rank draws the same full logits [T, V] and labels from the
 * seed, computes tp_cross_entropy on them as the reference, takes its
 * vocabulary shard (tp_chunk_range) and runs
 * tp_cross_entropy_vocab_parallel on it: the loss and this rank's gradient
 * columns must equal the reference within 1e-6 relative, in place and with
 * a thread pool too; without a mesh, on the full logits, the bits of
 * tp_cross_entropy.
 *
 * Memory: this program is linked with -Wl,--wrap for malloc, calloc,
 * realloc, posix_memalign and free (tests/CMakeLists.txt), so every
 * allocation of the library (dist's and comm's included) passes through the
 * counters below; the peak of live bytes during the call, over the bytes
 * live before it, is what the loss step allocated.  It must be the
 * documented scratch (O(T·P)) plus at most a little of dist's, and the
 * whole step (the caller's [T, V_local] logits, in place, plus that peak)
 * at most 1/P of the gathered step's (the same logits all-gathered to
 * [T, V] through tp_redistribute_local, then tp_cross_entropy in place).
 *
 * Prints per rank:  worker_vploss: rank R of P: N checks, F failed
 * and per case:     loss <case> <%a of the loss>   (the same on every rank)
 *                   err <case> <loss rel. error> <gradient rel. error>
 *                   mem <case> <vp bytes> <gathered bytes> */
#include "worker_check.h"
#include "tensorpar/comm.h"
#include "tensorpar/kernels.h"
#include "tensorpar/train.h"

#include <malloc.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "worker_vploss";

/* ---- allocation counters (the --wrap targets) --------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t sz);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void __real_free(void *p);

static _Atomic long long live_bytes, peak_bytes;

static void count_in(void *p)
{
    if (!p) return;
    long long now = atomic_fetch_add(&live_bytes, (long long)malloc_usable_size(p)) + (long long)malloc_usable_size(p);
    long long pk = atomic_load(&peak_bytes);
    while (now > pk && !atomic_compare_exchange_weak(&peak_bytes, &pk, now)) {}
}

static void count_out(void *p)
{
    if (p) atomic_fetch_sub(&live_bytes, (long long)malloc_usable_size(p));
}

void *__wrap_malloc(size_t n)
{
    void *p = __real_malloc(n);
    count_in(p);
    return p;
}

void *__wrap_calloc(size_t n, size_t sz)
{
    void *p = __real_calloc(n, sz);
    count_in(p);
    return p;
}

void *__wrap_realloc(void *old, size_t n)
{
    count_out(old);
    void *p = __real_realloc(old, n);
    count_in(p ? p : (n ? old : NULL));   /* a failed realloc keeps old */
    return p;
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    int rc = __real_posix_memalign(p, align, n);
    if (!rc) count_in(*p);
    return rc;
}

void __wrap_free(void *p)
{
    count_out(p);
    __real_free(p);
}

/* Starts a window; returns the bytes live at its start. */
static long long window_begin(void)
{
    long long now = atomic_load(&live_bytes);
    atomic_store(&peak_bytes, now);
    return now;
}

static long long window_peak(long long start) { return atomic_load(&peak_bytes) - start; }

/* ---- the cases ------------------------------------------------------------ */

typedef struct {
    const char *name;
    int64_t T, V;
    double scale, offset;   /* logits ~ offset + scale·N(0, 1) */
    double ignore;          /* share of rows labelled -100 */
} vp_case;

static const vp_case cases[] = {
    {"uneven", 9, 1001, 3.0, 0.0, 0.3},
    {"tiny_vocab", 5, 3, 2.0, 0.0, 0.2},      /* V < P at P = 4: an empty shard */
    {"large_logits", 6, 257, 4.0, 1000.0, 0.2},
    {"all_ignored", 4, 50, 1.0, 0.0, 1.0},
    {"memory", 64, 4099, 2.0, 0.0, 0.1},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    return p;
}

static double max_abs(const float *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* max |a - b| over this rank's columns, relative to max |full ref|. */
static double grad_err(const float *local, const float *ref_full, int64_t T, int64_t V, int64_t v0, int64_t Vl)
{
    double m = 0, scale = max_abs(ref_full, T * V);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < Vl; i++) {
            double d = fabs((double)local[t * Vl + i] - ref_full[t * V + v0 + i]);
            if (d > m) m = d;
        }
    return scale > 0 ? m / scale : m;
}

/* The gathered loss step, for the memory comparison: the shard all-gathered
 * to [T, V], the loss in place, this rank's columns copied back. */
static tp_status gathered_step(const tp_mesh *mesh, float *local, const int64_t *labels, int64_t T, int64_t V,
                               int64_t v0, int64_t Vl, double count, double *loss)
{
    int64_t shape[2] = {T, V};
    tp_placement sh = tp_shard(1), rep = tp_replicate();
    float *full = malloc((size_t)(T * V) * sizeof(float));
    if (!full) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status st = tp_redistribute_local(mesh, TP_F32, 2, shape, &sh, local, &rep, full);
    if (!st) st = tp_cross_entropy(loss, full, full, labels, T, V, count, NULL);
    for (int64_t t = 0; !st && t < T; t++) memcpy(local + t * Vl, full + t * V + v0, (size_t)Vl * sizeof(float));
    free(full);
    return st;
}

static void run_case(const vp_case *c, const tp_mesh *mesh, tp_threadpool *pool, uint64_t seed)
{
    int P = tp_mesh_size(mesh, 0), r = tp_mesh_coord(mesh, 0);
    int64_t T = c->T, V = c->V, v0, Vl;
    tp_chunk_range(V, P, r, &v0, &Vl);
    tp_rng rng;
    tp_rng_seed(&rng, seed);
    float *full = xmalloc((size_t)(T * V) * sizeof(float)), *dref = xmalloc((size_t)(T * V) * sizeof(float));
    int64_t *labels = xmalloc((size_t)T * sizeof(int64_t)), counted = 0;
    for (int64_t i = 0; i < T * V; i++) full[i] = (float)(c->offset + c->scale * tp_rng_normal(&rng));
    for (int64_t t = 0; t < T; t++) {
        int64_t y = (int64_t)(tp_rng_uniform(&rng) * (double)V);
        labels[t] = tp_rng_uniform(&rng) < c->ignore ? TP_IGNORE_INDEX : y;
        counted += labels[t] != TP_IGNORE_INDEX;
    }
    /* As with gradient accumulation: the count is the whole batch's. */
    double count = (double)(2 * counted + 3), ref;
    EXPECT(!tp_cross_entropy(&ref, dref, full, labels, T, V, count, NULL), "%s: reference: %s", c->name, tp_error());

    float *local = xmalloc((size_t)(T * Vl) * sizeof(float)), *dl = xmalloc((size_t)(T * Vl) * sizeof(float));
    float *work = xmalloc((size_t)(T * Vl) * sizeof(float));
    for (int64_t t = 0; t < T; t++) memcpy(local + t * Vl, full + t * V + v0, (size_t)Vl * sizeof(float));
    double loss = NAN, loss_in = NAN, loss_pool = NAN, loss_only = NAN;
    EXPECT(!tp_cross_entropy_vocab_parallel(&loss, dl, local, labels, T, V, count, mesh, NULL),
           "%s: %s", c->name, tp_error());
    double tol = 1e-6 * (fabs(ref) > 1e-300 ? fabs(ref) : 1.0);
    EXPECT(fabs(loss - ref) <= tol, "%s: loss %.17g, reference %.17g", c->name, loss, ref);
    if (c->ignore >= 1.0) EXPECT(loss == 0 && max_abs(dl, T * Vl) == 0, "%s: loss %g with every row ignored",
                                 c->name, loss);
    double err = grad_err(dl, dref, T, V, v0, Vl);
    EXPECT(err <= 1e-6, "%s: gradient columns [%lld, +%lld): relative error %.3g", c->name, (long long)v0,
           (long long)Vl, err);
    printf("loss %s %a\n", c->name, loss);
    printf("err %s %.3g %.3g\n", c->name, fabs(loss - ref) / (fabs(ref) > 1e-300 ? fabs(ref) : 1.0), err);

    /* Without a mesh, on the full logits: tp_cross_entropy's very bits (the
     * same sums in the same order). */
    float *dfull = xmalloc((size_t)(T * V) * sizeof(float));
    double loss_full = NAN;
    EXPECT(!tp_cross_entropy_vocab_parallel(&loss_full, dfull, full, labels, T, V, count, NULL, NULL)
           && loss_full == ref && !memcmp(dfull, dref, (size_t)(T * V) * sizeof(float)),
           "%s: without a mesh: loss %.17g against %.17g, or the gradient differs", c->name, loss_full, ref);
    free(dfull);

    /* In place (dlogits = logits), loss only, and over a pool: same bits. */
    memcpy(work, local, (size_t)(T * Vl) * sizeof(float));
    long long start = window_begin();
    EXPECT(!tp_cross_entropy_vocab_parallel(&loss_in, work, work, labels, T, V, count, mesh, NULL),
           "%s: in place: %s", c->name, tp_error());
    long long vp_peak = window_peak(start);
    EXPECT(loss_in == loss && !memcmp(work, dl, (size_t)(T * Vl) * sizeof(float)), "%s: in place differs", c->name);
    EXPECT(!tp_cross_entropy_vocab_parallel(&loss_only, NULL, local, labels, T, V, count, mesh, NULL)
           && loss_only == loss, "%s: loss only: %g against %g", c->name, loss_only, loss);
    memset(work, 0, (size_t)(T * Vl) * sizeof(float));
    EXPECT(!tp_cross_entropy_vocab_parallel(&loss_pool, work, local, labels, T, V, count, mesh, pool)
           && loss_pool == loss && !memcmp(work, dl, (size_t)(T * Vl) * sizeof(float)),
           "%s: over the pool: loss %g against %g, or the gradient differs", c->name, loss_pool, loss);

    /* Memory: the vocab-parallel step against the gathered one. */
    long long scratch = (long long)tp_cross_entropy_vocab_parallel_scratch(T, P);
    EXPECT(vp_peak >= scratch, "%s: measured %lld bytes, less than the scratch of %lld", c->name, vp_peak, scratch);
    /* dist may stage a move through one buffer of its size: at most twice. */
    EXPECT(vp_peak <= 2 * scratch + 4096, "%s: the loss allocated %lld bytes, more than O(T·P) (%lld)", c->name,
           vp_peak, scratch);
    memcpy(work, local, (size_t)(T * Vl) * sizeof(float));
    double loss_g;
    start = window_begin();
    EXPECT(!gathered_step(mesh, work, labels, T, V, v0, Vl, count, &loss_g), "%s: gathered: %s", c->name,
           tp_error());
    long long g_peak = window_peak(start);
    long long shard = T * Vl * (long long)sizeof(float);
    EXPECT(g_peak >= T * V * (long long)sizeof(float), "%s: the gathered step allocated %lld bytes", c->name, g_peak);
    if (!strcmp(c->name, "memory"))
        EXPECT((shard + vp_peak) * P <= shard + g_peak, "%s: vocab-parallel step %lld bytes, gathered %lld at P=%d",
               c->name, shard + vp_peak, shard + g_peak, P);
    printf("mem %s %lld %lld\n", c->name, shard + vp_peak, shard + g_peak);

    /* A label outside the vocabulary fails on every rank, before any move. */
    int64_t saved = labels[0];
    labels[0] = V;
    double dummy;
    EXPECT(tp_cross_entropy_vocab_parallel(&dummy, dl, local, labels, T, V, count, mesh, NULL) == TP_ERR_INVALID
           && strstr(tp_error(), "outside"), "%s: a label of V was not refused: %s", c->name, tp_error());
    labels[0] = saved;
    free(full), free(dref), free(labels), free(local), free(dl), free(work);
}

static void run_cases(tp_mesh *mesh, tp_threadpool *pool, uint64_t seed)
{
    for (int i = 0; i < NCASES; i++) run_case(&cases[i], mesh, pool, seed + (uint64_t)i);
}

int main(int argc, char **argv)
{
    return worker_mesh_main(prog, argc, argv, 7, run_cases);
}
