/* lines.c - newline-delimited JSON for `conch mcp`: line buffers with a cap that still find
 * the id of an oversize request, and the cap on a tool result's text. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mcp/mcp-internal.h"

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

static size_t utf8_back(const char *s, size_t i)
{
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

char *conch_mcp_cap_text(const char *s, size_t len, size_t max, size_t *ret_len)
{
    if (len <= max) {
        char *d = malloc(len + 1);
        if (!d)
            return NULL;
        memcpy(d, s, len);
        d[len] = '\0';
        *ret_len = len;
        return d;
    }
    size_t head = utf8_back(s, max * 3 / 4);
    size_t tail_start = utf8_back(s, len - (max - max * 3 / 4));
    if (tail_start < head)
        tail_start = head;
    char note[256];
    int nn = snprintf(note, sizeof(note),
                      "\n\n[... %zu bytes left out here: the result was %zu bytes, more than "
                      "the %zu this server returns; ask for less (a line range, a narrower "
                      "pattern, or redirect the output to a file and read parts of it) ...]\n\n",
                      tail_start - head, len, max);
    size_t tail = len - tail_start;
    char *d = malloc(head + (size_t)nn + tail + 1);
    if (!d)
        return NULL;
    memcpy(d, s, head);
    memcpy(d + head, note, (size_t)nn);
    memcpy(d + head + (size_t)nn, s + tail_start, tail);
    *ret_len = head + (size_t)nn + tail;
    d[*ret_len] = '\0';
    return d;
}

int conch_mcp_linebuf_fill(struct mcp_linebuf *b, int fd)
{
    if (b->cap - b->len < 65536) {
        size_t cap = b->cap ? b->cap * 2 : 131072;
        char *nb = realloc(b->buf, cap);
        if (!nb)
            return -ENOMEM;
        b->buf = nb;
        b->cap = cap;
    }
    ssize_t got = read(fd, b->buf + b->len, b->cap - b->len);
    if (got < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : -errno;
    if (got == 0)
        return 0;
    b->len += (size_t)got;
    return 1;
}

/* Keep the last MCP_SNIFF bytes of an oversize line (its id may come last, as the MCP SDK
 * serialises requests). */
static void tail_add(struct mcp_linebuf *b, const char *p, size_t n)
{
    if (n >= MCP_SNIFF) {
        memcpy(b->tail, p + n - MCP_SNIFF, MCP_SNIFF);
        b->tail_len = MCP_SNIFF;
        return;
    }
    size_t keep = b->tail_len + n > MCP_SNIFF ? MCP_SNIFF - n : b->tail_len;
    memmove(b->tail, b->tail + b->tail_len - keep, keep);
    memcpy(b->tail + keep, p, n);
    b->tail_len = keep + n;
}

/*
 * Hand every complete line to @fn. A line longer than b->max is not kept: its first and last
 * MCP_SNIFF bytes go to @too_large once its end arrives, so that its id can still be answered.
 */
void conch_mcp_linebuf_lines(struct mcp_linebuf *b, void *ctx,
                             void (*fn)(void *ctx, const char *line, size_t len),
                             void (*too_large)(void *ctx, struct mcp_linebuf *b))
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(b->buf + start, '\n', b->len - start);
        if (!nl)
            break;
        size_t end = (size_t)(nl - b->buf);
        if (b->skipping) {
            tail_add(b, b->buf + start, end - start);
            b->skipping = false;
            too_large(ctx, b);
        } else {
            size_t s = start, e = end;
            while (s < e && is_blank(b->buf[s]))
                s++;
            while (e > s && is_blank(b->buf[e - 1]))
                e--;
            if (e > s)
                fn(ctx, b->buf + s, e - s);
        }
        start = end + 1;
    }
    memmove(b->buf, b->buf + start, b->len - start);
    b->len -= start;
    if (b->skipping) {
        tail_add(b, b->buf, b->len);
        b->len = 0;
    } else if (b->len > b->max) {
        b->head_len = b->len < MCP_SNIFF ? b->len : MCP_SNIFF;
        memcpy(b->head, b->buf, b->head_len);
        b->tail_len = 0;
        tail_add(b, b->buf, b->len);
        b->skipping = true;
        b->len = 0;
    }
    /* Give back what a large line took. */
    if (b->len == 0 && b->cap > (1u << 20)) {
        free(b->buf);
        b->buf = NULL;
        b->cap = 0;
    }
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (is_blank(*p) || *p == '\n'))
        p++;
    return p;
}

/* Past the JSON string starting at @p ('"'), or NULL when it does not end before @end. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

/* The id (a JSON integer or string) that starts at @p, or NULL. */
static json_t *id_at(const char *p, const char *end)
{
    const char *q = p;
    if (q < end && *q == '"') {
        q = skip_string(q, end);
    } else {
        while (q < end && (*q == '-' || (*q >= '0' && *q <= '9')))
            q++;
    }
    if (!q || q == p)
        return NULL;
    json_t *id = json_loadb(p, (size_t)(q - p), JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (id && !json_is_integer(id) && !json_is_string(id)) {
        json_decref(id);
        id = NULL;
    }
    return id;
}

/* The top-level "id" of the object that @s (a line's first bytes) starts, when it comes
 * before the cut; NULL otherwise. Skips other members' values, nested ones included. */
static json_t *sniff_head(const char *s, size_t n)
{
    const char *p = s, *end = s + n;
    p = skip_ws(p, end);
    if (p >= end || *p++ != '{')
        return NULL;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"')
            return NULL;
        const char *k = p;
        p = skip_string(p, end);
        if (!p)
            return NULL;
        bool is_id = p - k == 4 && !memcmp(k, "\"id\"", 4);
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':')
            return NULL;
        p = skip_ws(p, end);
        if (is_id)
            return id_at(p, end);
        int depth = 0;
        while (p < end) {
            if (*p == '"') {
                p = skip_string(p, end);
                if (!p)
                    return NULL;
                continue;
            }
            if (*p == '{' || *p == '[')
                depth++;
            else if (*p == '}' || *p == ']')
                depth--;
            else if (*p == ',' && depth == 0)
                break;
            if (depth < 0)
                return NULL;
            p++;
        }
        if (p >= end)
            return NULL;
        p++; /* the ',' */
    }
}

/* The "id" that ends the object in @s (a line's last bytes): `..., "id": 7}`. */
static json_t *sniff_tail(const char *s, size_t n)
{
    const char *end = s + n;
    while (end > s && is_blank(end[-1]))
        end--;
    if (end == s || *--end != '}')
        return NULL;
    while (end > s && is_blank(end[-1]))
        end--;
    const char *v = end;
    if (v > s && v[-1] == '"') {
        v--;
        while (v > s && v[-1] != '"')
            v--;
        if (v == s)
            return NULL;
        v--;
    } else {
        while (v > s && (v[-1] == '-' || (v[-1] >= '0' && v[-1] <= '9')))
            v--;
    }
    if (v == end)
        return NULL;
    const char *p = v;
    while (p > s && is_blank(p[-1]))
        p--;
    if (p == s || *--p != ':')
        return NULL;
    while (p > s && is_blank(p[-1]))
        p--;
    if (p - s < 5 || memcmp(p - 4, "\"id\"", 4) ||
        (p[-5] != ',' && p[-5] != '{' && !is_blank(p[-5])))
        return NULL;
    return id_at(v, end);
}

json_t *conch_mcp_sniff_id(const struct mcp_linebuf *b)
{
    json_t *id = sniff_head(b->head, b->head_len);
    return id ? id : sniff_tail(b->tail, b->tail_len);
}
