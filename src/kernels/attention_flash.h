/* kernels/attention_flash.h — the flash-style attention body, included by
 * attention.c once per SIMD path with these macros defined:
 *   FLASH_FN      name of the function to define
 *   FLASH_TARGET  its target attribute
 *   VDOT(a,b,d)   Σ a[i]·b[i]            VAXPY(o,p,v,d)  o += p·v
 *   VSCALE(o,c,d) o *= c                  VEXPSUM(s,n,m)  s = exp(s − m), returns Σ s
 *
 * One call handles the queries t0..t1-1 of one head.  It walks the keys in
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
