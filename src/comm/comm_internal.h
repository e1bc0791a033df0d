/* Internal interface between comm.c (the public group API) and the backends.
 *
 * comm.c validates arguments, turns the equal-count collectives into their
 * "v" forms and guards against a group being used after a failure; each
 * backend implements only the general forms below. */
#ifndef TP_COMM_INTERNAL_H
#define TP_COMM_INTERNAL_H

#include "tensorpar/comm.h"

#include <stdint.h>

typedef struct tp_comm_ops {
    const char *name;
    tp_status (*all_reduce)(tp_group *g, const void *send, void *recv, size_t count,
                            tp_dtype dt, tp_reduce_op op);
    tp_status (*all_gatherv)(tp_group *g, const void *send, void *recv,
                             const size_t *counts, tp_dtype dt);
    tp_status (*reduce_scatterv)(tp_group *g, const void *send, void *recv,
                                 const size_t *counts, tp_dtype dt, tp_reduce_op op);
    /* NULL: tp_comm_all_reduce_rows_steps (reduce-scatter, fn, all-gather). */
    tp_status (*all_reduce_rows)(tp_group *g, const float *send, float *recv, const size_t *row_counts,
                                 size_t row_len, tp_comm_rows_fn fn, void *ctx);
    tp_status (*broadcast)(tp_group *g, void *buf, size_t bytes, int root);
    tp_status (*barrier)(tp_group *g);
    tp_status (*all_to_allv)(tp_group *g, const void *send, const size_t *send_counts,
                             void *recv, const size_t *recv_counts, tp_dtype dt);
    /* dst < 0: nothing to send; src < 0: nothing to receive.  Byte counts. */
    tp_status (*sendrecv)(tp_group *g, const void *send, size_t send_bytes, int dst,
                          void *recv, size_t recv_bytes, int src);
    /* Fills child->impl for the sub-group whose members (parent ranks) are
     * given; child's rank, size and global ranks are already set. */
    tp_status (*new_sub)(tp_group *parent, const int *ranks, int n, tp_group *child);
    void (*free)(tp_group *g);
} tp_comm_ops;

struct tp_group {
    const tp_comm_ops *ops;
    tp_backend backend;
    int rank, size;
    int *global;            /* global rank of each group rank               */
    int local_rank, local_size;
    double timeout_s;
    int failed;             /* a collective failed: the group is unusable    */
    void *impl;             /* backend state                                 */
};

/* The shm backend's sizes in bytes, from tp_shm_options
 * (tp_shm_settings_of): only a segment's creator uses them, and the ranks
 * take them from its header, so all ranks of a job agree. */
typedef struct {
    size_t slot_bytes;      /* shm.slot_kb                                   */
    size_t oneshot_max;     /* shm.oneshot_max_kb                            */
    uint64_t cma_min;       /* shm.cma, shm.cma_min_kb; UINT64_MAX: no CMA   */
} tp_shm_settings;

/* The job as tp_comm_init sees it: the options resolved (an unset field is
 * its default) and the layout read from the environment (rendezvous.c). */
typedef struct {
    tp_backend backend;
    int rank, world_size, local_rank, local_size;
    double timeout_s;
    double hang_s;          /* TENSORPAR_HANG_TIMEOUT (shm, mpi); 0: off     */
    char rendezvous[200];   /* "" when none is known                        */
    int shm_fd;             /* segment inherited from the launcher, or -1    */
    tp_shm_settings shm;    /* for a segment this process creates            */
} tp_comm_env;

/* tp_comm_all_reduce_rows from the backend's reduce_scatterv and
 * all_gatherv, for any backend. */
tp_status tp_comm_all_reduce_rows_steps(tp_group *g, const float *send, float *recv, const size_t *row_counts,
                                        size_t row_len, tp_comm_rows_fn fn, void *ctx);

tp_status tp_comm_env_read(tp_comm_env *e, const tp_comm_options *opts);
/* A 64-bit FNV-1a hash, used to name things every rank must agree on. */
uint64_t tp_comm_hash(const void *data, size_t n, uint64_t seed);

/* Backend constructors: fill g (ops, impl, local ranks) for the world. */
tp_status tp_comm_self_init(tp_group *g);
tp_status tp_comm_shm_init(tp_group *g, const tp_comm_env *e);
tp_status tp_comm_mpi_init(tp_group *g, const tp_comm_env *e);

/* Ordered reduction (reduce.c): dst[i] = op(srcs[0][i], ..., srcs[n-1][i]),
 * folded left to right in the accumulation type; dst may alias any src. */
void tp_comm_reduce_ordered(void *dst, const void *const *srcs, int n, size_t count,
                            tp_dtype dt, tp_reduce_op op);
int tp_comm_reducible(tp_dtype dt);

/* The name of the segment for a rendezvous ("/tensorpar-<uid>-<name>"). */
void tp_shm_segment_name(char *buf, size_t cap, const char *rendezvous);
/* Creates and initialises the world segment for n ranks under `name`,
 * returning its descriptor (the launcher unlinks the name at once and hands
 * the descriptor to its children). */
tp_status tp_shm_segment_create(const char *rendezvous, int n, const tp_shm_settings *cfg, int *fd_out);
/* What the options mean (comm_options.c); o NULL means every default.
 * The shm sizes in bytes, refusing a field out of its range: */
tp_status tp_shm_settings_of(const tp_shm_options *o, tp_shm_settings *out);
/* A collective's wait in seconds: */
double tp_comm_timeout_of(const tp_comm_options *o);
/* Seconds a rank's heartbeat may be silent before it counts as stopped
 * responding; 0: no check. */
double tp_comm_hang_of(const tp_comm_options *o);

/* A thread that calls fn(arg) at once and then every period_s until
 * stopped (periodic.c); `what` names it in an error. */
typedef struct tp_periodic tp_periodic;
tp_status tp_periodic_start(double period_s, void (*fn)(void *), void *arg, const char *what, tp_periodic **out);
/* Stops it (waking it at once) and waits for it. */
void tp_periodic_stop(tp_periodic *p);

/* Waiting for peers, both backends (wait.c).  A waiting rank pauses with
 * a tp_backoff: spin until spin_s, then yield until yield_s, then sleep a
 * growing interval; tp_wait_limits gives those two for ranks_here ranks on
 * this host. */
#define TP_WAIT_CHECK_S 0.05    /* how often a waiting rank looks at its peers */
typedef struct {
    double start, next_check, spin_s, yield_s;
    long iter, sleep_ns;
} tp_backoff;

void tp_wait_limits(int ranks_here, double *spin_s, double *yield_s);
void tp_backoff_init(tp_backoff *b, double spin_s, double yield_s);
/* Pauses once.  Every 64th call it reads the clock: returns 1 with *now
 * set; else 0 (a cheap pause, *now untouched). */
int tp_backoff_pause(tp_backoff *b, double *now);
/* 1 once every TP_WAIT_CHECK_S: time to look at the peers. */
int tp_backoff_check_due(tp_backoff *b, double now);

/* The silence rule, for both backends' heartbeats: how long a watcher has
 * seen a counter stand still. */
typedef struct {
    int who;                        /* whose counter                       */
    uint64_t seen;                  /* its value since `since`             */
    double since, last;             /* first and latest look at that value */
} tp_silence;

void tp_silence_init(tp_silence *s, double now);
/* Seconds that `who`'s counter has shown `value`, as seen by this watcher
 * while it was running itself (a long gap between two looks restarts it). */
double tp_silence_seconds(tp_silence *s, int who, uint64_t value, double now);

/* Liveness (shm_heartbeat.c).  A rank's heartbeat thread: */
typedef struct tp_shm_beat tp_shm_beat;
/* The launcher's view of the ranks' slots in the segment `fd`: */
typedef struct tp_shm_watch tp_shm_watch;
tp_status tp_shm_watch_open(int fd, int n, tp_shm_watch **out);
void tp_shm_watch_close(tp_shm_watch *w);
/* Records a rank's pid as soon as it is forked. */
void tp_shm_watch_announce(tp_shm_watch *w, int rank, int pid);
/* How long the rank's heartbeat has been silent; before the rank beats and
 * after it left the job, how long the launcher's child `pid` (the rank, or
 * a wrapper that runs it) has been stopped. */
double tp_shm_watch_silent(tp_shm_watch *w, int rank, int pid, double now);

#endif
