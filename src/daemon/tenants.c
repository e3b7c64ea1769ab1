/* tenants.c - tenants in the daemon (docs/ARCHITECTURE.md, "Tenants"): connection.auth against
 * the --tokens table (tokens.c), its failures counted and rate-limited per peer, SIGHUP
 * reloading the table; the method table a tenant's connection is held to (default-deny: a
 * method not listed here as tenant-safe is forbidden), what a tenant sees, and its quotas. */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "core/sha256.h"
#include "daemon/daemon-internal.h"
#include "daemon/sessions.h"
#include "daemon/tokens.h"

/* Failed authentications: AUTH_FAILS_MAX within AUTH_WINDOW_MS from one peer, and that peer
 * is refused for AUTH_BLOCK_MS. At most AUTH_PEERS_MAX peers are remembered (the
 * oldest go first). */
#define AUTH_FAILS_MAX 10
#define AUTH_WINDOW_MS (60 * 1000)
#define AUTH_BLOCK_MS (60 * 1000)
#define AUTH_PEERS_MAX 4096
#define PEER_MAX 128

struct auth_fail {
    struct conch_list link; /* in daemon.auth_fails, the least recently failed first */
    char peer[PEER_MAX + 1];
    /* The times of its last AUTH_FAILS_MAX failures (monotonic ms; a ring, @next the oldest):
     * a sliding window, so that failures either side of a window's edge add up. */
    uint64_t at[AUTH_FAILS_MAX];
    unsigned next, count;
    uint64_t blocked_until;
};

/* The table every connection of a daemon with tenants dispatches through:
 * conch_daemon_methods with every handler replaced by gate(). Built once, at the first
 * request. */
static struct conch_rpc_method *tenant_table;

static void on_sighup(uv_signal_t *h, int signum);

int conch_daemon_tenants_start(struct daemon *d, const char *path, struct conch_err *err)
{
    CONCH_LIST_INIT(&d->auth_fails);
    if (path) {
        int r = conch_tokens_load(path, &d->tokens, err);
        if (r < 0)
            return r;
        log_info("tenants: %zu loaded from %s", d->tokens->n, path);
    }
    return 0;
}

void conch_daemon_tenants_listen(struct daemon *d)
{
    uv_signal_init(&d->loop, &d->sighup);
    d->sighup.data = d;
    uv_signal_start(&d->sighup, on_sighup, SIGHUP);
}

void conch_daemon_tenants_stop(struct daemon *d)
{
    conch_tokens_free(d->tokens);
    d->tokens = NULL;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->auth_fails)
    {
        conch_list_del(pos);
        free(conch_list_entry(pos, struct auth_fail, link));
    }
    d->n_auth_fails = 0;
}

/* SIGHUP: read the tokens file again. A file that no longer loads keeps the table in force; a
 * connection whose tenant is no longer in the file, or whose token is no longer its tenant's
 * (rotated after a leak, say), is closed. */
static void on_sighup(uv_signal_t *h, int signum)
{
    (void)signum;
    struct daemon *d = h->data;
    /* The gateway (conch serve --listen) reloads its certificate and key. */
    if (d->opts.on_sighup)
        d->opts.on_sighup(d->opts.hook_ctx);
    if (!d->opts.tokens_path) {
        log_info("SIGHUP: no --tokens file to reload");
        return;
    }
    struct conch_tokens *t = NULL;
    struct conch_err err = {0};
    if (conch_tokens_load(d->opts.tokens_path, &t, &err) < 0) {
        log_warn("SIGHUP: the tokens file was not reloaded, the previous tenants stay in force: "
                 "%s",
                 err.msg);
        return;
    }
    conch_tokens_free(d->tokens);
    d->tokens = t;
    log_info("SIGHUP: tenants: %zu loaded from %s", t->n, d->opts.tokens_path);
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->clients)
    {
        struct client *c = conch_list_entry(pos, struct client, link);
        if (!c->authed || c->closing)
            continue;
        const struct conch_token_entry *e = conch_tokens_find(t, c->tenant);
        if (!e || !conch_secure_equal(e->digest, c->token_digest, sizeof(e->digest))) {
            log_info("tenant '%s': %s: its connection is closed", c->tenant,
                     e ? "its token changed" : "no longer in the tokens file");
            conch_daemon_client_close(c);
        }
    }
}

/* ---- visibility ---- */

bool conch_daemon_tenant_sees_tenant(const struct daemon *d, const char *tenant)
{
    const struct client *v = d->viewer;
    if (!v || !v->authed || v->admin)
        return true;
    return !strcmp(tenant ? tenant : "", v->tenant);
}

bool conch_daemon_tenant_sees(const struct daemon *d, const struct sandbox *sb)
{
    return conch_daemon_tenant_sees_tenant(d, sb->tenant);
}

const char *conch_daemon_tenant_viewer(const struct daemon *d)
{
    return d->viewer && d->viewer->authed ? d->viewer->tenant : "";
}

/* ---- a tenant's workspace ---- */

int conch_daemon_tenant_workspace(struct daemon *d, const char *tenant, char *buf, size_t size,
                                  struct conch_err *err)
{
    int n = snprintf(buf, size, "%s/tenant-workspaces", d->state_dir);
    if (n < 0 || (size_t)n >= size)
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if (mkdir(buf, 0711) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", buf, strerror(errno));
    int m = snprintf(buf + n, size - (size_t)n, "/%s", tenant);
    if (m < 0 || (size_t)m >= size - (size_t)n)
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", buf, strerror(errno));
    return 0;
}

/* ---- quotas ---- */

static const struct conch_tenant_quota *quota_of(struct daemon *d, const char *tenant)
{
    const struct conch_token_entry *e = conch_tokens_find(d->tokens, tenant);
    return e ? &e->quota : NULL;
}

static void fmt_size(char *buf, size_t size, uint64_t v)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (v >= 1024 && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, size, "%llu", (unsigned long long)v);
    else
        snprintf(buf, size, "%llu%c", (unsigned long long)v, units[u]);
}

/* A quota's share for one sandbox given no value: the quota split evenly over its sandboxes
 * quota, else the whole quota. */
static uint64_t share(uint64_t quota, unsigned sandboxes)
{
    return sandboxes ? quota / sandboxes : quota;
}

uint64_t conch_daemon_tenant_disk_quota(struct daemon *d, const char *tenant)
{
    const struct conch_tenant_quota *q = quota_of(d, tenant);
    return q ? q->disk_bytes : 0;
}

int conch_daemon_tenant_admit(struct daemon *d, const char *tenant, uint64_t *memory,
                              uint64_t *disk, struct conch_err *err)
{
    const struct conch_tenant_quota *q = quota_of(d, tenant);
    if (!q)
        return 0;
    unsigned n = 0;
    uint64_t mem = 0, dsk = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sandbox_destroyed(sb) || strcmp(sb->tenant, tenant))
            continue;
        n++;
        mem += sb->limits.memory_bytes;
        dsk += sb->disk_bytes;
    }
    char a[32], b[32];
    if (q->sandboxes && n >= q->sandboxes)
        return conch_err_setk(err, CONCH_ERR_LIMIT, EDQUOT,
                              "tenant '%s': quota sandboxes=%u reached (%u held): destroy one "
                              "first",
                              tenant, q->sandboxes, n);
    if (q->memory_bytes) {
        uint64_t want = *memory ? *memory : share(q->memory_bytes, q->sandboxes);
        if (want > q->memory_bytes || mem > q->memory_bytes - want) {
            fmt_size(a, sizeof(a), q->memory_bytes);
            fmt_size(b, sizeof(b), mem);
            return conch_err_setk(err, CONCH_ERR_LIMIT, EDQUOT,
                                  "tenant '%s': quota memory=%s: its sandboxes hold %s and this "
                                  "one asks for %llu bytes%s",
                                  tenant, a, b, (unsigned long long)want,
                                  *memory ? "" : " (its share: give a smaller 'memory')");
        }
        *memory = want;
    }
    if (q->disk_bytes) {
        uint64_t def = share(q->disk_bytes, q->sandboxes);
        if (def > CONCH_SPEC_DISK_DEFAULT)
            def = CONCH_SPEC_DISK_DEFAULT;
        uint64_t want = *disk ? *disk : def;
        if (want > q->disk_bytes || dsk > q->disk_bytes - want) {
            fmt_size(a, sizeof(a), q->disk_bytes);
            fmt_size(b, sizeof(b), dsk);
            return conch_err_setk(err, CONCH_ERR_LIMIT, EDQUOT,
                                  "tenant '%s': quota disk=%s: its sandboxes hold %s and this "
                                  "one asks for %llu bytes%s",
                                  tenant, a, b, (unsigned long long)want,
                                  *disk ? "" : " (its share: give a smaller 'disk')");
        }
        *disk = want;
    }
    return 0;
}

bool conch_daemon_tenant_command_admit(struct daemon *d, struct conch_rpc_call *call)
{
    const char *tenant = conch_daemon_tenant_viewer(d);
    const struct conch_tenant_quota *q = tenant[0] ? quota_of(d, tenant) : NULL;
    if (!q || !q->commands)
        return true;
    unsigned n = 0;
    struct conch_list *pos, *tmp, *rp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (strcmp(sb->tenant, tenant))
            continue;
        for (rp = sb->runs.next; rp != &sb->runs; rp = rp->next)
            n += !conch_list_entry(rp, struct run, link)->finished;
        /* A session's shell runs whatever it is given, and a JS eval runs code: each is a
         * command as much as an exec.run. */
        char ids[8];
        n += (unsigned)conch_daemon_sessions_live(sb, ids, sizeof(ids));
        n += conch_daemon_js_busy(sb);
    }
    if (n < q->commands)
        return true;
    conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                         "tenant '%s': quota commands=%u reached (%u running): wait for one to "
                         "end",
                         tenant, q->commands, n);
    return false;
}

/* ---- connection.auth ---- */

static struct auth_fail *fail_find(struct daemon *d, const char *peer)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->auth_fails)
    {
        struct auth_fail *f = conch_list_entry(pos, struct auth_fail, link);
        if (!strcmp(f->peer, peer))
            return f;
    }
    return NULL;
}

/* Count a failure of @peer; log it (the peer quoted, never the token). */
static void fail_count(struct daemon *d, const char *peer)
{
    uint64_t now = conch_daemon_now_ms();
    struct auth_fail *f = fail_find(d, peer);
    if (!f && d->n_auth_fails >= AUTH_PEERS_MAX) {
        /* The least recently failed peer that is not refused now goes (a flood of new
         * peers must not free a refused one), else the least recently failed. */
        f = conch_list_entry(d->auth_fails.next, struct auth_fail, link);
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &d->auth_fails)
        {
            struct auth_fail *g = conch_list_entry(pos, struct auth_fail, link);
            if (g->blocked_until <= now) {
                f = g;
                break;
            }
        }
        conch_list_del(&f->link);
        d->n_auth_fails--;
        memset(f, 0, sizeof(*f));
    } else if (!f) {
        f = calloc(1, sizeof(*f));
    } else {
        conch_list_del(&f->link);
        d->n_auth_fails--;
    }
    if (!f)
        return;
    if (!f->peer[0])
        snprintf(f->peer, sizeof(f->peer), "%s", peer);
    f->at[f->next] = now;
    f->next = (f->next + 1) % AUTH_FAILS_MAX;
    if (f->count < AUTH_FAILS_MAX)
        f->count++;
    /* the 10th failure within 60 s (the oldest of the last 10 is that recent) */
    bool block = f->count == AUTH_FAILS_MAX && now - f->at[f->next] <= AUTH_WINDOW_MS;
    if (block) {
        f->blocked_until = now + AUTH_BLOCK_MS;
        f->count = 0;
    }
    conch_list_add(&d->auth_fails, &f->link);
    d->n_auth_fails++;
    log_warn("connection.auth: authentication failed (tenant unknown) from peer '%s'%s", peer,
             block ? ": too many failures, the peer is refused for 60 s" : "");
}

/* @s as a peer name fit for a log line: printable ASCII, at most PEER_MAX bytes. */
static void peer_clean(char *buf, size_t size, const char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < size; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[o++] = ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\' ? (char)ch : '?';
    }
    buf[o] = '\0';
}

/* An IPv6 peer counts as its /64: one host is usually given a whole /64, and would otherwise
 * have 2^64 addresses to spread its failures over. */
static void peer_group_v6(char *peer, size_t size)
{
    struct in6_addr a;
    char text[INET6_ADDRSTRLEN];
    if (inet_pton(AF_INET6, peer, &a) != 1)
        return;
    memset(a.s6_addr + 8, 0, 8);
    if (inet_ntop(AF_INET6, &a, text, sizeof(text)))
        snprintf(peer, size, "%s/64", text);
}

void conch_daemon_handle_connection_auth(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    struct daemon *d = c->d;
    char peer[PEER_MAX + 1];
    size_t plen = 0;
    const char *p = conch_rpc_strn(params, "peer", &plen);
    if (p)
        peer_clean(peer, sizeof(peer), p, plen);
    if (p)
        peer_group_v6(peer, sizeof(peer));
    else
        snprintf(peer, sizeof(peer), "local uid %u", (unsigned)c->peer_uid);
    if (c->authed) {
        /* Its own token again (an HTTP front end checking each request of a session) is
         * answered as the first time; any other token, good or bad, is refused alike: the
         * connection stays its tenant's, and learns nothing of other tokens. */
        size_t len = 0;
        const char *tok = conch_rpc_strn(params, "token", &len);
        unsigned char digest[32];
        conch_sha256(tok, tok ? len : 0, digest);
        bool same = conch_secure_equal(digest, c->token_digest, sizeof(digest));
        conch_secure_zero(digest, sizeof(digest));
        if (same)
            conch_rpc_call_reply(call,
                                 json_pack("{s:s,s:b}", "tenant", c->tenant, "admin", c->admin));
        else
            conch_rpc_call_failf(call, CONCH_RPC_FORBIDDEN, "forbidden", NULL,
                                 "connection.auth: this connection is already tenant '%s''s: a "
                                 "connection belongs to one tenant",
                                 c->tenant);
        return;
    }
    struct auth_fail *f = fail_find(d, peer);
    uint64_t now = conch_daemon_now_ms();
    if (f && f->blocked_until > now) {
        conch_rpc_call_failf(call, CONCH_RPC_RATE_LIMITED, "rate_limited", NULL,
                             "too many failed authentications from this peer: try again in %llu "
                             "s",
                             (unsigned long long)((f->blocked_until - now + 999) / 1000));
        return;
    }
    size_t tlen = 0;
    const char *token = conch_rpc_strn(params, "token", &tlen);
    const struct conch_token_entry *e =
        token && tlen <= CONCH_TOKENS_TOKEN_MAX ? conch_tokens_match(d->tokens, token, tlen) : NULL;
    if (!e) {
        fail_count(d, peer);
        conch_rpc_call_fail(call, CONCH_RPC_UNAUTHORIZED, "unauthorized", "unauthorized", NULL);
        return;
    }
    c->authed = true;
    c->admin = !strcmp(e->tenant, CONCH_TOKENS_ADMIN);
    memcpy(c->token_digest, e->digest, sizeof(c->token_digest));
    snprintf(c->tenant, sizeof(c->tenant), "%s", e->tenant);
    log_info("connection.auth: tenant '%s' from peer '%s'", c->tenant, peer);
    conch_rpc_call_reply(call, json_pack("{s:s,s:b}", "tenant", c->tenant, "admin", c->admin));
}

/* ---- what a tenant may call ---- */

static void forbid(struct conch_rpc_call *call, const char *what, const char *why)
{
    conch_rpc_call_failf(call, CONCH_RPC_FORBIDDEN, "forbidden", NULL,
                         "%s is not available to a tenant: %s", what, why);
}

#define HOST_WHY "it names a path or a resource of the daemon's host, which is not the tenant's"

/* sandbox.create (and exec.run's spec) from a tenant: nothing of the host. */
static bool create_ok(struct conch_rpc_call *call, json_t *params, struct client *c)
{
    (void)c;
    static const char *const host_keys[] = {"workspace", "rootfs", "sockets"};
    for (size_t i = 0; i < ARRAY_SIZE(host_keys); i++) {
        json_t *v = json_object_get(params, host_keys[i]);
        if (v && !json_is_null(v)) {
            char what[64];
            snprintf(what, sizeof(what), "'%s'", host_keys[i]);
            forbid(call, what, HOST_WHY);
            return false;
        }
    }
    const char *net = conch_rpc_str(params, "net", NULL);
    if (net && !strcmp(net, "host")) {
        forbid(call, "net \"host\"", "it shares the daemon host's network");
        return false;
    }
    const char *mode = conch_rpc_str(params, "mode", NULL);
    if (mode && strcmp(mode, "overlay")) {
        forbid(call, "a 'mode' other than overlay",
               "a tenant's workspace is an overlay on an empty directory of the daemon's");
        return false;
    }
    json_t *mounts = json_object_get(params, "mounts");
    size_t i;
    json_t *m;
    json_array_foreach(mounts, i, m)
    {
        /* A mount is an object {type, ...} or a string "type=...,target=..."; only tmpfs and
         * store mounts are a tenant's (anything else names a host directory). */
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *s = json_string_value(m);
        bool ok = type ? !strcmp(type, "tmpfs") || !strcmp(type, "store")
                       : s && (!strncmp(s, "type=tmpfs", 10) || !strncmp(s, "type=store", 10));
        if (s && ok && (strstr(s, ",type=") || strstr(s, "source=")))
            ok = false;
        if (!ok) {
            forbid(call, "a bind or overlay mount", HOST_WHY);
            return false;
        }
    }
    return true;
}

static bool exec_ok(struct conch_rpc_call *call, json_t *params, struct client *c)
{
    if (conch_rpc_bool(params, "fresh", false)) {
        forbid(call, "exec.run {fresh}",
               "a fresh sandbox comes from the daemon's shared pool (create a sandbox instead)");
        return false;
    }
    json_t *ws = json_object_get(params, "workspace");
    if (ws && !json_is_null(ws)) {
        forbid(call, "'workspace'", HOST_WHY);
        return false;
    }
    return conch_daemon_tenant_command_admit(c->d, call);
}

static bool command_ok(struct conch_rpc_call *call, json_t *params, struct client *c)
{
    (void)params;
    return conch_daemon_tenant_command_admit(c->d, call);
}

static bool net_ok(struct conch_rpc_call *call, json_t *params, struct client *c)
{
    (void)c;
    const char *net = conch_rpc_str(params, "net", NULL);
    if (net && !strcmp(net, "host")) {
        forbid(call, "net \"host\"", "it shares the daemon host's network");
        return false;
    }
    return true;
}

/* daemon.ping for a tenant: that the daemon answers, and its own sandboxes' count only. */
static void tenant_ping(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    (void)params;
    int n = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        n += !sandbox_in_pool(sb) && !sb->fresh && conch_daemon_tenant_sees(c->d, sb);
    }
    conch_rpc_call_reply(
        call, json_pack("{s:s,s:i,s:s}", "version", "0.1.0", "sandboxes", n, "tenant", c->tenant));
}

/* The methods a tenant may call: the handler of the method table after @check (NULL: none)
 * passes, or @own instead of it. Every other method is forbidden (@why says why for the
 * ones listed with a reason). */
struct tenant_rule {
    const char *method;
    bool (*check)(struct conch_rpc_call *call, json_t *params, struct client *c);
    void (*own)(struct conch_rpc_call *call, json_t *params, void *ctx);
    const char *why; /* non-NULL: forbidden, for this reason */
};

static const struct tenant_rule rules[] = {
    {"connection.auth", NULL, NULL, NULL},
    {"daemon.ping", NULL, tenant_ping, NULL},
    {"sandbox.create", create_ok, NULL, NULL},
    {"sandbox.list", NULL, NULL, NULL},
    {"sandbox.get", NULL, NULL, NULL},
    {"sandbox.destroy", NULL, NULL, NULL},
    {"sandbox.start", NULL, NULL, NULL},
    {"sandbox.fork", NULL, NULL, NULL},
    {"sandbox.lease", NULL, NULL, "it lends a sandbox on a directory of the daemon's host"},
    {"sandbox.release", NULL, NULL, "it ends a sandbox.lease, which a tenant cannot take"},
    {"exec.run", exec_ok, NULL, NULL},
    {"exec.signal", NULL, NULL, NULL},
    {"job.start", command_ok, NULL, NULL},
    {"job.output", NULL, NULL, NULL},
    {"job.wait", NULL, NULL, NULL},
    {"job.kill", NULL, NULL, NULL},
    {"job.list", NULL, NULL, NULL},
    {"fs.read", NULL, NULL, NULL},
    {"fs.write", NULL, NULL, NULL},
    {"fs.edit", NULL, NULL, NULL},
    {"fs.ls", NULL, NULL, NULL},
    {"fs.glob", NULL, NULL, NULL},
    {"fs.grep", NULL, NULL, NULL},
    {"fs.delete", NULL, NULL, NULL},
    {"fs.upload", NULL, NULL, NULL},
    {"fs.download", NULL, NULL, NULL},
    {"fs.copy_in", NULL, NULL, "it reads a file of the daemon's host (use fs.upload)"},
    {"fs.copy_out", NULL, NULL, "it writes a file on the daemon's host (use fs.download)"},
    {"workspace.changes", NULL, NULL, NULL},
    {"workspace.diff", NULL, NULL, NULL},
    {"workspace.commit", NULL, NULL, "it writes into a directory of the daemon's host"},
    {"workspace.discard", NULL, NULL, NULL},
    {"workspace.snapshot", NULL, NULL, NULL},
    {"workspace.restore", NULL, NULL, NULL},
    {"workspace.snapshots", NULL, NULL, NULL},
    {"workspace.snapshot_delete", NULL, NULL, NULL},
    {"tools.register", NULL, NULL, NULL},
    {"tools.unregister", NULL, NULL, NULL},
    {"tools.list", NULL, NULL, NULL},
    {"tools.trace", NULL, NULL, NULL},
    {"tools.prompt", NULL, NULL, NULL},
    {"agents.register", NULL, NULL, NULL},
    {"agents.unregister", NULL, NULL, NULL},
    {"session.open", command_ok, NULL, NULL},
    {"session.run", NULL, NULL, NULL},
    {"session.write", NULL, NULL, NULL},
    {"session.attach", NULL, NULL, NULL},
    {"session.detach", NULL, NULL, NULL},
    {"session.resize", NULL, NULL, NULL},
    {"session.signal", NULL, NULL, NULL},
    {"session.list", NULL, NULL, NULL},
    {"session.close", NULL, NULL, NULL},
    {"js.eval", command_ok, NULL, NULL},
    {"js.reset", NULL, NULL, NULL},
    {"js.close", NULL, NULL, NULL},
    {"js.list", NULL, NULL, NULL},
    {"network.log", NULL, NULL, NULL},
    {"network.set", net_ok, NULL, NULL},
    {"store.list", NULL, NULL, NULL},
    {"store.ls", NULL, NULL, NULL},
    {"store.read", NULL, NULL, NULL},
    {"store.write", NULL, NULL, NULL},
    {"store.delete", NULL, NULL, NULL},
};

/* The gated table's entries, by index as in conch_daemon_methods: each one's rule (NULL: not
 * a tenant's). */
static const struct tenant_rule **rule_of;

/* Every request of a daemon with tenants comes here, also those of the owner's connections:
 * a batch may hold connection.auth and then other requests, which must meet the tenant's
 * rules although the batch was dispatched before the connection was a tenant's. */
static void gate(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *method = conch_rpc_call_method(call);
    size_t i = 0;
    /* the name is the table's own pointer (the gated table copies it) */
    while (conch_daemon_methods[i].name && conch_daemon_methods[i].name != method)
        i++;
    if (!conch_daemon_methods[i].name) {
        forbid(call, method, "unknown to the tenants' table");
        return;
    }
    if (!c->authed) {
        conch_daemon_methods[i].handler(call, params, ctx);
        return;
    }
    const struct tenant_rule *rule = rule_of[i];
    if (!rule || rule->why) {
        forbid(call, method,
               rule ? rule->why : "it acts on the daemon as a whole, which is its owner's");
        return;
    }
    if (rule->check && !rule->check(call, params, c))
        return;
    if (rule->own)
        rule->own(call, params, ctx);
    else
        conch_daemon_methods[i].handler(call, params, ctx);
}

static const struct conch_rpc_method *tenant_methods(void)
{
    if (tenant_table)
        return tenant_table;
    size_t n = 0;
    while (conch_daemon_methods[n].name)
        n++;
    struct conch_rpc_method *t = calloc(n + 1, sizeof(*t));
    const struct tenant_rule **r = calloc(n + 1, sizeof(*r));
    if (!t || !r) {
        free(t);
        free(r);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        t[i] = (struct conch_rpc_method){conch_daemon_methods[i].name,
                                         conch_daemon_methods[i].params, gate};
        for (size_t k = 0; k < ARRAY_SIZE(rules) && !r[i]; k++)
            if (!strcmp(rules[k].method, t[i].name))
                r[i] = &rules[k];
    }
    rule_of = r;
    tenant_table = t;
    return t;
}

void conch_daemon_tenant_dispatch(struct client *c, const char *line, size_t len)
{
    /* Without tenants no connection can become one: the table as it is. */
    const struct conch_rpc_method *table = conch_daemon_methods;
    if ((c->authed || c->d->tokens) && !(table = tenant_methods())) {
        conch_rpc_sink_send(
            c->sink, conch_rpc_error(NULL, CONCH_RPC_INTERNAL_ERROR, NULL, "out of memory", NULL));
        return;
    }
    struct daemon *d = c->d;
    d->viewer = c;
    conch_rpc_dispatch(table, line, len, c, c->sink);
    d->viewer = NULL;
}
