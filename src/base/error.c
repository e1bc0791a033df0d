/* Status codes and the per-thread error message.
 *
 * The buffer is thread-local so that worker threads (and the ranks' helper
 * threads) never overwrite each other's message; no locking is needed. */
#include "tensorpar/base.h"

#include <stdarg.h>
#include <string.h>

#define TP_ERROR_CAP 2048

static _Thread_local char error_buf[TP_ERROR_CAP];

const char *tp_error(void) { return error_buf; }

void tp_clear_error(void) { error_buf[0] = '\0'; }

tp_status tp_fail(tp_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
    return code;
}

tp_status tp_fail_context(tp_status code, const char *fmt, ...)
{
    char old[TP_ERROR_CAP];
    memcpy(old, error_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
    /* Append ": <old>" by hand: the result is meant to be cut at the
     * buffer's end, which snprintf would (rightly) warn about. */
    if (n >= 0 && old[0]) {
        size_t used = (size_t)n < sizeof error_buf ? (size_t)n : sizeof error_buf - 1;
        size_t room = sizeof error_buf - 1 - used;
        size_t oldlen = strlen(old);
        if (room >= 2) {
            memcpy(error_buf + used, ": ", 2);
            used += 2;
            room -= 2;
            if (oldlen > room) oldlen = room;
            memcpy(error_buf + used, old, oldlen);
            used += oldlen;
        }
        error_buf[used] = '\0';
    }
    return code;
}

const char *tp_status_name(tp_status s)
{
    switch (s) {
    case TP_OK: return "ok";
    case TP_ERR_INVALID: return "invalid argument";
    case TP_ERR_IO: return "I/O error";
    case TP_ERR_FORMAT: return "malformed input";
    case TP_ERR_NOMEM: return "out of memory";
    case TP_ERR_UNSUPPORTED: return "unsupported";
    case TP_ERR_COMM: return "communication error";
    case TP_ERR_TIMEOUT: return "timeout";
    case TP_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
