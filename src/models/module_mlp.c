/* The MLP module: gate_proj and up_proj as one group, SiLU(gate) · up, and
 * down_proj, whose output joins the residual stream (left pending for the
 * next norm); its backward below. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

/* Training: gate and up before SwiGLU, which its backward reads. */
static tp_status save_gate_up(tp_train_acts *s, tp_saved_layer *sv, const tp_act *gate, const tp_act *up)
{
    int64_t n = gate->T * gate->width;
    sv->inter = gate->width;
    sv->gate = tp_train_save(s, gate->data, n);
    sv->up = tp_train_save(s, up->data, n);
    return sv->gate && sv->up ? TP_OK : TP_ERR_NOMEM;
}

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
        tp_saved_layer *sv = f->save ? &f->save->layers[mod->layer] : NULL;
        if (sv) st = save_gate_up(f->save, sv, gate, up);
        if (!st) tp_par_silu_mul(m, gate->data, up->data, T, gate->width);
        if (!st && sv && !(sv->act = tp_train_save(f->save, gate->data, T * gate->width))) st = TP_ERR_NOMEM;
        if (!st)
            st = tp_module_linear_to_stream(m, f, &m->modules[L->down_proj], mod, gate->data, T, gate->width,
                                            &f->pending);
    }
    tp_act_release(m, gate); tp_act_release(m, up);
    return st;
}

/* b->dx is the gradient of the MLP's output: through the block's rule (if
 * any), down_proj, SwiGLU,
 * and gate/up, whose input gradients (both read post_attention_layernorm's
 * output) are summed into b->dh. */
static tp_status mlp_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    const tp_layer_modules *L = &m->layers[mod->layer];
    const tp_saved_layer *sv = &b->saved->layers[mod->layer];
    int64_t T = b->T, n = T * sv->inter;
    float *dact = calloc((size_t)n, sizeof(float)), *dgate = calloc((size_t)n, sizeof(float));
    float *dup = calloc((size_t)n, sizeof(float));
    tp_status st = dact && dgate && dup ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_dtensor gy;
    int have = 0;
    if (!st) st = tp_module_block_output_backward(m, tp_module_block(m, mod), b->dx, T, m->cfg.hidden_size, &gy, &have);
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->down_proj], have ? gy.local.data : b->dx, sv->act, T,
                                            dact);
    if (have) tp_dtensor_release(&gy);
    if (!st) {
        tp_silu_mul_backward(dgate, dup, dact, sv->gate, sv->up, n);
        memset(b->dh, 0, (size_t)(T * m->cfg.hidden_size) * sizeof(float));
        st = tp_module_linear_backward(m, &m->modules[L->gate_proj], dgate, sv->h_mlp, T, b->dh);
    }
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->up_proj], dup, sv->h_mlp, T, b->dh);
    free(dact); free(dgate); free(dup);
    return st;
}

const tp_module_ops tp_mlp_ops = {"mlp", mlp_forward, mlp_backward};
