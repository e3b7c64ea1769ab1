/* select.c - acting on part of a change list: choosing the changes at given paths, and
 * taking changes out of the overlay's upper dir once they are committed or discarded. */
#include "workspace/workspace.h"

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
#include "workspace/ws-internal.h"

/* ---- selecting --------------------------------------------------------------------- */

/* Turns a client's path into a change path: "" for the workspace root itself. */
static int normalize(const char *in, char **ret)
{
    const char *p = in;
    if (!*p)
        return -EINVAL;
    if (*p == '/') {
        if (strncmp(p, "/workspace", 10) != 0 || (p[10] != '\0' && p[10] != '/'))
            return -EINVAL;
        p += 10;
    }
    size_t len = strlen(p);
    if (len >= 4096)
        return -ENAMETOOLONG;
    char *out = malloc(len + 1);
    if (!out)
        return -ENOMEM;
    size_t o = 0;
    while (*p) {
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        if (n == 0 || (n == 1 && p[0] == '.')) {
            p += n;
            continue;
        }
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            if (o == 0) {
                free(out);
                return -EINVAL; /* would leave the workspace */
            }
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--;
            p += n;
            continue;
        }
        if (o)
            out[o++] = '/';
        memcpy(out + o, p, n);
        o += n;
        p += n;
    }
    out[o] = '\0';
    *ret = out;
    return 0;
}

static int cmp_change_ptr(const void *a, const void *b)
{
    return strcmp((*(const struct conch_ws_change *const *)a)->path,
                  (*(const struct conch_ws_change *const *)b)->path);
}

/* Marks the changes at or beneath @p (indices into @all) using @v, @all's items sorted by
 * path; returns how many. */
static size_t mark_under(const struct conch_ws_changes *all, const struct conch_ws_change **v,
                         const char *p, bool *marked)
{
    size_t len = strlen(p), lo = 0, hi = all->n, count = 0;
    if (len == 0) {
        for (size_t i = 0; i < all->n; i++)
            marked[i] = true;
        return all->n;
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(v[mid]->path, p) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* Everything with the prefix @p is contiguous in strcmp order; "p-x" sorts between
     * "p" and "p/x", so the walk skips such names rather than stopping at them. */
    for (size_t i = lo; i < all->n; i++) {
        const char *path = v[i]->path;
        if (strncmp(path, p, len) != 0)
            break;
        if (path[len] == '\0' || path[len] == '/') {
            marked[v[i] - all->items] = true;
            count++;
        }
    }
    return count;
}

static int copy_change(const struct conch_ws_change *from, struct conch_ws_change *to)
{
    *to = *from;
    to->path = strdup(from->path);
    return to->path ? 0 : -ENOMEM;
}

int conch_ws_changes_select(const struct conch_ws_changes *all, char *const *paths,
                            struct conch_ws_changes *ret, struct conch_err *err)
{
    static const struct conch_ws_changes none = {0};
    if (!all)
        all = &none;
    for (size_t i = 0; i < all->n; i++)
        if (!all->items[i].path)
            return conch_err_set(err, EINVAL, "select changes: a change has no path");
    _cleanup_free_ bool *marked = calloc(all->n + 1, sizeof(*marked));
    _cleanup_free_ const struct conch_ws_change **v = calloc(all->n + 1, sizeof(*v));
    if (!marked || !v)
        return conch_err_set(err, ENOMEM, "select changes: out of memory");
    /* Callers may hand in any order (scan's is sorted already, and qsort is quick then). */
    for (size_t i = 0; i < all->n; i++)
        v[i] = &all->items[i];
    qsort(v, all->n, sizeof(*v), cmp_change_ptr);

    if (!paths) {
        for (size_t i = 0; i < all->n; i++)
            marked[i] = true;
    }
    for (size_t k = 0; paths && paths[k]; k++) {
        _cleanup_free_ char *p = NULL;
        int r = normalize(paths[k], &p);
        if (r == -ENOMEM)
            return conch_err_set(err, ENOMEM, "select changes: out of memory");
        if (r < 0) {
            _cleanup_free_ char *q = conch_ws__qname(paths[k]);
            return conch_err_setk(err, CONCH_ERR_USAGE, -r, "invalid path %s: %s", q ? q : "",
                                  r == -EINVAL ? "empty, or outside /workspace" : strerror(-r));
        }
        if (mark_under(all, v, p, marked) == 0 && *p) {
            _cleanup_free_ char *q = conch_ws__qname(paths[k]);
            return conch_err_setk(err, CONCH_ERR_USAGE, ENOENT, "%s has no change in the workspace",
                                  q ? q : "");
        }
    }

    struct conch_ws_changes out = {0};
    size_t n = 0;
    for (size_t i = 0; i < all->n; i++)
        n += marked[i];
    out.items = calloc(n ? n : 1, sizeof(*out.items));
    if (!out.items)
        return conch_err_set(err, ENOMEM, "select changes: out of memory");
    for (size_t i = 0; i < all->n; i++) {
        if (!marked[i])
            continue;
        if (copy_change(&all->items[i], &out.items[out.n]) < 0) {
            conch_ws_changes_done(&out);
            return conch_err_set(err, ENOMEM, "select changes: out of memory");
        }
        out.n++;
    }
    *ret = out;
    return 0;
}

/* ---- removing from the upper dir --------------------------------------------------- */

static int split(const char *path, char **ret_parent, const char **ret_name)
{
    const char *slash = strrchr(path, '/');
    char *parent = slash ? strndup(path, (size_t)(slash - path)) : strdup("");
    if (!parent)
        return -ENOMEM;
    *ret_parent = parent;
    *ret_name = slash ? slash + 1 : path;
    return 0;
}

static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s%s%s", dir, *dir ? "/" : "", name) < 0)
        return NULL;
    return p;
}

/* The entry names of the dir @rel beneath @base (never through a symlink). The dir is
 * closed again before the caller descends, so deep trees cannot exhaust fds. */
static int list_dir(int base, const char *rel, struct conch_names *ret)
{
    int fd = conch_open_beneath(base, rel, O_RDONLY | O_DIRECTORY, 0, 0);
    if (fd < 0)
        return fd;
    return conch_names_read(fd, ret);
}

/* Removes the entry @rel beneath @base: a file, symlink (never its target), whiteout or
 * a directory with all it holds, however deep. A missing entry is not an error. */
static int remove_at(int base, const char *rel)
{
    _cleanup_free_ char *parent = NULL;
    const char *name;
    if (split(rel, &parent, &name) < 0)
        return -ENOMEM;
    _cleanup_close_ int pfd = conch_open_beneath(base, parent, O_PATH | O_DIRECTORY, 0, 0);
    if (pfd == -ENOENT || pfd == -ENOTDIR)
        return 0;
    if (pfd < 0)
        return pfd;
    return conch_rm_at(pfd, name, 0);
}

static bool fd_opaque(int fd)
{
    static const char *const keys[] = {"user.overlay.opaque", "trusted.overlay.opaque"};
    for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
        char v[4];
        if (fgetxattr(fd, keys[i], v, sizeof(v)) == 1 && v[0] == 'y')
            return true;
    }
    return false;
}

/* Whether an opaque upper dir at or above @dir (a path) hides the host's entries below
 * @dir. Overlayfs stops merging at the first opaque dir, so the walk stops at the first
 * upper component that is missing (the host shows from there on) or not a dir. */
static int hidden_below(int upper_fd, const char *dir, bool *ret)
{
    size_t len = strlen(dir);
    *ret = false;
    /* Prefixes "", "a", "a/b", ... up to @dir itself. */
    for (size_t end = 0;;) {
        _cleanup_free_ char *prefix = strndup(dir, end);
        if (!prefix)
            return -ENOMEM;
        int fd = conch_open_beneath(upper_fd, prefix, O_RDONLY | O_DIRECTORY, 0, 0);
        if (fd == -ENOENT || fd == -ENOTDIR || fd == -ELOOP)
            return 0;
        if (fd < 0)
            return fd;
        bool opaque = fd_opaque(fd);
        close(fd);
        if (opaque) {
            *ret = true;
            return 0;
        }
        if (end >= len)
            return 0;
        const char *slash = strchr(dir + end + 1, '/');
        end = slash ? (size_t)(slash - dir) : len;
    }
}

/* Gives @name in @dfd the owner, mode and times of the host's @st: what a copy-up by
 * overlayfs would have kept. */
static int set_meta(int dfd, const char *name, const struct stat *st)
{
    /* Only root may give files away; another daemon user keeps its own uid. */
    if (fchownat(dfd, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0 && errno != EPERM)
        return -errno;
    if (!S_ISLNK(st->st_mode) && fchmodat(dfd, name, st->st_mode & 07777, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    return utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int copy_file(int lpfd, int upfd, const char *name)
{
    _cleanup_close_ int src =
        openat(lpfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (src < 0)
        return -errno;
    struct stat st;
    if (fstat(src, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return -ESTALE;
    _cleanup_close_ int dst =
        openat(upfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (dst < 0)
        return -errno;
    _cleanup_free_ char *buf = malloc(64 * 1024);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        ssize_t n = read(src, buf, 64 * 1024);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        int r = conch_write_all(dst, buf, (size_t)n);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Copies the host's entry @rel (a tree, if a dir) into the upper dir at the same path,
 * whose parent exists there. A host path that is missing or under a non-dir is skipped. */
static int copy_in(int upper_fd, int lower_fd, const char *rel)
{
    _cleanup_free_ char *parent = NULL;
    const char *name;
    if (split(rel, &parent, &name) < 0)
        return -ENOMEM;
    _cleanup_close_ int lpfd = conch_open_beneath(lower_fd, parent, O_PATH | O_DIRECTORY, 0, 0);
    if (lpfd == -ENOENT || lpfd == -ENOTDIR || lpfd == -ELOOP)
        return 0;
    if (lpfd < 0)
        return lpfd;
    struct stat st;
    if (fstatat(lpfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    _cleanup_close_ int upfd = conch_open_beneath(upper_fd, parent, O_PATH | O_DIRECTORY, 0, 0);
    if (upfd < 0)
        return upfd;
    int r = 0;
    switch (st.st_mode & S_IFMT) {
    case S_IFREG:
        r = copy_file(lpfd, upfd, name);
        break;
    case S_IFLNK: {
        _cleanup_free_ char *target = NULL;
        r = conch_ws__read_link(lpfd, name, &target);
        if (r >= 0 && symlinkat(target, upfd, name) < 0)
            r = -errno;
        break;
    }
    case S_IFDIR: {
        if (mkdirat(upfd, name, 0700) < 0)
            return -errno;
        struct conch_names ns = {0};
        r = list_dir(lower_fd, rel, &ns);
        for (size_t i = 0; r >= 0 && i < ns.n; i++) {
            _cleanup_free_ char *child = join(rel, ns.v[i]);
            r = child ? copy_in(upper_fd, lower_fd, child) : -ENOMEM;
        }
        conch_names_done(&ns);
        break;
    }
    case S_IFIFO:
        r = mkfifoat(upfd, name, 0600) < 0 ? -errno : 0;
        break;
    case S_IFCHR:
    case S_IFBLK:
        r = mknodat(upfd, name, st.st_mode & S_IFMT, st.st_rdev) < 0 ? -errno : 0;
        break;
    default:
        return 0; /* a socket is only a name; nothing to copy */
    }
    if (r >= 0)
        r = set_meta(upfd, name, &st);
    return r;
}

/* Whether a proper ancestor of @path is among @v (sorted). */
static bool ancestor_listed(const struct conch_ws_change **v, size_t n, const char *path)
{
    _cleanup_free_ char *p = strdup(path);
    if (!p)
        return false;
    for (char *slash = strrchr(p, '/'); slash; slash = strrchr(p, '/')) {
        *slash = '\0';
        struct conch_ws_change key = {.path = p};
        const struct conch_ws_change *kp = &key;
        if (bsearch(&kp, v, n, sizeof(*v), cmp_change_ptr))
            return true;
    }
    return false;
}

static int remove_one(int upper_fd, int lower_fd, const char *path, const char **what)
{
    *what = "remove from the sandbox's layer";
    int r = remove_at(upper_fd, path);
    if (r < 0)
        return r;
    _cleanup_free_ char *parent = NULL;
    const char *name;
    if (split(path, &parent, &name) < 0)
        return -ENOMEM;
    bool hidden = false;
    *what = "check for an opaque dir above";
    r = hidden_below(upper_fd, parent, &hidden);
    if (r < 0 || !hidden)
        return r;
    *what = "copy the host's entry into the sandbox's layer";
    return copy_in(upper_fd, lower_fd, path);
}

int conch_ws_upper_remove(int upper_fd, int lower_fd, const struct conch_ws_changes *changes,
                          struct conch_err *err)
{
    if (!changes || changes->n == 0)
        return 0;
    _cleanup_free_ const struct conch_ws_change **v = calloc(changes->n, sizeof(*v));
    if (!v)
        return conch_err_set(err, ENOMEM, "remove changes: out of memory");
    for (size_t i = 0; i < changes->n; i++) {
        const char *p = changes->items[i].path;
        if (!p || !conch_ws__path_ok(p)) {
            _cleanup_free_ char *q = p ? conch_ws__qname(p) : NULL;
            return conch_err_set(err, EINVAL, "remove change %s: invalid path", q ? q : "(null)");
        }
        v[i] = &changes->items[i];
    }
    qsort(v, changes->n, sizeof(*v), cmp_change_ptr);

    int first = 0;
    for (size_t i = 0; i < changes->n; i++) {
        const char *path = v[i]->path;
        /* Duplicates, and entries that go with a listed dir's tree. */
        if ((i > 0 && strcmp(path, v[i - 1]->path) == 0) || ancestor_listed(v, changes->n, path))
            continue;
        const char *what = NULL;
        int r = remove_one(upper_fd, lower_fd, path, &what);
        if (r < 0 && first == 0) {
            _cleanup_free_ char *q = conch_ws__qname(path);
            first = conch_err_set(err, -r, "%s: %s: %s", q ? q : "", what,
                                  r == -ELOOP ? "a component is a symlink" : strerror(-r));
        }
    }
    return first;
}

int conch_ws_upper_clear(int upper_fd, struct conch_err *err)
{
    int r = conch_rm_contents(upper_fd, 0);
    if (r < 0)
        return conch_err_set(err, -r, "clear the sandbox's layer: %s", strerror(-r));
    /* An opaque root would go on hiding the host dir. */
    (void)fremovexattr(upper_fd, "user.overlay.opaque");
    (void)fremovexattr(upper_fd, "trusted.overlay.opaque");
    return 0;
}
