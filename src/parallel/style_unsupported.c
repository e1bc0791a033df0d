/* Styles for MoE, expert parallelism and multi-head latent attention
 * (§2.13–§2.15, §2.17, §2.18).  They are registered so that their names are
 * valid and listed, but tensorpar's models are dense: a plan that selects
 * one of them for a parameter or module is refused at plan time
 * (tp_plan_resolve), never silently ignored. */
#include "parallel_internal.h"

#define NOT_YET(var, nm, cls) \
    const tp_style var = {.name = nm, .impl = cls, .support = TP_STYLE_NOT_YET}

NOT_YET(tp_par_mla_kv_a_proj, "mla_kv_a_proj", "MlaKvAProjParallel");
NOT_YET(tp_par_moe_tp_experts, "moe_tp_experts", "MoeExpertsParallel");
NOT_YET(tp_par_moe_identity_expert, "moe_identity_expert", "MoeIdentityParallel");
NOT_YET(tp_par_grouped_gemm, "grouped_gemm", "MoEParamShard");
NOT_YET(tp_par_ep_router, "ep_router", "EpRouterParallel");
