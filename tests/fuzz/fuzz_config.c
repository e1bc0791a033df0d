/* libFuzzer harness: config.json.  Each input is a model folder's
 * config.json; a config that loads must survive tp_config_save and load
 * again with the same shape-defining fields (what the model is built from). */
#include "fuzz_util.h"
#include "tensorpar/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int same_shape(const tp_model_config *a, const tp_model_config *b)
{
    return a->arch == b->arch && a->hidden_size == b->hidden_size
        && a->intermediate_size == b->intermediate_size && a->num_hidden_layers == b->num_hidden_layers
        && a->num_attention_heads == b->num_attention_heads
        && a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim
        && a->vocab_size == b->vocab_size && a->max_position_embeddings == b->max_position_embeddings
        && a->tie_word_embeddings == b->tie_word_embeddings && a->qk_norm == b->qk_norm
        && a->qkv_bias == b->qkv_bias && a->attention_bias == b->attention_bias
        && a->rope_scaling.kind == b->rope_scaling.kind && a->sliding_window == b->sliding_window;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_write("config.json", data, size);
    tp_model_config cfg, again;
    if (tp_config_load(&cfg, fuzz_scratch_dir()) == TP_OK) {
        if (tp_config_save(&cfg, fuzz_scratch_dir()) != TP_OK) abort();
        if (tp_config_load(&again, fuzz_scratch_dir()) != TP_OK) {
            fprintf(stderr, "a saved config does not load again: %s\n", tp_error());
            abort();
        }
        if (!same_shape(&cfg, &again)) {
            fprintf(stderr, "a saved config loads with a different shape\n");
            abort();
        }
    }
    free(path);
    return 0;
}
