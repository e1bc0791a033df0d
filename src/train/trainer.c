/* The training loop (tensorpar train): data loader -> forward and backward
 * of each row -> global-norm clipping -> optimizer step -> log, the same
 * code on every rank of the TP mesh.  The model's styles do the
 * communication inside forward and backward; clipping and the replica
 * check talk over the mesh; everything else is local to the rank. */
#include "tensorpar/train.h"
#include "checkpoint.h"
#include "tensorpar/models.h"
#include "train/data_parallel.h"
#include "tensorpar/module.h"
#include "tensorpar/lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* LoRA training: the adapters' tensors alone (f32, no masters); a
 * replicated one (A under colwise, B under rowwise) has the same gradient
 * on every rank and is counted once, as is a B split like a KV head that
 * kv_rep ranks hold. */
static tp_status collect_adapters(tp_model *m, tp_train_param *ps, int *n)
{
    size_t count = tp_model_lora_count(m);
    if (count > tp_model_module_count(m) * TP_MODULE_MAX_PARAMS)
        return tp_fail(TP_ERR_INTERNAL, "more adapter tensors than room for them");
    for (size_t k = 0; k < count; k++) {
        const char *name;
        tp_tensor *value, *grad;
        int reps;
        tp_status s = tp_model_lora_tensor(m, k, &name, &value, &grad, &reps);
        if (s) return s;
        unsigned flags = reps == 1 ? 0 : TP_PARAM_COUNTED_ONCE;
        if (strstr(name, "bias")) flags |= TP_PARAM_NO_DECAY;   /* a bias trained with the adapter: HF's rule by name */
        ps[k] = (tp_train_param){name, value, grad, flags, reps == 1 ? 0 : reps};
        *n = (int)k + 1;
    }
    return TP_OK;
}

/* The parameters the optimizer updates: each module parameter with a local
 * shard of its own (a tied lm_head borrows the embedding's), flagged as
 * train.h describes.  A bf16 shard trains through an f32 master copy
 * (masters[k], empty for f32 shards): the optimizer updates the master,
 * and the shard the forward reads is the master rounded to bf16. */
static tp_status collect_params(tp_model *m, tp_train_param **out, tp_tensor **masters, int *n)
{
    size_t cap = tp_model_module_count(m) * TP_MODULE_MAX_PARAMS, k = 0;
    tp_train_param *ps = calloc(cap ? cap : 1, sizeof *ps);
    tp_tensor *ms = calloc(cap ? cap : 1, sizeof *ms);
    *out = ps;
    *masters = ms;
    *n = 0;
    if (!ps || !ms) return tp_fail(TP_ERR_NOMEM, "out of memory");
    if (tp_model_base_frozen(m)) return collect_adapters(m, ps, n);
    for (size_t i = 0; i < tp_model_module_count(m); i++) {
        tp_module *mod = &m->modules[i];
        for (int j = 0; j < mod->n_params; j++) {
            tp_module_param *p = &mod->params[j];
            if (p->tied_to >= 0 || !p->local.data) continue;
            tp_tensor *value = &p->local;
            if (p->local.dtype == TP_BF16) {
                tp_status s = tp_tensor_init(&ms[k], TP_F32, p->local.ndim, p->local.shape);
                if (!s) s = tp_convert(ms[k].data, TP_F32, p->local.data, TP_BF16, (size_t)tp_tensor_numel(&p->local));
                if (s) { *n = (int)k + 1; return tp_fail_context(s, "the f32 master copy of %s", mod->name); }
                value = &ms[k];
            } else if (p->local.dtype != TP_F32) {
                *n = (int)k;
                return tp_fail(TP_ERR_UNSUPPORTED, "%s.%s is %s: training needs f32 or bf16 weights", mod->name,
                               p->suffix, tp_dtype_name(p->local.dtype));
            }
            int reps = tp_model_param_replicas(m, mod, j);
            unsigned flags = (p->kind == TP_PARAM_BIAS || p->kind == TP_PARAM_NORM) ? TP_PARAM_NO_DECAY : 0;
            if (reps != 1) flags |= TP_PARAM_COUNTED_ONCE;
            ps[k++] = (tp_train_param){mod->name, value, &p->grad, flags, reps == 1 ? 0 : reps};
        }
    }
    *n = (int)k;
    return TP_OK;
}

/* The bf16 shards of the model, each its master rounded (after every
 * optimizer step). */
static tp_status round_masters(tp_model *m, const tp_tensor *masters, int n)
{
    int k = 0;
    for (size_t i = 0; i < tp_model_module_count(m); i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            tp_module_param *p = &m->modules[i].params[j];
            if (p->tied_to >= 0 || !p->local.data) continue;
            if (k >= n) return TP_OK;
            if (masters[k].data) {
                tp_status s = tp_convert(p->local.data, TP_BF16, masters[k].data, TP_F32,
                                         (size_t)tp_tensor_numel(&p->local));
                if (s) return s;
            }
            k++;
        }
    return TP_OK;
}

/* At the end: each bf16 shard that the model owns is replaced by its f32
 * master, so what is saved afterwards is the master's values. */
static void adopt_masters(tp_model *m, tp_tensor *masters, int n)
{
    int k = 0;
    for (size_t i = 0; i < tp_model_module_count(m); i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            tp_module_param *p = &m->modules[i].params[j];
            if (p->tied_to >= 0 || !p->local.data) continue;
            if (k >= n) return;
            if (masters[k].data && p->local.owns_data) {
                tp_tensor_release(&p->local);
                p->local = masters[k];
                memset(&masters[k], 0, sizeof masters[k]);
            }
            k++;
        }
    /* A tied parameter borrows its owner's new tensor (as loading does). */
    for (size_t i = 0; i < tp_model_module_count(m); i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            tp_module_param *p = &m->modules[i].params[j];
            if (p->tied_to < 0) continue;
            p->local = m->modules[p->tied_to].params[j].local;
            p->local.owns_data = 0;
        }
}

/* The labels of a row shifted for tp_cross_entropy: out[t] = labels[t+1],
 * the last position predicts nothing. */
static void shift_labels(int64_t *out, const int64_t *labels, int64_t L)
{
    for (int64_t t = 0; t + 1 < L; t++) out[t] = labels[t + 1];
    out[L - 1] = TP_IGNORE_INDEX;
}

/* The eval loss: Σ -log p over every counted label of the eval set divided
 * by their number (token-weighted), forward only. */
static tp_status evaluate(tp_model *m, const tp_dataset *d, double *loss)
{
    int64_t L = d->seq_len, V = m->cfg.vocab_size, counted = 0;
    double total = 0;
    float *logits = malloc((size_t)(L * V) * sizeof(float));
    int64_t *lab = malloc((size_t)L * sizeof(int64_t));
    tp_kv_cache c;
    int have_cache = 0;
    tp_status s = logits && lab ? tp_kv_cache_init(&c, m, L) : tp_fail(TP_ERR_NOMEM, "out of memory");
    have_cache = !s;
    for (int64_t r = 0; !s && r < d->n_rows; r++) {
        double sum = 0;
        tp_kv_cache_reset(&c);
        shift_labels(lab, d->labels + r * L, L);
        int64_t n = tp_data_row_label_count(d->labels + r * L, L);
        s = tp_model_forward(m, &c, d->ids + r * L, L, logits, 1);
        if (!s && n > 0) s = tp_cross_entropy(&sum, NULL, logits, lab, L, V, (double)n, m->pool);
        total += sum;
        counted += n;
    }
    if (have_cache) tp_kv_cache_release(&c);
    free(logits);
    free(lab);
    *loss = counted ? total / (double)counted : NAN;
    return s ? tp_fail_context(s, "evaluating") : TP_OK;
}

typedef struct {
    tp_model *m;
    const tp_mesh *mesh;
    const tp_trainer_options *o;
    tp_data_loader loader;
    tp_train_param *params;
    tp_tensor *masters;            /* f32 masters of bf16 shards, by param */
    int n_params;
    tp_optim *opt;
    tp_lr_schedule sched;
    int64_t *rows, *ids, *labels;
    tp_dp *dp;                     /* data parallelism, or NULL */
} trainer;

/* Forward and backward of one row; under data parallelism between the
 * gathers and reduce-scatters its dp partners run alike. */
static tp_status one_row(trainer *t, const int64_t *ids, const int64_t *labels, int64_t L, double count,
                         double *sum)
{
    if (!t->dp) return tp_model_forward_backward(t->m, ids, labels, L, count, sum, NULL);
    tp_status s = tp_dp_row_begin(t->dp);
    if (!s && tp_data_row_label_count(labels, L) == 0) s = tp_dp_row_idle(t->dp);
    else if (!s) s = tp_model_forward_backward(t->m, ids, labels, L, count, sum, NULL);
    tp_status e = tp_dp_row_end(t->dp);
    return s ? s : e;
}

/* Forward and backward of every row of step s; *loss_sum is the sum of the
 * rows' loss sums, *tokens the rows' real tokens (padding not counted). */
static tp_status accumulate(trainer *t, int64_t s, const tp_data_step *st, double *loss_sum, int64_t *tokens)
{
    int64_t L = t->loader.data->seq_len;
    for (int micro = 0; micro < st->n_micro; micro++) {
        int64_t nr = 0;
        tp_status e = tp_data_loader_micro(&t->loader, s, micro, t->rows, &nr, t->ids, t->labels);
        for (int64_t r = 0; !e && r < nr; r++) {
            double sum = 0;
            /* count > 0 always: a step without labels gives 0 / 0 below. */
            double count = st->label_tokens > 0 ? (double)st->label_tokens : 1.0;
            /* LoRA dropout masks keyed by the step and the dataset row:
             * the same whatever the TP and dp layout (no-op without) */
            tp_model_lora_dropout_key(t->m, 1, t->o->seed, s, t->rows[r]);
            e = one_row(t, t->ids + r * L, t->labels + r * L, L, count, &sum);
            tp_model_lora_dropout_key(t->m, 0, 0, 0, 0);
            *loss_sum += sum;
            *tokens += t->loader.data->lengths ? t->loader.data->lengths[t->rows[r]] : L;
        }
        if (e) return e;
    }
    return TP_OK;
}

static tp_status one_step(trainer *t, int64_t s, tp_train_log_entry *e)
{
    tp_data_step st;
    double sum = 0;
    int64_t tokens = 0;
    float norm = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    tp_status r = tp_data_loader_step(&t->loader, s, &st);
    if (!r) r = tp_model_zero_grad(t->m);
    if (!r && t->dp && tp_dp_sharded(t->dp)) tp_train_params_zero_grad(t->params, t->n_params);
    if (!r) r = accumulate(t, s, &st, &sum, &tokens);
    if (!r && t->dp) r = tp_dp_reduce_loss(t->dp, &sum, &tokens);
    if (!r && t->dp) r = tp_dp_reduce_grads(t->dp, t->params, t->n_params);
    if (r) return r;
    e->step = s + 1;
    e->loss = st.label_tokens > 0 ? sum / (double)st.label_tokens : NAN;
    if (!isfinite(e->loss))
        return tp_fail(TP_ERR_INVALID, "step %lld: the loss is %s%s; training stopped before its update",
                       (long long)(s + 1), isnan(e->loss) ? "nan" : "inf",
                       st.label_tokens > 0 ? "" : " (the step counts no label)");
    if (t->dp) r = tp_dp_clip(t->dp, t->params, t->n_params, t->mesh, t->m->pool, t->o->max_grad_norm, &norm);
    else r = tp_clip_grad_norm(t->params, t->n_params, t->mesh, t->m->pool, t->o->max_grad_norm, &norm);
    if (!r && !isfinite(norm))   /* the update would make every weight nan: keep the last good ones */
        return tp_fail(TP_ERR_INVALID, "step %lld: the gradient norm is %s; training stopped before its update",
                       (long long)(s + 1), isnan(norm) ? "nan" : "inf");
    e->lr = tp_lr_at(&t->sched, s);
    if (!r) r = tp_optim_step(t->opt, e->lr);
    if (!r) r = round_masters(t->m, t->masters, t->n_params);
    if (!r && t->o->check_replicas) r = tp_check_replicated(t->params, t->n_params, t->mesh);
    if (!r && t->o->check_replicas && t->dp) r = tp_dp_check_replicas(t->dp, t->params, t->n_params);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double dt = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    e->grad_norm = norm;
    e->tokens_per_s = dt > 0 ? (double)tokens / dt : 0;
    return r ? tp_fail_context(r, "step %lld", (long long)(s + 1)) : TP_OK;
}

static tp_status setup(trainer *t, const tp_dataset *train, int64_t *total)
{
    const tp_trainer_options *o = t->o;
    int64_t L = train->seq_len;
    tp_status s = o->dp_mesh ? tp_dp_new(t->m, o->dp_mesh, &t->dp) : TP_OK;
    if (s) return s;
    int n_dp = t->dp ? tp_dp_count(t->dp) : 1, dp_index = t->dp ? tp_dp_index(t->dp) : 0;
    int64_t global = o->batch_size * n_dp;
    s = tp_data_loader_init(&t->loader, train, global, o->grad_accum, o->shuffle, o->seed, dp_index, n_dp);
    if (s) return s;
    if (t->loader.steps_per_epoch <= 0)
        return tp_fail(TP_ERR_INVALID, "the data holds %lld sequences, fewer than one micro-batch of %lld",
                       (long long)train->n_rows, (long long)global);
    *total = o->steps > 0 ? o->steps : o->epochs * t->loader.steps_per_epoch;
    if (*total <= 0) return tp_fail(TP_ERR_INVALID, "no training step to run (steps and epochs are 0)");
    t->sched = o->schedule;
    t->sched.total_steps = *total;
    if ((s = tp_lr_schedule_check(&t->sched))) return s;
    t->rows = malloc((size_t)global * sizeof(int64_t));
    t->ids = malloc((size_t)(global * L) * sizeof(int64_t));
    t->labels = malloc((size_t)(global * L) * sizeof(int64_t));
    if (!t->rows || !t->ids || !t->labels) return tp_fail(TP_ERR_NOMEM, "out of memory");
    if ((s = tp_model_zero_grad(t->m))) return s;
    if (t->dp && tp_dp_sharded(t->dp)) {
        /* The optimizer steps the chunks: f32, a bf16 weight's master
         * (data_parallel.c rounds it when it gathers). */
        const tp_train_param *chunks = tp_dp_params(t->dp, &t->n_params);
        t->params = malloc((size_t)(t->n_params ? t->n_params : 1) * sizeof *t->params);
        t->masters = calloc((size_t)(t->n_params ? t->n_params : 1), sizeof *t->masters);
        if (!t->params || !t->masters) return tp_fail(TP_ERR_NOMEM, "out of memory");
        memcpy(t->params, chunks, (size_t)t->n_params * sizeof *t->params);
    } else if ((s = collect_params(t->m, &t->params, &t->masters, &t->n_params))) {
        return s;
    }
    tp_optim_options oo = o->optim;
    if (!oo.pool) oo.pool = t->m->pool;
    return tp_optim_new(&oo, t->params, t->n_params, &t->opt);
}

static tp_status teardown(trainer *t, int ok)
{
    /* Under dp_shard the model gets its whole parameters back (what a
     * save reads). */
    tp_optim_free(t->opt);   /* first: its moments need not outlive the chunks */
    tp_status s = tp_dp_free(t->dp, ok);
    for (int k = 0; t->masters && k < t->n_params; k++) tp_tensor_release(&t->masters[k]);
    free(t->masters);
    free(t->params);
    free(t->rows);
    free(t->ids);
    free(t->labels);
    tp_data_loader_release(&t->loader);
    return s;
}

/* The eval loss; under dp_shard with the root unit gathered meanwhile. */
static tp_status evaluate_dp(trainer *t, const tp_dataset *d, double *loss)
{
    tp_status s = t->dp ? tp_dp_root_gather(t->dp) : TP_OK;
    if (!s) s = evaluate(t->m, d, loss);
    if (t->dp) tp_dp_root_release(t->dp);
    return s;
}

tp_status tp_trainer_run(struct tp_model *m, const tp_mesh *mesh, const tp_dataset *train, const tp_dataset *eval,
                         const tp_trainer_options *o, tp_trainer_result *res)
{
    trainer t = {.m = m, .mesh = mesh, .o = o};
    int64_t total = 0;
    tp_train_log *log = NULL;
    memset(res, 0, sizeof *res);
    if (eval && eval->seq_len != train->seq_len)
        return tp_fail(TP_ERR_INVALID, "the eval data's seq_len differs from the training data's");
    tp_status s = setup(&t, train, &total);
    tp_train_view view = {m, mesh, t.params, t.masters, t.n_params, t.opt, &t.sched, &t.loader, o,
                          t.dp && tp_dp_sharded(t.dp) ? t.dp : NULL, NULL};
    int64_t first = 0;
    if (!s) s = tp_train_checkpoint_open(&view);
    if (!s && o->ckpt.resume_dir) s = tp_train_checkpoint_resume(&view, &first);
    if (!s && first > total)
        s = tp_fail(TP_ERR_INVALID, "the checkpoint is at step %lld, past this run's %lld steps", (long long)first,
                    (long long)total);
    if (!s) s = tp_train_log_open(o->out_dir, total, o->writer, &log);
    if (!s && o->ckpt.resume_dir) s = tp_train_checkpoint_carry_log(&view, log, first);
    for (int64_t k = first; !s && k < total; k++) {
        tp_train_log_entry e = {0};
        s = one_step(&t, k, &e);
        if (!s && eval && (o->eval_every > 0 ? (k + 1) % o->eval_every == 0 : k + 1 == total)) {
            e.has_eval = 1;
            s = evaluate_dp(&t, eval, &e.eval_loss);
        }
        if (!s) s = tp_train_log_step(log, &e);
        if (!s) { res->steps = k + 1; res->last_loss = e.loss; }
        if (!s) s = tp_train_checkpoint_maybe_save(&view, k + 1);
    }
    if (!s) s = tp_train_log_chart(log, NULL, NULL);
    if (!s && !(t.dp && tp_dp_sharded(t.dp))) adopt_masters(m, t.masters, t.n_params);
    tp_train_log_close(log);
    tp_train_checkpoint_close(&view);
    tp_status e = teardown(&t, !s);
    return s ? s : e;
}
