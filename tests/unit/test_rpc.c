/* test_rpc.c - unit tests for src/rpc: line framing (split, joined, CRLF, empty, oversize),
 * responses and error objects, serialisation, and dispatch: every error path, id types,
 * notifications, async replies, batches, and closing a sink with calls outstanding. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/fdpass.h"
#include "rpc/rpc.h"

/* ---- framing ---------------------------------------------------------------------------- */

struct lines {
    char *got[16];
    size_t len[16];
    size_t n;
    int oversize;
};

static void on_line(void *ctx, const char *line, size_t len)
{
    struct lines *l = ctx;
    cr_assert_lt(l->n, 16);
    l->got[l->n] = malloc(len + 1);
    memcpy(l->got[l->n], line, len);
    l->got[l->n][len] = '\0';
    l->len[l->n++] = len;
}

static void on_oversize(void *ctx)
{
    ((struct lines *)ctx)->oversize++;
}

static void lines_free(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->got[i]);
}

static void feed(struct conch_rpc_framer *f, struct lines *l, const char *s)
{
    cr_assert_eq(conch_rpc_framer_feed(f, s, strlen(s), on_line, on_oversize, l), 0);
}

Test(framer, joined_lines_in_one_feed)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 64);
    feed(&f, &l, "a\nbb\nccc\n");
    cr_assert_eq(l.n, 3);
    cr_assert_str_eq(l.got[0], "a");
    cr_assert_str_eq(l.got[1], "bb");
    cr_assert_str_eq(l.got[2], "ccc");
    cr_assert_eq(conch_rpc_framer_pending(&f), 0);
    lines_free(&l);
    conch_rpc_framer_done(&f);
}

Test(framer, line_split_across_feeds)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 64);
    feed(&f, &l, "{\"a\"");
    cr_assert_eq(l.n, 0);
    cr_assert_eq(conch_rpc_framer_pending(&f), 4);
    feed(&f, &l, ":1}\nx");
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.got[0], "{\"a\":1}");
    cr_assert_eq(conch_rpc_framer_pending(&f), 1);
    feed(&f, &l, "y\n");
    cr_assert_eq(l.n, 2);
    cr_assert_str_eq(l.got[1], "xy");
    lines_free(&l);
    conch_rpc_framer_done(&f);
}

Test(framer, one_byte_at_a_time)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 64);
    const char *s = "hello\r\nworld\n\n";
    for (size_t i = 0; s[i]; i++)
        cr_assert_eq(conch_rpc_framer_feed(&f, s + i, 1, on_line, on_oversize, &l), 0);
    cr_assert_eq(l.n, 2);
    cr_assert_str_eq(l.got[0], "hello");
    cr_assert_str_eq(l.got[1], "world");
    lines_free(&l);
    conch_rpc_framer_done(&f);
}

Test(framer, crlf_and_empty_lines)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 64);
    feed(&f, &l, "\n\r\n\nabc\r\n\n\r\n");
    feed(&f, &l, "a\rb\n"); /* only a trailing \r is stripped */
    feed(&f, &l, "def\r");
    feed(&f, &l, "\n"); /* \r\n split across feeds */
    cr_assert_eq(l.n, 3);
    cr_assert_str_eq(l.got[0], "abc");
    cr_assert_str_eq(l.got[1], "a\rb");
    cr_assert_str_eq(l.got[2], "def");
    cr_assert_eq(l.oversize, 0);
    lines_free(&l);
    conch_rpc_framer_done(&f);
}

Test(framer, nul_bytes_pass_through)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 64);
    cr_assert_eq(conch_rpc_framer_feed(&f, "a\0b\n", 4, on_line, on_oversize, &l), 0);
    cr_assert_eq(l.n, 1);
    cr_assert_eq(l.len[0], 3);
    cr_assert_eq(memcmp(l.got[0], "a\0b", 3), 0);
    lines_free(&l);
    conch_rpc_framer_done(&f);
}

Test(framer, oversize_in_one_feed)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 8);
    feed(&f, &l, "12345678\n123456789\nok\n12345678\r\n123456789\r\n");
    cr_assert_eq(l.oversize, 2);
    cr_assert_eq(l.n, 3);
    cr_assert_str_eq(l.got[0], "12345678"); /* exactly the maximum is fine */
    cr_assert_str_eq(l.got[1], "ok");
    cr_assert_str_eq(l.got[2], "12345678"); /* the \r does not count */
    lines_free(&l);
    conch_rpc_framer_done(&f);
}

Test(framer, oversize_across_feeds_is_reported_once_and_not_buffered)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 8);
    feed(&f, &l, "12345");
    feed(&f, &l, "67890");
    cr_assert_eq(l.oversize, 1, "reported as soon as it is known");
    cr_assert_eq(conch_rpc_framer_pending(&f), 0);
    for (int i = 0; i < 1000; i++) {
        feed(&f, &l, "abcdefghijklmnopqrstuvwxyz");
        cr_assert_eq(conch_rpc_framer_pending(&f), 0);
    }
    cr_assert_leq(f.cap, 9, "memory stays bounded by max_message");
    feed(&f, &l, "tail\nok\n");
    cr_assert_eq(l.oversize, 1);
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.got[0], "ok");
    /* An oversize line completed in the feed that made it too long. */
    feed(&f, &l, "1234");
    feed(&f, &l, "56789\nnext\n");
    cr_assert_eq(l.oversize, 2);
    cr_assert_eq(l.n, 2);
    cr_assert_str_eq(l.got[1], "next");
    /* 9 bytes then \r\n split: the \r decides it is in fact 9 bytes, too long. */
    feed(&f, &l, "123456789");
    feed(&f, &l, "\r\n");
    cr_assert_eq(l.oversize, 3);
    cr_assert_eq(l.n, 2);
    lines_free(&l);
    conch_rpc_framer_done(&f);
    cr_assert_eq(conch_rpc_framer_pending(&f), 0);
}

Test(framer, done_drops_partial_line)
{
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 1 << 20);
    feed(&f, &l, "partial");
    cr_assert_eq(conch_rpc_framer_pending(&f), 7);
    conch_rpc_framer_done(&f);
    cr_assert_eq(conch_rpc_framer_pending(&f), 0);
    cr_assert_eq(l.n, 0);
}

/* ---- messages --------------------------------------------------------------------------- */

Test(message, result_copies_id_and_steals_result)
{
    json_t *id = json_string("req-1");
    json_t *msg = conch_rpc_result(id, json_pack("{si}", "x", 1));
    json_decref(id); /* copied: the message does not depend on it */
    cr_assert_str_eq(json_string_value(json_object_get(msg, "jsonrpc")), "2.0");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "id")), "req-1");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(msg, "result"), "x")), 1);
    cr_assert_null(json_object_get(msg, "error"));
    json_decref(msg);

    msg = conch_rpc_result(NULL, NULL);
    cr_assert(json_is_null(json_object_get(msg, "id")));
    cr_assert(json_is_null(json_object_get(msg, "result")));
    json_decref(msg);
}

static json_t *err_data(json_t *msg)
{
    return json_object_get(json_object_get(msg, "error"), "data");
}

static int err_code(json_t *msg)
{
    json_t *e = json_object_get(msg, "error");
    cr_assert_not_null(e, "not an error response");
    return (int)json_integer_value(json_object_get(e, "code"));
}

static const char *err_str(json_t *msg, const char *key)
{
    return json_string_value(json_object_get(err_data(msg), key));
}

static const char *err_msg(json_t *msg)
{
    return json_string_value(json_object_get(json_object_get(msg, "error"), "message"));
}

Test(message, error_object)
{
    json_t *id = json_integer(7);
    json_t *msg = conch_rpc_error(id, CONCH_RPC_INFRASTRUCTURE, "infrastructure",
                                  "mount overlay: EPERM", NULL);
    json_decref(id);
    cr_assert_eq(json_integer_value(json_object_get(msg, "id")), 7);
    cr_assert_eq(err_code(msg), -32001);
    cr_assert_str_eq(err_msg(msg), "mount overlay: EPERM");
    cr_assert_str_eq(err_str(msg, "code"), "infrastructure");
    cr_assert_str_eq(err_str(msg, "kind"), "infrastructure");
    cr_assert_null(json_object_get(msg, "result"));
    json_decref(msg);

    /* extra data merged; it may set kind but never code */
    msg = conch_rpc_error(NULL, CONCH_RPC_AMBIGUOUS_MATCH, "ambiguous_match", "twice",
                          json_pack("{sisssb}", "occurrences", 2, "code", "evil", "x", 1));
    cr_assert(json_is_null(json_object_get(msg, "id")));
    cr_assert_str_eq(err_str(msg, "code"), "ambiguous_match");
    cr_assert_str_eq(err_str(msg, "kind"), "usage");
    cr_assert_eq(json_integer_value(json_object_get(err_data(msg), "occurrences")), 2);
    json_decref(msg);

    msg = conch_rpc_error(NULL, CONCH_RPC_LIMIT, NULL, NULL, json_pack("{ss}", "kind", "x"));
    cr_assert_str_eq(err_str(msg, "code"), "limit");
    cr_assert_str_eq(err_str(msg, "kind"), "x");
    cr_assert_str_eq(err_msg(msg), "error");
    json_decref(msg);

    /* code 0: from the data code; a NULL data code: the default for the code */
    msg = conch_rpc_error(NULL, 0, "file_not_found", "no 'a'", NULL);
    cr_assert_eq(err_code(msg), -32010);
    json_decref(msg);
    msg = conch_rpc_error(NULL, CONCH_RPC_PARSE_ERROR, NULL, "bad", NULL);
    cr_assert_str_eq(err_str(msg, "code"), "parse_error");
    cr_assert_str_eq(err_str(msg, "kind"), "usage");
    json_decref(msg);
    msg = conch_rpc_error(NULL, CONCH_RPC_INTERNAL_ERROR, NULL, "bug", NULL);
    cr_assert_str_eq(err_str(msg, "code"), "internal_error");
    cr_assert_str_eq(err_str(msg, "kind"), "internal");
    json_decref(msg);
    msg = conch_rpc_error(NULL, CONCH_RPC_INVALID_REQUEST, "message_too_large", "big", NULL);
    cr_assert_eq(err_code(msg), -32600);
    cr_assert_str_eq(err_str(msg, "code"), "message_too_large");
    json_decref(msg);
}

Test(message, invalid_utf8_in_message_is_replaced)
{
    json_t *msg = conch_rpc_error(NULL, CONCH_RPC_FILE_NOT_FOUND, NULL, "no '\xff\xc3xé'", NULL);
    cr_assert_not_null(msg);
    cr_assert_str_eq(err_msg(msg), "no '\xef\xbf\xbd\xef\xbf\xbdxé'"); /* U+FFFD, as everywhere */
    json_decref(msg);
}

Test(message, code_for)
{
    static const struct {
        const char *s;
        int code;
    } t[] = {
        {"parse_error", -32700},
        {"invalid_request", -32600},
        {"message_too_large", -32600},
        {"method_not_found", -32601},
        {"invalid_params", -32602},
        {"internal_error", -32603},
        {"infrastructure", -32001},
        {"sandbox_not_found", -32002},
        {"job_not_found", -32003},
        {"limit", -32004},
        {"sandbox_stopped", -32005},
        {"file_not_found", -32010},
        {"permission_denied", -32011},
        {"is_directory", -32012},
        {"invalid_path", -32013},
        {"not_a_directory", -32014},
        {"string_not_found", -32015},
        {"ambiguous_match", -32016},
        {"too_large", -32017},
        {"no_such_code", -32603},
        {NULL, -32603},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        cr_assert_eq(conch_rpc_code_for(t[i].s), t[i].code, "%s", t[i].s ? t[i].s : "NULL");
}

Test(message, dumps_is_one_compact_utf8_line)
{
    json_t *msg = conch_rpc_result(NULL, json_pack("{s:s%}", "t", "é\n\0x", (size_t)5));
    char *s = conch_rpc_dumps(msg);
    cr_assert_str_eq(s, "{\"jsonrpc\":\"2.0\",\"id\":null,\"result\":{\"t\":\"é\\n\\u0000x\"}}\n");
    free(s);
    json_decref(msg);
    cr_assert_null(conch_rpc_dumps(NULL));
}

/* ---- dispatch --------------------------------------------------------------------------- */

static json_t *sent; /* every message sent, decoded back from its line */
static struct conch_rpc_call *stored[16];
static size_t nstored;
static int ran; /* handler invocations */
static json_t *last_params;

static void capture(void *ctx, json_t *msg)
{
    cr_assert_eq(ctx, &sent);
    char *line = conch_rpc_dumps(msg);
    cr_assert_not_null(line);
    size_t n = strlen(line);
    cr_assert(n > 1 && line[n - 1] == '\n');
    cr_assert_null(memchr(line, '\n', n - 1), "one message, one line");
    json_error_t e;
    json_t *back = json_loadb(line, n - 1, JSON_ALLOW_NUL, &e);
    cr_assert_not_null(back, "%s: %s", line, e.text);
    json_array_append_new(sent, back);
    free(line);
    json_decref(msg);
}

static struct conch_rpc_sink *sink;

static void setup(void)
{
    sent = json_array();
    sink = conch_rpc_sink_new(capture, &sent);
    nstored = 0;
    ran = 0;
    last_params = NULL;
}

static void teardown(void)
{
    if (sink)
        conch_rpc_sink_close(sink);
    json_decref(sent);
    json_decref(last_params);
}

static void h_echo(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ran++;
    cr_assert_eq(ctx, (void *)0x1234);
    json_decref(last_params);
    last_params = json_incref(params);
    size_t len = 0;
    const char *t = conch_rpc_strn(params, "text", &len);
    conch_rpc_call_reply(
        call, json_pack("{s:s%,s:I}", "text", t ? t : "", t ? len : 0, "len", (json_int_t)len));
}

static void h_later(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ran++;
    cr_assert_lt(nstored, 16);
    stored[nstored++] = call;
}

static void h_fail(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ran++;
    conch_rpc_call_fail(call, CONCH_RPC_FILE_NOT_FOUND, "file_not_found", "no such file",
                        json_pack("{ss}", "path", "a"));
}

static const struct conch_rpc_param echo_params[] = {
    {.name = "text", .type = CONCH_RPC_STRING, .required = true},
    {.name = "n", .type = CONCH_RPC_INT},
    {.name = "x", .type = CONCH_RPC_NUMBER},
    {.name = "b", .type = CONCH_RPC_BOOL},
    {.name = "o", .type = CONCH_RPC_OBJECT},
    {.name = "a", .type = CONCH_RPC_ARRAY},
    {.name = "any", .type = CONCH_RPC_ANY},
    /* a size: 0 .. 1 MiB */
    {.name = "size", .type = CONCH_RPC_INT, .ranged = true, .min = 0, .max = 1048576},
    /* a time: 0 (none) or 0.001 .. 3600 s */
    {.name = "secs",
     .type = CONCH_RPC_NUMBER,
     .ranged = true,
     .min = 0,
     .max = 3600,
     .min_nonzero = 0.001},
    {.name = NULL},
};

static const struct conch_rpc_method table[] = {
    {"echo", echo_params, h_echo},
    {"later", NULL, h_later},
    {"fail", NULL, h_fail},
    {NULL, NULL, NULL},
};

static void dispatch_n(const char *line, size_t len)
{
    conch_rpc_dispatch(table, line, len, (void *)0x1234, sink);
}

static void dispatch(const char *line)
{
    dispatch_n(line, strlen(line));
}

/* The only message sent so far. */
static json_t *only(void)
{
    cr_assert_eq(json_array_size(sent), 1, "sent %zu messages", json_array_size(sent));
    return json_array_get(sent, 0);
}

static void expect_error(json_t *msg, int code, const char *data_code)
{
    cr_assert_eq(err_code(msg), code);
    cr_assert_str_eq(err_str(msg, "code"), data_code);
    cr_assert_str_eq(json_string_value(json_object_get(msg, "jsonrpc")), "2.0");
}

static void expect_only_error(const char *line, int code, const char *data_code, bool null_id)
{
    json_array_clear(sent);
    dispatch(line);
    json_t *m = only();
    expect_error(m, code, data_code);
    if (null_id)
        cr_assert(json_is_null(json_object_get(m, "id")), "%s", line);
}

TestSuite(dispatch, .init = setup, .fini = teardown);

Test(dispatch, request_gets_result)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"text\":\"hé\"}}");
    json_t *m = only();
    cr_assert_eq(json_integer_value(json_object_get(m, "id")), 1);
    json_t *r = json_object_get(m, "result");
    cr_assert_str_eq(json_string_value(json_object_get(r, "text")), "hé");
    cr_assert_eq(ran, 1);
}

Test(dispatch, parse_errors)
{
    expect_only_error("{", CONCH_RPC_PARSE_ERROR, "parse_error", true);
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"", CONCH_RPC_PARSE_ERROR,
                      "parse_error", true);
    expect_only_error("nope", CONCH_RPC_PARSE_ERROR, "parse_error", true);
    expect_only_error("{\"a\":\"\xff\"}", CONCH_RPC_PARSE_ERROR, "parse_error", true);
    expect_only_error("{\"a\":99999999999999999999999}", CONCH_RPC_PARSE_ERROR, "parse_error",
                      true);
    /* the message is still valid UTF-8 even when it quotes bad input */
    cr_assert_not_null(err_msg(only()));
    cr_assert_eq(ran, 0);
}

Test(dispatch, invalid_requests)
{
    expect_only_error("[]", CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    expect_only_error("1", CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    expect_only_error("\"x\"", CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"echo\"}",
                      CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    expect_only_error("{\"id\":1,\"method\":\"echo\"}", CONCH_RPC_INVALID_REQUEST,
                      "invalid_request", false);
    cr_assert_eq(json_integer_value(json_object_get(only(), "id")), 1, "valid id is echoed");
    expect_only_error("{\"jsonrpc\":\"1.0\",\"id\":\"a\",\"method\":\"echo\"}",
                      CONCH_RPC_INVALID_REQUEST, "invalid_request", false);
    cr_assert_str_eq(json_string_value(json_object_get(only(), "id")), "a");
    expect_only_error("{\"jsonrpc\":2.0,\"id\":1,\"method\":\"echo\"}", CONCH_RPC_INVALID_REQUEST,
                      "invalid_request", false);
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":1}", CONCH_RPC_INVALID_REQUEST,
                      "invalid_request", false);
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":7}", CONCH_RPC_INVALID_REQUEST,
                      "invalid_request", false);
    /* Not a valid request at all: answered even without an id. */
    expect_only_error("{\"method\":\"echo\"}", CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    expect_only_error("{}", CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    cr_assert_eq(ran, 0);
}

Test(dispatch, id_types)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"method\":\"echo\",\"params\":{\"text\":\"\"}}");
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":-42,\"method\":\"echo\",\"params\":{\"text\":\"\"}}");
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"echo\",\"params\":{\"text\":\"\"}}");
    cr_assert_eq(json_array_size(sent), 3);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(sent, 0), "id")), "abc");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(sent, 1), "id")), -42);
    cr_assert(json_is_null(json_object_get(json_array_get(sent, 2), "id")));
    cr_assert_not_null(json_object_get(json_array_get(sent, 2), "result"), "id null is a request");
    cr_assert_eq(ran, 3);

    const char *bad[] = {"1.5", "true", "{}", "[1]", "1.0"};
    for (size_t i = 0; i < 5; i++) {
        char line[128];
        snprintf(line, sizeof(line), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"echo\"}", bad[i]);
        expect_only_error(line, CONCH_RPC_INVALID_REQUEST, "invalid_request", true);
    }
    cr_assert_eq(ran, 3);
}

Test(dispatch, notifications_get_no_reply)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"text\":\"x\"}}");
    cr_assert_eq(ran, 1, "the handler runs");
    dispatch("{\"jsonrpc\":\"2.0\",\"method\":\"fail\"}");
    cr_assert_eq(ran, 2);
    /* errors of a well-formed notification are not reported either */
    dispatch("{\"jsonrpc\":\"2.0\",\"method\":\"nope\"}");
    dispatch("{\"jsonrpc\":\"2.0\",\"method\":\"echo\"}");
    dispatch("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":[1]}");
    dispatch("{\"jsonrpc\":\"2.0\",\"method\":\"later\"}");
    cr_assert_eq(nstored, 1);
    cr_assert_null(conch_rpc_call_id(stored[0]));
    conch_rpc_call_reply(stored[0], json_true());
    cr_assert_eq(json_array_size(sent), 0);
    cr_assert_eq(ran, 3);
}

Test(dispatch, unknown_method_names_it)
{
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"sandbox.nope\"}",
                      CONCH_RPC_METHOD_NOT_FOUND, "method_not_found", false);
    cr_assert_eq(json_integer_value(json_object_get(only(), "id")), 3);
    cr_assert_not_null(strstr(err_msg(only()), "sandbox.nope"));
    /* a NUL does not make a prefix match */
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"echo\\u0000x\"}",
                      CONCH_RPC_METHOD_NOT_FOUND, "method_not_found", false);
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ech\"}",
                      CONCH_RPC_METHOD_NOT_FOUND, "method_not_found", false);
    /* long names are cut in the message */
    char line[4096];
    char name[2001];
    memset(name, 'm', 2000);
    name[2000] = '\0';
    snprintf(line, sizeof(line), "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"%s\"}", name);
    expect_only_error(line, CONCH_RPC_METHOD_NOT_FOUND, "method_not_found", false);
    cr_assert_lt(strlen(err_msg(only())), 300);
    cr_assert_eq(ran, 0);
}

static void expect_bad_param(const char *params, const char *param)
{
    char line[512];
    snprintf(line, sizeof(line), "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"echo\",\"params\":%s}",
             params);
    expect_only_error(line, CONCH_RPC_INVALID_PARAMS, "invalid_params", false);
    cr_assert_eq(json_integer_value(json_object_get(only(), "id")), 9);
    if (param)
        cr_assert_str_eq(err_str(only(), "param"), param, "%s", params);
    else
        cr_assert_null(json_object_get(err_data(only()), "param"));
    cr_assert_str_eq(err_str(only(), "kind"), "usage");
}

Test(dispatch, params_checked_against_the_table)
{
    expect_bad_param("[\"x\"]", NULL);
    cr_assert_str_eq(err_msg(only()), "params must be an object");
    expect_bad_param("3", NULL);
    expect_bad_param("{}", "text");
    cr_assert_not_null(strstr(err_msg(only()), "missing"));
    expect_bad_param("{\"text\":null}", "text");
    expect_bad_param("{\"text\":1}", "text");
    expect_bad_param("{\"text\":\"\",\"n\":3.0}", "n");
    expect_bad_param("{\"text\":\"\",\"n\":\"3\"}", "n");
    expect_bad_param("{\"text\":\"\",\"x\":\"1\"}", "x");
    expect_bad_param("{\"text\":\"\",\"b\":0}", "b");
    expect_bad_param("{\"text\":\"\",\"o\":[]}", "o");
    expect_bad_param("{\"text\":\"\",\"a\":{}}", "a");
    expect_bad_param("{\"text\":\"\",\"extra\":1}", "extra");
    cr_assert_not_null(strstr(err_msg(only()), "unknown"));
    /* jansson refuses a NUL in a key outright, so such a key can never pass for "n" */
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"text\":\"\","
                      "\"n\\u0000\":1}}",
                      CONCH_RPC_PARSE_ERROR, "parse_error", true);
    cr_assert_eq(ran, 0);

    /* a method without params refuses any */
    expect_only_error("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"fail\",\"params\":{\"a\":1}}",
                      CONCH_RPC_INVALID_PARAMS, "invalid_params", false);
    cr_assert_str_eq(err_str(only(), "param"), "a");
    cr_assert_eq(ran, 0);
}

Test(dispatch, numbers_range_checked)
{
    /* NaN and infinities are not JSON; 1e400 overflows to a parse error in jansson */
    expect_bad_param("{\"text\":\"\",\"size\":-1}", "size");
    cr_assert_not_null(strstr(err_msg(only()), "between 0 and 1048576"), "%s", err_msg(only()));
    cr_assert_eq(json_real_value(json_object_get(err_data(only()), "max")), 1048576.0);
    expect_bad_param("{\"text\":\"\",\"size\":1048577}", "size");
    expect_bad_param("{\"text\":\"\",\"size\":9223372036854775807}", "size");
    expect_bad_param("{\"text\":\"\",\"size\":-9223372036854775807}", "size");
    expect_bad_param("{\"text\":\"\",\"secs\":1e308}", "secs");
    expect_bad_param("{\"text\":\"\",\"secs\":-0.5}", "secs");
    expect_bad_param("{\"text\":\"\",\"secs\":1e-7}", "secs");
    cr_assert_not_null(strstr(err_msg(only()), "must be 0 or between 0.001 and 3600"), "%s",
                       err_msg(only()));
    expect_bad_param("{\"text\":\"\",\"secs\":3600.0001}", "secs");
    cr_assert_eq(ran, 0);
    /* the bounds themselves, 0 and an integer for a number pass */
    const char *ok[] = {"{\"text\":\"\",\"size\":0,\"secs\":0}",
                        "{\"text\":\"\",\"size\":1048576,\"secs\":3600}",
                        "{\"text\":\"\",\"secs\":0.001}", "{\"text\":\"\",\"secs\":5}",
                        "{\"text\":\"\",\"size\":null,\"secs\":null}"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char line[256];
        snprintf(line, sizeof(line),
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":%s}", ok[i]);
        json_array_clear(sent);
        dispatch(line);
        cr_assert_not_null(json_object_get(only(), "result"), "%s", ok[i]);
    }
    cr_assert_eq(ran, 5);
}

Test(dispatch, valid_params_reach_the_handler)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"text\":\"t\","
             "\"n\":-5,\"x\":2,\"b\":false,\"o\":{},\"a\":[],\"any\":null}}");
    cr_assert_not_null(json_object_get(only(), "result"));
    cr_assert_eq(conch_rpc_int(last_params, "n", 0), -5);
    cr_assert_eq(conch_rpc_num(last_params, "x", 0), 2.0);
    cr_assert_eq(conch_rpc_bool(last_params, "b", true), false);
    json_array_clear(sent);
    /* optional params given as null count as absent; a real NUMBER is fine */
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"text\":\"t\","
             "\"n\":null,\"x\":2.5,\"b\":null}}");
    cr_assert_not_null(json_object_get(only(), "result"));
    cr_assert_eq(conch_rpc_int(last_params, "n", 77), 77);
    cr_assert_eq(conch_rpc_num(last_params, "x", 0), 2.5);
    cr_assert_eq(conch_rpc_bool(last_params, "b", true), true);
    json_array_clear(sent);
    /* absent and null params: the handler gets {} */
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"later\"}");
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"later\",\"params\":null}");
    cr_assert_eq(nstored, 2);
    conch_rpc_call_reply(stored[0], json_null());
    conch_rpc_call_reply(stored[1], json_null());
    cr_assert_eq(json_array_size(sent), 2);
}

Test(dispatch, nul_inside_strings_reaches_the_handler)
{
    static const char line[] =
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"text\":\"a\\u0000b\"}}";
    dispatch(line);
    json_t *r = json_object_get(only(), "result");
    cr_assert_eq(json_integer_value(json_object_get(r, "len")), 3);
    cr_assert_eq(json_string_length(json_object_get(r, "text")), 3);
    cr_assert_eq(memcmp(json_string_value(json_object_get(r, "text")), "a\0b", 3), 0);
    size_t len = 0;
    cr_assert_str_eq(conch_rpc_str(last_params, "text", NULL), "a");
    cr_assert_not_null(conch_rpc_strn(last_params, "text", &len));
    cr_assert_eq(len, 3);

    /* a raw NUL byte in the line is not JSON */
    json_array_clear(sent);
    static const char raw[] =
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"text\":\"a\0\"}}";
    dispatch_n(raw, sizeof(raw) - 1);
    expect_error(only(), CONCH_RPC_PARSE_ERROR, "parse_error");
}

Test(dispatch, async_reply_comes_later)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":\"x1\",\"method\":\"later\"}");
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":\"x2\",\"method\":\"later\"}");
    cr_assert_eq(json_array_size(sent), 0);
    cr_assert_eq(nstored, 2);
    cr_assert_str_eq(json_string_value(conch_rpc_call_id(stored[1])), "x2");
    cr_assert_not(conch_rpc_call_cancelled(stored[0]));
    /* any order */
    conch_rpc_call_fail_param(stored[1], "timeout", "timeout must be positive, got %d", -1);
    conch_rpc_call_reply(stored[0], json_pack("{sb}", "ok", 1));
    cr_assert_eq(json_array_size(sent), 2);
    json_t *a = json_array_get(sent, 0), *b = json_array_get(sent, 1);
    cr_assert_str_eq(json_string_value(json_object_get(a, "id")), "x2");
    expect_error(a, CONCH_RPC_INVALID_PARAMS, "invalid_params");
    cr_assert_str_eq(err_str(a, "param"), "timeout");
    cr_assert_str_eq(err_msg(a), "timeout must be positive, got -1");
    cr_assert_str_eq(json_string_value(json_object_get(b, "id")), "x1");
    cr_assert(json_is_true(json_object_get(json_object_get(b, "result"), "ok")));
}

Test(dispatch, reply_with_null_result_is_an_internal_error)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"later\"}");
    conch_rpc_call_reply(stored[0], NULL);
    expect_error(only(), CONCH_RPC_INTERNAL_ERROR, "internal_error");
}

Test(dispatch, fail_variants)
{
    for (int i = 0; i < 5; i++)
        dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"later\"}");
    struct conch_err err;
    conch_err_set(&err, EPERM, "mount overlay on '/workspace': EPERM");
    conch_rpc_call_fail_err(stored[0], 0, NULL, &err);
    conch_err_setk(&err, CONCH_ERR_USAGE, ENOENT, "no sandbox 'sb-1'");
    conch_rpc_call_fail_err(stored[1], 0, "sandbox_not_found", &err);
    conch_err_setk(&err, CONCH_ERR_USAGE, EINVAL, "bad mode");
    conch_rpc_call_fail_err(stored[2], 0, NULL, &err);
    conch_rpc_call_failf(stored[3], 0, "too_large", json_pack("{si}", "limit", 10), "%d > %d", 11,
                         10);
    conch_rpc_call_fail(stored[4], CONCH_RPC_LIMIT, "limit", "too many sandboxes", NULL);
    cr_assert_eq(json_array_size(sent), 5);

    json_t *m = json_array_get(sent, 0);
    expect_error(m, CONCH_RPC_INFRASTRUCTURE, "infrastructure");
    cr_assert_str_eq(err_str(m, "kind"), "infrastructure");
    cr_assert_str_eq(err_msg(m), "mount overlay on '/workspace': EPERM");
    m = json_array_get(sent, 1);
    expect_error(m, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found");
    cr_assert_str_eq(err_str(m, "kind"), "usage");
    m = json_array_get(sent, 2);
    expect_error(m, CONCH_RPC_INVALID_PARAMS, "invalid_params");
    m = json_array_get(sent, 3);
    expect_error(m, CONCH_RPC_TOO_LARGE, "too_large");
    cr_assert_str_eq(err_msg(m), "11 > 10");
    cr_assert_eq(json_integer_value(json_object_get(err_data(m), "limit")), 10);
    m = json_array_get(sent, 4);
    expect_error(m, CONCH_RPC_LIMIT, "limit");
    cr_assert_str_eq(err_str(m, "kind"), "limit");
}

Test(dispatch, batch_answered_once_when_the_last_async_call_completes)
{
    dispatch("["
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"later\"},"
             "{\"jsonrpc\":\"2.0\",\"method\":\"later\"},"
             "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{\"text\":\"t\"}},"
             "{\"foo\":1},"
             "5,"
             "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"nope\"},"
             "{\"jsonrpc\":\"2.0\",\"method\":\"nope\"},"
             "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"text\":\"n\"}},"
             "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"later\"}"
             "]");
    cr_assert_eq(ran, 5);
    cr_assert_eq(nstored, 3);
    cr_assert_eq(json_array_size(sent), 0, "nothing before the last call completes");
    conch_rpc_call_reply(stored[0], json_integer(1));
    conch_rpc_call_reply(stored[1], json_integer(99)); /* the notification */
    cr_assert_eq(json_array_size(sent), 0);
    conch_rpc_call_fail(stored[2], CONCH_RPC_JOB_NOT_FOUND, NULL, "no job", NULL);

    json_t *arr = only();
    cr_assert(json_is_array(arr));
    cr_assert_eq(json_array_size(arr), 6);
    int seen = 0;
    size_t i;
    json_t *m;
    json_array_foreach(arr, i, m)
    {
        json_t *id = json_object_get(m, "id");
        cr_assert_not_null(id);
        if (json_is_null(id)) {
            expect_error(m, CONCH_RPC_INVALID_REQUEST, "invalid_request");
            seen |= 1 << 0;
            continue;
        }
        switch (json_integer_value(id)) {
        case 1:
            cr_assert_eq(json_integer_value(json_object_get(m, "result")), 1);
            seen |= 1 << 1;
            break;
        case 2:
            cr_assert_not_null(json_object_get(m, "result"));
            seen |= 1 << 2;
            break;
        case 3:
            expect_error(m, CONCH_RPC_METHOD_NOT_FOUND, "method_not_found");
            seen |= 1 << 3;
            break;
        case 4:
            expect_error(m, CONCH_RPC_JOB_NOT_FOUND, "job_not_found");
            seen |= 1 << 4;
            break;
        default:
            cr_assert_fail("unexpected id");
        }
    }
    cr_assert_eq(seen, 0x1f);
}

Test(dispatch, batch_of_synchronous_calls)
{
    dispatch("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"fail\"},"
             "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{\"text\":\"\"}}]");
    json_t *arr = only();
    cr_assert_eq(json_array_size(arr), 2);
    expect_error(json_array_get(arr, 0), CONCH_RPC_FILE_NOT_FOUND, "file_not_found");
    cr_assert_str_eq(err_str(json_array_get(arr, 0), "path"), "a");
}

Test(dispatch, batch_of_notifications_sends_nothing)
{
    dispatch("[{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"text\":\"a\"}},"
             "{\"jsonrpc\":\"2.0\",\"method\":\"later\"},"
             "{\"jsonrpc\":\"2.0\",\"method\":\"nope\"}]");
    cr_assert_eq(ran, 2);
    cr_assert_eq(nstored, 1);
    conch_rpc_call_reply(stored[0], json_true());
    cr_assert_eq(json_array_size(sent), 0);
}

Test(dispatch, batch_too_large)
{
    size_t n = 1025;
    char *line = malloc(n * 3 + 2);
    char *p = line;
    *p++ = '[';
    for (size_t i = 0; i < n; i++) {
        memcpy(p, i ? ",{}" : "{}", i ? 3 : 2);
        p += i ? 3 : 2;
    }
    *p++ = ']';
    dispatch_n(line, (size_t)(p - line));
    free(line);
    expect_error(only(), CONCH_RPC_INVALID_REQUEST, "invalid_request");
    cr_assert_eq(json_integer_value(json_object_get(err_data(only()), "limit")), 1024);
}

Test(dispatch, closed_sink_drops_later_replies)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"later\"}");
    dispatch("[{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"later\"},"
             "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"later\"}]");
    cr_assert_eq(nstored, 3);
    conch_rpc_call_reply(stored[1], json_string("half a batch"));
    conch_rpc_sink_close(sink);
    sink = NULL;
    cr_assert(conch_rpc_call_cancelled(stored[0]));
    conch_rpc_call_reply(stored[0], json_string("late"));
    conch_rpc_call_fail(stored[2], CONCH_RPC_INTERNAL_ERROR, NULL, "late",
                        json_pack("{si}", "x", 1));
    cr_assert_eq(json_array_size(sent), 0);
    /* valgrind/ASan: the calls, the batch and the sink are all freed by now */
}

static void close_on_send(void *ctx, json_t *msg)
{
    capture(ctx, msg);
    conch_rpc_sink_close(sink);
    sink = NULL;
}

Test(dispatch, send_may_close_the_sink_mid_batch)
{
    struct conch_rpc_sink *s = conch_rpc_sink_new(close_on_send, &sent);
    conch_rpc_sink_close(sink);
    sink = s;
    /* The first reply of a single request closes the sink from inside send. */
    const char *line = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"fail\"}";
    conch_rpc_dispatch(table, line, strlen(line), NULL, s);
    cr_assert_null(sink);
    cr_assert_eq(json_array_size(sent), 1);
}

Test(dispatch, send_helper_after_close_is_safe_while_calls_hold_it)
{
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"later\"}");
    conch_rpc_sink_send(sink, conch_rpc_error(NULL, 0, "message_too_large", "big", NULL));
    cr_assert_eq(json_array_size(sent), 1);
    expect_error(only(), CONCH_RPC_INVALID_REQUEST, "message_too_large");
    conch_rpc_sink_close(sink);
    sink = NULL;
    conch_rpc_call_reply(stored[0], json_true());
    cr_assert_eq(json_array_size(sent), 1);
}

Test(params, helpers)
{
    json_t *p =
        json_pack("{sssIsfsbsn}", "s", "str", "i", (json_int_t)1LL << 40, "f", 1.5, "b", 1, "z");
    cr_assert_str_eq(conch_rpc_str(p, "s", "d"), "str");
    cr_assert_str_eq(conch_rpc_str(p, "i", "d"), "d");
    cr_assert_str_eq(conch_rpc_str(p, "z", "d"), "d");
    cr_assert_str_eq(conch_rpc_str(p, "missing", "d"), "d");
    cr_assert_null(conch_rpc_str(NULL, "s", NULL));
    cr_assert_eq(conch_rpc_int(p, "i", 0), 1LL << 40);
    cr_assert_eq(conch_rpc_int(p, "f", 3), 3);
    cr_assert_eq(conch_rpc_num(p, "f", 0), 1.5);
    cr_assert_eq(conch_rpc_num(p, "i", 0), (double)(1LL << 40));
    cr_assert_eq(conch_rpc_num(p, "s", 2.5), 2.5);
    cr_assert_eq(conch_rpc_bool(p, "b", false), true);
    cr_assert_eq(conch_rpc_bool(p, "i", false), false);
    size_t len = 99;
    cr_assert_null(conch_rpc_strn(p, "i", &len));
    cr_assert_eq(len, 99);
    json_decref(p);
}

/* ---- recovering the id of an oversize request ------------------------------------------- */

static void expect_peek(const char *text, size_t cut, const char *want)
{
    json_t *id = conch_rpc_peek_id(text, cut ? cut : strlen(text));
    if (!want) {
        cr_assert_null(id, "%s", text);
        return;
    }
    cr_assert_not_null(id, "%s", text);
    char *got = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    cr_assert_str_eq(got, want, "%s", text);
    free(got);
    json_decref(id);
}

Test(peek_id, finds_the_id_before_the_cut)
{
    expect_peek("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"x\",\"params\":{\"p\":\"aaaa", 0, "7");
    expect_peek(" { \"id\" : \"a\\\"b\" , \"params\": {\"x", 0, "\"a\\\"b\"");
    expect_peek("{\"params\":{\"id\":1,\"z\":[1,{\"id\":2}]},\"id\":null,\"pad\":\"", 0, "null");
    expect_peek("{\"method\":\"a}b\",\"id\":-12,", 0, "-12");
    /* the id after the cut, cut inside the id, a number that may go on, a bad type */
    expect_peek("{\"params\":{\"p\":\"aaaa", 0, NULL);
    expect_peek("{\"id\":\"abc", 0, NULL);
    expect_peek("{\"id\":12", 0, NULL);
    expect_peek("{\"id\":[1],\"x\":1", 0, NULL);
    expect_peek("{\"id\":1.5,\"x\":1", 0, NULL);
    expect_peek("[{\"id\":1}", 0, NULL);
    expect_peek("garbage", 0, NULL);
    expect_peek("{\"id\":5,", 6, NULL); /* cut after the 5 */
}

struct id_seen {
    char id[64];
    int calls;
};

static struct conch_rpc_framer *id_framer;

static void on_line_ignore(void *ctx, const char *line, size_t len)
{
    (void)ctx;
    (void)line;
    (void)len;
}

static void on_oversize_id(void *ctx)
{
    struct id_seen *h = ctx;
    json_t *id = conch_rpc_framer_oversize_id(id_framer);
    char *s = id ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    snprintf(h->id, sizeof(h->id), "%s", s ? s : "(none)");
    free(s);
    h->calls++;
}

static void feed_parts(struct conch_rpc_framer *f, struct id_seen *h, const char *const *parts,
                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(
            conch_rpc_framer_feed(f, parts[i], strlen(parts[i]), on_line_ignore, on_oversize_id, h),
            0);
        cr_assert_leq(conch_rpc_framer_pending(f), 17);
    }
}

Test(framer, oversize_finds_the_id_anywhere_and_stays_bounded)
{
    struct conch_rpc_framer f;
    struct id_seen h = {0};
    id_framer = &f;
    conch_rpc_framer_init(&f, 16);
    /* the start arrives in small pieces, then the line goes past the cap */
    const char *a[] = {"{\"id\":4", "2,\"p\":\"", "xxxxxxxxxxxxxxxxxxxxxxxxx", "yyyy\n"};
    feed_parts(&f, &h, a, 4);
    cr_assert_eq(h.calls, 1);
    cr_assert_str_eq(h.id, "42");
    cr_assert_null(conch_rpc_framer_oversize_id(&f));
    /* the id after a long params, split in the middle of the id and of a nested string */
    h.calls = 0;
    const char *b[] = {"{\"jsonrpc\":\"2.0\",\"params\":{\"id\":1,\"s\":\"}\\\"",
                       "xxxxxxxxxxxxxxxxx",
                       "\",\"z\":[{\"id\":2}]},\"method\":\"m\",\"i",
                       "d\" : \"r",
                       "-1\"",
                       ",\"x\":1}\n"};
    for (size_t i = 0; i < 6; i++) {
        conch_rpc_framer_feed(&f, b[i], strlen(b[i]), on_line_ignore, on_oversize_id, &h);
        if (i < 4)
            cr_assert_eq(h.calls, 0, "part %zu", i);
        cr_assert_leq(conch_rpc_framer_pending(&f), 17);
    }
    cr_assert_eq(h.calls, 1);
    cr_assert_str_eq(h.id, "\"r-1\"");
    /* a number id is complete only once something follows it */
    h.calls = 0;
    const char *c[] = {"{\"pad\":\"zzzzzzzzzzzzzzzzzzzz\",\"id\":12", "3}\n"};
    feed_parts(&f, &h, c, 2);
    cr_assert_eq(h.calls, 1);
    cr_assert_str_eq(h.id, "123");
    /* no id at all, a bad id type, not an object: reported without one */
    const char *d[] = {"{\"pad\":\"zzzzzzzzzzzzzzzzzzzz\"}\n",
                       "{\"id\":[1],\"pad\":\"zzzzzzzzzzzzzzzz\"}\n",
                       "[{\"id\":1},{\"id\":2},{\"id\":3}]\n"};
    for (size_t i = 0; i < 3; i++) {
        h.calls = 0;
        feed_parts(&f, &h, d + i, 1);
        cr_assert_eq(h.calls, 1);
        cr_assert_str_eq(h.id, "(none)");
    }
    /* a line that never ends and has no id yet: nothing kept, not reported */
    h.calls = 0;
    feed_parts(&f, &h, (const char *[]){"{\"params\":\""}, 1);
    for (int i = 0; i < 1000; i++)
        feed_parts(&f, &h, (const char *[]){"abcdefghijklmnopqrstuvwxyz"}, 1);
    cr_assert_eq(h.calls, 0);
    cr_assert_leq(f.cap, 17);
    feed_parts(&f, &h, (const char *[]){"\",\"id\":null}\n"}, 1);
    cr_assert_eq(h.calls, 1);
    cr_assert_str_eq(h.id, "null");
    conch_rpc_framer_done(&f);
}

static void sink_send_nothing(void *ctx, json_t *msg)
{
    (void)ctx;
    json_decref(msg);
}

Test(sink, ctx_until_closed)
{
    int owner;
    struct conch_rpc_sink *s = conch_rpc_sink_new(sink_send_nothing, &owner);
    cr_assert_eq(conch_rpc_sink_ctx(s), &owner);
    conch_rpc_sink_ref(s);
    conch_rpc_sink_close(s);
    cr_assert_null(conch_rpc_sink_ctx(s));
    conch_rpc_sink_unref(s);
    cr_assert_null(conch_rpc_sink_ctx(NULL));
}

static char *last_line;

static void capture_line(void *ctx, char *line, size_t len)
{
    cr_assert_eq(ctx, &sent);
    cr_assert_eq(strlen(line), len);
    free(last_line);
    last_line = line;
}

Test(dispatch, reply_dumped_builds_the_line_without_parsing)
{
    conch_rpc_sink_set_line_sender(sink, capture_line);
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":\"q\\\"1\",\"method\":\"later\"}");
    dispatch("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"later\"}");
    dispatch("[{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"later\"}]");
    cr_assert_eq(nstored, 3);
    conch_rpc_call_reply_dumped(stored[0], strdup("{\"changes\":[1,2]}"));
    cr_assert_str_eq(last_line,
                     "{\"jsonrpc\":\"2.0\",\"id\":\"q\\\"1\",\"result\":{\"changes\":[1,2]}}\n");
    cr_assert_eq(json_array_size(sent), 0);
    /* NULL (out of memory in the worker) is an internal error */
    conch_rpc_call_reply_dumped(stored[1], NULL);
    expect_error(only(), CONCH_RPC_INTERNAL_ERROR, "internal_error");
    /* in a batch the text is parsed back into the array */
    json_array_clear(sent);
    conch_rpc_call_reply_dumped(stored[2], strdup("[\"x\"]"));
    json_t *b = only();
    cr_assert(json_is_array(b));
    json_t *r = json_object_get(json_array_get(b, 0), "result");
    cr_assert_str_eq(json_string_value(json_array_get(r, 0)), "x");
    free(last_line);
    last_line = NULL;
}

/* A partial line is charged to the framer's budget before it is held; one that does not fit
 * is refused (-ENOBUFS) and nothing stays charged; a long line's buffer is given back once
 * the line is complete. */
Test(framer, budget_bounds_partial_lines)
{
    struct conch_budget b;
    conch_budget_init(&b, "test", 200000, NULL); /* room for a 128 KiB buffer, not 256 */
    struct conch_rpc_framer f;
    struct lines l = {0};
    conch_rpc_framer_init(&f, 1 << 20);
    conch_rpc_framer_set_budget(&f, &b);
    char *big = malloc(200000);
    memset(big, 'a', 200000);
    cr_assert_eq(conch_rpc_framer_feed(&f, big, 90000, on_line, on_oversize, &l), 0);
    cr_assert_geq(conch_budget_held(&b), 90000);
    cr_assert_eq(conch_rpc_framer_feed(&f, "a\n", 2, on_line, on_oversize, &l), 0);
    cr_assert_eq(l.n, 1);
    cr_assert_eq(conch_budget_held(&b), 0, "a complete long line's buffer stays charged");
    cr_assert_eq(conch_rpc_framer_feed(&f, big, 200000, on_line, on_oversize, &l), -ENOBUFS);
    cr_assert_eq(conch_budget_held(&b), 0);
    free(big);
    lines_free(&l);
    conch_rpc_framer_done(&f);
    cr_assert_eq(conch_budget_held(&b), 0);
}

/* ---- the client ---- */

Test(client, request_line_and_reader_round_trip)
{
    size_t n = 0;
    json_t *params = json_pack("{s:s}", "command", "echo hi");
    char *line = conch_rpc_request_line(7, "exec.run", params, &n);
    json_decref(params);
    cr_assert_not_null(line);
    cr_assert_eq(n, strlen(line));
    cr_assert_eq(line[n - 1], '\n');
    json_t *req = json_loadb(line, n - 1, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(req, "id")), 7);
    cr_assert_str_eq(json_string_value(json_object_get(req, "method")), "exec.run");
    json_decref(req);
    free(line);
    line = conch_rpc_request_line(0, "sandbox.release", NULL, &n);
    cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"method\":\"sandbox.release\"}\n");
    free(line);

    /* Two answers, one with a NUL byte, one line too long, one not JSON, a passed fd. */
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char big[200];
    memset(big, 'x', sizeof(big));
    static const char a[] = "{\"id\":1,\"result\":\"a\\u0000b\"}\n{\"id\":2,";
    int pass = dup(sv[0]);
    cr_assert_eq(conch_send_fds(sv[1], a, sizeof(a) - 1, &pass, 1, 0), (ssize_t)(sizeof(a) - 1));
    close(pass);
    cr_assert_eq(write(sv[1], "\"result\":2}\n", 12), 12);
    cr_assert_eq(write(sv[1], big, sizeof(big)), (ssize_t)sizeof(big));
    cr_assert_eq(write(sv[1], "\nnot json\n{\"id\":3}\n", 19), 19);
    close(sv[1]);
    struct conch_rpc_reader in = {.max = 100};
    int got_fd = -1;
    json_t *msgs[3] = {0};
    int n_msgs = 0, too_long = 0, bad = 0;
    for (;;) {
        json_t *m = NULL;
        struct conch_err err = {0};
        int r = conch_rpc_reader_next(&in, &m, &err);
        if (r > 0) {
            cr_assert_lt(n_msgs, 3);
            msgs[n_msgs++] = m;
        } else if (r == -EMSGSIZE) {
            too_long++;
        } else if (r == -EBADMSG) {
            bad++;
        } else if (conch_rpc_reader_fill(&in, sv[0], &got_fd) <= 0) {
            break;
        }
    }
    cr_assert_eq(n_msgs, 3);
    cr_assert_eq(too_long, 1);
    cr_assert_eq(bad, 1);
    cr_assert_eq(json_string_length(json_object_get(msgs[0], "result")), 3, "the NUL is kept");
    cr_assert_eq(json_integer_value(json_object_get(msgs[1], "result")), 2);
    cr_assert_eq(json_integer_value(json_object_get(msgs[2], "id")), 3);
    cr_assert_geq(got_fd, 0, "the passed descriptor was taken");
    close(got_fd);
    for (int i = 0; i < 3; i++)
        json_decref(msgs[i]);
    conch_rpc_reader_done(&in);
    close(sv[0]);
}

Test(client, a_line_too_long_is_dropped_across_reads)
{
    /* The long line arrives without its newline first: what is held of it is let go at once
     * (the reader keeps nothing past its cap), its end is dropped when it comes, and the next
     * message is read. */
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char big[150];
    memset(big, 'x', sizeof(big));
    struct conch_rpc_reader in = {.max = 100};
    json_t *m = NULL;
    struct conch_err err = {0};
    cr_assert_eq(write(sv[1], big, sizeof(big)), (ssize_t)sizeof(big));
    cr_assert_gt(conch_rpc_reader_fill(&in, sv[0], NULL), 0);
    cr_assert_eq(conch_rpc_reader_next(&in, &m, &err), 0);
    cr_assert(in.skipping && in.len == 0, "the partial long line was kept");
    cr_assert_eq(write(sv[1], "xx\n{\"id\":9}\n", 12), 12);
    cr_assert_gt(conch_rpc_reader_fill(&in, sv[0], NULL), 0);
    cr_assert_eq(conch_rpc_reader_next(&in, &m, &err), -EMSGSIZE);
    cr_assert_eq(conch_rpc_reader_next(&in, &m, &err), 1);
    cr_assert_eq(json_integer_value(json_object_get(m, "id")), 9);
    json_decref(m);
    conch_rpc_reader_done(&in);
    close(sv[0]);
    close(sv[1]);
}
