/* --tp, --tp-plan and --backend for the model commands (see tp_cli.c). */
#ifndef TP_CLI_TP_H
#define TP_CLI_TP_H

#include "cli.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"

#define CLI_TP_N_OPTIONS 3
extern const cli_option cli_tp_options[CLI_TP_N_OPTIONS];

typedef struct {
    tp_group *world;      /* NULL on a single rank */
    tp_mesh *mesh;        /* the 1-D TP mesh, or NULL */
    int rank, size;
    const char *plan;     /* --tp-plan, or NULL */
} cli_tp;

/* 0: go on as this rank (or as the only process); 1: the N ranks were
 * launched from here and have finished, *rc is their exit code; -1: error
 * (tp_error()). */
int cli_tp_begin(int argc, char **argv, const cli_option *o, int n, cli_tp *tp, int *rc);
void cli_tp_end(cli_tp *tp);
/* A tp_choose_callback: every rank takes rank 0's token. */
tp_status cli_tp_choose(void *ctx, int64_t *id);

#endif
