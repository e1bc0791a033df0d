/* A weight kept in row blocks (tp_module_row_hooks, module.h): hooks that
 * serve an embedding and lm_head from copies outside the model, a block of
 * rows at a time, give tp_model_forward_backward the loss and every
 * gradient bit for bit of the model holding them whole — lm_head and the
 * loss in vocabulary blocks (head_blocks.c), the lookup and its gradient
 * through the hooks — with the vocabulary (700) larger than a block (256:
 * three, the last one short), tied and untied, with ignored labels; an idle
 * rank's schedule makes the same fetches and gradient calls, the gradients
 * zero. */
#include "check.h"
#include "tmpdir.h"
#include "models/tp_module.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T 12
#define V 700
#define BLOCK 256

/* Up to two tables (embedding, untied lm_head) taken out of the model. */
typedef struct {
    int module[2], n;
    float *value[2], *grad[2];
    void *orig[2];          /* the model's own data, given back at the end */
    int64_t width;
    int fetches, grads, lookups, scatters;
    int nonzero_grad;       /* a gradient block with a nonzero element came */
} tables;

static int table_of(const tables *t, const tp_model *m, int i, int j)
{
    if (j != TP_MODULE_WEIGHT) return -1;
    if (m->modules[i].params[j].tied_to >= 0) i = m->modules[i].params[j].tied_to;
    for (int k = 0; k < t->n; k++)
        if (t->module[k] == i) return k;
    return -1;
}

static int64_t rows_block(void *ctx, const tp_model *m, int i, int j)
{
    return table_of(ctx, m, i, j) >= 0 ? BLOCK : 0;
}

static tp_status rows_fetch(void *ctx, tp_model *m, int i, int j, int64_t row0, int64_t n, void *out)
{
    tables *t = ctx;
    int k = table_of(t, m, i, j);
    t->fetches++;
    memcpy(out, t->value[k] + row0 * t->width, (size_t)(n * t->width) * sizeof(float));
    return TP_OK;
}

static tp_status rows_grad(void *ctx, tp_model *m, int i, int j, int64_t row0, int64_t n, float *dw)
{
    tables *t = ctx;
    float *g = t->grad[table_of(t, m, i, j)] + row0 * t->width;
    t->grads++;
    for (int64_t e = 0; e < n * t->width; e++) {
        g[e] += dw[e];
        t->nonzero_grad |= dw[e] != 0;
    }
    return TP_OK;
}

static tp_status rows_lookup(void *ctx, tp_model *m, int i, int j, const int64_t *ids, int64_t n, float *y)
{
    tables *t = ctx;
    int k = table_of(t, m, i, j);
    t->lookups++;
    for (int64_t r = 0; r < n; r++)
        memcpy(y + r * t->width, t->value[k] + ids[r] * t->width, (size_t)t->width * sizeof(float));
    return TP_OK;
}

static tp_status rows_scatter(void *ctx, tp_model *m, int i, int j, const int64_t *ids, int64_t n,
                              const float *dy)
{
    tables *t = ctx;
    float *g = t->grad[table_of(t, m, i, j)];
    t->scatters++;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < t->width; c++) g[ids[r] * t->width + c] += dy[r * t->width + c];
    return TP_OK;
}

/* Takes module i's weight (and a tied lm_head's) out of the model. */
static void take(tables *t, tp_model *m, int i)
{
    tp_module_param *p = &m->modules[i].params[TP_MODULE_WEIGHT];
    size_t n = (size_t)tp_tensor_numel(&p->local);
    int k = t->n++;
    t->module[k] = i;
    t->width = p->local.shape[1];
    t->orig[k] = p->local.data;
    t->value[k] = malloc(n * sizeof(float));
    t->grad[k] = calloc(n, sizeof(float));
    memcpy(t->value[k], p->local.data, n * sizeof(float));
    for (size_t q = 0; q < m->n_modules; q++) {
        tp_module_param *o = &m->modules[q].params[TP_MODULE_WEIGHT];
        if ((int)q == i || o->tied_to == i) o->local.data = NULL;
    }
}

/* Gives the model its weights back. */
static void give_back(tables *t, tp_model *m)
{
    for (int k = 0; k < t->n; k++)
        for (size_t q = 0; q < m->n_modules; q++) {
            tp_module_param *o = &m->modules[q].params[TP_MODULE_WEIGHT];
            if ((int)q == t->module[k] || o->tied_to == t->module[k]) o->local.data = t->orig[k];
        }
}

static float *copy_grad(const tp_module_param *p)
{
    size_t n = (size_t)tp_tensor_numel(&p->grad);
    float *g = malloc(n * sizeof *g);
    memcpy(g, p->grad.data, n * sizeof *g);
    return g;
}

static void test_model(const char *dir, tp_arch arch, int tied)
{
    tp_model_config cfg;
    tp_make_options mo = {.dtype = TP_F32, .seed = 9, .std = 0.02, .qk_std = 0.25, .shards = 1};
    tp_model_options lo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 2};
    tp_model *m = NULL;
    int ok = tp_preset_config(&cfg, arch, "tiny") == TP_OK;
    cfg.vocab_size = V;
    cfg.tie_word_embeddings = tied;
    ok = ok && tp_make_model(&cfg, &mo, dir) == TP_OK && tp_model_load(&m, dir, &lo) == TP_OK &&
         tp_model_zero_grad(m) == TP_OK;
    CHECK_MSG(ok, "%s", tp_error());
    if (!ok) { tp_model_free(m); return; }
    int64_t ids[T] = {3, 699, 250, 9, 511, 255, 256, 300, 12, 8, 699, 512};
    int64_t labels[T] = {3, 699, 250, -100, 511, 255, 256, 300, 12, -100, 699, 512};
    double whole = 0, blocked = 0;
    CHECK(tp_model_forward_backward(m, ids, labels, T, 0, &whole, NULL) == TP_OK);
    /* every gradient of the whole run, by module and parameter */
    float *ref[256][TP_MODULE_MAX_PARAMS] = {{0}};
    CHECK(m->n_modules <= 256);
    for (size_t i = 0; i < m->n_modules && i < 256; i++)
        for (int j = 0; j < m->modules[i].n_params; j++)
            if (m->modules[i].params[j].grad.data) ref[i][j] = copy_grad(&m->modules[i].params[j]);
    tables t = {0};
    take(&t, m, m->embed_tokens);
    CHECK((m->modules[m->lm_head].params[TP_MODULE_WEIGHT].tied_to >= 0) == tied);
    if (!tied) take(&t, m, m->lm_head);
    tp_module_hooks h = {.ctx = &t, .rows = {rows_block, rows_fetch, rows_grad, rows_lookup, rows_scatter}};
    m->hooks = &h;
    CHECK(tp_model_zero_grad(m) == TP_OK);
    CHECK(tp_model_forward_backward(m, ids, labels, T, 0, &blocked, NULL) == TP_OK);
    CHECK_MSG(blocked == whole, "loss %.17g blocked, %.17g whole", blocked, whole);
    /* three passes over three blocks, the gradient in the last; one lookup and its scatter */
    CHECK(t.fetches == 9 && t.grads == 3 && t.lookups == 1 && t.scatters == 1);
    for (int k = 0; k < t.n; k++) {
        size_t n = (size_t)(V * t.width);
        CHECK_MSG(memcmp(t.grad[k], ref[t.module[k]][TP_MODULE_WEIGHT], n * sizeof(float)) == 0,
                  "the gradient of %s", m->modules[t.module[k]].name);
    }
    for (size_t i = 0; i < m->n_modules && i < 256; i++)
        for (int j = 0; j < m->modules[i].n_params; j++) {
            const tp_module_param *p = &m->modules[i].params[j];
            if (!ref[i][j] || table_of(&t, m, (int)i, j) >= 0 || p->tied_to >= 0) continue;
            CHECK_MSG(memcmp(ref[i][j], p->grad.data, (size_t)tp_tensor_numel(&p->grad) * sizeof(float)) == 0,
                      "the gradient of %s.%s", m->modules[i].name, p->suffix);
        }
    /* an idle rank's lm_head: the same fetches and gradient calls, zeros */
    t.fetches = t.grads = 0;
    t.nonzero_grad = 0;
    CHECK(tp_model_head_blocks_idle(m) == TP_OK);
    CHECK(t.fetches == 9 && t.grads == 3 && !t.nonzero_grad);
    m->hooks = NULL;
    give_back(&t, m);
    tp_model_free(m);
    for (int k = 0; k < t.n; k++) free(t.value[k]), free(t.grad[k]);
    for (int i = 0; i < 256; i++)
        for (int j = 0; j < TP_MODULE_MAX_PARAMS; j++) free(ref[i][j]);
}

int main(void)
{
    char dir[] = "/tmp/tp_head_blocks_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char a[64], b[64];
    snprintf(a, sizeof a, "%s/tied", dir);
    snprintf(b, sizeof b, "%s/untied", dir);
    test_model(a, TP_ARCH_QWEN3, 1);
    test_model(b, TP_ARCH_LLAMA, 0);
    remove_tree(dir);
    return check_summary();
}
