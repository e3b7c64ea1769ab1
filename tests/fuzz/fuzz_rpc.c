/* fuzz_rpc.c - libFuzzer target for what a client controls first: the byte stream, framed into
 * lines and dispatched through a small method table whose handlers reply at once, fail, or keep
 * the call and complete it at the end, before or after the sink is closed. Every message sent is
 * checked to be one line of valid JSON-RPC. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/rpc.h"

static struct conch_rpc_call *stored[64];
static size_t nstored;

static void check_response(json_t *m)
{
    if (!json_is_object(m))
        abort();
    json_t *v = json_object_get(m, "jsonrpc");
    if (!json_is_string(v) || strcmp(json_string_value(v), "2.0") != 0)
        abort();
    json_t *id = json_object_get(m, "id");
    if (!json_is_string(id) && !json_is_integer(id) && !json_is_null(id))
        abort();
    json_t *err = json_object_get(m, "error");
    if (!!json_object_get(m, "result") == !!err)
        abort();
    if (err) {
        json_t *data = json_object_get(err, "data");
        if (!json_is_integer(json_object_get(err, "code")) ||
            !json_is_string(json_object_get(err, "message")) ||
            !json_is_string(json_object_get(data, "code")) ||
            !json_is_string(json_object_get(data, "kind")))
            abort();
    }
}

static void send_msg(void *ctx, json_t *msg)
{
    char *line = conch_rpc_dumps(msg);
    if (!line)
        abort();
    size_t n = strlen(line);
    if (n < 2 || line[n - 1] != '\n' || memchr(line, '\n', n - 1))
        abort();
    json_error_t e;
    json_t *back = json_loadb(line, n - 1, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &e);
    if (!back)
        abort();
    if (json_is_array(back)) {
        if (json_array_size(back) == 0)
            abort();
        size_t i;
        json_t *m;
        json_array_foreach(back, i, m) check_response(m);
    } else {
        check_response(back);
    }
    json_decref(back);
    free(line);
    json_decref(msg);
}

static void h_now(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    conch_rpc_call_reply(call, json_incref(params));
}

static void h_later(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    if (nstored < sizeof(stored) / sizeof(stored[0]))
        stored[nstored++] = call;
    else
        conch_rpc_call_reply(call, json_null());
}

static void h_fail(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct conch_err err;
    conch_err_setk(&err, (enum conch_err_kind)(conch_rpc_int(params, "kind", 0) & 7), EIO, "%s",
                   conch_rpc_str(params, "msg", "failed"));
    conch_rpc_call_fail_err(call, 0, conch_rpc_str(params, "code", NULL), &err);
}

static void h_typed(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    size_t len = 0;
    const char *s = conch_rpc_strn(params, "s", &len);
    if (conch_rpc_int(params, "i", 0) < 0) {
        conch_rpc_call_fail_param(call, "i", "i must be >= 0, got %lld",
                                  conch_rpc_int(params, "i", 0));
        return;
    }
    conch_rpc_call_reply(call, json_pack("{s:s%,s:I,s:f,s:b,s:O?}", "s", s ? s : "", len, "i",
                                         (json_int_t)conch_rpc_int(params, "i", 0), "n",
                                         conch_rpc_num(params, "n", 0), "b",
                                         conch_rpc_bool(params, "b", false), "any",
                                         json_object_get(params, "any")));
}

static void h_nil(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    conch_rpc_call_reply(call, NULL);
}

static const struct conch_rpc_param fail_params[] = {
    {.name = "kind", .type = CONCH_RPC_INT},
    {.name = "msg", .type = CONCH_RPC_STRING},
    {.name = "code", .type = CONCH_RPC_STRING},
    {.name = NULL},
};

static const struct conch_rpc_param typed_params[] = {
    {.name = "s", .type = CONCH_RPC_STRING, .required = true},
    {.name = "i", .type = CONCH_RPC_INT, .ranged = true, .min = -5, .max = 1e6},
    {.name = "n", .type = CONCH_RPC_NUMBER, .ranged = true, .max = 60, .min_nonzero = 0.001},
    {.name = "b", .type = CONCH_RPC_BOOL},
    {.name = "o", .type = CONCH_RPC_OBJECT},
    {.name = "a", .type = CONCH_RPC_ARRAY},
    {.name = "any", .type = CONCH_RPC_ANY},
    {.name = NULL},
};

static const struct conch_rpc_method table[] = {
    {"now", NULL, h_now},          {"later", NULL, h_later},
    {"fail", fail_params, h_fail}, {"typed", typed_params, h_typed},
    {"nil", NULL, h_nil},          {NULL, NULL, NULL},
};

struct conn {
    struct conch_rpc_sink *sink;
};

/* The streaming id scan (oversize lines) against conch_rpc_peek_id on whole lines: where
 * the line is a JSON object and peek finds a short id, the scan, fed in two pieces, must
 * find the same one. */
static void check_idscan(const char *line, size_t len)
{
    /* Only well-formed objects: on broken JSON the two may differ, and the request is a
     * parse error answered with id null either way. */
    json_t *whole = json_loadb(line, len, JSON_ALLOW_NUL, NULL);
    bool object = json_is_object(whole);
    json_decref(whole);
    if (!object)
        return;
    json_t *peek = conch_rpc_peek_id(line, len);
    char *want = peek ? json_dumps(peek, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(peek);
    if (!want)
        return;
    if (strlen(want) < 200) {
        struct conch_rpc_idscan sc = {0};
        conch_rpc_idscan_feed(&sc, line, len / 2);
        conch_rpc_idscan_feed(&sc, line + len / 2, len - len / 2);
        char *got = sc.result == 1 ? json_dumps(sc.id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        if (!got || strcmp(got, want) != 0)
            __builtin_trap();
        free(got);
        conch_rpc_idscan_init(&sc);
    }
    free(want);
}

static void on_line(void *ctx, const char *line, size_t len)
{
    struct conn *c = ctx;
    check_idscan(line, len);
    conch_rpc_dispatch(table, line, len, NULL, c->sink);
}

static struct conch_rpc_framer *cur_framer;

static void on_oversize(void *ctx)
{
    struct conn *c = ctx;
    json_t *id = json_incref(conch_rpc_framer_oversize_id(cur_framer));
    conch_rpc_sink_send(c->sink, conch_rpc_error(id, 0, "message_too_large", "too long", NULL));
    json_decref(id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* The first byte picks the chunk size, the size cap and the ending. */
    uint8_t cfg = data[0];
    data++;
    size--;
    size_t chunk = (size_t)1 << (cfg & 7); /* 1 .. 128 bytes */
    if ((cfg & 7) == 7)
        chunk = SIZE_MAX;
    size_t max = (cfg & 0x08) ? 64 : 1 << 16;
    bool close_first = cfg & 0x10;

    struct conn c = {.sink = conch_rpc_sink_new(send_msg, NULL)};
    if (!c.sink)
        return 0;
    struct conch_rpc_framer f;
    conch_rpc_framer_init(&f, max);
    cur_framer = &f;
    nstored = 0;
    const char *p = (const char *)data;
    size_t left = size;
    while (left > 0) {
        size_t n = left < chunk ? left : chunk;
        if (conch_rpc_framer_feed(&f, p, n, on_line, on_oversize, &c) < 0)
            abort();
        if (conch_rpc_framer_pending(&f) > max + 1)
            abort();
        p += n;
        left -= n;
    }
    conch_rpc_framer_done(&f);

    if (close_first)
        conch_rpc_sink_close(c.sink);
    /* Complete the kept calls in reverse order, alternating replies and failures. */
    for (size_t i = nstored; i-- > 0;) {
        if (i & 1)
            conch_rpc_call_fail(stored[i], CONCH_RPC_JOB_NOT_FOUND, NULL, "gone", NULL);
        else
            conch_rpc_call_reply(stored[i], json_integer((json_int_t)i));
    }
    if (!close_first)
        conch_rpc_sink_close(c.sink);
    return 0;
}
