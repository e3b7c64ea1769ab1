/* quote.c - file names are attacker-controlled data: C-style quoting, as git does, for
 * wherever a name reaches a patch header or a terminal, so that a newline in a name cannot
 * forge a line and an escape sequence never reaches a terminal. */
#include "workspace/workspace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

/* The escape git writes for @c, or 0 when it writes an octal one. */
static char letter(unsigned char c)
{
    switch (c) {
    case '\a':
        return 'a';
    case '\b':
        return 'b';
    case '\t':
        return 't';
    case '\n':
        return 'n';
    case '\v':
        return 'v';
    case '\f':
        return 'f';
    case '\r':
        return 'r';
    case '"':
        return '"';
    case '\\':
        return '\\';
    }
    return 0;
}

/* Bytes of @s[i..n) kept as they are (0: escape s[i]). @ascii: escape every byte >= 0x80 (git's
 * core.quotePath); otherwise keep well-formed UTF-8 except C1 controls (U+0080..U+009F,
 * which some terminals obey like ESC). */
static size_t plain_len(const unsigned char *s, size_t i, size_t n, bool ascii)
{
    unsigned char c = s[i];
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
        return 0;
    if (c < 0x80)
        return 1;
    if (ascii)
        return 0;
    size_t k = conch_utf8_seq(s + i, n - i);
    if (k == 2 && c == 0xc2 && s[i + 1] < 0xa0)
        return 0;
    return k;
}

char *conch_ws_quote(const char *prefix, const char *name, bool ascii)
{
    size_t pl = strlen(prefix), nl = strlen(name);
    size_t total = pl + nl;
    char *whole = malloc(total + 1);
    if (!whole)
        return NULL;
    memcpy(whole, prefix, pl);
    memcpy(whole + pl, name, nl + 1);
    const unsigned char *s = (const unsigned char *)whole;
    bool need = false;
    for (size_t i = 0; i < total && !need;) {
        size_t k = plain_len(s, i, total, ascii);
        need = k == 0;
        i += k;
    }
    if (!need)
        return whole;
    /* At most 4 bytes out per byte in, plus the quotes. */
    char *out = malloc(4 * total + 3);
    if (!out) {
        free(whole);
        return NULL;
    }
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < total;) {
        size_t k = plain_len(s, i, total, ascii);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        char l = letter(s[i]);
        if (l) {
            out[o++] = '\\';
            out[o++] = l;
        } else {
            o += (size_t)snprintf(out + o, 5, "\\%03o", (unsigned)s[i]);
        }
        i++;
    }
    out[o++] = '"';
    out[o] = '\0';
    free(whole);
    return out;
}
