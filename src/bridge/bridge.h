/* bridge.h - the tool bridge of one sandbox: programs inside call the harness's tools and
 * spawn its sub-agents through the unix socket /run/conch/ptc.sock (docs/TOOLS.md has the
 * line protocol). The bridge accepts those connections on a libuv loop, knows which command
 * each comes from (the pid namespace of the peer), checks every call against the registered
 * tools and their input schemas, hands the valid ones to their owner (the client that
 * registered the tool: ops->deliver), enforces the per-call timeout, the per-command call cap
 * and the payload cap, charges everything it holds for the sandbox to a budget (limits
 * max_held, shared), and records a trace of every call.
 *
 * Owners are opaque pointers of the host (the daemon's clients, conch run's tools file).
 * Single-threaded: every function runs on the loop given to conch_bridge_new. */
#ifndef CONCH_BRIDGE_BRIDGE_H
#define CONCH_BRIDGE_BRIDGE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/budget.h"
#include "core/error.h"

struct conch_bridge;
struct conch_bridge_call;

enum conch_bridge_kind {
    CONCH_BRIDGE_TOOL,
    CONCH_BRIDGE_AGENT,
};

struct conch_bridge_ops {
    /* Hand @c to @owner (it answers with conch_bridge_call_answer/fail, later). Returns 0,
     * or -1 when @owner cannot take it (the bridge then fails the call as unavailable). */
    int (*deliver)(void *ctx, void *owner, struct conch_bridge_call *c);
    /* The bridge gave up on a delivered @c before its answer (@reason: the call timed out,
     * its command ended, the sandbox stopped): forget it. @c is freed after the return. */
    void (*cancel)(void *ctx, void *owner, struct conch_bridge_call *c, const char *reason);
    /* A connection came from a pid namespace no origin has: the host may learn about a
     * command that just started (read its supervisor's events) and begin its origin. May be
     * NULL. */
    void (*resolve)(void *ctx);
};

struct conch_bridge_limits {
    double call_timeout_s; /* per call, unless the tool says otherwise (default 300) */
    unsigned max_calls;    /* per command (default 10000) */
    unsigned max_pending;  /* calls in flight in the sandbox (default 1024) */
    size_t max_payload;    /* bytes of one request or answer line (default 4 MiB) */
    unsigned max_conns;    /* connections at once (default 1024) */
    unsigned max_trace;    /* records kept for tools.trace (default 10000) */
    /* Bytes the bridge may hold for its sandbox (default 64 MiB): partial request lines,
     * answers queued to callers that do not read them, calls in flight and waiting (their
     * parsed JSON, estimated), open connections. A connection whose next bytes would not fit
     * is closed with an error line; a call that would not fit is answered "limit". */
    uint64_t max_held;
    /* The budget the bridge's draws on too (the sandbox's, which draws on the daemon's),
     * borrowed: it must outlive the bridge until conch_bridge_free returns; or NULL. With
     * max_held 0 the bridge has no cap of its own, only @shared's. */
    struct conch_budget *shared;
};

/* conch_bridge_limits_init - the defaults above. */
void conch_bridge_limits_init(struct conch_bridge_limits *l);

/*
 * conch_bridge_new - a bridge for sandbox @sandbox (its id, copied: it appears in
 * deliveries) on @loop, not listening yet. Returns 0 with *@ret, or -ENOMEM with @err.
 */
int conch_bridge_new(uv_loop_t *loop, const char *sandbox, const struct conch_bridge_limits *limits,
                     const struct conch_bridge_ops *ops, void *ctx, struct conch_bridge **ret,
                     struct conch_err *err);

/*
 * conch_bridge_listen - serve @listen_fd (taken over: a listening unix stream socket, the
 * one conch_jail_take_ptc_fd gives) instead of the previous one, whose connections are
 * closed; -1 just stops listening (the sandbox stopped). The registry, the origins and the
 * trace stay: a sandbox restarted over its workspace keeps its tools. Returns 0, or -errno
 * with @err (and @listen_fd closed).
 */
int conch_bridge_listen(struct conch_bridge *b, int listen_fd, struct conch_err *err);

/*
 * conch_bridge_refuse - with @refuse, every connection from inside, open or new, is closed
 * without a byte read or answered (the sandbox is lent to a client that drives it itself,
 * and has no tools); without, connections are served again.
 */
void conch_bridge_refuse(struct conch_bridge *b, bool refuse);

/* conch_bridge_free - stop serving: every pending call is failed for its caller and
 * cancelled for its owner (reason "the sandbox stopped"), no op is called after this
 * returns, and the memory goes once libuv has closed the handles. What it held is uncharged
 * from limits.shared before it returns. NULL is a no-op. */
void conch_bridge_free(struct conch_bridge *b);

/* ---- Registry --------------------------------------------------------------------------- */

/*
 * conch_bridge_register - add or replace (by name) tools ([{name, description, input_schema,
 * output_schema?, timeout?}]) or, with @agents, agent types ([{name, description}]) owned by
 * @owner. Everything is checked before anything changes. *@ret_names: a new array of the
 * names. Returns 0 or -EINVAL with @err (kind usage) naming the bad entry.
 */
int conch_bridge_register(struct conch_bridge *b, bool agents, json_t *defs, void *owner,
                          json_t **ret_names, struct conch_err *err);

/* conch_bridge_check_defs - the checks of conch_bridge_register on @defs alone (a tools
 * file read before any sandbox exists). Returns 0 or -EINVAL with @err. */
int conch_bridge_check_defs(bool agents, json_t *defs, struct conch_err *err);

/* conch_bridge_unregister - remove tools (or agent types) by name, whoever owns them.
 * Returns a new array of the names that were there. */
json_t *conch_bridge_unregister(struct conch_bridge *b, bool agents, json_t *names);

/* conch_bridge_drop_owner - @owner went away: its tools and agent types go, and the calls
 * it was answering fail as unavailable for their callers. */
void conch_bridge_drop_owner(struct conch_bridge *b, void *owner);

/* conch_bridge_used - whether anything was registered on @b or anything reached it (a call,
 * a record in its trace, a connection or an origin): a sandbox whose bridge was used is not
 * made as new for another client (its tools and trace would carry over). NULL: false. */
bool conch_bridge_used(const struct conch_bridge *b);

/* conch_bridge_list - {"tools": [...], "agents": [...]}, new reference. */
json_t *conch_bridge_list(struct conch_bridge *b);

/* conch_bridge_prompt - the registered tools and agent types as a system-prompt section
 * (@languages: CONCH_TOOLSCHEMA_* bits, 0 = all). malloc'd text, NULL if out of memory. */
char *conch_bridge_prompt(struct conch_bridge *b, unsigned languages);

/* ---- Origins: who calls ------------------------------------------------------------------ */

/*
 * conch_bridge_origin_begin - calls from pid namespace @pidns (0: from anywhere, for a
 * sandbox that runs one command) belong to the origin @kind ("exec", "job", "session",
 * "run") @id from now on. Returns 0, or -ENOMEM.
 */
int conch_bridge_origin_begin(struct conch_bridge *b, const char *kind, const char *id,
                              uint64_t pidns);

/* What an origin did, for its result. Owned by the caller: conch_bridge_report_done. */
struct conch_bridge_report {
    json_t *calls;    /* array of call records, in order of start */
    json_t *detached; /* array of {call_id, task, type}: spawn_agent --detach */
    char *summary;    /* "[tools: 3 calls (a=2, b=1), 3 ok, 0 failed, 0.1 s]", NULL if none */
};

/* conch_bridge_origin_end - the origin's command ended: its calls still pending are failed
 * (cancelled for their owners) and *@ret gets what it did (zeroed when unknown). */
void conch_bridge_origin_end(struct conch_bridge *b, const char *kind, const char *id,
                             struct conch_bridge_report *ret);
void conch_bridge_report_done(struct conch_bridge_report *r);

/* conch_bridge_origin_take - what a live origin did since it began or since the last take
 * (a session's shell lives on across its commands: each command's result takes its own
 * calls). Calls still in flight stay with the origin. *@ret is zeroed when it is unknown. */
void conch_bridge_origin_take(struct conch_bridge *b, const char *kind, const char *id,
                              struct conch_bridge_report *ret);

/* conch_bridge_trace - the recorded calls (the last max_trace), of one origin when @kind and
 * @id are given. New reference. */
json_t *conch_bridge_trace(struct conch_bridge *b, const char *kind, const char *id);

/* ---- Callers with no socket --------------------------------------------------------------- */

/* A caller the host relays (a JS worker, which has no socket: its calls come over the
 * daemon's channel to it). Its calls are checked, capped, delivered, timed out, traced and
 * recorded exactly as a socket's, under an origin of its own. */
struct conch_bridge_local;

/*
 * conch_bridge_local_open - a caller whose calls belong to a new origin @kind @id (cut to
 * 15 and 63 bytes; it must not be live), which no socket's peer matches. Each answer (a
 * line a socket's caller would get: {id, ok, result} or {id, ok: false, error: {kind,
 * message}}, taken over) goes to @answer(@data, msg), possibly from inside
 * conch_bridge_local_line. Returns 0 with *@ret, or -errno with @err.
 */
int conch_bridge_local_open(struct conch_bridge *b, const char *kind, const char *id,
                            void (*answer)(void *data, json_t *msg), void *data,
                            struct conch_bridge_local **ret, struct conch_err *err);

/* conch_bridge_local_line - one request line of @l ({"op": "call"|"spawn"|"list", "id", ...},
 * as docs/TOOLS.md's), charged to the budget as a socket's line. */
void conch_bridge_local_line(struct conch_bridge_local *l, const char *line, size_t len);

/* conch_bridge_local_request - conch_bridge_local_line of a request already parsed: @req
 * (borrowed; a JSON object, parsed with JSON_REJECT_DUPLICATES as a line would be), charged as
 * a line of @len bytes whose text is @text (what the host read it from). */
void conch_bridge_local_request(struct conch_bridge_local *l, json_t *req, const char *text,
                                size_t len);

/* conch_bridge_local_close - @l is done: its calls still in flight fail (cancelled for their
 * owners), no answer reaches @answer after this, its origin ends and *@ret (NULL: dropped)
 * gets what it did. @l is freed; NULL is a no-op. Safe after conch_bridge_free. */
void conch_bridge_local_close(struct conch_bridge_local *l, struct conch_bridge_report *ret);

/* ---- A call, as its owner sees it --------------------------------------------------------- */

enum conch_bridge_kind conch_bridge_call_kind(const struct conch_bridge_call *c);
const char *conch_bridge_call_id(const struct conch_bridge_call *c);
/* conch_bridge_call_params - the delivery's params: {sandbox, call_id, name, input, origin}
 * for a tool, {sandbox, call_id, task, type, origin} for an agent. New reference. */
json_t *conch_bridge_call_params(const struct conch_bridge_call *c);
/* The owner's own handle for @c (e.g. its request id). */
void conch_bridge_call_set_handle(struct conch_bridge_call *c, void *handle);
void *conch_bridge_call_handle(const struct conch_bridge_call *c);

/* conch_bridge_call_answer - the owner's result (taken over) reaches the caller; @c is freed. */
void conch_bridge_call_answer(struct conch_bridge_call *c, json_t *result);
/* conch_bridge_call_fail - the call failed (@kind "tool_error", "unavailable", ...): the
 * caller gets @message; @c is freed. */
void conch_bridge_call_fail(struct conch_bridge_call *c, const char *kind, const char *message);

#endif
