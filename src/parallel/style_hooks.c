/* The seven hooks of a style (§3.2) and their defaults.  Model code calls
 * tp_style_*(), never a hook pointer directly, so a custom style need fill
 * in only the hooks it changes. */
#include "parallel_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *tp_module_kind_name(tp_module_kind k)
{
    switch (k) {
    case TP_MODULE_LINEAR: return "Linear";
    case TP_MODULE_EMBEDDING: return "Embedding";
    case TP_MODULE_EXPERTS: return "Experts";
    default: return "Module";
    }
}

int tp_param_is_bias_named(const char *short_name)
{
    size_t n = strlen(short_name);
    return !strcmp(short_name, "bias") || (n >= 5 && !strcmp(short_name + n - 5, "_bias"));
}

tp_placement tp_par_shard(int d, int ndim)
{
    return tp_shard(d < 0 ? d + ndim : d);
}

tp_placement tp_par_strided(int d, int ndim, int split)
{
    return tp_strided_shard(d < 0 ? d + ndim : d, split);
}

tp_forward_desc tp_par_desc_passthrough(void)
{
    tp_forward_desc d;
    memset(&d, 0, sizeof d);
    d.installed = 1;
    d.use_local_tensors = 1;
    d.input = d.compute_input = d.local_output = d.output = tp_replicate();
    return d;
}

tp_forward_desc tp_par_desc_local(void)
{
    tp_forward_desc d = tp_par_desc_passthrough();
    d.input_from_model = d.output_from_model = 1;
    return d;
}

tp_status tp_par_forward_local(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d)
{
    (void)st; (void)mod;
    *d = tp_par_desc_local();
    return TP_OK;
}

/* ---- dispatch with defaults -------------------------------------------- */

tp_status tp_style_validate_param(const tp_style *st, const tp_module_ctx *mod,
                                  const tp_param_ctx *p, const char *qualified_name)
{
    return st->validate_param ? st->validate_param(st, mod, p, qualified_name) : TP_OK;
}

tp_status tp_style_shard_param(const tp_style *st, const tp_module_ctx *mod,
                               const tp_param_ctx *p, tp_placement *out)
{
    *out = tp_replicate();
    if (!st->shard_param) return TP_OK;
    tp_status s = st->shard_param(st, mod, p, out);
    if (s) return s;
    /* Placements are kept normalised so that comparing them (tied weights,
     * the digest) never depends on how a style spelled a negative dim. */
    if ((out->kind == TP_SHARD || out->kind == TP_STRIDED_SHARD) && out->dim < 0) out->dim += p->ndim;
    if ((out->kind == TP_SHARD || out->kind == TP_STRIDED_SHARD) && (out->dim < 0 || out->dim >= p->ndim))
        return tp_fail(TP_ERR_INVALID, "style '%s' placed `%s` on dimension %d, which a %d-D parameter does not have",
                       st->name, p->name, out->dim, p->ndim);
    if (out->kind == TP_STRIDED_SHARD && out->split < 1)
        return tp_fail(TP_ERR_INVALID, "style '%s' gave `%s` a StridedShard with split %d", st->name, p->name, out->split);
    return TP_OK;
}

int tp_style_use_local_tensors(const tp_style *st, const tp_module_ctx *mod)
{
    return st->should_use_local_tensors ? st->should_use_local_tensors(st, mod) : 1;
}

/* The default forward: the options' layouts around a plain local computation. */
static void default_desc(const tp_style *st, tp_forward_desc *d)
{
    *d = tp_par_desc_passthrough();
    if (st->opt.has_input_layout) d->input = d->compute_input = st->opt.input_layout;
    if (st->opt.has_output_layout) d->local_output = d->output = st->opt.output_layout;
}

tp_status tp_style_install_forward(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *out)
{
    tp_status s = TP_OK;
    if (st->install_forward) s = st->install_forward(st, mod, out);
    else default_desc(st, out);
    if (!s) {
        out->installed = 1;
        out->use_local_tensors = tp_style_use_local_tensors(st, mod);
        if (st->inference_only) out->inference_only = 1;
        /* The one place that looks at which hook a style left to its
         * default: users of the description read the flag. */
        out->post_forward_moves = !st->transform_output_post_forward;
    }
    return s;
}

tp_status tp_style_context_enter(const tp_style *st, const tp_module_ctx *mod, void **state)
{
    *state = NULL;
    return st->context_enter ? st->context_enter(st, mod, state) : TP_OK;
}

void tp_style_context_leave(const tp_style *st, const tp_module_ctx *mod, void *state)
{
    if (st->context_leave) st->context_leave(st, mod, state);
}

/* Relabels x as `from` (a declaration, not a check: §1.3) and moves it to
 * `to` through dist's redistribute, replacing x's buffer.  With in_place
 * (outputs, whose buffer the module owns), Partial -> Replicate on a 1-D
 * mesh is reduced where it lies: the local shape does not change, and a new
 * buffer per module cost a zero fill, fresh pages and a copy back. */
static tp_status move(tp_dtensor *x, tp_placement from, tp_placement to, int in_place)
{
    if (!x->mesh) return tp_fail(TP_ERR_INVALID, "forward hook: the activation has no mesh");
    if ((from.kind == TP_SHARD || from.kind == TP_STRIDED_SHARD) && from.dim < 0) from.dim += x->ndim;
    if ((to.kind == TP_SHARD || to.kind == TP_STRIDED_SHARD) && to.dim < 0) to.dim += x->ndim;
    x->placements[0] = from;
    if (tp_placement_equal(from, to, x->ndim)) return TP_OK;
    if (in_place && from.kind == TP_PARTIAL && to.kind == TP_REPLICATE && tp_mesh_ndim(x->mesh) == 1) {
        tp_status s = tp_redistribute_local(x->mesh, x->local.dtype, x->ndim, x->shape, &from, x->local.data,
                                            &to, x->local.data);
        if (!s) x->placements[0] = to;
        return s;
    }
    tp_dtensor y;
    tp_status s = tp_redistribute(x, &to, &y);
    if (s) return s;
    tp_dtensor_release(x);
    *x = y;
    return TP_OK;
}

tp_status tp_style_pre_forward(const tp_style *st, const tp_module_ctx *mod,
                               const tp_forward_desc *d, tp_dtensor *x)
{
    if (st->transform_inputs_pre_forward) return st->transform_inputs_pre_forward(st, mod, d, x);
    if (!d->installed || d->ids_input) return TP_OK;   /* token ids are always replicated */
    return move(x, d->input, d->compute_input, 0);
}

/* The rowwise family's bias: added once, after the reduction (§2.5). */
static tp_status add_bias(const tp_module_ctx *mod, tp_dtensor *y)
{
    const tp_tensor *b = mod->bias;
    if (!b || !b->data) return TP_OK;
    if (y->local.dtype != TP_F32 || b->dtype != TP_F32)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: the bias after the all-reduce needs f32 activations and bias", mod->name);
    int64_t width = y->local.shape[y->local.ndim - 1], n = tp_tensor_numel(&y->local);
    if (tp_tensor_numel(b) != width)
        return tp_fail(TP_ERR_INVALID, "%s: bias has %lld elements, output rows %lld", mod->name,
                       (long long)tp_tensor_numel(b), (long long)width);
    float *o = y->local.data;
    const float *bv = b->data;
    for (int64_t i = 0; i < n; i++) o[i] += bv[i % width];
    return TP_OK;
}

tp_status tp_style_post_forward(const tp_style *st, const tp_module_ctx *mod,
                                const tp_forward_desc *d, tp_dtensor *y)
{
    if (st->transform_output_post_forward) return st->transform_output_post_forward(st, mod, d, y);
    if (!d->installed) return TP_OK;
    tp_status s = move(y, d->local_output, d->output, 1);
    if (!s && d->bias_after_reduce) s = add_bias(mod, y);
    return s;
}

/* ---- small shared helpers ---------------------------------------------- */

void tp_par_parent_name(const char *name, char *out, size_t cap)
{
    const char *dot = strrchr(name, '.');
    size_t n = dot ? (size_t)(dot - name) : strlen(name);
    if (n >= cap) n = cap - 1;
    memcpy(out, name, n);
    out[n] = 0;
}

static void buf_reserve(tp_par_buf *b, size_t extra)
{
    if (b->oom || b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) { b->oom = 1; return; }
    b->s = ns;
    b->cap = cap;
}

void tp_par_buf_puts(tp_par_buf *b, const char *s)
{
    size_t n = strlen(s);
    buf_reserve(b, n);
    if (b->oom) return;
    memcpy(b->s + b->n, s, n + 1);
    b->n += n;
}

void tp_par_buf_printf(tp_par_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    buf_reserve(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* Python's str.__repr__ for the strings that occur here: single quotes
 * unless the text holds a ' and no ", backslash and control characters
 * escaped. */
void tp_par_buf_pyrepr(tp_par_buf *b, const char *s)
{
    char q = (strchr(s, '\'') && !strchr(s, '"')) ? '"' : '\'';
    char qs[2] = {q, 0};
    tp_par_buf_puts(b, qs);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\' || *p == (unsigned char)q) tp_par_buf_printf(b, "\\%c", *p);
        else if (*p == '\n') tp_par_buf_puts(b, "\\n");
        else if (*p == '\t') tp_par_buf_puts(b, "\\t");
        else if (*p == '\r') tp_par_buf_puts(b, "\\r");
        else if (*p < 0x20 || *p == 0x7f) tp_par_buf_printf(b, "\\x%02x", *p);
        else { char c[2] = {(char)*p, 0}; tp_par_buf_puts(b, c); }
    }
    tp_par_buf_puts(b, qs);
}

char *tp_par_buf_take(tp_par_buf *b)
{
    if (b->oom) { free(b->s); b->s = NULL; b->n = b->cap = 0; return NULL; }
    if (!b->s) { buf_reserve(b, 0); if (b->oom) return NULL; b->s[0] = 0; }
    char *s = b->s;
    b->s = NULL;
    b->n = b->cap = 0;
    return s;
}
