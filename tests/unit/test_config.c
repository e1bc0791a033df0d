/* io/config: parsing, defaults, --set overrides, rejection of bad configs. */
#include "check.h"
#include "tensorpar/io.h"
#include "tensorpar/models.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static tp_status load_text(const char *json, tp_model_config *c)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (tp_write_file_atomic(path, json, strlen(json))) return TP_ERR_IO;
    return tp_config_load(c, dir);
}

static void test_parse(void)
{
    tp_model_config c;
    CHECK(load_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                    " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
                    " \"eos_token_id\": [5, 6], \"torch_dtype\": \"bfloat16\"}", &c) == TP_OK);
    CHECK(c.arch == TP_ARCH_LLAMA && c.head_dim == 16 && c.num_key_value_heads == 4);
    CHECK(c.rope_scaling.kind == TP_ROPE_LLAMA3 && c.rope_scaling.factor == 8.0);
    CHECK(c.n_eos == 2 && c.eos_token_ids[1] == 6 && c.dtype == TP_BF16);
    CHECK(load_text("{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                    " \"num_key_value_heads\": 2, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", &c) == TP_OK);
    CHECK(c.qkv_bias && !c.qk_norm && c.rope_scaling.kind == TP_ROPE_LINEAR);
    CHECK(load_text("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32}", &c) == TP_OK);
    CHECK(c.qk_norm && c.head_dim == 32);
    CHECK(load_text("{\"model_type\": \"mistral\", \"sliding_window\": null}", &c) == TP_OK);
    CHECK(c.sliding_window == 0);
}

/* deepseek_v2/v3: head_dim is the rotary width, q_lora_rank null means
 * q_proj, YaRN's factor follows max_position_embeddings over the original
 * when the latter is given, MoE keys only with sparse layers. */
static void test_deepseek(void)
{
    tp_model_config c;
    CHECK(load_text("{\"model_type\": \"deepseek_v2\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                    " \"num_hidden_layers\": 2, \"first_k_dense_replace\": 2, \"q_lora_rank\": null,"
                    " \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 12,"
                    " \"max_position_embeddings\": 2048, \"head_dim\": 99, \"rope_interleave\": false,"
                    " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 3, \"original_max_position_embeddings\": 512,"
                    " \"mscale\": 0.707, \"mscale_all_dim\": 0.707}}", &c) == TP_OK);
    CHECK(c.mla && c.head_dim == 8 && c.q_lora_rank == 0 && c.kv_lora_rank == 32 && c.v_head_dim == 12);
    CHECK(c.rope_interleave);   /* V2 always turns pairs */
    CHECK(c.rope_scaling.kind == TP_ROPE_YARN && c.rope_scaling.factor == 3.0 && c.rope_scaling.yarn_factor == 4.0 &&
          c.rope_scaling.yarn_original == 512 && c.rope_scaling.beta_fast == 32.0 &&
          c.rope_scaling.mscale_all_dim == 0.707 && c.num_experts == 0 && c.num_key_value_heads == 4);
    /* a round trip through the writer keeps every key */
    CHECK(tp_config_set(&c, "q_lora_rank=24") == TP_OK);
    CHECK(c.q_lora_rank == 24 && c.head_dim == 8 && c.rope_scaling.factor == 3.0 && c.rope_scaling.yarn_factor == 4.0 &&
          c.rope_scaling.mscale == 0.707);
    CHECK(tp_config_set(&c, "first_k_dense_replace=1") != TP_OK);   /* V2 has no default num_experts_per_tok */
    CHECK(tp_config_set_all(&c, (const char *[]){"first_k_dense_replace=1", "num_experts_per_tok=2",
                                                 "n_routed_experts=8", "topk_method=group_limited_greedy",
                                                 "n_group=4", "topk_group=2"}, 6) == TP_OK);
    CHECK(c.num_experts == 8 && c.group_limited && c.n_shared_experts == 2 && c.moe_intermediate_size == 1407);
    CHECK(tp_config_layer_is_sparse(&c, 1) && !tp_config_layer_is_sparse(&c, 0));
    CHECK(load_text("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                    " \"num_hidden_layers\": 3, \"n_routed_experts\": 16, \"moe_intermediate_size\": 8}", &c) == TP_OK);
    CHECK(c.first_k_dense_replace == 3 && c.num_experts == 0 && c.q_lora_rank == 1536 && c.rope_interleave);
    CHECK(load_text("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                    " \"num_hidden_layers\": 4, \"n_routed_experts\": 16, \"moe_intermediate_size\": 8}", &c) == TP_OK);
    CHECK(c.num_experts == 16 && c.num_experts_per_tok == 8 && c.n_group == 8 && c.topk_group == 4 &&
          c.norm_topk_prob && c.routed_scaling_factor == 2.5 && tp_config_layer_is_sparse(&c, 3));
}

static void expect_error(const char *json, const char *needle);

/* llama4_text: Llama4TextConfig's defaults and derived layer lists; the
 * published attn_temperature_tuning 4 read as true; moe_layers past the
 * last layer ignored; the writer and --set keep the lists. */
static void test_llama4(void)
{
    tp_model_config c;
    CHECK(load_text("{\"model_type\": \"llama4_text\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_hidden_layers\": 8,"
                    " \"interleave_moe_layer_step\": 2, \"no_rope_layers\": [], \"attn_temperature_tuning\": 4,"
                    " \"attention_chunk_size\": null}", &c) == TP_OK);
    CHECK(c.llama4 && c.num_experts == 16 && c.num_experts_per_tok == 1 && c.moe_intermediate_size == 8192 &&
          c.intermediate_size_mlp == 16384 && c.l2_qk_norm && c.attn_temperature_tuning && c.floor_scale == 8192);
    CHECK(!tp_config_layer_is_sparse(&c, 0) && tp_config_layer_is_sparse(&c, 1) && tp_config_layer_is_sparse(&c, 7));
    CHECK(tp_config_layer_uses_rope(&c, 2) && !tp_config_layer_uses_rope(&c, 3) && !tp_config_layer_uses_rope(&c, 7));
    CHECK(tp_config_layer_window(&c, 0) == 0);   /* no chunks */
    CHECK(tp_config_set_all(&c, (const char *[]){"attention_chunk_size=32", "moe_layers=[0, 5, 20]",
                                                 "no_rope_layers=[1, 0, 1, 1, 1, 1, 1, 1, 1]"}, 3) == TP_OK);
    CHECK(tp_config_layer_is_sparse(&c, 0) && tp_config_layer_is_sparse(&c, 5) && !tp_config_layer_is_sparse(&c, 1));
    CHECK(!tp_config_layer_uses_rope(&c, 1) && tp_config_layer_window(&c, 0) == -32 &&
          tp_config_layer_window(&c, 1) == 0);
    CHECK(tp_config_set(&c, "num_hidden_layers=4") == TP_OK);   /* the lists outlive a cut */
    CHECK(tp_config_layer_is_sparse(&c, 0) && !tp_config_layer_is_sparse(&c, 3) && !tp_config_layer_uses_rope(&c, 1));
    CHECK(tp_config_set(&c, "num_hidden_layers=12") != TP_OK && strstr(tp_error(), "no_rope_layers"));
    CHECK(tp_config_set(&c, "layer_types=[\"full_attention\"]") != TP_OK && strstr(tp_error(), "layer_types"));
}

static void expect_error(const char *json, const char *needle)
{
    tp_model_config c;
    tp_status s = load_text(json, &c);
    CHECK_MSG(s != TP_OK && strstr(tp_error(), needle) && strstr(tp_error(), "config.json"),
              "json %s gave '%s'", json, tp_error());
}

static void test_errors(void)
{
    expect_error("{\"model_type\": \"llama\", ", "not a valid JSON");
    expect_error("[1, 2]", "not a valid JSON object");
    expect_error("{\"hidden_size\": 4}", "model_type");
    expect_error("{\"model_type\": \"gpt2\"}", "gpt2");
    expect_error("{\"model_type\": \"llama\", \"hidden_size\": \"big\"}", "hidden_size");
    expect_error("{\"model_type\": \"llama\", \"hidden_size\": -4}", "hidden_size");
    expect_error("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "rope_scaling");
    expect_error("{\"model_type\": \"llama\", \"hidden_size\": 60, \"num_attention_heads\": 8}", "num_attention_heads");
    expect_error("{\"model_type\": \"llama\", \"num_attention_heads\": 8, \"num_key_value_heads\": 3}", "num_key_value_heads");
    expect_error("{\"model_type\": \"qwen2\", \"use_sliding_window\": true}", "use_sliding_window");
    expect_error("{\"model_type\": \"llama\", \"torch_dtype\": \"int4\"}", "torch_dtype");
    expect_error("{\"model_type\": \"deepseek_v2\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                 " \"num_hidden_layers\": 2, \"first_k_dense_replace\": 2, \"num_key_value_heads\": 2}",
                 "num_key_value_heads");
    expect_error("{\"model_type\": \"deepseek_v2\", \"attention_bias\": true}", "attention_bias");
    expect_error("{\"model_type\": \"llama4\", \"text_config\": {}}", "'llama4_text'");
    expect_error("{\"model_type\": \"llama4_text\", \"num_local_experts\": 2, \"num_experts_per_tok\": 3}",
                 "num_experts_per_tok");
    expect_error("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                 " \"num_hidden_layers\": 4, \"n_routed_experts\": 16, \"n_group\": 16, \"topk_group\": 16}",
                 "two best experts");
    tp_model_config c;
    rmdir(dir);
    CHECK(tp_config_load(&c, "/nonexistent-dir") != TP_OK && strstr(tp_error(), "/nonexistent-dir/config.json"));
}

static void test_set_and_roundtrip(void)
{
    tp_model_config c, back;
    CHECK(tp_preset_config(&c, TP_ARCH_LLAMA, "tiny") == TP_OK);
    CHECK(tp_config_set(&c, "num_key_value_heads=4") == TP_OK && c.num_key_value_heads == 4);
    CHECK(tp_config_set(&c, "tie_word_embeddings=true") == TP_OK && c.tie_word_embeddings);
    CHECK(tp_config_set(&c, "rope_scaling={\"rope_type\":\"linear\",\"factor\":2.0}") == TP_OK &&
          c.rope_scaling.kind == TP_ROPE_LINEAR);
    CHECK(tp_config_set(&c, "hidden_size=96") == TP_OK && c.head_dim == 24);
    CHECK(tp_config_set(&c, "nonsense") != TP_OK);
    CHECK(tp_config_set(&c, "num_attention_heads=5") != TP_OK && strstr(tp_error(), "num_attention_heads"));
    CHECK(tp_config_save(&c, dir) == TP_OK);
    CHECK(tp_config_load(&back, dir) == TP_OK);
    CHECK(back.hidden_size == c.hidden_size && back.head_dim == c.head_dim &&
          back.num_key_value_heads == c.num_key_value_heads && back.tie_word_embeddings &&
          back.rope_scaling.kind == TP_ROPE_LINEAR && back.rope_scaling.factor == 2.0);
    CHECK(tp_preset_config(&c, TP_ARCH_QWEN3, "qwen3-0.6b") == TP_OK && c.head_dim == 128 && c.tie_word_embeddings);
    CHECK(tp_preset_config(&c, TP_ARCH_LLAMA, "nope") != TP_OK);
}

/* Inputs the fuzzer (tests/fuzz/fuzz_config) found mishandled: numbers
 * beyond int64 were converted with undefined behaviour. */
static void test_fuzz_regressions(void)
{
    expect_error("{\"model_type\": \"qwen2\", \"hidden_size\": 5555555555555555555555555555555555555555555555555555555555555555555555555555555555896}",
                 "'hidden_size' must be an integer (at most 2^53");
    expect_error("{\"model_type\": \"llama\", \"eos_token_id\": 1e300}", "eos_token_id");
    expect_error("{\"model_type\": \"llama\", \"eos_token_id\": [2, 1.5]}", "eos_token_id");
    expect_error("{\"model_type\": \"llama\", \"bos_token_id\": -1e19}", "'bos_token_id' must be an integer");
    expect_error("{\"model_type\": \"llama\", \"head_dim\": 1e15}", "'head_dim' = 1000000000000000 is too large");
    expect_error("{\"model_type\": \"llama\", \"vocab_size\": 4294967296}", "'vocab_size' = 4294967296 is too large");
    tp_model_config c;
    CHECK(load_text("{\"model_type\": \"llama\", \"vocab_size\": 2147483647, \"bos_token_id\": 9007199254740992}", &c) == TP_OK);
    CHECK(c.vocab_size == 2147483647 && c.bos_token_id == 9007199254740992LL);
}

/* make-model --set: all pairs first, one check of the final config, and
 * unknown keys refused with the list of known ones. */
static void test_set_all(void)
{
    tp_model_config c;
    CHECK(tp_preset_config(&c, TP_ARCH_LLAMA, "tiny") == TP_OK && c.hidden_size == 64 && c.num_key_value_heads == 2);
    const char *heads_first[] = {"num_attention_heads=6", "hidden_size=96"};
    const char *hidden_first[] = {"hidden_size=96", "num_attention_heads=6"};
    CHECK(tp_config_set(&c, heads_first[0]) != TP_OK && strstr(tp_error(), "hidden_size 64"));
    CHECK(c.num_attention_heads == 4);   /* a refused --set leaves the config as it was */
    CHECK(tp_config_set_all(&c, heads_first, 2) == TP_OK && c.num_attention_heads == 6 && c.head_dim == 16);
    CHECK(tp_preset_config(&c, TP_ARCH_LLAMA, "tiny") == TP_OK);
    CHECK(tp_config_set_all(&c, hidden_first, 2) == TP_OK && c.num_attention_heads == 6 && c.head_dim == 16);
    const char *typo[] = {"hidden_size=128", "num_attention_head=8"};
    CHECK(tp_config_set_all(&c, typo, 2) != TP_OK && strstr(tp_error(), "unknown config key 'num_attention_head'") &&
          strstr(tp_error(), "known keys: ") && strstr(tp_error(), "num_attention_heads"));
    CHECK(c.hidden_size == 96);
    CHECK(tp_config_set(&c, "architectures=[\"X\"]") != TP_OK && strstr(tp_error(), "'architectures'"));
    CHECK(tp_config_set(&c, "model_type=qwen3") != TP_OK && strstr(tp_error(), "'model_type'"));
}

/* gpt_oss: GptOssConfig's defaults (YaRN factor 32 untruncated, window
 * 128 on alternating layers, attention biases, experts as wide as
 * intermediate_size), explicit layer_types, and their round trip. */
static void test_gpt_oss(void)
{
    tp_model_config c;
    CHECK(load_text("{\"model_type\": \"gpt_oss\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_hidden_layers\": 3,"
                    " \"intermediate_size\": 40, \"num_local_experts\": 8}", &c) == TP_OK);
    const tp_rope_scaling *rs = &c.rope_scaling;
    CHECK(c.arch == TP_ARCH_GPT_OSS && c.attention_bias && c.num_experts == 8 && c.num_experts_per_tok == 4 &&
          c.moe_intermediate_size == 40 && c.swiglu_limit == 7.0 && c.swiglu_alpha == 1.702);
    CHECK(rs->kind == TP_ROPE_YARN && !rs->yarn_truncate && rs->yarn_factor == 32.0 && rs->yarn_original == 4096 &&
          c.rope_theta == 150000.0 && c.max_position_embeddings == 131072);
    CHECK(tp_config_layer_window(&c, 0) == 128 && tp_config_layer_window(&c, 1) == 0 &&
          tp_config_layer_window(&c, 2) == 128);
    CHECK(tp_config_layer_is_sparse(&c, 0) && tp_config_layer_is_sparse(&c, 2));
    CHECK(tp_config_set(&c, "layer_types=[\"full_attention\",\"sliding_attention\",\"sliding_attention\"]") == TP_OK);
    CHECK(tp_config_layer_window(&c, 0) == 0 && tp_config_layer_window(&c, 1) == 128 &&
          tp_config_layer_window(&c, 2) == 128);
    /* the writer keeps the list (not the default alternation) and the untruncated YaRN */
    CHECK(tp_config_set(&c, "swiglu_limit=3") == TP_OK);
    CHECK(c.swiglu_limit == 3.0 && tp_config_layer_window(&c, 0) == 0 && !c.rope_scaling.yarn_truncate);
    CHECK(tp_config_set(&c, "layer_types=[\"full_attention\"]") != TP_OK && strstr(tp_error(), "'layer_types'"));
    CHECK(tp_config_set(&c, "layer_types=[\"a\",\"b\",\"c\"]") != TP_OK && strstr(tp_error(), "layer_types[0]"));
    /* openai/gpt-oss-20b's config.json as published (its MXFP4
     * quantization_config is read past: the tensors' names refuse it) */
    CHECK(load_text("{\"architectures\": [\"GptOssForCausalLM\"], \"attention_bias\": true, \"attention_dropout\": 0.0,"
                    " \"eos_token_id\": 200002, \"experts_per_token\": 4, \"head_dim\": 64, \"hidden_act\": \"silu\","
                    " \"hidden_size\": 2880, \"initial_context_length\": 4096, \"initializer_range\": 0.02,"
                    " \"intermediate_size\": 2880, \"layer_types\": [\"sliding_attention\", \"full_attention\","
                    " \"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 131072,"
                    " \"model_type\": \"gpt_oss\", \"num_attention_heads\": 64, \"num_experts_per_tok\": 4,"
                    " \"num_hidden_layers\": 4, \"num_key_value_heads\": 8, \"num_local_experts\": 32,"
                    " \"output_router_logits\": false, \"pad_token_id\": 199999, \"quantization_config\":"
                    " {\"modules_to_not_convert\": [\"model.layers.*.self_attn\"], \"quant_method\": \"mxfp4\"},"
                    " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0,"
                    " \"factor\": 32.0, \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\","
                    " \"truncate\": false}, \"rope_theta\": 150000, \"router_aux_loss_coef\": 0.9,"
                    " \"sliding_window\": 128, \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
                    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 201088}", &c) == TP_OK);
    CHECK(c.num_experts == 32 && c.head_dim == 64 && c.n_layer_types == 4 && tp_config_layer_window(&c, 2) == 128 &&
          tp_config_layer_window(&c, 3) == 0 && !c.rope_scaling.yarn_truncate && c.rope_scaling.yarn_factor == 32.0 &&
          c.dtype == TP_BF16 && c.eos_token_ids[0] == 200002);
    /* other model types: one window for every layer */
    CHECK(load_text("{\"model_type\": \"mistral\", \"sliding_window\": 7}", &c) == TP_OK);
    CHECK(tp_config_layer_window(&c, 0) == 7 && tp_config_layer_window(&c, 1) == 7);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tp-config-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_parse();
    test_deepseek();
    test_gpt_oss();
    test_llama4();
    test_set_and_roundtrip();
    test_fuzz_regressions();
    test_set_all();
    test_errors();
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    return check_summary();
}
