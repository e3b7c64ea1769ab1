/* fs-write.c - the changing methods: fs.write, fs.edit, fs.delete and fs.upload. Files
 * are replaced through a temporary file renamed over them, so a reader sees the old
 * content or the new, never half of it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "fs/fs-internal.h"

/* Largest file fs.edit will produce. */
#define MAX_EDIT_RESULT (64LL * 1024 * 1024)
/* Directory levels a recursive delete descends; deeper trees fail rather than exhaust fds. */

static json_t *oom(struct conch_fs_error *ferr)
{
    conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    return NULL;
}

/* Open (O_PATH) the directory @parent, creating it and its missing ancestors (0755). */
static int mkdir_parents(int root_fd, const char *parent)
{
    int prev = -1;
    size_t i = 0;
    for (;;) {
        size_t end = i + strcspn(parent + i, "/");
        _cleanup_free_ char *prefix = strndup(parent, end);
        _cleanup_free_ char *comp = strndup(parent + i, end - i);
        if (!prefix || !comp) {
            if (prev >= 0)
                close(prev);
            return -ENOMEM;
        }
        int fd = conch_fs__open(root_fd, prefix, O_PATH | O_DIRECTORY, 0);
        if (fd == -ENOENT) {
            /* @prev was itself resolved beneath the root and @comp is one plain name, so
             * mkdirat cannot land outside. EEXIST: someone else was faster. */
            if (mkdirat(prev >= 0 ? prev : root_fd, comp, 0755) < 0 && errno != EEXIST)
                fd = -errno;
            else
                fd = conch_fs__open(root_fd, prefix, O_PATH | O_DIRECTORY, 0);
        }
        if (prev >= 0)
            close(prev);
        if (fd < 0)
            return fd;
        prev = fd;
        if (!parent[end])
            return prev;
        i = end + 1;
    }
}

/* Open @rel's parent directory (O_PATH); *@ret_name points into @rel at the last name. */
static int open_parent(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                       bool create, const char **ret_name, struct conch_fs_error *ferr)
{
    const char *slash = strrchr(rel, '/');
    _cleanup_free_ char *parent = slash ? strndup(rel, (size_t)(slash - rel)) : strdup("");
    if (!parent)
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    int fd = conch_fs__open(ctx->root_fd, parent, O_PATH | O_DIRECTORY, 0);
    if (fd == -ENOENT && create)
        fd = mkdir_parents(ctx->root_fd, parent);
    if (fd < 0)
        return conch_fs__fail_errno(ferr, -fd, "open the directory of", given);
    *ret_name = slash ? slash + 1 : rel;
    return fd;
}

/* What a write puts in the file: @len bytes at @data, or (@fd >= 0) all that can be read from
 * @fd, its count stored in *@copied. */
struct src {
    const char *data;
    size_t len;
    int fd;
    long long max; /* the most to copy from @fd (<0: no cap); more is EFBIG */
    long long *copied;
};

static int put(int fd, const struct src *src)
{
    if (src->fd >= 0)
        return conch_fs__copy_fd(src->fd, fd, src->max, src->copied);
    return conch_write_all(fd, src->data, src->len);
}

/* Open @rel with @flags (beneath the root; created 0644 without O_TRUNC when missing), check
 * that it is a regular file and write @data to it. @verb names the action in errors
 * ("write", "append to"). */
static int write_regular(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                         int flags, const char *verb, const struct src *src, bool *ret_created,
                         struct conch_fs_error *ferr)
{
    bool created = false;
    int fd = conch_fs__open(ctx->root_fd, rel, flags, 0);
    if (fd == -ENOENT) {
        created = true;
        fd = conch_fs__open(ctx->root_fd, rel, (flags & ~O_TRUNC) | O_CREAT | O_EXCL, 0644);
    }
    if (fd < 0)
        return conch_fs__fail_errno(ferr, -fd, verb, given);
    struct stat st;
    int r = fstat(fd, &st) < 0 ? -errno : 0;
    if (r == 0 && S_ISDIR(st.st_mode))
        r = -EISDIR;
    else if (r == 0 && !S_ISREG(st.st_mode))
        r = -EINVAL;
    if (r == 0)
        r = put(fd, src);
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == -EINVAL)
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "'%s' is not a regular file", given);
    if (r < 0)
        return conch_fs__fail_errno(ferr, -r, verb, given);
    *ret_created = created;
    return 0;
}

/* A final symlink: write through it in place (following it beneath the root). Not atomic,
 * but replacing the link by a file would silently detach it from its target. */
static int write_through(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                         const struct src *src, bool *ret_created, struct conch_fs_error *ferr)
{
    return write_regular(ctx, rel, given, O_WRONLY | O_TRUNC | O_NOCTTY | O_NONBLOCK, "write", src,
                         ret_created, ferr);
}

static int write_file_src(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                          const struct src *src, bool *ret_created, struct conch_fs_error *ferr)
{
    if (!*rel)
        return conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY, "'%s' is a directory", given);
    const char *name;
    _cleanup_close_ int pfd = open_parent(ctx, rel, given, true, &name, ferr);
    if (pfd < 0)
        return -1;

    struct stat st;
    mode_t mode = 0644;
    bool exists = false;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISDIR(st.st_mode))
            return conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY, "'%s' is a directory", given);
        if (S_ISLNK(st.st_mode))
            return write_through(ctx, rel, given, src, ret_created, ferr);
        if (!S_ISREG(st.st_mode))
            return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "'%s' is not a regular file", given);
        /* The rename only needs the directory writable; keep the file's own permission
         * meaningful, as an in-place write would. */
        if (faccessat(pfd, name, W_OK, AT_EACCESS) < 0)
            return conch_fs__fail_errno(ferr, errno, "write", given);
        /* Without set-uid/set-gid: a write by an unprivileged process clears them, and the
         * seccomp filter refuses to set them. */
        mode = st.st_mode & 01777;
        exists = true;
    } else if (errno != ENOENT) {
        return conch_fs__fail_errno(ferr, errno, "write", given);
    }

    /* Created with its final mode when the umask leaves it whole (no fchmod: one inode
     * update less); else 0600 and fchmod. The temporary file shows nothing the old one at
     * the same mode did not. */
    static mode_t umask_now = (mode_t)-1;
    if (umask_now == (mode_t)-1) {
        umask_now = umask(022);
        umask(umask_now);
    }
    bool direct = (mode & ~(mode_t)0777) == 0 && (mode & umask_now) == 0;
    char tmp[64];
    int tfd = -1;
    for (int tries = 0; tfd < 0 && tries < 16; tries++) {
        uint64_t rnd;
        if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
            rnd = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)tries;
        snprintf(tmp, sizeof(tmp), ".conch-write-%016llx", (unsigned long long)rnd);
        tfd = openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     direct ? mode : 0600);
        if (tfd < 0 && errno != EEXIST)
            break;
    }
    if (tfd < 0)
        return conch_fs__fail_errno(ferr, errno, "write", given);
    int r = put(tfd, src);
    if (r == 0 && !direct && fchmod(tfd, mode) < 0)
        r = -errno;
    if (close(tfd) < 0 && r == 0)
        r = -errno;
    /* Replacing a file with deferral on (conch_fs_defer_replaced): the old one is held
     * open, and freed after the answer. (Not RENAME_EXCHANGE with the old file left under
     * the temporary name: that name was visible to the workspace's scans until the answer
     * was out, and overlayfs copies the target of an exchange up, data and all.) */
    if (r == 0 && exists)
        conch_fs__hold_replaced(pfd, name);
    if (r == 0 && renameat(pfd, tmp, pfd, name) < 0)
        r = -errno;
    if (r < 0) {
        unlinkat(pfd, tmp, 0);
        return conch_fs__fail_errno(ferr, -r, "write", given);
    }
    *ret_created = !exists;
    return 0;
}

int conch_fs__write_file(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                         const char *data, size_t len, bool *ret_created,
                         struct conch_fs_error *ferr)
{
    struct src src = {.data = data, .len = len, .fd = -1};
    return write_file_src(ctx, rel, given, &src, ret_created, ferr);
}

int conch_fs__write_file_fd(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                            int src_fd, long long max, bool *ret_created, long long *ret_size,
                            struct conch_fs_error *ferr)
{
    long long copied = 0;
    struct src src = {.fd = src_fd, .max = max, .copied = &copied};
    if (write_file_src(ctx, rel, given, &src, ret_created, ferr) < 0)
        return -1;
    *ret_size = copied;
    return 0;
}

/* Append @len bytes to @rel (created 0644 if missing, through a final symlink). */
static int append_file(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                       const char *data, size_t len, bool *ret_created, struct conch_fs_error *ferr)
{
    if (!*rel)
        return conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY, "'%s' is a directory", given);
    const char *name;
    _cleanup_close_ int pfd = open_parent(ctx, rel, given, true, &name, ferr);
    if (pfd < 0)
        return -1;
    struct src src = {.data = data, .len = len, .fd = -1};
    return write_regular(ctx, rel, given, O_WRONLY | O_APPEND | O_NOCTTY | O_NONBLOCK, "append to",
                         &src, ret_created, ferr);
}

/* One request carries at most CONCH_FS_MAX_FILE bytes of a file, as one may read back. */
static int check_size(size_t len, const char *given, struct conch_fs_error *ferr)
{
    if ((long long)len <= CONCH_FS_MAX_FILE)
        return 0;
    return conch_fs__fail(ferr, CONCH_FS_TOO_LARGE,
                          "content for '%s' is %zu bytes, above the limit of %lld bytes for one "
                          "request (write it in chunks: fs.write with append)",
                          given, len, CONCH_FS_MAX_FILE);
}

json_t *conch_fs__write(const struct conch_fs__ctx *ctx, json_t *params,
                        struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"path", "content", "encoding", "append", NULL};
    const char *path, *content;
    size_t plen, clen;
    bool base64, append;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "path", true, &path, &plen, ferr) < 0 ||
        conch_fs__param_str(params, "content", true, &content, &clen, ferr) < 0 ||
        conch_fs__param_encoding(params, &base64, ferr) < 0 ||
        conch_fs__param_bool(params, "append", false, &append, ferr) < 0)
        return NULL;
    _cleanup_free_ char *rel = NULL;
    if (conch_fs__path_parse(ctx, path, plen, false, &rel, ferr) < 0)
        return NULL;
    _cleanup_free_ unsigned char *raw = NULL;
    if (base64) {
        int r = conch_fs__base64_decode(content, clen, &raw, &clen);
        if (r == -ENOMEM)
            return oom(ferr);
        if (r < 0) {
            conch_fs__fail_param(ferr, "content", "param 'content' is not valid base64");
            return NULL;
        }
        content = (const char *)raw;
    }
    bool created;
    if (check_size(clen, path, ferr) < 0)
        return NULL;
    if (append ? append_file(ctx, rel, path, content, clen, &created, ferr) < 0
               : conch_fs__write_file(ctx, rel, path, content, clen, &created, ferr) < 0)
        return NULL;
    json_t *res = json_pack("{s:I, s:b}", "bytes_written", (json_int_t)clen, "created", created);
    return res ? res : oom(ferr);
}

json_t *conch_fs__edit(const struct conch_fs__ctx *ctx, json_t *params, struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"path", "old_string", "new_string", "replace_all", NULL};
    const char *path, *old, *new;
    size_t plen, olen, nlen;
    bool all;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "path", true, &path, &plen, ferr) < 0 ||
        conch_fs__param_str(params, "old_string", true, &old, &olen, ferr) < 0 ||
        conch_fs__param_str(params, "new_string", true, &new, &nlen, ferr) < 0 ||
        conch_fs__param_bool(params, "replace_all", false, &all, ferr) < 0)
        return NULL;
    if (olen == 0) {
        conch_fs__fail_param(ferr, "old_string", "param 'old_string' must not be empty");
        return NULL;
    }
    _cleanup_free_ char *rel = NULL;
    if (conch_fs__path_parse(ctx, path, plen, false, &rel, ferr) < 0)
        return NULL;
    _cleanup_free_ char *buf = NULL;
    size_t len;
    if (conch_fs__read_file(ctx, rel, path, &buf, &len, ferr) < 0)
        return NULL;

    long long n = 0;
    for (const char *p = buf; (p = memmem(p, len - (size_t)(p - buf), old, olen)); p += olen)
        n++;
    if (n == 0) {
        conch_fs__fail(ferr, CONCH_FS_STRING_NOT_FOUND, "old_string does not occur in '%s'", path);
        return NULL;
    }
    if (n > 1 && !all) {
        conch_fs__fail(ferr, CONCH_FS_AMBIGUOUS_MATCH,
                       "old_string occurs %lld times in '%s': add context to make it unique, "
                       "or set replace_all",
                       n, path);
        ferr->occurrences = n;
        return NULL;
    }
    long long newlen = (long long)len + n * ((long long)nlen - (long long)olen);
    if (newlen > MAX_EDIT_RESULT) {
        conch_fs__fail(ferr, CONCH_FS_TOO_LARGE,
                       "editing '%s' would make it %lld bytes, above the limit of %lld", path,
                       newlen, MAX_EDIT_RESULT);
        return NULL;
    }
    _cleanup_free_ char *out = malloc((size_t)newlen + 1);
    if (!out)
        return oom(ferr);
    size_t o = 0;
    const char *p = buf, *q;
    while ((q = memmem(p, len - (size_t)(p - buf), old, olen))) {
        memcpy(out + o, p, (size_t)(q - p));
        o += (size_t)(q - p);
        memcpy(out + o, new, nlen);
        o += nlen;
        p = q + olen;
    }
    memcpy(out + o, p, len - (size_t)(p - buf));
    o += len - (size_t)(p - buf);
    bool created;
    if (conch_fs__write_file(ctx, rel, path, out, o, &created, ferr) < 0)
        return NULL;
    json_t *res = json_pack("{s:I}", "occurrences", (json_int_t)n);
    return res ? res : oom(ferr);
}

json_t *conch_fs__delete(const struct conch_fs__ctx *ctx, json_t *params,
                         struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"path", "recursive", NULL};
    const char *path;
    size_t plen;
    bool recursive;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "path", true, &path, &plen, ferr) < 0 ||
        conch_fs__param_bool(params, "recursive", false, &recursive, ferr) < 0)
        return NULL;
    _cleanup_free_ char *rel = NULL;
    if (conch_fs__path_parse(ctx, path, plen, false, &rel, ferr) < 0)
        return NULL;
    if (!*rel || (*ctx->home && !strcmp(rel, ctx->home + 1))) {
        conch_fs__fail(ferr, CONCH_FS_INVALID_PATH, "refusing to delete the %s root '%s'",
                       *rel ? "workspace" : "sandbox", path);
        return NULL;
    }
    const char *name;
    _cleanup_close_ int pfd = open_parent(ctx, rel, path, false, &name, ferr);
    if (pfd < 0)
        return NULL;
    struct stat st;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        conch_fs__fail_errno(ferr, errno, "delete", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        if (!recursive) {
            conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY,
                           "'%s' is a directory: set recursive to delete it", path);
            return NULL;
        }
        /* Never following a symlink, nor into another mount; any depth; a read-only dir
         * stops it, as it stops rm -r. */
        _cleanup_free_ char *failed = NULL;
        int r = conch_rm_at_named(pfd, name, CONCH_RM_ONE_FS | CONCH_RM_KEEP_MODES, &failed);
        if (r < 0) {
            /* @failed is relative to the parent: put the parent's path back in front. */
            const char *slash = strrchr(rel, '/');
            _cleanup_free_ char *full = NULL;
            if (failed &&
                asprintf(&full, "%.*s%s", slash ? (int)(slash - rel + 1) : 0, rel, failed) < 0)
                full = NULL;
            _cleanup_free_ char *shown = full ? conch_fs__path_display(ctx, full) : NULL;
            conch_fs__fail_errno(ferr, -r, "delete", shown ? shown : path);
            return NULL;
        }
    } else if (unlinkat(pfd, name, 0) < 0) {
        conch_fs__fail_errno(ferr, errno, "delete", path);
        return NULL;
    }
    json_t *res = json_pack("{s:b}", "deleted", 1);
    return res ? res : oom(ferr);
}

json_t *conch_fs__upload(const struct conch_fs__ctx *ctx, json_t *params,
                         struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"files", NULL};
    if (conch_fs__params_check(params, keys, ferr) < 0)
        return NULL;
    json_t *files = json_object_get(params, "files");
    const char *bad = "param 'files' must be an array of {\"path\": str, \"content\": base64}";
    if (!json_is_array(files)) {
        conch_fs__fail_param(ferr, "files", "%s", bad);
        return NULL;
    }
    if (json_array_size(files) > CONCH_FS__MAX_BATCH) {
        conch_fs__fail_param(ferr, "files", "param 'files' has more than %d entries",
                             CONCH_FS__MAX_BATCH);
        return NULL;
    }
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        if (!json_is_object(f) || json_object_size(f) != 2 ||
            !json_is_string(json_object_get(f, "path")) ||
            !json_is_string(json_object_get(f, "content"))) {
            conch_fs__fail_param(ferr, "files", "%s (entry %zu)", bad, i);
            return NULL;
        }
    }

    json_t *results = json_array();
    json_array_foreach(files, i, f)
    {
        if (!results)
            break;
        json_t *jpath = json_object_get(f, "path");
        json_t *jcontent = json_object_get(f, "content");
        const char *path = json_string_value(jpath);
        struct conch_fs_error e = {0};
        _cleanup_free_ char *rel = NULL;
        _cleanup_free_ unsigned char *raw = NULL;
        size_t len;
        bool created;
        if (conch_fs__path_parse(ctx, path, json_string_length(jpath), false, &rel, &e) == 0) {
            int r = conch_fs__base64_decode(json_string_value(jcontent),
                                            json_string_length(jcontent), &raw, &len);
            if (r < 0)
                conch_fs__fail(&e, r == -ENOMEM ? CONCH_FS_IO_ERROR : CONCH_FS_INVALID_PARAMS,
                               "content of '%s' is not valid base64", path);
            else if (check_size(len, path, &e) == 0)
                conch_fs__write_file(ctx, rel, path, (const char *)raw, len, &created, &e);
        }
        json_t *entry = json_pack("{s:O}", "path", jpath);
        if (entry && e.code != CONCH_FS_OK)
            json_object_set_new(entry, "error",
                                json_pack("{s:s, s:s}", "code", conch_fs_errcode_name(e.code),
                                          "message", e.message));
        if (!entry || json_array_append_new(results, entry) < 0) {
            json_decref(results);
            results = NULL;
        }
    }
    json_t *res = results ? json_pack("{s:o}", "results", results) : NULL;
    return res ? res : oom(ferr);
}
