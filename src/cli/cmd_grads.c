/* tensorpar grads: one forward and backward of Hugging Face's causal-LM
 * loss on one sequence; every parameter's gradient (HF names and shapes,
 * f32) and the loss to a .safetensors file, for comparison with another
 * implementation. */
#include "tp_cli.h"
#include "tensorpar/io.h"
#include "tensorpar/models.h"
#include "tensorpar/module.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_OWN 5

/* The parameters a checkpoint holds (a tied one is its owner's), each with
 * its gradient; the names point into `names`. */
static tp_status write_grads(const tp_model *m, double loss, const char *out)
{
    size_t n = tp_model_module_count(m), k = 0;
    tp_st_entry *e = calloc(n * TP_MODULE_MAX_PARAMS + 1, sizeof *e);
    char (*names)[128] = calloc(n * TP_MODULE_MAX_PARAMS, sizeof *names);
    float lossf = (float)loss;
    tp_status s = e && names ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < n; i++) {
        const tp_module *mod = tp_model_module_at(m, i);
        for (int j = 0; j < mod->n_params; j++) {
            const tp_module_param *p = &mod->params[j];
            if (p->tied_to >= 0 || !p->grad.data) continue;
            snprintf(names[k], sizeof names[k], "%s.%s", mod->name, p->suffix);
            e[k] = (tp_st_entry){names[k], TP_F32, p->ndim, p->shape, p->grad.data};
            k++;
        }
    }
    e[k++] = (tp_st_entry){"loss", TP_F32, 0, NULL, &lossf};
    if (!s) s = tp_safetensors_write(out, e, k, NULL, 0);
    free(e);
    free(names);
    return s;
}

static tp_status run(tp_model *m, const int64_t *ids, int nt, const char *out)
{
    double sum = 0;
    int64_t counted = 0;
    tp_status s = tp_model_zero_grad(m);
    if (!s) s = tp_model_forward_backward(m, ids, NULL, nt, 0, &sum, &counted);
    if (!s) s = write_grads(m, sum / (double)counted, out);
    return s;
}

/* The backward runs on one rank for now: --tp N > 1 is refused before any
 * rank starts. */
static int tp_refused(const cli_option *o, int n)
{
    const char *v = cli_value(o, n, "--tp");
    if (!v || atoi(v) <= 1) return 0;
    tp_fail(TP_ERR_UNSUPPORTED, "--tp %s: gradients are computed on one rank for now (the styles' backward hooks "
            "are not wired into the model's backward yet); run without --tp", v);
    return 1;
}

int cmd_grads(int argc, char **argv)
{
    cli_option o[N_OWN + CLI_TP_N_OPTIONS] = {
        {"--model", "DIR", "model directory (required)", 0, {0}},
        {"--tokens", "IDS", "comma-separated token ids, at least two (required)", 0, {0}},
        {"--out", "FILE.safetensors", "output: every parameter's gradient (f32, HF names) and `loss` (required)", 0, {0}},
        {"--dtype", "f32|bf16", "weight dtype in memory (default: as stored; f16 checkpoints are converted to f32)", 0, {0}},
        {"--threads", "N", "threads per rank (default: cores / local ranks)", 0, {0}},
    };
    memcpy(o + N_OWN, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n, "tensorpar grads --model DIR --tokens 1,2,3 --out FILE.safetensors",
                       "One forward and backward of the causal-LM loss (labels = the tokens, shifted inside); "
                       "writes every parameter's gradient and the loss.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir = cli_value(o, n, "--model"), *toks = cli_value(o, n, "--tokens"), *out = cli_value(o, n, "--out");
    if (!dir || !toks || !out) {
        tp_fail(TP_ERR_INVALID, "--model, --tokens and --out are required (see --help)");
        return cli_usage_error("grads");
    }
    if (tp_refused(o, n)) return cli_usage_error("grads");
    int64_t *ids;
    int nt;
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .show_progress = isatty(2)};
    const char *dt = cli_value(o, n, "--dtype");
    if (cli_parse_ids(toks, &ids, &nt) || (dt && tp_dtype_parse(dt, &mo.weight_dtype)))
        return cli_usage_error("grads");
    if (nt < 2) {
        free(ids);
        tp_fail(TP_ERR_INVALID, "--tokens: the causal-LM loss needs at least two tokens");
        return cli_usage_error("grads");
    }
    cli_tp tp;
    if (cli_tp_begin("grads", argc, argv, o, n, dir, &tp, &rc)) { free(ids); cli_tp_end(&tp); return rc; }
    if (cli_tp_threads(o, n, &tp, &mo)) { free(ids); cli_tp_end(&tp); return cli_report("grads"); }
    mo.mesh = tp.mesh;
    mo.tp_plan = tp.plan;
    tp_model *m;
    tp_status s = tp_model_load(&m, dir, &mo);
    if (!s) {
        s = run(m, ids, nt, out);
        tp_model_free(m);
    }
    free(ids);
    cli_tp_end(&tp);
    return s ? cli_report("grads") : 0;
}
