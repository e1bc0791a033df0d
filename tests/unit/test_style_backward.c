/* The default backward hooks of the built-in styles (§3.4, §2.2's backward
 * column), derived from their forward layouts: at P = 2 and 3 over shm,
 * each hook runs on a random gradient and the test checks the placement it
 * lands on and the values, which show the collective performed (all-reduce:
 * the sum of the ranks' summands; all-gather: the whole tensor; slice: own
 * chunk; none: the same buffer, untouched). */
#include "check.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/parallel.h"

#include <stdlib.h>
#include <string.h>

enum { T = 5, H = 7, NEL = T * H };

static void fill(float *v, int n, unsigned seed)
{
    uint32_t s = 2654435761u * (seed + 1);
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (float)(s >> 8) / (float)(1u << 24) - 0.5f;
    }
}

typedef enum { HOOK_PRE, HOOK_POST, HOOK_PARAM } hook;
typedef enum { EXPECT_NONE, EXPECT_ALL_REDUCE, EXPECT_ALL_GATHER, EXPECT_SLICE } expect;

typedef struct {
    const tp_mesh *m;
    int P, r;
} ctx;

/* The gradient as it arrives: `in` placed, with global value G.  A Partial
 * one holds a different summand on every rank. */
static tp_status arrive(const ctx *c, tp_placement in, unsigned seed, float *G, tp_dtensor *g)
{
    int64_t gs[2] = {T, H};
    if (in.kind != TP_PARTIAL) {
        fill(G, NEL, seed);
        tp_tensor t = {TP_F32, 2, {T, H}, G, 0};
        return tp_dtensor_distribute(g, c->m, &in, &t);
    }
    float part[NEL];
    memset(G, 0, sizeof part);
    for (int q = 0; q < c->P; q++) {
        fill(part, NEL, seed * 7 + (unsigned)q);
        for (int i = 0; i < NEL; i++) G[i] += part[i];
    }
    tp_status st = tp_dtensor_init(g, c->m, &in, TP_F32, 2, gs);
    if (!st) fill(g->local.data, NEL, seed * 7 + (unsigned)c->r);
    return st;
}

/* This rank's chunk of G's last dim, as Shard(-1) keeps it. */
static void own_cols(const ctx *c, const float *G, float *out, int64_t *w)
{
    int64_t s;
    tp_chunk_range(H, c->P, c->r, &s, w);
    for (int t = 0; t < T; t++)
        for (int64_t j = 0; j < *w; j++) out[t * *w + j] = G[t * H + s + j];
}

static int close_to(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float d = a[i] - b[i];
        if (d > 1e-5f || d < -1e-5f) return 0;
    }
    return 1;
}

static void run_case(const ctx *c, const char *style, tp_module_kind kind, hook h, tp_placement in,
                     tp_placement_kind lands, expect e, unsigned seed)
{
    const tp_style *st = tp_style_lookup(style);
    tp_module_ctx mod = {"m", kind, c->P, c->r, NULL, c->m, NULL};
    tp_forward_desc d;
    float G[NEL], want[NEL];
    tp_dtensor g;
    int ok = st && tp_style_install_forward(st, &mod, &d) == TP_OK && arrive(c, in, seed, G, &g) == TP_OK;
    CHECK_MSG(ok, "%s: setup: %s", style, tp_error());
    if (!ok) return;
    float before[NEL];
    void *buf = g.local.data;
    int64_t n0 = tp_tensor_numel(&g.local), w;
    memcpy(before, g.local.data, (size_t)n0 * sizeof *before);
    tp_status s = h == HOOK_PRE ? tp_style_pre_backward(st, &mod, &d, &g)
                : h == HOOK_POST ? tp_style_post_backward(st, &mod, &d, &g)
                : tp_style_param_grad(st, &mod, &d, &g);
    int64_t n = tp_tensor_numel(&g.local);
    int good = s == TP_OK && g.placements[0].kind == lands;
    switch (e) {
    case EXPECT_NONE: good = good && g.local.data == buf && n == n0 && !memcmp(g.local.data, before, (size_t)n * 4); break;
    case EXPECT_ALL_REDUCE:
    case EXPECT_ALL_GATHER: good = good && n == NEL && close_to(g.local.data, G, NEL); break;
    case EXPECT_SLICE: own_cols(c, G, want, &w); good = good && n == T * w && close_to(g.local.data, want, n); break;
    }
    CHECK_MSG(good, "%s, hook %d, P=%d rank %d: status %d, lands %d (want %d), %lld elements", style, (int)h,
              c->P, c->r, (int)s, (int)g.placements[0].kind, (int)lands, (long long)n);
    tp_dtensor_release(&g);
}

static int rank_main(void)
{
    tp_group *world;
    tp_mesh *m;
    if (tp_comm_init(&world, NULL) != TP_OK || tp_mesh_new_1d(world, "tp", &m) != TP_OK) {
        fprintf(stderr, "rank: %s\n", tp_error());
        return 1;
    }
    ctx c = {m, tp_mesh_size(m, 0), tp_mesh_coord(m, 0)};
    tp_placement R = tp_replicate(), Pt = tp_partial(), S = tp_shard(-1), Seq = tp_shard(0);
    const tp_module_kind LIN = TP_MODULE_LINEAR, EMB = TP_MODULE_EMBEDDING, OTH = TP_MODULE_OTHER;
    /* colwise: output grad already Shard(-1); the input grad, a partial sum
     * of the local backward, all-reduced (§1.6 AllReduceBackward). */
    run_case(&c, "colwise", LIN, HOOK_PRE, S, TP_SHARD, EXPECT_NONE, 1);
    run_case(&c, "colwise", LIN, HOOK_POST, Pt, TP_REPLICATE, EXPECT_ALL_REDUCE, 2);
    /* colwise_gather_output: backward of the all-gather keeps own chunk. */
    run_case(&c, "colwise_gather_output", LIN, HOOK_PRE, R, TP_SHARD, EXPECT_SLICE, 3);
    /* rowwise: backward of the all-reduce is nothing; input grad Shard(-1). */
    run_case(&c, "rowwise", LIN, HOOK_PRE, R, TP_REPLICATE, EXPECT_NONE, 4);
    run_case(&c, "rowwise", LIN, HOOK_POST, S, TP_SHARD, EXPECT_NONE, 5);
    /* rowwise_split_input: the split input's grad all-gathered. */
    run_case(&c, "rowwise_split_input", LIN, HOOK_POST, S, TP_REPLICATE, EXPECT_ALL_GATHER, 6);
    /* embedding_rowwise: nothing moves; ids have no gradient. */
    run_case(&c, "embedding_rowwise", EMB, HOOK_PRE, R, TP_REPLICATE, EXPECT_NONE, 7);
    run_case(&c, "embedding_rowwise", EMB, HOOK_POST, R, TP_REPLICATE, EXPECT_NONE, 8);
    /* replicated_with_grad_allreduce: activations untouched, each param
     * grad summed once. */
    run_case(&c, "replicated_with_grad_allreduce", OTH, HOOK_POST, R, TP_REPLICATE, EXPECT_NONE, 9);
    run_case(&c, "replicated_with_grad_allreduce", OTH, HOOK_PARAM, Pt, TP_REPLICATE, EXPECT_ALL_REDUCE, 10);
    /* sequence_parallel: Shard(seq) both ways, param grads summed. */
    run_case(&c, "sequence_parallel", OTH, HOOK_PRE, Seq, TP_SHARD, EXPECT_NONE, 11);
    run_case(&c, "sequence_parallel", OTH, HOOK_POST, Seq, TP_SHARD, EXPECT_NONE, 12);
    run_case(&c, "sequence_parallel", OTH, HOOK_PARAM, Pt, TP_REPLICATE, EXPECT_ALL_REDUCE, 13);
    /* colwise's weight grad is placed like the weight: nothing to reduce. */
    run_case(&c, "colwise", LIN, HOOK_PARAM, S, TP_SHARD, EXPECT_NONE, 14);
    tp_mesh_free(m);
    tp_group_free(world);
    if (check_failed) fprintf(stderr, "rank %d: %d checks failed\n", c.r, check_failed);
    return check_failed ? 1 : 0;
}

/* A custom hook replaces the default. */
static int custom_calls;
static tp_status custom_post(const tp_style *st, const tp_module_ctx *mod, const tp_forward_desc *d, tp_dtensor *gx)
{
    (void)st; (void)mod; (void)d; (void)gx;
    custom_calls++;
    return TP_OK;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (tp_launch_in_job()) return rank_main();
    tp_style s = *tp_style_lookup("colwise");
    s.transform_grad_input_post_backward = custom_post;
    tp_forward_desc d;
    tp_module_ctx mod = {"m", TP_MODULE_LINEAR, 2, 0, NULL, NULL, NULL};
    tp_dtensor none;
    memset(&none, 0, sizeof none);
    CHECK(tp_style_install_forward(&s, &mod, &d) == TP_OK && tp_style_post_backward(&s, &mod, &d, &none) == TP_OK);
    CHECK(custom_calls == 1);
    /* Where each style's local backward leaves the input gradient. */
    CHECK(tp_style_local_input_grad_layout(&d).kind == TP_PARTIAL);
    unsetenv("TENSORPAR_BACKEND");
    for (int n = 2; n <= 3; n++) {
        int code = -1;
        CHECK(tp_launch_self(n, TP_BACKEND_SHM, argv, &code) == TP_OK);
        CHECK_MSG(code == 0, "%d ranks: exit code %d", n, code);
    }
    return check_summary();
}
