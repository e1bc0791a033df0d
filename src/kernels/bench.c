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

/* The peaks are measured with AVX-512 code (x86-64 only). */
#if TP_KERNELS_X86
/* ---- FMA peak: 24 independent FMA chains in registers ------------------ */

#define FMA_ITERS 240000000L   /* ~50 ms per run at peak */

typedef struct { long iters; float sink[64]; } fma_job;

TP_T512 static void fma512_worker(void *p, int ti, int nt)
{
    (void)nt;
    fma_job *j = p;
    __m512 a[24], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < j->iters / 24; it++)
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

/* What the host lets lockstep work gain from the pool's nt threads: chunks
 * of FMA work (~25 ms, about a TP=2 rank's share of one block of a 512-token
 * qwen3-0.6b prefill), run by one thread and by all nt at once with a
 * barrier after each, alternately.  nt × t(1 thread) ÷ t(nt threads): nt on
 * an idle machine; less when the host slows one core (another tenant on
 * its sibling), since each step waits for the slowest — as a TP run's
 * collectives do, while one thread on one core only feels its own. */
static double lockstep_scaling(tp_threadpool *pool, int chunks)
{
    fma_job j = {FMA_ITERS / 2, {0}};
    double one = 0, all = 0;
    for (int c = 0; c < chunks; c++) {
        one += time_run(NULL, fma512_worker, &j);
        all += time_run(pool, fma512_worker, &j);
    }
    return tp_threadpool_size(pool) * one / all;
}

/* ---- read bandwidth ---------------------------------------------------- */

/* A sum over the buffer with 8 independent accumulators (a chain of adds
 * would be latency-bound), optionally with a software prefetch BW_PF_BYTES
 * ahead.  Both are measured and the better one counts: on these machines
 * the hardware streamers alone leave about a quarter of one core's
 * bandwidth unused (they restart at every 4 KiB page), and the GEMV
 * prefetches too, so a plain loop would understate what a reader gets. */
#define BW_PF_BYTES 8192

typedef struct { const float *buf; int64_t n; int prefetch; float sink[64]; } bw_job;

TP_T512 static void bw_worker(void *p, int ti, int nt)
{
    bw_job *j = p;
    int64_t b, e;
    tp_split_range(j->n / 128, ti, nt, &b, &e);
    __m512 s[8];
    for (int u = 0; u < 8; u++) s[u] = _mm512_setzero_ps();
    const char *q = (const char *)j->buf;
    int64_t end = e * 512, pf_last = end - 64;   /* prefetch only this thread's share */
    if (j->prefetch) {
        for (int64_t i = b * 512; i < end; i += 512)
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) {
                int64_t f = i + BW_PF_BYTES + 64 * u;
                _mm_prefetch(q + (f < pf_last ? f : pf_last), _MM_HINT_T0);
                s[u] = _mm512_add_ps(s[u], _mm512_load_ps(q + i + 64 * u));
            }
    } else {
        for (int64_t i = b * 512; i < end; i += 512)
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) s[u] = _mm512_add_ps(s[u], _mm512_load_ps(q + i + 64 * u));
    }
    for (int u = 1; u < 8; u++) s[0] = _mm512_add_ps(s[0], s[u]);
    j->sink[ti % 64] = _mm512_reduce_add_ps(s[0]);
}

/* GB/s of the plain and the prefetching loop, median of reps each; the runs
 * alternate so that a busy neighbour slows both alike. */
static void read_bw(const float *buf, int64_t n, tp_threadpool *pool, int reps, double *plain, double *pf)
{
    double t[2][REPS_MAX];
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 2; v++) {
            bw_job bj = {buf, n, v, {0}};
            t[v][r] = time_run(pool, bw_worker, &bj);
        }
    *plain = (double)n * 4 / median(t[0], reps) / 1e9;
    *pf = (double)n * 4 / median(t[1], reps) / 1e9;
}

#endif /* TP_KERNELS_X86 */

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

/* AMX: x split into 3 bf16 parts (exact products), 2 parts, 1 (bf16-dot). */
enum { V_F32, V_BF16, V_BF16DOT, V_AMX3, V_AMX2, V_AMX1, V_AVX2_F32, V_BLAS_F32, V_BLAS_BF16, NVAR };
static const char *const var_names[NVAR] = {"avx512 f32", "avx512 bf16", "avx512 bf16-dot", "amx bf16 x3",
                                            "amx bf16 x2", "amx bf16-dot", "avx2 f32", "openblas f32",
                                            "openblas bf16"};

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

#if TP_KERNELS_X86
/* tp_machine_peaks_measure; plain_gbs, if not NULL, gets the plain loop's
 * bandwidth on 1 and on the pool's threads. */
static tp_status measure_peaks(tp_machine_peaks *out, tp_threadpool *pool, int quick, double *plain_gbs)
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
    fma_job fj = {FMA_ITERS, {0}};
    for (int r = 0; r < reps; r++) t[r] = time_run(NULL, fma512_worker, &fj);
    out->fma_gflops_1 = 2.0 * 16 * FMA_ITERS / 24 * 24 / median(t, reps) / 1e9;
    for (int r = 0; r < reps; r++) t[r] = time_run(pool, fma512_worker, &fj);
    out->fma_gflops_n = nt * 2.0 * 16 * FMA_ITERS / 24 * 24 / median(t, reps) / 1e9;
    out->lockstep_scaling = lockstep_scaling(pool, quick > 1 ? 2 : 24);

    /* read bandwidth over 1 GiB of huge pages (the L3 may hold 300 MiB) */
    int64_t n = quick > 1 ? (int64_t)1 << 22 : (int64_t)1 << 28;
    float *buf = tp_alloc((size_t)n * sizeof(float));
    if (!buf) return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory for 1 GiB");
    for (int64_t i = 0; i < n; i++) buf[i] = 1.0f;
    double plain[2], pf[2];
    read_bw(buf, n, NULL, reps, &plain[0], &pf[0]);
    read_bw(buf, n, pool, reps, &plain[1], &pf[1]);
    out->read_gbs_1 = plain[0] > pf[0] ? plain[0] : pf[0];
    out->read_gbs_n = plain[1] > pf[1] ? plain[1] : pf[1];
    if (plain_gbs) { plain_gbs[0] = plain[0]; plain_gbs[1] = plain[1]; }
    tp_free(buf);
    return TP_OK;
}
#else
static tp_status measure_peaks(tp_machine_peaks *out, tp_threadpool *pool, int quick, double *plain_gbs)
{
    (void)pool, (void)quick;
    memset(out, 0, sizeof *out);
    if (plain_gbs) plain_gbs[0] = plain_gbs[1] = 0;
    return tp_fail(TP_ERR_UNSUPPORTED, "tp_kernel_bench: needs AVX-512 (an x86-64 CPU)");
}
#endif

tp_status tp_machine_peaks_measure(tp_machine_peaks *out, tp_threadpool *pool, int quick)
{
    return measure_peaks(out, pool, quick, NULL);
}

/* GEMV at the qwen3-0.6b decode shapes (T = 1, bf16) with cold weights: a
 * decode step reads ~1.2 GB of weights, so no matrix is still cached when it
 * comes round again.  Copies of W, 512 MiB in all (more than the L3), are
 * used in turn.  GB/s of weights on 1 thread and on the pool's, and the share
 * of the read bandwidth measured on as many threads. */
static tp_status gemv_cold(FILE *out, tp_threadpool *pool, const tp_machine_peaks *pk, int quick, const float *x,
                           float *y)
{
    static const shape dshapes[] = {{"q_proj", 1, 2048, 1024},  {"k/v_proj", 1, 1024, 1024},
                                    {"o_proj", 1, 1024, 2048},  {"gate/up", 1, 3072, 1024},
                                    {"down", 1, 1024, 3072},    {"lm_head", 1, 151936, 1024},
                                    {"lm_head/2", 1, 75968, 1024}};
    int reps = quick ? 3 : 5;
    size_t total = quick > 1 ? (size_t)16 << 20 : (size_t)512 << 20;
    fprintf(out, "\nGEMV, bf16 weights cold (copies cycled through %zu MiB), T=1, GB/s of weights and share of "
            "the read bandwidth:\n%-14s %12s %8s %10s %-2d %8s\n", total >> 20, "shape", "1 thread", "share",
            "threads:", tp_threadpool_size(pool), "share");
    tp_matmul_opts o;
    tp_matmul_opts_default(&o);
    o.path = TP_KERNEL_AVX512;
    o.bf16_dot = 0;
    for (size_t s = 0; s < sizeof dshapes / sizeof *dshapes; s++) {
        const shape *sh = &dshapes[s];
        size_t bytes = (size_t)(sh->n * sh->k) * 2;
        int m = (int)((total + bytes - 1) / bytes);
        if (m < 2) m = 2;
        tp_tensor *w = calloc((size_t)m, sizeof *w);
        if (!w) return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory");
        int64_t shp[2] = {sh->n, sh->k};
        tp_status st = TP_OK;
        for (int c = 0; c < m && !st; c++) {
            st = tp_tensor_init(&w[c], TP_BF16, 2, shp);
            if (!st) {   /* any bit pattern of finite weights will do */
                uint16_t *d = w[c].data;
                for (int64_t i = 0; i < sh->n * sh->k; i++) d[i] = (uint16_t)(0x3c00u + ((uint64_t)i * 2654435761u >> 20) % 512);
            }
        }
        double gbs[2];
        for (int th = 0; th < 2 && !st; th++) {
            tp_threadpool *p = th ? pool : NULL;
            double t[REPS_MAX];
            for (int c = 0; c < m && !st; c++) st = tp_matmul_ex(y, x, 1, &w[c], NULL, p, &o);   /* warm up */
            for (int r = 0; r < reps && !st; r++) {
                double t0 = tp_now();
                for (int c = 0; c < m && !st; c++) st = tp_matmul_ex(y, x, 1, &w[c], NULL, p, &o);
                t[r] = (tp_now() - t0) / m;
            }
            gbs[th] = (double)bytes / median(t, reps) / 1e9;
        }
        if (!st)
            fprintf(out, "%-14s %12.1f %7.0f%% %12.1f %7.0f%%\n", sh->name, gbs[0], 100 * gbs[0] / pk->read_gbs_1,
                    gbs[1], 100 * gbs[1] / pk->read_gbs_n);
        for (int c = 0; c < m; c++) tp_tensor_release(&w[c]);
        free(w);
        if (st) return st;
        fflush(out);
    }
    return TP_OK;
}

tp_status tp_kernel_bench(FILE *out, tp_threadpool *pool, int quick)
{
    int nt = tp_threadpool_size(pool), reps = quick ? 3 : 7;
    tp_machine_peaks pk;
    double plain[2];
    tp_status st0 = measure_peaks(&pk, pool, quick, plain);
    if (st0) return st0;
    fprintf(out, "FMA peak (AVX-512, registers only): %.1f GFLOP/s on 1 thread, %.1f on %d\n", pk.fma_gflops_1,
            pk.fma_gflops_n, nt);
    fprintf(out, "read bandwidth (1 GiB, 2 MiB pages): %.1f GB/s on 1 thread, %.1f on %d "
            "(without software prefetch: %.1f, %.1f)\n", pk.read_gbs_1, pk.read_gbs_n, nt, plain[0], plain[1]);

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
            tp_matmul_opts o = {TP_KERNEL_AVX512, 0, 0, 0};
            const tp_tensor *W = &wf;
            if (v == V_BF16 || v == V_BF16DOT || v == V_BLAS_BF16 || (v >= V_AMX3 && v <= V_AMX1)) W = &wb;
            if (v == V_BF16DOT) { if (!tp_kernel_has_bf16_dot()) { fprintf(out, " %16s", "-"); continue; } o.bf16_dot = 1; }
            if (v >= V_AMX3 && v <= V_AMX1) {
                if (!tp_kernel_has_amx()) { fprintf(out, " %16s", "-"); continue; }
                o.amx = v == V_AMX2 ? 2 : 1;
                o.bf16_dot = v == V_AMX1;
            }
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
            tp_matmul_opts o = {TP_KERNEL_AVX512, v == 2, 0, 0};
            const tp_tensor *W = v ? &wb : &wf;
            double sec = time_matmul(y, x, sh->T, W, pool, &o, reps);
            fprintf(out, " %*.1f", v == 2 ? 16 : 12, (double)tp_tensor_nbytes(W) / sec / 1e9);
        }
        fprintf(out, "\n");
        tp_tensor_release(&wf);
        tp_tensor_release(&wb);
    }
    if (!st) st = gemv_cold(out, pool, &pk, quick, x, y);
    free(x);
    tp_free(y);
    return st;
}
