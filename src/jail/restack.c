/* restack.c - the parent side of a snapshot without a restart (issue 18): the warden lets go
 * of /workspace (JRESTACK_RELEASE), the caller freezes the upper dir into a layer, and the
 * new overlay (the host workspace under the frozen layers and a new empty upper) is mounted
 * at /workspace (JRESTACK_MOUNT). As host root it is built detached here (the workspace must
 * be idmapped, which only host root can do) and handed over, as for an attach; unprivileged
 * the warden builds it in its view of the host from the paths sent (restack-child.c). */
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "jail/jail-internal.h"

bool conch_jail_can_restack(const struct conch_jail *j)
{
    return j->restackable && j->host_ws_fd >= 0 && j->ctl_fd >= 0 && !j->adopted;
}

int conch_jail_send_release(struct conch_jail *j, struct conch_err *err)
{
    if (!conch_jail_can_restack(j))
        return conch_err_set(err, EOPNOTSUPP, "this sandbox's workspace cannot be restacked");
    struct jail_msg m = {.type = JMSG_RESTACK, .a = JRESTACK_RELEASE};
    int r = conch_jail_ctl_send(j, &m, NULL, 0);
    return r < 0 ? conch_err_set(err, -r, "ask the warden to release /workspace: %s", strerror(-r))
                 : 0;
}

static int fsconfig_fd(int fs, const char *key, int fd)
{
    return (int)syscall(SYS_fsconfig, fs, FSCONFIG_SET_FD, key, NULL, fd);
}

/* The workspace's idmapped clone (its owner seen as the sandbox's agent), through the
 * idmapping the jail keeps for its owner (each new one costs a fork). */
static int workspace_tree(struct conch_jail *j, const char *workspace, struct conch_err *err)
{
    if (j->idmap_fd >= 0 && (j->idmap_uid != j->ws_owner_uid || j->idmap_gid != j->ws_owner_gid)) {
        close(j->idmap_fd);
        j->idmap_fd = -1;
    }
    if (j->idmap_fd < 0) {
        j->idmap_fd =
            conch_jail_idmap_userns(j->host_id_base, false, j->ws_owner_uid, j->ws_owner_gid, err);
        if (j->idmap_fd < 0)
            return j->idmap_fd;
        j->idmap_uid = j->ws_owner_uid;
        j->idmap_gid = j->ws_owner_gid;
    }
    int tree = conch_jail_idmapped_tree_in(workspace, j->idmap_fd, false, false, err);
    if (tree < 0)
        return tree;
    struct stat a, b;
    if (fstat(tree, &a) < 0 || fstat(j->host_ws_fd, &b) < 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        close(tree);
        return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                              "workspace '%s' was replaced (or swapped for a link) since the "
                              "sandbox was built: refusing it",
                              workspace);
    }
    return tree;
}

/* Layer @l as an overlay lower: a dir of ours as it is when this sandbox's block wrote it,
 * else a read-only clone idmapped from the block that did onto ours. */
static int layer_fd(struct conch_jail *j, const struct conch_jail_layer *l, struct conch_err *err)
{
    uint32_t from = l->id_base ? l->id_base : j->host_id_base;
    if (from == j->host_id_base) {
        int fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return conch_err_set(err, errno, "open snapshot layer '%s': %s", l->dir,
                                 strerror(errno));
        return fd;
    }
    _cleanup_close_ int userns = conch_jail_idmap_userns_shift(from, j->host_id_base, err);
    if (userns < 0)
        return userns;
    return conch_jail_idmapped_tree_in(l->dir, userns, false, true, err);
}

/* Unprivileged: the paths the warden builds the overlay from (conch_jail_restack_build_child),
 * in a sealed memfd. */
static int send_paths(struct conch_jail *j, const struct conch_jail_restack *rs,
                      struct conch_err *err)
{
    _cleanup_close_ int fd = memfd_create("conch-restack", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return conch_err_set(err, errno, "memfd_create: %s", strerror(errno));
    char one[PATH_MAX + 16];
    for (int i = 0; i <= rs->n_layers + 3; i++) {
        const char *p = i < rs->n_layers ? rs->layers[i].dir : NULL;
        if (i == rs->n_layers)
            p = rs->workspace;
        else if (i == rs->n_layers + 1)
            p = "";
        int n = i <= rs->n_layers + 1 ? snprintf(one, sizeof(one), "%s", p)
                                      : snprintf(one, sizeof(one), "%s/%s", rs->upper_dir,
                                                 i == rs->n_layers + 2 ? "upper" : "work");
        if (n < 0 || (size_t)n >= sizeof(one))
            return conch_err_set(err, ENAMETOOLONG, "restack: a path is too long");
        if (conch_write_all(fd, one, (size_t)n + 1) < 0)
            return conch_err_set(err, errno, "restack: write the paths: %s", strerror(errno));
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0)
        return conch_err_set(err, errno, "restack: seal the paths: %s", strerror(errno));
    struct jail_msg m = {.type = JMSG_RESTACK, .a = JRESTACK_MOUNT, .b = JRESTACK_PATHS};
    int fds[2] = {fd, j->host_ws_fd};
    int r = conch_jail_ctl_send(j, &m, fds, 2);
    return r < 0 ? conch_err_set(err, -r, "send the new workspace to the warden: %s", strerror(-r))
                 : 0;
}

int conch_jail_send_restack(struct conch_jail *j, const struct conch_jail_restack *rs,
                            struct conch_err *err)
{
    if (!conch_jail_can_restack(j))
        return conch_err_set(err, EOPNOTSUPP, "this sandbox's workspace cannot be restacked");
    if (rs->n_layers < 0 || rs->n_layers > CONCH_JAIL_MAX_LAYERS)
        return conch_err_set(err, EINVAL, "%d snapshot layers: at most %d", rs->n_layers,
                             CONCH_JAIL_MAX_LAYERS);
    if (!j->root_mode)
        return send_paths(j, rs, err);
    _cleanup_close_ int upper =
        openat(rs->upper_dir_fd, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    _cleanup_close_ int work =
        openat(rs->upper_dir_fd, "work", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (upper < 0 || work < 0)
        return conch_err_set(err, errno, "open the sandbox's upper and work dirs: %s",
                             strerror(errno));
    _cleanup_close_ int ws = workspace_tree(j, rs->workspace, err);
    if (ws < 0)
        return ws;
    _cleanup_close_ int fs = (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
    if (fs < 0)
        return conch_err_set(err, errno, "fsopen overlay: %s", strerror(errno));
    /* Top first, the workspace at the bottom: as the sandbox's setup mounts it. */
    for (int i = 0; i < rs->n_layers; i++) {
        _cleanup_close_ int l = layer_fd(j, &rs->layers[i], err);
        if (l < 0)
            return l;
        if (fsconfig_fd(fs, "lowerdir+", l) < 0)
            return conch_err_set(err, errno, "overlay: snapshot layer '%s': %s", rs->layers[i].dir,
                                 strerror(errno));
    }
    if (fsconfig_fd(fs, "lowerdir+", ws) < 0 || fsconfig_fd(fs, "upperdir", upper) < 0 ||
        fsconfig_fd(fs, "workdir", work) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        return conch_err_set(err, errno, "create the workspace's overlay: %s", strerror(errno));
    _cleanup_close_ int mnt =
        (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (mnt < 0)
        return conch_err_set(err, errno, "mount the workspace's overlay: %s", strerror(errno));
    struct jail_msg m = {.type = JMSG_RESTACK, .a = JRESTACK_MOUNT};
    int fds[2] = {mnt, upper};
    int r = conch_jail_ctl_send(j, &m, fds, 2);
    return r < 0 ? conch_err_set(err, -r, "send the new workspace to the warden: %s", strerror(-r))
                 : 0;
}
