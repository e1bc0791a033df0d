/* tensorpar bench comm: latency and bandwidth of the collectives.
 *
 * Run plainly, it launches itself as N ranks once per backend (shm, then
 * mpi through mpirun) and prints both side by side; run inside a job (under
 * `tensorpar launch` or mpirun) it measures that job's backend only.
 *
 * Each size is measured as the median over batches: a barrier, then K
 * back-to-back operations timed on rank 0, giving one per-operation time.
 * "bytes" is the size of the whole tensor (all_reduce: the buffer; all_gather:
 * the gathered output; reduce_scatter: the input), and GB/s = bytes / time.
 * A memcpy of the same size gives the machine's reference bandwidth. */
#include "cli.h"
#include "tp_cli.h"
#include "tensorpar/comm.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_MEMCPY, OP_COUNT } bench_op;
static const char *const op_names[OP_COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "memcpy"};

typedef struct {
    size_t min_bytes, max_bytes;
    int batches;
    int ops[OP_COUNT];
} bench_cfg;

typedef struct {
    bench_op op;
    char backend[16];
    int ranks;
    size_t bytes;
    double median_us, gb_per_s;
} result;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One operation on a tensor of `bytes` bytes (f32). */
static tp_status run_op(tp_group *g, bench_op op, float *in, float *out, size_t bytes)
{
    size_t n = (size_t)tp_group_size(g), count = bytes / sizeof(float);
    switch (op) {
    case OP_ALL_REDUCE: return tp_comm_all_reduce(g, in, out, count, TP_F32, TP_REDUCE_SUM);
    case OP_ALL_GATHER: return tp_comm_all_gather(g, in, out, count / n, TP_F32);
    case OP_REDUCE_SCATTER: return tp_comm_reduce_scatter(g, in, out, count / n, TP_F32, TP_REDUCE_SUM);
    case OP_MEMCPY: memcpy(out, in, bytes); return TP_OK;
    default: return TP_OK;
    }
}

/* Median per-operation seconds over cfg->batches batches. */
static tp_status measure(tp_group *g, bench_op op, float *in, float *out, size_t bytes, int batches, double *med)
{
    int k = (int)((8u << 20) / bytes);
    k = k < 1 ? 1 : k > 200 ? 200 : k;
    double *t = malloc((size_t)batches * sizeof(double));
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status st = TP_OK;
    /* Warm up with one untimed batch: the first size of a run otherwise
     * measures the slots' first touches and the cores waking up. */
    for (int w = 0; w < k && !st; w++) st = run_op(g, op, in, out, bytes);
    for (int b = 0; b < batches && !st; b++) {
        if (op != OP_MEMCPY) st = tp_comm_barrier(g);
        double t0 = tp_now();
        for (int i = 0; i < k && !st; i++) st = run_op(g, op, in, out, bytes);
        t[b] = (tp_now() - t0) / k;
    }
    if (!st) {
        qsort(t, (size_t)batches, sizeof(double), cmp_double);
        *med = t[batches / 2];
    }
    free(t);
    return st;
}

static void print_json(FILE *f, const result *r)
{
    fprintf(f, "{\"op\": \"%s\", \"backend\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"median_us\": %.3f, "
               "\"gb_per_s\": %.3f}\n", op_names[r->op], r->backend, r->ranks, r->bytes, r->median_us, r->gb_per_s);
}

/* The rank side: measures every op and size, rank 0 prints JSON lines. */
static int worker(const bench_cfg *cfg, FILE *out)
{
    tp_group *g;
    if (tp_comm_init(&g, NULL)) return cli_report("bench comm");
    int n = tp_group_size(g), me = tp_group_rank(g);
    /* One core per rank, as the model commands do: a rank the scheduler
     * moves, or puts beside its peer, measures the scheduler. */
    if (cli_pin_wanted() && tp_pin_thread(tp_group_local_rank(g)))
        tp_log(TP_LOG_WARN, "rank %d not pinned: %s", me, tp_error());
    size_t cap = cfg->max_bytes + 64 * (size_t)n;
    float *in = tp_alloc(cap), *buf = tp_alloc(cap);
    tp_status st = in && buf ? TP_OK : TP_ERR_NOMEM;
    if (!st) {
        for (size_t i = 0; i < cap / sizeof(float); i++) in[i] = (float)(i % 1000) * 0.001f;
        memset(buf, 0, cap);
    }
    for (int op = 0; op < OP_COUNT && !st; op++) {
        if (!cfg->ops[op] || (op == OP_MEMCPY && me != 0)) continue;
        for (size_t bytes = cfg->min_bytes; bytes <= cfg->max_bytes && !st; bytes *= 4) {
            double med = 0;
            st = measure(g, (bench_op)op, in, buf, bytes, cfg->batches, &med);
            result r = {(bench_op)op, "", op == OP_MEMCPY ? 1 : n, bytes, med * 1e6, bytes / med / 1e9};
            snprintf(r.backend, sizeof r.backend, "%s", op == OP_MEMCPY ? "none" : tp_backend_name(tp_group_backend(g)));
            if (!st && me == 0) print_json(out, &r);
        }
    }
    if (out != stdout) fflush(out);
    tp_free(in);
    tp_free(buf);
    tp_group_free(g);
    return st ? cli_report("bench comm") : 0;
}

/* ---- the launching side -------------------------------------------------- */

static int parse_line(const char *line, result *r)
{
    char op[32], backend[16];
    if (sscanf(line, "{\"op\": \"%31[^\"]\", \"backend\": \"%15[^\"]\", \"ranks\": %d, \"bytes\": %zu, "
                     "\"median_us\": %lf, \"gb_per_s\": %lf}", op, backend, &r->ranks, &r->bytes,
               &r->median_us, &r->gb_per_s) != 6)
        return 0;
    for (int i = 0; i < OP_COUNT; i++)
        if (!strcmp(op, op_names[i])) r->op = (bench_op)i;
    snprintf(r->backend, sizeof r->backend, "%s", backend);
    return 1;
}

static const result *find(const result *rs, int n, bench_op op, const char *backend, size_t bytes)
{
    for (int i = 0; i < n; i++)
        if (rs[i].op == op && rs[i].bytes == bytes && !strcmp(rs[i].backend, backend)) return &rs[i];
    return NULL;
}

static void size_str(char *buf, size_t cap, size_t b)
{
    if (b >= (1u << 20)) snprintf(buf, cap, "%zu MiB", b >> 20);
    else snprintf(buf, cap, "%zu KiB", b >> 10);
}

static void print_table(const result *rs, int nr, const bench_cfg *cfg, int ranks)
{
    printf("collectives over %d ranks, f32; median time per operation; GB/s = tensor bytes / time\n\n", ranks);
    printf("%-15s %8s %10s %9s %10s %9s %8s %11s\n", "op", "bytes", "shm us", "shm GB/s", "mpi us", "mpi GB/s",
           "mpi/shm", "memcpy GB/s");
    for (int op = 0; op < OP_MEMCPY; op++) {
        if (!cfg->ops[op]) continue;
        for (size_t b = cfg->min_bytes; b <= cfg->max_bytes; b *= 4) {
            const result *s = find(rs, nr, (bench_op)op, "shm", b), *m = find(rs, nr, (bench_op)op, "mpi", b);
            const result *c = find(rs, nr, OP_MEMCPY, "none", b);
            char sz[32], col[6][16];
            size_str(sz, sizeof sz, b);
            snprintf(col[0], 16, s ? "%.2f" : "-", s ? s->median_us : 0);
            snprintf(col[1], 16, s ? "%.2f" : "-", s ? s->gb_per_s : 0);
            snprintf(col[2], 16, m ? "%.2f" : "-", m ? m->median_us : 0);
            snprintf(col[3], 16, m ? "%.2f" : "-", m ? m->gb_per_s : 0);
            snprintf(col[4], 16, s && m ? "%.2fx" : "-", s && m ? m->median_us / s->median_us : 0);
            snprintf(col[5], 16, c ? "%.2f" : "-", c ? c->gb_per_s : 0);
            printf("%-15s %8s %10s %9s %10s %9s %8s %11s\n", op_names[op], sz, col[0], col[1], col[2], col[3],
                   col[4], col[5]);
        }
    }
}

/* Launches `argv + --out FILE` as n ranks on backend b; appends the results. */
static int run_backend(char **argv, int argc, tp_backend b, int n, result **rs, int *nr)
{
    char path[] = "/tmp/tensorpar-bench-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("tensorpar bench comm: mkstemp"); return 1; }
    close(fd);
    char **av = calloc((size_t)argc + 3, sizeof(char *));
    if (!av) return 1;
    memcpy(av, argv, (size_t)argc * sizeof(char *));
    av[argc] = "--out";
    av[argc + 1] = path;
    int code = 1;
    tp_status st = tp_launch_self(n, b, av, &code);
    free(av);
    if (st) { unlink(path); return cli_report("bench comm"); }
    FILE *f = fopen(path, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        result r;
        if (!parse_line(line, &r)) continue;
        if (r.op == OP_MEMCPY && find(*rs, *nr, OP_MEMCPY, "none", r.bytes)) continue;
        result *p = realloc(*rs, (size_t)(*nr + 1) * sizeof r);
        if (!p) break;
        *rs = p;
        (*rs)[(*nr)++] = r;
    }
    if (f) fclose(f);
    unlink(path);
    if (code) fprintf(stderr, "tensorpar bench comm: the %s run failed (exit %d)\n", tp_backend_name(b), code);
    return code;
}

int cmd_bench_comm(int argc, char **argv)
{
    cli_option opts[] = {
        {"--backend", "NAME", "shm, mpi or both (default: both when mpi is available)", 0, {0}},
        {"-n", "N", "number of ranks (default 2)", 0, {0}},
        {"--json", NULL, "one JSON object per line instead of a table", 0, {0}},
        {"--min-bytes", "B", "smallest tensor (default 4096)", 0, {0}},
        {"--max-bytes", "B", "largest tensor (default 67108864 = 64 MiB)", 0, {0}},
        {"--batches", "K", "timed batches per size; the median is reported (default 25)", 0, {0}},
        {"--op", "NAME", "all_reduce, all_gather or reduce_scatter (repeatable; default all)", 0, {0}},
        {"--out", "FILE", "(internal) where rank 0 writes its JSON lines", 0, {0}},
    };
    int nopts = sizeof opts / sizeof opts[0];
    int rc = cli_parse(argc, argv, opts, nopts, "tensorpar bench comm [--backend shm|mpi|both] [-n N] [--json]",
                       "Measures latency and bandwidth of all_reduce, all_gather and reduce_scatter from\n"
                       "4 KiB to 64 MiB (median of many repetitions), shm and mpi side by side.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    long long n = 2, minb = 4096, maxb = 64 << 20, batches = 25;
    if (cli_int(opts, nopts, "-n", &n) || cli_int(opts, nopts, "--min-bytes", &minb) ||
        cli_int(opts, nopts, "--max-bytes", &maxb) || cli_int(opts, nopts, "--batches", &batches))
        return cli_report("bench comm");
    if (n < 1 || minb < 256 || maxb < minb || batches < 1) {
        fprintf(stderr, "tensorpar bench comm: error: need -n >= 1, --min-bytes >= 256, --max-bytes >= --min-bytes\n");
        return 2;
    }
    bench_cfg cfg = {(size_t)minb, (size_t)maxb, (int)batches, {0}};
    const cli_option *op = NULL;
    for (int i = 0; i < nopts; i++) if (!strcmp(opts[i].name, "--op")) op = &opts[i];
    for (int i = 0; i < OP_COUNT; i++) cfg.ops[i] = op->count == 0 || i == OP_MEMCPY;
    for (int k = 0; k < op->count; k++) {
        int found = 0;
        for (int i = 0; i < OP_MEMCPY; i++)
            if (!strcmp(op->values[k], op_names[i])) cfg.ops[i] = found = 1;
        if (!found) { fprintf(stderr, "tensorpar bench comm: error: unknown --op '%s'\n", op->values[k]); return 2; }
    }
    const char *out_path = cli_value(opts, nopts, "--out");
    if (tp_launch_in_job()) {
        FILE *out = out_path ? fopen(out_path, "w") : stdout;
        if (!out) { perror(out_path); return 1; }
        rc = worker(&cfg, out);
        if (out != stdout) fclose(out);
        return rc;
    }
    const char *b = cli_value(opts, nopts, "--backend");
    int want_shm = !b || !strcmp(b, "both") || !strcmp(b, "shm");
    int want_mpi = (!b && tp_backend_available(TP_BACKEND_MPI)) || (b && (!strcmp(b, "both") || !strcmp(b, "mpi")));
    if (!want_shm && !want_mpi) { fprintf(stderr, "tensorpar bench comm: error: unknown backend '%s'\n", b); return 2; }
    /* The ranks get our argv (minus the program name's path) plus --out. */
    char **av = malloc(((size_t)argc + 2) * sizeof(char *));
    if (!av) return 1;
    av[0] = "tensorpar";
    av[1] = "bench";
    memcpy(av + 2, argv, (size_t)argc * sizeof(char *));
    result *rs = NULL;
    int nr = 0;
    rc = 0;
    if (want_shm) rc |= run_backend(av, argc + 2, TP_BACKEND_SHM, (int)n, &rs, &nr);
    if (want_mpi) rc |= run_backend(av, argc + 2, TP_BACKEND_MPI, (int)n, &rs, &nr);
    free(av);
    if (cli_flag(opts, nopts, "--json"))
        for (int i = 0; i < nr; i++) print_json(stdout, &rs[i]);
    else
        print_table(rs, nr, &cfg, (int)n);
    free(rs);
    return rc ? 1 : 0;
}
