/* ws-internal.h - helpers shared by the workspace's scan (changes.c) and commit (commit.c):
 * symlink-proof path resolution and entry classification. Not part of the module's API. */
#ifndef CONCH_WORKSPACE_WS_INTERNAL_H
#define CONCH_WORKSPACE_WS_INTERNAL_H

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/fsutil.h"

/* Size of the prefix read to decide whether content is binary (git uses the same rule). */
#define CONCH_WS__BINARY_PROBE 8192

/*
 * What openat2 would do, one component at a time, for when the syscall is missing
 * (ENOSYS: kernels before 5.6, valgrind, container seccomp profiles that predate it).
 * Callers reject "." and ".." components, so walking beneath @dirfd cannot climb out;
 * each component is opened O_PATH|O_NOFOLLOW and checked to be a real directory, and
 * the last is opened O_NOFOLLOW, which fails with ELOOP on a symlink.
 */
static inline int conch_ws__openat2_walk(int dirfd, const char *path, int flags, bool no_xdev)
{
    struct stat st;
    if (fstat(dirfd, &st) < 0)
        return -errno;
    dev_t dev = st.st_dev;
    int cur = -1; /* -1: still at dirfd */
    const char *p = path;
    for (;;) {
        const char *slash = strchr(p, '/');
        if (!slash)
            break;
        char comp[256];
        size_t n = (size_t)(slash - p);
        if (n == 0 || n >= sizeof(comp) || (n == 1 && p[0] == '.') ||
            (n == 2 && p[0] == '.' && p[1] == '.')) {
            if (cur >= 0)
                close(cur);
            return -EINVAL;
        }
        memcpy(comp, p, n);
        comp[n] = '\0';
        int next = openat(cur >= 0 ? cur : dirfd, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        int r = next < 0 ? -errno : 0;
        if (r == 0 && fstat(next, &st) < 0)
            r = -errno;
        if (r == 0 && S_ISLNK(st.st_mode))
            r = -ELOOP;
        else if (r == 0 && !S_ISDIR(st.st_mode))
            r = -ENOTDIR;
        else if (r == 0 && no_xdev && st.st_dev != dev)
            r = -EXDEV;
        if (cur >= 0)
            close(cur);
        if (r < 0) {
            if (next >= 0)
                close(next);
            return r;
        }
        cur = next;
        p = slash + 1;
    }
    const char *last = *p ? p : ".";
    if (strcmp(last, "..") == 0) {
        if (cur >= 0)
            close(cur);
        return -EINVAL;
    }
    int fd = openat(cur >= 0 ? cur : dirfd, last, flags | O_NOFOLLOW | O_CLOEXEC);
    int r = fd < 0 ? -errno : 0;
    /* O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR; report it as openat2 would. */
    if (r == -ENOTDIR && fstatat(cur >= 0 ? cur : dirfd, last, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode))
        r = -ELOOP;
    if (cur >= 0)
        close(cur);
    if (r == 0 && (flags & O_PATH) && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode))
        r = -ELOOP; /* O_PATH|O_NOFOLLOW opens a symlink itself instead of failing */
    else if (r == 0 && no_xdev && fstat(fd, &st) == 0 && st.st_dev != dev)
        r = -EXDEV;
    if (r < 0 && fd >= 0)
        close(fd);
    return r < 0 ? r : fd;
}

/*
 * conch_ws__openat2 - open @path (relative, "" = @dirfd itself) beneath @dirfd without
 * following any symlink, in any component including the last, nor leaving @dirfd's tree.
 * With @no_xdev, crossing a mount point fails too (EXDEV). O_CLOEXEC is added. Returns
 * a new fd or -errno: ELOOP for a symlink, EXDEV for an escape or a mount crossing.
 */
static inline int conch_ws__openat2(int dirfd, const char *path, int flags, bool no_xdev)
{
    struct open_how how = {
        .flags = (uint64_t)(flags | O_CLOEXEC),
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    if (no_xdev)
        how.resolve |= RESOLVE_NO_XDEV;
    /* Per translation unit, which is fine: at most one failed probe each. */
    static bool missing;
    if (!*path)
        path = ".";
    if (missing)
        return conch_ws__openat2_walk(dirfd, path, flags, no_xdev);
    /* openat2 returns EAGAIN when a concurrent rename or mount might have let a
     * RESOLVE_BENEATH walk escape; the kernel's advice is to retry. */
    for (int tries = 0;; tries++) {
        long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
        if (fd >= 0)
            return (int)fd;
        if (errno == ENOSYS) {
            missing = true;
            return conch_ws__openat2_walk(dirfd, path, flags, no_xdev);
        }
        if ((errno != EAGAIN && errno != EINTR) || tries >= 64)
            return -errno;
    }
}

/* conch_ws__type - the API's one-letter file type for @mode: 'f', 'd', 'l' or 'o'. */
static inline char conch_ws__type(mode_t mode)
{
    if (S_ISREG(mode))
        return 'f';
    if (S_ISDIR(mode))
        return 'd';
    if (S_ISLNK(mode))
        return 'l';
    return 'o';
}

/*
 * conch_ws__path_ok - whether @path is a change path we are willing to act on: relative,
 * non-empty, no empty, "." or ".." components, shorter than PATH_MAX.
 */
static inline bool conch_ws__path_ok(const char *path)
{
    size_t len = strlen(path);
    if (len == 0 || len >= 4096 || path[0] == '/')
        return false;
    const char *p = path;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (!slash)
            return true;
        p = slash + 1;
    }
}

/* conch_ws__read_link - the target of symlink @name in @dfd as a new string (*@ret). */
static inline int conch_ws__read_link(int dfd, const char *name, char **ret)
{
    for (size_t size = 256; size <= 65536; size *= 2) {
        char *buf = malloc(size);
        if (!buf)
            return -ENOMEM;
        ssize_t n = readlinkat(dfd, name, buf, size);
        if (n < 0) {
            int r = -errno;
            free(buf);
            return r;
        }
        if ((size_t)n < size) {
            buf[n] = '\0';
            *ret = buf;
            return 0;
        }
        free(buf);
    }
    return -ENAMETOOLONG;
}

char *conch_ws_quote(const char *prefix, const char *name, bool ascii);

/*
 * conch_ws__qname - @path for an error message: in single quotes, or, when it holds bytes
 * that must not reach a terminal or log raw, C-quoted (conch_ws_quote). Returns a new
 * string, or NULL when out of memory.
 */
static inline char *conch_ws__qname(const char *path)
{
    char *q = conch_ws_quote("", path, false);
    if (!q || q[0] == '"')
        return q;
    size_t n = strlen(q);
    char *out = malloc(n + 3);
    if (out) {
        out[0] = '\'';
        memcpy(out + 1, q, n);
        out[n + 1] = '\'';
        out[n + 2] = '\0';
    }
    free(q);
    return out;
}

#endif
