/* libFuzzer harness: generation_config.json, read beside a fixed valid
 * config.json (the model's bos/eos are its defaults). */
#include "fuzz_util.h"
#include "tensorpar/io.h"
#include "tensorpar/text.h"

#include <stdlib.h>
#include <string.h>

static const char CONFIG[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 512, \"bos_token_id\": 1, \"eos_token_id\": [2, 3]}";

static tp_model_config cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    free(fuzz_write("config.json", (const uint8_t *)CONFIG, strlen(CONFIG)));
    if (tp_config_load(&cfg, fuzz_scratch_dir()) != TP_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_write("generation_config.json", data, size);
    tp_generation_config g;
    if (tp_generation_config_load(&g, fuzz_scratch_dir(), size % 2 ? &cfg : NULL) == TP_OK) {
        if (g.n_eos < 0 || g.n_eos > TP_MAX_EOS) abort();
        tp_sampling sp;
        tp_sampling_defaults(&sp);
        sp.do_sample = g.do_sample;
        sp.temperature = g.temperature;
        sp.top_k = g.top_k;
        sp.top_p = g.top_p;
        sp.min_p = g.min_p;
        sp.repetition_penalty = g.repetition_penalty;
        tp_sampling_validate(&sp);
    }
    free(path);
    return 0;
}
