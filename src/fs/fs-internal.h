/* fs-internal.h - what the fs module's files share: the call context, error setters, param
 * readers, workspace path parsing and beneath-the-root resolution, and text encodings. */
#ifndef CONCH_FS_FS_INTERNAL_H
#define CONCH_FS_FS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "fs/fs.h"

/* Size of the prefix probed for a NUL to call a file binary (git's rule). */
#define CONCH_FS__BINARY_PROBE 8192
/* Entries in one fs.upload / fs.download. */
#define CONCH_FS__MAX_BATCH 1000

struct conch_fs__ctx {
    int root_fd;           /* borrowed */
    int data_fd;           /* borrowed: the host file of fs.copy_in / copy_out, or -1 */
    const char *root_name; /* borrowed; without trailing '/': "/workspace", or "" for "/" */
    const char *home;      /* "" or, for conch_fs_call_rooted, "/workspace": where relative
                            * paths and the default directory are */
};

/* Set for the duration of conch_fs_call_rooted: paths resolve with RESOLVE_IN_ROOT (absolute
 * symlinks and ".." stay inside the root, as the kernel resolves them for the sandbox). */
extern _Thread_local bool conch_fs__in_root;

/* conch_fs__hold_replaced - when deferral is on (conch_fs_defer_replaced) and there is room,
 * hold @name in @dirfd (the file a write is about to rename over) open until the next
 * conch_fs_release_deferred, so that freeing it is no part of the write. */
void conch_fs__hold_replaced(int dirfd, const char *name);

/* conch_fs__default_shown - the name of the default directory (home, else the root). */
const char *conch_fs__default_shown(const struct conch_fs__ctx *ctx);

/* conch_fs__fail - set @ferr to @code with a printf message. Returns -1. */
int conch_fs__fail(struct conch_fs_error *ferr, enum conch_fs_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* conch_fs__fail_param - CONCH_FS_INVALID_PARAMS naming @param. Returns -1. */
int conch_fs__fail_param(struct conch_fs_error *ferr, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/*
 * conch_fs__fail_errno - map @errnum (positive) to an error code and set "@what '@path':
 * cause". ENOENT file_not_found, EACCES/EPERM/EROFS permission_denied, EISDIR is_directory,
 * ENOTDIR not_a_directory, EXDEV/ELOOP/ENAMETOOLONG invalid_path, EFBIG too_large, the
 * rest io_error. Returns -1.
 */
int conch_fs__fail_errno(struct conch_fs_error *ferr, int errnum, const char *what,
                         const char *path);

/* Param readers: a JSON null counts as absent. Return 1 when set, 0 when absent (the
 * default is stored), -1 with @ferr naming @key when of the wrong type or range. */
int conch_fs__params_check(json_t *params, const char *const *keys, struct conch_fs_error *ferr);
int conch_fs__param_str(json_t *params, const char *key, bool required, const char **ret,
                        size_t *ret_len, struct conch_fs_error *ferr);
int conch_fs__param_int(json_t *params, const char *key, long long def, long long min,
                        long long max, long long *ret, struct conch_fs_error *ferr);
int conch_fs__param_bool(json_t *params, const char *key, bool def, bool *ret,
                         struct conch_fs_error *ferr);
/* conch_fs__param_encoding - "encoding": "utf-8" (default, also "utf8") or "base64". */
int conch_fs__param_encoding(json_t *params, bool *ret_base64, struct conch_fs_error *ferr);

/*
 * conch_fs__path_parse - turn the caller's path (@s, @len bytes, may hold a NUL) into a
 * lexically clean path relative to the root: no "", "." or ".." components, "" for the
 * root itself. "" as input is accepted only with @allow_empty. Returns 0 with *@ret_rel a
 * new string, or -1 (CONCH_FS_INVALID_PATH).
 */
int conch_fs__path_parse(const struct conch_fs__ctx *ctx, const char *s, size_t len,
                         bool allow_empty, char **ret_rel, struct conch_fs_error *ferr);
/* conch_fs__path_display - "@root_name/@rel" (or @root_name, or "/"); a new string. */
char *conch_fs__path_display(const struct conch_fs__ctx *ctx, const char *rel);
/* conch_fs__type_letter - an entry's type as fs.ls gives it: 'f', 'd', 'l', or 'o' (other). */
char conch_fs__type_letter(mode_t m);
/* conch_fs__path_join - "@a/@b", or @b when @a is ""; a new string. */
char *conch_fs__path_join(const char *a, const char *b);

/*
 * conch_fs__open - open @rel ("" = @dirfd itself) beneath @dirfd following symlinks that
 * stay beneath it (openat2 RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS, or a user-space walk
 * with the same rules where openat2 is ENOSYS). O_CLOEXEC is added. Returns a new fd or
 * -errno: EXDEV for an escape, ELOOP for too many symlinks.
 */
int conch_fs__open(int dirfd, const char *rel, int flags, mode_t mode);
/* Tests set this to exercise the user-space walk on kernels that have openat2. */
extern bool conch_fs__force_walk;

/*
 * conch_fs__read_fd - read all of @fd into a new buffer (*@ret_buf, NUL-terminated, caller
 * frees; *@ret_len its length). Returns 0, -EFBIG when above @max bytes, or -errno.
 */
int conch_fs__read_fd(int fd, size_t max, char **ret_buf, size_t *ret_len);
/*
 * conch_fs__read_file - open @rel beneath the root (following inside symlinks), require a
 * regular file no larger than CONCH_FS_MAX_FILE and read it whole. @given is the caller's
 * spelling for messages. Returns 0 or -1.
 */
int conch_fs__read_file(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                        char **ret_buf, size_t *ret_len, struct conch_fs_error *ferr);
/*
 * conch_fs__write_file - replace or create @rel with @len bytes of @data, creating parent
 * directories; *@ret_created says whether the file is new. Returns 0 or -1.
 */
int conch_fs__write_file(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                         const char *data, size_t len, bool *ret_created,
                         struct conch_fs_error *ferr);

/*
 * conch_fs__write_file_fd - conch_fs__write_file with the content read from @src_fd (from its
 * position to EOF; borrowed; more than @max bytes, if @max >= 0, fails as too large), its size
 * to *@ret_size. Returns 0 or -1.
 */
int conch_fs__write_file_fd(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                            int src_fd, long long max, bool *ret_created, long long *ret_size,
                            struct conch_fs_error *ferr);
/*
 * conch_fs__copy_fd - copy from @in's position to its EOF to @out's position, in the kernel
 * (copy_file_range, else sendfile, else read and write). The count goes to *@ret_copied even
 * on failure. Returns 0 or -errno (EFBIG: past RLIMIT_FSIZE, the sandbox's disk limit, or
 * more than @max bytes when @max >= 0).
 */
int conch_fs__copy_fd(int in, int out, long long max, long long *ret_copied);

/* conch_fs__base64_encode - a new NUL-terminated standard base64 (padded) string. */
char *conch_fs__base64_encode(const unsigned char *data, size_t len, size_t *ret_len);
/*
 * conch_fs__base64_decode - decode standard base64 (padding optional, no other characters).
 * Returns 0 with a new buffer (NUL-terminated for convenience), -EINVAL when malformed,
 * -ENOMEM.
 */
int conch_fs__base64_decode(const char *s, size_t len, unsigned char **ret, size_t *ret_len);
/* conch_fs__json_text - a JSON string of @len bytes of @s, invalid UTF-8 bytes replaced by
 * U+FFFD (NULs kept). Returns a new reference or NULL on allocation failure. */
json_t *conch_fs__json_text(const char *s, size_t len);

/* Methods: each takes borrowed @params (checked to be an object) and returns a new result. */
json_t *conch_fs__read(const struct conch_fs__ctx *ctx, json_t *params,
                       struct conch_fs_error *ferr);
json_t *conch_fs__ls(const struct conch_fs__ctx *ctx, json_t *params, struct conch_fs_error *ferr);
json_t *conch_fs__download(const struct conch_fs__ctx *ctx, json_t *params,
                           struct conch_fs_error *ferr);
json_t *conch_fs__write(const struct conch_fs__ctx *ctx, json_t *params,
                        struct conch_fs_error *ferr);
json_t *conch_fs__edit(const struct conch_fs__ctx *ctx, json_t *params,
                       struct conch_fs_error *ferr);
json_t *conch_fs__delete(const struct conch_fs__ctx *ctx, json_t *params,
                         struct conch_fs_error *ferr);
json_t *conch_fs__upload(const struct conch_fs__ctx *ctx, json_t *params,
                         struct conch_fs_error *ferr);
json_t *conch_fs__glob(const struct conch_fs__ctx *ctx, json_t *params,
                       struct conch_fs_error *ferr);
json_t *conch_fs__copy_in(const struct conch_fs__ctx *ctx, json_t *params,
                          struct conch_fs_error *ferr);
json_t *conch_fs__copy_out(const struct conch_fs__ctx *ctx, json_t *params,
                           struct conch_fs_error *ferr);
json_t *conch_fs__grep(const struct conch_fs__ctx *ctx, json_t *params,
                       struct conch_fs_error *ferr);

#endif
