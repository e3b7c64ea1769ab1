/* fs-copy.c - fs.copy_in and fs.copy_out: a whole file between a workspace path and a host
 * file the daemon opened and lent to this worker (its data_fd), copied by the kernel
 * (copy_file_range, sendfile) with no byte passing through JSON. The path rules are those of
 * fs.write and fs.read; the disk limit is the worker's RLIMIT_FSIZE, as for every write. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "fs/fs-internal.h"

/* Bytes asked of one copy_file_range / sendfile: large, but well inside ssize_t. */
#define COPY_STEP (1L << 30)
#define COPY_BUF (1u << 20)

/* What may be asked of one step: at most @step, and one byte past @max (<0: no cap) to see
 * that the file is larger. */
static size_t step_of(long long max, long long copied, size_t step)
{
    if (max < 0 || max + 1 - copied >= (long long)step)
        return step;
    return (size_t)(max + 1 - copied);
}

static int copy_rw(int in, int out, long long max, long long *copied)
{
    _cleanup_free_ char *buf = malloc(COPY_BUF);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        ssize_t n = read(in, buf, step_of(max, *copied, COPY_BUF));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        int r = conch_write_all(out, buf, (size_t)n);
        if (r < 0)
            return r;
        *copied += n;
        if (max >= 0 && *copied > max)
            return -EFBIG;
    }
}

int conch_fs__copy_fd(int in, int out, long long max, long long *ret_copied)
{
    *ret_copied = 0;
    /* copy_file_range shares extents on one filesystem and copies in the kernel across them
     * (EXDEV on kernels that refuse that: sendfile then, which takes any file to any file). */
    int mode = 0;
    for (;;) {
        size_t step = step_of(max, *ret_copied, COPY_STEP);
        ssize_t n = mode == 0   ? copy_file_range(in, NULL, out, NULL, step, 0)
                    : mode == 1 ? sendfile(out, in, NULL, step)
                                : -2;
        if (n == -2)
            return copy_rw(in, out, max, ret_copied);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && *ret_copied == 0 &&
            (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
            mode++;
            continue;
        }
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        *ret_copied += n;
        if (max >= 0 && *ret_copied > max)
            return -EFBIG;
    }
}

static json_t *oom(struct conch_fs_error *ferr)
{
    conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    return NULL;
}

/* The params, "path" parsed beneath the root (and, for copy_in, "max": the most it may write,
 * the room the daemon found for it); and the lent fd's presence checked. */
static int copy_params(const struct conch_fs__ctx *ctx, json_t *params, const char **ret_path,
                       char **ret_rel, struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"path", "max", NULL};
    size_t plen;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "path", true, ret_path, &plen, ferr) < 0)
        return -1;
    if (ctx->data_fd < 0)
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "no host file came with the request");
    return conch_fs__path_parse(ctx, *ret_path, plen, false, ret_rel, ferr);
}

json_t *conch_fs__copy_in(const struct conch_fs__ctx *ctx, json_t *params,
                          struct conch_fs_error *ferr)
{
    const char *path;
    _cleanup_free_ char *rel = NULL;
    if (copy_params(ctx, params, &path, &rel, ferr) < 0)
        return NULL;
    bool created;
    long long size;
    if (lseek(ctx->data_fd, 0, SEEK_SET) < 0) {
        conch_fs__fail_errno(ferr, errno, "seek the host file for", path);
        return NULL;
    }
    json_t *m = json_object_get(params, "max");
    long long max = json_is_integer(m) && json_integer_value(m) >= 0 ? json_integer_value(m) : -1;
    if (conch_fs__write_file_fd(ctx, rel, path, ctx->data_fd, max, &created, &size, ferr) < 0)
        return NULL;
    json_t *res = json_pack("{s:I, s:b}", "bytes_written", (json_int_t)size, "created", created);
    return res ? res : oom(ferr);
}

json_t *conch_fs__copy_out(const struct conch_fs__ctx *ctx, json_t *params,
                           struct conch_fs_error *ferr)
{
    const char *path;
    _cleanup_free_ char *rel = NULL;
    if (copy_params(ctx, params, &path, &rel, ferr) < 0)
        return NULL;
    _cleanup_close_ int fd = conch_fs__open(ctx->root_fd, rel, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0);
    if (fd < 0) {
        conch_fs__fail_errno(ferr, -fd, "read", path);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        conch_fs__fail_errno(ferr, errno, "read", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY, "'%s' is a directory", path);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "'%s' is not a regular file", path);
        return NULL;
    }
    long long size;
    int r = ftruncate(ctx->data_fd, 0) < 0 || lseek(ctx->data_fd, 0, SEEK_SET) < 0 ? -errno : 0;
    if (r == 0)
        r = conch_fs__copy_fd(fd, ctx->data_fd, -1, &size);
    /* The worker's RLIMIT_FSIZE (the sandbox's disk limit) bounds the host file too: a file
     * of the host's workspace may be larger than what the sandbox may write. */
    if (r == -EFBIG) {
        conch_fs__fail(ferr, CONCH_FS_TOO_LARGE,
                       "'%s' (%lld bytes) is larger than the sandbox's disk limit, the most a "
                       "copy out writes: read it in chunks (fs.read with offset and length)",
                       path, (long long)st.st_size);
        return NULL;
    }
    if (r < 0) {
        conch_fs__fail_errno(ferr, -r, "copy out", path);
        return NULL;
    }
    json_t *res = json_pack("{s:I}", "size", (json_int_t)size);
    return res ? res : oom(ferr);
}
