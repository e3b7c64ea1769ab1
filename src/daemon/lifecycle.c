/* lifecycle.c - a sandbox's lifecycle: the table of legal edges, the one transition function
 * that owns what entering and leaving each state means, and the warden's control socket
 * whose events, routed by the supervisor, drive most edges (setup and recycle answers, the
 * lease's attach, the warden's death). docs/ARCHITECTURE.md ("A sandbox's lifecycle") draws the
 * same table. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/lifecycle.h"
#include "daemon/sessions.h"
#include "daemon/recover.h"
#include "daemon/statedir.h"
#include "ptc/ptc.h"

/* ---- the table ---- */

static const char *const state_names[SB_N_STATES] = {
    [SB_NEW] = "new",
    [SB_BUILDING] = "building",
    [SB_POOLED] = "pooled",
    [SB_READY] = "ready",
    [SB_LEASING] = "leasing",
    [SB_LENT] = "lent",
    [SB_RECYCLING] = "recycling",
    [SB_RESTARTING] = "restarting",
    [SB_STOPPED] = "stopped",
    [SB_STOPPING] = "stopping",
    [SB_GONE] = "gone",
};

#define E(s) (1u << (s))
/* edges[from]: the states a sandbox may go to from @from, with the event that takes it. */
static const unsigned edges[SB_N_STATES] = {
    [SB_NEW] = E(SB_BUILDING)    /* conch_daemon_pool_fill: its warden spawned in the background */
               | E(SB_READY)     /* sandbox.create: its warden set up */
               | E(SB_STOPPED)   /* recovered from the state database */
               | E(SB_STOPPING)  /* creation failed (the directory goes) */
               | E(SB_GONE),     /* conch_daemon_pool_fill: the spawn failed */
    [SB_BUILDING] = E(SB_POOLED) /* the warden's setup answered */
                    | E(SB_STOPPING), /* setup failed; shutdown */
    [SB_POOLED] = E(SB_READY)         /* exec.run fresh or sandbox.fork took it (pool_take) */
                  | E(SB_LEASING)     /* sandbox.lease sent the attach */
                  | E(SB_STOPPING),   /* its warden died; shutdown */
    [SB_READY] = E(SB_RECYCLING)      /* its fresh command answered: recycle sent */
                 | E(SB_RESTARTING)   /* workspace.discard */
                 | E(SB_STOPPED)      /* its warden died (a named sandbox) */
                 | E(SB_STOPPING),    /* destroy, idle, fresh done, warden died (fresh); shutdown */
    [SB_LEASING] = E(SB_LENT)         /* attached: the answer and channel sent */
                   | E(SB_STOPPING),  /* attach failed, answer not sent; shutdown */
    [SB_LENT] = E(SB_RECYCLING)       /* sandbox.release: recycle sent */
                | E(SB_STOPPING),     /* the borrower went away, not recyclable; shutdown */
    [SB_RECYCLING] = E(SB_POOLED)     /* the warden made it as new */
                     | E(SB_STOPPING), /* that failed; shutdown */
    [SB_RESTARTING] = E(SB_READY)      /* its warden started again */
                      | E(SB_STOPPED), /* that failed */
    [SB_STOPPED] = E(SB_READY)         /* sandbox.start: its warden started again */
                   | E(SB_STOPPING),   /* destroy, idle; shutdown */
    [SB_STOPPING] = E(SB_GONE),        /* out of the registry at once */
    [SB_GONE] = 0,
};
#undef E

bool conch_sb_edge_ok(enum sandbox_state from, enum sandbox_state to)
{
    if ((unsigned)from >= SB_N_STATES || (unsigned)to >= SB_N_STATES)
        return false;
    return edges[from] & (1u << to);
}

const char *conch_sb_state_name(enum sandbox_state s)
{
    return (unsigned)s < SB_N_STATES ? state_names[s] : "?";
}

/* States in which the sandbox has a warden and the handles that watch it. */
static bool warden_state(enum sandbox_state s)
{
    return s == SB_BUILDING || s == SB_POOLED || s == SB_READY || s == SB_LEASING || s == SB_LENT ||
           s == SB_RECYCLING;
}

/* ---- the warden's control socket ---- */

static void on_ctl_readable(uv_poll_t *h, int status, int events);

static void on_handle_closed(uv_handle_t *h)
{
    free(h);
}

/* The warden's control socket is watched for writability only while sends wait for room
 * (conch_super_wants_write): a socket with room is always writable. Not at all while lent:
 * the borrower's commands and events go over its own channel, and nothing of ours is sent. */
static void ctl_poll_update(struct sandbox *sb)
{
    if (!sb->ctl_poll || sb->state == SB_LENT || !sb->jail)
        return;
    int events = UV_READABLE | UV_DISCONNECT;
    if (conch_super_wants_write(&sb->super))
        events |= UV_WRITABLE;
    uv_poll_start(sb->ctl_poll, events, on_ctl_readable);
}

static void on_write_wanted(struct conch_super *s)
{
    ctl_poll_update(s->data);
}

/* The warden answered the request it owed (see sandbox.answer), or it died first, or the
 * sandbox was stopped meanwhile (then it is no longer in the state that awaited it). */
static void on_answer(struct conch_super_req *q, int r, const struct conch_err *err)
{
    struct sandbox *sb = q->data;
    switch (sb->state) {
    case SB_LEASING:
        conch_sb_lease_answer(sb, r, err);
        break;
    case SB_BUILDING:
    case SB_RECYCLING:
        if (r < 0) {
            log_warn("pool: %s", err->msg);
            conch_daemon_sandbox_destroy(sb);
        } else {
            conch_sb_set_state(sb, SB_POOLED, NULL);
        }
        break;
    default:
        break; /* stopped meanwhile: its stop said why */
    }
}

static void on_ctl_readable(uv_poll_t *h, int status, int events)
{
    struct sandbox *sb = h->data;
    if (status < 0) {
        log_warn("sandbox %s: poll the warden's socket: %s", sb->id, uv_strerror(status));
        conch_daemon_sandbox_warden_gone(sb);
        return;
    }
    /* Queued sends first. 0: the warden is gone (every running process has been ended,
     * every pending request failed); -1: the sandbox was stopped by a callback meanwhile. */
    if (events & UV_WRITABLE) {
        int r = conch_super_flush(&sb->super);
        if (r == 0)
            conch_daemon_sandbox_warden_gone(sb);
        if (r <= 0)
            return;
        ctl_poll_update(sb);
        if (!(events & (UV_READABLE | UV_DISCONNECT)))
            return;
    }
    /* Events and answers alike: nothing here waits for the warden. */
    if (conch_super_dispatch(&sb->super) == 0)
        conch_daemon_sandbox_warden_gone(sb);
}

int conch_sb_spawn(struct sandbox *sb, bool async, struct conch_err *err)
{
    struct conch_jail_spec spec;
    conch_jail_spec_init(&spec);
    int r;
    if (geteuid() == 0 && sb->ids.base == 0 && (r = conch_jail_ids_claim(&sb->ids, err)) < 0)
        return r;
    spec.host_id_base = sb->ids.base;
    spec.workspace = sb->workspace[0] ? sb->workspace : NULL;
    spec.ws_mode = sb->mode;
    spec.ws_dev = sb->ws_dev;
    spec.ws_ino = sb->ws_ino;
    spec.rootfs = sb->rootfs[0] ? sb->rootfs : NULL;
    spec.as_root = sb->as_root;
    spec.limits = sb->limits;
    if (sb->tmp_bytes)
        spec.tmp_bytes = sb->tmp_bytes;
    spec.name = sb->id;
    spec.upper_dir = sb->upper_dir[0] ? sb->upper_dir : NULL;
    /* Its snapshots, stacked between the workspace and the upper. */
    _cleanup_free_ struct conch_jail_layer *layers = NULL;
    if (sb->layer[0] &&
        (r = conch_daemon_layer_stack(sb->d, sb->layer, &layers, &spec.n_layers, err)) < 0)
        return conch_err_wrap(err, "sandbox '%s'", sb->id);
    spec.layers = layers;
    if ((r = conch_daemon_stores_prepare(sb, err)) < 0)
        return conch_err_wrap(err, "sandbox '%s'", sb->id);
    spec.mounts = sb->mounts;
    spec.n_mounts = sb->n_mounts;
    if (sb->rules_unreadable)
        return conch_err_set(err, EINVAL,
                             "sandbox '%s': its recorded path rules could not be read (see the "
                             "daemon's log): it is not started without them",
                             sb->id);
    spec.rules = sb->rules;
    spec.n_rules = sb->n_rules;
    spec.sockets = sb->sockets;
    spec.n_sockets = sb->n_sockets;
    if ((r = conch_spec_sockets_clear(sb->sockets, sb->n_sockets, sb->d->socket_path,
                                      sb->d->state_dir, err)) < 0)
        return conch_err_wrap(err, "sandbox '%s'", sb->id);
    /* A tmpfs workspace is sized by it; an on-disk upper dir is watched (on_sample) and no
     * single file may outgrow it. */
    spec.disk_bytes = spec.file_bytes = sb->disk_bytes ? sb->disk_bytes : CONCH_SPEC_DISK_DEFAULT;
    spec.file_handler = conch_fs_worker_run;
    spec.file_server = conch_fs_worker_serve;
    spec.js_server = conch_daemon_js_worker_main;
    /* The daemon raised its open files limit; commands keep the usual one. */
    spec.nofile = sb->d->nofile_orig;
    /* The tool bridge: its socket inside, and the in-sandbox clients (tool_call, conch_tools,
     * conch-tools) when this conch has them. */
    if (!sb->bridge && (r = conch_daemon_sandbox_bridge_new(sb, err)) < 0)
        return r;
    spec.ptc_socket = true;
    _cleanup_free_ char *ptc_dir = NULL;
    struct conch_err ptc_err = {0};
    if (conch_ptc_find_dir(&ptc_dir, &ptc_err) < 0 && !sb->d->ptc_warned) {
        sb->d->ptc_warned = true;
        log_warn("tool bridge: %s; commands get no tool_call", ptc_err.msg);
    }
    spec.ptc_dir = ptc_dir;
    spec.net = sb->net.mode;
    spec.attachable = async; /* the pool's: `conch run` may take it with its workspace (lease) */
    /* The pool builds its sandboxes in the background: the warden's setup (mounts) runs
     * while the loop serves requests, and the outcome arrives on the control socket. */
    r = async ? conch_jail_spawn(&spec, &sb->jail, err) : conch_jail_start(&spec, &sb->jail, err);
    if (r < 0)
        return r;
    conch_super_init(&sb->super, sb->jail);
    sb->super.write_wanted = on_write_wanted;
    sb->super.data = sb;
    sb->answer.done = on_answer;
    sb->answer.data = sb;
    if (async) /* the setup's outcome, when it comes */
        conch_super_await_setup(&sb->super, &sb->answer);
    /* A handle of its own per warden: the previous one may still be closing (restart). */
    sb->ctl_poll = calloc(1, sizeof(*sb->ctl_poll));
    if (!sb->ctl_poll) {
        conch_jail_destroy(sb->jail);
        sb->jail = NULL;
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    if ((r = uv_poll_init(&sb->d->loop, sb->ctl_poll, conch_jail_ctl_fd(sb->jail))) < 0) {
        free(sb->ctl_poll);
        sb->ctl_poll = NULL;
        conch_jail_destroy(sb->jail);
        sb->jail = NULL;
        return conch_err_set(err, -r, "poll the warden's socket: %s", uv_strerror(r));
    }
    sb->ctl_poll->data = sb;
    /* Pool sandboxes spill to the shared directory (see conch_daemon_sandbox_spill_dir): nothing to
     * measure there unless a limit has to be sampled. */
    if (sb->upper_dir[0] || !async ||
        (!conch_jail_has_cgroup(sb->jail) && (sb->limits.memory_bytes || sb->limits.pids_max)))
        conch_sb_sample_start(sb);
    conch_sb_set_state(sb, async ? SB_BUILDING : SB_READY, NULL);
    return 0;
}

int conch_daemon_sandbox_start(struct sandbox *sb, struct conch_err *err)
{
    int r = conch_sb_spawn(sb, false, err);
    if (r < 0 && sb->state == SB_RESTARTING)
        conch_sb_set_state(sb, SB_STOPPED, err->msg);
    return r;
}

void conch_daemon_sandbox_stop(struct sandbox *sb, const char *why)
{
    conch_sb_set_state(sb, SB_RESTARTING, why);
}

void conch_daemon_sandbox_warden_gone(struct sandbox *sb)
{
    log_warn("sandbox %s: its warden died", sb->id);
    if (sb->state == SB_READY && !sb->fresh)
        conch_sb_set_state(sb, SB_STOPPED, "the sandbox's warden died");
    else
        conch_sb_destroy_why(sb, "the sandbox's warden died");
}

/* ---- teardown off the loop: the warden's end and the directory's removal ---- */

struct teardown {
    uv_work_t req;
    struct sandbox *sb;         /* held until the warden is gone; NULL for a directory removal */
    struct conch_jail *jail;    /* owned; NULL for a directory removal only */
    char parent[PATH_MAX + 16]; /* the state dir; "" for no directory to remove */
    char name[64];
    char what[PATH_MAX + 80];
    void (*gone)(void *arg); /* called on the loop once done */
    void *gone_arg;
};

static void teardown_work(uv_work_t *req)
{
    struct teardown *t = req->data;
    /* Waiting for the kernel to take the namespaces down (cgroup, sync_destroy) and
     * unmounting the staging dirs take milliseconds to seconds: never on the loop. */
    conch_jail_destroy(t->jail);
    if (t->parent[0]) {
        /* Beneath the state dir, never through a link. */
        struct conch_err err = {0};
        _cleanup_close_ int pfd =
            conch_statedir_open(t->parent, "sandboxes", O_RDONLY | O_DIRECTORY, &err);
        if (pfd < 0 || conch_recover_rm_tree(pfd, t->name, t->what, &err) < 0)
            log_warn("sandbox %s: %s (conch gc will retry)", t->name, err.msg);
    }
}

static void teardown_done(uv_work_t *req, int status)
{
    struct teardown *t = req->data;
    (void)status;
    if (t->sb)
        conch_daemon_sandbox_release(t->sb);
    if (t->gone)
        t->gone(t->gone_arg);
    free(t);
}

/* Run @t in a worker; synchronously if that cannot be had. Takes @t over. */
static void teardown_queue(struct daemon *d, struct teardown *t)
{
    t->req.data = t;
    if (uv_queue_work(&d->loop, &t->req, teardown_work, teardown_done) < 0) {
        teardown_work(&t->req);
        teardown_done(&t->req, 0);
    }
}

/* Remove the sandbox's directory (upper dir, work dir, spill files), off the loop; then
 * call sb->gone. */
static void remove_sandbox_dir(struct sandbox *sb)
{
    struct teardown *t = calloc(1, sizeof(*t));
    if (!t || (!sb->upper_dir[0] && !sb->spill_dir[0])) {
        free(t);
        if (sb->gone)
            sb->gone(sb->gone_arg);
        return;
    }
    t->gone = sb->gone;
    t->gone_arg = sb->gone_arg;
    snprintf(t->parent, sizeof(t->parent), "%s", sb->d->state_dir);
    snprintf(t->name, sizeof(t->name), "%s", sb->id);
    snprintf(t->what, sizeof(t->what), "%s/sandboxes/%s", sb->d->state_dir, sb->id);
    sb->upper_dir[0] = sb->spill_dir[0] = '\0';
    teardown_queue(sb->d, t);
}

/* End the warden of @sb in a worker (the sandbox held until it is gone). */
static void warden_teardown(struct sandbox *sb)
{
    struct teardown *t = calloc(1, sizeof(*t));
    if (t) {
        t->jail = sb->jail;
        t->sb = sb;
        conch_daemon_sandbox_hold(sb);
        teardown_queue(sb->d, t);
    } else {
        conch_jail_destroy(sb->jail);
    }
    sb->jail = NULL; /* the teardown's now */
}

static void on_idle_closed(uv_handle_t *h)
{
    struct sandbox *sb = h->data;
    conch_daemon_net_free(sb); /* its log's charge goes */
    /* Every holder of a charge held the sandbox, or let go of it when it went (the bridge):
     * what is left is a slip, which must not stay charged to the daemon's budget. */
    uint64_t left = conch_budget_held(&sb->held);
    if (left) {
        log_error("sandbox %s: %llu bytes still charged to its budget at its end (a bug in the "
                  "daemon)",
                  sb->id, (unsigned long long)left);
        conch_budget_uncharge(sb->held.parent, left);
    }
    json_decref(sb->env);
    conch_daemon_stores_free(sb);
    free(sb->mounts);
    free(sb->rules);
    free(sb->sockets);
    free(sb);
}

/* The last hold of a GONE sandbox went. */
static void free_now(struct sandbox *sb)
{
    /* At shutdown the loop closes every handle itself, this one included; the sandbox is
     * then left to the process's exit. */
    if (uv_is_closing((uv_handle_t *)&sb->idle))
        return;
    /* A sandbox that never had a directory (the pool's) just calls sb->gone. */
    if (!sb->keep_dir)
        remove_sandbox_dir(sb);
    else if (sb->gone)
        sb->gone(sb->gone_arg);
    uv_timer_stop(&sb->idle);
    conch_jail_ids_release(&sb->ids); /* its warden is gone */
    uv_close((uv_handle_t *)&sb->idle, on_idle_closed);
}

void conch_daemon_sandbox_hold(struct sandbox *sb)
{
    sb->holds++;
    sb->d->holds++;
}

void conch_daemon_sandbox_release(struct sandbox *sb)
{
    sb->d->holds--;
    if (--sb->holds == 0 && sb->state == SB_GONE)
        free_now(sb);
}

/* ---- the transition ---- */

/* Fail what runs in @sb (@why) and close the handles that watch its warden; the warden
 * itself is left to the caller. */
static void stop_handles(struct sandbox *sb, const char *why)
{
    struct conch_list *pos, *tmp;
    /* Every command still running gets its final event now (lost, @why). */
    if (sb->jail)
        conch_super_done(&sb->super, why);
    if (sb->bridge)
        conch_bridge_listen(sb->bridge, -1, NULL);
    conch_daemon_net_stop(sb);
    conch_list_for_each_safe(pos, tmp, &sb->files)
        conch_daemon_file_req_abort(conch_list_entry(pos, struct file_req, link));
    conch_daemon_file_pool_stop(sb);
    conch_daemon_js_stop(sb);
    if (sb->ctl_poll) {
        uv_poll_stop(sb->ctl_poll);
        uv_close((uv_handle_t *)sb->ctl_poll, on_handle_closed);
        sb->ctl_poll = NULL;
    }
    if (sb->sample) {
        uv_timer_stop(sb->sample);
        uv_close((uv_handle_t *)sb->sample, on_handle_closed);
        sb->sample = NULL;
    }
}

static void on_pool_timer(uv_timer_t *t)
{
    conch_daemon_pool_fill(t->data);
}

/* Made as new for the pool: a new identity, so that whoever learnt the old id finds nothing
 * under it, and nothing of its last use counted. */
static void renew(struct sandbox *sb)
{
    conch_daemon_make_id(sb->d, "sb", sb->id, sizeof(sb->id));
    conch_daemon_sandbox_budget_label(sb);
    sb->fresh = sb->from_pool = false;
    sb->commands = 0;
    sb->disk_over = sb->measure_wanted = false;
    sb->disk_charged = 0;
    sb->created_at = sb->last_used_at = conch_daemon_now();
}

/* Out of the registry; its commands' records go; freed once no worker holds it. */
static void unlink_sandbox(struct sandbox *sb)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->runs)
        conch_daemon_run_forget(conch_list_entry(pos, struct run, link));
    conch_list_for_each_safe(pos, tmp, &sb->done_jobs)
        conch_daemon_run_forget(conch_list_entry(pos, struct run, link));
    conch_bridge_free(sb->bridge);
    sb->bridge = NULL;
    conch_daemon_sessions_sandbox_gone(sb);
    conch_list_del(&sb->link);
    sb->d->n_sandboxes--;
    if (sb->holds == 0)
        free_now(sb);
}

void conch_sb_set_state(struct sandbox *sb, enum sandbox_state to, const char *why)
{
    struct daemon *d = sb->d;
    enum sandbox_state from = sb->state;
    if (!conch_sb_edge_ok(from, to)) {
        log_error("sandbox %s: illegal lifecycle edge %s -> %s (a bug in the daemon)", sb->id,
                  conch_sb_state_name(from), conch_sb_state_name(to));
#ifdef CONCH_ABORT_ON_BUG
        abort();
#endif
    }
    log_debug("sandbox %s: %s -> %s", sb->id, conch_sb_state_name(from), conch_sb_state_name(to));
    bool was_pool = sandbox_in_pool(sb);
    sb->state = to;
    if (was_pool && !sandbox_in_pool(sb))
        d->n_pooled--;
    else if (!was_pool && sandbox_in_pool(sb))
        d->n_pooled++;
    /* A built pool sandbox that goes without being taken (its warden died or was killed,
     * its recycle failed) is replaced: nothing else would (a taken one is refilled by whoever
     * took it, a `fresh` one once its command is answered). Not one whose build failed:
     * building again at once would fail again, at once, for ever. */
    if ((from == SB_POOLED || from == SB_RECYCLING) && (to == SB_STOPPING || to == SB_GONE) &&
        !d->stopping)
        conch_daemon_pool_fill_soon(d);

    /* Leaving a lease that did not succeed fails its call; leaving it at all lets go of the
     * borrower's sink. */
    if (from == SB_LEASING && to != SB_LENT && sb->lease_call) {
        conch_rpc_call_failf(sb->lease_call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "lease: %s", why ? why : "the sandbox went");
        sb->lease_call = NULL;
    }
    if ((from == SB_LEASING && to != SB_LENT) || from == SB_LENT) {
        conch_rpc_sink_unref(sb->lease_sink);
        sb->lease_sink = NULL;
    }

    switch (to) {
    case SB_NEW:
    case SB_N_STATES:
        break;
    case SB_BUILDING:
        ctl_poll_update(sb); /* the setup's answer */
        break;
    case SB_READY:
        if (from != SB_POOLED) { /* a warden just set up */
            ctl_poll_update(sb);
            conch_daemon_sandbox_bridge_listen(sb);
            conch_daemon_net_listen(sb);
        }
        break;
    case SB_POOLED:
        if (from == SB_BUILDING)
            conch_daemon_sandbox_bridge_listen(sb);
        else if (sb->bridge) /* made as new: it listens already; lent, it refused */
            conch_bridge_refuse(sb->bridge, false);
        break;
    case SB_LEASING:
        /* Its command gets no tool bridge, as in a sandbox of conch run's own: the bridge
         * would make us read the control socket that is the borrower's (bridge_resolve). */
        if (sb->bridge)
            conch_bridge_refuse(sb->bridge, true);
        break;
    case SB_LENT:
        /* The borrower's commands report on its own channel; ours stays quiet until then. */
        uv_poll_stop(sb->ctl_poll);
        break;
    case SB_RECYCLING:
        renew(sb);
        ctl_poll_update(sb); /* the recycle's answer (lent, the poll was off) */
        break;
    case SB_RESTARTING:
    case SB_STOPPED:
        if (warden_state(from)) {
            stop_handles(sb, why);
            conch_jail_destroy(sb->jail);
            sb->jail = NULL;
        }
        if (to == SB_STOPPED && sb->recorded) {
            if (from == SB_NEW)
                conch_state_sandbox_set_state(d->state, sb->id, "stopped", NULL);
            else
                conch_state_sandbox_mark_stopped(d->state, sb->id, conch_daemon_now(), NULL);
        }
        break;
    case SB_STOPPING:
        uv_timer_stop(&sb->idle);
        /* A `fresh` sandbox came from the pool: refill it now that the command was answered,
         * not while the command runs (measured: refilling during the command delays its
         * answer more than it saves). */
        if (sb->fresh && !d->stopping)
            uv_timer_start(&d->pool_timer, on_pool_timer, 0, 0);
        conch_daemon_ws_ops_cancel(sb, why);
        stop_handles(sb, why);
        /* The warden's end (and a cgroup's removal, which waits for it) in a worker; the
         * directory is removed once that and any workspace request in flight are done. */
        if (sb->jail)
            warden_teardown(sb);
        /* Jobs go with their sandbox (ON DELETE CASCADE); a kept one is listed stopped. */
        if (sb->recorded && sb->keep_dir)
            conch_state_sandbox_mark_stopped(d->state, sb->id, conch_daemon_now(), NULL);
        else if (sb->recorded)
            conch_state_sandbox_delete(d->state, sb->id, NULL);
        break;
    case SB_GONE:
        unlink_sandbox(sb);
        break;
    }
}
