/* worker_dist: the multi-rank check of dist/ (tests/e2e/test_dist.py).
 *
 * Run as every rank of a job (`tensorpar launch -n N -- worker_dist`, or
 * under mpirun).  For many global shapes, dtypes and
 * every pair of placements it builds a source DTensor, redistributes it and
 * compares this rank's local result, bit for bit, with a serial computation:
 * every rank can compute the whole global tensor (and every rank's Partial
 * summand) from the seed.  Values are multiples of 1/4 in [-4, 4], so sums
 * of up to a few summands are exact in f32 and bf16 whatever the order.
 * A last check with non-integer data compares hashes across all ranks. */
#include "worker_args.h"
#include "tensorpar/base.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t seed;
    int verbose;
    long checks, failures;
    uint64_t hash;            /* of the non-integer results, for --out-dir */
    char where[160];
} st_ctx;

/* ---- the serial reference -------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Element `idx` of the summand tagged `tag` (one tag per Partial coordinate). */
static double value(uint64_t seed, int tag, int64_t idx)
{
    uint64_t h = mix(seed ^ mix((uint64_t)tag * 1000003u + (uint64_t)idx));
    return (double)((int)(h % 33) - 16) / 4.0;
}

/* The tag of the Partial coordinates `pc` over the mesh dims in `mask`. */
static int tag_of(const int *sizes, const int *pc, int mnd, unsigned mask)
{
    int t = 0;
    for (int g = 0; g < mnd; g++)
        if (mask & (1u << g)) t = t * sizes[g] + pc[g];
    return t;
}

/* Sum over all coordinate tuples of the dims in `sum_mask` (the others fixed
 * at `coords`) of the summands tagged over `src_mask`. */
static double summed(uint64_t seed, const int *sizes, const int *coords, int mnd, unsigned src_mask,
                     unsigned sum_mask, int64_t idx)
{
    int pc[TP_MESH_MAX_DIMS];
    memcpy(pc, coords, sizeof pc);
    for (int g = 0; g < mnd; g++)
        if (sum_mask & (1u << g)) pc[g] = 0;
    double s = 0;
    for (;;) {
        s += value(seed, tag_of(sizes, pc, mnd, src_mask), idx);
        int g = mnd - 1;
        for (; g >= 0; g--) {
            if (!(sum_mask & (1u << g))) continue;
            if (++pc[g] < sizes[g]) break;
            pc[g] = 0;
        }
        if (g < 0) return s;
    }
}

static unsigned partial_mask(const tp_placement *pl, int mnd)
{
    unsigned m = 0;
    for (int g = 0; g < mnd; g++)
        if (pl[g].kind == TP_PARTIAL) m |= 1u << g;
    return m;
}

static void store(void *buf, tp_dtype dt, int64_t i, double v)
{
    if (dt == TP_BF16) ((uint16_t *)buf)[i] = tp_bf16_from_f32((float)v);
    else ((float *)buf)[i] = (float)v;
}

/* This rank's local tensor for placements `pl` when the Partial dims of
 * `src_pl` carry the summands: reduced where pl is not Partial, kept where
 * both are, and "rank 0 keeps" where only pl is (tp-semantics §1.5). */
static tp_status expected_local(const st_ctx *c, const tp_mesh *m, const tp_placement *src_pl,
                                const tp_placement *pl, tp_dtype dt, int ndim, const int64_t *gshape,
                                tp_tensor *out)
{
    int mnd = tp_mesh_ndim(m);
    const int *sizes = tp_mesh_sizes(m), *coords = tp_mesh_coords(m);
    tp_dim_layout L[TP_MAX_DIMS];
    int64_t ls[TP_MAX_DIMS];
    tp_status st = tp_placement_layout(mnd, sizes, coords, pl, ndim, gshape, L);
    for (int i = 0; i < ndim; i++) ls[i] = L[i].nblocks * L[i].size;
    if (!st) st = tp_tensor_init(out, dt, ndim, ls);
    if (st) return st;
    unsigned sm = partial_mask(src_pl, mnd), dm = partial_mask(pl, mnd);
    for (int g = 0; g < mnd; g++)
        if ((dm & ~sm & (1u << g)) && coords[g] != 0) return TP_OK;   /* zeros */
    int64_t n = tp_tensor_numel(out);
    for (int64_t l = 0; l < n; l++) {
        int64_t rest = l, gidx = 0, mul = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            int64_t li = rest % ls[i];
            rest /= ls[i];
            int64_t gi = (li / L[i].size) * L[i].block_len + L[i].start + li % L[i].size;
            gidx += gi * mul;
            mul *= gshape[i];
        }
        store(out->data, dt, l, summed(c->seed, sizes, coords, mnd, sm, sm & ~dm, gidx));
    }
    return TP_OK;
}

/* ---- one redistribution ---------------------------------------------- */

static const char *pl_list(const tp_placement *pl, int mnd, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int g = 0; g < mnd && o < cap; g++) {
        char b[48];
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", g ? "," : "", tp_placement_str(pl[g], b, sizeof b));
    }
    return buf;
}

static void fail(st_ctx *c, const tp_mesh *m, const tp_placement *a, const tp_placement *b, tp_dtype dt,
                 int ndim, const int64_t *gs, const char *what)
{
    char x[200], y[200], s[64];
    c->failures++;
    if (c->failures > 20) return;
    fprintf(stderr, "worker_dist: rank %d: %s: %s %s [%s] -> [%s]: %s\n", tp_mesh_world_rank(m), c->where,
            tp_dtype_name(dt), tp_shape_str(ndim, gs, s, sizeof s), pl_list(a, tp_mesh_ndim(m), x, sizeof x),
            pl_list(b, tp_mesh_ndim(m), y, sizeof y), what);
}

static int same_shapes_everywhere(const tp_placement *a, const tp_placement *b, int mnd, int ndim)
{
    for (int g = 0; g < mnd; g++) {
        int sharded = a[g].kind == TP_SHARD || a[g].kind == TP_STRIDED_SHARD || b[g].kind == TP_SHARD ||
                      b[g].kind == TP_STRIDED_SHARD;
        if (sharded && !tp_placement_equal(a[g], b[g], ndim)) return 0;
    }
    return 1;
}

/* Redistributes src_pl -> dst_pl (through the DTensor API and, for the
 * in-place path, the raw-buffer one) and checks the result.  A collective
 * error is fatal: the groups are unusable afterwards. */
static tp_status check_pair(st_ctx *c, const tp_mesh *m, const tp_placement *src_pl, const tp_placement *dst_pl,
                            tp_dtype dt, int ndim, const int64_t *gs)
{
    tp_tensor want_src, want_dst;
    tp_dtensor src, out;
    tp_status st = expected_local(c, m, src_pl, src_pl, dt, ndim, gs, &want_src);
    if (st) return st;
    st = expected_local(c, m, src_pl, dst_pl, dt, ndim, gs, &want_dst);
    if (!st) st = tp_dtensor_from_local(&src, m, src_pl, dt, ndim, gs, want_src.data);
    if (!st) st = tp_redistribute(&src, dst_pl, &out);
    if (!st) {
        c->checks++;
        if (memcmp(out.local.shape, want_dst.shape, sizeof out.local.shape))
            fail(c, m, src_pl, dst_pl, dt, ndim, gs, "wrong local shape");
        else if (memcmp(out.local.data, want_dst.data, tp_tensor_nbytes(&want_dst)))
            fail(c, m, src_pl, dst_pl, dt, ndim, gs, "wrong values");
        tp_dtensor_release(&out);
    }
    /* In place, when the local shapes are equal on every rank (it is a
     * collective: all ranks must agree to run it): the per-layer path. */
    if (!st && same_shapes_everywhere(src_pl, dst_pl, tp_mesh_ndim(m), ndim)) {
        st = tp_redistribute_local(m, dt, ndim, gs, src_pl, want_src.data, dst_pl, want_src.data);
        c->checks++;
        if (!st && memcmp(want_src.data, want_dst.data, tp_tensor_nbytes(&want_dst)))
            fail(c, m, src_pl, dst_pl, dt, ndim, gs, "wrong values in place");
    }
    tp_tensor_release(&want_src);
    tp_tensor_release(&want_dst);
    if (st) fail(c, m, src_pl, dst_pl, dt, ndim, gs, tp_error());
    return st;
}

/* ---- the suites -------------------------------------------------------- */

/* Every placement that makes sense for the shape: Replicate, Partial, Shard
 * of each dim (and -1), StridedShard with 2 or 3 blocks where divisible. */
static int placements_for(int ndim, const int64_t *gs, tp_placement *out)
{
    int n = 0;
    out[n++] = tp_replicate();
    out[n++] = tp_partial();
    for (int d = 0; d < ndim; d++) out[n++] = tp_shard(d);
    if (ndim > 1) out[n++] = tp_shard(-1);
    for (int d = 0; d < ndim; d++)
        for (int s = 2; s <= 3; s++)
            if (gs[d] > 0 && gs[d] % s == 0) out[n++] = tp_strided_shard(d, s);
    return n;
}

typedef struct { int ndim; int64_t shape[TP_MAX_DIMS]; } shape_case;

static const shape_case SHAPES_1D[] = {
    {2, {10, 6}},      /* 10 over 3: 4,4,2; 10 over 4: 3,3,3,1 */
    {2, {5, 4}},       /* 5 over 4: 2,2,1,0 */
    {3, {2, 3, 4}},    /* 2 over 3 or 4: empty tail shards */
    {4, {3, 1, 2, 6}}, /* 4-D */
    {1, {7}},
    {2, {0, 3}},       /* nothing at all */
};

static const shape_case SHAPES_2D[] = {
    {2, {10, 6}},
    {3, {5, 2, 4}},
};

static tp_status suite_1d(st_ctx *c, const tp_mesh *m, const char *name)
{
    tp_dtype dts[2] = {TP_F32, TP_BF16};
    for (size_t k = 0; k < sizeof SHAPES_1D / sizeof SHAPES_1D[0]; k++) {
        const shape_case *sc = &SHAPES_1D[k];
        tp_placement pl[16];
        int np = placements_for(sc->ndim, sc->shape, pl);
        snprintf(c->where, sizeof c->where, "%s", name);
        for (int t = 0; t < 2; t++)
            for (int a = 0; a < np; a++)
                for (int b = 0; b < np; b++) {
                    tp_status st = check_pair(c, m, &pl[a], &pl[b], dts[t], sc->ndim, sc->shape);
                    if (st) return st;
                }
    }
    return TP_OK;
}

/* On a 2-D mesh: every pair of placement lists from {R, P, S0, S1,
 * SS(last, 2)}² that is valid (a strided dim is not sharded twice). */
static tp_status suite_2d(st_ctx *c, const tp_mesh *m)
{
    for (size_t k = 0; k < sizeof SHAPES_2D / sizeof SHAPES_2D[0]; k++) {
        const shape_case *sc = &SHAPES_2D[k];
        tp_placement one[5] = {tp_replicate(), tp_partial(), tp_shard(0), tp_shard(1),
                               tp_strided_shard(sc->ndim - 1, 2)};
        tp_placement lists[25][2];
        int nl = 0;
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 5; j++) {
                tp_placement cand[2] = {one[i], one[j]}, tmp[2];
                if (tp_placements_normalize(2, cand, sc->ndim, sc->shape, tmp)) continue;
                memcpy(lists[nl++], cand, sizeof cand);
            }
        tp_clear_error();
        tp_dtype dt = k % 2 ? TP_BF16 : TP_F32;
        snprintf(c->where, sizeof c->where, "2-D mesh %dx%d", tp_mesh_size(m, 0), tp_mesh_size(m, 1));
        for (int a = 0; a < nl; a++)
            for (int b = 0; b < nl; b++) {
                tp_status st = check_pair(c, m, lists[a], lists[b], dt, sc->ndim, sc->shape);
                if (st) return st;
            }
    }
    return TP_OK;
}

/* The mesh itself: coordinates, consecutive TP groups, sub-mesh lookup. */
static void check_mesh(st_ctx *c, const tp_mesh *m)
{
    int W = tp_mesh_world_size(m), R = tp_mesh_world_rank(m), tp = tp_mesh_size(m, 1);
    const tp_mesh *sub = tp_mesh_sub(m, "tp");
    tp_group *g = sub ? tp_mesh_group(sub, 0) : NULL;
    int ok = sub && tp_mesh_ndim(sub) == 1 && g && tp_group_size(g) == tp && tp_group_rank(g) == R % tp &&
             tp_mesh_coord(m, 0) == R / tp && tp_mesh_size(m, 0) * tp == W && !tp_mesh_sub(m, "pp");
    for (int r = 0; ok && r < tp; r++) ok = tp_group_global_rank(g, r) == R / tp * tp + r;
    tp_group *dp = tp_mesh_group(m, 0);
    for (int r = 0; ok && r < tp_group_size(dp); r++) ok = tp_group_global_rank(dp, r) == r * tp + R % tp;
    c->checks++;
    if (!ok) {
        c->failures++;
        fprintf(stderr, "worker_dist: rank %d: mesh groups are not row-major\n", R);
    }
    tp_clear_error();
}

/* Non-integer data: Partial -> Replicate must give identical bits on all
 * ranks; compared through a hash gathered over the world. */
static tp_status check_bitwise(st_ctx *c, tp_group *world, const tp_mesh *m, tp_dtype dt)
{
    int64_t gs[2] = {37, 129};
    tp_tensor x;
    tp_status st = tp_tensor_init(&x, dt, 2, gs);
    if (st) return st;
    tp_rng rng;
    tp_rng_seed(&rng, c->seed * 7919u + (uint64_t)tp_mesh_world_rank(m));
    for (int64_t i = 0; i < gs[0] * gs[1]; i++) store(x.data, dt, i, tp_rng_normal(&rng));
    tp_placement src[2] = {tp_partial(), tp_partial()}, dst[2] = {tp_replicate(), tp_replicate()};
    st = tp_redistribute_local(m, dt, 2, gs, src, x.data, dst, x.data);
    int W = tp_group_size(world);
    int64_t h = 1469598103934665603ll, *all = calloc((size_t)W, sizeof *all);
    for (size_t i = 0; i < tp_tensor_nbytes(&x); i++)
        h = (int64_t)(((uint64_t)h ^ ((unsigned char *)x.data)[i]) * 1099511628211ull);
    if (!st) st = all ? tp_comm_all_gather(world, &h, all, 1, TP_I64) : TP_ERR_NOMEM;
    c->hash = c->hash * 31u + (uint64_t)h;
    c->checks++;
    for (int r = 0; !st && r < W; r++)
        if (all[r] != h) {
            c->failures++;
            fprintf(stderr, "worker_dist: rank %d: %s all-reduce differs from rank %d's\n",
                    tp_mesh_world_rank(m), tp_dtype_name(dt), r);
            break;
        }
    free(all);
    tp_tensor_release(&x);
    return st;
}

static tp_status run_all(st_ctx *c, tp_group *world)
{
    int W = tp_group_size(world);
    tp_mesh *m1 = NULL, *m2 = NULL;
    int sizes[2] = {W % 2 == 0 ? W / 2 : 1, W % 2 == 0 ? 2 : W};
    const char *names[2] = {"dp", "tp"};
    tp_status st = tp_mesh_new_1d(world, "tp", &m1);
    if (!st) st = suite_1d(c, m1, "1-D mesh");
    if (!st) st = tp_mesh_new(world, 2, names, sizes, &m2);
    if (!st) check_mesh(c, m2);
    if (!st) st = suite_2d(c, m2);
    /* The tp row of the 2-D mesh as a mesh of its own (mesh["tp"]). */
    if (!st && sizes[0] > 1) st = suite_1d(c, tp_mesh_sub(m2, "tp"), "mesh[\"tp\"]");
    for (int t = 0; !st && t < 2; t++) st = check_bitwise(c, world, t ? m2 : m1, t ? TP_BF16 : TP_F32);
    tp_mesh_free(m2);
    tp_mesh_free(m1);
    return st;
}

/* The transport must not change results (§5.4): tests compare these files
 * across backends. */
static tp_status write_hash(const char *dir, int rank, uint64_t h)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.hash", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) return tp_fail(TP_ERR_IO, "%s: cannot create", path);
    fprintf(f, "%016llx\n", (unsigned long long)h);
    return fclose(f) ? tp_fail(TP_ERR_IO, "%s: write failed", path) : TP_OK;
}

static int report(const char *prog)
{
    fprintf(stderr, "%s: error: %s\n", prog, tp_error());
    return 1;
}

int main(int argc, char **argv)
{
    enum { SEED, VERBOSE, OUT_DIR, NOPTS };
    worker_opt o[NOPTS] = {
        {"--seed", 1, NULL},     /* seed of the test data (default 1) */
        {"--verbose", 0, NULL},  /* print the number of checks of every rank */
        {"--out-dir", 1, NULL},  /* write DIR/rank<R>.hash: a hash of the non-integer results */
    };
    const char *prog = "worker_dist";
    double seed;
    if (worker_parse(prog, argc, argv, o, NOPTS) || worker_number(prog, &o[SEED], 1, &seed)) return 2;
    st_ctx c = {(uint64_t)seed, o[VERBOSE].value != NULL, 0, 0, 0, ""};
    tp_group *world;
    if (tp_comm_init(&world, NULL)) return report(prog);
    tp_status st = run_all(&c, world);
    int R = tp_group_rank(world), W = tp_group_size(world);
    const char *backend = tp_backend_name(tp_group_backend(world));
    if (!st && c.failures == 0) st = tp_comm_barrier(world);
    tp_group_free(world);
    if (st) return report(prog);
    const char *dir = o[OUT_DIR].value;
    if (dir && write_hash(dir, R, c.hash)) return report(prog);
    if (c.verbose || (R == 0 && c.failures == 0))
        printf("worker_dist: rank %d of %d (%s): %ld checks, %ld failed\n", R, W, backend, c.checks,
               c.failures);
    return c.failures ? 1 : 0;
}
