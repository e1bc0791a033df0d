/* parallel/: the style registry (A1) and the placements and local shapes
 * each style gives (B2, B4, B6, B17, uneven and empty shards). */
#include "check.h"
#include "tensorpar/parallel.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const section_2_1[] = {
    "embedding_rowwise", "embedding_colwise", "colwise_gather_output", "colwise_rep", "colwise",
    "rowwise", "rowwise_split_input", "rowwise_rep", "packed_colwise", "packed_rowwise",
    "sequence_parallel", "replicated_with_grad_allreduce", "mla_kv_a_proj", "all_reduce",
    "moe_tp_experts", "moe_identity_expert", "local_params", "grouped_gemm", "ep_router",
    "local_colwise", "local_rowwise", "local_packed_rowwise", "gather", "local", "replicate",
};
#define N21 (sizeof section_2_1 / sizeof section_2_1[0])

static void test_registry(void)
{
    tp_style_registry_reset();
    CHECK(tp_style_registry_count(NULL) == N21);
    for (size_t i = 0; i < N21; i++)
        CHECK_MSG(!strcmp(tp_style_registry_name(NULL, i), section_2_1[i]), "%zu: %s", i, tp_style_registry_name(NULL, i));
    char *names = tp_style_registry_names_repr(NULL);
    CHECK(names && !strncmp(names, "['embedding_rowwise', 'embedding_colwise', 'colwise_gather_output', ", 68));
    CHECK(names && !strcmp(names + strlen(names) - strlen("'local', 'replicate']"), "'local', 'replicate']"));
    free(names);

    /* A1: register a ColwiseParallel instance under a new name: appended. */
    tp_style custom = *tp_style_lookup("colwise");
    custom.name = "colwise_custom";
    CHECK(tp_style_register(&custom) == TP_OK);
    CHECK(tp_style_registry_count(NULL) == N21 + 1);
    CHECK(!strcmp(tp_style_registry_name(NULL, N21), "colwise_custom"));
    CHECK(!strcmp(tp_style_lookup("colwise_custom")->impl, "ColwiseParallel"));
    /* Re-registering keeps the position. */
    custom.opt.output_layout = tp_replicate();
    CHECK(tp_style_register(&custom) == TP_OK);
    CHECK(tp_style_registry_count(NULL) == N21 + 1);
    CHECK(tp_style_lookup("colwise_custom")->opt.output_layout.kind == TP_REPLICATE);

    /* Views: a local entry is visible only in its view. */
    tp_style_registry *v1 = NULL, *v2 = NULL;
    CHECK(tp_style_registry_new(&v1) == TP_OK && tp_style_registry_new(&v2) == TP_OK);
    CHECK(tp_style_registry_set(v1, "my_local", tp_style_lookup("rowwise")) == TP_OK);
    CHECK(tp_style_registry_contains(v1, "my_local"));
    CHECK(!tp_style_registry_contains(v2, "my_local"));
    CHECK(!tp_style_lookup("my_local"));
    CHECK(tp_style_registry_count(v1) == N21 + 2 && tp_style_registry_count(v2) == N21 + 1);
    CHECK(!strcmp(tp_style_registry_name(v1, N21 + 1), "my_local"));
    /* A local override of a global name shadows it in the view only. */
    CHECK(tp_style_registry_set(v1, "colwise", tp_style_lookup("rowwise")) == TP_OK);
    CHECK(!strcmp(tp_style_registry_get(v1, "colwise")->impl, "RowwiseParallel"));
    CHECK(!strcmp(tp_style_lookup("colwise")->impl, "ColwiseParallel"));
    CHECK(tp_style_registry_count(v1) == N21 + 2);
    CHECK(tp_style_registry_del(v1, "colwise") == TP_OK);
    CHECK(!strcmp(tp_style_registry_get(v1, "colwise")->impl, "ColwiseParallel"));
    CHECK(tp_style_registry_del(v1, "my_local") == TP_OK);
    CHECK(!tp_style_registry_contains(v1, "my_local"));
    CHECK(tp_style_registry_del(v1, "colwise") != TP_OK);     /* global entry untouched */
    CHECK(tp_style_lookup("colwise") != NULL);
    /* Registering globally is seen by every view. */
    custom.name = "late_global";
    CHECK(tp_style_register(&custom) == TP_OK);
    CHECK(tp_style_registry_contains(v2, "late_global"));
    CHECK(!tp_style_registry_get(v1, "nope") && !tp_style_lookup("nope"));
    CHECK(!tp_style_lookup("Colwise"));                        /* case-sensitive */
    tp_style_registry_free(v1);
    tp_style_registry_free(v2);
    tp_style_registry_reset();
    CHECK(tp_style_registry_count(NULL) == N21 && !tp_style_lookup("colwise_custom"));
}

/* Placement of one parameter under a style, P ranks. */
static tp_placement place(const char *style, tp_module_kind kind, const char *shortname, int ndim,
                          int64_t d0, int64_t d1, int P)
{
    int64_t shape[2] = {d0, d1};
    tp_module_ctx m = {"m", kind, P, 0, NULL, NULL, NULL};
    char full[64];
    snprintf(full, sizeof full, "m.%s", shortname);
    tp_param_ctx p = {full, shortname, TP_PARAM_WEIGHT, ndim, shape};
    tp_placement pl = {TP_PARTIAL, 99, 99};
    const tp_style *st = tp_style_lookup(style);
    if (tp_style_validate_param(st, &m, &p, full) != TP_OK) return pl;
    tp_style_shard_param(st, &m, &p, &pl);
    return pl;
}

static int is(tp_placement p, tp_placement_kind k, int dim, int split)
{
    return p.kind == k && (k == TP_REPLICATE || p.dim == dim) && (k != TP_STRIDED_SHARD || p.split == split);
}

static void test_placements(void)
{
    /* B4 and the §2.2 summary */
    CHECK(is(place("colwise", TP_MODULE_LINEAR, "weight", 2, 16, 32, 4), TP_SHARD, 0, 0));
    CHECK(is(place("colwise", TP_MODULE_LINEAR, "bias", 1, 16, 0, 4), TP_SHARD, 0, 0));
    CHECK(is(place("colwise_gather_output", TP_MODULE_LINEAR, "weight", 2, 16, 32, 4), TP_SHARD, 0, 0));
    CHECK(is(place("rowwise", TP_MODULE_LINEAR, "weight", 2, 16, 32, 4), TP_SHARD, 1, 0));
    CHECK(is(place("rowwise", TP_MODULE_LINEAR, "bias", 1, 16, 0, 4), TP_REPLICATE, 0, 0));
    CHECK(is(place("rowwise_split_input", TP_MODULE_LINEAR, "weight", 2, 16, 32, 4), TP_SHARD, 1, 0));
    CHECK(is(place("embedding_rowwise", TP_MODULE_EMBEDDING, "weight", 2, 32, 16, 4), TP_SHARD, 0, 0));
    CHECK(is(place("embedding_colwise", TP_MODULE_EMBEDDING, "weight", 2, 32, 16, 4), TP_SHARD, 1, 0));
    CHECK(is(place("colwise", TP_MODULE_EMBEDDING, "weight", 2, 6, 10, 3), TP_SHARD, 1, 0));
    CHECK(is(place("rowwise", TP_MODULE_EMBEDDING, "weight", 2, 10, 6, 3), TP_SHARD, 0, 0));
    CHECK(is(place("colwise", TP_MODULE_OTHER, "sinks", 1, 8, 0, 2), TP_SHARD, 0, 0));
    CHECK(is(place("replicated_with_grad_allreduce", TP_MODULE_OTHER, "weight", 1, 16, 0, 2), TP_REPLICATE, 0, 0));
    CHECK(is(place("local_params", TP_MODULE_OTHER, "weight", 1, 16, 0, 2), TP_REPLICATE, 0, 0));
    CHECK(is(place("replicate", TP_MODULE_LINEAR, "weight", 2, 16, 32, 2), TP_REPLICATE, 0, 0));
    CHECK(is(place("local_colwise", TP_MODULE_LINEAR, "weight", 2, 16, 32, 2), TP_SHARD, 0, 0));
    CHECK(is(place("local_rowwise", TP_MODULE_LINEAR, "bias", 1, 16, 0, 2), TP_REPLICATE, 0, 0));
    /* packed (B6, §2.8) */
    CHECK(is(place("packed_rowwise", TP_MODULE_OTHER, "weight", 2, 16, 32, 2), TP_STRIDED_SHARD, 1, 2));
    CHECK(is(place("packed_rowwise", TP_MODULE_OTHER, "bias", 1, 32, 0, 2), TP_REPLICATE, 0, 0));
    CHECK(is(place("packed_colwise", TP_MODULE_LINEAR, "weight", 2, 32, 16, 4), TP_STRIDED_SHARD, 0, 2));
    CHECK(is(place("packed_colwise", TP_MODULE_LINEAR, "gate_up_proj_bias", 1, 32, 0, 4), TP_STRIDED_SHARD, 0, 2));

    /* B1 / B17: gathered outputs of any size pass validation (§10.10);
     * the packed split factor still must divide. */
    int64_t shape[2] = {99, 8};
    tp_module_ctx m = {"lm_head", TP_MODULE_LINEAR, 2, 0, NULL, NULL, NULL};
    tp_param_ctx p = {"lm_head.weight", "weight", TP_PARAM_WEIGHT, 2, shape};
    CHECK(tp_style_validate_param(tp_style_lookup("colwise_gather_output"), &m, &p, "lm_head.weight") == TP_OK);
    CHECK(tp_style_validate_param(tp_style_lookup("colwise_rep"), &m, &p, "lm_head.weight") == TP_OK);
    CHECK(tp_style_validate_param(tp_style_lookup("colwise"), &m, &p, "lm_head.weight") == TP_OK);
    CHECK(is(place("colwise_gather_output", TP_MODULE_LINEAR, "weight", 2, 99, 8, 3), TP_SHARD, 0, 0));
    int64_t packed[2] = {7, 4};
    tp_param_ctx q = {"m.gate_up_proj", "gate_up_proj", TP_PARAM_WEIGHT, 2, packed};
    CHECK(tp_style_validate_param(tp_style_lookup("packed_colwise"), &m, &q, "m.gate_up_proj") != TP_OK);
    CHECK_MSG(!strcmp(tp_error(), "The packed dimension of `m.gate_up_proj` (7) is not divisible by split_factor (2)."),
              "%s", tp_error());
    int64_t emb[2] = {12, 6};
    tp_module_ctx e = {"model.embed_tokens", TP_MODULE_EMBEDDING, 4, 0, NULL, NULL, NULL};
    tp_param_ctx ew = {"model.embed_tokens.weight", "weight", TP_PARAM_EMBEDDING, 2, emb};
    CHECK(tp_style_validate_param(tp_style_lookup("embedding_colwise"), &e, &ew, ew.name) == TP_OK);
    CHECK(tp_style_validate_param(tp_style_lookup("embedding_rowwise"), &e, &ew, ew.name) == TP_OK);
    CHECK(tp_param_is_bias_named("bias") && tp_param_is_bias_named("down_proj_bias") && !tp_param_is_bias_named("biased"));
}

static tp_status own_post_forward(const tp_style *st, const tp_module_ctx *mod, const tp_forward_desc *d, tp_dtensor *y)
{
    (void)st; (void)mod; (void)d; (void)y;
    return TP_OK;
}

static void test_forward_descs(void)
{
    tp_forward_desc d;
    tp_module_ctx lin = {"m", TP_MODULE_LINEAR, 2, 0, NULL, NULL, NULL};
    tp_module_ctx emb = {"e", TP_MODULE_EMBEDDING, 2, 0, NULL, NULL, NULL};
    CHECK(tp_style_install_forward(tp_style_lookup("colwise"), &lin, &d) == TP_OK);
    CHECK(d.installed && d.input.kind == TP_REPLICATE && d.local_output.kind == TP_SHARD && d.output.kind == TP_SHARD);
    CHECK(d.allreduce_backward_input && d.use_local_tensors && !d.bias_after_reduce);
    CHECK(tp_style_install_forward(tp_style_lookup("colwise_gather_output"), &lin, &d) == TP_OK);
    CHECK(d.local_output.kind == TP_SHARD && d.output.kind == TP_REPLICATE);
    CHECK(tp_style_install_forward(tp_style_lookup("rowwise"), &lin, &d) == TP_OK);
    CHECK(d.input.kind == TP_SHARD && d.compute_input.kind == TP_SHARD && d.local_output.kind == TP_PARTIAL &&
          d.output.kind == TP_REPLICATE && d.bias_after_reduce);
    CHECK(d.post_forward_moves);   /* the default post_forward: the declared move, nothing else */
    /* A style with its own post_forward says nothing about what it does
     * there, so the model may not do that move another way. */
    tp_style own = *tp_style_lookup("rowwise");
    own.transform_output_post_forward = own_post_forward;
    CHECK(tp_style_install_forward(&own, &lin, &d) == TP_OK && !d.post_forward_moves && d.local_output.kind == TP_PARTIAL);
    CHECK(tp_style_install_forward(tp_style_lookup("rowwise_split_input"), &lin, &d) == TP_OK);
    CHECK(d.input.kind == TP_REPLICATE && d.compute_input.kind == TP_SHARD && d.local_output.kind == TP_PARTIAL);
    CHECK(tp_style_install_forward(tp_style_lookup("embedding_rowwise"), &emb, &d) == TP_OK);
    CHECK(d.ids_input && d.mask_vocab && d.local_output.kind == TP_PARTIAL && d.output.kind == TP_REPLICATE);
    CHECK(tp_style_install_forward(tp_style_lookup("embedding_colwise"), &emb, &d) == TP_OK);
    CHECK(d.ids_input && !d.mask_vocab && d.local_output.kind == TP_SHARD && d.output.kind == TP_REPLICATE);
    CHECK(tp_style_install_forward(tp_style_lookup("rowwise"), &emb, &d) == TP_OK);
    CHECK(d.ids_input && d.mask_vocab && !d.bias_after_reduce);
    CHECK(tp_style_install_forward(tp_style_lookup("replicated_with_grad_allreduce"), &lin, &d) == TP_OK);
    CHECK(d.param_grad_allreduce && d.local_output.kind == d.output.kind);
    CHECK(tp_style_install_forward(tp_style_lookup("all_reduce"), &lin, &d) == TP_OK);
    CHECK(d.local_output.kind == TP_PARTIAL && d.output.kind == TP_REPLICATE);
    CHECK(tp_style_install_forward(tp_style_lookup("gather"), &lin, &d) == TP_OK && d.inference_only);
    CHECK(tp_style_install_forward(tp_style_lookup("local"), &lin, &d) == TP_OK && d.divide_params_by_p);
    CHECK(tp_style_install_forward(tp_style_lookup("local_params"), &lin, &d) == TP_OK);
    CHECK(d.use_local_tensors && d.input.kind == d.compute_input.kind && d.local_output.kind == d.output.kind);
    CHECK(tp_style_lookup("moe_tp_experts")->support == TP_STYLE_OK);
    CHECK(tp_style_install_forward(tp_style_lookup("moe_tp_experts"), &lin, &d) == TP_OK);
    CHECK(d.local_output.kind == TP_PARTIAL && d.output.kind == TP_REPLICATE && d.allreduce_backward_input);
    CHECK(tp_style_lookup("grouped_gemm")->support == TP_STYLE_OK);
    /* mla_kv_a_proj (§2.13): a whole Linear, nothing moves; the config must have qk_rope_head_dim */
    CHECK(tp_style_lookup("mla_kv_a_proj")->support == TP_STYLE_OK);
    tp_model_config mla = {0};
    mla.qk_rope_head_dim = 8;
    tp_module_ctx kva = {"model.layers.0.self_attn.kv_a_proj_with_mqa", TP_MODULE_LINEAR, 2, 0, &mla, NULL, NULL};
    CHECK(tp_style_install_forward(tp_style_lookup("mla_kv_a_proj"), &kva, &d) == TP_OK);
    CHECK(d.input_from_model && d.output_from_model && !d.param_grad_allreduce &&
          tp_placement_equal(d.local_output, d.output, 2));
    mla.qk_rope_head_dim = 0;
    CHECK(tp_style_install_forward(tp_style_lookup("mla_kv_a_proj"), &kva, &d) != TP_OK);
    CHECK(!strcmp(tp_error(), "mla_kv_a_proj requires `qk_rope_head_dim` in the model config (module "
                  "`model.layers.0.self_attn.kv_a_proj_with_mqa`)."));
}

/* grouped_gemm (§2.17): Shard(0) on the expert dimension, E % P checked;
 * ep_router (§2.18): both plan-time checks. */
static void test_expert_parallel_styles(void)
{
    tp_model_config cfg = {.num_experts = 8};
    tp_module_ctx ex = {"model.layers.0.mlp.experts", TP_MODULE_EXPERTS, 4, 0, &cfg, NULL, NULL};
    int64_t shape[3] = {8, 80, 64};
    tp_param_ctx p = {"model.layers.0.mlp.experts.gate_up_proj", "gate_up_proj", TP_PARAM_WEIGHT, 3, shape};
    const tp_style *gg = tp_style_lookup("grouped_gemm");
    tp_placement pl;
    CHECK(tp_style_validate_param(gg, &ex, &p, p.name) == TP_OK);
    CHECK(tp_style_shard_param(gg, &ex, &p, &pl) == TP_OK && pl.kind == TP_SHARD && pl.dim == 0);
    ex.tp_size = 3;
    CHECK(tp_style_validate_param(gg, &ex, &p, p.name) != TP_OK);
    CHECK(!strcmp(tp_error(), "Global number of experts must be divisible by number of devices: 8 % 3 != 0"));
    tp_module_ctx router = {"model.layers.0.mlp.gate", TP_MODULE_LINEAR, 3, 0, &cfg, NULL, NULL};
    tp_forward_desc d;
    const tp_style *er = tp_style_lookup("ep_router");
    CHECK(tp_style_install_forward(er, &router, &d) != TP_OK);
    CHECK(!strcmp(tp_error(), "num_experts must be divisible by ep_size: 8 % 3 != 0"));
    cfg.num_experts = 0;
    CHECK(tp_style_install_forward(er, &router, &d) != TP_OK);
    CHECK(!strcmp(tp_error(), "Router module Linear is missing `num_experts` and `config.num_experts`"));
    cfg.num_experts = 6;
    CHECK(tp_style_install_forward(er, &router, &d) == TP_OK);
}

/* §2.18's test vector: 4 experts, top-2, EP size 2. */
static void test_ep_router_remap(void)
{
    static const int32_t ids[8] = {0, 2, 1, 3, 2, 0, 3, 1};
    static const float scores[8] = {.5f, .5f, .6f, .4f, .7f, .3f, .2f, .8f};
    static const int32_t want_ids[2][8] = {{0, 2, 1, 2, 2, 0, 2, 1}, {2, 0, 2, 1, 0, 2, 1, 2}};
    static const float want_scores[2][8] = {{.5f, 0, .6f, 0, 0, .3f, 0, .8f}, {0, .5f, 0, .4f, .7f, 0, .2f, 0}};
    for (int r = 0; r < 2; r++) {
        int32_t i[8];
        float s[8];
        memcpy(i, ids, sizeof i);
        memcpy(s, scores, sizeof s);
        tp_ep_router_remap(i, s, 4, 2, 4, r, 2);
        CHECK(!memcmp(i, want_ids[r], sizeof i) && !memcmp(s, want_scores[r], sizeof s));
    }
}


/* Registration from several threads at once: each of 4 threads registers
 * 1000 times, half under one shared name and half under 100 names of its
 * own (each 5 times), while looking names up and listing them. */
#define N_THREADS 4
#define N_REGS 1000
#define N_OWN 100

typedef struct {
    int id;
    int failures;
} reg_worker;

static void *register_many(void *arg)
{
    reg_worker *w = arg;
    tp_style st = *tp_style_lookup("colwise");
    char name[32];
    for (int i = 0; i < N_REGS; i++) {
        if (i % 2) snprintf(name, sizeof name, "thr%d_%d", w->id, (i / 2) % N_OWN);
        else snprintf(name, sizeof name, "thr_shared");
        st.name = name;
        if (tp_style_register(&st) != TP_OK) w->failures++;
        const tp_style *got = tp_style_lookup(name);
        if (!got || strcmp(got->name, name) || strcmp(got->impl, "ColwiseParallel")) w->failures++;
        if (i % 100 == 0) {
            char *names = tp_style_registry_names_repr(NULL);
            if (!names || !strstr(names, "'replicate'")) w->failures++;
            free(names);
        }
    }
    return NULL;
}

static void test_registry_threads(void)
{
    tp_style_registry_reset();
    pthread_t th[N_THREADS];
    reg_worker w[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (reg_worker){.id = i};
        CHECK(pthread_create(&th[i], NULL, register_many, &w[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(w[i].failures == 0, "thread %d: %d failures", i, w[i].failures);
    }
    /* every name once: the built-ins, the shared one, 100 per thread */
    CHECK(tp_style_registry_count(NULL) == N21 + 1 + N_THREADS * N_OWN);
    CHECK(!strcmp(tp_style_registry_name(NULL, N21 - 1), "replicate"));
    CHECK(tp_style_lookup("thr_shared") && tp_style_lookup("thr3_99") && !tp_style_lookup("thr4_0"));
    tp_style_registry_reset();
    CHECK(tp_style_registry_count(NULL) == N21 && !tp_style_lookup("thr_shared"));
}

static tp_model_config tiny_llama(void)
{
    tp_model_config c;
    tp_preset_config(&c, TP_ARCH_LLAMA, "tiny");
    return c;
}

/* The built-in plan with q_proj under `style`, resolved over 2 ranks. */
static tp_status resolve_with(const char *style, const tp_style_registry *reg, tp_plan_resolution **out)
{
    tp_model_config c = tiny_llama();
    tp_plan p = {0};
    tp_status s = tp_plan_builtin(&c, &p);
    if (!s) s = tp_plan_set(&p, "model.layers.*.self_attn.q_proj", style);
    *out = NULL;
    if (!s) s = tp_plan_resolve(&c, &p, 2, reg, out);
    tp_plan_free(&p);
    return s;
}

/* A plan resolved before a re-registration keeps the instance it resolved
 * (the replaced copy is not freed: under ASan a use after free would stop
 * the test). */
static void test_reregister_live_plan(void)
{
    tp_style_registry_reset();
    tp_style custom = *tp_style_lookup("colwise");
    custom.name = "colwise_live";
    CHECK(tp_style_register(&custom) == TP_OK);
    tp_plan_resolution *r = NULL;
    CHECK(resolve_with("colwise_live", NULL, &r) == TP_OK);
    const tp_param_plan *q = r ? tp_plan_find_param(r, "model.layers.1.self_attn.q_proj.weight") : NULL;
    CHECK(q && q->style && !strcmp(q->style->name, "colwise_live"));
    /* replace it (as rowwise) twice, then delete a view's copy */
    tp_style row = *tp_style_lookup("rowwise");
    row.name = "colwise_live";
    CHECK(tp_style_register(&row) == TP_OK && tp_style_register(&row) == TP_OK);
    CHECK(!strcmp(tp_style_lookup("colwise_live")->impl, "RowwiseParallel"));
    if (q && q->style) {
        /* the plan still sees the ColwiseParallel it resolved */
        CHECK(!strcmp(q->style->impl, "ColwiseParallel") && !strcmp(q->style->name, "colwise_live"));
        tp_param_slice sl;
        CHECK(tp_plan_param_slice(r, (size_t)(q - r->params), 1, &sl) == TP_OK);
        CHECK(sl.dim == 0 && sl.local_shape[0] == 32 && sl.local_shape[1] == 64);
    }
    const tp_module_plan *mp = r ? tp_plan_find_module(r, "model.layers.0.self_attn.q_proj") : NULL;
    tp_forward_desc d;
    CHECK(mp && mp->style && tp_style_install_forward(mp->style, &(tp_module_ctx){.kind = TP_MODULE_LINEAR}, &d) == TP_OK);
    CHECK(mp && d.output.kind == TP_SHARD);
    tp_plan_resolution_free(r);
    tp_style_registry_reset();
}

/* A model's own registry: its style resolves there and nowhere else. */
static void test_per_model_registry(void)
{
    tp_style_registry_reset();
    tp_style_registry *mine = NULL;
    CHECK(tp_style_registry_new(&mine) == TP_OK);
    tp_style custom = *tp_style_lookup("colwise");
    CHECK(tp_style_registry_set(mine, "colwise_mine", &custom) == TP_OK);
    CHECK(!tp_style_lookup("colwise_mine") && !tp_style_registry_contains(tp_style_registry_default(), "colwise_mine"));
    tp_plan_resolution *r = NULL;
    CHECK(resolve_with("colwise_mine", mine, &r) == TP_OK);
    const tp_param_plan *q = r ? tp_plan_find_param(r, "model.layers.0.self_attn.q_proj.weight") : NULL;
    CHECK(q && q->style == tp_style_registry_get(mine, "colwise_mine") && q->placement.kind == TP_SHARD);
    tp_plan_resolution_free(r);
    /* re-setting and deleting in the per-model registry, too, keeps the
     * resolved instance */
    CHECK(resolve_with("colwise_mine", mine, &r) == TP_OK);
    CHECK(tp_style_registry_set(mine, "colwise_mine", tp_style_lookup("rowwise")) == TP_OK);
    CHECK(tp_style_registry_del(mine, "colwise_mine") == TP_OK);
    q = r ? tp_plan_find_param(r, "model.layers.0.self_attn.q_proj.weight") : NULL;
    CHECK(q && !strcmp(q->style->impl, "ColwiseParallel"));
    tp_plan_resolution_free(r);
    /* the default registry does not know it */
    CHECK(resolve_with("colwise_mine", NULL, &r) == TP_ERR_INVALID && !r);
    CHECK(strstr(tp_error(), "Unsupported tensor parallel style") && strstr(tp_error(), "'colwise_mine'"));
    tp_style_registry_free(mine);
    /* the default registry is not freed by mistake */
    tp_style_registry_free((tp_style_registry *)tp_style_registry_default());
    CHECK(tp_style_lookup("colwise") != NULL);
}

int main(void)
{
    test_registry();
    test_registry_threads();
    test_reregister_live_plan();
    test_per_model_registry();
    test_placements();
    test_forward_descs();
    test_expert_parallel_styles();
    test_ep_router_remap();
    return check_summary();
}
