/* --adapter DIR and --merge-adapter, for the commands that run a model
 * (logits, generate, chat): a PEFT LoRA adapter on the loaded model. */
#include "tp_cli.h"

#include "tensorpar/lora.h"

const cli_option cli_adapter_options[CLI_ADAPTER_N_OPTIONS] = {
    {"--adapter", "DIR", "a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) on the model", 0, {0}},
    {"--merge-adapter", NULL, "fold the adapter into the weights at load (f32 weights; no cost per token)", 0, {0}},
};

int cli_adapter_load(const cli_option *o, int n, tp_model *m)
{
    const char *dir = cli_value(o, n, "--adapter");
    int merge = cli_flag(o, n, "--merge-adapter");
    if (!dir && merge) {
        tp_fail(TP_ERR_INVALID, "--merge-adapter needs --adapter DIR");
        return -1;
    }
    return dir && tp_model_load_adapter(m, dir, merge) ? -1 : 0;
}
