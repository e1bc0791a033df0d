/* examples/custom_style.c — registering a tensor-parallel style of your own.
 *
 * Registers `colwise_custom` (a ColwiseParallel instance: it behaves like
 * `colwise`) in a style registry of the program's own, uses it in a plan for
 * q/k/v, loads the model with that registry, runs it split over the job's
 * ranks, and checks that the logits equal those of the built-in plan.  The
 * style stays invisible to the default registry (tp_style_register would
 * put it there, for every model of the process).
 *
 *   tensorpar make-model --arch llama --preset tiny --out /tmp/m
 *   tensorpar launch -n 2 -- build/examples/custom_style /tmp/m
 */
#include <tensorpar.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *what)
{
    fprintf(stderr, "custom_style: %s: %s\n", what, tp_error());
    return 1;
}

/* The built-in plan with q/k/v switched to the custom style, as a file. */
static tp_status write_plan(const tp_model_config *cfg, const char *path)
{
    tp_plan plan = {0};
    tp_status s = tp_plan_builtin(cfg, &plan);
    const char *keys[] = {"model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.k_proj",
                          "model.layers.*.self_attn.v_proj"};
    for (int i = 0; i < 3 && !s; i++) s = tp_plan_set(&plan, keys[i], "colwise_custom");
    char *json = s ? NULL : tp_plan_to_json(&plan);
    if (!s && !json) s = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!s) s = tp_write_file_atomic(path, json, strlen(json));
    free(json);
    tp_plan_free(&plan);
    return s;
}

static tp_status logits_with(const char *dir, const tp_mesh *mesh, const char *plan,
                             const tp_style_registry *styles, float *out)
{
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .mesh = mesh, .tp_plan = plan,
                           .styles = styles};
    tp_model *m;
    tp_status s = tp_model_load(&m, dir, &mo);
    if (s) return s;
    int64_t ids[6] = {1, 5, 9, 42, 7, 3};
    tp_kv_cache kv;
    if (!(s = tp_kv_cache_init(&kv, m, 6))) {
        s = tp_model_forward(m, &kv, ids, 6, out, 1);
        tp_kv_cache_release(&kv);
    }
    tp_model_free(m);
    return s;
}

int main(int argc, char **argv)
{
    if (argc != 2) { fprintf(stderr, "usage: tensorpar launch -n N -- custom_style MODEL_DIR\n"); return 2; }
    tp_style_registry *styles;
    if (tp_style_registry_new(&styles)) return fail("registry");
    if (tp_style_registry_set(styles, "colwise_custom", tp_style_lookup("colwise"))) return fail("register");

    tp_group *world;
    tp_mesh *mesh;
    if (tp_comm_init(&world, NULL)) return fail("joining the job");
    if (tp_mesh_new_1d(world, "tp", &mesh)) return fail("mesh");
    tp_model_config cfg;
    char plan_path[256];
    snprintf(plan_path, sizeof plan_path, "/tmp/tp-custom-plan-%d-%d.json", (int)getpid(), tp_group_rank(world));
    if (tp_config_load(&cfg, argv[1]) || write_plan(&cfg, plan_path)) return fail("plan");

    size_t n = (size_t)6 * (size_t)cfg.vocab_size;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (!a || !b) return fail("memory");
    int rc = 0;
    if (logits_with(argv[1], mesh, plan_path, styles, a) || logits_with(argv[1], mesh, "auto", NULL, b))
        rc = fail("forward");
    /* the default registry does not know the style: the same plan fails */
    if (!rc && logits_with(argv[1], mesh, plan_path, NULL, b) == TP_OK) rc = fail("colwise_custom is visible to every model");
    remove(plan_path);
    double diff = 0;
    for (size_t i = 0; !rc && i < n; i++) diff = fmax(diff, fabs((double)a[i] - b[i]));
    if (!rc && tp_group_rank(world) == 0)
        printf("colwise_custom over %d ranks: max |logits - built-in plan| = %g\n", tp_group_size(world), diff);
    if (!rc && diff != 0) rc = 1;
    free(a);
    free(b);
    tp_style_registry_free(styles);
    tp_mesh_free(mesh);
    tp_group_free(world);
    return rc;
}
