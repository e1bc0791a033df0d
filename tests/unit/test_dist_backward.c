/* dist/backward.c: tp_redistribute_backward is the conjugate of
 * tp_redistribute.  Where the gradient lands and which collective moves it
 * (pure), then, at P = 2 and 3 over the shm backend, the adjoint identity
 * <g, redistribute(x)> == <redistribute_backward(g), x> on random data for
 * every pair of placements, with g placed as the forward's output and, for
 * Replicate outputs, as a Partial sum. */
#include "check.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R, P, S0, S1, SS1, NPL };
static tp_placement pl_of(int k)
{
    switch (k) {
    case R: return tp_replicate();
    case P: return tp_partial();
    case S0: return tp_shard(0);
    case S1: return tp_shard(-1);
    default: return tp_strided_shard(1, 2);
    }
}

/* The collectives of the backward of fwd_src -> (grad arriving as grad_pl)
 * on a 1-D mesh, as the plan runs them; "" when nothing moves. */
static void backward_steps(int src, tp_placement grad_pl, char *out, size_t cap)
{
    tp_placement s = pl_of(src), dst, ns, nd;
    tp_redistribute_backward_placements(1, &s, &grad_pl, &dst);
    tp_redist_step st[TP_REDIST_MAX_STEPS];
    int n = 0;
    out[0] = 0;
    if (tp_placements_normalize(1, &grad_pl, 2, NULL, &ns) || tp_placements_normalize(1, &dst, 2, NULL, &nd) ||
        tp_redistribute_plan(1, &ns, &nd, 2, st, &n)) {
        snprintf(out, cap, "error");
        return;
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", i ? "+" : "", tp_collective_name(st[i].coll));
    }
}

/* §1.5's backward column, and the Partial-gradient cases. */
static void test_backward_table(void)
{
    static const struct { int src, grad; const char *want; tp_placement_kind lands; } t[] = {
        {R, S0, "all_gather", TP_REPLICATE},           /* Replicate -> Shard: slice; back: gather */
        {S0, R, "local_slice", TP_SHARD},              /* Shard -> Replicate: gather; back: keep own chunk */
        {S0, P, "reduce_scatter", TP_SHARD},           /* ... with a partial-sum gradient */
        {P, R, "", TP_REPLICATE},                      /* all-reduce; back: nothing */
        {P, P, "", TP_PARTIAL},                        /* a partial gradient stays partial */
        {P, S1, "all_gather", TP_REPLICATE},           /* reduce-scatter; back: all-gather */
        {R, P, "all_reduce", TP_REPLICATE},            /* zero non-root / AllReduceBackward */
        {R, R, "", TP_REPLICATE},
        {S0, S1, "all_to_all", TP_SHARD},              /* all-to-all; back: all-to-all */
        {SS1, R, "local_slice", TP_STRIDED_SHARD},     /* gather + interleave; back: own strided part */
        {SS1, S1, "all_gather+local_slice", TP_STRIDED_SHARD},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char got[96];
        tp_placement g = pl_of(t[i].grad), s = pl_of(t[i].src), lands;
        backward_steps(t[i].src, g, got, sizeof got);
        tp_redistribute_backward_placements(1, &s, &g, &lands);
        CHECK_MSG(!strcmp(got, t[i].want) && lands.kind == t[i].lands, "backward %zu: %s (want %s), lands %d",
                  i, got, t[i].want, (int)lands.kind);
    }
}

/* ---- the adjoint identity over real ranks -------------------------------- */

/* A deterministic random fill, the same on every rank for the same seed. */
static void fill(float *v, int64_t n, unsigned seed)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v[i] = (float)((double)(s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
    }
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

enum { D0 = 5, D1 = 6, NEL = D0 * D1 };

/* A gradient DTensor placed `gp` whose global value is G.  A Partial one is
 * made of different random summands on every rank (G is their sum), so a
 * backward that reduced the wrong way would show. */
static tp_status make_grad(const tp_mesh *m, tp_placement gp, int case_seed, float *G, tp_dtensor *g)
{
    int64_t gs[2] = {D0, D1};
    if (gp.kind != TP_PARTIAL) {
        fill(G, NEL, (unsigned)case_seed);
        tp_tensor t = {TP_F32, 2, {D0, D1}, G, 0};
        return tp_dtensor_distribute(g, m, &gp, &t);
    }
    float part[NEL];
    memset(G, 0, NEL * sizeof *G);
    for (int q = 0; q < tp_mesh_size(m, 0); q++) {
        fill(part, NEL, (unsigned)(case_seed * 31 + q));
        for (int i = 0; i < NEL; i++) G[i] += part[i];
    }
    tp_status st = tp_dtensor_init(g, m, &gp, TP_F32, 2, gs);
    if (!st) fill(g->local.data, NEL, (unsigned)(case_seed * 31 + tp_mesh_coord(m, 0)));
    return st;
}

/* One (from, to, gradient placement) case: forward, backward, both sides. */
static void adjoint_case(const tp_mesh *m, int a, int b, tp_placement gp, int seed)
{
    float X[NEL], G[NEL];
    fill(X, NEL, 1000u + (unsigned)seed);
    tp_tensor xt = {TP_F32, 2, {D0, D1}, X, 0};
    tp_placement from = pl_of(a), to = pl_of(b), want;
    tp_dtensor x, y, g, gx;
    tp_tensor yf = {0}, gxf = {0};
    memset(&g, 0, sizeof g);
    memset(&gx, 0, sizeof gx);
    int ok = tp_dtensor_distribute(&x, m, &from, &xt) == TP_OK && tp_redistribute(&x, &to, &y) == TP_OK;
    ok = ok && make_grad(m, gp, seed, G, &g) == TP_OK && tp_redistribute_backward(&g, &from, &gx) == TP_OK;
    ok = ok && tp_dtensor_full(&y, &yf) == TP_OK && tp_dtensor_full(&gx, &gxf) == TP_OK;
    CHECK_MSG(ok, "case %d -> %d (grad %d): %s", a, b, (int)gp.kind, tp_error());
    if (ok) {
        tp_redistribute_backward_placements(1, &from, &gp, &want);
        double lhs = dot(G, yf.data, NEL), rhs = dot(gxf.data, X, NEL);
        CHECK_MSG(tp_placement_equal(gx.placements[0], want, 2), "case %d -> %d: gradient placement", a, b);
        CHECK_MSG(fabs(lhs - rhs) <= 1e-5 * (1 + fabs(lhs)),
                  "case %d -> %d (grad %d), P=%d: <g, Rx> = %.9g, <R*g, x> = %.9g", a, b, (int)gp.kind,
                  tp_mesh_size(m, 0), lhs, rhs);
    }
    tp_tensor_release(&yf);
    tp_tensor_release(&gxf);
    tp_dtensor_release(&gx);
    tp_dtensor_release(&g);
    if (ok) { tp_dtensor_release(&y); tp_dtensor_release(&x); }
}

static int rank_main(void)
{
    tp_group *world;
    tp_mesh *m;
    if (tp_comm_init(&world, NULL) != TP_OK || tp_mesh_new_1d(world, "tp", &m) != TP_OK) {
        fprintf(stderr, "rank: %s\n", tp_error());
        return 1;
    }
    int seed = 0;
    for (int a = 0; a < NPL; a++)
        for (int b = 0; b < NPL; b++) {
            adjoint_case(m, a, b, pl_of(b), ++seed);
            /* A replicated output whose gradient arrives as partial sums. */
            if (b == R) adjoint_case(m, a, b, tp_partial(), ++seed);
        }
    tp_mesh_free(m);
    tp_group_free(world);
    return check_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (tp_launch_in_job()) return rank_main();
    test_backward_table();
    unsetenv("TENSORPAR_BACKEND");
    for (int n = 2; n <= 3; n++) {
        int code = -1;
        CHECK(tp_launch_self(n, TP_BACKEND_SHM, argv, &code) == TP_OK);
        CHECK_MSG(code == 0, "%d ranks: exit code %d", n, code);
    }
    return check_summary();
}
