/* Expert parallelism (§2.17, §2.18): grouped_gemm gives every rank E/P
 * whole experts (Shard(0) on the expert dimension of every matched expert
 * tensor); ep_router turns the router's global top-k ids into this rank's
 * local ids, masking the slots of other ranks' experts.  The sum over ranks
 * is moe_tp_experts' all-reduce on the container. */
#include "parallel_internal.h"

static tp_status grouped_validate(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p,
                                  const char *qualified_name)
{
    /* 3-D weights, and 2-D biases [E, width] (gpt_oss, §2.17) */
    if (p->ndim != 3 && !(p->ndim == 2 && p->kind == TP_PARAM_BIAS))
        return tp_fail(TP_ERR_INVALID, "Tensor parallel style '%s' cannot shard `%s`: it splits the expert dimension "
                       "of 3-D expert tensors (and their 2-D biases), and this one has %d dimensions", st->name,
                       qualified_name, p->ndim);
    int64_t E = p->shape[0], P = mod->tp_size;
    if (E % P == 0) return TP_OK;
    return tp_fail(TP_ERR_INVALID, "Global number of experts must be divisible by number of devices: %lld %% %lld != 0",
                   (long long)E, (long long)P);
}

static tp_status grouped_shard(const tp_style *st, const tp_module_ctx *mod, const tp_param_ctx *p, tp_placement *out)
{
    (void)st; (void)mod; (void)p;
    *out = tp_shard(0);
    return TP_OK;
}

/* Parameter-only: the container's moe_tp_experts supplies the all-reduce. */
const tp_style tp_par_grouped_gemm = {
    .name = "grouped_gemm", .impl = "MoEParamShard", .validate_param = grouped_validate,
    .shard_param = grouped_shard, .install_forward = tp_par_forward_local};

/* Both checks of §2.18 at plan time; the router's own parameters stay
 * replicated and nothing moves in the forward. */
static tp_status router_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st;
    int64_t E = mod->cfg ? mod->cfg->num_experts : 0, S = mod->tp_size;
    if (E <= 0)
        return tp_fail(TP_ERR_INVALID, "Router module %s is missing `num_experts` and `config.num_experts`",
                       mod->kind == TP_MODULE_LINEAR ? "Linear" : tp_module_kind_name(mod->kind));
    if (E % S)
        return tp_fail(TP_ERR_INVALID, "num_experts must be divisible by ep_size: %lld %% %lld != 0", (long long)E,
                       (long long)S);
    *d = tp_par_desc_passthrough();
    d->allreduce_backward_input = 0;
    return TP_OK;
}

const tp_style tp_par_ep_router = {
    .name = "ep_router", .impl = "EpRouterParallel", .install_forward = router_forward};

void tp_ep_router_remap(int32_t *ids, float *scores, int64_t T, int64_t k, int64_t E, int ep_rank, int ep_size)
{
    int64_t L = E / ep_size;
    for (int64_t i = 0; i < T * k; i++) {
        if (ids[i] / L == ep_rank) {
            ids[i] -= (int32_t)(ep_rank * L);
        } else {
            scores[i] = 0.0f;
            ids[i] = (int32_t)L;
        }
    }
}
