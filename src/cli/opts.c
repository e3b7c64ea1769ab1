/* opts.c - option value parsers shared by the subcommands, and text → JSON conversion. */
#include "cli/opts.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cleanup.h"

int conch_cli_parse_seconds(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: '%s' is not a number of seconds (e.g. 30, 0.5)", what, s);
    *ret = (uint64_t)llround(v * 1000.0);
    return 0;
}

int conch_cli_parse_count(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v == 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is not a positive number",
                              what, s);
    *ret = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at @p (at most @n bytes), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80)
        return 1;
    size_t len;
    unsigned min;
    unsigned cp;
    if ((p[0] & 0xe0) == 0xc0) {
        len = 2, min = 0x80, cp = p[0] & 0x1f;
    } else if ((p[0] & 0xf0) == 0xe0) {
        len = 3, min = 0x800, cp = p[0] & 0x0f;
    } else if ((p[0] & 0xf8) == 0xf0) {
        len = 4, min = 0x10000, cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void *conch_cli_json_text(const char *buf, size_t len)
{
    _cleanup_free_ char *clean = malloc(len * 3 + 1);
    if (!clean)
        return NULL;
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)buf;
    for (size_t i = 0; i < len;) {
        size_t s = utf8_seq(p + i, len - i);
        if (s == 0) {
            memcpy(clean + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy(clean + o, p + i, s);
            o += s;
            i += s;
        }
    }
    return json_stringn(clean, o);
}
