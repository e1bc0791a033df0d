/* The backward of a mixture-of-experts block, against central finite
 * differences of a float64 forward written here: the router's (softmax,
 * the chosen probabilities, renormalised or not; the choice itself held
 * fixed, as torch.topk passes no gradient through it; DeepSeek's V2
 * softmax and V3 sigmoid routers alike) and the grouped
 * experts' (input, slot weights, stacked weight gradients; a skipped slot
 * gets none), in both layouts: linear-style with the weight on the output,
 * Llama 4's bmm-style with the weight on the input. */
#include "check.h"
#include "models/tp_module.h"
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double drand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)((*s >> 40) & 0xFFFF) / 32768.0 - 1.0;
}

/* ---- the router ----------------------------------------------------------- */

/* Σ_j c_j · w_j for one token, w the weights of the fixed choice ids. */
static double route_loss(const double *logit, int64_t E, int64_t k, int renorm, const int32_t *ids, const double *c)
{
    double mx = logit[0], z = 0, S = 0, L = 0;
    for (int64_t e = 1; e < E; e++) mx = fmax(mx, logit[e]);
    for (int64_t e = 0; e < E; e++) z += exp(logit[e] - mx);
    for (int64_t j = 0; j < k; j++) S += exp(logit[ids[j]] - mx) / z;
    for (int64_t j = 0; j < k; j++) L += c[j] * exp(logit[ids[j]] - mx) / z / (renorm ? S : 1.0);
    return L;
}

static void check_router(int64_t E, int64_t k, int renorm)
{
    int64_t T = 3;
    uint64_t seed = (uint64_t)(E * 7 + k + renorm);
    float logits[3 * 16], scratch[3 * 16], w[3 * 4], dw[3 * 4], dl[3 * 16];
    int32_t ids[3 * 4];
    double c[3 * 4], l64[16];
    for (int64_t i = 0; i < T * E; i++) logits[i] = (float)(2.0 * drand(&seed));
    for (int64_t i = 0; i < T * k; i++) dw[i] = (float)(c[i] = drand(&seed));
    memcpy(scratch, logits, sizeof scratch);
    tp_moe_route(scratch, T, E, k, renorm, ids, w);
    tp_moe_route_backward(logits, T, E, k, renorm, ids, dw, dl);
    double err = 0, mx = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            const double h = 1e-5;
            for (int64_t i = 0; i < E; i++) l64[i] = logits[t * E + i];
            l64[e] += h;
            double up = route_loss(l64, E, k, renorm, ids + t * k, c + t * k);
            l64[e] -= 2 * h;
            double fd = (up - route_loss(l64, E, k, renorm, ids + t * k, c + t * k)) / (2 * h);
            err = fmax(err, fabs(fd - dl[t * E + e]));
            mx = fmax(mx, fabs(fd));
        }
    /* k = 1 renormalised: the weight is 1 whatever the logits, so no gradient */
    int constant = k == 1 && renorm;
    CHECK_MSG((constant ? mx < 1e-9 : mx > 1e-3) && err <= 1e-5 * mx + 1e-7,
              "router E=%lld k=%lld renorm=%d: err %g of %g", (long long)E, (long long)k, renorm, err, mx);
}

static void test_router_backward(void)
{
    check_router(8, 2, 1);
    check_router(8, 2, 0);
    check_router(16, 4, 1);
    check_router(5, 1, 1);   /* k = 1 renormalised: the weight is 1 whatever the logits */
    check_router(5, 1, 0);
}

/* DeepSeek's weights for one token's fixed choice: V2 the softmax
 * probabilities (group_limited_greedy: 0 for a pick from a group outside
 * the topk_group of best maximum probability, masked_fill's constant), V3
 * the sigmoid scores renormalised (+1e-20) or not; both times the scaling
 * factor; Σ_j c_j · w_j. */
static double deepseek_loss(const tp_model_config *cfg, const double *logit, const int32_t *ids, const double *c)
{
    int64_t E = cfg->num_experts, k = cfg->num_experts_per_tok, G = cfg->n_group;
    double s[16], gmax[16], S = 0, L = 0, mx = logit[0], z = 0;
    int kept[16] = {0};
    for (int64_t e = 1; e < E; e++) mx = fmax(mx, logit[e]);
    for (int64_t e = 0; e < E; e++) z += exp(logit[e] - mx);
    for (int64_t g = 0; g < G; g++) {
        gmax[g] = -1;
        for (int64_t e = g * (E / G); e < (g + 1) * (E / G); e++) gmax[g] = fmax(gmax[g], exp(logit[e] - mx) / z);
    }
    for (int64_t n = 0; n < cfg->topk_group; n++) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (!kept[g] && (best < 0 || gmax[g] > gmax[best])) best = g;
        kept[best] = 1;
    }
    for (int64_t j = 0; j < k; j++) {
        double l = logit[ids[j]];
        s[j] = cfg->arch == TP_ARCH_DEEPSEEK_V3 ? 1.0 / (1.0 + exp(-l)) : exp(l - mx) / z;
        if (cfg->arch == TP_ARCH_DEEPSEEK_V2 && cfg->group_limited && !kept[ids[j] / (E / G)]) s[j] = 0;
        S += s[j];
    }
    int renorm = cfg->arch == TP_ARCH_DEEPSEEK_V3 && cfg->norm_topk_prob;
    for (int64_t j = 0; j < k; j++) L += c[j] * s[j] / (renorm ? S + 1e-20 : 1.0) * cfg->routed_scaling_factor;
    return L;
}

/* edge: V2's logits with all but two of the kept groups' experts ~500
 * below the best (their f32 probability 0), so that the third pick is
 * expert 0 of a masked group, whose probability is well above 0. */
static void check_deepseek_router(tp_arch arch, int norm, int groups, double sf, int edge)
{
    enum { T = 3, E = 8, K = 3 };
    tp_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = arch, cfg.num_experts = E, cfg.num_experts_per_tok = K, cfg.norm_topk_prob = norm;
    cfg.routed_scaling_factor = sf, cfg.n_group = groups ? 4 : 1, cfg.topk_group = groups ? 2 : 1;
    cfg.group_limited = groups;
    uint64_t seed = (uint64_t)(arch * 31 + norm * 7 + groups);
    float logits[T * E], scratch[T * E], w[T * K], dw[T * K], dl[T * E];
    int32_t ids[T * K];
    double c[T * K], l64[E];
    static const float far[E] = {-3.0f, -500.0f, 0.0f, -500.0f, -1.0f, -500.0f, -500.0f, -500.0f};
    for (int64_t i = 0; i < T * E; i++)
        logits[i] = edge ? far[i % E] + (float)(0.5 * drand(&seed)) : (float)(2.0 * drand(&seed));
    for (int64_t i = 0; i < T * K; i++) dw[i] = (float)(c[i] = drand(&seed));
    memcpy(scratch, logits, sizeof scratch);
    CHECK(tp_moe_route_deepseek(&cfg, scratch, T, NULL, ids, w) == TP_OK);
    for (int64_t t = 0; edge && t < T; t++)
        CHECK_MSG(ids[t * K + 2] == 0 && w[t * K + 2] == 0.0f, "token %lld: the third pick (%d) is the masked "
                  "expert 0, at weight 0 (%g)", (long long)t, ids[t * K + 2], (double)w[t * K + 2]);
    tp_moe_route_deepseek_backward(&cfg, logits, T, ids, dw, dl);
    double err = 0, mx = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            const double h = 1e-5;
            for (int64_t i = 0; i < E; i++) l64[i] = logits[t * E + i];
            l64[e] += h;
            double up = deepseek_loss(&cfg, l64, ids + t * K, c + t * K);
            l64[e] -= 2 * h;
            double fd = (up - deepseek_loss(&cfg, l64, ids + t * K, c + t * K)) / (2 * h);
            err = fmax(err, fabs(fd - dl[t * E + e]));
            mx = fmax(mx, fabs(fd));
        }
    CHECK_MSG(mx > 1e-3 && err <= 1e-5 * mx + 1e-7, "deepseek router arch=%d norm=%d groups=%d edge=%d: err %g of %g",
              (int)arch, norm, groups, edge, err, mx);
}

static void test_deepseek_router_backward(void)
{
    check_deepseek_router(TP_ARCH_DEEPSEEK_V2, 0, 0, 1.0, 0);
    check_deepseek_router(TP_ARCH_DEEPSEEK_V2, 0, 1, 1.5, 0);   /* group_limited_greedy */
    check_deepseek_router(TP_ARCH_DEEPSEEK_V2, 0, 1, 1.5, 1);   /* ... picking a masked expert */
    check_deepseek_router(TP_ARCH_DEEPSEEK_V3, 1, 1, 2.5, 0);
    check_deepseek_router(TP_ARCH_DEEPSEEK_V3, 0, 0, 1.0, 0);
}

/* gpt_oss's router: the chosen logits softmaxed among themselves; the top-k
 * (descending logits, the lower id on a tie) and the gradient of Σ c_j·w_j,
 * zero off the chosen ones. */
static void test_topk_softmax_router(void)
{
    enum { T = 3, E = 8, K = 3 };
    uint64_t seed = 11;
    float logits[T * E], w[T * K], dw[T * K], dl[T * E];
    int32_t ids[T * K];
    double c[T * K], l64[E];
    for (int64_t i = 0; i < T * E; i++) logits[i] = (float)(2.0 * drand(&seed));
    for (int64_t i = 0; i < T * K; i++) dw[i] = (float)(c[i] = drand(&seed));
    float scratch[T * E];
    memcpy(scratch, logits, sizeof scratch);
    tp_moe_route_topk_softmax(scratch, T, E, K, ids, w);
    tp_moe_route_topk_softmax_backward(logits, T, E, K, ids, dw, dl);
    double err = 0, mx = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        int ok = 1;
        double sum = 0;
        for (int64_t j = 0; j < K; j++) {
            sum += w[t * K + j];
            for (int64_t e = 0; e < E; e++) {   /* ids[j] beats every unchosen and every later one */
                int later = 0;
                for (int64_t i = 0; i < j; i++) later |= ids[t * K + i] == e;
                if (!later && e != ids[t * K + j]) ok &= l[ids[t * K + j]] >= l[e];
            }
        }
        CHECK_MSG(ok && fabs(sum - 1) < 1e-6, "token %lld: top-%d choice or softmax", (long long)t, K);
        for (int64_t e = 0; e < E; e++) {
            const double h = 1e-5;
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                for (int64_t i = 0; i < E; i++) l64[i] = l[i];
                l64[e] += sgn ? -h : h;
                double mxl = l64[ids[t * K]], z = 0, acc = 0;
                for (int64_t j = 0; j < K; j++) z += exp(l64[ids[t * K + j]] - mxl);
                for (int64_t j = 0; j < K; j++) acc += c[t * K + j] * exp(l64[ids[t * K + j]] - mxl) / z;
                L[sgn] = acc;
            }
            double fd = (L[0] - L[1]) / (2 * h);
            err = fmax(err, fabs(fd - dl[t * E + e]));
            mx = fmax(mx, fabs(fd));
        }
    }
    CHECK_MSG(mx > 1e-3 && err <= 1e-5 * mx + 1e-7, "top-k softmax router: err %g of %g", err, mx);
}

/* ---- the grouped experts ---------------------------------------------------- */

typedef struct {
    int64_t T, H, I, E, k;
    double *x, *w, *gu, *dn, *dy;   /* float64 copies of the operands */
    int32_t *ids;
    int bmm;   /* Llama 4: gu [E, H, 2I], dn [E, I, H], the weight scaling the input */
} experts_case;

static double gu_at(const experts_case *c, int64_t e, int64_t row, int64_t q)
{
    return c->bmm ? c->gu[(e * c->H + q) * 2 * c->I + row] : c->gu[(e * 2 * c->I + row) * c->H + q];
}

static double dn_at(const experts_case *c, int64_t e, int64_t o, int64_t i)
{
    return c->bmm ? c->dn[(e * c->I + i) * c->H + o] : c->dn[(e * c->H + o) * c->I + i];
}

/* Σ dy ⊙ out in float64, slots outside [0, E) skipped. */
static double experts_loss(const experts_case *c)
{
    double L = 0;
    for (int64_t s = 0; s < c->T * c->k; s++) {
        int32_t e = c->ids[s];
        if (e < 0 || e >= c->E) continue;
        const double *x = c->x + (s / c->k) * c->H, *dy = c->dy + (s / c->k) * c->H;
        double in = c->bmm ? c->w[s] : 1.0, out = c->bmm ? 1.0 : c->w[s];
        for (int64_t o = 0; o < c->H; o++) {
            double y = 0;
            for (int64_t i = 0; i < c->I; i++) {
                double g = 0, u = 0;
                for (int64_t q = 0; q < c->H; q++) {
                    g += gu_at(c, e, i, q) * in * x[q];
                    u += gu_at(c, e, c->I + i, q) * in * x[q];
                }
                y += dn_at(c, e, o, i) * g / (1 + exp(-g)) * u;
            }
            L += dy[o] * out * y;
        }
    }
    return L;
}

/* The finite difference of the loss in *v, against the analytic value. */
static void fd_check(experts_case *c, double *v, float analytic, double *err, double *mx)
{
    const double h = 1e-5, keep = *v;
    *v = keep + h;
    double up = experts_loss(c);
    *v = keep - h;
    double fd = (up - experts_loss(c)) / (2 * h);
    *v = keep;
    *err = fmax(*err, fabs(fd - analytic));
    *mx = fmax(*mx, fabs(fd));
}

static float *to_f32(const double *v, int64_t n)
{
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)v[i];
    return f;
}

static double *fill(uint64_t *seed, int64_t n, double scale)
{
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)(float)(scale * drand(seed));   /* float-exact */
    return v;
}

static void check_experts_backward(int bmm)
{
    experts_case c = {.T = 5, .H = 6, .I = 4, .E = 3, .k = 2, .bmm = bmm};
    uint64_t seed = 11;
    int64_t nx = c.T * c.H, ns = c.T * c.k, ngu = c.E * 2 * c.I * c.H, ndn = c.E * c.H * c.I;
    c.x = fill(&seed, nx, 1.0); c.w = fill(&seed, ns, 1.0); c.dy = fill(&seed, nx, 1.0);
    c.gu = fill(&seed, ngu, 0.5); c.dn = fill(&seed, ndn, 0.5);
    int32_t ids[10] = {0, 2, 1, 0, 2, 3 /* skipped: the EP sentinel */, 0, 1, 2, 1};
    c.ids = ids;
    float *x = to_f32(c.x, nx), *w = to_f32(c.w, ns), *dy = to_f32(c.dy, nx);
    float *gu = to_f32(c.gu, ngu), *dn = to_f32(c.dn, ndn);
    float *dx = calloc((size_t)nx, sizeof *dx), *dwt = calloc((size_t)ns, sizeof *dwt);
    float *dgu = calloc((size_t)ngu, sizeof *dgu), *ddn = calloc((size_t)ndn, sizeof *ddn);
    tp_tensor tgu = {.data = gu, .dtype = TP_F32, .ndim = 3, .shape = {c.E, 2 * c.I, c.H}};
    tp_tensor tdn = {.data = dn, .dtype = TP_F32, .ndim = 3, .shape = {c.E, c.H, c.I}};
    if (bmm) {
        tgu.shape[1] = c.H, tgu.shape[2] = 2 * c.I;
        tdn.shape[1] = c.I, tdn.shape[2] = c.H;
    }
    tp_threadpool *pool;
    CHECK(tp_threadpool_create(&pool, 2) == TP_OK);
    tp_matmul_opts opts;
    tp_matmul_opts_default(&opts);
    tp_grouped_experts_args a = {NULL, x, c.T, c.H, c.k, ids, w, &tgu, &tdn, pool, &opts, bmm, bmm};
    tp_grouped_experts_grads g = {dy, dx, dwt, dgu, ddn};
    CHECK(tp_grouped_experts_backward(&a, &g) == TP_OK);
    double err = 0, mx = 0;
    for (int64_t i = 0; i < nx; i++) fd_check(&c, &c.x[i], dx[i], &err, &mx);
    for (int64_t i = 0; i < ns; i++) fd_check(&c, &c.w[i], dwt[i], &err, &mx);
    for (int64_t i = 0; i < ngu; i++) fd_check(&c, &c.gu[i], dgu[i], &err, &mx);
    for (int64_t i = 0; i < ndn; i++) fd_check(&c, &c.dn[i], ddn[i], &err, &mx);
    CHECK_MSG(mx > 1e-2 && err <= 1e-5 * mx, "grouped experts backward (bmm %d): err %g of %g", bmm, err, mx);
    CHECK(dwt[5] == 0.0f);   /* the skipped slot */
    /* the weight gradients accumulate: a second backward doubles them */
    float before = dgu[7];
    CHECK(tp_grouped_experts_backward(&a, &g) == TP_OK);
    CHECK(fabsf(dgu[7] - 2 * before) <= 1e-6f * fabsf(before) + 1e-12f);
    tp_threadpool_destroy(pool);
    free(x); free(w); free(dy); free(gu); free(dn); free(dx); free(dwt); free(dgu); free(ddn);
    free(c.x); free(c.w); free(c.dy); free(c.gu); free(c.dn);
}

static void test_experts_backward(void)
{
    check_experts_backward(0);
    check_experts_backward(1);   /* Llama 4's bmm-style experts, input scaled */
}

int main(void)
{
    test_router_backward();
    test_topk_softmax_router();
    test_deepseek_router_backward();
    test_experts_backward();
    return check_summary();
}
