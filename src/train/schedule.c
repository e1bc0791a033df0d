/* HF Trainer's learning-rate schedules (transformers' get_scheduler and the
 * LambdaLR lambdas behind it), as a pure function of the step count.  The
 * lambdas are written from their definitions, in double as Python computes
 * them, so the lr matches Trainer's to the last bit. */
#include "tensorpar/train.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[] = {"constant", "constant_with_warmup", "linear", "cosine"};
#define N_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

const char *tp_lr_kind_name(tp_lr_kind k)
{
    return (int)k >= 0 && (int)k < N_KINDS ? kind_names[k] : "?";
}

tp_status tp_lr_kind_parse(const char *s, tp_lr_kind *out)
{
    for (int k = 0; s && k < N_KINDS; k++)
        if (!strcmp(s, kind_names[k])) return *out = (tp_lr_kind)k, TP_OK;
    return tp_fail(TP_ERR_INVALID, "unknown lr scheduler '%s' (constant, constant_with_warmup, linear, cosine)",
                   s ? s : "");
}

tp_status tp_lr_schedule_check(const tp_lr_schedule *s)
{
    if ((int)s->kind < 0 || (int)s->kind >= N_KINDS)
        return tp_fail(TP_ERR_INVALID, "unknown lr scheduler kind %d", (int)s->kind);
    if (!(s->lr >= 0) || isinf(s->lr)) return tp_fail(TP_ERR_INVALID, "learning rate %g is not a number >= 0", s->lr);
    if (s->warmup_steps < 0) return tp_fail(TP_ERR_INVALID, "warmup steps %lld < 0", (long long)s->warmup_steps);
    if ((s->kind == TP_LR_LINEAR || s->kind == TP_LR_COSINE) && s->total_steps <= 0)
        return tp_fail(TP_ERR_INVALID, "the %s lr scheduler needs the number of training steps",
                       tp_lr_kind_name(s->kind));
    if (!(s->num_cycles >= 0)) return tp_fail(TP_ERR_INVALID, "cosine num_cycles %g < 0", s->num_cycles);
    return TP_OK;
}

static double max_d(double a, double b) { return a > b ? a : b; }

/* float(step) / float(max(1, warmup)): the warmup ramp from 0. */
static double warmup_factor(int64_t step, int64_t warmup)
{
    return (double)step / max_d(1.0, (double)warmup);
}

static double lambda(const tp_lr_schedule *s, int64_t step)
{
    int64_t w = s->warmup_steps, T = s->total_steps;
    switch (s->kind) {
    case TP_LR_CONSTANT:
        return 1.0;
    case TP_LR_CONSTANT_WITH_WARMUP:
        return step < w ? warmup_factor(step, w) : 1.0;
    case TP_LR_LINEAR:
        if (step < w) return warmup_factor(step, w);
        return max_d(0.0, (double)(T - step) / max_d(1.0, (double)(T - w)));
    case TP_LR_COSINE: {
        if (step < w) return warmup_factor(step, w);
        double cycles = s->num_cycles > 0 ? s->num_cycles : 0.5;
        double progress = (double)(step - w) / max_d(1.0, (double)(T - w));
        return max_d(0.0, 0.5 * (1.0 + cos(M_PI * cycles * 2.0 * progress)));
    }
    }
    return 0.0;
}

double tp_lr_at(const tp_lr_schedule *s, int64_t step)
{
    return s->lr * lambda(s, step < 0 ? 0 : step);
}
