/* sandboxes.c - the daemon's sandboxes: create (a jail with its upper dir on disk, recorded
 * in the state database), find, touch (idle timeout), restart, destroy; the pool of
 * pre-built sandboxes for `fresh` commands; and listing what a previous daemon left. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fdpass.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "ptc/ptc.h"
#include "daemon/recover.h"
#include "daemon/statedir.h"

static void on_ctl_readable(uv_poll_t *h, int status, int events);
static void on_other_event(struct conch_super *s, const struct conch_jail_event *ev);
static void on_write_wanted(struct conch_super *s);
static void on_sample(uv_timer_t *t);

#define SAMPLE_MS 50
#define DISK_EVERY 4 /* samples between two measures of the upper dir */
#define DEFAULT_DISK_BYTES CONCH_SPEC_DISK_DEFAULT /* the spec's (pool, recovered sandboxes) */

struct sandbox *sandbox_find(struct daemon *d, const char *id)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = dlist_entry(pos, struct sandbox, link);
        /* Neither a pool's nor a lent one: a lent sandbox's borrower drives it alone (another
         * client's command there would count as its own, changes and commit included). */
        if (!strcmp(sb->id, id) && !sb->pooled && !sb->destroying && !sb->leasing && !sb->leased)
            return sb;
    }
    return NULL;
}

struct sandbox *sandbox_find_running(struct daemon *d, struct conch_rpc_call *call, const char *id)
{
    struct sandbox *sb = sandbox_find(d, id ? id : "");
    if (!sb) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                             "no sandbox '%s'", id ? id : "");
        return NULL;
    }
    if (sb->state != SB_RUNNING) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "sandbox '%s' is stopped (its processes are gone, e.g. after a "
                             "daemon restart): only workspace.* and sandbox.destroy work on it",
                             sb->id);
        return NULL;
    }
    return sb;
}

json_t *sandbox_json(const struct sandbox *sb)
{
    return json_pack(
        "{s:s,s:s?,s:s,s:s?,s:s,s:b,s:f,s:f,s:i,s:f}", "id", sb->id, "name",
        sb->name[0] ? sb->name : NULL, "state", sb->state == SB_RUNNING ? "running" : "stopped",
        "workspace", sb->workspace[0] ? sb->workspace : NULL, "mode", conch_ws_mode_name(sb->mode),
        "as_root", sb->as_root, "created_at", sb->created_at, "last_used_at", sb->last_used_at,
        "commands", (int)sb->commands, "idle_timeout", sb->idle_timeout);
}

static void on_idle(uv_timer_t *t)
{
    struct sandbox *sb = t->data;
    if (!dlist_empty(&sb->runs) || !dlist_empty(&sb->files)) {
        sandbox_touch(sb); /* busy: not idle */
        return;
    }
    log_info("sandbox %s idle for %.0f s: destroying it", sb->id, sb->idle_timeout);
    sandbox_destroy(sb);
}

void sandbox_touch(struct sandbox *sb)
{
    sb->last_used_at = daemon_now();
    if (sb->idle_active && sb->idle_timeout > 0)
        uv_timer_start(&sb->idle, on_idle, (uint64_t)(sb->idle_timeout * 1000), 0);
}

static int sandbox_spawn(struct sandbox *sb, bool async, struct conch_err *err);

int sandbox_start(struct sandbox *sb, struct conch_err *err)
{
    return sandbox_spawn(sb, false, err);
}

static int sandbox_spawn(struct sandbox *sb, bool async, struct conch_err *err)
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
    /* A tmpfs workspace is sized by it; an on-disk upper dir is watched (on_sample) and no
     * single file may outgrow it. */
    spec.disk_bytes = spec.file_bytes = sb->disk_bytes ? sb->disk_bytes : DEFAULT_DISK_BYTES;
    spec.file_handler = conch_fs_worker_run;
    spec.file_server = conch_fs_worker_serve;
    /* The daemon raised its open files limit; commands keep the usual one. */
    spec.nofile = sb->d->nofile_orig;
    /* The tool bridge: its socket inside, and the in-sandbox clients (tool_call, conch_tools,
     * conch-tools) when this conch has them. */
    if (!sb->bridge && (r = sandbox_bridge_new(sb, err)) < 0)
        return r;
    spec.ptc_socket = true;
    _cleanup_free_ char *ptc_dir = NULL;
    struct conch_err ptc_err = {0};
    if (conch_ptc_find_dir(&ptc_dir, &ptc_err) < 0 && !sb->d->ptc_warned) {
        sb->d->ptc_warned = true;
        log_warn("tool bridge: %s; commands get no tool_call", ptc_err.msg);
    }
    spec.ptc_dir = ptc_dir;
    spec.attachable = sb->pooled; /* `conch run` may take it with its workspace (lease) */
    /* The pool builds its sandboxes in the background: the warden's setup (mounts) runs
     * while the loop serves requests, and the outcome arrives on the control socket. */
    r = async ? conch_jail_spawn(&spec, &sb->jail, err) : conch_jail_start(&spec, &sb->jail, err);
    if (r < 0)
        return r;
    sb->jail_up = true;
    sb->starting = async;
    conch_super_init(&sb->super, sb->jail);
    sb->super.other_event = on_other_event;
    sb->super.write_wanted = on_write_wanted;
    sb->super.data = sb;
    /* A handle of its own per warden: the previous one may still be closing (restart). */
    sb->ctl_poll = calloc(1, sizeof(*sb->ctl_poll));
    if (!sb->ctl_poll) {
        conch_jail_destroy(sb->jail);
        sb->jail = NULL;
        sb->jail_up = false;
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    uv_poll_init(&sb->d->loop, sb->ctl_poll, conch_jail_ctl_fd(sb->jail));
    sb->ctl_poll->data = sb;
    uv_poll_start(sb->ctl_poll, UV_READABLE | UV_DISCONNECT, on_ctl_readable);
    if (!async)
        sandbox_bridge_listen(sb);
    /* Pool sandboxes spill to the shared directory (see sandbox_spill_dir): nothing to
     * measure there unless a limit has to be sampled. */
    bool sampled =
        sb->upper_dir[0] || !sb->pooled ||
        (!conch_jail_has_cgroup(sb->jail) && (sb->limits.memory_bytes || sb->limits.pids_max));
    if (sampled && (sb->sample = calloc(1, sizeof(*sb->sample)))) {
        uv_timer_init(&sb->d->loop, sb->sample);
        sb->sample->data = sb;
        uv_timer_start(sb->sample, on_sample, SAMPLE_MS, SAMPLE_MS);
    }
    sb->state = async ? SB_STOPPED : SB_RUNNING;
    return 0;
}

static void on_poll_closed(uv_handle_t *h)
{
    free(h);
}

/* ---- disk: measured in a worker thread ---- */

/* Each inode is charged this much on top of its blocks: 200,000 empty files are not free
 * (the host's inodes, dentries and slab). */
#define INODE_COST 4096
/* Directories opened at once while measuring (one per level): a deeper tree counts as full. */
#define MEASURE_MAX_DEPTH 512

struct du {
    dev_t dev;
    uint64_t bytes, inodes;
    bool too_deep;
};

/* Add what is beneath @dfd (taken over) to @u: fd-relative, never following a symlink or
 * leaving the filesystem, no global state (it runs in worker threads). */
static void du_dir(int dfd, unsigned depth, struct du *u)
{
    DIR *dir = fdopendir(dfd);
    if (!dir) {
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        u->bytes += (uint64_t)st.st_blocks * 512;
        u->inodes++;
        if (!S_ISDIR(st.st_mode) || st.st_dev != u->dev)
            continue;
        if (depth >= MEASURE_MAX_DEPTH) {
            u->too_deep = true;
            continue;
        }
        int fd = openat(dirfd(dir), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0)
            du_dir(fd, depth + 1, u);
    }
    closedir(dir);
}

/* What @path (a directory; missing is 0) costs the disk budget, in bytes. */
static uint64_t disk_charge(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return 0;
    }
    struct du u = {.dev = st.st_dev};
    du_dir(fd, 0, &u);
    if (u.too_deep)
        return UINT64_MAX;
    return u.bytes + u.inodes * INODE_COST;
}

struct measure {
    uv_work_t req;
    struct sandbox *sb; /* held */
    uint64_t started_ms;
    char upper[PATH_MAX + 16];
    char spill[PATH_MAX];
    uint64_t charged;
};

static void measure_work(uv_work_t *req)
{
    struct measure *m = req->data;
    uint64_t a = m->upper[0] ? disk_charge(m->upper) : 0;
    uint64_t b = m->spill[0] ? disk_charge(m->spill) : 0;
    m->charged = a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void measure_done(uv_work_t *req, int status)
{
    struct measure *m = req->data;
    struct sandbox *sb = m->sb;
    sb->measuring = false;
    /* A tree that takes long to measure is measured less often: at most half of a worker's
     * time goes to it. */
    uint64_t now = daemon_now_ms();
    sb->next_measure_ms = now + (now - m->started_ms);
    if (status == 0)
        sb->disk_over = m->charged > sb->disk_bytes;
    if (status == 0 && !sb->destroying && sb->jail_up && m->charged > sb->disk_bytes) {
        struct dlist *pos, *tmp;
        dlist_for_each_safe(pos, tmp, &sb->runs)
        {
            run_limit_hit(dlist_entry(pos, struct run, link), RUN_LIMIT_DISK);
        }
    }
    free(m);
    sandbox_release(sb);
}

/* Measure the upper dir and the spill files of @sb in a worker (one at a time): with
 * hundreds of thousands of files that takes seconds, which the loop must not wait for. */
static void measure_start(struct sandbox *sb)
{
    if (sb->measuring || (!sb->upper_dir[0] && !sb->spill_dir[0]) ||
        daemon_now_ms() < sb->next_measure_ms)
        return;
    struct measure *m = calloc(1, sizeof(*m));
    if (!m)
        return;
    m->req.data = m;
    m->sb = sb;
    m->started_ms = daemon_now_ms();
    sb->measure_wanted = false;
    if (sb->upper_dir[0])
        snprintf(m->upper, sizeof(m->upper), "%s/upper", sb->upper_dir);
    snprintf(m->spill, sizeof(m->spill), "%s", sb->spill_dir);
    if (uv_queue_work(&sb->d->loop, &m->req, measure_work, measure_done) < 0) {
        free(m);
        return;
    }
    sb->measuring = true;
    sandbox_hold(sb);
}

bool sandbox_changes_none(struct sandbox *sb)
{
    if (!sb->upper_dir[0] || sb->ws_running || !dlist_empty(&sb->ws_ops))
        return false;
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s/upper", sb->id);
    struct conch_err err = {0};
    int fd = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, &err);
    if (fd < 0)
        return false; /* the worker's scan says why, or that nothing was ever written */
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return false;
    }
    bool empty = true;
    struct dirent *e;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

void sandbox_measure(struct sandbox *sb)
{
    /* Requests coalesce, and the throttle holds (a tree that takes seconds to measure is not
     * measured after every command): one that cannot start now starts from on_sample. */
    if (sb->upper_dir[0] && !sb->destroying) {
        sb->measure_wanted = true;
        measure_start(sb);
    }
}

bool sandbox_disk_refuse(struct sandbox *sb, struct conch_rpc_call *call)
{
    if (!sb->disk_over)
        return false;
    conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                         "sandbox '%s' has used its disk limit (%llu bytes) for its changes, "
                         "spill files and inodes: free room with fs.delete or "
                         "workspace.discard, or create the sandbox with a larger disk",
                         sb->id, (unsigned long long)sb->disk_bytes);
    return true;
}

/* No cgroup (an ordinary user on cgroup v1): memory and the process count are sampled from
 * the sandbox's /proc; past the memory limit every running command is killed. */
static void on_sample(uv_timer_t *t)
{
    struct sandbox *sb = t->data;
    if (sb->jail_up && sb->measure_wanted)
        measure_start(sb);
    if (!sb->jail_up || dlist_empty(&sb->runs))
        return;
    enum run_limit hit = RUN_LIMIT_NONE;
    struct conch_jail_usage u;
    if (!conch_jail_has_cgroup(sb->jail) && (sb->limits.memory_bytes || sb->limits.pids_max) &&
        conch_jail_usage(sb->jail, &u) == 0) {
        if (sb->limits.pids_max && u.processes + 1 >= sb->limits.pids_max)
            hit = RUN_LIMIT_PIDS;
        if (sb->limits.memory_bytes && u.rss_bytes > sb->limits.memory_bytes)
            hit = RUN_LIMIT_MEMORY;
    }
    if (++sb->samples % DISK_EVERY == 0)
        measure_start(sb);
    if (hit == RUN_LIMIT_NONE)
        return;
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &sb->runs)
    {
        run_limit_hit(dlist_entry(pos, struct run, link), hit);
    }
}

/* Stop the warden: every process of the sandbox dies; runs and file requests fail. */
/* Fail what runs in @sb and close its handles; the warden is left to the caller. */
static void sandbox_stop_handles(struct sandbox *sb, const char *why)
{
    struct dlist *pos, *tmp;
    if (sb->leasing) {
        sb->leasing = false;
        conch_rpc_call_failf(sb->lease_call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "lease: %s", why);
        sb->lease_call = NULL;
    }
    sb->leased = false;
    conch_rpc_sink_unref(sb->lease_sink);
    sb->lease_sink = NULL;
    /* Every command still running gets its final event now (lost, @why). */
    if (sb->jail_up)
        conch_super_done(&sb->super, why);
    if (sb->bridge)
        conch_bridge_listen(sb->bridge, -1, NULL);
    dlist_for_each_safe(pos, tmp, &sb->files)
        file_req_abort(dlist_entry(pos, struct file_req, link));
    file_pool_stop(sb);
    if (sb->ctl_poll) {
        uv_poll_stop(sb->ctl_poll);
        uv_close((uv_handle_t *)sb->ctl_poll, on_poll_closed);
        sb->ctl_poll = NULL;
    }
    if (sb->sample) {
        uv_timer_stop(sb->sample);
        uv_close((uv_handle_t *)sb->sample, on_poll_closed);
        sb->sample = NULL;
    }
}

void sandbox_stop(struct sandbox *sb, const char *why)
{
    sandbox_stop_handles(sb, why);
    if (sb->jail_up) {
        conch_jail_destroy(sb->jail);
        sb->jail = NULL;
        sb->jail_up = false;
    }
    sb->state = SB_STOPPED;
}

/* Write @sb's record. Returns 0, or -errno with @err (the database is full, read-only...). */
static int record(struct sandbox *sb, struct conch_err *err)
{
    struct conch_state_sandbox rec;
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.id, sizeof(rec.id), "%s", sb->id);
    snprintf(rec.name, sizeof(rec.name), "%s", sb->name);
    snprintf(rec.workspace, sizeof(rec.workspace), "%s", sb->workspace);
    snprintf(rec.mode, sizeof(rec.mode), "%s", conch_ws_mode_name(sb->mode));
    snprintf(rec.state, sizeof(rec.state), "%s", sb->state == SB_RUNNING ? "running" : "stopped");
    snprintf(rec.upper_dir, sizeof(rec.upper_dir), "%s", sb->upper_dir);
    json_t *spec = json_pack("{s:b,s:I,s:I,s:s?,s:O?}", "as_root", sb->as_root, "ws_dev",
                             (json_int_t)sb->ws_dev, "ws_ino", (json_int_t)sb->ws_ino, "rootfs",
                             sb->rootfs[0] ? sb->rootfs : NULL, "env", sb->env);
    rec.spec_json = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    rec.warden_pid = sb->jail_up ? conch_jail_warden_pid(sb->jail) : 0;
    rec.warden_starttime =
        sb->jail_up ? conch_recover_starttime(conch_jail_warden_pid(sb->jail)) : 0;
    rec.created_at = sb->created_at;
    rec.last_used_at = sb->last_used_at;
    int r = rec.spec_json ? conch_state_sandbox_put(sb->d->state, &rec, err)
                          : conch_err_set(err, ENOMEM, "out of memory");
    if (r >= 0)
        sb->recorded = true;
    free(rec.spec_json);
    return r;
}

static void on_idle_closed(uv_handle_t *h)
{
    struct sandbox *sb = h->data;
    json_decref(sb->env);
    free(sb);
}

static struct sandbox *sandbox_alloc(struct daemon *d)
{
    struct sandbox *sb = calloc(1, sizeof(*sb));
    if (!sb)
        return NULL;
    sb->d = d;
    conch_jail_ids_init(&sb->ids);
    DLIST_INIT(&sb->runs);
    DLIST_INIT(&sb->done_jobs);
    DLIST_INIT(&sb->files);
    uv_timer_init(&d->loop, &sb->idle);
    sb->idle.data = sb;
    sb->idle_active = true;
    sb->created_at = sb->last_used_at = daemon_now();
    sb->state = SB_STOPPED;
    DLIST_INIT(&sb->ws_ops);
    return sb;
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
        sandbox_release(t->sb);
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

static void sandbox_unlink(struct sandbox *sb)
{
    if (sb->unlinked)
        return;
    sb->unlinked = true;
    dlist_del(&sb->link);
    sb->d->n_sandboxes--;
}

static void sandbox_really_free(struct sandbox *sb)
{
    /* At shutdown the loop closes every handle itself, this one included; the sandbox is
     * then left to the process's exit. */
    if (uv_is_closing((uv_handle_t *)&sb->idle))
        return;
    if (sb->destroying && !sb->keep_dir)
        remove_sandbox_dir(sb);
    else if (sb->gone)
        sb->gone(sb->gone_arg);
    uv_timer_stop(&sb->idle);
    conch_jail_ids_release(&sb->ids); /* its warden is gone (sandbox_stop) */
    uv_close((uv_handle_t *)&sb->idle, on_idle_closed);
}

/* Out of the registry now; freed once no worker holds it. */
static void sandbox_free(struct sandbox *sb)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &sb->runs) run_forget(dlist_entry(pos, struct run, link));
    dlist_for_each_safe(pos, tmp, &sb->done_jobs) run_forget(dlist_entry(pos, struct run, link));
    conch_bridge_free(sb->bridge);
    sb->bridge = NULL;
    sandbox_unlink(sb);
    if (sb->holds > 0) {
        sb->free_pending = true;
        return;
    }
    sandbox_really_free(sb);
}

void sandbox_hold(struct sandbox *sb)
{
    sb->holds++;
    sb->d->holds++;
}

void sandbox_release(struct sandbox *sb)
{
    sb->d->holds--;
    if (--sb->holds == 0 && sb->free_pending) {
        sb->free_pending = false;
        sandbox_really_free(sb);
    }
}

const char *sandbox_spill_dir(struct sandbox *sb)
{
    struct daemon *d = sb->d;
    if (sb->fresh || sb->pooled)
        return d->spill_dir;
    if (sb->spill_dir[0])
        return sb->spill_dir;
    char dir[PATH_MAX];
    int n = snprintf(dir, sizeof(dir), "%s/sandboxes/%s", d->state_dir, sb->id);
    /* conch_output keeps the directory in 256 bytes, with room for its file names. */
    if (n < 0 || (size_t)n >= 200)
        return d->spill_dir;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return d->spill_dir;
    n = snprintf(sb->spill_dir, sizeof(sb->spill_dir), "%.*s/spill", (int)(sizeof(dir) - 8), dir);
    if (n < 0 || (size_t)n >= sizeof(sb->spill_dir) ||
        (mkdir(sb->spill_dir, 0700) < 0 && errno != EEXIST)) {
        log_warn("sandbox %s: spill directory '%s': %s", sb->id, sb->spill_dir, strerror(errno));
        sb->spill_dir[0] = '\0';
        return d->spill_dir;
    }
    return sb->spill_dir;
}

int sandbox_create(struct daemon *d, const struct sandbox_spec *spec, struct sandbox **ret,
                   struct conch_err *err)
{
    if (d->n_sandboxes >= d->opts.max_sandboxes)
        return conch_err_setk(err, CONCH_ERR_LIMIT, EMFILE,
                              "too many sandboxes (%u, --max-sandboxes): destroy some first",
                              d->opts.max_sandboxes);
    struct sandbox *sb = sandbox_alloc(d);
    if (!sb)
        return conch_err_set(err, ENOMEM, "out of memory");
    dlist_add(&d->sandboxes, &sb->link);
    d->n_sandboxes++;
    daemon_make_id(d, "sb", sb->id, sizeof(sb->id));
    if (spec->name)
        snprintf(sb->name, sizeof(sb->name), "%s", spec->name);
    if (spec->workspace) {
        snprintf(sb->workspace, sizeof(sb->workspace), "%s", spec->workspace);
        struct stat st;
        if (stat(spec->workspace, &st) == 0 && S_ISDIR(st.st_mode)) {
            sb->ws_dev = st.st_dev;
            sb->ws_ino = st.st_ino;
        }
    }
    sb->mode = spec->mode;
    if (spec->rootfs)
        snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", spec->rootfs);
    sb->as_root = spec->as_root;
    sb->limits = spec->limits;
    sb->tmp_bytes = spec->tmp_bytes;
    sb->disk_bytes = spec->disk_bytes ? spec->disk_bytes : DEFAULT_DISK_BYTES;
    sb->env = spec->env ? json_deep_copy(spec->env) : json_object();
    sb->idle_timeout = spec->idle_timeout >= 0 ? spec->idle_timeout : d->opts.idle_timeout;
    sb->tool_timeout = spec->tool_timeout;
    sb->max_tool_calls = spec->max_tool_calls;
    int r;
    if (spec->workspace && spec->mode == CONCH_WS_OVERLAY) {
        int n =
            snprintf(sb->upper_dir, sizeof(sb->upper_dir), "%s/sandboxes/%s", d->state_dir, sb->id);
        if (n < 0 || (size_t)n >= sizeof(sb->upper_dir)) {
            r = conch_err_set(err, ENAMETOOLONG, "state directory path too long");
            goto fail;
        }
        _cleanup_close_ int pfd =
            conch_statedir_open(d->state_dir, "sandboxes", O_RDONLY | O_DIRECTORY, err);
        if (pfd < 0) {
            r = pfd;
            goto fail;
        }
        if (mkdirat(pfd, sb->id, 0700) < 0) {
            r = conch_err_set(err, errno, "mkdir '%s': %s", sb->upper_dir, strerror(errno));
            goto fail;
        }
    }
    if ((r = sandbox_start(sb, err)) < 0)
        goto fail;
    /* A sandbox that is not recorded would be unknown after a restart, its changes
     * orphaned: better not to have it. */
    if ((r = record(sb, err)) < 0) {
        conch_err_wrap(err, "cannot record the sandbox in the state directory '%s'", d->state_dir);
        sandbox_stop(sb, "it could not be recorded");
        goto fail;
    }
    sandbox_touch(sb);
    *ret = sb;
    return 0;
fail:
    sb->destroying = true; /* the directory goes with it */
    sandbox_free(sb);
    return r;
}

int sandbox_restart(struct sandbox *sb, struct conch_err *err)
{
    sandbox_stop(sb, "the sandbox was restarted");
    int r = sandbox_start(sb, err);
    struct conch_err rerr = {0};
    if (record(sb, &rerr) < 0)
        log_warn("record sandbox %s: %s", sb->id, rerr.msg);
    return r;
}

void sandbox_destroy_keep_record(struct sandbox *sb)
{
    if (sb->destroying)
        return;
    sb->destroying = true;
    sb->keep_dir = sb->recorded && !sb->fresh; /* a kept record keeps its changes */
    ws_ops_cancel(sb, "the daemon is shutting down");
    sandbox_stop(sb, "the daemon is shutting down");
    if (sb->recorded && !sb->fresh)
        conch_state_sandbox_mark_stopped(sb->d->state, sb->id, daemon_now(), NULL);
    else if (sb->recorded)
        conch_state_sandbox_delete(sb->d->state, sb->id, NULL);
    sandbox_free(sb);
}

static void pool_timer_cb(uv_timer_t *t);

void sandbox_destroy(struct sandbox *sb)
{
    sandbox_destroy_then(sb, NULL, NULL);
}

void sandbox_destroy_then(struct sandbox *sb, void (*gone)(void *arg), void *arg)
{
    if (sb->destroying) {
        if (gone)
            gone(arg);
        return;
    }
    sb->gone = gone;
    sb->gone_arg = arg;
    /* A `fresh` sandbox came from the pool: refill it now that the command was answered,
     * not while the command runs (measured: refilling during the command delays its
     * answer more than it saves). */
    if (sb->fresh && !sb->d->stopping)
        uv_timer_start(&sb->d->pool_timer, pool_timer_cb, 0, 0);

    sb->destroying = true;
    ws_ops_cancel(sb, "the sandbox was destroyed");
    sandbox_stop_handles(sb, "the sandbox was destroyed");
    sb->state = SB_STOPPED;
    /* The warden's end (and a cgroup's removal, which waits for it) in a worker; the
     * directory is removed once that and any workspace request in flight are done. */
    if (sb->jail_up) {
        struct teardown *t = calloc(1, sizeof(*t));
        if (t) {
            t->jail = sb->jail;
            t->sb = sb;
            sandbox_hold(sb);
            teardown_queue(sb->d, t);
        } else {
            conch_jail_destroy(sb->jail);
        }
        sb->jail = NULL; /* the teardown's now */
        sb->jail_up = false;
    }
    /* Jobs go with their sandbox (ON DELETE CASCADE). */
    if (sb->recorded)
        conch_state_sandbox_delete(sb->d->state, sb->id, NULL);
    sandbox_free(sb);
}

void sandbox_warden_gone(struct sandbox *sb)
{
    log_warn("sandbox %s: its warden died", sb->id);
    sandbox_stop(sb, "the sandbox's warden died");
    if (sb->recorded)
        conch_state_sandbox_mark_stopped(sb->d->state, sb->id, daemon_now(), NULL);
    if (sb->fresh || sb->pooled)
        sandbox_destroy(sb);
}

static void lease_answer(struct sandbox *sb, int r, const struct conch_err *err);

/* The warden's control socket is watched for writability only while sends wait for room
 * (conch_super_wants_write): a socket with room is always writable. Not while lent: the
 * borrower reads and writes it then. */
static void ctl_poll_update(struct sandbox *sb)
{
    if (!sb->ctl_poll || sb->leased || !sb->jail_up)
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

static void on_ctl_readable(uv_poll_t *h, int status, int events)
{
    struct sandbox *sb = h->data;
    /* Queued sends first: a recycle's answer (read below, blocking) comes only once the
     * RECYCLE itself has reached the warden. */
    if (status >= 0 && (events & UV_WRITABLE)) {
        int r = conch_super_flush(&sb->super);
        if (r == 0 && !sb->leasing && !sb->starting) {
            sandbox_warden_gone(sb);
            return;
        }
        if (r >= 0)
            ctl_poll_update(sb); /* a warden gone mid-setup reads as EOF next */
        if (!(events & (UV_READABLE | UV_DISCONNECT)))
            return;
    }
    if (sb->leasing) {
        struct conch_err err = {0};
        int r = status < 0 ? conch_err_set(&err, -status, "lease: %s", uv_strerror(status))
                           : conch_jail_await_attach(sb->jail, &err);
        lease_answer(sb, r, &err);
        return;
    }
    if (sb->starting) {
        struct conch_err err = {0};
        sb->starting = false;
        int r = status < 0 ? conch_err_set(&err, -status, "pool sandbox: %s", uv_strerror(status))
                           : conch_jail_await_setup(sb->jail, &err);
        if (r < 0) {
            log_warn("pool: %s", err.msg);
            if (status < 0)
                conch_jail_destroy(sb->jail);
            sb->jail = NULL; /* await_setup destroyed it */
            sb->jail_up = false;
            sandbox_destroy(sb);
            return;
        }
        sb->state = SB_RUNNING;
        if (sb->recycling) {
            sb->recycling = false; /* its bridge listens already; lent, it refused */
            if (sb->bridge)
                conch_bridge_refuse(sb->bridge, false);
        } else
            sandbox_bridge_listen(sb);
        return;
    }
    if (status < 0) {
        sandbox_warden_gone(sb);
        return;
    }
    /* 0: the warden is gone (every running command has been ended); -1: the sandbox was
     * stopped by a callback meanwhile. */
    if (conch_super_dispatch(&sb->super) == 0)
        sandbox_warden_gone(sb);
}

/* Warden events that are not about a command: a file request the warden could not start. */
static void on_other_event(struct conch_super *s, const struct conch_jail_event *ev)
{
    struct sandbox *sb = s->data;
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &sb->files)
    {
        struct file_req *fr = dlist_entry(pos, struct file_req, link);
        if (fr->id == ev->id && ev->type == CONCH_JAIL_START_FAILED) {
            file_req_abort(fr);
            return;
        }
    }
}

/* ---- the pool of default sandboxes for `fresh` ---- */

static unsigned pool_count(struct daemon *d)
{
    unsigned n = 0;
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &d->sandboxes)
    {
        if (dlist_entry(pos, struct sandbox, link)->pooled)
            n++;
    }
    return n;
}

void pool_fill(struct daemon *d)
{
    if (d->stopping)
        return;
    while (pool_count(d) < d->opts.pool_size && d->n_sandboxes < d->opts.max_sandboxes) {
        struct sandbox *sb = sandbox_alloc(d);
        if (!sb)
            return;
        dlist_add(&d->sandboxes, &sb->link);
        d->n_sandboxes++;
        daemon_make_id(d, "sb", sb->id, sizeof(sb->id));
        sb->env = json_object();
        sb->pooled = true;
        sb->idle_timeout = 0;
        struct conch_err err = {0};
        if (sandbox_spawn(sb, true, &err) < 0) {
            log_warn("pool: %s", err.msg);
            sandbox_free(sb);
            return;
        }
    }
}

static void pool_timer_cb(uv_timer_t *t)
{
    pool_fill(t->data);
}

/* Recycling is worth it only as a whole: building a sandbox costs ~2.5 ms of CPU and
 * destroying one ~1 ms (namespaces, ~75 mounts, the network namespace); making one as new
 * ran 0.7-1.2 ms in the warden (traced; about half is the new network namespace, and the
 * unmounts wait on RCU, 1-3 ms of wall time), after the answer. What a command could have
 * changed is renewed (see the warden's recycle()); what is kept is read-only to commands. A
 * sandbox that anything else touched (another run or a session by its id, file requests,
 * workspace operations) is destroyed as before: the warden's recycle ends processes without
 * final events, so none may be live. */
void sandbox_retire(struct sandbox *sb)
{
    struct daemon *d = sb->d;
    unsigned runs = 0;
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &sb->runs) runs++;
    struct conch_err err = {0};
    if (!sb->from_pool || d->stopping || sb->as_root || sb->workspace[0] || sb->upper_dir[0] ||
        !sb->jail_up || runs > 1 || sb->super.live || !dlist_empty(&sb->done_jobs) ||
        !dlist_empty(&sb->files) || sb->file_pool || sb->ws_running || !dlist_empty(&sb->ws_ops) ||
        pool_count(d) >= d->opts.pool_size || conch_jail_send_recycle(sb->jail, &err) < 0) {
        sandbox_destroy(sb);
        return;
    }
    /* A new identity: whoever learnt the old id finds nothing under it. */
    daemon_make_id(d, "sb", sb->id, sizeof(sb->id));
    sb->fresh = sb->from_pool = false;
    sb->pooled = true;
    sb->recycling = true;
    sb->starting = true; /* not taken before the warden's answer (on_ctl_readable) */
    sb->state = SB_STOPPED;
    sb->commands = 0;
    sb->disk_over = sb->measure_wanted = false;
    sb->created_at = sb->last_used_at = daemon_now();
}

struct sandbox *pool_take(struct daemon *d)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = dlist_entry(pos, struct sandbox, link);
        if (sb->pooled && sb->state == SB_RUNNING && !sb->starting && dlist_empty(&sb->runs)) {
            sb->pooled = false;
            return sb;
        }
    }
    return NULL;
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
        client_close(c);
        return -EPIPE;
    }
    return 0;
}

static void lease_answer(struct sandbox *sb, int r, const struct conch_err *err)
{
    struct conch_rpc_call *call = sb->lease_call;
    struct client *c = lease_client(sb);
    sb->leasing = false;
    sb->lease_call = NULL;
    struct conch_jail_lease lease;
    int ctl = -1;
    struct conch_err herr = {0};
    if (r < 0 || !c || conch_jail_hand_over(sb->jail, &lease, &ctl, &herr) < 0) {
        if (r < 0 || c)
            conch_rpc_call_fail_err(call, 0, NULL, r < 0 ? err : &herr);
        else
            conch_rpc_call_reply(call, json_null()); /* nobody reads it */
        conch_rpc_sink_unref(sb->lease_sink);
        sb->lease_sink = NULL;
        sandbox_destroy(sb);
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
        conch_rpc_sink_unref(sb->lease_sink);
        sb->lease_sink = NULL;
        sandbox_destroy(sb);
        return;
    }
    /* The client's commands report on its own channel; ours stays quiet until it is done. */
    uv_poll_stop(sb->ctl_poll);
    sb->leased = true;
}

/* The client is done with @sb: @clean, it read every event of its commands (sandbox.release),
 * so the sandbox can be made as new for the pool; otherwise it went away mid-way. */
static void lease_end(struct sandbox *sb, bool clean)
{
    sb->leased = false;
    conch_rpc_sink_unref(sb->lease_sink);
    sb->lease_sink = NULL;
    if (!clean || !sb->ctl_poll) {
        sandbox_destroy(sb);
        return;
    }
    uv_poll_start(sb->ctl_poll, UV_READABLE | UV_DISCONNECT, on_ctl_readable);
    sandbox_retire(sb);
}

void sandboxes_client_gone(struct daemon *d, struct conch_rpc_sink *sink)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = dlist_entry(pos, struct sandbox, link);
        if (sb->leased && sb->lease_sink == sink)
            lease_end(sb, false);
    }
}

void handle_sandbox_release(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    (void)params;
    struct dlist *pos, *tmp;
    unsigned n = 0;
    dlist_for_each_safe(pos, tmp, &c->d->sandboxes)
    {
        struct sandbox *sb = dlist_entry(pos, struct sandbox, link);
        if (sb->leased && sb->lease_sink == c->sink) {
            lease_end(sb, true);
            n++;
        }
    }
    conch_rpc_call_reply(call, json_pack("{s:i}", "released", n));
}

void handle_sandbox_lease(struct conch_rpc_call *call, json_t *params, void *ctx)
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
    struct sandbox *sb = pool_take(d);
    if (!sb) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "no pre-built sandbox is ready in the pool");
        return;
    }
    uint64_t disk = (uint64_t)conch_rpc_int(params, "disk", 0);
    if (conch_jail_send_attach(sb->jail, ws, (dev_t)conch_rpc_int(params, "ws_dev", 0),
                               (ino_t)conch_rpc_int(params, "ws_ino", 0), mode,
                               disk ? disk : CONCH_SPEC_DISK_DEFAULT, &err) < 0) {
        /* Nothing was attached (a missing or replaced workspace, say): the sandbox is as it
         * was, back in the pool. */
        sb->pooled = true;
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    /* Not listed; made as new for the pool (or destroyed) when the client is done. Its
     * command gets no tool bridge, as in a sandbox of conch run's own: the bridge would make
     * us read the control socket that is the borrower's now (bridge_resolve). */
    sb->fresh = sb->from_pool = true;
    if (sb->bridge)
        conch_bridge_refuse(sb->bridge, true);
    sb->leasing = true;
    sb->lease_call = call;
    sb->lease_sink = conch_rpc_sink_ref(c->sink);
}

/* ---- what a previous daemon left ---- */

void sandboxes_recover(struct daemon *d)
{
    struct conch_state_sandbox *list = NULL;
    size_t n = 0;
    struct conch_err err = {0};
    if (conch_state_sandbox_list(d->state, &list, &n, &err) < 0) {
        log_warn("list recorded sandboxes: %s", err.msg);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct sandbox *sb = sandbox_alloc(d);
        if (!sb)
            break;
        dlist_add(&d->sandboxes, &sb->link);
        d->n_sandboxes++;
        snprintf(sb->id, sizeof(sb->id), "%s", list[i].id);
        snprintf(sb->name, sizeof(sb->name), "%s", list[i].name);
        snprintf(sb->workspace, sizeof(sb->workspace), "%s", list[i].workspace);
        conch_ws_mode_parse(list[i].mode[0] ? list[i].mode : "overlay", &sb->mode, NULL);
        snprintf(sb->upper_dir, sizeof(sb->upper_dir), "%s", list[i].upper_dir);
        sb->created_at = list[i].created_at;
        sb->last_used_at = list[i].last_used_at;
        json_t *spec = list[i].spec_json ? json_loads(list[i].spec_json, 0, NULL) : NULL;
        sb->as_root = json_is_true(json_object_get(spec, "as_root"));
        sb->ws_dev = (dev_t)json_integer_value(json_object_get(spec, "ws_dev"));
        sb->ws_ino = (ino_t)json_integer_value(json_object_get(spec, "ws_ino"));
        const char *rootfs = json_string_value(json_object_get(spec, "rootfs"));
        if (rootfs)
            snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
        json_t *env = json_object_get(spec, "env");
        sb->env = json_is_object(env) ? json_incref(env) : json_object();
        json_decref(spec);
        sb->state = SB_STOPPED;
        sb->recorded = true;
        /* Its jobs' spill files: removed with it. */
        char spill[PATH_MAX];
        struct stat st;
        int len = snprintf(spill, sizeof(spill), "%s/sandboxes/%s/spill", d->state_dir, sb->id);
        if (len > 0 && (size_t)len < sizeof(spill) && lstat(spill, &st) == 0 && S_ISDIR(st.st_mode))
            snprintf(sb->spill_dir, sizeof(sb->spill_dir), "%s", spill);
        sb->idle_timeout = 0; /* stopped: nothing to reclaim but the record */
        conch_state_sandbox_set_state(d->state, sb->id, "stopped", NULL);
    }
    conch_state_sandbox_free_list(list, n);
}
