/* Logging to stderr, with the rank in the prefix when running as a rank. */
#include "tensorpar/base.h"
#include "tensorpar/settings.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* TENSORPAR_LOG is read here, not passed in an options struct: logging is
 * the process's, used before any options exist (settings and argument
 * errors) and by code that has none (the launcher, the comm backends). */
static tp_log_level threshold(void)
{
    /* The table's names are in tp_log_level's order; a bad value reads as
     * the default (info) and tp_settings_check reports it. */
    return (tp_log_level)tp_setting_enum(TP_SET_LOG);
}

void tp_rank_prefix(char *buf, size_t cap)
{
    const char *rank = getenv("RANK"), *world = getenv("WORLD_SIZE");
    if (!rank || !world) {   /* mpirun sets only its own variables */
        rank = getenv("OMPI_COMM_WORLD_RANK");
        world = getenv("OMPI_COMM_WORLD_SIZE");
    }
    if (rank && *rank && world && *world && atol(world) > 1) snprintf(buf, cap, "[rank %s] ", rank);
    else if (cap) buf[0] = '\0';
}

void tp_log(tp_log_level level, const char *fmt, ...)
{
    if (level < threshold()) return;
    static const char *names[] = {"debug", "info", "warning", "error"};
    char msg[2048], prefix[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tp_rank_prefix(prefix, sizeof prefix);
    fprintf(stderr, "%stensorpar: %s: %s\n", prefix, names[level], msg);
}
