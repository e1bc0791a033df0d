/* tensorpar bench <what>: speed measurements, one sub-command per subject. */
#include "cli.h"

#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} bench;

static const bench benches[] = {
    {"comm", cmd_bench_comm, "latency and bandwidth of the collectives (shm and mpi side by side)"},
    {"tokenize", cmd_bench_tokenize, "tokenizer load time and encoding throughput"},
    {"load", cmd_bench_load, "per-rank load time, bytes read and peak memory, TP=1 against TP=N"},
    {"forward", cmd_bench_forward, "one prefill forward pass, TP=1 against TP=N"},
    {"decode", cmd_bench_decode, "decode tokens/s and weight bytes/s, TP=1 against TP=N"},
    {"model", cmd_bench_model, "one prefill or decode configuration (TP size, threads, dtype) on its own"},
    {"kernels", cmd_bench_kernels, "the kernels on this CPU's (or TENSORPAR_ISA's) path: peaks, GEMM, GEMV"},
    {"all", cmd_bench_all, "machine limits, then the model: the speed targets' ratios and a chart"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tensorpar bench <what> [options]\n\nwhat:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].summary);
    fprintf(f, "\n'tensorpar bench <what> --help' describes the options.\n\n%s", CLI_EXIT_HELP);
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return CLI_EXIT_USAGE; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) { usage(stdout); return 0; }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tensorpar bench: unknown subject '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
