/* js-internal.h - what the files of src/js share: the code transform (js-strip.c), the
 * session's state (js-session.c), the host globals (js-host.c) and the value rendering
 * (js-render.c). */
#ifndef CONCH_JS_INTERNAL_H
#define CONCH_JS_INTERNAL_H

#include <quickjs.h>

#include "core/strbuf.h"
#include "js/js.h"

/* What conch_js_transform made of a script. */
struct conch_js_code {
    char *text; /* NUL-terminated; the script to run */
    size_t len;
    bool parsed;    /* false: the grammar found a syntax error and text is the input */
    char **globals; /* REPL mode: names the top level declares (to predeclare), owned */
    size_t n_globals;
};

/*
 * conch_js_transform - strip @src's types (see conch_js_strip_types); with @repl, also make
 * it a REPL cell: the whole script becomes `(async()=>{...\n})()` on the same lines, its
 * top-level declarations assignments to globals (listed in ->globals; functions and classes
 * copied to globalThis), its last expression statement the function's return value.
 * Code that does not parse is returned as given with ->parsed false (not wrapped). Returns
 * 0, or -ENOMEM with @err.
 */
int conch_js_transform(const char *src, size_t len, bool repl, struct conch_js_code *ret,
                       struct conch_err *err);

/* conch_js_code_done - free what @c holds; safe on a zeroed struct. */
void conch_js_code_done(struct conch_js_code *c);

/* A tool call waiting for the host's answer. */
struct js_call {
    uint64_t id;
    JSValue resolve, reject;
    size_t trace; /* index in the eval's tool_calls trace */
    struct js_call *next;
};

struct js_timer {
    uint64_t id;
    uint64_t due_ms;
    JSValue fn;
    struct js_timer *next;
};

struct js_write {
    char *path;
    char *data;
    size_t len;
    struct js_write *next;
};

struct conch_js_session {
    JSRuntime *rt;
    JSContext *ctx;
    struct conch_js_limits limits;
    struct conch_js_host host;
    JSValue render;    /* the value renderer (js-render.c) */
    JSValue set_tools; /* rebuilds globalThis.tools from a list of names */
    /* The eval under way. */
    uint64_t deadline_ms;     /* wall, conch_clock_ms; 0 = none */
    uint64_t cpu_deadline_ns; /* thread CPU time; 0 = none */
    bool interrupted;         /* the interrupt handler stopped the script */
    struct js_call *calls;
    uint64_t next_call_id;
    unsigned n_calls;
    struct js_timer *timers;
    uint64_t next_timer_id;
    struct js_write *writes, **writes_tail;
    size_t write_bytes;
    json_t *console; /* array of {level, text} */
    size_t console_bytes;
    size_t console_dropped;
    json_t *trace;       /* array of {id, name, ok} */
    uint64_t generation; /* which eval is under way (a late settle of an earlier one is dropped) */
    bool settled, settled_ok;
    JSValue outcome;
};

/* js-host.c: install the globals (console, readFile, writeFile, tools, timers) and keep
 * the renderer; 0 or -ENOMEM. */
int conch_js_host_install(struct conch_js_session *s, struct conch_err *err);
/* js-host.c: drop the eval's pending calls, timers and writes (their promises never settle). */
void conch_js_host_clear(struct conch_js_session *s);
/* js-host.c: fire the timers due by @now_ms; returns how many fired. */
int conch_js_host_run_timers(struct conch_js_session *s, uint64_t now_ms);
/* js-host.c: ms until the next timer (-1: none). */
int64_t conch_js_host_next_timer(struct conch_js_session *s, uint64_t now_ms);

/* js-render.c: the renderer's source (a function expression). */
extern const char conch_js_render_source[];
/* js-render.c: render @v as a JSON value (new reference), cut at the session's value cap;
 * *@ret_type is set to typeof-like text ("undefined", "bigint", "map", ...), static;
 * *@ret_text (if not NULL) to a new string of the value's JSON as JavaScript printed it. */
json_t *conch_js_render_value(struct conch_js_session *s, JSValueConst v, const char **ret_type,
                              char **ret_text);
/* js-render.c: a thrown value as {name, message, stack?, line?}; @filename finds the line. */
json_t *conch_js_render_error(struct conch_js_session *s, JSValueConst exc, const char *filename);
/* js-render.c: the text for a model: console lines, then `→ value` or the error. */
json_t *conch_js_result_text(json_t *res, const char *value_text);
/* js-render.c: a JSON string of @n bytes of @s, invalid UTF-8 repaired (U+FFFD). */
json_t *conch_js_json_string(const char *s, size_t n);

#endif
