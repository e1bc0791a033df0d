/* models/backward.c and the modules' backward ops, on one rank: the loss
 * is the causal-LM loss of the inference forward's logits (labels shifted,
 * -100 skipped, divided by the count given); gradients match central
 * finite differences of that loss; they accumulate and scale with the
 * count; the training step leaves the activation arena empty and the
 * inference logits unchanged.  On a tiny Qwen3 model (q/k norms, GQA) made
 * in a temporary directory. */
#include "check.h"
#include "tmpdir.h"
#include "models/tp_module.h"
#include "tensorpar/models.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T 12

static tp_status logits_of(tp_model *m, const int64_t *ids, float *logits)
{
    tp_kv_cache kv;
    tp_status s = tp_kv_cache_init(&kv, m, T);
    if (s) return s;
    s = tp_model_forward(m, &kv, ids, T, logits, 1);
    tp_kv_cache_release(&kv);
    return s;
}

/* Σ over rows t < T-1 whose next label counts of -log softmax(logits[t])[label[t+1]], in double. */
static double loss_sum_of(const float *logits, const int64_t *labels, int64_t V)
{
    double sum = 0;
    for (int t = 0; t + 1 < T; t++) {
        if (labels[t + 1] == -100) continue;
        const float *z = logits + (size_t)t * (size_t)V;
        double mx = z[0], se = 0;
        for (int64_t v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        for (int64_t v = 0; v < V; v++) se += exp(z[v] - mx);
        sum += mx + log(se) - z[labels[t + 1]];
    }
    return sum;
}

static double loss_at(tp_model *m, const int64_t *ids, float *logits)
{
    return logits_of(m, ids, logits) == TP_OK ? loss_sum_of(logits, ids, m->cfg.vocab_size) / (T - 1) : NAN;
}

static const tp_module_param *param(const tp_model *m, const char *module, int j)
{
    int i = tp_model_module_find(m, module);
    return i < 0 ? NULL : &tp_model_module_at(m, (size_t)i)->params[j];
}

/* The largest entry of a parameter's gradient against (L(w+h) - L(w-h)) / 2h. */
static void check_fd(tp_model *m, const int64_t *ids, float *logits, const char *module)
{
    const tp_module_param *p = param(m, module, TP_MODULE_WEIGHT);
    CHECK_MSG(p && p->grad.data, "%s", module);
    if (!p || !p->grad.data) return;
    const float *g = p->grad.data;
    float *w = p->local.data;
    size_t n = tp_tensor_nbytes(&p->grad) / sizeof(float), at = 0;
    for (size_t i = 1; i < n; i++) if (fabsf(g[i]) > fabsf(g[at])) at = i;
    float w0 = w[at], h = 1e-2f;
    double f[4];   /* L at w0 + h, w0 - h, w0 + 2h, w0 - 2h */
    const float step[4] = {h, -h, 2 * h, -2 * h};
    for (int k = 0; k < 4; k++) {
        w[at] = w0 + step[k];
        f[k] = loss_at(m, ids, logits);
    }
    w[at] = w0;
    /* the fourth-order central difference: truncation O(h^4) */
    double fd = (8.0 * (f[0] - f[1]) - (f[2] - f[3])) / (12.0 * h);
    CHECK_MSG(fabs(fd - g[at]) <= 1e-3 * fabs(g[at]) + 2e-5, "%s[%zu]: backward %.6g, finite difference %.6g",
              module, at, g[at], fd);
    CHECK_MSG(fabs(g[at]) > 1e-4, "%s: largest gradient entry %.3g (too small to test)", module, g[at]);
}

static void copy_grad(const tp_model *m, const char *module, float *out)
{
    const tp_module_param *p = param(m, module, TP_MODULE_WEIGHT);
    memcpy(out, p->grad.data, tp_tensor_nbytes(&p->grad));
}

static void test_backward(tp_model *m)
{
    int64_t V = m->cfg.vocab_size, ids[T];
    for (int t = 0; t < T; t++) ids[t] = (t * 41 + 7) % V;
    float *logits = malloc((size_t)(T * V) * sizeof(float)), *before = malloc((size_t)(T * V) * sizeof(float));
    double sum = 0;
    int64_t counted = 0;

    /* No gradient buffers yet: refused, naming the call that makes them. */
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, &sum, &counted) == TP_ERR_INVALID);
    CHECK(strstr(tp_error(), "tp_model_zero_grad") != NULL);

    CHECK(logits_of(m, ids, before) == TP_OK);
    CHECK(tp_model_zero_grad(m) == TP_OK);
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, &sum, &counted) == TP_OK);
    CHECK(counted == T - 1);
    double want = loss_sum_of(before, ids, V);
    CHECK_MSG(fabs(sum - want) <= 1e-5 * want, "loss sum %.9g, from the logits %.9g", sum, want);
    CHECK(tp_act_arena_stats(m).used == 0);
    CHECK(logits_of(m, ids, logits) == TP_OK);
    CHECK(memcmp(logits, before, (size_t)(T * V) * sizeof(float)) == 0);   /* inference unchanged */

    const char *mods[] = {"model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj",
                          "model.layers.0.self_attn.k_norm", "model.layers.1.self_attn.v_proj",
                          "model.layers.1.mlp.down_proj", "model.layers.0.mlp.gate_proj", "model.norm", "lm_head"};
    for (size_t i = 0; i < sizeof mods / sizeof *mods; i++) check_fd(m, ids, logits, mods[i]);

    /* Accumulation: a second call adds the same gradient; a count twice as
     * large halves it. */
    const tp_module_param *q = param(m, "model.layers.0.self_attn.q_proj", TP_MODULE_WEIGHT);
    size_t n = tp_tensor_nbytes(&q->grad) / sizeof(float);
    float *g1 = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float));
    copy_grad(m, "model.layers.0.self_attn.q_proj", g1);
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, NULL, NULL) == TP_OK);
    copy_grad(m, "model.layers.0.self_attn.q_proj", g2);
    int twice = 1, half = 1;
    for (size_t i = 0; i < n; i++) twice &= fabsf(g2[i] - 2 * g1[i]) <= 1e-6f * fabsf(g1[i]) + 1e-12f;
    CHECK(twice);
    CHECK(tp_model_zero_grad(m) == TP_OK);
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 2.0 * (T - 1), NULL, NULL) == TP_OK);
    copy_grad(m, "model.layers.0.self_attn.q_proj", g2);
    for (size_t i = 0; i < n; i++) half &= fabsf(2 * g2[i] - g1[i]) <= 1e-6f * fabsf(g1[i]) + 1e-12f;
    CHECK(half);

    /* Labels: -100 rows do not count; the loss is over the others only. */
    int64_t labels[T];
    for (int t = 0; t < T; t++) labels[t] = t % 3 == 0 ? ids[t] : -100;
    CHECK(tp_model_zero_grad(m) == TP_OK);
    CHECK(tp_model_forward_backward(m, ids, labels, T, 0, &sum, &counted) == TP_OK);
    CHECK(counted == (T - 1) / 3);
    want = loss_sum_of(before, labels, V);
    CHECK_MSG(fabs(sum - want) <= 1e-5 * want, "loss sum %.9g with -100 labels, want %.9g", sum, want);
    for (int t = 0; t < T; t++) labels[t] = -100;
    CHECK(tp_model_forward_backward(m, ids, labels, T, 0, NULL, NULL) == TP_ERR_INVALID);
    labels[3] = V;
    CHECK(tp_model_forward_backward(m, ids, labels, T, 0, NULL, NULL) == TP_ERR_INVALID);
    CHECK(tp_model_forward_backward(m, ids, NULL, 1, 0, NULL, NULL) == TP_ERR_INVALID);
    free(g1); free(g2); free(logits); free(before);
}

/* Every gradient of the model, concatenated (malloc'd), and its length. */
static float *all_grads(const tp_model *m, size_t *n)
{
    size_t total = 0, at = 0;
    for (size_t i = 0; i < m->n_modules; i++)
        for (int j = 0; j < m->modules[i].n_params; j++)
            if (m->modules[i].params[j].grad.data) total += tp_tensor_nbytes(&m->modules[i].params[j].grad);
    char *out = malloc(total ? total : 1);
    for (size_t i = 0; i < m->n_modules; i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            const tp_tensor *g = &m->modules[i].params[j].grad;
            if (!g->data) continue;
            memcpy(out + at, g->data, tp_tensor_nbytes(g));
            at += tp_tensor_nbytes(g);
        }
    *n = total / sizeof(float);
    return (float *)out;
}

/* Gradient checkpointing (each layer recomputed inside its backward):
 * the loss and every gradient bitwise those of the plain step, with and
 * without -100 labels; the activation arena empty after. */
static void test_gradient_checkpointing(tp_model *m)
{
    int64_t V = m->cfg.vocab_size, ids[T], labels[T];
    for (int t = 0; t < T; t++) ids[t] = (t * 17 + 3) % V, labels[t] = t % 4 == 1 ? -100 : ids[t];
    for (int with_labels = 0; with_labels < 2; with_labels++) {
        double plain = 0, ckpt = 0;
        size_t n1 = 0, n2 = 0;
        m->gradient_checkpointing = 0;
        CHECK(tp_model_zero_grad(m) == TP_OK);
        CHECK(tp_model_forward_backward(m, ids, with_labels ? labels : NULL, T, 0, &plain, NULL) == TP_OK);
        float *g1 = all_grads(m, &n1);
        m->gradient_checkpointing = 1;
        CHECK(tp_model_zero_grad(m) == TP_OK);
        CHECK(tp_model_forward_backward(m, ids, with_labels ? labels : NULL, T, 0, &ckpt, NULL) == TP_OK);
        CHECK(tp_act_arena_stats(m).used == 0);
        float *g2 = all_grads(m, &n2);
        CHECK(n1 == n2 && n1 > 0);
        CHECK_MSG(plain == ckpt, "loss %.17g, checkpointed %.17g", plain, ckpt);
        CHECK(n1 == n2 && memcmp(g1, g2, n1 * sizeof(float)) == 0);
        float big = 0;
        for (size_t i = 0; i < n1; i++) big = fmaxf(big, fabsf(g1[i]));
        CHECK(big > 0);
        free(g1);
        free(g2);
    }
    m->gradient_checkpointing = 0;
}

int main(void)
{
    char dir[] = "/tmp/tp_model_backward_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    tp_model_config cfg;
    tp_make_options mo = {.dtype = TP_F32, .seed = 5, .std = 0.02, .qk_std = 0.25, .shards = 1};
    tp_model *m = NULL;
    tp_model_options lo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 2};
    int ok = tp_preset_config(&cfg, TP_ARCH_QWEN3, "tiny") == TP_OK && tp_make_model(&cfg, &mo, dir) == TP_OK &&
             tp_model_load(&m, dir, &lo) == TP_OK;
    CHECK_MSG(ok, "%s", tp_error());
    if (ok) test_backward(m);
    if (ok) test_gradient_checkpointing(m);
    tp_model_free(m);
    remove_tree(dir);
    return check_summary();
}
