/* bridge-internal.h - what the tool bridge's files share: the bridge, its connections,
 * calls, deferred calls, registry entries and origins, and the functions one file calls in
 * another. bridge.c: the bridge's life and its listener; bridge-conn.c: connections, their
 * lines and what is written back; bridge-call.c: calls from the first line to the answer,
 * and calls deferred until their origin begins; bridge-registry.c: the registry of tools and
 * agent types, the origins and the trace. */
#ifndef CONCH_BRIDGE_BRIDGE_INTERNAL_H
#define CONCH_BRIDGE_BRIDGE_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

#include "bridge/bridge.h"
#include "core/budget.h"
#include "core/list.h"
#include "rpc/rpc.h"

/* CLOCK_MONOTONIC in milliseconds, with a fraction: calls take well under one. */
static inline double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

struct entry { /* a tool or an agent type */
    struct conch_list link;
    json_t *def; /* the registered definition (owned) */
    const char *name;
    void *owner;
    double timeout_s; /* 0: the bridge's */
};

struct origin {
    struct conch_list link;
    char kind[16];
    char id[64];
    uint64_t pidns;
    unsigned calls;   /* started so far (the cap counts these) */
    json_t *records;  /* this origin's call records */
    json_t *detached; /* {call_id, task, type} */
};

struct conn {
    struct conch_list link;
    struct conch_bridge *b;
    uv_pipe_t pipe;
    struct conch_rpc_framer framer;
    uint64_t pidns;
    bool have_pidns;
    bool closing;
    bool read_eof;  /* the caller shut its side: answer what it asked, then close */
    bool shutting;  /* uv_shutdown in progress */
    bool charged;   /* sizeof(struct conn) is charged to the budget */
    unsigned calls; /* in flight from this connection */
    uv_shutdown_t shutdown;
    /* A caller with no socket (conch_bridge_local_open): no pipe; its answers go to
     * local_answer, its calls to the origin local_kind/local_id. */
    void (*local_answer)(void *data, json_t *msg);
    void *local_data;
    char local_kind[16];
    char local_id[64];
};

struct conch_bridge_local {
    struct conn conn;
};

struct conch_bridge_call {
    struct conch_list link; /* in b->calls */
    struct conch_bridge *b;
    struct conn *conn; /* NULL once the caller went away */
    json_t *req_id;    /* the caller's id for the answer */
    char call_id[48];
    enum conch_bridge_kind kind;
    char *name; /* tool name, or agent type ("agent" when none) */
    json_t *input;
    char *task;
    char *type; /* NULL: the default agent */
    char origin_kind[16];
    char origin_id[64];
    void *owner;
    void *handle;
    double start_wall;
    double start_ms; /* monotonic, fractional */
    uv_timer_t timer;
    bool delivered;
    bool finishing; /* answered or failed: out of b->calls, whatever a send re-enters */
    size_t bytes;   /* its request line, counted in b->inflight_bytes */
    uint64_t held;  /* charged to b->budget: its parsed request, estimated (json_cost) */
};

/* A call that arrived before its command's origin began (the command can connect before
 * its supervisor's STARTED event reaches the host): replayed when the origin begins. */
struct deferred {
    struct conch_list link;
    struct conn *c;
    json_t *req;
    size_t bytes;
    uint64_t held; /* charged to b->budget (json_cost of the request) */
    double deadline_ms;
};
#define DEFER_MS 5000.0
#define DEFER_MAX 1024

struct conch_bridge {
    uv_loop_t *loop;
    uv_pipe_t *listener; /* NULL when not listening */
    char sandbox[64];
    struct conch_bridge_limits lim;
    const struct conch_bridge_ops *ops;
    void *ctx;
    struct conch_list tools, agents, origins, conns, calls, deferred;
    struct conch_list locals; /* struct conn of conch_bridge_local_open */
    unsigned n_deferred;
    uv_timer_t *defer_timer; /* while calls are deferred */
    unsigned n_conns, n_pending;
    size_t inflight_bytes;      /* request lines of the calls in flight */
    struct conch_budget budget; /* everything held for the sandbox; draws on lim.shared */
    uint64_t next_call;
    json_t *trace; /* the last lim.max_trace records */
    bool freeing;
    bool refusing;    /* conch_bridge_refuse: connections are closed unread */
    unsigned handles; /* open libuv handles: the memory goes with the last one */
};

/* ---- bridge.c ---- */

/* conch_bridge__maybe_free - free @b once conch_bridge_free ran and its last handle closed. */
void conch_bridge__maybe_free(struct conch_bridge *b);

/* ---- bridge-conn.c ---- */

/* conch_bridge__conn_send - send @msg (taken over) to @c (NULL: dropped) as one line. */
void conch_bridge__conn_send(struct conn *c, json_t *msg);
/* conch_bridge__error_msg - the error line {id, ok: false, error: {kind, message}}; new. */
json_t *conch_bridge__error_msg(json_t *id, const char *kind, const char *message);
/* conch_bridge__budget_state - what @b's budget holds, for a message, into @buf. */
void conch_bridge__budget_state(const struct conch_bridge *b, char *buf, size_t size);
/* conch_bridge__conn_close - close @c: its calls fail for their owners, its deferred calls go. */
void conch_bridge__conn_close(struct conn *c);
/* conch_bridge__on_connection - the listener's callback: accept a connection from inside. */
void conch_bridge__on_connection(uv_stream_t *server, int status);

/* ---- bridge-call.c ---- */

/* conch_bridge__call_fail - finish @c with an error: recorded, sent to its caller, cancelled
 * for its owner if it had it (@cancel_reason), freed. */
void conch_bridge__call_fail(struct conch_bridge_call *c, const char *kind, const char *message,
                             const char *cancel_reason);
/* conch_bridge__start_call - start a call (op "call", or "spawn" with @spawn) of @c's request
 * @req (borrowed; @bytes its line, @held its cost) or answer why not. *@charged: what the
 * caller already charged to the budget for this request; a call that keeps it takes @held of
 * it over (subtracted) instead of charging again; the caller uncharges what is left. */
void conch_bridge__start_call(struct conn *c, json_t *req, json_t *id, bool spawn, size_t bytes,
                              uint64_t held, uint64_t *charged);
/* conch_bridge__defer_call - keep @req of @c until its origin begins (its charge taken from
 * *@charged as for conch_bridge__start_call); false when it cannot. */
bool conch_bridge__defer_call(struct conn *c, json_t *req, size_t bytes, uint64_t held,
                              uint64_t *charged);
/* conch_bridge__conn_has_deferred - whether @c has calls waiting for their origin. */
bool conch_bridge__conn_has_deferred(struct conn *c);
/* conch_bridge__deferred_free - drop @d, uncharging it. */
void conch_bridge__deferred_free(struct conch_bridge *b, struct deferred *d);
/* conch_bridge__deferred_replay - start @d's call now (its origin began, or its time is up). */
void conch_bridge__deferred_replay(struct conch_bridge *b, struct deferred *d);

/* ---- bridge-registry.c ---- */

/* conch_bridge__entry_find - the entry named @name in the list @head, or NULL. */
struct entry *conch_bridge__entry_find(struct conch_list *head, const char *name);
/* conch_bridge__entries_free - free every entry of the list @head. */
void conch_bridge__entries_free(struct conch_list *head);
/* conch_bridge__list_json - {"tools", "agents"}: whole definitions with @full, else each
 * tool's name, description and input_schema. New reference. */
json_t *conch_bridge__list_json(struct conch_bridge *b, bool full);
/* conch_bridge__origin_find - the origin @kind @id, or NULL. */
struct origin *conch_bridge__origin_find(struct conch_bridge *b, const char *kind, const char *id);
/* conch_bridge__origin_of - the origin @c's calls belong to (asking the host to resolve
 * once), or NULL; check b->freeing and c->closing after it. */
struct origin *conch_bridge__origin_of(struct conn *c);
/* conch_bridge__origin_free - unlink and free @o. */
void conch_bridge__origin_free(struct origin *o);

#endif
