/* js-session.c - an engine session: one QuickJS runtime and context with a heap limit, a
 * stack limit and an interrupt handler holding the eval's deadlines; an eval runs a REPL
 * cell (js-strip.c) and then its promise's jobs, timers and tool answers until it settles,
 * its deadline passes or nothing is left that could settle it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "js/js-internal.h"

void conch_js_limits_default(struct conch_js_limits *l)
{
    *l = (struct conch_js_limits){
        .memory_bytes = 256u << 20,
        .stack_bytes = 1u << 20,
        .console_bytes = 64u << 10,
        .value_bytes = 64u << 10,
        .max_tool_calls = 1000,
        .max_write_bytes = 64u << 20,
    };
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* QuickJS calls this every few thousand operations: a script past a deadline stops with an
 * uncatchable "interrupted" error, however it loops. */
static int interrupt(JSRuntime *rt, void *opaque)
{
    struct conch_js_session *s = opaque;
    if ((s->deadline_ms && conch_clock_ms() >= s->deadline_ms) ||
        (s->cpu_deadline_ns && thread_cpu_ns() >= s->cpu_deadline_ns)) {
        s->interrupted = true;
        return 1;
    }
    return 0;
}

int conch_js_session_new(const struct conch_js_limits *limits, const struct conch_js_host *host,
                         struct conch_js_session **ret_s, struct conch_err *err)
{
    struct conch_js_session *s = calloc(1, sizeof(*s));
    if (!s)
        return conch_err_set(err, ENOMEM, "new JavaScript session: out of memory");
    if (limits)
        s->limits = *limits;
    else
        conch_js_limits_default(&s->limits);
    if (host)
        s->host = *host;
    s->writes_tail = &s->writes;
    s->render = s->set_tools = s->outcome = JS_UNDEFINED;
    s->rt = JS_NewRuntime();
    s->ctx = s->rt ? JS_NewContext(s->rt) : NULL;
    if (!s->ctx) {
        conch_js_session_free(s);
        return conch_err_set(err, ENOMEM, "new JavaScript session: out of memory");
    }
    if (s->limits.memory_bytes)
        JS_SetMemoryLimit(s->rt, s->limits.memory_bytes);
    JS_SetMaxStackSize(s->rt, s->limits.stack_bytes);
    JS_SetInterruptHandler(s->rt, interrupt, s);
    JS_SetContextOpaque(s->ctx, s);
    int r = conch_js_host_install(s, err);
    if (r < 0) {
        conch_js_session_free(s);
        return r;
    }
    *ret_s = s;
    return 0;
}

void conch_js_session_free(struct conch_js_session *s)
{
    if (!s)
        return;
    if (s->ctx) {
        conch_js_host_clear(s);
        JS_FreeValue(s->ctx, s->render);
        JS_FreeValue(s->ctx, s->set_tools);
        JS_FreeValue(s->ctx, s->outcome);
        JS_FreeContext(s->ctx);
    }
    if (s->rt)
        JS_FreeRuntime(s->rt);
    json_decref(s->console);
    json_decref(s->trace);
    free(s);
}

/* The wrapper's promise settles into s->outcome; data[0] says how, data[1] which eval. */
static JSValue on_settle(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv,
                         int magic, JSValue *data)
{
    struct conch_js_session *s = JS_GetContextOpaque(ctx);
    int64_t gen = 0;
    JS_ToInt64(ctx, &gen, data[1]);
    if ((uint64_t)gen != s->generation || s->settled)
        return JS_UNDEFINED; /* a cell an earlier eval gave up on */
    s->settled = true;
    s->settled_ok = JS_ToBool(ctx, data[0]);
    JS_FreeValue(ctx, s->outcome);
    s->outcome = JS_DupValue(ctx, argc > 0 ? argv[0] : JS_UNDEFINED);
    return JS_UNDEFINED;
}

static int watch(struct conch_js_session *s, JSValue promise)
{
    JSContext *ctx = s->ctx;
    JSValue gen = JS_NewInt64(ctx, (int64_t)s->generation);
    JSValue d_ok[2] = {JS_TRUE, gen}, d_fail[2] = {JS_FALSE, gen};
    JSValue fns[2] = {JS_NewCFunctionData(ctx, on_settle, 1, 0, 2, d_ok),
                      JS_NewCFunctionData(ctx, on_settle, 1, 0, 2, d_fail)};
    JSValue then = JS_GetPropertyStr(ctx, promise, "then");
    JSValue r = JS_Call(ctx, then, promise, 2, fns);
    int ret = JS_IsException(r) ? -1 : 0;
    JS_FreeValue(ctx, r);
    JS_FreeValue(ctx, then);
    JS_FreeValue(ctx, fns[0]);
    JS_FreeValue(ctx, fns[1]);
    return ret;
}

/* The eval ended with the pending exception. */
static void fail_with_exception(struct conch_js_session *s)
{
    JS_FreeValue(s->ctx, s->outcome);
    s->outcome = JS_GetException(s->ctx);
    s->settled = true;
    s->settled_ok = false;
}

static void run_jobs(struct conch_js_session *s)
{
    JSContext *job_ctx;
    while (JS_IsJobPending(s->rt)) {
        if (JS_ExecutePendingJob(s->rt, &job_ctx) < 0) {
            /* Only what a promise cannot catch: the deadline, or no memory left. */
            fail_with_exception(s);
            return;
        }
    }
}

static json_t *timeout_error(struct conch_js_session *s, const char *what, int64_t ms)
{
    return json_pack("{s:s,s:o}", "name", "TimeoutError", "message",
                     json_sprintf("%s (%lld ms)", what, (long long)ms));
}

int conch_js_eval(struct conch_js_session *s, const char *code, size_t len,
                  const struct conch_js_eval_opts *opts, json_t **ret_result, struct conch_err *err)
{
    static const struct conch_js_eval_opts no_opts;
    if (!opts)
        opts = &no_opts;
    const char *filename = opts->filename ? opts->filename : "<eval>";
    struct conch_js_code cell;
    int r = conch_js_transform(code, len, true, &cell, err);
    if (r < 0)
        return r;
    JSContext *ctx = s->ctx;
    s->generation++;
    s->settled = s->settled_ok = s->interrupted = false;
    JS_FreeValue(ctx, s->outcome);
    s->outcome = JS_UNDEFINED;
    json_decref(s->console);
    json_decref(s->trace);
    s->console = json_array();
    s->trace = json_array();
    s->console_bytes = s->console_dropped = 0;
    int64_t timeout = opts->timeout_ms > 0 ? opts->timeout_ms : 0;
    int64_t cpu = opts->cpu_ms > 0 ? opts->cpu_ms : timeout;
    if (timeout > CONCH_JS_MAX_TIMEOUT_MS)
        timeout = CONCH_JS_MAX_TIMEOUT_MS;
    if (cpu > CONCH_JS_MAX_TIMEOUT_MS)
        cpu = CONCH_JS_MAX_TIMEOUT_MS;
    uint64_t start = conch_clock_ms();
    s->deadline_ms = timeout ? start + (uint64_t)timeout : 0;
    s->cpu_deadline_ns = cpu ? thread_cpu_ns() + (uint64_t)cpu * 1000000u : 0;
    /* The stack limit counts from here: the caller's frames are not the script's. */
    JS_UpdateStackTop(s->rt);

    json_t *error = NULL;
    char *value_text = NULL;
    if (cell.parsed) {
        /* Names the cell declares exist as globals before it runs (so that its
         * assignments to them work in strict code too); existing values are kept. */
        JSValue global = JS_GetGlobalObject(ctx);
        for (size_t i = 0; i < cell.n_globals; i++) {
            JSAtom a = JS_NewAtom(ctx, cell.globals[i]);
            if (JS_HasProperty(ctx, global, a) == 0)
                JS_DefinePropertyValue(ctx, global, a, JS_UNDEFINED,
                                       JS_PROP_WRITABLE | JS_PROP_ENUMERABLE |
                                           JS_PROP_CONFIGURABLE);
            JS_FreeAtom(ctx, a);
        }
        JS_FreeValue(ctx, global);
        JSValue promise = JS_Eval(ctx, cell.text, cell.len, filename, JS_EVAL_TYPE_GLOBAL);
        if (JS_IsException(promise))
            fail_with_exception(s);
        else if (watch(s, promise) < 0)
            fail_with_exception(s);
        JS_FreeValue(ctx, promise);
    } else {
        /* Not TypeScript the grammar knows: as a plain script, whose completion value is
         * the result; a syntax error is the engine's, with its line. */
        JSValue v = JS_Eval(ctx, cell.text, cell.len, filename, JS_EVAL_TYPE_GLOBAL);
        if (JS_IsException(v)) {
            fail_with_exception(s);
        } else {
            s->settled = s->settled_ok = true;
            s->outcome = v;
        }
    }
    conch_js_code_done(&cell);

    while (!s->settled || JS_IsJobPending(s->rt)) {
        run_jobs(s);
        uint64_t now = conch_clock_ms();
        if (!s->settled || s->timers)
            conch_js_host_run_timers(s, now);
        if (s->settled && !JS_IsJobPending(s->rt))
            break;
        if (s->interrupted)
            break;
        if (JS_IsJobPending(s->rt))
            continue;
        now = conch_clock_ms();
        if (s->deadline_ms && now >= s->deadline_ms) {
            error = timeout_error(s, "the eval's promise did not settle by its deadline", timeout);
            break;
        }
        int64_t wait = conch_js_host_next_timer(s, now);
        if (!s->calls && wait < 0) {
            error = json_pack("{s:s,s:s}", "name", "TimeoutError", "message",
                              "the eval awaits a promise that nothing can settle: no tool "
                              "call or timer is pending");
            break;
        }
        if (s->deadline_ms) {
            int64_t left = (int64_t)(s->deadline_ms - now);
            if (wait < 0 || wait > left)
                wait = left;
        }
        if (wait > 0 || (wait < 0 && s->calls)) {
            if (!s->calls) {
                struct timespec ts = {.tv_sec = wait / 1000, .tv_nsec = (wait % 1000) * 1000000};
                nanosleep(&ts, NULL);
            } else {
                struct conch_err werr = {0};
                if (!s->host.wait ||
                    s->host.wait(s->host.data, s, wait > INT32_MAX ? INT32_MAX : (int)wait, &werr) <
                        0) {
                    error = json_pack("{s:s,s:s}", "name", "HostError", "message",
                                      s->host.wait ? werr.msg
                                                   : "tool calls are pending and the host "
                                                     "cannot wait for their answers");
                    break;
                }
            }
        }
    }

    json_t *res = json_object();
    if (s->interrupted && !error) {
        bool wall = s->deadline_ms && conch_clock_ms() >= s->deadline_ms;
        error = wall ? timeout_error(s, "the script ran past the eval's deadline", timeout)
                     : timeout_error(s, "the script used more CPU time than the eval allows", cpu);
        JS_FreeValue(ctx, s->outcome);
        s->outcome = JS_UNDEFINED;
    }
    if (!error && s->settled && !s->settled_ok)
        error = conch_js_render_error(s, s->outcome, filename);
    if (!error) {
        /* Rendering may run getters and toJSON: it gets what is left of the deadlines,
         * and at least a moment past them. */
        if (s->deadline_ms && s->deadline_ms < conch_clock_ms() + 100)
            s->deadline_ms = conch_clock_ms() + 100;
        if (s->cpu_deadline_ns && s->cpu_deadline_ns < thread_cpu_ns() + 100000000u)
            s->cpu_deadline_ns = thread_cpu_ns() + 100000000u;
        const char *type = "undefined";
        json_object_set_new(res, "value", conch_js_render_value(s, s->outcome, &type, &value_text));
        json_object_set_new(res, "type", json_string(type));
    }
    s->deadline_ms = 0;
    s->cpu_deadline_ns = 0;
    /* Writes land only when the script succeeded; the first failure ends them. */
    json_t *writes = json_array();
    if (!error) {
        for (struct js_write *w = s->writes; w; w = w->next) {
            struct conch_err werr = {0};
            int wr = s->host.write_file
                         ? s->host.write_file(s->host.data, w->path, w->data, w->len, &werr)
                         : conch_err_set(&werr, ENOTSUP,
                                         "writeFile '%s': this session has no "
                                         "file system",
                                         w->path);
            if (wr < 0) {
                error = json_pack("{s:s,s:s}", "name", "WriteError", "message", werr.msg);
                free(value_text);
                value_text = NULL;
                json_object_del(res, "value");
                json_object_del(res, "type");
                break;
            }
            json_array_append_new(writes, json_string(w->path));
        }
    }
    conch_js_host_clear(s);
    JS_FreeValue(ctx, s->outcome);
    s->outcome = JS_UNDEFINED;
    json_object_set_new(res, "ok", json_boolean(!error));
    if (error)
        json_object_set_new(res, "error", error);
    json_object_set_new(res, "console", s->console);
    if (s->console_dropped)
        json_object_set_new(res, "console_dropped", json_integer((json_int_t)s->console_dropped));
    json_object_set_new(res, "tool_calls", s->trace);
    json_object_set_new(res, "writes", writes);
    s->console = s->trace = NULL;
    json_object_set_new(res, "text", conch_js_result_text(res, value_text));
    free(value_text);
    *ret_result = res;
    return 0;
}
