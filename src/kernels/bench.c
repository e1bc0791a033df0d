/* tp_kernel_bench: the numbers that say how close the kernels come to the
 * machine.  Every figure is the median of several repetitions. */
#include "kernels/kern_internal.h"
#include "kernels/vmath.h"
#include "tensorpar/settings.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- compute peak: independent chains of vector FMAs in registers ------
 * One worker per path, each on its own instructions: 24 chains of 16-lane
 * FMAs (AVX-512: 32 registers), 12 of 8-lane FMAs (AVX2: 16 registers),
 * and for the scalar path 12 chains of 4-lane multiply-then-add in the
 * x86-64 baseline (SSE2 has no FMA; GCC vector types, so no intrinsics).
 * Every worker runs `iters` vector steps, 2 × lanes FLOP each. */

#define FMA_ITERS 240000000L   /* ~50 ms per run at peak */

typedef struct { long iters; float sink[64]; } fma_job;
typedef float v4f __attribute__((vector_size(16)));

#if TP_KERNELS_X86   /* the AVX-512 and AVX2 workers are x86-64 code */
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

TP_TAVX2 static void fma256_worker(void *p, int ti, int nt)
{
    (void)nt;
    fma_job *j = p;
    __m256 a[12], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < j->iters / 12; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 12; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    float t[8];
    _mm256_storeu_ps(t, a[0]);
    j->sink[ti % 64] = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

static void mul_add128_worker(void *p, int ti, int nt)
{
    (void)nt;
    fma_job *j = p;
    v4f a[12], m = {0.999999f, 0.999999f, 0.999999f, 0.999999f}, c = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
    for (int i = 0; i < 12; i++) a[i] = (v4f){(float)i, (float)i, (float)i, (float)i};
    for (long it = 0; it < j->iters / 12; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = a[i] * m + c;
    for (int i = 1; i < 12; i++) a[0] += a[i];
    j->sink[ti % 64] = a[0][0] + a[0][1] + a[0][2] + a[0][3];
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
static double lockstep_scaling(tp_threadpool *pool, int chunks, tp_parallel_fn fma, long iters)
{
    fma_job j = {iters / 2, {0}};
    double one = 0, all = 0;
    for (int c = 0; c < chunks; c++) {
        one += time_run(NULL, fma, &j);
        all += time_run(pool, fma, &j);
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

#if TP_KERNELS_X86
/* Each worker reads its share in 512-byte units (tp_split_range over n/128
 * floats), 8 vectors at a time, and prefetches only inside its share. */
TP_T512 static void bw512_worker(void *p, int ti, int nt)
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

TP_TAVX2 static void bw256_worker(void *p, int ti, int nt)
{
    bw_job *j = p;
    int64_t b, e;
    tp_split_range(j->n / 128, ti, nt, &b, &e);
    __m256 s[8];
    for (int u = 0; u < 8; u++) s[u] = _mm256_setzero_ps();
    const char *q = (const char *)j->buf;
    int64_t end = e * 512, pf_last = end - 64;
    if (j->prefetch) {
        for (int64_t i = b * 512; i < end; i += 256)
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) {
                int64_t f = i + BW_PF_BYTES + 32 * u;
                if (u % 2 == 0) _mm_prefetch(q + (f < pf_last ? f : pf_last), _MM_HINT_T0);   /* one per line */
                s[u] = _mm256_add_ps(s[u], _mm256_load_ps((const float *)(q + i + 32 * u)));
            }
    } else {
        for (int64_t i = b * 512; i < end; i += 256)
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) s[u] = _mm256_add_ps(s[u], _mm256_load_ps((const float *)(q + i + 32 * u)));
    }
    for (int u = 1; u < 8; u++) s[0] = _mm256_add_ps(s[0], s[u]);
    float t[8];
    _mm256_storeu_ps(t, s[0]);
    j->sink[ti % 64] = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

/* Pages touched before any timing, each by the thread that reads it in the
 * all-threads run (as STREAM does: on a NUMA host the pages then lie on
 * the reader's node), so no run pays for page faults. */
static void touch_worker(void *p, int ti, int nt)
{
    bw_job *j = p;
    int64_t b, e;
    tp_split_range(j->n / 128, ti, nt, &b, &e);
    float *q = (float *)j->buf;
    for (int64_t i = b * 128; i < e * 128; i++) q[i] = 1.0f;
}

/* The baseline: 16-byte vectors through memcpy (no aliasing questions;
 * compiled to plain SSE2 loads). */
static void bw128_worker(void *p, int ti, int nt)
{
    bw_job *j = p;
    int64_t b, e;
    tp_split_range(j->n / 128, ti, nt, &b, &e);
    v4f s[8] = {{0}};
    const char *q = (const char *)j->buf;
    int64_t end = e * 512, pf_last = end - 64;
    for (int64_t i = b * 512; i < end; i += 128)
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            int64_t f = i + BW_PF_BYTES + 16 * u;
            if (j->prefetch && u % 4 == 0) __builtin_prefetch(q + (f < pf_last ? f : pf_last));
            v4f v;
            memcpy(&v, q + i + 16 * u, sizeof v);
            s[u] += v;
        }
    for (int u = 1; u < 8; u++) s[0] += s[u];
    j->sink[ti % 64] = s[0][0] + s[0][1] + s[0][2] + s[0][3];
}

/* The peak workers of the process's kernel path, and what to call them. */
typedef struct {
    tp_parallel_fn fma, bw;
    int lanes;          /* floats per vector: 2 × lanes FLOP per fma step */
    const char *what;
} peak_kernels;

static peak_kernels peak_kernels_for(tp_kernel_path p)
{
#if TP_KERNELS_X86
    if (p == TP_KERNEL_AVX512) return (peak_kernels){fma512_worker, bw512_worker, 16, "avx512: 16-lane FMA"};
    if (p == TP_KERNEL_AVX2) return (peak_kernels){fma256_worker, bw256_worker, 8, "avx2: 8-lane FMA"};
    return (peak_kernels){mul_add128_worker, bw128_worker, 4, "scalar: baseline SSE2 4-lane mul + add"};
#else
    (void)p;
    return (peak_kernels){mul_add128_worker, bw128_worker, 4, "scalar: 4-lane mul + add"};
#endif
}

/* GB/s of the plain and the prefetching loop, median of reps each; the runs
 * alternate so that a busy neighbour slows both alike. */
static void read_bw(const float *buf, int64_t n, tp_threadpool *pool, int reps, tp_parallel_fn bw, double *plain,
                    double *pf)
{
    double t[2][REPS_MAX];
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 2; v++) {
            bw_job bj = {buf, n, v, {0}};
            t[v][r] = time_run(pool, bw, &bj);
        }
    *plain = (double)n * 4 / median(t[0], reps) / 1e9;
    *pf = (double)n * 4 / median(t[1], reps) / 1e9;
}

/* ---- matmul ------------------------------------------------------------ */

typedef struct {
    const char *name;
    int64_t T, n, k;
} shape;

/* The shapes of one model's Linears, W [n x k] (tp_bench_dims): q_proj,
 * k/v_proj, o_proj, gate/up, down, lm_head, lm_head split over 2 ranks,
 * each with T rows of x. */
enum { S_Q, S_KV, S_O, S_GATE, S_DOWN, S_HEAD, S_HEAD2, NSHAPES };

static shape model_shape(const tp_bench_dims *d, int s, int64_t T)
{
    switch (s) {
    case S_Q: return (shape){"q_proj", T, d->q_width, d->hidden};
    case S_KV: return (shape){"k/v_proj", T, d->kv_width, d->hidden};
    case S_O: return (shape){"o_proj", T, d->hidden, d->q_width};
    case S_GATE: return (shape){"gate/up", T, d->intermediate, d->hidden};
    case S_DOWN: return (shape){"down", T, d->hidden, d->intermediate};
    case S_HEAD: return (shape){"lm_head", T, d->vocab, d->hidden};
    default: return (shape){"lm_head/2", T, (d->vocab + 1) / 2, d->hidden};
    }
}

/* The widest k and n of the model's Linears. */
static int64_t max_k(const tp_bench_dims *d)
{
    int64_t k = d->hidden > d->q_width ? d->hidden : d->q_width;
    return k > d->intermediate ? k : d->intermediate;
}

const tp_bench_dims tp_bench_dims_qwen3_06b = {"qwen3-0.6b", 1024, 2048, 1024, 3072, 151936};

static tp_status make_weight(tp_tensor *w, tp_dtype dt, int64_t n, int64_t k, tp_rng *rng)
{
    int64_t s[2] = {n, k};
    tp_status st = tp_tensor_init(w, dt, 2, s);
    if (st) return st;
    if (dt == TP_Q8_0) {   /* quantized a row at a time, as a load does per shard */
        float *row = malloc((size_t)k * sizeof(float));
        if (!row) { tp_tensor_release(w); return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory"); }
        for (int64_t r = 0; r < n && !st; r++) {
            for (int64_t i = 0; i < k; i++) row[i] = (float)(0.02 * tp_rng_normal(rng));
            st = tp_q8_quantize_rows((tp_q8_block *)w->data + r * (k / TP_Q8_BLOCK), row, TP_F32, 1, k);
        }
        free(row);
        if (st) tp_tensor_release(w);
        return st;
    }
    for (int64_t i = 0; i < n * k; i++) {
        float v = (float)(0.02 * tp_rng_normal(rng));
        if (dt == TP_F32) ((float *)w->data)[i] = v;
        else ((uint16_t *)w->data)[i] = tp_bf16_from_f32(v);
    }
    return TP_OK;
}

/* The GEMM table's columns: the process's path on f32 and bf16 weights,
 * then what else it may run (bf16-dot, AMX with x split into 3 bf16 parts
 * for exact products, 2, or 1 = bf16-dot; AVX2 next to AVX-512; OpenBLAS,
 * which the scalar path never calls).  "-" where the path rules one out. */
enum { V_F32, V_BF16, V_BF16DOT, V_AMX3, V_AMX2, V_AMX1, V_AVX2_F32, V_BLAS_F32, V_BLAS_BF16, V_Q8, NVAR };
static const char *const var_names[NVAR] = {"f32", "bf16", "avx512 bf16-dot", "amx bf16 x3", "amx bf16 x2",
                                            "amx bf16-dot", "avx2 f32", "openblas f32", "openblas bf16", "q8_0"};

/* Options for variant v on path `path`; 0 if the process may not run it. */
static int variant_opts(int v, tp_kernel_path path, tp_matmul_opts *o)
{
    *o = (tp_matmul_opts){path, 0, 0, 0};
    switch (v) {
    case V_BF16DOT: o->bf16_dot = 1; return tp_kernel_has_bf16_dot();
    case V_AMX3: case V_AMX2: case V_AMX1:
        o->amx = v == V_AMX2 ? 2 : 1;
        o->bf16_dot = v == V_AMX1;
        return tp_kernel_has_amx();
    case V_AVX2_F32: o->path = TP_KERNEL_AVX2; return path == TP_KERNEL_AVX512;
    case V_BLAS_F32: case V_BLAS_BF16: o->blas = 1; return path != TP_KERNEL_SCALAR;
    default: return 1;
    }
}

/* *sec: the median time of reps calls after one to warm up. */
static tp_status time_matmul(float *y, const float *x, int64_t T, const tp_tensor *W, tp_threadpool *pool,
                             const tp_matmul_opts *o, int reps, double *sec)
{
    double t[REPS_MAX];
    tp_status st = tp_matmul_ex(y, x, T, W, NULL, pool, o);   /* warm up */
    for (int r = 0; r < reps && !st; r++) {
        double t0 = tp_now();
        st = tp_matmul_ex(y, x, T, W, NULL, pool, o);
        t[r] = tp_now() - t0;
    }
    if (!st) *sec = median(t, reps);
    return st;
}

/* tp_machine_peaks_measure; plain_gbs, if not NULL, gets the plain loop's
 * bandwidth on 1 and on the pool's threads. */
static tp_status measure_peaks(tp_machine_peaks *out, tp_threadpool *pool, int quick, double *plain_gbs)
{
    memset(out, 0, sizeof *out);
    /* quick = 2 is a smoke run (tests, sanitizers): one repetition over a
     * buffer small enough to be cached; the figures then mean nothing. */
    int nt = tp_threadpool_size(pool), reps = quick > 1 ? 1 : quick ? 3 : 7;
    out->threads = nt;
    tp_status st = tp_isa_check();
    if (st) return st;
    out->path = tp_kernel_path_default();
    peak_kernels k = peak_kernels_for(out->path);
    double t[REPS_MAX];

    /* compute peak */
    /* The smoke run's builds (-O0 under sanitizers) take seconds per
     * million steps: a thousandth of the work there. */
    long iters = quick > 1 ? FMA_ITERS / 1000 : FMA_ITERS;
    fma_job fj = {iters, {0}};
    double flop = 2.0 * k.lanes * (double)iters;
    for (int r = 0; r < reps; r++) t[r] = time_run(NULL, k.fma, &fj);
    out->fma_gflops_1 = flop / median(t, reps) / 1e9;
    for (int r = 0; r < reps; r++) t[r] = time_run(pool, k.fma, &fj);
    out->fma_gflops_n = nt * flop / median(t, reps) / 1e9;
    out->lockstep_scaling = lockstep_scaling(pool, quick > 1 ? 2 : 24, k.fma, iters);

    /* read bandwidth over 1 GiB of huge pages (the L3 may hold 300 MiB) */
    int64_t n = quick > 1 ? (int64_t)1 << 22 : (int64_t)1 << 28;
    float *buf = tp_alloc((size_t)n * sizeof(float));
    if (!buf) return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory for 1 GiB");
    bw_job tj = {buf, n, 0, {0}};
    tp_parallel_run(pool, touch_worker, &tj);
    out->read_huge_share = (double)tp_huge_page_bytes(buf, (size_t)n * sizeof(float)) / ((double)n * sizeof(float));
    double plain[2], pf[2];
    read_bw(buf, n, NULL, reps, k.bw, &plain[0], &pf[0]);
    read_bw(buf, n, pool, reps, k.bw, &plain[1], &pf[1]);
    out->read_gbs_1 = plain[0] > pf[0] ? plain[0] : pf[0];
    out->read_gbs_n = plain[1] > pf[1] ? plain[1] : pf[1];
    if (plain_gbs) { plain_gbs[0] = plain[0]; plain_gbs[1] = plain[1]; }
    tp_free(buf);
    return TP_OK;
}

tp_status tp_machine_peaks_measure(tp_machine_peaks *out, tp_threadpool *pool, int quick)
{
    return measure_peaks(out, pool, quick, NULL);
}

/* GEMV at the model's decode shapes (T = 1, bf16) with cold weights: a
 * decode step reads 1.2 GB (qwen3-0.6b) or more, so no matrix is still cached when it
 * comes round again.  Copies of W, 512 MiB in all (more than the L3), are
 * used in turn.  GB/s of weights on 1 thread and on the pool's, and the share
 * of the read bandwidth measured on as many threads. */
static tp_status gemv_cold(FILE *out, tp_threadpool *pool, const tp_machine_peaks *pk, int quick, const float *x,
                           float *y, const tp_bench_dims *d)
{
    int reps = quick > 1 ? 1 : quick ? 3 : 5;
    size_t total = quick > 1 ? (size_t)16 << 20 : (size_t)512 << 20;
    fprintf(out, "\nGEMV, bf16 weights cold (copies cycled through %zu MiB), T=1, GB/s of weights and share of "
            "the read bandwidth:\n%-14s %12s %8s %10s %-2d %8s\n", total >> 20, "shape", "1 thread", "share",
            "threads:", tp_threadpool_size(pool), "share");
    tp_matmul_opts o;
    tp_matmul_opts_default(&o);   /* the process's path */
    o.bf16_dot = 0;
    for (int s = 0; s < NSHAPES; s++) {
        shape cur = model_shape(d, s, 1);
        const shape *sh = &cur;
        if (quick > 1 && sh->n > 50000) continue;
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

/* ---- training GEMMs: the own packed GEMM next to OpenBLAS ---------------
 * The three products of a Linear in training at T = 512, f32: the forward
 * y = x·Wᵀ, dx += dy·W and dW += dyᵀ·x, through tp_matmul_ex and
 * tp_matmul_backward_ex with and without opts.blas, OpenBLAS limited to the
 * same number of threads.  The two run alternately (a busy neighbour slows
 * both alike); GFLOP/s of the median, and the share of the FMA peak
 * measured on as many threads. */

enum { P_FWD, P_DX, P_DW, NPROD };
static const char *const prod_names[NPROD] = {"y=x*W^T", "dx+=dy*W", "dW+=dy^T*x"};

typedef struct {
    float *x, *dy, *y, *dx, *dw;
    const tp_tensor *W;
    int64_t T;
} train_bufs;

static tp_status run_product(const train_bufs *b, int prod, tp_threadpool *pool, const tp_matmul_opts *o)
{
    if (prod == P_FWD) return tp_matmul_ex(b->y, b->x, b->T, b->W, NULL, pool, o);
    if (prod == P_DX) return tp_matmul_backward_ex(b->dx, NULL, NULL, b->dy, b->x, b->T, b->W, pool, o);
    return tp_matmul_backward_ex(NULL, b->dw, NULL, b->dy, b->x, b->T, b->W, pool, o);
}

/* On one thread both sides run on the calling thread (OpenBLAS limited to
 * one, the own GEMM without a pool), so its CPU time, which other jobs on a
 * shared machine do not inflate, measures them; on more, wall time. */
static double clock_s(int cpu)
{
    if (!cpu) return tp_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The FMA peak of one thread in its CPU time (as clock_s(1)). */
static double fma_peak_cpu(tp_kernel_path path, int quick)
{
    peak_kernels k = peak_kernels_for(path);
    long iters = quick > 1 ? FMA_ITERS / 1000 : FMA_ITERS / 4;
    fma_job fj = {iters, {0}};
    double t[REPS_MAX];
    int reps = quick > 1 ? 1 : 5;
    for (int r = 0; r < reps; r++) {
        double t0 = clock_s(1);
        k.fma(&fj, 0, 1);
        t[r] = clock_s(1) - t0;
    }
    return 2.0 * k.lanes * (double)iters / median(t, reps) / 1e9;
}

/* sec[0] ours, sec[1] OpenBLAS: medians of reps alternated runs. */
static tp_status time_product(const train_bufs *b, int prod, tp_threadpool *pool, tp_kernel_path path, int reps,
                              double sec[2])
{
    double t[2][REPS_MAX];
    tp_status st = TP_OK;
    openblas_set_num_threads(tp_threadpool_size(pool));
    for (int r = -1; r < reps && !st; r++)   /* r = -1 warms up */
        for (int v = 0; v < 2 && !st; v++) {
            tp_matmul_opts o = {path, 0, v, 0};
            /* OpenBLAS's threads spin for a while after a call (2^28 cycles
             * by default) before they sleep: on more than one thread, let
             * them, or they take the cores from the own GEMM's pool; then
             * an untimed call, so that the cores are back at speed. */
            if (v == 0 && pool) {
                nanosleep(&(struct timespec){0, 200000000}, NULL);
                st = run_product(b, prod, pool, &o);
            }
            double t0 = clock_s(pool == NULL);
            st = run_product(b, prod, pool, &o);
            if (r >= 0) t[v][r] = clock_s(pool == NULL) - t0;
        }
    if (!st) sec[0] = median(t[0], reps), sec[1] = median(t[1], reps);
    return st;
}

static tp_status train_gemm_shape(FILE *out, const train_bufs *b, const char *name, tp_threadpool *pool,
                                  const tp_machine_peaks *pk, double peak_cpu1, tp_kernel_path path, int reps)
{
    int64_t n = b->W->shape[0], k = b->W->shape[1];
    double flop = 2.0 * (double)b->T * (double)n * (double)k;
    for (int prod = 0; prod < NPROD; prod++) {
        char label[64];
        snprintf(label, sizeof label, "%s %lldx%lld", name, (long long)n, (long long)k);
        fprintf(out, "%-24s %-11s", label, prod_names[prod]);
        for (int th = 0; th < 2; th++) {
            double sec[2], peak = th ? pk->fma_gflops_n : peak_cpu1;
            tp_status st = time_product(b, prod, th ? pool : NULL, path, reps, sec);
            if (st) return st;
            double g0 = flop / sec[0] / 1e9, g1 = flop / sec[1] / 1e9;
            fprintf(out, "   %7.1f %3.0f%% %7.1f %3.0f%%", g0, 100 * g0 / peak, g1, 100 * g1 / peak);
        }
        fprintf(out, "\n");
        fflush(out);
    }
    return TP_OK;
}

static tp_status train_gemms(FILE *out, tp_threadpool *pool, const tp_machine_peaks *pk, int quick,
                             const tp_bench_dims *d)
{
    static const int lshapes[] = {S_Q, S_O, S_GATE, S_DOWN, S_HEAD};
    if (pk->path == TP_KERNEL_SCALAR) return TP_OK;   /* the scalar loops are the reference, not a rival */
    int64_t T = quick > 1 ? 16 : 512, maxn = d->vocab, maxk = max_k(d);
    int reps = quick > 1 ? 1 : quick ? 3 : 5, nt = tp_threadpool_size(pool), saved = openblas_get_num_threads();
    double peak_cpu1 = fma_peak_cpu(pk->path, quick);
    fprintf(out, "\nTraining GEMMs, f32, T=%lld: GFLOP/s and share of the FMA peak, own packed GEMM next to OpenBLAS "
            "(OPENBLAS_CORETYPE=%s, as many threads), alternated, median of %d; 1 thread in its CPU time (FMA peak "
            "%.1f GFLOP/s so), %d in wall time (peak %.1f):\n%-24s %-11s   %-25s   %d threads\n",
            (long long)T, getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(auto)", reps, peak_cpu1, nt,
            pk->fma_gflops_n, "W [n x k]", "product", "1 thread: own, openblas", nt);
    train_bufs b = {malloc((size_t)(T * maxk) * sizeof(float)), malloc((size_t)(T * maxn) * sizeof(float)),
                    tp_alloc((size_t)(T * maxn) * sizeof(float)), malloc((size_t)(T * maxk) * sizeof(float)),
                    NULL, NULL, T};
    tp_status st = TP_OK;
    tp_rng rng;
    tp_rng_seed(&rng, 11);
    if (!b.x || !b.dy || !b.y || !b.dx) st = tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory");
    for (int64_t i = 0; !st && i < T * maxk; i++) b.x[i] = (float)tp_rng_normal(&rng), b.dx[i] = 0;
    for (int64_t i = 0; !st && i < T * maxn; i++) b.dy[i] = (float)(0.01 * tp_rng_normal(&rng));
    for (size_t s = 0; s < sizeof lshapes / sizeof *lshapes && !st; s++) {
        shape cur = model_shape(d, lshapes[s], T);
        const shape *sh = &cur;
        if (quick > 1 && sh->n > 100000) continue;
        tp_tensor w = {0};
        if ((st = make_weight(&w, TP_F32, sh->n, sh->k, &rng))) break;
        b.W = &w;
        b.dw = tp_alloc((size_t)(sh->n * sh->k) * sizeof(float));
        if (!b.dw) st = tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory");
        else memset(b.dw, 0, (size_t)(sh->n * sh->k) * sizeof(float));
        if (!st) st = train_gemm_shape(out, &b, sh->name, pool, pk, peak_cpu1, pk->path, sh->n > 100000 && reps > 3 ? 3 : reps);
        tp_free(b.dw);
        tp_tensor_release(&w);
    }
    openblas_set_num_threads(saved);
    free(b.x); free(b.dy); tp_free(b.y); free(b.dx);
    return st;
}

tp_status tp_kernel_bench(FILE *out, tp_threadpool *pool, int quick)
{
    return tp_kernel_bench_dims(out, pool, quick, &tp_bench_dims_qwen3_06b);
}

tp_status tp_kernel_bench_dims(FILE *out, tp_threadpool *pool, int quick, const tp_bench_dims *d)
{
    int nt = tp_threadpool_size(pool), reps = quick > 1 ? 1 : quick ? 3 : 7;
    tp_machine_peaks pk;
    double plain[2];
    tp_status st0 = measure_peaks(&pk, pool, quick, plain);
    if (st0) return st0;
    tp_kernel_path path = pk.path;
    fprintf(out, "kernel path: %s (TENSORPAR_ISA=%s)\n", tp_isa_name(tp_isa_selected()),
            tp_setting_is_set(TP_SET_ISA) ? tp_setting_string(TP_SET_ISA) : "unset: the CPU's best");
    fprintf(out, "compute peak (%s, registers only): %.1f GFLOP/s on 1 thread, %.1f on %d\n",
            peak_kernels_for(path).what, pk.fma_gflops_1, pk.fma_gflops_n, nt);
    fprintf(out, "read bandwidth (1 GiB, %.0f %% of it in 2 MiB pages): %.1f GB/s on 1 thread, %.1f on %d "
            "(without software prefetch: %.1f, %.1f)\n", 100 * pk.read_huge_share, pk.read_gbs_1, pk.read_gbs_n, nt,
            plain[0], plain[1]);

    /* GEMM at the model's prefill shapes (lm_head at T = 64: its rate is
     * that of the other shapes, and 512 rows of it take long) */
    fprintf(out, "shapes: %s (hidden %lld, q %lld, k/v %lld, intermediate %lld, vocabulary %lld)\n", d->name,
            (long long)d->hidden, (long long)d->q_width, (long long)d->kv_width, (long long)d->intermediate,
            (long long)d->vocab);
    shape shapes[S_HEAD + 1];
    for (int s = 0; s <= S_HEAD; s++) shapes[s] = model_shape(d, s, s == S_HEAD ? 64 : 512);
    shapes[S_HEAD].name = "lm_head T=64";
    int64_t mk = max_k(d);
    /* The scalar loops' rate does not depend on T (no blocking), and at
     * ~1 GFLOP/s the full shapes would take minutes: 16 rows there; the
     * smoke run (sanitizer builds) 8 rows. */
    int64_t t_cap = quick > 1 ? 8 : path == TP_KERNEL_SCALAR ? 16 : 512;
    tp_rng rng;
    tp_rng_seed(&rng, 7);
    float *x = malloc((size_t)(512 * mk) * sizeof(float));
    float *y = tp_alloc((size_t)(512 * d->vocab) * sizeof(float));
    if (!x || !y) { free(x); tp_free(y); return tp_fail(TP_ERR_NOMEM, "tp_kernel_bench: no memory"); }
    for (int64_t i = 0; i < 512 * mk; i++) x[i] = (float)tp_rng_normal(&rng);
    char rows[32] = "";
    if (t_cap < 512) snprintf(rows, sizeof rows, ", T = %lld rows", (long long)t_cap);
    fprintf(out, "\nGEMM GFLOP/s, %d thread(s)%s (OpenBLAS under OPENBLAS_CORETYPE=%s):\n%-14s", nt, rows,
            getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(auto)", "shape");
    for (int v = 0; v < NVAR; v++) {
        char name[32];
        int own = v <= V_BF16 || v == V_Q8;   /* the path's own kernels */
        snprintf(name, sizeof name, "%s%s%s", own ? tp_kernel_path_name(path) : "", own ? " " : "", var_names[v]);
        fprintf(out, " %16s", name);
    }
    /* The path's own f32 and bf16 GEMMs as shares of its FMA peak on as
     * many threads, measured above. */
    fprintf(out, " %9s %9s\n", "f32/peak", "bf16/peak");
    tp_status st = TP_OK;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes && !st; s++) {
        const shape *sh = &shapes[s];
        int64_t T = sh->T < t_cap ? sh->T : t_cap;
        if (quick > 1 && sh->n > 100000) continue;   /* the smoke run leaves out the lm_head shapes */
        tp_tensor wf = {0}, wb = {0}, wq = {0};
        if ((st = make_weight(&wf, TP_F32, sh->n, sh->k, &rng)) || (st = make_weight(&wb, TP_BF16, sh->n, sh->k, &rng)) ||
            (st = make_weight(&wq, TP_Q8_0, sh->n, sh->k, &rng))) {
            tp_tensor_release(&wf);
            tp_tensor_release(&wb);
            break;
        }
        fprintf(out, "%-14s", sh->name);
        double share[2] = {0, 0};
        int r = sh->n > 100000 || path == TP_KERNEL_SCALAR ? (reps < 3 ? reps : 3) : reps;
        for (int v = 0; v < NVAR && !st; v++) {
            tp_matmul_opts o;
            if (!variant_opts(v, path, &o)) { fprintf(out, " %16s", "-"); continue; }
            const tp_tensor *W = v == V_F32 || v == V_AVX2_F32 || v == V_BLAS_F32 ? &wf : v == V_Q8 ? &wq : &wb;
            double sec;
            st = time_matmul(y, x, T, W, pool, &o, r, &sec);
            /* Four decimals below 1 GFLOP/s, so a slow build (sanitizers,
             * an emulator) never prints a measured rate as 0.0. */
            double gflops = 2.0 * (double)T * (double)sh->n * (double)sh->k / sec / 1e9;
            if (!st) fprintf(out, " %16.*f", gflops < 1.0 ? 4 : 1, gflops);
            if (v <= V_BF16) share[v] = gflops / pk.fma_gflops_n;
            fflush(out);
        }
        if (!st) fprintf(out, " %8.0f%% %8.0f%%", 100 * share[V_F32], 100 * share[V_BF16]);
        fprintf(out, "\n");
        tp_tensor_release(&wf);
        tp_tensor_release(&wb);
        tp_tensor_release(&wq);
    }

    /* GEMV (decode): lm_head-sized weights (311 MB bf16, 622 MB f32) are far
     * bigger than any cache; the per-layer shapes may sit in the L3. */
    shape gshapes[4] = {model_shape(d, S_GATE, 1), model_shape(d, S_DOWN, 1), model_shape(d, S_HEAD, 1),
                        model_shape(d, S_HEAD, 4)};
    gshapes[0].name = "gate/up T=1", gshapes[1].name = "down T=1";
    gshapes[2].name = "lm_head T=1", gshapes[3].name = "lm_head T=4";
    fprintf(out, "\nGEMV GB/s of weights read, %d thread(s):\n%-14s %12s %12s %16s %12s\n", nt, "shape", "f32", "bf16",
            "bf16-dot", "q8_0");
    for (size_t s = 0; s < sizeof gshapes / sizeof *gshapes && !st; s++) {
        const shape *sh = &gshapes[s];
        if (quick > 1 && sh->n > 100000) continue;
        tp_tensor wf = {0}, wb = {0}, wq = {0};
        if ((st = make_weight(&wf, TP_F32, sh->n, sh->k, &rng)) || (st = make_weight(&wb, TP_BF16, sh->n, sh->k, &rng)) ||
            (st = make_weight(&wq, TP_Q8_0, sh->n, sh->k, &rng))) {
            tp_tensor_release(&wf);
            tp_tensor_release(&wb);
            break;
        }
        fprintf(out, "%-14s", sh->name);
        for (int v = 0; v < 4 && !st; v++) {   /* f32, bf16, bf16-dot, q8_0 */
            tp_matmul_opts o = {path, v == 2, 0, 0};
            const tp_tensor *W = v == 0 ? &wf : v == 3 ? &wq : &wb;
            double sec;
            if (v == 2 && !tp_kernel_has_bf16_dot()) { fprintf(out, " %16s", "-"); continue; }
            st = time_matmul(y, x, sh->T, W, pool, &o, reps, &sec);
            if (!st) fprintf(out, " %*.1f", v == 2 ? 16 : 12, (double)tp_tensor_nbytes(W) / sec / 1e9);
        }
        fprintf(out, "\n");
        tp_tensor_release(&wf);
        tp_tensor_release(&wb);
        tp_tensor_release(&wq);
    }
    if (!st) st = gemv_cold(out, pool, &pk, quick, x, y, d);
    if (!st) st = train_gemms(out, pool, &pk, quick, d);
    free(x);
    tp_free(y);
    return st;
}
