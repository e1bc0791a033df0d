/* parallel/: plans — built-in plans (A6), matching (A7, A8), validation and
 * its exact messages (A2, A3, A4, A9, C6), KV-head replication, uneven
 * shards, tied embeddings, tp_size = 1. */
#include "check.h"
#include "tensorpar/parallel.h"

#include <stdlib.h>
#include <string.h>

static tp_model_config tiny(tp_arch arch)
{
    tp_model_config c;
    tp_preset_config(&c, arch, "tiny");   /* hidden 64, 4 heads, 2 KV heads, vocab 512, 2 layers */
    return c;
}

static tp_plan parse(const char *json)
{
    tp_plan p;
    if (tp_plan_parse(json, "test", &p) != TP_OK) memset(&p, 0, sizeof p);
    return p;
}

/* Resolves; returns the status and leaves the resolution in *out (or NULL). */
static tp_status resolve_json(const tp_model_config *c, const char *json, int P, tp_plan_resolution **out)
{
    tp_plan p;
    tp_status s = tp_plan_parse(json, "test", &p);
    if (s) { *out = NULL; return s; }
    s = tp_plan_resolve(c, &p, P, NULL, out);
    tp_plan_free(&p);
    return s;
}

static const char *const llama_merged[] = {
    "lm_head", "colwise_gather_output",
    "model.layers.*.self_attn.q_proj", "colwise", "model.layers.*.self_attn.k_proj", "colwise",
    "model.layers.*.self_attn.v_proj", "colwise", "model.layers.*.self_attn.o_proj", "rowwise",
    "model.layers.*.mlp.gate_proj", "colwise", "model.layers.*.mlp.up_proj", "colwise",
    "model.layers.*.mlp.down_proj", "rowwise",
};

static void test_builtin(void)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    tp_plan a, b;
    CHECK(tp_plan_supports_tp(&c));
    CHECK(tp_plan_builtin(&c, &a) == TP_OK);
    CHECK(a.n == 8 && !a.is_user);
    for (size_t i = 0; i < 8 && i < a.n; i++)
        CHECK(!strcmp(a.v[i].key, llama_merged[2 * i]) && !strcmp(a.v[i].style, llama_merged[2 * i + 1]));
    /* A6: changing one plan does not reach a second one built afterwards. */
    CHECK(tp_plan_set(&a, "model.layers.*.mlp.up_proj", "replicate") == TP_OK);
    CHECK(tp_plan_set(&a, "extra", "colwise") == TP_OK);
    CHECK(tp_plan_builtin(&c, &b) == TP_OK);
    CHECK(b.n == 8 && !strcmp(b.v[6].style, "colwise"));
    CHECK(a.n == 9 && !strcmp(a.v[6].style, "replicate") && !strcmp(a.v[6].key, "model.layers.*.mlp.up_proj"));
    tp_plan_free(&a);
    tp_plan_free(&b);
    /* tied: embedding_rowwise appended to the base plan */
    c.tie_word_embeddings = 1;
    CHECK(tp_plan_builtin(&c, &a) == TP_OK);
    CHECK(a.n == 9 && !strcmp(a.v[8].key, "model.embed_tokens") && !strcmp(a.v[8].style, "embedding_rowwise"));
    tp_plan_free(&a);
    /* qwen3: the per-head norms */
    c = tiny(TP_ARCH_QWEN3);
    CHECK(tp_plan_builtin(&c, &a) == TP_OK);
    CHECK(a.n == 10 && !strcmp(a.v[4].key, "model.layers.*.self_attn.q_norm") &&
          !strcmp(a.v[4].style, "replicated_with_grad_allreduce") && !strcmp(a.v[6].key, "model.layers.*.self_attn.o_proj"));
    char *json = tp_plan_to_json(&a);
    CHECK(json && strstr(json, "\"lm_head\":\t\"colwise_gather_output\""));
    free(json);
    tp_plan_free(&a);
    c = tiny(TP_ARCH_MISTRAL);
    CHECK(tp_plan_builtin(&c, &a) == TP_OK && a.n == 8);
    tp_plan_free(&a);
    /* A9 */
    c = tiny(TP_ARCH_LLAMA);
    CHECK(tp_plan_builtin_ep(&c, &a) != TP_OK);
    CHECK(!strncmp(tp_error(), "Expert parallelism was requested (`enable_expert_parallel=True`), but "
                   "`LlamaForCausalLM` does not define an expert-parallel plan.", 121));
}

static void test_matching(void)
{
    char out[128];
    tp_plan_normalize("model.layers.12.mlp.fc1.weight", out, sizeof out);
    CHECK(!strcmp(out, "model.layers.*.mlp.fc1.weight"));
    tp_plan_normalize("w2", out, sizeof out);
    CHECK(!strcmp(out, "w2"));
    tp_plan_normalize("dense_h_to_4h", out, sizeof out);
    CHECK(!strcmp(out, "dense_h_to_4h"));
    tp_plan_normalize("layers.3.fc1", out, sizeof out);
    CHECK(!strcmp(out, "layers.*.fc1"));
    tp_plan_normalize("0.1", out, sizeof out);
    CHECK(!strcmp(out, "*.*"));

    /* the four rows of the §4.3 table */
    const char *N = "model.layers.5.mlp.down_proj.weight";
    tp_plan p = parse("{\"model.layers.*.mlp.down_proj\": \"rowwise\"}");
    int via;
    CHECK(tp_plan_match_param(&p, N, &via) == 0 && via);
    CHECK(tp_plan_set(&p, "model.layers.5.mlp.down_proj", "replicate") == TP_OK);
    CHECK(tp_plan_match_param(&p, N, &via) == 1 && via);
    CHECK(tp_plan_set(&p, "model.layers.*.mlp.down_proj.weight", "colwise") == TP_OK);
    CHECK(tp_plan_match_param(&p, N, &via) == 2 && !via);
    CHECK(tp_plan_set(&p, "model.layers.5.mlp.down_proj.weight", "rowwise") == TP_OK);
    CHECK(tp_plan_match_param(&p, N, &via) == 3 && !via);
    tp_plan_free(&p);
    p = parse("{\"model.layers.*.mlp\": \"colwise\"}");
    CHECK(tp_plan_match_param(&p, N, &via) == -1);            /* only the direct parent */
    CHECK(tp_plan_match_module(&p, "model.layers.5.mlp") == 0);
    tp_plan_free(&p);
    p = parse("{\"model.layers.0.experts.*.w1\": \"colwise\", \"model.layers\": \"colwise\"}");
    CHECK(tp_plan_match_param(&p, "model.layers.0.experts.3.w1.weight", NULL) == -1);
    CHECK(tp_plan_match_module(&p, "model.layers.0.experts.3.w1") == -1);
    CHECK(tp_plan_match_module(&p, "model.layers.0") == -1);  /* no prefix matching */
    tp_plan_free(&p);
}

static const tp_param_plan *param(const tp_plan_resolution *r, const char *name)
{
    const tp_param_plan *p = tp_plan_find_param(r, name);
    if (!p) fprintf(stderr, "no parameter %s\n", name);
    return p;
}

static int local_shape_is(const tp_plan_resolution *r, const char *name, int rank, int64_t d0, int64_t d1)
{
    const tp_param_plan *p = param(r, name);
    tp_param_slice s;
    if (!p || tp_plan_slice_of(r, p, rank, &s)) return 0;
    int ok = s.local_shape[0] == d0 && (s.ndim == 1 || s.local_shape[1] == d1);
    if (!ok) fprintf(stderr, "%s rank %d: [%lld, %lld]\n", name, rank, (long long)s.local_shape[0], (long long)s.local_shape[1]);
    return ok;
}

static void test_resolve_auto(void)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    tp_plan p;
    tp_plan_resolution *r;
    CHECK(tp_plan_builtin(&c, &p) == TP_OK);
    CHECK(tp_plan_resolve(&c, &p, 2, NULL, &r) == TP_OK);
    tp_plan_free(&p);
    if (!r) return;
    CHECK(local_shape_is(r, "model.layers.0.self_attn.q_proj.weight", 0, 32, 64));
    CHECK(local_shape_is(r, "model.layers.0.self_attn.k_proj.weight", 1, 16, 64));
    CHECK(local_shape_is(r, "model.layers.1.self_attn.o_proj.weight", 1, 64, 32));
    CHECK(local_shape_is(r, "model.layers.1.mlp.down_proj.weight", 0, 64, 80));
    CHECK(local_shape_is(r, "lm_head.weight", 1, 256, 64));
    CHECK(local_shape_is(r, "model.embed_tokens.weight", 1, 512, 64));
    const tp_param_plan *q = param(r, "model.layers.0.self_attn.q_proj.weight");
    CHECK(q && q->rule == 1 && q->via_module && !strcmp(q->style->name, "colwise") && q->placement.kind == TP_SHARD);
    tp_param_slice s;
    CHECK(tp_plan_slice_of(r, q, 1, &s) == TP_OK && s.dim == 0 && s.n == 1 && s.start[0] == 32 && s.len[0] == 32);
    CHECK(param(r, "model.norm.weight")->rule == -1);
    CHECK(r->q_heads_per_rank == 2 && r->kv_heads_per_rank == 1 && r->kv_rep == 1);
    /* D7: the coverage report */
    CHECK(!r->not_applied_warning && r->n_pattern_warnings == 0);
    CHECK_MSG(r->not_sharded_warning && !strcmp(r->not_sharded_warning, "The following layers were not sharded: "
              "model.embed_tokens.weight, model.layers.*.input_layernorm.weight, "
              "model.layers.*.post_attention_layernorm.weight, model.norm.weight"), "%s", r->not_sharded_warning);
    /* forward actions */
    const tp_module_plan *o = tp_plan_find_module(r, "model.layers.0.self_attn.o_proj");
    CHECK(o && o->fwd.local_output.kind == TP_PARTIAL && o->fwd.output.kind == TP_REPLICATE && o->out_features == 64);
    const tp_module_plan *lm = tp_plan_find_module(r, "lm_head");
    CHECK(lm && lm->fwd.output.kind == TP_REPLICATE && lm->out_features == 512);
    CHECK(r->n_modules == 15 && !tp_plan_find_module(r, "model.embed_tokens"));
    tp_plan_comm *cm;
    size_t nc;
    CHECK(tp_plan_comms(r, &cm, &nc) == TP_OK && nc == 5);   /* 2 x (o_proj, down_proj) + lm_head */
    if (nc == 5) CHECK(cm[4].coll == TP_COLL_ALL_GATHER && cm[4].elements == 512 && cm[0].coll == TP_COLL_ALL_REDUCE);
    free(cm);
    uint64_t unsplit = 0;
    for (size_t i = 0; i < r->n_params; i++)
        unsplit += (uint64_t)(r->params[i].shape[0] * (r->params[i].ndim == 2 ? r->params[i].shape[1] : 1)) * 4;
    CHECK(tp_plan_rank_bytes(r, 0, 4) + tp_plan_rank_bytes(r, 1, 4) > unsplit);   /* replicated parts twice */
    CHECK(tp_plan_check_training(r) == TP_OK);
    /* A10: the digest tells plans apart */
    tp_plan_resolution *r2;
    CHECK(resolve_json(&c, "{\"lm_head\": \"colwise_gather_output\"}", 2, &r2) == TP_OK);
    CHECK(r2 && tp_plan_digest(r) != tp_plan_digest(r2));
    CHECK(tp_plan_fail_disagree(0, 1) != TP_OK && !strncmp(tp_error(), "Ranks disagree on the tensor parallel plan (rank 0 and rank 1", 60));
    tp_plan_resolution_free(r2);
    tp_plan_resolution_free(r);
}

static void test_errors(void)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    tp_plan p;
    tp_plan_resolution *r;
    /* A3 */
    CHECK(tp_plan_parse("[\"colwise\"]", "x", &p) != TP_OK);
    CHECK(!strcmp(tp_error(), "Can only set a dictionary as `tp_plan`"));
    CHECK(tp_plan_parse("\"auto\"", "x", &p) != TP_OK && !strcmp(tp_error(), "Can only set a dictionary as `tp_plan`"));
    /* A2: one invalid, then two, then a non-string value */
    CHECK(resolve_json(&c, "{\"model.layers.*.self_attn.q_proj\": \"colwise\", "
                           "\"model.layers.*.mlp.up_proj\": \"invalid_style\"}", 2, &r) != TP_OK);
    CHECK_MSG(!strncmp(tp_error(), "Unsupported tensor parallel style 'invalid_style' for layer "
              "'model.layers.*.mlp.up_proj'. Supported styles are ['embedding_rowwise', 'embedding_colwise', ", 150),
              "%s", tp_error());
    CHECK(strstr(tp_error(), "'gather', 'local', 'replicate']") != NULL);
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp.up_proj\": \"invalid_style\", \"lm_head\": \"colwise_gather_output\", "
                           "\"model.layers.*.mlp.down_proj\": \"bad_style_2\"}", 2, &r) != TP_OK);
    CHECK_MSG(!strncmp(tp_error(), "Unsupported tensor parallel styles 'invalid_style' for layer "
              "'model.layers.*.mlp.up_proj', 'bad_style_2' for layer 'model.layers.*.mlp.down_proj'. "
              "Supported styles are [", 150), "%s", tp_error());
    CHECK(resolve_json(&c, "{\"lm_head\": 3}", 2, &r) != TP_OK);
    CHECK(!strncmp(tp_error(), "Unsupported tensor parallel style 3 for layer 'lm_head'. Supported", 60));
    /* tp_size = 1 validates names too, and applies nothing */
    CHECK(resolve_json(&c, "{\"lm_head\": \"nope\"}", 1, &r) != TP_OK);
    CHECK(resolve_json(&c, "{\"lm_head\": \"colwise_gather_output\", \"x.*.y\": \"colwise\"}", 1, &r) == TP_OK);
    if (r) {
        CHECK(!r->applied && r->n_modules == 0 && !r->not_sharded_warning && r->n_pattern_warnings == 0);
        CHECK(local_shape_is(r, "lm_head.weight", 0, 512, 64));
        tp_param_slice s;
        CHECK(tp_plan_param_slice(r, 0, 0, &s) == TP_OK && s.dim == -1);
        tp_plan_resolution_free(r);
    }
    /* B1 on the model: an lm_head that does not divide is gathered with
     * per-rank counts (§10.10): 50, 49 at P = 2, 33 each at P = 3; so are
     * colwise_rep, plain colwise and a hidden-parallel embedding (64 over 3:
     * 22, 22, 20). */
    c.vocab_size = 99;
    static const char *const gathering[] = {"colwise_gather_output", "colwise_rep", "colwise"};
    for (int k = 0; k < 3; k++) {
        char json[128];
        snprintf(json, sizeof json, "{\"lm_head\": \"%s\", \"model.embed_tokens\": \"embedding_colwise\"}", gathering[k]);
        CHECK_MSG(resolve_json(&c, json, 2, &r) == TP_OK, "%s: %s", gathering[k], tp_error());
        if (r) {
            CHECK(local_shape_is(r, "lm_head.weight", 0, 50, 64) && local_shape_is(r, "lm_head.weight", 1, 49, 64));
            tp_plan_resolution_free(r);
        }
        CHECK_MSG(resolve_json(&c, json, 3, &r) == TP_OK, "%s: %s", gathering[k], tp_error());
        if (r) {
            for (int q = 0; q < 3; q++) CHECK(local_shape_is(r, "lm_head.weight", q, 33, 64));
            CHECK(local_shape_is(r, "model.embed_tokens.weight", 0, 99, 22) &&
                  local_shape_is(r, "model.embed_tokens.weight", 2, 99, 20));
            tp_plan_resolution_free(r);
        }
    }
    c = tiny(TP_ARCH_LLAMA);
    /* mla_kv_a_proj on a model without qk_rope_head_dim: §2.13's message */
    CHECK(resolve_json(&c, "{\"model.layers.*.self_attn.q_proj\": \"mla_kv_a_proj\"}", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "mla_kv_a_proj requires `qk_rope_head_dim` in the model config (module "
                             "`model.layers.0.self_attn.q_proj`).") != NULL, "%s", tp_error());
    /* grouped_gemm shards 3-D expert tensors only */
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp.up_proj\": \"grouped_gemm\"}", 2, &r) != TP_OK);
    CHECK(strstr(tp_error(), "'grouped_gemm'") && strstr(tp_error(), "3-D expert tensors"));
    /* moe_tp_experts on a dense MLP resolves, and the flow check refuses it:
     * its all-reduce would add P copies of a replicated output */
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp\": \"moe_tp_experts\"}", 2, &r) == TP_OK);
    if (r) {
        CHECK(tp_plan_check_flow(r) != TP_OK && strstr(tp_error(), "P copies") != NULL);
        tp_plan_resolution_free(r);
    }
    /* ... but an unmatched rule only warns */
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp.experts\": \"moe_tp_experts\"}", 2, &r) == TP_OK);
    tp_plan_resolution_free(r);
    /* training rejects legacy inference-only styles */
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp\": \"gather\"}", 2, &r) == TP_OK);
    if (r) {
        CHECK(tp_plan_check_training(r) != TP_OK);
        CHECK(!strcmp(tp_error(), "The legacy tensor parallel style 'gather' is inference-only and cannot be used for training."));
        tp_plan_resolution_free(r);
    }
}

static void test_warnings(void)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    tp_plan_resolution *r;
    const char *valid = "{\"lm_head\": \"colwise_gather_output\", \"model.layers.*.self_attn.q_proj\": \"colwise\", "
                        "\"model.layers.*.self_attn.k_proj\": \"colwise\", \"model.layers.*.self_attn.v_proj\": \"colwise\", "
                        "\"model.layers.*.self_attn.o_proj\": \"rowwise\"";
    char json[1024];
    snprintf(json, sizeof json, "%s, \"nonexistent.*.layer\": \"colwise\"}", valid);
    /* A4 */
    CHECK(resolve_json(&c, json, 2, &r) == TP_OK);
    if (r) {
        CHECK(r->n_pattern_warnings == 1);
        CHECK(r->n_pattern_warnings && !strcmp(r->pattern_warnings[0], "Layer pattern 'nonexistent.*.layer' does not match "
              "any parameters in the model. This rule may not be applied during tensor parallelization, or may lead to "
              "dimension mismatches"));
        CHECK_MSG(r->not_applied_warning && !strcmp(r->not_applied_warning, "The following TP rules were not applied on "
                  "any of the layers: {'nonexistent.*.layer': 'colwise'}"), "%s", r->not_applied_warning);
        tp_plan_resolution_free(r);
    }
    snprintf(json, sizeof json, "%s}", valid);
    CHECK(resolve_json(&c, json, 2, &r) == TP_OK);
    if (r) {
        CHECK(r->n_pattern_warnings == 0 && !r->not_applied_warning);
        tp_plan_resolution_free(r);
    }
    /* A7: a mixed key matches nothing and is warned about; module and parameter names both count */
    CHECK(resolve_json(&c, "{\"model.layers.0.experts.*.w1\": \"colwise\", \"model.layers.*.mlp\": \"all_reduce\", "
                           "\"model.norm.weight\": \"replicate\", \"model.layers.1\": \"local_params\"}", 2, &r) == TP_OK);
    if (r) {
        CHECK(r->n_pattern_warnings == 1 && strstr(r->pattern_warnings[0], "'model.layers.0.experts.*.w1'"));
        CHECK(param(r, "model.norm.weight")->rule == 2);
        CHECK(tp_plan_find_module(r, "model.layers.1.mlp") && tp_plan_find_module(r, "model.layers.1"));
        tp_plan_resolution_free(r);
    }
    /* A5: {} shards nothing and lists everything */
    CHECK(resolve_json(&c, "{}", 2, &r) == TP_OK);
    if (r) {
        CHECK(r->n_modules == 0 && r->not_sharded_warning && strstr(r->not_sharded_warning, "lm_head.weight") &&
              strstr(r->not_sharded_warning, "model.layers.*.mlp.down_proj.weight"));
        tp_plan_resolution_free(r);
    }
}

static void test_indexed_override(void)
{
    /* A8: layer 0's MLP replicated, layer 1's split */
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    tp_plan p;
    tp_plan_resolution *r;
    CHECK(tp_plan_builtin(&c, &p) == TP_OK);
    p.is_user = 1;
    CHECK(tp_plan_set(&p, "model.layers.0.mlp.gate_proj", "replicate") == TP_OK &&
          tp_plan_set(&p, "model.layers.0.mlp.up_proj", "replicate") == TP_OK &&
          tp_plan_set(&p, "model.layers.0.mlp.down_proj", "replicate") == TP_OK);
    CHECK(tp_plan_resolve(&c, &p, 2, NULL, &r) == TP_OK);
    tp_plan_free(&p);
    if (!r) return;
    CHECK(local_shape_is(r, "model.layers.0.mlp.up_proj.weight", 1, 160, 64));
    CHECK(local_shape_is(r, "model.layers.0.mlp.down_proj.weight", 1, 64, 160));
    CHECK(local_shape_is(r, "model.layers.1.mlp.up_proj.weight", 1, 80, 64));
    CHECK(local_shape_is(r, "model.layers.1.mlp.down_proj.weight", 1, 64, 80));
    CHECK(!strcmp(tp_plan_find_module(r, "model.layers.0.mlp.down_proj")->style->name, "replicate"));
    CHECK(!strcmp(tp_plan_find_module(r, "model.layers.1.mlp.down_proj")->style->name, "rowwise"));
    CHECK(!r->not_applied_warning && r->n_pattern_warnings == 0);
    tp_plan_resolution_free(r);
}

static tp_status heads(int64_t H, int64_t K, int P, tp_plan_resolution **r)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    c.num_attention_heads = H;
    c.num_key_value_heads = K;
    c.head_dim = 8;
    c.hidden_size = 96;
    c.vocab_size = 96;
    tp_plan p;
    if (tp_plan_builtin(&c, &p)) return TP_ERR_INTERNAL;
    tp_status s = tp_plan_resolve(&c, &p, P, NULL, r);
    tp_plan_free(&p);
    return s;
}

static void test_heads(void)
{
    tp_plan_resolution *r;
    /* C6 */
    CHECK(heads(6, 6, 4, &r) != TP_OK);
    CHECK(!strcmp(tp_error(), "Cannot use tensor parallelism with tp_size=4 for a model with num_attention_heads=6: "
                  "`num_attention_heads` must be divisible by `tp_size`."));
    CHECK(heads(12, 3, 4, &r) != TP_OK);
    CHECK(!strcmp(tp_error(), "Cannot use tensor parallelism with tp_size=4 for a model with num_key_value_heads=3: "
                  "when there are fewer KV heads than ranks, `num_key_value_heads` must divide `tp_size` so that KV "
                  "heads can be replicated."));
    CHECK(heads(12, 3, 2, &r) != TP_OK);
    CHECK(!strcmp(tp_error(), "Cannot use tensor parallelism with tp_size=2 for a model with num_key_value_heads=3: "
                  "`num_key_value_heads` must be divisible by `tp_size`, or divide it so that KV heads can be replicated."));
    /* H = 8, K = 2, P = 4: replication, ranks 0,1 -> head 0, ranks 2,3 -> head 1 */
    CHECK(heads(8, 2, 4, &r) == TP_OK);
    if (r) {
        CHECK(r->kv_rep == 2 && r->kv_heads_per_rank == 1 && r->q_heads_per_rank == 2);
        for (int k = 0; k < 4; k++) {
            int64_t f, n;
            tp_plan_kv_heads(r, k, &f, &n);
            CHECK(f == k / 2 && n == 1);
            tp_plan_q_heads(r, k, &f, &n);
            CHECK(f == 2 * k && n == 2);
            tp_param_slice s;
            const tp_param_plan *kp = param(r, "model.layers.1.self_attn.k_proj.weight");
            CHECK(kp && kp->kv_rep == 2 && tp_plan_slice_of(r, kp, k, &s) == TP_OK);
            CHECK(s.dim == 0 && s.n == 1 && s.start[0] == (k / 2) * 8 && s.len[0] == 8 && s.local_shape[0] == 8 &&
                  s.local_shape[1] == 96);
            CHECK(local_shape_is(r, "model.layers.0.self_attn.v_proj.weight", k, 8, 96));
            CHECK(local_shape_is(r, "model.layers.0.self_attn.q_proj.weight", k, 16, 96));
        }
        tp_plan_resolution_free(r);
    }
    CHECK(heads(32, 8, 16, &r) == TP_OK && r && r->kv_rep == 2);
    tp_plan_resolution_free(r);
    /* qwen2 biases are replicated per head as well */
    tp_model_config c = tiny(TP_ARCH_QWEN2);
    c.num_key_value_heads = 1;
    tp_plan p;
    CHECK(tp_plan_builtin(&c, &p) == TP_OK && tp_plan_resolve(&c, &p, 4, NULL, &r) == TP_OK);
    tp_plan_free(&p);
    if (r) {
        CHECK(r->kv_rep == 4 && local_shape_is(r, "model.layers.0.self_attn.k_proj.bias", 3, 16, 0));
        CHECK(local_shape_is(r, "model.layers.0.self_attn.q_proj.bias", 3, 16, 0));
        tp_plan_resolution_free(r);
    }
    /* heads do not matter when attention is not sharded */
    tp_model_config d = tiny(TP_ARCH_LLAMA);
    d.num_attention_heads = 3; d.num_key_value_heads = 3; d.head_dim = 16; d.hidden_size = 48;
    CHECK(resolve_json(&d, "{\"model.layers.*.mlp.up_proj\": \"colwise\"}", 2, &r) == TP_OK);
    tp_plan_resolution_free(r);
}

static void test_uneven_and_tied(void)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    c.vocab_size = 10;
    c.hidden_size = 6;
    c.num_attention_heads = 3; c.num_key_value_heads = 3; c.head_dim = 2;
    c.intermediate_size = 10;
    tp_plan_resolution *r;
    /* 10 over 3 -> 4, 4, 2 (B2) */
    CHECK(resolve_json(&c, "{\"model.embed_tokens\": \"embedding_rowwise\", \"model.layers.*.mlp.up_proj\": \"colwise\", "
                           "\"model.layers.*.mlp.down_proj\": \"rowwise\", \"lm_head\": \"colwise\"}", 3, &r) == TP_OK);
    if (r) {
        int64_t want[3] = {4, 4, 2}, start[3] = {0, 4, 8};
        for (int k = 0; k < 3; k++) {
            CHECK(local_shape_is(r, "model.embed_tokens.weight", k, want[k], 6));
            CHECK(local_shape_is(r, "model.layers.0.mlp.up_proj.weight", k, want[k], 6));
            CHECK(local_shape_is(r, "model.layers.0.mlp.down_proj.weight", k, 6, want[k]));
            CHECK(local_shape_is(r, "lm_head.weight", k, want[k], 6));
            int64_t vs, vn;
            tp_plan_vocab_range(r, k, &vs, &vn);
            CHECK(vs == start[k] && vn == want[k]);
        }
        tp_plan_resolution_free(r);
    }
    /* 5 over 4 -> 2, 2, 1, 0 (B3) */
    c.intermediate_size = 5;
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp.up_proj\": \"colwise\"}", 4, &r) == TP_OK);
    if (r) {
        int64_t want[4] = {2, 2, 1, 0};
        for (int k = 0; k < 4; k++) CHECK(local_shape_is(r, "model.layers.1.mlp.up_proj.weight", k, want[k], 6));
        tp_param_slice s;
        CHECK(tp_plan_slice_of(r, param(r, "model.layers.1.mlp.up_proj.weight"), 3, &s) == TP_OK && s.start[0] == 5 && s.len[0] == 0);
        tp_plan_resolution_free(r);
    }
    /* strided: packed_colwise on a [10, 6] weight at P = 2: m = 5 -> {0,1,2,5,6,7}, {3,4,8,9} */
    c.intermediate_size = 10;
    CHECK(resolve_json(&c, "{\"model.layers.*.mlp.up_proj\": \"packed_colwise\"}", 2, &r) == TP_OK);
    if (r) {
        tp_param_slice s;
        const tp_param_plan *u = param(r, "model.layers.0.mlp.up_proj.weight");
        CHECK(u && u->placement.kind == TP_STRIDED_SHARD && u->placement.split == 2);
        CHECK(tp_plan_slice_of(r, u, 0, &s) == TP_OK && s.n == 2 && s.start[0] == 0 && s.len[0] == 3 &&
              s.start[1] == 5 && s.len[1] == 3 && s.local_shape[0] == 6);
        CHECK(tp_plan_slice_of(r, u, 1, &s) == TP_OK && s.n == 2 && s.start[0] == 3 && s.len[0] == 2 &&
              s.start[1] == 8 && s.len[1] == 2 && s.local_shape[0] == 4);
        tp_plan_resolution_free(r);
    }
    /* tied embeddings: the merged plan agrees; a mismatched user plan is refused */
    tp_model_config t = tiny(TP_ARCH_QWEN3);
    t.tie_word_embeddings = 1;
    tp_plan p;
    CHECK(tp_plan_builtin(&t, &p) == TP_OK && tp_plan_resolve(&t, &p, 2, NULL, &r) == TP_OK);
    tp_plan_free(&p);
    if (r) {
        CHECK(r->has_tied_head && r->tied_head.tied_to == 0 && r->tied_head.placement.kind == TP_SHARD);
        CHECK(local_shape_is(r, "lm_head.weight", 1, 256, 64));
        CHECK(tp_plan_find_module(r, "lm_head") && tp_plan_find_module(r, "model.embed_tokens"));
        CHECK(tp_plan_find_module(r, "model.embed_tokens")->fwd.mask_vocab);
        CHECK(!r->not_applied_warning);
        CHECK(r->not_sharded_warning && !strstr(r->not_sharded_warning, "embed_tokens") &&
              !strstr(r->not_sharded_warning, "q_norm"));
        tp_plan_resolution_free(r);
    }
    CHECK(resolve_json(&t, "{\"lm_head\": \"colwise_gather_output\"}", 2, &r) != TP_OK);
    CHECK_MSG(!strcmp(tp_error(), "Tied parameters `model.embed_tokens.weight` and `lm_head.weight` resolve to different "
              "tensor parallel placements (Replicate() and Shard(0)); give them matching styles, e.g. `embed_tokens: "
              "embedding_rowwise` with `lm_head: colwise_gather_output`."), "%s", tp_error());
}

/* The built-in llama plan plus `extra` rules (a JSON object's inside),
 * resolved at P and checked by tp_plan_check_flow; the flow's status. */
static tp_status flow_json(const tp_model_config *c, const char *extra, int P, tp_plan_resolution **out)
{
    char json[2048];
    snprintf(json, sizeof json, "{\"lm_head\": \"colwise_gather_output\", "
             "\"model.layers.*.self_attn.q_proj\": \"colwise\", \"model.layers.*.self_attn.k_proj\": \"colwise\", "
             "\"model.layers.*.self_attn.v_proj\": \"colwise\", \"model.layers.*.self_attn.o_proj\": \"rowwise\", "
             "\"model.layers.*.mlp.gate_proj\": \"colwise\", \"model.layers.*.mlp.up_proj\": \"colwise\", "
             "\"model.layers.*.mlp.down_proj\": \"rowwise\"%s%s}", *extra ? ", " : "", extra);
    tp_status s = resolve_json(c, json, P, out);
    if (s) return s;
    s = tp_plan_check_flow(*out);
    if (s) { tp_plan_resolution_free(*out); *out = NULL; }
    return s;
}

/* Layouts that do not fit are refused naming module and style; styles that
 * leave layouts to the module get the real ones. */
static void test_flow(void)
{
    tp_model_config c = tiny(TP_ARCH_LLAMA);
    tp_plan_resolution *r;
    CHECK(flow_json(&c, "", 2, &r) == TP_OK);
    tp_plan_resolution_free(r);
    /* a replicated down_proj fed a Shard(-1) activation (was: wrong logits) */
    CHECK(flow_json(&c, "\"model.layers.*.mlp.down_proj\": \"all_reduce\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "'all_reduce'") && strstr(tp_error(), "`model.layers.0.mlp.down_proj`") &&
              strstr(tp_error(), "Shard(-1)"), "%s", tp_error());
    CHECK(flow_json(&c, "\"model.layers.*.mlp.down_proj\": \"replicate\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "it declares its input Replicate, but the input it receives here is Shard(-1) "
                     "(the output of `model.layers.0.mlp.gate_proj`, style 'colwise')"), "%s", tp_error());
    /* legacy local pair under gather: the real layouts are filled in */
    CHECK(flow_json(&c, "\"model.layers.*.self_attn.q_proj\": \"local_colwise\", \"model.layers.*.self_attn.k_proj\": "
                        "\"local_colwise\", \"model.layers.*.self_attn.v_proj\": \"local_colwise\", "
                        "\"model.layers.*.self_attn.o_proj\": \"local_rowwise\", \"model.layers.*.self_attn\": "
                        "\"gather\"", 2, &r) == TP_OK);
    if (r) {
        const tp_module_plan *q = tp_plan_find_module(r, "model.layers.1.self_attn.q_proj");
        const tp_module_plan *o = tp_plan_find_module(r, "model.layers.1.self_attn.o_proj");
        const tp_module_plan *b = tp_plan_find_module(r, "model.layers.1.self_attn");
        CHECK(q && q->fwd.input.kind == TP_REPLICATE && q->fwd.output.kind == TP_SHARD);
        CHECK(o && o->fwd.input.kind == TP_SHARD && o->fwd.output.kind == TP_PARTIAL);
        CHECK(b && b->fwd.local_output.kind == TP_PARTIAL && b->fwd.output.kind == TP_REPLICATE);
        tp_plan_resolution_free(r);
    }
    /* ... and without the gather nothing sums o_proj's output */
    CHECK(flow_json(&c, "\"model.layers.*.self_attn.o_proj\": \"local_rowwise\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "'local_rowwise'") && strstr(tp_error(), "nothing sums it"), "%s", tp_error());
    /* gather on a replicated output would add P copies */
    CHECK(flow_json(&c, "\"model.layers.*.mlp\": \"gather\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "P copies") && strstr(tp_error(), "`model.layers.0.mlp`"), "%s", tp_error());
    /* rowwise k_proj at P = 4 with 2 KV heads: its input, not KV replication */
    CHECK(flow_json(&c, "\"model.layers.*.self_attn.k_proj\": \"rowwise\"", 4, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "'rowwise'") && strstr(tp_error(), "k_proj") &&
              strstr(tp_error(), "declares its input Shard(-1)") && !strstr(tp_error(), "replication"),
              "%s", tp_error());
    /* sequence_parallel: runs on the stream's norms, refused on a block */
    CHECK(flow_json(&c, "\"model.layers.*.input_layernorm\": \"sequence_parallel\", \"model.norm\": "
                        "\"sequence_parallel\"", 2, &r) == TP_OK);
    tp_plan_resolution_free(r);
    CHECK(flow_json(&c, "\"model.layers.*.mlp\": \"sequence_parallel\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "'sequence_parallel'") && strstr(tp_error(), "sequence-sharded"), "%s", tp_error());
    /* a sharded norm weight */
    CHECK(flow_json(&c, "\"model.norm\": \"colwise\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "'colwise'") && strstr(tp_error(), "`model.norm`") &&
              strstr(tp_error(), "whole weight"), "%s", tp_error());
    /* q/k/v heads that do not line up (q whole, k and v split) */
    CHECK(flow_json(&c, "\"model.layers.*.self_attn.q_proj\": \"replicate\"", 2, &r) != TP_OK);
    CHECK_MSG(strstr(tp_error(), "'replicate'") && strstr(tp_error(), "do not line up"), "%s", tp_error());
}

int main(void)
{
    test_builtin();
    test_matching();
    test_resolve_auto();
    test_errors();
    test_warnings();
    test_indexed_override();
    test_heads();
    test_uneven_and_tied();
    test_flow();
    return check_summary();
}
