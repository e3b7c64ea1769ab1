/* restack-child.c - in the warden, unprivileged: a snapshot's new overlay built in the
 * warden's view of the host (JMSG_RESTACK with JRESTACK_PATHS; see restack.c for the parent's
 * side and docs/ARCHITECTURE.md "Snapshots"). No allocation. */
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jail/jail-internal.h"

/* Enter our view of the host (warden-child.c, clone_from_host_view); *@here and *@root to come back
 * with leave_host_view. */
static int enter_host_view(int *here, int *root)
{
    *here = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    *root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*here >= 0 && *root >= 0 && setns(conch_jail_warden.host_view, CLONE_NEWNS) == 0)
        return 0;
    int e = errno;
    if (*here >= 0)
        close(*here);
    if (*root >= 0)
        close(*root);
    return -e;
}

static void leave_host_view(int here, int root)
{
    /* Back into the sandbox, onto its root: a warden left in the host view would hand it to
     * every shepherd it forks. */
    if (setns(here, CLONE_NEWNS) < 0 || fchdir(root) < 0 || chroot(".") < 0 || chdir("/") < 0)
        _exit(1);
    close(here);
    close(root);
}

/* One layer (or the upper, the work dir) of the overlay being built in the host view. */
static int ovl_dir(int fs, const char *key, const char *path, struct stat *ret_st)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || (ret_st && fstat(fd, ret_st) < 0) ||
        syscall(SYS_fsconfig, fs, FSCONFIG_SET_FD, key, NULL, fd) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return -e;
    }
    return fd;
}

/* JRESTACK_PATHS: unprivileged, the new overlay is built here, in our view of the host (a
 * layer must be a mount of a namespace of ours), from the paths the parent sent in @blob
 * (the frozen layers top first, the workspace, an empty string, the upper dir, the work
 * dir; each NUL-terminated), the workspace checked to be the dir @ws is. Returns 0 with
 * *@ret_mnt and *@ret_upper, or -errno with @err. */
int conch_jail_restack_build_child(int blob, int ws, int *ret_mnt, int *ret_upper,
                                   struct conch_err *err)
{
    struct stat bst, want, got = {0};
    if (conch_jail_warden.host_view < 0 || fstat(blob, &bst) < 0 || bst.st_size < 4 ||
        bst.st_size > (8 << 20) || fstat(ws, &want) < 0)
        return conch_err_set(err, EINVAL, "warden: bad restack request");
    size_t size = (size_t)bst.st_size;
    char *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, blob, 0);
    if (p == MAP_FAILED)
        return conch_err_set(err, errno, "warden: read the restack request: %s", strerror(errno));
    int here, root, fs = -1, upper = -1, mnt = -1, e = EINVAL;
    const char *what = "its paths";
    if (p[size - 1] != '\0') {
        munmap(p, size);
        return conch_err_set(err, EINVAL, "warden: bad restack request");
    }
    int r = enter_host_view(&here, &root);
    if (r < 0) {
        munmap(p, size);
        return conch_err_set(err, -r, "restack the workspace: enter the host view: %s",
                             strerror(-r));
    }
    fs = (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
    const char *s = p, *end = p + size, *last = NULL;
    for (; fs >= 0 && s < end && *s; s += strlen(s) + 1) {
        int fd = ovl_dir(fs, "lowerdir+", s, &got);
        if (fd < 0) {
            e = -fd;
            what = s;
            goto out;
        }
        close(fd);
        last = s;
    }
    if (fs < 0 || !last || s >= end)
        goto out;
    if (got.st_dev != want.st_dev || got.st_ino != want.st_ino) {
        /* The last lower is the workspace: the very dir the parent has, or refused. */
        what = "the workspace was replaced since the sandbox was built";
        e = ESTALE;
        goto out;
    }
    const char *up = s + 1;
    if (up >= end || up + strlen(up) + 1 >= end)
        goto out;
    const char *work = up + strlen(up) + 1;
    what = up;
    if ((upper = ovl_dir(fs, "upperdir", up, NULL)) < 0) {
        e = -upper;
        goto out;
    }
    what = work;
    int wfd = ovl_dir(fs, "workdir", work, NULL);
    if (wfd < 0) {
        e = -wfd;
        goto out;
    }
    close(wfd);
    what = "the overlay";
    if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
        (mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
                            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0)
        e = errno;
out:
    leave_host_view(here, root);
    if (fs >= 0)
        close(fs);
    if (mnt < 0) {
        if (upper >= 0)
            close(upper);
        conch_err_set(err, e, "restack the workspace: %s: %s", what, strerror(e));
        munmap(p, size);
        return -e;
    }
    munmap(p, size);
    *ret_mnt = mnt;
    *ret_upper = upper;
    return 0;
}
