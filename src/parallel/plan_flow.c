/* The layouts a resolved plan gives tensorpar's dense decoder, followed
 * module by module before any weight is read (§1.3, §4.4).  Styles declare
 * their input layout instead of checking it, so a plan whose layouts do not
 * fit would run and give wrong numbers, or read past a buffer.  Here every
 * plan either fits or is refused with a message naming the module, its
 * style and why.  The styles that leave a layout to the module (the legacy
 * local styles, local_params, gather's input) get the real layouts written
 * into their forward description, so the executor labels nothing wrongly.
 *
 * Activations are [T, width]; the layouts a feature dimension can have: */
#include "parallel_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    L_REP,       /* whole on every rank                                  */
    L_SHARD,     /* Shard(-1): the rank's chunk of the features          */
    L_STRIDED,   /* StridedShard(-1, s): its chunk of each of s blocks   */
    L_PARTIAL,   /* every rank a summand of the whole                    */
    L_KVREP,     /* one whole KV head per rank (KV replication, §8.3)   */
    L_SEQ        /* Shard(0): the rank's tokens (sequence-sharded)       */
} lay_kind;

typedef struct {
    lay_kind k;
    int split;
    const char *mod, *sty;   /* the module (and style) that made it, for messages */
} lay;

typedef struct {
    tp_plan_resolution *r;
    unsigned char *seen;   /* per module plan: visited by the flow */
} flow;

static const lay REP = {L_REP, 0, NULL, NULL};

static lay mk(lay_kind k, int split)
{
    lay l = {k, split, NULL, NULL};
    return l;
}

static int lay_eq(lay a, lay b) { return a.k == b.k && (a.k != L_STRIDED || a.split == b.split); }

static lay lay_of(tp_placement p)
{
    switch (p.kind) {
    case TP_REPLICATE: return REP;
    case TP_PARTIAL: return mk(L_PARTIAL, 0);
    case TP_SHARD: return mk(p.dim == 0 ? L_SEQ : L_SHARD, 0);
    default: return mk(p.dim == 0 ? L_SEQ : L_STRIDED, p.split);
    }
}

static tp_placement place_of(lay l)
{
    switch (l.k) {
    case L_REP: return tp_replicate();
    case L_PARTIAL: return tp_partial();
    case L_STRIDED: return tp_strided_shard(-1, l.split);
    case L_SEQ: return tp_shard(0);
    default: return tp_shard(-1);   /* KV replication: the executor widens it */
    }
}

/* Where a layout came from: " (the output of `m`, style 's')". */
static const char *origin(lay l, char *buf, size_t cap)
{
    if (!l.mod) return "";
    if (l.sty) snprintf(buf, cap, " (the output of `%s`, style '%s')", l.mod, l.sty);
    else snprintf(buf, cap, " (the output of `%s`, no rule)", l.mod);
    return buf;
}

static lay made_by(lay l, const char *mod, const char *sty)
{
    l.mod = mod;
    l.sty = sty;
    return l;
}

static const char *lay_str(lay l, char *buf, size_t cap)
{
    switch (l.k) {
    case L_REP: return "Replicate";
    case L_PARTIAL: return "Partial (a summand on each rank)";
    case L_SHARD: return "Shard(-1)";
    case L_KVREP: return "one replicated KV head per rank";
    case L_SEQ: return "Shard(1) (sequence-sharded)";
    default: snprintf(buf, cap, "StridedShard(-1, %d)", l.split); return buf;
    }
}

/* The transitions the executor performs between layouts (§1.5). */
static int move_ok(lay from, lay to)
{
    return lay_eq(from, to) || (from.k == L_REP && to.k == L_SHARD) || (from.k == L_SHARD && to.k == L_REP) ||
           (from.k == L_PARTIAL && to.k == L_REP);
}

static tp_module_plan *module_at(flow *f, const char *name)
{
    for (size_t i = 0; i < f->r->n_modules; i++)
        if (!strcmp(f->r->modules[i].name, name)) { f->seen[i] = 1; return &f->r->modules[i]; }
    return NULL;
}

static const tp_param_plan *param_of(const flow *f, const char *module, const char *short_name)
{
    char name[272];   /* module names come from 96-byte records */
    snprintf(name, sizeof name, "%s.%s", module, short_name);
    return tp_plan_find_param(f->r, name);
}

/* The style to name: the module's own rule, else its weight's. */
static const char *style_of(const tp_module_plan *mp, const tp_param_plan *w)
{
    if (mp) return mp->style->name;
    return w && w->style ? w->style->name : NULL;
}

static tp_status refuse(const char *module, const char *style, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tp_status refuse(const char *module, const char *style, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (!style)
        return tp_fail(TP_ERR_UNSUPPORTED, "The tensor parallel plan does not fit `%s` (no rule, so it runs whole on "
                       "every rank): %s", module, why);
    return tp_fail(TP_ERR_UNSUPPORTED, "Tensor parallel style '%s' cannot be used on `%s`: %s", style, module, why);
}

/* ---- input and output sides of a module's forward ---------------------- */

/* The layout the module's own computation sees, given what it receives. */
static tp_status input_side(tp_module_plan *mp, const char *name, lay in, lay *x)
{
    tp_forward_desc *d = &mp->fwd;
    char a[40], b[40], o[300];
    if (d->input_from_model) {
        d->input = d->compute_input = place_of(in);
        *x = in;
        return TP_OK;
    }
    lay decl = lay_of(d->input), c = lay_of(d->compute_input);
    if (!lay_eq(decl, in))
        return refuse(name, mp->style->name, "it declares its input %s, but the input it receives here is %s%s%s",
                      lay_str(decl, a, sizeof a), lay_str(in, b, sizeof b), origin(in, o, sizeof o),
                      decl.k == L_SEQ ? " (tensorpar's decoder keeps activations whole along the sequence, "
                                        "and no style here hands this module a sequence-sharded one)" : "");
    if (!move_ok(decl, c))
        return refuse(name, mp->style->name, "it would move its input from %s to %s, which tensorpar does not do",
                      lay_str(decl, a, sizeof a), lay_str(c, b, sizeof b));
    *x = c;
    return TP_OK;
}

/* The layout handed on, given what the module's computation gave (raw). */
static tp_status output_side(tp_module_plan *mp, const char *name, lay raw, lay *out)
{
    tp_forward_desc *d = &mp->fwd;
    char a[40], b[40];
    if (d->output_from_model) {
        d->local_output = d->output = place_of(raw);
        *out = raw;
        return TP_OK;
    }
    lay label = lay_of(d->local_output), o = lay_of(d->output);
    if (raw.k == L_KVREP && label.k == L_SHARD && o.k == L_SHARD) { *out = raw; return TP_OK; }
    if (raw.k == L_KVREP)
        return refuse(name, mp->style->name, "k_proj and v_proj hold one replicated KV head per rank here "
                      "(fewer KV heads than ranks, §8.3), which cannot be gathered or reduced; use colwise");
    if (!lay_eq(label, raw))
        return refuse(name, mp->style->name, "its local computation gives %s here, but the style treats the "
                      "result as %s%s", lay_str(raw, a, sizeof a), lay_str(label, b, sizeof b),
                      raw.k == L_REP && label.k == L_PARTIAL
                          ? ": all-reducing it would add up P copies of the same value" : "");
    if (!move_ok(label, o))
        return refuse(name, mp->style->name, "it would move its output from %s to %s, which tensorpar does not do",
                      lay_str(label, a, sizeof a), lay_str(o, b, sizeof b));
    *out = o;
    return TP_OK;
}

/* ---- Linear modules ----------------------------------------------------- */

/* What x · W_rᵀ (+ b_r) is, given the weight's and bias's placements. */
static tp_status local_linear(const char *name, const char *sty, const tp_param_plan *w, const tp_param_plan *b,
                              const tp_forward_desc *d, lay x, lay *raw)
{
    char a[40], c[40], o[300];
    tp_placement pw = w->placement;
    int rows = (pw.kind == TP_SHARD || pw.kind == TP_STRIDED_SHARD) && pw.dim == 0;
    int cols = (pw.kind == TP_SHARD || pw.kind == TP_STRIDED_SHARD) && pw.dim == 1;
    if (pw.kind == TP_REPLICATE && (x.k == L_REP || x.k == L_PARTIAL)) *raw = x;
    else if (rows && x.k == L_REP)
        *raw = w->kv_rep > 1 ? mk(L_KVREP, 0) : pw.kind == TP_SHARD ? mk(L_SHARD, 0) : mk(L_STRIDED, pw.split);
    else if (cols && pw.kind == TP_SHARD && x.k == L_SHARD) *raw = mk(L_PARTIAL, 0);
    else if (cols && pw.kind == TP_STRIDED_SHARD && x.k == L_STRIDED && x.split == pw.split) *raw = mk(L_PARTIAL, 0);
    else
        return refuse(name, sty, "its weight is %s on each rank, which needs %s input features, but its input "
                      "here is %s%s", tp_placement_str(pw, a, sizeof a),
                      cols ? "a slice of the" : "all the", lay_str(x, c, sizeof c), origin(x, o, sizeof o));
    if (d && d->divide_params_by_p) {
        if (raw->k != L_REP)
            return refuse(name, sty, "`local` divides the parameters by P so that a parent summing P copies "
                          "restores them; that needs the whole computation on every rank, but it is %s here",
                          lay_str(*raw, a, sizeof a));
        *raw = mk(L_PARTIAL, 0);
        return TP_OK;   /* the bias is divided too */
    }
    if (!b) return TP_OK;
    tp_placement pb = b->placement;
    int ok;
    switch (raw->k) {
    case L_REP: ok = pb.kind == TP_REPLICATE; break;
    case L_SHARD: ok = pb.kind == TP_SHARD && b->kv_rep == 1; break;
    case L_KVREP: ok = pb.kind == TP_SHARD && b->kv_rep > 1; break;
    case L_STRIDED: ok = pb.kind == TP_STRIDED_SHARD && pb.split == raw->split; break;
    default: ok = pb.kind == TP_REPLICATE && d && d->bias_after_reduce; break;
    }
    if (!ok)
        return refuse(name, sty, "its bias is %s while its output is %s on this rank%s", tp_placement_str(pb, a, sizeof a),
                      lay_str(*raw, c, sizeof c),
                      raw->k == L_PARTIAL ? ": the bias would be added on every rank before the sum" : "");
    return TP_OK;
}

static tp_status linear(flow *f, const char *name, lay in, lay *out)
{
    const tp_param_plan *w = param_of(f, name, "weight"), *b = param_of(f, name, "bias");
    tp_module_plan *mp = module_at(f, name);
    const char *sty = style_of(mp, w);
    if (!w) return tp_fail(TP_ERR_INTERNAL, "`%s` has no weight in the parameter table", name);
    lay x = in, raw;
    tp_status s;
    if (mp && mp->fwd.ids_input)
        return refuse(name, sty, "it is a style for Embedding modules (its input is token ids), and `%s` is a Linear",
                      name);
    if (mp && (s = input_side(mp, name, in, &x))) return s;
    if ((s = local_linear(name, sty, w, b, mp ? &mp->fwd : NULL, x, &raw))) return s;
    raw = made_by(raw, name, sty);
    if (!mp) { *out = raw; return TP_OK; }
    if ((s = output_side(mp, name, raw, out))) return s;
    *out = made_by(*out, name, sty);
    return TP_OK;
}

/* ---- modules tensorpar runs without hooks ------------------------------
 * Norms, the decoder layer, the model and the layer list: their forward is
 * the model's own code, so a rule on them may only leave layouts as they
 * are (replicate, local_params, replicated_with_grad_allreduce, ...). */
static tp_status passive(flow *f, const char *name, const char *what, lay in, lay out, int has_params)
{
    tp_module_plan *mp = module_at(f, name);
    if (!mp) return TP_OK;
    tp_forward_desc *d = &mp->fwd;
    const char *sty = mp->style->name;
    lay x, o;
    if (d->ids_input) return refuse(name, sty, "it is a style for Embedding modules, and `%s` is %s", name, what);
    if (d->divide_params_by_p && has_params)
        return refuse(name, sty, "`local` divides the parameters by P, but the output of %s is not summed over "
                      "the ranks afterwards", what);
    tp_status s = input_side(mp, name, in, &x);
    if (!s && !lay_eq(x, in)) s = refuse(name, sty, "it would split the input of %s, which tensorpar does not do", what);
    if (!s) s = output_side(mp, name, out, &o);
    if (!s && !lay_eq(o, out)) {
        char a[40], b[40];
        s = refuse(name, sty, "it would move the output of %s from %s to %s, which would be wrong here", what,
                   lay_str(out, a, sizeof a), lay_str(o, b, sizeof b));
    }
    return s;
}

/* sequence_parallel on a norm of the residual stream (§2.10): the stream,
 * a Replicate handle, is redistributed to the rank's tokens, the norm runs
 * on them, and its consumers (which declare Replicate) gather the rows. */
static int sequence_parallel_norm(const tp_module_plan *mp, lay in)
{
    const tp_forward_desc *d = &mp->fwd;
    return in.k == L_REP && !d->input_from_model && !d->output_from_model && !d->divide_params_by_p &&
           !d->ids_input && lay_of(d->input).k == L_SEQ && lay_of(d->compute_input).k == L_SEQ &&
           lay_of(d->local_output).k == L_SEQ && lay_of(d->output).k == L_SEQ;
}

/* A norm: per token (or per head), on whatever layout its input has; its
 * weight must be whole on every rank.  stream: a norm of the residual
 * stream, which may be sequence-parallel. */
static tp_status norm(flow *f, const char *name, lay in, int stream)
{
    const tp_param_plan *w = param_of(f, name, "weight");
    char a[40];
    if (w && w->placement.kind != TP_REPLICATE)
        return refuse(name, w->style ? w->style->name : "?", "an RMSNorm needs its whole weight on every rank, "
                      "and this style gives it %s", tp_placement_str(w->placement, a, sizeof a));
    const tp_module_plan *mp = module_at(f, name);
    if (stream && mp && sequence_parallel_norm(mp, in)) return TP_OK;
    return passive(f, name, "an RMSNorm", in, in, 1);
}

/* self_attn and mlp: the input is the normed stream; a rule may reduce the
 * block's output (gather, all_reduce). */
static tp_status container(flow *f, const char *name, lay raw, lay *out)
{
    tp_module_plan *mp = module_at(f, name);
    *out = raw;
    if (!mp) return TP_OK;
    const char *sty = mp->style->name;
    lay x;
    if (mp->fwd.ids_input) return refuse(name, sty, "it is a style for Embedding modules, and `%s` is a container", name);
    tp_status s = input_side(mp, name, REP, &x);
    if (!s && !lay_eq(x, REP)) s = refuse(name, sty, "it would split the block's input, which tensorpar does not do");
    return s ? s : output_side(mp, name, raw, out);
}

/* The output of a block joins the residual stream, which every rank holds
 * whole (§1.3's invariant). */
static tp_status stream(const char *module, const char *sty, const char *block, lay l)
{
    char a[40];
    if (l.k == L_REP) return TP_OK;
    return refuse(module, sty, "the output of `%s` is %s here, but it joins the residual stream, which must be "
                  "Replicate%s", block, lay_str(l, a, sizeof a),
                  l.k == L_PARTIAL ? "; nothing sums it (a rowwise style, or `gather` / `all_reduce` on the block, "
                                     "would)" : "");
}

/* ---- the blocks ---------------------------------------------------------- */

/* Heads of n that rank holds under l; check_heads made a Shard(-1) split
 * whole heads (n % P == 0) and KV replication P % K == 0. */
static void head_range(const tp_plan_resolution *r, lay l, int64_t n, int rank, int64_t *first, int64_t *count)
{
    int64_t P = r->tp_size;
    if (l.k == L_REP) { *first = 0; *count = n; }
    else if (l.k == L_KVREP) { *first = rank / (P / n); *count = 1; }
    else { *first = rank * (n / P); *count = n / P; }
}

/* Local query head h reads local KV head h / (nq / nkv) (the attention
 * kernel's grouping): every rank's heads must line up that way. */
static tp_status heads_line_up(flow *f, const char *qname, const char *sty, lay q, lay k)
{
    const tp_plan_resolution *r = f->r;
    int64_t H = r->cfg.num_attention_heads, K = r->cfg.num_key_value_heads, group = H / K;
    for (int rank = 0; rank < r->tp_size; rank++) {
        int64_t q0, nq, k0, nkv;
        head_range(r, q, H, rank, &q0, &nq);
        head_range(r, k, K, rank, &k0, &nkv);
        int ok = nq > 0 && nkv > 0 && nq % nkv == 0;
        for (int64_t h = 0; ok && h < nq; h++) ok = (q0 + h) / group - k0 == h / (nq / nkv);
        char o[300];
        if (!ok)
            return refuse(qname, sty, "on rank %d its query heads [%lld, %lld) do not line up with the KV heads "
                          "[%lld, %lld) that k_proj%s and v_proj give that rank; shard q_proj, k_proj and v_proj "
                          "alike", rank, (long long)q0, (long long)(q0 + nq), (long long)k0, (long long)(k0 + nkv),
                          origin(k, o, sizeof o));
    }
    return TP_OK;
}

static tp_status not_linear(flow *f, const char *name, lay l, const char *what)
{
    if (l.k != L_PARTIAL) return TP_OK;
    const tp_module_plan *mp = module_at(f, name);
    return refuse(name, style_of(mp, param_of(f, name, "weight")), "its output is a Partial sum here, and %s is "
                  "not linear in it; reduce it first (a rowwise or gathering style) or keep it whole", what);
}

/* A latent of multi-head latent attention (q_a_proj's or
 * kv_a_proj_with_mqa's output): the latent norm and the split of the rope
 * part need it whole on every rank. */
static tp_status latent(flow *f, const char *name, lay *out)
{
    char a[40];
    tp_status s = linear(f, name, REP, out);
    if (!s && out->k != L_REP)
        s = refuse(name, style_of(module_at(f, name), param_of(f, name, "weight")), "its output is %s here; multi-head "
                   "latent attention needs the latent whole on every rank (replicated, or mla_kv_a_proj)",
                   lay_str(*out, a, sizeof a));
    return s;
}

/* deepseek_v2/v3's self_attn (§8.5): q (q_proj, or q_a_proj -> q_a_layernorm
 * -> q_b_proj) and kv_b_proj give the heads, both whole or both split by
 * heads alike; the latents stay whole; o_proj reads the heads. */
static tp_status mla_attention(flow *f, int64_t l)
{
    char base[96], qa[128], qan[128], qn[128], ka[128], kan[128], kb[128], on[128], a[40], b[40], o[300];
    snprintf(base, sizeof base, "model.layers.%lld.self_attn", (long long)l);
    snprintf(qa, sizeof qa, "%s.q_a_proj", base);
    snprintf(qan, sizeof qan, "%s.q_a_layernorm", base);
    snprintf(qn, sizeof qn, "%s.%s", base, f->r->cfg.q_lora_rank > 0 ? "q_b_proj" : "q_proj");
    snprintf(ka, sizeof ka, "%s.kv_a_proj_with_mqa", base);
    snprintf(kan, sizeof kan, "%s.kv_a_layernorm", base);
    snprintf(kb, sizeof kb, "%s.kv_b_proj", base);
    snprintf(on, sizeof on, "%s.o_proj", base);
    lay x = REP, q, kv, kl, out, y;
    tp_status s = TP_OK;
    if (f->r->cfg.q_lora_rank > 0 && ((s = latent(f, qa, &x)) || (s = norm(f, qan, x, 0)))) return s;
    if ((s = linear(f, qn, x, &q)) || (s = not_linear(f, qn, q, "attention")) || (s = latent(f, ka, &kl)) ||
        (s = norm(f, kan, kl, 0)) || (s = linear(f, kb, kl, &kv)) || (s = not_linear(f, kb, kv, "attention")))
        return s;
    const char *qsty = style_of(module_at(f, qn), param_of(f, qn, "weight"));
    if (q.k != L_REP && q.k != L_SHARD)
        return refuse(qn, qsty, "its output is %s here; attention needs whole heads on each rank (Replicate, or "
                      "Shard(-1) from a colwise style)", lay_str(q, a, sizeof a));
    if (!lay_eq(q, kv))
        return refuse(kb, style_of(module_at(f, kb), param_of(f, kb, "weight")), "the queries are %s%s and "
                      "kv_b_proj gives %s here; the heads need them alike", lay_str(q, a, sizeof a),
                      origin(q, o, sizeof o), lay_str(kv, b, sizeof b));
    if ((s = linear(f, on, q, &out)) || (s = container(f, base, out, &y))) return s;
    const tp_module_plan *mp = module_at(f, base);
    return mp ? stream(base, mp->style->name, base, y) : stream(y.mod, y.sty, base, y);
}

static int placed(const tp_param_plan *p, tp_placement_kind kind, int dim);

/* gpt_oss's sinks, one per query head: whole when the heads are (a rank
 * reads its own), split with them (§2.16: colwise, Shard(0)) when q is. */
static tp_status sinks(flow *f, const char *base, lay q)
{
    const tp_param_plan *p = param_of(f, base, "sinks");
    char a[48];
    int whole = placed(p, TP_REPLICATE, 0), split = placed(p, TP_SHARD, 0);
    if (whole || (split && q.k == L_SHARD)) return TP_OK;
    return refuse(p->name, p->style ? p->style->name : NULL, "the sinks are %s here, but the query heads are %s; "
                  "leave the sinks whole or split them with the heads (colwise, §2.16)",
                  tp_placement_str(p->placement, a, sizeof a), q.k == L_SHARD ? "split" : "whole");
}

static tp_status attention(flow *f, int64_t l)
{
    if (f->r->cfg.mla) return mla_attention(f, l);
    char base[96], n[4][128], sa[104];
    snprintf(base, sizeof base, "model.layers.%lld.self_attn", (long long)l);
    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int i = 0; i < 4; i++) snprintf(n[i], sizeof n[i], "%s.%s", base, proj[i]);
    lay q, k, v, o, y;
    char a[40], b[40];
    tp_status s;
    if ((s = linear(f, n[0], REP, &q)) || (s = linear(f, n[1], REP, &k)) || (s = linear(f, n[2], REP, &v)))
        return s;
    for (int i = 0; i < 3; i++)
        if ((s = not_linear(f, n[i], i == 0 ? q : i == 1 ? k : v, "attention"))) return s;
    const char *qsty = style_of(module_at(f, n[0]), param_of(f, n[0], "weight"));
    const char *vsty = style_of(module_at(f, n[2]), param_of(f, n[2], "weight"));
    if (q.k != L_REP && q.k != L_SHARD)
        return refuse(n[0], qsty, "its output is %s here; attention needs whole heads on each rank (Replicate, or "
                      "Shard(-1) from a colwise style)", lay_str(q, a, sizeof a));
    char from[300];
    if (!lay_eq(k, v))
        return refuse(n[2], vsty, "k_proj gives %s%s and v_proj gives %s here; attention needs them alike",
                      lay_str(k, a, sizeof a), origin(k, from, sizeof from), lay_str(v, b, sizeof b));
    if (k.k != L_REP && k.k != L_SHARD && k.k != L_KVREP)
        return refuse(n[2], vsty, "its output is %s here; attention needs whole KV heads on each rank",
                      lay_str(k, a, sizeof a));
    if ((s = heads_line_up(f, n[0], qsty, q, k))) return s;
    if (f->r->cfg.arch == TP_ARCH_GPT_OSS && (s = sinks(f, base, q))) return s;
    if (f->r->cfg.qk_norm) {
        snprintf(sa, sizeof sa, "%s.q_norm", base);
        if ((s = norm(f, sa, q, 0))) return s;
        snprintf(sa, sizeof sa, "%s.k_norm", base);
        if ((s = norm(f, sa, k, 0))) return s;
    }
    if ((s = linear(f, n[3], q, &o)) || (s = container(f, base, o, &y))) return s;
    const tp_module_plan *mp = module_at(f, base);
    return mp ? stream(base, mp->style->name, base, y) : stream(y.mod, y.sty, base, y);
}

/* A gated MLP's gate_proj and up_proj: both fed whole, neither followed
 * by a linear op, and alike (their elementwise product); *lg the layout
 * they give, which down_proj takes. */
static tp_status gate_up(flow *f, const char *g, const char *u, lay *lg)
{
    char a[40], b[40], o[300];
    lay lu;
    tp_status s;
    if ((s = linear(f, g, REP, lg)) || (s = linear(f, u, REP, &lu)) ||
        (s = not_linear(f, g, *lg, "the SiLU gate")) || (s = not_linear(f, u, lu, "the gated product")))
        return s;
    if (!lay_eq(*lg, lu))
        return refuse(u, style_of(module_at(f, u), param_of(f, u, "weight")), "gate_proj gives %s%s and up_proj "
                      "gives %s here; the elementwise product needs them alike", lay_str(*lg, a, sizeof a),
                      origin(*lg, o, sizeof o), lay_str(lu, b, sizeof b));
    return TP_OK;
}

/* The feed-forward block's name (Llama 4: feed_forward). */
static const char *ffn(const flow *f) { return f->r->cfg.llama4 ? "feed_forward" : "mlp"; }

static tp_status mlp(flow *f, int64_t l)
{
    char base[96], g[128], u[128], dn[128];
    snprintf(base, sizeof base, "model.layers.%lld.%s", (long long)l, ffn(f));
    snprintf(g, sizeof g, "%s.gate_proj", base);
    snprintf(u, sizeof u, "%s.up_proj", base);
    snprintf(dn, sizeof dn, "%s.down_proj", base);
    lay lg, ld, y;
    tp_status s;
    if ((s = gate_up(f, g, u, &lg))) return s;
    if ((s = linear(f, dn, lg, &ld)) || (s = container(f, base, ld, &y))) return s;
    const tp_module_plan *mp = module_at(f, base);
    return mp ? stream(base, mp->style->name, base, y) : stream(y.mod, y.sty, base, y);
}

static int placed(const tp_param_plan *p, tp_placement_kind kind, int dim)
{
    return p && p->placement.kind == kind && (kind == TP_REPLICATE || p->placement.dim == dim);
}

/* The experts' tensors: both whole, slices of I (gate_up StridedShard(1,
 * 2) with down Shard(2); Llama 4's bmm-style [E, H, 2I] and [E, I, H]:
 * StridedShard(2, 2) with Shard(1)), or whole experts (both Shard(0)); 1
 * for EP. */
static tp_status expert_split(const tp_param_plan *gu, const tp_param_plan *dn, int bmm, int *split, int *ep)
{
    char a[48], b[48], sa[64], sb[64];
    int gu_rep = placed(gu, TP_REPLICATE, 0);
    int gu_i = placed(gu, TP_STRIDED_SHARD, bmm ? 2 : 1) && gu->placement.split == 2;
    int whole = gu_rep && placed(dn, TP_REPLICATE, 0);
    int tp = gu_i && placed(dn, TP_SHARD, bmm ? 1 : 2);
    *ep = placed(gu, TP_SHARD, 0) && placed(dn, TP_SHARD, 0);
    *split = !whole;
    if (whole || tp || *ep) return TP_OK;
    /* name the tensor whose own placement fits none of the three */
    const tp_param_plan *odd = gu_rep || gu_i || placed(gu, TP_SHARD, 0) ? dn : gu;
    snprintf(sa, sizeof sa, gu->style ? "style '%s'" : "no rule", gu->style ? gu->style->name : "");
    snprintf(sb, sizeof sb, dn->style ? "style '%s'" : "no rule", dn->style ? dn->style->name : "");
    return refuse(odd->name, odd->style ? odd->style->name : NULL, "gate_up_proj is %s (%s) and down_proj %s (%s); "
                  "the experts take both whole, slices of I (%s) or whole experts (grouped_gemm on both)",
                  tp_placement_str(gu->placement, a, sizeof a), sa, tp_placement_str(dn->placement, b, sizeof b), sb,
                  bmm ? "packed_rowwise on gate_up_proj, colwise on down_proj"
                      : "packed_colwise on gate_up_proj, rowwise on down_proj");
}

/* DeepSeek's shared experts: a dense MLP beside the routed experts whose
 * output the block adds to theirs, so it must arrive whole (rowwise
 * down_proj, or everything replicated); no rule on the container. */
static tp_status shared_experts(flow *f, const char *block)
{
    char base[128], g[144], u[144], dn[144], a[40];
    snprintf(base, sizeof base, "%s.%s", block, f->r->cfg.llama4 ? "shared_expert" : "shared_experts");
    snprintf(g, sizeof g, "%s.gate_proj", base);
    snprintf(u, sizeof u, "%s.up_proj", base);
    snprintf(dn, sizeof dn, "%s.down_proj", base);
    tp_module_plan *bp = module_at(f, base);
    if (bp) return refuse(base, bp->style->name, "tensorpar runs no rule on shared_experts itself; rules go on its "
                          "projections");
    lay lg, ld;
    tp_status s;
    if ((s = gate_up(f, g, u, &lg))) return s;
    if ((s = linear(f, dn, lg, &ld))) return s;
    if (ld.k != L_REP)
        return refuse(dn, ld.sty ? ld.sty : "-", "its output is %s here, but the block adds it to the routed "
                      "experts' whole output", lay_str(ld, a, sizeof a));
    return TP_OK;
}

/* A sparse block (§2.14, §2.17, §2.18): the router replicated (every rank
 * routes every token), with ep_router exactly when the experts are split
 * on the expert dimension, and split experts summed by the rule on
 * mlp.experts (moe_tp_experts: Partial -> Replicate). */
/* gpt_oss's expert biases go with their weights: whole, or split on the
 * expert dimension alike (a bias split otherwise would not line up). */
static tp_status expert_biases(flow *f, const char *ex, const tp_param_plan *gu)
{
    static const char *const names[2] = {"gate_up_proj_bias", "down_proj_bias"};
    char a[48];
    if (!placed(gu, TP_REPLICATE, 0) && !placed(gu, TP_SHARD, 0))
        return refuse(gu->name, gu->style ? gu->style->name : NULL, "gpt_oss's experts keep Transformers' layout "
                      "[E, H, 2I]; tensorpar runs them whole or split on the expert dimension (grouped_gemm) only");
    for (int i = 0; i < 2; i++) {
        const tp_param_plan *b = param_of(f, ex, names[i]);
        if (b && !placed(b, gu->placement.kind, 0))
            return refuse(b->name, b->style ? b->style->name : NULL, "gpt_oss's expert biases are split like the "
                          "expert weights (whole, or grouped_gemm on all four tensors); gate_up_proj is %s "
                          "(style '%s')", tp_placement_str(gu->placement, a, sizeof a),
                          gu->style ? gu->style->name : "-");
    }
    return TP_OK;
}

static tp_status moe_block(flow *f, int64_t l)
{
    char base[96], gate[128], ex[128];
    int llama4 = f->r->cfg.llama4, oss = f->r->cfg.arch == TP_ARCH_GPT_OSS;
    snprintf(base, sizeof base, "model.layers.%lld.%s", (long long)l, ffn(f));
    snprintf(gate, sizeof gate, "%s.%s", base, llama4 || oss ? "router" : "gate");
    snprintf(ex, sizeof ex, "%s.experts", base);
    const tp_param_plan *rw = param_of(f, gate, "weight");
    const tp_param_plan *gu = param_of(f, ex, "gate_up_proj"), *dn = param_of(f, ex, "down_proj");
    tp_module_plan *rp = module_at(f, gate), *xp = module_at(f, ex), *bp = module_at(f, base);
    const char *xsty = style_of(xp, gu);
    int split, ep;
    if (bp) return refuse(base, bp->style->name, "tensorpar runs no rule on the sparse block itself; rules go on "
                          "mlp.gate, mlp.experts and the expert tensors");
    if (!placed(rw, TP_REPLICATE, 0))
        return refuse(gate, style_of(rp, rw), "the router must stay replicated: every rank routes every token");
    tp_status s = oss ? expert_biases(f, ex, gu) : TP_OK;
    if (!s) s = expert_split(gu, dn, llama4, &split, &ep);
    if (s) return s;
    int remaps = rp && !strcmp(rp->style->impl, "EpRouterParallel");
    if (rp && !remaps)
        return refuse(gate, rp->style->name, "the router runs its own GEMM on its replicated weight; the only rule "
                      "it takes is ep_router");
    if (ep && !remaps)
        return refuse(gate, style_of(rp, rw), "the experts are split on the expert dimension (grouped_gemm; %s "
                      "has style '%s'), so the router must map its choices to each rank's own experts (ep_router)",
                      gu->name, gu->style ? gu->style->name : "-");
    if (!ep && remaps)
        return refuse(gate, rp->style->name, "it maps the router's choices to each rank's own experts, but the "
                      "experts are not split on the expert dimension (grouped_gemm on both expert tensors)");
    int sums = xp && xp->fwd.local_output.kind == TP_PARTIAL && xp->fwd.output.kind == TP_REPLICATE;
    /* §10.6: Llama 4's experts module sums its own split output */
    if (split && !sums && !llama4)
        return refuse(ex, xsty, "its experts are split, so each rank's output is a partial sum; the container "
                      "needs a rule that sums it (moe_tp_experts)");
    if (xp && !sums)
        return refuse(ex, xp->style->name, "the experts' container takes only a rule that sums the ranks' partial "
                      "outputs (moe_tp_experts)");
    return (f->r->cfg.mla && f->r->cfg.n_shared_experts > 0) || llama4 ? shared_experts(f, base) : TP_OK;
}

/* The lookup's layout follows from the table's placement. */
static tp_status embedding(flow *f)
{
    const char *name = "model.embed_tokens";
    const tp_param_plan *w = param_of(f, name, "weight");
    tp_module_plan *mp = module_at(f, name);
    const char *sty = style_of(mp, w);
    char a[40];
    tp_placement pw = w->placement;
    lay raw = pw.kind == TP_REPLICATE ? REP
            : pw.dim == 0 ? mk(L_PARTIAL, 0)          /* masked rows */
            : pw.kind == TP_SHARD ? mk(L_SHARD, 0) : mk(L_STRIDED, pw.split);
    lay out = raw;
    tp_status s = TP_OK;
    if (mp) {
        tp_forward_desc *d = &mp->fwd;
        lay x;
        if (d->divide_params_by_p)
            return refuse(name, sty, "`local` divides the table by P, but nothing sums the lookups afterwards");
        if (!d->ids_input && (s = input_side(mp, name, REP, &x))) return s;   /* ids are replicated */
        if (!d->ids_input && !lay_eq(x, REP))
            return refuse(name, sty, "it would split the token ids, which are never split (§10.9)");
        if ((s = output_side(mp, name, raw, &out))) return s;
    }
    if (out.k != L_REP)
        return refuse(name, sty, "the lookup gives %s here, but the embedding output is the residual stream, which "
                      "must be Replicate%s", lay_str(out, a, sizeof a),
                      out.k == L_PARTIAL ? "; nothing sums it (embedding_rowwise would)" : "");
    return TP_OK;
}

static tp_status lm_head(flow *f)
{
    lay y;
    char a[40];
    tp_status s = linear(f, "lm_head", REP, &y);
    if (s || y.k == L_REP) return s;
    return refuse("lm_head", style_of(module_at(f, "lm_head"), param_of(f, "lm_head", "weight")),
                  "its output is %s here, but the logits must be whole on every rank (colwise_gather_output "
                  "gathers them)", lay_str(y, a, sizeof a));
}

static tp_status run(flow *f)
{
    const tp_model_config *c = &f->r->cfg;
    char name[96];
    tp_status s = passive(f, "model", "the model", REP, REP, 0);
    if (!s) s = passive(f, "model.layers", "the layer list", REP, REP, 0);
    if (!s) s = embedding(f);
    for (int64_t l = 0; l < c->num_hidden_layers && !s; l++) {
        snprintf(name, sizeof name, "model.layers.%lld", (long long)l);
        s = passive(f, name, "a decoder layer", REP, REP, 0);
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm", (long long)l);
        if (!s) s = norm(f, name, REP, 1);
        if (!s) s = attention(f, l);
        snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm", (long long)l);
        if (!s) s = norm(f, name, REP, 1);
        if (!s) s = tp_config_layer_is_sparse(c, l) ? moe_block(f, l) : mlp(f, l);
    }
    if (!s) s = norm(f, "model.norm", REP, 1);
    if (!s) s = lm_head(f);
    /* A module rule the walk above never met would be silently ignored. */
    for (size_t i = 0; !s && i < f->r->n_modules; i++)
        if (!f->seen[i])
            s = refuse(f->r->modules[i].name, f->r->modules[i].style->name,
                       "tensorpar's decoder runs no forward of its own for this module");
    return s;
}

tp_status tp_plan_check_flow(tp_plan_resolution *r)
{
    if (!r->applied) return TP_OK;
    unsigned char seen[1];
    flow f = {r, r->n_modules ? calloc(r->n_modules, 1) : seen};
    if (!f.seen) return tp_fail(TP_ERR_NOMEM, "out of memory");
    tp_status s = run(&f);
    if (r->n_modules) free(f.seen);
    return s;
}
