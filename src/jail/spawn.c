/* spawn.c - the parent side of a sandbox's life: prepare the plan, clone the warden into new
 * namespaces, write its id maps, put it in a cgroup, await its setup, and destroy it. What is
 * asked of a running sandbox is in jail-ops.c. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fdpass.h"
#include "core/fsutil.h"
#include "jail/jail-internal.h"
#include "jail/spec-internal.h"

#define STAGE_ROOT CONCH_JAIL_STAGE_ROOT

int conch_jail_send(int fd, struct jail_msg *m, const int *fds, int nfds)
{
    m->version = JAIL_PROTO_VERSION;
    ssize_t n = conch_send_fds(fd, m, sizeof(*m), fds, nfds, 0);
    if (n < 0)
        return (int)n;
    return n == (ssize_t)sizeof(*m) ? 0 : -EPROTO;
}

int conch_jail_recv(int fd, struct jail_msg *m, int *fds, int max_fds, int *ret_nfds, int flags)
{
    ssize_t n = conch_recv_fds(fd, m, sizeof(*m), fds, max_fds, ret_nfds, flags);
    if (n <= 0)
        return (int)n;
    if (n != (ssize_t)sizeof(*m) || m->version != JAIL_PROTO_VERSION) {
        for (int i = 0; i < *ret_nfds; i++)
            close(fds[i]);
        *ret_nfds = 0;
        return -EPROTO;
    }
    return 1;
}

static void write_proc_file(pid_t pid, const char *name, const char *text)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (write(fd, text, strlen(text)) < 0) {
        /* best effort: without it an OOM kill may pick the warden */
    }
    close(fd);
}

/* Host root: sandbox processes are unprivileged host ids, which may not traverse the
 * directories above the workspace or --rootfs (a 0700 home or temp dir). So both are cloned
 * with open_tree() while we are still root and attached in a staging dir that only exists
 * in conch's own private mount namespace (the clone child inherits a copy of it). */
int conch_jail_stage_prepare(struct conch_err *err)
{
    static bool have_private_ns;
    int r;
    if (have_private_ns)
        return 0;
    if ((r = conch_mkdir_p(STAGE_ROOT, 0711, err)) < 0)
        return r;
    if (unshare(CLONE_NEWNS) < 0)
        return conch_err_set(err, errno, "unshare a private mount namespace for staging: %s",
                             strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return conch_err_set(err, errno, "make mounts private: %s", strerror(errno));
    if (mount("tmpfs", STAGE_ROOT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0711,size=64k") < 0)
        return conch_err_set(err, errno, "mount staging tmpfs on '%s': %s", STAGE_ROOT,
                             strerror(errno));
    have_private_ns = true;
    return 0;
}

int conch_jail_host_prepare(struct conch_err *err)
{
    int r = conch_jail_clean_image_prepare(err);
    if (r < 0)
        return r;
    return geteuid() == 0 ? conch_jail_stage_prepare(err) : 0;
}

static int stage_tree(int tree, char *dir, size_t dir_size, const char *name, struct conch_err *err)
{
    snprintf(dir, dir_size, STAGE_ROOT "/%s", name);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", dir, strerror(errno));
    return conch_jail_stage_attach(tree, dir, err);
}

/* The idmapped workspace is not staged in a mount namespace of ours: the tree is kept and
 * sent to the warden with its go-ahead, which attaches it in its new root (setup_workspace).
 * No private mount namespace, staging tmpfs or bind for it on conch run's path. */
static int stage_workspace(struct conch_jail *j, const struct conch_jail_spec *spec,
                           struct conch_err *err)
{
    /* The tree is cloned by path (a mount of another mount namespace, as host_ws_fd's may
     * be, cannot be cloned here), then checked to be the very directory host_ws_fd is, which
     * was checked against the caller's record: a workspace swapped meanwhile is refused. */
    _cleanup_close_ int tree =
        conch_jail_idmapped_tree(spec->workspace, j->host_id_base, false, j->ws_owner_uid,
                                 j->ws_owner_gid, spec->ws_mode == CONCH_WS_RO, err);
    if (tree < 0)
        return tree;
    struct stat a, b;
    if (fstat(tree, &a) < 0 || fstat(j->host_ws_fd, &b) < 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino)
        return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                              "workspace '%s' changed while the sandbox was being built (it was "
                              "replaced, or swapped for a link): refusing it",
                              spec->workspace);
    j->ws_tree_fd = TAKE_FD(tree);
    return 0;
}

static int stage_rootfs(struct conch_jail *j, const char *rootfs, struct conch_err *err)
{
    int r;
    if ((r = conch_jail_stage_prepare(err)) < 0)
        return r;
    _cleanup_close_ int tree =
        conch_jail_idmapped_tree(rootfs, j->host_id_base, true, 0, 0, true, err);
    if (tree < 0)
        return conch_err_wrap(err, "--rootfs");
    char name[80];
    snprintf(name, sizeof(name), "%s-rootfs", j->name);
    if ((r = stage_tree(tree, j->root_stage_dir, sizeof(j->root_stage_dir), name, err)) < 0)
        return r;
    j->mounted_root_stage = true;
    return 0;
}

/* Take the staged binds out of our mount namespace. The warden bound them into its own
 * while it built its root: once it reported its setup they are its, and ours only cost every
 * later clone of our namespace (a daemon's 1,000 sandboxes left 2,000 mounts in it, and each
 * new warden's clone copied them all). */
static void unstage(struct conch_jail *j)
{
    if (j->mounted_upper_stage) {
        umount2(j->upper_stage_dir, MNT_DETACH);
        rmdir(j->upper_stage_dir);
        j->mounted_upper_stage = false;
    }
    if (j->mounted_root_stage) {
        umount2(j->root_stage_dir, MNT_DETACH);
        rmdir(j->root_stage_dir);
        j->mounted_root_stage = false;
    }
    for (; j->n_mount_stages > 0; j->n_mount_stages--) {
        char dir[320];
        snprintf(dir, sizeof(dir), STAGE_ROOT "/%s-m%d", j->name, j->n_mount_stages - 1);
        umount2(dir, MNT_DETACH);
        rmdir(dir);
    }
    for (; j->n_socket_stages > 0; j->n_socket_stages--) {
        char file[320];
        snprintf(file, sizeof(file), STAGE_ROOT "/%s-s%d", j->name, j->n_socket_stages - 1);
        umount2(file, MNT_DETACH);
        unlink(file);
    }
    for (; j->n_layer_stages > 0; j->n_layer_stages--) {
        char dir[320];
        snprintf(dir, sizeof(dir), STAGE_ROOT "/%s-l%d", j->name, j->n_layer_stages - 1);
        umount2(dir, MNT_DETACH);
        rmdir(dir);
    }
}

/* The on-disk upper dir may sit under directories the sandbox's host ids cannot traverse
 * (a 0700 state dir): stage a bind of it like the workspace. */
static int stage_upper(struct conch_jail *j, const char *upper_dir, struct conch_err *err)
{
    int r;
    if ((r = conch_jail_stage_prepare(err)) < 0)
        return r;
    _cleanup_close_ int tree =
        (int)syscall(SYS_open_tree, AT_FDCWD, upper_dir,
                     OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
    if (tree < 0)
        return conch_err_set(err, errno, "open_tree '%s': %s", upper_dir, strerror(errno));
    char name[80];
    snprintf(name, sizeof(name), "%s-upper", j->name);
    if ((r = stage_tree(tree, j->upper_stage_dir, sizeof(j->upper_stage_dir), name, err)) < 0)
        return r;
    j->mounted_upper_stage = true;
    return 0;
}

/* Host root: a frozen layer's files belong to the host id block of the sandbox that wrote
 * it, which this sandbox's ids cannot use (and the state dir above it is 0700): each layer
 * is cloned read-only, idmapped from that block onto this sandbox's, and staged. */
static int stage_layers(struct conch_jail *j, const struct conch_jail_spec *spec,
                        struct conch_err *err)
{
    int r;
    if ((r = conch_jail_stage_prepare(err)) < 0)
        return r;
    /* One idmapping per host id block the layers come from (each costs a fork): a stack is
     * mostly one sandbox's own layers. */
    _cleanup_close_ int userns = -1;
    uint32_t userns_from = 0;
    for (int i = 0; i < spec->n_layers; i++) {
        const struct conch_jail_layer *l = &spec->layers[i];
        uint32_t from = l->id_base ? l->id_base : j->host_id_base;
        if (userns < 0 || from != userns_from) {
            if (userns >= 0)
                close(userns);
            userns = conch_jail_idmap_userns_shift(from, j->host_id_base, err);
            userns_from = from;
        }
        if (userns < 0)
            return conch_err_wrap(err, "snapshot layer '%s'", l->dir);
        _cleanup_close_ int tree = conch_jail_idmapped_tree_in(l->dir, userns, false, true, err);
        if (tree < 0)
            return conch_err_wrap(err, "snapshot layer '%s'", l->dir);
        char name[96], dir[256];
        snprintf(name, sizeof(name), "%s-l%d", j->name, i);
        if ((r = stage_tree(tree, dir, sizeof(dir), name, err)) < 0)
            return r;
        j->n_layer_stages = i + 1;
    }
    return 0;
}

/* Host root: a bind mount's source is cloned and idmapped like the workspace (its owner shown
 * as the command's user, others as nobody) and staged: the sandbox's ids could not traverse
 * the dirs above it. Read-only unless asked. */
static int stage_mounts(struct conch_jail *j, const struct conch_jail_spec *spec,
                        struct conch_err *err)
{
    int r;
    if ((r = conch_jail_stage_prepare(err)) < 0)
        return r;
    for (unsigned i = 0; i < spec->n_mounts; i++) {
        const struct conch_mount *m = &spec->mounts[i];
        if (m->type == CONCH_MOUNT_TMPFS)
            continue; /* a bind or a store's view: a host dir */
        struct stat st;
        if (stat(m->source, &st) < 0 || !S_ISDIR(st.st_mode))
            return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR,
                                  "mount source '%s': not a directory", m->source);
        _cleanup_close_ int tree = conch_jail_idmapped_tree(m->source, j->host_id_base, false,
                                                            st.st_uid, st.st_gid, !m->rw, err);
        if (tree < 0)
            return conch_err_wrap(err, "mount '%s'", m->target);
        struct stat tst;
        if (fstat(tree, &tst) < 0 || tst.st_dev != st.st_dev || tst.st_ino != st.st_ino)
            return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                                  "mount source '%s' changed while the sandbox was being built",
                                  m->source);
        char name[96], dir[256];
        snprintf(name, sizeof(name), "%s-m%u", j->name, i);
        if ((r = stage_tree(tree, dir, sizeof(dir), name, err)) < 0)
            return r;
        j->n_mount_stages = (int)i + 1;
    }
    return 0;
}

static int plan_mounts(struct conch_jail *j, const struct conch_jail_spec *spec,
                       struct jail_plan *plan, struct conch_err *err)
{
    if (spec->n_mounts > CONCH_SPEC_MOUNTS_MAX)
        return conch_err_set(err, E2BIG, "at most %d mounts", CONCH_SPEC_MOUNTS_MAX);
    uint64_t tmpfs_left = spec->limits.memory_bytes / 2; /* tmpfs is memory: as /tmp */
    for (unsigned i = 0; i < spec->n_mounts; i++) {
        const struct conch_mount *m = &spec->mounts[i];
        int r = conch_mount_check(m, err);
        if (r < 0)
            return r;
        struct jail_mount *pm = &plan->mounts[i];
        pm->type = (int)m->type;
        pm->rw = m->rw;
        pm->bytes = m->bytes;
        if (m->type == CONCH_MOUNT_TMPFS && spec->limits.memory_bytes && pm->bytes > tmpfs_left)
            pm->bytes = tmpfs_left > CONCH_SPEC_SIZE_MIN ? tmpfs_left : CONCH_SPEC_SIZE_MIN;
        if (m->type == CONCH_MOUNT_TMPFS) /* (not 0 above: 0 would be no limit) */
            tmpfs_left -= pm->bytes < tmpfs_left ? pm->bytes : tmpfs_left;
        snprintf(pm->dst, sizeof(pm->dst), "%s", m->target);
        /* Its upper sits beside the workspace's (on disk, or in the overlay workspace's tmpfs) */
        if (m->type == CONCH_MOUNT_OVERLAY && !plan->upper_on_disk &&
            (!spec->workspace || spec->ws_mode != CONCH_WS_OVERLAY))
            return conch_err_setk(err, CONCH_ERR_USAGE, EOPNOTSUPP,
                                  "mount '%s': an overlay mount needs --mode overlay", m->target);
        if (m->type != CONCH_MOUNT_TMPFS && !m->source[0])
            return conch_err_set(err, EINVAL, "mount '%s': a store's view was not made", m->target);
        if (m->type != CONCH_MOUNT_TMPFS && j->root_mode)
            snprintf(pm->src, sizeof(pm->src), "/oldroot" STAGE_ROOT "/%s-m%u", j->name, i);
        else if (m->type != CONCH_MOUNT_TMPFS)
            snprintf(pm->src, sizeof(pm->src), "/oldroot%s", m->source);
    }
    plan->n_mounts = (int)spec->n_mounts;
    return 0;
}

static int rule_cmp(const void *a, const void *b)
{
    return strcmp(((const struct jail_rule *)a)->path, ((const struct jail_rule *)b)->path);
}

/* The path rules, sorted by path so that a parent comes before what lies beneath it (the
 * warden pins each parent once, before anything is mounted beneath it). */
static int plan_rules(const struct conch_jail_spec *spec, struct jail_plan *plan,
                      struct conch_err *err)
{
    if (spec->n_rules > CONCH_SPEC_RULES_MAX)
        return conch_err_set(err, E2BIG, "at most %d path rules", CONCH_SPEC_RULES_MAX);
    if (spec->n_rules && spec->attachable)
        return conch_err_set(err, EINVAL, "a sandbox with path rules cannot be lent");
    for (unsigned i = 0; i < spec->n_rules; i++) {
        struct jail_rule *pr = &plan->rules[i];
        int r = conch_rule_path_normalize(spec->rules[i].path, pr->path, sizeof(pr->path), err);
        if (r < 0)
            return r;
        pr->kind = (int)spec->rules[i].kind;
    }
    plan->n_rules = (int)spec->n_rules;
    qsort(plan->rules, spec->n_rules, sizeof(plan->rules[0]), rule_cmp);
    return 0;
}

static bool path_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return path[0] == '/';
    return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* A bind mount's source that shows a rule's path (the workspace beneath it, or a dir of the
 * workspace at, above or beneath a rule's path) would show it without the rule's cover: a
 * hidden .env read at /data/.env. Refused; compared by real paths. */
static int check_mounts_rules(const struct conch_jail_spec *spec, struct conch_err *err)
{
    char ws[PATH_MAX], src[PATH_MAX];
    if (!spec->n_rules || !spec->workspace || !realpath(spec->workspace, ws))
        return 0;
    for (unsigned i = 0; i < spec->n_mounts; i++) {
        const struct conch_mount *m = &spec->mounts[i];
        if ((m->type != CONCH_MOUNT_BIND && m->type != CONCH_MOUNT_OVERLAY) ||
            !realpath(m->source, src))
            continue;
        const char *hit = NULL;
        if (path_under(ws, src)) {
            hit = spec->rules[0].path;
        } else if (path_under(src, ws)) {
            const char *rel = src + strlen(ws) + (strcmp(ws, "/") ? 1 : 0);
            for (unsigned k = 0; !hit && k < spec->n_rules; k++) {
                const char *p = spec->rules[k].path;
                if (path_under(p, rel) || path_under(rel, p))
                    hit = p;
            }
        }
        if (hit)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount '%s': its source '%s' shows the workspace's '%s', which a "
                                  "path rule protects, without the rule: bind a directory that "
                                  "holds no rule's path",
                                  m->target, m->source, hit);
    }
    return 0;
}

/* The frozen layers as overlayfs's lowerdir wants them, top first, each followed by ':'. */
static int plan_layers(struct conch_jail *j, const struct conch_jail_spec *spec,
                       struct jail_plan *plan, struct conch_err *err)
{
    size_t off = 0;
    for (int i = 0; i < spec->n_layers; i++) {
        char one[PATH_MAX + 32];
        if (j->root_mode)
            snprintf(one, sizeof(one), "/oldroot" STAGE_ROOT "/%s-l%d:", j->name, i);
        else
            snprintf(one, sizeof(one), "/oldroot%s:", spec->layers[i].dir);
        /* overlayfs splits its options at ',' and its lower dirs at ':'. */
        if (strpbrk(one + 8, ",\\") || strchr(one + 8, ':') != one + strlen(one) - 1)
            return conch_err_set(err, EINVAL,
                                 "snapshot layer '%s': a path with ',', ':' or '\\' cannot be "
                                 "stacked by overlayfs",
                                 spec->layers[i].dir);
        size_t n = strlen(one);
        if (off + n + 1 > sizeof(plan->ws_layers))
            return conch_err_set(err, ENAMETOOLONG,
                                 "%d snapshot layers: their paths are too long for one overlay "
                                 "mount (a shorter state dir helps)",
                                 spec->n_layers);
        memcpy(plan->ws_layers + off, one, n + 1);
        off += n;
    }
    return 0;
}

static int build_plan(struct conch_jail *j, const struct conch_jail_spec *spec,
                      struct jail_plan *plan, struct conch_err *err)
{
    int r;
    plan->root_mode = j->root_mode;
    if (j->root_mode) {
        plan->warden_uid = plan->warden_gid = 0;
        plan->can_setgroups = true;
    } else {
        plan->warden_uid = spec->as_root ? 0 : CONCH_AGENT_UID;
        plan->warden_gid = spec->as_root ? 0 : CONCH_AGENT_GID;
    }
    plan->cmd_uid = spec->as_root ? 0 : CONCH_AGENT_UID;
    plan->cmd_gid = spec->as_root ? 0 : CONCH_AGENT_GID;
    /* Root of the namespace keeps what a container's root usually keeps; the mount family,
     * module loading, raw I/O, time and the like stay out of reach. Not CAP_SETFCAP: a
     * security.capability xattr written here becomes a valid host file capability through
     * the idmapped mount; not CAP_FSETID: set-id bits must not survive writes and chown. */
    if (spec->as_root)
        plan->keep_caps = (1ULL << 0) | (1ULL << 1) | (1ULL << 3) | (1ULL << 5) | (1ULL << 6) |
                          (1ULL << 7) | (1ULL << 8) | (1ULL << 10) | (1ULL << 18) | (1ULL << 29);
    snprintf(plan->passwd, sizeof(plan->passwd),
             "root:x:0:0:root:/root:/bin/bash\n"
             "agent:x:%d:%d:agent:/home/agent:/bin/bash\n"
             "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
             CONCH_AGENT_UID, CONCH_AGENT_GID);
    snprintf(plan->group, sizeof(plan->group),
             "root:x:0:\ntty:x:5:\nagent:x:%d:\nnogroup:x:65534:\n", CONCH_AGENT_GID);
    if ((r = conch_jail_plan_rootfs(plan, spec->rootfs,
                                    j->mounted_root_stage ? j->root_stage_dir : NULL, err)) < 0)
        return r;
    plan->tmp_bytes = spec->tmp_bytes;
    plan->home_bytes = spec->home_bytes;
    /* Files in /tmp and the home are memory, charged to the sandbox's memory cgroup and never
     * reclaimable without swap: with a memory limit they may hold at most half of it, or a
     * full /tmp would leave the cgroup out of memory for good, every allocation an OOM kill. */
    if (spec->limits.memory_bytes) {
        uint64_t half = spec->limits.memory_bytes / 2;
        if (plan->tmp_bytes > half)
            plan->tmp_bytes = half;
        if (plan->home_bytes > half / 2)
            plan->home_bytes = half / 2;
    }
    plan->disk_bytes = spec->disk_bytes;
    plan->seccomp = &j->seccomp;
    plan->seccomp_file = &j->seccomp_file;
    plan->seccomp_js = &j->seccomp_js;
    plan->rlimit_fsize = spec->file_bytes;
    plan->rlimit_nofile = spec->nofile;
    plan->file_handler = spec->file_handler;
    plan->file_server = spec->file_handler ? spec->file_server : NULL;
    plan->js_server = spec->js_server;
    plan->ptc_socket = spec->ptc_socket;
    plan->attachable = spec->attachable;
    plan->net = spec->net;
    if (plan->net == CONCH_NET_HOST) {
        /* The host's resolver for the host's network; read here: the child cannot. */
        int fd = open("/etc/resolv.conf", O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, plan->resolv, sizeof(plan->resolv) - 1) : -1;
        plan->resolv[n > 0 ? n : 0] = '\0';
        if (fd >= 0)
            close(fd);
    }
    if (spec->ptc_dir) {
        if (spec->ptc_dir[0] != '/' || strlen(spec->ptc_dir) + 9 >= sizeof(plan->ptc_lib))
            return conch_err_set(err, EINVAL, "tool bridge dir '%s': not an absolute path",
                                 spec->ptc_dir);
        snprintf(plan->ptc_lib, sizeof(plan->ptc_lib), "/oldroot%s", spec->ptc_dir);
    }
    if (spec->upper_dir) {
        plan->upper_on_disk = true;
        snprintf(plan->upper_dir, sizeof(plan->upper_dir), "/oldroot%s",
                 j->mounted_upper_stage ? j->upper_stage_dir : spec->upper_dir);
    }
    if (spec->n_layers > 0 && (r = plan_layers(j, spec, plan, err)) < 0)
        return r;
    if ((r = plan_mounts(j, spec, plan, err)) < 0 || (r = plan_rules(spec, plan, err)) < 0 ||
        (r = check_mounts_rules(spec, err)) < 0 ||
        (r = conch_jail_sockets_plan(j, spec, plan, err)) < 0)
        return r;
    if (spec->workspace) {
        plan->has_workspace = true;
        plan->ws_mode = spec->ws_mode;
        /* Root mode: the warden attaches the tree we send it (ws_tree_fd) instead. */
        snprintf(plan->ws_lower, sizeof(plan->ws_lower), "/oldroot%s", spec->workspace);
    }
    /* A process limit always holds: the cgroup's when one was asked for, else RLIMIT_NPROC
     * (counted per user namespace since Linux 5.14, so it bounds the sandbox's processes, not
     * the caller's), CONCH_DEFAULT_PIDS when the caller gave none, also beside a cgroup made
     * for memory or CPU only. */
    /* At most that many processes in the sandbox's pid namespace, whatever their uids (the
     * kernel's smallest pid_max is 301; a smaller limit is the cgroup's or the rlimit's). */
    long pids = (long)(spec->limits.pids_max ? spec->limits.pids_max : CONCH_DEFAULT_PIDS) + 1;
    plan->pid_max = pids < 301 ? 301 : pids;
    if (!j->has_cgroup || !spec->limits.pids_max) {
        plan->set_rlimit_nproc = true;
        plan->rlimit_nproc = spec->limits.pids_max ? spec->limits.pids_max : CONCH_DEFAULT_PIDS;
    }
    if (!j->has_cgroup) {
        /* Memory is then watched by the caller (conch_jail_usage); RLIMIT_AS is only a
         * backstop against an allocation burst between two samples. It limits address
         * space, not memory, so it is set well above the limit. */
        if (spec->limits.memory_bytes) {
            plan->set_rlimit_as = true;
            uint64_t m = spec->limits.memory_bytes;
            plan->rlimit_as = m * 4 > m + (512ULL << 20) ? m * 4 : m + (512ULL << 20);
        }
    }
    return 0;
}

/* The seccomp programs depend only on the mode and the purpose (a command, or a file worker
 * that may also use openat2), and compiling one with libseccomp costs a few hundred
 * microseconds: a long-lived caller compiles each once and copies it. */
static int seccomp_prog_for(bool as_root, int purpose, struct conch_seccomp_prog *ret,
                            struct conch_err *err)
{
    static struct conch_seccomp_prog cache[2][3];
    struct conch_seccomp_prog *c = &cache[as_root][purpose];
    if (!c->insns) {
        struct conch_seccomp_opts sopts = {
            .as_root = as_root, .file_worker = purpose >= 1, .js_worker = purpose == 2};
        int r = conch_seccomp_prog_build(&sopts, c, err);
        if (r < 0)
            return r;
    }
    ret->insns = malloc(c->len * sizeof(*c->insns));
    if (!ret->insns)
        return conch_err_set(err, ENOMEM, "out of memory");
    memcpy(ret->insns, c->insns, c->len * sizeof(*c->insns));
    ret->len = c->len;
    return 0;
}

/* Open @path as @j's host workspace (host_ws_fd, its owner's ids; *@ret_st when not NULL),
 * refusing a directory other than @dev/@ino when @ino is not 0: one that replaced it, or a
 * link swapped in. Returns 0 or -errno with @err (usage). */
int conch_jail_open_workspace(struct conch_jail *j, const char *path, dev_t dev, ino_t ino,
                              struct stat *ret_st, struct conch_err *err)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return conch_err_setk(err, CONCH_ERR_USAGE, e, "workspace '%s': %s", path, strerror(e));
    }
    if (ino && (st.st_dev != dev || st.st_ino != ino)) {
        close(fd);
        return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                              "workspace '%s' is not the directory it was (it was replaced, or "
                              "swapped for a link): refusing it",
                              path);
    }
    j->host_ws_fd = fd;
    j->ws_owner_uid = st.st_uid;
    j->ws_owner_gid = st.st_gid;
    if (ret_st)
        *ret_st = st;
    return 0;
}

/* The warden's environment: nothing of ours but the sanitizers' options (a sanitizer build's
 * warden reports as its caller does). @envp gets pointers into our environ, NULL-terminated. */
static void warden_env(char **envp, size_t max)
{
    extern char **environ;
    size_t n = 0;
    for (char **e = environ; e && *e && n + 1 < max; e++) {
        const char *eq = strchr(*e, '=');
        if (eq && eq - *e > 11 && !strncmp(eq - 11, "SAN_OPTIONS", 11))
            envp[n++] = *e;
    }
    envp[n] = NULL;
}

/* The exec'd child's id map files (JMSG_ID_MAP_FDS), there already: it sent them before its
 * exec, which we waited for (CLONE_VFORK). A child that failed before says why instead. */
static int recv_id_map_fds(int ctl, int fds[3], struct conch_err *err)
{
    struct jail_msg m;
    int nfds = 0;
    int r = conch_jail_recv(ctl, &m, fds, 3, &nfds, MSG_DONTWAIT);
    if (r > 0 && m.type == JMSG_ID_MAP_FDS && nfds == 3)
        return 0;
    for (int i = 0; i < nfds; i++) {
        close(fds[i]);
        fds[i] = -1;
    }
    if (r > 0 && m.type == JMSG_SETUP_ERR) {
        *err = m.err;
        err->kind = CONCH_ERR_INFRASTRUCTURE;
        return -(err->code ? err->code : EIO);
    }
    return conch_err_set(err, r < 0 ? -r : EPROTO, "start the warden: no id map files from it");
}

/* conch_jail_spawn's work on a zeroed @j; on failure @j is destroyed (freed). */
static int spawn_into(const struct conch_jail_spec *spec, struct conch_jail *j,
                      struct conch_err *err)
{
    int r;
    _cleanup_free_ struct jail_plan *plan = NULL;
    _cleanup_close_ int plan_fd = -1;
    j->ctl_fd = j->host_ws_fd = j->upper_fd_nr = j->ptc_fd = j->net_fd = j->pidfd = j->idmap_fd =
        j->ws_tree_fd = -1;
    conch_jail_ids_init(&j->ids);
    j->root_mode = geteuid() == 0;
    j->restackable = spec->upper_dir && spec->workspace && spec->ws_mode == CONCH_WS_OVERLAY;
    j->as_root = spec->as_root;
    if (spec->name)
        snprintf(j->name, sizeof(j->name), "%s", spec->name);
    else
        snprintf(j->name, sizeof(j->name), "run-%d", (int)getpid());

    if (spec->workspace && (r = conch_jail_open_workspace(j, spec->workspace, spec->ws_dev,
                                                          spec->ws_ino, NULL, err)) < 0)
        goto fail;

    if ((r = seccomp_prog_for(spec->as_root, 0, &j->seccomp, err)) < 0)
        goto fail;
    if (spec->file_handler && (r = seccomp_prog_for(spec->as_root, 1, &j->seccomp_file, err)) < 0)
        goto fail;
    if (spec->js_server && (r = seccomp_prog_for(spec->as_root, 2, &j->seccomp_js, err)) < 0)
        goto fail;

    if (j->root_mode && spec->host_id_base) {
        j->host_id_base = spec->host_id_base;
    } else if (j->root_mode) {
        if ((r = conch_jail_ids_claim(&j->ids, err)) < 0)
            goto fail;
        j->host_id_base = j->ids.base;
    }

    const struct conch_cgroup_limits *lim = &spec->limits;
    if (lim->memory_bytes || lim->pids_max || lim->cpu_millicpus) {
        struct conch_err cg_err = {0};
        r = conch_cgroup_create(&j->cg, j->name, lim, &cg_err);
        if (r == 0) {
            j->has_cgroup = true;
        } else if (lim->cpu_millicpus) {
            /* There is no rlimit for a CPU share: refuse rather than run unlimited. */
            *err = cg_err;
            conch_err_wrap(err, "--cpu needs a cgroup");
            goto fail;
        } else if (r != -EOPNOTSUPP) {
            *err = cg_err;
            goto fail;
        }
    }

    if (spec->workspace && j->root_mode && (r = stage_workspace(j, spec, err)) < 0)
        goto fail;
    if (spec->rootfs && j->root_mode && (r = stage_rootfs(j, spec->rootfs, err)) < 0)
        goto fail;
    if (spec->n_layers < 0 || spec->n_layers > CONCH_JAIL_MAX_LAYERS ||
        (spec->n_layers > 0 && (!spec->workspace || spec->ws_mode != CONCH_WS_OVERLAY))) {
        r = conch_err_set(err, EINVAL,
                          "%d snapshot layers: at most %d, on an overlay workspace only",
                          spec->n_layers, CONCH_JAIL_MAX_LAYERS);
        goto fail;
    }
    if (spec->n_layers > 0 && j->root_mode && (r = stage_layers(j, spec, err)) < 0)
        goto fail;
    if (spec->n_mounts > 0 && j->root_mode && (r = stage_mounts(j, spec, err)) < 0)
        goto fail;
    if (spec->upper_dir && j->root_mode && (r = stage_upper(j, spec->upper_dir, err)) < 0)
        goto fail;
    if (spec->upper_dir && j->root_mode &&
        lchown(spec->upper_dir, j->host_id_base, j->host_id_base) < 0) {
        /* The warden is root of the namespace = host id host_id_base: it creates upper/
         * and work/ in here. */
        r = conch_err_set(err, errno, "chown '%s' to the sandbox's root: %s", spec->upper_dir,
                          strerror(errno));
        goto fail;
    }

    plan = calloc(1, sizeof(*plan));
    if (!plan) {
        r = conch_err_set(err, ENOMEM, "out of memory");
        goto fail;
    }
    if ((r = build_plan(j, spec, plan, err)) < 0)
        goto fail;
    plan->unshare_cgroup = j->has_cgroup;

    /* A daemon's wardens are exec'd from its clean image (warden-exec.c); `conch run`'s is a
     * plain clone that calls conch_jail_warden_main (single-threaded, it holds only its own data,
     * and copying the binary would cost more than the whole exec). */
    int image = conch_jail_clean_image();
    bool exec_image = image >= 0;
    if (exec_image && (plan_fd = conch_jail_plan_pack(plan, err)) < 0) {
        r = plan_fd;
        goto fail;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        r = conch_err_set(err, errno, "socketpair: %s", strerror(errno));
        goto fail;
    }
    plan->ctl_fd = sv[1];
    static char *const warden_argv[] = {(char *)JAIL_WARDEN_ARGV0, (char *)JAIL_WARDEN_PLAN_ARG,
                                        (char *)"4", NULL};
    _Static_assert(JAIL_WARDEN_PLAN_FD == 4, "warden_argv names the plan's fd");
    char *warden_envp[8];
    warden_env(warden_envp, ARRAY_SIZE(warden_envp));
    struct jail_exec x = {.ctl_fd = sv[1],
                          .plan_fd = plan_fd,
                          .exe_fd = image,
                          .argv = warden_argv,
                          .envp = warden_envp,
                          .send_id_map_fds = !j->root_mode};
    uid_t outer_uid = getuid();
    gid_t outer_gid = getgid();
    /* Every signal blocked across the clone: a handler of ours (libuv's, which writes to its
     * own pipes) must never run in the child; the warden resets the dispositions before it
     * unblocks them. */
    sigset_t all, old_mask;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_mask);
    /* Only what must be given at clone: the child unshares the mount, network, ipc and uts
     * namespaces itself (they cost a millisecond of kernel time, better spent in the child
     * than in a daemon's loop). With the image, CLONE_VFORK: we go on once the child has
     * exec'd (or died), so the id maps are written after the exec, which must find the
     * namespace without them (see conch_jail_clean_image_prepare). */
    long pid = conch_jail_warden_clone(exec_image ? &x : NULL);
    if (pid == 0) {
        close(sv[0]);
        conch_jail_warden_main(plan);
    }
    int clone_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    close(sv[1]);
    j->ctl_fd = sv[0];
    if (pid < 0) {
        const char *hint = clone_errno == EPERM || clone_errno == ENOSPC
                               ? " (unprivileged user namespaces may be disabled or restricted: "
                                 "run 'conch doctor' for the fix)"
                               : "";
        r = conch_err_set(err, clone_errno,
                          "create namespaces (user, mount, pid, net, ipc, uts): %s%s",
                          strerror(clone_errno), hint);
        goto fail;
    }
    j->warden_pid = (pid_t)pid;
    /* Not reaped before we wait for it: the pid is still the warden's. */
    j->pidfd = (int)syscall(SYS_pidfd_open, j->warden_pid, 0);

    int map_fds[3] = {-1, -1, -1};
    if (exec_image && x.send_id_map_fds && (r = recv_id_map_fds(j->ctl_fd, map_fds, err)) < 0)
        goto fail;
    r = conch_jail_write_id_maps(j->warden_pid, j->root_mode, j->host_id_base, spec->as_root,
                                 outer_uid, outer_gid, map_fds[0] >= 0 ? map_fds : NULL, err);
    for (int i = 0; i < 3; i++)
        if (map_fds[i] >= 0)
            close(map_fds[i]);
    if (r < 0)
        goto fail;
    if (j->has_cgroup && (r = conch_cgroup_attach(&j->cg, j->warden_pid, err)) < 0)
        goto fail;
    /* The warden (and the shepherds it forks) should never be what a memory limit's OOM kill
     * picks: that would stop the sandbox instead of the command. Commands raise their own
     * score to the top; where the caller may (CAP_SYS_RESOURCE), the warden's is lowered too. */
    if (j->root_mode)
        write_proc_file(j->warden_pid, "oom_score_adj", "-1000");
    struct jail_msg m = {.type = JMSG_SETUP_OK};
    r = conch_jail_send(j->ctl_fd, &m, &j->ws_tree_fd, j->ws_tree_fd >= 0 ? 1 : 0);
    if (j->ws_tree_fd >= 0)
        close(TAKE_FD(j->ws_tree_fd));
    if (r < 0) {
        conch_err_set(err, -r, "start the warden: %s", strerror(-r));
        goto fail;
    }
    return 0;

fail:
    conch_jail_destroy(j);
    return r < 0 ? r : -EIO;
}

int conch_jail_take_answer(struct conch_jail *j, enum conch_jail_answer_kind kind,
                           struct conch_jail_event *ev, struct conch_err *err)
{
    int fd = ev->answer_fd, net_fd = ev->answer_net_fd;
    ev->answer_fd = ev->answer_net_fd = -1;
    if (net_fd >= 0 && (kind != CONCH_JAIL_ANSWER_SETUP || !ev->answer_ok)) {
        close(net_fd);
        net_fd = -1;
    }
    if (!ev->answer_ok) {
        if (fd >= 0)
            close(fd);
        *err = ev->err;
        int r = -(err->code ? err->code : EIO);
        if (kind == CONCH_JAIL_ANSWER_SETUP) {
            err->kind = CONCH_ERR_INFRASTRUCTURE;
            conch_err_wrap(err, "build sandbox");
        } else if (kind == CONCH_JAIL_ANSWER_RECYCLE) {
            conch_err_wrap(err, "make the sandbox as new");
        }
        return r;
    }
    j->upper_fd_nr = ev->answer_nr;
    if (kind != CONCH_JAIL_ANSWER_SETUP) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    if (fd >= 0) {
        if (j->ptc_fd >= 0)
            close(j->ptc_fd);
        j->ptc_fd = fd;
    }
    if (net_fd >= 0) {
        if (j->net_fd >= 0)
            close(j->net_fd);
        j->net_fd = net_fd;
    }
    unstage(j);
    return 0;
}

/* conch_jail_start's second half: block until the warden's setup answers. On failure @j is
 * destroyed. */
static int await_setup(struct conch_jail *j, struct conch_err *err)
{
    struct jail_msg m;
    int nfds = 0, fds[JAIL_MSG_MAX_FDS] = {-1, -1, -1, -1};
    int r = conch_jail_recv(j->ctl_fd, &m, fds, JAIL_MSG_MAX_FDS, &nfds, 0);
    struct conch_jail_event ev;
    if (r <= 0) {
        r = conch_err_set(err, r < 0 ? -r : EPIPE, "the warden died during setup");
    } else if (m.type != JMSG_SETUP_OK && m.type != JMSG_SETUP_ERR) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        r = conch_err_set(err, EPROTO, "unexpected warden message %u during setup", m.type);
    } else {
        conch_jail_event_from_msg(&m, fds, nfds, &ev);
        r = conch_jail_take_answer(j, CONCH_JAIL_ANSWER_SETUP, &ev, err);
    }
    if (r < 0)
        conch_jail_destroy(j);
    return r;
}

/* The least stack the warden's setup runs in (it is exec'd with our limit). */
#define WARDEN_MIN_STACK (256u << 10)

int conch_jail_check_stack(struct conch_err *err)
{
    struct rlimit stack;
    if (getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur < WARDEN_MIN_STACK)
        return conch_err_set(err, ENOMEM,
                             "the stack size limit is %llu KiB (ulimit -s): building or driving "
                             "a sandbox needs at least %u KiB; raise it",
                             (unsigned long long)stack.rlim_cur >> 10, WARDEN_MIN_STACK >> 10);
    return 0;
}

int conch_jail_spawn(const struct conch_jail_spec *spec, struct conch_jail **ret,
                     struct conch_err *err)
{
    int r = conch_jail_check_stack(err);
    if (r < 0)
        return r;
    struct conch_jail *j = calloc(1, sizeof(*j));
    if (!j)
        return conch_err_set(err, ENOMEM, "out of memory");
    r = spawn_into(spec, j, err);
    if (r < 0)
        return r;
    *ret = j;
    return 0;
}

int conch_jail_start(const struct conch_jail_spec *spec, struct conch_jail **ret,
                     struct conch_err *err)
{
    struct conch_jail *j;
    int r = conch_jail_spawn(spec, &j, err);
    if (r < 0 || (r = await_setup(j, err)) < 0)
        return r;
    *ret = j;
    return 0;
}

int conch_jail_take_ptc_fd(struct conch_jail *j)
{
    int fd = j->ptc_fd;
    j->ptc_fd = -1;
    return fd;
}

int conch_jail_take_net_fd(struct conch_jail *j)
{
    int fd = j->net_fd;
    j->net_fd = -1;
    return fd;
}

uint32_t conch_jail_proto_version(void)
{
    return JAIL_PROTO_VERSION;
}

pid_t conch_jail_warden_pid(const struct conch_jail *j)
{
    return j->warden_pid;
}

int conch_jail_ctl_fd(const struct conch_jail *j)
{
    return j->ctl_fd;
}

int conch_jail_host_ws_fd(const struct conch_jail *j)
{
    return j->host_ws_fd;
}

bool conch_jail_has_cgroup(const struct conch_jail *j)
{
    return j->has_cgroup;
}

void conch_jail_cgroup_stats(struct conch_jail *j, struct conch_cgroup_stats *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (j->has_cgroup)
        conch_cgroup_stats(&j->cg, ret, NULL);
}

void conch_jail_set_sync_destroy(struct conch_jail *j, bool on)
{
    j->sync_destroy = on;
}

void conch_jail_destroy(struct conch_jail *j)
{
    if (!j)
        return;
    if (j->warden_pid > 0 && !j->adopted) {
        struct jail_msg m = {.type = JMSG_SHUTDOWN};
        if (j->ctl_fd >= 0)
            conch_jail_send(j->ctl_fd, &m, NULL, 0);
        /* The warden is PID 1 of its namespace: SIGKILL to it kills every process inside.
         * Tearing the namespaces down takes the kernel a millisecond or more; only a cgroup
         * (which cannot be removed while the warden is in it) needs us to wait for that. */
        if (j->pidfd >= 0)
            syscall(SYS_pidfd_send_signal, j->pidfd, SIGKILL, NULL, 0); /* ESRCH: it is gone */
        else
            kill(j->warden_pid, SIGKILL);
        while (waitpid(j->warden_pid, NULL, j->has_cgroup || j->sync_destroy ? 0 : WNOHANG) < 0 &&
               errno == EINTR)
            ;
        j->warden_pid = 0;
    }
    conch_jail_ctl_queue_clear(j);
    if (j->ctl_fd >= 0)
        close(j->ctl_fd);
    j->ctl_fd = -1;
    if (j->host_ws_fd >= 0)
        close(j->host_ws_fd);
    j->host_ws_fd = -1;
    if (j->ws_tree_fd >= 0)
        close(j->ws_tree_fd);
    j->ws_tree_fd = -1;
    if (j->ptc_fd >= 0)
        close(j->ptc_fd);
    j->ptc_fd = -1;
    if (j->net_fd >= 0)
        close(j->net_fd);
    j->net_fd = -1;
    if (j->pidfd >= 0)
        close(j->pidfd);
    j->pidfd = -1;
    if (j->idmap_fd >= 0)
        close(j->idmap_fd);
    j->idmap_fd = -1;
    if (j->has_cgroup) {
        struct conch_err ignored = {0};
        conch_cgroup_destroy(&j->cg, &ignored);
        j->has_cgroup = false;
    }
    unstage(j);
    /* Only now that the warden is dead may another sandbox get its host ids. */
    conch_jail_ids_release(&j->ids);
    conch_seccomp_prog_done(&j->seccomp);
    conch_seccomp_prog_done(&j->seccomp_file);
    conch_seccomp_prog_done(&j->seccomp_js);
    free(j);
}
