/* worker_rowloss: the rank program of tests/e2e/test_row_parallel_loss.py.
 *
 * Run as every rank of a job (`tensorpar launch -n P -- worker_rowloss`).
 * For each case every rank draws the same full logits [T, V] and labels
 * from the seed and computes tp_cross_entropy on them (what one rank
 * computes), then takes its vocabulary shard (tp_chunk_range's columns,
 * Shard(1)) and runs tp_cross_entropy_row_parallel on it in place: the
 * loss must be the reference's very bits and the shard's gradient the very
 * bits of the reference gradient's columns, with and without a thread pool.
 * Cases: T not divisible by P, T < P (ranks without rows), V not divisible
 * by P, several blocks of 64 rows per rank with whole blocks labelled -100,
 * large logits, every row ignored.
 *
 * Prints per rank:  worker_rowloss: rank R of P: N checks, F failed
 * and per case:     loss <case> <%a of the loss>   (the same on every rank) */
#include "worker_check.h"
#include "tensorpar/comm.h"
#include "tensorpar/kernels.h"
#include "tensorpar/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "worker_rowloss";

typedef struct {
    const char *name;
    int64_t T, V;
    double scale, offset;     /* logits ~ offset + scale·N(0, 1) */
    double ignore;            /* share of rows labelled -100 */
    int64_t ignore_to;        /* rows [0, ignore_to) labelled -100 as well */
} rl_case;

static const rl_case cases[] = {
    {"uneven", 7, 1001, 3.0, 0.0, 0.3, 0},
    {"fewer_rows_than_ranks", 3, 50, 2.0, 0.0, 0.0, 0},
    {"blocks", 300, 257, 2.0, 0.0, 0.1, 140},   /* > 64·P rows; the first block(s) all ignored */
    {"large_logits", 70, 129, 4.0, 1000.0, 0.2, 0},
    {"all_ignored", 9, 40, 1.0, 0.0, 1.0, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    return p;
}

/* 1 when the shard [T, Vl] is the columns [v0, v0 + Vl) of full, bit for bit. */
static int same_columns(const float *shard, const float *full, int64_t T, int64_t V, int64_t v0, int64_t Vl)
{
    for (int64_t t = 0; t < T; t++)
        if (memcmp(shard + t * Vl, full + t * V + v0, (size_t)Vl * sizeof(float))) return 0;
    return 1;
}

static void run_case(const rl_case *c, const tp_mesh *mesh, tp_threadpool *pool, uint64_t seed)
{
    int P = tp_mesh_size(mesh, 0), r = tp_mesh_coord(mesh, 0);
    int64_t T = c->T, V = c->V, v0, Vl, counted = 0;
    tp_chunk_range(V, P, r, &v0, &Vl);
    tp_rng rng;
    tp_rng_seed(&rng, seed);
    float *full = xmalloc((size_t)(T * V) * sizeof(float)), *dref = xmalloc((size_t)(T * V) * sizeof(float));
    int64_t *labels = xmalloc((size_t)T * sizeof(int64_t));
    for (int64_t i = 0; i < T * V; i++) full[i] = (float)(c->offset + c->scale * tp_rng_normal(&rng));
    for (int64_t t = 0; t < T; t++) {
        int64_t y = (int64_t)(tp_rng_uniform(&rng) * (double)V);
        labels[t] = tp_rng_uniform(&rng) < c->ignore || t < c->ignore_to ? TP_IGNORE_INDEX : y;
        counted += labels[t] != TP_IGNORE_INDEX;
    }
    /* As with gradient accumulation: the count is the whole batch's. */
    double count = (double)(2 * counted + 3), ref = NAN;
    EXPECT(!tp_cross_entropy(&ref, dref, full, labels, T, V, count, NULL), "%s: reference: %s", c->name, tp_error());

    float *shard = xmalloc((size_t)(T * Vl) * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t t = 0; t < T; t++) memcpy(shard + t * Vl, full + t * V + v0, (size_t)Vl * sizeof(float));
        double loss = NAN;
        EXPECT(!tp_cross_entropy_row_parallel(&loss, shard, labels, T, V, count, mesh, pass ? pool : NULL),
               "%s: %s", c->name, tp_error());
        EXPECT(loss == ref, "%s (pool %d): loss %a, one rank's %a", c->name, pass, loss, ref);
        EXPECT(same_columns(shard, dref, T, V, v0, Vl), "%s (pool %d): the gradient of columns [%lld, +%lld) is "
               "not one rank's", c->name, pass, (long long)v0, (long long)Vl);
        if (!pass) printf("loss %s %a\n", c->name, loss);
    }
    if (c->ignore >= 1.0) EXPECT(ref == 0, "%s: loss %g with every row ignored", c->name, ref);

    /* A label outside the vocabulary fails on every rank, before any move. */
    int64_t saved = labels[0];
    labels[0] = V;
    double dummy;
    EXPECT(tp_cross_entropy_row_parallel(&dummy, shard, labels, T, V, count, mesh, NULL) == TP_ERR_INVALID
           && strstr(tp_error(), "outside"), "%s: a label of V was not refused: %s", c->name, tp_error());
    labels[0] = saved;
    free(full), free(dref), free(labels), free(shard);
}

static void run_cases(tp_mesh *mesh, tp_threadpool *pool, uint64_t seed)
{
    for (int i = 0; i < NCASES; i++) run_case(&cases[i], mesh, pool, seed + (uint64_t)i);
}

int main(int argc, char **argv)
{
    return worker_mesh_main(prog, argc, argv, 11, run_cases);
}
