/* models/: the module table — names, types, the tree, parameter records
 * (global shapes of any rank), the parameter table derived from it, and a
 * loaded model's tensors (tied lm_head borrowing the embedding's). */
#include "check.h"
#include "tensorpar/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int find(const tp_module *mods, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(mods[i].name, name)) return (int)i;
    return -1;
}

static int shape_is(const tp_module_param *p, int ndim, int64_t d0, int64_t d1)
{
    return p->ndim == ndim && p->shape[0] == d0 && (ndim < 2 || p->shape[1] == d1) && p->slice.dim == -1 &&
           p->slice.local_shape[0] == d0 && (ndim < 2 || p->slice.local_shape[1] == d1);
}

/* The children of mods[i], by name, in order, joined with spaces. */
static void children(const tp_module *mods, int i, char *out, size_t cap)
{
    out[0] = '\0';
    for (int c = mods[i].first_child; c >= 0; c = mods[c].next_sibling) {
        CHECK(mods[c].parent == i);
        const char *last = strrchr(mods[c].name, '.');
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", len ? " " : "", last ? last + 1 : mods[c].name);
    }
}

static void test_table(tp_arch arch)
{
    tp_model_config c;
    CHECK(tp_preset_config(&c, arch, "tiny") == TP_OK);
    tp_module *mods;
    size_t n;
    CHECK(tp_module_table_build(&c, &mods, &n) == TP_OK);
    int qk = arch == TP_ARCH_QWEN3, bias = arch == TP_ARCH_QWEN2;
    /* model, embed, per layer (layer, 2 norms, attn, 4 proj, mlp, 3 proj
     * [+ 2 qk norms]), final norm, lm_head */
    size_t per_layer = 12 + (qk ? 2 : 0);
    CHECK_MSG(n == 4 + per_layer * (size_t)c.num_hidden_layers, "%zu modules", n);
    CHECK(!strcmp(mods[0].name, "model") && mods[0].type == TP_MT_CONTAINER && mods[0].parent == -1);
    char buf[256];
    children(mods, 0, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "embed_tokens 0 1 norm"), "%s", buf);

    int emb = find(mods, n, "model.embed_tokens"), head = find(mods, n, "lm_head");
    CHECK(emb == 1 && mods[emb].type == TP_MT_EMBEDDING && mods[emb].n_params == 1);
    CHECK(shape_is(&mods[emb].params[0], 2, 512, 64) && !strcmp(mods[emb].params[0].suffix, "weight"));
    CHECK(head == (int)n - 1 && mods[head].parent == -1 && mods[head].type == TP_MT_LINEAR);
    CHECK(mods[head].params[TP_MODULE_WEIGHT].tied_to == -1);   /* tiny is untied */

    int l1 = find(mods, n, "model.layers.1");
    CHECK(l1 > 0 && mods[l1].type == TP_MT_DECODER_LAYER && mods[l1].layer == 1 && mods[l1].parent == 0);
    children(mods, l1, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "input_layernorm self_attn post_attention_layernorm mlp"), "%s", buf);
    int attn = find(mods, n, "model.layers.1.self_attn");
    CHECK(attn == l1 + 2 && mods[attn].type == TP_MT_ATTENTION && mods[attn].n_params == 0);
    children(mods, attn, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, qk ? "q_proj k_proj v_proj o_proj q_norm k_norm" : "q_proj k_proj v_proj o_proj"), "%s", buf);
    int mlp = find(mods, n, "model.layers.1.mlp");
    CHECK(mlp > 0 && mods[mlp].type == TP_MT_MLP && mods[mlp].layer == 1);
    children(mods, mlp, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "gate_proj up_proj down_proj"), "%s", buf);

    /* q: [heads * head_dim, hidden] = [64, 64]; k: [kv * head_dim, hidden] = [32, 64] */
    const tp_module *q = &mods[find(mods, n, "model.layers.1.self_attn.q_proj")];
    const tp_module *k = &mods[find(mods, n, "model.layers.1.self_attn.k_proj")];
    const tp_module *o = &mods[find(mods, n, "model.layers.1.self_attn.o_proj")];
    const tp_module *down = &mods[find(mods, n, "model.layers.1.mlp.down_proj")];
    CHECK(q->type == TP_MT_LINEAR && q->parent == attn && q->layer == 1 && shape_is(&q->params[0], 2, 64, 64));
    CHECK(shape_is(&k->params[0], 2, 32, 64) && shape_is(&down->params[0], 2, 64, 160));
    CHECK(q->n_params == 1 + bias && k->n_params == 1 + bias && o->n_params == 1);
    if (bias) CHECK(shape_is(&k->params[TP_MODULE_BIAS], 1, 32, 0) && !strcmp(k->params[1].suffix, "bias") &&
                    k->params[1].kind == TP_PARAM_BIAS);
    int qn = find(mods, n, "model.layers.1.self_attn.q_norm");
    CHECK(qk ? qn > 0 && mods[qn].type == TP_MT_NORM && shape_is(&mods[qn].params[0], 1, 16, 0) : qn == -1);
    int fn = find(mods, n, "model.norm");
    CHECK(fn == head - 1 && mods[fn].type == TP_MT_NORM && mods[fn].parent == 0 && mods[fn].params[0].kind == TP_PARAM_NORM);
    for (size_t i = 0; i < n; i++) CHECK(mods[i].ops && mods[i].ops->forward && mods[i].ops->backward);

    /* The parameter table is the table's parameters in order. */
    tp_param_desc *d;
    size_t np;
    CHECK(tp_model_params(&c, NULL, &d, &np) == TP_OK);
    size_t want = 0;
    for (size_t i = 0; i < n; i++) want += (size_t)mods[i].n_params;
    CHECK_MSG(np == want, "%zu params, %zu in the table", np, want);
    CHECK(!strcmp(d[0].name, "model.embed_tokens.weight") && !strcmp(d[1].name, "model.layers.0.input_layernorm.weight"));
    CHECK(!strcmp(d[2].name, "model.layers.0.self_attn.q_proj.weight"));
    CHECK(!strcmp(d[3].name, bias ? "model.layers.0.self_attn.q_proj.bias" : "model.layers.0.self_attn.k_proj.weight"));
    CHECK(!strcmp(d[np - 1].name, "lm_head.weight") && !strcmp(d[np - 2].name, "model.norm.weight"));
    CHECK(d[np - 1].module_index == head && d[np - 1].param_index == 0 && !d[np - 1].slot && !d[np - 1].module);
    free(d);
    tp_module_table_free(mods, n);
}

static void test_tied(void)
{
    tp_model_config c;
    CHECK(tp_preset_config(&c, TP_ARCH_QWEN3, "qwen3-0.6b") == TP_OK && c.tie_word_embeddings);
    tp_module *mods;
    size_t n;
    CHECK(tp_module_table_build(&c, &mods, &n) == TP_OK);
    int emb = find(mods, n, "model.embed_tokens"), head = find(mods, n, "lm_head");
    CHECK(mods[head].params[TP_MODULE_WEIGHT].tied_to == emb);
    CHECK(shape_is(&mods[head].params[0], 2, 151936, 1024));
    tp_param_desc *d;
    size_t np;
    CHECK(tp_model_params(&c, NULL, &d, &np) == TP_OK);
    CHECK(!strcmp(d[np - 1].name, "model.norm.weight"));   /* no lm_head.weight of its own */
    free(d);
    tp_module_table_free(mods, n);
}

/* A 3-D parameter (experts: [n_experts, out, in]) is a record like any
 * other: its global shape and, whole, its local shape. */
static void test_3d_record(void)
{
    tp_module mod;
    memset(&mod, 0, sizeof mod);
    snprintf(mod.name, sizeof mod.name, "model.layers.0.mlp.experts");
    mod.type = TP_MT_EXPERTS;
    int64_t shape[3] = {8, 320, 64}, bias[2] = {8, 320};
    CHECK(tp_module_add_param(&mod, "gate_up_proj", TP_PARAM_WEIGHT, 3, shape) == TP_OK);
    CHECK(tp_module_add_param(&mod, "gate_up_proj_bias", TP_PARAM_BIAS, 2, bias) == TP_OK);
    const tp_module_param *p = &mod.params[0];
    CHECK(mod.n_params == 2 && p->ndim == 3 && p->shape[0] == 8 && p->shape[1] == 320 && p->shape[2] == 64);
    CHECK(p->slice.dim == -1 && p->slice.ndim == 3 && p->slice.local_shape[2] == 64);
    CHECK(p->placement.kind == TP_REPLICATE && p->tied_to == -1 && !p->local.data);
    int64_t five[5] = {1, 2, 3, 4, 5};
    CHECK(tp_module_add_param(&mod, "too_many_dims", TP_PARAM_WEIGHT, 5, five) == TP_ERR_INTERNAL);
    CHECK(tp_module_add_param(&mod, "down_proj", TP_PARAM_WEIGHT, 3, shape) == TP_OK);
    CHECK(tp_module_add_param(&mod, "down_proj_bias", TP_PARAM_BIAS, 2, bias) == TP_OK);
    CHECK(tp_module_add_param(&mod, "fifth", TP_PARAM_BIAS, 2, bias) == TP_ERR_INTERNAL);
    CHECK(!strcmp(tp_module_type_name(TP_MT_EXPERTS), "experts") && !strcmp(tp_module_type_name(TP_MT_MLP), "mlp"));
}

/* A loaded model: its tensors live in the records, the parameter table
 * points at them, and a tied lm_head shares the embedding's data. */
static void test_loaded(const char *dir)
{
    tp_model_config c;
    CHECK(tp_preset_config(&c, TP_ARCH_LLAMA, "tiny") == TP_OK);
    c.tie_word_embeddings = 1;
    tp_make_options mo = {.dtype = TP_F32, .seed = 1, .std = 0.02, .qk_std = 0.02, .shards = 1};
    CHECK(tp_make_model(&c, &mo, dir) == TP_OK);
    tp_model *m = NULL;
    tp_model_options opt = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1};
    CHECK(tp_model_load(&m, dir, &opt) == TP_OK);
    if (!m) return;
    int emb = tp_model_module_find(m, "model.embed_tokens"), head = tp_model_module_find(m, "lm_head");
    int k1 = tp_model_module_find(m, "model.layers.1.self_attn.k_proj");
    CHECK(emb >= 0 && head == (int)tp_model_module_count(m) - 1 && k1 > 0);
    CHECK(tp_model_module_at(m, tp_model_module_count(m)) == NULL);
    const tp_module *e = tp_model_module_at(m, (size_t)emb), *h = tp_model_module_at(m, (size_t)head);
    const tp_module *k = tp_model_module_at(m, (size_t)k1);
    CHECK(e->params[0].local.data && h->params[0].local.data == e->params[0].local.data && !h->params[0].local.owns_data);
    CHECK(k->params[0].local.ndim == 2 && k->params[0].local.shape[0] == 32 && k->params[0].local.shape[1] == 64);
    CHECK(m->layers[1].k_proj == k1 && m->layers[1].q_norm == -1 && m->lm_head == head);
    tp_param_desc *d;
    size_t np;
    CHECK(tp_model_params(&m->cfg, m, &d, &np) == TP_OK);
    int seen = 0;
    for (size_t i = 0; i < np; i++)
        if (!strcmp(d[i].name, "model.layers.1.self_attn.k_proj.weight"))
            seen = d[i].slot == &m->modules[k1].params[0].local && d[i].module == &m->modules[k1];
    CHECK(seen);
    free(d);
    tp_model_free(m);
}

int main(void)
{
    test_table(TP_ARCH_LLAMA);
    test_table(TP_ARCH_QWEN2);
    test_table(TP_ARCH_QWEN3);
    test_tied();
    test_3d_record();
    char dir[] = "/tmp/tp_modules_XXXXXX";
    if (mkdtemp(dir)) {
        test_loaded(dir);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        CHECK(!"mkdtemp");
    }
    return check_summary();
}
