/* --tp N for the model commands: the first process re-launches itself as N
 * ranks (like torchrun) and waits; each rank joins the job's process group
 * and builds the 1-D tensor-parallel mesh.  A process that already is a
 * rank (started by `tensorpar launch`, torchrun-style variables or mpirun)
 * joins directly. */
#include "tp_cli.h"

#include <stdlib.h>
#include <string.h>

const cli_option cli_tp_options[CLI_TP_N_OPTIONS] = {
    {"--tp", "N", "split the model over N ranks (tensor parallelism)", 0, {0}},
    {"--tp-plan", "auto|FILE", "TP plan: the model type's built-in plan (auto) or a JSON file", 0, {0}},
    {"--backend", "shm|mpi", "how ranks communicate (default shm on one host)", 0, {0}},
};

static int relaunch(int argc, char **argv, long long n, tp_backend backend, int *rc)
{
    char **full = calloc((size_t)argc + 2, sizeof *full);
    if (!full) { tp_fail(TP_ERR_NOMEM, "out of memory"); return -1; }
    full[0] = "tensorpar";
    for (int i = 0; i < argc; i++) full[i + 1] = argv[i];
    tp_status s = tp_launch_self((int)n, backend, full, rc);
    free(full);
    return s ? -1 : 1;
}

int cli_tp_begin(int argc, char **argv, const cli_option *o, int n, cli_tp *tp, int *rc)
{
    memset(tp, 0, sizeof *tp);
    tp->size = 1;
    tp->plan = cli_value(o, n, "--tp-plan");
    long long want = 0;
    tp_backend backend = TP_BACKEND_AUTO;
    const char *b = cli_value(o, n, "--backend");
    if (cli_int(o, n, "--tp", &want) || (b && tp_backend_parse(b, &backend))) return -1;
    if (cli_value(o, n, "--tp") && want < 1) { tp_fail(TP_ERR_INVALID, "--tp must be at least 1"); return -1; }
    int in_job = tp_launch_in_job();
    if (!in_job && want > 1) return relaunch(argc, argv, want, backend, rc);
    if (!in_job) return 0;
    tp_comm_options co;
    tp_comm_options_default(&co);
    if (tp_comm_init(&tp->world, &co)) return -1;
    tp->size = tp_group_size(tp->world);
    tp->rank = tp_group_rank(tp->world);
    if (want > 0 && want != tp->size) {
        tp_fail(TP_ERR_INVALID, "--tp %lld but the job has %d ranks (WORLD_SIZE); data parallelism is not "
                "supported by this command", want, tp->size);
        return -1;
    }
    return tp_mesh_new_1d(tp->world, "tp", &tp->mesh) ? -1 : 0;
}

void cli_tp_end(cli_tp *tp)
{
    tp_mesh_free(tp->mesh);
    tp_group_free(tp->world);
    memset(tp, 0, sizeof *tp);
}

tp_status cli_tp_choose(void *ctx, int64_t *id)
{
    cli_tp *tp = ctx;
    return tp_comm_broadcast(tp->world, id, 1, TP_I64, 0);
}

int cli_pin_wanted(void)
{
    const char *pin = getenv("TENSORPAR_PIN");
    return !(pin && !strcmp(pin, "0"));
}

int cli_tp_threads(const cli_option *o, int n, const cli_tp *tp, tp_model_options *mo)
{
    int cores = tp_cpu_count();
    int local_rank = tp->world ? tp_group_local_rank(tp->world) : 0;
    int local_size = tp->world ? tp_group_local_size(tp->world) : 1;
    if (local_size < 1) local_size = 1;
    long long threads = cores / local_size;
    if (threads < 1) threads = 1;
    if (cli_int(o, n, "--threads", &threads)) return -1;
    if (threads < 1 || threads > 4096) { tp_fail(TP_ERR_INVALID, "--threads must be in [1, 4096]"); return -1; }
    if (cli_value(o, n, "--threads") && threads * local_size > cores && local_rank == 0)
        tp_log(TP_LOG_WARN, "%d rank(s) x %lld threads = %lld threads on %d cores: oversubscribed, expect it to "
               "run slower than %d threads in all", local_size, threads, threads * local_size, cores, cores);
    mo->threads = (int)threads;
    mo->pin_threads = cli_pin_wanted();
    mo->first_cpu = (int)((long long)local_rank * threads % cores);
    return 0;
}
