/* tensorpar/comm.h — process groups, collectives and the launcher.
 *
 * One OS process per rank.  A tp_group is an ordered set of ranks that run
 * collectives together; the world group holds every rank of the job, and
 * sub-groups (one per mesh dimension: the tp ranks, the dp ranks, ...) are
 * made from it.  Three backends sit behind the same interface:
 *
 *   shm   processes on one host (the default there): one POSIX shared-memory
 *         segment per job, a slot per rank, sequence counters, no locks;
 *   mpi   OpenMPI (the default under mpirun), a sub-communicator per group;
 *   self  a single rank; every collective is a copy.
 *
 * Semantics shared by every backend (tp-semantics.md §1.4, §5.4):
 *   - Every rank of a group calls the same collectives in the same order with
 *     the same counts, dtype and root; buffers are host memory.
 *   - Reductions sum each element in ascending group-rank order
 *     (x_0 + x_1 + ... + x_{n-1}), in f32 for bf16/f16 and in the element
 *     type otherwise, rounded once at the end.  Every rank therefore receives
 *     bitwise identical results, whatever the backend, message size or timing.
 *   - Counts are element counts; zero is allowed everywhere.  "v" variants
 *     take one count per group rank (uneven torch.chunk shards, including
 *     empty ones); pieces are laid out contiguously in rank order.
 *   - send == recv (in place) is allowed for all_reduce; for the gathers and
 *     scatters the buffers must not overlap.
 *   - tp_comm_init is called once per process, and the comm API is used by
 *     one thread at a time (the rank's main thread, typically).
 *   - Point-to-point messages between two processes are matched in issue
 *     order, whatever group they were sent through.
 *   - A dead or silent peer makes the collective fail within seconds with
 *     TP_ERR_COMM or TP_ERR_TIMEOUT and a message naming the global rank;
 *     a group that failed must not be used again except to free it.
 *
 * The job's layout comes from the environment the launcher (or mpirun)
 * gives each rank, when the options leave rank and world_size unset:
 *   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE   torchrun-style layout
 *   MASTER_ADDR, MASTER_PORT names the job when no rendezvous is given
 *   OMPI_COMM_WORLD_RANK...  set by mpirun: the mpi backend is the default
 * The TENSORPAR_* settings (backend, timeouts, the shm sizes, the
 * launcher's rendezvous and segment) are fields of tp_comm_options, which
 * tp_comm_options_from_env fills from the settings table.
 */
#ifndef TENSORPAR_COMM_H
#define TENSORPAR_COMM_H

#include "tensorpar/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_group tp_group;

/* ---- backends and initialisation -------------------------------------- */

typedef enum {
    TP_BACKEND_AUTO = 0,  /* env TENSORPAR_BACKEND, else mpi under mpirun,
                             else shm when WORLD_SIZE > 1, else self       */
    TP_BACKEND_SELF,
    TP_BACKEND_SHM,
    TP_BACKEND_MPI
} tp_backend;

/* "self", "shm", "mpi" ("auto" for TP_BACKEND_AUTO). */
const char *tp_backend_name(tp_backend b);
/* Parses "shm" | "mpi" | "self" | "auto". */
tp_status tp_backend_parse(const char *s, tp_backend *out);
/* 1 if this build has the backend (mpi may be compiled out). */
int tp_backend_available(tp_backend b);

/* The shm backend's sizes (experiments; the defaults are measured).  Only
 * the process that creates a job's segment (the launcher, else rank 0)
 * uses them; the ranks take them from the segment, so all ranks agree.
 * Zero-initialised: every default. */
typedef struct {
    long slot_kb;            /* KiB per collective slot; 0: 256               */
    long oneshot_max_kb;     /* largest all-reduce done in one shot; 0: 64;
                                < 0: none                                    */
    tp_switch cma;           /* single-copy collectives (process_vm_readv);
                                default on                                   */
    long cma_min_kb;         /* smallest collective that reads the peers'
                                buffers directly; 0: 16; < 0: every size     */
} tp_shm_options;

typedef struct {
    tp_backend backend;      /* TP_BACKEND_AUTO: mpi under mpirun, else shm
                                for several ranks, else self                 */
    int rank, world_size;    /* < 0 (or both 0): the job's layout from the
                                environment (RANK, WORLD_SIZE, ...)          */
    const char *rendezvous;  /* the job's name, which tells concurrent jobs'
                                shared memory apart; NULL: MASTER_ADDR and
                                MASTER_PORT when set, else none              */
    double timeout_s;        /* a collective's wait for its peers; <= 0: 30 s */
    double hang_timeout_s;   /* shm, mpi: a peer's heartbeat may be silent this
                                long before it counts as hung; 0: 2 s;
                                < 0: no check                                */
    int shm_fd;              /* the segment inherited from the launcher;
                                <= 0: none (it is opened by name)            */
    tp_shm_options shm;      /* for a segment this process creates           */
} tp_comm_options;

/* Fills *o with the defaults: every field unset, nothing from the
 * environment. */
void tp_comm_options_default(tp_comm_options *o);
/* Fills *o from the settings table (TENSORPAR_BACKEND, _COMM_TIMEOUT,
 * _HANG_TIMEOUT, _SHM_SLOT_KB, _SHM_ONESHOT_KB, _SHM_CMA, _SHM_CMA_KB, and
 * the launcher's _RENDEZVOUS and _SHM_FD), an unset variable giving its
 * default; rank and world_size are left unset (the job's layout).  A bad
 * value is TP_ERR_INVALID naming the variable; *o then holds the
 * defaults.  o->rendezvous points into the environment. */
tp_status tp_comm_options_from_env(tp_comm_options *o);

/* Creates the world group of this process's job.  opts NULL:
 * tp_comm_options_from_env's options (what a rank started by a launcher
 * wants).
 * Collective over the whole job: every rank must call it.  Errors start with
 * the sentence of §5.3 ("We tried to initialize the process group for you,
 * but it failed: ..."). */
tp_status tp_comm_init(tp_group **world, const tp_comm_options *opts);

/* The job's layout as the launcher (or mpirun) set it in the environment,
 * without joining the job: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * else mpirun's OMPI_COMM_WORLD_*, else one process.  Any pointer may be
 * NULL.  A bad or inconsistent variable is TP_ERR_INVALID naming it. */
tp_status tp_comm_job_layout(int *rank, int *world_size, int *local_rank, int *local_size);

/* ---- groups ----------------------------------------------------------- */

/* Frees a group (world or sub-group, in any order; the job's resources go
 * with the last one).  Not collective; never fails; NULL is fine. */
void tp_group_free(tp_group *g);

int tp_group_rank(const tp_group *g);          /* this process's rank in g  */
int tp_group_size(const tp_group *g);
/* The global (world) rank of group rank r, or -1 if r is out of range. */
int tp_group_global_rank(const tp_group *g, int r);
/* This process's rank among the ranks on its host, and their number. */
int tp_group_local_rank(const tp_group *g);
int tp_group_local_size(const tp_group *g);
tp_backend tp_group_backend(const tp_group *g);
/* Seconds a wait may last before TP_ERR_TIMEOUT; changeable per group. */
double tp_group_timeout(const tp_group *g);
void tp_group_set_timeout(tp_group *g, double seconds);

/* Makes the sub-group of `parent` whose rank i is parent rank ranks[i].
 * Collective over the listed ranks only (others need not call it); each
 * of them passes the same list, and the calling rank must be in it.  Two
 * sub-groups with the same member list are distinct groups when created
 * twice.  Example, world 4 as (dp=2, tp=2): ranks 0,1 create {0,1} and
 * ranks 2,3 create {2,3} (tp); ranks 0,2 create {0,2}, ranks 1,3 {1,3} (dp). */
tp_status tp_group_new_sub(tp_group *parent, const int *ranks, int n, tp_group **out);

/* MPI_Comm_split-style: collective over all of `parent`.  Ranks passing the
 * same color >= 0 form a group, ordered by (key, parent rank); color < 0
 * gives *out = NULL. */
tp_status tp_group_split(tp_group *parent, int color, int key, tp_group **out);

/* ---- collectives ------------------------------------------------------ */

typedef enum { TP_REDUCE_SUM = 0, TP_REDUCE_MAX } tp_reduce_op;

/* Reductions accept f32, bf16, f16 (accumulated in f32), f64, i64, i32.
 * Gathers, scatters, broadcast, all_to_all and send/recv accept any dtype. */

/* recv[i] = op over ranks of send[i], count elements.  In place allowed. */
tp_status tp_comm_all_reduce(tp_group *g, const void *send, void *recv, size_t count,
                             tp_dtype dt, tp_reduce_op op);

/* recv = concat over ranks r of rank r's `count` elements (n*count total). */
tp_status tp_comm_all_gather(tp_group *g, const void *send, void *recv, size_t count,
                             tp_dtype dt);
/* Rank r sends counts[r] elements; recv holds sum(counts), in rank order. */
tp_status tp_comm_all_gatherv(tp_group *g, const void *send, void *recv,
                              const size_t *counts, tp_dtype dt);

/* send holds n*count elements on every rank; rank r receives
 * the reduction of piece r (elements [r*count, (r+1)*count)). */
tp_status tp_comm_reduce_scatter(tp_group *g, const void *send, void *recv, size_t count,
                                 tp_dtype dt, tp_reduce_op op);
/* send holds sum(counts) elements; rank r receives counts[r] elements: the
 * reduction of piece r, pieces laid out in rank order. */
tp_status tp_comm_reduce_scatterv(tp_group *g, const void *send, void *recv,
                                  const size_t *counts, tp_dtype dt, tp_reduce_op op);

/* An all-reduce of the rows of an f32 matrix [rows, row_len] with a
 * row-wise step between the reduction and the distribution.  Rank p owns
 * row_counts[p] consecutive rows, in rank order (the counts sum to rows).
 * Each rank sums its own rows over every rank's send (in rank order, as
 * tp_comm_all_reduce), calls fn(ctx, first_row, nrows, rows) on them — in
 * one or more calls, ascending, rewriting the rows in place — and then every
 * rank's recv holds every row as its owner's fn left it.  send and recv must
 * not overlap; fn NULL gives tp_comm_all_reduce's result.  For the residual
 * add and the norm after a row-parallel layer: each rank does its own rows
 * while they are in its cache, instead of every rank doing all of them. */
typedef void (*tp_comm_rows_fn)(void *ctx, int64_t first_row, int64_t nrows, float *rows);
tp_status tp_comm_all_reduce_rows(tp_group *g, const float *send, float *recv, const size_t *row_counts,
                                  size_t row_len, tp_comm_rows_fn fn, void *ctx);

/* root's buf is copied into every rank's buf.  root is a group rank. */
tp_status tp_comm_broadcast(tp_group *g, void *buf, size_t count, tp_dtype dt, int root);

tp_status tp_comm_barrier(tp_group *g);
/* A barrier that is also a verdict: every rank passes its own status and
 * gets TP_OK when all succeeded, else the failure of the lowest failing
 * rank (its message, prefixed "rank R: " on the other ranks).  g NULL or
 * of one rank: mine. */
tp_status tp_comm_agree(tp_group *g, tp_status mine);

/* send holds n pieces of `count` elements, piece q for rank q; recv gets n
 * pieces, piece p from rank p. */
tp_status tp_comm_all_to_all(tp_group *g, const void *send, void *recv, size_t count,
                             tp_dtype dt);
/* send_counts[q] elements go to rank q (pieces contiguous in q order);
 * recv_counts[p] elements come from rank p (contiguous in p order).
 * recv_counts[p] must equal rank p's send_counts[me]. */
tp_status tp_comm_all_to_allv(tp_group *g, const void *send, const size_t *send_counts,
                              void *recv, const size_t *recv_counts, tp_dtype dt);

/* Point to point, matched in issue order per (sender, receiver) pair; the
 * receiver's count must equal the sender's.  A send may block until the
 * receiver takes the data (large messages), so two ranks exchanging data
 * should use tp_comm_sendrecv. */
tp_status tp_comm_send(tp_group *g, const void *buf, size_t count, tp_dtype dt, int dst);
tp_status tp_comm_recv(tp_group *g, void *buf, size_t count, tp_dtype dt, int src);
/* Sends to dst and receives from src at once, without deadlock. */
tp_status tp_comm_sendrecv(tp_group *g, const void *send, size_t send_count, int dst,
                           void *recv, size_t recv_count, int src, tp_dtype dt);

/* ---- launching -------------------------------------------------------- */

/* 1 if this process is a rank of a launched job (RANK and WORLD_SIZE, or
 * mpirun's variables, are set; or WORLD_SIZE > 1 alone, which joining then
 * refuses for want of RANK): a command given --tp N then runs as that rank
 * instead of launching again. */
int tp_launch_in_job(void);

typedef struct {
    int nprocs;              /* N ranks, >= 1                                */
    tp_backend backend;      /* shm (AUTO means shm) or mpi (execs mpirun)   */
    const char *name;        /* prefix of messages, e.g. "tensorpar launch"  */
    double kill_grace_s;     /* SIGTERM -> SIGKILL delay; <= 0: 2 s           */
    /* What the launcher itself uses of the ranks' comm settings: the shm
     * segment's sizes (comm->shm) and the heartbeat limit
     * (comm->hang_timeout_s).  NULL: the defaults. */
    const tp_comm_options *comm;
    /* mpi only: mpirun's hostfile (the hosts and their slots); NULL: every
     * rank on this host.  mpirun starts the ranks of other hosts (ssh). */
    const char *hostfile;
} tp_launch_options;

/* Runs argv (argv[0] searched in PATH) as N ranks with RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, TENSORPAR_RENDEZVOUS and TENSORPAR_BACKEND
 * set, and waits for all of them.  When one dies or exits non-zero, the
 * others get SIGTERM, then SIGKILL, the cause goes to stderr, and the
 * job's shared memory is gone.  SIGTERM/SIGINT/SIGHUP to the caller stop
 * the job the same way; ranks die with the caller (PR_SET_PDEATHSIG).
 * *exit_code: 0 when every rank exited 0, else the first failure's code
 * (128 + signal for a signal).  Returns TP_OK when the job ran, whatever
 * its outcome; an error only if it could not be started. */
tp_status tp_launch(const tp_launch_options *opts, char *const argv[], int *exit_code);

/* tp_launch of this very executable (/proc/self/exe) with argv, for
 * `tensorpar <cmd> --tp N`: the ranks see RANK etc. and run the command. */
tp_status tp_launch_self(int nprocs, tp_backend backend, char *const argv[], int *exit_code);
/* The same with every launch option (opts->name NULL: "tensorpar"). */
tp_status tp_launch_self_ex(const tp_launch_options *opts, char *const argv[], int *exit_code);

#ifdef __cplusplus
}
#endif
#endif
