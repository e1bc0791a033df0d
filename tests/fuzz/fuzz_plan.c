/* libFuzzer harness: TP plan JSON (tensorpar --tp-plan FILE).  The first
 * byte picks one of the built-in tiny models and a TP size of 1 to 4; the
 * rest is the plan, parsed and resolved against that model's parameter
 * table.  A plan that resolves must give every rank a slice of every
 * parameter, and its reports must print. */
#include "fuzz_util.h"
#include "tensorpar/parallel.h"

#include <stdlib.h>
#include <string.h>

/* The ranges of a slice lie inside the parameter's dimension and add up to
 * the local shape. */
static void check_slice(const tp_plan_resolution *r, size_t i, const tp_param_slice *sl)
{
    const tp_param_plan *p = i < r->n_params ? &r->params[i] : &r->tied_head;
    if (sl->dim < 0) return;
    if (sl->dim >= p->ndim || sl->n < 0 || sl->n > TP_PLAN_MAX_RANGES) abort();
    int64_t total = 0;
    for (int k = 0; k < sl->n; k++) {
        if (sl->start[k] < 0 || sl->len[k] < 0 || sl->start[k] + sl->len[k] > p->shape[sl->dim]) abort();
        total += sl->len[k];
    }
    if (total != sl->local_shape[sl->dim]) abort();
}

static void use_resolution(const tp_plan_resolution *r, int P)
{
    for (size_t i = 0; i <= r->n_params; i++) {
        if (i == r->n_params && !r->has_tied_head) break;
        for (int rank = 0; rank < P; rank++) {
            tp_param_slice sl;
            if (tp_plan_param_slice(r, i, rank, &sl) == TP_OK) check_slice(r, i, &sl);
        }
    }
    for (int rank = 0; rank < P; rank++) {
        int64_t a, b;
        tp_plan_kv_heads(r, rank, &a, &b);
        tp_plan_q_heads(r, rank, &a, &b);
        tp_plan_vocab_range(r, rank, &a, &b);
        tp_plan_rank_bytes(r, rank, 2);
    }
    tp_plan_digest(r);
    tp_plan_check_training(r);
    char *repr = tp_plan_repr(&r->plan, r->entry_used);
    char *json = tp_plan_to_json(&r->plan);
    free(repr);
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    static const tp_arch arches[4] = {TP_ARCH_LLAMA, TP_ARCH_MISTRAL, TP_ARCH_QWEN2, TP_ARCH_QWEN3};
    tp_model_config cfg;
    tp_preset_config(&cfg, arches[data[0] & 3], "tiny");
    cfg.tie_word_embeddings = data[0] >> 4 & 1;
    int P = 1 + (data[0] >> 2 & 3);
    char *text = fuzz_strndup(data + 1, size - 1);
    tp_plan plan;
    if (tp_plan_parse(text, "fuzz.json", &plan) == TP_OK) {
        tp_plan_resolution *r = NULL;
        if (tp_plan_resolve(&cfg, &plan, P, NULL, &r) == TP_OK) {
            use_resolution(r, P);
            tp_plan_resolution_free(r);
        }
        tp_plan_free(&plan);
    }
    free(text);
    return 0;
}
