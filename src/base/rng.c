/* Deterministic random numbers (xoshiro256**, splitmix64 seeding) and a
 * counter-based hash for draws keyed by an index. */
#include "tensorpar/base.h"

#include <math.h>

static uint64_t finalise(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *x)
{
    return finalise(*x += 0x9e3779b97f4a7c15ull);
}

uint64_t tp_rng_hash(uint64_t key, uint64_t counter)
{
    return finalise(key + (counter + 1) * 0x9e3779b97f4a7c15ull);
}

void tp_rng_seed(tp_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tp_rng_next(tp_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tp_rng_uniform(tp_rng *r) { return (double)(tp_rng_next(r) >> 11) * 0x1.0p-53; }

double tp_rng_normal(tp_rng *r)
{
    /* Box-Muller; one of the pair is dropped to keep the generator stateless
     * beyond its four words. */
    double u1 = tp_rng_uniform(r), u2 = tp_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
