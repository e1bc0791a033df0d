/* kernels/attention_flash.h — the flash-style attention body, included by
 * attention.c once per SIMD path with these macros defined:
 *   FLASH_FN      name of the rows kernel to define
 *   FLASH_TARGET  its target attribute
 *   VDOT(a,b,d)   Σ a[i]·b[i]            VAXPY(o,p,v,d)  o += p·v
 *   VSCALE(o,c,d) o *= c                  VEXPSUM(s,n,m)  s = exp(s − m), returns Σ s
 * and attention.c's types and helpers (attn_job, kv_rows, first_key,
 * prefetch_row, BK).
 *
 * One call of the rows kernel handles the queries t0..t1-1 of the heads
 * h0..h0+nh-1, which share one KV head (used for blocks of fewer than VL
 * queries: decode, and a prefill's last block).  It walks the keys in blocks
 * of BK; for each (query, head) row it keeps the running maximum m, the
 * running sum l of exp(score − m) and the unnormalised output o.  When a
 * block raises the maximum, the old l and o are rescaled by
 * exp(m_old − m_new).  At the end out = o / l.  Scores exist for one key
 * block only, so memory stays O(rows·d + BK) however long the prompt; the
 * block of keys and values is read from cache by all rows before moving on,
 * which in decode means the heads of a group fetch the KV cache from memory
 * once, not once each.  Every row's sums run in the same order whatever else is in the
 * call. */

#define ROW_AHEAD 6   /* rows of K or V prefetched ahead in the rows kernel */

FLASH_TARGET static void FLASH_FN(const attn_job *j, int64_t t0, int64_t t1, int64_t h0, int nh,
                                  float *o, float *s, float *m, float *l)
{
    int64_t d = j->d, kvh = h0 / (j->n_heads / j->n_kv), kv_stride = j->n_kv * j->d;
    const float *kbase = j->k + kvh * d, *vbase = j->v + kvh * d;
    float scale = 1.0f / sqrtf((float)d);
    int64_t nq = t1 - t0, rows = nq * nh;   /* row = qi·nh + hh */
    for (int64_t r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int64_t i = 0; i < d; i++) o[r * d + i] = 0.0f;
    }
    int64_t k_lo = first_key(j, j->pos0 + t0), k_hi = j->pos0 + t1;   /* keys [k_lo, k_hi) */
    for (int64_t kb = k_lo; kb < k_hi; kb += BK) {
        int64_t kend = kb + BK < k_hi ? kb + BK : k_hi;
        for (int64_t r = 0; r < rows; r++) {
            int64_t qi = r / nh, h = h0 + r % nh, pos = j->pos0 + t0 + qi;
            int64_t lo = first_key(j, pos), hi = pos + 1;
            if (lo < kb) lo = kb;
            if (hi > kend) hi = kend;
            if (lo >= hi) continue;   /* causal mask or window: nothing here */
            const float *q = j->q + ((t0 + qi) * j->n_heads + h) * d;
            float bmax = -INFINITY;
            for (int64_t p = lo; p < hi; p++) {
                /* The rows lie a page or so apart (in decode they come from
                 * memory): no hardware prefetcher follows them. */
                if (p + ROW_AHEAD < hi) prefetch_row(kbase + (p + ROW_AHEAD) * kv_stride, d);
                float sc = VDOT(q, kbase + p * kv_stride, d) * scale;
                s[p - lo] = sc;
                if (sc > bmax) bmax = sc;
            }
            float mnew = bmax > m[r] ? bmax : m[r];
            float corr = expf(m[r] - mnew);   /* 0 on the first block (m = -inf) */
            float sum = VEXPSUM(s, hi - lo, mnew);
            float *oq = o + r * d;
            l[r] = l[r] * corr + sum;
            if (corr != 1.0f) VSCALE(oq, corr, d);
            for (int64_t p = lo; p < hi; p++) {
                if (p + ROW_AHEAD < hi) prefetch_row(vbase + (p + ROW_AHEAD) * kv_stride, d);
                VAXPY(oq, s[p - lo], vbase + p * kv_stride, d);
            }
            m[r] = mnew;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float *out = j->out + ((t0 + r / nh) * j->n_heads + h0 + r % nh) * d;
        float inv = 1.0f / l[r];
        for (int64_t i = 0; i < d; i++) out[i] = o[r * d + i] * inv;
    }
}

#undef ROW_AHEAD

/* ---- query lanes ------------------------------------------------------
 * The prefill kernel: one call handles VL consecutive queries t0..t0+VL-1
 * (a full block), one query per vector lane, of NH heads h0..h0+NH-1 that
 * share one KV head (NH = 2 where the GQA group size is even, else 1).
 * Both products are small register-tiled GEMMs:
 *   scores  S[p][q] = Σ_i K[p][i]·Qt[i][q]   (KR keys × NH heads per tile)
 *   output Ot[i][q] += Σ_p V[p][i]·P[p][q]   (RB rows of Ot × NH heads)
 * with Qt = the block's queries transposed once ([d][VL] per head) and Ot the
 * output transposed ([d][VL] per head).  Each broadcast K or V element feeds
 * NH FMAs: with one head a tile needs about a load per FMA, with two 0.6,
 * so the FMAs rather than the loads set the pace, and a KV block comes from
 * cache once for both heads.  The online
 * softmax works lane-wise: the running max m and sum l of the VL queries of
 * a head are one vector each, so no horizontal operation is left in the
 * inner loops.
 *
 * The keys and values come through kv (see kv_rows in attention.c): the
 * cache itself, or a packed copy of the KV head.
 *
 * Every accumulator is one chain of FMAs in a fixed order (i ascending for a
 * score, p ascending for an output), so a lane's result depends neither on
 * the tile shape, nor on NH, nor on the thread that runs it.
 *
 * Macros, besides FLASH_TARGET: LANES_FN, LANES_BODY, VEC, VL, VZERO(),
 * VSET1(x), VLOAD(p), VSTORE(p,v), VADD, VMUL, VMAX, VFMA(a,b,c) = a·b + c,
 * VEXP(x) = 2^x, VKEEP(s, p, lo, hi): s where lo <= p <= hi (all float vectors),
 * else -inf, VTRANSPOSE(VEC r[VL]): transposes the VL×VL block r[row][lane]. */

#define KR_MAX 16   /* the most keys per register tile of the scores */
#define RB_MAX 16   /* the most rows of Ot per register tile */
#define PF_ROWS 8   /* how far ahead V rows are prefetched */

/* A tile of the scores: keys p..p+NKEYS-1 (rows of K from krow) against the
 * nh heads' Qt, scaled (by scale·log2 e: the softmax works in base 2),
 * masked where the block needs it, stored to s (nh vectors per key) and
 * folded into the block maxima bmax. */
#define SCORE_TILE(NKEYS)                                                             \
    do {                                                                              \
        VEC acc[KR_MAX][NH_MAX];                                                       \
        for (int r = 0; r < (NKEYS); r++)                                             \
            for (int hh = 0; hh < nh; hh++) acc[r][hh] = VZERO();                     \
        for (int64_t i = 0; i < d; i++) {                                             \
            VEC qv[NH_MAX];                                                           \
            for (int hh = 0; hh < nh; hh++) qv[hh] = VLOAD(qt + (hh * d + i) * VL);   \
            for (int r = 0; r < (NKEYS); r++) {                                       \
                VEC kv = VSET1(krow[r * kv_stride + i]);                              \
                for (int hh = 0; hh < nh; hh++) acc[r][hh] = VFMA(kv, qv[hh], acc[r][hh]); \
            }                                                                         \
        }                                                                             \
        for (int r = 0; r < (NKEYS); r++) {                                           \
            VEC kpos = VSET1((float)(kb + p + r));                                    \
            for (int hh = 0; hh < nh; hh++) {                                         \
                VEC sc = VMUL(acc[r][hh], scale);                                     \
                if (masked) sc = VKEEP(sc, kpos, lov, posv);                          \
                bmax[hh] = VMAX(bmax[hh], sc);                                        \
                VSTORE(s + (p + r) * sv + hh * VL, sc);                               \
            }                                                                         \
        }                                                                             \
    } while (0)

#define NH_MAX 2

/* The body, inlined into LANES_FN once per NH so that the tiles' loops over
 * heads and rows unroll into registers. */
FLASH_TARGET static inline __attribute__((always_inline)) void
LANES_BODY(const attn_job *j, kv_rows kv, int64_t t0, int64_t h0, const int nh, const int kr, const int rb,
           float *qt, float *ot, float *s)
{
    int64_t d = j->d, kv_stride = kv.stride, sv = nh * VL;
    const float *kbase = kv.k, *vbase = kv.v;
    /* Qt: VL×VL blocks of the query rows transposed in registers; the
     * rows are read whole (they lie n_heads·d floats apart, in the same few
     * cache sets, so a column at a time would miss on every row). */
    for (int hh = 0; hh < nh; hh++) {
        const float *qh = j->q + (t0 * j->n_heads + h0 + hh) * d;
        int64_t qs = j->n_heads * d, i0 = 0;
        for (; i0 + VL <= d; i0 += VL) {
            VEC r[VL];
            for (int q = 0; q < VL; q++) r[q] = VLOAD(qh + q * qs + i0);
            VTRANSPOSE(r);
            for (int c = 0; c < VL; c++) VSTORE(qt + (hh * d + i0 + c) * VL, r[c]);
        }
        for (; i0 < d; i0++)
            for (int q = 0; q < VL; q++) qt[(hh * d + i0) * VL + q] = qh[q * qs + i0];
    }
    for (int64_t i = 0; i < nh * d; i++) VSTORE(ot + i * VL, VZERO());
    float lo_f[VL], pos_f[VL];
    for (int q = 0; q < VL; q++) {
        int64_t pos = j->pos0 + t0 + q;
        lo_f[q] = (float)first_key(j, pos);
        pos_f[q] = (float)pos;
    }
    VEC lov = VLOAD(lo_f), posv = VLOAD(pos_f), scale = VSET1(1.4426950408889634f / sqrtf((float)d));
    VEC m[NH_MAX], l[NH_MAX], corr[NH_MAX];
    for (int hh = 0; hh < nh; hh++) { m[hh] = VSET1(-INFINITY); l[hh] = VZERO(); }
    /* Keys [k_lo, k_hi): from the first key of the first query to the last
     * query itself; lanes mask what they may not see. */
    int64_t k_lo = first_key(j, j->pos0 + t0), k_hi = j->pos0 + t0 + VL;
    int64_t lo_max = first_key(j, k_hi - 1), pos_min = j->pos0 + t0;
    for (int64_t kb = k_lo; kb < k_hi; kb += BK) {
        int64_t kend = kb + BK < k_hi ? kb + BK : k_hi, nk = kend - kb;
        /* scores of the block, kr keys at a time; masked only in blocks
         * that cross a lane's first or last key */
        int masked = kb < lo_max || kend - 1 > pos_min;
        VEC bmax[NH_MAX];
        for (int hh = 0; hh < nh; hh++) bmax[hh] = VSET1(-INFINITY);
        int64_t p = 0;
        for (; p + kr <= nk; p += kr) {
            const float *krow = kbase + (kb + p) * kv_stride;
            /* the next tile's rows: K rows lie a page or so apart, where no
             * hardware prefetcher follows */
            for (int r = 0; r < kr && p + kr + r < nk; r++)
                _mm_prefetch((const char *)(krow + (kr + r) * kv_stride), _MM_HINT_T0);
            SCORE_TILE(kr);
        }
        /* the rest (a cache before the prompt, a window) in shorter tiles:
         * one key alone is a single chain of d FMAs, bound by latency */
        if (kr > 4)
            for (; p + 4 <= nk; p += 4) {
                const float *krow = kbase + (kb + p) * kv_stride;
                SCORE_TILE(4);
            }
        for (; p < nk; p++) {
            const float *krow = kbase + (kb + p) * kv_stride;
            SCORE_TILE(1);
        }
        /* the online softmax, per head, in base 2 */
        for (int hh = 0; hh < nh; hh++) {
            float *sh = s + hh * VL;
            /* A lane that has seen no key yet keeps m = -inf; subtracting
             * -FLT_MAX instead of -inf keeps its exp at 0 instead of NaN. */
            VEC mnew = VMAX(m[hh], bmax[hh]), msafe = VMAX(mnew, VSET1(-FLT_MAX));
            VEC neg = VMUL(msafe, VSET1(-1.0f));
            corr[hh] = VEXP(VADD(m[hh], neg));
            VEC sum = VZERO();
            for (p = 0; p < nk; p++) {
                VEC e = VEXP(VADD(VLOAD(sh + p * sv), neg));
                VSTORE(sh + p * sv, e);
                sum = VADD(sum, e);
            }
            l[hh] = VADD(VMUL(l[hh], corr[hh]), sum);
            m[hh] = mnew;
        }
        /* Ot = Ot·corr + Vᵀ·P, rb rows of Ot × nh heads at a time */
        int64_t i0 = 0;
        for (; i0 + rb <= d; i0 += rb) {
            VEC acc[RB_MAX][NH_MAX];
            for (int r = 0; r < rb; r++)
                for (int hh = 0; hh < nh; hh++) acc[r][hh] = VMUL(VLOAD(ot + (hh * d + i0 + r) * VL), corr[hh]);
            const float *vr = vbase + kb * kv_stride + i0;
            for (p = 0; p < nk; p++, vr += kv_stride) {
                VEC pv[NH_MAX];
                for (int hh = 0; hh < nh; hh++) pv[hh] = VLOAD(s + p * sv + hh * VL);
                /* V rows lie a page or so apart: no hardware prefetcher
                 * follows them, so ask for a later row's line here. */
                if (p + PF_ROWS < nk) _mm_prefetch((const char *)(vr + PF_ROWS * kv_stride), _MM_HINT_T0);
                for (int r = 0; r < rb; r++) {
                    VEC vv = VSET1(vr[r]);
                    for (int hh = 0; hh < nh; hh++) acc[r][hh] = VFMA(vv, pv[hh], acc[r][hh]);
                }
            }
            for (int r = 0; r < rb; r++)
                for (int hh = 0; hh < nh; hh++) VSTORE(ot + (hh * d + i0 + r) * VL, acc[r][hh]);
        }
        for (; i0 < d; i0++)
            for (int hh = 0; hh < nh; hh++) {
                VEC acc = VMUL(VLOAD(ot + (hh * d + i0) * VL), corr[hh]);
                for (p = 0; p < nk; p++)
                    acc = VFMA(VSET1(vbase[(kb + p) * kv_stride + i0]), VLOAD(s + p * sv + hh * VL), acc);
                VSTORE(ot + (hh * d + i0) * VL, acc);
            }
    }
    /* out = Ot / l, transposed back as Qt came */
    for (int hh = 0; hh < nh; hh++) {
        float linv[VL];
        VSTORE(linv, l[hh]);
        for (int q = 0; q < VL; q++) linv[q] = 1.0f / linv[q];
        VEC inv = VLOAD(linv);
        const float *oth = ot + hh * d * VL;
        float *outh = j->out + (t0 * j->n_heads + h0 + hh) * d;
        int64_t os = j->n_heads * d, i0 = 0;
        for (; i0 + VL <= d; i0 += VL) {
            VEC r[VL];
            for (int c = 0; c < VL; c++) r[c] = VMUL(VLOAD(oth + (i0 + c) * VL), inv);
            VTRANSPOSE(r);
            for (int q = 0; q < VL; q++) VSTORE(outh + q * os + i0, r[q]);
        }
        for (; i0 < d; i0++)
            for (int q = 0; q < VL; q++) outh[q * os + i0] = oth[i0 * VL + q] * linv[q];
    }
}

/* The tile shapes (KR1, RB1 for one head, KR2, RB2 for two) come from the
 * includer: they fill the vector registers without spilling. */
FLASH_TARGET static void LANES_FN(const attn_job *j, kv_rows kv, int64_t t0, int64_t h0, int nh, float *qt,
                                  float *ot, float *s)
{
    if (nh == 2) LANES_BODY(j, kv, t0, h0, 2, KR2, RB2, qt, ot, s);
    else LANES_BODY(j, kv, t0, h0, 1, KR1, RB1, qt, ot, s);
}

#undef SCORE_TILE
#undef NH_MAX
#undef KR_MAX
#undef RB_MAX
#undef PF_ROWS
