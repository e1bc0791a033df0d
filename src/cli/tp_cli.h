/* --tp, --tp-plan and --backend for the model commands (see tp_cli.c). */
#ifndef TP_CLI_TP_H
#define TP_CLI_TP_H

#include "cli.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/models.h"

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
/* The thread pool of this rank: --threads T (default: the cores this
 * process may use ÷ LOCAL_WORLD_SIZE, at least 1), pinned so that local
 * rank r takes cores [r·T, (r+1)·T) mod ncores (TENSORPAR_PIN=0: unpinned).
 * Asking for more threads than cores works, with a warning.  Sets
 * mo->threads, mo->pin_threads and mo->first_cpu; -1 on a bad --threads. */
int cli_tp_threads(const cli_option *o, int n, const cli_tp *tp, tp_model_options *mo);
/* 0 when TENSORPAR_PIN=0 asks for ranks and threads to stay unpinned. */
int cli_pin_wanted(void);

/* A tp_choose_callback: every rank takes rank 0's token. */
tp_status cli_tp_choose(void *ctx, int64_t *id);

#endif
