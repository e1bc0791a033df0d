/* A sparse MoE block (qwen3_moe's Qwen3MoeSparseMoeBlock, Mixtral's
 * MixtralSparseMoeBlock, DeepSeek's, Llama 4's Llama4TextMoe with its
 * sigmoid `router`, input-scaled experts and `shared_expert`) in place of
 * a layer's MLP: the router `gate`
 * (replicated: every rank routes every token alike), its top-k choice
 * (moe_router.c), under expert parallelism ep_router's remap to this
 * rank's experts (§2.18), then the experts (module_experts.c), whose output
 * is left pending for the next norm. */
#include "lora_internal.h"
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

int64_t tp_moe_block_bound(const tp_model *m, const tp_module *moe)
{
    const tp_layer_modules *L = &m->layers[moe->layer];
    const tp_module *experts = &m->modules[L->experts];
    int64_t H = m->cfg.hidden_size, I = tp_moe_experts_width(m, experts);
    /* logits; the output and the copy its all-reduce may make; the
     * kernel's scratch; a row of the stream for the norm */
    /* DeepSeek's shared experts beside the routed output: gate and up, the
     * copies their hooks may make, down_proj's output and its copy */
    int64_t S = L->shared_experts >= 0 ? tp_module_weight(&m->modules[L->shared_gate])->shape[0] : 0;
    int64_t shared = L->shared_experts >= 0 ? 4 * S + 2 * H : 0;
    int64_t kernel = tp_grouped_experts_scratch(1, H, I, m->cfg.num_experts_per_tok, tp_threadpool_size(m->pool));
    return m->cfg.num_experts + 2 * H + kernel + H + shared;
}

/* gpt_oss's router is a Linear with a bias (DeepSeek V3's second
 * parameter is the choice's correction, not added to the logits). */
static const tp_tensor *router_bias(const tp_model *m, const tp_module *router)
{
    return m->cfg.arch == TP_ARCH_GPT_OSS ? &router->params[1].local : NULL;
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
    const tp_module *gate = &m->modules[L->router];
    tp_status st = tp_matmul_ex(logits, f->sc.h, T, tp_module_weight(gate), router_bias(m, gate), m->pool,
                                &m->matmul);
    if (!st && m->cfg.arch == TP_ARCH_GPT_OSS)
        tp_moe_route_topk_softmax(logits, T, E, k, ids, w);
    else if (!st && m->cfg.llama4)
        tp_moe_route_llama4(logits, T, E, k, ids, w);
    else if (!st && m->cfg.mla)
        st = tp_moe_route_deepseek(&m->cfg, logits, T, gate->n_params > 1 ? gate->params[1].local.data : NULL, ids, w);
    else if (!st)
        tp_moe_route(logits, T, E, k, m->cfg.norm_topk_prob, ids, w);
    tp_act_free(m, logits);
    if (!st && tp_moe_expert_parallel(m, &m->modules[L->experts]))
        tp_ep_router_remap(ids, w, T, k, E, m->tp->rank, m->tp->size);
    return st;
}

/* DeepSeek's shared experts, one dense MLP on the same input, added to the
 * routed output pending in f (DeepseekV2Moe: experts(x) + shared_experts(x)).
 * Under TP its gate/up are colwise and down_proj rowwise: the output
 * arrives whole (Replicate) from down_proj's all-reduce. */
static tp_status shared_experts(tp_model *m, int64_t layer, tp_forward_pass *f)
{
    const tp_layer_modules *L = &m->layers[layer];
    int64_t H = m->cfg.hidden_size, T = f->T;
    tp_act gu[2], y = {0};
    const tp_module *lins[2] = {&m->modules[L->shared_gate], &m->modules[L->shared_up]};
    tp_status st = tp_module_linear_group(m, lins, 2, f->sc.h, T, H, gu);
    if (st) return st;
    if (gu[0].width != gu[1].width)
        st = tp_fail(TP_ERR_UNSUPPORTED, "shared_experts: gate_proj and up_proj give %lld and %lld features on this "
                     "rank; shard them alike", (long long)gu[0].width, (long long)gu[1].width);
    if (!st) tp_par_silu_mul(m, gu[0].data, gu[1].data, T, gu[0].width);
    if (!st) st = tp_module_linear(m, &m->modules[L->shared_down], gu[0].data, T, gu[0].width, &y);
    if (!st && (y.width != H || y.pl.kind != TP_REPLICATE))
        st = tp_fail(TP_ERR_UNSUPPORTED, "shared_experts.down_proj gives %lld of %lld features, %s, on this rank; "
                     "its output must be whole (rowwise, or replicated)", (long long)y.width, (long long)H,
                     y.pl.kind == TP_PARTIAL ? "a partial sum" : "a shard");
    if (!st)
        for (int64_t i = 0; i < T * H; i++) f->pending.data[i] += y.data[i];
    tp_act_release(m, &y);
    tp_act_release(m, &gu[1]);
    tp_act_release(m, &gu[0]);
    return st;
}

static tp_status moe_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    /* Training keeps nothing of its own here: the backward recomputes the
     * routing and the experts from post_attention_layernorm's saved output. */
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
    if (!st && m->layers[mod->layer].shared_experts >= 0) st = shared_experts(m, mod->layer, f);
    free(ids);
    free(w);
    return st;
}

/* The routing again, from the saved input: logits [T, E] (kept for the
 * router's backward), the global choice (ids, w) and the experts' view of
 * it (lids, lw: remapped under expert parallelism). */
typedef struct {
    float *logits, *dlogits, *w, *lw, *dw;
    int32_t *ids, *lids;
} moe_bwd;

static void moe_bwd_free(moe_bwd *r)
{
    free(r->logits); free(r->dlogits); free(r->w); free(r->lw); free(r->dw); free(r->ids); free(r->lids);
}

static tp_status reroute(tp_model *m, const tp_module *mod, const float *x, int64_t T, moe_bwd *r)
{
    const tp_layer_modules *L = &m->layers[mod->layer];
    int64_t E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok;
    r->logits = malloc((size_t)(T * E) * sizeof(float));
    r->dlogits = malloc((size_t)(T * E) * sizeof(float));
    r->w = malloc((size_t)(T * k) * sizeof(float));
    r->lw = malloc((size_t)(T * k) * sizeof(float));
    r->dw = malloc((size_t)(T * k) * sizeof(float));
    r->ids = malloc((size_t)(T * k) * sizeof(int32_t));
    r->lids = malloc((size_t)(T * k) * sizeof(int32_t));
    if (!r->logits || !r->dlogits || !r->w || !r->lw || !r->dw || !r->ids || !r->lids)
        return tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)T);
    const tp_module *router = &m->modules[L->router];
    tp_status st = tp_matmul_ex(r->logits, x, T, tp_module_weight(router), router_bias(m, router), m->pool,
                                &m->matmul);
    if (st) return st;
    memcpy(r->dlogits, r->logits, (size_t)(T * E) * sizeof(float));   /* the routers overwrite their input */
    const tp_module *gate = &m->modules[L->router];
    if (m->cfg.arch == TP_ARCH_GPT_OSS)
        tp_moe_route_topk_softmax(r->dlogits, T, E, k, r->ids, r->w);
    else if (m->cfg.mla)
        st = tp_moe_route_deepseek(&m->cfg, r->dlogits, T, gate->n_params > 1 ? gate->params[1].local.data : NULL,
                                   r->ids, r->w);
    else
        tp_moe_route(r->dlogits, T, E, k, m->cfg.norm_topk_prob, r->ids, r->w);
    if (st) return st;
    memcpy(r->lids, r->ids, (size_t)(T * k) * sizeof(int32_t));
    memcpy(r->lw, r->w, (size_t)(T * k) * sizeof(float));
    if (tp_moe_expert_parallel(m, &m->modules[L->experts]))
        tp_ep_router_remap(r->lids, r->lw, T, k, E, m->tp->rank, m->tp->size);
    return TP_OK;
}

/* The router Linear's backward.  DeepSeek-V3's e_score_correction_bias
 * sits in the bias slot but is no bias of the logits: it only chose the
 * experts (a buffer in Transformers), so it gets no gradient, and AdamW,
 * which does not decay biases, leaves it as it is.  Routers are replicated
 * (no rule, or ep_router, which moves nothing): the plain GEMMs. */
static tp_status router_backward(tp_model *m, const tp_module *router, const float *dlogits, const float *x,
                                 int64_t T, float *dx)
{
    /* gpt_oss's router bias is a bias of the logits: the Linear's own backward */
    if (m->cfg.arch == TP_ARCH_GPT_OSS || !tp_module_bias(router)->data)
        return tp_module_linear_backward(m, router, dlogits, x, T, dx);
    float *dw;
    tp_status st = tp_module_grad(m, router, TP_MODULE_WEIGHT, &dw);
    if (!st) st = tp_matmul_backward_ex(dx, dw, NULL, dlogits, x, T, tp_module_weight(router), m->pool, &m->matmul);
    return st ? tp_fail_context(st, "the backward of %s", router->name) : TP_OK;
}

/* The shared expert's backward (Llama 4's shared_expert, DeepSeek's
 * shared_experts) from the block input x and the block output's gradient
 * dy (replicated): its gate and up recomputed through their styles, then
 * down_proj, SwiGLU, gate and up, whose input gradients (colwise: summed
 * by their styles) are added into dh. */
static tp_status shared_expert_backward(tp_model *m, const tp_layer_modules *L, const float *x, const float *dy,
                                        int64_t T, float *dh)
{
    int64_t H = m->cfg.hidden_size;
    tp_act gu[2];
    const tp_module *lins[2] = {&m->modules[L->shared_gate], &m->modules[L->shared_up]};
    tp_status st = tp_module_linear_group(m, lins, 2, x, T, H, gu);
    if (st) return st;
    int64_t n = T * gu[0].width;
    float *act = malloc((size_t)n * sizeof(float)), *dact = calloc((size_t)n, sizeof(float));
    float *dg = calloc((size_t)n, sizeof(float)), *du = calloc((size_t)n, sizeof(float));
    if (!act || !dact || !dg || !du) st = tp_fail(TP_ERR_NOMEM, "out of memory for the shared expert's backward");
    if (!st) {
        memcpy(act, gu[0].data, (size_t)n * sizeof(float));
        tp_silu_mul(act, gu[1].data, n);
        st = tp_module_linear_backward(m, &m->modules[L->shared_down], dy, act, T, dact);
    }
    if (!st) {
        tp_silu_mul_backward(dg, du, dact, gu[0].data, gu[1].data, n);
        st = tp_module_linear_backward(m, &m->modules[L->shared_gate], dg, x, T, dh);
    }
    if (!st) st = tp_module_linear_backward(m, &m->modules[L->shared_up], du, x, T, dh);
    free(act); free(dact); free(dg); free(du);
    tp_act_release(m, &gu[1]);
    tp_act_release(m, &gu[0]);
    return st;
}

/* ---- Llama 4 (Llama4TextMoe) ---------------------------------------------- */

/* Llama 4's block backward: the routing again from the saved input, the
 * experts (their input scaled by the sigmoid scores: the score gradient
 * comes from the experts' input gradient, summed over the ranks with it),
 * the sigmoid of the chosen logits (the others' scores are constant 0),
 * the router Linear and the shared expert; every input gradient into dh. */
static tp_status llama4_moe_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    const tp_layer_modules *L = &m->layers[mod->layer];
    const float *x = b->saved->layers[mod->layer].h_mlp;
    int64_t T = b->T, E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok;
    moe_bwd r = {0};
    r.logits = malloc((size_t)(T * E) * sizeof(float));
    r.dlogits = calloc((size_t)(T * E), sizeof(float));
    r.w = malloc((size_t)(T * k) * sizeof(float));
    r.lw = malloc((size_t)(T * k) * sizeof(float));
    r.dw = malloc((size_t)(T * k) * sizeof(float));
    r.ids = malloc((size_t)(T * k) * sizeof(int32_t));
    r.lids = malloc((size_t)(T * k) * sizeof(int32_t));
    tp_status st = r.logits && r.dlogits && r.w && r.lw && r.dw && r.ids && r.lids
                       ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory routing %lld tokens", (long long)T);
    if (!st) st = tp_matmul_ex(r.logits, x, T, tp_module_weight(&m->modules[L->router]), NULL, m->pool, &m->matmul);
    if (!st) {
        tp_moe_route_llama4(r.logits, T, E, k, r.ids, r.w);
        memcpy(r.lids, r.ids, (size_t)(T * k) * sizeof(int32_t));
        memcpy(r.lw, r.w, (size_t)(T * k) * sizeof(float));
        if (tp_moe_expert_parallel(m, &m->modules[L->experts]))
            tp_ep_router_remap(r.lids, r.lw, T, k, E, m->tp->rank, m->tp->size);
        memset(b->dh, 0, (size_t)(T * m->cfg.hidden_size) * sizeof(float));
        tp_moe_routing view = {r.lids, r.lw, k};
        st = tp_moe_experts_backward(m, &m->modules[L->experts], &view, x, b->dx, T, b->dh, r.dw);
    }
    if (!st) {
        for (int64_t i = 0; i < T * k; i++)
            r.dlogits[(i / k) * E + r.ids[i]] += r.dw[i] * r.w[i] * (1.0f - r.w[i]);
        st = tp_module_linear_backward(m, &m->modules[L->router], r.dlogits, x, T, b->dh);
    }
    if (!st) st = shared_expert_backward(m, L, x, b->dx, T, b->dh);
    moe_bwd_free(&r);
    return st;
}

/* b->dx, the gradient of the block's output: through the experts (their
 * weights, their input, the slots' weights; summed over the ranks), the
 * router's top-k and softmax, and the router Linear, whose input gradient
 * joins the experts' in b->dh.  The router is replicated and sees the
 * summed, replicated weight gradients: every rank computes the same router
 * gradient, with no further sum (§9.2). */
static tp_status moe_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    if (m->cfg.llama4) return llama4_moe_backward(m, mod, b);
    const tp_layer_modules *L = &m->layers[mod->layer];
    const float *x = b->saved->layers[mod->layer].h_mlp;
    int64_t T = b->T, E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok;
    moe_bwd r = {0};
    tp_status st = reroute(m, mod, x, T, &r);
    tp_moe_routing view = {r.lids, r.lw, k};
    if (!st) {
        memset(b->dh, 0, (size_t)(T * m->cfg.hidden_size) * sizeof(float));
        st = tp_moe_experts_backward(m, &m->modules[L->experts], &view, x, b->dx, T, b->dh, r.dw);
    }
    if (!st) {
        if (m->cfg.arch == TP_ARCH_GPT_OSS) tp_moe_route_topk_softmax_backward(r.logits, T, E, k, r.ids, r.dw, r.dlogits);
        else if (m->cfg.mla) tp_moe_route_deepseek_backward(&m->cfg, r.logits, T, r.ids, r.dw, r.dlogits);
        else tp_moe_route_backward(r.logits, T, E, k, m->cfg.norm_topk_prob, r.ids, r.dw, r.dlogits);
        st = router_backward(m, &m->modules[L->router], r.dlogits, x, T, b->dh);
    }
    moe_bwd_free(&r);
    if (!st && L->shared_experts >= 0) st = shared_expert_backward(m, L, x, b->dx, T, b->dh);
    return st;
}

const tp_module_ops tp_moe_ops = {"moe", moe_forward, moe_backward};
