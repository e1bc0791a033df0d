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
 * It also trains: one forward and backward of the causal-LM loss
 * (tp_model_forward_backward) under the custom plan, every parameter's
 * whole gradient gathered (tp_model_grad_full) and compared with the
 * built-in plan's.  colwise_custom overrides one backward hook,
 * transform_grad_input_post_backward: it counts its calls and then does
 * what the default does (the conjugate of colwise's input move, an
 * all-reduce of the partial input gradient), so the count shows the hook
 * is the one training calls.
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

/* colwise_custom's post_backward: counts its calls in *st->user, then the
 * default (the same style without the override). */
static tp_status counted_post_backward(const tp_style *st, const tp_module_ctx *mod, const tp_forward_desc *d,
                                       tp_dtensor *gx)
{
    ++*(long *)st->user;
    tp_style plain = *st;
    plain.transform_grad_input_post_backward = NULL;
    return tp_style_post_backward(&plain, mod, d, gx);
}

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

/* Every parameter's whole gradient (tied ones once) after one forward and
 * backward, one after another in module order, into *out (malloc'd, *n
 * floats); *loss the mean loss.  Every rank takes part. */
static tp_status grads_with(const char *dir, const tp_mesh *mesh, const tp_plan *plan, const char *plan_name,
                            const tp_style_registry *styles, float **out, size_t *n, double *loss)
{
    tp_model_options mo = {.weight_dtype = TP_DTYPE_COUNT, .threads = 1, .mesh = mesh, .plan = plan,
                           .tp_plan = plan_name, .styles = styles};
    tp_model *m;
    tp_status s = tp_model_load(&m, dir, &mo);
    if (s) return s;
    int64_t ids[6] = {1, 5, 9, 42, 7, 3}, counted = 0;
    double sum = 0;
    *out = NULL;
    *n = 0;
    if (!(s = tp_model_zero_grad(m))) s = tp_model_forward_backward(m, ids, NULL, 6, 0, &sum, &counted);
    for (size_t i = 0; !s && i < tp_model_module_count(m); i++) {
        const tp_module *mod = tp_model_module_at(m, i);
        for (int j = 0; !s && j < mod->n_params; j++) {
            const tp_module_param *p = &mod->params[j];
            if (p->tied_to >= 0 || !p->grad.data) continue;
            size_t numel = 1;
            for (int k = 0; k < p->ndim; k++) numel *= (size_t)p->shape[k];
            float *grown = realloc(*out, (*n + numel) * sizeof(float));
            if (!grown) { s = tp_fail(TP_ERR_NOMEM, "out of memory"); break; }
            *out = grown;
            s = tp_model_grad_full(m, mod, j, *out + *n);
            *n += numel;
        }
    }
    *loss = counted ? sum / (double)counted : 0;
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
    long post_backward_calls = 0;
    tp_style custom = *tp_style_lookup("colwise");
    custom.transform_grad_input_post_backward = counted_post_backward;
    custom.user = &post_backward_calls;
    if (tp_style_registry_set(styles, "colwise_custom", &custom)) return fail("register");

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
    /* training: the custom plan's gradients against the built-in plan's */
    float *ga = NULL, *gc = NULL;
    size_t na = 0, nc = 0;
    double loss_a = 0, loss_c = 0, grad_diff = 0;
    post_backward_calls = 0;
    if (!rc && grads_with(argv[1], mesh, &plan, NULL, styles, &ga, &na, &loss_a)) rc = fail("backward");
    long calls = post_backward_calls;
    if (!rc && grads_with(argv[1], mesh, NULL, "auto", NULL, &gc, &nc, &loss_c)) rc = fail("backward (built-in plan)");
    if (!rc && na != nc) rc = fail("the two plans give different parameter counts");
    if (!rc) grad_diff = max_diff(ga, gc, na);
    tp_plan_free(&plan);
    if (!rc && tp_group_rank(world) == 0) {
        printf("plan object vs the same plan from a file over %d ranks: max |logits difference| = %g\n",
               tp_group_size(world), file_diff);
        printf("colwise_custom over %d ranks: max |logits - built-in plan| = %g\n", tp_group_size(world), builtin_diff);
        printf("colwise_custom over %d ranks: loss %.9g (built-in plan %.9g), %zu gradient values, "
               "max |gradient - built-in plan| = %g\n", tp_group_size(world), loss_a, loss_c, na, grad_diff);
        /* q, k and v of every layer pass their input gradient back once */
        printf("colwise_custom's transform_grad_input_post_backward: %ld calls for %lld layers\n", calls,
               (long long)cfg.num_hidden_layers);
    }
    if (!rc && (file_diff != 0 || builtin_diff != 0 || grad_diff != 0 || loss_a != loss_c)) rc = 1;
    if (!rc && calls != 3 * (long)cfg.num_hidden_layers) {
        fprintf(stderr, "custom_style: the custom backward hook ran %ld times, not once per q/k/v\n", calls);
        rc = 1;
    }
    free(ga);
    free(gc);
    free(c);
    free(a);
    free(b);
    tp_style_registry_free(styles);
    tp_mesh_free(mesh);
    tp_group_free(world);
    return rc;
}
