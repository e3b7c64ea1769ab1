/* js-host.c - the globals a session's scripts see, over the host's C hooks: console.*
 * (captured, capped), readFile/writeFile (writes buffered until the eval succeeds, reads
 * seeing them), tools.<name>(input) (a promise per call, settled when the host answers, so
 * Promise.all runs calls concurrently), setTimeout/clearTimeout (fired by the eval loop).
 * The C functions reach the script only through closures made here, never by a global name. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "js/js-internal.h"

static struct conch_js_session *session_of(JSContext *ctx)
{
    return JS_GetContextOpaque(ctx);
}

/* A promise already settled with @v (taken): resolved, or rejected if @reject. */
static JSValue settled(JSContext *ctx, JSValue v, bool reject)
{
    JSValue funcs[2];
    JSValue p = JS_NewPromiseCapability(ctx, funcs);
    if (JS_IsException(p)) {
        JS_FreeValue(ctx, v);
        return p;
    }
    JSValue r = JS_Call(ctx, funcs[reject ? 1 : 0], JS_UNDEFINED, 1, &v);
    JS_FreeValue(ctx, r);
    JS_FreeValue(ctx, v);
    JS_FreeValue(ctx, funcs[0]);
    JS_FreeValue(ctx, funcs[1]);
    return p;
}

static JSValue error_value(JSContext *ctx, const char *msg)
{
    JSValue e = JS_NewError(ctx);
    if (!JS_IsException(e))
        JS_SetPropertyStr(ctx, e, "message", JS_NewString(ctx, msg));
    return e;
}

static JSValue js_emit(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    struct conch_js_session *s = session_of(ctx);
    size_t len;
    const char *level = JS_ToCString(ctx, argv[0]);
    const char *text = JS_ToCStringLen(ctx, &len, argv[1]);
    if (level && text) {
        if (s->console_bytes + len > s->limits.console_bytes) {
            s->console_dropped++;
        } else {
            s->console_bytes += len;
            json_t *l =
                json_pack("{s:s,s:o}", "level", level, "text", conch_js_json_string(text, len));
            json_array_append_new(s->console, l);
        }
    }
    JS_FreeCString(ctx, level);
    JS_FreeCString(ctx, text);
    return JS_UNDEFINED;
}

static JSValue js_read(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    struct conch_js_session *s = session_of(ctx);
    const char *path = JS_ToCString(ctx, argv[0]);
    if (!path)
        return JS_EXCEPTION;
    /* What this eval wrote and has not applied yet: the last write wins. */
    struct js_write *last = NULL;
    for (struct js_write *w = s->writes; w; w = w->next)
        if (strcmp(w->path, path) == 0)
            last = w;
    if (last) {
        JS_FreeCString(ctx, path);
        return settled(ctx, JS_NewStringLen(ctx, last->data, last->len), false);
    }
    struct conch_err err = {0};
    char *buf = NULL;
    size_t len = 0;
    int r = s->host.read_file ? s->host.read_file(s->host.data, path, &buf, &len, &err)
                              : conch_err_set(&err, ENOTSUP,
                                              "readFile '%s': this session has "
                                              "no file system",
                                              path);
    JS_FreeCString(ctx, path);
    if (r < 0)
        return settled(ctx, error_value(ctx, err.msg), true);
    JSValue str = JS_NewStringLen(ctx, buf, len);
    free(buf);
    return settled(ctx, str, false);
}

static JSValue js_write(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    struct conch_js_session *s = session_of(ctx);
    size_t len;
    const char *path = JS_ToCString(ctx, argv[0]);
    const char *data = path ? JS_ToCStringLen(ctx, &len, argv[1]) : NULL;
    if (!path || !data) {
        JS_FreeCString(ctx, path);
        return JS_EXCEPTION;
    }
    JSValue ret;
    struct js_write *w = NULL;
    if (len > s->limits.max_write_bytes - s->write_bytes || !*path) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 *path ? "writeFile: this eval's writes pass their cap of %zu bytes"
                       : "writeFile: the path is empty",
                 s->limits.max_write_bytes);
        ret = settled(ctx, error_value(ctx, msg), true);
    } else if (!(w = calloc(1, sizeof(*w))) || !(w->path = strdup(path)) ||
               !(w->data = malloc(len + 1))) {
        if (w)
            free(w->path);
        free(w);
        ret = JS_ThrowOutOfMemory(ctx);
    } else {
        memcpy(w->data, data, len);
        w->len = len;
        *s->writes_tail = w;
        s->writes_tail = &w->next;
        s->write_bytes += len;
        ret = settled(ctx, JS_UNDEFINED, false);
    }
    JS_FreeCString(ctx, path);
    JS_FreeCString(ctx, data);
    return ret;
}

static void trace_set(struct conch_js_session *s, size_t i, bool ok)
{
    json_object_set_new(json_array_get(s->trace, i), "ok", json_boolean(ok));
}

static JSValue js_tool(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    struct conch_js_session *s = session_of(ctx);
    const char *name = JS_ToCString(ctx, argv[0]);
    if (!name)
        return JS_EXCEPTION;
    char msg[600];
    if (s->n_calls >= s->limits.max_tool_calls) {
        snprintf(msg, sizeof(msg), "tools.%s: this eval made its %u tool calls, the most it may",
                 name, s->limits.max_tool_calls);
        JS_FreeCString(ctx, name);
        return settled(ctx, error_value(ctx, msg), true);
    }
    JSValue json = JS_JSONStringify(ctx, argv[1], JS_UNDEFINED, JS_UNDEFINED);
    size_t input_len = 0;
    const char *input = JS_IsException(json) || JS_IsUndefined(json)
                            ? NULL
                            : JS_ToCStringLen(ctx, &input_len, json);
    JS_FreeValue(ctx, json);
    if (input && input_len > CONCH_JS_MAX_TOOL_INPUT) {
        snprintf(msg, sizeof(msg), "tools.%s: the input is %zu bytes of JSON, more than %u", name,
                 input_len, CONCH_JS_MAX_TOOL_INPUT);
        JS_FreeCString(ctx, name);
        JS_FreeCString(ctx, input);
        return settled(ctx, error_value(ctx, msg), true);
    }
    if (!input) {
        JSValue exc = JS_GetException(ctx);
        JS_FreeCString(ctx, name);
        return settled(ctx, JS_IsNull(exc) ? error_value(ctx, "tool input is not JSON") : exc,
                       true);
    }
    struct js_call *c = calloc(1, sizeof(*c));
    JSValue funcs[2];
    JSValue p = c ? JS_NewPromiseCapability(ctx, funcs) : JS_ThrowOutOfMemory(ctx);
    if (JS_IsException(p)) {
        free(c);
        JS_FreeCString(ctx, name);
        JS_FreeCString(ctx, input);
        return p;
    }
    s->n_calls++;
    c->id = ++s->next_call_id;
    c->resolve = funcs[0];
    c->reject = funcs[1];
    c->trace = json_array_size(s->trace);
    json_array_append_new(s->trace,
                          json_pack("{s:I,s:s,s:n}", "id", (json_int_t)c->id, "name", name, "ok"));
    c->next = s->calls;
    s->calls = c;
    struct conch_err err = {0};
    int r = s->host.tool_start
                ? s->host.tool_start(s->host.data, s, c->id, name, input, &err)
                : conch_err_set(&err, ENOTSUP, "tools.%s: this session has no tool host", name);
    JS_FreeCString(ctx, name);
    JS_FreeCString(ctx, input);
    if (r < 0)
        conch_js_tool_answer(s, c->id, false, err.msg, strlen(err.msg));
    return p;
}

int conch_js_tool_answer(struct conch_js_session *s, uint64_t id, bool ok, const char *json,
                         size_t len)
{
    struct js_call **pp = &s->calls, *c;
    while ((c = *pp) && c->id != id)
        pp = &c->next;
    if (!c)
        return 1;
    *pp = c->next;
    JSContext *ctx = s->ctx;
    JSValue v;
    char *text = malloc(len + 1);
    if (!text) {
        v = JS_ThrowOutOfMemory(ctx);
    } else {
        memcpy(text, json, len);
        text[len] = '\0';
        if (ok) {
            v = JS_ParseJSON(ctx, text, len, "<tool result>");
        } else {
            /* The host's error: a JSON string's content, or the text as it came. */
            json_t *j = json_loadb(text, len, JSON_DECODE_ANY, NULL);
            json_t *m = json_is_object(j) ? json_object_get(j, "message") : j;
            v = error_value(ctx, json_is_string(m) ? json_string_value(m) : text);
            json_decref(j);
        }
        free(text);
    }
    bool resolve = ok && !JS_IsException(v);
    if (JS_IsException(v))
        v = JS_GetException(ctx);
    JSValue r = JS_Call(ctx, resolve ? c->resolve : c->reject, JS_UNDEFINED, 1, &v);
    JS_FreeValue(ctx, r);
    JS_FreeValue(ctx, v);
    JS_FreeValue(ctx, c->resolve);
    JS_FreeValue(ctx, c->reject);
    trace_set(s, c->trace, resolve);
    free(c);
    return 0;
}

static JSValue js_timer(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    struct conch_js_session *s = session_of(ctx);
    double ms = 0;
    if (JS_ToFloat64(ctx, &ms, argv[1]) < 0)
        return JS_EXCEPTION;
    if (!(ms >= 0))
        ms = 0;
    if (ms > 1e12)
        ms = 1e12;
    struct js_timer *t = calloc(1, sizeof(*t));
    if (!t)
        return JS_ThrowOutOfMemory(ctx);
    t->id = ++s->next_timer_id;
    t->due_ms = conch_clock_ms() + (uint64_t)ms;
    t->fn = JS_DupValue(ctx, argv[0]);
    /* Kept in due order; equal times fire in the order they were set. */
    struct js_timer **pp = &s->timers;
    while (*pp && (*pp)->due_ms <= t->due_ms)
        pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    return JS_NewInt64(ctx, (int64_t)t->id);
}

static JSValue js_clear(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    struct conch_js_session *s = session_of(ctx);
    int64_t id = 0;
    JS_ToInt64(ctx, &id, argv[0]);
    for (struct js_timer **pp = &s->timers; *pp; pp = &(*pp)->next)
        if ((int64_t)(*pp)->id == id) {
            struct js_timer *t = *pp;
            *pp = t->next;
            JS_FreeValue(ctx, t->fn);
            free(t);
            break;
        }
    return JS_UNDEFINED;
}

int conch_js_host_run_timers(struct conch_js_session *s, uint64_t now_ms)
{
    int fired = 0;
    while (s->timers && s->timers->due_ms <= now_ms) {
        struct js_timer *t = s->timers;
        s->timers = t->next;
        JSValue r = JS_Call(s->ctx, t->fn, JS_UNDEFINED, 0, NULL);
        if (JS_IsException(r)) {
            /* A timer's throw is the script's error: shown on the console, as Node would. */
            JSValue exc = JS_GetException(s->ctx);
            const char *m = JS_ToCString(s->ctx, exc);
            json_array_append_new(s->console,
                                  json_pack("{s:s,s:o}", "level", "error", "text",
                                            json_sprintf("Uncaught %s", m ? m : "exception")));
            JS_FreeCString(s->ctx, m);
            JS_FreeValue(s->ctx, exc);
        }
        JS_FreeValue(s->ctx, r);
        JS_FreeValue(s->ctx, t->fn);
        free(t);
        fired++;
        if (s->interrupted)
            break;
    }
    return fired;
}

int64_t conch_js_host_next_timer(struct conch_js_session *s, uint64_t now_ms)
{
    if (!s->timers)
        return -1;
    return s->timers->due_ms > now_ms ? (int64_t)(s->timers->due_ms - now_ms) : 0;
}

void conch_js_host_clear(struct conch_js_session *s)
{
    while (s->calls) {
        struct js_call *c = s->calls;
        s->calls = c->next;
        JS_FreeValue(s->ctx, c->resolve);
        JS_FreeValue(s->ctx, c->reject);
        free(c);
    }
    while (s->timers) {
        struct js_timer *t = s->timers;
        s->timers = t->next;
        JS_FreeValue(s->ctx, t->fn);
        free(t);
    }
    while (s->writes) {
        struct js_write *w = s->writes;
        s->writes = w->next;
        free(w->path);
        free(w->data);
        free(w);
    }
    s->writes_tail = &s->writes;
    s->write_bytes = 0;
    s->n_calls = 0;
}

/* Run one of conch's own scripts: its bytecode compiled at build time (js-bytecode-gen.c),
 * read in a few microseconds where compiling the source took most of a new session's time;
 * the source when there is none (or QuickJS refuses it). */
static JSValue run_builtin(JSContext *ctx, const uint8_t *bc, size_t bc_len, const char *source)
{
    if (bc_len) {
        JSValue f = JS_ReadObject(ctx, bc, bc_len, JS_READ_OBJ_BYTECODE);
        if (!JS_IsException(f))
            return JS_EvalFunction(ctx, f);
        JS_FreeValue(ctx, JS_GetException(ctx));
    }
    return JS_Eval(ctx, source, strlen(source), "<conch>", JS_EVAL_TYPE_GLOBAL);
}

int conch_js_host_install(struct conch_js_session *s, struct conch_err *err)
{
    JSContext *ctx = s->ctx;
    s->render =
        run_builtin(ctx, conch_js_render_bc, conch_js_render_bc_len, conch_js_render_source);
    JSValue boot = JS_IsException(s->render)
                       ? JS_EXCEPTION
                       : run_builtin(ctx, conch_js_bootstrap_bc, conch_js_bootstrap_bc_len,
                                     conch_js_bootstrap_source);
    if (JS_IsException(boot)) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        return conch_err_set(err, ENOMEM, "start the JavaScript session: out of memory");
    }
    JSValue args[7] = {
        JS_NewCFunction(ctx, js_emit, "emit", 2),
        JS_NewCFunction(ctx, js_read, "readFile", 1),
        JS_NewCFunction(ctx, js_write, "writeFile", 2),
        JS_NewCFunction(ctx, js_tool, "tool", 2),
        JS_NewCFunction(ctx, js_timer, "setTimeout", 2),
        JS_NewCFunction(ctx, js_clear, "clearTimeout", 1),
        JS_DupValue(ctx, s->render),
    };
    s->set_tools = JS_Call(ctx, boot, JS_UNDEFINED, 7, args);
    for (int i = 0; i < 7; i++)
        JS_FreeValue(ctx, args[i]);
    JS_FreeValue(ctx, boot);
    if (JS_IsException(s->set_tools)) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        return conch_err_set(err, ENOMEM, "start the JavaScript session: out of memory");
    }
    return conch_js_session_set_tools(s, NULL, 0, NULL, 0, err);
}

/* A tool name: letters, digits, '_', '$', '-' (the bridge's names are a subset). */
static bool is_tool_name(const char *n)
{
    if (!*n)
        return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '$' || *p == '-'))
            return false;
    return true;
}

static JSValue name_array(JSContext *ctx, const char *const *names, size_t n)
{
    JSValue arr = JS_NewArray(ctx);
    for (size_t i = 0; i < n && !JS_IsException(arr); i++)
        JS_SetPropertyUint32(ctx, arr, (uint32_t)i, JS_NewString(ctx, names[i]));
    return arr;
}

int conch_js_session_set_tools(struct conch_js_session *s, const char *const *names, size_t n,
                               const char *const *hidden, size_t n_hidden, struct conch_err *err)
{
    JSContext *ctx = s->ctx;
    for (size_t i = 0; i < n + n_hidden; i++) {
        const char *name = i < n ? names[i] : hidden[i - n];
        if (!is_tool_name(name))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "tool name '%s' is not 1 or more of letters, digits, '_', '$' "
                                  "and '-'",
                                  name);
    }
    JSValue args[2] = {name_array(ctx, names, n), name_array(ctx, hidden, n_hidden)};
    JSValue r = JS_IsException(args[0]) || JS_IsException(args[1])
                    ? JS_EXCEPTION
                    : JS_Call(ctx, s->set_tools, JS_UNDEFINED, 2, args);
    JS_FreeValue(ctx, args[0]);
    JS_FreeValue(ctx, args[1]);
    if (JS_IsException(r)) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        return conch_err_set(err, ENOMEM, "set the session's tools: out of memory");
    }
    JS_FreeValue(ctx, r);
    return 0;
}
