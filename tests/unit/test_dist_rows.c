/* tp_redistribute_rows: Partial -> Shard(rows) -> Replicate with a row-wise
 * epilogue, at 2 and 3 ranks (this test re-runs itself as the ranks).  Each
 * rank checks the result bit for bit against a serial computation (the sum
 * in rank order, then the epilogue), on both paths: the single collective
 * (src and dst apart) and the two redistributes (src == dst), and that the
 * epilogue saw exactly this rank's rows of torch.chunk's split. */
#include "check.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/settings.h"

#include <stdlib.h>
#include <string.h>

/* Non-integer values, so that a different summation order shows. */
static float summand(int rank, int64_t i) { return (float)((i * 2654435761u + (uint64_t)rank * 40503u) % 1000) / 7.0f - 60.0f; }

/* The epilogue: scales row r by (r + 1) and adds 0.1; records what it saw. */
typedef struct {
    int64_t row_len, next, seen;
    int bad;
} epi;

static float epi_value(float v, int64_t row) { return v * (float)(row + 1) + 0.1f; }

static void epi_fn(void *p, int64_t first, int64_t nrows, float *rows)
{
    epi *e = p;
    e->bad |= first != e->next;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t j = 0; j < e->row_len; j++) rows[r * e->row_len + j] = epi_value(rows[r * e->row_len + j], first + r);
    e->next = first + nrows;
    e->seen += nrows;
}

static void check_shape(const tp_mesh *mesh, int64_t rows, int64_t row_len, int in_place, int with_epi)
{
    int P = tp_mesh_sizes(mesh)[0], me = tp_mesh_coords(mesh)[0];
    size_t n = (size_t)(rows * row_len);
    float *src = malloc((n + 1) * sizeof *src), *dst = malloc((n + 1) * sizeof *dst);
    float *want = malloc((n + 1) * sizeof *want);
    for (size_t i = 0; i < n; i++) {
        src[i] = summand(me, (int64_t)i);
        float s = summand(0, (int64_t)i);
        for (int r = 1; r < P; r++) s += summand(r, (int64_t)i);
        want[i] = with_epi ? epi_value(s, (int64_t)i / row_len) : s;
    }
    int64_t start, size;
    tp_chunk_range(rows, P, me, &start, &size);
    epi e = {row_len, start, 0, 0};
    tp_redist_epilogue ep = {epi_fn, &e};
    float *out = in_place ? src : dst;
    CHECK(tp_redistribute_rows(mesh, (int64_t[2]){rows, row_len}, src, out, with_epi ? &ep : NULL) == TP_OK);
    CHECK_MSG(memcmp(out, want, n * sizeof *out) == 0, "P=%d rank %d: %lld x %lld%s%s differ", P, me,
              (long long)rows, (long long)row_len, in_place ? " in place" : "", with_epi ? " with epilogue" : "");
    if (with_epi) CHECK_MSG(!e.bad && e.seen == size, "rank %d: epilogue saw %lld rows, want %lld from %lld", me,
                            (long long)e.seen, (long long)size, (long long)start);
    free(src); free(dst); free(want);
}

static int rank_main(void)
{
    tp_group *world;
    tp_mesh *mesh = NULL;
    if (tp_comm_init(&world, NULL) != TP_OK) { fprintf(stderr, "rank: %s\n", tp_error()); return 1; }
    CHECK(tp_mesh_new_1d(world, "tp", &mesh) == TP_OK);
    static const int64_t shapes[][2] = {{1, 5}, {2, 3}, {7, 64}, {64, 96}, {301, 33}};
    for (size_t s = 0; mesh && s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mode = 0; mode < 4; mode++) check_shape(mesh, shapes[s][0], shapes[s][1], mode & 1, mode >> 1);
    tp_mesh_free(mesh);
    tp_group_free(world);
    return check_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (tp_launch_in_job()) return rank_main();
    unsetenv("TENSORPAR_BACKEND"); tp_settings_reload();
    for (int n = 2; n <= 3; n++) {
        int code = -1;
        CHECK(tp_launch_self(n, TP_BACKEND_SHM, argv, &code) == TP_OK);
        CHECK_MSG(code == 0, "%d ranks: exit code %d", n, code);
    }
    return check_summary();
}
