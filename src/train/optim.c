/* AdamW and SGD with torch.optim's semantics, over a list of local shards.
 *
 * The arithmetic is torch 1.13's single-tensor path (foreach=False), in the
 * same order and in f32 with the scalars rounded to f32 where torch rounds
 * them, so that a run agrees with torch.optim to rounding:
 *   AdamW: p *= 1 - lr·wd; m = m·β1 + (1-β1)·g; v = v·β2 + (1-β2)·g·g;
 *          denom = sqrt(v) / sqrt(1-β2^t) + eps;  p += -(lr / (1-β1^t))·m / denom
 *   SGD:   d = g + wd·p; buf = d at the first step, else buf·μ + (1-τ)·d;
 *          d = nesterov ? d + μ·buf : buf;  p += -lr·d
 * Weight decay skips TP_PARAM_NO_DECAY parameters (Trainer's second
 * parameter group, weight_decay 0).  Each parameter's state is a tensor of
 * its local shard's shape, so the state is sharded exactly as the
 * parameter is, and ranks holding the same shard update it identically. */
#include "tensorpar/train.h"
#include "tensorpar/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tp_optim {
    tp_optim_options o;
    tp_train_param *params;
    int n;
    tp_tensor *state;      /* AdamW: 2 per parameter (m, v); SGD: 1 (buf) or 0 */
    int n_state;           /* state tensors per parameter */
    int64_t t;             /* steps taken */
};

void tp_optim_options_default(tp_optim_options *o, tp_optim_kind kind)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
    if (kind == TP_OPTIM_ADAMW) o->beta1 = 0.9, o->beta2 = 0.999, o->eps = 1e-8;
}

const char *tp_optim_kind_name(tp_optim_kind k)
{
    return k == TP_OPTIM_ADAMW ? "adamw" : k == TP_OPTIM_SGD ? "sgd" : "?";
}

tp_status tp_optim_kind_parse(const char *s, tp_optim_kind *out)
{
    if (s && !strcmp(s, "adamw")) return *out = TP_OPTIM_ADAMW, TP_OK;
    if (s && !strcmp(s, "sgd")) return *out = TP_OPTIM_SGD, TP_OK;
    return tp_fail(TP_ERR_INVALID, "unknown optimizer '%s' (adamw, sgd)", s ? s : "");
}

static tp_status check_options(const tp_optim_options *o)
{
    if (o->kind != TP_OPTIM_ADAMW && o->kind != TP_OPTIM_SGD)
        return tp_fail(TP_ERR_INVALID, "unknown optimizer kind %d", (int)o->kind);
    if (!(o->weight_decay >= 0)) return tp_fail(TP_ERR_INVALID, "weight_decay %g < 0", o->weight_decay);
    if (o->kind == TP_OPTIM_ADAMW) {
        if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
            return tp_fail(TP_ERR_INVALID, "AdamW betas (%g, %g) must lie in [0, 1)", o->beta1, o->beta2);
        if (!(o->eps >= 0)) return tp_fail(TP_ERR_INVALID, "AdamW eps %g < 0", o->eps);
        return TP_OK;
    }
    if (!(o->momentum >= 0)) return tp_fail(TP_ERR_INVALID, "SGD momentum %g < 0", o->momentum);
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return tp_fail(TP_ERR_INVALID, "SGD nesterov needs a momentum and zero dampening (as torch.optim.SGD)");
    return TP_OK;
}

tp_status tp_optim_new(const tp_optim_options *o, const tp_train_param *params, int n, tp_optim **out)
{
    *out = NULL;
    tp_status st = check_options(o);
    if (!st) st = tp_train_params_check(params, n);
    if (st) return st;
    tp_optim *opt = calloc(1, sizeof *opt);
    if (!opt) return tp_fail(TP_ERR_NOMEM, "optimizer: out of memory");
    opt->o = *o;
    opt->n = n;
    opt->n_state = o->kind == TP_OPTIM_ADAMW ? 2 : o->momentum != 0 ? 1 : 0;
    opt->params = calloc((size_t)(n ? n : 1), sizeof *opt->params);
    size_t n_states = (size_t)n * (size_t)opt->n_state;
    opt->state = calloc(n_states ? n_states : 1, sizeof *opt->state);
    if (!opt->params || !opt->state) {
        tp_optim_free(opt);
        return tp_fail(TP_ERR_NOMEM, "optimizer: out of memory");
    }
    if (n) memcpy(opt->params, params, (size_t)n * sizeof *params);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < opt->n_state; k++) {
            const tp_tensor *v = params[i].value;
            if ((st = tp_tensor_init(&opt->state[i * opt->n_state + k], TP_F32, v->ndim, v->shape))) {
                tp_optim_free(opt);
                return tp_fail_context(st, "optimizer state of %s", params[i].name);
            }
        }
    *out = opt;
    return TP_OK;
}

void tp_optim_free(tp_optim *opt)
{
    if (!opt) return;
    for (int i = 0; opt->state && i < opt->n * opt->n_state; i++) tp_tensor_release(&opt->state[i]);
    free(opt->state);
    free(opt->params);
    free(opt);
}

int64_t tp_optim_steps(const tp_optim *opt) { return opt->t; }

void tp_optim_set_steps(tp_optim *opt, int64_t t) { opt->t = t; }

tp_status tp_optim_state(const tp_optim *opt, int i, const char *which, const tp_tensor **out)
{
    *out = NULL;
    if (i < 0 || i >= opt->n) return tp_fail(TP_ERR_INVALID, "optimizer state: no parameter %d", i);
    int k = -1;
    if (opt->o.kind == TP_OPTIM_ADAMW) k = !strcmp(which, "exp_avg") ? 0 : !strcmp(which, "exp_avg_sq") ? 1 : -1;
    else if (opt->n_state && !strcmp(which, "momentum_buffer")) k = 0;
    if (k < 0)
        return tp_fail(TP_ERR_INVALID, "%s keeps no state '%s' for %s", tp_optim_kind_name(opt->o.kind), which,
                       opt->params[i].name);
    *out = &opt->state[i * opt->n_state + k];
    return TP_OK;
}

/* The per-step scalars, rounded to f32 where torch hands a Python float to
 * an f32 tensor op. */
typedef struct {
    tp_adamw_consts adamw;
    float decay;           /* SGD: wd */
    float momentum, one_minus_dampening, neg_lr;
    int first;             /* SGD: the momentum buffer is still empty */
} step_consts;

typedef struct {
    const tp_optim *opt;
    step_consts c;
} step_ctx;

static void sgd_range(const step_consts *c, int decay, int nesterov, float *p, const float *g, float *buf,
                      int64_t b, int64_t e)
{
    for (int64_t i = b; i < e; i++) {
        float d = g[i];
        if (decay) d = d + c->decay * p[i];
        if (buf) {
            if (c->first) buf[i] = d;
            else buf[i] = buf[i] * c->momentum + c->one_minus_dampening * d;
            d = nesterov ? d + c->momentum * buf[i] : buf[i];
        }
        p[i] = p[i] + c->neg_lr * d;
    }
}

/* Thread ti of nt takes its share of every parameter; the update is
 * element-wise, so the bits do not depend on the split. */
static void step_part(void *vctx, int ti, int nt)
{
    const step_ctx *sc = vctx;
    const tp_optim *opt = sc->opt;
    for (int i = 0; i < opt->n; i++) {
        const tp_train_param *pa = &opt->params[i];
        int64_t b, e;
        tp_split_range(tp_tensor_numel(pa->value), ti, nt, &b, &e);
        int decay = opt->o.weight_decay != 0 && !(pa->flags & TP_PARAM_NO_DECAY);
        float *p = pa->value->data;
        const float *g = pa->grad->data;
        tp_tensor *s = &opt->state[i * opt->n_state];
        if (opt->o.kind == TP_OPTIM_ADAMW)
            tp_adamw_update(&sc->c.adamw, decay, p + b, g + b, (float *)s[0].data + b, (float *)s[1].data + b, e - b);
        else
            sgd_range(&sc->c, decay, opt->o.nesterov, p, g, opt->n_state ? s[0].data : NULL, b, e);
    }
}

tp_status tp_optim_step(tp_optim *opt, double lr)
{
    if (!(lr >= 0) || isinf(lr)) return tp_fail(TP_ERR_INVALID, "learning rate %g is not a number >= 0", lr);
    const tp_optim_options *o = &opt->o;
    step_ctx sc;
    memset(&sc, 0, sizeof sc);
    sc.opt = opt;
    step_consts *c = &sc.c;
    double t = (double)(opt->t + 1);
    if (o->kind == TP_OPTIM_ADAMW) {
        double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
        tp_adamw_consts *a = &c->adamw;
        a->decay = (float)(1 - lr * o->weight_decay);
        a->beta1 = (float)o->beta1, a->one_minus_beta1 = (float)(1 - o->beta1);
        a->beta2 = (float)o->beta2, a->one_minus_beta2 = (float)(1 - o->beta2);
        a->bc2_sqrt = (float)sqrt(bc2);
        a->eps = (float)o->eps;
        a->neg_step_size = (float)-(lr / bc1);
    } else {
        c->decay = (float)o->weight_decay;
        c->momentum = (float)o->momentum;
        c->one_minus_dampening = (float)(1 - o->dampening);
        c->neg_lr = (float)-lr;
        c->first = opt->t == 0;
    }
    tp_parallel_run(o->pool, step_part, &sc);
    opt->t++;
    return TP_OK;
}
