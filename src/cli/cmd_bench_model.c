/* tensorpar bench forward | decode | all: how fast the model runs, and how
 * close that comes to the machine's own limits.
 *
 * Every figure of TP = 1 and TP = N is measured side by side in one run:
 * the command re-launches itself once per configuration (as bench load
 * does), each rank measures the median of several repetitions and writes
 * one line to REPORT.<rank>, and the first process compares.  A fresh
 * process per configuration keeps one configuration's memory and page
 * cache state out of the next one's figures.  bench all measures in
 * rounds of every configuration once (see there), since the machine
 * drifts during a run. */
#include "tp_cli.h"
#include "tensorpar/kernels.h"
#include "tensorpar/models.h"
#include "tensorpar/module.h"
#include "bench_chart_gp.h"   /* generated from bench/chart.gp */

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_REPS 64
#define MAX_TP_POINTS 8

/* ---- as one rank ------------------------------------------------------ */

typedef enum { MODE_FORWARD, MODE_DECODE } bench_mode;

typedef struct {
    bench_mode mode;
    int64_t seq;          /* forward: tokens of the prefill; decode: the prompt */
    int64_t new_tokens;   /* decode only */
    int reps;
} work;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[MAX_REPS];
    memcpy(s, v, (size_t)n * sizeof *v);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* The weight bytes this rank reads per decoded token: the parameters of
 * every module of the table (the layers' Linears and norms, the routers,
 * the final norm, the local lm_head) but the embedding, which costs one row
 * per token (when tied, the lm_head counts the shared tensor once), and of
 * an experts module only the k experts of E the router picks: its local
 * tensors times k/E.  Under EP a rank holds E/P whole experts and gets on
 * average k/P of a token's picks; under TP it holds a slice of every expert
 * and reads that slice of the k picked.  Summed over the ranks, exactly k
 * experts' bytes. */
static double weight_bytes_per_token(const tp_model *m)
{
    double b = 0, routed = m->cfg.num_experts > 0 ? (double)m->cfg.num_experts_per_tok / (double)m->cfg.num_experts : 1;
    for (size_t i = 0; i < tp_model_module_count(m); i++) {
        const tp_module *mod = tp_model_module_at(m, i);
        if (mod->type == TP_MT_EMBEDDING) continue;
        uint64_t own = 0;
        for (int j = 0; j < mod->n_params; j++)
            if (mod->params[j].local.data) own += tp_tensor_nbytes(&mod->params[j].local);
        b += mod->type == TP_MT_EXPERTS ? (double)own * routed : (double)own;
    }
    return b;
}

/* One repetition: a prefill of w->seq tokens, or (decode) a prefill of the
 * prompt, untimed, then w->new_tokens steps of one token each, timed. */
static tp_status one_rep(tp_model *m, tp_kv_cache *kv, const int64_t *ids, int64_t new_tokens, const work *w,
                         float *logits, double *secs, double *comm)
{
    tp_kv_cache_reset(kv);
    tp_status s = TP_OK;
    if (w->mode == MODE_DECODE) s = tp_model_forward(m, kv, ids, w->seq, logits, 0);
    m->comm_seconds = 0;
    double t0 = tp_now();
    if (w->mode == MODE_FORWARD) s = tp_model_forward(m, kv, ids, w->seq, logits, 0);
    for (int64_t i = 0; i < new_tokens && !s; i++) s = tp_model_forward(m, kv, ids + w->seq + i, 1, logits, 0);
    *secs = tp_now() - t0;
    *comm = m->comm_seconds;
    return s;
}

static tp_status run_reps(tp_model *m, const cli_tp *tp, const work *w, double *secs, double *comm)
{
    int64_t total = w->seq + (w->mode == MODE_DECODE ? w->new_tokens : 0);
    tp_kv_cache kv;
    tp_status s = tp_kv_cache_init(&kv, m, total);
    if (s) return s;
    int64_t *ids = malloc((size_t)total * sizeof *ids);
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    if (!ids || !logits) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    /* The same ids on every rank (same seed): the ranks run one sequence. */
    tp_rng rng;
    tp_rng_seed(&rng, 1234);
    for (int64_t i = 0; !s && i < total; i++) ids[i] = (int64_t)(tp_rng_next(&rng) % (uint64_t)m->cfg.vocab_size);
    double t[MAX_REPS], c[MAX_REPS], ws, wc;
    /* One warm-up (first touch of the scratch buffers, the KV cache, the
     * caches); decode warms up on a few tokens only. */
    int64_t warm = w->mode == MODE_DECODE ? (w->new_tokens < 8 ? w->new_tokens : 8) : 0;
    if (!s) s = one_rep(m, &kv, ids, warm, w, logits, &ws, &wc);
    for (int r = 0; r < w->reps && !s; r++) {
        /* Start together, so that no rank's clock includes waiting for a
         * peer that is still finishing the previous repetition. */
        if (tp->world && (s = tp_comm_barrier(tp->world))) break;
        s = one_rep(m, &kv, ids, w->mode == MODE_DECODE ? w->new_tokens : 0, w, logits, &t[r], &c[r]);
    }
    if (!s) {
        *secs = median(t, w->reps);
        *comm = median(c, w->reps);
    }
    free(ids);
    free(logits);
    tp_kv_cache_release(&kv);
    return s;
}

static int measure_as_rank(const char *dir, const char *report, const work *w, const cli_option *o, int n,
                           int argc, char **argv, const char *cmd)
{
    cli_tp tp;
    int rc = 0;
    if (cli_tp_begin(cmd, argc, argv, o, n, NULL, &tp, &rc)) { cli_tp_end(&tp); return rc; }
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .mesh = tp.mesh, .tp_plan = tp.plan,
                           .expert_parallel = tp.ep && tp.size > 1};
    const char *dt = cli_value(o, n, "--dtype");
    tp_model *m = NULL;
    double secs = 0, comm = 0;
    if (cli_tp_threads(o, n, &tp, &mo) || (dt && tp_dtype_parse(dt, &mo.weight_dtype)) ||
        tp_model_load(&m, dir, &mo) || run_reps(m, &tp, w, &secs, &comm)) {
        tp_model_free(m);
        cli_tp_end(&tp);
        return cli_report(cmd);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", report, tp.rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.9f %.9f %.0f\n", secs, comm, weight_bytes_per_token(m));
        fclose(f);
    }
    tp_model_free(m);
    cli_tp_end(&tp);
    return f ? 0 : 1;
}

/* ---- the first process: launching configurations ---------------------- */

typedef struct {
    int tp, threads;
    const char *dtype;     /* NULL: as stored */
} config;

typedef struct {
    double seconds;        /* the slowest rank's median */
    double comm_share;     /* mean over ranks of comm seconds / seconds */
    double weight_bytes;   /* per token, summed over ranks */
} figures;

typedef struct {
    const char *dir, *plan, *report;
    int64_t seq, new_tokens;
    int reps;
    int ep;                /* --ep: the TP = N side splits the experts (EP plan) */
    const char *matmul;    /* --matmul, passed to the ranks; NULL: TENSORPAR_BF16_DOT decides */
} job;

/* What the ranks multiply with: --matmul, else the environment's default. */
static const char *matmul_label(const job *j)
{
    tp_kernel_options k;
    if (j->matmul) return j->matmul;
    return tp_kernel_options_from_env(&k) == TP_OK && k.bf16_dot == TP_ON ? "bf16" : "exact";
}

static int measure(const job *j, bench_mode mode, const config *c, figures *out)
{
    char nbuf[16], tbuf[16], sbuf[32], kbuf[32], rbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", c->tp);
    snprintf(tbuf, sizeof tbuf, "%d", c->threads);
    snprintf(sbuf, sizeof sbuf, "%lld", (long long)j->seq);
    snprintf(kbuf, sizeof kbuf, "%lld", (long long)j->new_tokens);
    snprintf(rbuf, sizeof rbuf, "%d", j->reps);
    char *argv[28];
    int k = 0;
    argv[k++] = "tensorpar";
    argv[k++] = "bench";
    argv[k++] = mode == MODE_FORWARD ? "forward" : "decode";
    argv[k++] = "--model"; argv[k++] = (char *)j->dir;
    argv[k++] = "--report"; argv[k++] = (char *)j->report;
    argv[k++] = "--tp"; argv[k++] = nbuf;
    argv[k++] = "--threads"; argv[k++] = tbuf;
    argv[k++] = "--reps"; argv[k++] = rbuf;
    if (mode == MODE_FORWARD) { argv[k++] = "--seq"; argv[k++] = sbuf; }
    else { argv[k++] = "--prompt"; argv[k++] = sbuf; argv[k++] = "--new-tokens"; argv[k++] = kbuf; }
    if (c->dtype) { argv[k++] = "--dtype"; argv[k++] = (char *)c->dtype; }
    if (j->plan) { argv[k++] = "--tp-plan"; argv[k++] = (char *)j->plan; }
    if (j->ep) argv[k++] = "--ep";
    if (j->matmul) { argv[k++] = "--matmul"; argv[k++] = (char *)j->matmul; }
    argv[k] = NULL;
    int rc = 0;
    if (tp_launch_self(c->tp, TP_BACKEND_AUTO, argv, &rc)) return -1;
    if (rc) { tp_fail(TP_ERR_INTERNAL, "TP=%d x %d threads: a rank exited with %d", c->tp, c->threads, rc); return -1; }
    memset(out, 0, sizeof *out);
    for (int r = 0; r < c->tp; r++) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", j->report, r);
        FILE *f = fopen(path, "r");
        double secs = 0, comm = 0, bytes = 0;
        int ok = f && fscanf(f, "%lf %lf %lf", &secs, &comm, &bytes) == 3;
        if (f) fclose(f);
        remove(path);
        if (!ok) { tp_fail(TP_ERR_IO, "rank %d left no report", r); return -1; }
        if (secs > out->seconds) out->seconds = secs;
        out->comm_share += (secs > 0 ? comm / secs : 0) / c->tp;
        out->weight_bytes += bytes;
    }
    return 0;
}

/* The weights of multi-head latent attention's Linears (deepseek_v2/v3). */
static double mla_weights(const tp_model_config *c)
{
    double H = (double)c->hidden_size, nq = (double)c->num_attention_heads, R = (double)c->kv_lora_rank;
    double rope = (double)c->qk_rope_head_dim, nope = (double)c->qk_nope_head_dim, v = (double)c->v_head_dim;
    double ql = (double)c->q_lora_rank, q = ql > 0 ? H * ql + ql * nq * (nope + rope) : H * nq * (nope + rope);
    return q + H * (R + rope) + R * nq * (nope + v) + nq * v * H;
}

/* The weights one token multiplies in layer l's MLP: a dense MLP's three
 * matrices (Llama 4's intermediate_size_mlp wide), or a sparse block's
 * router [E, H], the k experts it routes to (not all E: the grouped kernel
 * runs each expert on its own rows only) and its shared experts
 * (DeepSeek's n_shared_experts, Llama 4's one). */
static double mlp_weights_per_token(const tp_model_config *c, int64_t l)
{
    double H = (double)c->hidden_size;
    if (!tp_config_layer_is_sparse(c, l))
        return 3 * H * (double)(c->llama4 ? c->intermediate_size_mlp : c->intermediate_size);
    double I = (double)c->moe_intermediate_size, shared = c->llama4 ? 1 : (double)c->n_shared_experts;
    return H * (double)c->num_experts + 3 * H * I * ((double)c->num_experts_per_tok + shared);
}

/* The FLOPs of one prefill of T tokens (all ranks together): 2 per weight
 * and token for the layers' Linears (of an MoE block, the router and the
 * routed experts only: k per token), the causal attention (q·k and p·v, 2
 * FLOPs per multiply-add, each query against its visible keys), and the
 * lm_head on the last row only, which is all a prefill computes. */
static double prefill_flops(const tp_model_config *c, int64_t T)
{
    double H = (double)c->hidden_size, D = (double)c->head_dim;
    double nq = (double)c->num_attention_heads, nkv = (double)c->num_key_value_heads;
    double attn_w = c->mla ? mla_weights(c) : H * nq * D * 2 + H * nkv * D * 2;
    double keys = 0;
    for (int64_t t = 0; t < T; t++)
        keys += (double)(c->sliding_window > 0 && t + 1 > c->sliding_window ? c->sliding_window : t + 1);
    /* q·k over the query/key head, p·v over the value head */
    double attn = c->mla ? 2 * (double)(c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim) * nq * keys
                         : 4 * D * nq * keys;
    double total = 2 * (double)c->vocab_size * H;
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        total += 2 * (double)T * (attn_w + mlp_weights_per_token(c, l)) + attn;
    return total;
}

/* A temporary report prefix; the ranks append ".<rank>". */
static int report_prefix(char *tmpl)
{
    int fd = mkstemp(tmpl);
    if (fd < 0) { tp_fail(TP_ERR_IO, "cannot create a report file"); return -1; }
    close(fd);
    return 0;
}

static int default_threads(int ranks)
{
    int t = tp_cpu_count() / ranks;
    return t < 1 ? 1 : t;
}

static const char *dtype_label(const config *c, const tp_model_config *mc)
{
    return c->dtype ? c->dtype : tp_dtype_name(mc->dtype == TP_BF16 ? TP_BF16 : TP_F32);
}

/* The machine's limits on `threads` threads (tp_machine_peaks_measure). */
static int machine_peaks(tp_machine_peaks *pk, int threads, int smoke)
{
    tp_threadpool *pool;
    if (tp_threadpool_create(&pool, threads)) return -1;
    /* Pinned like a rank's pool, so the figures compare like with like;
     * this thread's own mask is restored afterwards, since the ranks
     * launched next inherit it and would see a single core. */
    cpu_set_t mine;
    int saved = sched_getaffinity(0, sizeof mine, &mine) == 0;
    if (tp_threadpool_pin(pool, 0)) tp_log(TP_LOG_WARN, "threads not pinned: %s", tp_error());
    tp_status s = tp_machine_peaks_measure(pk, pool, smoke ? 2 : 1);
    tp_threadpool_destroy(pool);
    if (saved) sched_setaffinity(0, sizeof mine, &mine);
    return s ? -1 : 0;
}

/* ---- options shared by forward and decode ------------------------------ */

enum { N_OWN = 11 };
static const cli_option pair_options[N_OWN] = {
    {"--model", "DIR", "model directory (required)", 0, {0}},
    {"--seq", "N", "forward: tokens of the prefill (default 512)", 0, {0}},
    {"--prompt", "N", "decode: tokens of the untimed prompt (default 16)", 0, {0}},
    {"--new-tokens", "N", "decode: tokens generated one at a time (default 128)", 0, {0}},
    {"--threads", "T", "threads per rank (default: cores / ranks, for each TP size)", 0, {0}},
    {"--reps", "R", "repetitions; the median is reported (default 5)", 0, {0}},
    {"--dtype", "f32|bf16|q8_0|q4_0", "weight dtype in memory (default: as stored; f16 is converted to f32; q8_0/q4_0: 8-/4-bit Linear weights)", 0, {0}},
    CLI_MATMUL_OPTION,
    {"--json", NULL, "print one JSON object", 0, {0}},
    {"--report", "FILE", "(internal) where a rank writes its figures", 0, {0}},
    {"--smoke", NULL, "decode: measure the read bandwidth only roughly (tests: proves the bench runs)", 0, {0}},
};

static int read_common(const cli_option *o, int n, const char *cmd, job *j, long long *tp, long long *threads,
                       bench_mode mode)
{
    long long seq = mode == MODE_FORWARD ? 512 : 16, newt = 128, reps = 5;
    j->dir = cli_value(o, n, "--model");
    j->plan = cli_value(o, n, "--tp-plan");
    j->ep = cli_flag(o, n, "--ep");
    j->matmul = cli_value(o, n, "--matmul");
    j->report = cli_value(o, n, "--report");
    if (!j->dir) { fprintf(stderr, "tensorpar %s: error: --model is required\n", cmd); return 2; }
    if (cli_int(o, n, mode == MODE_FORWARD ? "--seq" : "--prompt", &seq) || cli_int(o, n, "--new-tokens", &newt) ||
        cli_int(o, n, "--reps", &reps) || cli_int(o, n, "--tp", tp) || cli_int(o, n, "--threads", threads))
        return cli_report(cmd);
    if (seq < 1 || newt < 1 || reps < 1 || reps > MAX_REPS || *tp < 1) {
        tp_fail(TP_ERR_INVALID, "--seq/--prompt and --new-tokens must be >= 1, --reps in [1, %d], --tp >= 1",
                MAX_REPS);
        return cli_report(cmd);
    }
    j->seq = seq;
    j->new_tokens = newt;
    j->reps = (int)reps;
    return 0;
}

static int load_config(const char *dir, tp_model_config *mc, const char *cmd)
{
    return tp_config_load(mc, dir) ? cli_report(cmd) : 0;
}

/* bench forward and bench decode: TP = 1 and TP = N, side by side. */
static int bench_pair(int argc, char **argv, bench_mode mode)
{
    const char *cmd = mode == MODE_FORWARD ? "bench forward" : "bench decode";
    cli_option o[N_OWN + CLI_TP_N_OPTIONS];
    memcpy(o, pair_options, sizeof pair_options);
    memcpy(o + N_OWN, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + CLI_TP_N_OPTIONS;
    const char *usage = mode == MODE_FORWARD
        ? "tensorpar bench forward --model DIR [--seq 512] [--tp N] [--threads T] [--reps R] [--dtype D] [--json]"
        : "tensorpar bench decode --model DIR [--new-tokens 128] [--tp N] [--threads T] [--reps R] [--dtype D] [--json]";
    const char *summary = mode == MODE_FORWARD
        ? "Times one prefill forward pass of --seq tokens (median of --reps) at TP = 1 and at\n"
          "TP = N (default 2), each in its own processes, and reports the FLOP rate, the\n"
          "share of time in communication and the speedup."
        : "Times --new-tokens decode steps of one token each after a --prompt-token prefill\n"
          "(median of --reps) at TP = 1 and at TP = N (default 2), and reports tokens/s and\n"
          "the weight bytes streamed per second (local weight bytes per token x tokens/s,\n"
          "summed over ranks).";
    int rc = cli_parse(argc, argv, o, n, usage, summary, NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    job j;
    long long tp = 2, threads = 0;
    if ((rc = read_common(o, n, cmd, &j, &tp, &threads, mode))) return rc;
    work w = {mode, j.seq, j.new_tokens, j.reps};
    if (j.report) return measure_as_rank(j.dir, j.report, &w, o, n, argc, argv, cmd);
    tp_model_config mc;
    if ((rc = load_config(j.dir, &mc, cmd))) return rc;
    char tmpl[] = "/tmp/tp-bench-model-XXXXXX";
    if (report_prefix(tmpl)) return cli_report(cmd);
    j.report = tmpl;
    const char *dt = cli_value(o, n, "--dtype");
    config c1 = {1, threads ? (int)threads : default_threads(1), dt};
    config cn = {(int)tp, threads ? (int)threads : default_threads((int)tp), dt};
    figures f1, fn;
    /* decode: the read bandwidth of as many threads as the larger side
     * uses, measured first, before any model is in memory */
    tp_machine_peaks pk;
    memset(&pk, 0, sizeof pk);
    int most = c1.tp * c1.threads > cn.tp * cn.threads ? c1.tp * c1.threads : cn.tp * cn.threads;
    int bad = (mode == MODE_DECODE && machine_peaks(&pk, most, cli_flag(o, n, "--smoke"))) ||
              measure(&j, mode, &c1, &f1) || measure(&j, mode, &cn, &fn);
    remove(tmpl);
    if (bad) return cli_report(cmd);
    double speedup = f1.seconds / fn.seconds;
    if (mode == MODE_FORWARD) {
        double fl = prefill_flops(&mc, j.seq);
        if (cli_flag(o, n, "--json")) {
            printf("{\"bench\": \"forward\", \"isa\": \"%s\", \"seq\": %lld, \"dtype\": \"%s\", \"matmul\": \"%s\", "
                   "\"flops\": %.0f, "
                   "\"tp1\": {\"tp\": 1, \"threads\": %d, \"seconds\": %.6f, \"gflops\": %.3f, \"comm_share\": %.4f}, "
                   "\"tpN\": {\"tp\": %d, \"threads\": %d, \"seconds\": %.6f, \"gflops\": %.3f, \"comm_share\": %.4f}, "
                   "\"speedup\": %.4f}\n",
                   tp_isa_name(tp_isa_selected()), (long long)j.seq, dtype_label(&c1, &mc), matmul_label(&j), fl,
                   c1.threads, f1.seconds, fl / f1.seconds / 1e9,
                   f1.comm_share, cn.tp, cn.threads, fn.seconds, fl / fn.seconds / 1e9, fn.comm_share, speedup);
            return 0;
        }
        printf("forward pass of %lld tokens, %s weights, matmul %s, median of %d (%.1f GFLOP per pass); kernel path "
               "%s\n\n", (long long)j.seq, dtype_label(&c1, &mc), matmul_label(&j), j.reps, fl / 1e9,
               tp_isa_name(tp_isa_selected()));
        printf("%-16s %10s %10s %10s %11s\n", "config", "seconds", "tokens/s", "GFLOP/s", "comm share");
        const config *cs[2] = {&c1, &cn};
        const figures *fs[2] = {&f1, &fn};
        for (int i = 0; i < 2; i++)
            printf("TP=%d x %d thr%*s %10.4f %10.1f %10.1f %10.1f%%\n", cs[i]->tp, cs[i]->threads,
                   cs[i]->threads >= 10 ? 3 : 4, "", fs[i]->seconds, (double)j.seq / fs[i]->seconds,
                   fl / fs[i]->seconds / 1e9, 100 * fs[i]->comm_share);
        printf("\nspeedup of TP=%d x %d over TP=1 x %d: %.3f\n", cn.tp, cn.threads, c1.threads, speedup);
        return 0;
    }
    double tok1 = (double)j.new_tokens / f1.seconds, tokn = (double)j.new_tokens / fn.seconds;
    const config *cs[2] = {&c1, &cn};
    const figures *fs[2] = {&f1, &fn};
    double toks[2] = {tok1, tokn}, bw[2], ratio[2];
    for (int i = 0; i < 2; i++) {
        int used = cs[i]->tp * cs[i]->threads;
        bw[i] = used > 1 ? pk.read_gbs_n : pk.read_gbs_1;
        ratio[i] = fs[i]->weight_bytes * toks[i] / 1e9 / bw[i];
    }
    if (cli_flag(o, n, "--json")) {
        printf("{\"bench\": \"decode\", \"isa\": \"%s\", \"new_tokens\": %lld, \"dtype\": \"%s\", \"matmul\": \"%s\", "
               "\"probe_threads\": %d, \"read_gbs_1\": %.3f, \"read_gbs_n\": %.3f, ",
               tp_isa_name(tp_isa_selected()), (long long)j.new_tokens, dtype_label(&c1, &mc), matmul_label(&j),
               pk.threads,
               pk.read_gbs_1, pk.read_gbs_n);
        for (int i = 0; i < 2; i++)
            printf("\"%s\": {\"tp\": %d, \"threads\": %d, \"tokens_per_s\": %.4f, \"weight_bytes_per_token\": %.0f, "
                   "\"weight_bytes_per_s\": %.0f, \"read_gbs\": %.3f, \"bw_ratio\": %.4f, \"comm_share\": %.4f}, ",
                   i ? "tpN" : "tp1", cs[i]->tp, cs[i]->threads, toks[i], fs[i]->weight_bytes,
                   fs[i]->weight_bytes * toks[i], bw[i], ratio[i], fs[i]->comm_share);
        printf("\"expert_parallel\": %s, \"speedup\": %.4f}\n", j.ep ? "true" : "false", speedup);
        return 0;
    }
    printf("decode of %lld tokens after a %lld-token prompt, %s weights, matmul %s, median of %d; kernel path %s\n",
           (long long)j.new_tokens, (long long)j.seq, dtype_label(&c1, &mc), matmul_label(&j), j.reps,
           tp_isa_name(tp_isa_selected()));
    printf("read bandwidth probe (pinned): %.2f GB/s on 1 thread, %.2f GB/s on %d\n\n", pk.read_gbs_1, pk.read_gbs_n,
           pk.threads);
    printf("%-16s %10s %16s %12s %12s %9s %11s\n", "config", "tokens/s", "weight MB/token", "weight GB/s",
           "probe GB/s", "/ probe", "comm share");
    for (int i = 0; i < 2; i++)
        printf("%s=%d x %d thr%*s %10.2f %16.1f %12.2f %12.2f %9.3f %10.1f%%\n", i && j.ep ? "EP" : "TP", cs[i]->tp,
               cs[i]->threads, cs[i]->threads >= 10 ? 3 : 4, "", toks[i], fs[i]->weight_bytes / 1e6,
               fs[i]->weight_bytes * toks[i] / 1e9, bw[i], ratio[i], 100 * fs[i]->comm_share);
    printf("\n(weight MB/token: the weights a token reads, summed over the ranks: each rank streams its own\n"
           "shards; of the experts only the k of E the router picks; the probe ran on as many threads)\n");
    printf("speedup of %s=%d x %d over TP=1 x %d: %.3f\n", j.ep ? "EP" : "TP", cn.tp, cn.threads, c1.threads,
           speedup);
    return 0;
}

int cmd_bench_forward(int argc, char **argv) { return bench_pair(argc, argv, MODE_FORWARD); }
int cmd_bench_decode(int argc, char **argv) { return bench_pair(argc, argv, MODE_DECODE); }

/* ---- bench model: one configuration ------------------------------------- */

static void print_one(const job *j, bench_mode mode, const config *c, const figures *f, const tp_model_config *mc,
                      int json)
{
    int64_t toks = mode == MODE_FORWARD ? j->seq : j->new_tokens;
    double tps = (double)toks / f->seconds;
    if (json) {
        printf("{\"bench\": \"model\", \"mode\": \"%s\", \"isa\": \"%s\", \"tp\": %d, \"threads\": %d, "
               "\"dtype\": \"%s\", \"matmul\": \"%s\", \"seq\": %lld, \"new_tokens\": %lld, \"reps\": %d, "
               "\"seconds\": %.9g, "
               "\"tokens_per_s\": %.4f, \"comm_share\": %.4f, \"weight_bytes_per_token\": %.0f}\n",
               mode == MODE_FORWARD ? "prefill" : "decode", tp_isa_name(tp_isa_selected()), c->tp, c->threads,
               dtype_label(c, mc), matmul_label(j), (long long)j->seq,
               (long long)(mode == MODE_DECODE ? j->new_tokens : 0), j->reps,
               f->seconds, tps, f->comm_share, f->weight_bytes);
        return;
    }
    if (mode == MODE_FORWARD)
        printf("prefill of %lld tokens, %s weights, matmul %s, TP=%d x %d threads, median of %d; kernel path %s\n"
               "%.4f s, %.1f tokens/s, comm share %.1f%%\n", (long long)j->seq, dtype_label(c, mc), matmul_label(j), c->tp,
               c->threads, j->reps, tp_isa_name(tp_isa_selected()), f->seconds, tps, 100 * f->comm_share);
    else
        printf("decode of %lld tokens after a %lld-token prompt, %s weights, matmul %s, TP=%d x %d threads, median "
               "of %d; kernel path %s\n%.2f tokens/s, %.2f weight GB/s, comm share %.1f%%\n", (long long)j->new_tokens,
               (long long)j->seq, dtype_label(c, mc), matmul_label(j), c->tp, c->threads, j->reps, tp_isa_name(tp_isa_selected()),
               tps, f->weight_bytes * tps / 1e9, 100 * f->comm_share);
}

/* bench model: a prefill or a decode at one TP size and thread count, in
 * its own processes (as each configuration of bench forward/decode), for
 * drivers that pair it with another engine (bench/llamacpp). */
int cmd_bench_model(int argc, char **argv)
{
    const char *cmd = "bench model";
    cli_option o[N_OWN + 1 + CLI_TP_N_OPTIONS];
    o[0] = (cli_option){"--mode", "prefill|decode", "what to time (required)", 0, {0}};
    memcpy(o + 1, pair_options, sizeof pair_options);
    memcpy(o + 1 + N_OWN, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + 1 + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n,
                       "tensorpar bench model --model DIR --mode prefill|decode [--seq 512] [--prompt 16] "
                       "[--new-tokens 128] [--tp 1] [--threads T] [--reps R] [--dtype D] [--json]",
                       "Times one configuration: a prefill of --seq tokens, or --new-tokens decode steps\n"
                       "after a --prompt-token prefill, at TP = --tp (default 1) with --threads per rank,\n"
                       "in its own processes (load, an untimed warm-up, then the median of --reps).",
                       NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    const char *ms = cli_value(o, n, "--mode");
    if (!ms || (strcmp(ms, "prefill") && strcmp(ms, "decode"))) {
        tp_fail(TP_ERR_INVALID, "--mode must be prefill or decode");
        return cli_usage_error(cmd);
    }
    bench_mode mode = strcmp(ms, "prefill") ? MODE_DECODE : MODE_FORWARD;
    job j;
    long long tp = 1, threads = 0;
    if ((rc = read_common(o, n, cmd, &j, &tp, &threads, mode))) return rc;
    if (j.report) {
        tp_fail(TP_ERR_INVALID, "--report belongs to bench forward/decode");
        return cli_usage_error(cmd);
    }
    tp_model_config mc;
    if ((rc = load_config(j.dir, &mc, cmd))) return rc;
    char tmpl[] = "/tmp/tp-bench-model-XXXXXX";
    if (report_prefix(tmpl)) return cli_report(cmd);
    j.report = tmpl;
    config c = {(int)tp, threads ? (int)threads : default_threads((int)tp), cli_value(o, n, "--dtype")};
    figures f;
    int bad = measure(&j, mode, &c, &f);
    remove(tmpl);
    if (bad) return cli_report(cmd);
    print_one(&j, mode, &c, &f, &mc, cli_flag(o, n, "--json"));
    return 0;
}

/* ---- bench all ---------------------------------------------------------- */

/* The machine drifts (a VM on a shared host: ~15 % between runs), so bench
 * all measures in rounds: each round measures the machine's limits and then
 * every configuration once, close together in time, and each ratio is taken
 * within one round.  The ratios reported are the medians over the rounds. */

/* The configurations of one round: the six behind the targets, then the
 * chart's TP sizes beyond 2 (f32 prefill, 1 thread per rank). */
enum { F11, F12, F21, B12, D12, D21, N_FIXED, MAX_CONFIGS = N_FIXED + MAX_TP_POINTS };

typedef struct {
    bench_mode mode;
    config c;
    int live;              /* 0: a chart TP size left off (the model's heads do not divide it) */
} slot;

/* Everything one round measures. */
typedef struct {
    tp_machine_peaks pk;
    figures f[MAX_CONFIGS];
} round_figures;

/* The speed ratios bench/README.md tracks, in the order printed. */
enum { R_FMA12, R_FMA21, R_BF16, R_TP21_11, R_LOCK, R_TP21_LOCK, R_TP21_12, R_BW12, R_BW21, R_COMM, R_COMM_DEC,
       N_RATIOS };
static const struct { const char *key, *what, *target; } ratio_info[N_RATIOS] = {
    {"prefill_fma_ratio", "prefill f32 FLOP rate / FMA peak (TP=1x2)", ">= 0.60"},
    {"prefill_fma_ratio_tp2x1", "prefill f32 FLOP rate / FMA peak (TP=2x1)", ""},
    {"bf16_over_f32", "prefill rate bf16 / f32 weights (TP=1x2)", ">= 1.5"},
    {"tp2x1_over_tp1x1", "prefill TP=2x1 / TP=1x1", ">= 1.9"},
    {"machine_lockstep_scaling", "machine: FMA chunks, 2 threads in lockstep / 1", ""},
    {"tp2x1_over_tp1x1_per_lockstep", "prefill TP=2x1 / TP=1x1, / the machine's lockstep", ""},
    {"tp2x1_over_tp1x2", "prefill TP=2x1 / TP=1x2", ">= 0.95"},
    {"decode_bw_ratio_tp1x2", "decode bf16 weight bytes/s / read bw (TP=1x2)", ">= 0.90"},
    {"decode_bw_ratio_tp2x1", "decode bf16 weight bytes/s / read bw (TP=2x1)", ">= 0.90"},
    {"comm_share_tp2", "share of a prefill in communication (TP=2x1)", ""},
    {"comm_share_tp2_decode", "share of a decode step in communication (TP=2x1)", ""},
};

typedef struct {
    double med, lo, hi;
} spread;

typedef struct {
    int rounds;
    double flops;
    round_figures med;                    /* each figure's own median over the rounds (the tables) */
    spread ratio[N_RATIOS];               /* over the rounds of the per-round ratios */
    int npoints;
    int tp_sizes[MAX_TP_POINTS];
    double speedup[MAX_TP_POINTS];        /* median over rounds of t(1x1) / t(k x 1), f32 prefill */
} all_figures;

static int make_slots(slot *s, long long max_tp)
{
    const slot fixed[N_FIXED] = {
        [F11] = {MODE_FORWARD, {1, 1, "f32"}, 1}, [F12] = {MODE_FORWARD, {1, 2, "f32"}, 1},
        [F21] = {MODE_FORWARD, {2, 1, "f32"}, 1}, [B12] = {MODE_FORWARD, {1, 2, "bf16"}, 1},
        [D12] = {MODE_DECODE, {1, 2, "bf16"}, 1}, [D21] = {MODE_DECODE, {2, 1, "bf16"}, 1},
    };
    memcpy(s, fixed, sizeof fixed);
    int n = N_FIXED;
    /* The chart has TP = 1 and 2 from the fixed ones, then these. */
    for (long long k = 4; k <= max_tp && n - N_FIXED + 2 < MAX_TP_POINTS; k *= 2)
        s[n++] = (slot){MODE_FORWARD, {(int)k, 1, "f32"}, 1};
    return n;
}

/* The order of a round's launches: the two sides of each target ratio back
 * to back (TP=1x1 with TP=2x1, TP=1x2 with bf16, the two decodes), and in
 * reverse order every other round, so that the host's drift within a round
 * (its load moves over tens of seconds) favours neither side. */
static int launch_order(int round, int i)
{
    static const int even[N_FIXED] = {F11, F21, F12, B12, D12, D21};
    static const int odd[N_FIXED] = {F21, F11, B12, F12, D21, D12};
    if (i >= N_FIXED) return i;   /* the chart's other TP sizes */
    return round % 2 ? odd[i] : even[i];
}

/* One round: the machine's limits, then every configuration once, each in
 * its own launch that loads the model and warms up untimed and then times
 * it (a prefill: the median of 3 passes; decode: one run of its steps). */
static int run_round(const job *jf, const job *jd, slot *s, int nconf, int smoke, int round, round_figures *g)
{
    if (machine_peaks(&g->pk, 2, smoke)) return -1;
    for (int o = 0; o < nconf; o++) {
        int i = launch_order(round, o);
        if (!s[i].live || !measure(s[i].mode == MODE_FORWARD ? jf : jd, s[i].mode, &s[i].c, &g->f[i])) continue;
        if (i < N_FIXED) return -1;
        /* A TP size the model's heads do not divide is left off the chart
         * (and not tried again in the later rounds). */
        tp_log(TP_LOG_WARN, "TP=%d left off the chart: %s", s[i].c.tp, tp_error());
        s[i].live = 0;
    }
    return 0;
}

/* One round's ratios, from that round's own figures only, so that a drift
 * of the machine between rounds moves each ratio's two sides together. */
static void round_ratios(const round_figures *g, double flops, int64_t new_tokens, double *v)
{
    const figures *f = g->f;
    double bw = g->pk.read_gbs_n * 1e9, peak = g->pk.fma_gflops_n * 1e9, nt = (double)new_tokens;
    v[R_FMA12] = flops / f[F12].seconds / peak;
    v[R_FMA21] = flops / f[F21].seconds / peak;
    v[R_BF16] = f[F12].seconds / f[B12].seconds;
    v[R_TP21_11] = f[F11].seconds / f[F21].seconds;
    v[R_LOCK] = g->pk.lockstep_scaling;
    v[R_TP21_LOCK] = v[R_TP21_11] / g->pk.lockstep_scaling;
    v[R_TP21_12] = f[F12].seconds / f[F21].seconds;
    v[R_BW12] = f[D12].weight_bytes * nt / f[D12].seconds / bw;
    v[R_BW21] = f[D21].weight_bytes * nt / f[D21].seconds / bw;
    v[R_COMM] = f[F21].comm_share;
    v[R_COMM_DEC] = f[D21].comm_share;
}

static spread spread_of(const double *v, int n)
{
    spread s = {median(v, n), v[0], v[0]};
    for (int i = 1; i < n; i++) {
        if (v[i] < s.lo) s.lo = v[i];
        if (v[i] > s.hi) s.hi = v[i];
    }
    return s;
}

/* Each figure's median over the rounds on its own, for the tables. */
static void median_figures(const round_figures *g, int rounds, int nconf, round_figures *m)
{
    double v[MAX_REPS];
#define MEDIAN_OF(field)                                      \
    do {                                                      \
        for (int r = 0; r < rounds; r++) v[r] = g[r].field;   \
        m->field = median(v, rounds);                         \
    } while (0)
    MEDIAN_OF(pk.fma_gflops_1);
    MEDIAN_OF(pk.fma_gflops_n);
    MEDIAN_OF(pk.read_gbs_1);
    MEDIAN_OF(pk.read_gbs_n);
    MEDIAN_OF(pk.read_huge_share);
    MEDIAN_OF(pk.lockstep_scaling);
    m->pk.threads = g[0].pk.threads;
    for (int i = 0; i < nconf; i++) {
        MEDIAN_OF(f[i].seconds);
        MEDIAN_OF(f[i].comm_share);
        m->f[i].weight_bytes = g[0].f[i].weight_bytes;   /* the same in every round */
    }
#undef MEDIAN_OF
}

static void summarise(const round_figures *g, int rounds, const slot *s, int nconf, int64_t new_tokens,
                      all_figures *a)
{
    double v[N_RATIOS][MAX_REPS], sp[MAX_REPS];
    a->rounds = rounds;
    median_figures(g, rounds, nconf, &a->med);
    for (int r = 0; r < rounds; r++) {
        double one[N_RATIOS];
        round_ratios(&g[r], a->flops, new_tokens, one);
        for (int i = 0; i < N_RATIOS; i++) v[i][r] = one[i];
    }
    for (int i = 0; i < N_RATIOS; i++) a->ratio[i] = spread_of(v[i], rounds);
    a->tp_sizes[0] = 1; a->speedup[0] = 1;
    a->tp_sizes[1] = 2; a->speedup[1] = a->ratio[R_TP21_11].med;
    a->npoints = 2;
    for (int i = N_FIXED; i < nconf; i++) {
        if (!s[i].live) continue;
        for (int r = 0; r < rounds; r++) sp[r] = g[r].f[F11].seconds / g[r].f[i].seconds;
        a->tp_sizes[a->npoints] = s[i].c.tp;
        a->speedup[a->npoints++] = median(sp, rounds);
    }
}

/* Writes the gnuplot script: the variables bench/chart.gp reads, then it. */
static int write_script(const char *path, const char *term, const char *png, const char *data,
                        const all_figures *a, const job *j, const char *model_name, int max_tp, int cores,
                        double ymax)
{
    FILE *g = fopen(path, "w");
    if (!g) return -1;
    fprintf(g, "term = '%s'\nout = ", term);
    tp_gnuplot_quote(g, png);
    fprintf(g, "\ndata = ");
    tp_gnuplot_quote(g, data);
    fprintf(g, "\nmodel = ");
    tp_gnuplot_quote(g, model_name);
    fprintf(g, "\nseq = %lld\nr11 = %.6f\nr12 = %.6f\nmax_tp = %d\ncores = %d\nymax = %.4f\n%s",
            (long long)j->seq, a->ratio[R_TP21_11].med, a->ratio[R_TP21_12].med, max_tp, cores, ymax,
            bench_chart_gp);
    return fclose(g) ? -1 : 0;
}

/* Writes the chart of forward-pass speedup against TP size with gnuplot. */
static int draw_png(const all_figures *a, const job *j, const char *png, const char *model_name)
{
    char dir[] = "/tmp/tp-bench-plot-XXXXXX";
    if (!mkdtemp(dir)) { tp_fail(TP_ERR_IO, "cannot create a temporary folder"); return -1; }
    char data[64], script[64];
    snprintf(data, sizeof data, "%s/speedup.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    int cores = tp_cpu_count(), rc = -1;
    FILE *f = fopen(data, "w");
    if (f) {
        for (int i = 0; i < a->npoints; i++)
            fprintf(f, "%d %.4f %d\n", a->tp_sizes[i], a->speedup[i], a->tp_sizes[i] > cores);
        fclose(f);
    }
    int max_tp = a->npoints ? a->tp_sizes[a->npoints - 1] : 2;
    double ymax = cores < max_tp ? cores : max_tp;
    for (int i = 0; i < a->npoints; i++)
        if (a->speedup[i] > ymax) ymax = a->speedup[i];
    ymax = ymax * 1.2 + 0.1;   /* room for the value labels */
    /* pngcairo draws better; the plain png terminal is the fallback. */
    for (int attempt = 0; attempt < 2 && rc; attempt++) {
        if (write_script(script, attempt == 0 ? "pngcairo" : "png", png, data, a, j, model_name, max_tp, cores,
                         ymax))
            break;
        rc = tp_gnuplot_run(script, NULL);
    }
    remove(data);
    remove(script);
    rmdir(dir);
    if (rc) tp_fail(TP_ERR_IO, "gnuplot could not draw %s (is gnuplot installed?)", png);
    return rc;
}

static const char *base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path;
    for (size_t i = 0; i + 1 < n; i++)
        if (path[i] == '/') b = path + i + 1;
    return b;
}

static void print_json(const all_figures *a, const job *jf, const job *jd, double load)
{
    const figures *f = a->med.f;
    const tp_machine_peaks *pk = &a->med.pk;
    double tok12 = (double)jd->new_tokens / f[D12].seconds, tok21 = (double)jd->new_tokens / f[D21].seconds;
    printf("{\"bench\": \"all\", \"isa\": \"%s\", \"seq\": %lld, \"new_tokens\": %lld, \"reps\": %d, \"rounds\": %d, "
           "\"loadavg\": %.2f, ", tp_isa_name(tp_isa_selected()), (long long)jf->seq, (long long)jd->new_tokens, a->rounds, a->rounds, load);
    for (int i = 0; i < N_RATIOS; i++) printf("\"%s\": %.4f, ", ratio_info[i].key, a->ratio[i].med);
    printf("\"ratio_ranges\": {");
    for (int i = 0; i < N_RATIOS; i++)
        printf("%s\"%s\": [%.4f, %.4f]", i ? ", " : "", ratio_info[i].key, a->ratio[i].lo, a->ratio[i].hi);
    printf("}, \"fma_gflops_1\": %.2f, \"fma_gflops_2\": %.2f, \"read_gbs_1\": %.2f, \"read_gbs_2\": %.2f, "
           "\"read_huge_share\": %.4f, ", pk->fma_gflops_1, pk->fma_gflops_n, pk->read_gbs_1, pk->read_gbs_n,
           pk->read_huge_share);
    printf("\"prefill_flops\": %.0f, \"prefill_seconds\": {\"f32_tp1x1\": %.6f, \"f32_tp1x2\": %.6f, "
           "\"f32_tp2x1\": %.6f, \"bf16_tp1x2\": %.6f}, ",
           a->flops, f[F11].seconds, f[F12].seconds, f[F21].seconds, f[B12].seconds);
    printf("\"decode_tokens_per_s\": {\"bf16_tp1x2\": %.4f, \"bf16_tp2x1\": %.4f}, "
           "\"decode_weight_bytes_per_token\": {\"bf16_tp1x2\": %.0f, \"bf16_tp2x1\": %.0f}, \"speedup_by_tp\": {",
           tok12, tok21, f[D12].weight_bytes, f[D21].weight_bytes);
    for (int i = 0; i < a->npoints; i++) printf("%s\"%d\": %.4f", i ? ", " : "", a->tp_sizes[i], a->speedup[i]);
    printf("}}\n");
}

static void print_tables(const all_figures *a, const job *jf, const job *jd, const char *model, double load)
{
    const figures *f = a->med.f;
    const tp_machine_peaks *pk = &a->med.pk;
    double tok12 = (double)jd->new_tokens / f[D12].seconds, tok21 = (double)jd->new_tokens / f[D21].seconds;
    printf("kernel path %s (TENSORPAR_ISA=scalar|avx2|avx512|amx chooses; `tensorpar --isa-list`)\n",
           tp_isa_name(tp_isa_selected()));
    printf("machine (2 threads, pinned, %s instructions): compute peak %.1f GFLOP/s (%.1f on 1 thread), read bandwidth "
           "%.1f GB/s (%.1f on 1 thread; %.0f %% of its buffer in 2 MiB pages), lockstep scaling %.3f\n",
           tp_kernel_path_name(tp_kernel_path_default()), pk->fma_gflops_n, pk->fma_gflops_1, pk->read_gbs_n,
           pk->read_gbs_1, 100 * pk->read_huge_share, pk->lockstep_scaling);
    printf("model %s: prefill of %lld tokens = %.1f GFLOP; medians of %d rounds (each: the machine, then every "
           "configuration once); load average %.2f\n\n", model, (long long)jf->seq, a->flops / 1e9, a->rounds, load);
    printf("%-28s %10s %10s %11s\n", "prefill", "seconds", "GFLOP/s", "comm share");
    const char *names[4] = {"f32  TP=1 x 1 thread", "f32  TP=1 x 2 threads", "f32  TP=2 x 1 thread",
                            "bf16 TP=1 x 2 threads"};
    const int pf[4] = {F11, F12, F21, B12};
    for (int i = 0; i < 4; i++)
        printf("%-28s %10.4f %10.1f %10.1f%%\n", names[i], f[pf[i]].seconds, a->flops / f[pf[i]].seconds / 1e9,
               100 * f[pf[i]].comm_share);
    printf("\n%-28s %10s %10s %11s\n", "decode (bf16)", "tokens/s", "GB/s", "comm share");
    printf("%-28s %10.2f %10.2f %10.1f%%\n", "TP=1 x 2 threads", tok12, f[D12].weight_bytes * tok12 / 1e9,
           100 * f[D12].comm_share);
    printf("%-28s %10.2f %10.2f %10.1f%%\n", "TP=2 x 1 thread", tok21, f[D21].weight_bytes * tok21 / 1e9,
           100 * f[D21].comm_share);
    printf("\nforward speedup over TP=1 x 1 (1 thread per rank):");
    for (int i = 0; i < a->npoints; i++)
        printf("  TP=%d %.2fx%s", a->tp_sizes[i], a->speedup[i],
               a->tp_sizes[i] > tp_cpu_count() ? " (oversubscribed)" : "");
    printf("\n\n%-50s %10s %8s  %s\n", "ratio (median of the rounds' own ratios)", "measured", "target",
           "min..max over rounds");
    for (int i = 0; i < N_RATIOS; i++)
        printf("%-50s %10.3f %8s  %.3f..%.3f\n", ratio_info[i].what, a->ratio[i].med, ratio_info[i].target,
               a->ratio[i].lo, a->ratio[i].hi);
}

/* All the rounds; *a gets their summary. */
static int measure_all(const job *jf, const job *jd, long long max_tp, int rounds, int smoke, all_figures *a)
{
    slot s[MAX_CONFIGS];
    int nconf = make_slots(s, max_tp), bad = 0;
    round_figures *g = calloc((size_t)rounds, sizeof *g);
    if (!g) {
        tp_fail(TP_ERR_NOMEM, "out of memory");
        return -1;
    }
    for (int r = 0; r < rounds && !bad; r++) bad = run_round(jf, jd, s, nconf, smoke, r, &g[r]);
    if (!bad) summarise(g, rounds, s, nconf, jd->new_tokens, a);
    free(g);
    return bad;
}

int cmd_bench_all(int argc, char **argv)
{
    const char *cmd = "bench all";
    enum { N_ALL = 10 };
    cli_option o[N_ALL + CLI_TP_N_OPTIONS] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--seq", "N", "tokens of the prefill (default 512)", 0, {0}},
        {"--new-tokens", "N", "decode steps (default 128)", 0, {0}},
        {"--reps", "R", "rounds, each measuring every figure once; medians (default 3)", 0, {0}},
        {"--max-tp", "N", "largest TP size of the chart (powers of 2; default 4)", 0, {0}},
        {"--json", NULL, "print one JSON object", 0, {0}},
        {"--png", "FILE", "draw the speedup chart (gnuplot)", 0, {0}},
        {"--smoke", NULL, "measure the machine's limits only roughly (tests: proves the bench runs)", 0, {0}},
        {"--prompt", "N", "tokens of the untimed decode prompt (default 16)", 0, {0}},
        {"--threads", "T", "(not used: bench all picks the threads per figure)", 0, {0}},
    };
    memcpy(o + N_ALL, cli_tp_options, sizeof cli_tp_options);
    int n = N_ALL + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n,
                       "tensorpar bench all --model DIR [--seq 512] [--new-tokens 128] [--reps 3] [--json] [--png FILE]",
                       "Measures, in each of --reps rounds, the machine's limits (FMA peak, read bandwidth;\n"
                       "2 threads) and then once each: prefill at TP=1x1, TP=1x2 and TP=2x1 (f32 weights;\n"
                       "each the median of 3 passes), "
                       "TP=1x2 with bf16 weights, decode with bf16 weights at TP=1x2 and TP=2x1, and the\n"
                       "chart's TP sizes, each in its own processes.  Each ratio of the speed targets\n"
                       "targets is taken within a round (the machine drifts between rounds); the median\n"
                       "over the rounds is printed, with the range.  The weights are converted to the\n"
                       "dtype at load, whatever the checkpoint stores.",
                       NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    job j;
    long long tp = 2, threads = 0, max_tp = 4;
    if ((rc = read_common(o, n, cmd, &j, &tp, &threads, MODE_DECODE))) return rc;
    long long seq = 512, reps = 3;
    if (cli_int(o, n, "--seq", &seq) || cli_int(o, n, "--reps", &reps) || cli_int(o, n, "--max-tp", &max_tp))
        return cli_report(cmd);
    if (seq < 1 || reps < 1 || reps > MAX_REPS || max_tp < 2) {
        tp_fail(TP_ERR_INVALID, "--seq >= 1, --reps in [1, %d], --max-tp >= 2", MAX_REPS);
        return cli_report(cmd);
    }
    job jf = j, jd = j;
    jf.seq = seq;
    /* Decode times 128 steps in one repetition; a prefill is one pass, and
     * one preempted moment of the shared host moves a single pass by 10-20 %,
     * so each prefill launch reports the median of 3 (after its warm-up).
     * The rounds then give the median and range of the ratios. */
    jd.reps = 1;
    jf.reps = cli_flag(o, n, "--smoke") ? 1 : 3;
    tp_model_config mc;
    if ((rc = load_config(j.dir, &mc, cmd))) return rc;
    all_figures a;
    memset(&a, 0, sizeof a);
    a.flops = prefill_flops(&mc, jf.seq);
    char tmpl[] = "/tmp/tp-bench-all-XXXXXX";
    if (report_prefix(tmpl)) return cli_report(cmd);
    jf.report = jd.report = tmpl;
    int bad = measure_all(&jf, &jd, max_tp, (int)reps, cli_flag(o, n, "--smoke"), &a);
    remove(tmpl);
    if (bad) return cli_report(cmd);
    const char *png = cli_value(o, n, "--png");
    if (png && draw_png(&a, &jf, png, base_name(j.dir))) return cli_report(cmd);
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) < 0) load[0] = -1;
    if (cli_flag(o, n, "--json")) print_json(&a, &jf, &jd, load[0]);
    else print_tables(&a, &jf, &jd, base_name(j.dir), load[0]);
    if (png && !cli_flag(o, n, "--json")) printf("\nchart: %s\n", png);
    return 0;
}
