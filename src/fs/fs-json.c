/* fs-json.c - a fast check that bytes are exactly one JSON object, fit to be spliced as
 * they are into a JSON-RPC line: the daemon forwards a file worker's answer without
 * parsing it into a tree and writing it out again, once this check passes. The check is
 * stricter than JSON (see conch_fs_json_object_check): whatever it does not accept takes
 * the slow path, which parses the answer with jansson and serialises it anew. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/utf8.h"
#include "fs/fs.h"

/* Nesting deeper than this (fs results are 3 levels deep) takes the slow path. */
#define MAX_DEPTH 32
/* Keys of one object compared for duplicates; an object with more takes the slow path. */
#define MAX_KEYS 32

struct key {
    const char *s;
    size_t n;
};

struct level {
    bool object;
    unsigned nkeys;
    struct key keys[MAX_KEYS];
};

/* Bytes that may stand for themselves inside a string: printable ASCII but '"' and '\\'. */
static bool plain(unsigned char c)
{
    return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The string starting at s[*i] == '"': past its closing quote. *@escaped: it had escapes. */
static bool scan_string(const unsigned char *s, size_t n, size_t *i, bool *escaped)
{
    size_t p = *i + 1;
    *escaped = false;
    for (;;) {
        while (p < n && plain(s[p]))
            p++;
        if (p >= n)
            return false;
        unsigned char c = s[p];
        if (c == '"') {
            *i = p + 1;
            return true;
        }
        if (c == '\\') {
            *escaped = true;
            if (p + 1 >= n)
                return false;
            unsigned char e = s[p + 1];
            if (e == 'u') {
                if (p + 6 > n)
                    return false;
                unsigned v = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(s[p + k]);
                    if (h < 0)
                        return false;
                    v = v << 4 | (unsigned)h;
                }
                /* Surrogates (paired or not): the slow path judges them. */
                if (v >= 0xd800 && v <= 0xdfff)
                    return false;
                p += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                p += 2;
            } else {
                return false;
            }
            continue;
        }
        if (c < 0x20)
            return false; /* raw control characters, CR and LF among them */
        size_t k = conch_utf8_seq(s + p, n - p);
        if (!k)
            return false;
        p += k;
    }
}

static bool scan_number(const unsigned char *s, size_t n, size_t *i)
{
    size_t p = *i;
    if (p < n && s[p] == '-')
        p++;
    if (p >= n)
        return false;
    if (s[p] == '0')
        p++;
    else if (s[p] >= '1' && s[p] <= '9')
        while (p < n && s[p] >= '0' && s[p] <= '9')
            p++;
    else
        return false;
    if (p < n && s[p] == '.') {
        size_t d = ++p;
        while (p < n && s[p] >= '0' && s[p] <= '9')
            p++;
        if (p == d)
            return false;
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < n && (s[p] == '+' || s[p] == '-'))
            p++;
        size_t d = p;
        while (p < n && s[p] >= '0' && s[p] <= '9')
            p++;
        if (p == d)
            return false;
    }
    *i = p;
    return true;
}

static void skip_ws(const unsigned char *s, size_t n, size_t *i)
{
    while (*i < n && (s[*i] == ' ' || s[*i] == '\t'))
        (*i)++;
}

bool conch_fs_json_object_check(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    struct level stack[MAX_DEPTH];
    int depth = 0;
    size_t i = 0;
    skip_ws(s, n, &i);
    if (i >= n || s[i] != '{')
        return false;
    /* Each turn: at the start of a value (or of a key, in an object). */
    bool want_key = false;
    for (;;) {
        skip_ws(s, n, &i);
        if (i >= n)
            return false;
        unsigned char c = s[i];
        if (c == '{' || c == '[') {
            if (depth == MAX_DEPTH)
                return false;
            struct level *l = &stack[depth++];
            l->object = c == '{';
            l->nkeys = 0;
            i++;
            skip_ws(s, n, &i);
            if (i < n && s[i] == (l->object ? '}' : ']')) {
                depth--;
                i++;
                goto after_value;
            }
            if (l->object) {
                want_key = true;
                continue;
            }
            continue;
        }
        if (want_key) {
            struct level *l = &stack[depth - 1];
            bool escaped;
            size_t k0 = i;
            if (c != '"' || !scan_string(s, n, &i, &escaped) || escaped || l->nkeys == MAX_KEYS)
                return false;
            struct key key = {text + k0 + 1, i - k0 - 2};
            for (unsigned k = 0; k < l->nkeys; k++)
                if (l->keys[k].n == key.n && !memcmp(l->keys[k].s, key.s, key.n))
                    return false; /* a duplicate key */
            l->keys[l->nkeys++] = key;
            skip_ws(s, n, &i);
            if (i >= n || s[i] != ':')
                return false;
            i++;
            want_key = false;
            continue;
        }
        if (c == '"') {
            bool escaped;
            if (!scan_string(s, n, &i, &escaped))
                return false;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (!scan_number(s, n, &i))
                return false;
        } else if (n - i >= 4 && !memcmp(s + i, "true", 4)) {
            i += 4;
        } else if (n - i >= 5 && !memcmp(s + i, "false", 5)) {
            i += 5;
        } else if (n - i >= 4 && !memcmp(s + i, "null", 4)) {
            i += 4;
        } else {
            return false;
        }
    after_value:
        /* After a value: a comma, or the end of its container(s). */
        for (;;) {
            if (depth == 0) {
                skip_ws(s, n, &i);
                return i == n;
            }
            skip_ws(s, n, &i);
            if (i >= n)
                return false;
            struct level *l = &stack[depth - 1];
            if (s[i] == ',') {
                i++;
                want_key = l->object;
                break;
            }
            if (s[i] != (l->object ? '}' : ']'))
                return false;
            i++;
            depth--;
        }
    }
}
