/* tensorpar make-model: write a random-weight Hugging Face model directory. */
#include "cli.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <string.h>

int cmd_make_model(int argc, char **argv)
{
    cli_option o[] = {
        {"--arch", "ARCH", "llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v2, deepseek_v3, llama4_text or "
                           "gpt_oss", 0, {0}},
        {"--preset", "NAME", "tiny, small, qwen3-0.6b, llama-3.2-1b, llama-3-8b, qwen3-30b-a3b, mixtral-8x7b, "
                             "deepseek-v2-lite, deepseek-v3, llama-4-scout, gpt-oss-20b "
                             "(default tiny)", 0, {0}},
        {"--set", "KEY=VALUE", "override a config.json key (JSON value); repeatable; the final config is "
                               "checked once, so the order does not matter", 0, {0}},
        {"--dtype", "f32|bf16", "stored weight dtype (default: the preset's)", 0, {0}},
        {"--seed", "N", "random seed (default 0)", 0, {0}},
        {"--std", "F", "weights ~ N(0, F) (default 0.02)", 0, {0}},
        {"--qk-std", "F", "q_proj/k_proj weights ~ N(0, F) (default: --std)", 0, {0}},
        {"--router-std", "F", "MoE router (mlp.gate) weights ~ N(0, F) (default: --std)", 0, {0}},
        {"--shards", "K", "write K shard files and model.safetensors.index.json", 0, {0}},
        {"--tokenizer", "FILE|DIR", "copy tokenizer files beside the weights; a larger vocabulary than the "
                                     "preset's becomes vocab_size, rounded up to a multiple of 128 (unless "
                                     "--set vocab_size=N)", 0, {0}},
        {"--out", "DIR", "output directory (required)", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n,
                       "tensorpar make-model --arch ARCH [--preset NAME] [--set k=v ...] [--dtype f32|bf16] --out DIR",
                       "Writes config.json, generation_config.json and model.safetensors (or shards) in\n"
                       "the layout Transformers writes, with random weights.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *arch_s = cli_value(o, n, "--arch"), *out = cli_value(o, n, "--out");
    if (!arch_s || !out) {
        tp_fail(TP_ERR_INVALID, "--arch and --out are required (see --help)");
        return cli_usage_error("make-model");
    }
    tp_arch arch;
    tp_model_config cfg;
    const char *preset = cli_value(o, n, "--preset");
    /* A wrong --arch, --preset or --set is a usage error: nothing written. */
    if (tp_arch_parse(arch_s, &arch) || tp_preset_config(&cfg, arch, preset ? preset : "tiny"))
        return cli_usage_error("make-model");
    const cli_option *set = &o[2];
    if (tp_config_set_all(&cfg, set->values, set->count)) return cli_usage_error("make-model");
    tp_make_options mo = {.dtype = cfg.dtype, .std = 0.02, .qk_std = -1, .router_std = 0,
                          .tokenizer = cli_value(o, n, "--tokenizer")};
    for (int i = 0; i < set->count; i++) mo.vocab_size_given |= !strncmp(set->values[i], "vocab_size=", 11);
    long long seed = 0, shards = 0;
    const char *dt = cli_value(o, n, "--dtype");
    if ((dt && tp_dtype_parse(dt, &mo.dtype)) || cli_int(o, n, "--seed", &seed) ||
        cli_int(o, n, "--shards", &shards) || cli_double(o, n, "--std", &mo.std) ||
        cli_double(o, n, "--qk-std", &mo.qk_std) || cli_double(o, n, "--router-std", &mo.router_std))
        return cli_usage_error("make-model");
    if (mo.qk_std < 0) mo.qk_std = mo.std;
    mo.seed = (uint64_t)seed;
    mo.shards = (int)shards;
    if (tp_make_model(&cfg, &mo, out)) return cli_report("make-model");
    return 0;
}
