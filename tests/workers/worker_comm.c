/* worker_comm: the rank program of the collective tests (tests/e2e).
 *
 * Launched as N ranks (tensorpar launch, mpirun, or by hand), it runs every
 * collective over the world and over mesh-like sub-groups, for f32 and bf16
 * (and, for all-reduce, f16/f64/i32/i64), for many sizes including zero,
 * uneven and chunk-crossing ones, and compares each result bit for bit
 * with a serial computation done here from the inputs every rank can
 * regenerate.  Each rank prints a hash of everything it received (--out-dir
 * DIR writes it to DIR/rank<R>.hash), so runs on different backends can be
 * compared; with --out-dir each rank also writes DIR/rank<R>.pid once it
 * has joined.
 *
 * --loop SECONDS instead runs all-reduces for that long (the kill tests);
 * --stall-rank R then makes rank R stop answering after 0.5 s. */
#include "worker_args.h"
#include "tensorpar/base.h"
#include "tensorpar/comm.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    tp_group *g;       /* group under test */
    const char *label;
    int failures, checks;
    uint64_t hash;     /* of everything received                        */
    uint64_t ar_hash;  /* of the world all-reduce results: equal on all ranks */
    uint64_t seed;     /* bumped per test so inputs differ */
} ctx;

/* ---- deterministic inputs ----------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Element i of the input of (global) rank r: values of varied magnitude, so
 * that summing in another order would change the bits. */
static double value(uint64_t seed, int r, size_t i)
{
    uint64_t h = mix(seed * 1000003u + (uint64_t)r * 7919u + i);
    double m = (double)(h >> 11) / 9007199254740992.0 - 0.5;   /* [-0.5, 0.5) */
    int e = (int)((h >> 3) & 15) - 8;
    return m * (double)(1 << (e + 8)) / 256.0;
}

static void fill(void *buf, tp_dtype dt, uint64_t seed, int r, size_t off, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double v = value(seed, r, off + i);
        switch (dt) {
        case TP_F32: ((float *)buf)[i] = (float)v; break;
        case TP_BF16: ((uint16_t *)buf)[i] = tp_bf16_from_f32((float)v); break;
        case TP_F16: ((uint16_t *)buf)[i] = tp_f16_from_f32((float)v); break;
        case TP_F64: ((double *)buf)[i] = v; break;
        case TP_I32: ((int32_t *)buf)[i] = (int32_t)(v * 1e6); break;
        case TP_I64: ((int64_t *)buf)[i] = (int64_t)(v * 1e15); break;
        default: memset((char *)buf + i * tp_dtype_size(dt), (int)(v * 100), tp_dtype_size(dt)); break;
        }
    }
}

/* The serial reference: element i summed over ranks 0..n-1 in order, in f32
 * for f32/bf16/f16, rounded once. */
static void reference_sum(void *out, tp_dtype dt, uint64_t seed, const int *ranks, int n, size_t off, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float f = 0;
        double d = 0;
        uint64_t u = 0;
        for (int k = 0; k < n; k++) {
            double v = value(seed, ranks[k], off + i);
            switch (dt) {
            case TP_F32: f = k ? f + (float)v : (float)v; break;
            case TP_BF16: { float x = tp_f32_from_bf16(tp_bf16_from_f32((float)v)); f = k ? f + x : x; break; }
            case TP_F16: { float x = tp_f32_from_f16(tp_f16_from_f32((float)v)); f = k ? f + x : x; break; }
            case TP_F64: d = k ? d + v : v; break;
            case TP_I32: u = (uint32_t)((uint32_t)u + (uint32_t)(int32_t)(v * 1e6)); break;
            case TP_I64: u += (uint64_t)(int64_t)(v * 1e15); break;
            default: break;
            }
        }
        switch (dt) {
        case TP_F32: ((float *)out)[i] = f; break;
        case TP_BF16: ((uint16_t *)out)[i] = tp_bf16_from_f32(f); break;
        case TP_F16: ((uint16_t *)out)[i] = tp_f16_from_f32(f); break;
        case TP_F64: ((double *)out)[i] = d; break;
        case TP_I32: ((int32_t *)out)[i] = (int32_t)(uint32_t)u; break;
        case TP_I64: ((int64_t *)out)[i] = (int64_t)u; break;
        default: break;
        }
    }
}

/* ---- checking ------------------------------------------------------------ */

static void absorb(ctx *c, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) c->hash = (c->hash ^ b[i]) * 1099511628211ull;
}

static void expect(ctx *c, int ok, const char *what, tp_dtype dt, size_t count)
{
    c->checks++;
    if (ok) return;
    c->failures++;
    fprintf(stderr, "worker_comm: rank %d: %s: %s %s count %zu: wrong result\n",
            tp_group_global_rank(c->g, tp_group_rank(c->g)), c->label, what, tp_dtype_name(dt), count);
}

static int call_ok(ctx *c, tp_status st, const char *what)
{
    if (st == TP_OK) return 1;
    c->failures++;
    fprintf(stderr, "worker_comm: %s: %s: %s\n", c->label, what, tp_error());
    return 0;
}

/* Compares got with want, hashes got. */
static int same(ctx *c, const void *got, const void *want, size_t bytes)
{
    absorb(c, got, bytes);
    return bytes == 0 || memcmp(got, want, bytes) == 0;
}

static void *xmalloc(size_t n) { void *p = malloc(n ? n : 1); if (!p) abort(); return p; }

/* Global ranks of the group's members, for the reference computations. */
static int *members(tp_group *g)
{
    int n = tp_group_size(g), *m = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) m[i] = tp_group_global_rank(g, i);
    return m;
}

static int me_global(tp_group *g) { return tp_group_global_rank(g, tp_group_rank(g)); }

/* ---- the collectives ----------------------------------------------------- */

static void test_all_reduce(ctx *c, tp_dtype dt, size_t count, int in_place)
{
    size_t es = tp_dtype_size(dt), bytes = count * es;
    int n = tp_group_size(c->g), *m = members(c->g);
    uint64_t seed = ++c->seed;
    char *in = xmalloc(bytes), *out = xmalloc(bytes), *want = xmalloc(bytes);
    fill(in, dt, seed, me_global(c->g), 0, count);
    reference_sum(want, dt, seed, m, n, 0, count);
    tp_status st = tp_comm_all_reduce(c->g, in, in_place ? in : out, count, dt, TP_REDUCE_SUM);
    if (call_ok(c, st, "all_reduce")) {
        expect(c, same(c, in_place ? in : out, want, bytes), in_place ? "all_reduce (in place)" : "all_reduce", dt, count);
        if (!strcmp(c->label, "world")) {
            uint64_t keep = c->hash;
            c->hash = c->ar_hash;
            absorb(c, in_place ? in : out, bytes);
            c->ar_hash = c->hash;
            c->hash = keep;
        }
    }
    free(in); free(out); free(want); free(m);
}

/* Counts per rank for a total T: pattern 0 equal-ish, 1 torch.chunk rule
 * (ceil(T/n) each, the tail short or empty), 2 irregular with zeros. */
static void make_counts(size_t *counts, int n, size_t total, int pattern, uint64_t seed)
{
    size_t left = total;
    for (int r = 0; r < n; r++) {
        size_t k;
        if (pattern == 0) k = total / (size_t)n + ((size_t)r < total % (size_t)n);
        else if (pattern == 1) { size_t ch = (total + (size_t)n - 1) / (size_t)n; k = ch < left ? ch : left; }
        else k = r == n - 1 ? left : (mix(seed + (uint64_t)r) % 3 == 0 ? 0 : (size_t)(mix(seed ^ (uint64_t)r) % (left + 1)));
        if (k > left) k = left;
        counts[r] = k;
        left -= k;
    }
    counts[n - 1] += left;
}

static void test_all_gather(ctx *c, tp_dtype dt, size_t total, int pattern)
{
    int n = tp_group_size(c->g), me = tp_group_rank(c->g), *m = members(c->g);
    size_t es = tp_dtype_size(dt), *counts = xmalloc((size_t)n * sizeof(size_t));
    uint64_t seed = ++c->seed;
    make_counts(counts, n, total, pattern, seed);
    char *in = xmalloc(counts[me] * es), *out = xmalloc(total * es), *want = xmalloc(total * es);
    fill(in, dt, seed, m[me], 0, counts[me]);
    size_t off = 0;
    for (int r = 0; r < n; r++) { fill(want + off * es, dt, seed, m[r], 0, counts[r]); off += counts[r]; }
    tp_status st = pattern == 0 && total % (size_t)n == 0
                       ? tp_comm_all_gather(c->g, in, out, total / (size_t)n, dt)
                       : tp_comm_all_gatherv(c->g, in, out, counts, dt);
    if (call_ok(c, st, "all_gather")) expect(c, same(c, out, want, total * es), "all_gather", dt, total);
    free(in); free(out); free(want); free(counts); free(m);
}

static void test_reduce_scatter(ctx *c, tp_dtype dt, size_t total, int pattern)
{
    int n = tp_group_size(c->g), me = tp_group_rank(c->g), *m = members(c->g);
    size_t es = tp_dtype_size(dt), *counts = xmalloc((size_t)n * sizeof(size_t));
    uint64_t seed = ++c->seed;
    make_counts(counts, n, total, pattern, seed);
    size_t off = 0;
    for (int r = 0; r < me; r++) off += counts[r];
    char *in = xmalloc(total * es), *out = xmalloc(counts[me] * es), *want = xmalloc(counts[me] * es);
    fill(in, dt, seed, m[me], 0, total);
    reference_sum(want, dt, seed, m, n, off, counts[me]);
    tp_status st = pattern == 0 && total % (size_t)n == 0
                       ? tp_comm_reduce_scatter(c->g, in, out, total / (size_t)n, dt, TP_REDUCE_SUM)
                       : tp_comm_reduce_scatterv(c->g, in, out, counts, dt, TP_REDUCE_SUM);
    if (call_ok(c, st, "reduce_scatter"))
        expect(c, same(c, out, want, counts[me] * es), "reduce_scatter", dt, total);
    free(in); free(out); free(want); free(counts); free(m);
}

/* all_reduce_rows: each rank's fn must see exactly its own rows, in
 * ascending calls, holding the rank-order sums; every rank must then hold
 * every row as its owner's fn left it (here: sum * 0.5 + row index). */
typedef struct {
    size_t first, rows, seen;   /* this rank's rows; rows fn was given so far */
    size_t row_len;
    int bad;
} rows_probe;

static void rows_fn(void *p, int64_t first_row, int64_t nrows, float *rows)
{
    rows_probe *pr = p;
    if ((size_t)first_row != pr->first + pr->seen || pr->seen + (size_t)nrows > pr->rows || nrows <= 0) pr->bad = 1;
    pr->seen += (size_t)(nrows > 0 ? nrows : 0);
    for (int64_t r = 0; r < nrows; r++)
        for (size_t j = 0; j < pr->row_len; j++)
            rows[r * (int64_t)pr->row_len + (int64_t)j] = rows[r * (int64_t)pr->row_len + (int64_t)j] * 0.5f +
                                                          (float)(first_row + r);
}

static void test_all_reduce_rows(ctx *c, size_t rows, size_t row_len, int pattern)
{
    int n = tp_group_size(c->g), me = tp_group_rank(c->g), *m = members(c->g);
    size_t *counts = xmalloc((size_t)n * sizeof(size_t)), total = rows * row_len;
    uint64_t seed = ++c->seed;
    make_counts(counts, n, rows, pattern, seed);
    rows_probe pr = {0, counts[me], 0, row_len, 0};
    for (int r = 0; r < me; r++) pr.first += counts[r];
    float *in = xmalloc(total * sizeof(float)), *out = xmalloc(total * sizeof(float));
    float *want = xmalloc(total * sizeof(float));
    fill(in, TP_F32, seed, m[me], 0, total);
    reference_sum(want, TP_F32, seed, m, n, 0, total);
    for (size_t i = 0; i < total; i++) want[i] = want[i] * 0.5f + (float)(i / row_len);
    tp_status st = tp_comm_all_reduce_rows(c->g, in, out, counts, row_len, rows_fn, &pr);
    if (call_ok(c, st, "all_reduce_rows")) {
        expect(c, !pr.bad && pr.seen == pr.rows, "all_reduce_rows (the rows its step saw)", TP_F32, total);
        expect(c, same(c, out, want, total * sizeof(float)), "all_reduce_rows", TP_F32, total);
    }
    free(in); free(out); free(want); free(counts); free(m);
}

static void test_broadcast(ctx *c, tp_dtype dt, size_t count, int root)
{
    size_t es = tp_dtype_size(dt);
    uint64_t seed = ++c->seed;
    char *buf = xmalloc(count * es), *want = xmalloc(count * es);
    int groot = tp_group_global_rank(c->g, root);
    fill(want, dt, seed, groot, 0, count);
    if (tp_group_rank(c->g) == root) memcpy(buf, want, count * es);
    else memset(buf, 0xab, count * es);
    if (call_ok(c, tp_comm_broadcast(c->g, buf, count, dt, root), "broadcast"))
        expect(c, same(c, buf, want, count * es), "broadcast", dt, count);
    free(buf); free(want);
}

/* Elements rank p sends to rank q (known to everyone). */
static size_t a2a_count(uint64_t seed, int p, int q, size_t scale)
{
    uint64_t h = mix(seed * 31u + (uint64_t)p * 131u + (uint64_t)q);
    return h % 4 == 0 ? 0 : (size_t)(h % (scale + 1));
}

static void test_all_to_all(ctx *c, tp_dtype dt, size_t scale, int equal)
{
    int n = tp_group_size(c->g), me = tp_group_rank(c->g), *m = members(c->g);
    size_t es = tp_dtype_size(dt), *sc = xmalloc((size_t)n * sizeof(size_t)), *rc = xmalloc((size_t)n * sizeof(size_t));
    uint64_t seed = ++c->seed;
    size_t st_total = 0, rt_total = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = equal ? scale : a2a_count(seed, me, q, scale);
        rc[q] = equal ? scale : a2a_count(seed, q, me, scale);
        st_total += sc[q];
        rt_total += rc[q];
    }
    char *in = xmalloc(st_total * es), *out = xmalloc(rt_total * es), *want = xmalloc(rt_total * es);
    size_t off = 0;
    /* Piece p->q: values of rank p with an index offset of q*1e6. */
    for (int q = 0; q < n; q++) { fill(in + off * es, dt, seed, m[me], (size_t)q * 1000000u, sc[q]); off += sc[q]; }
    off = 0;
    for (int p = 0; p < n; p++) { fill(want + off * es, dt, seed, m[p], (size_t)me * 1000000u, rc[p]); off += rc[p]; }
    tp_status st = equal ? tp_comm_all_to_all(c->g, in, out, scale, dt) : tp_comm_all_to_allv(c->g, in, sc, out, rc, dt);
    if (call_ok(c, st, "all_to_all")) expect(c, same(c, out, want, rt_total * es), "all_to_all", dt, st_total);
    free(in); free(out); free(want); free(sc); free(rc); free(m);
}

/* A ring shift with sendrecv, then 0 -> last with plain send/recv. */
static void test_p2p(ctx *c, tp_dtype dt, size_t count)
{
    int n = tp_group_size(c->g), me = tp_group_rank(c->g), *m = members(c->g);
    size_t es = tp_dtype_size(dt);
    uint64_t seed = ++c->seed;
    int to = (me + 1) % n, from = (me + n - 1) % n;
    char *in = xmalloc(count * es), *out = xmalloc(count * es), *want = xmalloc(count * es);
    fill(in, dt, seed, m[me], 0, count);
    fill(want, dt, seed, m[from], 0, count);
    if (call_ok(c, tp_comm_sendrecv(c->g, in, count, to, out, count, from, dt), "sendrecv"))
        expect(c, same(c, out, want, count * es), "sendrecv", dt, count);
    if (n > 1 && me == 0) call_ok(c, tp_comm_send(c->g, in, count, dt, n - 1), "send");
    if (n > 1 && me == n - 1) {
        fill(want, dt, seed, m[0], 0, count);
        if (call_ok(c, tp_comm_recv(c->g, out, count, dt, 0), "recv"))
            expect(c, same(c, out, want, count * es), "send/recv", dt, count);
    }
    free(in); free(out); free(want); free(m);
}

/* ---- suites -------------------------------------------------------------- */

/* tp_comm_agree: all succeed; the last rank fails; ranks 1 and last fail
 * (the lowest failing rank's message wins, its code on every rank). */
static void test_agree(ctx *c)
{
    int n = tp_group_size(c->g), me = tp_group_rank(c->g);
    char want[128];
    c->checks++;
    call_ok(c, tp_comm_agree(c->g, TP_OK), "agree, all fine");
    for (int round = 0; round < 2 && n > 1; round++) {
        int fails = me == n - 1 || (round == 1 && me == 1);
        tp_status mine = fails ? tp_fail(TP_ERR_IO, "disk of rank %d is full", me) : TP_OK;
        tp_status got = tp_comm_agree(c->g, mine);
        int root = round == 1 ? 1 : n - 1;
        if (me == root) snprintf(want, sizeof want, "disk of rank %d is full", root);
        else snprintf(want, sizeof want, "rank %d: disk of rank %d is full", root, root);
        expect(c, got == TP_ERR_IO && !strcmp(tp_error(), want), "agree message", TP_U8, (size_t)round);
        tp_clear_error();
    }
}

static void suite(ctx *c, int full)
{
    /* Sizes around the interesting edges: empty, tiny, the one-shot limit
     * (64 KiB), the slot size (256 KiB), several slots. */
    static const size_t sizes[] = {0, 1, 7, 33, 1000, 16384, 16385, 65537, 200003};
    static const tp_dtype dts[] = {TP_F32, TP_BF16};
    size_t nsizes = full ? sizeof sizes / sizeof sizes[0] : 6;
    int n = tp_group_size(c->g);
    for (size_t d = 0; d < 2; d++)
        for (size_t s = 0; s < nsizes; s++) {
            test_all_reduce(c, dts[d], sizes[s], (int)(s & 1));
            for (int pattern = 0; pattern < 3; pattern++) {
                test_all_gather(c, dts[d], sizes[s], pattern);
                test_reduce_scatter(c, dts[d], sizes[s], pattern);
            }
            test_broadcast(c, dts[d], sizes[s], (int)(s % (size_t)n));
            test_p2p(c, dts[d], sizes[s]);
        }
    static const tp_dtype more[] = {TP_F16, TP_F64, TP_I32, TP_I64};
    for (size_t d = 0; d < 4; d++) {
        test_all_reduce(c, more[d], 1001, 0);
        test_all_reduce(c, more[d], full ? 70001 : 3001, 1);
    }
    /* Rows: tiny, around the single-copy limit, rows wider than a copy chunk,
     * more ranks than rows, uneven shares. */
    static const size_t rows_shapes[][2] = {{3, 5}, {70, 1024}, {300, 1024}, {1000, 260}, {1, 4096}, {3, 100000}};
    for (size_t s = 0; s < (full ? 6u : 4u); s++)
        test_all_reduce_rows(c, rows_shapes[s][0], rows_shapes[s][1], (int)(s % 3));
    static const size_t scales[] = {0, 5, 3000, 100000};
    for (size_t s = 0; s < (full ? 4u : 3u); s++) {
        test_all_to_all(c, TP_F32, scales[s], 0);
        test_all_to_all(c, TP_BF16, scales[s], 1);
    }
    c->checks++;
    call_ok(c, tp_comm_barrier(c->g), "barrier");
    test_agree(c);
}

/* World 4 as (dp=2, tp=2): tp groups of consecutive ranks made with
 * tp_group_new_sub, dp groups of strided ranks made with tp_group_split. */
static void sub_groups(ctx *world, int full)
{
    int n = tp_group_size(world->g), me = tp_group_rank(world->g);
    if (n < 2) return;
    int first = me / 2 * 2, tp_ranks[2] = {first, first + 1}, tp_n = first + 1 < n ? 2 : 1;
    tp_group *tp = NULL, *dp = NULL;
    if (!call_ok(world, tp_group_new_sub(world->g, tp_ranks, tp_n, &tp), "new_sub")) return;
    if (!call_ok(world, tp_group_split(world->g, me % 2, me, &dp), "split")) { tp_group_free(tp); return; }
    ctx c = *world;
    c.g = tp;
    c.label = "tp sub-group";
    expect(&c, tp_group_size(tp) == tp_n && tp_group_global_rank(tp, tp_group_rank(tp)) == me, "tp group layout", TP_F32, 0);
    suite(&c, 0);
    c.g = dp;
    c.label = "dp sub-group";
    expect(&c, tp_group_size(dp) == (n - me % 2 + 1) / 2 && tp_group_global_rank(dp, 0) == me % 2, "dp group layout", TP_F32, 0);
    suite(&c, full);
    /* The same member list twice gives two distinct, working groups. */
    tp_group *again = NULL;
    if (call_ok(&c, tp_group_new_sub(world->g, tp_ranks, tp_n, &again), "new_sub again")) {
        c.g = again;
        c.label = "second tp sub-group";
        test_all_reduce(&c, TP_F32, 4097, 0);
        tp_group_free(again);
    }
    world->checks = c.checks;
    world->failures = c.failures;
    world->hash = c.hash;
    world->ar_hash = c.ar_hash;
    world->seed = c.seed;
    tp_group_free(tp);
    tp_group_free(dp);
}

/* All ranks must hold the same all-reduce bits: compare their hashes. */
static void compare_hashes(ctx *c)
{
    int n = tp_group_size(c->g);
    int64_t *all = xmalloc((size_t)n * sizeof(int64_t)), mine = (int64_t)c->ar_hash;
    if (call_ok(c, tp_comm_all_gather(c->g, &mine, all, 1, TP_I64), "all_gather of hashes"))
        for (int r = 0; r < n; r++) expect(c, all[r] == mine, "all-reduce hash equal on all ranks", TP_I64, (size_t)r);
    free(all);
}

/* All-reduces for `seconds`; rank `stall` stops answering after 0.5 s and
 * just sleeps, like a hung peer. */
static int loop(ctx *c, double seconds, int stall)
{
    float buf[1024];
    double start = tp_now(), end = start + seconds;
    long iters = 0;
    while (tp_now() < end) {
        if (tp_group_rank(c->g) == stall && tp_now() - start > 0.5) {
            while (tp_now() < end) usleep(10000);
            break;
        }
        for (int i = 0; i < 1024; i++) buf[i] = (float)i;
        if (tp_comm_all_reduce(c->g, buf, buf, 1024, TP_F32, TP_REDUCE_SUM) != TP_OK) {
            fprintf(stderr, "worker_comm: rank %d: %s\n", tp_group_rank(c->g), tp_error());
            return 1;
        }
        iters++;
    }
    printf("worker_comm: rank %d: %ld all-reduces\n", tp_group_rank(c->g), iters);
    return 0;
}

static int write_file(const char *dir, int rank, const char *ext, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.%s", dir, rank, ext);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    return rename(tmp, path);
}

int main(int argc, char **argv)
{
    enum { QUICK, OUT_DIR, LOOP, BACKEND, STALL, NOPTS };
    worker_opt opts[NOPTS] = {
        {"--quick", 0, NULL},      /* fewer sizes */
        {"--out-dir", 1, NULL},    /* write DIR/rank<R>.hash and .pid */
        {"--loop", 1, NULL},       /* only run all-reduces for this many seconds */
        {"--backend", 1, NULL},    /* shm, mpi or self (default: from the environment) */
        {"--stall-rank", 1, NULL}, /* with --loop: this rank stops answering after 0.5 s */
    };
    const char *prog = "worker_comm";
    double loop_s, stall;
    if (worker_parse(prog, argc, argv, opts, NOPTS) || worker_number(prog, &opts[LOOP], 0, &loop_s) ||
        worker_number(prog, &opts[STALL], -1, &stall))
        return 2;
    tp_comm_options co;
    const char *b = opts[BACKEND].value;
    tp_group *world;
    if (tp_comm_options_from_env(&co) || (b && tp_backend_parse(b, &co.backend)) || tp_comm_init(&world, &co)) {
        fprintf(stderr, "%s: error: %s\n", prog, tp_error());
        return 1;
    }
    int me = tp_group_rank(world), n = tp_group_size(world);
    const char *dir = opts[OUT_DIR].value;
    char text[64];
    if (dir) {
        snprintf(text, sizeof text, "%d\n", (int)getpid());
        write_file(dir, me, "pid", text);
    }
    ctx c = {.g = world, .label = "world", .hash = 1469598103934665603ull, .ar_hash = 1469598103934665603ull};
    if (loop_s > 0) {
        int rc = loop(&c, loop_s, (int)stall);
        tp_group_free(world);
        return rc;
    }
    int full = !opts[QUICK].value;
    suite(&c, full);
    sub_groups(&c, full);
    compare_hashes(&c);
    printf("worker_comm: rank %d of %d (%s): %d checks, %d failed, hash %016llx\n", me, n,
           tp_backend_name(tp_group_backend(world)), c.checks, c.failures, (unsigned long long)c.hash);
    if (dir) {
        snprintf(text, sizeof text, "%016llx\n", (unsigned long long)c.hash);
        write_file(dir, me, "hash", text);
    }
    tp_group_free(world);
    return c.failures ? 1 : 0;
}
