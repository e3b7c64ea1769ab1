/* since.c - a sandbox's changes since one of its snapshots (workspace.changes/diff `since`):
 * the layers above the snapshot and the live upper merged into one upper, and the view at
 * the snapshot (its layers over the host dir) built sparsely as the lower, so that the scan
 * and the diff of changes.c and diff.c read them as they read an upper and the host dir. */
#include "workspace/workspace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "workspace/ws-internal.h"

#define SINCE_UPPER "since-upper"
#define SINCE_BASE "since-base"
#define SINCE_VIEW "since-view"
#define VIEW_MAX_DEPTH 2048

static bool whiteout(const struct stat *st)
{
    return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

static bool opaque(int fd)
{
    char v[4];
    ssize_t n = fgetxattr(fd, "user.overlay.opaque", v, sizeof(v));
    if (n < 0)
        n = fgetxattr(fd, "trusted.overlay.opaque", v, sizeof(v));
    return n == 1 && v[0] == 'y';
}

static int open_dir(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

/* The names in @dfd (borrowed) appended to @ns. */
static int names_add(int dfd, struct conch_names *ns)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct conch_names more = {0};
    int r = conch_names_read(fd, &more);
    if (r < 0)
        return r;
    char **v = realloc(ns->v, (ns->n + more.n + 1) * sizeof(*v));
    if (!v) {
        conch_names_done(&more);
        return -ENOMEM;
    }
    ns->v = v;
    for (size_t i = 0; i < more.n; i++)
        ns->v[ns->n++] = more.v[i];
    more.n = 0;
    conch_names_done(&more);
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A copy of the regular file @name of @sdir as @name in @odir: a second link where it is a
 * frozen layer's (never written again), else its bytes. */
static int put_file(int sdir, const char *name, const struct stat *st, bool frozen, int odir)
{
    if (frozen && linkat(sdir, name, odir, name, 0) == 0)
        return 0;
    _cleanup_close_ int s = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (s < 0)
        return -errno;
    _cleanup_close_ int d =
        openat(odir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (d < 0)
        return -errno;
    for (;;) {
        ssize_t n = copy_file_range(s, NULL, d, NULL, 1u << 30, 0);
        if (n == 0)
            break;
        if (n > 0)
            continue;
        if (errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP && errno != ENOSYS)
            return -errno;
        char buf[65536];
        while ((n = read(s, buf, sizeof(buf))) > 0)
            if (write(d, buf, (size_t)n) != n)
                return errno ? -errno : -EIO;
        if (n < 0)
            return -errno;
        break;
    }
    return fchmod(d, st->st_mode & 07777) < 0 ? -errno : 0;
}

/* What the view (base layer over host) holds at @name of the dir whose fds are @bfd (the
 * base's dir there, or -1) and @hfd (the host's, or -1: none or hidden). Sets *@st and
 * *@src (the dir it is in) and returns 1, or returns 0 when the view has nothing there. */
static int view_entry(int bfd, int hfd, const char *name, struct stat *st, int *src, bool *frozen)
{
    if (bfd >= 0) {
        if (fstatat(bfd, name, st, AT_SYMLINK_NOFOLLOW) == 0) {
            if (whiteout(st))
                return 0;
            *src = bfd;
            *frozen = true;
            return 1;
        }
        if (errno != ENOENT)
            return -errno;
    }
    if (hfd >= 0) {
        if (fstatat(hfd, name, st, AT_SYMLINK_NOFOLLOW) == 0) {
            *src = hfd;
            *frozen = false;
            return 1;
        }
        if (errno != ENOENT)
            return -errno;
    }
    return 0;
}

static int view_dir(int ufd, int bfd, int hfd, int ofd, bool full, unsigned depth);

/* Puts the view's entry @name (found in @src, @st) into @ofd; a dir is descended into where
 * the upper @ufd has a dir @name too. */
static int view_put(int ufd, int bfd, int hfd, int ofd, const char *name, const struct stat *st,
                    int src, bool frozen, bool full, unsigned depth)
{
    if (S_ISREG(st->st_mode))
        return put_file(src, name, st, frozen, ofd);
    if (S_ISLNK(st->st_mode)) {
        _cleanup_free_ char *target = NULL;
        int r = conch_ws__read_link(src, name, &target);
        if (r < 0)
            return r;
        return symlinkat(target, ofd, name) < 0 ? -errno : 0;
    }
    if (!S_ISDIR(st->st_mode)) {
        /* FIFOs and sockets; a device node cannot be made unprivileged, and no sandbox can
         * make one: left out (the scan then sees nothing there). */
        if (mknodat(ofd, name, st->st_mode, st->st_rdev) < 0 && errno != EPERM)
            return -errno;
        return 0;
    }
    if (mkdirat(ofd, name, 0700) < 0)
        return -errno;
    _cleanup_close_ int o = open_dir(ofd, name);
    if (o < 0)
        return o;
    struct stat ust;
    int r = 0;
    if (ufd >= 0 && fstatat(ufd, name, &ust, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(ust.st_mode)) {
        _cleanup_close_ int u = open_dir(ufd, name);
        if (u < 0)
            return u;
        /* The view's dir: the base's (and the host's beneath it unless the base's is
         * opaque), or the host's alone. */
        _cleanup_close_ int b = -1, h = -1;
        if (src == bfd) {
            b = open_dir(bfd, name);
            if (b < 0)
                return b;
            struct stat hst;
            if (!opaque(b) && hfd >= 0 && fstatat(hfd, name, &hst, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISDIR(hst.st_mode) && (h = open_dir(hfd, name)) < 0)
                return h;
        } else if ((h = open_dir(hfd, name)) < 0) {
            return h;
        }
        r = view_dir(u, b, h, o, full || opaque(u), depth + 1);
    }
    return r < 0 ? r : (fchmod(o, st->st_mode & 07777) < 0 ? -errno : 0);
}

/*
 * The view at the dir whose upper is @ufd, base @bfd and host @hfd (-1: none), into @ofd:
 * every entry the upper names (whiteouts included: a deleted file's diff reads what it
 * was); with @full (the upper's dir is opaque, or one above it), every entry of the view's
 * dir too, which the scan lists to report what the opaque dir deleted.
 */
static int view_dir(int ufd, int bfd, int hfd, int ofd, bool full, unsigned depth)
{
    if (depth > VIEW_MAX_DEPTH)
        return -ELOOP;
    struct conch_names ns = {0};
    int r = names_add(ufd, &ns);
    if (r >= 0 && full && bfd >= 0)
        r = names_add(bfd, &ns);
    if (r >= 0 && full && hfd >= 0)
        r = names_add(hfd, &ns);
    if (r < 0) {
        conch_names_done(&ns);
        return r;
    }
    if (ns.n > 1)
        qsort(ns.v, ns.n, sizeof(*ns.v), cmp_name);
    for (size_t i = 0; r >= 0 && i < ns.n; i++) {
        if (i > 0 && !strcmp(ns.v[i], ns.v[i - 1]))
            continue;
        struct stat st;
        int src = -1;
        bool frozen = false;
        r = view_entry(bfd, hfd, ns.v[i], &st, &src, &frozen);
        if (r > 0)
            r = view_put(ufd, bfd, hfd, ofd, ns.v[i], &st, src, frozen, full, depth);
    }
    conch_names_done(&ns);
    return r;
}

void conch_ws_since_init(struct conch_ws_since *s)
{
    s->upper = s->lower = -1;
    s->parent = -1;
}

void conch_ws_since_done(struct conch_ws_since *s)
{
    if (s->upper >= 0)
        close(s->upper);
    if (s->lower >= 0)
        close(s->lower);
    if (s->parent >= 0) {
        conch_rm_at(s->parent, SINCE_UPPER, CONCH_RM_ONE_FS);
        conch_rm_at(s->parent, SINCE_BASE, CONCH_RM_ONE_FS);
        conch_rm_at(s->parent, SINCE_VIEW, CONCH_RM_ONE_FS);
        close(s->parent);
    }
    conch_ws_since_init(s);
}

/* One dir (a dup of the only one, or @name of @work: the merge of them all) of @n. */
static int stack_one(const int *dirs, const bool *live, int n, int work, const char *name,
                     struct conch_err *err)
{
    if (n == 1) {
        int fd = fcntl(dirs[0], F_DUPFD_CLOEXEC, 3);
        return fd < 0 ? conch_err_set(err, errno, "dup: %s", strerror(errno)) : fd;
    }
    int r = conch_ws_layers_merge(dirs, live, n, work, name, err);
    if (r < 0)
        return r;
    int fd = open_dir(work, name);
    return fd < 0 ? conch_err_set(err, -fd, "open '%s': %s", name, strerror(-fd)) : fd;
}

int conch_ws_since_prepare(int live_upper, const int *layers, int n_layers, int at, int host_fd,
                           int work_fd, struct conch_ws_since *ret, struct conch_err *err)
{
    conch_ws_since_init(ret);
    if (at < 0 || at >= n_layers || n_layers > 64)
        return conch_err_set(err, EINVAL, "since: layer %d of %d", at, n_layers);
    ret->parent = fcntl(work_fd, F_DUPFD_CLOEXEC, 3);
    if (ret->parent < 0)
        return conch_err_set(err, errno, "dup: %s", strerror(errno));
    int dirs[65];
    bool live[65] = {false};
    int n = 0;
    if (live_upper >= 0) {
        live[n] = true;
        dirs[n++] = live_upper;
    }
    for (int i = 0; i < at; i++)
        dirs[n++] = layers[i];
    if (n == 0)
        return 0; /* nothing above the snapshot: no changes since */
    int r = 0;
    _cleanup_close_ int base = -1, view = -1, h = -1;
    if ((ret->upper = stack_one(dirs, live, n, ret->parent, SINCE_UPPER, err)) < 0 ||
        (base = stack_one(layers + at, NULL, n_layers - at, ret->parent, SINCE_BASE, err)) < 0) {
        r = ret->upper < 0 ? ret->upper : base;
        goto fail;
    }
    conch_rm_at(ret->parent, SINCE_VIEW, CONCH_RM_ONE_FS);
    if (mkdirat(ret->parent, SINCE_VIEW, 0700) < 0 ||
        (view = open_dir(ret->parent, SINCE_VIEW)) < 0) {
        r = conch_err_set(err, errno, "mkdir '%s': %s", SINCE_VIEW, strerror(errno));
        goto fail;
    }
    if (host_fd >= 0 && !opaque(base) && (h = fcntl(host_fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        r = conch_err_set(err, errno, "dup: %s", strerror(errno));
        goto fail;
    }
    r = view_dir(ret->upper, base, h, view, opaque(ret->upper), 0);
    if (r < 0) {
        r = conch_err_set(err, -r, "build the workspace as at the snapshot: %s", strerror(-r));
        goto fail;
    }
    ret->lower = TAKE_FD(view);
    return 0;
fail:
    conch_ws_since_done(ret);
    return r;
}
