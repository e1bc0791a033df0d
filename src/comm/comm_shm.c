/* The shm backend's collectives.
 *
 * Every collective is a sequence of numbered steps on the group's area.  In
 * step k each rank may write its slot buffer k%2, publishes seq[me] = k,
 * reads the slots of the ranks it needs once their seq reaches k, and
 * publishes done[me] = k.  Before writing buffer k%2 again a rank waits for
 * done >= k-2 of every member, i.e. for everyone to have finished reading
 * it.  Two buffers let a rank fill the next step while others still read
 * the last one.  Counters are C11 atomics with release/acquire ordering; no
 * locks.  Messages larger than a slot go through in chunks.
 *
 * Reductions use tp_comm_reduce_ordered (rank 0 + rank 1 + ... in the
 * accumulation type), so one-shot and two-shot give the same bits. */
#include "shm.h"

#include <stdlib.h>
#include <string.h>

static shm_group *sg(tp_group *g) { return g->impl; }

static char *slot(shm_group *s, int r, uint64_t step)
{
    return s->data + ((size_t)r * 2 + (size_t)(step & 1)) * s->slot_bytes;
}

/* ---- steps ------------------------------------------------------------ */

/* Starts step k; if this rank will write its buffer, first waits until
 * every member has finished step k-2 (the last reader of that buffer). */
static tp_status step_begin(tp_group *g, int will_write, const char *op)
{
    shm_group *s = sg(g);
    uint64_t k = s->step + 1;
    if (!will_write || k <= 2) return TP_OK;
    for (int p = 0; p < g->size; p++) {
        if (p == g->rank) continue;
        tp_status st = tp_shm_wait_ge(s->w, g, &s->done[p].v, k - 2, g->global[p], op);
        if (st) return st;
    }
    return TP_OK;
}

static void step_post(tp_group *g)
{
    shm_group *s = sg(g);
    atomic_store_explicit(&s->seq[g->rank].v, s->step + 1, memory_order_release);
}

static tp_status step_wait(tp_group *g, int p, const char *op)
{
    shm_group *s = sg(g);
    return tp_shm_wait_ge(s->w, g, &s->seq[p].v, s->step + 1, g->global[p], op);
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

static void step_end(tp_group *g)
{
    shm_group *s = sg(g);
    s->step++;
    atomic_store_explicit(&s->done[g->rank].v, s->step, memory_order_release);
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

/* Every rank copies its chunk in, then reduces the whole chunk itself. */
static tp_status oneshot(tp_group *g, const char *send, char *recv, size_t count, tp_dtype dt,
                         tp_reduce_op op, scratch *sc)
{
    shm_group *s = sg(g);
    size_t es = tp_dtype_size(dt), per = s->slot_bytes / es;
    for (size_t off = 0; off < count; off += per) {
        size_t m = min_size(per, count - off);
        tp_status st = step_begin(g, 1, "all_reduce");
        if (st) return st;
        memcpy(slot(s, g->rank, s->step + 1), send + off * es, m * es);
        step_post(g);
        if ((st = step_wait_all(g, "all_reduce"))) return st;
        for (int p = 0; p < g->size; p++)
            sc->ptr[p] = p == g->rank ? send + off * es : slot(s, p, s->step + 1);
        tp_comm_reduce_ordered(recv + off * es, sc->ptr, g->size, m, dt, op);
        step_end(g);
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
                         tp_reduce_op op, scratch *sc)
{
    shm_group *s = sg(g);
    int n = g->size, me = g->rank;
    size_t es = tp_dtype_size(dt), per = s->slot_bytes / es;
    for (size_t off = 0; off < count; off += per) {
        size_t m = min_size(per, count - off), lo, hi;
        share(m, es, me, n, &lo, &hi);
        /* Step A: publish the others' shares of the chunk (mine is read
         * straight from `send`); reduce my share. */
        tp_status st = step_begin(g, 1, "all_reduce");
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
        if ((st = step_begin(g, 1, "all_reduce"))) return st;
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

static tp_status shm_all_reduce(tp_group *g, const void *send, void *recv, size_t count,
                                tp_dtype dt, tp_reduce_op op)
{
    scratch sc;
    tp_status st = scratch_init(&sc, g->size);
    if (st) return st;
    /* Small: every rank reduces the whole message itself (one step).
     * Large: each reduces 1/n and the pieces are gathered (two steps per
     * chunk), reading n times less of the others' data. */
    if (count * tp_dtype_size(dt) <= sg(g)->oneshot_max)
        st = oneshot(g, send, recv, count, dt, op, &sc);
    else
        st = twoshot(g, send, recv, count, dt, op, &sc);
    scratch_free(&sc);
    return st;
}

/* ---- all-gather ------------------------------------------------------- */

static tp_status gatherv_steps(tp_group *g, const char *send, char *recv, const size_t *bytes,
                               const size_t *displ)
{
    shm_group *s = sg(g);
    size_t most = 0;
    for (int p = 0; p < g->size; p++) most = bytes[p] > most ? bytes[p] : most;
    size_t per = s->slot_bytes, steps = (most + per - 1) / per;
    for (size_t c = 0; c < steps; c++) {
        size_t mine = part(bytes[g->rank], c, per);
        tp_status st = step_begin(g, mine > 0, "all_gather");
        if (st) return st;
        memcpy(slot(s, g->rank, s->step + 1), send + c * per, mine);
        step_post(g);
        for (int p = 0; p < g->size; p++) {
            size_t b = part(bytes[p], c, per);
            if (p == g->rank || b == 0) continue;
            if ((st = step_wait(g, p, "all_gather"))) return st;
            memcpy(recv + displ[p] + c * per, slot(s, p, s->step + 1), b);
        }
        step_end(g);
    }
    return TP_OK;
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
    memcpy((char *)recv + displ[g->rank], send, sc.size[g->rank]);
    st = gatherv_steps(g, send, recv, sc.size, displ);
    scratch_free(&sc);
    return st;
}

/* ---- reduce-scatter --------------------------------------------------- */

/* Each step, every rank writes 1/n of its slot for each destination q;
 * q reduces the n parts addressed to it. */
static tp_status shm_reduce_scatterv(tp_group *g, const void *send, void *recv, const size_t *counts,
                                     tp_dtype dt, tp_reduce_op op)
{
    shm_group *s = sg(g);
    int n = g->size, me = g->rank;
    size_t es = tp_dtype_size(dt);
    size_t per = s->slot_bytes / (size_t)n / 64 * 64 / es;   /* elements per part */
    if (per == 0) per = 1;
    scratch sc;
    tp_status st = scratch_init(&sc, n);
    if (st) return st;
    size_t most = 0, d = 0, mydispl = 0;
    size_t *displ = sc.size;
    for (int q = 0; q < n; q++) {
        displ[q] = d;
        if (q == me) mydispl = d;
        d += counts[q];
        most = counts[q] > most ? counts[q] : most;
    }
    const char *in = send;
    size_t steps = (most + per - 1) / per;
    for (size_t c = 0; c < steps && st == TP_OK; c++) {
        if ((st = step_begin(g, 1, "reduce_scatter"))) break;
        char *mine = slot(s, me, s->step + 1);
        for (int q = 0; q < n; q++)
            if (q != me)
                memcpy(mine + (size_t)q * per * es, in + (displ[q] + c * per) * es, part(counts[q], c, per) * es);
        step_post(g);
        size_t m = part(counts[me], c, per);
        if ((st = step_wait_all(g, "reduce_scatter"))) break;
        for (int p = 0; p < n; p++)
            sc.ptr[p] = p == me ? in + (mydispl + c * per) * es
                                : slot(s, p, s->step + 1) + (size_t)me * per * es;
        tp_comm_reduce_ordered((char *)recv + c * per * es, sc.ptr, n, m, dt, op);
        step_end(g);
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
    for (size_t c = 0; c < steps; c++) {
        size_t b = part(bytes, c, per);
        tp_status st = step_begin(g, me_root, "broadcast");
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
    tp_status st = step_begin(g, 0, "barrier");
    if (st) return st;
    step_post(g);
    if ((st = step_wait_all(g, "barrier"))) return st;
    step_end(g);
    return TP_OK;
}

/* ---- all-to-all ------------------------------------------------------- */

/* First step: everyone publishes its send and receive counts, and every
 * rank checks the whole matrix, so that a mismatch fails on all ranks alike
 * instead of leaving some of them waiting. */
static tp_status exchange_counts(tp_group *g, const size_t *sc, const size_t *rc, size_t *most)
{
    shm_group *s = sg(g);
    int n = g->size;
    tp_status st = step_begin(g, 1, "all_to_all");
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
    tp_status st = exchange_counts(g, send_counts, recv_counts, &most);
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
        if ((st = step_begin(g, 1, "all_to_all"))) break;
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
    tp_shm_backoff_init(&b);
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
    tp_shm_group_view(w, area, s);
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
