/* bridge-call.c - the tool bridge's calls: a request from inside checked and started (or
 * deferred until its command's origin begins), delivered to its owner, timed out, answered
 * or failed, and recorded in the trace and its origin. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/bridge-internal.h"
#include "core/cleanup.h"
#include "core/clock.h"
#include "toolschema/toolschema.h"

/* ---- Calls ---------------------------------------------------------------------------------- */

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
#define DETACHED_TASK_MAX (256u << 10)
/* Bytes of the name a refused call asked for that its record keeps. */
#define REFUSED_NAME_MAX 100

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

/* Keep record @rec (taken) in the trace and in its origin @o's records (NULL: none). */
static void record_store(struct conch_bridge *b, json_t *rec, struct origin *o)
{
    if (b->trace) {
        json_array_append(b->trace, rec);
        while (json_array_size(b->trace) > b->lim.max_trace)
            json_array_remove(b->trace, 0);
    }
    if (o)
        json_array_append(o->records, rec);
    json_decref(rec);
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
    record_store(b, rec,
                 c->origin_kind[0] ? conch_bridge__origin_find(b, c->origin_kind, c->origin_id)
                                   : NULL);
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
    conch_bridge__maybe_free(b);
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
    conch_list_del(&c->link);
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
void conch_bridge__call_fail(struct conch_bridge_call *c, const char *kind, const char *message,
                             const char *cancel_reason)
{
    struct conch_bridge *b = c->b;
    if (!call_unlink(c))
        return;
    call_record(c, NULL, NULL, kind, message, false);
    conch_bridge__conn_send(call_take_conn(c), conch_bridge__error_msg(c->req_id, kind, message));
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
        conch_bridge__call_fail(c, "too_large", msg, NULL);
        return;
    }
    call_unlink(c);
    call_record(c, result, text, NULL, NULL, false);
    conch_bridge__conn_send(call_take_conn(c),
                            json_pack("{s:O,s:b,s:o}", "id", c->req_id, "ok", 1, "result", result));
    call_release(c);
}

void conch_bridge_call_fail(struct conch_bridge_call *c, const char *kind, const char *message)
{
    c->delivered = false; /* the owner said so itself: no cancel */
    conch_bridge__call_fail(c, kind ? kind : "tool_error", message ? message : "the tool failed",
                            NULL);
}

static void on_call_timeout(uv_timer_t *t)
{
    struct conch_bridge_call *c = t->data;
    char msg[200];
    snprintf(msg, sizeof(msg), "%s '%s' did not answer within %.3g s",
             c->kind == CONCH_BRIDGE_TOOL ? "tool" : "agent", c->name,
             (double)uv_timer_get_repeat(t) / 1000.0);
    conch_bridge__call_fail(c, "timeout", msg, "timeout");
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

static void names_of(struct conch_list *head, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (struct conch_list *n = head->next; n != head && len + 4 < size; n = n->next) {
        struct entry *e = conch_list_entry(n, struct entry, link);
        int w = snprintf(buf + len, size - len, "%s%s", len ? ", " : "", e->name);
        if (w < 0 || (size_t)w >= size - len) {
            snprintf(buf + len, size - len, ", ...");
            break;
        }
        len += (size_t)w;
    }
}

/* Refuse @c's call @id before it starts (@code, @msg to the caller) and record the refusal
 * as a failed call, so that the harness sees a model's malformed attempts in the trace, the
 * command's records and its summary. @spawn: an agent spawn; @name: the tool or agent type
 * asked for (NULL: none; cut to REFUSED_NAME_MAX bytes); @input: the call's input as
 * recorded (borrowed; NULL: not recorded). A refusal counts against the command's cap of
 * calls: past it, refusals are answered but no longer recorded. */
static void call_refuse(struct conn *c, json_t *id, bool spawn, const char *name, json_t *input,
                        size_t bytes, const char *code, const char *msg)
{
    struct conch_bridge *b = c->b;
    struct origin *o = conch_bridge__origin_of(c);
    if (b->freeing || c->closing)
        return;
    if (!o || o->calls < b->lim.max_calls) {
        if (o)
            o->calls++;
        size_t cut = name ? strnlen(name, REFUSED_NAME_MAX + 1) : 1;
        if (cut > REFUSED_NAME_MAX) {
            cut = REFUSED_NAME_MAX;
            while (cut > 0 && ((unsigned char)name[cut] & 0xC0) == 0x80)
                cut--; /* not inside a UTF-8 sequence */
        }
        char call_id[32];
        snprintf(call_id, sizeof(call_id), "call-%llu", (unsigned long long)++b->next_call);
        json_t *rec = json_pack(
            "{s:s,s:s,s:s%,s:o,s:b,s:f,s:f,s:o,s:{s:s,s:s}}", "call_id", call_id, "kind",
            spawn ? "agent" : "tool", "name", name ? name : "?", cut, "input",
            record_value(input, bytes), "ok", 0, "start", conch_clock_wall(), "duration_ms", 0.0,
            "origin", o ? json_pack("{s:s,s:s}", "kind", o->kind, "id", o->id) : json_null(),
            "error", "kind", code, "message", msg);
        if (rec)
            record_store(b, rec, o);
    }
    conch_bridge__conn_send(c, conch_bridge__error_msg(id, code, msg));
}

/* Refuse @c's call @id with unknown_tool: @name is not among @list's entries (named in the
 * message). */
static void refuse_unknown(struct conn *c, json_t *id, bool spawn, json_t *input, size_t bytes,
                           struct conch_list *list, const char *what, const char *name,
                           const char *names_label, const char *none)
{
    char names[400], msg[600];
    names_of(list, names, sizeof(names));
    snprintf(msg, sizeof(msg), "unknown %s '%.100s' (%s%s)", what, name,
             names[0] ? names_label : none, names);
    call_refuse(c, id, spawn, name, input, bytes, "unknown_tool", msg);
}

/* Charge @held to @b's budget for what keeps a request, taking it from *@charged (what the
 * caller charged already for the same request) when that covers it. Returns 0 or -ENOBUFS. */
static int take_charge(struct conch_bridge *b, uint64_t held, uint64_t *charged)
{
    if (charged && *charged >= held) {
        *charged -= held;
        return 0;
    }
    return conch_budget_charge(&b->budget, held, NULL);
}

/* Start a call (op "call" or "spawn") from @c. */
void conch_bridge__start_call(struct conn *c, json_t *req, json_t *id, bool spawn, size_t bytes,
                              uint64_t held, uint64_t *charged)
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
            call_refuse(c, id, false, NULL, NULL, 0, "invalid_request",
                        "a call needs a string \"name\"");
            return;
        }
        input = json_object_get(req, "input");
        input = input && !json_is_null(input) ? json_incref(input) : json_object();
        /* Input nested too deep is not recorded: a trace must stay readable by any parser. */
        bool deep = too_deep(input, INPUT_DEPTH_MAX);
        if (!(e = conch_bridge__entry_find(&b->tools, name))) {
            refuse_unknown(c, id, false, deep ? NULL : input, bytes, &b->tools, "tool", name,
                           "tools: ", "no tools are registered");
            json_decref(input);
            return;
        }
        if (deep) {
            snprintf(msg, sizeof(msg), "input: nested deeper than %d levels", INPUT_DEPTH_MAX);
            call_refuse(c, id, false, name, NULL, 0, "invalid_input", msg);
            json_decref(input);
            return;
        }
        char *why = NULL;
        json_t *schema = json_object_get(e->def, "input_schema");
        if (schema && conch_toolschema_validate(schema, input, &why) < 0) {
            call_refuse(c, id, false, name, input, bytes, "invalid_input",
                        why ? why : "input does not match");
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
            call_refuse(c, id, true, type, NULL, 0, "invalid_request",
                        "a spawn needs a string \"task\" and a string or null \"type\"");
            return;
        }
        if (type && !(e = conch_bridge__entry_find(&b->agents, type))) {
            json_t *spawn_in = json_pack("{s:s,s:s}", "task", task, "type", type);
            refuse_unknown(c, id, true, spawn_in, bytes, &b->agents, "agent type", type,
                           "types: ", "no agent types are registered");
            json_decref(spawn_in);
            return;
        }
        if (!e && b->agents.next != &b->agents)
            e = conch_list_entry(b->agents.next, struct entry, link);
        if (!e && !detach) {
            json_t *spawn_in = json_pack("{s:s,s:n}", "task", task, "type");
            call_refuse(c, id, true, "agent", spawn_in, bytes, "unavailable",
                        "no sub-agents are available: the harness registered no agent types "
                        "for this sandbox");
            json_decref(spawn_in);
            return;
        }
    }

    struct origin *o = conch_bridge__origin_of(c);
    if (b->freeing || c->closing) {
        json_decref(input);
        return;
    }
    if (!o) {
        json_decref(input);
        conch_bridge__conn_send(
            c, conch_bridge__error_msg(id, "unavailable",
                                       "this process belongs to no command of the sandbox"));
        return;
    }
    if (detach &&
        (json_array_size(o->detached) >= DETACHED_MAX || strlen(task) > DETACHED_TASK_MAX)) {
        snprintf(msg, sizeof(msg),
                 json_array_size(o->detached) >= DETACHED_MAX
                     ? "this command made %u detached requests, the limit"
                     : "a detached request's task may hold at most %u bytes",
                 json_array_size(o->detached) >= DETACHED_MAX ? DETACHED_MAX : DETACHED_TASK_MAX);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "limit", msg));
        return;
    }
    if (o->calls >= b->lim.max_calls) {
        json_decref(input);
        snprintf(msg, sizeof(msg), "this command made %u calls, the limit", b->lim.max_calls);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "limit", msg));
        return;
    }
    if (b->inflight_bytes + bytes > INFLIGHT_BYTES_MAX) {
        json_decref(input);
        snprintf(msg, sizeof(msg), "%zu bytes of calls are in flight in this sandbox, the limit",
                 (size_t)INFLIGHT_BYTES_MAX);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "limit", msg));
        return;
    }
    if (b->n_pending >= b->lim.max_pending) {
        json_decref(input);
        snprintf(msg, sizeof(msg), "%u calls are in flight in this sandbox, the limit",
                 b->lim.max_pending);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "limit", msg));
        return;
    }
    if (take_charge(b, held, charged) < 0) {
        json_decref(input);
        char state[256];
        conch_bridge__budget_state(b, state, sizeof(state));
        snprintf(msg, sizeof(msg), "a call of %llu bytes (parsed) does not fit: %s",
                 (unsigned long long)held, state);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "limit", msg));
        return;
    }

    struct conch_bridge_call *call = calloc(1, sizeof(*call));
    if (!call) {
        conch_budget_uncharge(&b->budget, held);
        json_decref(input);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "unavailable", "out of memory"));
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
    conch_list_add(&b->calls, &call->link);
    b->n_pending++;
    call->bytes = bytes;
    b->inflight_bytes += bytes;
    c->calls++;
    o->calls++;
    if (!call->name || (spawn && !call->task) || (type && !call->type)) {
        conch_bridge__call_fail(call, "unavailable", "out of memory", NULL);
        return;
    }
    if (detach) {
        json_array_append_new(o->detached, json_pack("{s:s,s:s,s:s?}", "call_id", call->call_id,
                                                     "task", call->task, "type", call->type));
        call_record(call, NULL, NULL, NULL, NULL, true);
        call_take_conn(call);
        conch_bridge__conn_send(c, json_pack("{s:O,s:b,s:{s:s}}", "id", id, "ok", 1, "result",
                                             "request_id", call->call_id));
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
        conch_bridge__call_fail(call, "unavailable", msg, NULL);
    }
}

/* ---- Deferred calls ------------------------------------------------------------------------- */

bool conch_bridge__conn_has_deferred(struct conn *c)
{
    for (struct conch_list *n = c->b->deferred.next; n != &c->b->deferred; n = n->next)
        if (conch_list_entry(n, struct deferred, link)->c == c)
            return true;
    return false;
}

void conch_bridge__deferred_free(struct conch_bridge *b, struct deferred *d)
{
    conch_list_del(&d->link);
    b->n_deferred--;
    conch_budget_uncharge(&b->budget, d->held);
    json_decref(d->req);
    free(d);
}

/* Replay @d's request (its origin is known now, or its time is up: conch_bridge__start_call
 * answers). */
void conch_bridge__deferred_replay(struct conch_bridge *b, struct deferred *d)
{
    struct conn *c = d->c;
    json_t *req = json_incref(d->req);
    size_t bytes = d->bytes;
    uint64_t held = d->held;
    d->held = 0; /* its charge goes on to the call, or is uncharged below */
    conch_bridge__deferred_free(b, d);
    const char *op = json_string_value(json_object_get(req, "op"));
    uint64_t charged = held;
    conch_bridge__start_call(c, req, json_object_get(req, "id"), op && !strcmp(op, "spawn"), bytes,
                             held, &charged);
    conch_budget_uncharge(&b->budget, charged);
    json_decref(req);
}

static void on_defer_timer(uv_timer_t *t)
{
    struct conch_bridge *b = t->data;
    double now = mono_ms();
    bool again = true;
    while (again) {
        again = false;
        for (struct conch_list *n = b->deferred.next; n != &b->deferred; n = n->next) {
            struct deferred *d = conch_list_entry(n, struct deferred, link);
            if (d->deadline_ms <= now) {
                conch_bridge__deferred_replay(b, d); /* no origin: answered "unavailable" */
                again = true;
                break;
            }
        }
    }
    if (!b->n_deferred)
        uv_timer_stop(t);
}

/* Keep @req of @c (@held: its cost, conch_rpc_json_cost) until its origin begins, taking
 * the charge from *@charged when it covers it. Returns false when it cannot be kept. */
bool conch_bridge__defer_call(struct conn *c, json_t *req, size_t bytes, uint64_t held,
                              uint64_t *charged)
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
    struct deferred *d = calloc(1, sizeof(*d));
    if (!d)
        return false;
    if (take_charge(b, held, charged) < 0) {
        free(d);
        return false; /* conch_bridge__start_call answers "limit" */
    }
    d->held = held;
    d->c = c;
    d->req = json_incref(req);
    d->bytes = bytes;
    d->deadline_ms = mono_ms() + DEFER_MS;
    conch_list_add(&b->deferred, &d->link);
    b->n_deferred++;
    if (!uv_is_active((uv_handle_t *)b->defer_timer))
        uv_timer_start(b->defer_timer, on_defer_timer, 100, 100);
    return true;
}
