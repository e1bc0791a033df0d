/* The activations a training forward keeps for its backward: one arena,
 * reserved once for T tokens from the config's (global, so widest) widths,
 * filled by the module forwards when tp_forward_pass.save is set, rewound
 * after the backward.  The arena is the model's (backward.c's tp_train_ws)
 * and outlives the step: fresh pages cost a page fault and the kernel's
 * zeroing each, over a gigabyte a step at 0.6B parameters.  The inference
 * forward never touches it. */
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

/* The allocations of one layer (every field of tp_saved_layer that holds
 * data), for the alignment slack. */
#define ALLOCS_PER_LAYER 20

static size_t bound_floats(const tp_model *m, int64_t T)
{
    const tp_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, D = c->head_dim, nq = c->num_attention_heads, nkv = c->num_key_value_heads;
    int64_t I = c->llama4 && c->intermediate_size_mlp > c->intermediate_size ? c->intermediate_size_mlp
                                                                             : c->intermediate_size;
    int64_t layer = 4 * H + (nq + 2 * nkv) * D + nq * D + nq + 3 * I;
    if (c->qk_norm || c->llama4) layer += (nq + nkv) * D;   /* q, k before their norms */
    if (c->mla) {
        /* padded q, k, v and the kernel's output, o_proj's input, lse, the
         * two latents before and after their norms (module_mla.c) */
        int64_t Dp = tp_mla_head_dim(c);
        layer += 4 * nq * Dp + nq * c->v_head_dim + nq + 2 * (c->q_lora_rank + c->kv_lora_rank);
    }
    /* Gradient checkpointing keeps each layer's input and one layer's
     * working set (module_container.c). */
    if (m->gradient_checkpointing) return (size_t)(T * (2 * H * c->num_hidden_layers + layer + 2 * H + D));
    return (size_t)(T * (layer * c->num_hidden_layers + 2 * H + D));
}

tp_status tp_train_acts_init(tp_train_acts *s, const tp_model *m, int64_t T, tp_arena *arena)
{
    memset(s, 0, sizeof *s);
    tp_arena_rewind(arena, 0);
    s->arena = arena;
    s->T = T;
    s->layers = calloc((size_t)m->cfg.num_hidden_layers, sizeof *s->layers);
    if (!s->layers) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t allocs = (size_t)(ALLOCS_PER_LAYER * m->cfg.num_hidden_layers + 3);
    size_t bytes = bound_floats(m, T) * sizeof(float) + allocs * TP_ARENA_ALIGN;
    tp_status st = tp_arena_reserve(s->arena, bytes);
    return st ? tp_fail_context(st, "the saved activations of %lld tokens", (long long)T) : TP_OK;
}

void tp_train_acts_free(tp_train_acts *s)
{
    if (s->arena) tp_arena_rewind(s->arena, 0);
    free(s->layers);
    s->layers = NULL;
}

float *tp_train_save(tp_train_acts *s, const float *src, int64_t n)
{
    float *p = tp_arena_alloc(s->arena, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) {
        tp_fail(TP_ERR_NOMEM, "the saved activations outgrew their reservation");
        return NULL;
    }
    if (src) memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

void tp_train_norm_slots(const tp_model *m, const tp_module *norm, tp_train_acts *s, float ***x, float ***h)
{
    if (norm->layer < 0) { *x = &s->x_final; *h = &s->h_final; return; }
    tp_saved_layer *l = &s->layers[norm->layer];
    int idx = (int)(norm - m->modules);
    if (idx == m->layers[norm->layer].input_layernorm) { *x = &l->x_attn; *h = &l->h_attn; }
    else { *x = &l->x_mlp; *h = &l->h_mlp; }
}
