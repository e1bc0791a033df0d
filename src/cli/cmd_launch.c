/* tensorpar launch: run any program as N ranks, like torchrun. */
#include "cli.h"
#include "tensorpar/comm.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int cmd_launch(int argc, char **argv)
{
    cli_option opts[] = {
        {"-n", "N", "number of ranks (processes) to start", 0, {0}},
        {"--backend", "NAME", "shm (default: shared memory, one host) or mpi (runs mpirun)", 0, {0}},
        {"--hostfile", "FILE", "mpirun's hostfile: start the ranks on these hosts (implies --backend mpi)", 0, {0}},
        {"--kill-grace", "SECONDS", "after a failure, SIGTERM waits this long before SIGKILL (default 2)", 0, {0}},
    };
    int nopts = sizeof opts / sizeof opts[0];
    char **rest;
    int nrest;
    int rc = cli_parse(argc, argv, opts, nopts, "tensorpar launch -n N [--backend shm|mpi] [--hostfile FILE] -- PROGRAM [ARGS...]",
                       "Starts PROGRAM as N ranks with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
                       "TENSORPAR_RENDEZVOUS and TENSORPAR_BACKEND set.  When a rank fails, the others\n"
                       "are stopped; the exit status is that of the first failure.  With --backend mpi\n"
                       "it runs mpirun, which passes on the TENSORPAR_* variables set here; with\n"
                       "--hostfile the ranks run on the hosts it lists (see docs/multi-host.md).",
                       &rest, &nrest);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    long long n = 0;
    double grace = 0;
    if (cli_int(opts, nopts, "-n", &n) || cli_double(opts, nopts, "--kill-grace", &grace))
        return cli_usage_error("launch");
    if (n < 1 || n > 4096) {
        fprintf(stderr, "tensorpar launch: error: -n N (1 to 4096 ranks) is required\n");
        return 2;
    }
    if (!rest || nrest < 1) {
        fprintf(stderr, "tensorpar launch: error: no program given (tensorpar launch -n N -- PROGRAM ARGS)\n");
        return 2;
    }
    tp_launch_options lo = {.nprocs = (int)n, .backend = TP_BACKEND_SHM, .name = "tensorpar launch",
                            .kill_grace_s = grace};
    const char *b = cli_value(opts, nopts, "--backend");
    if (b && tp_backend_parse(b, &lo.backend)) return cli_usage_error("launch");
    lo.hostfile = cli_value(opts, nopts, "--hostfile");
    if (lo.hostfile && b && lo.backend != TP_BACKEND_MPI) {
        fprintf(stderr, "tensorpar launch: error: --hostfile needs --backend mpi: only mpirun starts ranks on "
                "other hosts\n");
        return 2;
    }
    if (lo.hostfile && access(lo.hostfile, R_OK)) {
        fprintf(stderr, "tensorpar launch: error: --hostfile %s: %s\n", lo.hostfile, strerror(errno));
        return 2;
    }
    if (lo.hostfile && !b) lo.backend = TP_BACKEND_MPI;
    if (lo.backend == TP_BACKEND_SELF || lo.backend == TP_BACKEND_AUTO) lo.backend = TP_BACKEND_SHM;
    /* The segment's sizes and the heartbeat limit, as the ranks will read
     * them (checked by main before any command). */
    tp_comm_options co;
    if (tp_comm_options_from_env(&co)) return cli_report("launch");
    lo.comm = &co;
    int code = 1;
    if (tp_launch(&lo, rest, &code)) return cli_report("launch");
    return code;
}
