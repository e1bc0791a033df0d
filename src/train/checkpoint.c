/* Training checkpoints: OUT/checkpoint-<step>/ as Trainer writes them, in
 * safetensors and JSON instead of pickles:
 *
 *   config.json, generation_config.json, tokenizer files, model*.safetensors
 *                        the model as tp_model_save_ex writes it (byte for
 *                        byte the TP = 1 save); under LoRA training instead
 *                        adapter_model.safetensors and adapter_config.json
 *                        as PEFT saves them (the base is frozen: --model's),
 *                        and the optimizer files hold the adapter tensors'
 *                        state only, under PEFT's keys;
 *   optimizer*.safetensors  per parameter, under its HF name + ".exp_avg",
 *                        ".exp_avg_sq" (AdamW) or ".momentum_buffer" (SGD
 *                        with momentum), and ".master" (the f32 values the
 *                        optimizer updates, when the model file holds them
 *                        rounded: bf16 masters, or any parameter of a model
 *                        saved in bf16), full tensors written by the same
 *                        collective writer, so any TP layout reads its
 *                        shards back (shard-on-read);
 *   scheduler.json       the schedule and last_epoch (= the step);
 *   rng_state.json       the shuffle seed: the loop draws no other random
 *                        number (each epoch's order is a function of seed
 *                        and epoch, LoRA's dropout masks of seed, step and
 *                        row);
 *   trainer_state.json   global_step, epoch, max_steps, the optimizer's
 *                        step count and the data position (epoch, index
 *                        into its order, batch size, accumulation,
 *                        shuffle, seed).
 * A resume reads the weights (LoRA: the adapter, cmd_train loading it),
 * the optimizer files and trainer_state.json only: that file holds the step, the seed and the data position, from
 * which the schedule and the shuffle order follow, so scheduler.json and
 * rng_state.json are written for a reader (and Trainer's layout) and are
 * not read back.
 *
 * The directory is written and renamed atomically (models/save_dir.c), so
 * every checkpoint-<step>/ that exists is complete; old ones beyond the
 * limit are first renamed to a temporary name, then removed.
 *
 * Who writes which bytes: one replica saves, the one holding the log's
 * writer.  Its rank 0 creates the temporary directory, every safetensors
 * file at its size with its header (and the index), the JSON files, and
 * renames.  Without dp_shard its TP group saves: each rank pwrite()s its
 * shards (one rank per replicated copy).  Under dp_shard its dp_shard x tp
 * ranks save: each writes the chunks it holds (parameters, moments,
 * masters) as the runs tp_slice_runs gives, a bf16 model file rounding
 * the f32 chunk, so no rank gathers a shard.  Each rank fsyncs what it
 * wrote; the group agrees before the rename.  A resume reads, per rank,
 * only the runs of the part the optimizer holds (the shard or the chunk),
 * whatever layout saved the files. */
#include "checkpoint.h"

#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/io.h"
#include "tensorpar/lora.h"
#include "tensorpar/models.h"
#include "tensorpar/module.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const state_names[] = {"exp_avg", "exp_avg_sq", "momentum_buffer"};

/* The module parameter of optimizer parameter k (module order, tied and
 * empty ones skipped, as the trainer collects them; under dp_shard the
 * chunk's).  *start, *len: the part of the TP shard the optimizer holds. */
static int param_at(const tp_train_view *v, int k, const tp_module **mod, int *j, int64_t *start, int64_t *len)
{
    if (v->dp) {
        int i;
        tp_dp_param_at(v->dp, k, &i, j, start, len);
        *mod = tp_model_module_at(v->m, (size_t)i);
        return 1;
    }
    int at = 0;
    for (size_t i = 0; i < tp_model_module_count(v->m); i++) {
        const tp_module *md = tp_model_module_at(v->m, i);
        for (int q = 0; q < md->n_params; q++) {
            if (md->params[q].tied_to >= 0 || !md->params[q].local.data) continue;
            if (at++ == k) {
                *mod = md, *j = q, *start = 0, *len = tp_tensor_numel(&md->params[q].local);
                return 1;
            }
        }
    }
    return 0;
}

/* The f32 values the optimizer updates are saved beside the model when
 * the model file cannot hold them exactly: a bf16 weight's master, and
 * every f32 parameter of a model saved in bf16 or f16. */
static int needs_master(const tp_train_view *v, int i, const tp_module *mod, int j)
{
    tp_dtype saved = v->m->cfg.dtype;
    /* Under dp_shard the chunk is the master of a bf16 weight. */
    int rounded = v->dp ? mod->params[j].local.dtype != TP_F32 : v->masters && v->masters[i].data;
    return rounded || saved == TP_BF16 || saved == TP_F16;
}

/* A state tensor must be laid out as the optimizer's part of the
 * parameter's TP shard (whole, or its dp_shard chunk). */
static tp_status check_layout(const tp_module *mod, int j, const tp_tensor *st, int64_t len)
{
    const tp_module_param *p = &mod->params[j];
    if (tp_tensor_numel(st) == len) return TP_OK;
    return tp_fail(TP_ERR_INTERNAL, "%s.%s: its optimizer state holds %lld values, the optimizer's part of it %lld",
                   mod->name, p->suffix, (long long)tp_tensor_numel(st), (long long)len);
}

/* Parameter k's tensor `name` as this rank saves it: its TP shard, or
 * under dp_shard the chunk it holds ([start, start + len) of the flat
 * shard), written where it lies in the file without any gather. */
static void save_entry(const tp_train_view *v, const tp_module *mod, int j, const char *name, tp_dtype dtype,
                       const float *data, int64_t start, int64_t len, tp_save_tensor *out)
{
    tp_model_save_tensor(v->m, mod, j, name, dtype, data, TP_F32, out);
    if (!v->dp) return;
    out->part = 1;
    out->part_start = start;
    out->part_len = len;
}

/* LoRA training: the optimizer's parameters are the adapter tensors (f32,
 * no masters, never chunked), their state named after PEFT's keys:
 * "base_model.model.<module>.lora_A.weight.exp_avg". */
static tp_status adapter_optim_tensors(const tp_train_view *v, tp_save_tensor *t, size_t *n)
{
    char name[200];
    size_t k = 0;
    for (int i = 0; i < v->n_params; i++)
        for (size_t q = 0; q < sizeof state_names / sizeof *state_names; q++) {
            const tp_tensor *st;
            if (tp_optim_state(v->opt, i, state_names[q], &st)) { tp_clear_error(); continue; }
            snprintf(name, sizeof name, "%s.%s", v->params[i].name, state_names[q]);
            tp_status s = tp_model_lora_save_tensor(v->m, (size_t)i, name, st->data, &t[k++]);
            if (s) return s;
        }
    *n = k;
    return TP_OK;
}

/* Every state tensor (and master) of every parameter, named. */
static tp_status optim_tensors(const tp_train_view *v, tp_save_tensor **out, size_t *n)
{
    tp_save_tensor *t = calloc((size_t)v->n_params * 4 + 1, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t k = 0;
    char name[160];
    tp_status s = TP_OK;
    if (tp_model_base_frozen(v->m)) {
        s = adapter_optim_tensors(v, t, n);
        if (s) free(t);
        else *out = t;
        return s;
    }
    for (int i = 0; !s && i < v->n_params; i++) {
        const tp_module *mod;
        int j;
        int64_t start, len;
        if (!param_at(v, i, &mod, &j, &start, &len)) { s = tp_fail(TP_ERR_INTERNAL, "optimizer parameter %d has no module", i); break; }
        for (size_t q = 0; !s && q < sizeof state_names / sizeof *state_names; q++) {
            const tp_tensor *st;
            if (tp_optim_state(v->opt, i, state_names[q], &st)) { tp_clear_error(); continue; }
            s = check_layout(mod, j, st, len);
            if (s) break;
            snprintf(name, sizeof name, "%s.%s.%s", mod->name, mod->params[j].suffix, state_names[q]);
            save_entry(v, mod, j, name, TP_F32, st->data, start, len, &t[k++]);
        }
        if (!s && needs_master(v, i, mod, j)) {
            snprintf(name, sizeof name, "%s.%s.master", mod->name, mod->params[j].suffix);
            save_entry(v, mod, j, name, TP_F32, v->params[i].value->data, start, len, &t[k++]);
        }
    }
    if (s) { free(t); return s; }
    *out = t;
    *n = k;
    return TP_OK;
}

/* Under dp_shard: the model's parameters as the chunks this rank holds
 * (the optimizer's values, f32; a bf16 file rounds them as the gather
 * would), in state-dict order (the chunks follow the module order). */
static tp_status model_chunks(const tp_train_view *v, tp_save_tensor **out, size_t *n)
{
    tp_save_tensor *t = calloc((size_t)v->n_params + 1, sizeof *t);
    if (!t) return tp_fail(TP_ERR_NOMEM, "out of memory");
    char name[160];
    for (int i = 0; i < v->n_params; i++) {
        const tp_module *mod;
        int j;
        int64_t start, len;
        if (!param_at(v, i, &mod, &j, &start, &len)) {
            free(t);
            return tp_fail(TP_ERR_INTERNAL, "optimizer parameter %d has no module", i);
        }
        snprintf(name, sizeof name, "%s.%s", mod->name, mod->params[j].suffix);
        save_entry(v, mod, j, name, tp_model_save_dtype(v->m), v->params[i].value->data, start, len, &t[i]);
    }
    *out = t;
    *n = (size_t)v->n_params;
    return TP_OK;
}

static tp_status write_json(const char *dir, const char *file, cJSON *root)
{
    char path[4096], *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len = strlen(text);
    char *buf = realloc(text, len + 2);
    if (!buf) { free(text); return tp_fail(TP_ERR_NOMEM, "out of memory"); }
    buf[len] = '\n';
    tp_status s = tp_write_file_synced(path, buf, len + 1);
    free(buf);
    return s;
}

/* The rows of the epoch's order consumed after `step` steps. */
static int64_t data_index(const tp_data_loader *l, int64_t step)
{
    int64_t in_epoch = step % l->steps_per_epoch;
    int64_t micro = in_epoch * l->grad_accum;
    if (micro > l->micro_per_epoch) micro = l->micro_per_epoch;
    return micro * l->batch_size;
}

/* OUT/train_log.jsonl (flushed after every step) as the checkpoint's
 * log history, for the resumed run's log and chart. */
static tp_status copy_log(const tp_train_view *v, const char *dir)
{
    char from[4096], to[4200], *text = NULL;
    size_t len = 0;
    snprintf(from, sizeof from, "%s/train_log.jsonl", v->o->out_dir);
    if (access(from, F_OK) != 0) return TP_OK;
    snprintf(to, sizeof to, "%s/train_log.jsonl", dir);
    tp_status s = tp_read_file(from, &text, &len);
    if (!s) s = tp_write_file_synced(to, text, len);
    free(text);
    return s;
}

static tp_status write_state_files(const tp_train_view *v, const char *dir, int64_t step)
{
    const tp_data_loader *l = v->loader;
    const tp_lr_schedule *sc = v->sched;
    cJSON *sched = cJSON_CreateObject();
    cJSON_AddStringToObject(sched, "kind", tp_lr_kind_name(sc->kind));
    cJSON_AddNumberToObject(sched, "lr", sc->lr);
    cJSON_AddNumberToObject(sched, "warmup_steps", (double)sc->warmup_steps);
    cJSON_AddNumberToObject(sched, "total_steps", (double)sc->total_steps);
    cJSON_AddNumberToObject(sched, "num_cycles", sc->num_cycles > 0 ? sc->num_cycles : 0.5);
    cJSON_AddNumberToObject(sched, "last_epoch", (double)step);
    tp_status s = write_json(dir, "scheduler.json", sched);
    cJSON *rng = cJSON_CreateObject();
    cJSON_AddNumberToObject(rng, "shuffle_seed", (double)l->seed);
    cJSON_AddBoolToObject(rng, "shuffle", l->shuffle);
    /* LoRA dropout draws from the same seed, keyed by step and row */
    cJSON_AddNumberToObject(rng, "lora_dropout_seed", (double)l->seed);
    if (!s) s = write_json(dir, "rng_state.json", rng);
    else cJSON_Delete(rng);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "global_step", (double)step);
    cJSON_AddNumberToObject(st, "epoch", (double)step / (double)l->steps_per_epoch);
    cJSON_AddNumberToObject(st, "max_steps", (double)sc->total_steps);
    cJSON *opt = cJSON_AddObjectToObject(st, "optimizer");
    cJSON_AddStringToObject(opt, "kind", tp_optim_kind_name(v->o->optim.kind));
    cJSON_AddNumberToObject(opt, "steps", (double)tp_optim_steps(v->opt));
    cJSON *d = cJSON_AddObjectToObject(st, "data");
    cJSON_AddNumberToObject(d, "epoch", (double)(step / l->steps_per_epoch));
    cJSON_AddNumberToObject(d, "index", (double)data_index(l, step));
    cJSON_AddNumberToObject(d, "batch_size", (double)l->batch_size);
    cJSON_AddNumberToObject(d, "grad_accum", (double)l->grad_accum);
    cJSON_AddBoolToObject(d, "shuffle", l->shuffle);
    cJSON_AddNumberToObject(d, "seed", (double)l->seed);
    if (!s) s = write_json(dir, "trainer_state.json", st);
    else cJSON_Delete(st);
    return s ? s : copy_log(v, dir);
}

/* checkpoint-<N> of dir as N, or -1. */
static int64_t checkpoint_step(const char *name)
{
    if (strncmp(name, "checkpoint-", 11) || !name[11] || strspn(name + 11, "0123456789") != strlen(name + 11))
        return -1;
    return strtoll(name + 11, NULL, 10);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The steps of out's checkpoints, ascending, into *steps (malloc'd). */
static tp_status list_checkpoints(const char *out, int64_t **steps, size_t *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(out);
    if (!d) return errno == ENOENT ? TP_OK : tp_fail(TP_ERR_IO, "%s: %s", out, strerror(errno));
    size_t cap = 0;
    struct dirent *e;
    tp_status s = TP_OK;
    while (!s && (e = readdir(d))) {
        int64_t k = checkpoint_step(e->d_name);
        if (k < 0) continue;
        if (*n == cap) {
            int64_t *g = realloc(*steps, (cap = cap ? 2 * cap : 16) * sizeof *g);
            if (!g) { s = tp_fail(TP_ERR_NOMEM, "out of memory"); break; }
            *steps = g;
        }
        (*steps)[(*n)++] = k;
    }
    closedir(d);
    if (!s && *n) qsort(*steps, *n, sizeof **steps, cmp_i64);
    return s;
}

/* Removes the oldest checkpoints beyond the limit: each renamed to a
 * temporary name first, so a half-removed one never looks like one. */
static tp_status rotate(const char *out, int64_t limit)
{
    int64_t *steps;
    size_t n;
    tp_status s = list_checkpoints(out, &steps, &n);
    char from[4096], to[4096];
    for (size_t i = 0; !s && limit > 0 && i + (size_t)limit < n; i++) {
        snprintf(from, sizeof from, "%s/checkpoint-%lld", out, (long long)steps[i]);
        snprintf(to, sizeof to, "%s/.checkpoint-%lld.tmp-%ld", out, (long long)steps[i], (long)getpid());
        if (rename(from, to) != 0) s = tp_fail(TP_ERR_IO, "%s -> %s: %s", from, to, strerror(errno));
        else tp_remove_tree(to);
    }
    free(steps);
    return s;
}

/* A diverged update (finite loss, but weights now inf or nan) must not
 * become the newest checkpoint: the run stops with the last good one. */
static tp_status check_finite(const tp_train_view *v, int64_t step)
{
    for (int i = 0; i < v->n_params; i++) {
        const float *x = v->params[i].value->data;
        int64_t n = tp_tensor_numel(v->params[i].value);
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(x[k]))
                return tp_fail(TP_ERR_INVALID, "step %lld: %s is %s after the update; training stopped without "
                               "saving checkpoint-%lld (the last good checkpoint is kept)", (long long)step,
                               v->params[i].name, isnan(x[k]) ? "nan" : "inf", (long long)step);
    }
    return TP_OK;
}

/* checkpoint-<step> written by the ranks of g (the active replica's):
 * the model's tensors mt (NULL: its TP shards, g its TP group) and the
 * optimizer's ot (NULL: made here from the TP shards). */
static tp_status write_checkpoint(const tp_train_view *v, int64_t step, tp_group *g, const tp_save_tensor *mt,
                                  size_t nm, const tp_save_tensor *ot, size_t no)
{
    const tp_train_checkpointing *c = &v->o->ckpt;
    int me = g ? tp_group_rank(g) : 0;
    char target[4096], tmp[4096];
    snprintf(target, sizeof target, "%s/checkpoint-%lld", v->o->out_dir, (long long)step);
    tp_status s = tp_save_dir_begin(g, 0, target, tmp, sizeof tmp);
    if (s) return s;
    tp_save_tensor *mine = NULL;
    /* LoRA: the adapter in PEFT's format (the frozen base is the --model's;
     * never chunked, so g is the model's TP group) */
    if (tp_model_base_frozen(v->m)) s = tp_model_save_adapter_files(v->m, tmp);
    else s = mt ? tp_model_save_list(g, mt, nm, c->src_dir, tmp, c->max_shard_bytes)
                : tp_model_save_files(v->m, c->src_dir, tmp, c->max_shard_bytes);
    if (!s && !ot && !(s = tp_comm_agree(g, optim_tensors(v, &mine, &no)))) ot = mine;
    if (!s) s = tp_save_tensors(g, 0, tmp, "optimizer", ot, no, c->max_shard_bytes);
    if (!s && me == 0) s = write_state_files(v, tmp, step);
    free(mine);
    s = tp_save_dir_end(g, 0, tmp, target, 0, s);
    if (!s && me == 0) s = rotate(v->o->out_dir, c->save_total_limit);
    return tp_comm_agree(g, s);
}

/* Under dp_shard: the ranks of the writer's replica (dp_shard x tp) write
 * the bytes of the chunks they hold straight into the files; the other
 * replicas hold the same chunks and only agree that the weights are
 * finite. */
static tp_status save_chunks(const tp_train_view *v, int64_t step)
{
    tp_group *g = v->save_group;
    tp_status finite = tp_comm_agree(g, check_finite(v, step));
    int active = 0;
    tp_status s = tp_save_group_active(g, v->o->writer, &active);
    if (s || !active || finite) return s ? s : finite;
    tp_save_tensor *mt = NULL, *ot = NULL;
    size_t nm = 0, no = 0;
    s = model_chunks(v, &mt, &nm);
    if (!s) s = optim_tensors(v, &ot, &no);
    s = tp_comm_agree(g, s);
    if (!s) s = write_checkpoint(v, step, g, mt, nm, ot, no);
    free(mt);
    free(ot);
    return s;
}

tp_status tp_train_checkpoint_maybe_save(const tp_train_view *v, int64_t step)
{
    const tp_train_checkpointing *c = &v->o->ckpt;
    if (c->save_every <= 0 || step % c->save_every != 0) return TP_OK;
    if (v->dp) return save_chunks(v, step);
    /* One copy of the model saves: the TP group of the log's writer. */
    tp_group *g = tp_model_group(v->m);
    int active = 0;
    tp_status s = tp_save_group_active(g, v->o->writer, &active);
    if (s || !active) return s;
    s = tp_comm_agree(g, check_finite(v, step));
    return s ? s : write_checkpoint(v, step, g, NULL, 0, NULL, 0);
}

tp_status tp_train_checkpoint_open(tp_train_view *v)
{
    v->save_group = NULL;
    if (!v->dp || v->o->ckpt.save_every <= 0) return TP_OK;
    static const char *const dims[] = {"dp_shard", "tp"};
    return tp_mesh_group_new(v->o->dp_mesh, dims, 2, &v->save_group);
}

void tp_train_checkpoint_close(tp_train_view *v)
{
    if (v->save_group) tp_group_free(v->save_group);
    v->save_group = NULL;
}

tp_status tp_train_checkpoint_latest(const char *out_dir, char *path, size_t cap)
{
    int64_t *steps;
    size_t n;
    tp_status s = list_checkpoints(out_dir, &steps, &n);
    if (s) return s;
    if (!n) return tp_fail(TP_ERR_INVALID, "--resume latest: no checkpoint-<step> directory in %s", out_dir);
    snprintf(path, cap, "%s/checkpoint-%lld", out_dir, (long long)steps[n - 1]);
    free(steps);
    return TP_OK;
}

/* ---- resuming ---------------------------------------------------------- */

static tp_status open_optimizer(const char *dir, tp_checkpoint **ck)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    return tp_checkpoint_open(ck, path);
}

typedef struct {
    tp_checkpoint *ck;
    const char *name;
    float *dst;          /* element `first` of the shard */
    int64_t first;
} run_reader;

static tp_status read_run(void *ctx, int64_t local, int64_t global, int64_t count)
{
    const run_reader *r = ctx;
    return tp_checkpoint_read_range(r->ck, r->name, global, count, TP_F32, r->dst + (local - r->first));
}

/* Tensor `name` into the optimizer's part [start, start + len) of
 * parameter p's TP shard (all of it, or its dp_shard chunk): only the
 * runs of that part are read, whatever layout saved the file. */
static tp_status read_part(tp_checkpoint *ck, const char *name, const tp_module_param *p, int64_t start, int64_t len,
                           float *dst)
{
    tp_status s = tp_checkpoint_expect_weight(ck, name, p->ndim, p->shape);
    run_reader r = {ck, name, dst, start};
    return s ? s : tp_slice_runs(p->ndim, p->shape, &p->slice, start, len, read_run, &r);
}

/* The adapter tensors' state (LoRA), shard-on-read like the adapter. */
static tp_status read_adapter_optimizer(const tp_train_view *v, tp_checkpoint *ck)
{
    char name[200];
    tp_status s = TP_OK;
    for (int i = 0; !s && i < v->n_params; i++)
        for (size_t q = 0; !s && q < sizeof state_names / sizeof *state_names; q++) {
            const tp_tensor *st;
            if (tp_optim_state(v->opt, i, state_names[q], &st)) { tp_clear_error(); continue; }
            snprintf(name, sizeof name, "%s.%s", v->params[i].name, state_names[q]);
            s = tp_model_lora_read_tensor(v->m, (size_t)i, ck, name, st->data);
        }
    return s;
}

static tp_status read_optimizer(const tp_train_view *v, const char *dir)
{
    tp_checkpoint *ck = NULL;
    tp_status s = open_optimizer(dir, &ck);
    char name[160];
    if (!s && tp_model_base_frozen(v->m)) {
        s = read_adapter_optimizer(v, ck);
        tp_checkpoint_close(ck);
        return s;
    }
    for (int i = 0; !s && i < v->n_params; i++) {
        const tp_module *mod;
        int j;
        int64_t start, len;
        if (!param_at(v, i, &mod, &j, &start, &len)) { s = tp_fail(TP_ERR_INTERNAL, "optimizer parameter %d has no module", i); break; }
        const tp_module_param *p = &mod->params[j];
        for (size_t q = 0; !s && q < sizeof state_names / sizeof *state_names; q++) {
            const tp_tensor *st;
            if (tp_optim_state(v->opt, i, state_names[q], &st)) { tp_clear_error(); continue; }
            snprintf(name, sizeof name, "%s.%s.%s", mod->name, p->suffix, state_names[q]);
            s = check_layout(mod, j, st, len);
            if (!s) s = read_part(ck, name, p, start, len, st->data);
        }
        snprintf(name, sizeof name, "%s.%s.master", mod->name, p->suffix);
        if (!s && tp_checkpoint_find(ck, name)) s = read_part(ck, name, p, start, len, v->params[i].value->data);
    }
    if (ck) tp_checkpoint_close(ck);
    return s;
}

static tp_status read_json(const char *dir, const char *file, cJSON **out)
{
    char path[4096], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    tp_status s = tp_read_file(path, &text, &len);
    if (s) return s;
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    return *out ? TP_OK : tp_fail(TP_ERR_FORMAT, "%s: not valid JSON", path);
}

static double num_at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : cJSON_IsBool(x) ? (cJSON_IsTrue(x) ? 1 : 0) : NAN;
}

/* The run must consume the data as the checkpointed one did. */
static tp_status check_state(const tp_train_view *v, const cJSON *st, const char *dir, int64_t *step)
{
    const tp_data_loader *l = v->loader;
    struct { const char *key; double want; const char *option; } same[] = {
        {"batch_size", (double)l->batch_size, "--batch-size"},
        {"grad_accum", (double)l->grad_accum, "--grad-accum"},
        {"shuffle", (double)(l->shuffle != 0), "--shuffle"},
        {"seed", (double)l->seed, "--seed"},
    };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        double got = num_at(st, "data", same[i].key);
        if (got != same[i].want)
            return tp_fail(TP_ERR_INVALID, "%s/trainer_state.json: the checkpoint was trained with %s %g, this run has %g",
                           dir, same[i].option, got, same[i].want);
    }
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "optimizer"), "kind");
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, tp_optim_kind_name(v->o->optim.kind)))
        return tp_fail(TP_ERR_INVALID, "%s/trainer_state.json: the checkpoint's optimizer is not %s", dir,
                       tp_optim_kind_name(v->o->optim.kind));
    double g = num_at(st, "global_step", NULL), t = num_at(st, "optimizer", "steps");
    if (!(g >= 0) || !(t >= 0)) return tp_fail(TP_ERR_FORMAT, "%s/trainer_state.json: no global_step", dir);
    *step = (int64_t)g;
    tp_optim_set_steps(v->opt, (int64_t)t);
    return TP_OK;
}

tp_status tp_train_checkpoint_resume(const tp_train_view *v, int64_t *step)
{
    const char *dir = v->o->ckpt.resume_dir;
    tp_group *g = tp_model_group(v->m);
    cJSON *st = NULL;
    tp_status s = read_json(dir, "trainer_state.json", &st);
    if (!s) s = check_state(v, st, dir, step);
    cJSON_Delete(st);
    if (!s) s = read_optimizer(v, dir);
    if (v->dp) s = tp_dp_agree(v->dp, s);
    s = tp_comm_agree(g, s);
    return s ? tp_fail_context(s, "resuming from %s", dir) : TP_OK;
}

tp_status tp_train_checkpoint_carry_log(const tp_train_view *v, tp_train_log *log, int64_t step)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/train_log.jsonl", v->o->ckpt.resume_dir);
    if (access(path, F_OK) != 0) return TP_OK;
    return tp_train_log_carry(log, path, step);
}
