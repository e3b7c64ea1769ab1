/* js.h - the JavaScript/TypeScript engine: TypeScript type stripping (tree-sitter), engine
 * sessions (QuickJS: limits, deadlines, persistent globals, top-level await, a JSON-safe
 * result) with host hooks for files and tools, and the body of the JS worker process that
 * serves a session over a stream socket. The only module that includes quickjs.h and
 * tree_sitter/api.h. */
#ifndef CONCH_JS_JS_H
#define CONCH_JS_JS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* The longest code conch_js_strip_types parses (1 MiB). */
#define CONCH_JS_MAX_STRIP (1u << 20)

/*
 * conch_js_strip_types - TypeScript to JavaScript with the tree-sitter TypeScript grammar:
 * type syntax (interfaces, type aliases, annotations, generics, as/satisfies, non-null `!`,
 * optional `?` marks, type-only imports and exports, `declare`, overload signatures, access
 * modifiers, readonly, abstract, implements) becomes spaces, so every line and column of
 * the rest holds. Enums and namespaces become a real object (`var E = ...`, on their own
 * lines), and constructor parameter properties an assignment at the top of the
 * constructor's body.
 * Code that does not parse, or is longer than CONCH_JS_MAX_STRIP, is returned as given. *@ret_out
 * is a new NUL-terminated string (caller frees), *@ret_len its length (may be NULL). Returns 1 if
 * the code parsed and was stripped, 0 if it was returned as given, or -errno with @err filled (out
 * of memory).
 */
int conch_js_strip_types(const char *src, size_t len, char **ret_out, size_t *ret_len,
                         struct conch_err *err);

/* The exit status of a JS worker ended by its watchdog: an eval ran past its deadline in an
 * operation the engine cannot interrupt (a backtracking regular expression); it answered
 * that eval with a TimeoutError first, in a frame marked "ending": true. */
#define CONCH_JS_WATCHDOG_EXIT 3

/* The largest JSON input of one tool call (as the tool bridge's lines). */
#define CONCH_JS_MAX_TOOL_INPUT (4u << 20)
/* The longest timeout_ms or cpu_ms an eval takes (a larger one is this): 30 days. */
#define CONCH_JS_MAX_TIMEOUT_MS (30LL * 24 * 3600 * 1000)

/* An engine session's limits; conch_js_limits_default fills the defaults. */
struct conch_js_limits {
    size_t memory_bytes;     /* the engine's heap (JS_SetMemoryLimit); 0 = none. 256 MiB */
    size_t stack_bytes;      /* JS recursion's C stack (JS_SetMaxStackSize). 1 MiB */
    size_t console_bytes;    /* console text kept per eval; the rest counted, dropped. 64 KiB */
    size_t value_bytes;      /* the rendered value's JSON text, past which it is cut. 64 KiB */
    unsigned max_tool_calls; /* tool calls per eval; later calls reject at once. 1000 */
    size_t max_write_bytes;  /* buffered writeFile bytes per eval. 64 MiB */
};

/* conch_js_limits_default - fill @l with the defaults above. */
void conch_js_limits_default(struct conch_js_limits *l);

struct conch_js_session;

/*
 * What the host provides: every hook may be NULL (readFile/writeFile then fail with a clear
 * error; tools have no names). @data is passed back to each hook.
 */
struct conch_js_host {
    void *data;
    /* Read @path (as the script gave it) into a new buffer. Returns 0, or -errno with @err
     * (its message reaches the script as the rejection's message). */
    int (*read_file)(void *data, const char *path, char **ret_buf, size_t *ret_len,
                     struct conch_err *err);
    /* Write @path with @len bytes: called only after the eval succeeded, in script order. */
    int (*write_file)(void *data, const char *path, const char *buf, size_t len,
                      struct conch_err *err);
    /* Start tool call @id: @name as configured, @input its JSON text (borrowed). The host
     * answers later with conch_js_tool_answer, from inside wait or before it returns. A
     * negative return rejects the call's promise with @err's message. */
    int (*tool_start)(void *data, struct conch_js_session *s, uint64_t id, const char *name,
                      const char *input, struct conch_err *err);
    /* Block until an answer arrived (delivered with conch_js_tool_answer) or @timeout_ms
     * passed (-1: no limit). Returns 0, or -errno with @err when the host can wait no more
     * (its channel is gone): the eval then fails with that message. */
    int (*wait)(void *data, struct conch_js_session *s, int timeout_ms, struct conch_err *err);
};

/*
 * conch_js_session_new - a new engine session (a QuickJS runtime and context) with @limits
 * (NULL: defaults) and @host (copied; NULL: no hooks). Its globals: console, readFile,
 * writeFile, tools, setTimeout/clearTimeout. Returns 0 and *@ret_s, or -errno with @err.
 */
int conch_js_session_new(const struct conch_js_limits *limits, const struct conch_js_host *host,
                         struct conch_js_session **ret_s, struct conch_err *err);

/* conch_js_session_free - free @s and everything in it; accepts NULL. */
void conch_js_session_free(struct conch_js_session *s);

/*
 * conch_js_session_set_tools - the tools `tools.<name>(input)` offers, replacing any
 * earlier set (@names borrowed): each by its name (`tools["web-search"]`) and, when that
 * differs and is an identifier, by its camelCase form (web_search, web-search →
 * tools.webSearch; a real name wins over another's alias). tool_start gets the real name.
 * @hidden (@n_hidden names, may be NULL) are tools the session's setting leaves out: not
 * in `tools`, but `tools.NAME(...)` by one of their names rejects saying so (any other
 * missing name is undefined). `spawnAgent(task, type?)` calls tools.task({description:
 * task, subagent_type: type ?? "general-purpose"}), or rejects saying why there is none.
 * A name is letters, digits, '_', '$' and '-'. Returns 0 or -EINVAL/-ENOMEM with @err.
 */
int conch_js_session_set_tools(struct conch_js_session *s, const char *const *names, size_t n,
                               const char *const *hidden, size_t n_hidden, struct conch_err *err);

/* One eval's options; zero means the default. */
struct conch_js_eval_opts {
    int64_t timeout_ms;   /* wall deadline of the whole eval, pending promises included;
                             <= 0: none */
    int64_t cpu_ms;       /* CPU time the script may use (checked by the interrupt handler);
                             <= 0: the timeout's */
    const char *filename; /* the name in stacks and syntax errors; NULL: "<eval>" */
};

/*
 * conch_js_eval - run @code (TypeScript or JavaScript, @len bytes) in @s. Top-level
 * const/let/var/function/class/enum declarations become globals that later evals see (and
 * may declare again); top-level await works; the last expression statement's value is the
 * result. Code the TypeScript grammar cannot parse runs as a plain global script, so the
 * engine reports the real syntax error with its line. Buffered writes are applied when the
 * eval succeeded. *@ret_result is a new JSON object: {ok, value?, type?, error?: {name,
 * message, stack?, line?}, console: [{level, text}], console_dropped?, tool_calls: [{id,
 * name, ok}], writes: [path], text}. Returns 0 (whatever the script did), or -errno with
 * @err when the engine could not be driven (out of memory before the script ran).
 */
int conch_js_eval(struct conch_js_session *s, const char *code, size_t len,
                  const struct conch_js_eval_opts *opts, json_t **ret_result,
                  struct conch_err *err);

/*
 * conch_js_tool_answer - settle tool call @id: resolve its promise with @json (@len bytes of
 * JSON text) if @ok, else reject it with an Error whose message is @json's string (or its
 * text, or its "message" if it is an object). An unknown or finished @id is ignored (an answer that
 * came after its eval ended). Returns 0, 1 if ignored, or -errno.
 */
int conch_js_tool_answer(struct conch_js_session *s, uint64_t id, bool ok, const char *json,
                         size_t len);

/*
 * conch_js_worker_serve - the JS worker's body: serve one session over the stream socket
 * @fd (borrowed) until EOF. Frames both ways are a native-endian uint64_t length then that
 * many bytes of JSON (as the file workers'). Requests: {"method": "eval", "params": {code,
 * timeout_ms?, cpu_ms?, filename?, tools?: [names]}} → {"result": <conch_js_eval's
 * object>}; {"method": "reset"} → {"result": {"reset": true}} (a fresh session);
 * {"method": "tool_result", "params": {id, ok, value | error}} answers a call the worker
 * sent as {"tool_call": {id, name, input}} during an eval. Files are read and written
 * relative to the working directory. A malformed request gets {"error": {message}}.
 * Returns 0 at EOF, 1 on a broken channel.
 */
int conch_js_worker_serve(int fd, const struct conch_js_limits *limits);

#endif
