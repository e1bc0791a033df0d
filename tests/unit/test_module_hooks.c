/* tp_model.hooks (module.h): called around every module a container runs,
 * forward in table order and backward in reverse, each module's pre before
 * its children's and its post after; a hook that takes a decoder layer's
 * weights away after its forward and gives them back before its backward
 * (what ZeRO-3 does) leaves the loss and the gradients unchanged; a failing
 * hook stops the pass with its status.  On a tiny Qwen3 model. */
#include "check.h"
#include "tmpdir.h"
#include "models/tp_module.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T 10
#define MAX_EVENTS 4096

typedef struct {
    int kind[MAX_EVENTS], module[MAX_EVENTS], n;
    int hide;                /* take layer weights away between forward and backward */
    void *hidden[256];       /* the data pointers taken, by module index */
    int fail_at;             /* module index whose pre_backward fails, or -1 */
} recorder;

/* The Linear modules of the decoder layer at module index c (7), or 0. */
static int layer_linears(const tp_model *m, int c, int *out)
{
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const tp_layer_modules *L = &m->layers[l];
        if (m->modules[L->self_attn].parent != c) continue;
        int k[7] = {L->q_proj, L->k_proj, L->v_proj, L->o_proj, L->gate_proj, L->up_proj, L->down_proj};
        memcpy(out, k, sizeof k);
        return 7;
    }
    return 0;
}

/* Takes the layer's weights away (give = 0) or gives them back. */
static void swap_weights(recorder *r, tp_model *m, int c, int give)
{
    int lin[7], n = layer_linears(m, c, lin);
    for (int i = 0; i < n; i++) {
        tp_tensor *w = &m->modules[lin[i]].params[TP_MODULE_WEIGHT].local;
        if (lin[i] >= 256) continue;
        if (give) w->data = r->hidden[lin[i]];
        else r->hidden[lin[i]] = w->data, w->data = NULL;
    }
}

static tp_status record(recorder *r, int kind, int c)
{
    if (r->n < MAX_EVENTS) r->kind[r->n] = kind, r->module[r->n] = c, r->n++;
    return TP_OK;
}

static tp_status pre_f(void *ctx, tp_model *m, int c)
{
    recorder *r = ctx;
    (void)m;
    return record(r, 0, c);
}

static tp_status post_f(void *ctx, tp_model *m, int c)
{
    recorder *r = ctx;
    if (r->hide) swap_weights(r, m, c, 0);
    return record(r, 1, c);
}

static tp_status pre_b(void *ctx, tp_model *m, int c)
{
    recorder *r = ctx;
    if (c == r->fail_at) return tp_fail(TP_ERR_IO, "hook failed on purpose");
    if (r->hide) swap_weights(r, m, c, 1);
    return record(r, 2, c);
}

static tp_status post_b(void *ctx, tp_model *m, int c)
{
    recorder *r = ctx;
    (void)m;
    return record(r, 3, c);
}

/* The events' first index of (kind, module), or -1. */
static int find(const recorder *r, int kind, int c)
{
    for (int i = 0; i < r->n; i++)
        if (r->kind[i] == kind && r->module[i] == c) return i;
    return -1;
}

static void test_order(tp_model *m, const int64_t *ids)
{
    recorder r = {.fail_at = -1};
    tp_module_hooks h = {.pre_forward = pre_f, .post_forward = post_f, .pre_backward = pre_b,
                         .post_backward = post_b, .ctx = &r};
    m->hooks = &h;
    double sum = 0;
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, &sum, NULL) == TP_OK);
    m->hooks = NULL;
    const tp_layer_modules *L0 = &m->layers[0], *L1 = &m->layers[1];
    int layer0 = m->modules[L0->self_attn].parent, layer1 = m->modules[L1->self_attn].parent;
    CHECK(m->modules[layer0].type == TP_MT_DECODER_LAYER && m->modules[layer1].type == TP_MT_DECODER_LAYER);
    /* forward: embedding, layer 0 around its children (self_attn, mlp), then layer 1 */
    CHECK(find(&r, 0, m->embed_tokens) == 0);
    CHECK(find(&r, 0, layer0) < find(&r, 0, L0->self_attn) && find(&r, 1, L0->self_attn) < find(&r, 0, L0->mlp));
    CHECK(find(&r, 1, L0->mlp) < find(&r, 1, layer0) && find(&r, 1, layer0) < find(&r, 0, layer1));
    CHECK(find(&r, 0, m->norm) > find(&r, 1, layer1));
    /* backward: layer 1 before layer 0, each around its children (mlp first), the embedding last */
    CHECK(find(&r, 2, layer1) < find(&r, 2, layer0));
    CHECK(find(&r, 2, layer0) < find(&r, 2, L0->mlp) && find(&r, 3, L0->mlp) < find(&r, 2, L0->self_attn));
    CHECK(find(&r, 3, L0->self_attn) < find(&r, 3, layer0));
    CHECK(find(&r, 3, m->embed_tokens) == r.n - 1);
    CHECK(find(&r, 1, layer1) < find(&r, 2, layer1));
}

static void test_hide_and_fail(tp_model *m, const int64_t *ids)
{
    size_t n = 0;
    double plain = 0, hidden = 0;
    const tp_module_param *w = &m->modules[m->layers[0].down_proj].params[TP_MODULE_WEIGHT];
    CHECK(tp_model_zero_grad(m) == TP_OK);
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, &plain, NULL) == TP_OK);
    n = (size_t)tp_tensor_numel(&w->grad);
    float *g = malloc(n * sizeof *g);
    memcpy(g, w->grad.data, n * sizeof *g);
    recorder r = {.hide = 1, .fail_at = -1};
    tp_module_hooks h = {.pre_forward = pre_f, .post_forward = post_f, .pre_backward = pre_b,
                         .post_backward = post_b, .ctx = &r};
    m->hooks = &h;
    CHECK(tp_model_zero_grad(m) == TP_OK);
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, &hidden, NULL) == TP_OK);
    CHECK(hidden == plain);
    CHECK(memcmp(g, w->grad.data, n * sizeof *g) == 0);
    CHECK(w->local.data != NULL && r.hidden[m->layers[0].down_proj] == w->local.data);
    r.hide = 0;
    r.fail_at = m->layers[1].mlp;
    CHECK(tp_model_forward_backward(m, ids, NULL, T, 0, NULL, NULL) == TP_ERR_IO);
    CHECK(strstr(tp_error(), "hook failed on purpose") != NULL);
    m->hooks = NULL;
    free(g);
}

int main(void)
{
    char dir[] = "/tmp/tp_module_hooks_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    tp_model_config cfg;
    tp_make_options mo = {.dtype = TP_F32, .seed = 5, .std = 0.02, .qk_std = 0.25, .shards = 1};
    tp_model *m = NULL;
    tp_model_options lo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1};
    int ok = tp_preset_config(&cfg, TP_ARCH_QWEN3, "tiny") == TP_OK && tp_make_model(&cfg, &mo, dir) == TP_OK &&
             tp_model_load(&m, dir, &lo) == TP_OK && tp_model_zero_grad(m) == TP_OK;
    CHECK_MSG(ok, "%s", tp_error());
    int64_t ids[T] = {3, 17, 250, 9, 41, 77, 5, 300, 12, 8};
    if (ok) {
        test_order(m, ids);
        test_hide_and_fail(m, ids);
    }
    tp_model_free(m);
    remove_tree(dir);
    return check_summary();
}
