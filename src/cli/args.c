/* A small declarative option parser shared by every command.  An option's
 * metavar also says what its value must look like (N: an integer, F: a
 * number, "a|b": one of the words), so that a bad value is a usage error
 * found before anything runs (and before any rank is started). */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void print_help(const cli_option *opts, int nopts, const char *usage, const char *summary)
{
    printf("usage: %s\n\n%s\n\noptions:\n", usage, summary);
    for (int i = 0; i < nopts; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", opts[i].name, opts[i].metavar ? " " : "",
                 opts[i].metavar ? opts[i].metavar : "");
        printf("  %-28s %s\n", left, opts[i].help);
    }
    printf("  %-28s %s\n", "--help", "show this help and exit");
    printf("\n%s", CLI_EXIT_HELP);
}

/* A usage error found while parsing; returns 2. */
static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1024], prefix[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tp_rank_prefix(prefix, sizeof prefix);
    fprintf(stderr, "%stensorpar %s: error: %s\n", prefix, cmd, msg);
    return CLI_EXIT_USAGE;
}

static int is_one_of(const char *word, const char *const *set)
{
    for (; *set; set++)
        if (!strcmp(word, *set)) return 1;
    return 0;
}

/* "f32|bf16", "shm|mpi": a closed list of words (no upper-case placeholder). */
static int is_choice(const char *metavar)
{
    if (!strchr(metavar, '|')) return 0;
    for (const char *p = metavar; *p; p++)
        if (*p >= 'A' && *p <= 'Z') return 0;
    return 1;
}

static int in_choice(const char *metavar, const char *val)
{
    size_t n = strlen(val);
    for (const char *p = metavar; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, val, n)) return 1;
        p += len + (bar != NULL);
    }
    return 0;
}

/* 0 when val suits the option's metavar; else prints the usage error. */
static int check_value(const char *cmd, const cli_option *o, const char *val)
{
    static const char *const ints[] = {"N", "K", "R", "T", "B", NULL};
    static const char *const numbers[] = {"F", "P", "SECONDS", NULL};
    char *end;
    errno = 0;
    if (is_one_of(o->metavar, ints)) {
        (void)strtoll(val, &end, 10);
        if (!errno && end != val && !*end) return 0;
        return usage_error(cmd, "option %s expects an integer, got '%s'", o->name, val);
    }
    if (is_one_of(o->metavar, numbers)) {
        (void)strtod(val, &end);
        if (!errno && end != val && !*end) return 0;
        return usage_error(cmd, "option %s expects a number, got '%s'", o->name, val);
    }
    if (!is_choice(o->metavar) || in_choice(o->metavar, val)) return 0;
    if (!strcmp(o->name, "--dtype") && (!strcmp(val, "f16") || !strcmp(val, "float16")))
        /* f16 checkpoints load fine (converted to f32); computing in f16 is
         * what is not offered. */
        return usage_error(cmd, "--dtype %s is not supported: weights are held as f32 or bf16 "
                           "(an f16 checkpoint is read and converted to f32); use --dtype f32 or bf16", val);
    if (!strcmp(o->name, "--dtype") && (!strcmp(val, "q8_0") || !strcmp(val, "q4_0")))
        return usage_error(cmd, "--dtype %s is for inference only (logits, generate, chat, bench): this command "
                           "needs f32 or bf16 weights", val);
    return usage_error(cmd, "option %s expects %s, got '%s'", o->name, o->metavar, val);
}

int cli_parse(int argc, char **argv, cli_option *opts, int nopts,
              const char *usage, const char *summary, char ***rest, int *nrest)
{
    if (rest) { *rest = NULL; *nrest = 0; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { print_help(opts, nopts, usage, summary); return 1; }
        if (!strcmp(a, "--") && rest) { *rest = argv + i + 1; *nrest = argc - i - 1; return 0; }
        const char *eq = strchr(a, '=');
        size_t keylen = eq && !strncmp(a, "--", 2) ? (size_t)(eq - a) : strlen(a);
        cli_option *o = NULL;
        for (int j = 0; j < nopts; j++)
            if (strlen(opts[j].name) == keylen && !strncmp(opts[j].name, a, keylen)) { o = &opts[j]; break; }
        if (!o) {
            return usage_error(argv[0], "unknown option '%s' (see --help)", a);
        }
        const char *val = NULL;
        if (o->metavar) {
            if (eq && keylen < strlen(a)) val = eq + 1;
            else if (i + 1 < argc) val = argv[++i];
            else {
                return usage_error(argv[0], "option %s needs a value %s", o->name, o->metavar);
            }
        } else if (eq && keylen < strlen(a)) {
            return usage_error(argv[0], "option %s takes no value", o->name);
        }
        if (o->count >= CLI_MAX_REPEAT) {
            return usage_error(argv[0], "option %s given too often", o->name);
        }
        if (val && check_value(argv[0], o, val)) return 2;
        o->values[o->count++] = val ? val : "";
    }
    return 0;
}

static const cli_option *find(const cli_option *opts, int nopts, const char *name)
{
    for (int i = 0; i < nopts; i++)
        if (!strcmp(opts[i].name, name)) return &opts[i];
    return NULL;
}

const char *cli_value(const cli_option *opts, int nopts, const char *name)
{
    const cli_option *o = find(opts, nopts, name);
    return o && o->count ? o->values[o->count - 1] : NULL;
}

int cli_flag(const cli_option *opts, int nopts, const char *name)
{
    const cli_option *o = find(opts, nopts, name);
    return o && o->count > 0;
}

int cli_int(const cli_option *opts, int nopts, const char *name, long long *out)
{
    const char *v = cli_value(opts, nopts, name);
    if (!v) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) {
        tp_fail(TP_ERR_INVALID, "option %s expects an integer, got '%s'", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_double(const cli_option *opts, int nopts, const char *name, double *out)
{
    const char *v = cli_value(opts, nopts, name);
    if (!v) return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end) {
        tp_fail(TP_ERR_INVALID, "option %s expects a number, got '%s'", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_parse_ids(const char *s, int64_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int64_t *v = malloc(cap * sizeof *v);
    if (!v) { tp_fail(TP_ERR_NOMEM, "out of memory"); return -1; }
    const char *p = s;
    int k = 0;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || (*end && *end != ',')) {
            free(v);
            tp_fail(TP_ERR_INVALID, "token ids must be comma-separated integers, got '%s'", s);
            return -1;
        }
        v[k++] = x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) { free(v); tp_fail(TP_ERR_INVALID, "no token ids given"); return -1; }
    *ids = v;
    *n = k;
    return 0;
}

int cli_model_tokens_out(const cli_option *opts, int nopts, const char *cmd, const char **dir, const char **out,
                         int64_t **ids, int *n, tp_dtype *dtype)
{
    const char *toks = cli_value(opts, nopts, "--tokens"), *dt = cli_value(opts, nopts, "--dtype");
    *dir = cli_value(opts, nopts, "--model");
    *out = cli_value(opts, nopts, "--out");
    *ids = NULL;
    if (!*dir || !toks || !*out) {
        tp_fail(TP_ERR_INVALID, "--model, --tokens and --out are required (see --help)");
        return cli_usage_error(cmd);
    }
    if (cli_parse_ids(toks, ids, n) || (dt && tp_dtype_parse(dt, dtype))) {
        free(*ids);
        *ids = NULL;
        return cli_usage_error(cmd);
    }
    return 0;
}

int cli_check_dir(const char *cmd, const char *option, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) return usage_error(cmd, "%s %s: %s", option, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return usage_error(cmd, "%s %s: not a directory", option, dir);
    return 0;
}

int cli_report(const char *cmd)
{
    char prefix[48];
    tp_rank_prefix(prefix, sizeof prefix);
    fprintf(stderr, "%stensorpar %s: error: %s\n", prefix, cmd, tp_error());
    return CLI_EXIT_RUNTIME;
}

int cli_report_shared(const char *cmd)
{
    fprintf(stderr, "tensorpar %s: error: %s\n", cmd, tp_error());
    return CLI_EXIT_RUNTIME;
}

int cli_usage_error(const char *cmd)
{
    cli_report(cmd);
    return CLI_EXIT_USAGE;
}
