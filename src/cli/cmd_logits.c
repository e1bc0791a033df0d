/* tensorpar logits: one forward pass over given token ids, logits to .npy. */
#include "tp_cli.h"
#include "tensorpar/api.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_OWN 8

/* Feeds the tokens one at a time through the KV cache (the decode path),
 * keeping each step's logits: must equal the full forward at every row. */
static tp_status forward_incremental(tp_model *m, tp_kv_cache *kv, const int64_t *ids, int n, float *logits)
{
    int64_t V = m->cfg.vocab_size;
    for (int t = 0; t < n; t++) {
        tp_status s = tp_model_forward(m, kv, ids + t, 1, logits + (size_t)t * (size_t)V, 1);
        if (s) return s;
    }
    return TP_OK;
}

/* "%r" in the output path stands for the rank: then every rank writes its
 * own copy (tests compare them bit for bit). */
static int per_rank_path(const char *out, int rank, char *buf, size_t cap)
{
    const char *at = strstr(out, "%r");
    if (!at) { snprintf(buf, cap, "%s", out); return 0; }
    snprintf(buf, cap, "%.*s%d%s", (int)(at - out), out, rank, at + 2);
    return 1;
}

static tp_status run(tp_model *m, const int64_t *ids, int nt, int incremental, const char *out, int writer)
{
    tp_kv_cache kv;
    float *logits = malloc((size_t)nt * (size_t)m->cfg.vocab_size * sizeof(float));
    tp_status s = logits ? tp_kv_cache_init(&kv, m, nt) : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) {
        s = incremental ? forward_incremental(m, &kv, ids, nt, logits) : tp_model_forward(m, &kv, ids, nt, logits, 1);
        tp_kv_cache_release(&kv);
    }
    if (!s && writer) {   /* every rank has the logits; rank 0 writes them once */
        int64_t shape[2] = {nt, m->cfg.vocab_size};
        s = tp_npy_write_f32(out, logits, 2, shape);
    }
    free(logits);
    return s;
}

int cmd_logits(int argc, char **argv)
{
    cli_option o[N_OWN + CLI_TP_N_OPTIONS + CLI_ADAPTER_N_OPTIONS] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--tokens", "IDS", "comma-separated token ids (required)", 0, {0}},
        {"--out", "FILE.npy", "output file: float32 [T, vocab] (required); %r = rank: every rank writes", 0, {0}},
        {"--dtype", "f32|bf16|q8_0|q4_0", "weight dtype in memory (default: as stored; f16 is converted to f32; q8_0/q4_0: 8-/4-bit Linear weights)", 0, {0}},
        CLI_MATMUL_OPTION,
        {"--threads", "N", "threads per rank (default: cores / local ranks)", 0, {0}},
        {"--incremental", NULL, "feed tokens one at a time through the KV cache", 0, {0}},
        {"--bytes-read", NULL, "print the checkpoint bytes each rank read (stderr)", 0, {0}},
    };
    memcpy(o + N_OWN, cli_tp_options, sizeof cli_tp_options);
    memcpy(o + N_OWN + CLI_TP_N_OPTIONS, cli_adapter_options, sizeof cli_adapter_options);
    int n = N_OWN + CLI_TP_N_OPTIONS + CLI_ADAPTER_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n, "tensorpar logits --model DIR --tokens 1,2,3 --out FILE.npy [--tp N]",
                       "Runs the model over the tokens and writes the logits of every position.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir, *out;
    int64_t *ids;
    int nt;
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .show_progress = isatty(2)};
    if ((rc = cli_model_tokens_out(o, n, "logits", &dir, &out, &ids, &nt, &mo.weight_dtype))) return rc;
    cli_tp tp;
    if (cli_tp_begin("logits", argc, argv, o, n, dir, &tp, &rc)) { free(ids); cli_tp_end(&tp); return rc; }
    if (cli_tp_threads(o, n, &tp, &mo)) { free(ids); cli_tp_end(&tp); return cli_report("logits"); }
    mo.show_progress = mo.show_progress && tp.rank == 0;   /* one bar, not one per rank */
    tp_dist_config dc = {.tp_size = tp.size, .tp_plan = tp.plan, .world = tp.world, .model = &mo,
                         .ep_size = tp.ep ? tp.size : 0};
    tp_model *m;
    tp_status s = tp_model_from_pretrained(&m, dir, mo.weight_dtype, &dc);
    if (!s && cli_adapter_load(o, n, m)) {
        s = TP_ERR_INVALID;
        tp_model_free(m);
    } else if (!s) {
        if (cli_flag(o, n, "--bytes-read"))
            fprintf(stderr, "rank %d read %llu bytes\n", tp.rank, (unsigned long long)tp_model_bytes_read(m));
        char path[4096];
        int every_rank = per_rank_path(out, tp.rank, path, sizeof path);
        s = run(m, ids, nt, cli_flag(o, n, "--incremental"), path, every_rank || tp.rank == 0);
        tp_model_free(m);
    }
    free(ids);
    cli_tp_end(&tp);
    return s ? cli_report("logits") : 0;
}
