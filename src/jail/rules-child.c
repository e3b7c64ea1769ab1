/* rules-child.c - path rules in the workspace (issue 18), applied by the warden over the
 * mounted /workspace before the root turns read-only: a read-only path is bound onto itself
 * read-only, a hidden path is covered by an empty read-only mount of mode 000, and every dir
 * between /workspace and a rule path is bound onto itself, so that no command can rename,
 * remove or replace it (a mount point gives EBUSY; link() across mounts gives EXDEV). Paths
 * are resolved beneath /workspace with openat2 and never through a symlink. Runs in the child:
 * no allocation. See docs/ARCHITECTURE.md "Path rules". */
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jail/jail-internal.h"

/* Where the empty file that covers hidden files lives while the rules are applied: a tmpfs in
 * the sandbox's root (open_tree clones only from the caller's own mount namespace), detached
 * and removed after. */
#define EMPTY_MNT "/.conch-empty"
#define EMPTY_FILE EMPTY_MNT "/empty"

static int rule_fail(struct conch_err *err, const char *path, const char *what, int e)
{
    if (e == ELOOP)
        return conch_err_setk(err, CONCH_ERR_USAGE, e,
                              "path rule '%s': a symlink in the path is refused ('%s')", path,
                              what);
    return conch_err_set(err, e, "path rule '%s': %s: %s", path, what, strerror(e));
}

/* @path (relative, normalised) beneath @ws as an O_PATH fd, never through a symlink. */
static int open_beneath(int ws, const char *path)
{
    struct open_how how = {
        .flags = O_PATH | O_CLOEXEC | O_NOFOLLOW,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    int fd;
    do
        fd = (int)syscall(SYS_openat2, ws, path, &how, sizeof(how));
    while (fd < 0 && errno == EAGAIN);
    return fd;
}

/* Mount the detached tree @tree over the object @target_fd is (both borrowed). */
static int attach_over(int tree, int target_fd)
{
    return (int)syscall(SYS_move_mount, tree, "", target_fd, "",
                        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
}

/* A clone of the mount tree at @fd (with what is mounted beneath it), made read-only when
 * @rdonly, mounted over @fd itself: the object can no longer be renamed, removed or replaced,
 * and with @rdonly nothing beneath it written. */
static int bind_self(int fd, bool rdonly)
{
    int tree = (int)syscall(SYS_open_tree, fd, "",
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
    if (tree < 0)
        return -1;
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    int r = 0;
    if (rdonly)
        r = (int)syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
                         sizeof(attr));
    if (r == 0)
        r = attach_over(tree, fd);
    int e = errno;
    close(tree);
    errno = e;
    return r;
}

static int fsconfig_str(int fs, const char *key, const char *value)
{
    return (int)syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, key, value, 0);
}

/* An empty read-only tmpfs of @mode (that holds nothing and can hold nothing) over the dir
 * @fd. */
static int cover_dir(int fd, const char *mode)
{
    int fs = (int)syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC), mnt = -1, r = -1;
    if (fs >= 0 && fsconfig_str(fs, "size", "4k") == 0 && fsconfig_str(fs, "nr_inodes", "1") == 0 &&
        fsconfig_str(fs, "mode", mode) == 0 &&
        syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
        mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
                           MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                               MOUNT_ATTR_NOEXEC);
    if (mnt >= 0)
        r = attach_over(mnt, fd);
    int e = errno;
    if (mnt >= 0)
        close(mnt);
    if (fs >= 0)
        close(fs);
    errno = e;
    return r;
}

/* The empty file of mode 000 (EMPTY_FILE), read-only, over the non-directory @fd. */
static int cover_file(int fd)
{
    int tree =
        (int)syscall(SYS_open_tree, AT_FDCWD, EMPTY_FILE, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0)
        return -1;
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                          MOUNT_ATTR_NOEXEC};
    int r = (int)syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr));
    if (r == 0)
        r = attach_over(tree, fd);
    int e = errno;
    close(tree);
    errno = e;
    return r;
}

/* A missing component @name beneath the dir @parent: made (an empty dir, in the overlay's upper
 * or the workspace tmpfs; the rule's own place is the warden's and mode 0555, so a read-only
 * one is an empty dir nothing can be created in) so that a mount has a place, or refused where it
 * would be made on the host (rw). Returns 1 when made, 0 when the rule has nothing to protect (ro:
 * nothing can be created anywhere), -errno with @err. */
static int make_missing(const struct jail_plan *plan, int parent, const char *name,
                        const char *path, bool placeholder, struct conch_err *err)
{
    if (plan->has_workspace && plan->ws_mode == CONCH_WS_RO)
        return 0;
    if (plan->has_workspace && plan->ws_mode == CONCH_WS_RW)
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOENT,
                              "path rule '%s': no such file or directory (in the mode rw a rule "
                              "needs an existing path: its place would be made on the host)",
                              path);
    if (mkdirat(parent, name, placeholder ? 0555 : 0755) < 0)
        return rule_fail(err, path, "make its place", errno);
    /* A parent made here is the command's to fill, as its other dirs are. */
    if (!placeholder &&
        fchownat(parent, name, plan->cmd_uid, plan->cmd_gid, AT_SYMLINK_NOFOLLOW) < 0)
        return rule_fail(err, path, "chown its place", errno);
    return 1;
}

/* Rule @i's parents pinned before: an earlier rule is one of them or lies beneath one. */
static bool pinned_before(const struct jail_plan *plan, int i, const char *prefix, size_t len)
{
    for (int k = 0; k < i; k++) {
        const char *p = plan->rules[k].path;
        if (!strncmp(p, prefix, len) && (p[len] == '/' || p[len] == '\0'))
            return true;
    }
    return false;
}

/* Rule @i: its parents pinned (made where missing), then the rule's own mount. */
static int apply_one(const struct jail_plan *plan, int i, int ws, struct conch_err *err)
{
    const struct jail_rule *rule = &plan->rules[i];
    char buf[CONCH_SPEC_RULE_PATH_MAX];
    size_t n = strlen(rule->path);
    if (n >= sizeof(buf))
        return conch_err_set(err, ENAMETOOLONG, "path rule too long");
    memcpy(buf, rule->path, n + 1);
    int parent = ws;
    const char *name = buf;
    for (size_t k = 0; k <= n; k++) {
        if (buf[k] != '/' && buf[k] != '\0')
            continue;
        bool last = buf[k] == '\0';
        buf[k] = '\0';
        int fd = open_beneath(ws, buf);
        if (fd < 0 && errno == ENOENT) {
            int r = make_missing(plan, parent, name, rule->path, last, err);
            if (r <= 0) {
                if (parent != ws)
                    close(parent);
                return r;
            }
            fd = open_beneath(ws, buf);
        }
        if (parent != ws)
            close(parent);
        parent = -1;
        if (fd < 0)
            return rule_fail(err, rule->path, "open", errno);
        struct stat st;
        if (fstat(fd, &st) < 0) {
            close(fd);
            return rule_fail(err, rule->path, "stat", errno);
        }
        /* RESOLVE_NO_SYMLINKS lets O_PATH|O_NOFOLLOW open a link that ends the path: the link
         * itself, which a mount would cover while its target stays in reach. */
        if (S_ISLNK(st.st_mode)) {
            close(fd);
            return rule_fail(err, rule->path, buf, ELOOP);
        }
        if (!last) {
            if (!S_ISDIR(st.st_mode)) {
                close(fd);
                return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR,
                                      "path rule '%s': '%s' is not a directory", rule->path, buf);
            }
            if (!pinned_before(plan, i, buf, k) && bind_self(fd, false) < 0) {
                int e = errno;
                close(fd);
                return rule_fail(err, rule->path, "pin its parent", e);
            }
            buf[k] = '/';
            parent = fd;
            name = buf + k + 1;
            continue;
        }
        int r;
        const char *what;
        if (rule->kind == CONCH_RULE_READONLY) {
            what = "make it read-only";
            r = bind_self(fd, true);
        } else {
            what = "hide it";
            r = S_ISDIR(st.st_mode) ? cover_dir(fd, "0000") : cover_file(fd);
        }
        int e = errno;
        close(fd);
        return r < 0 ? rule_fail(err, rule->path, what, e) : 0;
    }
    return 0;
}

int conch_jail_rules_apply_child(const struct jail_plan *plan, struct conch_err *err)
{
    if (plan->n_rules <= 0)
        return 0;
    int ws = open("/workspace", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (ws < 0)
        return conch_err_set(err, errno, "path rules: open '/workspace': %s", strerror(errno));
    int r = 0;
    if (mkdir(EMPTY_MNT, 0700) < 0 || mount("tmpfs", EMPTY_MNT, "tmpfs", MS_NOSUID | MS_NODEV,
                                            "size=4k,nr_inodes=2,mode=0700") < 0)
        r = conch_err_set(err, errno, "path rules: mount '%s': %s", EMPTY_MNT, strerror(errno));
    int fd = r < 0 ? -1 : open(EMPTY_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
    if (r == 0 && fd < 0)
        r = conch_err_set(err, errno, "path rules: create '%s': %s", EMPTY_FILE, strerror(errno));
    if (fd >= 0)
        close(fd);
    for (int i = 0; r == 0 && i < plan->n_rules; i++)
        r = apply_one(plan, i, ws, err);
    close(ws);
    /* The covers made from it stay; the tmpfs itself leaves the tree. */
    if (umount2(EMPTY_MNT, MNT_DETACH) < 0 && r == 0)
        r = conch_err_set(err, errno, "path rules: unmount '%s': %s", EMPTY_MNT, strerror(errno));
    if (rmdir(EMPTY_MNT) < 0 && r == 0)
        r = conch_err_set(err, errno, "path rules: rmdir '%s': %s", EMPTY_MNT, strerror(errno));
    return r;
}
