/* The decoder forward pass, shared by the four model types: they differ only
 * in flags (q/k/v biases, q/k norms, sliding window) that the config sets.
 *
 * Every Linear and the embedding run through tp_module_* (tp_module.c), which
 * applies the module's TP style; the code here is the same on one rank and
 * on many.  Head counts come from the width of the local activations, not
 * from the config, so a rank computes exactly the heads its shards hold. */
#include "tensorpar/kernels.h"
#include "tensorpar/models.h"
#include "tp_module.h"

#include <stdlib.h>
#include <string.h>

/* A module's output joins the residual stream, which every rank holds in
 * full: the output must have come back replicated. */
static tp_status check_replicated(const tp_act *y, int64_t H, const char *what)
{
    if (y->width != H || y->pl.kind != TP_REPLICATE)
        return tp_fail(TP_ERR_INVALID, "the output of %s is not replicated (%lld of %lld features on this rank); "
                       "the plan must reduce it before the residual add", what, (long long)y->width, (long long)H);
    return TP_OK;
}

/* What one forward pass allocates once and every layer reuses, from the
 * model's activation arena (act_arena.c) before the first block's mark; the
 * rope table is computed once per pass instead of once per layer and head. */
typedef struct {
    float *h;          /* [T, H] the normed residual stream, input of the next block */
    float *attn;       /* [T, heads * head_dim] attention output (local heads) */
    float *rope;       /* [T, head_dim] cos/sin of each position */
    int fused;         /* the fused add+norm (below) runs in this pass */
} fwd_scratch;

/* ---- the residual add and norm under TP --------------------------------
 * o_proj and down_proj are rowwise: each rank holds a partial sum of the
 * block's output, which the plan all-reduces; then every rank adds it to
 * the residual stream and norms all T rows, the same work on each.  For a
 * prompt, the block output is instead moved as a DTensor Partial ->
 * Shard(rows) -> Replicate with the add and norm as the row-wise epilogue
 * between (tp_redistribute_rows): each rank reduces its own rows (its share
 * of the all-reduce anyway), adds and norms them while they are in its
 * cache, and what every rank receives is the next block's normed input.
 * Each rank then keeps only its own rows of the residual stream.  The bits
 * are the all-reduce's: every row sums the same terms in rank order, and
 * add and norm are row-wise. */

#define FUSE_MIN_ROWS 64   /* decode keeps the one small all-reduce */

/* A rule on self_attn or mlp whose post_forward changes the block's output. */
static int block_moves(const tp_model *m, int64_t layer, int mlp)
{
    const tp_module_plan *b = tp_module_block(m, layer, mlp);
    return b && b->fwd.installed && !tp_placement_equal(b->fwd.local_output, b->fwd.output, 2);
}

static int fuse_norm(const tp_model *m, int64_t T)
{
    if (!m->fuse_norm || !m->tp || m->tp->size < 2 || !m->tp->mesh || T < FUSE_MIN_ROWS) return 0;
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++)
        if (!tp_module_output_summed(m, &m->layers[l].o_proj) || !tp_module_output_summed(m, &m->layers[l].down_proj) ||
            block_moves(m, l, 0) || block_moves(m, l, 1))
            return 0;
    return 1;
}

static tp_status scratch_init(fwd_scratch *s, tp_model *m, int64_t T, int64_t pos0)
{
    const tp_model_config *c = &m->cfg;
    s->h = tp_act_alloc(m, T * c->hidden_size);
    /* Local query heads never outnumber the global ones. */
    s->attn = tp_act_alloc(m, T * c->num_attention_heads * c->head_dim);
    s->rope = tp_act_alloc(m, T * c->head_dim);
    if (!s->h || !s->attn || !s->rope)
        return tp_fail(TP_ERR_NOMEM, "out of memory for activations of %lld tokens", (long long)T);
    tp_rope_table(s->rope, T, c->head_dim, m->inv_freq, pos0);
    s->fused = fuse_norm(m, T);
    return TP_OK;
}

/* ---- the element-wise kernels over the pool ----------------------------
 * Norms, rope and the activation are row-wise (or element-wise), so each
 * thread takes a contiguous range of rows and calls the kernel on it: the
 * result is bitwise the same for any thread count.  With one thread, or a
 * single row (decode), the kernel runs directly on the caller. */

typedef enum { ROWS_RMSNORM, ROWS_ADD_RMSNORM, ROWS_ROPE, ROWS_SILU_MUL } rows_op;

typedef struct {
    rows_op op;
    float *x, *out;            /* x: rmsnorm input / residual / rope target / silu's a */
    const float *y;            /* add_rmsnorm's addend, silu_mul's b */
    const tp_tensor *w;
    const float *table;        /* rope */
    int64_t rows, n;           /* n: row length (rope: heads; silu: elements per row) */
    int64_t head_dim;
    double eps;
} rows_job;

static void rows_range(const rows_job *j, int64_t b, int64_t e)
{
    int64_t r = e - b;
    if (r <= 0) return;
    switch (j->op) {
    case ROWS_RMSNORM: tp_rmsnorm(j->out + b * j->n, j->x + b * j->n, j->w, r, j->n, j->eps); break;
    case ROWS_ADD_RMSNORM:
        tp_add_rmsnorm(j->x + b * j->n, j->y + b * j->n, j->out + b * j->n, j->w, r, j->n, j->eps);
        break;
    case ROWS_ROPE:
        tp_rope_apply_table(j->x + b * j->n * j->head_dim, r, j->n, j->head_dim, j->table + b * j->head_dim);
        break;
    case ROWS_SILU_MUL: tp_silu_mul(j->x + b * j->n, j->y + b * j->n, r * j->n); break;
    }
}

static void rows_worker(void *p, int ti, int nt)
{
    const rows_job *j = p;
    int64_t b, e;
    tp_split_range(j->rows, ti, nt, &b, &e);
    rows_range(j, b, e);
}

/* Below this many floats a parallel region costs more than it saves. */
#define MIN_PARALLEL_FLOATS 16384

static void run_rows(tp_model *m, const rows_job *j)
{
    int64_t floats = j->rows * j->n * (j->op == ROWS_ROPE ? j->head_dim : 1);
    if (j->rows < 2 || floats < MIN_PARALLEL_FLOATS || tp_threadpool_size(m->pool) == 1) rows_range(j, 0, j->rows);
    else tp_parallel_run(m->pool, rows_worker, (void *)j);
}

static void par_rmsnorm(tp_model *m, float *out, const float *x, const tp_tensor *w, int64_t rows, int64_t n)
{
    rows_job j = {.op = ROWS_RMSNORM, .x = (float *)x, .out = out, .w = w, .rows = rows, .n = n,
                  .eps = m->cfg.rms_norm_eps};
    run_rows(m, &j);
}

static void par_add_rmsnorm(tp_model *m, float *x, const float *y, float *out, const tp_tensor *w, int64_t rows,
                            int64_t n)
{
    rows_job j = {.op = ROWS_ADD_RMSNORM, .x = x, .y = y, .out = out, .w = w, .rows = rows, .n = n,
                  .eps = m->cfg.rms_norm_eps};
    run_rows(m, &j);
}

static void par_rope(tp_model *m, float *x, int64_t T, int64_t heads, int64_t D, const float *table)
{
    rows_job j = {.op = ROWS_ROPE, .x = x, .table = table, .rows = T, .n = heads, .head_dim = D};
    run_rows(m, &j);
}

static void par_silu_mul(tp_model *m, float *a, const float *b, int64_t T, int64_t width)
{
    rows_job j = {.op = ROWS_SILU_MUL, .x = a, .y = b, .rows = T, .n = width};
    run_rows(m, &j);
}

/* A module whose output joins the residual stream (o_proj, down_proj):
 * replicated, or under the fused norm the rank's partial sum. */
static tp_status stream_module(tp_model *m, const fwd_scratch *sc, const tp_linear *lin, const tp_module_plan *block,
                               const float *in, int64_t T, int64_t width, tp_act *y, const char *what)
{
    if (sc->fused) return tp_module_linear_partial(m, lin, in, T, width, y);
    tp_status st = tp_module_linear(m, lin, in, T, width, y);
    if (!st) st = tp_module_block_output(m, block, y);
    return st ? st : check_replicated(y, m->cfg.hidden_size, what);
}

typedef struct {
    float *x;
    const tp_tensor *w;
    int64_t H;
    double eps, seconds;   /* seconds: time in the add and norm */
} add_norm_rows_ctx;

static void add_norm_rows(void *p, int64_t first, int64_t nrows, float *rows)
{
    add_norm_rows_ctx *c = p;
    double t0 = tp_now();
    tp_add_rmsnorm(c->x + first * c->H, rows, rows, c->w, nrows, c->H, c->eps);
    c->seconds += tp_now() - t0;
}

/* x += y, then sc->h = norm(x): the next block's input, whole on every
 * rank.  Under the fused norm y is partial and x keeps this rank's rows;
 * the collective counts as communication, the add and norm in it do not. */
static tp_status add_norm(tp_model *m, fwd_scratch *sc, float *x, const tp_act *y, const tp_tensor *norm,
                          const tp_module_plan *sp, int64_t T)
{
    int64_t H = m->cfg.hidden_size;
    if (!sc->fused && sp) {   /* sequence_parallel norm: the add on every row, the norm on own rows */
        for (int64_t i = 0; i < T * H; i++) x[i] += y->data[i];
        return tp_module_norm_sp(m, sp, x, norm, T, H, sc->h);
    }
    if (!sc->fused) {
        par_add_rmsnorm(m, x, y->data, sc->h, norm, T, H);
        return TP_OK;
    }
    /* The fused form below already norms each rank's own rows and gathers
     * them: under a sequence_parallel norm it is that rule's effect too. */
    add_norm_rows_ctx c = {x, norm, H, m->cfg.rms_norm_eps, 0};
    double t0 = tp_now();
    tp_redist_epilogue ep = {add_norm_rows, &c};
    tp_status st = tp_redistribute_rows(m->tp->mesh, (int64_t[2]){T, H}, y->data, sc->h, &ep);
    m->comm_seconds += tp_now() - t0 - c.seconds;
    return st;
}

/* The first global head of a head-sliced activation (q, k or v). */
static int64_t first_head(const tp_model *m, const tp_linear *proj, const tp_act *a, int64_t D)
{
    if (proj->tp && proj->tp->kv_rep > 1) return m->tp->rank / proj->tp->kv_rep;
    return tp_act_offset(m, a) / D;
}

/* Local query head h must read local KV head h / (nq / nkv), which is what
 * the attention kernel does; check that the plan's layout gives exactly
 * that (it does for colwise q/k/v, gathered q/k/v, and KV replication). */
static tp_status check_head_layout(const tp_model_config *c, int64_t q0, int64_t nq, int64_t k0, int64_t nkv,
                                   const char *layer)
{
    int64_t group = c->num_attention_heads / c->num_key_value_heads;
    int ok = nq > 0 && nkv > 0 && nq % nkv == 0;
    for (int64_t h = 0; ok && h < nq; h++) ok = (q0 + h) / group - k0 == h / (nq / nkv);
    if (!ok)
        return tp_fail(TP_ERR_UNSUPPORTED, "%s: this rank's query heads [%lld, %lld) do not line up with its "
                       "KV heads [%lld, %lld); shard q_proj, k_proj and v_proj alike",
                       layer, (long long)q0, (long long)(q0 + nq), (long long)k0, (long long)(k0 + nkv));
    return TP_OK;
}

typedef struct {
    tp_act q, k, v, o;
} attn_acts;

static void attn_release(tp_model *m, attn_acts *a)
{
    tp_act_release(m, &a->q); tp_act_release(m, &a->k); tp_act_release(m, &a->v); tp_act_release(m, &a->o);
}

static tp_status project_qkv(tp_model *m, const tp_layer *L, const float *h, int64_t T, attn_acts *a)
{
    int64_t H = m->cfg.hidden_size;
    const tp_linear *lins[3] = {&L->q_proj, &L->k_proj, &L->v_proj};
    tp_act out[3];
    tp_status s = tp_module_linear_group(m, lins, 3, h, T, H, out);
    if (s) return s;
    a->q = out[0], a->k = out[1], a->v = out[2];
    if (a->k.width != a->v.width)
        return tp_fail(TP_ERR_UNSUPPORTED, "k_proj and v_proj give %lld and %lld features on this rank; "
                       "shard them alike", (long long)a->k.width, (long long)a->v.width);
    return TP_OK;
}

/* h holds input_layernorm(x); on return x has the attention output added
 * and h holds post_attention_layernorm(x), fused in one pass. */
static tp_status attention_block(tp_model *m, const tp_layer *L, tp_kv_cache *cache, int64_t layer,
                                 float *x, fwd_scratch *sc, int64_t T)
{
    const tp_model_config *c = &m->cfg;
    int64_t D = c->head_dim, pos0 = cache->length;
    attn_acts a = {0};
    tp_status st = project_qkv(m, L, sc->h, T, &a);
    int64_t nq = a.q.width / D, nkv = a.k.width / D;
    char where[48];
    snprintf(where, sizeof where, "layer %lld", (long long)layer);
    if (!st) st = check_head_layout(c, first_head(m, &L->q_proj, &a.q, D), nq, first_head(m, &L->k_proj, &a.k, D),
                                    nkv, where);
    if (!st && nkv != cache->n_kv[layer])
        st = tp_fail(TP_ERR_INVALID, "%s has %lld KV heads on this rank; the cache was made for %lld",
                     where, (long long)nkv, (long long)cache->n_kv[layer]);
    if (!st) {
        if (c->qk_norm) {   /* Qwen3 normalises each head before the rotation */
            par_rmsnorm(m, a.q.data, a.q.data, &L->q_norm, T * nq, D);
            par_rmsnorm(m, a.k.data, a.k.data, &L->k_norm, T * nkv, D);
        }
        par_rope(m, a.q.data, T, nq, D, sc->rope);
        par_rope(m, a.k.data, T, nkv, D, sc->rope);
        size_t row = (size_t)(nkv * D);
        memcpy(cache->k[layer] + (size_t)pos0 * row, a.k.data, (size_t)T * row * sizeof(float));
        memcpy(cache->v[layer] + (size_t)pos0 * row, a.v.data, (size_t)T * row * sizeof(float));
        tp_attention(sc->attn, a.q.data, cache->k[layer], cache->v[layer], T, pos0, nq, nkv, D,
                     c->sliding_window, m->pool);
        st = stream_module(m, sc, &L->o_proj, tp_module_block(m, layer, 0), sc->attn, T, nq * D, &a.o, "o_proj");
    }
    if (!st) st = add_norm(m, sc, x, &a.o, &L->post_attention_layernorm, tp_module_norm_rule(m, 2 * layer + 1), T);
    attn_release(m, &a);
    return st;
}

/* h holds post_attention_layernorm(x); on return x has the MLP output added
 * and h holds next_norm(x): the next layer's input_layernorm, or the final
 * norm after the last layer. */
static tp_status mlp_block(tp_model *m, const tp_layer *L, int64_t layer, const tp_tensor *next_norm, float *x,
                           fwd_scratch *sc, int64_t T)
{
    int64_t H = m->cfg.hidden_size;
    const float *h = sc->h;
    tp_act gate_up[2], down = {0};
    tp_act *gate = &gate_up[0], *up = &gate_up[1];
    const tp_linear *lins[2] = {&L->gate_proj, &L->up_proj};
    tp_status st = tp_module_linear_group(m, lins, 2, h, T, H, gate_up);
    if (!st) {
        if (gate->width != up->width)
            st = tp_fail(TP_ERR_UNSUPPORTED, "gate_proj and up_proj give %lld and %lld features on this rank; "
                         "shard them alike", (long long)gate->width, (long long)up->width);
        else {
            par_silu_mul(m, gate->data, up->data, T, gate->width);
            st = stream_module(m, sc, &L->down_proj, tp_module_block(m, layer, 1), gate->data, T, gate->width, &down,
                               "down_proj");
        }
    }
    int64_t next = layer + 1 < m->cfg.num_hidden_layers ? 2 * (layer + 1) : 2 * m->cfg.num_hidden_layers;
    if (!st) st = add_norm(m, sc, x, &down, next_norm, tp_module_norm_rule(m, next), T);
    tp_act_release(m, gate); tp_act_release(m, up); tp_act_release(m, &down);
    return st;
}

/* h holds norm(x) of the rows whose logits are wanted. */
static tp_status head(tp_model *m, const float *h, int64_t rows, float *logits)
{
    int64_t H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    tp_act out = {0};
    tp_status st = tp_module_linear(m, &m->lm_head, h, rows, H, &out);
    if (!st && (out.width != V || out.pl.kind != TP_REPLICATE))
        st = tp_fail(TP_ERR_INVALID, "lm_head gives %lld of %lld logits on this rank; the plan must gather them "
                     "(colwise_gather_output)", (long long)out.width, (long long)V);
    if (!st) memcpy(logits, out.data, (size_t)(rows * V) * sizeof(float));
    tp_act_release(m, &out);
    return st;
}

tp_status tp_model_forward(tp_model *m, tp_kv_cache *cache, const int64_t *tokens, int64_t T,
                           float *logits, int all_logits)
{
    if (T <= 0) return tp_fail(TP_ERR_INVALID, "forward needs at least one token");
    if (cache->length + T > cache->capacity)
        return tp_fail(TP_ERR_INVALID, "the KV cache holds %lld positions; %lld are needed",
                       (long long)cache->capacity, (long long)(cache->length + T));
    int64_t H = m->cfg.hidden_size, nl = m->cfg.num_hidden_layers;
    tp_act x = {0};
    fwd_scratch sc = {0};
    /* Every activation below comes from the arena; tp_act_end frees them. */
    tp_status st = tp_act_begin(m, T, all_logits ? T : 1);
    if (st) return st;
    st = tp_module_embedding(m, tokens, T, &x);
    if (!st && (x.width != H || x.pl.kind != TP_REPLICATE))
        st = tp_fail(TP_ERR_INVALID, "the embedding output is not replicated; the plan must gather it");
    if (!st) st = scratch_init(&sc, m, T, cache->length);
    /* Each residual add is fused with the norm that follows it, so the
     * stream x is read and written once per block.  A block's buffers go
     * at the rewind after it: the arena holds one block's working set. */
    size_t block_mark = tp_act_mark(m);
    const tp_module_plan *sp0 = tp_module_norm_rule(m, 0);   /* layer 0's input_layernorm, or the final norm */
    if (!st && sp0) st = tp_module_norm_sp(m, sp0, x.data, nl > 0 ? &m->layers[0].input_layernorm : &m->norm, T, H, sc.h);
    else if (!st) par_rmsnorm(m, sc.h, x.data, nl > 0 ? &m->layers[0].input_layernorm : &m->norm, T, H);
    tp_act_rewind(m, block_mark);
    for (int64_t l = 0; l < nl && !st; l++) {
        st = attention_block(m, &m->layers[l], cache, l, x.data, &sc, T);
        tp_act_rewind(m, block_mark);
        if (!st) st = mlp_block(m, &m->layers[l], l, l + 1 < nl ? &m->layers[l + 1].input_layernorm : &m->norm,
                                x.data, &sc, T);
        tp_act_rewind(m, block_mark);
    }
    if (!st) {
        int64_t first = all_logits ? 0 : T - 1;
        st = head(m, sc.h + first * H, T - first, logits);
    }
    if (!st) {
        memcpy(cache->tokens + cache->length, tokens, (size_t)T * sizeof *tokens);
        cache->length += T;
    }
    tp_act_release(m, &x);
    tp_act_end(m);
    return st;
}
