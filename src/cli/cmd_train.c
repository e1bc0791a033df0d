/* tensorpar train: fine-tunes a model directory on a data file, split over
 * --tp N ranks, and writes the trained model as a Hugging Face directory
 * with its training log and loss chart.  The loop is the library's
 * tp_trainer_run; this file parses options (defaults of HF Trainer's
 * TrainingArguments), loads data and model, and saves. */
#include "tp_cli.h"
#include "tensorpar/io.h"
#include "tensorpar/lora.h"
#include "tensorpar/models.h"
#include "tensorpar/module.h"
#include "tensorpar/text.h"
#include "tensorpar/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_OWN 38

static const cli_option own[N_OWN] = {
    {"--model", "DIR", "model directory (required)", 0, {0}},
    {"--data", "FILE", "training data: .jsonl (input_ids, text or messages) or plain text (required)", 0, {0}},
    {"--out", "DIR", "output: the trained model, train_log.jsonl, loss.png (required)", 0, {0}},
    {"--seq-len", "N", "tokens per sequence (default: min(1024, max_position_embeddings))", 0, {0}},
    {"--batch-size", "N", "sequences per micro-batch on each data-parallel rank (default 8)", 0, {0}},
    {"--grad-accum", "N", "micro-batches per optimizer step (default 1)", 0, {0}},
    {"--lr", "F", "peak learning rate (default 5e-5)", 0, {0}},
    {"--lr-scheduler", "KIND", "constant|constant_with_warmup|linear|cosine (default linear)", 0, {0}},
    {"--warmup-steps", "N", "linear warmup steps (default 0)", 0, {0}},
    {"--weight-decay", "F", "weight decay, not on biases and norms (default 0)", 0, {0}},
    {"--max-grad-norm", "F", "clip the global gradient norm to F; 0: no clipping (default 1.0)", 0, {0}},
    {"--optim", "adamw|sgd", "optimizer (default adamw: betas 0.9/0.999, eps 1e-8)", 0, {0}},
    {"--momentum", "F", "SGD momentum (default 0)", 0, {0}},
    {"--steps", "N", "optimizer steps to run (overrides the epochs)", 0, {0}},
    {"--epochs", "N", "passes over the data (default 3)", 0, {0}},
    {"--seed", "N", "shuffle seed (default 42)", 0, {0}},
    {"--shuffle", NULL, "visit the sequences in a random order per epoch (default)", 0, {0}},
    {"--no-shuffle", NULL, "visit the sequences in file order", 0, {0}},
    {"--eval-data", "FILE", "evaluation data, same formats", 0, {0}},
    {"--eval-every", "N", "evaluate every N steps (default: after the last step)", 0, {0}},
    {"--loss", "default|vocab-parallel", "default: HF's on the gathered logits; vocab-parallel: no rank holds [T, vocab] logits", 0, {0}},
    {"--dtype", "f32|bf16", "weights the forward and backward use (default f32); bf16 trains an f32 master copy", 0, {0}},
    {"--gradient-checkpointing", NULL, "keep only each decoder layer's input; recompute the layer in its backward (same results, less memory)", 0, {0}},
    {"--check-replicas", NULL, "verify after every step that replicated parameters are identical on every rank", 0, {0}},
    {"--threads", "N", "threads per rank (default: cores / local ranks)", 0, {0}},
    {"--save-every", "N", "write OUT/checkpoint-<step>/ (model, optimizer, scheduler, data position) every N steps", 0, {0}},
    {"--save-total-limit", "N", "keep only the newest N checkpoints (default: all)", 0, {0}},
    {"--resume", "DIR|latest", "continue from a checkpoint directory, or OUT's newest checkpoint-<step>", 0, {0}},
    {"--max-shard-size", "BYTES", "split saved safetensors past this size: 5GB, 200MB, 4096 (default 5GB)", 0, {0}},
    {"--lora-r", "R", "train a LoRA adapter of rank R on the frozen model; OUT gets the adapter in PEFT's format", 0, {0}},
    {"--lora-alpha", "A", "LoRA scale numerator: scale = A / R (default 8)", 0, {0}},
    {"--lora-target", "NAMES", "comma-separated modules to adapt (default q_proj,v_proj)", 0, {0}},
    {"--lora-modules-to-save", "NAMES", "comma-separated modules trained in full and saved with the adapter "
     "(PEFT's modules_to_save; f32 weights)", 0, {0}},
    {"--lora-bias", "none|all|lora_only", "biases trained with the adapter: none (default), every one, or the "
     "adapted modules' (PEFT's bias; f32 weights)", 0, {0}},
    {"--lora-dropout", "P", "dropout on the adapters' input in training, masks from --seed (default 0)", 0, {0}},
    {"--adapter", "DIR", "continue training this PEFT LoRA adapter on the frozen model", 0, {0}},
    {"--dp-replicate", "N", "data parallelism: N replicas of the TP-split model, gradients averaged (default 1)", 0, {0}},
    {"--dp-shard", "N", "data parallelism with FSDP/ZeRO-3: parameters, gradients and AdamW state split over N ranks (default 1)", 0, {0}},
};

static int usage(const char *msg)
{
    tp_fail(TP_ERR_INVALID, "%s", msg);
    return cli_usage_error("train");
}

static int get_int(const cli_option *o, int n, const char *name, long long lo, long long *v)
{
    if (cli_int(o, n, name, v)) return -1;
    if (cli_value(o, n, name) && *v < lo) { tp_fail(TP_ERR_INVALID, "%s must be >= %lld, got %lld", name, lo, *v); return -1; }
    return 0;
}

/* HF's max_shard_size: an integer with an optional decimal unit. */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    static const struct { const char *unit; uint64_t mul; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"KIB", 1024},
        {"MIB", 1048576}, {"GIB", 1073741824},
    };
    char u[8] = {0};
    for (int i = 0; end[i] && i < 7; i++) u[i] = (char)(end[i] >= 'a' && end[i] <= 'z' ? end[i] - 32 : end[i]);
    if (end == s || strlen(end) > 3 || v == 0) return -1;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(u, units[i].unit)) { *out = (uint64_t)v * units[i].mul; return 0; }
    return -1;
}

/* Every option into the trainer's options; 0 or a usage error's status. */
static int parse_train(const cli_option *o, int n, tp_trainer_options *t, long long *seq_len)
{
    long long bs = 8, ga = 1, warm = 0, steps = 0, epochs = 3, seed = 42, every = 0;
    double lr = 5e-5, wd = 0, clip = 1.0, mom = 0;
    if (get_int(o, n, "--batch-size", 1, &bs) || get_int(o, n, "--grad-accum", 1, &ga) ||
        get_int(o, n, "--warmup-steps", 0, &warm) || get_int(o, n, "--steps", 1, &steps) ||
        get_int(o, n, "--epochs", 1, &epochs) || get_int(o, n, "--seed", 0, &seed) ||
        get_int(o, n, "--eval-every", 1, &every) || get_int(o, n, "--seq-len", 2, seq_len) ||
        cli_double(o, n, "--lr", &lr) || cli_double(o, n, "--weight-decay", &wd) ||
        cli_double(o, n, "--max-grad-norm", &clip) || cli_double(o, n, "--momentum", &mom))
        return cli_usage_error("train");
    if (cli_value(o, n, "--steps") && cli_value(o, n, "--epochs")) return usage("give --steps or --epochs, not both");
    if (cli_flag(o, n, "--shuffle") && cli_flag(o, n, "--no-shuffle"))
        return usage("give --shuffle or --no-shuffle, not both");
    if (cli_value(o, n, "--eval-every") && !cli_value(o, n, "--eval-data")) return usage("--eval-every needs --eval-data");
    long long save_every = 0, limit = 0;
    if (get_int(o, n, "--save-every", 1, &save_every) || get_int(o, n, "--save-total-limit", 1, &limit))
        return cli_usage_error("train");
    if (limit && !save_every) return usage("--save-total-limit needs --save-every");
    t->ckpt.save_every = save_every;
    t->ckpt.save_total_limit = limit;
    const char *ms = cli_value(o, n, "--max-shard-size");
    if (ms && parse_size(ms, &t->ckpt.max_shard_bytes)) return usage("--max-shard-size expects bytes, e.g. 5GB, 200MB or 4096");
    const char *loss = cli_value(o, n, "--loss"), *dt = cli_value(o, n, "--dtype");
    if (loss && strcmp(loss, "default") && strcmp(loss, "vocab-parallel"))
        return usage("--loss expects default or vocab-parallel");
    if (dt && strcmp(dt, "f32") && strcmp(dt, "bf16")) return usage("--dtype expects f32 or bf16");
    tp_optim_kind ok = TP_OPTIM_ADAMW;
    const char *os = cli_value(o, n, "--optim"), *ls = cli_value(o, n, "--lr-scheduler");
    if (os && tp_optim_kind_parse(os, &ok)) return cli_usage_error("train");
    tp_optim_options_default(&t->optim, ok);
    t->optim.weight_decay = wd;
    t->optim.momentum = mom;
    if (cli_value(o, n, "--momentum") && ok != TP_OPTIM_SGD) return usage("--momentum is for --optim sgd");
    t->schedule = (tp_lr_schedule){.kind = TP_LR_LINEAR, .lr = lr, .warmup_steps = warm};
    if (ls && tp_lr_kind_parse(ls, &t->schedule.kind)) return cli_usage_error("train");
    t->schedule.total_steps = 1;   /* checked here for lr and warmup; the loop sets the real count */
    if (tp_lr_schedule_check(&t->schedule)) return cli_usage_error("train");
    t->batch_size = bs; t->grad_accum = ga; t->steps = steps; t->epochs = epochs;
    t->seed = (uint64_t)seed; t->shuffle = !cli_flag(o, n, "--no-shuffle");
    t->max_grad_norm = clip; t->eval_every = every;
    t->check_replicas = cli_flag(o, n, "--check-replicas");
    return 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The model's tokenizer, chat template and special ids as far as they
 * exist: an input_ids file needs none of them. */
typedef struct {
    tp_tokenizer *tok;
    tp_chat_template *tpl;
    tp_data_options d;
} data_ctx;

static tp_status data_ctx_init(data_ctx *c, const char *dir, int64_t seq_len)
{
    tp_model_config cfg;
    char path[4096];
    memset(c, 0, sizeof *c);
    tp_status s = tp_config_load(&cfg, dir);
    if (!s) s = tp_config_check_training(&cfg);   /* before anything is written */
    if (s) return s;
    c->d.seq_len = seq_len > 0 ? seq_len : (cfg.max_position_embeddings < 1024 ? cfg.max_position_embeddings : 1024);
    c->d.vocab = cfg.vocab_size;
    c->d.pad_id = -1;
    for (int i = 0; i < cfg.n_eos; i++) c->d.eos_ids[c->d.n_eos++] = cfg.eos_token_ids[i];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (exists(path)) {
        int64_t eos = -1, pad = -1;
        if ((s = tp_tokenizer_load(&c->tok, dir)) || (s = tp_data_special_ids(dir, c->tok, &eos, &pad))) return s;
        c->d.tok = c->tok;
        c->d.pad_id = pad;
        if (!c->d.n_eos && eos >= 0) c->d.eos_ids[c->d.n_eos++] = eos;
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        if (exists(path) && tp_chat_template_load(&c->tpl, dir) == TP_OK) c->d.chat = c->tpl;
        tp_clear_error();
    }
    /* Without any eos id, id 0 pads input_ids rows (their labels are -100,
     * so the choice does not change the loss). */
    if (!c->d.n_eos) c->d.eos_ids[c->d.n_eos++] = 0;
    return TP_OK;
}

static void data_ctx_free(data_ctx *c)
{
    if (c->tok) tp_tokenizer_free(c->tok);
    if (c->tpl) tp_chat_template_free(c->tpl);
}

/* Both datasets, refused (naming file and line) before any rank starts. */
static tp_status load_data(const char *dir, long long seq_len, const char *train, const char *eval, tp_dataset *dt,
                           tp_dataset *de)
{
    data_ctx c;
    tp_status s = data_ctx_init(&c, dir, seq_len);
    if (!s) s = tp_dataset_load(dt, train, &c.d);
    if (!s && eval) s = tp_dataset_load(de, eval, &c.d);
    data_ctx_free(&c);
    return s;
}

/* LoRA options: an adapter to train (fresh: r > 0, or resumed: adapter). */
typedef struct {
    long long r;
    double alpha, dropout;
    const char *target, *adapter, *save, *bias;
} lora_opts;

static int parse_lora(const cli_option *o, int n, lora_opts *l)
{
    l->r = 0;
    l->alpha = 8.0;
    l->dropout = 0.0;
    l->target = cli_value(o, n, "--lora-target");
    l->adapter = cli_value(o, n, "--adapter");
    l->save = cli_value(o, n, "--lora-modules-to-save");
    l->bias = cli_value(o, n, "--lora-bias");
    if (cli_int(o, n, "--lora-r", &l->r) || cli_double(o, n, "--lora-alpha", &l->alpha) ||
        cli_double(o, n, "--lora-dropout", &l->dropout))
        return cli_usage_error("train");
    int any = l->r || l->target || l->save || l->bias || cli_value(o, n, "--lora-alpha") ||
              cli_value(o, n, "--lora-dropout");
    if (cli_value(o, n, "--lora-r") && l->r < 1) return usage("--lora-r must be >= 1");
    if (l->adapter && any) return usage("--adapter resumes an adapter with its own adapter_config.json; "
                                        "it takes no --lora-* option");
    if (any && !l->r)
        return usage("--lora-alpha, --lora-target, --lora-dropout, --lora-bias and --lora-modules-to-save need "
                     "--lora-r");
    return 0;
}

/* A resumed LoRA run continues the checkpoint's adapter, which must be
 * the one this run's --lora-* options describe (--adapter: the start the
 * checkpoint came from, replaced by it). */
static tp_status lora_resume(tp_model *m, const lora_opts *l, const char *ckpt)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", ckpt);
    if (!exists(path))
        return tp_fail(TP_ERR_INVALID, "--resume %s: not a LoRA checkpoint (no adapter_config.json); resume it "
                       "without the --lora-* and --adapter options", ckpt);
    tp_lora_config run, saved;
    memset(&saved, 0, sizeof saved);
    tp_status s = TP_OK;
    if (l->r && !(s = tp_lora_config_make(&run, l->r, l->alpha, l->dropout, l->target ? l->target : "q_proj,v_proj"))) {
        if (l->save) s = tp_lora_config_set_saved(&run, l->save);
        if (!s && l->bias) s = tp_lora_config_set_bias(&run, l->bias, "--lora-bias");
        if (!s) s = tp_lora_config_load(&saved, ckpt);
        if (!s) s = tp_lora_config_same(&run, &saved, path);
        tp_lora_config_free(&saved);
        tp_lora_config_free(&run);
    }
    if (!s) s = tp_model_load_adapter(m, ckpt, 0);
    return s ? s : tp_model_lora_train(m);
}

/* Attaches the adapter to train and freezes the base. */
static tp_status lora_attach(tp_model *m, const lora_opts *l, uint64_t seed, const char *resume)
{
    tp_status s;
    if (resume) return lora_resume(m, l, resume);
    if (l->adapter) {
        s = tp_model_load_adapter(m, l->adapter, 0);
    } else {
        tp_lora_config c;
        s = tp_lora_config_make(&c, l->r, l->alpha, l->dropout, l->target ? l->target : "q_proj,v_proj");
        if (!s && l->save) s = tp_lora_config_set_saved(&c, l->save);
        if (!s && l->bias) s = tp_lora_config_set_bias(&c, l->bias, "--lora-bias");
        if (!s) s = tp_model_lora_init(m, &c, seed);
        tp_lora_config_free(&c);
    }
    return s ? s : tp_model_lora_train(m);
}

static tp_status train_and_save(const char *dir, const char *out, cli_tp *tp, tp_model_options *mo, tp_dataset *dt,
                                tp_dataset *de, tp_trainer_options *t, int vocab_parallel, const lora_opts *lora,
                                int grad_ckpt)
{
    tp_model *m;
    mo->mesh = cli_tp_mesh(tp);
    mo->tp_plan = tp->plan;
    mo->expert_parallel = tp->ep && tp->tp_size > 1;
    t->ckpt.src_dir = dir;
    /* Resuming: the weights are the checkpoint's (LoRA: the adapter; the
     * frozen base is --model's). */
    int adapting = lora->r > 0 || lora->adapter;
    const char *resume = t->ckpt.resume_dir;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/adapter_config.json", resume ? resume : "");
    if (resume && !adapting && exists(probe))
        return tp_fail(TP_ERR_INVALID, "--resume %s: a LoRA checkpoint; resume it with the run's --lora-* options "
                       "(or --adapter)", resume);
    tp_status s = tp_model_load(&m, resume && !adapting ? resume : dir, mo);
    if (s) return s;
    m->vocab_parallel_loss = vocab_parallel;
    m->gradient_checkpointing = grad_ckpt;
    if (adapting && (s = lora_attach(m, lora, t->seed, resume))) { tp_model_free(m); return s; }
    tp_trainer_result r;
    t->out_dir = out;
    t->writer = tp->rank == 0;
    t->dp_mesh = tp->grid;
    s = tp_trainer_run(m, cli_tp_mesh(tp), dt, de->n_rows ? de : NULL, t, &r);
    tp_save_options so = {.max_shard_bytes = t->ckpt.max_shard_bytes, .into_existing = 1};
    int active = 0;
    if (!s) s = tp_save_group_active(tp_model_group(m), t->writer, &active);
    if (!s && active) s = adapting ? tp_model_save_adapter(m, out) : tp_model_save_ex(m, dir, out, &so);
    tp_model_free(m);
    return s;
}

/* --resume DIR or latest (OUT's newest checkpoint), resolved by rank 0
 * after it put back a checkpoint that a crash left aside
 * (io/atomic_dir.c), and sent to every rank so all read the same one. */
static tp_status resume_dir(const char *arg, const char *out, cli_tp *tp, char *buf, size_t cap)
{
    tp_status s = TP_OK;
    memset(buf, 0, cap);
    if (tp->rank == 0) {
        if (!strcmp(arg, "latest")) {
            s = tp_atomic_dir_recover_all(out);
            if (!s) s = tp_train_checkpoint_latest(out, buf, cap);
        } else if (snprintf(buf, cap, "%s", arg) >= (int)cap) {
            s = tp_fail(TP_ERR_INVALID, "--resume: path too long");
        }
        if (!s) s = tp_atomic_dir_recover(buf);
        if (!s && !exists(buf)) s = tp_fail(TP_ERR_IO, "--resume %s: no such directory", buf);
    }
    s = tp_comm_agree(tp->world, s);
    if (!s && tp->world) s = tp_comm_broadcast(tp->world, buf, cap, TP_U8, 0);
    buf[cap - 1] = 0;
    return s;
}

int cmd_train(int argc, char **argv)
{
    cli_option o[N_OWN + CLI_TP_N_OPTIONS];
    memcpy(o, own, sizeof own);
    memcpy(o + N_OWN, cli_tp_options, sizeof cli_tp_options);
    int n = N_OWN + CLI_TP_N_OPTIONS;
    int rc = cli_parse(argc, argv, o, n, "tensorpar train --model DIR --data FILE --out DIR [--tp N] [options]",
                       "Fine-tunes the model on the data (HF causal-LM loss, AdamW, HF Trainer's defaults) and "
                       "writes the trained model, train_log.jsonl and loss.png to --out.", NULL, NULL);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    const char *dir = cli_value(o, n, "--model"), *data = cli_value(o, n, "--data"), *out = cli_value(o, n, "--out");
    if (!dir || !data || !out) return usage("--model, --data and --out are required (see --help)");
    tp_trainer_options t = {0};
    long long seq_len = 0;
    if ((rc = parse_train(o, n, &t, &seq_len))) return rc;
    lora_opts lora;
    if ((rc = parse_lora(o, n, &lora))) return rc;
    if ((rc = cli_check_dir("train", "--model", dir))) return rc;
    tp_dataset dt = {0}, de = {0};
    const char *eval = cli_value(o, n, "--eval-data");
    /* Parsed once per process: a rank (one process, or one of a job) keeps
     * what it loaded; a process that starts the ranks (--tp N from a shell)
     * only checks the files, each rank loading its own copy. */
    if (load_data(dir, seq_len, data, eval, &dt, &de)) return cli_report("train");
    long long dpr = 1, dps = 1;
    if (get_int(o, n, "--dp-replicate", 1, &dpr) || get_int(o, n, "--dp-shard", 1, &dps)) {
        tp_dataset_release(&dt);
        tp_dataset_release(&de);
        return cli_usage_error("train");
    }
    const char *dt_name = cli_value(o, n, "--dtype");
    long long want = 1;
    if (!tp_launch_in_job() && !cli_int(o, n, "--tp", &want) && want * dpr * dps > 1) {
        tp_dataset_release(&dt);
        tp_dataset_release(&de);
    }
    cli_tp tp;
    if (cli_tp_begin_dp("train", argc, argv, o, n, dir, (int)dpr, (int)dps, &tp, &rc)) {
        tp_dataset_release(&dt);
        tp_dataset_release(&de);
        cli_tp_end(&tp);
        return rc;
    }
    tp_model_options mo = {.threads = 1, .show_progress = isatty(2) && tp.rank == 0};
    if (cli_tp_threads(o, n, &tp, &mo)) {
        tp_dataset_release(&dt);
        tp_dataset_release(&de);
        cli_tp_end(&tp);
        return cli_report("train");
    }
    tp_status s = TP_OK;
    mo.weight_dtype = dt_name && !strcmp(dt_name, "bf16") ? TP_BF16 : TP_F32;
    char resume[4096];
    if (!s && cli_value(o, n, "--resume")) {   /* collective: every rank takes part */
        s = resume_dir(cli_value(o, n, "--resume"), out, &tp, resume, sizeof resume);
        t.ckpt.resume_dir = resume;
    }
    if (!cli_tp_agree("train", &tp, s != TP_OK)) {
        const char *loss = cli_value(o, n, "--loss");
        s = train_and_save(dir, out, &tp, &mo, &dt, &de, &t, loss && !strcmp(loss, "vocab-parallel"), &lora,
                           cli_flag(o, n, "--gradient-checkpointing"));
        rc = cli_tp_agree("train", &tp, s != TP_OK);
    } else {
        rc = 1;
    }
    tp_dataset_release(&dt);
    tp_dataset_release(&de);
    cli_tp_end(&tp);
    return rc ? CLI_EXIT_RUNTIME : 0;
}
