/* forkpool.c - sandbox.fork served by a pool sandbox (issue 18; docs/ARCHITECTURE.md "A fork
 * from the pool"): a fork whose spec is the pool's takes a POOLED sandbox, gives it its own
 * upper dir on disk and attaches the snapshot's stack at its /workspace in one message to
 * its warden, then turns it into an ordinary listed, recorded sandbox. A fork that does not
 * fit, or any failure on the way, is built as before (snapshots.c fork_from). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/statedir.h"
#include "spec/spec.h"

/* The warden answers the attach in a few hundred microseconds; past this it is stuck. */
#define FORK_ATTACH_TIMEOUT_MS 5000

static bool json_none(json_t *v)
{
    return !v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0);
}

/* Whether a sandbox of @s is what a pool sandbox's warden was built as (conch_daemon_pool_fill:
 * no rootfs, limits, sizes, mounts, path rules, sockets, network; the agent's ids). Its env
 * and idle timeout are the daemon's alone (given to each command, timed here): any fits. A
 * tenant's fork is built: conch_daemon_sandbox_create checks its quotas and records it as
 * the tenant's, and the pool is the owner's (tenants.c). */
static bool fits(const struct sandbox_spec *s)
{
    return s->workspace && s->layer && s->layer[0] && s->mode == CONCH_WS_OVERLAY && !s->rootfs &&
           !s->as_root && !s->limits.memory_bytes && !s->limits.pids_max &&
           !s->limits.cpu_millicpus && (!s->tmp_bytes || s->tmp_bytes == CONCH_SPEC_TMP_DEFAULT) &&
           (!s->disk_bytes || s->disk_bytes == CONCH_SPEC_DISK_DEFAULT) && !s->tool_timeout &&
           !s->max_tool_calls && json_none(s->mounts) && json_none(s->readonly) &&
           json_none(s->hidden) && json_none(s->sockets) && s->net.mode == CONCH_NET_NONE &&
           !s->net.n_allow && !s->net.n_deny && (!s->tenant || !s->tenant[0]);
}

/* @id of the block @from moved onto the block @to (as root, a layer's files belong to the
 * block of the sandbox that wrote them); one outside @from is @dflt's in @to. */
static uint32_t shift_id(uint32_t id, uint32_t from, uint32_t to, uint32_t dflt)
{
    if (from && id >= from && id - from < CONCH_HOST_ID_COUNT)
        return id - from + to;
    return to + dflt;
}

/* <state>/sandboxes/<id>/{upper,work} for @sb, as its warden makes them at a build: the dir
 * owned by the sandbox's root (as host root), upper/ with the owner and mode of @top's root
 * (so a chmod of /workspace before the snapshot is kept), work/ empty. Returns the dir's fd
 * or -errno with @err; sb->upper_dir is set once the dir exists (it goes with the sandbox). */
static int make_upper(struct sandbox *sb, const struct conch_jail_layer *top, struct conch_err *err)
{
    struct daemon *d = sb->d;
    char path[sizeof(sb->upper_dir)];
    int n = snprintf(path, sizeof(path), "%s/sandboxes/%s", d->state_dir, sb->id);
    if (n < 0 || (size_t)n >= sizeof(path))
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    _cleanup_close_ int pfd =
        conch_statedir_open(d->state_dir, "sandboxes", O_RDONLY | O_DIRECTORY, err);
    if (pfd < 0)
        return pfd;
    if (mkdirat(pfd, sb->id, 0700) < 0)
        return conch_err_set(err, errno, "mkdir '%s': %s", path, strerror(errno));
    memcpy(sb->upper_dir, path, (size_t)n + 1);
    _cleanup_close_ int dir = openat(pfd, sb->id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dir < 0 || fstatat(AT_FDCWD, top->dir, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return conch_err_set(err, errno, "fork: the sandbox's dir or its snapshot: %s",
                             strerror(errno));
    uint32_t base = sb->ids.base;
    bool root = geteuid() == 0;
    if (mkdirat(dir, "upper", 0700) < 0 || mkdirat(dir, "work", 0700) < 0 ||
        (root && (fchown(dir, base, base) < 0 ||
                  fchownat(dir, "work", base, base, AT_SYMLINK_NOFOLLOW) < 0 ||
                  fchownat(dir, "upper", shift_id(st.st_uid, top->id_base, base, CONCH_AGENT_UID),
                           shift_id(st.st_gid, top->id_base, base, CONCH_AGENT_GID),
                           AT_SYMLINK_NOFOLLOW) < 0)) ||
        fchmodat(dir, "upper", st.st_mode & 07777, 0) < 0)
        return conch_err_set(err, errno, "make the sandbox's upper dir in '%s': %s", path,
                             strerror(errno));
    return TAKE_FD(dir);
}

struct attach_wait {
    struct conch_super_req q;
    int r;
    struct conch_err err;
};

static void attach_done(struct conch_super_req *q, int r, const struct conch_err *err)
{
    struct attach_wait *w = q->data;
    w->r = r;
    if (r < 0 && err)
        w->err = *err;
}

/* Make the pool sandbox @sb the fork @s: its bookkeeping, its upper dir, the stack attached
 * and awaited. Returns 0, or -errno with @err (@sb is then to be destroyed). */
static int become_fork(struct sandbox *sb, const struct sandbox_spec *s, const struct stat *ws,
                       struct conch_err *err)
{
    struct daemon *d = sb->d;
    snprintf(sb->name, sizeof(sb->name), "%s", s->name ? s->name : "");
    snprintf(sb->workspace, sizeof(sb->workspace), "%s", s->workspace);
    snprintf(sb->layer, sizeof(sb->layer), "%s", s->layer);
    sb->ws_dev = ws->st_dev;
    sb->ws_ino = ws->st_ino;
    sb->mode = CONCH_WS_OVERLAY;
    sb->disk_bytes = CONCH_SPEC_DISK_DEFAULT;
    json_decref(sb->env);
    sb->env = s->env ? json_deep_copy(s->env) : json_object();
    sb->idle_timeout = s->idle_timeout >= 0 ? s->idle_timeout : d->opts.idle_timeout;
    sb->created_at = sb->last_used_at = conch_daemon_now();
    sb->pool_fork = true;
    _cleanup_free_ struct conch_jail_layer *layers = NULL;
    struct conch_jail_restack rs = {.workspace = sb->workspace, .upper_dir = sb->upper_dir};
    int r = conch_daemon_layer_stack(d, sb->layer, &layers, &rs.n_layers, err);
    if (r < 0)
        return r;
    if (rs.n_layers < 1)
        return conch_err_set(err, ENOENT, "snapshot '%s' has no layer", sb->layer);
    rs.layers = layers;
    _cleanup_close_ int dir = make_upper(sb, &layers[0], err);
    if (dir < 0)
        return dir;
    rs.upper_dir_fd = dir;
    struct attach_wait w = {.q = {.done = attach_done}};
    w.q.data = &w;
    if ((r = conch_super_attach_stack(&sb->super, &w.q, &rs, sb->ws_dev, sb->ws_ino, err)) < 0)
        return r;
    /* Nothing else is sent to the warden meanwhile; the loop waits (as a snapshot's restack). */
    if (!conch_super_await(&sb->super, &w.q, FORK_ATTACH_TIMEOUT_MS))
        return conch_err_set(err, ETIMEDOUT, "its warden did not answer in %d ms",
                             FORK_ATTACH_TIMEOUT_MS);
    if (w.r < 0) {
        *err = w.err;
        return w.r;
    }
    return conch_daemon_sandbox_record(sb, err);
}

int conch_daemon_fork_pooled(struct daemon *d, const struct sandbox_spec *s, struct sandbox **ret)
{
    struct stat ws;
    struct conch_err err = {0};
    if (d->stopping || !fits(s) || stat(s->workspace, &ws) < 0 || !S_ISDIR(ws.st_mode) ||
        conch_daemon_workspace_clear(d, s->workspace, &err) < 0)
        return 0; /* the build says why */
    /* Only a sandbox that has run nothing since it was built or made as new (POOLED): a
     * recycled one kept nothing a command could write (conch_daemon_sandbox_retire). */
    struct sandbox *sb = conch_daemon_pool_take(d);
    if (!sb)
        return 0;
    if (become_fork(sb, s, &ws, &err) < 0) {
        log_warn("fork: from the pool sandbox %s: %s (building one instead)", sb->id, err.msg);
        conch_sb_destroy_why(sb, "the fork could not use it");
        conch_daemon_pool_fill_soon(d);
        return 0;
    }
    log_debug("fork: sandbox %s from the pool, on snapshot %s", sb->id, sb->layer);
    conch_daemon_sandbox_touch(sb);
    if (!sb->sample)
        conch_sb_sample_start(sb); /* its upper dir's size, as a built sandbox's */
    conch_daemon_pool_fill_soon(d);
    *ret = sb;
    return 1;
}
