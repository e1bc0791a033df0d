/* The option parsing of the test workers (tests/workers/worker_NAME.c):
 * "--name value" and "--flag" pairs, no more.  The workers are test programs, not user
 * commands, so they do without the CLI's parser and its help text. */
#ifndef TP_WORKER_ARGS_H
#define TP_WORKER_ARGS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;   /* "--out-dir" */
    int takes_value;
    const char *value;  /* filled: the value, or "" for a flag that was given */
} worker_opt;

/* Fills opts from argv[1..]; 0, or prints why on stderr and returns 2. */
static inline int worker_parse(const char *prog, int argc, char **argv, worker_opt *opts, int nopts)
{
    for (int i = 1; i < argc; i++) {
        int k = 0;
        while (k < nopts && strcmp(argv[i], opts[k].name)) k++;
        if (k == nopts) {
            fprintf(stderr, "%s: unknown option %s\n", prog, argv[i]);
            return 2;
        }
        if (!opts[k].takes_value) { opts[k].value = ""; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, argv[i]);
            return 2;
        }
        opts[k].value = argv[++i];
    }
    return 0;
}

/* A number option's value, or dflt when it was not given; 0 or 2 (printed). */
static inline int worker_number(const char *prog, const worker_opt *o, double dflt, double *out)
{
    *out = dflt;
    if (!o->value) return 0;
    char *end;
    *out = strtod(o->value, &end);
    if (end == o->value || *end) {
        fprintf(stderr, "%s: %s: not a number: %s\n", prog, o->name, o->value);
        return 2;
    }
    return 0;
}

#endif
