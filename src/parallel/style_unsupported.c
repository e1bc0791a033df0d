/* mla_kv_a_proj (MlaKvAProjParallel, §2.13) on kv_a_proj_with_mqa of
 * multi-head latent attention (§8.5): the Linear stays whole on every
 * rank, its input and output Replicate, nothing moves in the forward.
 * Its backward all-reduces the gradient of the output's rope part (each
 * rank's heads read the shared rotary key): module_mla.c does that sum, once,
 * where it gathers the heads' parts of that gradient, and only when the
 * heads are split — with the attention replicated (deepseek_v3's built-in
 * plan) the gradient is whole and a sum would count it P times.  The
 * Linear's own hooks move nothing. */
#include "parallel_internal.h"

static tp_status mla_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st;
    if (!mod->cfg || mod->cfg->qk_rope_head_dim <= 0)
        return tp_fail(TP_ERR_INVALID, "mla_kv_a_proj requires `qk_rope_head_dim` in the model config (module `%s`).",
                       mod->name);
    *d = tp_par_desc_local();
    return TP_OK;
}

const tp_style tp_par_mla_kv_a_proj = {.name = "mla_kv_a_proj", .impl = "MlaKvAProjParallel",
                                       .install_forward = mla_forward};
