/* fs-util.c - the fs module's plumbing: opening paths beneath the workspace root (openat2,
 * or a user-space walk with the same rules), whole-file reads, base64 and UTF-8 repair. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/utf8.h"
#include "fs/fs-internal.h"

bool conch_fs__force_walk;

/* The kernel's own limit on symlinks followed in one lookup. */
#define MAX_SYMLINKS 40
/* Directories held open by the walk (for ".."); deeper paths are ENAMETOOLONG. */
#define WALK_STACK 256

/*
 * The user-space equivalent of openat2(RESOLVE_BENEATH) for kernels or tools (valgrind)
 * without it: one component at a time, never following a symlink by the kernel
 * (O_NOFOLLOW); symlinks are read and their relative targets spliced into the rest of
 * the path; an absolute target, or ".." above @dirfd, is EXDEV, as openat2 says. Racy
 * against concurrent renames where openat2 is not, which is why it is only a fallback.
 */
static int walk(int dirfd, const char *rel, int flags, mode_t mode)
{
    int stack[WALK_STACK];
    int depth = 0, links = 0, r = 0;
    size_t pos = 0;
    char *rem = strdup(rel);
    if (!rem)
        return -ENOMEM;
    for (;;) {
        int cur = depth ? stack[depth - 1] : dirfd;
        while (rem[pos] == '/')
            pos++;
        if (!rem[pos]) {
            r = openat(cur, ".", flags | O_CLOEXEC, mode);
            if (r < 0)
                r = -errno;
            break;
        }
        char *e = strchrnul(rem + pos, '/');
        size_t n = (size_t)(e - (rem + pos));
        char name[NAME_MAX + 1];
        if (n > NAME_MAX) {
            r = -ENAMETOOLONG;
            break;
        }
        memcpy(name, rem + pos, n);
        name[n] = '\0';
        const char *after = e;
        while (*after == '/')
            after++;
        bool last = !*after;
        pos = (size_t)(e - rem);
        if (strcmp(name, ".") == 0)
            continue;
        if (strcmp(name, "..") == 0) {
            if (depth == 0 && conch_fs__in_root)
                continue; /* "/.." is "/" */
            if (depth == 0) {
                r = -EXDEV;
                break;
            }
            close(stack[--depth]);
            continue;
        }

        char target[PATH_MAX];
        ssize_t tn;
        if (!last) {
            int fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
            struct stat st;
            if (fd < 0 || fstat(fd, &st) < 0) {
                r = -errno;
                if (fd >= 0)
                    close(fd);
                break;
            }
            if (S_ISDIR(st.st_mode)) {
                if (depth == WALK_STACK) {
                    close(fd);
                    r = -ENAMETOOLONG;
                    break;
                }
                stack[depth++] = fd;
                continue;
            }
            if (!S_ISLNK(st.st_mode)) {
                close(fd);
                r = -ENOTDIR;
                break;
            }
            tn = readlinkat(fd, "", target, sizeof(target));
            if (tn < 0)
                r = -errno;
            close(fd);
        } else {
            struct stat st;
            if ((flags & O_NOFOLLOW) || fstatat(cur, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                !S_ISLNK(st.st_mode)) {
                /* Not a symlink (or not to be followed): O_NOFOLLOW makes a symlink
                 * swapped in meanwhile fail with ELOOP rather than be followed. */
                r = openat(cur, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
                if (r < 0)
                    r = -errno;
                break;
            }
            tn = readlinkat(cur, name, target, sizeof(target));
            if (tn < 0)
                r = -errno;
        }
        if (r < 0)
            break;
        if (tn >= (ssize_t)sizeof(target)) {
            r = -ENAMETOOLONG;
            break;
        }
        target[tn] = '\0';
        if (target[0] == '/' && conch_fs__in_root) {
            /* An absolute target starts again from the root. */
            while (depth > 0)
                close(stack[--depth]);
        } else if (target[0] == '/') {
            r = -EXDEV;
            break;
        }
        if (++links > MAX_SYMLINKS) {
            r = -ELOOP;
            break;
        }
        char *next = NULL;
        if (asprintf(&next, "%s/%s", target, rem + pos) < 0) {
            r = -ENOMEM;
            break;
        }
        free(rem);
        rem = next;
        pos = 0;
    }
    while (depth > 0)
        close(stack[--depth]);
    free(rem);
    return r;
}

int conch_fs__open(int dirfd, const char *rel, int flags, mode_t mode)
{
    static bool missing;
    if (!*rel)
        rel = ".";
    if (!missing && !conch_fs__force_walk) {
        struct open_how how = {
            .flags = (uint64_t)(flags | O_CLOEXEC),
            .mode = (flags & O_CREAT) ? mode : 0,
            .resolve =
                (conch_fs__in_root ? RESOLVE_IN_ROOT : RESOLVE_BENEATH) | RESOLVE_NO_MAGICLINKS,
        };
        /* EAGAIN: a concurrent rename might have let the walk escape; the kernel's advice
         * is to retry. */
        for (int tries = 0;; tries++) {
            long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
            if (fd >= 0)
                return (int)fd;
            if (errno == ENOSYS) {
                missing = true;
                break;
            }
            if ((errno != EAGAIN && errno != EINTR) || tries >= 64)
                return -errno;
        }
    }
    return walk(dirfd, rel, flags, mode);
}

int conch_fs__read_fd(int fd, size_t max, char **ret_buf, size_t *ret_len)
{
    struct stat st;
    size_t cap = 4096;
    if (fstat(fd, &st) == 0 && st.st_size > 0)
        cap = (size_t)st.st_size < max ? (size_t)st.st_size + 1 : max + 1;
    _cleanup_free_ char *buf = malloc(cap + 1);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    for (;;) {
        if (len == cap) {
            if (cap > max)
                return -EFBIG;
            size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb)
                return -ENOMEM;
            buf = nb;
            cap = ncap;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > max)
            return -EFBIG;
    }
    buf[len] = '\0';
    *ret_buf = TAKE_PTR(buf);
    *ret_len = len;
    return 0;
}

int conch_fs__read_file(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                        char **ret_buf, size_t *ret_len, struct conch_fs_error *ferr)
{
    /* O_NONBLOCK: a FIFO in the workspace must not hang the worker in open(). */
    _cleanup_close_ int fd = conch_fs__open(ctx->root_fd, rel, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0);
    if (fd < 0)
        return conch_fs__fail_errno(ferr, -fd, "open", given);
    struct stat st;
    if (fstat(fd, &st) < 0)
        return conch_fs__fail_errno(ferr, errno, "stat", given);
    if (S_ISDIR(st.st_mode))
        return conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY, "'%s' is a directory", given);
    if (!S_ISREG(st.st_mode))
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "'%s' is not a regular file", given);
    if (st.st_size > CONCH_FS_MAX_FILE)
        return conch_fs__fail(ferr, CONCH_FS_TOO_LARGE,
                              "'%s' is %lld bytes, above the limit of %lld bytes for one request "
                              "(read it in chunks: encoding base64 with offset and length)",
                              given, (long long)st.st_size, CONCH_FS_MAX_FILE);
    int r = conch_fs__read_fd(fd, CONCH_FS_MAX_FILE, ret_buf, ret_len);
    if (r == -EFBIG)
        return conch_fs__fail(ferr, CONCH_FS_TOO_LARGE, "'%s' grew above the limit of %lld bytes",
                              given, CONCH_FS_MAX_FILE);
    if (r < 0)
        return conch_fs__fail_errno(ferr, -r, "read", given);
    return 0;
}

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *conch_fs__base64_encode(const unsigned char *data, size_t len, size_t *ret_len)
{
    size_t olen = (len + 2) / 3 * 4;
    char *out = malloc(olen + 1);
    if (!out)
        return NULL;
    char *o = out;
    size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
        *o++ = b64chars[v >> 18];
        *o++ = b64chars[(v >> 12) & 63];
        *o++ = b64chars[(v >> 6) & 63];
        *o++ = b64chars[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)data[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)data[i + 1] << 8;
        *o++ = b64chars[v >> 18];
        *o++ = b64chars[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    if (ret_len)
        *ret_len = olen;
    return out;
}

static int b64val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int conch_fs__base64_decode(const char *s, size_t len, unsigned char **ret, size_t *ret_len)
{
    /* Padding is optional but, when present, only at the end and only to a multiple of 4. */
    size_t pad = 0;
    while (len > 0 && s[len - 1] == '=' && pad < 2) {
        len--;
        pad++;
    }
    if (len % 4 == 1 || (pad && (len + pad) % 4 != 0))
        return -EINVAL;
    _cleanup_free_ unsigned char *out = malloc(len / 4 * 3 + 3 + 1);
    if (!out)
        return -ENOMEM;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0)
            return -EINVAL;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    out[o] = '\0';
    *ret = TAKE_PTR(out);
    *ret_len = o;
    return 0;
}

json_t *conch_fs__json_text(const char *s, size_t len)
{
    size_t n;
    _cleanup_free_ char *clean = conch_utf8_repair(s, len, &n);
    return clean ? json_stringn(clean, n) : NULL;
}

char conch_fs__type_letter(mode_t m)
{
    if (S_ISREG(m))
        return 'f';
    if (S_ISDIR(m))
        return 'd';
    if (S_ISLNK(m))
        return 'l';
    return 'o';
}

char *conch_fs_base64_encode(const unsigned char *data, size_t len, size_t *ret_len)
{
    return conch_fs__base64_encode(data, len, ret_len);
}

int conch_fs_base64_decode(const char *s, size_t len, unsigned char **ret, size_t *ret_len)
{
    return conch_fs__base64_decode(s, len, ret, ret_len);
}
