/* The tensorpar command-line tool: one file per command, this shared header,
 * and a small declarative option parser (args.c). */
#ifndef TP_CLI_H
#define TP_CLI_H

#include "tensorpar/base.h"

#define CLI_MAX_REPEAT 64

typedef struct {
    const char *name;       /* "--model" */
    const char *metavar;    /* "DIR", or NULL for a flag */
    const char *help;
    /* filled by cli_parse */
    int count;
    const char *values[CLI_MAX_REPEAT];
} cli_option;

/* Parses argv[1..] (argv[0] is the command name).  Returns 0 on success, 1
 * when --help was printed (exit 0), 2 on a usage error (message printed).
 * Arguments after "--" are left in *rest / *nrest when those are non-NULL. */
int cli_parse(int argc, char **argv, cli_option *opts, int nopts,
              const char *usage, const char *summary, char ***rest, int *nrest);
/* The last value of an option, or NULL. */
const char *cli_value(const cli_option *opts, int nopts, const char *name);
int cli_flag(const cli_option *opts, int nopts, const char *name);
/* Parses an integer option; returns 0 and fills *out (or leaves default). */
int cli_int(const cli_option *opts, int nopts, const char *name, long long *out);
int cli_double(const cli_option *opts, int nopts, const char *name, double *out);
/* Parses "1,2,3" into a malloc'd array. */
int cli_parse_ids(const char *s, int64_t **ids, int *n);
/* What logits and grads read first: --model (*dir), --tokens and --out
 * (*out), all required; the ids in a malloc'd *ids; --dtype into *dtype
 * when given.  0, or (the usage error of `cmd` printed, nothing held) 2. */
int cli_model_tokens_out(const cli_option *opts, int nopts, const char *cmd, const char **dir, const char **out,
                         int64_t **ids, int *n, tp_dtype *dtype);
/* Exit statuses of every command (README, --help): 0 success, 1 a runtime
 * error (a file, the model, a rank, the system), 2 a usage error (unknown
 * option, bad value, missing required option), found before any work. */
#define CLI_EXIT_RUNTIME 1
#define CLI_EXIT_USAGE 2
#define CLI_EXIT_HELP "exit status: 0 success, 1 runtime error (a file, the model, a rank failed),\n" \
                      "2 usage error (unknown option, bad value, missing required option).\n"

/* Prints "[rank r] tensorpar <cmd>: error: <tp_error()>" (the prefix only
 * when this process is one of several ranks) and returns 1. */
int cli_report(const char *cmd);
/* 0 when dir is a directory; else prints the usage error for `option` and
 * returns 2. */
int cli_check_dir(const char *cmd, const char *option, const char *dir);
/* The same without the rank: an error every rank found alike, printed by
 * rank 0 alone (tp-semantics §5.3). */
int cli_report_shared(const char *cmd);
/* The same for a usage error (a bad option value): returns 2. */
int cli_usage_error(const char *cmd);

/* tensorpar --isa-list: the paths this CPU supports, the chosen one marked. */
int cmd_isa_list(void);
/* tensorpar --help-env: every TENSORPAR_* setting, its type, default and doc. */
int cmd_help_env(void);
/* 0 if every setting in the environment is valid; else prints why and
 * returns CLI_EXIT_USAGE. */
int cli_settings_check(void);
/* 0 if TENSORPAR_ISA (and the environment around it) is accepted; else
 * prints why and returns 2. */
int cli_isa_check(void);

/* Commands: int cmd_x(int argc, char **argv) with argv[0] = "x". */
int cmd_make_model(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_grads(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench_load(int argc, char **argv);
int cmd_bench_forward(int argc, char **argv);
int cmd_bench_decode(int argc, char **argv);
int cmd_bench_all(int argc, char **argv);
int cmd_bench_model(int argc, char **argv);
int cmd_bench_tokenize(int argc, char **argv);
int cmd_bench_kernels(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* Communication (comm/): launcher and collective benchmark. */
int cmd_launch(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_comm(int argc, char **argv);

#endif
