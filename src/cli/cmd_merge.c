/* tensorpar merge: a base model with a PEFT LoRA adapter folded into its
 * weights, written as a Hugging Face model directory (what PEFT's
 * merge_and_unload followed by save_pretrained gives).  With --tp N each
 * rank merges its own shards and the collective save writes the TP = 1
 * bytes. */
#include "tp_cli.h"
#include "tensorpar/api.h"
#include "tensorpar/lora.h"
#include "tensorpar/models.h"

#include <string.h>
#include <unistd.h>

#define N_OWN 4

int cmd_merge(int argc, char **argv)
{
    cli_option o[N_OWN + CLI_TP_N_OPTIONS] = {
        {"--model", "DIR", "base model directory (required)", 0, {0}},
        {"--adapter", "DIR", "PEFT LoRA adapter directory (required)", 0, {0}},
        {"--out", "DIR", "where the merged model goes (replaced atomically; required)", 0, {0}},
        {"--threads", "N", "threads per rank (default: cores / local ranks)", 0, {0}},
    };
    memcpy(o + N_OWN, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n, "tensorpar merge --model DIR --adapter DIR --out DIR [--tp N]",
                       "Folds a LoRA adapter into the model's weights and saves the merged model.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir = cli_value(o, n, "--model"), *adapter = cli_value(o, n, "--adapter");
    const char *out = cli_value(o, n, "--out");
    if (!dir || !adapter || !out) {
        tp_fail(TP_ERR_INVALID, "--model, --adapter and --out are required (see --help)");
        return cli_usage_error("merge");
    }
    /* merged in f32, saved in the checkpoint's dtype */
    tp_model_options mo = {.weight_dtype = TP_F32, .threads = 1, .show_progress = isatty(2)};
    cli_tp tp;
    if (cli_tp_begin("merge", argc, argv, o, n, dir, &tp, &rc)) { cli_tp_end(&tp); return rc; }
    if (cli_tp_threads(o, n, &tp, &mo)) { cli_tp_end(&tp); return cli_report("merge"); }
    mo.show_progress = mo.show_progress && tp.rank == 0;
    tp_dist_config dc = {.tp_size = tp.size, .tp_plan = tp.plan, .world = tp.world, .model = &mo,
                         .ep_size = tp.ep ? tp.size : 0};
    tp_model *m;
    tp_status s = tp_model_from_pretrained(&m, dir, TP_F32, &dc);
    if (!s) {
        s = tp_model_load_adapter(m, adapter, 1);
        if (!s) s = tp_model_save_ex(m, dir, out, NULL);
        tp_model_free(m);
    }
    cli_tp_end(&tp);
    return s ? cli_report("merge") : 0;
}
