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
 * its whole gradient (gathered from every rank: all ranks take part), and
 * the loss; rank 0 writes them. */
typedef struct {
    tp_st_entry *e;
    char (*names)[128];
    float **bufs;
    size_t n;
} grad_table;

static void grad_table_free(grad_table *g)
{
    for (size_t i = 0; g->bufs && i < g->n; i++) free(g->bufs[i]);
    free(g->bufs); free(g->e); free(g->names);
}

static tp_status gather_one(tp_model *m, const tp_module *mod, int j, grad_table *g)
{
    const tp_module_param *p = &mod->params[j];
    size_t k = g->n, numel = 1;
    for (int i = 0; i < p->ndim; i++) numel *= (size_t)p->shape[i];
    if (!(g->bufs[k] = malloc(numel * sizeof(float)))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    g->n++;
    snprintf(g->names[k], sizeof g->names[k], "%s.%s", mod->name, p->suffix);
    g->e[k] = (tp_st_entry){g->names[k], TP_F32, p->ndim, p->shape, g->bufs[k]};
    return tp_model_grad_full(m, mod, j, g->bufs[k]);
}

static tp_status write_grads(tp_model *m, double loss, const char *out, int writer)
{
    size_t n = tp_model_module_count(m) * TP_MODULE_MAX_PARAMS + 1;
    grad_table g = {calloc(n, sizeof *g.e), calloc(n, sizeof *g.names), calloc(n, sizeof *g.bufs), 0};
    float lossf = (float)loss;
    tp_status s = g.e && g.names && g.bufs ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < tp_model_module_count(m); i++) {
        const tp_module *mod = tp_model_module_at(m, i);
        for (int j = 0; !s && j < mod->n_params; j++)
            if (mod->params[j].tied_to < 0 && mod->params[j].grad.data) s = gather_one(m, mod, j, &g);
    }
    if (!s) {
        g.e[g.n] = (tp_st_entry){"loss", TP_F32, 0, NULL, &lossf};
        if (writer) s = tp_safetensors_write(out, g.e, g.n + 1, NULL, 0);
    }
    grad_table_free(&g);
    return s;
}

static tp_status run(tp_model *m, const int64_t *ids, int nt, const char *out, int writer)
{
    double sum = 0;
    int64_t counted = 0;
    tp_status s = tp_model_zero_grad(m);
    if (!s) s = tp_model_forward_backward(m, ids, NULL, nt, 0, &sum, &counted);
    if (!s) s = write_grads(m, sum / (double)counted, out, writer);
    return s;
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
    int rc = cli_parse(argc, argv, o, n, "tensorpar grads --model DIR --tokens 1,2,3 --out FILE.safetensors [--tp N]",
                       "One forward and backward of the causal-LM loss (labels = the tokens, shifted inside); "
                       "writes every parameter's whole gradient (gathered over the ranks) and the loss.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir, *out;
    int64_t *ids;
    int nt;
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .show_progress = isatty(2)};
    if ((rc = cli_model_tokens_out(o, n, "grads", &dir, &out, &ids, &nt, &mo.weight_dtype))) return rc;
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
    mo.expert_parallel = tp.ep && tp.size > 1;
    tp_model *m;
    tp_status s = tp_model_load(&m, dir, &mo);
    if (!s) {
        s = run(m, ids, nt, out, tp.rank == 0);
        tp_model_free(m);
    }
    free(ids);
    cli_tp_end(&tp);
    return s ? cli_report("grads") : 0;
}
