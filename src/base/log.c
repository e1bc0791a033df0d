/* Logging to stderr, with the rank in the prefix when running as a rank. */
#include "tensorpar/base.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static tp_log_level threshold(void)
{
    /* Read each time: logging is rare, and this keeps the library free of
     * mutable global state. */
    const char *s = getenv("TENSORPAR_LOG");
    if (!s) return TP_LOG_INFO;
    if (!strcmp(s, "debug")) return TP_LOG_DEBUG;
    if (!strcmp(s, "warn")) return TP_LOG_WARN;
    if (!strcmp(s, "error")) return TP_LOG_ERROR;
    return TP_LOG_INFO;
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
