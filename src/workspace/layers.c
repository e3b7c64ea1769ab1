/* layers.c - the layer store: a sandbox's overlay upper dir frozen into a read-only layer
 * (a rename, never a copy), measured, squashed with the layers under it, and removed. A
 * store is a directory of layers, one sub-directory per layer id, in overlayfs's upper
 * format (whiteouts, user.overlay.* xattrs); the metadata (names, parents, sizes) is the
 * caller's. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "workspace/workspace.h"

#define LAYER_MAX_DEPTH 512

bool conch_ws_layer_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > 63 || id[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9') || id[i] == '-'))
            return false;
    return true;
}

int conch_ws_layer_freeze(int from_fd, const char *name, int store_fd, const char *id,
                          struct conch_err *err)
{
    if (!conch_ws_layer_id_ok(id))
        return conch_err_set(err, EINVAL, "layer id '%s' is not valid", id);
    /* RENAME_NOREPLACE: an id already in the store is never overwritten. */
    if (renameat2(from_fd, name, store_fd, id, RENAME_NOREPLACE) == 0)
        return 0;
    int e = errno;
    if (e == ENOENT) {
        /* Nothing was ever written: an empty layer. */
        if (mkdirat(store_fd, id, 0755) == 0)
            return 0;
        e = errno;
    }
    if (e == EXDEV)
        return conch_err_set(err, e,
                             "freeze the upper dir into layer '%s': the store is on another "
                             "filesystem than the sandbox's directory (a snapshot is a rename)",
                             id);
    return conch_err_set(err, e, "freeze the upper dir into layer '%s': %s", id, strerror(e));
}

struct walk {
    uint64_t bytes;
    uint64_t inodes;
    bool too_deep;
    dev_t dev;
};

static void walk_dir(int dfd, unsigned depth, struct walk *w)
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
        w->bytes += (uint64_t)st.st_blocks * 512;
        w->inodes++;
        if (!S_ISDIR(st.st_mode) || st.st_dev != w->dev)
            continue;
        if (depth >= LAYER_MAX_DEPTH) {
            w->too_deep = true;
            continue;
        }
        int fd = openat(dirfd(dir), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0)
            walk_dir(fd, depth + 1, w);
    }
    closedir(dir);
}

int conch_ws_layer_measure(int store_fd, const char *id, uint64_t *ret_bytes, uint64_t *ret_files,
                           struct conch_err *err)
{
    if (!conch_ws_layer_id_ok(id))
        return conch_err_set(err, EINVAL, "layer id '%s' is not valid", id);
    int fd = openat(store_fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "open layer '%s': %s", id, strerror(errno));
    uint64_t files;
    conch_ws_dir_usage(fd, ret_bytes, &files);
    if (ret_files)
        *ret_files = files;
    return 0;
}

bool conch_ws_dir_usage(int dfd, uint64_t *ret_bytes, uint64_t *ret_inodes)
{
    struct stat st;
    if (fstat(dfd, &st) < 0) {
        close(dfd);
        *ret_bytes = *ret_inodes = 0;
        return false;
    }
    struct walk w = {.dev = st.st_dev};
    walk_dir(dfd, 0, &w);
    *ret_bytes = w.bytes;
    *ret_inodes = w.inodes;
    return !w.too_deep;
}

int conch_ws_layer_remove(int store_fd, const char *id, struct conch_err *err)
{
    if (!conch_ws_layer_id_ok(id))
        return conch_err_set(err, EINVAL, "layer id '%s' is not valid", id);
    int r = conch_rm_at(store_fd, id, CONCH_RM_ONE_FS);
    if (r < 0)
        return conch_err_set(err, -r, "remove layer '%s': %s", id, strerror(-r));
    return 0;
}

/* ---- squash: several layers merged into one, as overlayfs would show them ---- */

static bool is_whiteout(const struct stat *st)
{
    return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

#define OPAQUE_XATTR "user.overlay.opaque"

static bool is_opaque(int fd)
{
    char v[4];
    ssize_t n = fgetxattr(fd, OPAQUE_XATTR, v, sizeof(v));
    return n == 1 && v[0] == 'y';
}

/* Copy the owner, mode, times and xattrs of @src onto @dst (fds; @dst a copy being made). */
static int copy_attrs(int src, int dst, const struct stat *st)
{
    if (fchown(dst, st->st_uid, st->st_gid) < 0 || fchmod(dst, st->st_mode & 07777) < 0)
        return -errno;
    char list[4096];
    ssize_t n = flistxattr(src, list, sizeof(list));
    for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(list + off) + 1) {
        char val[4096];
        ssize_t vn = fgetxattr(src, list + off, val, sizeof(val));
        if (vn >= 0)
            (void)fsetxattr(dst, list + off, val, (size_t)vn, 0);
    }
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    (void)futimens(dst, ts);
    return 0;
}

#define LINK_FILES 1u /* hard-link regular files instead of copying them (frozen layers) */

static int copy_entry(int sdir, const char *name, int ddir, const char *dname, unsigned depth,
                      unsigned flags);

static int copy_tree(int sfd, int dfd, unsigned depth, unsigned flags)
{
    /* A new open file description: a dup would share the offset of @sfd, which a reader
     * before us may have left at the end (then no entry would be seen). */
    int dup_fd = openat(sfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dup_fd < 0)
        return -errno;
    DIR *dir = fdopendir(dup_fd);
    if (!dir) {
        close(dup_fd);
        return -errno;
    }
    int r = 0;
    struct dirent *de;
    while (r >= 0 && (de = readdir(dir))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            r = copy_entry(sfd, de->d_name, dfd, de->d_name, depth + 1, flags);
    }
    closedir(dir);
    return r;
}

/* Copy @name of @sdir into @ddir as @dname (absent there): files, dirs (with what is
 * beneath), symlinks, whiteouts, with owner, mode, times and xattrs. */
static int copy_entry(int sdir, const char *name, int ddir, const char *dname, unsigned depth,
                      unsigned flags)
{
    if (depth > LAYER_MAX_DEPTH)
        return -ELOOP;
    struct stat st;
    if (fstatat(sdir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (S_ISDIR(st.st_mode)) {
        if (mkdirat(ddir, dname, 0700) < 0)
            return -errno;
        _cleanup_close_ int s = openat(sdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        _cleanup_close_ int d =
            openat(ddir, dname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (s < 0 || d < 0)
            return -errno;
        int r = copy_tree(s, d, depth, flags);
        return r < 0 ? r : copy_attrs(s, d, &st);
    }
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlinkat(sdir, name, target, sizeof(target) - 1);
        if (n < 0)
            return -errno;
        target[n] = '\0';
        if (symlinkat(target, ddir, dname) < 0)
            return -errno;
        return fchownat(ddir, dname, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
    }
    /* A frozen layer's file is never written again: a second name for it costs nothing. */
    if (S_ISREG(st.st_mode) && (flags & LINK_FILES) && linkat(sdir, name, ddir, dname, 0) == 0)
        return 0;
    if (S_ISREG(st.st_mode)) {
        _cleanup_close_ int s = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        _cleanup_close_ int d =
            openat(ddir, dname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (s < 0 || d < 0)
            return -errno;
        char buf[65536];
        ssize_t n;
        while ((n = read(s, buf, sizeof(buf))) > 0)
            if (write(d, buf, (size_t)n) != n)
                return errno ? -errno : -EIO;
        if (n < 0)
            return -errno;
        return copy_attrs(s, d, &st);
    }
    /* Whiteouts (and what else overlayfs keeps: FIFOs, sockets, device nodes a sandbox may
     * have made) are nodes of their own. */
    if (mknodat(ddir, dname, st.st_mode, st.st_rdev) < 0)
        return -errno;
    return fchownat(ddir, dname, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int merge_dir(int upper, int merged, unsigned depth, unsigned flags);

/* Put @name of the upper layer @udir over what the merged layer @mdir has there, as
 * overlayfs shows an upper entry over a lower one. */
static int merge_entry(int udir, int mdir, const char *name, unsigned depth, unsigned flags)
{
    if (depth > LAYER_MAX_DEPTH)
        return -ELOOP;
    struct stat ust, mst;
    if (fstatat(udir, name, &ust, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    bool have = fstatat(mdir, name, &mst, AT_SYMLINK_NOFOLLOW) == 0;
    if (S_ISDIR(ust.st_mode) && have && S_ISDIR(mst.st_mode)) {
        _cleanup_close_ int u = openat(udir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        _cleanup_close_ int m = openat(mdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (u < 0 || m < 0)
            return -errno;
        if (is_opaque(u)) {
            /* An opaque dir hides everything below it: it replaces the merged one. */
            int r = conch_rm_contents(m, CONCH_RM_ONE_FS);
            if (r < 0)
                return r;
        }
        int r = merge_dir(u, m, depth, flags);
        if (r < 0)
            return r;
        /* The upper dir's attributes win; an opaque mark in either stays. */
        bool opaque = is_opaque(u) || is_opaque(m);
        if ((r = copy_attrs(u, m, &ust)) < 0)
            return r;
        if (opaque && fsetxattr(m, OPAQUE_XATTR, "y", 1, 0) < 0)
            return -errno;
        return 0;
    }
    if (have) {
        int r = conch_rm_at(mdir, name, CONCH_RM_ONE_FS);
        if (r < 0)
            return r;
    }
    int r = copy_entry(udir, name, mdir, name, depth, flags);
    if (r < 0)
        return r;
    /* A dir over a whiteout or a non-dir of the layers below: nothing beneath it shows
     * through (overlayfs stops its lookup there), so in one layer it is opaque. */
    if (S_ISDIR(ust.st_mode) && have && (is_whiteout(&mst) || !S_ISDIR(mst.st_mode))) {
        _cleanup_close_ int m = openat(mdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (m < 0 || fsetxattr(m, OPAQUE_XATTR, "y", 1, 0) < 0)
            return -errno;
    }
    return 0;
}

static int merge_dir(int upper, int merged, unsigned depth, unsigned flags)
{
    int dup_fd = openat(upper, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* as copy_tree */
    if (dup_fd < 0)
        return -errno;
    DIR *dir = fdopendir(dup_fd);
    if (!dir) {
        close(dup_fd);
        return -errno;
    }
    int r = 0;
    struct dirent *de;
    while (r >= 0 && (de = readdir(dir))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            r = merge_entry(upper, merged, de->d_name, depth + 1, flags);
    }
    closedir(dir);
    return r;
}

int conch_ws_layers_merge(const int *dirs, const bool *live, int n, int out_parent,
                          const char *out_name, struct conch_err *err)
{
    if (n < 1)
        return conch_err_set(err, EINVAL, "merge: no layers");
    conch_rm_at(out_parent, out_name, CONCH_RM_ONE_FS);
    if (mkdirat(out_parent, out_name, 0755) < 0)
        return conch_err_set(err, errno, "merge: mkdir '%s': %s", out_name, strerror(errno));
    _cleanup_close_ int m =
        openat(out_parent, out_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int r = m < 0 ? -errno : 0;
    struct stat st;
    if (r >= 0 && fstat(dirs[n - 1], &st) < 0)
        r = -errno;
    if (r >= 0)
        r = copy_tree(dirs[n - 1], m, 0, live && live[n - 1] ? 0 : LINK_FILES);
    if (r >= 0)
        r = copy_attrs(dirs[n - 1], m, &st);
    for (int i = n - 2; r >= 0 && i >= 0; i--) {
        if ((r = merge_dir(dirs[i], m, 0, live && live[i] ? 0 : LINK_FILES)) >= 0 &&
            is_opaque(dirs[i]))
            (void)fsetxattr(m, OPAQUE_XATTR, "y", 1, 0);
    }
    if (r < 0) {
        conch_rm_at(out_parent, out_name, CONCH_RM_ONE_FS);
        return conch_err_set(err, -r, "merge %d layers: %s", n, strerror(-r));
    }
    return 0;
}

int conch_ws_layer_squash(int store_fd, const char *const *ids, int n, const char *new_id,
                          struct conch_err *err)
{
    if (n < 1 || n > 64)
        return conch_err_set(err, EINVAL, "squash: 1 to 64 layers");
    if (!conch_ws_layer_id_ok(new_id))
        return conch_err_set(err, EINVAL, "layer id '%s' is not valid", new_id);
    int fds[64];
    int opened = 0, r = 0;
    for (; opened < n; opened++) {
        if (!conch_ws_layer_id_ok(ids[opened])) {
            r = conch_err_set(err, EINVAL, "layer id '%s' is not valid", ids[opened]);
            break;
        }
        fds[opened] =
            openat(store_fd, ids[opened], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fds[opened] < 0) {
            r = conch_err_set(err, errno, "squash: open layer '%s': %s", ids[opened],
                              strerror(errno));
            break;
        }
    }
    /* Built under a temporary name and renamed into place: a crash leaves no half layer
     * under a name the store lists. */
    char tmp[80];
    snprintf(tmp, sizeof(tmp), ".squash-%s", new_id);
    if (r >= 0)
        r = conch_ws_layers_merge(fds, NULL, n, store_fd, tmp, err);
    if (r >= 0 && renameat2(store_fd, tmp, store_fd, new_id, RENAME_NOREPLACE) < 0) {
        r = conch_err_set(err, errno, "squash: rename into layer '%s': %s", new_id,
                          strerror(errno));
        conch_rm_at(store_fd, tmp, CONCH_RM_ONE_FS);
    }
    while (opened > 0)
        close(fds[--opened]);
    return r;
}
