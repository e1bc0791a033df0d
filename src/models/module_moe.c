/* A sparse MoE block (qwen3_moe's Qwen3MoeSparseMoeBlock, Mixtral's
 * MixtralSparseMoeBlock) in place of a layer's MLP: the router `gate`
 * (replicated: every rank routes every token alike), its top-k choice
 * (moe_router.c), under expert parallelism ep_router's remap to this
 * rank's experts (§2.18), then the experts (module_experts.c), whose output
 * is left pending for the next norm. */
#include "lora_internal.h"
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>

int64_t tp_moe_block_bound(const tp_model *m, const tp_module *moe)
{
    const tp_layer_modules *L = &m->layers[moe->layer];
    const tp_module *experts = &m->modules[L->experts];
    int64_t H = m->cfg.hidden_size, I = experts->params[0].local.shape[1] / 2;
    /* logits; the output and the copy its all-reduce may make; the
     * kernel's scratch; a row of the stream for the norm */
    return m->cfg.num_experts + 2 * H + tp_grouped_experts_scratch(1, H, I) + H;
}

static tp_status route(tp_model *m, const tp_module *mod, tp_forward_pass *f, int32_t *ids, float *w)
{
    const tp_layer_modules *L = &m->layers[mod->layer];
    int64_t T = f->T, E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok;
    /* The router runs its GEMM here, not through the Linear path that
     * applies adapters: one on it would be ignored. */
    if (m->lora && m->lora->by_module[L->router])
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: a LoRA adapter on a mixture-of-experts router is not supported",
                       m->modules[L->router].name);
    float *logits = tp_act_alloc(m, T * E);
    if (!logits) return tp_fail(TP_ERR_NOMEM, "out of memory for the router of %lld tokens", (long long)T);
    /* f32 logits over all experts from the replicated router weight */
    tp_status st = tp_matmul_ex(logits, f->sc.h, T, tp_module_weight(&m->modules[L->router]), NULL, m->pool,
                                &m->matmul);
    if (!st) tp_moe_route(logits, T, E, k, m->cfg.norm_topk_prob, ids, w);
    tp_act_free(m, logits);
    if (!st && tp_moe_expert_parallel(m, &m->modules[L->experts]))
        tp_ep_router_remap(ids, w, T, k, E, m->tp->rank, m->tp->size);
    return st;
}

static tp_status moe_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    if (f->save)
        return tp_fail(TP_ERR_UNSUPPORTED, "training through mixture-of-experts layers (model type %s) is not "
                       "supported yet", m->cfg.model_type);
    int64_t n = f->T * m->cfg.num_experts_per_tok;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *w = malloc((size_t)n * sizeof *w);
    tp_status st = ids && w ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)f->T);
    if (!st) st = route(m, mod, f, ids, w);
    if (!st) {
        const tp_module *experts = &m->modules[m->layers[mod->layer].experts];
        f->moe_ids = ids;
        f->moe_w = w;
        f->moe_k = m->cfg.num_experts_per_tok;
        st = experts->ops->forward(m, experts, f);
        f->moe_ids = NULL;
        f->moe_w = NULL;
    }
    free(ids);
    free(w);
    return st;
}

static tp_status moe_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    (void)b;
    return tp_fail(TP_ERR_UNSUPPORTED, "%s: training through mixture-of-experts layers (model type %s) is not "
                   "supported yet", mod->name, m->cfg.model_type);
}

const tp_module_ops tp_moe_ops = {"moe", moe_forward, moe_backward};
