/* js-render.c - a script's value and errors as JSON a client can carry: undefined, NaN,
 * BigInt, Map/Set, Dates, functions, cycles and errors each shown sensibly, with caps on
 * depth and size. The walk over the value is JavaScript (it runs the value's getters and
 * toJSON under the eval's deadline); it holds its own references to the builtins it uses,
 * so a script that replaces them does not change how values are shown. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "js/js-internal.h"

static const char *static_type(const char *t)
{
    static const char *const types[] = {"undefined", "null",   "number",   "bigint", "string",
                                        "boolean",   "symbol", "function", "array",  "map",
                                        "set",       "error",  "date",     "object"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (strcmp(t, types[i]) == 0)
            return types[i];
    return "object";
}

/* The pending exception's message, for a value that could not be rendered. */
static json_t *unrenderable(struct conch_js_session *s)
{
    JSValue exc = JS_GetException(s->ctx);
    const char *m = JS_ToCString(s->ctx, exc);
    json_t *j = json_sprintf("[unrenderable: %s]", s->interrupted ? "the deadline passed"
                                                   : m            ? m
                                                                  : "?");
    JS_FreeCString(s->ctx, m);
    JS_FreeValue(s->ctx, exc);
    return j;
}

json_t *conch_js_render_value(struct conch_js_session *s, JSValueConst v, const char **ret_type,
                              char **ret_text)
{
    *ret_type = "object";
    if (ret_text)
        *ret_text = NULL;
    JSValue args[2] = {JS_DupValue(s->ctx, v), JS_FALSE};
    JSValue r = JS_Call(s->ctx, s->render, JS_UNDEFINED, 2, args);
    JS_FreeValue(s->ctx, args[0]);
    if (JS_IsException(r))
        return unrenderable(s);
    size_t len;
    const char *text = JS_ToCStringLen(s->ctx, &len, r);
    JS_FreeValue(s->ctx, r);
    if (!text)
        return unrenderable(s);
    json_t *pair = json_loadb(text, len, 0, NULL);
    json_t *type = json_array_get(pair, 0), *value = json_array_get(pair, 1);
    if (!json_is_string(type) || !value) {
        JS_FreeCString(s->ctx, text);
        json_decref(pair);
        return json_string("[unrenderable]");
    }
    *ret_type = static_type(json_string_value(type));
    /* The value's own JSON text, as JavaScript printed it (shortest numbers: 3.14, where
     * jansson would print 3.1400000000000001): `["type",` ... `]`. */
    size_t skip = 4 + json_string_length(type);
    const char *raw = text + skip;
    size_t raw_len = len > skip ? len - skip - 1 : 0;
    json_t *ret;
    if (raw_len > s->limits.value_bytes) {
        /* Too big to carry: the start of its JSON text, and how much there was. */
        size_t cut = s->limits.value_bytes;
        while (cut > 0 && ((unsigned char)raw[cut] & 0xC0) == 0x80)
            cut--; /* not inside a UTF-8 sequence */
        ret = json_sprintf("%.*s... [cut: %zu bytes of JSON in all]", (int)cut, raw, raw_len);
        if (ret_text)
            *ret_text = strdup(json_string_value(ret));
    } else {
        ret = json_incref(value);
        if (ret_text)
            *ret_text = strndup(raw, raw_len);
    }
    json_decref(pair);
    JS_FreeCString(s->ctx, text);
    return ret;
}

json_t *conch_js_json_string(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    size_t len;
    char *fixed = conch_utf8_repair(s, n, &len);
    j = fixed ? json_stringn(fixed, len) : NULL;
    free(fixed);
    return j ? j : json_string("");
}

static json_t *string_prop(struct conch_js_session *s, JSValueConst obj, const char *name)
{
    JSValue v = JS_GetPropertyStr(s->ctx, obj, name);
    if (JS_IsException(v)) {
        JS_FreeValue(s->ctx, JS_GetException(s->ctx));
        return NULL;
    }
    if (!JS_IsString(v)) {
        JS_FreeValue(s->ctx, v);
        return NULL;
    }
    size_t len;
    const char *c = JS_ToCStringLen(s->ctx, &len, v);
    JS_FreeValue(s->ctx, v);
    json_t *j = NULL;
    if (c && len > s->limits.value_bytes) {
        /* An error's text is the script's to make as long as it likes: cut like a value. */
        size_t cut = s->limits.value_bytes;
        while (cut > 0 && ((unsigned char)c[cut] & 0xC0) == 0x80)
            cut--;
        struct conch_sb b = {0};
        conch_sb_putn(&b, c, cut);
        conch_sb_printf(&b, "... [cut: %zu bytes in all]", len);
        j = b.oom ? NULL : conch_js_json_string(b.buf, b.len);
        conch_sb_done(&b);
    } else if (c) {
        j = conch_js_json_string(c, len);
    }
    JS_FreeCString(s->ctx, c);
    return j;
}

/* The first "FILENAME:LINE" in @stack: the line of the script the error came from. */
static long line_in_stack(const char *stack, const char *filename)
{
    size_t fl = strlen(filename);
    for (const char *p = strstr(stack, filename); p; p = strstr(p + 1, filename)) {
        if (p[fl] != ':')
            continue;
        char *end;
        long line = strtol(p + fl + 1, &end, 10);
        if (end != p + fl + 1 && line > 0)
            return line;
    }
    return 0;
}

json_t *conch_js_render_error(struct conch_js_session *s, JSValueConst exc, const char *filename)
{
    json_t *e = json_object();
    if (JS_IsObject(exc)) {
        json_t *name = string_prop(s, exc, "name"), *message = string_prop(s, exc, "message");
        json_t *stack = string_prop(s, exc, "stack");
        json_object_set_new(e, "name", name ? name : json_string("Error"));
        if (message)
            json_object_set_new(e, "message", message);
        else {
            const char *type;
            json_object_set_new(e, "message", conch_js_render_value(s, exc, &type, NULL));
        }
        if (stack) {
            json_object_set_new(e, "stack", stack);
            long line = line_in_stack(json_string_value(stack), filename);
            if (line)
                json_object_set_new(e, "line", json_integer(line));
        }
    } else {
        /* `throw "x"`: no name, no stack; the value as the message. */
        JSValue args[2] = {JS_DupValue(s->ctx, exc), JS_TRUE};
        JSValue r = JS_Call(s->ctx, s->render, JS_UNDEFINED, 2, args);
        JS_FreeValue(s->ctx, args[0]);
        size_t len = 0;
        const char *m = JS_IsException(r) ? NULL : JS_ToCStringLen(s->ctx, &len, r);
        if (JS_IsException(r))
            JS_FreeValue(s->ctx, JS_GetException(s->ctx));
        json_object_set_new(e, "name", json_string("Error"));
        json_object_set_new(e, "message",
                            m ? conch_js_json_string(m, len) : json_string("(a thrown value)"));
        JS_FreeCString(s->ctx, m);
        JS_FreeValue(s->ctx, r);
    }
    return e;
}

json_t *conch_js_result_text(json_t *res, const char *value_text)
{
    struct conch_sb b = {0};
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(res, "console"), i, l)
    {
        const char *level = json_string_value(json_object_get(l, "level"));
        const char *text = json_string_value(json_object_get(l, "text"));
        if (level && strcmp(level, "log") != 0 && strcmp(level, "info") != 0)
            conch_sb_printf(&b, "[%s] ", level);
        conch_sb_printf(&b, "%s\n", text ? text : "");
    }
    json_int_t dropped = json_integer_value(json_object_get(res, "console_dropped"));
    if (dropped)
        conch_sb_printf(&b, "[... %lld console lines dropped: past the cap]\n", (long long)dropped);
    json_t *e = json_object_get(res, "error");
    if (e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        const char *stack = json_string_value(json_object_get(e, "stack"));
        conch_sb_printf(&b, "%s: %s", name ? name : "Error", msg ? msg : "");
        if (stack && *stack)
            conch_sb_printf(&b, "\n%s", stack);
    } else {
        json_t *v = json_object_get(res, "value");
        const char *type = json_string_value(json_object_get(res, "type"));
        char *dump = value_text ? NULL : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        const char *shown = type && strcmp(type, "undefined") == 0 ? "undefined"
                            : value_text                           ? value_text
                            : dump                                 ? dump
                                                                   : "?";
        conch_sb_printf(&b, "→ %s", shown);
        free(dump);
    }
    while (b.len && b.buf[b.len - 1] == '\n')
        conch_sb_trunc(&b, b.len - 1);
    json_t *j = conch_js_json_string(b.buf ? b.buf : "", b.len);
    conch_sb_done(&b);
    return j;
}
