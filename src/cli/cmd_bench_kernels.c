/* tensorpar bench kernels: the kernel micro-benchmarks (tp_kernel_bench) on
 * the process's instruction-set path: the compute peak and read bandwidth,
 * GEMM GFLOP/s at a model's prefill shapes (qwen3-0.6b unless --shapes
 * names another preset), GEMV GB/s for decode, and the training GEMMs
 * (forward, dx, dW) next to OpenBLAS. */
#include "cli.h"
#include "tensorpar/kernels.h"
#include "tensorpar/models.h"

#include <string.h>

/* The Linear widths of a make-model preset; the qwen3 presets under qwen3,
 * the others under llama (tiny and small are alike under both). */
static int preset_dims(const char *name, tp_model_config *cfg, tp_bench_dims *d)
{
    tp_arch arch = strncmp(name, "qwen3", 5) == 0 ? TP_ARCH_QWEN3 : TP_ARCH_LLAMA;
    if (tp_preset_config(cfg, arch, name)) return -1;
    *d = (tp_bench_dims){name, cfg->hidden_size, cfg->num_attention_heads * cfg->head_dim,
                         cfg->num_key_value_heads * cfg->head_dim, cfg->intermediate_size, cfg->vocab_size};
    return 0;
}

/* --moe: the grouped expert kernel against the dense GEMM at the expert
 * shapes of a qwen3_moe or mixtral preset (default qwen3-30b-a3b). */
static int bench_moe(const char *shapes, long long seq, tp_threadpool *pool, int quick)
{
    tp_model_config cfg;
    const char *name = shapes ? shapes : "qwen3-30b-a3b";
    tp_arch arch = strncmp(name, "mixtral", 7) == 0 ? TP_ARCH_MIXTRAL : TP_ARCH_QWEN3_MOE;
    if (tp_preset_config(&cfg, arch, name)) return cli_report("bench kernels");
    tp_bench_moe_dims d = {name, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts,
                           cfg.num_experts_per_tok, quick > 1 && seq > 32 ? 32 : seq};
    tp_bench_moe_result r;
    return tp_kernel_bench_moe(stdout, pool, quick, &d, &r) ? cli_report("bench kernels") : 0;
}

int cmd_bench_kernels(int argc, char **argv)
{
    cli_option o[] = {
        {"--threads", "N", "threads of the pool (default 2)", 0, {0}},
        {"--shapes", "PRESET", "the Linear shapes of this make-model preset (default qwen3-0.6b; llama-3.2-1b, ...)",
         0, {0}},
        {"--quick", NULL, "fewer repetitions (~1 minute on 2 cores)", 0, {0}},
        {"--smoke", NULL, "one repetition, small buffers, no lm_head shapes: proves it runs, figures mean nothing",
         0, {0}},
        {"--moe", NULL, "only the MoE experts: grouped kernel vs dense GEMM, then a decode in the stacked vs the "
         "[in, out] expert layout (--shapes: a qwen3_moe/mixtral preset, default qwen3-30b-a3b)", 0, {0}},
        {"--seq", "N", "--moe: tokens of the prefill (default 512)", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n,
                       "tensorpar bench kernels [--threads N] [--shapes PRESET] [--moe [--seq N]] [--quick|--smoke]",
                       "Measures the kernels on the path TENSORPAR_ISA (or the CPU) gives; prints which.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    long long threads = 2, seq = 512;
    if (cli_int(o, n, "--threads", &threads) || cli_int(o, n, "--seq", &seq)) return cli_report("bench kernels");
    if (seq < 1) {
        fprintf(stderr, "tensorpar bench kernels: error: --seq must be >= 1\n");
        return 2;
    }
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "tensorpar bench kernels: error: --threads must be 1..1024\n");
        return 2;
    }
    const char *shapes = cli_value(o, n, "--shapes");
    int quick = cli_flag(o, n, "--smoke") ? 2 : cli_flag(o, n, "--quick");
    int moe = cli_flag(o, n, "--moe");
    tp_model_config cfg;
    tp_bench_dims dims = tp_bench_dims_qwen3_06b;
    if (!moe && shapes && preset_dims(shapes, &cfg, &dims)) {
        fprintf(stderr, "tensorpar bench kernels: error: --shapes: %s\n", tp_error());
        return 2;
    }
    tp_threadpool *pool = NULL;
    if (tp_threadpool_create(&pool, (int)threads)) return cli_report("bench kernels");
    /* Threads pinned one to a core, as a rank's are: a thread that the
     * scheduler moves mid-run measures neither the core nor the kernel. */
    if (tp_threadpool_pin(pool, 0)) fprintf(stderr, "tensorpar bench kernels: threads not pinned: %s\n", tp_error());
    if (moe) {
        rc = bench_moe(shapes, seq, pool, quick);
        tp_threadpool_destroy(pool);
        return rc;
    }
    tp_status st = tp_kernel_bench_dims(stdout, pool, quick, &dims);
    tp_threadpool_destroy(pool);
    return st ? cli_report("bench kernels") : 0;
}
