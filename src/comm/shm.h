/* The shm backend's shared segment and its per-process view.
 *
 * One POSIX shared-memory segment per job, created by the launcher (which
 * unlinks its name at once and hands the descriptor to the ranks, so nothing
 * can be left in /dev/shm) or, without our launcher, by rank 0 under a name
 * derived from uid + rendezvous (unlinked as soon as every rank attached).
 *
 * Layout (offsets in the header, all 4 KiB aligned):
 *   header   magic, layout, job hash, failure flag, the area table
 *   ranks    per global rank: pid, start time (against pid reuse), state
 *   areas    SHM_AREAS group areas; area 0 is the world.  Each holds the
 *            members' global ranks, per member a `seq` line (the step
 *            counter plus what the step is: see shm_step_info), and per
 *            member two slot buffers
 *   p2p      per ordered pair of global ranks: posted/consumed counters and
 *            a buffer for point-to-point messages
 *
 * The segment is sized for the worst case but tmpfs allocates pages only
 * when touched, so unused areas cost nothing. */
#ifndef TP_COMM_SHM_H
#define TP_COMM_SHM_H

#include "comm_internal.h"

#include <stdatomic.h>
#include <stdint.h>

#define SHM_MAGIC 0x74656e736f72706dull   /* "tensorpm" */
#define SHM_VERSION 3u
#define SHM_LINE 128                      /* two lines: the adjacent-line
                                             prefetcher shares pairs */
#define SHM_AREAS 32
#define SHM_P2P_BYTES (64u << 10)
/* The slot size, the one-shot limit and the smallest collective that reads
 * the peers' buffers directly (process_vm_readv) instead of going through
 * the slots: their defaults are in the settings table (src/base/settings.c,
 * TENSORPAR_SHM_*), read by tp_comm_shm_settings. */

enum { AREA_FREE = 0, AREA_INIT, AREA_READY };
enum { RANK_ABSENT = 0, RANK_ALIVE, RANK_LEFT };
/* Why failed_rank was set. */
enum { FAIL_DIED = 0, FAIL_SILENT };

/* What a step belongs to, written by each rank before it publishes the step:
 * a rank that reads a peer's step compares it with its own, so that ranks
 * calling different collectives (or different counts) fail with a message
 * naming both calls instead of exchanging garbage.  `send`/`recv` are the
 * caller's buffer addresses, for the single-copy (CMA) algorithms only. */
typedef struct {
    uint32_t kind;            /* shm_kind | dtype << 8 | op << 16          */
    int32_t root;
    uint64_t count;           /* elements (the whole tensor)               */
    uint64_t hash;            /* of the per-rank counts of "v" collectives */
    uint64_t send, recv;      /* 0 unless the step reads peers' buffers    */
} shm_step_info;

typedef struct {
    uint32_t kind;
    int32_t root;
    uint64_t count, hash;
} shm_step_check;

typedef struct {
    uint64_t send, recv;
} shm_step_addr;

/* A member's step counter and, in the same 64-byte line, what its last two
 * steps are (one per slot buffer parity: a peer may still check step k
 * while this rank already describes step k+1), so that publishing and
 * checking a step moves one line between cores.  The buffer addresses of
 * the single-copy algorithms sit in the next line, written and read only by
 * them. */
typedef struct {
    _Atomic uint64_t seq;
    shm_step_check check[2];
    char pad0[64 - sizeof(uint64_t) - 2 * sizeof(shm_step_check)];
    shm_step_addr addr[2];
    char pad[SHM_LINE - 64 - 2 * sizeof(shm_step_addr)];
} shm_seq;

typedef struct {
    _Atomic int32_t pid;
    _Atomic int32_t state;
    uint64_t start_time;      /* /proc/<pid>/stat field 22 */
    uint64_t probe_addr;      /* a word peers read to test process_vm_readv */
    _Atomic int32_t cma;      /* 0 unknown, 1 could read every peer, -1 not */
    _Atomic uint64_t beat;    /* heartbeat counter, 0 until the rank attaches */
    char pad[SHM_LINE - 40];
} shm_rank_info;

_Static_assert(sizeof(shm_seq) == SHM_LINE, "shm_seq is one line pair");
_Static_assert(sizeof(shm_rank_info) == SHM_LINE, "shm_rank_info is one line pair");

typedef struct {
    _Atomic uint32_t state;
    _Atomic int32_t refs;     /* members that have not freed the group */
    int32_t n;
    uint64_t key;
} shm_area_entry;

typedef struct {
    _Atomic uint64_t posted;  /* chunks written by the sender            */
    uint64_t len;             /* bytes in the current chunk              */
    uint64_t total;           /* bytes in the whole message              */
    char pad1[SHM_LINE - 24];
    _Atomic uint64_t consumed;/* chunks taken by the receiver            */
    char pad2[SHM_LINE - 8];
} shm_p2p;

typedef struct {
    _Atomic uint64_t magic;   /* written last by the creator             */
    uint32_t version;
    int32_t world;
    uint64_t job_hash;
    int32_t creator_pid;
    uint64_t creator_start;
    uint64_t total_bytes, slot_bytes, p2p_bytes;
    uint64_t oneshot_max;          /* all-reduce algorithm switch (bytes)  */
    uint64_t cma_min;              /* single-copy switch (bytes); UINT64_MAX: off */
    uint64_t ranks_off, areas_off, area_bytes, area_data_off, p2p_off, p2p_stride;
    _Atomic uint64_t attached;
    _Atomic int32_t failed_rank;   /* -1, or a rank found dead            */
    _Atomic int32_t failed_by;
    _Atomic int32_t failed_why;    /* FAIL_DIED or FAIL_SILENT            */
    shm_area_entry table[SHM_AREAS];
} shm_header;

/* Per-process view of the segment, shared by all of its groups. */
typedef struct {
    shm_header *h;
    size_t bytes;
    int world, me;
    int refs;                       /* tp_groups using this view          */
    int cma;                        /* every rank can process_vm_readv every other */
    double spin_s;                  /* busy-wait this long before yielding */
    double yield_s;                 /* then sched_yield until this, then sleep */
    uint64_t probe;                 /* what peers read in the CMA probe    */
    double hang_s;                  /* TENSORPAR_HANG_TIMEOUT; 0: off      */
    tp_shm_beat *beat;              /* this rank's heartbeat thread        */
    struct { uint64_t hash; int count; } *occ;   /* sub-group creations  */
    int nocc, capocc;
} shm_world;

/* Per-group state. */
typedef struct {
    shm_world *w;
    int area;
    int32_t *members;
    shm_seq *seq;
    uint64_t *seen;                 /* the highest seq read of each member */
    int *pid;                       /* each member's pid (for CMA)         */
    char *data;
    size_t slot_bytes;
    size_t oneshot_max, cma_min;
    uint64_t step;
} shm_group;

/* ---- segment (shm_segment.c) ---- */
tp_status tp_shm_attach(shm_world **out, const tp_comm_env *e, double timeout_s);
void tp_shm_detach(shm_world *w);
/* Claims (leader) or finds (everyone) the area for a member list. */
tp_status tp_shm_area_open(shm_world *w, tp_group *g, const int32_t *members, int n,
                           uint64_t key, int leader, int *area_out);
void tp_shm_area_close(shm_world *w, int area);
tp_status tp_shm_group_view(shm_world *w, int area, int n, shm_group *s);
void tp_shm_group_view_free(shm_group *s);
shm_p2p *tp_shm_p2p(shm_world *w, int from, int to, char **buf);

/* ---- waiting (shm_wait.c) ---- */
typedef struct {
    tp_backoff pause;               /* wait.c's schedule                   */
    tp_silence silence;             /* of the awaited peer                 */
} shm_backoff;

void tp_shm_backoff_init(shm_backoff *b, const shm_world *w);
/* Pauses once (spin, then yield, then sleep).  Fails if `peer` (a global
 * rank) died or left, another rank reported a failure, or the group's
 * timeout passed; `what` names what was awaited. */
tp_status tp_shm_backoff(shm_backoff *b, shm_world *w, const tp_group *g, int peer, const char *what);
/* Fails, naming the cause, if another rank reported a failure or `peer`
 * (a global rank; -1: none) died or left; TP_OK otherwise. */
tp_status tp_shm_check_peer(shm_world *w, int peer, const char *what);
/* Waits until *c >= target. */
tp_status tp_shm_wait_ge(shm_world *w, const tp_group *g, _Atomic uint64_t *c, uint64_t target,
                         int peer, const char *what);
/* 0 if global rank r is known dead (or its pid was reused), 1 otherwise. */
int tp_shm_rank_alive(shm_world *w, int r);
/* Start time of a process (field 22 of /proc/<pid>/stat), and its state letter. */
uint64_t tp_shm_proc_start(int pid, char *state);

/* ---- liveness (shm_heartbeat.c) ---- */
/* Starts a thread that bumps *counter every 50 ms until stopped. */
tp_status tp_shm_beat_start(_Atomic uint64_t *counter, tp_shm_beat **out);
void tp_shm_beat_stop(tp_shm_beat *b);

#endif
