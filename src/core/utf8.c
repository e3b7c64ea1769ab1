/* utf8.c - UTF-8 validation and repair. */
#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

/* The well-formed sequence at @s (its length, > 0), or the negated length of the maximal
 * subpart of one to replace by a single U+FFFD (at least 1): Unicode's recommended practice
 * ("U+FFFD substitution of maximal subparts"), which Python's errors="replace" and the WHATWG
 * decoder follow. The second byte's range rules out overlong forms, surrogates and code points
 * above U+10FFFF. */
static long scan(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    int need;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return -1;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n || s[k] < lo || s[k] > hi)
            return -k;
        lo = 0x80;
        hi = 0xbf;
    }
    return need + 1;
}

size_t conch_utf8_seq(const unsigned char *s, size_t n)
{
    long k = scan(s, n);
    return k > 0 ? (size_t)k : 0;
}

size_t conch_utf8_bad(const unsigned char *s, size_t n)
{
    long k = scan(s, n);
    return k > 0 ? 0 : (size_t)-k;
}

char *conch_utf8_repair(const char *s, size_t n, size_t *ret_len)
{
    char *out = malloc(n * 3 + 1);
    if (!out)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = conch_utf8_seq(u + i, n - i);
        if (k == 0) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += conch_utf8_bad(u + i, n - i);
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
    *ret_len = o;
    return out;
}
