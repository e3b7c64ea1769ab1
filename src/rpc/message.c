/* message.c - building JSON-RPC responses and errors with conch's error codes, serialising
 * them as lines, and reading params. */
#include "rpc/rpc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/cleanup.h"
#include "core/utf8.h"

static const struct {
    int code;
    const char *name;
} codes[] = {
    {CONCH_RPC_PARSE_ERROR, "parse_error"},
    {CONCH_RPC_INVALID_REQUEST, "invalid_request"},
    {CONCH_RPC_INVALID_REQUEST, "message_too_large"},
    {CONCH_RPC_METHOD_NOT_FOUND, "method_not_found"},
    {CONCH_RPC_INVALID_PARAMS, "invalid_params"},
    {CONCH_RPC_INTERNAL_ERROR, "internal_error"},
    {CONCH_RPC_INFRASTRUCTURE, "infrastructure"},
    {CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found"},
    {CONCH_RPC_JOB_NOT_FOUND, "job_not_found"},
    {CONCH_RPC_LIMIT, "limit"},
    {CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped"},
    {CONCH_RPC_BUSY, "busy"},
    {CONCH_RPC_SNAPSHOT_NOT_FOUND, "snapshot_not_found"},
    {CONCH_RPC_SNAPSHOT_IN_USE, "snapshot_in_use"},
    {CONCH_RPC_FILE_NOT_FOUND, "file_not_found"},
    {CONCH_RPC_PERMISSION_DENIED, "permission_denied"},
    {CONCH_RPC_IS_DIRECTORY, "is_directory"},
    {CONCH_RPC_INVALID_PATH, "invalid_path"},
    {CONCH_RPC_NOT_A_DIRECTORY, "not_a_directory"},
    {CONCH_RPC_STRING_NOT_FOUND, "string_not_found"},
    {CONCH_RPC_AMBIGUOUS_MATCH, "ambiguous_match"},
    {CONCH_RPC_TOO_LARGE, "too_large"},
    {CONCH_RPC_UNAUTHORIZED, "unauthorized"},
    {CONCH_RPC_RATE_LIMITED, "rate_limited"},
    {CONCH_RPC_FORBIDDEN, "forbidden"},
};

int conch_rpc_code_for(const char *data_code)
{
    if (data_code)
        for (size_t i = 0; i < ARRAY_SIZE(codes); i++)
            if (strcmp(codes[i].name, data_code) == 0)
                return codes[i].code;
    return CONCH_RPC_INTERNAL_ERROR;
}

static const char *default_data_code(int code)
{
    for (size_t i = 0; i < ARRAY_SIZE(codes); i++)
        if (codes[i].code == code)
            return codes[i].name;
    return "internal_error";
}

static const char *kind_for(int code)
{
    switch (code) {
    case CONCH_RPC_INFRASTRUCTURE:
        return "infrastructure";
    case CONCH_RPC_LIMIT:
        return "limit";
    case CONCH_RPC_INTERNAL_ERROR:
        return "internal";
    default:
        return "usage";
    }
}

/* A JSON string of @s; messages often quote paths and command output, which need not be UTF-8,
 * and jansson refuses such strings outright, which would lose the whole error. */
static json_t *text(const char *s)
{
    size_t n = strlen(s);
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    _cleanup_free_ char *clean = conch_utf8_repair(s, n, &n);
    return clean ? json_stringn(clean, n) : NULL;
}

/* json_object_set_new that also tolerates a NULL @obj; returns false on failure (an allocation
 * of @val or inside @obj failed); @val is always consumed. */
static bool set(json_t *obj, const char *key, json_t *val)
{
    if (!obj || !val) {
        json_decref(val);
        return false;
    }
    return json_object_set_new(obj, key, val) == 0;
}

static json_t *envelope(json_t *id)
{
    json_t *msg = json_object();
    bool ok = set(msg, "jsonrpc", json_string("2.0"));
    ok = set(msg, "id", id ? json_deep_copy(id) : json_null()) && ok;
    if (!ok) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

json_t *conch_rpc_result(json_t *id, json_t *result)
{
    json_t *msg = envelope(id);
    if (!set(msg, "result", result ? result : json_null())) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

json_t *conch_rpc_error(json_t *id, int code, const char *data_code, const char *message,
                        json_t *data_extra)
{
    if (code == 0)
        code = conch_rpc_code_for(data_code);
    if (!data_code)
        data_code = default_data_code(code);

    json_t *data = json_object();
    bool ok = set(data, "kind", json_string(kind_for(code)));
    if (ok && json_is_object(data_extra))
        ok = json_object_update(data, data_extra) == 0;
    json_decref(data_extra);
    /* data.code is what clients branch on: an extra "code" must not shadow it. */
    ok = set(data, "code", text(data_code)) && ok;
    if (!ok) {
        json_decref(data);
        return NULL;
    }

    json_t *err = json_object();
    ok = set(err, "code", json_integer(code));
    ok = set(err, "message", text(message ? message : "error")) && ok;
    ok = set(err, "data", data) && ok;
    if (!ok) {
        json_decref(err);
        return NULL;
    }
    json_t *msg = envelope(id);
    if (!set(msg, "error", err)) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

char *conch_rpc_dumps(json_t *msg)
{
    if (!msg)
        return NULL;
    /* No JSON_ENSURE_ASCII: UTF-8 goes out as is. Control characters (so '\n') are always
     * escaped by jansson, which keeps one message on one line. */
    _cleanup_free_ char *s = json_dumps(msg, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line)
        return NULL;
    s = NULL;
    line[n] = '\n';
    line[n + 1] = '\0';
    return line;
}

static json_t *member(json_t *params, const char *key)
{
    return json_is_object(params) && key ? json_object_get(params, key) : NULL;
}

const char *conch_rpc_str(json_t *params, const char *key, const char *def)
{
    json_t *v = member(params, key);
    return json_is_string(v) ? json_string_value(v) : def;
}

const char *conch_rpc_strn(json_t *params, const char *key, size_t *ret_len)
{
    json_t *v = member(params, key);
    if (!json_is_string(v))
        return NULL;
    if (ret_len)
        *ret_len = json_string_length(v);
    return json_string_value(v);
}

long long conch_rpc_int(json_t *params, const char *key, long long def)
{
    json_t *v = member(params, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : def;
}

double conch_rpc_num(json_t *params, const char *key, double def)
{
    json_t *v = member(params, key);
    return json_is_number(v) ? json_number_value(v) : def;
}

bool conch_rpc_bool(json_t *params, const char *key, bool def)
{
    json_t *v = member(params, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* ---- recovering the id of a request too long to parse ---- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* The end of the string starting at s[i] == '"' (index past its closing quote), or 0. */
static size_t skip_string(const char *s, size_t i, size_t n)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return 0;
}

/* The end of the value starting at s[i] (a member's value, any type), or 0 if cut. */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    size_t depth = 0;
    while (i < n) {
        char ch = s[i];
        if (ch == '"') {
            i = skip_string(s, i, n);
            if (!i)
                return 0;
            if (depth == 0)
                return i;
            continue;
        }
        if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (depth == 0)
                return i; /* the end of the enclosing object: a scalar ended here */
            if (--depth == 0)
                return i + 1;
        } else if (ch == ',' && depth == 0) {
            return i;
        }
        i++;
    }
    return 0;
}

json_t *conch_rpc_peek_id(const char *s, size_t n)
{
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{')
        return NULL;
    i++;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != '"')
            return NULL;
        size_t kend = skip_string(s, i, n);
        if (!kend)
            return NULL;
        bool is_id = kend - i == 4 && !memcmp(s + i, "\"id\"", 4);
        i = skip_ws(s, kend, n);
        if (i >= n || s[i] != ':')
            return NULL;
        i = skip_ws(s, i + 1, n);
        size_t vend = skip_value(s, i, n);
        if (!vend)
            return NULL;
        if (is_id) {
            /* A number is complete only once something follows it. */
            if (vend >= n)
                return NULL;
            json_t *v = json_loadb(s + i, vend - i, JSON_DECODE_ANY, NULL);
            if (v && (json_is_string(v) || json_is_integer(v) || json_is_null(v)))
                return v;
            json_decref(v);
            return NULL;
        }
        i = skip_ws(s, vend, n);
        if (i >= n || s[i] != ',')
            return NULL;
        i++;
    }
}

/* What one parsed JSON value costs at most, about (conch_rpc_json_cost). */
#define JSON_VALUE_COST 64

uint64_t conch_rpc_json_cost(const char *line, size_t len)
{
    uint64_t values = 1;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < len; i++) {
        char ch = line[i];
        if (in_str) {
            if (esc)
                esc = false;
            else if (ch == '\\')
                esc = true;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == ',' || ch == '[' || ch == '{') {
            values++;
        }
    }
    return (uint64_t)len + values * JSON_VALUE_COST;
}
