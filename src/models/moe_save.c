/* Saving a mixture-of-experts model reverses the load-time conversion of
 * §6.1 (§6.4): the stacked gate_up_proj [E, 2I, H] and down_proj [E, H, I]
 * become the checkpoint's per-expert gate / up / down tensors again.  No
 * tensor is copied: each per-expert tensor is described as this rank's
 * part of it inside the stacked local shard, for the collective writer —
 * under grouped_gemm the whole tensor on the rank that holds the expert,
 * under packed_colwise / rowwise each rank's rows (gate, up) or columns
 * (down) of I, so the file is the same bytes at any split. */
#include "tp_module.h"

#include <string.h>

typedef struct {
    const tp_model *m;
    const tp_module_param *p;      /* the stacked tensor */
    int64_t e, lo, hi;             /* the expert; its rows [lo, hi) of dim 1 */
    tp_save_tensor *t;
} part_ctx;

static int split_group(const tp_model *m) { return m->tp && m->tp->mesh && m->tp->size > 1; }

/* The rows [lo, hi) of dimension 1 this rank holds (ranges of the slice,
 * in local order): the per-expert tensor's slice along `dim`, and where
 * its first local row starts within the expert's local block. */
static void rows_of(part_ctx *c, int dim, int64_t *local_row)
{
    const tp_param_slice *sl = &c->p->slice;
    tp_param_slice *o = &c->t->slice;
    int64_t at = 0, held = 0;
    *local_row = -1;
    o->dim = dim;
    o->n = 0;
    for (int r = 0; r < sl->n; r++) {
        int64_t a = sl->start[r] > c->lo ? sl->start[r] : c->lo;
        int64_t b = sl->start[r] + sl->len[r] < c->hi ? sl->start[r] + sl->len[r] : c->hi;
        if (a < b) {
            if (*local_row < 0) *local_row = at + (a - sl->start[r]);
            o->start[o->n] = a - c->lo;
            o->len[o->n++] = b - a;
            held += b - a;
        }
        at += sl->len[r];
    }
    c->t->writes = held > 0;
}

static void describe(part_ctx *c, int part)
{
    const tp_module_param *p = c->p;
    const tp_tensor *L = &p->local;
    size_t esz = tp_dtype_size(L->dtype);
    int64_t per_expert = L->shape[1] * L->shape[2], e = c->e, row = 0;
    tp_save_tensor *t = c->t;
    int rank = c->m->tp ? c->m->tp->rank : 0;
    t->slice.dim = -1;
    t->slice.ndim = 2;
    t->writes = !split_group(c->m) || rank == 0;
    if (p->slice.dim == 0) {               /* grouped_gemm: whole experts */
        int64_t e0 = p->slice.start[0];
        t->writes = e >= e0 && e < e0 + p->slice.len[0];
        e = t->writes ? e - e0 : 0;
        row = part == TP_MOE_UP ? c->lo : 0;
    } else if (p->slice.dim == 1) {        /* gate_up rows of I */
        rows_of(c, 0, &row);
        if (row < 0) row = 0;
    } else if (p->slice.dim == 2) {        /* down_proj columns of I */
        c->lo = 0;
        c->hi = p->shape[2];
        rows_of(c, 1, &row);
        row = 0;
    } else {
        row = part == TP_MOE_UP ? c->lo : 0;
    }
    t->local = (const char *)L->data + (size_t)(e * per_expert + row * L->shape[2]) * esz;
    for (int d = 0; d < 2; d++) {
        int64_t n = 0;
        for (int r = 0; t->slice.dim == d && r < t->slice.n; r++) n += t->slice.len[r];
        t->slice.local_shape[d] = t->slice.dim == d ? n : t->shape[d];
    }
}

size_t tp_moe_save_tensors(const tp_model *m, const tp_module *experts, tp_dtype dtype, tp_save_tensor *out)
{
    const tp_module_param *gu = &experts->params[0], *down = &experts->params[1];
    int64_t E = gu->shape[0], I = gu->shape[1] / 2, H = gu->shape[2];
    size_t k = 0;
    for (int64_t e = 0; e < E; e++)
        for (int part = TP_MOE_GATE; part <= TP_MOE_DOWN; part++) {
            tp_save_tensor *t = &out[k++];
            memset(t, 0, sizeof *t);
            tp_moe_expert_name(&m->cfg, experts->layer, e, part, t->name, sizeof t->name);
            t->dtype = dtype;
            t->ndim = 2;
            t->shape[0] = part == TP_MOE_DOWN ? H : I;
            t->shape[1] = part == TP_MOE_DOWN ? I : H;
            part_ctx c = {m, part == TP_MOE_DOWN ? down : gu, e, part == TP_MOE_UP ? I : 0,
                          part == TP_MOE_UP ? 2 * I : I, t};
            t->local_dtype = c.p->local.dtype;
            describe(&c, part);
        }
    return k;
}
