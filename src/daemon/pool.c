/* pool.c - the pool of pre-built sandboxes for `fresh` commands (filled in the background,
 * taken by exec.run fresh, made as new by their warden after their one command when the
 * pool has room) and `conch run`'s lease of one with its workspace attached. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/fdpass.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"

void conch_daemon_pool_fill(struct daemon *d)
{
    if (d->stopping)
        return;
    /* Counted as the pool's from BUILDING: a pool being built is not built twice. */
    while (d->n_pooled < d->opts.pool_size && d->n_sandboxes < d->opts.max_sandboxes) {
        struct sandbox *sb = conch_sb_new(d);
        if (!sb)
            return;
        sb->env = json_object();
        sb->idle_timeout = 0;
        struct conch_err err = {0};
        if (conch_sb_spawn(sb, true, &err) < 0) {
            log_warn("pool: %s", err.msg);
            conch_sb_set_state(sb, SB_GONE, NULL);
            return;
        }
    }
}

static void on_fill_timer(uv_timer_t *t)
{
    conch_daemon_pool_fill(t->data);
}

void conch_daemon_pool_fill_soon(struct daemon *d)
{
    if (!d->stopping)
        uv_timer_start(&d->pool_timer, on_fill_timer, 0, 0);
}

/* Recycling is worth it only as a whole: building a sandbox costs ~2.5 ms of CPU and
 * destroying one ~1 ms (namespaces, ~75 mounts, the network namespace); making one as new
 * ran 0.7-1.2 ms in the warden (traced; about half is the new network namespace, and the
 * unmounts wait on RCU, 1-3 ms of wall time), after the answer. What a command could have
 * changed is renewed (see the warden's recycle()); what is kept is read-only to commands. A
 * sandbox that anything else touched (another run or a session by its id, file requests, JS
 * sessions, workspace operations) is destroyed as before: the warden's recycle ends processes
 * without final events, so none may be live. */
void conch_daemon_sandbox_retire(struct sandbox *sb)
{
    struct daemon *d = sb->d;
    struct conch_err err = {0};
    /* Its one command's run is out of sb->runs by now (answered): any run left is another's;
     * tools registered on it by its id, or its trace, would carry over to the next client. */
    if (!sb->from_pool || d->stopping || sb->as_root || sb->workspace[0] || sb->upper_dir[0] ||
        !sb->jail || !conch_list_empty(&sb->runs) || sb->super.live ||
        conch_bridge_used(sb->bridge) || !conch_list_empty(&sb->done_jobs) ||
        !conch_list_empty(&sb->files) || sb->file_pool || sb->js || sb->ws_running ||
        !conch_list_empty(&sb->ws_ops) || d->n_pooled >= d->opts.pool_size ||
        conch_super_recycle(&sb->super, &sb->answer, &err) < 0) {
        conch_daemon_sandbox_destroy(sb);
        return;
    }
    /* Renewed (a new id) and not taken before the warden's answer (lifecycle.c on_answer). */
    conch_sb_set_state(sb, SB_RECYCLING, NULL);
}

/* A sandbox of the pool ready to be taken, or NULL. */
static struct sandbox *pool_ready(struct daemon *d)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sb->state == SB_POOLED)
            return sb;
    }
    return NULL;
}

struct sandbox *conch_daemon_pool_take(struct daemon *d)
{
    struct sandbox *sb = pool_ready(d);
    if (sb)
        conch_sb_set_state(sb, SB_READY, NULL);
    return sb;
}

/* ---- `conch run` through the pool: a sandbox lent with its workspace attached ---- */

static struct client *lease_client(struct sandbox *sb)
{
    struct client *c = conch_rpc_sink_ctx(sb->lease_sink);
    return c && !c->closing && !c->stdio ? c : NULL;
}

/* Send @line on @c's socket with @fd, around libuv (which passes no plain fds), when nothing
 * else is queued for it: the line then lands whole and in order. */
static int send_with_fd(struct client *c, const char *line, int fd)
{
    uv_os_fd_t sock;
    conch_daemon_client_flush(c); /* what was gathered goes first */
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->in) != 0)
        return -EAGAIN;
    if (uv_fileno((uv_handle_t *)&c->in, &sock) != 0)
        return -EBADF;
    size_t len = strlen(line);
    ssize_t n = conch_send_fds(sock, line, len, &fd, 1, MSG_DONTWAIT);
    if (n < 0)
        return (int)n;
    /* A short write of a line this small to a socket with nothing queued does not happen;
     * if it did, the client would read half a line: it is disconnected instead. */
    if ((size_t)n < len) {
        conch_daemon_client_close(c);
        return -EPIPE;
    }
    return 0;
}

void conch_sb_lease_answer(struct sandbox *sb, int r, const struct conch_err *err)
{
    struct conch_rpc_call *call = sb->lease_call;
    struct client *c = lease_client(sb);
    sb->lease_call = NULL; /* answered here, whatever happens */
    struct conch_jail_lease lease;
    int ctl = -1;
    struct conch_err herr = {0};
    if (r < 0 || !c || conch_jail_hand_over(sb->jail, &lease, &ctl, &herr) < 0) {
        if (r < 0 || c)
            conch_rpc_call_fail_err(call, 0, NULL, r < 0 ? err : &herr);
        else
            conch_rpc_call_reply(call, json_null()); /* nobody reads it */
        conch_daemon_sandbox_destroy(sb);
        return;
    }
    json_t *res = json_pack("{s:s,s:i,s:i,s:b,s:I}", "sandbox", sb->id, "warden_pid",
                            (int)lease.warden_pid, "upper_fd", lease.upper_fd_nr, "root_mode",
                            lease.root_mode, "host_id_base", (json_int_t)lease.host_id_base);
    char *line = res ? conch_rpc_call_take_result_line(call, res) : NULL;
    int sr = line ? send_with_fd(c, line, ctl) : -ENOMEM;
    free(line);
    close(ctl);
    if (!line) {
        json_decref(res);
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, NULL, NULL, "lease: out of memory");
    }
    if (sr < 0) {
        log_warn("sandbox %s: lease answer not sent: %s", sb->id, strerror(-sr));
        conch_daemon_sandbox_destroy(sb);
        return;
    }
    conch_sb_set_state(sb, SB_LENT, NULL);
}

/* The client is done with @sb: @clean, it read every event of its commands (sandbox.release),
 * so the sandbox can be made as new for the pool; otherwise it went away mid-way. */
static void lease_end(struct sandbox *sb, bool clean)
{
    if (clean)
        conch_daemon_sandbox_retire(sb);
    else
        conch_daemon_sandbox_destroy(sb);
}

void conch_daemon_sandboxes_client_gone(struct daemon *d, struct conch_rpc_sink *sink)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sb->state == SB_LENT && sb->lease_sink == sink)
            lease_end(sb, false);
    }
}

void conch_daemon_handle_sandbox_release(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    (void)params;
    struct conch_list *pos, *tmp;
    unsigned n = 0;
    conch_list_for_each_safe(pos, tmp, &c->d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sb->state == SB_LENT && sb->lease_sink == c->sink) {
            lease_end(sb, true);
            n++;
        }
    }
    conch_rpc_call_reply(call, json_pack("{s:i}", "released", n));
}

void conch_daemon_handle_sandbox_lease(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    struct daemon *d = c->d;
    struct conch_err err = {0};
    if (c->stdio) {
        conch_rpc_call_failf(call, CONCH_RPC_INVALID_REQUEST, "unsupported", NULL,
                             "sandbox.lease needs a socket connection (it passes an fd)");
        return;
    }
    const char *ws = conch_rpc_str(params, "workspace", "");
    enum conch_ws_mode mode = CONCH_WS_OVERLAY;
    if (ws[0] != '/') {
        conch_rpc_call_fail_param(call, "workspace", "workspace must be an absolute path");
        return;
    }
    if (conch_ws_mode_parse(conch_rpc_str(params, "mode", "overlay"), &mode, &err) < 0 ||
        mode == CONCH_WS_RW) {
        conch_rpc_call_fail_param(call, "mode", "mode must be \"overlay\" or \"ro\"");
        return;
    }
    /* The borrower drives the warden itself: a conch of another build would have every
     * message refused mid-command. */
    json_int_t proto = conch_rpc_int(params, "proto", 0);
    if (proto && proto != (json_int_t)conch_jail_proto_version()) {
        conch_rpc_call_failf(call, CONCH_RPC_INVALID_REQUEST, "unsupported", NULL,
                             "this daemon's wardens speak protocol %#x, the client %#llx: "
                             "conch run builds its own sandbox",
                             conch_jail_proto_version(), (unsigned long long)proto);
        return;
    }
    struct sandbox *sb = pool_ready(d);
    if (!sb) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "no pre-built sandbox is ready in the pool");
        return;
    }
    uint64_t disk = (uint64_t)conch_rpc_int(params, "disk", 0);
    if (conch_super_attach(&sb->super, &sb->answer, ws, (dev_t)conch_rpc_int(params, "ws_dev", 0),
                           (ino_t)conch_rpc_int(params, "ws_ino", 0), mode,
                           disk ? disk : CONCH_SPEC_DISK_DEFAULT, &err) < 0) {
        /* Nothing was attached (a missing or replaced workspace, say): the sandbox is as it
         * was, in the pool. */
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    /* Not listed; made as new for the pool (or destroyed) when the client is done. */
    sb->fresh = sb->from_pool = true;
    sb->lease_call = call;
    sb->lease_sink = conch_rpc_sink_ref(c->sink);
    conch_sb_set_state(sb, SB_LEASING, NULL);
}
