/* tp_kernel_bench: the numbers that say how close the kernels come to the
 * machine.  Every figure is the median of several repetitions. */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#define REPS_MAX 15

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* ---- FMA peak: 24 independent FMA chains in registers ------------------ */

#define FMA_ITERS 240000000L   /* ~50 ms per run at peak */

typedef struct { float sink[64]; } fma_job;

TP_T512 static void fma512_worker(void *p, int ti, int nt)
{
    (void)nt;
    fma_job *j = p;
    __m512 a[24], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < FMA_ITERS / 24; it++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 24; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    j->sink[ti % 64] = _mm512_reduce_add_ps(a[0]);
}

/* Seconds per run of fn with nt threads (a pool of exactly nt, or NULL). */
static double time_run(tp_threadpool *pool, tp_parallel_fn fn, void *ctx)
{
    double t0 = tp_now();
    tp_parallel_run(pool, fn, ctx);
    return tp_now() - t0;
}

/* ---- read bandwidth ---------------------------------------------------- */

typedef struct { const float *buf; int64_t n; float sink[64]; } bw_job;

TP_T512 static void bw_worker(void *p, int ti, int nt)
{
    bw_job *j = p;
    int64_t b, e;
    tp_split_range(j->n / 64, ti, nt, &b, &e);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = b * 64; i < e * 64; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(j->buf + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(j->buf + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(j->buf + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(j->buf + i + 48));
    }
    j->sink[ti % 64] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* ---- matmul ------------------------------------------------------------ */

typedef struct {
    const char *name;
    int64_t T, n, k;
} shape;

static tp_status make_weight(tp_tensor *w, tp_dtype dt, int64_t n, int64_t k, tp_rng *rng)
{
    int64_t s[2] = {n, k};
    tp_status st = tp_tensor_init(w, dt, 2, s);
    if (st) return st;
    for (int64_t i = 0; i < n * k; i++) {
        float v = (float)(0.02 * tp_rng_normal(rng));
        if (dt == TP_F32) ((float *)w->data)[i] = v;
        else ((uint16_t *)w->data)[i] = tp_bf16_from_f32(v);
    }
    return TP_OK;
}

enum { V_F32, V_BF16, V_BF16DOT, V_AVX2_F32, V_BLAS_F32, V_BLAS_BF16, NVAR };
static const char *const var_names[NVAR] = {"avx512 f32", "avx512 bf16", "avx512 bf16-dot",
                                            "avx2 f32", "openblas f32", "openblas bf16"};

static double time_matmul(float *y, const float *x, int64_t T, const tp_tensor *W, tp_threadpool *pool,
                          const tp_matmul_opts *o, int reps)
{
    double t[REPS_MAX];
    tp_matmul_ex(y, x, T, W, NULL, pool, o);   /* warm up */
    for (int r = 0; r < reps; r++) {
        double t0 = tp_now();
        tp_matmul_ex(y, x, T, W, NULL, pool, o);
        t[r] = tp_now() - t0;
    }
    return median(t, reps);
}

tp_status tp_machine_peaks_measure(tp_machine_peaks *out, tp_threadpool *pool, int quick)
{
    memset(out, 0, sizeof *out);
    /* quick = 2 is a smoke run (tests, sanitizers): one repetition over a
     * buffer small enough to be cached; the figures then mean nothing. */
    int nt = tp_threadpool_size(pool), reps = quick > 1 ? 1 : quick ? 3 : 7;
    out->threads = nt;
    if (!tp_kernel_path_supported(TP_KERNEL_AVX512))
        return tp_fail(TP_ERR_UNSUPPORTED, "tp_kernel_bench: needs AVX-512");
    double t[REPS_MAX];

    /* FMA peak */
    fma_job fj;
    for (int r = 0; r < reps; r++) t[r] = time_run(NULL, fma512_worker, &fj);
    out->fma_gflops_1 = 2.0 * 16 * FMA_ITERS / 24 * 24 / median(t, reps) / 1e9;
    for (int r = 0; r < reps; r++) t[r] = time_run(pool, fma512_worker, &fj);
    out->fma_gflops_n = nt * 2.0 * 16 * FMA_ITERS / 24 * 24 / median(t, reps) / 1e9;

    /* read bandwidth over 1 GiB of huge pages (the L3 may hold 300 MiB) */
    int64_t n = quick > 1 ? (int64_t)1 << 22 : (int64_t)1 << 28;
    float *buf = tp_alloc((size_t)n * sizeof(float));
    if (!buf) return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory for 1 GiB");
    for (int64_t i = 0; i < n; i++) buf[i] = 1.0f;
    bw_job bj = {buf, n, {0}};
    for (int r = 0; r < reps; r++) t[r] = time_run(NULL, bw_worker, &bj);
    out->read_gbs_1 = (double)n * 4 / median(t, reps) / 1e9;
    for (int r = 0; r < reps; r++) t[r] = time_run(pool, bw_worker, &bj);
    out->read_gbs_n = (double)n * 4 / median(t, reps) / 1e9;
    tp_free(buf);
    return TP_OK;
}

tp_status tp_kernel_bench(FILE *out, tp_threadpool *pool, int quick)
{
    int nt = tp_threadpool_size(pool), reps = quick ? 3 : 7;
    tp_machine_peaks pk;
    tp_status st0 = tp_machine_peaks_measure(&pk, pool, quick);
    if (st0) return st0;
    fprintf(out, "FMA peak (AVX-512, registers only): %.1f GFLOP/s on 1 thread, %.1f on %d\n", pk.fma_gflops_1,
            pk.fma_gflops_n, nt);
    fprintf(out, "read bandwidth (1 GiB, 2 MiB pages): %.1f GB/s on 1 thread, %.1f on %d\n", pk.read_gbs_1,
            pk.read_gbs_n, nt);

    /* GEMM at the qwen3-0.6b prefill shapes */
    static const shape shapes[] = {
        {"q_proj", 512, 2048, 1024}, {"k/v_proj", 512, 1024, 1024}, {"o_proj", 512, 1024, 2048},
        {"gate/up", 512, 3072, 1024}, {"down", 512, 1024, 3072}, {"lm_head T=64", 64, 151936, 1024},
    };
    tp_rng rng;
    tp_rng_seed(&rng, 7);
    float *x = malloc((size_t)512 * 3072 * sizeof(float));
    float *y = tp_alloc((size_t)512 * 151936 * sizeof(float));
    if (!x || !y) { free(x); tp_free(y); return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory"); }
    for (int64_t i = 0; i < 512 * 3072; i++) x[i] = (float)tp_rng_normal(&rng);
    fprintf(out, "\nGEMM GFLOP/s, %d thread(s) (OpenBLAS under OPENBLAS_CORETYPE=%s):\n%-14s", nt,
            getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(auto)", "shape");
    for (int v = 0; v < NVAR; v++) fprintf(out, " %16s", var_names[v]);
    fprintf(out, "\n");
    tp_status st = TP_OK;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes && !st; s++) {
        const shape *sh = &shapes[s];
        tp_tensor wf = {0}, wb = {0};
        if ((st = make_weight(&wf, TP_F32, sh->n, sh->k, &rng)) || (st = make_weight(&wb, TP_BF16, sh->n, sh->k, &rng))) {
            tp_tensor_release(&wf);
            break;
        }
        fprintf(out, "%-14s", sh->name);
        int r = sh->n > 100000 ? (reps < 3 ? reps : 3) : reps;
        for (int v = 0; v < NVAR; v++) {
            tp_matmul_opts o = {TP_KERNEL_AVX512, 0, 0};
            const tp_tensor *W = &wf;
            if (v == V_BF16 || v == V_BF16DOT || v == V_BLAS_BF16) W = &wb;
            if (v == V_BF16DOT) { if (!tp_kernel_has_bf16_dot()) { fprintf(out, " %16s", "-"); continue; } o.bf16_dot = 1; }
            if (v == V_AVX2_F32) o.path = TP_KERNEL_AVX2;
            if (v == V_BLAS_F32 || v == V_BLAS_BF16) o.blas = 1;
            double sec = time_matmul(y, x, sh->T, W, pool, &o, r);
            fprintf(out, " %16.1f", 2.0 * (double)sh->T * (double)sh->n * (double)sh->k / sec / 1e9);
            fflush(out);
        }
        fprintf(out, "\n");
        tp_tensor_release(&wf);
        tp_tensor_release(&wb);
    }

    /* GEMV (decode): lm_head-sized weights (311 MB bf16, 622 MB f32) are far
     * bigger than any cache; the per-layer shapes may sit in the L3. */
    static const shape gshapes[] = {{"gate/up T=1", 1, 3072, 1024}, {"down T=1", 1, 1024, 3072},
                                    {"lm_head T=1", 1, 151936, 1024}, {"lm_head T=4", 4, 151936, 1024}};
    fprintf(out, "\nGEMV GB/s of weights read, %d thread(s):\n%-14s %12s %12s %16s\n", nt, "shape", "f32", "bf16",
            "bf16-dot");
    for (size_t s = 0; s < sizeof gshapes / sizeof *gshapes && !st; s++) {
        const shape *sh = &gshapes[s];
        tp_tensor wf = {0}, wb = {0};
        if ((st = make_weight(&wf, TP_F32, sh->n, sh->k, &rng)) || (st = make_weight(&wb, TP_BF16, sh->n, sh->k, &rng))) {
            tp_tensor_release(&wf);
            break;
        }
        fprintf(out, "%-14s", sh->name);
        for (int v = 0; v < 3; v++) {
            tp_matmul_opts o = {TP_KERNEL_AVX512, v == 2, 0};
            const tp_tensor *W = v ? &wb : &wf;
            double sec = time_matmul(y, x, sh->T, W, pool, &o, reps);
            fprintf(out, " %*.1f", v == 2 ? 16 : 12, (double)tp_tensor_nbytes(W) / sec / 1e9);
        }
        fprintf(out, "\n");
        tp_tensor_release(&wf);
        tp_tensor_release(&wb);
    }
    free(x);
    tp_free(y);
    return st;
}
