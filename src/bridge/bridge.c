/* bridge.c - one sandbox's tool bridge: the listener on /run/conch/ptc.sock (accepted on the
 * host's libuv loop), its connections and their line protocol, the registry of tools and
 * agent types, the calls in flight with their timeouts, the origins (which command a call
 * comes from, by pid namespace) and the trace. See bridge.h and docs/TOOLS.md. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bridge/bridge.h"
#include "core/cleanup.h"
#include "core/clock.h"
#include "rpc/rpc.h"
#include "toolschema/toolschema.h"

/* A doubly-linked list node (circular, with a head). */
struct node {
    struct node *prev, *next;
};
#define NODE_INIT(n) ((n)->prev = (n)->next = (n))
#define node_entry(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))
static void node_add(struct node *head, struct node *n)
{
    n->prev = head->prev;
    n->next = head;
    head->prev->next = n;
    head->prev = n;
}
static void node_del(struct node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    NODE_INIT(n);
}

/* CLOCK_MONOTONIC in milliseconds, with a fraction: calls take well under one. */
static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

struct entry { /* a tool or an agent type */
    struct node link;
    json_t *def; /* the registered definition (owned) */
    const char *name;
    void *owner;
    double timeout_s; /* 0: the bridge's */
};

struct origin {
    struct node link;
    char kind[16];
    char id[64];
    uint64_t pidns;
    unsigned calls;   /* started so far (the cap counts these) */
    json_t *records;  /* this origin's call records */
    json_t *detached; /* {call_id, task, type} */
};

struct conn {
    struct node link;
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
};

struct conch_bridge_call {
    struct node link; /* in b->calls */
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
    struct node link;
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
    struct node tools, agents, origins, conns, calls, deferred;
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

void conch_bridge_limits_init(struct conch_bridge_limits *l)
{
    l->call_timeout_s = 300;
    l->max_calls = 10000;
    l->max_pending = 1024;
    l->max_payload = 4u << 20;
    l->max_conns = 1024;
    l->max_trace = 2000;
    l->max_held = 64u << 20;
    l->shared = NULL;
}

static void bridge_maybe_free(struct conch_bridge *b)
{
    if (!b->freeing || b->handles)
        return;
    /* Everything charged went with its holder (the last of which closed with the handles);
     * whatever a slip left must not stay charged to the daemon-wide budget forever. */
    conch_budget_uncharge(b->budget.parent, conch_budget_held(&b->budget));
    json_decref(b->trace);
    free(b);
}

/* ---- Writing to a caller ----------------------------------------------------------------- */

/* Answers a connection may leave unread before it is closed. */
#define CONN_OUTPUT_MAX (16u << 20)
/* A call's input and result are kept whole in its record up to this size (serialised);
 * larger ones are kept as a preview, so a trace stays small whatever the payloads. */
#define RECORD_VALUE_MAX 1024
/* Bytes of calls in flight in one sandbox (each is held here and sent to the harness). */
#define INFLIGHT_BYTES_MAX (16u << 20)
/* Input nested deeper than this is refused inside: common JSON parsers (Python's) fail on
 * a few hundred levels, and a harness's reader must not be killed by one call. */
#define INPUT_DEPTH_MAX 64
/* spawn_agent --detach: the requests are kept for the command's result. */
#define DETACHED_MAX 256
/* Tools (and agent types) a sandbox may have registered. */
#define REGISTRY_MAX 4096
#define DETACHED_TASK_MAX (256u << 10)
/* What one parsed JSON value costs at most, about (json_cost). */
#define JSON_VALUE_COST 64

struct write_req {
    uv_write_t req;
    struct conch_bridge *b; /* alive: a closing pipe cancels its writes before it closes */
    char *line;
    size_t len; /* charged to b->budget */
};

static void on_written(uv_write_t *req, int status)
{
    (void)status;
    struct write_req *w = (struct write_req *)req;
    conch_budget_uncharge(&w->b->budget, w->len);
    free(w->line);
    free(w);
}

static void conn_close(struct conn *c);

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    conn_close(req->data);
}

static bool conn_has_deferred(struct conn *c);

/* A caller that shut its side is closed once its calls are answered (and the answers sent:
 * uv_shutdown waits for the queued writes). */
static void conn_maybe_finish(struct conn *c)
{
    if (c->closing || c->shutting || !c->read_eof || c->calls || conn_has_deferred(c))
        return;
    c->shutting = true;
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->pipe, on_shutdown) < 0)
        conn_close(c);
}

/* Send @msg (taken over) to @c as one line. */
static void conn_send(struct conn *c, json_t *msg)
{
    if (!c || c->closing || !msg) {
        json_decref(msg);
        return;
    }
    /* A caller that does not read its answers is cut off before they pile up here. */
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CONN_OUTPUT_MAX) {
        json_decref(msg);
        conn_close(c);
        return;
    }
    char *line = conch_rpc_dumps(msg);
    json_decref(msg);
    struct write_req *w = line ? malloc(sizeof(*w)) : NULL;
    if (!w) {
        free(line);
        conn_close(c);
        return;
    }
    w->b = c->b;
    w->line = line;
    w->len = strlen(line);
    uv_buf_t buf = uv_buf_init(line, (unsigned)w->len);
    /* The line is held until its write completes (a callback on a later turn of the loop),
     * whatever the kernel takes at once: charge it all. When it does not fit, only what the
     * kernel takes now may go: a short answer to a caller that reads still reaches it; a
     * caller that leaves answers unread is cut off. */
    if (conch_budget_charge(&c->b->budget, w->len, NULL) < 0) {
        bool sent = uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) == 0 &&
                    uv_try_write((uv_stream_t *)&c->pipe, &buf, 1) == (int)w->len;
        free(line);
        free(w);
        if (sent)
            conn_maybe_finish(c);
        else
            conn_close(c);
        return;
    }
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_written) < 0) {
        conch_budget_uncharge(&c->b->budget, w->len);
        free(line);
        free(w);
        conn_close(c);
        return;
    }
    conn_maybe_finish(c);
}

static json_t *error_msg(json_t *id, const char *kind, const char *message)
{
    return json_pack("{s:O,s:b,s:{s:s,s:s}}", "id", id ? id : json_null(), "ok", 0, "error", "kind",
                     kind, "message", message);
}

/* What the budget holds, for a message: "the tool bridge holds N of its M MiB for this
 * sandbox (the daemon's bridges: N of M MiB)". */
static void budget_state(const struct conch_bridge *b, char *buf, size_t size)
{
    const struct conch_budget *p = b->budget.parent;
    int n = snprintf(buf, size, "the tool bridge holds %llu bytes of its %llu MiB for this sandbox",
                     (unsigned long long)conch_budget_held(&b->budget),
                     (unsigned long long)(b->budget.cap >> 20));
    if (p && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, " (all sandboxes: %llu bytes of %llu MiB)",
                 (unsigned long long)conch_budget_held(p), (unsigned long long)(p->cap >> 20));
}

/* Close @c for the budget, telling the caller why (@what: what did not fit) with a line the
 * kernel takes at once or not at all: nothing more may be held for it. */
static void conn_refuse(struct conn *c, const char *what)
{
    char state[256], msg[512];
    budget_state(c->b, state, sizeof(state));
    snprintf(msg, sizeof(msg), "%s: %s; connection closed", what, state);
    json_t *m = error_msg(NULL, "limit", msg);
    char *line = m ? conch_rpc_dumps(m) : NULL;
    json_decref(m);
    if (line && uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) == 0) {
        uv_buf_t buf = uv_buf_init(line, (unsigned)strlen(line));
        (void)uv_try_write((uv_stream_t *)&c->pipe, &buf, 1);
    }
    free(line);
    conn_close(c);
}

/* ---- Calls ---------------------------------------------------------------------------------- */

static struct origin *origin_find(struct conch_bridge *b, const char *kind, const char *id)
{
    for (struct node *n = b->origins.next; n != &b->origins; n = n->next) {
        struct origin *o = node_entry(n, struct origin, link);
        if (!strcmp(o->kind, kind) && !strcmp(o->id, id))
            return o;
    }
    return NULL;
}

static json_t *call_origin_json(const struct conch_bridge_call *c)
{
    if (!c->origin_kind[0])
        return json_null();
    return json_pack("{s:s,s:s}", "kind", c->origin_kind, "id", c->origin_id);
}

/* @v as a call record keeps it: whole when small, else {"truncated": true, "bytes": N,
 * "preview": the first bytes of its JSON}. New reference. */
static json_t *record_preview(json_t *v, const char *text, size_t len)
{
    if (len <= RECORD_VALUE_MAX)
        return json_incref(v);
    size_t cut = 512;
    while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80)
        cut--; /* not inside a UTF-8 sequence */
    json_t *r =
        json_pack("{s:b,s:I,s:s%}", "truncated", 1, "bytes", (json_int_t)len, "preview", text, cut);
    return r ? r : json_null();
}

/* @v as a call record keeps it (see record_preview). @at_most bounds the length of its JSON
 * when known (the request line that carried it): a small value is kept without serialising
 * it again. */
static json_t *record_value(json_t *v, size_t at_most)
{
    if (!v)
        return json_null();
    if (at_most <= RECORD_VALUE_MAX)
        return json_incref(v);
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    json_t *r = text ? record_preview(v, text, strlen(text)) : json_null();
    free(text);
    return r;
}

/* Record @c's outcome (@result, whose JSON is @result_text when the caller has it, or
 * @ekind/@emsg) in the trace and its origin. */
static void call_record(struct conch_bridge_call *c, json_t *result, const char *result_text,
                        const char *ekind, const char *emsg, bool detached)
{
    struct conch_bridge *b = c->b;
    json_t *spawn = c->kind == CONCH_BRIDGE_AGENT
                        ? json_pack("{s:s,s:s?}", "task", c->task, "type", c->type)
                        : NULL;
    double dur = mono_ms() - c->start_ms;
    json_t *rec = json_pack(
        "{s:s,s:s,s:s,s:o,s:b,s:f,s:f,s:o}", "call_id", c->call_id, "kind",
        c->kind == CONCH_BRIDGE_TOOL ? "tool" : "agent", "name", c->name, "input",
        record_value(c->kind == CONCH_BRIDGE_TOOL ? c->input : spawn, c->bytes), "ok",
        ekind == NULL, "start", c->start_wall, "duration_ms", dur, "origin", call_origin_json(c));
    json_decref(spawn);
    if (!rec)
        return;
    if (ekind)
        json_object_set_new(rec, "error",
                            json_pack("{s:s,s:s}", "kind", ekind, "message", emsg ? emsg : ""));
    else if (!detached)
        json_object_set_new(rec, "result",
                            result_text ? record_preview(result, result_text, strlen(result_text))
                                        : record_value(result, SIZE_MAX));
    if (detached)
        json_object_set_new(rec, "detached", json_true());
    if (b->trace) {
        json_array_append(b->trace, rec);
        while (json_array_size(b->trace) > b->lim.max_trace)
            json_array_remove(b->trace, 0);
    }
    struct origin *o = c->origin_kind[0] ? origin_find(b, c->origin_kind, c->origin_id) : NULL;
    if (o)
        json_array_append(o->records, rec);
    json_decref(rec);
}

static void on_call_timer_closed(uv_handle_t *h)
{
    struct conch_bridge_call *c = h->data;
    struct conch_bridge *b = c->b;
    conch_budget_uncharge(&b->budget, c->held);
    json_decref(c->req_id);
    json_decref(c->input);
    free(c->name);
    free(c->task);
    free(c->type);
    free(c);
    b->handles--;
    bridge_maybe_free(b);
}

/* Take @c out of the live set and free it (after libuv closed its timer). */
/* Take @c out of b->calls before anything about it is sent: a send may close a connection or
 * a client, which fails or cancels the calls it finds there, and must not find @c. Returns
 * false when @c is already finishing. */
static bool call_unlink(struct conch_bridge_call *c)
{
    if (c->finishing)
        return false;
    c->finishing = true;
    node_del(&c->link);
    return true;
}

static void call_release(struct conch_bridge_call *c)
{
    call_unlink(c);
    c->b->n_pending--;
    c->b->inflight_bytes -= c->bytes;
    if (c->conn)
        c->conn->calls--;
    uv_timer_stop(&c->timer);
    c->timer.data = c;
    uv_close((uv_handle_t *)&c->timer, on_call_timer_closed);
}

/* Take @c's caller away from it before answering: sending may close the connection, which
 * fails the calls still attached to it, and @c must not be one of them. */
static struct conn *call_take_conn(struct conch_bridge_call *c)
{
    struct conn *conn = c->conn;
    if (conn)
        conn->calls--;
    c->conn = NULL;
    return conn;
}

/* Finish @c with an error: recorded, sent to the caller, cancelled for its owner if it had
 * it (@cancel_reason), freed. */
static void call_fail(struct conch_bridge_call *c, const char *kind, const char *message,
                      const char *cancel_reason)
{
    struct conch_bridge *b = c->b;
    if (!call_unlink(c))
        return;
    call_record(c, NULL, NULL, kind, message, false);
    conn_send(call_take_conn(c), error_msg(c->req_id, kind, message));
    if (c->delivered && cancel_reason && b->ops->cancel)
        b->ops->cancel(b->ctx, c->owner, c, cancel_reason);
    call_release(c);
}

void conch_bridge_call_answer(struct conch_bridge_call *c, json_t *result)
{
    if (c->finishing) {
        json_decref(result);
        return;
    }
    if (!result)
        result = json_null();
    _cleanup_free_ char *text = json_dumps(result, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t len = text ? strlen(text) : 0;
    if (len > c->b->lim.max_payload) {
        char msg[160];
        snprintf(msg, sizeof(msg), "the answer of %s is %zu bytes, over the limit of %zu", c->name,
                 len, c->b->lim.max_payload);
        json_decref(result);
        c->delivered = false; /* the owner answered: nothing to cancel */
        call_fail(c, "too_large", msg, NULL);
        return;
    }
    call_unlink(c);
    call_record(c, result, text, NULL, NULL, false);
    conn_send(call_take_conn(c),
              json_pack("{s:O,s:b,s:o}", "id", c->req_id, "ok", 1, "result", result));
    call_release(c);
}

void conch_bridge_call_fail(struct conch_bridge_call *c, const char *kind, const char *message)
{
    c->delivered = false; /* the owner said so itself: no cancel */
    call_fail(c, kind ? kind : "tool_error", message ? message : "the tool failed", NULL);
}

static void on_call_timeout(uv_timer_t *t)
{
    struct conch_bridge_call *c = t->data;
    char msg[200];
    snprintf(msg, sizeof(msg), "%s '%s' did not answer within %.3g s",
             c->kind == CONCH_BRIDGE_TOOL ? "tool" : "agent", c->name,
             (double)uv_timer_get_repeat(t) / 1000.0);
    call_fail(c, "timeout", msg, "timeout");
}

enum conch_bridge_kind conch_bridge_call_kind(const struct conch_bridge_call *c)
{
    return c->kind;
}

const char *conch_bridge_call_id(const struct conch_bridge_call *c)
{
    return c->call_id;
}

json_t *conch_bridge_call_params(const struct conch_bridge_call *c)
{
    if (c->kind == CONCH_BRIDGE_TOOL)
        return json_pack("{s:s,s:s,s:s,s:O,s:o}", "sandbox", c->b->sandbox, "call_id", c->call_id,
                         "name", c->name, "input", c->input, "origin", call_origin_json(c));
    return json_pack("{s:s,s:s,s:s,s:s?,s:o}", "sandbox", c->b->sandbox, "call_id", c->call_id,
                     "task", c->task, "type", c->type, "origin", call_origin_json(c));
}

void conch_bridge_call_set_handle(struct conch_bridge_call *c, void *handle)
{
    c->handle = handle;
}

void *conch_bridge_call_handle(const struct conch_bridge_call *c)
{
    return c->handle;
}

/* ---- Requests from inside ------------------------------------------------------------------ */

static struct entry *entry_find(struct node *head, const char *name)
{
    for (struct node *n = head->next; n != head; n = n->next) {
        struct entry *e = node_entry(n, struct entry, link);
        if (!strcmp(e->name, name))
            return e;
    }
    return NULL;
}

static bool origin_matches(const struct origin *o, const struct conn *c)
{
    return o->pidns == 0 || (c->have_pidns && o->pidns == c->pidns);
}

static struct origin *origin_of(struct conn *c)
{
    struct conch_bridge *b = c->b;
    for (int pass = 0; pass < 2; pass++) {
        for (struct node *n = b->origins.next; n != &b->origins; n = n->next) {
            struct origin *o = node_entry(n, struct origin, link);
            if (origin_matches(o, c))
                return o;
        }
        /* The command may have started an instant ago: its supervisor's event can still be
         * waiting on the host's loop. */
        if (pass == 0 && b->ops->resolve)
            b->ops->resolve(b->ctx);
        if (b->freeing || c->closing)
            return NULL;
    }
    return NULL;
}

/* Whether @v nests deeper than @left levels. */
static bool too_deep(json_t *v, int left)
{
    if (!json_is_object(v) && !json_is_array(v))
        return false;
    if (left <= 0)
        return true;
    size_t i;
    json_t *x;
    const char *k;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x) if (too_deep(x, left - 1)) return true;
    } else {
        json_object_foreach(v, k, x) if (too_deep(x, left - 1)) return true;
    }
    return false;
}

static void names_of(struct node *head, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (struct node *n = head->next; n != head && len + 4 < size; n = n->next) {
        struct entry *e = node_entry(n, struct entry, link);
        int w = snprintf(buf + len, size - len, "%s%s", len ? ", " : "", e->name);
        if (w < 0 || (size_t)w >= size - len) {
            snprintf(buf + len, size - len, ", ...");
            break;
        }
        len += (size_t)w;
    }
}

/* Answer @id with unknown_tool: @name is not among @list's entries (named in the message). */
static void send_unknown(struct conn *c, json_t *id, struct node *list, const char *what,
                         const char *name, const char *names_label, const char *none)
{
    char names[400], msg[600];
    names_of(list, names, sizeof(names));
    snprintf(msg, sizeof(msg), "unknown %s '%.100s' (%s%s)", what, name,
             names[0] ? names_label : none, names);
    conn_send(c, error_msg(id, "unknown_tool", msg));
}

/* Start a call (op "call" or "spawn") from @c. */
static void start_call(struct conn *c, json_t *req, json_t *id, bool spawn, size_t bytes,
                       uint64_t held)
{
    struct conch_bridge *b = c->b;
    struct entry *e = NULL;
    const char *name = NULL, *task = NULL, *type = NULL;
    json_t *input = NULL;
    char msg[600];
    bool detach = false;

    if (!spawn) {
        name = json_string_value(json_object_get(req, "name"));
        if (!name) {
            conn_send(c, error_msg(id, "invalid_request", "a call needs a string \"name\""));
            return;
        }
        if (!(e = entry_find(&b->tools, name))) {
            send_unknown(c, id, &b->tools, "tool", name, "tools: ", "no tools are registered");
            return;
        }
        input = json_object_get(req, "input");
        input = input && !json_is_null(input) ? json_incref(input) : json_object();
        if (too_deep(input, INPUT_DEPTH_MAX)) {
            snprintf(msg, sizeof(msg), "input: nested deeper than %d levels", INPUT_DEPTH_MAX);
            conn_send(c, error_msg(id, "invalid_input", msg));
            json_decref(input);
            return;
        }
        char *why = NULL;
        json_t *schema = json_object_get(e->def, "input_schema");
        if (schema && conch_toolschema_validate(schema, input, &why) < 0) {
            conn_send(c, error_msg(id, "invalid_input", why ? why : "input does not match"));
            free(why);
            json_decref(input);
            return;
        }
    } else {
        task = json_string_value(json_object_get(req, "task"));
        json_t *t = json_object_get(req, "type");
        type = json_string_value(t);
        detach = json_is_true(json_object_get(req, "detach"));
        if (!task || (t && !json_is_null(t) && !type)) {
            conn_send(c,
                      error_msg(id, "invalid_request",
                                "a spawn needs a string \"task\" and a string or null \"type\""));
            return;
        }
        if (type && !(e = entry_find(&b->agents, type))) {
            send_unknown(c, id, &b->agents, "agent type", type,
                         "types: ", "no agent types are registered");
            return;
        }
        if (!e && b->agents.next != &b->agents)
            e = node_entry(b->agents.next, struct entry, link);
        if (!e && !detach) {
            conn_send(c, error_msg(id, "unavailable",
                                   "no sub-agents are available: the harness registered no "
                                   "agent types for this sandbox"));
            return;
        }
    }

    struct origin *o = origin_of(c);
    if (b->freeing || c->closing) {
        json_decref(input);
        return;
    }
    if (!o) {
        json_decref(input);
        conn_send(
            c, error_msg(id, "unavailable", "this process belongs to no command of the sandbox"));
        return;
    }
    if (detach &&
        (json_array_size(o->detached) >= DETACHED_MAX || strlen(task) > DETACHED_TASK_MAX)) {
        snprintf(msg, sizeof(msg),
                 json_array_size(o->detached) >= DETACHED_MAX
                     ? "this command made %u detached requests, the limit"
                     : "a detached request's task may hold at most %u bytes",
                 json_array_size(o->detached) >= DETACHED_MAX ? DETACHED_MAX : DETACHED_TASK_MAX);
        conn_send(c, error_msg(id, "limit", msg));
        return;
    }
    if (o->calls >= b->lim.max_calls) {
        json_decref(input);
        snprintf(msg, sizeof(msg), "this command made %u calls, the limit", b->lim.max_calls);
        conn_send(c, error_msg(id, "limit", msg));
        return;
    }
    if (b->inflight_bytes + bytes > INFLIGHT_BYTES_MAX) {
        json_decref(input);
        snprintf(msg, sizeof(msg), "%zu bytes of calls are in flight in this sandbox, the limit",
                 (size_t)INFLIGHT_BYTES_MAX);
        conn_send(c, error_msg(id, "limit", msg));
        return;
    }
    if (b->n_pending >= b->lim.max_pending) {
        json_decref(input);
        snprintf(msg, sizeof(msg), "%u calls are in flight in this sandbox, the limit",
                 b->lim.max_pending);
        conn_send(c, error_msg(id, "limit", msg));
        return;
    }
    if (conch_budget_charge(&b->budget, held, NULL) < 0) {
        json_decref(input);
        char state[256];
        budget_state(b, state, sizeof(state));
        snprintf(msg, sizeof(msg), "a call of %llu bytes (parsed) does not fit: %s",
                 (unsigned long long)held, state);
        conn_send(c, error_msg(id, "limit", msg));
        return;
    }

    struct conch_bridge_call *call = calloc(1, sizeof(*call));
    if (!call) {
        conch_budget_uncharge(&b->budget, held);
        json_decref(input);
        conn_send(c, error_msg(id, "unavailable", "out of memory"));
        return;
    }
    call->held = held;
    call->b = b;
    call->conn = c;
    call->req_id = json_incref(id);
    call->kind = spawn ? CONCH_BRIDGE_AGENT : CONCH_BRIDGE_TOOL;
    call->name = strdup(spawn ? (type ? type : "agent") : name);
    call->input = input;
    call->task = task ? strdup(task) : NULL;
    call->type = type ? strdup(type) : NULL;
    snprintf(call->origin_kind, sizeof(call->origin_kind), "%s", o->kind);
    snprintf(call->origin_id, sizeof(call->origin_id), "%s", o->id);
    snprintf(call->call_id, sizeof(call->call_id), "call-%llu", (unsigned long long)++b->next_call);
    call->owner = e ? e->owner : NULL;
    call->start_wall = conch_clock_wall();
    call->start_ms = mono_ms();
    uv_timer_init(b->loop, &call->timer);
    call->timer.data = call;
    b->handles++;
    node_add(&b->calls, &call->link);
    b->n_pending++;
    call->bytes = bytes;
    b->inflight_bytes += bytes;
    c->calls++;
    o->calls++;
    if (!call->name || (spawn && !call->task) || (type && !call->type)) {
        call_fail(call, "unavailable", "out of memory", NULL);
        return;
    }
    if (detach) {
        json_array_append_new(o->detached, json_pack("{s:s,s:s,s:s?}", "call_id", call->call_id,
                                                     "task", call->task, "type", call->type));
        call_record(call, NULL, NULL, NULL, NULL, true);
        call_take_conn(call);
        conn_send(c, json_pack("{s:O,s:b,s:{s:s}}", "id", id, "ok", 1, "result", "request_id",
                               call->call_id));
        call_release(call);
        return;
    }
    double t = e && e->timeout_s > 0 ? e->timeout_s : b->lim.call_timeout_s;
    uv_timer_start(&call->timer, on_call_timeout, (uint64_t)(t * 1000), (uint64_t)(t * 1000));
    call->delivered = true;
    if (b->ops->deliver(b->ctx, call->owner, call) < 0) {
        call->delivered = false;
        snprintf(msg, sizeof(msg), "the harness answering %s '%s' cannot take calls now",
                 spawn ? "agent" : "tool", call->name);
        call_fail(call, "unavailable", msg, NULL);
    }
}

static json_t *list_json(struct conch_bridge *b, bool full)
{
    json_t *tools = json_array(), *agents = json_array();
    for (struct node *n = b->tools.next; n != &b->tools; n = n->next) {
        struct entry *e = node_entry(n, struct entry, link);
        if (full) {
            json_array_append(tools, e->def);
        } else {
            json_t *d = json_pack("{s:s,s:O?,s:O?}", "name", e->name, "description",
                                  json_object_get(e->def, "description"), "input_schema",
                                  json_object_get(e->def, "input_schema"));
            json_array_append_new(tools, d);
        }
    }
    for (struct node *n = b->agents.next; n != &b->agents; n = n->next)
        json_array_append(agents, node_entry(n, struct entry, link)->def);
    return json_pack("{s:o,s:o}", "tools", tools, "agents", agents);
}

static bool conn_has_deferred(struct conn *c)
{
    for (struct node *n = c->b->deferred.next; n != &c->b->deferred; n = n->next)
        if (node_entry(n, struct deferred, link)->c == c)
            return true;
    return false;
}

static void deferred_free(struct conch_bridge *b, struct deferred *d)
{
    node_del(&d->link);
    b->n_deferred--;
    conch_budget_uncharge(&b->budget, d->held);
    json_decref(d->req);
    free(d);
}

/* Replay @d's request (its origin is known now, or its time is up: start_call answers). */
static void deferred_replay(struct conch_bridge *b, struct deferred *d)
{
    struct conn *c = d->c;
    json_t *req = json_incref(d->req);
    size_t bytes = d->bytes;
    uint64_t held = d->held;
    deferred_free(b, d);
    const char *op = json_string_value(json_object_get(req, "op"));
    start_call(c, req, json_object_get(req, "id"), op && !strcmp(op, "spawn"), bytes, held);
    json_decref(req);
}

static void on_defer_timer(uv_timer_t *t)
{
    struct conch_bridge *b = t->data;
    double now = mono_ms();
    bool again = true;
    while (again) {
        again = false;
        for (struct node *n = b->deferred.next; n != &b->deferred; n = n->next) {
            struct deferred *d = node_entry(n, struct deferred, link);
            if (d->deadline_ms <= now) {
                deferred_replay(b, d); /* no origin: answered "unavailable" */
                again = true;
                break;
            }
        }
    }
    if (!b->n_deferred)
        uv_timer_stop(t);
}

/* Keep @req of @c (@held: its cost, json_cost) until its origin begins. Returns false when
 * it cannot be kept. */
static bool defer_call(struct conn *c, json_t *req, size_t bytes, uint64_t held)
{
    struct conch_bridge *b = c->b;
    if (!c->have_pidns || b->n_deferred >= DEFER_MAX)
        return false;
    if (!b->defer_timer) {
        if (!(b->defer_timer = calloc(1, sizeof(*b->defer_timer))))
            return false;
        uv_timer_init(b->loop, b->defer_timer);
        b->defer_timer->data = b;
        b->handles++;
    }
    if (conch_budget_charge(&b->budget, held, NULL) < 0)
        return false; /* start_call answers "limit" */
    struct deferred *d = calloc(1, sizeof(*d));
    if (!d) {
        conch_budget_uncharge(&b->budget, held);
        return false;
    }
    d->held = held;
    d->c = c;
    d->req = json_incref(req);
    d->bytes = bytes;
    d->deadline_ms = mono_ms() + DEFER_MS;
    node_add(&b->deferred, &d->link);
    b->n_deferred++;
    if (!uv_is_active((uv_handle_t *)b->defer_timer))
        uv_timer_start(b->defer_timer, on_defer_timer, 100, 100);
    return true;
}

/* Bytes of memory a parsed @line takes at most, about: jansson keeps a copy of every string
 * and ~40-64 bytes per value (an array of 2 million zeros is 4 MiB of text and 90 MiB parsed). */
static uint64_t json_cost(const char *line, size_t len)
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

/* Answer a request that cannot be parsed within the budget, by its id (found in constant
 * memory). */
static void refuse_line(struct conn *c, const char *line, size_t len, uint64_t cost)
{
    struct conch_rpc_idscan ids = {0};
    conch_rpc_idscan_feed(&ids, line, len);
    char state[256], msg[512];
    budget_state(c->b, state, sizeof(state));
    snprintf(msg, sizeof(msg), "a request of %zu bytes (about %llu parsed) does not fit: %s", len,
             (unsigned long long)cost, state);
    conn_send(c, error_msg(ids.result == 1 ? ids.id : NULL, "limit", msg));
    conch_rpc_idscan_init(&ids);
}

static void handle_line(struct conn *c, const char *line, size_t len, uint64_t cost);

static void on_request_line(void *ctx, const char *line, size_t len)
{
    struct conn *c = ctx;
    if (c->closing || c->b->freeing)
        return;
    /* Parsing holds the whole request: charged while it lasts (and again by a call that keeps
     * it), so that no line makes the daemon hold more than the budget, even for a moment. */
    struct conch_bridge *b = c->b;
    uint64_t cost = json_cost(line, len);
    if (conch_budget_charge(&b->budget, cost, NULL) < 0) {
        refuse_line(c, line, len, cost);
        return;
    }
    handle_line(c, line, len, cost);
    conch_budget_uncharge(&b->budget, cost);
}

static void handle_line(struct conn *c, const char *line, size_t len, uint64_t cost)
{
    json_error_t jerr;
    json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(req)) {
        char msg[300];
        snprintf(msg, sizeof(msg), "not a JSON object: %s", req ? "another value" : jerr.text);
        conn_send(c, error_msg(NULL, "invalid_request", msg));
        json_decref(req);
        return;
    }
    json_t *id = json_object_get(req, "id");
    const char *op = json_string_value(json_object_get(req, "op"));
    if (!id || !(json_is_string(id) || json_is_integer(id))) {
        conn_send(
            c, error_msg(NULL, "invalid_request", "a request needs an \"id\" (string or integer)"));
    } else if (!op) {
        conn_send(c, error_msg(id, "invalid_request", "a request needs a string \"op\""));
    } else if (!strcmp(op, "call") || !strcmp(op, "spawn")) {
        if (origin_of(c) || c->closing || c->b->freeing || !defer_call(c, req, len, cost))
            start_call(c, req, id, !strcmp(op, "spawn"), len, cost);
    } else if (!strcmp(op, "list")) {
        conn_send(c,
                  json_pack("{s:O,s:b,s:o}", "id", id, "ok", 1, "result", list_json(c->b, false)));
    } else {
        char msg[160];
        snprintf(msg, sizeof(msg), "unknown op '%.60s' (ops: call, spawn, list)", op);
        conn_send(c, error_msg(id, "invalid_request", msg));
    }
    json_decref(req);
}

static void on_request_oversize(void *ctx)
{
    struct conn *c = ctx;
    json_t *id = conch_rpc_framer_oversize_id(&c->framer); /* borrowed */
    char msg[128];
    snprintf(msg, sizeof(msg), "a request is larger than the limit of %zu bytes",
             c->b->lim.max_payload);
    conn_send(c, error_msg(id, "too_large", msg));
}

/* ---- Connections ---------------------------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct conch_bridge *b = c->b;
    conch_rpc_framer_done(&c->framer);
    if (c->charged)
        conch_budget_uncharge(&b->budget, sizeof(*c));
    free(c);
    b->handles--;
    bridge_maybe_free(b);
}

static void conn_close(struct conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct conch_bridge *b = c->b;
    /* Its calls lose their caller: nobody reads the answer now. Each failure may re-enter
     * (a $/cancel that disconnects a client): scan again from the start after each. */
    for (struct node *n = b->calls.next; n != &b->calls;) {
        struct conch_bridge_call *call = node_entry(n, struct conch_bridge_call, link);
        if (call->conn != c) {
            n = n->next;
            continue;
        }
        c->calls--;
        call->conn = NULL;
        call_fail(call, "cancelled", "the caller went away", "the caller went away");
        n = b->calls.next;
    }
    for (struct node *n = b->deferred.next, *next; n != &b->deferred; n = next) {
        next = n->next;
        struct deferred *d = node_entry(n, struct deferred, link);
        if (d->c == c)
            deferred_free(b, d);
    }
    node_del(&c->link);
    b->n_conns--;
    uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    static char chunk[64 * 1024];
    (void)suggested;
    *buf = uv_buf_init(chunk, sizeof(chunk));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (n == UV_EOF && !c->closing) {
        /* Half-closed (nc -N, a here-string): its calls still get their answers. */
        c->read_eof = true;
        uv_read_stop(s);
        conn_maybe_finish(c);
        return;
    }
    if (n < 0) {
        conn_close(c);
        return;
    }
    int r = n > 0 ? conch_rpc_framer_feed(&c->framer, buf->base, (size_t)n, on_request_line,
                                          on_request_oversize, c)
                  : 0;
    if (r == -ENOBUFS)
        conn_refuse(c, "a request line being read does not fit");
    else if (r < 0)
        conn_close(c);
}

/* The pid namespace of the process at the other end of @fd. */
static bool peer_pidns(int fd, uint64_t *ret)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0)
        return false;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)cred.pid);
    struct stat st;
    if (stat(path, &st) < 0)
        return false;
    *ret = st.st_ino;
    return true;
}

static void on_connection(uv_stream_t *server, int status)
{
    struct conch_bridge *b = server->data;
    if (status < 0 || b->freeing)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->b = b;
    NODE_INIT(&c->link);
    uv_pipe_init(b->loop, &c->pipe, 0);
    c->pipe.data = c;
    b->handles++;
    if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
        c->closing = true;
        c->pipe.data = c;
        conch_rpc_framer_init(&c->framer, b->lim.max_payload);
        uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
        return;
    }
    conch_rpc_framer_init(&c->framer, b->lim.max_payload);
    conch_rpc_framer_set_budget(&c->framer, &b->budget);
    node_add(&b->conns, &c->link);
    b->n_conns++;
    if (b->refusing) {
        conn_close(c);
        return;
    }
    c->charged = conch_budget_charge(&b->budget, sizeof(*c), NULL) == 0;
    if (!c->charged) {
        conn_refuse(c, "a new connection does not fit");
        return;
    }
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0)
        c->have_pidns = peer_pidns(fd, &c->pidns);
    if (b->n_conns > b->lim.max_conns) {
        conn_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

int conch_bridge_new(uv_loop_t *loop, const char *sandbox, const struct conch_bridge_limits *limits,
                     const struct conch_bridge_ops *ops, void *ctx, struct conch_bridge **ret,
                     struct conch_err *err)
{
    struct conch_bridge *b = calloc(1, sizeof(*b));
    if (!b || !(b->trace = json_array())) {
        free(b);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    b->loop = loop;
    snprintf(b->sandbox, sizeof(b->sandbox), "%s", sandbox ? sandbox : "");
    if (limits)
        b->lim = *limits;
    else
        conch_bridge_limits_init(&b->lim);
    char label[96];
    snprintf(label, sizeof(label), "sandbox %s's tool bridge", b->sandbox);
    conch_budget_init(&b->budget, label, b->lim.max_held ? b->lim.max_held : UINT64_MAX,
                      b->lim.shared);
    b->ops = ops;
    b->ctx = ctx;
    NODE_INIT(&b->tools);
    NODE_INIT(&b->agents);
    NODE_INIT(&b->origins);
    NODE_INIT(&b->conns);
    NODE_INIT(&b->calls);
    NODE_INIT(&b->deferred);
    *ret = b;
    return 0;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct conch_bridge *b = h->data;
    free(h);
    b->handles--;
    bridge_maybe_free(b);
}

static void stop_listening(struct conch_bridge *b)
{
    while (b->conns.next != &b->conns)
        conn_close(node_entry(b->conns.next, struct conn, link));
    if (b->listener) {
        b->listener->data = b;
        uv_close((uv_handle_t *)b->listener, on_listener_closed);
        b->listener = NULL;
    }
}

void conch_bridge_refuse(struct conch_bridge *b, bool refuse)
{
    b->refusing = refuse;
    while (refuse && b->conns.next != &b->conns)
        conn_close(node_entry(b->conns.next, struct conn, link));
}

int conch_bridge_listen(struct conch_bridge *b, int listen_fd, struct conch_err *err)
{
    stop_listening(b);
    if (listen_fd < 0)
        return 0;
    uv_pipe_t *l = calloc(1, sizeof(*l));
    if (!l) {
        close(listen_fd);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    uv_pipe_init(b->loop, l, 0);
    l->data = b;
    b->handles++;
    int r = uv_pipe_open(l, listen_fd);
    if (r == 0)
        r = uv_listen((uv_stream_t *)l, 1024, on_connection);
    if (r < 0) {
        uv_close((uv_handle_t *)l, on_listener_closed);
        return conch_err_set(err, -r, "tool bridge: listen: %s", uv_strerror(r));
    }
    b->listener = l;
    return 0;
}

static void entries_free(struct node *head)
{
    while (head->next != head) {
        struct entry *e = node_entry(head->next, struct entry, link);
        node_del(&e->link);
        json_decref(e->def);
        free(e);
    }
}

static void origin_free(struct origin *o)
{
    node_del(&o->link);
    json_decref(o->records);
    json_decref(o->detached);
    free(o);
}

void conch_bridge_free(struct conch_bridge *b)
{
    if (!b || b->freeing)
        return;
    b->freeing = true;
    while (b->calls.next != &b->calls) {
        struct conch_bridge_call *c = node_entry(b->calls.next, struct conch_bridge_call, link);
        call_fail(c, "unavailable", "the sandbox stopped", "the sandbox stopped");
    }
    entries_free(&b->tools);
    entries_free(&b->agents);
    while (b->origins.next != &b->origins)
        origin_free(node_entry(b->origins.next, struct origin, link));
    stop_listening(b); /* closes the connections, and so drops what they deferred */
    if (b->defer_timer) {
        uv_timer_stop(b->defer_timer);
        uv_close((uv_handle_t *)b->defer_timer, on_listener_closed);
        b->defer_timer = NULL;
    }
    bridge_maybe_free(b);
}

/* ---- Registry ----------------------------------------------------------------------------- */

static int check_def(bool agent, json_t *d, size_t i, struct conch_err *err)
{
    const char *what = agent ? "agents" : "tools";
    int r = agent ? conch_toolschema_check_agent(d, err) : conch_toolschema_check_tool(d, err);
    if (r < 0)
        return conch_err_wrap(err, "%s[%zu]", what, i);
    json_t *timeout = agent ? NULL : json_object_get(d, "timeout");
    if (timeout && !json_is_null(timeout) &&
        (!json_is_number(timeout) || json_number_value(timeout) <= 0 ||
         json_number_value(timeout) > 86400))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "tools[%zu] (%s).timeout: expected seconds in (0, 86400]", i,
                              json_string_value(json_object_get(d, "name")));
    return 0;
}

int conch_bridge_check_defs(bool agents, json_t *defs, struct conch_err *err)
{
    if (!json_is_array(defs))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: expected an array",
                              agents ? "agents" : "tools");
    if (json_array_size(defs) > 1024)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: at most 1024 at once",
                              agents ? "agents" : "tools");
    size_t i;
    json_t *d;
    json_array_foreach(defs, i, d)
    {
        int r = check_def(agents, d, i, err);
        if (r < 0)
            return r;
    }
    return 0;
}

int conch_bridge_register(struct conch_bridge *b, bool agents, json_t *defs, void *owner,
                          json_t **ret_names, struct conch_err *err)
{
    int r = conch_bridge_check_defs(agents, defs, err);
    if (r < 0)
        return r;
    size_t i;
    json_t *d;
    /* A bounded registry: at most REGISTRY_MAX entries of each kind (names replaced count
     * once). Counted before anything changes. */
    size_t have = 0;
    struct node *heads = agents ? &b->agents : &b->tools;
    for (struct node *n = heads->next; n != heads; n = n->next)
        have++;
    size_t fresh = 0;
    json_array_foreach(defs, i, d)
    {
        if (!entry_find(heads, json_string_value(json_object_get(d, "name"))))
            fresh++;
    }
    if (have + fresh > REGISTRY_MAX)
        return conch_err_setk(err, CONCH_ERR_LIMIT, E2BIG,
                              "a sandbox may have at most %d %s (it has %zu; %zu more asked for)",
                              REGISTRY_MAX, agents ? "agent types" : "tools", have, fresh);
    json_t *names = json_array();
    json_array_foreach(defs, i, d)
    {
        struct entry *e = calloc(1, sizeof(*e));
        json_t *copy = json_deep_copy(d);
        if (!e || !copy) {
            free(e);
            json_decref(copy);
            json_decref(names);
            return conch_err_set(err, ENOMEM, "out of memory");
        }
        e->def = copy;
        e->name = json_string_value(json_object_get(copy, "name"));
        e->owner = owner;
        json_t *t = json_object_get(copy, "timeout");
        e->timeout_s = json_is_number(t) ? json_number_value(t) : 0;
        struct node *head = agents ? &b->agents : &b->tools;
        struct entry *old = entry_find(head, e->name);
        if (old) {
            node_del(&old->link);
            json_decref(old->def);
            free(old);
        }
        node_add(head, &e->link);
        json_array_append_new(names, json_string(e->name));
    }
    *ret_names = names;
    return 0;
}

json_t *conch_bridge_unregister(struct conch_bridge *b, bool agents, json_t *names)
{
    json_t *removed = json_array();
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n)
    {
        const char *name = json_string_value(n);
        struct entry *e = name ? entry_find(agents ? &b->agents : &b->tools, name) : NULL;
        if (!e)
            continue;
        json_array_append_new(removed, json_string(name));
        node_del(&e->link);
        json_decref(e->def);
        free(e);
    }
    return removed;
}

void conch_bridge_drop_owner(struct conch_bridge *b, void *owner)
{
    struct node *heads[] = {&b->tools, &b->agents};
    for (int k = 0; k < 2; k++)
        for (struct node *n = heads[k]->next, *next; n != heads[k]; n = next) {
            next = n->next;
            struct entry *e = node_entry(n, struct entry, link);
            if (e->owner != owner)
                continue;
            node_del(&e->link);
            json_decref(e->def);
            free(e);
        }
    for (struct node *n = b->calls.next; n != &b->calls;) {
        struct conch_bridge_call *c = node_entry(n, struct conch_bridge_call, link);
        if (c->owner != owner || !c->delivered) {
            n = n->next;
            continue;
        }
        char msg[200];
        snprintf(msg, sizeof(msg), "the harness answering %s '%s' went away",
                 c->kind == CONCH_BRIDGE_TOOL ? "tool" : "agent", c->name);
        c->delivered = false; /* nobody to cancel for */
        call_fail(c, "unavailable", msg, NULL);
        n = b->calls.next; /* the failure may have re-entered: scan again */
    }
}

json_t *conch_bridge_list(struct conch_bridge *b)
{
    return list_json(b, true);
}

char *conch_bridge_prompt(struct conch_bridge *b, unsigned languages)
{
    json_t *l = list_json(b, true);
    char *text = l ? conch_toolschema_prompt(json_object_get(l, "tools"),
                                             json_object_get(l, "agents"), languages)
                   : NULL;
    json_decref(l);
    return text;
}

/* ---- Origins -------------------------------------------------------------------------------- */

int conch_bridge_origin_begin(struct conch_bridge *b, const char *kind, const char *id,
                              uint64_t pidns)
{
    struct origin *o = calloc(1, sizeof(*o));
    if (!o || !(o->records = json_array()) || !(o->detached = json_array())) {
        if (o) {
            json_decref(o->records);
            free(o);
        }
        return -ENOMEM;
    }
    snprintf(o->kind, sizeof(o->kind), "%s", kind);
    snprintf(o->id, sizeof(o->id), "%s", id);
    o->pidns = pidns;
    node_add(&b->origins, &o->link);
    /* Calls its command made before we knew it was running. */
    bool again = true;
    while (again && !b->freeing) {
        again = false;
        for (struct node *n = b->deferred.next; n != &b->deferred; n = n->next) {
            struct deferred *d = node_entry(n, struct deferred, link);
            if (origin_matches(o, d->c)) {
                deferred_replay(b, d);
                again = true;
                break;
            }
        }
    }
    return 0;
}

static char *summary_of(json_t *records)
{
    size_t n = json_array_size(records);
    if (!n)
        return NULL;
    /* Count by name, in order of first appearance. */
    json_t *counts = json_object();
    json_t *order = json_array();
    size_t ok = 0, i;
    double first = 0, last = 0;
    json_t *r;
    json_array_foreach(records, i, r)
    {
        const char *name = json_string_value(json_object_get(r, "name"));
        json_t *cnt = json_object_get(counts, name ? name : "?");
        if (!cnt) {
            json_object_set_new(counts, name ? name : "?", json_integer(1));
            json_array_append_new(order, json_string(name ? name : "?"));
        } else {
            json_integer_set(cnt, json_integer_value(cnt) + 1);
        }
        if (json_is_true(json_object_get(r, "ok")))
            ok++;
        double s = json_number_value(json_object_get(r, "start"));
        double e = s + json_number_value(json_object_get(r, "duration_ms")) / 1000.0;
        if (i == 0 || s < first)
            first = s;
        if (e > last)
            last = e;
    }
    char by[512] = "";
    size_t len = 0;
    json_t *nm;
    json_array_foreach(order, i, nm)
    {
        const char *name = json_string_value(nm);
        int w = snprintf(by + len, sizeof(by) - len, "%s%s=%lld", i ? ", " : "", name,
                         (long long)json_integer_value(json_object_get(counts, name)));
        if (w < 0 || (size_t)w >= sizeof(by) - len) {
            if (len + 5 < sizeof(by))
                snprintf(by + len, sizeof(by) - len, ", ...");
            break;
        }
        len += (size_t)w;
    }
    json_decref(counts);
    json_decref(order);
    char *s = NULL;
    if (asprintf(&s, "[tools: %zu call%s (%s), %zu ok, %zu failed, %.1f s]", n, n == 1 ? "" : "s",
                 by, ok, n - ok, last - first) < 0)
        return NULL;
    return s;
}

void conch_bridge_origin_end(struct conch_bridge *b, const char *kind, const char *id,
                             struct conch_bridge_report *ret)
{
    memset(ret, 0, sizeof(*ret));
    struct origin *o = origin_find(b, kind, id);
    if (!o)
        return;
    for (struct node *n = b->calls.next; n != &b->calls;) {
        struct conch_bridge_call *c = node_entry(n, struct conch_bridge_call, link);
        if (strcmp(c->origin_kind, kind) || strcmp(c->origin_id, id)) {
            n = n->next;
            continue;
        }
        call_fail(c, "cancelled", "the command ended", "the command ended");
        n = b->calls.next; /* the failure may have re-entered: scan again */
    }
    ret->calls = json_incref(o->records);
    ret->detached = json_incref(o->detached);
    ret->summary = summary_of(o->records);
    origin_free(o);
}

void conch_bridge_origin_take(struct conch_bridge *b, const char *kind, const char *id,
                              struct conch_bridge_report *ret)
{
    memset(ret, 0, sizeof(*ret));
    struct origin *o = origin_find(b, kind, id);
    json_t *records = json_array(), *detached = json_array();
    if (!o || !records || !detached) {
        json_decref(records);
        json_decref(detached);
        return;
    }
    ret->calls = o->records;
    ret->detached = o->detached;
    ret->summary = summary_of(o->records);
    o->records = records;
    o->detached = detached;
}

void conch_bridge_report_done(struct conch_bridge_report *r)
{
    json_decref(r->calls);
    json_decref(r->detached);
    free(r->summary);
    memset(r, 0, sizeof(*r));
}

json_t *conch_bridge_trace(struct conch_bridge *b, const char *kind, const char *id)
{
    if (!kind || !id)
        return json_deep_copy(b->trace);
    json_t *out = json_array();
    size_t i;
    json_t *r;
    json_array_foreach(b->trace, i, r)
    {
        json_t *o = json_object_get(r, "origin");
        const char *k = json_string_value(json_object_get(o, "kind"));
        const char *v = json_string_value(json_object_get(o, "id"));
        if (k && v && !strcmp(k, kind) && !strcmp(v, id))
            json_array_append(out, r);
    }
    return out;
}
