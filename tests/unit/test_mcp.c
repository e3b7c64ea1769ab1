/* test_mcp.c - unit tests of conch mcp's line handling (src/mcp/lines.c): the cap on a tool
 * result's text, line buffers with a length cap, and finding the id of an oversize request. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/utf8.h"
#include "mcp/mcp-internal.h"

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = conch_utf8_seq((const unsigned char *)s + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

Test(mcp, cap_text_short_is_a_copy)
{
    size_t n = 0;
    char *t = conch_mcp_cap_text("hello", 5, 5, &n);
    cr_assert_eq(n, 5);
    cr_assert_str_eq(t, "hello");
    free(t);
}

Test(mcp, cap_text_keeps_head_and_tail_around_a_note)
{
    char big[10000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    size_t n = 0;
    char *t = conch_mcp_cap_text(big, sizeof(big), 1000, &n);
    cr_assert_eq(strlen(t), n);
    cr_assert(!memcmp(t, big, 750), "the first three quarters of the cap are the head");
    cr_assert(!memcmp(t + n - 250, big + sizeof(big) - 250, 250), "the last quarter the tail");
    cr_assert(strstr(t, "[... 9000 bytes left out here: the result was 10000 bytes, more than "
                        "the 1000 this server returns"),
              "%s", t);
    free(t);
}

Test(mcp, cap_text_never_splits_a_utf8_sequence)
{
    /* 3-byte characters (U+20AC), so a cut at a multiple of the cap lands mid-sequence. */
    size_t len = 3 * 5000;
    char *s = malloc(len);
    for (size_t i = 0; i < len; i += 3)
        memcpy(s + i, "\xe2\x82\xac", 3);
    for (size_t max = 100; max < 110; max++) {
        size_t n = 0;
        char *t = conch_mcp_cap_text(s, len, max, &n);
        cr_assert(valid_utf8(t, n), "cap %zu cut a character", max);
        json_t *j = json_stringn(t, n);
        cr_assert(j != NULL);
        json_decref(j);
        free(t);
    }
    free(s);
}

struct seen {
    char lines[8][64];
    int n;
    json_t *too_large_id;
    int too_large;
};

static void on_line(void *ctx, const char *line, size_t len)
{
    struct seen *s = ctx;
    cr_assert_lt(s->n, 8);
    snprintf(s->lines[s->n++], sizeof(s->lines[0]), "%.*s", (int)len, line);
}

static void on_too_large(void *ctx, struct mcp_linebuf *b)
{
    struct seen *s = ctx;
    s->too_large++;
    json_decref(s->too_large_id);
    s->too_large_id = conch_mcp_sniff_id(b);
}

/* Feed @data through a pipe in chunks of @chunk bytes. */
static void feed(struct mcp_linebuf *b, struct seen *s, const char *data, size_t chunk)
{
    size_t len = strlen(data);
    for (size_t off = 0; off < len; off += chunk) {
        int p[2];
        cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
        size_t n = len - off < chunk ? len - off : chunk;
        cr_assert_eq(write(p[1], data + off, n), (ssize_t)n);
        close(p[1]);
        while (conch_mcp_linebuf_fill(b, p[0]) > 0)
            conch_mcp_linebuf_lines(b, s, on_line, on_too_large);
        close(p[0]);
    }
}

Test(mcp, lines_split_trim_and_skip_empty)
{
    struct mcp_linebuf b = {.max = 1024};
    struct seen s = {0};
    feed(&b, &s, "  {\"a\":1}\r\n\n\t\n{\"b\":2}\n{\"c\"", 3);
    cr_assert_eq(s.n, 2);
    cr_assert_str_eq(s.lines[0], "{\"a\":1}");
    cr_assert_str_eq(s.lines[1], "{\"b\":2}");
    feed(&b, &s, ":3}\n", 100);
    cr_assert_eq(s.n, 3);
    cr_assert_str_eq(s.lines[2], "{\"c\":3}");
    cr_assert_eq(s.too_large, 0);
    free(b.buf);
}

static char *oversize(const char *before, const char *after, size_t fill)
{
    size_t n = strlen(before) + fill + strlen(after) + 2;
    char *s = malloc(n);
    strcpy(s, before);
    memset(s + strlen(before), 'x', fill);
    strcpy(s + strlen(before) + fill, after);
    strcat(s, "\n");
    return s;
}

Test(mcp, oversize_line_is_dropped_and_its_id_found)
{
    struct {
        const char *before, *after;
        json_t *want;
    } cases[] = {
        /* id first, as conch's own clients write it */
        {"{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"tools/call\",\"params\":{\"c\":\"", "\"}}",
         json_integer(42)},
        /* id last, as the MCP SDK writes it */
        {"{\"method\":\"tools/call\",\"params\":{\"c\":\"", "\"},\"jsonrpc\":\"2.0\",\"id\":7}",
         json_integer(7)},
        {"{\"method\":\"x\",\"params\":{\"c\":\"", "\"}, \"id\" : \"req-9\" }",
         json_string("req-9")},
        /* an "id" inside a nested value or a string is not the request's */
        {"{\"method\":\"x\",\"params\":{\"id\":5,\"c\":\"", "\"}}", NULL},
        {"{\"method\":\"x\",\"params\":{\"c\":\"", "\\\"id\\\":3\"}}", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        struct mcp_linebuf b = {.max = 64 * 1024};
        struct seen s = {0};
        char *line = oversize(cases[i].before, cases[i].after, 300 * 1024);
        feed(&b, &s, line, 50000);
        free(line);
        feed(&b, &s, "{\"next\":1}\n", 100);
        cr_assert_eq(s.too_large, 1, "case %zu", i);
        cr_assert_eq(s.n, 1, "case %zu: the line after it is read", i);
        cr_assert_str_eq(s.lines[0], "{\"next\":1}");
        if (cases[i].want)
            cr_assert(json_equal(s.too_large_id, cases[i].want), "case %zu", i);
        else
            cr_assert_null(s.too_large_id, "case %zu", i);
        json_decref(s.too_large_id);
        json_decref(cases[i].want);
        free(b.buf);
    }
}
