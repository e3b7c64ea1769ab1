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
