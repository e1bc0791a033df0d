/* Mixture-of-experts checkpoints (§6.1, §6.2).  Published qwen3_moe and
 * mixtral checkpoints store one tensor per expert and projection
 * (`mlp.experts.<e>.gate_proj/up_proj/down_proj`, Mixtral's
 * `block_sparse_moe.experts.<e>.w1/w3/w2`) and Mixtral's router as
 * `block_sparse_moe.gate`; the model holds them as Transformers does after
 * loading: `mlp.gate`, `mlp.experts.gate_up_proj [E, 2I, H]` ([gate; up]
 * along dimension 1) and `mlp.experts.down_proj [E, H, I]`.  This file is
 * the one place that knows the stored names, for make-model (which writes
 * them) and loading (which reads, of each stored tensor, only the part this
 * rank holds: nothing of other ranks' experts under grouped_gemm, the
 * rank's rows of I under packed_colwise / rowwise). */
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

enum { PART_GATE = TP_MOE_GATE, PART_UP = TP_MOE_UP, PART_DOWN = TP_MOE_DOWN };

void tp_moe_expert_name(const tp_model_config *c, int64_t layer, int64_t e, int part, char *out, size_t cap)
{
    static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"}, *const mx[3] = {"w1", "w3", "w2"};
    if (c->arch == TP_ARCH_MIXTRAL)
        snprintf(out, cap, "model.layers.%lld.block_sparse_moe.experts.%lld.%s.weight", (long long)layer,
                 (long long)e, mx[part]);
    else
        snprintf(out, cap, "model.layers.%lld.mlp.experts.%lld.%s.weight", (long long)layer, (long long)e, hf[part]);
}

void tp_checkpoint_name_of(const tp_model_config *c, const char *param, char *out, size_t cap)
{
    const char *at = strstr(param, ".mlp.gate.");
    if (c->arch == TP_ARCH_MIXTRAL && at)
        snprintf(out, cap, "%.*s.block_sparse_moe.gate.%s", (int)(at - param), param, at + strlen(".mlp.gate."));
    else
        snprintf(out, cap, "%s", param);
}

int tp_moe_stored_per_expert(const tp_model_config *c)
{
    /* gpt_oss and Llama 4 store the 3-D tensors themselves */
    return c->arch != TP_ARCH_GPT_OSS && !c->llama4;
}

/* Appends the stored tensors of one model parameter to d (room assumed). */
static size_t expand(const tp_model_config *c, const tp_param_desc *p, tp_param_desc *d)
{
    if (!p->module || p->module->type != TP_MT_EXPERTS || !tp_moe_stored_per_expert(c)) {
        d[0] = *p;
        tp_checkpoint_name_of(c, p->name, d[0].name, sizeof d[0].name);
        return 1;
    }
    if (p->param_index != 0) return 0;     /* down_proj: listed with gate_up_proj, expert by expert */
    int64_t E = p->shape[0], I = p->shape[1] / 2, H = p->shape[2];
    size_t k = 0;
    for (int64_t e = 0; e < E; e++)
        for (int part = PART_GATE; part <= PART_DOWN; part++) {
            tp_param_desc *t = &d[k++];
            *t = *p;
            t->ndim = 2;
            t->shape[0] = part == PART_DOWN ? H : I;
            t->shape[1] = part == PART_DOWN ? I : H;
            t->param_index = part == PART_DOWN ? 1 : 0;
            tp_moe_expert_name(c, p->module->layer, e, part, t->name, sizeof t->name);
        }
    return k;
}

tp_status tp_model_checkpoint_params(const tp_model_config *c, tp_param_desc **out, size_t *n)
{
    tp_module *mods;
    size_t count, np, total = 0, k = 0;
    tp_param_desc *p;
    tp_status s = tp_module_table_build(c, &mods, &count);
    if (s) return s;
    /* tp_model_params without a model leaves module NULL; these need it. */
    if ((s = tp_model_params(c, NULL, &p, &np))) { tp_module_table_free(mods, count); return s; }
    for (size_t i = 0; i < np; i++) {
        p[i].module = &mods[p[i].module_index];
        /* an expert stack: gate, up and down of each expert, listed once */
        if (p[i].module->type != TP_MT_EXPERTS || !tp_moe_stored_per_expert(c)) total += 1;
        else if (p[i].param_index == 0) total += (size_t)(3 * p[i].shape[0]);
    }
    tp_param_desc *d = calloc(total ? total : 1, sizeof *d);
    if (!d) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < np; i++) k += expand(c, &p[i], d + k);
    for (size_t i = 0; d && i < k; i++) d[i].module = NULL;
    free(p);
    tp_module_table_free(mods, count);
    if (s) return s;
    *out = d;
    *n = k;
    return TP_OK;
}

/* Rows [a, a + len) of [gate; up] (each I rows) of expert e into dst:
 * each stored tensor gives the part of the range it covers. */
static tp_status read_gate_up_rows(tp_checkpoint *ck, const tp_model_config *c, int64_t layer, int64_t e, int64_t I,
                                   int64_t H, int64_t a, int64_t len, tp_dtype dt, char *dst)
{
    size_t row = (size_t)H * tp_dtype_size(dt);
    char name[160];
    tp_status s = TP_OK;
    for (int part = PART_GATE; part <= PART_UP && !s && len > 0; part++) {
        int64_t lo = part * I, hi = lo + I;
        if (a >= hi || a + len <= lo) continue;
        int64_t from = a > lo ? a : lo, to = a + len < hi ? a + len : hi;
        tp_moe_expert_name(c, layer, e, part, name, sizeof name);
        s = tp_checkpoint_expect_weight(ck, name, 2, (int64_t[2]){I, H});
        if (!s) s = tp_checkpoint_read_slice(ck, name, 0, from - lo, to - from, dt, dst);
        dst += (size_t)(to - from) * row;
    }
    return s;
}

static tp_status read_down(tp_checkpoint *ck, const tp_model_config *c, int64_t layer, int64_t e, int64_t I,
                           int64_t H, const tp_param_slice *sl, tp_dtype dt, char *dst)
{
    char name[160];
    tp_moe_expert_name(c, layer, e, PART_DOWN, name, sizeof name);
    tp_status s = tp_checkpoint_expect_weight(ck, name, 2, (int64_t[2]){H, I});
    if (s) return s;
    if (sl->dim != 2) return tp_checkpoint_read(ck, name, dt, dst);
    return tp_checkpoint_read_slice(ck, name, 1, sl->start[0], sl->len[0], dt, dst);
}

/* Llama 4 stores its experts stacked, as the model holds them: this
 * rank's ranges along sl->dim, each read on its own (only its bytes) and
 * put at its place in every row of the dimensions before it. */
static tp_status load_stacked(tp_checkpoint *ck, const tp_param_desc *p, const tp_param_slice *sl, tp_dtype dt)
{
    tp_status s = tp_checkpoint_expect_weight(ck, p->name, p->ndim, p->shape);
    if (!s) s = tp_tensor_init(p->slot, dt, sl->ndim, sl->local_shape);
    if (s || sl->dim < 0) return s ? s : tp_checkpoint_read(ck, p->name, dt, p->slot->data);
    int d = sl->dim;
    size_t es = tp_dtype_size(dt), outer = 1, inner = 1, off = 0, local = (size_t)sl->local_shape[d];
    for (int i = 0; i < d; i++) outer *= (size_t)p->shape[i];
    for (int i = d + 1; i < p->ndim; i++) inner *= (size_t)p->shape[i];
    for (int i = 0; i < sl->n && !s; i++) {
        size_t len = (size_t)sl->len[i];
        char *tmp = malloc(outer * len * inner * es + 1);
        if (!tmp) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s", p->name);
        s = tp_checkpoint_read_slice(ck, p->name, d, sl->start[i], sl->len[i], dt, tmp);
        for (size_t o = 0; !s && o < outer; o++)
            memcpy((char *)p->slot->data + ((o * local + off) * inner) * es, tmp + o * len * inner * es,
                   len * inner * es);
        free(tmp);
        off += len;
    }
    return s;
}

tp_status tp_moe_load_experts(tp_checkpoint *ck, const tp_model_config *c, const tp_param_desc *p,
                              const tp_param_slice *sl, tp_dtype dt)
{
    if (c->llama4) return load_stacked(ck, p, sl, dt);
    if (sl->dim == 2 && sl->n != 1)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: a split of the inner dimension into %d ranges", p->name, sl->n);
    tp_status s = tp_tensor_init(p->slot, dt, sl->ndim, sl->local_shape);
    if (s) return s;
    int64_t layer = p->module->layer, E0 = 0, El = p->shape[0];
    if (sl->dim == 0) { E0 = sl->start[0]; El = sl->len[0]; }
    int gate_up = p->param_index == 0;
    int64_t I = gate_up ? p->shape[1] / 2 : p->shape[2], H = gate_up ? p->shape[2] : p->shape[1];
    size_t per_expert = (size_t)(sl->local_shape[1] * sl->local_shape[2]) * tp_dtype_size(dt);
    for (int64_t e = 0; e < El && !s; e++) {
        char *dst = (char *)p->slot->data + (size_t)e * per_expert;
        if (!gate_up) { s = read_down(ck, c, layer, E0 + e, I, H, sl, dt, dst); continue; }
        if (sl->dim != 1) { s = read_gate_up_rows(ck, c, layer, E0 + e, I, H, 0, 2 * I, dt, dst); continue; }
        for (int j = 0; j < sl->n && !s; j++) {
            s = read_gate_up_rows(ck, c, layer, E0 + e, I, H, sl->start[j], sl->len[j], dt, dst);
            dst += (size_t)(sl->len[j] * H) * tp_dtype_size(dt);
        }
    }
    return s;
}
