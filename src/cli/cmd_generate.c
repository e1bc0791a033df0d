/* tensorpar generate: greedy decoding from token ids, new ids as JSON. */
#include "cli.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <unistd.h>

static int64_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

static int is_eos(const tp_generation_config *g, int64_t id)
{
    for (int i = 0; i < g->n_eos; i++) if (g->eos_token_ids[i] == id) return 1;
    return 0;
}

/* Prefill the prompt, then one token at a time; stops after an eos id. */
static tp_status generate(tp_model *m, const tp_generation_config *g, const int64_t *prompt, int np,
                          int64_t max_new, int64_t *out, int64_t *n_out)
{
    tp_kv_cache kv;
    tp_status s = tp_kv_cache_init(&kv, m, np + max_new);
    if (s) return s;
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    if (!logits) { tp_kv_cache_release(&kv); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    *n_out = 0;
    s = tp_model_forward(m, &kv, prompt, np, logits, 0);
    while (!s && *n_out < max_new) {
        int64_t next = argmax(logits, m->cfg.vocab_size);
        out[(*n_out)++] = next;
        if (is_eos(g, next) || *n_out == max_new) break;
        s = tp_model_forward(m, &kv, &next, 1, logits, 0);
    }
    free(logits);
    tp_kv_cache_release(&kv);
    return s;
}

int cmd_generate(int argc, char **argv)
{
    cli_option o[] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--tokens", "IDS", "comma-separated prompt token ids (required)", 0, {0}},
        {"--max-new-tokens", "N", "tokens to generate (default 32)", 0, {0}},
        {"--dtype", "f32|bf16", "weight dtype in memory (default: as stored)", 0, {0}},
        {"--threads", "N", "threads (default 1)", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n, "tensorpar generate --model DIR --tokens 1,2,3 [--max-new-tokens N]",
                       "Decodes greedily and prints the new token ids as a JSON array.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    const char *dir = cli_value(o, n, "--model"), *toks = cli_value(o, n, "--tokens");
    if (!dir || !toks) {
        fprintf(stderr, "tensorpar generate: error: --model and --tokens are required (see --help)\n");
        return 2;
    }
    int64_t *ids;
    int np;
    long long max_new = 32, threads = 1;
    tp_model_options mo = {TP_DTYPE_COUNT, 1, isatty(2)};
    const char *dt = cli_value(o, n, "--dtype");
    if (cli_parse_ids(toks, &ids, &np) || cli_int(o, n, "--max-new-tokens", &max_new) ||
        cli_int(o, n, "--threads", &threads) || (dt && tp_dtype_parse(dt, &mo.weight_dtype)))
        return cli_report("generate");
    if (max_new < 0) { free(ids); fprintf(stderr, "tensorpar generate: error: --max-new-tokens must be >= 0\n"); return 2; }
    mo.threads = (int)threads;
    tp_model *m;
    if (tp_model_load(&m, dir, &mo)) { free(ids); return cli_report("generate"); }
    tp_generation_config g;
    int64_t *out = malloc(((size_t)max_new + 1) * sizeof(int64_t)), n_out = 0;
    tp_status s = out ? tp_generation_config_load(&g, dir, &m->cfg) : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s && max_new > 0) s = generate(m, &g, ids, np, max_new, out, &n_out);
    if (!s) {
        printf("[");
        for (int64_t i = 0; i < n_out; i++) printf("%s%lld", i ? ", " : "", (long long)out[i]);
        printf("]\n");
    }
    free(out);
    free(ids);
    tp_model_free(m);
    return s ? cli_report("generate") : 0;
}
