/* tp_comm_options: their defaults, their values from the settings table
 * (the one place that reads the comm knobs of TENSORPAR_*), and what an
 * unset field means.  tp_comm_init and the launcher take every choice from
 * their options. */
#include "comm_internal.h"
#include "tensorpar/settings.h"

#include <stdint.h>
#include <string.h>

/* The settings table's defaults (settings.c), which an unset field means. */
#define TIMEOUT_DEFAULT_S 30.0
#define HANG_DEFAULT_S 2.0
#define SLOT_DEFAULT_KB 256
#define ONESHOT_DEFAULT_KB 64
#define CMA_MIN_DEFAULT_KB 16

void tp_comm_options_default(tp_comm_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = TP_BACKEND_AUTO;
    o->rank = -1;
    o->world_size = -1;
}

/* The table's kilobytes as an option: 0 there is "none" (< 0 here). */
static long kb_option(tp_setting_id id)
{
    long kb = tp_setting_int(id);
    return kb ? kb : -1;
}

static tp_status check_all(void)
{
    static const tp_setting_id ids[] = {TP_SET_BACKEND, TP_SET_COMM_TIMEOUT, TP_SET_HANG_TIMEOUT,
                                        TP_SET_SHM_SLOT_KB, TP_SET_SHM_ONESHOT_KB, TP_SET_SHM_CMA,
                                        TP_SET_SHM_CMA_KB, TP_SET_RENDEZVOUS, TP_SET_SHM_FD};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        tp_status st = tp_setting_check(ids[i]);
        if (st) return st;
    }
    return TP_OK;
}

tp_status tp_comm_options_from_env(tp_comm_options *o)
{
    tp_comm_options_default(o);
    tp_status st = check_all();
    if (st) return st;
    /* The table's backend names are tp_backend_parse's. */
    st = tp_backend_parse(tp_setting_info_of(TP_SET_BACKEND)->names[tp_setting_enum(TP_SET_BACKEND)], &o->backend);
    if (st) return st;
    o->timeout_s = tp_setting_seconds(TP_SET_COMM_TIMEOUT);
    double hang = tp_setting_seconds(TP_SET_HANG_TIMEOUT);
    o->hang_timeout_s = hang > 0 ? hang : -1;   /* 0 there is "no check" */
    o->rendezvous = tp_setting_string(TP_SET_RENDEZVOUS);
    /* A descriptor 0 would be this process's stdin: the launcher never
     * hands one below 3 (launcher.c), so 0 can mean "none" here. */
    o->shm_fd = tp_setting_is_set(TP_SET_SHM_FD) ? (int)tp_setting_int(TP_SET_SHM_FD) : 0;
    o->shm.slot_kb = tp_setting_int(TP_SET_SHM_SLOT_KB);
    o->shm.oneshot_max_kb = kb_option(TP_SET_SHM_ONESHOT_KB);
    o->shm.cma = tp_setting_bool(TP_SET_SHM_CMA) ? TP_ON : TP_OFF;
    o->shm.cma_min_kb = kb_option(TP_SET_SHM_CMA_KB);
    return TP_OK;
}

/* kb > 0: itself; 0: dflt; < 0: zero. */
static uint64_t kb_bytes(long kb, long dflt)
{
    return kb < 0 ? 0 : (uint64_t)(kb ? kb : dflt) << 10;
}

/* The table's ranges hold for the fields too: a slot must hold the
 * per-rank headers, and a size past 1 GiB is a mistake. */
#define KB_MAX 1048576L

tp_status tp_shm_settings_of(const tp_shm_options *o, tp_shm_settings *out)
{
    static const tp_shm_options none;
    if (!o) o = &none;
    if (o->slot_kb < 0 || (o->slot_kb > 0 && o->slot_kb < 4) || o->slot_kb > KB_MAX)
        return tp_fail(TP_ERR_INVALID, "shm slot_kb = %ld is not valid (allowed: 0 for the default, or 4 to %ld)",
                       o->slot_kb, KB_MAX);
    if (o->oneshot_max_kb > KB_MAX || o->cma_min_kb > KB_MAX)
        return tp_fail(TP_ERR_INVALID, "shm oneshot_max_kb = %ld, cma_min_kb = %ld: at most %ld",
                       o->oneshot_max_kb, o->cma_min_kb, KB_MAX);
    out->slot_bytes = (size_t)kb_bytes(o->slot_kb, SLOT_DEFAULT_KB);
    out->oneshot_max = (size_t)kb_bytes(o->oneshot_max_kb, ONESHOT_DEFAULT_KB);
    out->cma_min = tp_switch_on(o->cma, 1) ? kb_bytes(o->cma_min_kb, CMA_MIN_DEFAULT_KB) : UINT64_MAX;
    return TP_OK;
}

double tp_comm_timeout_of(const tp_comm_options *o)
{
    return o && o->timeout_s > 0 ? o->timeout_s : TIMEOUT_DEFAULT_S;
}

double tp_comm_hang_of(const tp_comm_options *o)
{
    double h = o ? o->hang_timeout_s : 0;
    return h > 0 ? h : h < 0 ? 0 : HANG_DEFAULT_S;
}
