/* --tp, --tp-plan and --backend for the model commands (see tp_cli.c). */
#ifndef TP_CLI_TP_H
#define TP_CLI_TP_H

#include "cli.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/models.h"

#define CLI_TP_N_OPTIONS 4
extern const cli_option cli_tp_options[CLI_TP_N_OPTIONS];

typedef struct {
    tp_group *world;      /* NULL on a single rank */
    tp_mesh *mesh;        /* the 1-D TP mesh, or NULL (NULL too under data parallelism: see grid) */
    int rank, size;
    const char *plan;     /* --tp-plan, or NULL */
    int ep;               /* --ep: expert parallelism over the TP ranks (the model type's EP plan) */
    /* Data parallelism (cli_tp_begin_dp): the replica counts and the mesh
     * ["dp_replicate", "dp_shard", "cp", "tp"] (tp fastest, cp 1, the
     * flattened "dp" group; tp_parallelism_config_mesh), NULL without. */
    int tp_size, dp_replicate, dp_shard;
    int dp_ok;            /* the command takes data parallelism (its size errors say so) */
    tp_mesh *grid;
} cli_tp;

/* Checks the options (--tp, --backend, --threads; --model DIR exists) and,
 * when dir is given, the model's config and TP plan for this TP size; then
 * launches the ranks (--tp N from a single process) or joins the job.  A
 * single process reports what it finds before any rank starts; ranks agree
 * on failures so that one found by all is printed once, by rank 0.
 * 0: go on as this rank (or as the only process); 1: done, return *rc (the
 * ranks' exit status, or 2 for a usage error, 1 for another error, already
 * printed). */
int cli_tp_begin(const char *cmd, int argc, char **argv, const cli_option *o, int n, const char *dir,
                 cli_tp *tp, int *rc);
/* The same for a command with data parallelism: the job has
 * tp × dp_replicate × dp_shard ranks (a single process launches that many;
 * --tp absent: world size ÷ the dp sizes), and when a dp size exceeds 1
 * each rank builds tp->grid, the model's TP mesh being grid["tp"]
 * (cli_tp_mesh). */
int cli_tp_begin_dp(const char *cmd, int argc, char **argv, const cli_option *o, int n, const char *dir,
                    int dp_replicate, int dp_shard, cli_tp *tp, int *rc);
/* The 1-D TP mesh of this rank: tp->mesh, or grid["tp"]; NULL on one rank. */
const tp_mesh *cli_tp_mesh(const cli_tp *tp);
void cli_tp_end(cli_tp *tp);
/* Called by every rank at the same point after a step that all ranks do
 * alike (failed: this rank's step failed, message in tp_error()).  An error
 * of every rank is printed once, by rank 0, without a rank; an error of
 * some ranks by each of them, with "[rank r]".  0 when no rank failed; 1
 * when some did (reported; every rank returns 1, so all stop). */
int cli_tp_agree(const char *cmd, cli_tp *tp, int failed);
/* The thread pool of this rank: --threads T (default: the cores this
 * process may use ÷ LOCAL_WORLD_SIZE, at least 1), pinned so that local
 * rank r takes cores [r·T, (r+1)·T) mod ncores (TENSORPAR_PIN=0: unpinned).
 * Asking for more threads than cores works, with a warning.  Fills mo's
 * settings from the environment (tp_model_options_from_env: pin_threads,
 * fuse_norm, kernels), then --matmul where the command has it, mo->threads
 * and mo->first_cpu; -1 on a bad --threads or setting. */
int cli_tp_threads(const cli_option *o, int n, const cli_tp *tp, tp_model_options *mo);
/* 0 when TENSORPAR_PIN=0 asks for ranks and threads to stay unpinned. */
int cli_pin_wanted(void);

/* A tp_choose_callback: every rank takes rank 0's token. */
tp_status cli_tp_choose(void *ctx, int64_t *id);

/* --matmul exact|bf16 for the inference commands (logits, generate, chat,
 * bench forward/decode/model): tp_kernel_options.bf16_dot, which
 * cli_tp_threads sets; absent, TENSORPAR_BF16_DOT decides.  The training
 * commands leave it to TENSORPAR_BF16_DOT. */
#define CLI_MATMUL_OPTION                                                                                           \
    {"--matmul", "exact|bf16",                                                                                     \
     "bf16 weights: exact (default; f32 products) or bf16 (activations rounded to bf16, as llama.cpp and "         \
     "PyTorch: ~2x the prefill rate with AVX512_BF16, logits ~1e-2 off; emulated elsewhere, not faster); "          \
     "unset: TENSORPAR_BF16_DOT",                                                                                   \
     0,                                                                                                             \
     {0}}

/* --adapter DIR and --merge-adapter (cli_adapter.c). */
#define CLI_ADAPTER_N_OPTIONS 2
extern const cli_option cli_adapter_options[CLI_ADAPTER_N_OPTIONS];
/* Loads the adapter the options name onto m, if any; -1 with tp_error(). */
int cli_adapter_load(const cli_option *o, int n, tp_model *m);

#endif
