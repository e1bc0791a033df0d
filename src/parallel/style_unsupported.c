/* Multi-head latent attention (§2.13): registered so that its name is
 * valid and listed, but no model type tensorpar builds has MLA: a plan that
 * selects it is refused at plan time (tp_plan_resolve), never silently
 * ignored. */
#include "parallel_internal.h"

const tp_style tp_par_mla_kv_a_proj = {.name = "mla_kv_a_proj", .impl = "MlaKvAProjParallel",
                                       .support = TP_STYLE_NOT_YET};
