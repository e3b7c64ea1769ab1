/* sandboxes.c - the daemon's sandboxes: create (a jail with its upper dir on disk, recorded
 * in the state database), find, touch (idle timeout), destroy, their disk use (measured in
 * workers) and listing what a previous daemon left. Their lifecycle is lifecycle.c's; the
 * pool and the lease are pool.c's. */
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
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/recover.h"
#include "daemon/statedir.h"
#include "exec/result.h"

static void on_sample(uv_timer_t *t);

#define SAMPLE_MS 50
#define DISK_EVERY 4 /* samples between two measures of the upper dir */

struct sandbox *conch_daemon_sandbox_find(struct daemon *d, const char *id)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        /* Neither a pool's nor a lent one (a lent sandbox's borrower drives it alone: another
         * client's command there would count as its own, changes and commit included), nor
         * one being destroyed. */
        bool findable =
            sb->state == SB_READY || sb->state == SB_STOPPED || sb->state == SB_RESTARTING;
        if (findable && !strcmp(sb->id, id) && conch_daemon_tenant_sees(d, sb))
            return sb;
    }
    return NULL;
}

struct sandbox *conch_daemon_sandbox_find_or_fail(struct daemon *d, struct conch_rpc_call *call,
                                                  json_t *params, const char *key)
{
    const char *id = conch_rpc_str(params, key, "");
    struct sandbox *sb = conch_daemon_sandbox_find(d, id);
    if (!sb)
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                             "no sandbox '%s'", id);
    return sb;
}

struct sandbox *conch_daemon_sandbox_find_running(struct daemon *d, struct conch_rpc_call *call,
                                                  const char *id)
{
    struct sandbox *sb = conch_daemon_sandbox_find(d, id ? id : "");
    if (!sb) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                             "no sandbox '%s'", id ? id : "");
        return NULL;
    }
    if (sb->state != SB_READY) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "sandbox '%s' is stopped (its processes are gone, e.g. after a "
                             "daemon restart): only workspace.* and sandbox.destroy work on it",
                             sb->id);
        return NULL;
    }
    return sb;
}

/* What runs in @sb now: its commands and jobs not finished, the latest one's command. */
static json_t *sandbox_running_json(const struct sandbox *sb, json_t *o)
{
    int n = 0;
    const struct run *latest = NULL;
    const struct conch_list *pos;
    for (pos = sb->runs.next; pos != &sb->runs; pos = pos->next) {
        const struct run *r = conch_list_entry(pos, struct run, link);
        if (r->finished)
            continue;
        n++;
        if (!latest || r->started_at >= latest->started_at)
            latest = r;
    }
    if (!o)
        return NULL;
    json_object_set_new(o, "running", json_integer(n));
    json_object_set_new(o, "current_command",
                        latest && latest->command
                            ? conch_json_text(latest->command, strlen(latest->command))
                            : json_null());
    return o;
}

static int record(struct sandbox *sb, struct conch_err *err);

void conch_daemon_net_from_record(const char *id, json_t *spec, struct conch_net_policy *ret)
{
    struct conch_err err = {0};
    enum conch_net_mode mode = CONCH_NET_NONE;
    const char *net = json_string_value(json_object_get(spec, "net"));
    if (net && conch_net_mode_parse(net, &mode, &err) < 0)
        mode = CONCH_NET_NONE;
    conch_net_policy_init(ret, mode);
    for (int deny = 0; deny < 2; deny++) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(spec, deny ? "deny" : "allow"), i, v)
        {
            if (conch_net_policy_add(ret, deny, json_string_value(v), &err) < 0) {
                log_warn("sandbox %s: network rule: %s (it gets no network)", id, err.msg);
                conch_net_policy_done(ret);
                conch_net_policy_init(ret, CONCH_NET_NONE);
                return;
            }
        }
    }
}

json_t *conch_daemon_sandbox_json(const struct sandbox *sb)
{
    json_t *o = sandbox_running_json(
        sb, json_pack("{s:s,s:s?,s:s,s:s?,s:s,s:b,s:f,s:f,s:i,s:f,s:I,s:s?}", "id", sb->id, "name",
                      sb->name[0] ? sb->name : NULL, "state",
                      sb->state == SB_READY ? "running" : "stopped", "workspace",
                      /* a tenant's is a path of the daemon's, not shown to it */
                      sb->workspace[0] && conch_daemon_tenant_sees_tenant(sb->d, "") ? sb->workspace
                                                                                     : NULL,
                      "mode", conch_ws_mode_name(sb->mode), "as_root", sb->as_root, "created_at",
                      sb->created_at, "last_used_at", sb->last_used_at, "commands",
                      (int)sb->commands, "idle_timeout", sb->idle_timeout, "held",
                      (json_int_t)conch_budget_held(&sb->held), "snapshot",
                      sb->layer[0] ? sb->layer : NULL));
    if (o)
        conch_daemon_net_json(sb, o);
    if (o && sb->tenant[0])
        json_object_set_new(o, "tenant", json_string(sb->tenant));
    if (o && sb->pool_fork)
        json_object_set_new(o, "from_pool", json_true());
    if (o && sb->n_sockets) {
        json_t *arr = json_array();
        for (unsigned i = 0; i < sb->n_sockets; i++)
            json_array_append_new(arr, conch_socket_to_json(&sb->sockets[i]));
        json_object_set_new(o, "sockets", arr);
    }
    return o;
}

static void on_idle(uv_timer_t *t)
{
    struct sandbox *sb = t->data;
    if (!conch_list_empty(&sb->runs) || !conch_list_empty(&sb->files)) {
        conch_daemon_sandbox_touch(sb); /* busy: not idle */
        return;
    }
    log_info("sandbox %s idle for %.0f s: destroying it", sb->id, sb->idle_timeout);
    conch_daemon_sandbox_destroy(sb);
}

void conch_daemon_sandbox_touch(struct sandbox *sb)
{
    sb->last_used_at = conch_daemon_now();
    if (sb->idle_timeout > 0 && !sandbox_destroyed(sb))
        uv_timer_start(&sb->idle, on_idle, (uint64_t)(sb->idle_timeout * 1000), 0);
}

/* ---- disk: measured in a worker thread ---- */

/* Each inode is charged this much on top of its blocks: 200,000 empty files are not free
 * (the host's inodes, dentries and slab). */
#define INODE_COST 4096
/* Directories opened at once while measuring (one per level): a deeper tree counts as full. */
/* What @path (a directory; missing is 0) costs the disk budget, in bytes. */
static uint64_t disk_charge(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    uint64_t bytes, inodes;
    if (fd < 0)
        return 0;
    if (!conch_ws_dir_usage(fd, &bytes, &inodes))
        return bytes || inodes ? UINT64_MAX : 0; /* too deep to measure: charged whole */
    return bytes + inodes * INODE_COST;
}

struct measure {
    uv_work_t req;
    struct sandbox *sb; /* held */
    uint64_t started_ms;
    uint64_t copied_at_start; /* sb->copied_total when it started */
    char upper[PATH_MAX + 16];
    char spill[PATH_MAX];
    char stores[PATH_MAX + 96]; /* its store mounts' views (stores.c), or "" */
    char dir[PATH_MAX];         /* its sandbox dir, holding its overlay mounts' m<i>/upper */
    unsigned overlays;          /* the indices of its overlay mounts, a bit each */
    uint64_t charged;
};

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void measure_work(uv_work_t *req)
{
    struct measure *m = req->data;
    uint64_t a = m->upper[0] ? disk_charge(m->upper) : 0;
    uint64_t b = m->spill[0] ? disk_charge(m->spill) : 0;
    uint64_t c = m->stores[0] ? disk_charge(m->stores) : 0;
    m->charged = add_sat(add_sat(a, b), c);
    /* An overlay mount's writes lie on the state dir's disk too: the same budget. */
    for (unsigned i = 0; i < CONCH_SPEC_MOUNTS_MAX; i++) {
        char up[PATH_MAX + 32];
        if ((m->overlays & (1u << i)) &&
            snprintf(up, sizeof(up), "%s/m%u/upper", m->dir, i) < (int)sizeof(up))
            m->charged = add_sat(m->charged, disk_charge(up));
    }
}

static void measure_done(uv_work_t *req, int status)
{
    struct measure *m = req->data;
    struct sandbox *sb = m->sb;
    sb->measuring = false;
    /* A tree that takes long to measure is measured less often: at most half of a worker's
     * time goes to it. */
    uint64_t now = conch_daemon_now_ms();
    sb->next_measure_ms = now + (now - m->started_ms);
    if (status == 0) {
        sb->disk_over = m->charged > sb->disk_bytes;
        /* A copy_in that ended while the tree was walked may be missing from the walk: its
         * room still counts (twice at worst, until the next measurement), so that a copy
         * asked for now finds the sandbox no emptier than it is. */
        sb->disk_charged = add_sat(m->charged, sb->copied_total - m->copied_at_start);
    }
    if (status == 0 && !sandbox_destroyed(sb) && sb->jail && m->charged > sb->disk_bytes) {
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &sb->runs)
        {
            conch_daemon_run_disk_full(conch_list_entry(pos, struct run, link));
        }
    }
    free(m);
    conch_daemon_sandbox_release(sb);
}

/* Measure the upper dir and the spill files of @sb in a worker (one at a time): with
 * hundreds of thousands of files that takes seconds, which the loop must not wait for. */
static void measure_start(struct sandbox *sb)
{
    if (sb->measuring || (!sb->upper_dir[0] && !sb->spill_dir[0]) ||
        conch_daemon_now_ms() < sb->next_measure_ms)
        return;
    struct measure *m = calloc(1, sizeof(*m));
    if (!m)
        return;
    m->req.data = m;
    m->sb = sb;
    m->started_ms = conch_daemon_now_ms();
    m->copied_at_start = sb->copied_total;
    sb->measure_wanted = false;
    if (sb->upper_dir[0])
        snprintf(m->upper, sizeof(m->upper), "%s/upper", sb->upper_dir);
    snprintf(m->dir, sizeof(m->dir), "%s", sb->upper_dir);
    for (unsigned i = 0; sb->upper_dir[0] && i < sb->n_mounts && i < CONCH_SPEC_MOUNTS_MAX; i++)
        if (sb->mounts[i].type == CONCH_MOUNT_OVERLAY)
            m->overlays |= 1u << i;
    snprintf(m->spill, sizeof(m->spill), "%s", sb->spill_dir);
    /* A store's view lies on the state dir's disk between two write-backs: it counts
     * against the sandbox's disk limit as the workspace's changes do. */
    if (conch_daemon_stores_any(sb) &&
        snprintf(m->stores, sizeof(m->stores), "%s/sandboxes/%s/stores", sb->d->state_dir,
                 sb->id) >= (int)sizeof(m->stores))
        m->stores[0] = '\0';
    if (uv_queue_work(&sb->d->loop, &m->req, measure_work, measure_done) < 0) {
        free(m);
        return;
    }
    sb->measuring = true;
    conch_daemon_sandbox_hold(sb);
}

bool conch_daemon_sandbox_changes_none(struct sandbox *sb)
{
    if (!sb->upper_dir[0] || sb->ws_running || !conch_list_empty(&sb->ws_ops))
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

void conch_daemon_sandbox_measure(struct sandbox *sb)
{
    /* Requests coalesce, and the throttle holds (a tree that takes seconds to measure is not
     * measured after every command): one that cannot start now starts from on_sample. */
    if (sb->upper_dir[0] && !sandbox_destroyed(sb)) {
        sb->measure_wanted = true;
        measure_start(sb);
        if (sb->measure_wanted)
            conch_sb_sample_wake(sb);
    }
}

bool conch_daemon_sandbox_disk_refuse(struct sandbox *sb, struct conch_rpc_call *call)
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
    if (sb->jail && sb->measure_wanted)
        measure_start(sb);
    if (!sb->jail || conch_list_empty(&sb->runs)) {
        /* Nothing runs and no measurement waits: the timer sleeps until one does
         * (conch_sb_sample_wake). 1,000 idle sandboxes ticking every SAMPLE_MS were 20,000
         * callbacks a second on the loop. */
        if (!sb->measure_wanted)
            uv_timer_stop(t);
        return;
    }
    unsigned hit = conch_command_sample(sb->jail, &sb->limits);
    if (++sb->samples % DISK_EVERY == 0)
        measure_start(sb);
    if (!hit)
        return;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->runs)
    {
        conch_daemon_run_limit_hit(conch_list_entry(pos, struct run, link), hit);
    }
}

void conch_sb_sample_start(struct sandbox *sb)
{
    if ((sb->sample = calloc(1, sizeof(*sb->sample)))) {
        uv_timer_init(&sb->d->loop, sb->sample);
        sb->sample->data = sb;
        uv_timer_start(sb->sample, on_sample, SAMPLE_MS, SAMPLE_MS);
    }
}

void conch_sb_sample_wake(struct sandbox *sb)
{
    if (sb->sample && !uv_is_active((uv_handle_t *)sb->sample))
        uv_timer_start(sb->sample, on_sample, SAMPLE_MS, SAMPLE_MS);
}

static json_t *spec_json_base(const struct sandbox *sb);

/* Whether the directory @a holds @b or is it (both canonical absolute paths). */
static bool path_holds(const char *a, const char *b)
{
    size_t la = strlen(a);
    return !strcmp(a, "/") || (!strncmp(a, b, la) && (b[la] == '\0' || b[la] == '/'));
}

/* Refuse @path (a bind's source, or a workspace: @what) when it is, holds or lies beneath the
 * daemon's own state directory, or is or holds the directory of its socket: a sandbox that saw
 * them could read every sandbox's record, environment and changes, and, written, rewrite the
 * records the daemon trusts when it starts (a bind, the host's network); unprivileged, the
 * agent is the daemon's uid and could drive it through the socket. (A directory beside the
 * socket, beneath its directory, shows nothing of it.) A path that does not resolve is left
 * to the checks that follow (it cannot be mounted either). */
static int path_clear_of_daemon(const struct daemon *d, const char *what, const char *path,
                                struct conch_err *err)
{
    char p[PATH_MAX], own[2][PATH_MAX];
    if (!path || !realpath(path, p))
        return 0;
    const char *mine[2] = {d->state_dir, d->socket_path};
    for (int i = 0; i < 2; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", mine[i]);
        char *slash = i == 1 ? strrchr(dir, '/') : NULL;
        if (slash)
            *(slash == dir ? slash + 1 : slash) = '\0';
        if (!dir[0] || !realpath(dir, own[i]))
            continue;
        if (path_holds(p, own[i]) || (i == 0 && path_holds(own[i], p)))
            return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                                  "%s '%s' %s the daemon's own %s ('%s'): a sandbox may not "
                                  "see it",
                                  what, path, i == 0 ? "is, holds or lies beneath" : "is or holds",
                                  i == 0 ? "state directory" : "socket directory", own[i]);
    }
    return 0;
}

int conch_daemon_workspace_clear(const struct daemon *d, const char *path, struct conch_err *err)
{
    return path_clear_of_daemon(d, "the workspace", path, err);
}

/* Parse @arr (sandbox.create's "sockets") into @sb's own list, checked now (the socket exists,
 * is the caller's, is none of the daemon's); a record's (@recorded) is taken as it is, and
 * checked again at each start. */
static int sandbox_sockets(struct sandbox *sb, json_t *arr, bool recorded, struct conch_err *err)
{
    if (!arr || json_is_null(arr))
        return 0;
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    int r = 0;
    if (!recorded) {
        r = conch_spec_sockets_from_json(&s, arr, err);
        if (r >= 0)
            r = conch_spec_sockets_clear(s.sockets, s.n_sockets, sb->d->socket_path,
                                         sb->d->state_dir, err);
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v)
        {
            const char *h = json_string_value(json_object_get(v, "host"));
            const char *p = json_string_value(json_object_get(v, "path"));
            struct conch_socket one;
            memset(&one, 0, sizeof(one));
            if (!h || !p || strlen(h) >= sizeof(one.host) || strlen(p) >= sizeof(one.path) ||
                s.n_sockets >= CONCH_SPEC_SOCKETS_MAX) {
                r = conch_err_set(err, EINVAL, "a malformed socket in the record");
                break;
            }
            snprintf(one.host, sizeof(one.host), "%s", h);
            snprintf(one.path, sizeof(one.path), "%s", p);
            struct conch_socket *nl = reallocarray(s.sockets, s.n_sockets + 1, sizeof(*nl));
            if (!nl) {
                r = conch_err_set(err, ENOMEM, "out of memory");
                break;
            }
            s.sockets = nl;
            s.sockets[s.n_sockets++] = one;
        }
    }
    if (r >= 0) {
        free(sb->sockets);
        sb->sockets = s.sockets;
        sb->n_sockets = s.n_sockets;
        s.sockets = NULL;
    }
    conch_spec_done(&s);
    return r;
}

/* Parse @arr (sandbox.create's "mounts", or a record's) into @sb's own list. */
static int sandbox_mounts(struct sandbox *sb, json_t *arr, struct conch_err *err)
{
    if (!arr || json_is_null(arr))
        return 0;
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    int r = conch_spec_mounts_from_json(&s, arr, err);
    for (unsigned i = 0; r >= 0 && i < s.n_mounts; i++) {
        const struct conch_mount *m = &s.mounts[i];
        struct stat st;
        if (m->type == CONCH_MOUNT_BIND)
            r = path_clear_of_daemon(sb->d, "the bind source", m->source, err);
        else if (m->type == CONCH_MOUNT_OVERLAY &&
                 (r = path_clear_of_daemon(sb->d, "the overlay source", m->source, err)) >= 0 &&
                 stat(m->source, &st) == 0) {
            sb->mount_dev[i] = st.st_dev; /* a record's: replaced by its recorded ids */
            sb->mount_ino[i] = st.st_ino;
        }
    }
    if (r >= 0) {
        free(sb->mounts);
        sb->mounts = s.mounts;
        sb->n_mounts = s.n_mounts;
        s.mounts = NULL;
    }
    conch_spec_done(&s);
    return r;
}

/* Parse @readonly and @hidden (sandbox.create's path rules, or a record's) into @sb's own list. */
static int sandbox_rules(struct sandbox *sb, json_t *readonly, json_t *hidden,
                         struct conch_err *err)
{
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    int r = 0;
    if (readonly && !json_is_null(readonly))
        r = conch_spec_rules_from_json(&s, CONCH_RULE_READONLY, readonly, err);
    if (r >= 0 && hidden && !json_is_null(hidden))
        r = conch_spec_rules_from_json(&s, CONCH_RULE_HIDDEN, hidden, err);
    if (r >= 0) {
        free(sb->rules);
        sb->rules = s.rules;
        sb->n_rules = s.n_rules;
        s.rules = NULL;
    }
    conch_spec_done(&s);
    return r;
}

json_t *conch_daemon_sandbox_spec_json(const struct sandbox *sb)
{
    json_t *spec = spec_json_base(sb);
    if (spec)
        conch_daemon_net_json(sb, spec); /* its network: "net", "allow", "deny" */
    if (spec && sb->tenant[0])           /* its owner: a restarted daemon holds it to its tenant */
        json_object_set_new(spec, "tenant", json_string(sb->tenant));
    if (spec && sb->n_mounts) {
        json_t *arr = json_array();
        for (unsigned i = 0; i < sb->n_mounts; i++)
            json_array_append_new(arr, conch_mount_to_json(&sb->mounts[i]));
        json_object_set_new(spec, "mounts", arr);
        /* Its overlay mounts' source identities, by index: kept across a restart. */
        json_t *ids = json_array();
        for (unsigned i = 0; i < sb->n_mounts; i++)
            json_array_append_new(ids, json_pack("[I,I]", (json_int_t)sb->mount_dev[i],
                                                 (json_int_t)sb->mount_ino[i]));
        json_object_set_new(spec, "mount_ids", ids);
    }
    for (int k = CONCH_RULE_READONLY; spec && sb->n_rules && k <= CONCH_RULE_HIDDEN; k++)
        json_object_set_new(
            spec, conch_rule_kind_name((enum conch_rule_kind)k),
            conch_spec_rules_to_json(sb->rules, sb->n_rules, (enum conch_rule_kind)k));
    if (spec && sb->n_sockets) {
        json_t *arr = json_array();
        for (unsigned i = 0; i < sb->n_sockets; i++)
            json_array_append_new(arr, conch_socket_to_json(&sb->sockets[i]));
        json_object_set_new(spec, "sockets", arr);
    }
    return spec;
}

static json_t *spec_json_base(const struct sandbox *sb)
{
    /* Everything sandbox.start needs to bring it back as it was: its limits, and (as root)
     * the host id block that owns its upper dir's files. */
    return json_pack("{s:b,s:I,s:I,s:s?,s:O?,s:I,s:I,s:I,s:I,s:I,s:f,s:I}", "as_root", sb->as_root,
                     "ws_dev", (json_int_t)sb->ws_dev, "ws_ino", (json_int_t)sb->ws_ino, "rootfs",
                     sb->rootfs[0] ? sb->rootfs : NULL, "env", sb->env, "memory",
                     (json_int_t)sb->limits.memory_bytes, "pids", (json_int_t)sb->limits.pids_max,
                     "cpu_milli", (json_int_t)sb->limits.cpu_millicpus, "tmp_size",
                     (json_int_t)sb->tmp_bytes, "disk", (json_int_t)sb->disk_bytes, "idle_timeout",
                     sb->idle_timeout, "host_id_base", (json_int_t)sb->ids.base);
}

int conch_daemon_sandbox_record(struct sandbox *sb, struct conch_err *err)
{
    return record(sb, err);
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
    snprintf(rec.state, sizeof(rec.state), "%s", sb->state == SB_READY ? "running" : "stopped");
    snprintf(rec.upper_dir, sizeof(rec.upper_dir), "%s", sb->upper_dir);
    snprintf(rec.layer, sizeof(rec.layer), "%s", sb->layer);
    json_t *spec = conch_daemon_sandbox_spec_json(sb);
    rec.spec_json = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    rec.warden_pid = sb->jail ? conch_jail_warden_pid(sb->jail) : 0;
    rec.warden_starttime = sb->jail ? conch_recover_starttime(conch_jail_warden_pid(sb->jail)) : 0;
    rec.created_at = sb->created_at;
    rec.last_used_at = sb->last_used_at;
    int r = rec.spec_json ? conch_state_sandbox_put(sb->d->state, &rec, err)
                          : conch_err_set(err, ENOMEM, "out of memory");
    if (r >= 0)
        sb->recorded = true;
    free(rec.spec_json);
    return r;
}

struct sandbox *conch_sb_new(struct daemon *d)
{
    struct sandbox *sb = calloc(1, sizeof(*sb));
    if (!sb)
        return NULL;
    sb->d = d;
    sb->state = SB_NEW;
    conch_jail_ids_init(&sb->ids);
    CONCH_LIST_INIT(&sb->runs);
    CONCH_LIST_INIT(&sb->done_jobs);
    CONCH_LIST_INIT(&sb->files);
    uv_timer_init(&d->loop, &sb->idle);
    sb->idle.data = sb;
    sb->created_at = sb->last_used_at = conch_daemon_now();
    CONCH_LIST_INIT(&sb->ws_ops);
    conch_list_add(&d->sandboxes, &sb->link);
    d->n_sandboxes++;
    conch_daemon_make_id(d, "sb", sb->id, sizeof(sb->id));
    conch_daemon_sandbox_budget_label(sb);
    conch_budget_set_raise_with(&sb->held, "conch serve --max-sandbox-held");
    return sb;
}

void conch_daemon_sandbox_budget_label(struct sandbox *sb)
{
    char label[96];
    snprintf(label, sizeof(label), "sandbox %s", sb->id);
    if (conch_budget_held(&sb->held) == 0)
        conch_budget_init(&sb->held, label, sb->d->opts.max_sandbox_held, &sb->d->held_budget);
    else
        snprintf(sb->held.label, sizeof(sb->held.label), "%s", label);
}

const char *conch_daemon_sandbox_spill_dir(struct sandbox *sb)
{
    struct daemon *d = sb->d;
    if (sb->fresh || sandbox_in_pool(sb))
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

int conch_daemon_sandbox_create(struct daemon *d, const struct sandbox_spec *spec,
                                struct sandbox **ret, struct conch_err *err)
{
    if (d->n_sandboxes >= d->opts.max_sandboxes)
        return conch_err_setk(err, CONCH_ERR_LIMIT, EMFILE,
                              "too many sandboxes (%u, --max-sandboxes): destroy some first",
                              d->opts.max_sandboxes);
    /* A tenant's quotas are checked before anything is made (tenants.c). */
    const char *tenant = spec->tenant ? spec->tenant : conch_daemon_tenant_viewer(d);
    uint64_t memory = spec->limits.memory_bytes, disk = spec->disk_bytes;
    int r;
    if (tenant[0] && (r = conch_daemon_tenant_admit(d, tenant, &memory, &disk, err)) < 0)
        return r;
    struct sandbox *sb = conch_sb_new(d);
    if (!sb)
        return conch_err_set(err, ENOMEM, "out of memory");
    snprintf(sb->tenant, sizeof(sb->tenant), "%s", tenant);
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
    sb->limits.memory_bytes = memory;
    sb->tmp_bytes = spec->tmp_bytes;
    sb->disk_bytes = disk ? disk : CONCH_SPEC_DISK_DEFAULT;
    sb->env = spec->env ? json_deep_copy(spec->env) : json_object();
    sb->idle_timeout = spec->idle_timeout >= 0 ? spec->idle_timeout : d->opts.idle_timeout;
    sb->tool_timeout = spec->tool_timeout;
    sb->max_tool_calls = spec->max_tool_calls;
    if (spec->layer)
        snprintf(sb->layer, sizeof(sb->layer), "%s", spec->layer);
    /* A tenant's workspace is the daemon's own empty directory for it (tenants.c): the one
     * path under the state directory a sandbox may stand on. */
    char tws[PATH_MAX] = "";
    if (tenant[0] && spec->workspace &&
        conch_daemon_tenant_workspace(d, tenant, tws, sizeof(tws), err) < 0)
        tws[0] = '\0';
    bool tenant_ws = tws[0] && spec->workspace && !strcmp(spec->workspace, tws);
    if ((!tenant_ws && (r = path_clear_of_daemon(d, "the workspace", spec->workspace, err)) < 0) ||
        (r = sandbox_mounts(sb, spec->mounts, err)) < 0 ||
        (r = sandbox_rules(sb, spec->readonly, spec->hidden, err)) < 0 ||
        (r = sandbox_sockets(sb, spec->sockets, false, err)) < 0 ||
        (r = conch_net_policy_copy(&sb->net, &spec->net, err)) < 0)
        goto fail;
    /* An overlay mount's upper sits beside the workspace's (<state>/sandboxes/<id>/m<i>): that
     * dir is made for it whatever the workspace's mode. */
    bool overlays = false;
    for (unsigned i = 0; i < sb->n_mounts; i++)
        overlays |= sb->mounts[i].type == CONCH_MOUNT_OVERLAY;
    if ((spec->workspace && spec->mode == CONCH_WS_OVERLAY) || overlays) {
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
    if ((r = conch_daemon_sandbox_start(sb, err)) < 0)
        goto fail;
    /* A sandbox that is not recorded would be unknown after a restart, its changes
     * orphaned: better not to have it. */
    if ((r = record(sb, err)) < 0) {
        conch_err_wrap(err, "cannot record the sandbox in the state directory '%s'", d->state_dir);
        conch_sb_destroy_why(sb, "it could not be recorded");
        return r;
    }
    conch_daemon_sandbox_touch(sb);
    *ret = sb;
    return 0;
fail:
    conch_daemon_sandbox_destroy(sb); /* the directory goes with it */
    return r;
}

/* Destroy @sb (its commands and requests failing with @why), then @gone(@arg) once its
 * warden is gone and its directory removed. */
static void destroy(struct sandbox *sb, const char *why, void (*gone)(void *arg), void *arg)
{
    if (sandbox_destroyed(sb)) {
        if (gone)
            gone(arg);
        return;
    }
    sb->gone = gone;
    sb->gone_arg = arg;
    conch_sb_set_state(sb, SB_STOPPING, why);
    conch_sb_set_state(sb, SB_GONE, NULL);
}

void conch_daemon_sandbox_destroy_keep_record(struct sandbox *sb)
{
    if (sandbox_destroyed(sb))
        return;
    sb->keep_dir = sb->recorded && !sb->fresh; /* a kept record keeps its changes */
    destroy(sb, "the daemon is shutting down", NULL, NULL);
}

void conch_daemon_sandbox_destroy(struct sandbox *sb)
{
    destroy(sb, "the sandbox was destroyed", NULL, NULL);
}

void conch_sb_destroy_why(struct sandbox *sb, const char *why)
{
    destroy(sb, why, NULL, NULL);
}

void conch_daemon_sandbox_destroy_then(struct sandbox *sb, void (*gone)(void *arg), void *arg)
{
    destroy(sb, "the sandbox was destroyed", gone, arg);
}

/* ---- what a previous daemon left ---- */

void conch_daemon_sandboxes_recover(struct daemon *d)
{
    struct conch_state_sandbox *list = NULL;
    size_t n = 0;
    struct conch_err err = {0};
    if (conch_state_sandbox_list(d->state, &list, &n, &err) < 0) {
        log_warn("list recorded sandboxes: %s", err.msg);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct sandbox *sb = conch_sb_new(d);
        if (!sb)
            break;
        snprintf(sb->id, sizeof(sb->id), "%s", list[i].id);
        snprintf(sb->name, sizeof(sb->name), "%s", list[i].name);
        snprintf(sb->workspace, sizeof(sb->workspace), "%s", list[i].workspace);
        conch_ws_mode_parse(list[i].mode[0] ? list[i].mode : "overlay", &sb->mode, NULL);
        snprintf(sb->upper_dir, sizeof(sb->upper_dir), "%s", list[i].upper_dir);
        snprintf(sb->layer, sizeof(sb->layer), "%s", list[i].layer);
        sb->created_at = list[i].created_at;
        sb->last_used_at = list[i].last_used_at;
        json_t *spec = list[i].spec_json ? json_loads(list[i].spec_json, 0, NULL) : NULL;
        const char *tenant = json_string_value(json_object_get(spec, "tenant"));
        snprintf(sb->tenant, sizeof(sb->tenant), "%s", tenant ? tenant : "");
        sb->as_root = json_is_true(json_object_get(spec, "as_root"));
        sb->ws_dev = (dev_t)json_integer_value(json_object_get(spec, "ws_dev"));
        sb->ws_ino = (ino_t)json_integer_value(json_object_get(spec, "ws_ino"));
        const char *rootfs = json_string_value(json_object_get(spec, "rootfs"));
        if (rootfs)
            snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
        json_t *env = json_object_get(spec, "env");
        sb->env = json_is_object(env) ? json_incref(env) : json_object();
        if (sandbox_mounts(sb, json_object_get(spec, "mounts"), &err) < 0)
            log_warn("sandbox %s: its recorded mounts: %s", list[i].id, err.msg);
        json_t *ids = json_object_get(spec, "mount_ids");
        for (unsigned k = 0; k < sb->n_mounts && k < CONCH_SPEC_MOUNTS_MAX; k++) {
            json_t *id = json_array_get(ids, k);
            sb->mount_dev[k] = (dev_t)json_integer_value(json_array_get(id, 0));
            sb->mount_ino[k] = (ino_t)json_integer_value(json_array_get(id, 1));
        }
        /* A record whose rules do not parse must not start without them. */
        if (sandbox_rules(sb, json_object_get(spec, "readonly"), json_object_get(spec, "hidden"),
                          &err) < 0) {
            log_warn("sandbox %s: its recorded path rules: %s", list[i].id, err.msg);
            sb->rules_unreadable = true;
        }
        if (sandbox_sockets(sb, json_object_get(spec, "sockets"), true, &err) < 0)
            log_warn("sandbox %s: its recorded sockets: %s", list[i].id, err.msg);
        conch_daemon_net_from_record(sb->id, spec, &sb->net);
        sb->limits.memory_bytes = (uint64_t)json_integer_value(json_object_get(spec, "memory"));
        sb->limits.pids_max = (uint64_t)json_integer_value(json_object_get(spec, "pids"));
        sb->limits.cpu_millicpus = (uint64_t)json_integer_value(json_object_get(spec, "cpu_milli"));
        sb->tmp_bytes = (uint64_t)json_integer_value(json_object_get(spec, "tmp_size"));
        sb->disk_bytes = (uint64_t)json_integer_value(json_object_get(spec, "disk"));
        /* Its upper dir's files are owned by its host id block: held while it is stopped, so
         * that no pool sandbox takes it before sandbox.start brings it back. */
        json_int_t base = json_integer_value(json_object_get(spec, "host_id_base"));
        if (base > 0 && geteuid() == 0 &&
            conch_jail_ids_claim_base((uint32_t)base, &sb->ids, &err) < 0)
            log_warn("sandbox %s: %s ('conch start' cannot bring it back)", list[i].id, err.msg);
        json_decref(spec);
        sb->recorded = true;
        /* Its jobs' spill files: removed with it. */
        char spill[PATH_MAX];
        struct stat st;
        int len = snprintf(spill, sizeof(spill), "%s/sandboxes/%s/spill", d->state_dir, sb->id);
        if (len > 0 && (size_t)len < sizeof(spill) && lstat(spill, &st) == 0 && S_ISDIR(st.st_mode))
            snprintf(sb->spill_dir, sizeof(sb->spill_dir), "%s", spill);
        sb->idle_timeout = 0;                     /* stopped: nothing to reclaim but the record */
        conch_sb_set_state(sb, SB_STOPPED, NULL); /* recorded as such */
    }
    conch_state_sandbox_free_list(list, n);
}

int conch_daemon_sandbox_resume(struct sandbox *sb, struct conch_err *err)
{
    if (sb->state == SB_READY)
        return 0;
    if (sb->state != SB_STOPPED)
        return conch_err_set(err, EBUSY, "sandbox '%s' is being restarted: try again", sb->id);
    struct conch_state_sandbox rec;
    memset(&rec, 0, sizeof(rec));
    int r = conch_state_sandbox_get(sb->d->state, sb->id, &rec, err);
    if (r < 0)
        return conch_err_wrap(err, "sandbox '%s': its record", sb->id);
    json_t *spec = rec.spec_json ? json_loads(rec.spec_json, 0, NULL) : NULL;
    json_int_t base = json_integer_value(json_object_get(spec, "host_id_base"));
    double idle = json_number_value(json_object_get(spec, "idle_timeout"));
    json_decref(spec);
    conch_state_sandbox_done(&rec);
    /* As root, its files belong to its own host ids: with other ids it could not use them. */
    if (geteuid() == 0 && base > 0 && sb->ids.base != (uint32_t)base) {
        conch_jail_ids_release(&sb->ids);
        if ((r = conch_jail_ids_claim_base((uint32_t)base, &sb->ids, err)) < 0)
            return conch_err_wrap(err, "sandbox '%s' cannot be started with its files' owners",
                                  sb->id);
    }
    struct stat st;
    if (sb->upper_dir[0] && (lstat(sb->upper_dir, &st) < 0 || !S_ISDIR(st.st_mode)))
        return conch_err_set(err, ENOENT, "sandbox '%s': its changes' directory '%s' is gone",
                             sb->id, sb->upper_dir);
    if ((r = conch_sb_spawn(sb, false, err)) < 0)
        return conch_err_wrap(err, "start sandbox '%s'", sb->id);
    sb->idle_timeout = idle > 0 ? idle : 0;
    if ((r = record(sb, err)) < 0)
        log_warn("sandbox %s: record it as running: %s", sb->id, err->msg);
    conch_daemon_sandbox_touch(sb);
    return 0;
}
