/* tensorpar bench load: what loading costs each rank — seconds, checkpoint
 * bytes read, peak resident memory — for TP = 1 and TP = N measured side by
 * side in one run, with the ratios of our load targets (bench/README.md). */
#include "tp_cli.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct {
    double seconds;
    double bytes_read;
    double peak_rss;      /* bytes */
} load_figures;

/* As one rank of a job: load, measure, and write one line per rank to
 * REPORT.<rank>. */
static int measure_as_rank(const char *dir, const char *report, const cli_option *o, int n, int argc, char **argv)
{
    cli_tp tp;
    int rc = 0;
    if (cli_tp_begin("bench load", argc, argv, o, n, NULL, &tp, &rc)) { cli_tp_end(&tp); return rc; }
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .mesh = tp.mesh, .tp_plan = tp.plan,
                           .expert_parallel = tp.ep && tp.size > 1};
    tp_model *m;
    if (tp_model_options_from_env(&mo)) { cli_tp_end(&tp); return cli_report("bench load"); }
    mo.pin_threads = 0;   /* one thread, left to the OS, as before */
    double t0 = tp_now();
    if (tp_model_load(&m, dir, &mo)) { cli_tp_end(&tp); return cli_report("bench load"); }
    double secs = tp_now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", report, tp.rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.6f %llu %lld\n", secs, (unsigned long long)tp_model_bytes_read(m), (long long)ru.ru_maxrss * 1024);
        fclose(f);
    }
    tp_model_free(m);
    cli_tp_end(&tp);
    return f ? 0 : 1;
}

/* Runs the measurement as `ranks` processes and averages their figures. */
static int measure(const char *dir, const char *plan, int ranks, const char *report, load_figures *out)
{
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", ranks);
    char *argv[] = {"tensorpar", "bench", "load", "--model", (char *)dir, "--report", (char *)report,
                    "--tp", nbuf, plan ? "--tp-plan" : NULL, (char *)plan, NULL};
    int rc = 0;
    if (tp_launch_self(ranks, TP_BACKEND_AUTO, argv, &rc) || rc) return -1;
    memset(out, 0, sizeof *out);
    for (int r = 0; r < ranks; r++) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", report, r);
        FILE *f = fopen(path, "r");
        load_figures x = {0};
        int ok = f && fscanf(f, "%lf %lf %lf", &x.seconds, &x.bytes_read, &x.peak_rss) == 3;
        if (f) fclose(f);
        remove(path);
        if (!ok) { tp_fail(TP_ERR_IO, "rank %d left no report", r); return -1; }
        out->seconds += x.seconds / ranks;
        out->bytes_read += x.bytes_read / ranks;
        out->peak_rss += x.peak_rss / ranks;
    }
    return 0;
}

static long long file_bytes(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "du -cb '%s'/*.safetensors 2>/dev/null | tail -n 1", dir);
    FILE *p = popen(cmd, "r");
    long long total = 0;
    if (p) {
        if (fscanf(p, "%lld", &total) != 1) total = 0;
        pclose(p);
    }
    return total;
}

int cmd_bench_load(int argc, char **argv)
{
    cli_option o[3 + CLI_TP_N_OPTIONS] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--json", NULL, "print one JSON object", 0, {0}},
        {"--report", "FILE", "(internal) where a rank writes its figures", 0, {0}},
    };
    memcpy(o + 3, cli_tp_options, sizeof cli_tp_options);
    int n = 3 + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n, "tensorpar bench load --model DIR [--tp N] [--tp-plan FILE] [--json]",
                       "Loads the model at TP = 1 and at TP = N (default 2), one after the other, and\n"
                       "compares per-rank load time, checkpoint bytes read and peak resident memory.",
                       NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    const char *dir = cli_value(o, n, "--model"), *report = cli_value(o, n, "--report");
    if (!dir) { fprintf(stderr, "tensorpar bench load: error: --model is required\n"); return 2; }
    if (report) return measure_as_rank(dir, report, o, n, argc, argv);
    long long tp = 2;
    if (cli_int(o, n, "--tp", &tp) || tp < 1) return cli_report("bench load");
    char tmpl[] = "/tmp/tp-bench-load-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) { tp_fail(TP_ERR_IO, "cannot create a report file"); return cli_report("bench load"); }
    close(fd);
    load_figures one, many;
    const char *plan = cli_value(o, n, "--tp-plan");
    int bad = measure(dir, plan, 1, tmpl, &one) || measure(dir, plan, (int)tp, tmpl, &many);
    remove(tmpl);
    if (bad) return cli_report("bench load");
    double total = (double)file_bytes(dir);
    if (cli_flag(o, n, "--json")) {
        printf("{\"bench\": \"load\", \"tp\": %lld, \"checkpoint_bytes\": %.0f, "
               "\"tp1\": {\"seconds\": %.4f, \"bytes_read\": %.0f, \"peak_rss\": %.0f}, "
               "\"tpN\": {\"seconds\": %.4f, \"bytes_read\": %.0f, \"peak_rss\": %.0f}, "
               "\"rss_ratio\": %.4f, \"bytes_read_share\": %.4f}\n",
               tp, total, one.seconds, one.bytes_read, one.peak_rss, many.seconds, many.bytes_read, many.peak_rss,
               many.peak_rss / one.peak_rss, total > 0 ? many.bytes_read / total : 0);
        return 0;
    }
    printf("%-22s %14s %14s\n", "per rank", "TP=1", "TP=N");
    printf("%-22s %14.3f %14.3f\n", "load seconds", one.seconds, many.seconds);
    printf("%-22s %14.0f %14.0f\n", "bytes read", one.bytes_read, many.bytes_read);
    printf("%-22s %14.0f %14.0f\n", "peak RSS bytes", one.peak_rss, many.peak_rss);
    printf("\nTP=%lld: peak RSS per rank = %.1f %% of TP=1; bytes read per rank = %.1f %% of the checkpoint\n",
           tp, 100 * many.peak_rss / one.peak_rss, total > 0 ? 100 * many.bytes_read / total : 0);
    return 0;
}
