/* The activations of a forward pass: one arena per model.
 *
 * Ownership of every activation buffer, in one place:
 *  - The model owns the arena (m->acts).  tp_model_load makes it and
 *    reserves it for DEFAULT_TOKENS tokens (address space only: a page is
 *    faulted in when a forward first writes it); tp_model_free frees it.
 *  - tp_model_forward brackets its work with tp_act_begin and tp_act_end.
 *    tp_act_begin reserves enough for that forward, from the bound below:
 *    the block grows there, while nothing in it is alive, never during a
 *    forward.  tp_act_end rewinds it to empty: no activation outlives the
 *    forward that allocated it.
 *  - Inside a forward, the buffers that live through it (the embedding's
 *    output x, the normed stream h, the attention output, the rope table)
 *    are allocated first.  Each block (attention, MLP) runs between a mark
 *    and a rewind, so its q/k/v/o, gate/up/down, the copies take_local
 *    makes of collective outputs and the sequence-parallel norm's temporary
 *    die with the block, and the arena settles at one block's working set.
 *  - Only the forward code holds these pointers, and only until the rewind
 *    that covers them: a DTensor may wrap one (owns_data = 0) for the span of
 *    a hook; the KV cache and the logits get copies.
 *  - Buffers a collective returns inside a DTensor stay the DTensor's
 *    (tp_alloc'd, released with it); take_local copies them in here.
 *  - tp_act_free gives a buffer back only when it is the latest one;
 *    otherwise it goes at the block's rewind.
 *
 * Why one arena: prefill allocates a handful of [T, width] buffers per layer
 * (1-6 MiB each at T = 512).  Fresh from malloc, every 4 KiB page of them
 * faulted and was zeroed on its first write, about a tenth of a prefill;
 * the arena's pages are written once and then reused by every forward.
 * Decode's single rows cost a pointer bump instead of a malloc.
 *
 * If the bound is ever short (a style whose output is wider than its
 * module's global output), the allocation that does not fit comes from
 * tp_alloc instead ("spilled", freed by tp_act_free or at tp_act_end), and
 * the next forward reserves what this one needed. */
#include "tp_module.h"

#include <stdlib.h>

#define DEFAULT_TOKENS 512
/* Per allocation, rounding to the arena's 64 bytes adds at most 63 bytes;
 * a forward makes fewer than this many allocations between rewinds. */
#define MAX_LIVE_ALLOCS 64
#define SPILL_MAX 32

struct tp_act_arena {
    tp_arena arena;
    /* The bound of a forward of T tokens whose head computes R rows, in
     * floats: T * per_token + max(T * per_block, R * per_head_row). */
    int64_t per_token, per_block, per_head_row;
    size_t base_mark;          /* where the forward in progress began */
    size_t spilled_bytes;      /* this forward's allocations outside the arena */
    size_t spilled_total;      /* and every forward's since load */
    size_t need_next;          /* at least this much for the next forward */
    float *spill[SPILL_MAX];
};

/* ---- the bound ----------------------------------------------------------
 * Per token, in floats.  A Linear module allocates its local output (out
 * features of its weight shard) and at most one copy of what its
 * post_forward returns, which is no wider than the module's global output;
 * o_proj and down_proj may be copied once more by the block's own
 * post_forward. */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t global_out(const tp_model *m, const tp_module *lin)
{
    const struct tp_module_tp *mt = lin->tp;
    int64_t local = tp_module_weight(lin)->shape[0];
    if (!mt) return local;
    return max64(local, mt->kv_rep > 1 ? local * m->tp->size : mt->out_features);
}

static int64_t linear_bound(const tp_model *m, const tp_module *lin)
{
    return tp_module_weight(lin)->shape[0] + global_out(m, lin);
}

/* An attention or MLP block: each Linear child's bound, one more copy of
 * the widest output (the block's own post_forward on o_proj/down_proj),
 * and a row of the stream for the norm that consumes it. */
static int64_t block_bound(const tp_model *m, const tp_module *block)
{
    int64_t sum = m->cfg.hidden_size, widest = 0;
    for (int c = block->first_child; c >= 0; c = m->modules[c].next_sibling) {
        const tp_module *child = &m->modules[c];
        if (child->type != TP_MT_LINEAR) continue;
        sum += linear_bound(m, child);
        widest = max64(widest, global_out(m, child));
    }
    return sum + widest;
}

static void set_bound(struct tp_act_arena *a, const tp_model *m)
{
    const tp_model_config *c = &m->cfg;
    int64_t H = c->hidden_size;
    /* the embedding's lookup and x; h; the attention output (local query
     * heads never outnumber the global ones); the rope table */
    const tp_module *emb = &m->modules[m->embed_tokens];
    int64_t emb_out = emb->tp ? max64(emb->tp->in_features, H) : H;
    a->per_token = tp_module_weight(emb)->shape[1] + emb_out + H + c->num_attention_heads * c->head_dim + c->head_dim;
    a->per_block = H;   /* the sequence-parallel norm before the first block */
    for (size_t i = 0; i < m->n_modules; i++)
        if (m->modules[i].type == TP_MT_ATTENTION || m->modules[i].type == TP_MT_MLP)
            a->per_block = max64(a->per_block, block_bound(m, &m->modules[i]) +
                                                   (m->modules[i].ops == &tp_mla_ops ? tp_mla_block_bound(c) : 0));
        else if (m->modules[i].type == TP_MT_MOE)
            a->per_block = max64(a->per_block, tp_moe_block_bound(m, &m->modules[i]));
    a->per_head_row = linear_bound(m, &m->modules[m->lm_head]);
}

static size_t bound_bytes(const struct tp_act_arena *a, int64_t T, int64_t head_rows)
{
    int64_t floats = T * a->per_token + max64(T * a->per_block, head_rows * a->per_head_row);
    return (size_t)floats * sizeof(float) + (size_t)MAX_LIVE_ALLOCS * TP_ARENA_ALIGN;
}

/* ---- the model's side ---------------------------------------------------- */

tp_status tp_act_arena_init(tp_model *m)
{
    struct tp_act_arena *a = calloc(1, sizeof *a);
    if (!a) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_arena_init(&a->arena);
    set_bound(a, m);
    m->acts = a;
    tp_status s = tp_arena_reserve(&a->arena, bound_bytes(a, DEFAULT_TOKENS, 1));
    return s ? tp_fail_context(s, "the activations of %d tokens", DEFAULT_TOKENS) : TP_OK;
}

void tp_act_arena_free(tp_model *m)
{
    if (!m->acts) return;
    for (int i = 0; i < SPILL_MAX; i++) tp_free(m->acts->spill[i]);
    tp_arena_release(&m->acts->arena);
    free(m->acts);
    m->acts = NULL;
}

tp_status tp_act_begin(tp_model *m, int64_t T, int64_t head_rows)
{
    struct tp_act_arena *a = m->acts;
    if (!a) return tp_fail(TP_ERR_INTERNAL, "the model has no activation arena");
    size_t need = bound_bytes(a, T, head_rows);
    if (need < a->need_next) need = a->need_next;
    /* Growing by half at least: a chat whose prompts grow a little each
     * turn does not re-fault a fresh block every turn. */
    if (need > a->arena.capacity && need < a->arena.capacity + a->arena.capacity / 2)
        need = a->arena.capacity + a->arena.capacity / 2;
    tp_status s = tp_arena_reserve(&a->arena, need);
    if (s) return tp_fail_context(s, "the activations of %lld tokens", (long long)T);
    a->base_mark = tp_arena_mark(&a->arena);
    a->spilled_bytes = 0;
    return TP_OK;
}

void tp_act_end(tp_model *m)
{
    struct tp_act_arena *a = m->acts;
    if (!a) return;
    if (a->spilled_bytes) {
        tp_log(TP_LOG_DEBUG, "activation arena: %zu bytes spilled; the next forward reserves them",
               a->spilled_bytes);
        a->need_next = tp_arena_peak(&a->arena) + a->spilled_bytes;
    }
    for (int i = 0; i < SPILL_MAX; i++) { tp_free(a->spill[i]); a->spill[i] = NULL; }
    tp_arena_rewind(&a->arena, a->base_mark);
}

size_t tp_act_mark(const tp_model *m)
{
    return m->acts ? tp_arena_mark(&m->acts->arena) : 0;
}

void tp_act_rewind(tp_model *m, size_t mark)
{
    if (m->acts) tp_arena_rewind(&m->acts->arena, mark);
}

tp_act_stats tp_act_arena_stats(const tp_model *m)
{
    const struct tp_act_arena *a = m->acts;
    if (!a) return (tp_act_stats){0};
    return (tp_act_stats){a->arena.capacity, a->arena.used, tp_arena_peak(&a->arena), a->spilled_total};
}

static float *spill(struct tp_act_arena *a, size_t bytes)
{
    for (int i = 0; i < SPILL_MAX; i++) {
        if (a->spill[i]) continue;
        if (!(a->spill[i] = tp_alloc(bytes))) return NULL;
        a->spilled_bytes += bytes;
        a->spilled_total += bytes;
        return a->spill[i];
    }
    tp_fail(TP_ERR_NOMEM, "activation arena: more than %d buffers spilled", SPILL_MAX);
    return NULL;
}

float *tp_act_alloc(tp_model *m, int64_t floats)
{
    struct tp_act_arena *a = m->acts;
    size_t bytes = (size_t)(floats > 0 ? floats : 1) * sizeof(float);
    float *p = tp_arena_alloc(&a->arena, bytes);
    return p ? p : spill(a, bytes);
}

void tp_act_free(tp_model *m, float *data)
{
    struct tp_act_arena *a = m->acts;
    if (!data) return;
    if (tp_arena_owns(&a->arena, data)) { tp_arena_free(&a->arena, data); return; }
    for (int i = 0; i < SPILL_MAX; i++)
        if (a->spill[i] == data) { tp_free(data); a->spill[i] = NULL; return; }
}

void tp_act_release(tp_model *m, tp_act *a)
{
    tp_act_free(m, a->data);
    a->data = NULL;
}
