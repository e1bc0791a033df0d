/* tp_model_options from the settings table: the one place that reads the
 * model's TENSORPAR_* knobs.  tp_model_load itself takes every choice from
 * its options and never reads the environment. */
#include "tensorpar/models.h"
#include "tensorpar/settings.h"

tp_status tp_model_options_from_env(tp_model_options *o)
{
    tp_status st;
    if ((st = tp_setting_check(TP_SET_FUSE_NORM)) || (st = tp_setting_check(TP_SET_PIN))) return st;
    if ((st = tp_kernel_options_from_env(&o->kernels))) return st;
    o->fuse_norm = tp_setting_bool(TP_SET_FUSE_NORM) ? TP_ON : TP_OFF;
    o->pin_threads = tp_setting_bool(TP_SET_PIN);
    return TP_OK;
}
