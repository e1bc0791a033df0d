/* Box copies between row-major tensors: the one data movement that slicing,
 * packing pieces for a collective and unpacking them all reduce to. */
#include "dist_internal.h"

#include <string.h>

int64_t tp_dist_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Left-pads a shape/offset to 4 dims so one fixed loop nest serves all. */
static void pad4(int ndim, const int64_t *in, int64_t fill, int64_t *out)
{
    for (int i = 0; i < 4; i++) out[i] = i < 4 - ndim ? fill : in[i - (4 - ndim)];
}

void tp_dist_copy_box(void *dst, const int64_t *dshape, const int64_t *doff,
                      const void *src, const int64_t *sshape, const int64_t *soff,
                      const int64_t *box, int ndim, size_t es)
{
    int64_t D[4], DO[4], S[4], SO[4], B[4];
    pad4(ndim, dshape, 1, D);
    pad4(ndim, doff, 0, DO);
    pad4(ndim, sshape, 1, S);
    pad4(ndim, soff, 0, SO);
    pad4(ndim, box, 1, B);
    if (B[0] * B[1] * B[2] * B[3] == 0) return;
    size_t row = (size_t)B[3] * es;
    for (int64_t a = 0; a < B[0]; a++)
        for (int64_t b = 0; b < B[1]; b++)
            for (int64_t c = 0; c < B[2]; c++) {
                int64_t di = (((DO[0] + a) * D[1] + DO[1] + b) * D[2] + DO[2] + c) * D[3] + DO[3];
                int64_t si = (((SO[0] + a) * S[1] + SO[1] + b) * S[2] + SO[2] + c) * S[3] + SO[3];
                memcpy((char *)dst + (size_t)di * es, (const char *)src + (size_t)si * es, row);
            }
}
