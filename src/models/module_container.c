/* Containers: the model ("model": embed_tokens, the decoder layers, the
 * final norm) and each decoder layer (input_layernorm, self_attn,
 * post_attention_layernorm, mlp) run their children in table order; the
 * forward pass state carries the residual stream between them.  Also the
 * map from a module type to its ops table. */
#include "tp_module.h"

#include <string.h>

/* tp_model.hooks' function `fn` on module c, if any. */
static tp_status hook(tp_model *m, tp_module_hook_fn fn, int c)
{
    return m->hooks && fn ? fn(m->hooks->ctx, m, c) : TP_OK;
}

tp_status tp_module_run_children(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    tp_status st = TP_OK;
    for (int c = mod->first_child; c >= 0 && !st; c = m->modules[c].next_sibling) {
        const tp_module *child = &m->modules[c];
        if (!child->ops || !child->ops->forward)
            return tp_fail(TP_ERR_UNSUPPORTED, "%s: modules of type %s have no forward yet", child->name,
                           tp_module_type_name(child->type));
        st = hook(m, m->hooks ? m->hooks->pre_forward : NULL, c);
        if (!st) st = child->ops->forward(m, child, f);
        if (!st) st = hook(m, m->hooks ? m->hooks->post_forward : NULL, c);
    }
    return st;
}

/* Children from `c` on, backward: the later ones first. */
static tp_status backward_from(tp_model *m, int c, tp_backward_pass *b)
{
    if (c < 0) return TP_OK;
    const tp_module *child = &m->modules[c];
    tp_status st = backward_from(m, child->next_sibling, b);
    if (st) return st;
    if (!child->ops || !child->ops->backward)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: modules of type %s have no backward yet", child->name,
                       tp_module_type_name(child->type));
    st = hook(m, m->hooks ? m->hooks->pre_backward : NULL, c);
    if (!st) st = child->ops->backward(m, child, b);
    if (!st) st = hook(m, m->hooks ? m->hooks->post_backward : NULL, c);
    return st;
}

tp_status tp_module_run_children_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    return backward_from(m, mod->first_child, b);
}

/* ---- gradient checkpointing (m->gradient_checkpointing) ----------------
 * A decoder layer's training forward keeps only what input_layernorm
 * saves (its input stream after the add, and its output): everything the
 * later children save is dropped when the layer ends.  Its backward first
 * recomputes them from that input (forward.c), runs the children's
 * backward, and drops them again, so the saved activations hold every
 * layer's input and one layer's working set. */

/* The layer's saved activations beyond its input forgotten (their arena
 * space is rewound by the caller). */
static void forget_layer(tp_saved_layer *l)
{
    float *x = l->x_attn, *h = l->h_attn;
    memset(l, 0, sizeof *l);
    l->x_attn = x;
    l->h_attn = h;
}

static tp_status layer_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    if (!f->save || !m->gradient_checkpointing) return tp_module_run_children(m, mod, f);
    int first = m->layers[mod->layer].input_layernorm;
    size_t mark = 0;
    int seen = 0;
    tp_status st = TP_OK;
    for (int c = mod->first_child; c >= 0 && !st; c = m->modules[c].next_sibling) {
        const tp_module *child = &m->modules[c];
        st = hook(m, m->hooks ? m->hooks->pre_forward : NULL, c);
        if (!st) st = child->ops->forward(m, child, f);
        if (!st) st = hook(m, m->hooks ? m->hooks->post_forward : NULL, c);
        if (c == first) mark = tp_arena_mark(f->save->arena), seen = 1;
    }
    if (!st && !seen) st = tp_fail(TP_ERR_INTERNAL, "%s: no input_layernorm among its children", mod->name);
    if (!st) {
        tp_arena_rewind(f->save->arena, mark);
        forget_layer(&f->save->layers[mod->layer]);
    }
    return st;
}

static tp_status layer_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    if (!b->acts || !m->gradient_checkpointing) return tp_module_run_children_backward(m, mod, b);
    size_t mark = tp_arena_mark(b->acts->arena);
    tp_status st = tp_layer_recompute(m, mod, b->cache, b->tokens, b->T, b->acts);
    if (!st) st = tp_module_run_children_backward(m, mod, b);
    tp_arena_rewind(b->acts->arena, mark);
    forget_layer(&b->acts->layers[mod->layer]);
    return st ? tp_fail_context(st, "%s (recomputed for its backward)", mod->name) : TP_OK;
}

const tp_module_ops tp_container_ops = {"container", tp_module_run_children, tp_module_run_children_backward};
const tp_module_ops tp_decoder_layer_ops = {"decoder_layer", layer_forward, layer_backward};

const tp_module_ops *tp_module_ops_of(tp_module_type type)
{
    switch (type) {
    case TP_MT_CONTAINER: return &tp_container_ops;
    case TP_MT_DECODER_LAYER: return &tp_decoder_layer_ops;
    case TP_MT_EMBEDDING: return &tp_embedding_ops;
    case TP_MT_LINEAR: return &tp_linear_ops;
    case TP_MT_NORM: return &tp_norm_ops;
    case TP_MT_ATTENTION: return &tp_attention_ops;
    case TP_MT_MLP: return &tp_mlp_ops;
    case TP_MT_MOE: return &tp_moe_ops;
    case TP_MT_EXPERTS: return &tp_experts_ops;
    case TP_MT_ADAPTER: case TP_MT_COUNT: break;   /* not built yet */
    }
    return NULL;
}
