/* fsutil.c - small file helpers shared by every module. */
#include "core/fsutil.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
