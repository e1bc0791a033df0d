/* UTF-8 checks and repair.  Validation follows the Unicode "maximal subpart"
 * rule so that broken byte sequences turn into the same number of U+FFFD as
 * Rust's String::from_utf8_lossy gives (and thus as `tokenizers` decodes). */
#include "tok_internal.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Bytes 2..n of a sequence: the second byte's range depends on the lead
 * (no overlongs, no surrogates, nothing above U+10FFFF). */
static int expected_len(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80; *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* How many bytes of a sequence at p are well-formed (>= 1 for a lead byte
 * that is valid); *need is the full length (0 for an invalid lead). */
static int valid_prefix(const unsigned char *p, size_t avail, int *need)
{
    unsigned char lo, hi;
    int n = expected_len(p[0], &lo, &hi);
    *need = n;
    if (n <= 1) return n;
    int k = 1;
    while (k < n && (size_t)k < avail) {
        unsigned char c = p[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
        k++;
    }
    return k;
}

int tp_tok_utf8_seq_len(const unsigned char *p, size_t avail)
{
    int need;
    int k = valid_prefix(p, avail, &need);
    return need > 0 && k == need ? need : 0;
}

int tp_tok_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) { i++; continue; }
        int n = tp_tok_utf8_seq_len(p + i, len - i);
        if (!n) return 0;
        i += (size_t)n;
    }
    return 1;
}

int tp_tok_utf8_decode(const char *s, size_t len, int32_t *cp)
{
    const unsigned char *p = (const unsigned char *)s;
    int n = tp_tok_utf8_seq_len(p, len);
    if (n <= 1) { *cp = p[0]; return 1; }
    int32_t c = p[0] & (0x7F >> n);
    for (int k = 1; k < n; k++) c = (c << 6) | (p[k] & 0x3F);
    *cp = c;
    return n;
}

int tp_tok_is_space(int32_t cp)
{
    /* The Unicode White_Space property: small and fixed since Unicode 6.3. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

tp_status tp_tok_utf8_lossy(tok_buf *out, const char *s, size_t len, int final, size_t *used)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;   /* [run, i) is valid text not yet copied */
    tp_status st = TP_OK;
    while (i < len) {
        if (p[i] < 0x80) { i++; continue; }
        int need, k = valid_prefix(p + i, len - i, &need);
        if (need > 0 && k == need) { i += (size_t)k; continue; }
        if (!final && need > 0 && i + (size_t)k == len) break;   /* unfinished: wait */
        if ((st = tp_tok_buf_append(out, s + run, i - run))) return st;
        if ((st = tp_tok_buf_append(out, REPLACEMENT, 3))) return st;
        i += k > 0 ? (size_t)k : 1;
        run = i;
    }
    if ((st = tp_tok_buf_append(out, s + run, i - run))) return st;
    if (used) *used = i;
    return TP_OK;
}
