/* The flash-style attention (attention.c, attention_flash.h) against the
 * scalar reference, on the shapes that pick its different code: GQA groups
 * of 1, 2, 3 and 4 heads (heads paired or single in the lanes kernel),
 * head sizes that are not a multiple of the vector width (transpose and
 * tile tails), full and partial query blocks (lanes and rows kernels),
 * several key blocks, a KV cache before the prompt, sliding windows, and
 * decode against a long cache.  Beyond the error bound: the result must be
 * bit-identical for every thread count, and each head's result must not
 * depend on which other heads run in the same call (a tensor-parallel rank
 * runs a subset of the KV groups). */
#include "check.h"
#include "tensorpar/kernels.h"
#include "kernels/kern_internal.h"
#include "skip_paths.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tp_rng rng;

static const tp_kernel_path FAST[] = {TP_KERNEL_AVX2, TP_KERNEL_AVX512};

typedef struct {
    int64_t T, pos0, nh, nkv, d, window;
} shape;

typedef struct {
    float *q, *k, *v, *ref, *out, *out2;
} bufs;

static void bufs_free(bufs *b)
{
    free(b->q); free(b->k); free(b->v); free(b->ref); free(b->out); free(b->out2);
}

static int bufs_alloc(bufs *b, const shape *s)
{
    size_t nq = (size_t)(s->T * s->nh * s->d), nkv = (size_t)((s->pos0 + s->T) * s->nkv * s->d);
    b->q = malloc(nq * sizeof(float));
    b->k = malloc(nkv * sizeof(float));
    b->v = malloc(nkv * sizeof(float));
    b->ref = malloc(nq * sizeof(float));
    b->out = malloc(nq * sizeof(float));
    b->out2 = malloc(nq * sizeof(float));
    if (!b->q || !b->k || !b->v || !b->ref || !b->out || !b->out2) return 0;
    /* scores with a spread of several units, so the running maximum moves
     * and the exponentials span orders of magnitude */
    for (size_t i = 0; i < nq; i++) b->q[i] = (float)(2.0 * tp_rng_normal(&rng));
    for (size_t i = 0; i < nkv; i++) b->k[i] = (float)tp_rng_normal(&rng);
    for (size_t i = 0; i < nkv; i++) b->v[i] = (float)tp_rng_normal(&rng);
    return 1;
}

static void run(tp_kernel_path p, float *out, const bufs *b, const shape *s, tp_threadpool *pool)
{
    tp_attention_path(p, out, b->q, b->k, b->v, s->T, s->pos0, s->nh, s->nkv, s->d, s->window, pool);
}

static double max_abs_diff(const float *a, const float *b, int64_t n)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
    }
    return e;
}

/* Heads [g·group, (g+1)·group) of the full run, run alone as KV group g
 * would be on a tensor-parallel rank: same bits. */
static void check_group_alone(tp_kernel_path p, const bufs *b, const shape *s, int64_t g)
{
    int64_t group = s->nh / s->nkv, L = s->pos0 + s->T, d = s->d;
    float *q = malloc((size_t)(s->T * group * d) * sizeof(float));
    float *k = malloc((size_t)(L * d) * sizeof(float)), *v = malloc((size_t)(L * d) * sizeof(float));
    float *o = malloc((size_t)(s->T * group * d) * sizeof(float));
    if (!q || !k || !v || !o) { CHECK(!"oom"); goto done; }
    for (int64_t t = 0; t < s->T; t++)
        memcpy(q + t * group * d, b->q + (t * s->nh + g * group) * d, (size_t)(group * d) * sizeof(float));
    for (int64_t t = 0; t < L; t++) {
        memcpy(k + t * d, b->k + (t * s->nkv + g) * d, (size_t)d * sizeof(float));
        memcpy(v + t * d, b->v + (t * s->nkv + g) * d, (size_t)d * sizeof(float));
    }
    tp_attention_path(p, o, q, k, v, s->T, s->pos0, group, 1, d, s->window, NULL);
    int same = 1;
    for (int64_t t = 0; t < s->T; t++)
        same &= memcmp(o + t * group * d, b->out + (t * s->nh + g * group) * d,
                       (size_t)(group * d) * sizeof(float)) == 0;
    CHECK_MSG(same, "attention %s T=%lld d=%lld heads %lld/%lld: KV group %lld alone differs",
              tp_kernel_path_name(p), (long long)s->T, (long long)d, (long long)s->nh, (long long)s->nkv,
              (long long)g);
done:
    free(q); free(k); free(v); free(o);
}

static double worst;   /* the largest error / bound */

static void check_shape(const shape *s, tp_threadpool *pool3)
{
    bufs b = {0};
    if (!bufs_alloc(&b, s)) { CHECK(!"oom"); bufs_free(&b); return; }
    int64_t n = s->T * s->nh * s->d;
    run(TP_KERNEL_SCALAR, b.ref, &b, s, NULL);
    for (size_t pi = 0; pi < sizeof FAST / sizeof *FAST; pi++) {
        tp_kernel_path p = FAST[pi];
        if (!tp_kernel_path_supported(p)) continue;
        run(p, b.out, &b, s, NULL);
        /* outputs are convex combinations of v (|v| ~ 1): absolute error,
         * which grows like the rounding of the reference's float sums over
         * the keys, ~ sqrt(keys) */
        double e = max_abs_diff(b.out, b.ref, n), keys = (double)(s->pos0 + s->T);
        double bound = 4e-6 * (keys > 256 ? sqrt(keys / 256) : 1.0);
        if (e / bound > worst) worst = e / bound;
        CHECK_MSG(e <= bound, "attention %s T=%lld pos0=%lld heads %lld/%lld d=%lld window=%lld: err %.3g",
                  tp_kernel_path_name(p), (long long)s->T, (long long)s->pos0, (long long)s->nh,
                  (long long)s->nkv, (long long)s->d, (long long)s->window, e);
        run(p, b.out2, &b, s, pool3);
        CHECK_MSG(memcmp(b.out, b.out2, (size_t)n * sizeof(float)) == 0,
                  "attention %s T=%lld d=%lld heads %lld/%lld: 1 and 3 threads differ", tp_kernel_path_name(p),
                  (long long)s->T, (long long)s->d, (long long)s->nh, (long long)s->nkv);
        if (s->nkv > 1) check_group_alone(p, &b, s, s->nkv - 1);
    }
    bufs_free(&b);
}

int main(void)
{
    tp_rng_seed(&rng, 4321);
    tp_threadpool *pool3 = NULL;
    CHECK(tp_threadpool_create(&pool3, 3) == TP_OK);
    /* GQA groups of 2 (paired heads), 1, 3 (single) and 4 (two pairs) */
    static const int64_t heads[][2] = {{4, 2}, {3, 3}, {6, 2}, {8, 2}};
    static const int64_t Ts[] = {1, 7, 16, 33, 129};
    static const int64_t Ds[] = {7, 16, 129};
    for (size_t hi = 0; hi < sizeof heads / sizeof *heads; hi++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
            for (size_t di = 0; di < sizeof Ds / sizeof *Ds; di++)
                for (int variant = 0; variant < 3; variant++) {
                    /* 0: a fresh prompt; 1: after 70 cached positions; 2: a
                     * sliding window of 9 with 5 cached */
                    shape s = {Ts[ti], variant == 1 ? 70 : variant == 2 ? 5 : 0, heads[hi][0], heads[hi][1],
                               Ds[di], variant == 2 ? 9 : 0};
                    check_shape(&s, pool3);
                }
    /* many key blocks, partial last query block, window spanning blocks */
    check_shape(&(shape){1025, 0, 4, 2, 64, 0}, pool3);
    check_shape(&(shape){300, 17, 4, 2, 128, 100}, pool3);
    /* qwen3-0.6b decode against a long cache, and a short chunk after it */
    check_shape(&(shape){1, 2047, 16, 8, 128, 0}, pool3);
    check_shape(&(shape){40, 1000, 16, 8, 128, 0}, pool3);
    print_skipped_paths("test_attention");
    printf("attention: largest |flash - reference| / bound %.2g\n", worst);
    tp_threadpool_destroy(pool3);
    return check_summary();
}
