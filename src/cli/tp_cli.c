/* --tp N for the model commands: the first process re-launches itself as N
 * ranks (like torchrun) and waits; each rank joins the job's process group
 * and builds the 1-D tensor-parallel mesh.  A process that already is a
 * rank (started by `tensorpar launch`, torchrun-style variables or mpirun)
 * joins directly. */
#include "tp_cli.h"

#include "tensorpar/api.h"
#include "tensorpar/parallel.h"
#include "tensorpar/settings.h"

#include <stdlib.h>
#include <string.h>

const cli_option cli_tp_options[CLI_TP_N_OPTIONS] = {
    {"--tp", "N", "split the model over N ranks (tensor parallelism)", 0, {0}},
    {"--tp-plan", "auto|FILE", "TP plan: the model type's built-in plan (auto) or a JSON file", 0, {0}},
    {"--backend", "shm|mpi", "how ranks communicate (default shm on one host)", 0, {0}},
    {"--ep", NULL, "expert parallelism: split the experts of a MoE model over the --tp ranks (E/P whole experts "
                   "each; --tp-plan auto is then the model type's expert-parallel plan)", 0, {0}},
};

static int relaunch(int argc, char **argv, long long n, tp_backend backend, int *rc)
{
    char **full = calloc((size_t)argc + 2, sizeof *full);
    if (!full) { tp_fail(TP_ERR_NOMEM, "out of memory"); return -1; }
    full[0] = "tensorpar";
    for (int i = 0; i < argc; i++) full[i + 1] = argv[i];
    tp_comm_options co;
    tp_status s = tp_comm_options_from_env(&co);
    tp_launch_options lo = {.nprocs = (int)n, .backend = backend, .comm = &co};
    if (!s) s = tp_launch_self_ex(&lo, full, rc);
    free(full);
    return s ? -1 : 1;
}

/* Option values no rank could use: usage errors, found before any rank
 * starts (and so printed once). */
static int check_options(const char *cmd, const cli_option *o, int n, const char *dir, long long *want)
{
    tp_backend backend;
    const char *b = cli_value(o, n, "--backend");
    long long threads = 1;
    if (cli_int(o, n, "--tp", want) || (b && tp_backend_parse(b, &backend)) || cli_int(o, n, "--threads", &threads))
        return cli_usage_error(cmd);
    if (cli_value(o, n, "--tp") && *want < 1) {
        tp_fail(TP_ERR_INVALID, "--tp: Parallelism sizes must be >= 1, got %lld.", *want);   /* §5.2 */
        return cli_usage_error(cmd);
    }
    if (threads < 1 || threads > 4096) {
        tp_fail(TP_ERR_INVALID, "--threads must be in [1, 4096], got %lld", threads);
        return cli_usage_error(cmd);
    }
    return dir ? cli_check_dir(cmd, "--model", dir) : 0;
}

/* What every rank would find identically before reading a weight: the
 * config and the plan for this TP size.  -1 with tp_error(). */
static int check_model(const char *dir, long long size, const char *plan_spec, int ep)
{
    tp_model_config cfg;
    if (tp_config_load(&cfg, dir)) return -1;
    if (size <= 1 && !plan_spec) return 0;
    tp_plan plan = {0};
    tp_plan_resolution *res = NULL;
    tp_status s = tp_plan_load_mode(plan_spec, &cfg, ep && size > 1, &plan);
    if (!s) s = tp_plan_resolve(&cfg, &plan, (int)size, NULL, &res);
    tp_plan_free(&plan);
    tp_plan_resolution_free(res);
    return s ? -1 : 0;
}

/* The ranks of a job ran the same checks on the same files, so a failure is
 * normally everybody's (§5.3: plan and config errors are printed once, by
 * rank 0, without a rank).  A failure of only some ranks is printed by each
 * of them, with its rank.  The closing barrier keeps every rank alive until
 * the messages are out, so that a launcher stopping the job on the first
 * exit cannot cut them off.  0 when every rank passed; 1 otherwise. */
int cli_tp_agree(const char *cmd, cli_tp *tp, int failed)
{
    if (!tp->world) return failed ? (cli_report(cmd), 1) : 0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", tp_error());
    int64_t mine = failed, count = 0;
    if (tp_comm_all_reduce(tp->world, &mine, &count, 1, TP_I64, TP_REDUCE_SUM)) { cli_report(cmd); return 1; }
    if (!count) return 0;
    tp_fail(TP_ERR_INVALID, "%s", msg);
    if (count == tp->size && tp->rank == 0) cli_report_shared(cmd);
    else if (failed && count < tp->size) cli_report(cmd);
    fflush(stderr);
    tp_comm_barrier(tp->world);
    return 1;
}

/* The TP size of a job of `size` ranks with dp data-parallel replicas:
 * --tp (want > 0) or the rest of the world; -1 with the error naming the
 * three sizes and the world size when they do not multiply to it. */
static long long tp_size_of(long long want, const cli_tp *tp)
{
    int dp_replicate = tp->dp_replicate, dp_shard = tp->dp_shard, size = tp->size;
    long long dp = (long long)dp_replicate * dp_shard, t = want > 0 ? want : (size % dp ? 0 : size / dp);
    if (t * dp == size) return t;
    if (!tp->dp_ok)
        tp_fail(TP_ERR_INVALID, "--tp %lld but the job has %d ranks (WORLD_SIZE); data parallelism is not "
                "supported by this command", want, size);
    else   /* spec §9.4's message */
        tp_fail(TP_ERR_INVALID, "ParallelismConfig sizes multiply to %lld (dp_replicate=%d, dp_shard=%d, cp=1, "
                "tp=%lld), but WORLD_SIZE is %d.", (want > 0 ? want : 1) * dp, dp_replicate, dp_shard,
                want > 0 ? want : 1, size);
    return -1;
}

/* This rank's meshes: the 1-D TP mesh, or with data parallelism
 * ParallelismConfig's mesh ["dp_replicate", "dp_shard", "cp", "tp"] (cp 1),
 * row-major with tp fastest as torch's init_device_mesh (the TP groups are
 * runs of consecutive ranks), with the flattened "dp" group (api.h). */
static tp_status make_meshes(cli_tp *tp)
{
    if (tp->dp_replicate * tp->dp_shard == 1) return tp_mesh_new_1d(tp->world, "tp", &tp->mesh);
    tp_parallelism_config pc = {tp->dp_replicate, tp->dp_shard, 1, tp->tp_size};
    return tp_parallelism_config_mesh(&pc, tp->world, &tp->grid);
}

/* Joins the job this process is a rank of and runs the model checks on every
 * rank.  0, or 1 with *rc set. */
static int join(const char *cmd, long long want, const char *dir, cli_tp *tp, int *rc)
{
    tp_comm_options co;
    *rc = CLI_EXIT_RUNTIME;
    if (tp_comm_options_from_env(&co) || tp_comm_init(&tp->world, &co)) { cli_report(cmd); return 1; }
    tp->size = tp_group_size(tp->world);
    tp->rank = tp_group_rank(tp->world);
    long long t = tp_size_of(want, tp);
    int failed = t < 0;
    tp->tp_size = t > 0 ? (int)t : 1;
    if (!failed && dir) failed = check_model(dir, tp->tp_size, tp->plan, tp->ep) != 0;
    if (cli_tp_agree(cmd, tp, failed)) return 1;
    if (make_meshes(tp)) { cli_report(cmd); return 1; }
    return 0;
}

/* Both entry points: dp_ok says whether the command takes data parallelism. */
static int begin(const char *cmd, int argc, char **argv, const cli_option *o, int n, const char *dir,
                 int dp_replicate, int dp_shard, int dp_ok, cli_tp *tp, int *rc)
{
    memset(tp, 0, sizeof *tp);
    tp->size = 1;
    tp->tp_size = 1;
    tp->dp_replicate = dp_replicate;
    tp->dp_shard = dp_shard;
    tp->dp_ok = dp_ok;
    tp->plan = cli_value(o, n, "--tp-plan");
    tp->ep = cli_flag(o, n, "--ep");
    long long want = 0;
    if ((*rc = check_options(cmd, o, n, dir, &want))) return 1;
    if (tp_launch_in_job()) return join(cmd, want, dir, tp, rc);
    /* One process so far: what it finds wrong, it says once, and no rank
     * is started for nothing. */
    if (dir && check_model(dir, want > 1 ? want : 1, tp->plan, tp->ep)) { *rc = cli_report(cmd); return 1; }
    long long ranks = (want > 1 ? want : 1) * dp_replicate * dp_shard;
    if (ranks <= 1) return 0;
    tp_backend backend = TP_BACKEND_AUTO;
    const char *b = cli_value(o, n, "--backend");
    if (b) tp_backend_parse(b, &backend);   /* checked above */
    if (relaunch(argc, argv, ranks, backend, rc) < 0) { *rc = cli_report(cmd); return 1; }
    return 1;
}

int cli_tp_begin(const char *cmd, int argc, char **argv, const cli_option *o, int n, const char *dir,
                 cli_tp *tp, int *rc)
{
    return begin(cmd, argc, argv, o, n, dir, 1, 1, 0, tp, rc);
}

int cli_tp_begin_dp(const char *cmd, int argc, char **argv, const cli_option *o, int n, const char *dir,
                    int dp_replicate, int dp_shard, cli_tp *tp, int *rc)
{
    return begin(cmd, argc, argv, o, n, dir, dp_replicate, dp_shard, 1, tp, rc);
}

const tp_mesh *cli_tp_mesh(const cli_tp *tp)
{
    return tp->grid ? tp_mesh_sub(tp->grid, "tp") : tp->mesh;
}

void cli_tp_end(cli_tp *tp)
{
    tp_mesh_free(tp->mesh);
    tp_mesh_free(tp->grid);
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
    tp_model_options mo = {0};
    return tp_model_options_from_env(&mo) == TP_OK && mo.pin_threads;
}

int cli_tp_threads(const cli_option *o, int n, const cli_tp *tp, tp_model_options *mo)
{
    int cores = tp_cpu_count();
    int local_rank = tp->world ? tp_group_local_rank(tp->world) : 0;
    int local_size = tp->world ? tp_group_local_size(tp->world) : 1;
    if (local_size < 1) local_size = 1;
    long long threads = cores / local_size;
    if (threads < 1) threads = 1;
    if (tp_model_options_from_env(mo) || cli_int(o, n, "--threads", &threads)) return -1;
    const char *matmul = cli_value(o, n, "--matmul");   /* cli_parse allowed only exact|bf16 */
    if (matmul) mo->kernels.bf16_dot = strcmp(matmul, "bf16") ? TP_OFF : TP_ON;
    if (threads < 1 || threads > 4096) { tp_fail(TP_ERR_INVALID, "--threads must be in [1, 4096]"); return -1; }
    if (cli_value(o, n, "--threads") && threads * local_size > cores && local_rank == 0)
        tp_log(TP_LOG_WARN, "%d rank(s) x %lld threads = %lld threads on %d cores: oversubscribed, expect it to "
               "run slower than %d threads in all", local_size, threads, threads * local_size, cores, cores);
    mo->threads = (int)threads;
    mo->first_cpu = (int)((long long)local_rank * threads % cores);
    return 0;
}
