/* examples/custom_style.c — registering a tensor-parallel style of your own
 * and loading with a plan built in memory.
 *
 * Registers `colwise_custom` (a ColwiseParallel instance: it behaves like
 * `colwise`) in a style registry of the program's own, builds a plan object
 * in C (the built-in plan with q/k/v switched to it), loads the model with
 * that plan object and registry, runs it split over the job's ranks, and
 * checks that the logits equal those of the same plan read from a JSON file
 * and those of the built-in plan.  The style stays invisible to the default
 * registry (tp_style_register would put it there, for every model of the
 * process).
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

/* The built-in plan with q/k/v switched to the custom style. */
static tp_status build_plan(const tp_model_config *cfg, tp_plan *plan)
{
    tp_status s = tp_plan_builtin(cfg, plan);
    const char *keys[] = {"model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.k_proj",
                          "model.layers.*.self_attn.v_proj"};
    for (int i = 0; i < 3 && !s; i++) s = tp_plan_set(plan, keys[i], "colwise_custom");
    return s;
}

/* The same plan as a JSON file, the form `--tp-plan FILE` takes. */
static tp_status write_plan(const tp_plan *plan, const char *path)
{
    char *json = tp_plan_to_json(plan);
    tp_status s = json ? tp_write_file_atomic(path, json, strlen(json)) : tp_fail(TP_ERR_NOMEM, "out of memory");
    free(json);
    return s;
}

/* Loads with either a plan object or a plan name (file or "auto"), runs six
 * tokens, writes their logits. */
static tp_status logits_with(const char *dir, const tp_mesh *mesh, const tp_plan *plan, const char *plan_name,
                             const tp_style_registry *styles, float *out)
{
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .mesh = mesh, .plan = plan,
                           .tp_plan = plan_name, .styles = styles};
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

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
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
    tp_plan plan = {0};
    char plan_path[256];
    snprintf(plan_path, sizeof plan_path, "/tmp/tp-custom-plan-%d-%d.json", (int)getpid(), tp_group_rank(world));
    if (tp_config_load(&cfg, argv[1]) || build_plan(&cfg, &plan) || write_plan(&plan, plan_path)) return fail("plan");

    size_t n = (size_t)6 * (size_t)cfg.vocab_size;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) return fail("memory");
    int rc = 0;
    if (logits_with(argv[1], mesh, &plan, NULL, styles, a) || logits_with(argv[1], mesh, NULL, plan_path, styles, b) ||
        logits_with(argv[1], mesh, NULL, "auto", NULL, c))
        rc = fail("forward");
    double file_diff = rc ? 0 : max_diff(a, b, n), builtin_diff = rc ? 0 : max_diff(a, c, n);
    /* the default registry does not know the style: the same plan fails */
    if (!rc && logits_with(argv[1], mesh, &plan, NULL, NULL, b) == TP_OK) rc = fail("colwise_custom is visible to every model");
    remove(plan_path);
    tp_plan_free(&plan);
    if (!rc && tp_group_rank(world) == 0) {
        printf("plan object vs the same plan from a file over %d ranks: max |logits difference| = %g\n",
               tp_group_size(world), file_diff);
        printf("colwise_custom over %d ranks: max |logits - built-in plan| = %g\n", tp_group_size(world), builtin_diff);
    }
    if (!rc && (file_diff != 0 || builtin_diff != 0)) rc = 1;
    free(c);
    free(a);
    free(b);
    tp_style_registry_free(styles);
    tp_mesh_free(mesh);
    tp_group_free(world);
    return rc;
}
