/* bridge.c - one sandbox's tool bridge: its life (new, free) and its listener on
 * /run/conch/ptc.sock (accepted on the host's libuv loop). Connections and their lines are in
 * bridge-conn.c, calls in bridge-call.c, the registry, origins and trace in
 * bridge-registry.c. See bridge.h and docs/TOOLS.md. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bridge/bridge-internal.h"
#include "bridge/bridge.h"

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

void conch_bridge__maybe_free(struct conch_bridge *b)
{
    if (!b->freeing || b->handles)
        return;
    json_decref(b->trace);
    free(b);
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
    CONCH_LIST_INIT(&b->tools);
    CONCH_LIST_INIT(&b->agents);
    CONCH_LIST_INIT(&b->origins);
    CONCH_LIST_INIT(&b->conns);
    CONCH_LIST_INIT(&b->calls);
    CONCH_LIST_INIT(&b->deferred);
    CONCH_LIST_INIT(&b->locals);
    *ret = b;
    return 0;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct conch_bridge *b = h->data;
    free(h);
    b->handles--;
    /* What it holds goes with the handles, closed later: let go of it in the shared budgets
     * now, so that they need only outlive this call (the holders uncharge the bridge's own). */
    conch_budget_uncharge(b->budget.parent, conch_budget_held(&b->budget));
    b->budget.parent = NULL;
    conch_bridge__maybe_free(b);
}

static void stop_listening(struct conch_bridge *b)
{
    while (b->conns.next != &b->conns)
        conch_bridge__conn_close(conch_list_entry(b->conns.next, struct conn, link));
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
        conch_bridge__conn_close(conch_list_entry(b->conns.next, struct conn, link));
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
        r = uv_listen((uv_stream_t *)l, 1024, conch_bridge__on_connection);
    if (r < 0) {
        uv_close((uv_handle_t *)l, on_listener_closed);
        return conch_err_set(err, -r, "tool bridge: listen: %s", uv_strerror(r));
    }
    b->listener = l;
    return 0;
}

void conch_bridge_free(struct conch_bridge *b)
{
    if (!b || b->freeing)
        return;
    b->freeing = true;
    while (b->calls.next != &b->calls) {
        struct conch_bridge_call *c =
            conch_list_entry(b->calls.next, struct conch_bridge_call, link);
        conch_bridge__call_fail(c, "unavailable", "the sandbox stopped", "the sandbox stopped");
    }
    /* Callers with no socket outlive the bridge (their host closes them later): they get
     * nothing more from it. */
    while (b->locals.next != &b->locals) {
        struct conn *l = conch_list_entry(b->locals.next, struct conn, link);
        conch_list_del(&l->link);
        CONCH_LIST_INIT(&l->link);
        l->closing = true;
        l->b = NULL;
    }
    conch_bridge__entries_free(&b->tools);
    conch_bridge__entries_free(&b->agents);
    while (b->origins.next != &b->origins)
        conch_bridge__origin_free(conch_list_entry(b->origins.next, struct origin, link));
    stop_listening(b); /* closes the connections, and so drops what they deferred */
    if (b->defer_timer) {
        uv_timer_stop(b->defer_timer);
        uv_close((uv_handle_t *)b->defer_timer, on_listener_closed);
        b->defer_timer = NULL;
    }
    /* What it holds goes with the handles, closed later: let go of it in the shared budgets
     * now, so that they need only outlive this call (the holders uncharge the bridge's own). */
    conch_budget_uncharge(b->budget.parent, conch_budget_held(&b->budget));
    b->budget.parent = NULL;
    conch_bridge__maybe_free(b);
}
