/* The checks of the test workers that count them (worker_rowloss,
 * worker_vploss, worker_optim): EXPECT counts a check and prints a failed
 * one with its line; worker_mesh_main is the whole main of a worker that runs
 * its cases on a 1-D mesh of every rank.  Each worker is one translation
 * unit, so the counters are its own; the including file defines `prog`. */
#ifndef TP_WORKER_CHECK_H
#define TP_WORKER_CHECK_H

#include "worker_args.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"

#include <stdint.h>

static long checks, failures;

#define EXPECT(cond, ...) do { \
    checks++; \
    if (!(cond)) { failures++; fprintf(stderr, "%s: line %d: ", prog, __LINE__); \
                   fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

/* Parses --seed (dflt_seed when not given), joins the job as a 1-D "tp" mesh
 * of every rank, runs run(mesh, pool of 3 threads, seed), meets the other
 * ranks at a barrier and prints "PROG: rank R of P: N checks, F failed".
 * Returns main's status: 0, 1 (a failed check or call) or 2 (usage). */
static inline int worker_mesh_main(const char *name, int argc, char **argv, double dflt_seed,
                                   void (*run)(tp_mesh *mesh, tp_threadpool *pool, uint64_t seed))
{
    enum { SEED, NOPTS };
    worker_opt o[NOPTS] = {{"--seed", 1, NULL}};
    double seed;
    if (worker_parse(name, argc, argv, o, NOPTS) || worker_number(name, &o[SEED], dflt_seed, &seed)) return 2;
    tp_group *world;
    tp_mesh *mesh;
    tp_threadpool *pool;
    if (tp_comm_init(&world, NULL)) return fprintf(stderr, "%s: %s\n", name, tp_error()), 1;
    if (tp_mesh_new_1d(world, "tp", &mesh)) return fprintf(stderr, "%s: %s\n", name, tp_error()), 1;
    if (tp_threadpool_create(&pool, 3)) return fprintf(stderr, "%s: %s\n", name, tp_error()), 1;
    run(mesh, pool, (uint64_t)seed);
    int rc = tp_comm_barrier(world) ? 1 : 0;
    printf("%s: rank %d of %d: %ld checks, %ld failed\n", name, tp_mesh_coord(mesh, 0), tp_mesh_size(mesh, 0),
           checks, failures);
    tp_threadpool_destroy(pool);
    tp_mesh_free(mesh);
    tp_group_free(world);
    return rc || failures ? 1 : 0;
}

#endif
