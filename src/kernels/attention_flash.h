/* kernels/attention_flash.h — the flash-style attention body, included by
 * attention.c once per SIMD path with these macros defined:
 *   FLASH_FN      name of the function to define
 *   FLASH_TARGET  its target attribute
 *   VDOT(a,b,d)   Σ a[i]·b[i]            VAXPY(o,p,v,d)  o += p·v
 *   VSCALE(o,c,d) o *= c                  VEXPSUM(s,n,m)  s = exp(s − m), returns Σ s
 *
 * One call handles the queries t0..t1-1 of one head (the rows kernel, used
 * for blocks of fewer than VL queries: decode, and a prefill's last block).  It walks the keys in
 * blocks of BK; for each query it keeps the running maximum m, the running
 * sum l of exp(score − m) and the unnormalised output o.  When a block
 * raises the maximum, the old l and o are rescaled by exp(m_old − m_new).
 * At the end out = o / l.  Scores exist for one key block only, so memory
 * stays O(BQ·d + BK) however long the prompt; the block of keys and values
 * is read from cache by all BQ queries before moving on. */

FLASH_TARGET static void FLASH_FN(const attn_job *j, int64_t t0, int64_t t1, int64_t h, float *o,
                                  float *s, float *m, float *l)
{
    int64_t d = j->d, kvh = h / (j->n_heads / j->n_kv), kv_stride = j->n_kv * j->d;
    float scale = 1.0f / sqrtf((float)d);
    int64_t nq = t1 - t0;
    for (int64_t qi = 0; qi < nq; qi++) {
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
        for (int64_t i = 0; i < d; i++) o[qi * d + i] = 0.0f;
    }
    int64_t k_lo = first_key(j, j->pos0 + t0), k_hi = j->pos0 + t1;   /* keys [k_lo, k_hi) */
    for (int64_t kb = k_lo; kb < k_hi; kb += BK) {
        int64_t kend = kb + BK < k_hi ? kb + BK : k_hi;
        for (int64_t qi = 0; qi < nq; qi++) {
            int64_t pos = j->pos0 + t0 + qi;
            int64_t lo = first_key(j, pos), hi = pos + 1;
            if (lo < kb) lo = kb;
            if (hi > kend) hi = kend;
            if (lo >= hi) continue;   /* causal mask or window: nothing here */
            const float *q = j->q + ((t0 + qi) * j->n_heads + h) * d;
            float bmax = -INFINITY;
            for (int64_t p = lo; p < hi; p++) {
                float sc = VDOT(q, j->k + p * kv_stride + kvh * d, d) * scale;
                s[p - lo] = sc;
                if (sc > bmax) bmax = sc;
            }
            float mnew = bmax > m[qi] ? bmax : m[qi];
            float corr = expf(m[qi] - mnew);   /* 0 on the first block (m = -inf) */
            float sum = VEXPSUM(s, hi - lo, mnew);
            float *oq = o + qi * d;
            l[qi] = l[qi] * corr + sum;
            if (corr != 1.0f) VSCALE(oq, corr, d);
            for (int64_t p = lo; p < hi; p++) VAXPY(oq, s[p - lo], j->v + p * kv_stride + kvh * d, d);
            m[qi] = mnew;
        }
    }
    for (int64_t qi = 0; qi < nq; qi++) {
        float *out = j->out + ((t0 + qi) * j->n_heads + h) * d;
        float inv = 1.0f / l[qi];
        for (int64_t i = 0; i < d; i++) out[i] = o[qi * d + i] * inv;
    }
}

/* ---- query lanes ------------------------------------------------------
 * The prefill kernel: one call handles VL consecutive queries t0..t0+VL-1
 * of head h (a full block), one query per vector lane.  The dot products
 * above cost a horizontal sum per (query, key) and reload o per key; here
 * both products are small register-tiled GEMMs instead:
 *   scores  S[p][q] = Σ_i K[p][i]·Qt[i][q]   (KR keys at a time, K[p][i] broadcast)
 *   output Ot[i][q] += Σ_p V[p][i]·P[p][q]   (RB rows of Ot kept in registers)
 * with Qt = the block's queries transposed once ([d][VL]) and Ot the output
 * transposed ([d][VL]).  The online softmax then works lane-wise: the running
 * max m and sum l of all VL queries are one vector each, so no horizontal
 * operation is left in the inner loops.  The order of every sum depends only
 * on (t0, h), never on the thread that runs it.
 *
 * Macros, besides FLASH_TARGET: LANES_FN, VEC, VL, VZERO(), VSET1(x),
 * VLOAD(p), VSTORE(p,v), VADD, VMUL, VMAX, VFMA(a,b,c) = a·b + c, VEXP(x),
 * VKEEP(s, p, lo, hi): s where lo <= p <= hi (all float vectors), else -inf,
 * and RB, the rows of Ot per register tile (16 = a whole cache line of each
 * V row where there are 32 vector registers: V rows of one KV head lie 4 KiB
 * or so apart and alias in L1, so each line should be fetched once). */

#define KR 8   /* keys per register tile of the scores */
#define PF_ROWS 8   /* how far ahead V rows are prefetched */

FLASH_TARGET static void LANES_FN(const attn_job *j, int64_t t0, int64_t h, float *qt, float *ot, float *s)
{
    int64_t d = j->d, kvh = h / (j->n_heads / j->n_kv), kv_stride = j->n_kv * j->d;
    const float *kbase = j->k + kvh * d, *vbase = j->v + kvh * d;
    float lo_f[VL], pos_f[VL];
    for (int q = 0; q < VL; q++) {
        int64_t pos = j->pos0 + t0 + q;
        const float *qr = j->q + ((t0 + q) * j->n_heads + h) * d;
        for (int64_t i = 0; i < d; i++) { qt[i * VL + q] = qr[i]; ot[i * VL + q] = 0.0f; }
        lo_f[q] = (float)first_key(j, pos);
        pos_f[q] = (float)pos;
    }
    VEC lov = VLOAD(lo_f), posv = VLOAD(pos_f), scale = VSET1(1.0f / sqrtf((float)d));
    VEC m = VSET1(-INFINITY), l = VZERO();
    /* Keys [k_lo, k_hi): from the first key of the first query to the last
     * query itself; lanes mask what they may not see. */
    int64_t k_lo = first_key(j, j->pos0 + t0), k_hi = j->pos0 + t0 + VL;
    int64_t lo_max = first_key(j, k_hi - 1), pos_min = j->pos0 + t0;
    for (int64_t kb = k_lo; kb < k_hi; kb += BK) {
        int64_t kend = kb + BK < k_hi ? kb + BK : k_hi, nk = kend - kb;
        /* scores of the block, KR keys at a time */
        int64_t p = 0;
        for (; p + KR <= nk; p += KR) {
            VEC acc[KR];
            const float *kr = kbase + (kb + p) * kv_stride;
            for (int r = 0; r < KR; r++) {
                acc[r] = VZERO();
                if (p + KR + r < nk)   /* the next tile's rows */
                    _mm_prefetch((const char *)(kr + (KR + r) * kv_stride), _MM_HINT_T0);
            }
            for (int64_t i = 0; i < d; i++) {
                VEC qi = VLOAD(qt + i * VL);
                for (int r = 0; r < KR; r++) acc[r] = VFMA(VSET1(kr[r * kv_stride + i]), qi, acc[r]);
            }
            for (int r = 0; r < KR; r++) VSTORE(s + (p + r) * VL, acc[r]);
        }
        for (; p < nk; p++) {
            VEC acc = VZERO();
            const float *kr = kbase + (kb + p) * kv_stride;
            for (int64_t i = 0; i < d; i++) acc = VFMA(VSET1(kr[i]), VLOAD(qt + i * VL), acc);
            VSTORE(s + p * VL, acc);
        }
        /* scale, mask (only blocks that cross a lane's first or last key),
         * block maximum */
        int masked = kb < lo_max || kend - 1 > pos_min;
        VEC bmax = VSET1(-INFINITY);
        for (p = 0; p < nk; p++) {
            VEC sc = VMUL(VLOAD(s + p * VL), scale);
            if (masked) sc = VKEEP(sc, VSET1((float)(kb + p)), lov, posv);
            VSTORE(s + p * VL, sc);
            bmax = VMAX(bmax, sc);
        }
        /* A lane that has seen no key yet keeps m = -inf; subtracting
         * -FLT_MAX instead of -inf keeps its exp at 0 instead of NaN. */
        VEC mnew = VMAX(m, bmax), msafe = VMAX(mnew, VSET1(-FLT_MAX));
        VEC corr = VEXP(VADD(m, VMUL(msafe, VSET1(-1.0f))));
        VEC sum = VZERO();
        for (p = 0; p < nk; p++) {
            VEC e = VEXP(VADD(VLOAD(s + p * VL), VMUL(msafe, VSET1(-1.0f))));
            VSTORE(s + p * VL, e);
            sum = VADD(sum, e);
        }
        l = VADD(VMUL(l, corr), sum);
        m = mnew;
        /* Ot = Ot·corr + Vᵀ·P, RB rows of Ot at a time */
        int64_t i0 = 0;
        for (; i0 + RB <= d; i0 += RB) {
            VEC acc[RB];
            for (int r = 0; r < RB; r++) acc[r] = VMUL(VLOAD(ot + (i0 + r) * VL), corr);
            for (p = 0; p < nk; p++) {
                VEC pp = VLOAD(s + p * VL);
                const float *vr = vbase + (kb + p) * kv_stride + i0;
                /* V rows lie a page or so apart: no hardware prefetcher
                 * follows them, so ask for a later row's line here. */
                if (p + PF_ROWS < nk) _mm_prefetch((const char *)(vr + PF_ROWS * kv_stride), _MM_HINT_T0);
                for (int r = 0; r < RB; r++) acc[r] = VFMA(VSET1(vr[r]), pp, acc[r]);
            }
            for (int r = 0; r < RB; r++) VSTORE(ot + (i0 + r) * VL, acc[r]);
        }
        for (; i0 < d; i0++) {
            VEC acc = VMUL(VLOAD(ot + i0 * VL), corr);
            for (p = 0; p < nk; p++) acc = VFMA(VSET1(vbase[(kb + p) * kv_stride + i0]), VLOAD(s + p * VL), acc);
            VSTORE(ot + i0 * VL, acc);
        }
    }
    /* out = Ot / l, transposed back through qt (free now), so that each
     * output row is written whole rather than one float per query row */
    float linv[VL];
    VSTORE(linv, l);
    for (int q = 0; q < VL; q++) linv[q] = 1.0f / linv[q];
    VEC inv = VLOAD(linv);
    for (int64_t i = 0; i < d; i++) {
        float row[VL];
        VSTORE(row, VMUL(VLOAD(ot + i * VL), inv));
        for (int q = 0; q < VL; q++) qt[q * d + i] = row[q];
    }
    for (int q = 0; q < VL; q++) memcpy(j->out + ((t0 + q) * j->n_heads + h) * d, qt + q * d, (size_t)d * sizeof(float));
}

#undef KR
#undef PF_ROWS
