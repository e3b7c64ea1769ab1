/* dispatch.c - turning a line into handler calls: JSON-RPC 2.0 request checks, params checked
 * against the method table, batches answered as one array once their last (possibly async)
 * call completes, and refcounted sinks so replies after a client left are dropped safely. */
#include "rpc/rpc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cleanup.h"

/* A client controls the batch size; without a cap one 16 MiB line of "[{},{},...]" would make
 * the daemon build millions of error objects (hundreds of bytes each). */
#define MAX_BATCH 1024
/* Client strings quoted in messages are cut to this many bytes. */
#define MAX_QUOTE 128

struct conch_rpc_sink {
    unsigned refs;
    bool closed;
    void (*send)(void *send_ctx, json_t *msg);
    void (*send_line)(void *send_ctx, char *line, size_t len);
    void (*on_response)(void *send_ctx, json_t *id, json_t *result, json_t *error);
    void *send_ctx;
};

/* The responses of one batch, sent as one array when the last member completes. */
struct batch {
    struct conch_rpc_sink *sink; /* a reference */
    json_t *responses;           /* may be NULL if out of memory: then nothing is sent */
    size_t pending;              /* outstanding calls, plus one while dispatch runs */
};

struct conch_rpc_call {
    struct conch_rpc_sink *sink; /* a reference */
    struct batch *batch;         /* NULL unless a request (not notification) of a batch */
    json_t *id;                  /* owned copy; NULL for a notification */
    const char *method;          /* the method table's name (borrowed from the table) */
};

struct conch_rpc_sink *conch_rpc_sink_new(void (*send)(void *send_ctx, json_t *msg), void *send_ctx)
{
    struct conch_rpc_sink *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->refs = 1;
    s->send = send;
    s->send_ctx = send_ctx;
    return s;
}

static struct conch_rpc_sink *sink_ref(struct conch_rpc_sink *s)
{
    s->refs++;
    return s;
}

static void sink_unref(struct conch_rpc_sink *s)
{
    if (s && --s->refs == 0)
        free(s);
}

struct conch_rpc_sink *conch_rpc_sink_ref(struct conch_rpc_sink *sink)
{
    return sink ? sink_ref(sink) : NULL;
}

void conch_rpc_sink_unref(struct conch_rpc_sink *sink)
{
    sink_unref(sink);
}

void conch_rpc_sink_set_line_sender(struct conch_rpc_sink *sink,
                                    void (*send_line)(void *send_ctx, char *line, size_t len))
{
    if (sink)
        sink->send_line = send_line;
}

void conch_rpc_sink_set_response_handler(struct conch_rpc_sink *sink,
                                         void (*on_response)(void *send_ctx, json_t *id,
                                                             json_t *result, json_t *error))
{
    if (sink)
        sink->on_response = on_response;
}

json_t *conch_rpc_request(json_t *id, const char *method, json_t *params)
{
    json_t *msg = json_pack("{s:s,s:O,s:s,s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(),
                            "method", method, "params", params ? params : json_object());
    return msg;
}

void *conch_rpc_sink_ctx(const struct conch_rpc_sink *sink)
{
    return sink && !sink->closed ? sink->send_ctx : NULL;
}

void conch_rpc_sink_close(struct conch_rpc_sink *sink)
{
    if (!sink)
        return;
    sink->closed = true;
    sink->send = NULL;
    sink->send_line = NULL;
    sink->send_ctx = NULL;
    sink_unref(sink);
}

void conch_rpc_sink_send(struct conch_rpc_sink *sink, json_t *msg)
{
    if (!msg)
        return;
    if (!sink || sink->closed || !sink->send) {
        json_decref(msg);
        return;
    }
    sink->send(sink->send_ctx, msg);
}

static void batch_release(struct batch *b)
{
    if (--b->pending > 0)
        return;
    if (b->responses && json_array_size(b->responses) > 0)
        conch_rpc_sink_send(b->sink, b->responses);
    else
        json_decref(b->responses);
    sink_unref(b->sink);
    free(b);
}

/* Send @msg (taken over) alone, or add it to @b. */
static void emit(struct conch_rpc_sink *sink, struct batch *b, json_t *msg)
{
    if (!msg)
        return;
    if (b)
        json_array_append_new(b->responses, msg);
    else
        conch_rpc_sink_send(sink, msg);
}

/* The first bytes of a client string for a message, cut at a UTF-8 character boundary. */
static int quote_len(const char *s, size_t n)
{
    if (n <= MAX_QUOTE)
        return (int)n;
    n = MAX_QUOTE;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
        n--;
    return (int)n;
}

static const char *type_name(enum conch_rpc_type t)
{
    switch (t) {
    case CONCH_RPC_STRING:
        return "a string";
    case CONCH_RPC_INT:
        return "an integer";
    case CONCH_RPC_NUMBER:
        return "a number";
    case CONCH_RPC_BOOL:
        return "a boolean";
    case CONCH_RPC_OBJECT:
        return "an object";
    case CONCH_RPC_ARRAY:
        return "an array";
    case CONCH_RPC_ANY:
        break;
    }
    return "any value";
}

static bool type_ok(enum conch_rpc_type t, json_t *v)
{
    switch (t) {
    case CONCH_RPC_STRING:
        return json_is_string(v);
    case CONCH_RPC_INT:
        return json_is_integer(v);
    case CONCH_RPC_NUMBER:
        return json_is_number(v);
    case CONCH_RPC_BOOL:
        return json_is_boolean(v);
    case CONCH_RPC_OBJECT:
        return json_is_object(v);
    case CONCH_RPC_ARRAY:
        return json_is_array(v);
    case CONCH_RPC_ANY:
        return true;
    }
    return false;
}

static bool same(const char *name, const char *s, size_t n)
{
    return strlen(name) == n && memcmp(name, s, n) == 0;
}

/* "%g" prints 1e+308 and 6.7108864e+07: sizes and counts read better whole. */
static void fmt_bound(char *buf, size_t size, double v)
{
    if (v == (double)(long long)v && v > -1e18 && v < 1e18)
        snprintf(buf, size, "%lld", (long long)v);
    else
        snprintf(buf, size, "%g", v);
}

/* Whether the number @v is within @p's range; if not, fills @msg. */
static bool range_ok(const struct conch_rpc_param *p, json_t *v, char *msg, size_t size)
{
    if (!p->ranged || !json_is_number(v))
        return true;
    double x = json_number_value(v);
    char lo[32], hi[32];
    fmt_bound(lo, sizeof(lo), p->min);
    fmt_bound(hi, sizeof(hi), p->max);
    /* An integer beyond 2^53 loses precision as a double: compare it as an integer. */
    bool in = json_is_integer(v) ? (double)json_integer_value(v) >= p->min &&
                                       (double)json_integer_value(v) <= p->max
                                 : x >= p->min && x <= p->max; /* false for NaN */
    if (in && p->min_nonzero > 0 && x != 0 && x < p->min_nonzero) {
        char nz[32];
        fmt_bound(nz, sizeof(nz), p->min_nonzero);
        snprintf(msg, size, "param '%s' must be 0 or between %s and %s", p->name, nz, hi);
        return false;
    }
    if (!in)
        snprintf(msg, size, "param '%s' must be between %s and %s", p->name, lo, hi);
    return in;
}

/* Check @params (an object, or NULL for none) against @m's table. On a mismatch returns a new
 * -32602 error for @id. */
static json_t *check_params(const struct conch_rpc_method *m, json_t *params, json_t *id)
{
    char msg[256];
    if (m->params) {
        for (const struct conch_rpc_param *p = m->params; p->name; p++) {
            json_t *v = params ? json_object_get(params, p->name) : NULL;
            if (!v || (json_is_null(v) && !p->required && p->type != CONCH_RPC_ANY)) {
                if (!p->required)
                    continue;
                snprintf(msg, sizeof(msg), "missing required param '%s'", p->name);
            } else if (!type_ok(p->type, v)) {
                snprintf(msg, sizeof(msg), "param '%s' must be %s", p->name, type_name(p->type));
            } else if (!range_ok(p, v, msg, sizeof(msg))) {
                return conch_rpc_error(
                    id, CONCH_RPC_INVALID_PARAMS, "invalid_params", msg,
                    json_pack("{ss,sf,sf}", "param", p->name, "min", p->min, "max", p->max));
            } else {
                continue;
            }
            return conch_rpc_error(id, CONCH_RPC_INVALID_PARAMS, "invalid_params", msg,
                                   json_pack("{ss}", "param", p->name));
        }
    }
    if (!params)
        return NULL;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(params, key, klen, v)
    {
        bool known = false;
        for (const struct conch_rpc_param *p = m->params; p && p->name && !known; p++)
            known = same(p->name, key, klen);
        if (known)
            continue;
        snprintf(msg, sizeof(msg), "unknown param '%.*s'", quote_len(key, klen), key);
        json_t *extra = json_object();
        if (extra && json_object_set_new(extra, "param", json_stringn(key, klen)) < 0) {
            json_decref(extra);
            extra = NULL;
        }
        return conch_rpc_error(id, CONCH_RPC_INVALID_PARAMS, "invalid_params", msg, extra);
    }
    return NULL;
}

static const struct conch_rpc_method *lookup(const struct conch_rpc_method *table, json_t *name)
{
    const char *s = json_string_value(name);
    size_t n = json_string_length(name);
    for (const struct conch_rpc_method *m = table; m && m->name; m++)
        if (same(m->name, s, n))
            return m;
    return NULL;
}

static json_t *invalid(json_t *id, const char *message)
{
    return conch_rpc_error(id, CONCH_RPC_INVALID_REQUEST, "invalid_request", message, NULL);
}

/* Handle one request object (or a non-object batch member). */
static void handle(const struct conch_rpc_method *table, json_t *req, void *ctx,
                   struct conch_rpc_sink *sink, struct batch *b)
{
    if (!json_is_object(req)) {
        emit(sink, b, invalid(NULL, "a request must be a JSON object"));
        return;
    }
    json_t *id = json_object_get(req, "id");
    if (id && !json_is_string(id) && !json_is_integer(id) && !json_is_null(id)) {
        emit(sink, b, invalid(NULL, "id must be a string, an integer or null"));
        return;
    }
    json_t *version = json_object_get(req, "jsonrpc");
    if (!json_is_string(version) ||
        !same("2.0", json_string_value(version), json_string_length(version))) {
        /* Even without an id: a malformed object is not a notification, and JSON-RPC 2.0
         * answers it with id null. */
        emit(sink, b, invalid(id, "jsonrpc must be \"2.0\""));
        return;
    }
    json_t *name = json_object_get(req, "method");
    if (!name && id && (json_object_get(req, "result") || json_object_get(req, "error"))) {
        /* A response to a request of ours (tool.call): never answered, even when unknown. */
        json_t *result = json_object_get(req, "result"), *error = json_object_get(req, "error");
        if (sink->on_response && !sink->closed && !(result && error))
            sink->on_response(sink->send_ctx, id, result, error);
        return;
    }
    if (!json_is_string(name)) {
        emit(sink, b, invalid(id, "method must be a string"));
        return;
    }

    /* From here on the request is well-formed: a notification gets no reply, even an error. */
    bool notification = !id;
    json_t *params = json_object_get(req, "params");
    if (json_is_null(params))
        params = NULL;
    if (params && !json_is_object(params)) {
        if (!notification)
            emit(sink, b,
                 conch_rpc_error(id, CONCH_RPC_INVALID_PARAMS, "invalid_params",
                                 "params must be an object", NULL));
        return;
    }
    const struct conch_rpc_method *m = lookup(table, name);
    if (!m) {
        if (!notification) {
            const char *s = json_string_value(name);
            char msg[256];
            snprintf(msg, sizeof(msg), "unknown method '%.*s'",
                     quote_len(s, json_string_length(name)), s);
            emit(sink, b,
                 conch_rpc_error(id, CONCH_RPC_METHOD_NOT_FOUND, "method_not_found", msg, NULL));
        }
        return;
    }
    json_t *bad = check_params(m, params, id);
    if (bad) {
        if (notification)
            json_decref(bad);
        else
            emit(sink, b, bad);
        return;
    }

    struct conch_rpc_call *call = calloc(1, sizeof(*call));
    json_t *args = params ? json_incref(params) : json_object();
    if (!call || !args || (id && !(call->id = json_deep_copy(id)))) {
        if (call)
            json_decref(call->id);
        free(call);
        json_decref(args);
        if (!notification)
            emit(sink, b,
                 conch_rpc_error(id, CONCH_RPC_INTERNAL_ERROR, NULL, "out of memory", NULL));
        return;
    }
    call->sink = sink_ref(sink);
    call->method = m->name;
    if (b && !notification) {
        call->batch = b;
        b->pending++;
    }
    m->handler(call, args, ctx);
    json_decref(args);
}

void conch_rpc_dispatch(const struct conch_rpc_method *table, const char *line, size_t len,
                        void *ctx, struct conch_rpc_sink *sink)
{
    /* A send callback may close the sink while we still hand out calls: hold it. */
    sink_ref(sink);
    json_error_t jerr;
    json_t *root =
        json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s at position %d", jerr.text, jerr.position);
        if (json_error_code(&jerr) == json_error_duplicate_key)
            conch_rpc_sink_send(sink, invalid(NULL, msg));
        else
            conch_rpc_sink_send(
                sink, conch_rpc_error(NULL, CONCH_RPC_PARSE_ERROR, "parse_error", msg, NULL));
    } else if (json_is_array(root)) {
        size_t n = json_array_size(root);
        struct batch *b = NULL;
        if (n == 0) {
            conch_rpc_sink_send(sink, invalid(NULL, "empty batch"));
        } else if (n > MAX_BATCH) {
            char msg[128];
            snprintf(msg, sizeof(msg), "batch of %zu requests exceeds the limit of %d", n,
                     MAX_BATCH);
            conch_rpc_sink_send(sink,
                                conch_rpc_error(NULL, CONCH_RPC_INVALID_REQUEST, "invalid_request",
                                                msg, json_pack("{si}", "limit", MAX_BATCH)));
        } else if (!(b = calloc(1, sizeof(*b)))) {
            conch_rpc_sink_send(
                sink, conch_rpc_error(NULL, CONCH_RPC_INTERNAL_ERROR, NULL, "out of memory", NULL));
        } else {
            b->sink = sink_ref(sink);
            b->responses = json_array();
            b->pending = 1;
            for (size_t i = 0; i < n; i++)
                handle(table, json_array_get(root, i), ctx, sink, b);
            batch_release(b);
        }
    } else {
        handle(table, root, ctx, sink, NULL);
    }
    json_decref(root);
    sink_unref(sink);
}

/* Complete @call with @msg (taken over; NULL when nothing is to be sent) and free it. */
static void finish(struct conch_rpc_call *call, json_t *msg)
{
    if (call->batch) {
        emit(call->sink, call->batch, msg);
        batch_release(call->batch);
    } else {
        emit(call->sink, NULL, msg);
    }
    sink_unref(call->sink);
    json_decref(call->id);
    free(call);
}

/* Whether anyone will read this call's response. */
static bool wanted(const struct conch_rpc_call *call)
{
    return call->id && !call->sink->closed;
}

void conch_rpc_call_reply(struct conch_rpc_call *call, json_t *result)
{
    json_t *msg = NULL;
    if (!wanted(call)) {
        json_decref(result);
    } else if (result) {
        msg = conch_rpc_result(call->id, result);
    }
    if (wanted(call) && !msg)
        msg = conch_rpc_error(call->id, CONCH_RPC_INTERNAL_ERROR, NULL,
                              "out of memory building the result", NULL);
    finish(call, msg);
}

char *conch_rpc_call_take_result_line(struct conch_rpc_call *call, json_t *result)
{
    char *line = NULL;
    if (wanted(call) && !call->batch && result) {
        json_t *msg = conch_rpc_result(call->id, json_incref(result));
        char *text = msg ? json_dumps(msg, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(msg);
        size_t n = text ? strlen(text) : 0;
        line = text ? realloc(text, n + 2) : NULL;
        if (line) {
            line[n] = '\n';
            line[n + 1] = '\0';
        } else {
            free(text);
        }
    }
    if (!line)
        return NULL;
    json_decref(result);
    finish(call, NULL);
    return line;
}

void conch_rpc_call_reply_dumped(struct conch_rpc_call *call, char *text)
{
    if (!text || !wanted(call) || call->batch || !call->sink->send_line) {
        /* Parsed back: rare (batches, sinks without a line sender), and correct. */
        json_t *v = text && wanted(call) ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
        bool want = wanted(call);
        free(text);
        if (want)
            conch_rpc_call_reply(call, v);
        else
            finish(call, NULL);
        return;
    }
    _cleanup_free_ char *id = json_dumps(call->id, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t tlen = strlen(text);
    static const char pre[] = "{\"jsonrpc\":\"2.0\",\"id\":", mid[] = ",\"result\":";
    size_t len = id ? sizeof(pre) - 1 + strlen(id) + sizeof(mid) - 1 + tlen + 2 : 0;
    char *line = id ? malloc(len + 1) : NULL;
    if (!line) {
        free(text);
        conch_rpc_call_reply(call, NULL); /* internal_error: out of memory */
        return;
    }
    char *p = line;
    memcpy(p, pre, sizeof(pre) - 1);
    p += sizeof(pre) - 1;
    memcpy(p, id, strlen(id));
    p += strlen(id);
    memcpy(p, mid, sizeof(mid) - 1);
    p += sizeof(mid) - 1;
    memcpy(p, text, tlen);
    p += tlen;
    *p++ = '}';
    *p++ = '\n';
    *p = '\0';
    free(text);
    call->sink->send_line(call->sink->send_ctx, line, len);
    finish(call, NULL);
}

void conch_rpc_call_fail(struct conch_rpc_call *call, int code, const char *data_code,
                         const char *message, json_t *data_extra)
{
    json_t *msg = NULL;
    if (wanted(call))
        msg = conch_rpc_error(call->id, code, data_code, message, data_extra);
    else
        json_decref(data_extra);
    finish(call, msg);
}

void conch_rpc_call_failf(struct conch_rpc_call *call, int code, const char *data_code,
                          json_t *data_extra, const char *fmt, ...)
{
    _cleanup_free_ char *message = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&message, fmt, ap) < 0)
        message = NULL;
    va_end(ap);
    conch_rpc_call_fail(call, code, data_code, message ? message : "error (out of memory)",
                        data_extra);
}

void conch_rpc_call_fail_param(struct conch_rpc_call *call, const char *param, const char *fmt, ...)
{
    _cleanup_free_ char *message = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&message, fmt, ap) < 0)
        message = NULL;
    va_end(ap);
    json_t *extra = json_object();
    if (extra && param && json_object_set_new(extra, "param", json_string(param)) < 0) {
        json_decref(extra);
        extra = NULL;
    }
    conch_rpc_call_fail(call, CONCH_RPC_INVALID_PARAMS, "invalid_params",
                        message ? message : "invalid params", extra);
}

void conch_rpc_call_fail_err(struct conch_rpc_call *call, int code, const char *data_code,
                             const struct conch_err *err)
{
    enum conch_err_kind kind = err ? err->kind : CONCH_ERR_INFRASTRUCTURE;
    if (kind == CONCH_ERR_NONE)
        kind = CONCH_ERR_INFRASTRUCTURE;
    if (code == 0 && data_code)
        code = conch_rpc_code_for(data_code);
    if (code == 0) {
        switch (kind) {
        case CONCH_ERR_INFRASTRUCTURE:
            code = CONCH_RPC_INFRASTRUCTURE;
            break;
        case CONCH_ERR_USAGE:
            code = CONCH_RPC_INVALID_PARAMS;
            break;
        case CONCH_ERR_LIMIT:
            code = CONCH_RPC_LIMIT;
            break;
        default:
            code = CONCH_RPC_INTERNAL_ERROR;
            break;
        }
    }
    conch_rpc_call_fail(call, code, data_code, err && err->msg[0] ? err->msg : "unknown error",
                        json_pack("{ss}", "kind", conch_err_kind_name(kind)));
}

json_t *conch_rpc_call_id(const struct conch_rpc_call *call)
{
    return call->id;
}

bool conch_rpc_call_cancelled(const struct conch_rpc_call *call)
{
    return call->sink->closed;
}

const char *conch_rpc_call_method(const struct conch_rpc_call *call)
{
    return call->method;
}
