/* dist/: the placement arithmetic, redistribution plans, and a one-rank mesh.
 * The multi-rank checks run in the worker_dist test program (tests/workers/,
 * started by tests/e2e/test_dist.py). */
#include "check.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"

#include <string.h>

static void test_chunk(void)
{
    static const struct { int64_t n; int P; int64_t start[4], size[4]; } cases[] = {
        {10, 3, {0, 4, 8}, {4, 4, 2}},
        {5, 4, {0, 2, 4, 5}, {2, 2, 1, 0}},
        {2, 4, {0, 1, 2, 2}, {1, 1, 0, 0}},
        {0, 3, {0, 0, 0}, {0, 0, 0}},
        {7, 1, {0}, {7}},
        {8, 4, {0, 2, 4, 6}, {2, 2, 2, 2}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int r = 0; r < cases[k].P; r++) {
            int64_t s, z;
            tp_chunk_range(cases[k].n, cases[k].P, r, &s, &z);
            CHECK_MSG(s == cases[k].start[r] && z == cases[k].size[r], "n=%lld P=%d r=%d: got %lld+%lld",
                      (long long)cases[k].n, cases[k].P, r, (long long)s, (long long)z);
        }
}

/* The global indices a rank holds along one dim, in local order. */
static int indices(tp_dim_layout L, int64_t *out)
{
    int n = 0;
    for (int64_t l = 0; l < L.nblocks * L.size; l++)
        out[n++] = (l / L.size) * L.block_len + L.start + l % L.size;
    return n;
}

static void test_strided_layout(void)
{
    /* §1.2's examples: n = 8, s = 2, P = 2 and the uneven m = 5. */
    int sizes[1] = {2};
    int64_t got[16];
    tp_placement ss = tp_strided_shard(0, 2);
    tp_dim_layout L;
    int64_t g8[1] = {8}, g10[1] = {10};
    static const int64_t r0[] = {0, 1, 4, 5}, r1[] = {2, 3, 6, 7};
    static const int64_t u0[] = {0, 1, 2, 5, 6, 7}, u1[] = {3, 4, 8, 9};
    int c0[1] = {0}, c1[1] = {1};
    CHECK(tp_placement_layout(1, sizes, c0, &ss, 1, g8, &L) == TP_OK);
    CHECK(indices(L, got) == 4 && !memcmp(got, r0, sizeof r0));
    CHECK(tp_placement_layout(1, sizes, c1, &ss, 1, g8, &L) == TP_OK);
    CHECK(indices(L, got) == 4 && !memcmp(got, r1, sizeof r1));
    CHECK(tp_placement_layout(1, sizes, c0, &ss, 1, g10, &L) == TP_OK);
    CHECK(indices(L, got) == 6 && !memcmp(got, u0, sizeof u0));
    CHECK(tp_placement_layout(1, sizes, c1, &ss, 1, g10, &L) == TP_OK);
    CHECK(indices(L, got) == 4 && !memcmp(got, u1, sizeof u1));
}

/* Every global index is held by exactly one rank (no Partial/Replicate). */
static void test_partition(void)
{
    tp_placement pls[] = {tp_shard(0), tp_strided_shard(0, 2), tp_strided_shard(0, 3)};
    for (int P = 1; P <= 4; P++)
        for (size_t k = 0; k < sizeof pls / sizeof pls[0]; k++)
            for (int64_t n = 0; n <= 13; n++) {
                if (pls[k].kind == TP_STRIDED_SHARD && n % pls[k].split) continue;
                int seen[16] = {0}, ok = 1;
                for (int r = 0; r < P; r++) {
                    tp_dim_layout L;
                    int64_t got[16];
                    ok &= tp_placement_layout(1, &P, &r, &pls[k], 1, &n, &L) == TP_OK;
                    int c = indices(L, got);
                    for (int i = 0; i < c; i++) ok &= got[i] >= 0 && got[i] < n && !seen[got[i]]++;
                }
                for (int64_t i = 0; i < n; i++) ok &= seen[i] == 1;
                CHECK_MSG(ok, "placement %zu, n=%lld, P=%d", k, (long long)n, P);
            }
}

static void test_nested_and_shapes(void)
{
    /* (Shard(0), Shard(0)) on 2x2: 10 -> outer 5,5 -> inner 3,2. */
    int sizes[2] = {2, 2}, coords[2] = {1, 1};
    tp_placement pl[2] = {tp_shard(0), tp_shard(0)};
    int64_t gs[2] = {10, 6}, ls[2];
    tp_dim_layout L[2];
    CHECK(tp_placement_layout(2, sizes, coords, pl, 2, gs, L) == TP_OK);
    CHECK(L[0].start == 8 && L[0].size == 2 && L[1].start == 0 && L[1].size == 6);
    /* Shard(-1) is the last dim; Partial does not split. */
    tp_placement pl2[2] = {tp_partial(), tp_shard(-1)};
    CHECK(tp_placement_local_shape(2, sizes, coords, pl2, 2, gs, ls) == TP_OK);
    CHECK(ls[0] == 10 && ls[1] == 3);
    /* Errors. */
    tp_placement bad[2] = {tp_shard(2), tp_replicate()};
    CHECK(tp_placement_local_shape(2, sizes, coords, bad, 2, gs, ls) == TP_ERR_INVALID);
    tp_placement nodiv[2] = {tp_strided_shard(0, 4), tp_replicate()};
    CHECK(tp_placement_local_shape(2, sizes, coords, nodiv, 2, gs, ls) == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "not divisible") != NULL);
    tp_placement twice[2] = {tp_strided_shard(1, 2), tp_shard(-1)};
    CHECK(tp_placement_local_shape(2, sizes, coords, twice, 2, gs, ls) == TP_ERR_UNSUPPORTED);
    char b[48];
    CHECK(!strcmp(tp_placement_str(tp_strided_shard(0, 2), b, sizeof b), "StridedShard(0, 2)"));
    CHECK(tp_placement_equal(tp_shard(-1), tp_shard(1), 2) && !tp_placement_equal(tp_shard(0), tp_shard(1), 2));
}

/* Plans on a 1-D mesh: the collective each pair needs. */
static void expect_plan(int mnd, const tp_placement *a, const tp_placement *b, int ndim, int n,
                        const tp_collective *want, int line)
{
    tp_placement na[TP_MESH_MAX_DIMS], nb[TP_MESH_MAX_DIMS];
    tp_redist_step st[TP_REDIST_MAX_STEPS];
    int got = -1;
    int ok = tp_placements_normalize(mnd, a, ndim, NULL, na) == TP_OK &&
             tp_placements_normalize(mnd, b, ndim, NULL, nb) == TP_OK &&
             tp_redistribute_plan(mnd, na, nb, ndim, st, &got) == TP_OK && got == n;
    for (int i = 0; ok && i < n; i++) ok = st[i].coll == want[i];
    CHECK_MSG(ok, "plan at line %d: %d steps (want %d), first %s", line, got, n,
              got > 0 ? tp_collective_name(st[0].coll) : "-");
}
#define PLAN1(a, b, ...) do { tp_placement A = a, B = b; tp_collective W[] = {__VA_ARGS__}; \
    expect_plan(1, &A, &B, 3, (int)(sizeof W / sizeof W[0]), W, __LINE__); } while (0)
#define PLAN0(a, b) do { tp_placement A = a, B = b; expect_plan(1, &A, &B, 3, 0, NULL, __LINE__); } while (0)

static void test_plans_1d(void)
{
    PLAN1(tp_partial(), tp_replicate(), TP_COLL_ALL_REDUCE);
    PLAN1(tp_partial(), tp_shard(1), TP_COLL_REDUCE_SCATTER);
    PLAN1(tp_partial(), tp_strided_shard(0, 2), TP_COLL_REDUCE_SCATTER);
    PLAN1(tp_shard(0), tp_replicate(), TP_COLL_ALL_GATHER);
    PLAN1(tp_shard(2), tp_replicate(), TP_COLL_ALL_GATHER);
    PLAN1(tp_strided_shard(0, 2), tp_replicate(), TP_COLL_ALL_GATHER);
    PLAN1(tp_replicate(), tp_shard(-1), TP_COLL_LOCAL_SLICE);
    PLAN1(tp_replicate(), tp_strided_shard(1, 2), TP_COLL_LOCAL_SLICE);
    PLAN1(tp_replicate(), tp_partial(), TP_COLL_ZERO_NONROOT);
    PLAN1(tp_shard(0), tp_shard(2), TP_COLL_ALL_TO_ALL);
    PLAN1(tp_shard(0), tp_strided_shard(0, 2), TP_COLL_ALL_GATHER, TP_COLL_LOCAL_SLICE);
    PLAN1(tp_strided_shard(0, 2), tp_shard(0), TP_COLL_ALL_GATHER, TP_COLL_LOCAL_SLICE);
    PLAN1(tp_strided_shard(0, 2), tp_strided_shard(0, 3), TP_COLL_ALL_GATHER, TP_COLL_LOCAL_SLICE);
    PLAN1(tp_shard(1), tp_partial(), TP_COLL_ALL_GATHER, TP_COLL_ZERO_NONROOT);
    PLAN0(tp_shard(-1), tp_shard(2));
    PLAN0(tp_partial(), tp_partial());
    PLAN0(tp_replicate(), tp_replicate());
}

/* The one decider, every pair of kinds: the first operation and where it
 * lands (to itself, or Replicate for a two-step pair). */
static void test_step_table(void)
{
    enum { R, P, S0, S2, SS0, SS2, SS0b, N };
    tp_placement pl[N] = {tp_replicate(), tp_partial(), tp_shard(0), tp_shard(-1),
                          tp_strided_shard(0, 2), tp_strided_shard(2, 2), tp_strided_shard(0, 4)};
    /* want[from][to]; an upper-case G means all_gather landing on Replicate. */
    static const char *want[N] = {
        /* to:      R P S0 S2 SS0 SS2 SS0b */
        /* R    */ "nzlllll",
        /* P    */ "anrrrrr",
        /* S0   */ "gGntGGG",
        /* S2   */ "gGtnGGG",
        /* SS0  */ "gGGGnGG",
        /* SS2  */ "gGGGGnG",
        /* SS0b */ "gGGGGGn",
    };
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) {
            char w = want[a][b];
            tp_placement via;
            tp_collective c = tp_placement_step(pl[a], pl[b], 3, &via);
            tp_collective wc = w == 'n' ? TP_COLL_NONE : w == 'z' ? TP_COLL_ZERO_NONROOT
                             : w == 'l' ? TP_COLL_LOCAL_SLICE : w == 'a' ? TP_COLL_ALL_REDUCE
                             : w == 'r' ? TP_COLL_REDUCE_SCATTER : w == 't' ? TP_COLL_ALL_TO_ALL
                             : TP_COLL_ALL_GATHER;
            tp_placement wv = w == 'G' ? tp_replicate() : pl[b];
            CHECK_MSG(c == wc && tp_placement_equal(via, wv, 3), "step %d -> %d: %s", a, b, tp_collective_name(c));
        }
    /* Only the moves between ranks count as communication. */
    CHECK(!tp_collective_communicates(TP_COLL_NONE) && !tp_collective_communicates(TP_COLL_LOCAL_SLICE) &&
          !tp_collective_communicates(TP_COLL_ZERO_NONROOT) && tp_collective_communicates(TP_COLL_ALL_REDUCE) &&
          tp_collective_communicates(TP_COLL_ALL_GATHER) && tp_collective_communicates(TP_COLL_REDUCE_SCATTER) &&
          tp_collective_communicates(TP_COLL_ALL_TO_ALL));
}

#define PLAN2(a0, a1, b0, b1, ...) do { tp_placement A[2] = {a0, a1}, B[2] = {b0, b1}; \
    tp_collective W[] = {__VA_ARGS__}; expect_plan(2, A, B, 2, (int)(sizeof W / sizeof W[0]), W, __LINE__); } while (0)

static void test_plans_2d(void)
{
    /* Nested: the inner mesh dim must open before the outer one moves. */
    PLAN2(tp_shard(0), tp_shard(0), tp_replicate(), tp_shard(0),
          TP_COLL_ALL_GATHER, TP_COLL_ALL_GATHER, TP_COLL_LOCAL_SLICE);
    PLAN2(tp_shard(0), tp_shard(0), tp_shard(0), tp_replicate(), TP_COLL_ALL_GATHER);
    PLAN2(tp_shard(0), tp_replicate(), tp_shard(0), tp_shard(1), TP_COLL_LOCAL_SLICE);
    PLAN2(tp_shard(0), tp_shard(1), tp_shard(1), tp_shard(0),
          TP_COLL_ALL_GATHER, TP_COLL_ALL_GATHER, TP_COLL_LOCAL_SLICE, TP_COLL_LOCAL_SLICE);
    PLAN2(tp_partial(), tp_shard(1), tp_replicate(), tp_shard(1), TP_COLL_ALL_REDUCE);
    PLAN2(tp_partial(), tp_partial(), tp_replicate(), tp_replicate(), TP_COLL_ALL_REDUCE, TP_COLL_ALL_REDUCE);
    PLAN2(tp_replicate(), tp_shard(0), tp_replicate(), tp_shard(1), TP_COLL_ALL_TO_ALL);
    PLAN2(tp_replicate(), tp_shard(0), tp_shard(0), tp_shard(1),
          TP_COLL_ALL_GATHER, TP_COLL_LOCAL_SLICE, TP_COLL_LOCAL_SLICE);
}

/* A one-rank job: mesh bookkeeping and every redistribution as a copy. */
static void test_one_rank(void)
{
    tp_comm_options o;
    tp_comm_options_default(&o);
    o.backend = TP_BACKEND_SELF;
    o.rank = 0;
    o.world_size = 1;
    tp_group *world;
    CHECK(tp_comm_init(&world, &o) == TP_OK);
    if (!world) return;
    tp_mesh *m, *m2;
    const char *names[2] = {"dp", "tp"};
    int sizes[2] = {1, 1}, wrong[2] = {2, 2};
    CHECK(tp_mesh_new(world, 2, names, wrong, &m2) == TP_ERR_INVALID);
    CHECK(!strcmp(tp_error(), "The parallel mesh requires 4 processes, but world_size is 1."));
    const char *dup[2] = {"tp", "tp"};
    CHECK(tp_mesh_new(world, 2, dup, sizes, &m2) == TP_ERR_INVALID);
    CHECK(tp_mesh_new(world, 2, names, sizes, &m2) == TP_OK);
    CHECK(tp_mesh_new_1d(world, "tp", &m) == TP_OK);
    CHECK(tp_mesh_sub(m2, "tp") && tp_mesh_ndim(tp_mesh_sub(m2, "tp")) == 1);
    CHECK(tp_mesh_sub(m2, "pp") == NULL && tp_mesh_dim_index(m2, "tp") == 1);
    CHECK(tp_mesh_sub(m, "tp") == m && tp_mesh_group(m, 0) == world);

    int64_t gs[2] = {5, 4};
    float full[20];
    for (int i = 0; i < 20; i++) full[i] = (float)i - 7.5f;
    tp_tensor ft = {TP_F32, 2, {5, 4}, full, 0};
    tp_placement all[] = {tp_replicate(), tp_partial(), tp_shard(0), tp_shard(1), tp_strided_shard(1, 2)};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 5; b++) {
            tp_dtensor x, y;
            tp_tensor back;
            int ok = tp_dtensor_distribute(&x, m, &all[a], &ft) == TP_OK &&
                     tp_redistribute(&x, &all[b], &y) == TP_OK;
            ok = ok && tp_dtensor_full(&y, &back) == TP_OK;
            ok = ok && back.ndim == 2 && back.shape[0] == 5 && !memcmp(back.data, full, sizeof full);
            CHECK_MSG(ok, "one rank: %zu -> %zu: %s", a, b, tp_error());
            if (ok) tp_tensor_release(&back);
            tp_dtensor_release(&y);
            tp_dtensor_release(&x);
        }
    /* Raw buffers, in place. */
    float buf[20];
    memcpy(buf, full, sizeof buf);
    tp_placement p = tp_partial(), r = tp_replicate();
    CHECK(tp_redistribute_local(m, TP_F32, 2, gs, &p, buf, &r, buf) == TP_OK && !memcmp(buf, full, sizeof buf));
    tp_mesh_free(m);
    tp_mesh_free(m2);
    tp_group_free(world);
}

int main(void)
{
    test_chunk();
    test_strided_layout();
    test_partition();
    test_nested_and_shapes();
    test_plans_1d();
    test_step_table();
    test_plans_2d();
    test_one_rank();
    return check_summary();
}
