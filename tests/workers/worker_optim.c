/* worker_optim: the C side of tests/e2e/test_optim_torch.py.
 *
 * Alone (no --sharded): makes random parameters and five steps of random
 * gradients, writes them as .npy into --out-dir (P_<name>.npy,
 * G<step>_<name>.npy), then for each configuration (AdamW, SGD with
 * momentum, SGD nesterov; each with a schedule and clipping) runs five steps
 * — clip, step at the schedule's lr — and writes the parameters after each
 * step (<cfg>_<step>_<name>.npy) and a line per step on stdout:
 *   step <cfg> <k> lr <lr> norm <norm>
 * for the test to replay with torch.optim.
 *
 * --sharded, as every rank of a job (`tensorpar launch -n P`): the same
 * parameters held whole and as the shards a TP plan gives rank r (colwise,
 * rowwise, replicated, KV-replicated heads), three steps of clipping and
 * AdamW on both; the sharded global norm must equal the whole one, the
 * shards the whole parameters narrowed, and tp_check_replicated must pass,
 * then catch a replica changed on one rank.  Prints
 *   worker_optim: rank R of P: N checks, F failed   and  norm <step> <%a>. */
#include "worker_check.h"
#include "tensorpar/comm.h"
#include "tensorpar/io.h"
#include "tensorpar/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "worker_optim";

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    return p;
}

static void fill(tp_rng *rng, float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * tp_rng_normal(rng));
}

/* ---- alone: the torch comparison ---------------------------------------- */

#define NP 4
static const char *names[NP] = {"layer.weight", "layer.bias", "norm.weight", "embed.weight"};
static const int64_t shapes[NP][2] = {{5, 7}, {5, 1}, {7, 1}, {64, 33}};
static const int ndims[NP] = {2, 1, 1, 2};
static const unsigned pflags[NP] = {0, TP_PARAM_NO_DECAY, TP_PARAM_NO_DECAY, 0};
/* Gradient scales per step: the norm is about 47·scale, so max_norm 1
 * clips steps 2 and 4 and leaves 1, 3, 5 alone. */
static const double gscale[5] = {0.005, 0.05, 0.01, 0.1, 0.015};

typedef struct {
    const char *name;
    tp_optim_kind kind;
    double wd, momentum;
    int nesterov;
    tp_lr_schedule sched;
} config;

static int save(const char *dir, const char *file, const tp_tensor *t)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.npy", dir, file);
    if (tp_npy_write_f32(path, t->data, t->ndim, t->shape)) {
        fprintf(stderr, "%s: %s\n", prog, tp_error());
        return 1;
    }
    return 0;
}

static int run_config(const char *dir, const config *c, float *const *p0, float *const *const *grads)
{
    tp_tensor val[NP], grd[NP];
    tp_train_param params[NP];
    for (int i = 0; i < NP; i++) {
        if (tp_tensor_init(&val[i], TP_F32, ndims[i], shapes[i]) || tp_tensor_init(&grd[i], TP_F32, ndims[i], shapes[i]))
            return 1;
        memcpy(val[i].data, p0[i], tp_tensor_nbytes(&val[i]));
        params[i] = (tp_train_param){names[i], &val[i], &grd[i], pflags[i], 0};
    }
    tp_optim_options o;
    tp_optim_options_default(&o, c->kind);
    o.weight_decay = c->wd, o.momentum = c->momentum, o.nesterov = c->nesterov;
    tp_optim *opt;
    int rc = 0;
    if (tp_lr_schedule_check(&c->sched) || tp_optim_new(&o, params, NP, &opt)) {
        fprintf(stderr, "%s: %s\n", prog, tp_error());
        return 1;
    }
    for (int k = 0; k < 5 && !rc; k++) {
        for (int i = 0; i < NP; i++) memcpy(grd[i].data, grads[k][i], tp_tensor_nbytes(&grd[i]));
        float norm;
        double lr = tp_lr_at(&c->sched, k);
        if (tp_clip_grad_norm(params, NP, NULL, NULL, 1.0, &norm) || tp_optim_step(opt, lr)) {
            fprintf(stderr, "%s: %s\n", prog, tp_error());
            rc = 1;
        }
        printf("step %s %d lr %.17g norm %.9g\n", c->name, k + 1, lr, norm);
        for (int i = 0; i < NP && !rc; i++) {
            char file[256];
            snprintf(file, sizeof file, "%s_%d_%s", c->name, k + 1, names[i]);
            rc = save(dir, file, &val[i]);
        }
    }
    tp_optim_free(opt);
    for (int i = 0; i < NP; i++) tp_tensor_release(&val[i]), tp_tensor_release(&grd[i]);
    return rc;
}

static int run_alone(const char *dir, uint64_t seed)
{
    tp_rng rng;
    tp_rng_seed(&rng, seed);
    float *p0[NP], *gbuf[5][NP], *const *grads[5];
    int rc = 0;
    for (int i = 0; i < NP; i++) {
        int64_t n = shapes[i][0] * shapes[i][1];
        p0[i] = xcalloc((size_t)n, sizeof(float));
        fill(&rng, p0[i], n, 1.0);
        tp_tensor t = {TP_F32, ndims[i], {shapes[i][0], shapes[i][1]}, p0[i], 0};
        char file[256];
        snprintf(file, sizeof file, "P_%s", names[i]);
        rc |= save(dir, file, &t);
        for (int k = 0; k < 5; k++) {
            gbuf[k][i] = xcalloc((size_t)n, sizeof(float));
            fill(&rng, gbuf[k][i], n, gscale[k]);
            tp_tensor g = {TP_F32, ndims[i], {shapes[i][0], shapes[i][1]}, gbuf[k][i], 0};
            snprintf(file, sizeof file, "G%d_%s", k + 1, names[i]);
            rc |= save(dir, file, &g);
        }
    }
    for (int k = 0; k < 5; k++) grads[k] = gbuf[k];
    /* The test (test_optim_torch.py) knows these by name. */
    const config cfgs[4] = {
        {"adamw", TP_OPTIM_ADAMW, 0.1, 0, 0, {TP_LR_LINEAR, 1e-2, 2, 5, 0}},
        {"adamw_constant", TP_OPTIM_ADAMW, 0.0, 0, 0, {TP_LR_CONSTANT, 1e-3, 0, 0, 0}},
        {"sgd", TP_OPTIM_SGD, 0.01, 0.9, 0, {TP_LR_COSINE, 0.1, 0, 5, 0}},
        {"nesterov", TP_OPTIM_SGD, 0.0, 0.8, 1, {TP_LR_CONSTANT_WITH_WARMUP, 0.05, 3, 0, 0}},
    };
    for (int c = 0; c < 4 && !rc; c++) rc = run_config(dir, &cfgs[c], p0, grads);
    for (int i = 0; i < NP; i++) {
        free(p0[i]);
        for (int k = 0; k < 5; k++) free(gbuf[k][i]);
    }
    return rc;
}

/* ---- sharded: the global norm over ranks -------------------------------- */

#define NS 6
/* How rank r of P holds each parameter. */
typedef enum { WHOLE, ROWS, COLS, KV_HEADS } hold;
typedef struct {
    const char *name;
    int64_t rows, cols;   /* a 1-D parameter is [rows, 1] */
    int ndim;
    hold how;
    unsigned flags;
} sparam;
static const sparam sp[NS] = {
    {"q.weight", 8, 5, 2, ROWS, 0},
    {"q.bias", 8, 1, 1, ROWS, TP_PARAM_NO_DECAY},
    {"k.weight", 6, 5, 2, KV_HEADS, 0},     /* 2 KV heads of 3 rows */
    {"o.weight", 5, 8, 2, COLS, 0},
    {"o.bias", 5, 1, 1, WHOLE, TP_PARAM_NO_DECAY | TP_PARAM_COUNTED_ONCE},
    {"norm.weight", 5, 1, 1, WHOLE, TP_PARAM_NO_DECAY | TP_PARAM_COUNTED_ONCE},
};

/* Rank r's rows [*r0, *r0 + *nr) and columns [*c0, *c0 + *nc), and how many
 * ranks hold that same block. */
static void my_block(const sparam *s, int P, int r, int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc,
                     int *replicas)
{
    *r0 = 0, *nr = s->rows, *c0 = 0, *nc = s->cols, *replicas = 0;
    if (s->how == ROWS) tp_chunk_range(s->rows, P, r, r0, nr);
    if (s->how == COLS) tp_chunk_range(s->cols, P, r, c0, nc);
    if (s->how == KV_HEADS) {
        int K = 2, hd = 3;
        if (P > K) {  /* §8.3: rank r serves head r / (P / K) */
            *replicas = P / K;
            *r0 = r / *replicas * hd, *nr = hd;
        } else {
            tp_chunk_range(s->rows, P, r, r0, nr);
        }
    }
}

static void narrow(const float *full, int64_t cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out)
{
    for (int64_t i = 0; i < nr; i++) memcpy(out + i * nc, full + (r0 + i) * cols + c0, (size_t)nc * sizeof(float));
}

static double max_rel(const float *a, const float *b, int64_t n)
{
    double d = 0, m = 1e-30;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), m = fmax(m, fabs((double)b[i]));
    return d / m;
}

typedef struct {
    tp_tensor fv[NS], fg[NS], lv[NS], lg[NS];   /* full and local */
    tp_train_param full[NS], local[NS];
    int64_t r0[NS], nr[NS], c0[NS], nc[NS];
} sharded_set;

static int set_init(sharded_set *s, int P, int r, tp_rng *rng)
{
    for (int i = 0; i < NS; i++) {
        const sparam *q = &sp[i];
        int reps;
        my_block(q, P, r, &s->r0[i], &s->nr[i], &s->c0[i], &s->nc[i], &reps);
        int64_t fs[2] = {q->rows, q->cols}, ls[2] = {s->nr[i], s->nc[i]};
        if (q->ndim == 1) ls[0] = s->nr[i] * s->nc[i];
        if (tp_tensor_init(&s->fv[i], TP_F32, q->ndim, fs) || tp_tensor_init(&s->fg[i], TP_F32, q->ndim, fs) ||
            tp_tensor_init(&s->lv[i], TP_F32, q->ndim, ls) || tp_tensor_init(&s->lg[i], TP_F32, q->ndim, ls))
            return 1;
        fill(rng, s->fv[i].data, q->rows * q->cols, 1.0);
        narrow(s->fv[i].data, q->cols, s->r0[i], s->nr[i], s->c0[i], s->nc[i], s->lv[i].data);
        unsigned lf = q->flags | (reps ? TP_PARAM_COUNTED_ONCE : 0u);
        s->full[i] = (tp_train_param){q->name, &s->fv[i], &s->fg[i], q->flags, 0};
        s->local[i] = (tp_train_param){q->name, &s->lv[i], &s->lg[i], lf, reps};
    }
    return 0;
}

static void set_release(sharded_set *s)
{
    for (int i = 0; i < NS; i++)
        tp_tensor_release(&s->fv[i]), tp_tensor_release(&s->fg[i]), tp_tensor_release(&s->lv[i]),
            tp_tensor_release(&s->lg[i]);
}

/* Changes one bit of a replica on rank `victim` and expects every rank to
 * report it, naming the parameter and the first rank of its copy. */
static void expect_caught(sharded_set *s, const tp_mesh *mesh, int i, int grad, int victim, int first)
{
    int r = tp_mesh_coord(mesh, 0);
    uint32_t *w = (grad ? s->lg[i] : s->lv[i]).data;
    if (r == victim) w[1] ^= 1u << 3;
    tp_status st = tp_check_replicated(s->local, NS, mesh);
    char want[160];
    snprintf(want, sizeof want, "replicated parameter %s: its %s differs between ranks %d and %d", sp[i].name,
             grad ? "gradient" : "value", first, victim);
    EXPECT(st == TP_ERR_INTERNAL && strstr(tp_error(), want), "check_replicated: %d '%s', wanted '%s'", st,
           tp_error(), want);
    if (r == victim) w[1] ^= 1u << 3;
}

static int run_sharded(uint64_t seed)
{
    tp_group *world;
    tp_mesh *mesh = NULL;
    if (tp_comm_init(&world, NULL)) return fprintf(stderr, "%s: %s\n", prog, tp_error()), 1;
    if (tp_mesh_new_1d(world, "tp", &mesh)) return fprintf(stderr, "%s: %s\n", prog, tp_error()), 1;
    int P = tp_mesh_size(mesh, 0), r = tp_mesh_coord(mesh, 0);
    tp_rng rng;
    tp_rng_seed(&rng, seed);
    sharded_set s;
    memset(&s, 0, sizeof s);
    tp_optim *of = NULL, *ol = NULL;
    tp_optim_options o;
    tp_optim_options_default(&o, TP_OPTIM_ADAMW);
    o.weight_decay = 0.1;
    int rc = set_init(&s, P, r, &rng) || tp_optim_new(&o, s.full, NS, &of) || tp_optim_new(&o, s.local, NS, &ol);
    /* gradient scales: the norm is about 12·scale; max_norm 1 clips step 1 and 3 */
    const double scale[3] = {0.3, 0.05, 1.0};
    for (int k = 0; k < 3 && !rc; k++) {
        for (int i = 0; i < NS; i++) {
            fill(&rng, s.fg[i].data, sp[i].rows * sp[i].cols, scale[k]);
            narrow(s.fg[i].data, sp[i].cols, s.r0[i], s.nr[i], s.c0[i], s.nc[i], s.lg[i].data);
        }
        float nf, nl;
        rc = tp_clip_grad_norm(s.full, NS, NULL, NULL, 1.0, &nf) ||
             tp_clip_grad_norm(s.local, NS, mesh, NULL, 1.0, &nl);
        if (rc) break;
        EXPECT(fabs((double)nl - nf) <= 1e-6 * nf, "step %d: sharded norm %.9g, whole %.9g", k + 1, nl, nf);
        printf("norm %d %a %.9g\n", k + 1, (double)nl, nf);
        rc = tp_optim_step(of, 1e-2) || tp_optim_step(ol, 1e-2);
        for (int i = 0; i < NS && !rc; i++) {
            int64_t n = s.nr[i] * s.nc[i];
            float *want = xcalloc((size_t)n, sizeof(float));
            narrow(s.fv[i].data, sp[i].cols, s.r0[i], s.nr[i], s.c0[i], s.nc[i], want);
            double e = max_rel(s.lv[i].data, want, n);
            EXPECT(e <= 1e-6, "step %d: %s's shard is %.3g from the whole parameter's", k + 1, sp[i].name, e);
            free(want);
        }
        if (!rc) {
            tp_status st = tp_check_replicated(s.local, NS, mesh);
            EXPECT(st == TP_OK, "step %d: check_replicated: %s", k + 1, tp_error());
        }
    }
    if (!rc && P > 1) {
        expect_caught(&s, mesh, 5, 0, P - 1, 0);   /* norm.weight, value */
        expect_caught(&s, mesh, 4, 1, 1, 0);       /* o.bias, gradient */
        if (P >= 4) expect_caught(&s, mesh, 2, 0, 3, 2);   /* k.weight within KV subgroup {2, 3} */
        EXPECT(tp_check_replicated(s.local, NS, mesh) == TP_OK, "restored: %s", tp_error());
    }
    if (rc) fprintf(stderr, "%s: %s\n", prog, tp_error());
    tp_optim_free(of), tp_optim_free(ol);
    set_release(&s);
    if (!rc && tp_comm_barrier(world)) rc = 1;
    tp_mesh_free(mesh);
    tp_group_free(world);
    printf("worker_optim: rank %d of %d: %ld checks, %ld failed\n", r, P, checks, failures);
    return rc || failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    enum { OUT_DIR, SHARDED, SEED, NOPTS };
    worker_opt o[NOPTS] = {
        {"--out-dir", 1, NULL},   /* alone: where the .npy files go */
        {"--sharded", 0, NULL},   /* run as a rank: the sharded norm checks */
        {"--seed", 1, NULL},      /* of the random data (default 1) */
    };
    double seed;
    if (worker_parse(prog, argc, argv, o, NOPTS) || worker_number(prog, &o[SEED], 1, &seed)) return 2;
    if (o[SHARDED].value) return run_sharded((uint64_t)seed);
    if (!o[OUT_DIR].value) return fprintf(stderr, "%s: --out-dir DIR or --sharded\n", prog), 2;
    return run_alone(o[OUT_DIR].value, (uint64_t)seed);
}
