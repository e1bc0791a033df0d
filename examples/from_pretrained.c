/* examples/from_pretrained.c — load, split and generate through the C API.
 *
 * Loads a Hugging Face model directory with tp_model_from_pretrained and a
 * DistributedConfig whose tp_size is derived from the job (WORLD_SIZE, as
 * `tensorpar launch` or torchrun set it; mpirun's variables work too), then
 * greedily generates a few tokens after the given prompt ids.  Every rank
 * runs the same code; rank 0 prints the new ids as a JSON array, as
 * `tensorpar generate --tokens` does.
 *
 *   tensorpar make-model --arch llama --preset tiny --out /tmp/m
 *   tensorpar launch -n 2 -- from_pretrained /tmp/m 1,2,3 8
 *
 * Built outside the tree against an installed tensorpar:
 *   cc from_pretrained.c $(pkg-config --cflags --libs tensorpar)
 * or with CMake: find_package(tensorpar) and tensorpar::tensorpar.
 */
#include <tensorpar.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
    fprintf(stderr, "from_pretrained: %s: %s\n", what, tp_error());
    return 1;
}

/* "1,2,3" into ids (at most cap). */
static int parse_ids(const char *s, int64_t *ids, int cap)
{
    int n = 0;
    for (char *end; *s && n < cap; s = *end ? end + 1 : end) {
        ids[n++] = strtoll(s, &end, 10);
        if (end == s) return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: from_pretrained MODEL_DIR [IDS (default 1,2,3)] [NEW_TOKENS (default 8)]\n");
        return 2;
    }
    int64_t prompt[256];
    int np = parse_ids(argc > 2 ? argv[2] : "1,2,3", prompt, 256);
    int max_new = argc > 3 ? atoi(argv[3]) : 8;
    if (np < 1 || max_new < 1) { fprintf(stderr, "from_pretrained: bad ids or token count\n"); return 2; }

    /* DistributedConfig(tp_plan="auto"): tp_size = WORLD_SIZE (§5.2). */
    tp_dist_config dc = {.tp_plan = "auto"};
    tp_model *m;
    if (tp_model_from_pretrained(&m, argv[1], TP_DTYPE_COUNT, &dc)) return fail("loading");
    const tp_dist_sizes *sz = tp_model_dist_sizes(m);
    tp_group *world = tp_model_world(m);
    int rank = world ? tp_group_rank(world) : 0;
    if (rank == 0) fprintf(stderr, "from_pretrained: tp_size %d\n", sz->tp_size);

    /* Greedy decoding; the model's eos ids end it, as in `tensorpar generate`. */
    tp_generation_config gen;
    tp_generate_options go;
    memset(&go, 0, sizeof go);
    tp_sampling_defaults(&go.sampling);
    go.sampling.do_sample = 0;
    go.max_new_tokens = max_new;
    go.choose = tp_model_choose_tp_rank0;   /* every rank takes TP rank 0's token */
    go.choose_ctx = m;
    int rc = 0;
    tp_kv_cache kv;
    int64_t out[1024];
    int64_t n_out = 0;
    tp_generate_stats st;
    if (tp_generation_config_load(&gen, argv[1], &m->cfg)) {
        rc = fail("generation_config.json");
    } else {
        memcpy(go.eos_ids, gen.eos_token_ids, sizeof go.eos_ids);
        go.n_eos = gen.n_eos;
        if (max_new > 1000) go.max_new_tokens = 1000;
        if (tp_kv_cache_init(&kv, m, np + go.max_new_tokens)) {
            rc = fail("KV cache");
        } else {
            if (tp_generate(m, &kv, prompt, np, &go, out, &n_out, &st)) rc = fail("generating");
            tp_kv_cache_release(&kv);
        }
    }
    if (!rc && rank == 0) {
        printf("[");
        for (int64_t i = 0; i < n_out; i++) printf("%s%lld", i ? ", " : "", (long long)out[i]);
        printf("]\n");
    }
    tp_model_free(m);   /* the mesh and the world group go with it */
    return rc;
}
