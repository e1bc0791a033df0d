/* train/: AdamW and SGD single steps computed by hand, weight decay skipped
 * for TP_PARAM_NO_DECAY, the HF schedules at their key steps, gradient-norm
 * clipping on and off, counted-once parameters on a one-rank mesh, and the
 * parameter-list checks.  The sharded and the torch comparisons are in
 * tests/e2e/test_optim_torch.py. */
#include "check.h"
#include "tensorpar/comm.h"
#include "tensorpar/train.h"

#include <math.h>
#include <string.h>

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol) * fmax(1.0, fabs((double)(b))))

/* Parameter i holds values p[i] and gradients g[i]: [2] each. */
static float pv[3][2], gv[3][2];
static tp_tensor val[3], grd[3];
static tp_train_param params[3];

static void setup(const float p[2], const float g[2], int n, unsigned flags_last)
{
    for (int i = 0; i < n; i++) {
        memcpy(pv[i], p, sizeof pv[i]);
        memcpy(gv[i], g, sizeof gv[i]);
        val[i] = (tp_tensor){TP_F32, 1, {2}, pv[i], 0};
        grd[i] = (tp_tensor){TP_F32, 1, {2}, gv[i], 0};
        params[i] = (tp_train_param){i == 0 ? "w" : i == 1 ? "b" : "c", &val[i], &grd[i],
                                     i == n - 1 ? flags_last : 0u, 0};
    }
}

/* t = 1: m = 0.1·g, v = 0.001·g², bias corrections 0.1 and 0.001, so the
 * step is lr·g/|g| (up to eps), after p *= 1 - lr·wd when decayed. */
static void test_adamw_first_step(void)
{
    const float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f};
    setup(p, g, 2, TP_PARAM_NO_DECAY);
    tp_optim_options o;
    tp_optim_options_default(&o, TP_OPTIM_ADAMW);
    CHECK(o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 && o.weight_decay == 0.0);
    o.weight_decay = 0.01;
    tp_optim *opt;
    CHECK(tp_optim_new(&o, params, 2, &opt) == TP_OK);
    if (!opt) return;
    CHECK(tp_optim_step(opt, 0.1) == TP_OK);
    CHECK(tp_optim_steps(opt) == 1);
    CHECK_MSG(NEAR(pv[0][0], 0.999 - 0.1, 1e-6), "%.9g", pv[0][0]);
    CHECK_MSG(NEAR(pv[0][1], -2.0 * 0.999 + 0.1, 1e-6), "%.9g", pv[0][1]);
    /* the bias: no decay */
    CHECK_MSG(NEAR(pv[1][0], 0.9, 1e-6), "%.9g", pv[1][0]);
    CHECK_MSG(NEAR(pv[1][1], -1.9, 1e-6), "%.9g", pv[1][1]);
    const tp_tensor *m, *v, *none;
    CHECK(tp_optim_state(opt, 0, "exp_avg", &m) == TP_OK && NEAR(((float *)m->data)[0], 0.05, 1e-6));
    CHECK(tp_optim_state(opt, 0, "exp_avg_sq", &v) == TP_OK && NEAR(((float *)v->data)[1], 0.001 * 0.0625, 1e-6));
    CHECK(m->ndim == 1 && m->shape[0] == 2);
    CHECK(tp_optim_state(opt, 0, "momentum_buffer", &none) == TP_ERR_INVALID && !none);

    /* t = 2 with g' = (-1, 0.25), written out in double. */
    gv[0][0] = -1.0f, gv[0][1] = 0.25f;
    double p0 = pv[0][0], m0 = 0.9 * 0.05 + 0.1 * -1.0, v0 = 0.999 * 0.00025 + 0.001 * 1.0;
    double bc1 = 1 - 0.9 * 0.9, bc2 = 1 - 0.999 * 0.999;
    double want = p0 * (1 - 0.05 * 0.01) - 0.05 / bc1 * m0 / (sqrt(v0) / sqrt(bc2) + 1e-8);
    CHECK(tp_optim_step(opt, 0.05) == TP_OK);
    CHECK_MSG(NEAR(pv[0][0], want, 1e-6), "%.9g vs %.9g", pv[0][0], want);
    tp_optim_free(opt);
}

static void test_sgd(void)
{
    const float p[2] = {1.0f, 1.0f}, g[2] = {0.5f, 0.5f};
    setup(p, g, 3, TP_PARAM_NO_DECAY);
    tp_optim_options o;
    tp_optim_options_default(&o, TP_OPTIM_SGD);
    o.momentum = 0.9, o.weight_decay = 0.1;
    tp_optim *opt;
    /* params 0 and 1 decay (coupled), 2 does not */
    CHECK(tp_optim_new(&o, params, 3, &opt) == TP_OK);
    if (!opt) return;
    CHECK(tp_optim_step(opt, 0.1) == TP_OK);
    CHECK_MSG(NEAR(pv[0][0], 0.94, 1e-6), "%.9g", pv[0][0]);        /* d = buf = 0.6 */
    CHECK_MSG(NEAR(pv[2][0], 0.95, 1e-6), "%.9g", pv[2][0]);        /* d = buf = 0.5 */
    CHECK(tp_optim_step(opt, 0.1) == TP_OK);
    /* d = 0.5 + 0.1·0.94 = 0.594, buf = 0.9·0.6 + 0.594 = 1.134 */
    CHECK_MSG(NEAR(pv[0][0], 0.94 - 0.1134, 1e-6), "%.9g", pv[0][0]);
    /* d = 0.5, buf = 0.45 + 0.5 = 0.95 */
    CHECK_MSG(NEAR(pv[2][0], 0.95 - 0.095, 1e-6), "%.9g", pv[2][0]);
    const tp_tensor *buf;
    CHECK(tp_optim_state(opt, 0, "momentum_buffer", &buf) == TP_OK && NEAR(((float *)buf->data)[1], 1.134, 1e-6));
    tp_optim_free(opt);

    /* Nesterov: d = 0.6 + 0.9·0.6 at the first step. */
    setup(p, g, 1, 0);
    o.nesterov = 1;
    CHECK(tp_optim_new(&o, params, 1, &opt) == TP_OK);
    if (!opt) return;
    CHECK(tp_optim_step(opt, 0.1) == TP_OK);
    CHECK_MSG(NEAR(pv[0][0], 1 - 0.114, 1e-6), "%.9g", pv[0][0]);
    tp_optim_free(opt);

    /* Plain SGD keeps no state; nesterov without momentum is refused. */
    tp_optim_options_default(&o, TP_OPTIM_SGD);
    setup(p, g, 1, 0);
    CHECK(tp_optim_new(&o, params, 1, &opt) == TP_OK);
    if (!opt) return;
    CHECK(tp_optim_step(opt, 2.0) == TP_OK && pv[0][0] == 0.0f);
    CHECK(tp_optim_state(opt, 0, "momentum_buffer", &buf) == TP_ERR_INVALID);
    tp_optim_free(opt);
    o.nesterov = 1;
    CHECK(tp_optim_new(&o, params, 1, &opt) == TP_ERR_INVALID && !opt);
}

static void test_checks(void)
{
    const float p[2] = {1.0f, 1.0f}, g[2] = {0.5f, 0.5f};
    setup(p, g, 2, 0);
    tp_optim_options o;
    tp_optim_options_default(&o, TP_OPTIM_ADAMW);
    tp_optim *opt;
    grd[1].shape[0] = 1;
    CHECK(tp_optim_new(&o, params, 2, &opt) == TP_ERR_INVALID && !opt);
    CHECK_MSG(strstr(tp_error(), "b: gradient shape [1]") != NULL, "%s", tp_error());
    grd[1].shape[0] = 2, grd[1].dtype = TP_BF16;
    CHECK(tp_optim_new(&o, params, 2, &opt) == TP_ERR_UNSUPPORTED);
    grd[1].dtype = TP_F32;
    o.beta2 = 1.0;
    CHECK(tp_optim_new(&o, params, 2, &opt) == TP_ERR_INVALID);
    tp_optim_kind k;
    CHECK(tp_optim_kind_parse("sgd", &k) == TP_OK && k == TP_OPTIM_SGD);
    CHECK(tp_optim_kind_parse("adam", &k) == TP_ERR_INVALID);
    tp_train_params_zero_grad(params, 2);
    CHECK(gv[0][0] == 0.0f && gv[1][1] == 0.0f);
}

static void test_schedules(void)
{
    tp_lr_schedule s = {TP_LR_LINEAR, 2.0, 10, 110, 0};
    CHECK(tp_lr_schedule_check(&s) == TP_OK);
    CHECK(tp_lr_at(&s, 0) == 0.0 && tp_lr_at(&s, 5) == 1.0 && tp_lr_at(&s, 10) == 2.0);
    CHECK(tp_lr_at(&s, 60) == 1.0 && tp_lr_at(&s, 110) == 0.0 && tp_lr_at(&s, 200) == 0.0);
    s.kind = TP_LR_COSINE;
    CHECK(tp_lr_at(&s, 5) == 1.0 && tp_lr_at(&s, 10) == 2.0 && tp_lr_at(&s, 110) == 0.0);
    CHECK(NEAR(tp_lr_at(&s, 60), 1.0, 1e-15) && NEAR(tp_lr_at(&s, 35), 1.0 + sqrt(0.5), 1e-15));
    s.num_cycles = 1.0;   /* a whole cycle: back up at the end */
    CHECK(NEAR(tp_lr_at(&s, 110), 2.0, 1e-15) && NEAR(tp_lr_at(&s, 60), 0.0, 1e-15));
    s.kind = TP_LR_CONSTANT_WITH_WARMUP;
    CHECK(tp_lr_at(&s, 3) == 0.6 && tp_lr_at(&s, 10) == 2.0 && tp_lr_at(&s, 1000) == 2.0);
    s.kind = TP_LR_CONSTANT;   /* HF's constant ignores warmup */
    CHECK(tp_lr_at(&s, 0) == 2.0 && tp_lr_at(&s, 3) == 2.0);
    s.kind = TP_LR_LINEAR, s.warmup_steps = 0;
    CHECK(tp_lr_at(&s, 0) == 2.0 && tp_lr_at(&s, 55) == 1.0);
    s.total_steps = 0;
    CHECK(tp_lr_schedule_check(&s) == TP_ERR_INVALID);
    tp_lr_kind k;
    CHECK(tp_lr_kind_parse("constant_with_warmup", &k) == TP_OK && k == TP_LR_CONSTANT_WITH_WARMUP);
    CHECK(tp_lr_kind_parse("polynomial", &k) == TP_ERR_INVALID && strstr(tp_error(), "cosine"));
    CHECK(!strcmp(tp_lr_kind_name(TP_LR_COSINE), "cosine"));
}

static void test_clip(void)
{
    const float p[2] = {0, 0}, g[2] = {3.0f, 4.0f};
    setup(p, g, 2, TP_PARAM_COUNTED_ONCE);
    float norm = 0;
    /* two gradients (3, 4): norm sqrt(50); below max_norm nothing changes */
    CHECK(tp_clip_grad_norm(params, 2, NULL, NULL, 10.0, &norm) == TP_OK);
    CHECK(NEAR(norm, sqrt(50.0), 1e-7) && gv[0][0] == 3.0f && gv[1][1] == 4.0f);
    CHECK(tp_clip_grad_norm(params, 1, NULL, NULL, 1.0, &norm) == TP_OK);
    CHECK(NEAR(norm, 5.0, 1e-7) && NEAR(gv[0][0], 0.6, 1e-6) && NEAR(gv[0][1], 0.8, 1e-6));
    CHECK(gv[1][0] == 3.0f);   /* only the list given is clipped */
    CHECK(tp_grad_norm(params, 1, NULL, NULL, &norm) == TP_OK && NEAR(norm, 1.0, 1e-6));

    /* A one-rank mesh: the counted-once parameter is counted (rank 0 holds
     * the first copy), the Partial -> Replicate move is a copy. */
    tp_comm_options o;
    tp_comm_options_default(&o);
    o.backend = TP_BACKEND_SELF, o.rank = 0, o.world_size = 1;
    tp_group *world = NULL;
    tp_mesh *mesh = NULL;
    CHECK(tp_comm_init(&world, &o) == TP_OK);
    if (!world) return;
    CHECK(tp_mesh_new_1d(world, "tp", &mesh) == TP_OK);
    if (mesh) {
        setup(p, g, 2, TP_PARAM_COUNTED_ONCE);
        CHECK(tp_grad_norm(params, 2, mesh, NULL, &norm) == TP_OK && NEAR(norm, sqrt(50.0), 1e-7));
        CHECK(tp_check_replicated(params, 2, mesh) == TP_OK);
        params[1].replicas = 2;   /* more copies than ranks */
        CHECK(tp_grad_norm(params, 2, mesh, NULL, &norm) == TP_ERR_INVALID && strstr(tp_error(), "b: 2 replicas"));
    }
    tp_mesh_free(mesh);
    tp_group_free(world);
}

/* The same steps with the element ranges split over a pool of 3 threads:
 * the same bits. */
static void test_pool(void)
{
    enum { N = 1000 };
    static float p1[N], p2[N], g[N];
    tp_rng rng;
    tp_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) p1[i] = p2[i] = (float)tp_rng_normal(&rng), g[i] = (float)tp_rng_normal(&rng);
    tp_tensor v1 = {TP_F32, 1, {N}, p1, 0}, v2 = {TP_F32, 1, {N}, p2, 0}, gt = {TP_F32, 1, {N}, g, 0};
    float first = p1[0];
    tp_train_param a = {"a", &v1, &gt, 0, 0}, b = {"a", &v2, &gt, 0, 0};
    tp_threadpool *pool = NULL;
    CHECK(tp_threadpool_create(&pool, 3) == TP_OK);
    if (!pool) return;
    for (int kind = 0; kind < 2; kind++) {
        tp_optim_options o;
        tp_optim_options_default(&o, kind ? TP_OPTIM_SGD : TP_OPTIM_ADAMW);
        o.weight_decay = 0.05, o.momentum = 0.9;
        tp_optim *o1 = NULL, *o2 = NULL;
        CHECK(tp_optim_new(&o, &a, 1, &o1) == TP_OK);
        o.pool = pool;
        CHECK(tp_optim_new(&o, &b, 1, &o2) == TP_OK);
        for (int k = 0; o1 && o2 && k < 3; k++) CHECK(!tp_optim_step(o1, 0.01) && !tp_optim_step(o2, 0.01));
        CHECK(!memcmp(p1, p2, sizeof p1) && p1[0] != first);
        first = p1[0];
        tp_optim_free(o1), tp_optim_free(o2);
    }
    /* The norm over blocks of 2^15 elements, and the clipping: the same
     * bits with and without the pool. */
    enum { BIG = 100003 };
    static float g1[BIG], g2[BIG];
    for (int i = 0; i < BIG; i++) g1[i] = g2[i] = (float)tp_rng_normal(&rng);
    tp_tensor t1 = {TP_F32, 1, {BIG}, g1, 0}, t2 = {TP_F32, 1, {BIG}, g2, 0}, z = {TP_F32, 1, {0}, NULL, 0};
    tp_train_param c1[2] = {{"e", &z, &z, 0, 0}, {"big", &t1, &t1, 0, 0}};
    tp_train_param c2[2] = {{"e", &z, &z, 0, 0}, {"big", &t2, &t2, 0, 0}};
    float n1 = 0, n2 = 0;
    CHECK(tp_clip_grad_norm(c1, 2, NULL, NULL, 1.0, &n1) == TP_OK);
    CHECK(tp_clip_grad_norm(c2, 2, NULL, pool, 1.0, &n2) == TP_OK);
    CHECK_MSG(n1 == n2 && NEAR(n1, sqrt(BIG), 0.02), "%.9g %.9g", n1, n2);
    CHECK(!memcmp(g1, g2, sizeof g1));
    CHECK(tp_grad_norm(c2, 2, NULL, pool, &n2) == TP_OK && NEAR(n2, 1.0, 1e-6));
    tp_threadpool_destroy(pool);
}

int main(void)
{
    test_pool();
    test_adamw_first_step();
    test_sgd();
    test_checks();
    test_schedules();
    test_clip();
    return check_summary();
}
