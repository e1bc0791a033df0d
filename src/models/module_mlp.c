/* The MLP module: gate_proj and up_proj as one group, SiLU(gate) · up, and
 * down_proj, whose output joins the residual stream (left pending for the
 * next norm).  Backward: added here by the training issue. */
#include "tp_module.h"

/* f->sc.h holds post_attention_layernorm(x); on return f->pending holds the
 * MLP output, which the next norm (the next layer's input_layernorm or the
 * final norm) adds. */
static tp_status mlp_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    const tp_layer_modules *L = &m->layers[mod->layer];
    int64_t H = m->cfg.hidden_size, T = f->T;
    tp_act gate_up[2];
    tp_act *gate = &gate_up[0], *up = &gate_up[1];
    const tp_module *lins[2] = {&m->modules[L->gate_proj], &m->modules[L->up_proj]};
    tp_status st = tp_module_linear_group(m, lins, 2, f->sc.h, T, H, gate_up);
    if (st) return st;
    if (gate->width != up->width)
        st = tp_fail(TP_ERR_UNSUPPORTED, "gate_proj and up_proj give %lld and %lld features on this rank; "
                     "shard them alike", (long long)gate->width, (long long)up->width);
    else {
        tp_par_silu_mul(m, gate->data, up->data, T, gate->width);
        st = tp_module_linear_to_stream(m, f, &m->modules[L->down_proj], mod, gate->data, T, gate->width,
                                        &f->pending);
    }
    tp_act_release(m, gate); tp_act_release(m, up);
    return st;
}

const tp_module_ops tp_mlp_ops = {"mlp", mlp_forward, NULL};
