/* The experts of a sparse MoE block (mlp.experts, Transformers'
 * Qwen3MoeExperts / MixtralExperts): gate_up_proj [E, 2I, H] and down_proj
 * [E, H, I] as this rank holds them — every expert's slice of I under
 * packed_colwise / rowwise (TP mode), E/P whole experts under grouped_gemm
 * (EP mode), or everything.  The forward runs the grouped kernel on the
 * block's routing; under a split each rank's result is a partial sum (over
 * its slice of I, or over its own experts), which the module's rule
 * (moe_tp_experts) all-reduces into the pending block output. */
#include "tp_module.h"

#include "tensorpar/kernels.h"

#include <stdlib.h>
#include <string.h>

static const tp_module_param *gate_up(const tp_module *experts) { return &experts->params[0]; }

/* gpt_oss's experts carry biases and keep Transformers' layout (params:
 * gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias). */
static int oss(const tp_model *m) { return m->cfg.arch == TP_ARCH_GPT_OSS; }

static tp_oss_experts_args oss_args(tp_model *m, const tp_module *mod, float *out, const float *x, int64_t T,
                                    int64_t k, const int32_t *ids, const float *w)
{
    return (tp_oss_experts_args){out, x, T, m->cfg.hidden_size, k, ids, w, &mod->params[0].local,
                                 &mod->params[1].local, &mod->params[2].local, &mod->params[3].local,
                                 m->cfg.swiglu_alpha, m->cfg.swiglu_limit, m->pool, &m->matmul};
}

int tp_moe_expert_parallel(const tp_model *m, const tp_module *experts)
{
    const tp_placement *p = &gate_up(experts)->placement;
    return m->tp && m->tp->size > 1 && p->kind == TP_SHARD && p->dim == 0;
}

/* Any expert tensor split: the local result is one rank's summand. */
static int split(const tp_module *experts)
{
    for (int j = 0; j < experts->n_params; j++)
        if (experts->params[j].placement.kind != TP_REPLICATE) return 1;
    return 0;
}

int64_t tp_moe_experts_width(const tp_model *m, const tp_module *experts)
{
    const tp_tensor *gu = &gate_up(experts)->local;
    return (m->cfg.llama4 || oss(m) ? gu->shape[2] : gu->shape[1]) / 2;
}

/* f->sc.h [T, H] and the routing in f->moe_ids / moe_w -> f->pending. */
static tp_status experts_forward(tp_model *m, const tp_module *mod, tp_forward_pass *f)
{
    int64_t T = f->T, H = m->cfg.hidden_size, I = tp_moe_experts_width(m, mod);
    float *out = tp_act_alloc(m, T * H);
    float *scratch = tp_act_alloc(m, tp_grouped_experts_scratch(T, H, I, f->moe_k, tp_threadpool_size(m->pool)));
    if (!out || !scratch) return tp_fail(TP_ERR_NOMEM, "out of memory for the experts of %lld tokens", (long long)T);
    tp_grouped_experts_args a = {out, f->sc.h, T, H, f->moe_k, f->moe_ids, f->moe_w, &gate_up(mod)->local,
                                 &mod->params[1].local, m->pool, &m->matmul, m->cfg.llama4, m->cfg.llama4};
    tp_oss_experts_args b = oss_args(m, mod, out, f->sc.h, T, f->moe_k, f->moe_ids, f->moe_w);
    tp_status st = oss(m) ? tp_oss_experts(&b, scratch) : tp_grouped_experts(&a, scratch);
    tp_act_free(m, scratch);
    if (st) { tp_act_free(m, out); return st; }
    tp_act y = {out, T, H, H, split(mod) ? tp_partial() : tp_replicate()};
    /* §10.6: Llama 4's experts carry no container rule and sum their own
     * partial output (TP: over slices of I; EP: over each rank's experts). */
    if (y.pl.kind == TP_PARTIAL && m->cfg.llama4 && !tp_module_block(m, mod)) {
        int64_t shape[2] = {T, H};
        st = tp_sum_partial(m, 2, shape, out);
        if (!st) y.pl = tp_replicate();
    }
    if (!st && y.pl.kind == TP_PARTIAL) {
        if (!tp_module_block(m, mod))
            st = tp_fail(TP_ERR_INVALID, "%s: its experts are split, but no rule (moe_tp_experts) sums their "
                         "outputs", mod->name);
        if (!st) st = tp_module_block_output(m, tp_module_block(m, mod), &y);
        if (!st) y.pl = tp_replicate();
    }
    if (st) { tp_act_release(m, &y); return st; }
    f->pending = y;
    return TP_OK;
}

/* The sum over the ranks of each one's part (TP: its slice of I; EP: its
 * experts) of the input gradient and of the slots' weight gradients, one
 * all-reduce of [T, H + k] (Partial -> Replicate, §9.2's two sums). */
static tp_status sum_partials(tp_model *m, float *buf, int64_t T, int64_t width)
{
    int64_t shape[2] = {T, width};
    return tp_sum_partial(m, 2, shape, buf);
}

tp_status tp_moe_experts_backward(tp_model *m, const tp_module *mod, const tp_moe_routing *r, const float *x,
                                  const float *dy, int64_t T, float *dx, float *dw)
{
    int64_t H = m->cfg.hidden_size, k = r->k;
    tp_dtensor gy;
    int have = 0;
    const tp_module_plan *block = split(mod) ? tp_module_block(m, mod) : NULL;
    /* §10.6: Llama 4's experts sum their own partial gradients */
    int sum = block || (split(mod) && m->cfg.llama4);
    if (split(mod) && !sum)
        return tp_fail(TP_ERR_INVALID, "%s: its experts are split, but no rule (moe_tp_experts) sums their "
                       "gradients", mod->name);
    tp_status st = tp_module_block_output_backward(m, block, dy, T, H, &gy, &have);
    float *buf = st ? NULL : calloc((size_t)(T * (H + k)), sizeof(float));
    if (!st && !buf) st = tp_fail(TP_ERR_NOMEM, "out of memory for the experts' backward");
    tp_grouped_experts_grads g = {have ? gy.local.data : dy, buf, buf ? buf + T * H : NULL, NULL, NULL};
    if (!st) st = tp_module_grad(m, mod, 0, &g.d_gate_up);
    if (!st && !oss(m)) st = tp_module_grad(m, mod, 1, &g.d_down);
    tp_grouped_experts_args a = {NULL, x, T, H, k, r->ids, r->w, &gate_up(mod)->local, &mod->params[1].local,
                                 m->pool, &m->matmul, m->cfg.llama4, m->cfg.llama4};
    if (!st && oss(m)) {
        tp_oss_experts_args b = oss_args(m, mod, NULL, x, T, k, r->ids, r->w);
        tp_oss_experts_grads og = {g.dy, g.dx, g.dweights, g.d_gate_up, NULL, NULL, NULL};
        st = tp_module_grad(m, mod, 1, &og.d_gate_up_bias);
        if (!st) st = tp_module_grad(m, mod, 2, &og.d_down);
        if (!st) st = tp_module_grad(m, mod, 3, &og.d_down_bias);
        if (!st) st = tp_oss_experts_backward(&b, &og);
    } else if (!st) {
        st = tp_grouped_experts_backward(&a, &g);
    }
    if (have) tp_dtensor_release(&gy);
    /* [dx | dw] side by side per token would need a strided copy; the sum
     * runs on the two blocks laid end to end as [T, H + k] rows instead —
     * an element-wise sum, so any shape of the same size is the same sum. */
    if (!st && sum) st = sum_partials(m, buf, T, H + k);
    if (!st) {
        for (int64_t i = 0; i < T * H; i++) dx[i] += buf[i];
        memcpy(dw, buf + T * H, (size_t)(T * k) * sizeof(float));
    }
    free(buf);
    return st;
}

static tp_status experts_backward(tp_model *m, const tp_module *mod, tp_backward_pass *b)
{
    (void)b;
    return tp_fail(TP_ERR_INTERNAL, "%s: the experts' backward runs inside their block's (%s)", mod->name,
                   m->cfg.model_type);
}

const tp_module_ops tp_experts_ops = {"experts", experts_forward, experts_backward};
