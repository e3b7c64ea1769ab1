/* strbuf.c - the growing string buffer of strbuf.h. */
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(struct conch_sb *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *n = realloc(b->buf, cap);
    if (!n) {
        b->oom = true;
        return false;
    }
    b->buf = n;
    b->cap = cap;
    return true;
}

void conch_sb_putn(struct conch_sb *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    if (n) /* @s may be NULL when @n is 0 */
        memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

void conch_sb_puts(struct conch_sb *b, const char *s)
{
    conch_sb_putn(b, s, strlen(s));
}

void conch_sb_printf(struct conch_sb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void conch_sb_trunc(struct conch_sb *b, size_t len)
{
    if (b->buf && len < b->len) {
        b->len = len;
        b->buf[len] = '\0';
    }
}

char *conch_sb_take(struct conch_sb *b)
{
    if (!b->oom && !b->buf)
        reserve(b, 0);
    if (b->oom) {
        conch_sb_done(b);
        return NULL;
    }
    char *s = b->buf;
    s[b->len] = '\0';
    b->buf = NULL;
    b->len = b->cap = 0;
    return s;
}

void conch_sb_done(struct conch_sb *b)
{
    free(b->buf);
    b->buf = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}
