/* tp_kernel_options from the settings table: the one place that reads
 * TENSORPAR_BF16_DOT and TENSORPAR_BLAS.  The kernels themselves take the
 * choices from their options (tp_matmul_opts), never from the
 * environment. */
#include "tensorpar/kernels.h"
#include "tensorpar/settings.h"

#include <string.h>

static tp_switch switch_of(tp_setting_id id)
{
    return tp_setting_bool(id) ? TP_ON : TP_OFF;
}

tp_status tp_kernel_options_from_env(tp_kernel_options *o)
{
    memset(o, 0, sizeof *o);
    tp_status st;
    if ((st = tp_setting_check(TP_SET_BF16_DOT)) || (st = tp_setting_check(TP_SET_BLAS))) return st;
    o->bf16_dot = switch_of(TP_SET_BF16_DOT);
    o->blas = switch_of(TP_SET_BLAS);
    return TP_OK;
}
