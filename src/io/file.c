/* Whole-file reads and atomic whole-file writes.
 *
 * Every file tensorpar writes goes through a temporary name and a rename, so
 * a crash or a full disk never leaves a half-written file behind. */
#include "tensorpar/io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

tp_status tp_read_file(const char *path, char **out, size_t *len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (cap - n < 65536) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) { free(buf); fclose(f); return tp_fail(TP_ERR_NOMEM, "%s: out of memory", path); }
            buf = nb; cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return tp_fail(TP_ERR_IO, "%s: read error", path); }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return TP_OK;
}

tp_status tp_write_file_atomic(const char *path, const void *data, size_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(tmp, plen + 16, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        tp_status s = tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
        free(tmp);
        return s;
    }
    int ok = fwrite(data, 1, len, f) == len;
    ok = (fflush(f) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return tp_fail(TP_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    free(tmp);
    return TP_OK;
}
