/* The shm backend's segment: layout, creation, attaching, and the table of
 * group areas.  See shm.h for the layout and why the name never outlives
 * the job's start. */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void tp_shm_segment_name(char *buf, size_t cap, const char *rendezvous)
{
    snprintf(buf, cap, "/tensorpar-%u-%s", (unsigned)getuid(), rendezvous);
}

static void layout(shm_header *h, int n)
{
    size_t off = round_up(sizeof *h, 4096);
    h->ranks_off = off;
    off = round_up(off + (size_t)n * sizeof(shm_rank_info), 4096);
    h->areas_off = off;
    /* members, then seq[n], then 2n slots. */
    h->area_data_off = round_up(round_up((size_t)n * sizeof(int32_t), SHM_LINE) +
                                (size_t)n * sizeof(shm_seq), 4096);
    h->area_bytes = h->area_data_off + 2 * (size_t)n * h->slot_bytes;
    off += SHM_AREAS * h->area_bytes;
    h->p2p_off = off;
    h->p2p_stride = sizeof(shm_p2p) + h->p2p_bytes;
    h->total_bytes = off + (size_t)n * (size_t)n * h->p2p_stride;
}

static char *area_base(shm_world *w, int area)
{
    return (char *)w->h + w->h->areas_off + (size_t)area * w->h->area_bytes;
}

/* Resets an area's counters and writes its members (caller owns it). */
static void area_init(shm_header *h, char *base, const int32_t *members, int n)
{
    memcpy(base, members, (size_t)n * sizeof(int32_t));
    shm_seq *c = (shm_seq *)(base + round_up((size_t)h->world * sizeof(int32_t), SHM_LINE));
    for (int i = 0; i < h->world; i++) {
        atomic_store_explicit(&c[i].seq, 0, memory_order_relaxed);
        memset(c[i].check, 0, sizeof c[i].check);
        memset(c[i].addr, 0, sizeof c[i].addr);
    }
}

static void header_init(shm_header *h, const char *rendezvous, int n, const tp_shm_settings *cfg)
{
    h->version = SHM_VERSION;
    h->world = n;
    h->job_hash = tp_comm_hash(rendezvous, strlen(rendezvous), 0);
    h->creator_pid = (int32_t)getpid();
    char state;
    h->creator_start = tp_shm_proc_start(h->creator_pid, &state);
    h->slot_bytes = cfg->slot_bytes;
    h->p2p_bytes = SHM_P2P_BYTES;
    h->oneshot_max = cfg->oneshot_max;
    h->cma_min = cfg->cma_min;
    layout(h, n);
    atomic_store(&h->attached, 0);
    atomic_store(&h->failed_rank, -1);
    atomic_store(&h->failed_by, -1);
    /* Area 0 is the world group, ready from the start. */
    int32_t *all = (int32_t *)((char *)h + h->areas_off);
    for (int r = 0; r < n; r++) all[r] = r;
    area_init(h, (char *)h + h->areas_off, all, n);
    h->table[0].n = n;
    h->table[0].key = 0;
    atomic_store(&h->table[0].refs, n);
    atomic_store(&h->table[0].state, AREA_READY);
}

/* Creates name (O_EXCL) sized and initialised for n ranks. */
static tp_status create_named(const char *name, const char *rendezvous, int n, const tp_shm_settings *cfg,
                              int *fd_out)
{
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return tp_fail(errno == EEXIST ? TP_ERR_COMM : TP_ERR_IO, "shm_open %s: %s", name, strerror(errno));
    shm_header tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.slot_bytes = cfg->slot_bytes;
    tmp.p2p_bytes = SHM_P2P_BYTES;
    layout(&tmp, n);
    /* Only the header, the rank table and the world area's control part
     * need writing now. */
    size_t map_bytes = tmp.areas_off + tmp.area_data_off;
    shm_header *h = MAP_FAILED;
    if (ftruncate(fd, (off_t)tmp.total_bytes) != 0 ||
        (h = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE,
                  MAP_SHARED, fd, 0)) == MAP_FAILED) {
        tp_status st = tp_fail(TP_ERR_IO, "creating shared memory %s (%llu bytes): %s", name,
                               (unsigned long long)tmp.total_bytes, strerror(errno));
        close(fd);
        shm_unlink(name);
        return st;
    }
    header_init(h, rendezvous, n, cfg);
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    munmap(h, map_bytes);
    *fd_out = fd;
    return TP_OK;
}

tp_status tp_shm_segment_create(const char *rendezvous, int n, const tp_shm_settings *cfg, int *fd_out)
{
    char name[256];
    tp_shm_segment_name(name, sizeof name, rendezvous);
    return create_named(name, rendezvous, n, cfg, fd_out);
}

/* Maps a segment given its descriptor; checks that it is this job's. */
static tp_status map_fd(shm_world *w, int fd, const char *rendezvous, int n)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) return tp_fail(TP_ERR_IO, "fstat of shared memory: %s", strerror(errno));
    if ((size_t)sb.st_size < sizeof(shm_header))
        return tp_fail(TP_ERR_COMM, "shared memory segment is not initialised yet");
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return tp_fail(TP_ERR_IO, "mmap of shared memory: %s", strerror(errno));
    shm_header *h = p;
    const char *why = NULL;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC) why = "is not initialised yet";
    else if (h->version != SHM_VERSION) why = "comes from another tensorpar version";
    else if (h->job_hash != tp_comm_hash(rendezvous, strlen(rendezvous), 0)) why = "belongs to another job";
    else if (h->world != n) why = "was made for another world size";
    else if (h->total_bytes != (uint64_t)sb.st_size) why = "has the wrong size";
    if (why) {
        munmap(p, (size_t)sb.st_size);
        return tp_fail(TP_ERR_COMM, "shared memory segment %s", why);
    }
    w->h = h;
    w->bytes = (size_t)sb.st_size;
    return TP_OK;
}

/* A segment whose creator is gone is left over from a crashed job. */
static int creator_alive(const shm_header *h)
{
    char state;
    uint64_t t = tp_shm_proc_start(h->creator_pid, &state);
    return t != 0 && t == h->creator_start && state != 'Z' && state != 'X';
}

/* Rank 0 without a launcher: create the named segment, replacing a stale
 * one from a crashed run of the same rendezvous. */
static tp_status rank0_create(shm_world *w, const char *name, const tp_comm_env *e)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd;
        tp_status st = create_named(name, e->rendezvous, e->world_size, &e->shm, &fd);
        if (st == TP_OK) {
            st = map_fd(w, fd, e->rendezvous, e->world_size);
            close(fd);
            return st;
        }
        if (st != TP_ERR_COMM) return st;
        fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0) {
            shm_world old = {0};
            tp_status ost = map_fd(&old, fd, e->rendezvous, e->world_size);
            close(fd);
            int live = ost == TP_OK && creator_alive(old.h);
            int pid = ost == TP_OK ? old.h->creator_pid : 0;
            if (ost == TP_OK) munmap(old.h, old.bytes);
            if (live)
                return tp_fail(TP_ERR_COMM, "rendezvous '%s' is in use by another job (pid %d)",
                               e->rendezvous, pid);
        }
        shm_unlink(name);
    }
    return tp_fail(TP_ERR_COMM, "could not create shared memory %s", name);
}

/* Other ranks without a launcher: wait for rank 0's segment. */
static tp_status open_named(shm_world *w, const char *name, const tp_comm_env *e, double timeout_s)
{
    double start = tp_now();
    for (;;) {
        int fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0) {
            tp_status st = map_fd(w, fd, e->rendezvous, e->world_size);
            close(fd);
            if (st == TP_OK && creator_alive(w->h)) return TP_OK;
            if (st == TP_OK) { munmap(w->h, w->bytes); w->h = NULL; }
        } else if (errno != ENOENT) {
            return tp_fail(TP_ERR_IO, "shm_open %s: %s", name, strerror(errno));
        }
        if (tp_now() - start > timeout_s)
            return tp_fail(TP_ERR_TIMEOUT, "rank 0 did not create shared memory %s within %g s", name, timeout_s);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

static void register_me(shm_world *w)
{
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + w->me;
    char state;
    ri->start_time = tp_shm_proc_start((int)getpid(), &state);
    ri->probe_addr = (uint64_t)(uintptr_t)&w->probe;
    atomic_store_explicit(&ri->pid, (int32_t)getpid(), memory_order_release);
    atomic_store_explicit(&ri->state, RANK_ALIVE, memory_order_release);
}

/* Waits until every rank has attached, naming the first missing one. */
static tp_status wait_all_attached(shm_world *w, double timeout_s)
{
    tp_group fake = {.timeout_s = timeout_s};
    shm_backoff b;
    tp_shm_backoff_init(&b, w);
    while (atomic_load_explicit(&w->h->attached, memory_order_acquire) < (uint64_t)w->world) {
        int missing = 0;
        shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off);
        while (missing < w->world && atomic_load(&ri[missing].state) != RANK_ABSENT) missing++;
        tp_status st = tp_shm_backoff(&b, w, &fake, missing < w->world ? missing : -1, "all ranks to join");
        if (st == TP_ERR_TIMEOUT)
            return tp_fail(TP_ERR_TIMEOUT, "rank %d did not join within %g s", missing, timeout_s);
        if (st) return st;
    }
    return TP_OK;
}

/* Can this rank read every other rank's memory with process_vm_readv (same
 * uid, not forbidden by Yama, seccomp or PR_SET_DUMPABLE)?  Each rank tries
 * and publishes its verdict; all then wait for all verdicts, so that every
 * rank takes the same decision and picks the same algorithms. */
static tp_status probe_cma(shm_world *w, double timeout_s)
{
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off);
    int ok = 1;
    for (int r = 0; r < w->world && ok; r++) {
        if (r == w->me) continue;
        uint64_t v = 0;
        struct iovec l = {&v, sizeof v};
        struct iovec rem = {(void *)(uintptr_t)ri[r].probe_addr, sizeof v};
        ok = process_vm_readv(atomic_load(&ri[r].pid), &l, 1, &rem, 1, 0) == (ssize_t)sizeof v &&
             v == (SHM_MAGIC ^ (uint64_t)r);
    }
    atomic_store_explicit(&ri[w->me].cma, ok ? 1 : -1, memory_order_release);
    tp_group fake = {.timeout_s = timeout_s};
    shm_backoff b;
    tp_shm_backoff_init(&b, w);
    int all = 1;
    for (int r = 0; r < w->world; r++) {
        int v;
        while ((v = atomic_load_explicit(&ri[r].cma, memory_order_acquire)) == 0) {
            tp_status st = tp_shm_backoff(&b, w, &fake, r, "all ranks to join");
            if (st) return st;
        }
        all &= v == 1;
    }
    w->cma = all && w->h->cma_min != UINT64_MAX;
    return TP_OK;
}

tp_status tp_shm_attach(shm_world **out, const tp_comm_env *e, double timeout_s)
{
    *out = NULL;
    if (!e->rendezvous[0])
        return tp_fail(TP_ERR_INVALID, "no rendezvous for the shm backend: start the ranks with "
                       "'tensorpar launch', or set TENSORPAR_RENDEZVOUS or MASTER_ADDR/MASTER_PORT");
    shm_world *w = calloc(1, sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    w->world = e->world_size;
    w->me = e->rank;
    w->refs = 1;
    w->probe = SHM_MAGIC ^ (uint64_t)e->rank;
    tp_wait_limits(e->world_size, &w->spin_s, &w->yield_s);
    char name[256];
    tp_shm_segment_name(name, sizeof name, e->rendezvous);
    tp_status st;
    int named = e->shm_fd < 0;
    if (!named) st = map_fd(w, e->shm_fd, e->rendezvous, e->world_size);
    else if (e->rank == 0) st = rank0_create(w, name, e);
    else st = open_named(w, name, e, timeout_s);
    if (st) { free(w); return st; }
    if (!named) close(e->shm_fd);
    register_me(w);
    /* Beat from now on: the peers may wait for us from here. */
    w->hang_s = e->hang_s;
    shm_rank_info *mine = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + w->me;
    st = tp_shm_beat_start(&mine->beat, &w->beat);
    if (st) {
        if (named) shm_unlink(name);
        tp_shm_detach(w);
        return st;
    }
    uint64_t n = atomic_fetch_add(&w->h->attached, 1) + 1;
    /* The last rank to attach removes the name: from here on the segment
     * lives only as long as the ranks that map it. */
    if (named && n == (uint64_t)w->world) shm_unlink(name);
    st = wait_all_attached(w, timeout_s);
    if (st == TP_OK) st = probe_cma(w, timeout_s);
    if (st) {
        if (named) shm_unlink(name);
        tp_shm_detach(w);
        return st;
    }
    *out = w;
    return TP_OK;
}

void tp_shm_detach(shm_world *w)
{
    if (!w || --w->refs > 0) return;
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off) + w->me;
    atomic_store_explicit(&ri->state, RANK_LEFT, memory_order_release);
    /* After RANK_LEFT: nobody takes the silence that follows for a hang. */
    tp_shm_beat_stop(w->beat);
    munmap(w->h, w->bytes);
    free(w->occ);
    free(w);
}

/* ---- group areas ---------------------------------------------------- */

static int area_matches(shm_world *w, int a, const int32_t *members, int n, uint64_t key)
{
    shm_area_entry *t = &w->h->table[a];
    return atomic_load_explicit(&t->state, memory_order_acquire) == AREA_READY && t->key == key &&
           t->n == n && !memcmp(area_base(w, a), members, (size_t)n * sizeof(int32_t));
}

static tp_status claim_area(shm_world *w, const int32_t *members, int n, uint64_t key)
{
    for (int a = 1; a < SHM_AREAS; a++) {
        shm_area_entry *t = &w->h->table[a];
        uint32_t expected = AREA_FREE;
        if (!atomic_compare_exchange_strong(&t->state, &expected, AREA_INIT)) continue;
        area_init(w->h, area_base(w, a), members, n);
        t->n = n;
        t->key = key;
        atomic_store(&t->refs, n);
        atomic_store_explicit(&t->state, AREA_READY, memory_order_release);
        return TP_OK;
    }
    return tp_fail(TP_ERR_UNSUPPORTED, "too many process groups alive at once (at most %d)", SHM_AREAS - 1);
}

tp_status tp_shm_area_open(shm_world *w, tp_group *g, const int32_t *members, int n,
                           uint64_t key, int leader, int *area_out)
{
    if (leader) {
        tp_status st = claim_area(w, members, n, key);
        if (st) return st;
    }
    shm_backoff b;
    tp_shm_backoff_init(&b, w);
    for (;;) {
        for (int a = 1; a < SHM_AREAS; a++)
            if (area_matches(w, a, members, n, key)) { *area_out = a; return TP_OK; }
        tp_status st = tp_shm_backoff(&b, w, g, members[0], "the sub-group's first rank to set it up");
        if (st) return st;
    }
}

void tp_shm_area_close(shm_world *w, int area)
{
    shm_area_entry *t = &w->h->table[area];
    if (atomic_fetch_sub(&t->refs, 1) == 1) atomic_store_explicit(&t->state, AREA_FREE, memory_order_release);
}

tp_status tp_shm_group_view(shm_world *w, int area, int n, shm_group *s)
{
    char *base = area_base(w, area);
    s->w = w;
    s->area = area;
    s->members = (int32_t *)base;
    s->seq = (shm_seq *)(base + round_up((size_t)w->world * sizeof(int32_t), SHM_LINE));
    s->data = base + w->h->area_data_off;
    s->slot_bytes = w->h->slot_bytes;
    s->oneshot_max = w->h->oneshot_max;
    s->cma_min = w->cma ? w->h->cma_min : UINT64_MAX;
    s->step = 0;
    s->seen = calloc((size_t)n, sizeof *s->seen);
    s->pid = calloc((size_t)n, sizeof *s->pid);
    if (!s->seen || !s->pid) {
        tp_shm_group_view_free(s);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    shm_rank_info *ri = (shm_rank_info *)((char *)w->h + w->h->ranks_off);
    for (int i = 0; i < n; i++) s->pid[i] = atomic_load(&ri[s->members[i]].pid);
    return TP_OK;
}

void tp_shm_group_view_free(shm_group *s)
{
    free(s->seen);
    free(s->pid);
    s->seen = NULL;
    s->pid = NULL;
}

shm_p2p *tp_shm_p2p(shm_world *w, int from, int to, char **buf)
{
    char *p = (char *)w->h + w->h->p2p_off + ((size_t)from * (size_t)w->world + (size_t)to) * w->h->p2p_stride;
    *buf = p + sizeof(shm_p2p);
    return (shm_p2p *)p;
}
