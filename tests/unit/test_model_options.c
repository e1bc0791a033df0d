/* tp_model_options: a plan object built in memory with a style registry of
 * the test's own loads the same model as the same plan from a JSON file
 * (bitwise the same logits, at 2 ranks: this test re-runs itself as the
 * ranks), and the settings reach the options through
 * tp_model_options_from_env only. */
#include "check.h"
#include "tensorpar.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NT 6

static const char *const QKV[] = {"model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.k_proj",
                                  "model.layers.*.self_attn.v_proj"};

/* The built-in plan with q/k/v under a style only `mine` knows. */
static tp_status build_plan(const tp_model_config *cfg, tp_plan *plan)
{
    tp_status s = tp_plan_builtin(cfg, plan);
    for (int i = 0; i < 3 && !s; i++) s = tp_plan_set(plan, QKV[i], "colwise_mine");
    return s;
}

static tp_status logits_with(const char *dir, const tp_model_options *mo, float *out)
{
    tp_model *m;
    tp_status s = tp_model_load(&m, dir, mo);
    if (s) return s;
    int64_t ids[NT] = {1, 5, 9, 42, 7, 3};
    tp_kv_cache kv;
    if (!(s = tp_kv_cache_init(&kv, m, NT))) {
        s = tp_model_forward(m, &kv, ids, NT, out, 1);
        tp_kv_cache_release(&kv);
    }
    tp_model_free(m);
    return s;
}

static int rank_main(const char *dir)
{
    tp_group *world;
    tp_mesh *mesh;
    if (tp_comm_init(&world, NULL) || tp_mesh_new_1d(world, "tp", &mesh)) {
        fprintf(stderr, "rank: %s\n", tp_error());
        return 1;
    }
    int me = tp_group_rank(world);
    tp_style_registry *mine = NULL;
    CHECK(tp_style_registry_new(&mine) == TP_OK);
    CHECK(tp_style_registry_set(mine, "colwise_mine", tp_style_lookup("colwise")) == TP_OK);
    tp_model_config cfg;
    tp_plan plan = {0};
    CHECK(tp_config_load(&cfg, dir) == TP_OK && build_plan(&cfg, &plan) == TP_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/plan-%d.json", dir, me);
    char *json = tp_plan_to_json(&plan);
    CHECK(json && tp_write_file_atomic(path, json, strlen(json)) == TP_OK);
    free(json);

    size_t n = (size_t)NT * (size_t)cfg.vocab_size;
    float *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .mesh = mesh, .styles = mine};
    mo.plan = &plan;                         /* the object ... */
    CHECK(logits_with(dir, &mo, a) == TP_OK);
    mo.plan = NULL;
    mo.tp_plan = path;                       /* ... and the same plan as a file */
    CHECK(logits_with(dir, &mo, b) == TP_OK);
    CHECK_MSG(a && b && memcmp(a, b, n * sizeof *a) == 0, "rank %d: plan object and plan file differ", me);
    int nonzero = 0;
    for (size_t i = 0; a && i < n; i++) nonzero |= a[i] != 0;
    CHECK(nonzero);
    /* The object alone decides: q/k/v put back to colwise gives the
     * built-in plan's logits, which equal the custom style's (it is a
     * colwise). */
    for (int i = 0; i < 3; i++) CHECK(tp_plan_set(&plan, QKV[i], "colwise") == TP_OK);
    mo.plan = &plan;
    mo.tp_plan = NULL;
    mo.styles = NULL;
    CHECK(logits_with(dir, &mo, b) == TP_OK && memcmp(a, b, n * sizeof *a) == 0);
    /* without `mine`, colwise_mine is unknown; object and name together
     * are refused before any file is read */
    for (int i = 0; i < 3; i++) CHECK(tp_plan_set(&plan, QKV[i], "colwise_mine") == TP_OK);
    CHECK(logits_with(dir, &mo, b) == TP_ERR_INVALID && strstr(tp_error(), "colwise_mine"));
    mo.tp_plan = "auto";
    CHECK(logits_with(dir, &mo, b) == TP_ERR_INVALID && strstr(tp_error(), "not both"));
    remove(path);
    free(a);
    free(b);
    tp_plan_free(&plan);
    tp_style_registry_free(mine);
    tp_mesh_free(mesh);
    tp_group_free(world);
    return check_failed ? 1 : 0;
}

/* The model's knobs through tp_model_options_from_env; the fields it does
 * not own stay as they are. */
static void test_from_env(void)
{
    const char *vars[] = {"TENSORPAR_FUSE_NORM", "TENSORPAR_BF16_DOT", "TENSORPAR_BLAS", "TENSORPAR_PIN"};
    for (int i = 0; i < 4; i++) unsetenv(vars[i]);
    tp_settings_reload();
    tp_model_options mo = {.threads = 3, .tp_plan = "auto"};
    CHECK(tp_model_options_from_env(&mo) == TP_OK);
    CHECK(mo.fuse_norm == TP_ON && mo.kernels.bf16_dot == TP_OFF && mo.kernels.blas == TP_OFF && mo.pin_threads == 1);
    CHECK(mo.threads == 3 && !strcmp(mo.tp_plan, "auto"));
    setenv("TENSORPAR_FUSE_NORM", "0", 1);
    setenv("TENSORPAR_BLAS", "1", 1);
    setenv("TENSORPAR_PIN", "0", 1);
    tp_settings_reload();
    CHECK(tp_model_options_from_env(&mo) == TP_OK);
    CHECK(mo.fuse_norm == TP_OFF && mo.kernels.blas == TP_ON && mo.kernels.bf16_dot == TP_OFF && mo.pin_threads == 0);
    tp_matmul_opts o;
    tp_matmul_opts_init(&o, &mo.kernels);
    CHECK(o.blas == 1 && o.bf16_dot == 0);
    tp_matmul_opts_default(&o);   /* the defaults: the environment is not read */
    CHECK(o.blas == 0 && o.bf16_dot == 0 && o.amx == 1);
    setenv("TENSORPAR_BF16_DOT", "yes", 1);
    tp_settings_reload();
    CHECK(tp_model_options_from_env(&mo) == TP_ERR_INVALID && strstr(tp_error(), "TENSORPAR_BF16_DOT='yes'"));
    for (int i = 0; i < 4; i++) unsetenv(vars[i]);
    tp_settings_reload();
}

int main(int argc, char **argv)
{
    if (tp_launch_in_job()) return argc == 2 ? rank_main(argv[1]) : 2;
    test_from_env();
    char dir[] = "/tmp/tp-model-options-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    tp_model_config cfg;
    tp_make_options mk = {.dtype = TP_F32, .seed = 11, .std = 0.02, .qk_std = 0.02, .shards = 1};
    CHECK(tp_preset_config(&cfg, TP_ARCH_LLAMA, "tiny") == TP_OK);
    CHECK(tp_make_model(&cfg, &mk, dir) == TP_OK);
    unsetenv("TENSORPAR_BACKEND");
    tp_settings_reload();
    char *args[] = {argv[0], dir, NULL};
    int code = -1;
    CHECK(tp_launch_self(2, TP_BACKEND_SHM, args, &code) == TP_OK);
    CHECK_MSG(code == 0, "2 ranks: exit code %d", code);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
