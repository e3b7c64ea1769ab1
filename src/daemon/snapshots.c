/* snapshots.c - snapshots, restore and fork of a sandbox's workspace (issue 18): the upper
 * dir frozen into a read-only layer of the layer store (<state>/layers, workspace/layers.c)
 * by a rename while the warden is stopped, the sandbox started again on it with a new empty
 * upper; restore drops the upper and stacks the sandbox on another snapshot; fork makes a new
 * sandbox on the same frozen layers. The metadata is in the state database (state.c). */
#include <ctype.h>
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
#include "daemon/sessions.h"

/* The snapshot errors' data codes (docs/PROTOCOL.md). */
#define E_BUSY EBUSY       /* "busy": commands, jobs or sessions would be ended */
#define E_NOT_FOUND ENOENT /* "snapshot_not_found" */
#define E_IN_USE ENOTEMPTY /* "snapshot_in_use": others build on it */

void conch_daemon_snapshot_fail(struct conch_rpc_call *call, const struct conch_err *err)
{
    if (err->code == E_BUSY)
        conch_rpc_call_fail_err(call, CONCH_RPC_BUSY, "busy", err);
    else if (err->code == E_NOT_FOUND && err->kind == CONCH_ERR_USAGE)
        conch_rpc_call_fail_err(call, CONCH_RPC_SNAPSHOT_NOT_FOUND, "snapshot_not_found", err);
    else if (err->code == E_IN_USE)
        conch_rpc_call_fail_err(call, CONCH_RPC_SNAPSHOT_IN_USE, "snapshot_in_use", err);
    else if (err->kind == CONCH_ERR_LIMIT)
        conch_rpc_call_fail_err(call, CONCH_RPC_LIMIT, "limit", err);
    else
        conch_rpc_call_fail_err(call, 0, NULL, err);
}

/* ---- the records ---- */

struct layers {
    struct conch_state_layer *list;
    size_t n;
};

static void layers_done(struct layers *ls)
{
    conch_state_layer_free_list(ls->list, ls->n);
    ls->list = NULL;
    ls->n = 0;
}

static int layers_load(struct daemon *d, struct layers *ls, struct conch_err *err)
{
    ls->list = NULL;
    ls->n = 0;
    return conch_state_layer_list(d->state, &ls->list, &ls->n, err);
}

/* The layer named @key (its id, else its name), or NULL. */
static struct conch_state_layer *layer_find(struct layers *ls, const char *id)
{
    for (size_t i = 0; i < ls->n; i++)
        if (!strcmp(ls->list[i].id, id))
            return &ls->list[i];
    return NULL;
}

/* The tenant @l was taken for (its recorded spec's; "": the owner's, also when the spec is
 * unreadable, so that a tenant never sees a snapshot it cannot be shown to own). */
static void layer_tenant(const struct conch_state_layer *l, char *buf, size_t size)
{
    json_t *spec = l->spec_json ? json_loads(l->spec_json, 0, NULL) : NULL;
    const char *t = json_string_value(json_object_get(spec, "tenant"));
    snprintf(buf, size, "%s", t ? t : "");
    json_decref(spec);
}

/* Whether the viewer may see and use @l (tenants.c). */
static bool layer_visible(struct daemon *d, const struct conch_state_layer *l)
{
    char t[80];
    layer_tenant(l, t, sizeof(t));
    return conch_daemon_tenant_sees_tenant(d, t);
}

/* @key as a client names a snapshot: its id, or a name among the snapshots of @tenant (NULL:
 * those the viewer sees). Names are unique per tenant, as sandbox names are: another tenant's
 * name is no name here, and taking it tells nothing of theirs. Whether the viewer may use an
 * id's layer is the caller's check. */
static struct conch_state_layer *layer_named(struct daemon *d, struct layers *ls, const char *key,
                                             const char *tenant)
{
    struct conch_state_layer *l = layer_find(ls, key);
    char t[80];
    for (size_t i = 0; !l && key[0] && i < ls->n; i++) {
        layer_tenant(&ls->list[i], t, sizeof(t));
        if (!strcmp(ls->list[i].name, key) &&
            (tenant ? !strcmp(t, tenant) : conch_daemon_tenant_sees_tenant(d, t)))
            l = &ls->list[i];
    }
    return l;
}

static int not_found(struct conch_err *err, const char *key)
{
    return conch_err_setk(err, CONCH_ERR_USAGE, E_NOT_FOUND,
                          "no snapshot '%s' (workspace.snapshots lists them)", key);
}

/* Whether @l is one of @sb's snapshots: taken of it, or one its workspace stands on (what
 * workspace.snapshots {sandbox} lists). */
static bool layer_seen_by(struct layers *ls, const struct sandbox *sb,
                          const struct conch_state_layer *l)
{
    if (!strcmp(l->sandbox, sb->id))
        return true;
    /* The chain is at most CONCH_JAIL_MAX_LAYERS + 1 deep; the bound stops a parent loop in
     * records edited by hand. */
    const char *id = sb->layer;
    for (size_t hops = 0; id[0] && hops <= ls->n; hops++) {
        struct conch_state_layer *p = layer_find(ls, id);
        if (!p)
            return false;
        if (p == l)
            return true;
        id = p->parent;
    }
    return false;
}

/* The layer store, <state>/layers (0700, made on first use). */
static int store_open(struct daemon *d, struct conch_err *err)
{
    struct conch_err oerr = {0};
    int fd = conch_statedir_open(d->state_dir, "layers", O_RDONLY | O_DIRECTORY, &oerr);
    if (fd >= 0 || oerr.code != ENOENT) {
        if (fd < 0)
            *err = oerr;
        return fd;
    }
    _cleanup_close_ int sfd = conch_statedir_open(d->state_dir, "", O_RDONLY | O_DIRECTORY, err);
    if (sfd < 0)
        return sfd;
    if (mkdirat(sfd, "layers", 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s/layers': %s", d->state_dir, strerror(errno));
    return conch_statedir_open(d->state_dir, "layers", O_RDONLY | O_DIRECTORY, err);
}

int conch_daemon_layer_stack(struct daemon *d, const char *top,
                             struct conch_jail_layer **ret_layers, int *ret_n,
                             struct conch_err *err)
{
    struct layers ls;
    int r = layers_load(d, &ls, err);
    if (r < 0)
        return r;
    const char *ids[CONCH_JAIL_MAX_LAYERS];
    uint32_t bases[CONCH_JAIL_MAX_LAYERS];
    int n = 0;
    for (const char *id = top; id[0]; n++) {
        struct conch_state_layer *l = NULL;
        for (size_t i = 0; i < ls.n && !l; i++)
            if (!strcmp(ls.list[i].id, id))
                l = &ls.list[i];
        if (!l) {
            r = conch_err_set(err, ENOENT, "its snapshot '%s' is not recorded", id);
            goto out;
        }
        if (n >= CONCH_JAIL_MAX_LAYERS) {
            r = conch_err_set(err, ELOOP, "snapshot '%s': more than %d layers", top,
                              CONCH_JAIL_MAX_LAYERS);
            goto out;
        }
        ids[n] = l->id;
        bases[n] = l->id_base;
        id = l->parent;
    }
    size_t dlen = strlen(d->state_dir) + 8 + 64 + 1;
    struct conch_jail_layer *out = calloc(1, n * (sizeof(*out) + dlen) + 1);
    if (!out) {
        r = conch_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    char *paths = (char *)(out + n);
    for (int i = 0; i < n; i++) {
        char *p = paths + (size_t)i * dlen;
        snprintf(p, dlen, "%s/layers/%s", d->state_dir, ids[i]);
        /* Beneath the state dir, never through a link. */
        char rel[80];
        snprintf(rel, sizeof(rel), "layers/%s", ids[i]);
        int fd = conch_statedir_open(d->state_dir, rel, O_RDONLY | O_DIRECTORY, err);
        if (fd < 0) {
            free(out);
            r = conch_err_wrap(err, "snapshot '%s'", ids[i]);
            goto out;
        }
        close(fd);
        out[i].dir = p;
        out[i].id_base = bases[i];
    }
    *ret_layers = out;
    *ret_n = n;
    r = 0;
out:
    layers_done(&ls);
    return r;
}

int conch_daemon_snapshot_chain_at(struct daemon *d, const char *sb_id, const char *tenant,
                                   const char *top, const char *key, struct conch_err *err)
{
    struct layers ls;
    int r = layers_load(d, &ls, err);
    if (r < 0)
        return r;
    struct conch_state_layer *want = layer_named(d, &ls, key, tenant);
    char owner[80] = "";
    if (want)
        layer_tenant(want, owner, sizeof(owner));
    if (!want || strcmp(owner, tenant)) {
        r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                           "since: no snapshot '%s' (workspace.snapshots lists them)", key);
        goto out;
    }
    int at = 0;
    for (const char *id = top; id[0] && at <= CONCH_JAIL_MAX_LAYERS; at++) {
        if (!strcmp(id, want->id)) {
            r = at;
            goto out;
        }
        struct conch_state_layer *l = NULL;
        for (size_t i = 0; i < ls.n && !l; i++)
            if (!strcmp(ls.list[i].id, id))
                l = &ls.list[i];
        id = l ? l->parent : "";
    }
    r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                       "since: snapshot '%s' is not in the chain sandbox '%s' stands on (it is "
                       "another sandbox's, or this one was restored to an earlier snapshot; "
                       "'conch snapshots %s' lists its own)",
                       key, sb_id, sb_id);
out:
    layers_done(&ls);
    return r;
}

/* ---- what a restart would end ---- */

/* 0, or -EBUSY with @err naming what runs in @sb (commands, jobs, sessions, JS sessions):
 * a snapshot or a restore restarts the sandbox, which ends them. */
static int busy_check(struct sandbox *sb, const char *what, struct conch_err *err)
{
    if (sb->state != SB_READY)
        return 0;
    char list[400] = "";
    size_t off = 0;
    unsigned commands = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->runs)
    {
        struct run *run = conch_list_entry(pos, struct run, link);
        if (run->is_job) {
            int w =
                snprintf(list + off, sizeof(list) - off, "%sjob %s", off ? ", " : "", run->job_id);
            if (w > 0 && off + (size_t)w < sizeof(list))
                off += (size_t)w;
        } else {
            commands++;
        }
    }
    if (commands) {
        int w = snprintf(list + off, sizeof(list) - off, "%s%u command%s (exec.run)",
                         off ? ", " : "", commands, commands > 1 ? "s" : "");
        if (w > 0 && off + (size_t)w < sizeof(list))
            off += (size_t)w;
    }
    char sess[200];
    if (conch_daemon_sessions_live(sb, sess, sizeof(sess)) > 0) {
        int w = snprintf(list + off, sizeof(list) - off, "%ssession %s", off ? ", " : "", sess);
        if (w > 0 && off + (size_t)w < sizeof(list))
            off += (size_t)w;
    }
    if (!off)
        return 0;
    return conch_err_setk(err, CONCH_ERR_USAGE, E_BUSY,
                          "sandbox '%s' is busy: %s; %s restarts the sandbox and would end "
                          "them (and its JS sessions): wait for them, or pass force: true",
                          sb->id, list, what);
}

static bool overlay_ok(struct sandbox *sb, struct conch_err *err)
{
    if (sb->upper_dir[0] && sb->mode == CONCH_WS_OVERLAY && sb->workspace[0])
        return true;
    conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                   "sandbox '%s' has no overlay workspace: snapshots need a workspace in mode "
                   "overlay",
                   sb->id);
    return false;
}

/* Stop @sb's warden (and wait for its overlay to be gone) if it runs; returns whether it did. */
static bool stop_for(struct sandbox *sb, const char *why)
{
    if (sb->state != SB_READY)
        return false;
    conch_jail_set_sync_destroy(sb->jail, true);
    conch_daemon_sandbox_stop(sb, why);
    return true;
}

/* Start @sb again after stop_for; the first error is kept in @err when @r is still >= 0. */
static int start_again(struct sandbox *sb, bool was_running, int r, struct conch_err *err)
{
    if (!was_running)
        return r;
    struct conch_err serr = {0};
    if (conch_daemon_sandbox_start(sb, &serr) < 0) {
        log_warn("sandbox %s: start it again: %s", sb->id, serr.msg);
        if (r >= 0) {
            *err = serr;
            r = -(serr.code ? serr.code : EIO);
        }
    }
    return r;
}

/* ---- a snapshot without a restart (see conch_jail_send_release) ---- */

/* The warden answers each step in a few hundred microseconds; past this it is stuck. */
#define RESTACK_TIMEOUT_MS 5000

struct restack_wait {
    struct conch_super_req q;
    int r;
    struct conch_err err;
};

static void restack_done(struct conch_super_req *q, int r, const struct conch_err *err)
{
    struct restack_wait *w = q->data;
    w->r = r;
    if (r < 0 && err)
        w->err = *err;
}

/* Whether @sb can be snapshotted without a restart: running, with no path rule
 * (mounted below /workspace), and nothing running that could write through its overlay
 * meanwhile: no command, job, session, JS session or file request. Its idle persistent file
 * workers and its spare JS worker are ended (they hold the old /workspace); new ones are
 * made when needed. */
static bool restack_ok(struct sandbox *sb)
{
    /* Why not, in the log: a restart loses /tmp and what runs, so one that nothing running
     * asked for is worth knowing of. */
    const char *why = sb->state != SB_READY || !sb->jail || sb->super.gone ? "not running"
                      : sb->n_rules                                        ? "path rules"
                      : !conch_jail_can_restack(sb->jail)                  ? "its warden cannot"
                      : !conch_list_empty(&sb->runs)                       ? "a command runs"
                      : !conch_list_empty(&sb->files)                      ? "a file request runs"
                      : conch_daemon_js_count(sb) > 0                      ? "a JS session is open"
                                                                           : NULL;
    char sess[8];
    if (!why && conch_daemon_sessions_live(sb, sess, sizeof(sess)) > 0)
        why = "a session is open";
    if (why) {
        log_info("sandbox %s: restarted for a snapshot or restore: %s", sb->id, why);
        return false;
    }
    /* The new upper takes the old one's owner and mode: there must be one. */
    char rel[128];
    struct conch_err oerr = {0};
    snprintf(rel, sizeof(rel), "sandboxes/%s/upper", sb->id);
    int fd = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, &oerr);
    if (fd < 0)
        return false;
    close(fd);
    if (!conch_daemon_file_pool_retire_idle(sb)) {
        log_info("sandbox %s: restarted for a snapshot or restore: a file worker is busy", sb->id);
        return false;
    }
    conch_daemon_js_drop_spare(sb);
    return true;
}

/* Send one step (@rs NULL: the release) and wait for its answer. -ETIMEDOUT: the warden did
 * not answer and @sb was stopped (RESTARTING). */
static int restack_step(struct sandbox *sb, const struct conch_jail_restack *rs,
                        struct conch_err *err)
{
    struct restack_wait w = {.q = {.done = restack_done}};
    w.q.data = &w;
    int r = rs ? conch_super_restack(&sb->super, &w.q, rs, err)
               : conch_super_release(&sb->super, &w.q, err);
    if (r < 0)
        return r;
    if (!conch_super_await(&sb->super, &w.q, RESTACK_TIMEOUT_MS)) {
        /* The stop fails the request (conch_super_done) before @w goes out of scope. */
        conch_jail_set_sync_destroy(sb->jail, true);
        conch_daemon_sandbox_stop(sb, "the warden did not answer a snapshot");
        return conch_err_set(err, ETIMEDOUT, "the sandbox's warden did not answer in %d ms",
                             RESTACK_TIMEOUT_MS);
    }
    if (w.r < 0)
        *err = w.err;
    return w.r;
}

/* The second step: mount @sb's stack (its layers as recorded now, and its upper dir, made
 * anew with the owner and mode of @frozen's root when the freeze took it away) at its
 * /workspace. On failure @sb is left RESTARTING (to be started again) or stopped. */
static int restack_mount(struct sandbox *sb, const char *frozen, struct conch_err *err)
{
    struct daemon *d = sb->d;
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s", sb->id);
    _cleanup_close_ int dir = conch_statedir_open(d->state_dir, rel, O_RDONLY | O_DIRECTORY, err);
    int r = dir < 0 ? dir : 0;
    if (r >= 0 && mkdirat(dir, "upper", 0700) == 0) {
        struct stat st;
        _cleanup_close_ int store = frozen ? store_open(d, err) : -1;
        if (!frozen)
            r = conch_err_set(err, ENOENT, "the sandbox's upper dir is gone");
        else if (store < 0)
            r = store;
        else if (fstatat(store, frozen, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                 fchownat(dir, "upper", st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 ||
                 fchmodat(dir, "upper", st.st_mode & 07777, 0) < 0)
            r = conch_err_set(err, errno, "make the sandbox's new upper dir: %s", strerror(errno));
    } else if (r >= 0 && errno != EEXIST) {
        r = conch_err_set(err, errno, "mkdir '%s/upper': %s", rel, strerror(errno));
    }
    _cleanup_free_ struct conch_jail_layer *layers = NULL;
    struct conch_jail_restack rs = {
        .workspace = sb->workspace, .upper_dir_fd = dir, .upper_dir = sb->upper_dir};
    if (r >= 0 && sb->layer[0])
        r = conch_daemon_layer_stack(d, sb->layer, &layers, &rs.n_layers, err);
    rs.layers = layers;
    if (r >= 0)
        r = restack_step(sb, &rs, err);
    if (r < 0 && r != -ETIMEDOUT && sb->state == SB_READY) {
        conch_jail_set_sync_destroy(sb->jail, true);
        conch_daemon_sandbox_stop(sb, "a snapshot restarts the sandbox");
    }
    return r;
}

/* A tenant's workspace is a path of the daemon's (tenant-workspaces/...), shown to no one:
 * not to a tenant, as in sandbox.get (an answer from the sandbox's queue has no viewer). */
static json_t *layer_json(const struct conch_state_layer *l)
{
    char t[80];
    layer_tenant(l, t, sizeof(t));
    const char *ws = t[0] ? NULL : l->workspace;
    return json_pack("{s:s,s:s?,s:s?,s:s,s:s?,s:I,s:I,s:i,s:f}", "id", l->id, "name",
                     l->name[0] ? l->name : NULL, "parent", l->parent[0] ? l->parent : NULL,
                     "sandbox", l->sandbox, "workspace", ws, "size", (json_int_t)l->size, "files",
                     (json_int_t)l->files, "depth", l->depth, "created_at", l->created_at);
}

/* ---- snapshot ---- */

/* Freeze @sb's upper into a new layer (its warden stopped meanwhile) and stack @sb on it.
 * The new record in *@ret. */
/* A tenant's snapshots outlive its sandboxes and are no sandbox's changes. At most
 * TENANT_SNAPSHOTS_MAX of them (an empty one is a rename: thousands a second, and every
 * snapshot, fork and restore reads every layer's record on the loop); with a disk quota,
 * their sizes (each at least a block: its directory) and the changes a new one would freeze
 * (as last measured) add up to at most the quota (else snapshot after snapshot filled the
 * daemon's disk past it). */
#define TENANT_SNAPSHOTS_MAX 1000
#define SNAPSHOT_MIN_BYTES 4096ULL

static int tenant_snapshots_admit(struct sandbox *sb, struct layers *ls, struct conch_err *err)
{
    if (!sb->tenant[0])
        return 0;
    uint64_t held = 0, quota = conch_daemon_tenant_disk_quota(sb->d, sb->tenant);
    unsigned n = 0;
    char t[80];
    for (size_t i = 0; i < ls->n; i++) {
        layer_tenant(&ls->list[i], t, sizeof(t));
        if (strcmp(t, sb->tenant))
            continue;
        n++;
        held += ls->list[i].size > SNAPSHOT_MIN_BYTES ? ls->list[i].size : SNAPSHOT_MIN_BYTES;
    }
    if (n >= TENANT_SNAPSHOTS_MAX)
        return conch_err_setk(err, CONCH_ERR_LIMIT, EDQUOT,
                              "tenant '%s': %u snapshots, the most a tenant may keep: delete "
                              "some first (workspace.snapshot_delete)",
                              sb->tenant, n);
    uint64_t more = sb->disk_charged > SNAPSHOT_MIN_BYTES ? sb->disk_charged : SNAPSHOT_MIN_BYTES;
    if (!quota || held + more <= quota)
        return 0;
    return conch_err_setk(err, CONCH_ERR_LIMIT, EDQUOT,
                          "tenant '%s': quota disk=%llu bytes: its snapshots hold %llu and this "
                          "one would freeze %llu more: delete some first "
                          "(workspace.snapshot_delete)",
                          sb->tenant, (unsigned long long)quota, (unsigned long long)held,
                          (unsigned long long)more);
}

static int take(struct sandbox *sb, const char *name, bool force, struct conch_state_layer *ret,
                struct conch_err *err)
{
    struct daemon *d = sb->d;
    if (!overlay_ok(sb, err))
        return -EINVAL;
    if (sb->state != SB_READY && sb->state != SB_STOPPED)
        return conch_err_setk(err, CONCH_ERR_USAGE, E_BUSY, "sandbox '%s' is being restarted",
                              sb->id);
    int r;
    if (!force && (r = busy_check(sb, "a snapshot", err)) < 0)
        return r;
    struct layers ls;
    if ((r = layers_load(d, &ls, err)) < 0)
        return r;
    struct conch_state_layer *parent = sb->layer[0] ? layer_find(&ls, sb->layer) : NULL;
    if (name && name[0] && layer_named(d, &ls, name, sb->tenant)) {
        layers_done(&ls);
        return conch_err_setk(err, CONCH_ERR_USAGE, EEXIST,
                              "the snapshot name '%s' is taken: choose another", name);
    }
    if (sb->layer[0] && !parent) {
        layers_done(&ls);
        return conch_err_set(err, ENOENT, "sandbox '%s': its snapshot '%s' is not recorded", sb->id,
                             sb->layer);
    }
    if ((r = tenant_snapshots_admit(sb, &ls, err)) < 0) {
        layers_done(&ls);
        return r;
    }
    /* overlayfs stacks a bounded number of layers: past the bound the new layer is the whole
     * stack squashed into one (a copy of the layers, not of the workspace). Layers written
     * by other host id blocks (a fork's, as root) would need their owners shifted: refused. */
    int depth = parent ? parent->depth + 1 : 1;
    bool squash = depth > CONCH_JAIL_MAX_LAYERS;
    const char *chain[CONCH_JAIL_MAX_LAYERS + 1];
    int n_chain = 0;
    if (squash) {
        for (const char *id = sb->layer; id[0] && n_chain < CONCH_JAIL_MAX_LAYERS;) {
            struct conch_state_layer *l = layer_find(&ls, id);
            if (!l)
                break;
            if (l->id_base != sb->ids.base) {
                layers_done(&ls);
                return conch_err_setk(err, CONCH_ERR_LIMIT, ELOOP,
                                      "sandbox '%s' is stacked on %d snapshots, the most "
                                      "overlayfs is given, and some were written by another "
                                      "sandbox (a fork): restore an older snapshot first",
                                      sb->id, depth - 1);
            }
            chain[n_chain++] = l->id;
            id = l->parent;
        }
    }

    struct conch_state_layer rec;
    memset(&rec, 0, sizeof(rec));
    conch_daemon_make_id(d, "snap", rec.id, sizeof(rec.id));
    snprintf(rec.name, sizeof(rec.name), "%s", name ? name : "");
    snprintf(rec.parent, sizeof(rec.parent), "%s", squash ? "" : sb->layer);
    snprintf(rec.workspace, sizeof(rec.workspace), "%s", sb->workspace);
    snprintf(rec.sandbox, sizeof(rec.sandbox), "%s", sb->id);
    rec.id_base = sb->ids.base;
    rec.depth = squash ? 1 : depth;
    rec.created_at = conch_daemon_now();
    json_t *spec = conch_daemon_sandbox_spec_json(sb);
    rec.spec_json = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);

    _cleanup_close_ int store = store_open(d, err);
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s", sb->id);
    _cleanup_close_ int from =
        store < 0 ? -1 : conch_statedir_open(d->state_dir, rel, O_RDONLY | O_DIRECTORY, err);
    if (store < 0 || from < 0) {
        r = -(err->code ? err->code : EIO);
        goto out;
    }
    /* Without a restart when nothing runs: the warden lets go of /workspace, the upper is
     * frozen, and the new stack is mounted in its place. Else (or when the warden refuses:
     * something still holds /workspace) the sandbox is stopped meanwhile, as ever. */
    struct conch_err ferr = {0};
    bool fast = restack_ok(sb) && restack_step(sb, NULL, &ferr) >= 0;
    if (ferr.msg[0])
        log_info("sandbox %s: a snapshot with a restart: %s", sb->id, ferr.msg);
    bool was_running =
        ferr.code == ETIMEDOUT || (!fast && stop_for(sb, "a snapshot restarts the sandbox"));
    char raw[80];
    snprintf(raw, sizeof(raw), "%s-raw", rec.id);
    r = conch_ws_layer_freeze(from, "upper", store, squash ? raw : rec.id, err);
    if (r >= 0 && squash) {
        chain[n_chain] = NULL;
        const char *ids[CONCH_JAIL_MAX_LAYERS + 1];
        ids[0] = raw;
        for (int i = 0; i < n_chain; i++)
            ids[i + 1] = chain[i];
        r = conch_ws_layer_squash(store, ids, n_chain + 1, rec.id, err);
        if (r < 0) {
            /* Put the changes back where they were. */
            if (renameat(store, raw, from, "upper") < 0)
                log_warn("sandbox %s: put its changes back from '%s': %s", sb->id, raw,
                         strerror(errno));
        } else {
            conch_ws_layer_remove(store, raw, NULL);
        }
    }
    if (r >= 0) {
        struct conch_err merr = {0};
        if (conch_ws_layer_measure(store, rec.id, &rec.size, &rec.files, &merr) < 0)
            log_warn("snapshot %s: measure: %s", rec.id, merr.msg);
        if ((r = conch_state_layer_put(d->state, &rec, err)) < 0) {
            /* Unrecorded, the layer would be lost: the changes go back into the upper. */
            if (renameat(store, rec.id, from, "upper") < 0)
                log_warn("sandbox %s: put its changes back: %s", sb->id, strerror(errno));
        } else {
            snprintf(sb->layer, sizeof(sb->layer), "%s", rec.id);
            struct conch_err rerr = {0};
            if (conch_daemon_sandbox_record(sb, &rerr) < 0)
                log_warn("sandbox %s: record its snapshot: %s", sb->id, rerr.msg);
        }
    }
    if (fast) {
        /* Mounted again whatever happened: the new stack, or the old one put back. */
        struct conch_err merr = {0};
        if (restack_mount(sb, r >= 0 ? rec.id : NULL, &merr) < 0) {
            log_warn("sandbox %s: mount its workspace after the snapshot (restarting it): %s",
                     sb->id, merr.msg);
            was_running = sb->state == SB_RESTARTING;
        }
    }
    r = start_again(sb, was_running, r, err);
    if (r >= 0 && sb->state == SB_READY) {
        sb->disk_over = false;
        sb->disk_charged = 0;
        conch_daemon_sandbox_measure(sb);
    }
out:
    layers_done(&ls);
    if (r >= 0 && ret) {
        *ret = rec;
        rec.spec_json = NULL;
    }
    conch_state_layer_done(&rec);
    return r;
}

static bool param_bool(json_t *params, const char *key)
{
    return json_is_true(json_object_get(params, key));
}

json_t *conch_daemon_snapshot_take(struct sandbox *sb, json_t *params, struct conch_err *err)
{
    struct conch_state_layer rec;
    const char *name = conch_rpc_str(params, "name", NULL);
    if (take(sb, name, param_bool(params, "force"), &rec, err) < 0)
        return NULL;
    json_t *res = layer_json(&rec);
    conch_state_layer_done(&rec);
    return res;
}

/* ---- restore ---- */

json_t *conch_daemon_snapshot_restore(struct sandbox *sb, json_t *params, struct conch_err *err)
{
    struct daemon *d = sb->d;
    const char *key = conch_rpc_str(params, "snapshot", "");
    if (!overlay_ok(sb, err))
        return NULL;
    if (sb->state != SB_READY && sb->state != SB_STOPPED) {
        conch_err_setk(err, CONCH_ERR_USAGE, E_BUSY, "sandbox '%s' is being restarted", sb->id);
        return NULL;
    }
    struct layers ls;
    if (layers_load(d, &ls, err) < 0)
        return NULL;
    json_t *res = NULL;
    _cleanup_close_ int upper = -1;
    struct conch_state_layer *l = layer_named(d, &ls, key, sb->tenant);
    char owner[80] = "";
    if (l)
        layer_tenant(l, owner, sizeof(owner));
    /* Another tenant's snapshot is no snapshot to a tenant's sandbox (nor the reverse):
     * tenants' sandboxes all have no workspace, which the check below would let pass. */
    if (!l || strcmp(owner, sb->tenant)) {
        not_found(err, key);
        goto out;
    }
    if (strcmp(l->workspace, sb->workspace)) {
        conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                       "snapshot '%s' is of the workspace '%s', not of '%s' (sandbox '%s'): "
                       "fork it instead",
                       l->id, l->workspace, sb->workspace, sb->id);
        goto out;
    }
    if (!param_bool(params, "force") && busy_check(sb, "a restore", err) < 0)
        goto out;
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s/upper", sb->id);
    struct conch_err oerr = {0};
    upper = conch_statedir_open(d->state_dir, rel, O_RDONLY | O_DIRECTORY, &oerr);
    if (upper < 0 && oerr.code != ENOENT) {
        *err = oerr;
        goto out;
    }
    struct conch_err ferr = {0};
    bool fast = upper >= 0 && restack_ok(sb) && restack_step(sb, NULL, &ferr) >= 0;
    if (ferr.msg[0])
        log_info("sandbox %s: a restore with a restart: %s", sb->id, ferr.msg);
    bool was_running =
        ferr.code == ETIMEDOUT || (!fast && stop_for(sb, "a restore restarts the sandbox"));
    int r = upper >= 0 ? conch_ws_upper_clear(upper, err) : 0;
    if (r >= 0) {
        snprintf(sb->layer, sizeof(sb->layer), "%s", l->id);
        struct conch_err rerr = {0};
        if (conch_daemon_sandbox_record(sb, &rerr) < 0)
            log_warn("sandbox %s: record its snapshot: %s", sb->id, rerr.msg);
    }
    if (fast) {
        struct conch_err merr = {0};
        if (restack_mount(sb, NULL, &merr) < 0) {
            log_warn("sandbox %s: mount its workspace after the restore (restarting it): %s",
                     sb->id, merr.msg);
            was_running = sb->state == SB_RESTARTING;
        }
    }
    r = start_again(sb, was_running, r, err);
    if (r >= 0) {
        sb->disk_over = false;
        sb->disk_charged = 0;
        conch_daemon_sandbox_measure(sb);
        res = json_pack("{s:s,s:s}", "sandbox", sb->id, "snapshot", l->id);
    }
out:
    layers_done(&ls);
    return res;
}

/* ---- fork ---- */

/* A new sandbox like the one @spec_json recorded, on the workspace @workspace stacked on
 * @layer, named @name: a pool sandbox made it when the spec is the pool's (forkpool.c),
 * else built. */
static json_t *fork_from(struct daemon *d, const char *spec_json, const char *workspace,
                         const char *layer, const char *name, struct conch_err *err)
{
    json_t *spec = spec_json ? json_loads(spec_json, 0, NULL) : NULL;
    struct sandbox_spec s;
    memset(&s, 0, sizeof(s));
    s.workspace = workspace;
    s.mode = CONCH_WS_OVERLAY;
    s.rootfs = json_string_value(json_object_get(spec, "rootfs"));
    s.as_root = json_is_true(json_object_get(spec, "as_root"));
    s.limits.memory_bytes = (uint64_t)json_integer_value(json_object_get(spec, "memory"));
    s.limits.pids_max = (uint64_t)json_integer_value(json_object_get(spec, "pids"));
    s.limits.cpu_millicpus = (uint64_t)json_integer_value(json_object_get(spec, "cpu_milli"));
    s.tmp_bytes = (uint64_t)json_integer_value(json_object_get(spec, "tmp_size"));
    s.disk_bytes = (uint64_t)json_integer_value(json_object_get(spec, "disk"));
    json_t *env = json_object_get(spec, "env");
    s.env = json_is_object(env) ? env : NULL;
    s.idle_timeout = json_is_number(json_object_get(spec, "idle_timeout"))
                         ? json_number_value(json_object_get(spec, "idle_timeout"))
                         : -1;
    s.name = name && name[0] ? name : NULL;
    s.layer = layer;
    s.mounts = json_object_get(spec, "mounts");
    s.readonly = json_object_get(spec, "readonly");
    s.hidden = json_object_get(spec, "hidden");
    s.sockets = json_object_get(spec, "sockets");
    /* A fork is its source's tenant's (tenants.c). */
    const char *tenant = json_string_value(json_object_get(spec, "tenant"));
    s.tenant = tenant ? tenant : spec ? "" : NULL;
    /* The network too: a fork is the sandbox it comes from, allowlist and all. */
    conch_daemon_net_from_record(name && name[0] ? name : "(fork)", spec, &s.net);
    struct sandbox *sb = NULL;
    int r = conch_daemon_fork_pooled(d, &s, &sb) ? 0 : conch_daemon_sandbox_create(d, &s, &sb, err);
    conch_net_policy_done(&s.net);
    json_decref(spec);
    if (r < 0)
        return NULL;
    json_t *res = conch_daemon_sandbox_json(sb);
    return res;
}

json_t *conch_daemon_snapshot_fork(struct sandbox *sb, json_t *params, struct conch_err *err)
{
    struct conch_state_layer rec;
    if (take(sb, NULL, param_bool(params, "force"), &rec, err) < 0) {
        conch_err_wrap(err, "fork: snapshot sandbox '%s'", sb->id);
        return NULL;
    }
    json_t *res = fork_from(sb->d, rec.spec_json, rec.workspace, rec.id,
                            conch_rpc_str(params, "name", NULL), err);
    conch_state_layer_done(&rec);
    return res;
}

static bool name_taken(struct daemon *d, const char *name)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (conch_daemon_sandbox_find(d, sb->id) == sb && !strcmp(sb->name, name))
            return true;
    }
    return false;
}

void conch_daemon_handle_sandbox_fork(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *sbid = conch_rpc_str(params, "sandbox", NULL);
    const char *snap = conch_rpc_str(params, "snapshot", NULL);
    const char *name = conch_rpc_str(params, "name", NULL);
    if (!sbid && !snap) {
        conch_rpc_call_fail_param(call, "sandbox", "give a sandbox or a snapshot to fork");
        return;
    }
    if (name && name_taken(c->d, name)) {
        conch_rpc_call_fail_param(
            call, "name", "the name '%s' is taken by another sandbox: choose another", name);
        return;
    }
    if (sbid && !snap) {
        conch_daemon_workspace_queue(call, params, ctx, WS_Q_FORK);
        return;
    }
    /* Both: a snapshot of that sandbox's (conch mcp's fork tool: its agent may not reach
     * another sandbox's snapshots, with their own workspace, rules and sockets). */
    struct sandbox *of = NULL;
    if (sbid && !(of = conch_daemon_sandbox_find_or_fail(c->d, call, params, "sandbox")))
        return;
    struct conch_err err = {0};
    struct layers ls;
    if (layers_load(c->d, &ls, &err) < 0) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    struct conch_state_layer *l = layer_named(c->d, &ls, snap, NULL);
    json_t *res = NULL;
    if (!l || !layer_visible(c->d, l)) {
        not_found(&err, snap);
    } else if (of && !layer_seen_by(&ls, of, l)) {
        conch_rpc_call_fail_param(
            call, "snapshot",
            "snapshot '%s' is not one of sandbox '%s' (taken of it or one its "
            "workspace stands on: workspace.snapshots {\"sandbox\"} lists them)",
            snap, of->id);
        layers_done(&ls);
        return;
    } else {
        res = fork_from(c->d, l->spec_json, l->workspace, l->id, name, &err);
    }
    layers_done(&ls);
    if (res)
        conch_rpc_call_reply(call, res);
    else
        conch_daemon_snapshot_fail(call, &err);
}

/* ---- list and delete ---- */

void conch_daemon_handle_workspace_snapshots(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *sbid = conch_rpc_str(params, "sandbox", NULL);
    struct sandbox *sb = NULL;
    if (sbid && !(sb = conch_daemon_sandbox_find(c->d, sbid))) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                             "no sandbox '%s'", sbid);
        return;
    }
    struct conch_err err = {0};
    struct layers ls;
    if (layers_load(c->d, &ls, &err) < 0) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < ls.n; i++) {
        struct conch_state_layer *l = &ls.list[i];
        if ((!sb || layer_seen_by(&ls, sb, l)) && layer_visible(c->d, l))
            json_array_append_new(arr, layer_json(l));
    }
    layers_done(&ls);
    conch_rpc_call_reply(call, json_pack("{s:o}", "snapshots", arr));
}

void conch_daemon_handle_workspace_snapshot_delete(struct conch_rpc_call *call, json_t *params,
                                                   void *ctx)
{
    struct client *c = ctx;
    struct daemon *d = c->d;
    const char *key = conch_rpc_str(params, "snapshot", "");
    struct conch_err err = {0};
    struct layers ls;
    if (layers_load(d, &ls, &err) < 0) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    _cleanup_close_ int store = -1;
    struct conch_state_layer *l = layer_named(d, &ls, key, NULL);
    char users[400] = "";
    size_t off = 0;
    if (!l || !layer_visible(d, l)) {
        not_found(&err, key);
        goto fail;
    }
    for (size_t i = 0; i < ls.n; i++) {
        if (strcmp(ls.list[i].parent, l->id))
            continue;
        int w = snprintf(users + off, sizeof(users) - off, "%ssnapshot %s", off ? ", " : "",
                         ls.list[i].id);
        if (w > 0 && off + (size_t)w < sizeof(users))
            off += (size_t)w;
    }
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sandbox_destroyed(sb) || strcmp(sb->layer, l->id))
            continue;
        int w = snprintf(users + off, sizeof(users) - off, "%ssandbox %s", off ? ", " : "", sb->id);
        if (w > 0 && off + (size_t)w < sizeof(users))
            off += (size_t)w;
    }
    if (off) {
        conch_err_setk(&err, CONCH_ERR_USAGE, E_IN_USE,
                       "snapshot '%s' cannot be deleted: %s build%s on it (delete or destroy "
                       "them first, or restore the sandboxes to another snapshot)",
                       l->id, users, strchr(users, ',') ? "" : "s");
        goto fail;
    }
    if ((store = store_open(d, &err)) < 0)
        goto fail;
    /* The record first: a layer without a record is only disk, never a dangling stack. */
    if (conch_state_layer_delete(d->state, l->id, &err) < 0)
        goto fail;
    if (conch_ws_layer_remove(store, l->id, &err) < 0)
        log_warn("snapshot %s: %s", l->id, err.msg);
    conch_rpc_call_reply(call, json_pack("{s:s,s:b}", "snapshot", l->id, "deleted", 1));
    layers_done(&ls);
    return;
fail:
    layers_done(&ls);
    conch_daemon_snapshot_fail(call, &err);
}

void conch_daemon_handle_workspace_snapshot(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    const char *name = conch_rpc_str(params, "name", NULL);
    if (name) {
        size_t n = strlen(name);
        /* As sandbox names: "." and ".." (path-shaped) and "-x" (option-shaped) are refused,
         * and so is a name shaped as a snapshot id ("snap-" and 8 hex digits), which an id
         * would shadow. */
        bool ok = n >= 1 && n <= 64 && n == json_string_length(json_object_get(params, "name")) &&
                  isalnum((unsigned char)name[0]);
        for (size_t i = 1; ok && i < n; i++)
            ok = isalnum((unsigned char)name[i]) || strchr("_.-", name[i]);
        if (ok && n == 13 && !strncmp(name, "snap-", 5) &&
            strspn(name + 5, "0123456789abcdef") == 8)
            ok = false;
        if (!ok) {
            conch_rpc_call_fail_param(call, "name",
                                      "a snapshot name is 1 to 64 letters, digits, '_', '.' or "
                                      "'-', beginning with a letter or a digit, and not shaped as "
                                      "a snapshot id (snap-1a2b3c4d)");
            return;
        }
    }
    conch_daemon_workspace_queue(call, params, ctx, WS_Q_SNAPSHOT);
}

void conch_daemon_handle_workspace_restore(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    conch_daemon_workspace_queue(call, params, ctx, WS_Q_RESTORE);
}
