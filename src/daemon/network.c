/* network.c - a sandbox's network as the daemon keeps it: its policy, the allow mode's proxy
 * (net/, on the daemon's loop, accepting on the listener its warden made inside the
 * sandbox's network namespace), the log of attempts, their part in command results, and the
 * methods network.log and network.set. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "daemon/daemon-internal.h"

static void on_record(void *ctx, const struct conch_net_record *rec)
{
    struct sandbox *sb = ctx;
    if (!sb->net_log) {
        /* Made on the first attempt and charged once: a sandbox that never tries holds
         * nothing. Without room in its budget, attempts are still refused or served; only
         * the log is missing. */
        size_t size = CONCH_NET_LOG_MAX * sizeof(*sb->net_log);
        struct conch_err err = {0};
        if (conch_budget_charge(&sb->held, size, &err) < 0) {
            log_warn("sandbox %s: network log: %s", sb->id, err.msg);
            return;
        }
        if (!(sb->net_log = calloc(CONCH_NET_LOG_MAX, sizeof(*sb->net_log)))) {
            conch_budget_uncharge(&sb->held, size);
            return;
        }
    }
    sb->net_log[sb->net_log_next] = *rec;
    sb->net_log_next = (sb->net_log_next + 1) % CONCH_NET_LOG_MAX;
    sb->net_records++;
}

/* The proxy charges the sandbox's budget until its last connection is closed: the sandbox is
 * held until then. */
static void on_proxy_closed(void *ctx)
{
    conch_daemon_sandbox_release(ctx);
}

static const struct conch_net_proxy_ops proxy_ops = {.record = on_record,
                                                     .closed = on_proxy_closed};

void conch_daemon_net_listen(struct sandbox *sb)
{
    if (!sb->jail)
        return;
    int fd = conch_jail_take_net_fd(sb->jail);
    if (fd < 0)
        return;
    struct conch_err err = {0};
    conch_net_proxy_free(sb->proxy);
    sb->proxy = NULL;
    if (conch_net_proxy_new(&sb->d->loop, &sb->net, &sb->held, sb->d->opts.net_hosts, &proxy_ops,
                            sb, &sb->proxy, &err) < 0) {
        close(fd);
        log_error("sandbox %s: network proxy: %s", sb->id, err.msg);
        return;
    }
    /* A tenant's rules may name no address of the host's networks (tenants.c). */
    conch_net_proxy_set_public_only(sb->proxy, sb->tenant[0] != '\0');
    conch_daemon_sandbox_hold(sb); /* released by on_proxy_closed */
    if (conch_net_proxy_listen(sb->proxy, fd, &err) < 0) {
        /* Its commands reach nothing (the listener is gone): the allow mode fails closed. */
        log_error("sandbox %s: network proxy: %s", sb->id, err.msg);
    }
}

void conch_daemon_net_stop(struct sandbox *sb)
{
    conch_net_proxy_free(sb->proxy);
    sb->proxy = NULL;
}

void conch_daemon_net_free(struct sandbox *sb)
{
    conch_daemon_net_stop(sb);
    if (sb->net_log)
        conch_budget_uncharge(&sb->held, CONCH_NET_LOG_MAX * sizeof(*sb->net_log));
    free(sb->net_log);
    sb->net_log = NULL;
    conch_net_policy_done(&sb->net);
}

static json_t *rules_json(const struct conch_net_rule *rules, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        char buf[300];
        conch_net_rule_format(&rules[i], buf, sizeof(buf));
        json_array_append_new(a, json_string(buf));
    }
    return a;
}

void conch_daemon_net_json(const struct sandbox *sb, json_t *o)
{
    json_object_set_new(o, "net", json_string(conch_net_mode_name(sb->net.mode)));
    if (sb->net.mode != CONCH_NET_ALLOW)
        return;
    json_object_set_new(o, "allow", rules_json(sb->net.allow, sb->net.n_allow));
    json_object_set_new(o, "deny", rules_json(sb->net.deny, sb->net.n_deny));
}

static json_t *record_json(const struct conch_net_record *r, bool open)
{
    json_t *o = conch_net_record_json(r);
    if (o && open)
        json_object_set_new(o, "open", json_true());
    return o;
}

/* The records of @sb's log, oldest first, made at or after @since: @fn(@arg, rec). */
static void log_each(const struct sandbox *sb, double since,
                     void (*fn)(void *arg, const struct conch_net_record *rec), void *arg)
{
    if (!sb->net_log)
        return;
    size_t n = sb->net_records < CONCH_NET_LOG_MAX ? (size_t)sb->net_records : CONCH_NET_LOG_MAX;
    size_t first = (sb->net_log_next + CONCH_NET_LOG_MAX - n) % CONCH_NET_LOG_MAX;
    for (size_t i = 0; i < n; i++) {
        const struct conch_net_record *r = &sb->net_log[(first + i) % CONCH_NET_LOG_MAX];
        if (r->at >= since)
            fn(arg, r);
    }
}

struct collect {
    json_t *arr;
    size_t max, dropped;
    bool open;
    double since;
};

static void collect_one(void *arg, const struct conch_net_record *rec)
{
    struct collect *c = arg;
    if (rec->at < c->since)
        return;
    if (json_array_size(c->arr) >= c->max) {
        c->dropped++;
        return;
    }
    json_array_append_new(c->arr, record_json(rec, c->open));
}

void conch_daemon_net_result(struct sandbox *sb, double since, json_t *o)
{
    if (!o || sb->net.mode == CONCH_NET_NONE)
        return;
    if (sb->net.mode == CONCH_NET_HOST) {
        json_object_set_new(o, "network", json_string("host"));
        return;
    }
    /* A command's connections may end just after it: those still open are listed too, with
     * their bytes so far. */
    struct collect c = {.arr = json_array(), .max = CONCH_NET_RESULT_MAX, .since = since};
    log_each(sb, since, collect_one, &c);
    c.open = true;
    if (sb->proxy)
        conch_net_proxy_each_open(sb->proxy, collect_one, &c);
    json_object_set_new(o, "network", c.arr);
    if (c.dropped)
        json_object_set_new(o, "network_dropped", json_integer((json_int_t)c.dropped));
}

void conch_daemon_handle_network_log(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *cl = ctx;
    struct sandbox *sb = conch_daemon_sandbox_find_or_fail(cl->d, call, params, "sandbox");
    if (!sb)
        return;
    struct collect c = {.arr = json_array(), .max = CONCH_NET_LOG_MAX, .since = 0};
    log_each(sb, 0, collect_one, &c);
    c.open = true;
    if (sb->proxy)
        conch_net_proxy_each_open(sb->proxy, collect_one, &c);
    json_t *o = json_pack("{s:s,s:o,s:I}", "sandbox", sb->id, "records", c.arr, "total",
                          (json_int_t)sb->net_records);
    conch_daemon_net_json(sb, o);
    conch_rpc_call_reply(call, o);
}

/* Parse the rule strings of @arr into @p's @deny list. Returns false after failing @call. */
static bool rules_from(struct conch_rpc_call *call, const char *key, json_t *arr,
                       struct conch_net_policy *p, bool deny)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        struct conch_err err = {0};
        if (!json_is_string(v)) {
            conch_rpc_call_fail_param(call, key, "%s must be an array of strings", key);
            return false;
        }
        if (conch_net_policy_add(p, deny, json_string_value(v), &err) < 0) {
            conch_rpc_call_fail_param(call, key, "%s", err.msg);
            return false;
        }
    }
    return true;
}

void conch_daemon_handle_network_set(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *cl = ctx;
    struct sandbox *sb = conch_daemon_sandbox_find_or_fail(cl->d, call, params, "sandbox");
    if (!sb)
        return;
    enum conch_net_mode mode = sb->net.mode;
    const char *net = conch_rpc_str(params, "net", NULL);
    struct conch_err err = {0};
    if (net && conch_net_mode_parse(net, &mode, &err) < 0) {
        conch_rpc_call_fail_param(call, "net", "%s", err.msg);
        return;
    }
    /* The namespaces are the warden's: a sandbox built without the proxy's listener (none)
     * or on the host's network (host) keeps that. An allow sandbox may go quiet (none: the
     * proxy refuses everything) and come back. */
    bool built_allow = sb->net.mode == CONCH_NET_ALLOW || sb->proxy;
    if (mode != sb->net.mode && !(built_allow && mode != CONCH_NET_HOST)) {
        conch_rpc_call_fail_param(
            call, "net",
            "sandbox %s was built with the network mode '%s', which cannot change to '%s' on a "
            "live sandbox: create one with --net %s",
            sb->id, conch_net_mode_name(sb->net.mode), conch_net_mode_name(mode),
            conch_net_mode_name(mode));
        return;
    }
    json_t *allow = json_object_get(params, "allow"), *deny = json_object_get(params, "deny");
    struct conch_net_policy p;
    conch_net_policy_init(&p, mode);
    /* The lists given replace the sandbox's; those not given stay. */
    bool ok = true;
    if (allow)
        ok = rules_from(call, "allow", allow, &p, false);
    else
        for (size_t i = 0; ok && i < sb->net.n_allow; i++) {
            char buf[300];
            conch_net_rule_format(&sb->net.allow[i], buf, sizeof(buf));
            ok = conch_net_policy_add(&p, false, buf, &err) == 0;
        }
    if (ok && deny)
        ok = rules_from(call, "deny", deny, &p, true);
    else
        for (size_t i = 0; ok && i < sb->net.n_deny; i++) {
            char buf[300];
            conch_net_rule_format(&sb->net.deny[i], buf, sizeof(buf));
            ok = conch_net_policy_add(&p, true, buf, &err) == 0;
        }
    if (!ok) {
        if (err.msg[0])
            conch_rpc_call_fail_err(call, 0, NULL, &err);
        conch_net_policy_done(&p);
        return;
    }
    if ((p.n_allow || p.n_deny) && mode != CONCH_NET_ALLOW && !built_allow) {
        conch_net_policy_done(&p);
        conch_rpc_call_fail_param(call, allow ? "allow" : "deny",
                                  "sandbox %s was built with the network mode '%s': rules need "
                                  "a sandbox created with --net allow (or --allow)",
                                  sb->id, conch_net_mode_name(sb->net.mode));
        return;
    }
    if (sb->proxy && conch_net_proxy_set_policy(sb->proxy, &p, &err) < 0) {
        conch_net_policy_done(&p);
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    conch_net_policy_done(&sb->net);
    sb->net = p;
    struct conch_err rerr = {0};
    if (sb->recorded && conch_daemon_sandbox_record(sb, &rerr) < 0)
        log_warn("sandbox %s: record its network: %s (a daemon restart brings back the "
                 "previous one)",
                 sb->id, rerr.msg);
    json_t *o = json_pack("{s:s}", "sandbox", sb->id);
    conch_daemon_net_json(sb, o);
    conch_rpc_call_reply(call, o);
}
