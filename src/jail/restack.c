/* restack.c - the parent side of a snapshot without a restart (issue 18): the warden lets go
 * of /workspace (JRESTACK_RELEASE), the caller freezes the upper dir into a layer, and the
 * new overlay (the host workspace under the frozen layers and a new empty upper) is mounted
 * at /workspace (JRESTACK_MOUNT). As host root it is built detached here (the workspace must
 * be idmapped, which only host root can do) and handed over, as for an attach; unprivileged
 * the warden builds it in its view of the host from the paths sent (restack-child.c). The
 * same stack attached to a pool sandbox (JMSG_ATTACH with JATTACH_ON_DISK) makes it a fork:
 * conch_jail_send_attach_stack. */
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
 * in a sealed memfd; returned, or -errno with @err. */
static int paths_blob(const struct conch_jail_restack *rs, struct conch_err *err)
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
    return TAKE_FD(fd);
}

/* As host root: the overlay of @rs built detached here, into *@ret_mnt with its upper dir
 * in *@ret_upper. Returns 0 or -errno with @err. */
static int root_stack(struct conch_jail *j, const struct conch_jail_restack *rs, int *ret_mnt,
                      int *ret_upper, struct conch_err *err)
{
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
    /* Top first, the workspace at the bottom: as the sandbox's setup mounts it. Each layer's
     * fd stays open until the overlay is made: a detached clone (another block's layer,
     * idmapped) is dissolved when its last fd closes, and the overlay could then not clone
     * it ("failed to clone lowerpath", EINVAL). */
    int lfd[CONCH_JAIL_MAX_LAYERS], n = 0, r = 0;
    for (; n < rs->n_layers; n++) {
        if ((lfd[n] = layer_fd(j, &rs->layers[n], err)) < 0) {
            r = lfd[n];
            break;
        }
        if (fsconfig_fd(fs, "lowerdir+", lfd[n]) < 0) {
            r = conch_err_set(err, errno, "overlay: snapshot layer '%s': %s", rs->layers[n].dir,
                              strerror(errno));
            n++;
            break;
        }
    }
    if (r >= 0 && (fsconfig_fd(fs, "lowerdir+", ws) < 0 || fsconfig_fd(fs, "upperdir", upper) < 0 ||
                   fsconfig_fd(fs, "workdir", work) < 0 ||
                   syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0 ||
                   syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0))
        r = conch_err_set(err, errno, "create the workspace's overlay: %s", strerror(errno));
    while (n > 0)
        close(lfd[--n]);
    if (r < 0)
        return r;
    int mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (mnt < 0)
        return conch_err_set(err, errno, "mount the workspace's overlay: %s", strerror(errno));
    *ret_mnt = mnt;
    *ret_upper = TAKE_FD(upper);
    return 0;
}

/* Send @m with the stack of @rs: the overlay built here as host root (fds [it, its upper]),
 * else the paths for the warden to build it (fds [them, the host workspace], @paths_flag in
 * m->b). */
static int send_stack(struct conch_jail *j, struct jail_msg *m, uint32_t paths_flag,
                      const struct conch_jail_restack *rs, struct conch_err *err)
{
    if (rs->n_layers < 0 || rs->n_layers > CONCH_JAIL_MAX_LAYERS)
        return conch_err_set(err, EINVAL, "%d snapshot layers: at most %d", rs->n_layers,
                             CONCH_JAIL_MAX_LAYERS);
    int fds[2] = {-1, -1}, r;
    if (j->root_mode) {
        r = root_stack(j, rs, &fds[0], &fds[1], err);
    } else {
        r = fds[0] = paths_blob(rs, err);
        fds[1] = j->host_ws_fd;
        m->b |= paths_flag;
    }
    if (r < 0)
        return r;
    r = conch_jail_ctl_send(j, m, fds, 2);
    close(fds[0]);
    if (j->root_mode)
        close(fds[1]);
    return r < 0 ? conch_err_set(err, -r, "send the new workspace to the warden: %s", strerror(-r))
                 : 0;
}

int conch_jail_send_restack(struct conch_jail *j, const struct conch_jail_restack *rs,
                            struct conch_err *err)
{
    if (!conch_jail_can_restack(j))
        return conch_err_set(err, EOPNOTSUPP, "this sandbox's workspace cannot be restacked");
    struct jail_msg m = {.type = JMSG_RESTACK, .a = JRESTACK_MOUNT};
    return send_stack(j, &m, JRESTACK_PATHS, rs, err);
}

int conch_jail_send_attach_stack(struct conch_jail *j, const struct conch_jail_restack *rs,
                                 dev_t ws_dev, ino_t ws_ino, struct conch_err *err)
{
    if (j->host_ws_fd >= 0 || j->ctl_fd < 0 || j->adopted)
        return conch_err_set(err, EBUSY, "this sandbox cannot take a workspace");
    int r = conch_jail_open_workspace(j, rs->workspace, ws_dev, ws_ino, NULL, err);
    if (r < 0)
        return r;
    struct jail_msg m = {.type = JMSG_ATTACH,
                         .a = CONCH_WS_OVERLAY,
                         .b = JATTACH_ON_DISK | (j->root_mode ? JATTACH_MOUNTED : 0)};
    if ((r = send_stack(j, &m, JATTACH_PATHS, rs, err)) < 0) {
        close(j->host_ws_fd); /* nothing was attached: the sandbox is as it was */
        j->host_ws_fd = -1;
        return r;
    }
    /* What its warden was built for now: an overlay workspace with its upper on disk. */
    j->restackable = true;
    return 0;
}
