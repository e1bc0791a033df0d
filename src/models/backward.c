/* One training step's forward and backward on one sequence: the training
 * forward (the module forwards with tp_forward_pass.save set, keeping their
 * activations), Hugging Face's causal-LM loss, then the modules' backward
 * ops in reverse: lm_head, the final norm, each layer's MLP,
 * post_attention_layernorm, attention and input_layernorm, the embedding.
 * Gradients are added into tp_module_param.grad; a weight kept in row
 * blocks (ZeRO-3's tables, tp_module_row_hooks) hands its gradient to the
 * hooks instead, lm_head's and the loss then running a vocabulary block at
 * a time (head_blocks.c). */
#include "tensorpar/kernels.h"
#include "tensorpar/models.h"
#include "tensorpar/train.h"
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

/* labels shifted inside, as Transformers' ForCausalLMLoss: row t is scored
 * on labels[t + 1]; the last row has no next token. */
static int64_t shift_labels(int64_t *out, const int64_t *labels, int64_t T)
{
    int64_t counted = 0;
    for (int64_t t = 0; t < T; t++) {
        out[t] = t + 1 < T ? labels[t + 1] : TP_IGNORE_INDEX;
        counted += out[t] != TP_IGNORE_INDEX;
    }
    return counted;
}

/* lm_head for the vocabulary-parallel loss: its weight shard, the columns
 * of the vocabulary it covers, and the mesh they are split over (NULL when
 * every rank holds the whole head). */
typedef struct {
    const tp_tensor *W;
    int64_t start, cols;
    const tp_mesh *mesh;
} vp_head;

static tp_status vp_head_of(const tp_model *m, vp_head *h)
{
    const tp_module *lm = &m->modules[m->lm_head];
    const tp_module_param *p = &lm->params[TP_MODULE_WEIGHT];
    int64_t V = m->cfg.vocab_size;
    h->W = &p->local;
    h->start = 0;
    h->cols = V;
    h->mesh = NULL;
    if (lm->tp && lm->tp->plan && lm->tp->plan->fwd.input.kind != TP_REPLICATE)
        return tp_fail(TP_ERR_UNSUPPORTED, "--loss vocab-parallel: %s's input is not replicated under this plan",
                       lm->name);
    if (p->slice.dim < 0 || !m->tp || !m->tp->mesh || m->tp->size < 2) return TP_OK;
    int64_t want0, wantn;
    tp_chunk_range(V, m->tp->size, m->tp->rank, &want0, &wantn);
    if (p->slice.dim != 0 || p->slice.n != 1 || p->slice.start[0] != want0 || p->slice.len[0] != wantn)
        return tp_fail(TP_ERR_UNSUPPORTED, "--loss vocab-parallel: %s's weight is not split in vocabulary chunks "
                       "under this plan", lm->name);
    h->start = want0;
    h->cols = wantn;
    h->mesh = m->tp->mesh;
    return TP_OK;
}

/* lm_head's backward for a vocabulary shard: dW (this shard's rows) +=
 * dlogitsᵀ·h; dh += dlogits·W summed over the ranks (each holds the part
 * of its columns). */
static tp_status vp_head_backward(tp_model *m, const vp_head *h, const float *dlogits, const float *x, int64_t T,
                                  float *dh)
{
    int64_t H = m->cfg.hidden_size;
    float *dw;
    tp_status st = tp_module_grad(m, &m->modules[m->lm_head], TP_MODULE_WEIGHT, &dw);
    if (!st && h->cols > 0) st = tp_matmul_backward_ex(dh, dw, NULL, dlogits, x, T, h->W, m->pool, &m->matmul);
    /* a LoRA adapter's part of dh is partial too (B holds the shard's rows) */
    if (!st) st = tp_lora_backward(m, &m->modules[m->lm_head], x, dlogits, T, dh);
    if (st || !h->mesh) return st;
    tp_placement part = tp_partial(), rep = tp_replicate();
    int64_t shape[2] = {T, H};
    tp_dtensor src, sum;
    st = tp_dtensor_from_local(&src, h->mesh, &part, TP_F32, 2, shape, dh);
    if (st) return st;
    st = tp_redistribute(&src, &rep, &sum);
    tp_dtensor_release(&src);
    if (st) return tp_fail_context(st, "all-reducing lm_head's input gradient");
    memcpy(dh, sum.local.data, (size_t)(T * H) * sizeof(float));
    tp_dtensor_release(&sum);
    return TP_OK;
}

/* How lm_head's logits reach the loss. */
typedef enum {
    HEAD_GATHERED,      /* [T, V] on every rank (one rank, or a plan's own head) */
    HEAD_ROWS,          /* its column shard, whole rows moved to one rank each */
    HEAD_VOCAB,         /* --loss vocab-parallel */
    HEAD_BLOCKS         /* its weight kept in row blocks (head_blocks.c) */
} head_mode;

/* The default loss under a head split by columns and gathered
 * (colwise_gather_output): the gather is replaced by the row-parallel loss,
 * which gives the same bits without [T, V] on any rank. */
static head_mode head_mode_of(const tp_model *m)
{
    if (tp_module_rows_block(m, m->lm_head, TP_MODULE_WEIGHT) > 0) return HEAD_BLOCKS;
    if (m->vocab_parallel_loss) return HEAD_VOCAB;
    if (m->tp && m->tp->mesh && m->tp->size > 1 && tp_module_output_gathers_columns(m, &m->modules[m->lm_head]))
        return HEAD_ROWS;
    return HEAD_GATHERED;
}

/* HEAD_BLOCKS computes the loss inside the backward: its inputs. */
typedef struct {
    const int64_t *labels;
    double count, *loss_sum;
} blocks_loss;

/* dlogits back to every parameter: [T, V] through lm_head's own backward,
 * its column shard through its backward without the gather's (HEAD_ROWS),
 * or this rank's vocabulary shard [T, vp->cols] (HEAD_VOCAB); save holds
 * the forward's activations. */
static tp_status backward(tp_model *m, tp_train_acts *save, tp_kv_cache *kv, const int64_t *tokens, int64_t T,
                          float *dlogits, head_mode mode, const vp_head *vp, const blocks_loss *bl)
{
    int64_t H = m->cfg.hidden_size;
    float *dx = calloc((size_t)(T * H), sizeof(float)), *dh = calloc((size_t)(T * H), sizeof(float));
    tp_status st = dx && dh ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory for the gradients of %lld tokens",
                                              (long long)T);
    tp_backward_pass b = {.saved = save, .acts = save, .cache = kv, .tokens = tokens, .T = T, .dx = dx, .dh = dh,
                          .dy = dlogits, .in = save->h_final, .rows = T};
    const tp_module *lm_head = &m->modules[m->lm_head];
    const tp_module *model = &m->modules[m->modules[m->embed_tokens].parent];
    if (!st && mode == HEAD_BLOCKS)
        st = tp_head_blocks(m, save->h_final, bl->labels, T, bl->count, bl->loss_sum, dh, dlogits);
    else if (!st && mode == HEAD_VOCAB) st = vp_head_backward(m, vp, dlogits, save->h_final, T, dh);
    else if (!st && mode == HEAD_ROWS) st = tp_module_linear_backward_local(m, lm_head, dlogits, save->h_final, T, dh);
    else if (!st) st = lm_head->ops->backward(m, lm_head, &b);
    if (!st) st = model->ops->backward(m, model, &b);
    free(dx);
    free(dh);
    return st;
}

static tp_status check_ids(const tp_model *m, const int64_t *tokens, const int64_t *labels, int64_t T)
{
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= m->cfg.vocab_size)
            return tp_fail(TP_ERR_INVALID, "token id %lld at position %lld is outside the vocabulary [0, %lld)",
                           (long long)tokens[t], (long long)t, (long long)m->cfg.vocab_size);
    for (int64_t t = 0; t < T; t++)
        if (labels[t] != TP_IGNORE_INDEX && (labels[t] < 0 || labels[t] >= m->cfg.vocab_size))
            return tp_fail(TP_ERR_INVALID, "label %lld at position %lld is neither -100 nor a token id of the "
                           "vocabulary [0, %lld)", (long long)labels[t], (long long)t,
                           (long long)m->cfg.vocab_size);
    return TP_OK;
}

/* Spec §2.19: the legacy styles (local_colwise, local_rowwise,
 * local_packed_rowwise, gather, local) define no backward communication,
 * so a training run whose plan uses one is refused with §2.19's message.
 * Every other rule, on a Linear or on a whole block, trains through its
 * style's backward hooks.  An MoE config asking for the router's auxiliary
 * loss is refused too (tp_config_check_training). */
static tp_status check_split(const tp_model *m)
{
    tp_status s = tp_config_check_training(&m->cfg);
    if (s) return s;
    if (!m->tp || !m->tp->res) return TP_OK;
    return tp_plan_check_training(m->tp->res);
}

/* The buffers of a step that outlive it (m->train_ws): every step after
 * the first reuses resident pages instead of faulting in — and having the
 * kernel zero — over a gigabyte of fresh ones (the saved activations, the
 * KV cache, the logits) at 0.6B parameters and 512 tokens. */
struct tp_train_ws {
    tp_arena acts;
    tp_kv_cache kv;
    int has_kv;
    float *logits;
    size_t logits_bytes;
};

void tp_model_train_ws_free(tp_model *m)
{
    struct tp_train_ws *w = m->train_ws;
    if (!w) return;
    tp_arena_release(&w->acts);
    if (w->has_kv) tp_kv_cache_release(&w->kv);
    tp_free(w->logits);
    free(w);
    m->train_ws = NULL;
}

/* The workspace for T tokens and `floats` logits, grown when it must be. */
static tp_status train_ws_get(tp_model *m, int64_t T, size_t floats, struct tp_train_ws **out)
{
    if (!m->train_ws && !(m->train_ws = calloc(1, sizeof *m->train_ws)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    struct tp_train_ws *w = m->train_ws;
    size_t bytes = (floats ? floats : 1) * sizeof(float);
    if (bytes > w->logits_bytes) {
        tp_free(w->logits);
        w->logits_bytes = 0;
        if (!(w->logits = tp_alloc(bytes)))
            return tp_fail(TP_ERR_NOMEM, "out of memory for the logits of %lld tokens", (long long)T);
        w->logits_bytes = bytes;
    }
    if (w->has_kv && w->kv.capacity < T) {
        tp_kv_cache_release(&w->kv);
        w->has_kv = 0;
    }
    if (!w->has_kv) {
        tp_status st = tp_kv_cache_init(&w->kv, m, T);
        if (st) return st;
        w->has_kv = 1;
    }
    tp_kv_cache_reset(&w->kv);
    *out = w;
    return TP_OK;
}

static tp_status step(tp_model *m, const int64_t *tokens, const int64_t *shifted, int64_t T, double count,
                      double *loss_sum)
{
    int64_t V = m->cfg.vocab_size;
    vp_head vp = {0};
    head_mode mode = head_mode_of(m);
    tp_status st = mode == HEAD_VOCAB ? vp_head_of(m, &vp) : TP_OK;
    if (st) return st;
    int64_t cols = mode == HEAD_VOCAB ? vp.cols
                 : mode == HEAD_ROWS ? tp_module_weight(&m->modules[m->lm_head])->shape[0]
                 : mode == HEAD_BLOCKS ? tp_module_rows_block(m, m->lm_head, TP_MODULE_WEIGHT) : V;
    struct tp_train_ws *ws = NULL;
    st = train_ws_get(m, T, (size_t)(T * (cols > 0 ? cols : 1)), &ws);
    if (st) return st;
    tp_kv_cache *kv = &ws->kv;
    float *logits = ws->logits;
    tp_train_acts save;
    st = tp_train_acts_init(&save, m, T, &ws->acts);
    int head_outside = mode == HEAD_VOCAB || mode == HEAD_BLOCKS;   /* run below on save.h_final */
    if (!st) st = tp_model_forward_train(m, kv, tokens, T, head_outside ? NULL : logits, mode == HEAD_ROWS, &save);
    /* the logits become their own gradient */
    if (!st && mode == HEAD_GATHERED) st = tp_cross_entropy(loss_sum, logits, logits, shifted, T, V, count, m->pool);
    if (!st && mode == HEAD_ROWS)
        st = tp_cross_entropy_row_parallel(loss_sum, logits, shifted, T, V, count, m->tp->mesh, m->pool);
    if (mode == HEAD_VOCAB) {
        if (!st && cols > 0) st = tp_matmul_ex(logits, save.h_final, T, vp.W, NULL, m->pool, &m->matmul);
        if (!st && cols > 0) st = tp_lora_apply(m, &m->modules[m->lm_head], save.h_final, T, logits);
        if (!st) st = tp_cross_entropy_vocab_parallel(loss_sum, logits, logits, shifted, T, V, count, vp.mesh, m->pool);
    }
    blocks_loss bl = {shifted, count, loss_sum};
    if (!st) st = backward(m, &save, kv, tokens, T, logits, mode, &vp, &bl);
    tp_train_acts_free(&save);
    return st;
}

tp_status tp_model_forward_backward(tp_model *m, const int64_t *tokens, const int64_t *labels, int64_t T,
                                    double count, double *loss_sum, int64_t *counted)
{
    tp_status st = check_split(m);
    if (st) return st;
    if (T < 2) return tp_fail(TP_ERR_INVALID, "the causal-LM loss needs at least two tokens");
    if (!labels) labels = tokens;
    st = check_ids(m, tokens, labels, T);
    if (st) return st;
    int64_t *shifted = malloc((size_t)T * sizeof *shifted);
    if (!shifted) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t n = shift_labels(shifted, labels, T);
    double sum = 0;
    if (count <= 0) count = (double)n;
    if (n > 0) st = step(m, tokens, shifted, T, count, &sum);
    else if (count <= 0) st = tp_fail(TP_ERR_INVALID, "no position counts in the loss (every label is -100)");
    free(shifted);
    if (!st && loss_sum) *loss_sum = sum;
    if (!st && counted) *counted = n;
    return st;
}
