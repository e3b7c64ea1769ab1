/* tools.c - the daemon's side of the tool bridge: the tools.* and agents.* methods, and the
 * calls from inside a sandbox delivered to the client that registered the tool, as JSON-RPC
 * requests from the daemon (tool.call, agent.spawn) whose responses come back on the same
 * connection; $/cancel when the daemon gives up on one. Each sandbox has its own bridge
 * (bridge/), which does the in-sandbox protocol, the checks, the timeouts and the trace. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/bridge.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "toolschema/toolschema.h"

/* A call delivered to a client and not answered yet. */
struct out_call {
    struct conch_list link; /* in client->out_calls */
    struct client *c;
    json_int_t rpc_id;
    struct conch_bridge_call *call;
};

static void out_call_free(struct out_call *oc)
{
    conch_list_del(&oc->link);
    free(oc);
}

static int bridge_deliver(void *ctx, void *owner, struct conch_bridge_call *call)
{
    (void)ctx;
    struct client *c = owner;
    if (!c || c->closing || !c->sink)
        return -1;
    struct out_call *oc = calloc(1, sizeof(*oc));
    json_t *params = conch_bridge_call_params(call);
    json_t *id = oc ? json_integer(++c->next_out_id) : NULL;
    if (!oc || !params || !id) {
        free(oc);
        json_decref(params);
        json_decref(id);
        return -1;
    }
    oc->c = c;
    oc->rpc_id = json_integer_value(id);
    oc->call = call;
    conch_list_add(&c->out_calls, &oc->link);
    conch_bridge_call_set_handle(call, oc);
    const char *method =
        conch_bridge_call_kind(call) == CONCH_BRIDGE_TOOL ? "tool.call" : "agent.spawn";
    json_t *msg = conch_rpc_request(id, method, params);
    json_decref(id);
    if (!msg) {
        out_call_free(oc);
        conch_bridge_call_set_handle(call, NULL);
        return -1;
    }
    conch_rpc_sink_send(c->sink, msg);
    return 0;
}

static void bridge_cancel(void *ctx, void *owner, struct conch_bridge_call *call,
                          const char *reason)
{
    (void)ctx;
    struct out_call *oc = conch_bridge_call_handle(call);
    if (!oc)
        return;
    /* Forget it before telling the client: a send may disconnect it (output limit), which
     * frees every delivery it had. */
    json_int_t rpc_id = oc->rpc_id;
    out_call_free(oc);
    conch_bridge_call_set_handle(call, NULL);
    struct client *c = owner;
    if (c && !c->closing && c->sink)
        conch_daemon_client_notify(c->sink, "$/cancel",
                                   json_pack("{s:s,s:I,s:s}", "call_id", conch_bridge_call_id(call),
                                             "id", rpc_id, "reason",
                                             reason ? reason : "cancelled"));
}

/* A connection from a pid namespace the bridge does not know: the command may have started
 * an instant ago, its STARTED still on the warden's socket. */
static void bridge_resolve(void *ctx)
{
    struct sandbox *sb = ctx;
    /* A lent sandbox's control socket is its borrower's to read (its bridge refuses too);
     * one being built or made as new reads its answer first (lifecycle.c). */
    if (sb->state != SB_READY && sb->state != SB_POOLED)
        return;
    if (conch_super_dispatch(&sb->super) == 0)
        conch_daemon_sandbox_warden_gone(sb);
}

static const struct conch_bridge_ops bridge_ops = {
    .deliver = bridge_deliver,
    .cancel = bridge_cancel,
    .resolve = bridge_resolve,
};

int conch_daemon_sandbox_bridge_new(struct sandbox *sb, struct conch_err *err)
{
    struct conch_bridge_limits lim;
    conch_bridge_limits_init(&lim);
    if (sb->tool_timeout > 0)
        lim.call_timeout_s = sb->tool_timeout;
    if (sb->max_tool_calls)
        lim.max_calls = sb->max_tool_calls;
    lim.max_held = 0; /* its cap is the sandbox's (sb->held), which draws on the daemon's */
    lim.shared = &sb->held;
    return conch_bridge_new(&sb->d->loop, sb->id, &lim, &bridge_ops, sb, &sb->bridge, err);
}

void conch_daemon_sandbox_bridge_listen(struct sandbox *sb)
{
    if (!sb->bridge || !sb->jail)
        return;
    int fd = conch_jail_take_ptc_fd(sb->jail);
    struct conch_err err = {0};
    if (fd >= 0 && conch_bridge_listen(sb->bridge, fd, &err) < 0)
        log_warn("sandbox %s: %s", sb->id, err.msg);
}

void conch_daemon_client_tools_response(struct client *c, json_t *id, json_t *result, json_t *error)
{
    if (!json_is_integer(id))
        return;
    json_int_t want = json_integer_value(id);
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->out_calls)
    {
        struct out_call *oc = conch_list_entry(pos, struct out_call, link);
        if (oc->rpc_id != want)
            continue;
        struct conch_bridge_call *call = oc->call;
        out_call_free(oc);
        conch_bridge_call_set_handle(call, NULL);
        if (error) {
            const char *msg = json_string_value(json_object_get(error, "message"));
            conch_bridge_call_fail(call, "tool_error", msg ? msg : "the tool failed");
        } else {
            conch_bridge_call_answer(call, json_incref(result));
        }
        return;
    }
    /* An answer to a call the daemon gave up on (timed out, cancelled): dropped. */
}

void conch_daemon_client_tools_gone(struct client *c)
{
    /* Forget the deliveries first: the bridges fail those calls without cancelling them. */
    while (!conch_list_empty(&c->out_calls)) {
        struct out_call *oc = conch_list_entry(c->out_calls.next, struct out_call, link);
        conch_bridge_call_set_handle(oc->call, NULL);
        out_call_free(oc);
    }
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sb->bridge)
            conch_bridge_drop_owner(sb->bridge, c);
    }
}

/* ---- methods ---- */

static struct sandbox *bridge_sandbox(struct client *c, struct conch_rpc_call *call, json_t *params)
{
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", ""));
    if (sb && !sb->bridge) {
        conch_rpc_call_failf(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", NULL,
                             "sandbox %s has no tool bridge", sb->id);
        return NULL;
    }
    return sb;
}

static void do_register(struct conch_rpc_call *call, json_t *params, void *ctx, bool agents)
{
    struct client *c = ctx;
    struct sandbox *sb = bridge_sandbox(c, call, params);
    if (!sb)
        return;
    json_t *names = NULL;
    struct conch_err err = {0};
    if (conch_bridge_register(sb->bridge, agents,
                              json_object_get(params, agents ? "agents" : "tools"), c, &names,
                              &err) < 0) {
        if (err.kind == CONCH_ERR_LIMIT)
            conch_rpc_call_fail_err(call, 0, NULL, &err);
        else
            conch_rpc_call_fail_param(call, agents ? "agents" : "tools", "%s", err.msg);
        return;
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "registered", names));
}

static void do_unregister(struct conch_rpc_call *call, json_t *params, void *ctx, bool agents)
{
    struct client *c = ctx;
    struct sandbox *sb = bridge_sandbox(c, call, params);
    if (!sb)
        return;
    json_t *names = json_object_get(params, "names");
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n)
    {
        if (!json_is_string(n)) {
            conch_rpc_call_fail_param(call, "names", "names[%zu]: expected a string", i);
            return;
        }
    }
    conch_rpc_call_reply(
        call, json_pack("{s:o}", "removed", conch_bridge_unregister(sb->bridge, agents, names)));
}

void conch_daemon_handle_tools_register(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    do_register(call, params, ctx, false);
}

void conch_daemon_handle_agents_register(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    do_register(call, params, ctx, true);
}

void conch_daemon_handle_tools_unregister(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    do_unregister(call, params, ctx, false);
}

void conch_daemon_handle_agents_unregister(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    do_unregister(call, params, ctx, true);
}

void conch_daemon_handle_tools_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = bridge_sandbox(ctx, call, params);
    if (sb)
        conch_rpc_call_reply(call, conch_bridge_list(sb->bridge));
}

void conch_daemon_handle_tools_trace(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = bridge_sandbox(ctx, call, params);
    if (!sb)
        return;
    json_t *origin = json_object_get(params, "origin");
    const char *kind = NULL, *id = NULL;
    if (origin) {
        kind = json_string_value(json_object_get(origin, "kind"));
        id = json_string_value(json_object_get(origin, "id"));
        if (!kind || !id) {
            conch_rpc_call_fail_param(call, "origin",
                                      "origin: expected {\"kind\": \"exec\"|\"job\"|\"session\", "
                                      "\"id\": \"...\"}");
            return;
        }
    }
    conch_rpc_call_reply(call,
                         json_pack("{s:o}", "calls", conch_bridge_trace(sb->bridge, kind, id)));
}

void conch_daemon_handle_tools_prompt(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = bridge_sandbox(ctx, call, params);
    if (!sb)
        return;
    unsigned langs = 0;
    struct conch_err err = {0};
    if (conch_toolschema_languages(json_object_get(params, "languages"), &langs, &err) < 0) {
        conch_rpc_call_fail_param(call, "languages", "%s", err.msg);
        return;
    }
    char *text = conch_bridge_prompt(sb->bridge, langs);
    if (!text) {
        conch_rpc_call_fail(call, CONCH_RPC_INTERNAL_ERROR, NULL, "out of memory", NULL);
        return;
    }
    conch_rpc_call_reply(call, json_pack("{s:s%}", "text", text, strlen(text)));
    free(text);
}
