/* The shm backend's collectives.
 *
 * Every collective is a sequence of numbered steps on the group's area.  In
 * step k each rank may write its slot buffer k%2, describes the step in
 * seq[me].check[k%2] (which collective, dtype, counts; its buffer addresses
 * in seq[me].addr[k%2] when peers will read them),
 * publishes seq[me] = k with one release store, and reads the slots of the
 * ranks it needs once their seq reaches k.  Before rewriting buffer k%2 a
 * rank needs every member to have finished step k-2, the last reader of it;
 * a member that has published step k-1 has, so the seq counters are the
 * only shared variables a step touches.  Each rank remembers the highest seq
 * it has read of every member (`seen`), so that this check usually costs no
 * cache-line transfer at all.  Two buffers let a rank fill the next step
 * while others still read the last one.  No locks, no fences beyond the
 * release/acquire pairs on seq.  Messages larger than a slot go through in
 * chunks.
 *
 * From cma_min bytes on (16 KiB by default), all-reduce, all-gather and
 * reduce-scatter read the peers' buffers directly with process_vm_readv
 * (cross-memory attach: one copy instead of two through the slots); the
 * steps then only publish addresses and say when a phase is over.  Whether
 * every rank may do that is probed once at attach (shm_segment.c), so that
 * all ranks choose the same algorithm.
 *
 * Reductions use tp_comm_reduce_ordered (rank 0 + rank 1 + ... in the
 * accumulation type) over whole elements, so one-shot, two-shot and the
 * single-copy path give the same bits on every rank. */
#include "shm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

static shm_group *sg(tp_group *g) { return g->impl; }

static char *slot(shm_group *s, int r, uint64_t step)
{
    return s->data + ((size_t)r * 2 + (size_t)(step & 1)) * s->slot_bytes;
}

/* ---- step descriptions -------------------------------------------------- */

enum { K_ALL_REDUCE = 1, K_ALL_GATHER, K_REDUCE_SCATTER, K_BROADCAST, K_BARRIER, K_ALL_TO_ALL, K_ALL_REDUCE_ROWS };

static const char *kind_name(uint32_t k)
{
    static const char *const names[] = {"?", "all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast", "barrier", "all_to_all", "all_reduce_rows"};
    return k < sizeof names / sizeof names[0] ? names[k] : "?";
}

static shm_step_info describe(uint32_t kind, tp_dtype dt, tp_reduce_op op, int root, size_t count,
                              const size_t *counts, int n, const void *send, const void *recv)
{
    shm_step_info i = {0};
    i.kind = kind | (uint32_t)dt << 8 | (uint32_t)op << 16;
    i.root = root;
    i.count = count;
    if (counts) i.hash = tp_comm_hash(counts, (size_t)n * sizeof(size_t), 0);
    i.send = (uint64_t)(uintptr_t)send;
    i.recv = (uint64_t)(uintptr_t)recv;
    return i;
}

static void format_info(char *buf, size_t cap, const shm_step_check *i)
{
    uint32_t k = i->kind & 0xff;
    const char *dt = tp_dtype_name((tp_dtype)(i->kind >> 8 & 0xff));
    if (k == K_BARRIER) snprintf(buf, cap, "barrier()");
    else if (k == K_BROADCAST) snprintf(buf, cap, "broadcast(%llu bytes, root %d)", (unsigned long long)i->count, i->root);
    else if (k == K_ALL_REDUCE || k == K_REDUCE_SCATTER || k == K_ALL_REDUCE_ROWS)
        snprintf(buf, cap, "%s(%llu x %s, %s)", kind_name(k), (unsigned long long)i->count, dt,
                 (i->kind >> 16) == TP_REDUCE_SUM ? "sum" : "max");
    else snprintf(buf, cap, "%s(%llu x %s)", kind_name(k), (unsigned long long)i->count, dt);
}

/* Fails if member p's current step is not part of the same call as ours. */
static tp_status check_info(tp_group *g, int p, const shm_step_check *theirs)
{
    const shm_step_check *mine = &sg(g)->seq[g->rank].check[(sg(g)->step + 1) & 1];
    if (theirs->kind == mine->kind && theirs->root == mine->root && theirs->count == mine->count &&
        theirs->hash == mine->hash)
        return TP_OK;
    char a[96], b[96];
    g->failed = 1;   /* the ranks' step counters no longer agree */
    format_info(a, sizeof a, theirs);
    format_info(b, sizeof b, mine);
    return tp_fail(TP_ERR_INVALID, "rank %d called %s while rank %d called %s%s: every rank must call "
                   "the same collectives in the same order", g->global[p], a, g->global[g->rank], b,
                   !strcmp(a, b) ? " with other per-rank counts" : "");
}

/* Member p's buffer addresses for the current step (single-copy paths). */
static const shm_step_addr *peer_addr(tp_group *g, int p)
{
    return &sg(g)->seq[p].addr[(sg(g)->step + 1) & 1];
}

/* ---- steps ------------------------------------------------------------ */

/* Waits until member p has published step `target` (or a later one). */
static tp_status wait_seq(tp_group *g, int p, uint64_t target, const char *op)
{
    shm_group *s = sg(g);
    if (s->seen[p] >= target) return TP_OK;
    _Atomic uint64_t *c = &s->seq[p].seq;
    uint64_t v = atomic_load_explicit(c, memory_order_acquire);
    if (v < target) {
        tp_status st = tp_shm_wait_ge(s->w, g, c, target, g->global[p], op);
        if (st) return st;
        v = atomic_load_explicit(c, memory_order_acquire);
    }
    s->seen[p] = v;
    return TP_OK;
}

/* Starts step k: waits until every member has finished step k-2 (the last
 * reader of buffer k%2 and check[k%2]), then describes the step. */
static tp_status step_begin(tp_group *g, const shm_step_info *info)
{
    shm_group *s = sg(g);
    uint64_t k = s->step + 1;
    if (k > 2)
        for (int p = 0; p < g->size; p++) {
            if (p == g->rank) continue;
            tp_status st = wait_seq(g, p, k - 1, kind_name(info->kind & 0xff));
            if (st) return st;
        }
    shm_seq *mine = &s->seq[g->rank];
    mine->check[k & 1] = (shm_step_check){info->kind, info->root, info->count, info->hash};
    if (info->send || info->recv) mine->addr[k & 1] = (shm_step_addr){info->send, info->recv};
    return TP_OK;
}

static void step_post(tp_group *g)
{
    shm_group *s = sg(g);
    atomic_store_explicit(&s->seq[g->rank].seq, s->step + 1, memory_order_release);
}

/* Waits for member p's step and checks that it belongs to the same call. */
static tp_status step_wait(tp_group *g, int p, const char *op)
{
    shm_group *s = sg(g);
    tp_status st = wait_seq(g, p, s->step + 1, op);
    if (st) return st;
    return check_info(g, p, &s->seq[p].check[(s->step + 1) & 1]);
}

static tp_status step_wait_all(tp_group *g, const char *op)
{
    for (int p = 0; p < g->size; p++) {
        if (p == g->rank) continue;
        tp_status st = step_wait(g, p, op);
        if (st) return st;
    }
    return TP_OK;
}

static void step_end(tp_group *g) { sg(g)->step++; }

/* A step that only synchronises: begin, post, wait for everyone, end. */
static tp_status step_sync(tp_group *g, const shm_step_info *info, const char *op)
{
    tp_status st = step_begin(g, info);
    if (st) return st;
    step_post(g);
    if ((st = step_wait_all(g, op))) return st;
    step_end(g);
    return TP_OK;
}

/* ---- single copy (cross-memory attach) -------------------------------- */

/* Copies `bytes` from member p's address space.  A dead peer shows up as
 * ESRCH here, and a peer that gave up on a failure elsewhere (and freed its
 * buffer) as EFAULT: both are named like in every wait. */
static tp_status cma_read(tp_group *g, int p, void *dst, size_t src, size_t bytes)
{
    shm_group *s = sg(g);
    char *d = dst;
    while (bytes > 0) {
        struct iovec l = {d, bytes}, r = {(void *)(uintptr_t)src, bytes};
        ssize_t k = process_vm_readv(s->pid[p], &l, 1, &r, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int err = k < 0 ? errno : 0;
            tp_status st = tp_shm_check_peer(s->w, g->global[p], "its buffer to be read");
            if (st) return st;
            return tp_fail(TP_ERR_COMM, "rank %d could not read rank %d's buffer (pid %d): %s",
                           g->global[g->rank], g->global[p], s->pid[p], err ? strerror(err) : "no progress");
        }
        d += k;
        src += (size_t)k;
        bytes -= (size_t)k;
    }
    return TP_OK;
}

/* ---- small helpers ---------------------------------------------------- */

#define STACK_RANKS 64

/* Scratch arrays of n pointers and 2n sizes, on the stack when n is small. */
typedef struct {
    const void *ptr_stack[STACK_RANKS];
    size_t size_stack[2 * STACK_RANKS];
    const void **ptr;
    size_t *size, *aux;
} scratch;

static tp_status scratch_init(scratch *sc, int n)
{
    if (n <= STACK_RANKS) {
        sc->ptr = sc->ptr_stack;
        sc->size = sc->size_stack;
    } else {
        sc->ptr = malloc((size_t)n * sizeof(void *));
        sc->size = malloc(2 * (size_t)n * sizeof(size_t));
        if (!sc->ptr || !sc->size) {
            free(sc->ptr);
            free(sc->size);
            return tp_fail(TP_ERR_NOMEM, "out of memory");
        }
    }
    sc->aux = sc->size + n;
    return TP_OK;
}

static void scratch_free(scratch *sc)
{
    if (sc->ptr != sc->ptr_stack) { free(sc->ptr); free(sc->size); }
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Bytes of piece r's part in step c, where each step moves up to `per`. */
static size_t part(size_t total, size_t c, size_t per)
{
    size_t off = c * per;
    return off >= total ? 0 : min_size(per, total - off);
}

/* ---- all-reduce ------------------------------------------------------- */

/* Asks for write ownership of the lines of our next slot buffer now, while
 * the caller computes, instead of at the next copy.  The peers read those
 * lines two steps ago, so every store of the copy would otherwise wait for
 * their copies to be invalidated, and the step's counter — which follows the
 * copy in store order — would become visible only after all of them.  A
 * hint only: nobody reads the buffer until we publish the next step. */
static void claim_lines(char *p, size_t bytes)
{
#if defined(__x86_64__)
    /* prefetchw: in the 0F 0D space every x86-64 decodes (a no-op where
     * unsupported); spelled in asm so no -mprfchw is needed. */
    for (size_t i = 0; i < bytes; i += 64) __asm__ volatile("prefetchw %0" ::"m"(p[i]));
#else
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 1, 3);
#endif
}

/* Every rank copies its chunk in, then reduces the whole chunk itself. */
static tp_status oneshot(tp_group *g, const char *send, char *recv, size_t count, tp_dtype dt,
                         tp_reduce_op op, scratch *sc, const shm_step_info *info)
{
    shm_group *s = sg(g);
    size_t es = tp_dtype_size(dt), per = s->slot_bytes / es;
    for (size_t off = 0; off < count; off += per) {
        size_t m = min_size(per, count - off);
        tp_status st = step_begin(g, info);
        if (st) return st;
        memcpy(slot(s, g->rank, s->step + 1), send + off * es, m * es);
        step_post(g);
        if ((st = step_wait_all(g, "all_reduce"))) return st;
        for (int p = 0; p < g->size; p++)
            sc->ptr[p] = p == g->rank ? send + off * es : slot(s, p, s->step + 1);
        tp_comm_reduce_ordered(recv + off * es, sc->ptr, g->size, m, dt, op);
        step_end(g);
        claim_lines(slot(s, g->rank, s->step + 1), m * es);
    }
    return TP_OK;
}

/* Rank r's share [lo, hi) of an m-element chunk, cut at 64-byte multiples
 * so that every share starts cache-line aligned. */
static void share(size_t m, size_t es, int r, int n, size_t *lo, size_t *hi)
{
    size_t unit = es >= 64 ? 1 : 64 / es;
    size_t units = (m + unit - 1) / unit;
    size_t a = units * (size_t)r / (size_t)n, b = units * (size_t)(r + 1) / (size_t)n;
    *lo = min_size(a * unit, m);
    *hi = min_size(b * unit, m);
}

/* Reduce-scatter then all-gather, per chunk: each rank reduces 1/n of the
 * chunk (reading n slices) and the others copy its result. */
static tp_status twoshot(tp_group *g, const char *send, char *recv, size_t count, tp_dtype dt,
                         tp_reduce_op op, scratch *sc, const shm_step_info *info)
{
    shm_group *s = sg(g);
    int n = g->size, me = g->rank;
    size_t es = tp_dtype_size(dt), per = s->slot_bytes / es;
    for (size_t off = 0; off < count; off += per) {
        size_t m = min_size(per, count - off), lo, hi;
        share(m, es, me, n, &lo, &hi);
        /* Step A: publish the others' shares of the chunk (mine is read
         * straight from `send`); reduce my share. */
        tp_status st = step_begin(g, info);
        if (st) return st;
        char *mine = slot(s, me, s->step + 1);
        for (int p = 0; p < n; p++) {
            size_t plo, phi;
            share(m, es, p, n, &plo, &phi);
            if (p != me) memcpy(mine + plo * es, send + (off + plo) * es, (phi - plo) * es);
        }
        step_post(g);
        if ((st = step_wait_all(g, "all_reduce"))) return st;
        for (int p = 0; p < n; p++)
            sc->ptr[p] = p == me ? send + (off + lo) * es : slot(s, p, s->step + 1) + lo * es;
        tp_comm_reduce_ordered(recv + (off + lo) * es, sc->ptr, n, hi - lo, dt, op);
        step_end(g);
        /* Step B: publish my reduced share; copy everyone else's. */
        if ((st = step_begin(g, info))) return st;
        memcpy(slot(s, me, s->step + 1) + lo * es, recv + (off + lo) * es, (hi - lo) * es);
        step_post(g);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            size_t plo, phi;
            share(m, es, p, n, &plo, &phi);
            if ((st = step_wait(g, p, "all_reduce"))) return st;
            memcpy(recv + (off + plo) * es, slot(s, p, s->step + 1) + plo * es, (phi - plo) * es);
        }
        step_end(g);
    }
    return TP_OK;
}

/* Elements of each peer's part that fit in this rank's two slot buffers,
 * used as scratch by the single-copy reductions: during those, nobody
 * reads this rank's slots (every peer has passed the step that last did). */
#define CMA_CHUNK_MAX (256u << 10)

static size_t cma_chunk(shm_group *s, int n, size_t es)
{
    size_t per = 2 * s->slot_bytes / (size_t)(n - 1) / 64 * 64;
    /* 256 KiB chunks: the input chunk, the scratch and the result stay in
     * L2 between the read, the reduction and the write-back (measured 64 KiB
     * to 512 KiB: 256 KiB was 10-20 % faster for 4 and 16 MiB). */
    if (per > CMA_CHUNK_MAX) per = CMA_CHUNK_MAX;
    return (per < 64 ? 64 : per) / es;
}

/* Copies `bytes` into member p's address space. */
static tp_status cma_write(tp_group *g, int p, size_t dst, const void *src, size_t bytes)
{
    shm_group *s = sg(g);
    const char *from = src;
    while (bytes > 0) {
        struct iovec l = {(void *)from, bytes}, r = {(void *)(uintptr_t)dst, bytes};
        ssize_t k = process_vm_writev(s->pid[p], &l, 1, &r, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return tp_fail(TP_ERR_COMM, "rank %d could not write rank %d's buffer (pid %d): %s",
                           g->global[g->rank], g->global[p], s->pid[p],
                           k < 0 ? strerror(errno) : "no progress");
        from += k;
        dst += (size_t)k;
        bytes -= (size_t)k;
    }
    return TP_OK;
}

/* A row-wise step on the reduced rows before they are written out
 * (tp_comm_all_reduce_rows); piece offsets are then whole rows. */
typedef struct {
    tp_comm_rows_fn fn;
    void *ctx;
    size_t row_len;
} rows_step;

/* Reads piece [off, off + m) of every peer's `send` (addresses from their
 * step info) into the scratch, reduces it with ours in rank order into
 * dst, applies the rows step if any, and, when peer_recv is given, writes
 * each chunk into every peer's recv at the same offset while it is still in
 * this core's cache. */
static tp_status cma_reduce_piece(tp_group *g, const size_t *peer_send, const size_t *peer_recv,
                                  const char *send, char *dst, size_t off, size_t m, tp_dtype dt,
                                  tp_reduce_op op, scratch *sc, const rows_step *rs)
{
    shm_group *s = sg(g);
    size_t es = tp_dtype_size(dt), per = cma_chunk(s, g->size, es);
    if (rs) per = per < rs->row_len ? rs->row_len : per / rs->row_len * rs->row_len;
    char *scr = slot(s, g->rank, 0);
    for (size_t c = 0; c < m; c += per) {
        size_t k = min_size(per, m - c);
        for (int p = 0, j = 0; p < g->size; p++) {
            if (p == g->rank) { sc->ptr[p] = send + (off + c) * es; continue; }
            char *buf = scr + (size_t)j++ * per * es;
            tp_status st = cma_read(g, p, buf, peer_send[p] + (off + c) * es, k * es);
            if (st) return st;
            sc->ptr[p] = buf;
        }
        tp_comm_reduce_ordered(dst + c * es, sc->ptr, g->size, k, dt, op);
        if (rs && rs->fn)
            rs->fn(rs->ctx, (int64_t)((off + c) / rs->row_len), (int64_t)(k / rs->row_len), (float *)(dst + c * es));
        for (int p = 0; p < g->size && peer_recv; p++) {
            if (p == g->rank) continue;
            tp_status st = cma_write(g, p, peer_recv[p] + (off + c) * es, dst + c * es, k * es);
            if (st) return st;
        }
    }
    return TP_OK;
}

/* Step A publishes the buffers.  Each rank then reduces its share, reading
 * the peers' inputs in place, and writes the result into its own and every
 * peer's output.  Step B says that all shares are everywhere, and keeps
 * the buffers untouched until the last access is over.  Share q of every
 * rank's buffers is touched by rank q alone (read the input chunk, then
 * write the output chunk), so in place works too. */
static tp_status cma_all_reduce(tp_group *g, const char *send, char *recv, size_t count, tp_dtype dt,
                                tp_reduce_op op, scratch *sc, const shm_step_info *info, const rows_step *rs,
                                const size_t *row_counts)
{
    int n = g->size;
    size_t es = tp_dtype_size(dt), lo, hi;
    size_t *peer_send = sc->size, *peer_recv = sc->aux;
    tp_status st = step_begin(g, info);
    if (st) return st;
    step_post(g);
    if ((st = step_wait_all(g, "all_reduce"))) return st;
    for (int p = 0; p < n; p++) {
        peer_send[p] = peer_addr(g, p)->send;
        peer_recv[p] = peer_addr(g, p)->recv;
    }
    if (row_counts) {   /* rank r's share: its own rows */
        lo = 0;
        for (int p = 0; p < g->rank; p++) lo += row_counts[p] * rs->row_len;
        hi = lo + row_counts[g->rank] * rs->row_len;
    } else {
        share(count, es, g->rank, n, &lo, &hi);
    }
    st = cma_reduce_piece(g, peer_send, peer_recv, send, recv + lo * es, lo, hi - lo, dt, op, sc, rs);
    if (st) return st;
    step_end(g);
    return step_sync(g, info, "all_reduce");
}

static tp_status shm_all_reduce(tp_group *g, const void *send, void *recv, size_t count,
                                tp_dtype dt, tp_reduce_op op)
{
    scratch sc;
    tp_status st = scratch_init(&sc, g->size);
    if (st) return st;
    shm_group *s = sg(g);
    size_t bytes = count * tp_dtype_size(dt);
    int single_copy = bytes >= s->cma_min;
    shm_step_info info = describe(K_ALL_REDUCE, dt, op, 0, count, NULL, 0, single_copy ? send : NULL,
                                  single_copy ? recv : NULL);
    /* Small: every rank reduces the whole message itself (one step).
     * Large: each reduces 1/n and the pieces are gathered, reading the
     * peers' buffers directly when allowed, through the slots otherwise. */
    if (bytes <= s->oneshot_max && bytes < s->cma_min)
        st = oneshot(g, send, recv, count, dt, op, &sc, &info);
    else if (single_copy)
        st = cma_all_reduce(g, send, recv, count, dt, op, &sc, &info, NULL, NULL);
    else
        st = twoshot(g, send, recv, count, dt, op, &sc, &info);
    scratch_free(&sc);
    return st;
}

/* Large: the single-copy all-reduce with each rank's share its own rows
 * and the rows step applied to each reduced chunk before it is written
 * out — the all-reduce's one exchange, the step on data still in cache.
 * Small (or no single copy): reduce-scatter, the step, all-gather. */
static tp_status shm_all_reduce_rows(tp_group *g, const float *send, float *recv, const size_t *row_counts,
                                     size_t row_len, tp_comm_rows_fn fn, void *ctx)
{
    size_t rows = 0;
    for (int p = 0; p < g->size; p++) rows += row_counts[p];
    size_t count = rows * row_len;
    /* A chunk holds whole rows, and the scratch at most cma_chunk's. */
    if (count == 0 || count * sizeof(float) < sg(g)->cma_min || row_len > cma_chunk(sg(g), g->size, sizeof(float)))
        return tp_comm_all_reduce_rows_steps(g, send, recv, row_counts, row_len, fn, ctx);
    scratch sc;
    tp_status st = scratch_init(&sc, g->size);
    if (st) return st;
    shm_step_info info = describe(K_ALL_REDUCE_ROWS, TP_F32, TP_REDUCE_SUM, 0, count, row_counts, g->size, send,
                                  recv);
    rows_step rs = {fn, ctx, row_len};
    st = cma_all_reduce(g, (const char *)send, (char *)recv, count, TP_F32, TP_REDUCE_SUM, &sc, &info, &rs,
                        row_counts);
    scratch_free(&sc);
    return st;
}

/* ---- all-gather ------------------------------------------------------- */

static tp_status gatherv_steps(tp_group *g, const char *send, char *recv, const size_t *bytes,
                               const size_t *displ, const shm_step_info *info)
{
    shm_group *s = sg(g);
    size_t most = 0;
    for (int p = 0; p < g->size; p++) most = bytes[p] > most ? bytes[p] : most;
    size_t per = s->slot_bytes, steps = (most + per - 1) / per;
    for (size_t c = 0; c < steps; c++) {
        size_t mine = part(bytes[g->rank], c, per);
        tp_status st = step_begin(g, info);
        if (st) return st;
        memcpy(slot(s, g->rank, s->step + 1), send + c * per, mine);
        step_post(g);
        for (int p = 0; p < g->size; p++) {
            size_t b = part(bytes[p], c, per);
            /* The first step waits for everyone, to check that all called
             * the same thing before the counts decide the number of steps. */
            if (p == g->rank || (b == 0 && c > 0)) continue;
            if ((st = step_wait(g, p, "all_gather"))) return st;
            memcpy(recv + displ[p] + c * per, slot(s, p, s->step + 1), b);
        }
        step_end(g);
    }
    return TP_OK;
}

/* Step A publishes the buffers, each rank copies every peer's piece
 * straight into its output, step B keeps the inputs alive until then. */
static tp_status cma_gatherv(tp_group *g, char *recv, const size_t *bytes, const size_t *displ,
                             const shm_step_info *info)
{
    tp_status st = step_begin(g, info);
    if (st) return st;
    step_post(g);
    if ((st = step_wait_all(g, "all_gather"))) return st;
    for (int p = 0; p < g->size && st == TP_OK; p++)
        if (p != g->rank)
            st = cma_read(g, p, recv + displ[p], peer_addr(g, p)->send, bytes[p]);
    if (st) return st;
    step_end(g);
    return step_sync(g, info, "all_gather");
}

static tp_status shm_all_gatherv(tp_group *g, const void *send, void *recv, const size_t *counts,
                                 tp_dtype dt)
{
    scratch sc;
    tp_status st = scratch_init(&sc, g->size);
    if (st) return st;
    size_t es = tp_dtype_size(dt), d = 0;
    size_t *displ = sc.aux;   /* sc.size: byte counts */
    for (int p = 0; p < g->size; p++) {
        sc.size[p] = counts[p] * es;
        displ[p] = d;
        d += sc.size[p];
    }
    int single_copy = d > 0 && d >= sg(g)->cma_min;
    shm_step_info info = describe(K_ALL_GATHER, dt, 0, 0, d / (es ? es : 1), counts, g->size,
                                  single_copy ? send : NULL, single_copy ? recv : NULL);
    memcpy((char *)recv + displ[g->rank], send, sc.size[g->rank]);
    if (single_copy) st = cma_gatherv(g, recv, sc.size, displ, &info);
    else st = gatherv_steps(g, send, recv, sc.size, displ, &info);
    scratch_free(&sc);
    return st;
}

/* ---- reduce-scatter --------------------------------------------------- */

/* Each step, every rank writes 1/n of its slot for each destination q;
 * q reduces the n parts addressed to it. */
static tp_status slot_reduce_scatterv(tp_group *g, const char *in, char *recv, const size_t *counts,
                                      const size_t *displ, tp_dtype dt, tp_reduce_op op, scratch *sc,
                                      const shm_step_info *info)
{
    shm_group *s = sg(g);
    int n = g->size, me = g->rank;
    size_t es = tp_dtype_size(dt);
    size_t per = s->slot_bytes / (size_t)n / 64 * 64 / es;   /* elements per part */
    if (per == 0) per = 1;
    size_t most = 0;
    for (int q = 0; q < n; q++) most = counts[q] > most ? counts[q] : most;
    size_t steps = (most + per - 1) / per;
    tp_status st = TP_OK;
    for (size_t c = 0; c < steps && st == TP_OK; c++) {
        if ((st = step_begin(g, info))) break;
        char *mine = slot(s, me, s->step + 1);
        for (int q = 0; q < n; q++)
            if (q != me)
                memcpy(mine + (size_t)q * per * es, in + (displ[q] + c * per) * es, part(counts[q], c, per) * es);
        step_post(g);
        size_t m = part(counts[me], c, per);
        if ((st = step_wait_all(g, "reduce_scatter"))) break;
        for (int p = 0; p < n; p++)
            sc->ptr[p] = p == me ? in + (displ[me] + c * per) * es
                                 : slot(s, p, s->step + 1) + (size_t)me * per * es;
        tp_comm_reduce_ordered(recv + c * per * es, sc->ptr, n, m, dt, op);
        step_end(g);
    }
    return st;
}

static tp_status shm_reduce_scatterv(tp_group *g, const void *send, void *recv, const size_t *counts,
                                     tp_dtype dt, tp_reduce_op op)
{
    int n = g->size;
    scratch sc;
    tp_status st = scratch_init(&sc, n);
    if (st) return st;
    size_t d = 0, es = tp_dtype_size(dt);
    size_t *displ = sc.aux;   /* sc.size: the peers' send addresses (CMA) */
    for (int q = 0; q < n; q++) { displ[q] = d; d += counts[q]; }
    int single_copy = d > 0 && d * es >= sg(g)->cma_min;
    shm_step_info info = describe(K_REDUCE_SCATTER, dt, op, 0, d, counts, n, single_copy ? send : NULL,
                                  single_copy ? recv : NULL);
    if (single_copy) {
        /* Step A publishes the inputs and each rank reduces its piece
         * reading the peers' inputs in place; step B keeps them alive. */
        if ((st = step_begin(g, &info)) == TP_OK) {
            step_post(g);
            st = step_wait_all(g, "reduce_scatter");
        }
        if (st == TP_OK) {
            for (int p = 0; p < n; p++) sc.size[p] = peer_addr(g, p)->send;
            st = cma_reduce_piece(g, sc.size, NULL, send, recv, displ[g->rank], counts[g->rank], dt, op, &sc, NULL);
        }
        if (st == TP_OK) {
            step_end(g);
            st = step_sync(g, &info, "reduce_scatter");
        }
    } else {
        st = slot_reduce_scatterv(g, send, recv, counts, displ, dt, op, &sc, &info);
    }
    scratch_free(&sc);
    return st;
}

/* ---- broadcast, barrier ----------------------------------------------- */

static tp_status shm_broadcast(tp_group *g, void *buf, size_t bytes, int root)
{
    shm_group *s = sg(g);
    size_t per = s->slot_bytes, steps = (bytes + per - 1) / per;
    int me_root = g->rank == root;
    shm_step_info info = describe(K_BROADCAST, TP_U8, 0, root, bytes, NULL, 0, NULL, NULL);
    for (size_t c = 0; c < steps; c++) {
        size_t b = part(bytes, c, per);
        tp_status st = step_begin(g, &info);
        if (st) return st;
        if (me_root) memcpy(slot(s, root, s->step + 1), (char *)buf + c * per, b);
        step_post(g);
        if (!me_root) {
            if ((st = step_wait(g, root, "broadcast"))) return st;
            memcpy((char *)buf + c * per, slot(s, root, s->step + 1), b);
        }
        step_end(g);
    }
    return TP_OK;
}

static tp_status shm_barrier(tp_group *g)
{
    shm_step_info info = describe(K_BARRIER, TP_U8, 0, 0, 0, NULL, 0, NULL, NULL);
    return step_sync(g, &info, "barrier");
}

/* ---- all-to-all ------------------------------------------------------- */

/* First step: everyone publishes its send and receive counts, and every
 * rank checks the whole matrix, so that a mismatch fails on all ranks alike
 * instead of leaving some of them waiting. */
static tp_status exchange_counts(tp_group *g, const size_t *sc, const size_t *rc, size_t *most,
                                 const shm_step_info *info)
{
    shm_group *s = sg(g);
    int n = g->size;
    tp_status st = step_begin(g, info);
    if (st) return st;
    uint64_t *mine = (uint64_t *)(void *)slot(s, g->rank, s->step + 1);
    for (int q = 0; q < n; q++) { mine[q] = sc[q]; mine[n + q] = rc[q]; }
    step_post(g);
    if ((st = step_wait_all(g, "all_to_all"))) return st;
    *most = 0;
    for (int p = 0; p < n && st == TP_OK; p++) {
        const uint64_t *cp = (const uint64_t *)(void *)slot(s, p, s->step + 1);
        for (int q = 0; q < n; q++) {
            const uint64_t *cq = (const uint64_t *)(void *)slot(s, q, s->step + 1);
            if (cp[q] != cq[n + p]) {
                st = tp_fail(TP_ERR_INVALID, "rank %d sends %llu elements to rank %d, which expects %llu",
                             p, (unsigned long long)cp[q], q, (unsigned long long)cq[n + p]);
                break;
            }
            if (cp[q] > *most) *most = cp[q];
        }
    }
    step_end(g);
    return st;
}

static tp_status shm_all_to_allv(tp_group *g, const void *send, const size_t *send_counts,
                                 void *recv, const size_t *recv_counts, tp_dtype dt)
{
    shm_group *s = sg(g);
    int n = g->size, me = g->rank;
    if ((size_t)n * 16 > s->slot_bytes)
        return tp_fail(TP_ERR_UNSUPPORTED, "all_to_all over %d ranks needs larger shm slots", n);
    size_t most, es = tp_dtype_size(dt);
    /* Counts differ per rank here; exchange_counts checks them. */
    shm_step_info info = describe(K_ALL_TO_ALL, dt, 0, 0, 0, NULL, 0, NULL, NULL);
    tp_status st = exchange_counts(g, send_counts, recv_counts, &most, &info);
    if (st) return st;
    scratch sc;
    if ((st = scratch_init(&sc, n))) return st;
    size_t *sdispl = sc.size, *rdispl = sc.aux, sd = 0, rd = 0;
    for (int q = 0; q < n; q++) {
        sdispl[q] = sd; sd += send_counts[q];
        rdispl[q] = rd; rd += recv_counts[q];
    }
    const char *in = send;
    char *out = recv;
    memcpy(out + rdispl[me] * es, in + sdispl[me] * es, send_counts[me] * es);
    size_t per = s->slot_bytes / (size_t)n / 64 * 64 / es;
    if (per == 0) per = 1;
    size_t steps = (most + per - 1) / per;
    for (size_t c = 0; c < steps && st == TP_OK; c++) {
        if ((st = step_begin(g, &info))) break;
        char *mine = slot(s, me, s->step + 1);
        for (int q = 0; q < n; q++)
            if (q != me)
                memcpy(mine + (size_t)q * per * es, in + (sdispl[q] + c * per) * es, part(send_counts[q], c, per) * es);
        step_post(g);
        for (int p = 0; p < n && st == TP_OK; p++) {
            size_t b = part(recv_counts[p], c, per) * es;
            if (p == me || b == 0) continue;
            if ((st = step_wait(g, p, "all_to_all"))) break;
            memcpy(out + (rdispl[p] + c * per) * es, slot(s, p, s->step + 1) + (size_t)me * per * es, b);
        }
        if (st == TP_OK) step_end(g);
    }
    scratch_free(&sc);
    return st;
}

/* ---- point to point --------------------------------------------------- */

/* One message = max(1, ceil(bytes / buffer)) chunks through the pair's
 * mailbox; `total` lets the receiver check the size on the first chunk. */
typedef struct {
    shm_p2p *ch;
    char *buf;
    char *data;
    size_t bytes, off;
    int active, first;
} p2p_side;

static int try_send(p2p_side *x, size_t cap)
{
    uint64_t posted = atomic_load_explicit(&x->ch->posted, memory_order_relaxed);
    if (atomic_load_explicit(&x->ch->consumed, memory_order_acquire) != posted) return 0;
    size_t b = min_size(cap, x->bytes - x->off);
    memcpy(x->buf, x->data + x->off, b);
    x->ch->len = b;
    x->ch->total = x->bytes;
    atomic_store_explicit(&x->ch->posted, posted + 1, memory_order_release);
    x->off += b;
    x->active = x->off < x->bytes;
    return 1;
}

static tp_status try_recv(p2p_side *x, int *progress, int from, int me)
{
    uint64_t consumed = atomic_load_explicit(&x->ch->consumed, memory_order_relaxed);
    if (atomic_load_explicit(&x->ch->posted, memory_order_acquire) == consumed) return TP_OK;
    if (x->first && x->ch->total != x->bytes)
        return tp_fail(TP_ERR_COMM, "rank %d sent %llu bytes but rank %d expects %zu", from,
                       (unsigned long long)x->ch->total, me, x->bytes);
    x->first = 0;
    size_t b = x->ch->len;
    memcpy(x->data + x->off, x->buf, b);
    atomic_store_explicit(&x->ch->consumed, consumed + 1, memory_order_release);
    x->off += b;
    x->active = x->off < x->bytes;
    *progress = 1;
    return TP_OK;
}

static tp_status shm_sendrecv(tp_group *g, const void *send, size_t send_bytes, int dst,
                              void *recv, size_t recv_bytes, int src)
{
    shm_world *w = sg(g)->w;
    int me = w->me;
    p2p_side tx = {0}, rx = {0};
    size_t cap = w->h->p2p_bytes;
    if (dst >= 0) {
        tx.ch = tp_shm_p2p(w, me, g->global[dst], &tx.buf);
        tx.data = (char *)send;
        tx.bytes = send_bytes;
        tx.active = 1;   /* even an empty message is one chunk */
    }
    if (src >= 0) {
        rx.ch = tp_shm_p2p(w, g->global[src], me, &rx.buf);
        rx.data = recv;
        rx.bytes = recv_bytes;
        rx.active = rx.first = 1;
    }
    shm_backoff b;
    tp_shm_backoff_init(&b, w);
    while (tx.active || rx.active) {
        int progress = 0;
        if (tx.active) progress |= try_send(&tx, cap);
        if (rx.active) {
            tp_status st = try_recv(&rx, &progress, g->global[src], me);
            if (st) return st;
        }
        if (progress) continue;
        int peer = tx.active ? g->global[dst] : g->global[src];
        tp_status st = tp_shm_backoff(&b, w, g, peer, tx.active ? "a send to be taken" : "a message");
        if (st) return st;
    }
    return TP_OK;
}

/* ---- groups ----------------------------------------------------------- */

static tp_status shm_new_sub(tp_group *parent, const int *ranks, int n, tp_group *child);
static void shm_free(tp_group *g);

static const tp_comm_ops shm_ops = {
    .name = "shm",
    .all_reduce = shm_all_reduce,
    .all_gatherv = shm_all_gatherv,
    .reduce_scatterv = shm_reduce_scatterv,
    .all_reduce_rows = shm_all_reduce_rows,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .all_to_allv = shm_all_to_allv,
    .sendrecv = shm_sendrecv,
    .new_sub = shm_new_sub,
    .free = shm_free,
};

static tp_status attach_group(tp_group *g, shm_world *w, int area)
{
    shm_group *s = calloc(1, sizeof *s);
    if (!s) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status st = tp_shm_group_view(w, area, g->size, s);
    if (st) { free(s); return st; }
    w->refs++;
    g->ops = &shm_ops;
    g->impl = s;
    return TP_OK;
}

/* How many sub-groups with this member list this process made before:
 * creating the same list twice must give two distinct groups, and every
 * member counts the same way. */
static tp_status next_occurrence(shm_world *w, uint64_t hash, int *count)
{
    for (int i = 0; i < w->nocc; i++)
        if (w->occ[i].hash == hash) { *count = ++w->occ[i].count; return TP_OK; }
    if (w->nocc == w->capocc) {
        int cap = w->capocc ? 2 * w->capocc : 16;
        void *p = realloc(w->occ, (size_t)cap * sizeof *w->occ);
        if (!p) return tp_fail(TP_ERR_NOMEM, "out of memory");
        w->occ = p;
        w->capocc = cap;
    }
    w->occ[w->nocc].hash = hash;
    w->occ[w->nocc++].count = *count = 0;
    return TP_OK;
}

static tp_status shm_new_sub(tp_group *parent, const int *ranks, int n, tp_group *child)
{
    (void)ranks;
    if (n == 1) {
        tp_status st = tp_comm_self_init(child);
        child->backend = TP_BACKEND_SHM;
        return st;
    }
    shm_world *w = sg(parent)->w;
    int32_t members[STACK_RANKS], *m = n <= STACK_RANKS ? members : malloc((size_t)n * sizeof(int32_t));
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) m[i] = child->global[i];
    uint64_t hash = tp_comm_hash(m, (size_t)n * sizeof(int32_t), 0);
    int count = 0, area = -1;
    tp_status st = next_occurrence(w, hash, &count);
    uint64_t key = tp_comm_hash(&count, sizeof count, hash);
    if (st == TP_OK) st = tp_shm_area_open(w, child, m, n, key, child->rank == 0, &area);
    if (st == TP_OK) st = attach_group(child, w, area);
    if (st && area > 0) tp_shm_area_close(w, area);
    if (m != members) free(m);
    return st;
}

static void shm_free(tp_group *g)
{
    shm_group *s = sg(g);
    if (!s) return;
    tp_shm_area_close(s->w, s->area);
    tp_shm_detach(s->w);
    tp_shm_group_view_free(s);
    free(s);
    g->impl = NULL;
}

tp_status tp_comm_shm_init(tp_group *g, const tp_comm_env *e)
{
    shm_world *w;
    tp_status st = tp_shm_attach(&w, e, e->timeout_s);
    if (st) return st;
    st = attach_group(g, w, 0);
    tp_shm_detach(w);   /* the group holds its own reference now */
    return st;
}
