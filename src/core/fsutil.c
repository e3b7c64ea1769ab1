/* fsutil.c - small file helpers shared by every module. */
#include "core/fsutil.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"

int conch_write_file(const char *path, const char *data, size_t len, struct conch_err *err)
{
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "open '%s': %s", path, strerror(errno));
    if (conch_write_all(fd, data, len) < 0)
        return conch_err_set(err, errno, "write '%s': %s", path, strerror(errno));
    return 0;
}

int conch_read_file(const char *path, size_t max, char **ret_buf, size_t *ret_len,
                    struct conch_err *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "open '%s': %s", path, strerror(errno));
    return conch_read_fd(fd, path, max, ret_buf, ret_len, err);
}

int conch_read_fd(int fd, const char *name, size_t max, char **ret_buf, size_t *ret_len,
                  struct conch_err *err)
{
    /* The buffer starts at the file's size (4 KiB when it says none, as /proc and sysfs
     * files do) and grows to @max while there is more: a small file costs little. */
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size : 4096;
    if (cap > max)
        cap = max;
    _cleanup_free_ char *buf = malloc(cap + 1);
    if (!buf)
        return conch_err_set(err, ENOMEM, "read '%s': out of memory", name);
    size_t len = 0;
    for (;;) {
        if (len == cap) {
            if (cap == max)
                break;
            size_t ncap = cap > max / 2 ? max : cap * 2;
            char *n = realloc(buf, ncap + 1);
            if (!n)
                return conch_err_set(err, ENOMEM, "read '%s': out of memory", name);
            buf = n;
            cap = ncap;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return conch_err_set(err, errno, "read '%s': %s", name, strerror(errno));
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    if (ret_len)
        *ret_len = len;
    *ret_buf = TAKE_PTR(buf);
    return 0;
}

int conch_mkdir_p(const char *path, mode_t mode, struct conch_err *err)
{
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(tmp))
        return conch_err_set(err, ENAMETOOLONG, "mkdir '%s': path too long", path);
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(tmp, mode) < 0 && errno != EEXIST)
                return conch_err_set(err, errno, "mkdir '%s': %s", tmp, strerror(errno));
            *p = saved;
            if (saved == '\0')
                break;
        }
    }
    return 0;
}

int conch_parse_size(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    if (!s || !isdigit((unsigned char)*s))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: '%s' is not a size (examples: 4096, 64k, 512M, 2G)", what,
                              s ? s : "");
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is out of range", what, s);
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case 't':
    case 'T':
        shift = 40;
        break;
    default:
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: '%s' has an unknown suffix (use k, M, G or T)", what, s);
    }
    if (*end && end[1] != '\0' && !((end[1] == 'i' || end[1] == 'B') && end[2] == '\0') &&
        !(end[1] == 'i' && end[2] == 'B' && end[3] == '\0'))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is not a size", what, s);
    if (shift && v > (UINT64_MAX >> shift))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is out of range", what, s);
    *ret = (uint64_t)v << shift;
    return 0;
}

/* Both loops in one: @sock sends with MSG_NOSIGNAL. */
static int put_all(int fd, const void *buf, size_t len, bool sock)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = sock ? send(fd, p, len, MSG_NOSIGNAL) : write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int conch_write_all(int fd, const void *buf, size_t len)
{
    return put_all(fd, buf, len, false);
}

int conch_send_all(int sock, const void *buf, size_t len)
{
    return put_all(sock, buf, len, true);
}

/* What openat2 would do, one component at a time, for when the syscall is missing (ENOSYS:
 * kernels before 5.6, valgrind, container seccomp profiles that predate it). "." and ".."
 * components are refused, so the walk cannot climb out of @dirfd; each component is opened
 * O_PATH|O_NOFOLLOW and checked to be a real directory, and the last is opened O_NOFOLLOW,
 * which fails with ELOOP on a symlink. */
int conch_open_beneath_walk(int dirfd, const char *path, int flags, mode_t mode, bool no_xdev)
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
    int fd = openat(cur >= 0 ? cur : dirfd, last, flags | O_NOFOLLOW | O_CLOEXEC, mode);
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

int conch_open_beneath(int dirfd, const char *path, int flags, mode_t mode, unsigned how_flags)
{
    bool no_xdev = how_flags & CONCH_BENEATH_NO_XDEV;
    struct open_how how = {
        .flags = (uint64_t)(flags | O_CLOEXEC),
        .mode = (flags & O_CREAT) ? mode : 0,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
                   (no_xdev ? RESOLVE_NO_XDEV : 0),
    };
    static _Atomic bool missing; /* openat2 said ENOSYS once: walk from then on */
    if (!*path)
        path = ".";
    if (missing)
        return conch_open_beneath_walk(dirfd, path, flags, how.mode, no_xdev);
    /* openat2 returns EAGAIN when a concurrent rename or mount might have let a
     * RESOLVE_BENEATH walk escape; the kernel's advice is to retry. */
    for (int tries = 0;; tries++) {
        long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
        if (fd >= 0)
            return (int)fd;
        if (errno == ENOSYS) {
            missing = true;
            return conch_open_beneath_walk(dirfd, path, flags, how.mode, no_xdev);
        }
        if ((errno != EAGAIN && errno != EINTR) || tries >= 64)
            return -errno;
    }
}
