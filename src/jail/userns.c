/* userns.c - identity plumbing on the parent side: the uid/gid maps of a new sandbox, and
 * the idmapped mount that makes a root-owned workspace appear owned by agent inside. */
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "jail/jail-internal.h"

/* Write @text to the child's @name: through @fd when the child sent it (see
 * JMSG_ID_MAP_FDS), else by path. */
static int write_map(pid_t pid, int fd, const char *name, const char *text, struct conch_err *err)
{
    if (fd < 0) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/%s", pid, name);
        return conch_write_file(path, text, strlen(text), err);
    }
    ssize_t n = write(fd, text, strlen(text));
    if (n != (ssize_t)strlen(text))
        return conch_err_set(err, n < 0 ? errno : EIO, "write '/proc/%d/%s': %s", pid, name,
                             strerror(n < 0 ? errno : EIO));
    return 0;
}

int conch_jail_write_id_maps(pid_t pid, bool root_mode, uint32_t host_id_base, bool as_root,
                             uid_t outer_uid, gid_t outer_gid, const int *map_fds,
                             struct conch_err *err)
{
    char map[128];
    int none[3] = {-1, -1, -1};
    const int *fd = map_fds ? map_fds : none;
    if (root_mode) {
        /* Host root: the whole 0..65535 range of the sandbox lands on a block of
         * unprivileged host ids of its own (ids.c), so no sandbox process is ever host uid
         * 0, and none shares a host id with a user's subuid range or another sandbox. */
        if (host_id_base < CONCH_HOST_ID_FIRST)
            return conch_err_set(err, EINVAL, "write uid map: no host id block claimed");
        snprintf(map, sizeof(map), "0 %u %u\n", host_id_base, CONCH_HOST_ID_COUNT);
        if (write_map(pid, fd[1], "uid_map", map, err) < 0)
            return conch_err_wrap(err, "write uid map");
        if (write_map(pid, fd[2], "gid_map", map, err) < 0)
            return conch_err_wrap(err, "write gid map");
        return 0;
    }
    /* An ordinary user may map only its own ids, and must deny setgroups first. */
    if (write_map(pid, fd[0], "setgroups", "deny", err) < 0)
        return conch_err_wrap(err, "deny setgroups");
    snprintf(map, sizeof(map), "%u %u 1\n", as_root ? 0 : CONCH_AGENT_UID, outer_uid);
    if (write_map(pid, fd[1], "uid_map", map, err) < 0)
        return conch_err_wrap(err, "write uid map");
    snprintf(map, sizeof(map), "%u %u 1\n", as_root ? 0 : CONCH_AGENT_GID, outer_gid);
    if (write_map(pid, fd[2], "gid_map", map, err) < 0)
        return conch_err_wrap(err, "write gid map");
    return 0;
}

/* The holder of a user namespace made for its fd: it only waits, every signal blocked, for
 * the SIGKILL that ends it. It runs on the small stack userns_with_maps lends it, so no
 * instrumentation may touch its frame. */
__attribute__((no_sanitize_address)) static int hold_userns(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return 0;
}

/* A user namespace whose uid and gid maps are @uid_map and @gid_map, as an fd. */
static int userns_with_maps(const char *uid_map, const char *gid_map, struct conch_err *err)
{
    /* The namespace exists when clone() returns, so nothing waits for the child to run
     * (start-up time: no handshake, no unshare() in the child), and with CLONE_VM it shares
     * our memory instead of copying the page tables of a large process (a daemon's), and with
     * CLONE_FILES its fd table instead of copying it (a daemon with 1,000 sandboxes holds
     * 4,000 fds: each one referenced at the clone and closed at the exit otherwise). Every
     * signal is blocked across the clone (the daemon's threads may hold locks, its handlers
     * write to its own fds): the child runs none of our code but pause(). Its stack is ours
     * until it is reaped below, before this frame returns. */
    _Alignas(16) char stack[16384];
    sigset_t all, old_mask;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_mask);
    pid_t pid = clone(hold_userns, stack + sizeof(stack),
                      CLONE_VM | CLONE_FILES | CLONE_NEWUSER | SIGCHLD, NULL);
    int clone_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (pid < 0)
        return conch_err_set(err, clone_errno,
                             "create the user namespace of the workspace idmapping: clone: %s",
                             strerror(clone_errno));
    int fd = -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/uid_map", pid);
    if (conch_write_file(path, uid_map, strlen(uid_map), err) < 0)
        goto out;
    snprintf(path, sizeof(path), "/proc/%d/gid_map", pid);
    if (conch_write_file(path, gid_map, strlen(gid_map), err) < 0)
        goto out;
    snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        conch_err_set(err, errno, "open '%s': %s", path, strerror(errno));
out:
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return fd < 0 ? -(err && err->code ? err->code : EIO) : fd;
}

/* A user namespace used as the idmapping of a mount. With @whole_range it maps like the
 * sandbox (0..65535 onto the block at @base: a root-owned --rootfs looks root-owned
 * inside); otherwise its only mapping sends @inner_uid/@inner_gid (the workspace owner) to
 * the host ids of the sandbox's agent (@base + 1000). Returns an fd. */
int conch_jail_idmap_userns(uint32_t base, bool whole_range, uid_t inner_uid, gid_t inner_gid,
                            struct conch_err *err)
{
    char umap[96], gmap[96];
    if (whole_range) {
        snprintf(umap, sizeof(umap), "0 %u %u\n", base, CONCH_HOST_ID_COUNT);
        snprintf(gmap, sizeof(gmap), "%s", umap);
    } else {
        snprintf(umap, sizeof(umap), "%u %u 1\n", inner_uid, base + CONCH_AGENT_UID);
        snprintf(gmap, sizeof(gmap), "%u %u 1\n", inner_gid, base + CONCH_AGENT_GID);
    }
    return userns_with_maps(umap, gmap, err);
}

int conch_jail_idmap_userns_shift(uint32_t from, uint32_t to, struct conch_err *err)
{
    char map[96];
    snprintf(map, sizeof(map), "%u %u %u\n", from, to, CONCH_HOST_ID_COUNT);
    return userns_with_maps(map, map, err);
}

int conch_jail_idmapped_tree(const char *path, uint32_t host_id_base, bool whole_range,
                             uid_t owner_uid, gid_t owner_gid, bool read_only,
                             struct conch_err *err)
{
    if (host_id_base < CONCH_HOST_ID_FIRST)
        return conch_err_set(err, EINVAL, "idmap '%s': no host id block claimed", path);
    _cleanup_close_ int userns =
        conch_jail_idmap_userns(host_id_base, whole_range, owner_uid, owner_gid, err);
    if (userns < 0)
        return userns;
    return conch_jail_idmapped_tree_in(path, userns, whole_range, read_only, err);
}

int conch_jail_idmapped_tree_in(const char *path, int userns, bool whole_range, bool read_only,
                                struct conch_err *err)
{
    _cleanup_close_ int tree =
        (int)syscall(SYS_open_tree, AT_FDCWD, path,
                     OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (whole_range ? AT_RECURSIVE : 0));
    if (tree < 0)
        return conch_err_set(err, errno, "open_tree '%s': %s (needs Linux >= 5.2)", path,
                             strerror(errno));
    struct mount_attr attr = {
        .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                    (read_only ? MOUNT_ATTR_RDONLY : 0),
        .userns_fd = (uint64_t)userns,
    };
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | (whole_range ? AT_RECURSIVE : 0),
                &attr, sizeof(attr)) < 0) {
        int e = errno;
        return conch_err_set(err, e,
                             "idmap the workspace mount '%s': %s (idmapped mounts need Linux "
                             ">= 5.12 and a filesystem that supports them: see 'conch doctor')",
                             path, strerror(e));
    }
    return TAKE_FD(tree);
}

int conch_jail_stage_attach(int tree_fd, const char *dir, struct conch_err *err)
{
    if (syscall(SYS_move_mount, tree_fd, "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return conch_err_set(err, errno, "attach the workspace mount at '%s': %s", dir,
                             strerror(errno));
    return 0;
}
