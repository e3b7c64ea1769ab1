/* fsutil.h - small file helpers shared by every module: whole-file reads and writes,
 * directory creation, and human-readable sizes. */
#ifndef CONCH_CORE_FSUTIL_H
#define CONCH_CORE_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

/*
 * conch_write_file - write @len bytes of @data to @path (O_WRONLY|O_CLOEXEC, no create,
 * no truncate: meant for /proc and cgroup control files). Returns 0 or -errno with @err.
 */
int conch_write_file(const char *path, const char *data, size_t len, struct conch_err *err);

/*
 * conch_read_file - read at most @max bytes of @path into a new NUL-terminated buffer
 * (*@ret_buf, caller frees) and its length (*@ret_len, may be NULL).
 */
int conch_read_file(const char *path, size_t max, char **ret_buf, size_t *ret_len,
                    struct conch_err *err);

/*
 * conch_read_fd - the same from an open @fd (borrowed; @name names it in errors), for a
 * caller that opened it its own way (O_NOFOLLOW, beneath a dir fd). The buffer is sized
 * by the file's size when it has one (at most @max), not by @max.
 */
int conch_read_fd(int fd, const char *name, size_t max, char **ret_buf, size_t *ret_len,
                  struct conch_err *err);

/* conch_mkdir_p - create @path and missing parents with @mode; existing dirs are fine. */
int conch_mkdir_p(const char *path, mode_t mode, struct conch_err *err);

/*
 * conch_parse_size - parse "512", "64k", "10M", "2G" (binary multiples) into *@ret.
 * Returns 0, or -EINVAL with @err naming @what.
 */
int conch_parse_size(const char *s, const char *what, uint64_t *ret, struct conch_err *err);

/* conch_write_all - write all of @buf to @fd, retrying on EINTR and short writes. */
int conch_write_all(int fd, const void *buf, size_t len);

/* conch_send_all - conch_write_all for a connected socket, with MSG_NOSIGNAL: a peer that
 * went away is -EPIPE, never a SIGPIPE that kills the caller. */
int conch_send_all(int sock, const void *buf, size_t len);

/* A directory's entry names ("." and ".." left out), sorted by strcmp. */
struct conch_names {
    char **v;
    size_t n;
};

/* conch_names_done - free @ns's names; safe on a zeroed struct. */
void conch_names_done(struct conch_names *ns);

/* conch_names_read - read the names of the directory @fd (taken: it is closed) into *@ret,
 * sorted. Returns 0 or -errno. */
int conch_names_read(int fd, struct conch_names *ret);

/* conch_rm_* flags */
#define CONCH_RM_ONE_FS 1u /* leave what lies on another filesystem alone (-EXDEV) */
#define CONCH_RM_KEEP_MODES                                                                        \
    2u /* do not give a dir owner rwx first (a removal on a user's                                 \
        * behalf: a read-only dir stops it, as it stops rm -r) */

/*
 * conch_rm_contents - remove everything inside the dir @fd (borrowed; O_PATH will do), by
 * fds alone: no path is built, so depth is unbounded, and two fds are open at a time. Never
 * follows a symlink (it is unlinked, not its target); climbing back by ".." checks that it
 * reaches the dir it came from (-ESTALE otherwise). Dirs without owner rwx get it first.
 * Returns 0 or the first error, after trying everything.
 */
int conch_rm_contents(int fd, unsigned flags);

/* conch_rm_at - remove @name in @dfd: a non-dir itself, a dir with everything in it
 * (conch_rm_contents). A missing entry is not an error. Returns 0 or -errno. */
int conch_rm_at(int dfd, const char *name, unsigned flags);

/* conch_rm_path - conch_rm_at for a path: its last component in the directory its parent
 * names (trailing slashes ignored). Returns 0 (a missing path too), -EINVAL for a path with
 * no last component to remove ("/", ".", ".."), or -errno. */
int conch_rm_path(const char *path, unsigned flags);

/* conch_rm_at_named - conch_rm_at, and on failure *@ret_failed (malloc'd, or NULL if out of
 * memory) names the first entry that could not be removed, as a path relative to @dfd
 * ("name/sub/file"). */
int conch_rm_at_named(int dfd, const char *name, unsigned flags, char **ret_failed);

#define CONCH_BENEATH_NO_XDEV 1u /* conch_open_beneath: crossing a mount point fails too */

/*
 * conch_open_beneath - the one way conch opens a path it does not trust beneath a directory
 * it does: @path (relative; "" is @dirfd itself) beneath @dirfd, following no symlink in any
 * component, the last included, and never leaving @dirfd's tree (openat2 with
 * RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS, retried on EAGAIN; a walk of
 * O_NOFOLLOW components where the kernel has no openat2). With CONCH_BENEATH_NO_XDEV in
 * @how_flags, crossing a mount point fails too. O_CLOEXEC is added; @mode applies with
 * O_CREAT. Returns a new fd, or -errno: ELOOP for a symlink, EXDEV for an escape or a mount
 * crossing. (The file operations inside a sandbox follow symlinks within its root, a rule of
 * their own: fs/'s conch_fs__open.)
 */
int conch_open_beneath(int dirfd, const char *path, int flags, mode_t mode, unsigned how_flags);

/* conch_open_beneath_walk - conch_open_beneath's walk where openat2 is missing, one
 * O_NOFOLLOW component at a time ("." and ".." refused); its own entry so that tests hold it
 * to openat2's answers. */
int conch_open_beneath_walk(int dirfd, const char *path, int flags, mode_t mode, bool no_xdev);

#endif
