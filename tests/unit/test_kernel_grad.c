/* The backward kernels against central finite differences.
 *
 * Each test writes the forward again here, in double precision and from
 * the definition (not from the kernel), and a scalar loss L = Σ g·y with a
 * fixed random g, so that the gradient of L with respect to y is g.  The
 * finite difference (L(x + h) − L(x − h)) / 2h of that double forward is
 * then exact to ~1e-9, and the kernel's f32 gradient (given dy = g) must
 * match it to a relative error (2-norm over the whole tensor) below 1e-4.
 * Two guards keep that bound honest: the gradient's norm must be of order
 * one (no vanishing gradient passes), and the same comparison with one
 * element off by 1 % of the norm must fail.
 *
 * The backward kernels accumulate (dx += …): every gradient buffer starts
 * from random values here, which are subtracted before the comparison. */
#include "check.h"
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tp_rng rng;

#define FD_STEP 1e-6
#define GRAD_TOL 1e-4

static void fill(float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * tp_rng_normal(&rng));
}

static void to_double(double *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

static double rel_err(const double *a, const double *ref, int64_t n, double *ref_norm)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e += (a[i] - ref[i]) * (a[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    *ref_norm = sqrt(r);
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* The kernel's gradient (grad − base: it accumulated onto base) against
 * the numerical one. */
static double worst_err;   /* over every comparison, printed at the end */

static void compare(const char *what, const float *grad, const float *base, const double *num, int64_t n)
{
    double *a = malloc((size_t)n * sizeof(double));
    if (!a) { CHECK(!"out of memory"); return; }
    for (int64_t i = 0; i < n; i++) a[i] = (double)grad[i] - (base ? (double)base[i] : 0.0);
    double norm, e = rel_err(a, num, n, &norm);
    if (e > worst_err) worst_err = e;
    CHECK_MSG(e < GRAD_TOL, "%s: relative error %.3g (gradient norm %.3g)", what, e, norm);
    CHECK_MSG(norm > 0.1, "%s: gradient norm %.3g is too small to tell anything", what, norm);
    a[n / 2] += 0.01 * norm;   /* a gradient 1 % off must not pass */
    double e2 = rel_err(a, num, n, &norm);
    CHECK_MSG(e2 > GRAD_TOL, "%s: a perturbed gradient passes (error %.3g)", what, e2);
    free(a);
}

/* ∂L/∂x[i] for every i by central differences; x is the double input the
 * loss reads through ctx. */
static void numeric_grad(double *num, double *x, int64_t n, double (*loss)(void *), void *ctx)
{
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + FD_STEP;
        double lp = loss(ctx);
        x[i] = keep - FD_STEP;
        double lm = loss(ctx);
        x[i] = keep;
        num[i] = (lp - lm) / (2 * FD_STEP);
    }
}

/* A float buffer of n random values (the accumulation base) and its copy. */
static float *base_copy(float **grad, int64_t n)
{
    float *b = malloc((size_t)n * sizeof(float));
    *grad = malloc((size_t)n * sizeof(float));
    if (b && *grad) {
        fill(b, n, 1.0);
        memcpy(*grad, b, (size_t)n * sizeof(float));
    }
    return b;
}

/* ---- RMSNorm ---------------------------------------------------------- */

typedef struct {
    double *x, *w, *g;
    int64_t rows, n;
    double eps;
} rms_ctx;

static double rms_loss(void *p)
{
    const rms_ctx *c = p;
    double L = 0;
    for (int64_t r = 0; r < c->rows; r++) {
        const double *x = c->x + r * c->n;
        double ss = 0;
        for (int64_t i = 0; i < c->n; i++) ss += x[i] * x[i];
        double inv = 1 / sqrt(ss / (double)c->n + c->eps);
        for (int64_t i = 0; i < c->n; i++) L += c->g[r * c->n + i] * c->w[i] * x[i] * inv;
    }
    return L;
}

static void test_rmsnorm(int64_t rows, int64_t n, tp_dtype wt)
{
    int64_t nx = rows * n, wshape[1] = {n};
    float *x = malloc((size_t)nx * sizeof(float)), *g = malloc((size_t)nx * sizeof(float));
    float *wf = malloc((size_t)n * sizeof(float)), *dx, *dw;
    float *bx = base_copy(&dx, nx), *bw = base_copy(&dw, n);
    double *xd = malloc((size_t)nx * sizeof(double)), *wd = malloc((size_t)n * sizeof(double));
    double *gd = malloc((size_t)nx * sizeof(double)), *num = malloc((size_t)nx * sizeof(double));
    tp_tensor W = {0};
    if (!x || !g || !wf || !bx || !bw || !dx || !dw || !xd || !wd || !gd || !num ||
        tp_tensor_init(&W, wt, 1, wshape)) {
        CHECK(!"out of memory");
        goto done;
    }
    fill(x, nx, 1.0);
    fill(g, nx, 1.0);
    for (int64_t i = 0; i < n; i++) {
        wf[i] = (float)(1.0 + 0.5 * tp_rng_normal(&rng));
        if (wt == TP_BF16) {   /* the reference sees the bf16 value */
            ((uint16_t *)W.data)[i] = tp_bf16_from_f32(wf[i]);
            wf[i] = tp_f32_from_bf16(((uint16_t *)W.data)[i]);
        } else {
            ((float *)W.data)[i] = wf[i];
        }
    }
    to_double(xd, x, nx);
    to_double(wd, wf, n);
    to_double(gd, g, nx);
    rms_ctx c = {xd, wd, gd, rows, n, 1e-6};
    CHECK(tp_rmsnorm_backward(dx, dw, g, x, &W, rows, n, 1e-6) == TP_OK);
    numeric_grad(num, xd, nx, rms_loss, &c);
    compare(wt == TP_BF16 ? "rmsnorm dx (bf16 w)" : "rmsnorm dx", dx, bx, num, nx);
    numeric_grad(num, wd, n, rms_loss, &c);
    compare(wt == TP_BF16 ? "rmsnorm dw (bf16 w)" : "rmsnorm dw", dw, bw, num, n);
done:
    tp_tensor_release(&W);
    free(x); free(g); free(wf); free(bx); free(bw); free(dx); free(dw);
    free(xd); free(wd); free(gd); free(num);
}

/* ---- RoPE ------------------------------------------------------------- */

typedef struct {
    double *x, *g;
    const double *inv_freq;
    int64_t T, H, hd, pos0;
} rope_ctx;

/* Pairs (i, i + half) rotated by pos·inv_freq[i] (rotate_half form). */
static double rope_loss(void *p)
{
    const rope_ctx *c = p;
    int64_t half = c->hd / 2;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < half; i++) {
                int64_t o = (t * c->H + h) * c->hd;
                double th = (double)(c->pos0 + t) * c->inv_freq[i], a = c->x[o + i], b = c->x[o + half + i];
                L += c->g[o + i] * (a * cos(th) - b * sin(th)) + c->g[o + half + i] * (b * cos(th) + a * sin(th));
            }
    return L;
}

static void test_rope(int kind, const char *what)
{
    enum { T = 5, H = 3, HD = 16, POS0 = 7, N = T * H * HD };
    double inv_freq[HD / 2], xd[N], gd[N], num[N];
    float x[N], table[T * HD];
    /* theta small and original_max_pos short, so that llama3's three
     * bands (kept, blended, divided) all occur among 8 frequencies */
    tp_rope_inv_freq(inv_freq, HD, 100.0, kind, 4.0, 1.0, 4.0, 64);
    tp_rope_table(table, T, HD, inv_freq, POS0);
    fill(x, N, 1.0);
    to_double(gd, x, N);   /* g = the random x, used as the upstream gradient */
    for (int i = 0; i < N; i++) xd[i] = tp_rng_normal(&rng);
    rope_ctx c = {xd, gd, inv_freq, T, H, HD, POS0};
    numeric_grad(num, xd, N, rope_loss, &c);
    tp_rope_backward(x, T, H, HD, table);   /* in place: x held g */
    compare(what, x, NULL, num, N);
}

/* MLA's rope (tp_rope_apply_mla): a rotary part at `off` inside rows of
 * `stride`, rows r of position r / per_t, interleaved pairs (2i, 2i+1) or
 * halves, times a scale; the rest of each row passes through. */
typedef struct {
    double *x, *g;
    const float *table;
    int64_t rows, per_t, stride, off, hd;
    double scale;
    int interleaved;
} mla_rope_ctx;

static double mla_rope_loss(void *p)
{
    const mla_rope_ctx *c = p;
    int64_t half = c->hd / 2, ia = c->interleaved ? 2 : 1, ib = c->interleaved ? 1 : half;
    double L = 0;
    for (int64_t i = 0; i < c->rows * c->stride; i++) L += c->g[i] * c->x[i];
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t i = 0; i < half; i++) {
            const float *row = c->table + (r / c->per_t) * c->hd;
            double cs = row[i] * c->scale, sn = row[half + i] * c->scale;
            int64_t oa = r * c->stride + c->off + ia * i, ob = oa + ib;
            double a = c->x[oa], b = c->x[ob];
            L += c->g[oa] * (a * cs - b * sn - a) + c->g[ob] * (b * cs + a * sn - b);   /* replaces the pass-through */
        }
    return L;
}

static void test_rope_mla(int interleaved, const char *what)
{
    enum { T = 4, NH = 3, HD = 8, OFF = 5, STRIDE = OFF + HD + 2, ROWS = T * NH, N = ROWS * STRIDE };
    double inv_freq[HD / 2], xd[N], gd[N], num[N];
    float x[N], table[T * HD];
    tp_rope_inv_freq(inv_freq, HD, 100.0, 0, 1.0, 1.0, 4.0, 64);
    tp_rope_table(table, T, HD, inv_freq, 3);
    fill(x, N, 1.0);
    to_double(gd, x, N);   /* g = the random x, the upstream gradient */
    for (int i = 0; i < N; i++) xd[i] = tp_rng_normal(&rng);
    mla_rope_ctx c = {xd, gd, table, ROWS, NH, STRIDE, OFF, HD, 1.3, interleaved};
    numeric_grad(num, xd, N, mla_rope_loss, &c);
    tp_rope_backward_mla(x, ROWS, NH, STRIDE, OFF, HD, table, 1.3f, interleaved);   /* in place */
    compare(what, x, NULL, num, N);
}

/* ---- SwiGLU ----------------------------------------------------------- */

typedef struct {
    double *a, *b, *g;
    int64_t n;
} silu_ctx;

static double silu_loss(void *p)
{
    const silu_ctx *c = p;
    double L = 0;
    for (int64_t i = 0; i < c->n; i++) L += c->g[i] * c->a[i] / (1 + exp(-c->a[i])) * c->b[i];
    return L;
}

static void test_silu_mul(void)
{
    enum { N = 50 };
    float a[N], b[N], g[N], *da, *db;
    double ad[N], bd[N], gd[N], num[N];
    float *ba = base_copy(&da, N), *bb = base_copy(&db, N);
    if (!ba || !bb || !da || !db) { CHECK(!"out of memory"); goto done; }
    fill(a, N, 3.0);   /* both tails of the sigmoid */
    a[0] = 30.0f, a[1] = -30.0f;
    fill(b, N, 1.0);
    fill(g, N, 1.0);
    to_double(ad, a, N), to_double(bd, b, N), to_double(gd, g, N);
    silu_ctx c = {ad, bd, gd, N};
    tp_silu_mul_backward(da, db, g, a, b, N);
    numeric_grad(num, ad, N, silu_loss, &c);
    compare("silu_mul d gate", da, ba, num, N);
    numeric_grad(num, bd, N, silu_loss, &c);
    compare("silu_mul d up", db, bb, num, N);
done:
    free(ba); free(bb); free(da); free(db);
}

/* ---- Linear ----------------------------------------------------------- */

typedef struct {
    double *x, *w, *b, *g;
    int64_t T, out, in;
} lin_ctx;

static double lin_loss(void *p)
{
    const lin_ctx *c = p;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t o = 0; o < c->out; o++) {
            double y = c->b[o];
            for (int64_t i = 0; i < c->in; i++) y += c->x[t * c->in + i] * c->w[o * c->in + i];
            L += c->g[t * c->out + o] * y;
        }
    return L;
}

static void test_linear(int64_t T, int64_t out, int64_t in, tp_dtype wt, const char *what)
{
    int64_t nx = T * in, nw = out * in, ny = T * out, ws[2] = {out, in};
    float *x = malloc((size_t)nx * sizeof(float)), *g = malloc((size_t)ny * sizeof(float));
    float *dx, *dw, *db, *bx = base_copy(&dx, nx), *bw = base_copy(&dw, nw), *bb = base_copy(&db, out);
    double *xd = malloc((size_t)nx * sizeof(double)), *wd = malloc((size_t)nw * sizeof(double));
    double *bd = calloc((size_t)out, sizeof(double)), *gd = malloc((size_t)ny * sizeof(double));
    double *num = malloc((size_t)(nx > nw ? nx : nw) * sizeof(double));
    tp_tensor W = {0};
    if (!x || !g || !bx || !bw || !bb || !dx || !dw || !db || !xd || !wd || !bd || !gd || !num ||
        tp_tensor_init(&W, wt, 2, ws)) {
        CHECK(!"out of memory");
        goto done;
    }
    fill(x, nx, 1.0);
    fill(g, ny, 1.0);
    for (int64_t i = 0; i < nw; i++) {
        float v = (float)(0.5 * tp_rng_normal(&rng));
        if (wt == TP_BF16) {
            ((uint16_t *)W.data)[i] = tp_bf16_from_f32(v);
            wd[i] = tp_f32_from_bf16(((uint16_t *)W.data)[i]);
        } else {
            ((float *)W.data)[i] = v;
            wd[i] = v;
        }
    }
    for (int64_t o = 0; o < out; o++) bd[o] = tp_rng_normal(&rng);
    to_double(xd, x, nx);
    to_double(gd, g, ny);
    lin_ctx c = {xd, wd, bd, gd, T, out, in};
    CHECK(tp_matmul_backward(dx, dw, db, g, x, T, &W, NULL) == TP_OK);
    char name[96];
    numeric_grad(num, xd, nx, lin_loss, &c);
    snprintf(name, sizeof name, "%s dx", what);
    compare(name, dx, bx, num, nx);
    numeric_grad(num, wd, nw, lin_loss, &c);
    snprintf(name, sizeof name, "%s dW", what);
    compare(name, dw, bw, num, nw);
    numeric_grad(num, bd, out, lin_loss, &c);
    snprintf(name, sizeof name, "%s db", what);
    compare(name, db, bb, num, out);
done:
    tp_tensor_release(&W);
    free(x); free(g); free(dx); free(dw); free(db); free(bx); free(bw); free(bb);
    free(xd); free(wd); free(bd); free(gd); free(num);
}

/* ---- Embedding -------------------------------------------------------- */

typedef struct {
    double *w, *g;
    const int64_t *ids;
    int64_t T, row0, rows, width;
} emb_ctx;

static double emb_loss(void *p)
{
    const emb_ctx *c = p;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++) {
        int64_t r = c->ids[t] - c->row0;
        if (r < 0 || r >= c->rows) continue;
        for (int64_t i = 0; i < c->width; i++) L += c->g[t * c->width + i] * c->w[r * c->width + i];
    }
    return L;
}

static void test_embedding(tp_threadpool *pool3)
{
    /* this rank holds ids [3, 8); 0, 9 and 12 belong to others; 4 and 6 repeat */
    enum { T = 9, ROWS = 5, W = 6, ROW0 = 3 };
    const int64_t ids[T] = {4, 0, 6, 4, 9, 3, 7, 12, 6};
    float wf[ROWS * W], y[T * W], g[T * W], *dw, *dw3 = malloc(sizeof(float) * ROWS * W);
    double wd[ROWS * W], gd[T * W], num[ROWS * W];
    float *bw = base_copy(&dw, ROWS * W);
    int64_t ws[2] = {ROWS, W};
    tp_tensor Wt = {0};
    if (!bw || !dw || !dw3 || tp_tensor_init(&Wt, TP_F32, 2, ws)) { CHECK(!"out of memory"); goto done; }
    fill(wf, ROWS * W, 1.0);
    fill(g, T * W, 1.0);
    memcpy(Wt.data, wf, sizeof wf);
    tp_embedding_forward(y, &Wt, ROW0, ids, T);
    int ok = 1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < W; i++) {
            int64_t r = ids[t] - ROW0;
            float want = r >= 0 && r < ROWS ? wf[r * W + i] : 0.0f;
            ok &= y[t * W + i] == want;
        }
    CHECK_MSG(ok, "embedding forward: rows in range looked up, the others zero");
    to_double(wd, wf, ROWS * W);
    to_double(gd, g, T * W);
    emb_ctx c = {wd, gd, ids, T, ROW0, ROWS, W};
    memcpy(dw3, dw, sizeof(float) * ROWS * W);
    tp_embedding_backward(dw, ROW0, ROWS, W, ids, g, T, NULL);
    tp_embedding_backward(dw3, ROW0, ROWS, W, ids, g, T, pool3);
    numeric_grad(num, wd, ROWS * W, emb_loss, &c);
    compare("embedding dW", dw, bw, num, ROWS * W);
    CHECK_MSG(memcmp(dw, dw3, sizeof(float) * ROWS * W) == 0, "embedding dW: 1 and 3 threads differ");
done:
    tp_tensor_release(&Wt);
    free(bw); free(dw); free(dw3);
}

/* ---- Cross-entropy ---------------------------------------------------- */

typedef struct {
    double *z;
    const int64_t *labels;
    int64_t T, V;
    double count;
} ce_ctx;

/* Σ over counted rows of log Σ exp(z) − z[label], divided by count. */
static double ce_loss(void *p)
{
    const ce_ctx *c = p;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++) {
        if (c->labels[t] == -100) continue;
        const double *z = c->z + t * c->V;
        double s = 0;
        for (int64_t i = 0; i < c->V; i++) s += exp(z[i]);
        L += log(s) - z[c->labels[t]];
    }
    return L / c->count;
}

static void test_cross_entropy(tp_threadpool *pool3)
{
    enum { T = 7, V = 11, N = T * V };
    const int64_t labels[T] = {3, -100, 0, 10, -100, 5, 3};
    const double count = 5 + 4;   /* 5 counted here, 4 more in other micro-batches */
    float z[N], dz[N], dz3[N], zs[N];
    double zd[N], num[N], loss = 0, loss3 = 0, loss_s = 0;
    fill(z, N, 2.0);
    to_double(zd, z, N);
    ce_ctx c = {zd, labels, T, V, count};
    CHECK(tp_cross_entropy(&loss, dz, z, labels, T, V, count, NULL) == TP_OK);
    double want = ce_loss(&c) * count;
    CHECK_MSG(fabs(loss - want) < 1e-5 * fabs(want), "cross-entropy loss %.9g, want %.9g", loss, want);
    numeric_grad(num, zd, N, ce_loss, &c);
    compare("cross-entropy dlogits", dz, NULL, num, N);
    int zero = 1;
    for (int i = 0; i < V; i++) zero &= dz[V + i] == 0.0f && dz[4 * V + i] == 0.0f;
    CHECK_MSG(zero, "cross-entropy: ignored rows have zero gradient");
    /* threads, and in place */
    memcpy(dz3, z, sizeof z);
    CHECK(tp_cross_entropy(&loss3, dz3, dz3, labels, T, V, count, pool3) == TP_OK);
    CHECK_MSG(loss3 == loss && memcmp(dz3, dz, sizeof dz) == 0, "cross-entropy: 3 threads in place differ");
    /* logits shifted by 1000: the same loss (no exp overflows) */
    for (int i = 0; i < N; i++) zs[i] = z[i] + 1000.0f;
    CHECK(tp_cross_entropy(&loss_s, NULL, zs, labels, T, V, count, NULL) == TP_OK);
    CHECK_MSG(isfinite(loss_s) && fabs(loss_s - loss) < 1e-3 * fabs(loss), "shifted logits: loss %g vs %g",
              loss_s, loss);
    /* nothing counted: zero loss, zero gradient, any count */
    const int64_t none[T] = {-100, -100, -100, -100, -100, -100, -100};
    CHECK(tp_cross_entropy(&loss, dz, z, none, T, V, 0, NULL) == TP_OK);
    zero = loss == 0;
    for (int i = 0; i < N; i++) zero &= dz[i] == 0.0f;
    CHECK_MSG(zero, "cross-entropy: all ignored gives zero loss and gradient");
    /* refused: a label outside the vocabulary, a count of 0 */
    const int64_t bad[T] = {3, 11, 0, 0, 0, 0, 0};
    CHECK(tp_cross_entropy(&loss, dz, z, bad, T, V, count, NULL) == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "label 11") != NULL);
    CHECK(tp_cross_entropy(&loss, dz, z, labels, T, V, 0, NULL) == TP_ERR_INVALID);
}

/* ---- Attention -------------------------------------------------------- */

typedef struct {
    int64_t T, pos0, H, KV, d, window;
} ashape;

typedef struct {
    double *q, *k, *v, *g;
    ashape s;
} attn_ctx;

/* out = softmax(q·kᵀ/√d over the keys each query sees)·v, in double; with
 * lse != NULL also the log-sum-exp of each row's scores. */
static double attn_forward(const attn_ctx *c, double *out, double *lse)
{
    const ashape *s = &c->s;
    int64_t d = s->d, grp = s->H / s->KV, L = s->pos0 + s->T;
    double *sc = malloc((size_t)L * sizeof(double)), loss = 0;
    if (!sc) return NAN;
    for (int64_t t = 0; t < s->T; t++)
        for (int64_t h = 0; h < s->H; h++) {
            int64_t pos = s->pos0 + t, lo = s->window > 0 && pos - s->window + 1 > 0 ? pos - s->window + 1 : 0;
            const double *q = c->q + (t * s->H + h) * d;
            double mx = -INFINITY, sum = 0;
            for (int64_t p = lo; p <= pos; p++) {
                const double *k = c->k + (p * s->KV + h / grp) * d;
                double dot = 0;
                for (int64_t i = 0; i < d; i++) dot += q[i] * k[i];
                sc[p] = dot / sqrt((double)d);
                if (sc[p] > mx) mx = sc[p];
            }
            for (int64_t p = lo; p <= pos; p++) sum += exp(sc[p] - mx);
            if (lse) lse[t * s->H + h] = mx + log(sum);
            for (int64_t i = 0; i < d; i++) {
                double o = 0;
                for (int64_t p = lo; p <= pos; p++) o += exp(sc[p] - mx) / sum * c->v[(p * s->KV + h / grp) * d + i];
                if (out) out[(t * s->H + h) * d + i] = o;
                loss += c->g[(t * s->H + h) * d + i] * o;
            }
        }
    free(sc);
    return loss;
}

static double attn_loss(void *p) { return attn_forward(p, NULL, NULL); }

static double max_rel(const float *a, const double *ref, int64_t n)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(a[i] - ref[i]) > e) e = fabs(a[i] - ref[i]);
        if (fabs(ref[i]) > r) r = fabs(ref[i]);
    }
    return e / (r > 0 ? r : 1);
}

static void test_attention(const ashape *s, tp_threadpool *pool3)
{
    int64_t nq = s->T * s->H * s->d, nkv = (s->pos0 + s->T) * s->KV * s->d, nr = s->T * s->H;
    float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nkv);
    float *v = malloc(sizeof(float) * (size_t)nkv), *g = malloc(sizeof(float) * (size_t)nq);
    float *out = malloc(sizeof(float) * (size_t)nq), *out_inf = malloc(sizeof(float) * (size_t)nq);
    float *lse = malloc(sizeof(float) * (size_t)nr), *dq, *dk, *dv;
    float *bq = base_copy(&dq, nq), *bk = base_copy(&dk, nkv), *bv = base_copy(&dv, nkv);
    float *dq3 = malloc(sizeof(float) * (size_t)nq), *dk3 = malloc(sizeof(float) * (size_t)nkv);
    float *dv3 = malloc(sizeof(float) * (size_t)nkv);
    double *qd = malloc(sizeof(double) * (size_t)nq), *kd = malloc(sizeof(double) * (size_t)nkv);
    double *vd = malloc(sizeof(double) * (size_t)nkv), *gd = malloc(sizeof(double) * (size_t)nq);
    double *num = malloc(sizeof(double) * (size_t)(nq > nkv ? nq : nkv));
    double *outd = malloc(sizeof(double) * (size_t)nq), *lsed = malloc(sizeof(double) * (size_t)nr);
    char name[128];
    if (!q || !k || !v || !g || !out || !out_inf || !lse || !bq || !bk || !bv || !dq || !dk || !dv || !dq3 ||
        !dk3 || !dv3 || !qd || !kd || !vd || !gd || !num || !outd || !lsed) {
        CHECK(!"out of memory");
        goto done;
    }
    fill(q, nq, 1.5);   /* scores spread over a few units: peaked rows and flat ones */
    fill(k, nkv, 1.0);
    fill(v, nkv, 1.0);
    fill(g, nq, 1.0);
    to_double(qd, q, nq), to_double(kd, k, nkv), to_double(vd, v, nkv), to_double(gd, g, nq);
    attn_ctx c = {qd, kd, vd, gd, *s};
    attn_forward(&c, outd, lsed);
    snprintf(name, sizeof name, "attention T=%lld pos0=%lld H=%lld KV=%lld d=%lld window=%lld", (long long)s->T,
             (long long)s->pos0, (long long)s->H, (long long)s->KV, (long long)s->d, (long long)s->window);

    /* the forward that keeps lse: the definition's out and lse, and the
     * inference kernel's out */
    CHECK(tp_attention_forward_lse(out, lse, q, k, v, s->T, s->pos0, s->H, s->KV, s->d, s->window, pool3) == TP_OK);
    tp_attention(out_inf, q, k, v, s->T, s->pos0, s->H, s->KV, s->d, s->window, NULL);
    double lse_err = 0;
    for (int64_t r = 0; r < nr; r++) lse_err = fmax(lse_err, fabs(lse[r] - lsed[r]));
    CHECK_MSG(max_rel(out, outd, nq) < 1e-5, "%s: forward out off by %.3g", name, max_rel(out, outd, nq));
    CHECK_MSG(lse_err < 1e-5, "%s: lse off by %.3g", name, lse_err);
    double *inf_d = outd;   /* compare tp_attention's out with forward_lse's */
    double worst = 0;
    for (int64_t i = 0; i < nq; i++) worst = fmax(worst, fabs((double)out_inf[i] - inf_d[i]));
    CHECK_MSG(worst < 1e-5, "%s: tp_attention differs from the definition by %.3g", name, worst);

    memcpy(dq3, dq, sizeof(float) * (size_t)nq);
    memcpy(dk3, dk, sizeof(float) * (size_t)nkv);
    memcpy(dv3, dv, sizeof(float) * (size_t)nkv);
    CHECK(tp_attention_backward(dq, dk, dv, g, q, k, v, out, lse, s->T, s->pos0, s->H, s->KV, s->d, s->window,
                                NULL) == TP_OK);
    CHECK(tp_attention_backward(dq3, dk3, dv3, g, q, k, v, out, lse, s->T, s->pos0, s->H, s->KV, s->d,
                                s->window, pool3) == TP_OK);
    CHECK_MSG(!memcmp(dq, dq3, sizeof(float) * (size_t)nq) && !memcmp(dk, dk3, sizeof(float) * (size_t)nkv) &&
              !memcmp(dv, dv3, sizeof(float) * (size_t)nkv), "%s: 1 and 3 threads differ", name);
    char part[160];
    numeric_grad(num, qd, nq, attn_loss, &c);
    snprintf(part, sizeof part, "%s dq", name);
    compare(part, dq, bq, num, nq);
    numeric_grad(num, kd, nkv, attn_loss, &c);
    snprintf(part, sizeof part, "%s dk", name);
    compare(part, dk, bk, num, nkv);
    numeric_grad(num, vd, nkv, attn_loss, &c);
    snprintf(part, sizeof part, "%s dv", name);
    compare(part, dv, bv, num, nkv);
done:
    free(q); free(k); free(v); free(g); free(out); free(out_inf); free(lse);
    free(bq); free(bk); free(bv); free(dq); free(dk); free(dv); free(dq3); free(dk3); free(dv3);
    free(qd); free(kd); free(vd); free(gd); free(num); free(outd); free(lsed);
}

static void test_attention_refusals(void)
{
    float x[64] = {0};
    CHECK(tp_attention_backward(x, x, NULL, x, x, x, x, x, x, 1, 0, 2, 1, 8, 0, NULL) == TP_ERR_INVALID);
    CHECK(tp_attention_forward_lse(x, x, x, x, x, 1, 0, 3, 2, 8, 0, NULL) == TP_ERR_INVALID);
}

int main(void)
{
    tp_rng_seed(&rng, 13);
    tp_threadpool *pool3 = NULL;
    CHECK(tp_threadpool_create(&pool3, 3) == TP_OK);

    test_rmsnorm(5, 12, TP_F32);
    test_rmsnorm(3 * 4, 8, TP_F32);   /* Qwen3's q/k norm: T·heads rows of head_dim */
    test_rmsnorm(4, 9, TP_BF16);

    test_rope(0, "rope dx (default)");
    test_rope(1, "rope dx (llama3)");
    test_rope(2, "rope dx (linear)");
    test_rope_mla(1, "MLA rope dx (interleaved pairs, scaled)");
    test_rope_mla(0, "MLA rope dx (halves, scaled)");

    test_silu_mul();

    test_linear(6, 7, 10, TP_F32, "linear f32");
    test_linear(20, 17, 33, TP_F32, "linear f32 20x33->17");
    test_linear(3, 300, 5, TP_BF16, "linear bf16 (two row blocks)");

    test_embedding(pool3);
    test_cross_entropy(pool3);

    static const ashape shapes[] = {
        {7, 0, 4, 2, 8, 0},     /* GQA group 2 */
        {9, 3, 6, 2, 16, 4},    /* group 3, a cached prefix, sliding window */
        {5, 0, 2, 2, 8, 0},     /* no grouping */
        {40, 0, 3, 1, 8, 0},    /* group 3 over one KV head, two key blocks */
        {12, 30, 2, 1, 12, 5},  /* long prefix, window, head_dim 12 */
        {37, 5, 4, 2, 8, 20},   /* window across key blocks, steps of rows cut short */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) test_attention(&shapes[i], pool3);
    test_attention_refusals();

    tp_threadpool_destroy(pool3);
    printf("worst relative error of a gradient: %.3g (bound %g)\n", worst_err, GRAD_TOL);
    return check_summary();
}
