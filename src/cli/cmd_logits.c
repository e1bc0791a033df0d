/* tensorpar logits: one forward pass over given token ids, logits to .npy. */
#include "cli.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <unistd.h>

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

int cmd_logits(int argc, char **argv)
{
    cli_option o[] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--tokens", "IDS", "comma-separated token ids (required)", 0, {0}},
        {"--out", "FILE.npy", "output file: float32 [T, vocab] (required)", 0, {0}},
        {"--dtype", "f32|bf16", "weight dtype in memory (default: as stored)", 0, {0}},
        {"--threads", "N", "threads (default 1)", 0, {0}},
        {"--incremental", NULL, "feed tokens one at a time through the KV cache", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n, "tensorpar logits --model DIR --tokens 1,2,3 --out FILE.npy",
                       "Runs the model over the tokens and writes the logits of every position.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    const char *dir = cli_value(o, n, "--model"), *toks = cli_value(o, n, "--tokens"), *out = cli_value(o, n, "--out");
    if (!dir || !toks || !out) {
        fprintf(stderr, "tensorpar logits: error: --model, --tokens and --out are required (see --help)\n");
        return 2;
    }
    int64_t *ids;
    int nt;
    long long threads = 1;
    tp_model_options mo = {TP_DTYPE_COUNT, 1, isatty(2)};
    const char *dt = cli_value(o, n, "--dtype");
    if (cli_parse_ids(toks, &ids, &nt) || cli_int(o, n, "--threads", &threads) ||
        (dt && tp_dtype_parse(dt, &mo.weight_dtype)))
        return cli_report("logits");
    mo.threads = (int)threads;
    tp_model *m;
    if (tp_model_load(&m, dir, &mo)) { free(ids); return cli_report("logits"); }
    tp_kv_cache kv;
    float *logits = malloc((size_t)nt * (size_t)m->cfg.vocab_size * sizeof(float));
    tp_status s = logits ? tp_kv_cache_init(&kv, m, nt) : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) {
        s = cli_flag(o, n, "--incremental") ? forward_incremental(m, &kv, ids, nt, logits)
                                            : tp_model_forward(m, &kv, ids, nt, logits, 1);
        tp_kv_cache_release(&kv);
    }
    if (!s) {
        int64_t shape[2] = {nt, m->cfg.vocab_size};
        s = tp_npy_write_f32(out, logits, 2, shape);
    }
    free(logits);
    free(ids);
    tp_model_free(m);
    return s ? cli_report("logits") : 0;
}
