/* NumPy .npy output (format version 1.0), the way tests and users read
 * logits: np.load("logits.npy") gives float32 [T, vocab]. */
#include "tensorpar/io.h"

#include <stdlib.h>
#include <string.h>

tp_status tp_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape)
{
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)shape[i],
                      i + 1 < ndim ? " " : "");
        count *= (size_t)shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* magic(6) + version(2) + header length(2) + dict + padding + '\n' is a
     * multiple of 64, as the format asks. */
    size_t header = 10 + (size_t)n + 1;
    size_t padded = (header + 63) / 64 * 64;
    size_t total = padded + count * sizeof(float);
    unsigned char *buf = malloc(total);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "%s: out of memory", path);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    uint16_t hlen = (uint16_t)(padded - 10);
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, dict, (size_t)n);
    memset(buf + 10 + n, ' ', padded - 10 - (size_t)n - 1);
    buf[padded - 1] = '\n';
    memcpy(buf + padded, data, count * sizeof(float));
    tp_status s = tp_write_file_atomic(path, buf, total);
    free(buf);
    return s;
}
