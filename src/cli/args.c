/* A small declarative option parser shared by every command. */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
            fprintf(stderr, "tensorpar %s: error: unknown option '%s' (see --help)\n", argv[0], a);
            return 2;
        }
        const char *val = NULL;
        if (o->metavar) {
            if (eq && keylen < strlen(a)) val = eq + 1;
            else if (i + 1 < argc) val = argv[++i];
            else {
                fprintf(stderr, "tensorpar %s: error: option %s needs a value %s\n", argv[0], o->name, o->metavar);
                return 2;
            }
        } else if (eq && keylen < strlen(a)) {
            fprintf(stderr, "tensorpar %s: error: option %s takes no value\n", argv[0], o->name);
            return 2;
        }
        if (o->count >= CLI_MAX_REPEAT) {
            fprintf(stderr, "tensorpar %s: error: option %s given too often\n", argv[0], o->name);
            return 2;
        }
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

int cli_report(const char *cmd)
{
    fprintf(stderr, "tensorpar %s: error: %s\n", cmd, tp_error());
    return 1;
}
