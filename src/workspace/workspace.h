/* workspace.h - the agent's working directory as an overlay: reading what changed from
 * the overlay's upper dir, and applying those changes to the host directory safely. */
#ifndef CONCH_WORKSPACE_WORKSPACE_H
#define CONCH_WORKSPACE_WORKSPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "core/error.h"

enum conch_ws_mode {
    CONCH_WS_OVERLAY = 0, /* copy-on-write over the host dir (default) */
    CONCH_WS_RO,          /* read-only bind */
    CONCH_WS_RW,          /* live bind */
};

/* conch_ws_mode_parse - "overlay" | "ro" | "rw" → *@ret; -EINVAL otherwise. */
int conch_ws_mode_parse(const char *s, enum conch_ws_mode *ret, struct conch_err *err);
const char *conch_ws_mode_name(enum conch_ws_mode mode);

enum conch_change_kind {
    CONCH_CHANGE_ADDED,    /* path absent from the host dir */
    CONCH_CHANGE_MODIFIED, /* same type, different content, mode or symlink target */
    CONCH_CHANGE_DELETED,  /* present on the host dir, removed in the sandbox */
    CONCH_CHANGE_TYPE,     /* present on both, of a different file type (file → dir, ...) */
};

/* One changed path. @path is relative to the workspace root, no leading "./" or "/". */
struct conch_ws_change {
    char *path; /* owned */
    enum conch_change_kind kind;
    char type;                 /* new type: 'f' file, 'd' dir, 'l' symlink, 'o' other;
                                  for DELETED the old type */
    bool content_changed;      /* MODIFIED: bytes (or symlink target) differ; TYPE: true */
    bool mode_changed;         /* MODIFIED, TYPE: permission bits differ */
    mode_t old_mode, new_mode; /* permission bits (07777); 0 when absent */
    uint64_t size;             /* new size in bytes (files), 0 otherwise */
    bool binary;               /* new content looks binary (NUL in the first 8 KiB) */
};

struct conch_ws_changes {
    struct conch_ws_change *items; /* owned; sorted by path */
    size_t n;
};

/*
 * conch_ws_changes_scan - list what the overlay upper dir @upper_fd changes relative to
 * the lower (host) dir @lower_fd. Both fds are borrowed directories. Understands overlay's
 * whiteouts (char device 0/0), opaque directories (xattr user.overlay.opaque or
 * trusted.overlay.opaque = "y"), and copy-ups that changed nothing (not reported).
 * Directories that exist on both sides are not changes unless their mode changed; an
 * added directory is reported itself and so is every entry beneath it (likewise beneath a
 * path whose type changed to a directory); a deleted directory is reported once, not per
 * entry. Items are sorted by strcmp() of @path, so a parent precedes its children. A
 * symlink's mode is not compared (only its target); the workspace root's own mode is not
 * compared. Cost grows with the size of the upper dir, not the workspace. Nothing is
 * followed through a symlink. Fills *@ret (caller calls conch_ws_changes_done). Returns 0
 * or -errno with @err.
 */
int conch_ws_changes_scan(int upper_fd, int lower_fd, struct conch_ws_changes *ret,
                          struct conch_err *err);

/* conch_ws_changes_done - free @c's items; safe on a zeroed struct. */
void conch_ws_changes_done(struct conch_ws_changes *c);

/* conch_ws_change_kind_name - "added", "modified", "deleted", "type_changed". */
const char *conch_ws_change_kind_name(enum conch_change_kind kind);

struct conch_ws_commit_opts {
    /* Owner given to added entries; (uid_t)-1 / (gid_t)-1 = the owner of the host root
     * dir. Modified entries keep their existing host owner. Only applied when the caller
     * may chown (root); otherwise files belong to the caller. */
    uid_t new_uid;
    gid_t new_gid;
};

/*
 * conch_ws_commit - apply @changes (from conch_ws_changes_scan on the same fds) read from
 * @upper_fd to the host dir @host_fd. Every path is resolved with openat2
 * RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS (host side also
 * RESOLVE_NO_XDEV: the sandbox never saw what is mounted below the host dir), so a symlink
 * planted in the host dir or the sandbox cannot redirect a write outside @host_fd (the path
 * fails with ELOOP). Files, symlinks and FIFOs are written to a temporary name
 * (".conch-tmp-*") in the target dir and renamed over the old one (atomic); deletions
 * remove files, symlinks (never their targets) and whole trees; modes are applied, except
 * that set-uid/set-gid bits are dropped from non-directories; directory modes are applied
 * last, children first, so read-only directories can still be filled. Device nodes and
 * sockets are refused (EOPNOTSUPP). Ownership as described in @opts (NULL = both -1).
 * @changes is borrowed and may be in any order (it is applied in path order). Applies as
 * much as it can and returns the first error (-errno with @err naming the path) if any
 * path failed.
 */
int conch_ws_commit(int upper_fd, int host_fd, const struct conch_ws_changes *changes,
                    const struct conch_ws_commit_opts *opts, struct conch_err *err);

/*
 * conch_ws_changes_select - the changes of @all (borrowed) at the given @paths and beneath
 * them (a listed directory includes everything beneath it), in @all's order, deep-copied
 * into *@ret (caller calls conch_ws_changes_done). @paths is a NULL-terminated array
 * (NULL = all of @all). A path may be relative ("src/a.c") or absolute under the
 * workspace ("/workspace/src/a.c"); "." and ".." are resolved lexically, "/workspace"
 * itself selects everything. Errors (kind usage): -EINVAL for an empty path, one outside
 * /workspace or escaping it with ".."; -ENOENT for a path that matches no change (a file
 * inside a deleted directory matches nothing: the directory is the change). Only the
 * listed changes are returned, not their added parent directories, which a commit of a
 * file inside a new directory also needs.
 */
int conch_ws_changes_select(const struct conch_ws_changes *all, char *const *paths,
                            struct conch_ws_changes *ret, struct conch_err *err);

/*
 * conch_ws_diff - unified diffs of @changes (from conch_ws_changes_scan on the same fds,
 * borrowed) between the host dir @lower_fd and the upper dir @upper_fd (both borrowed).
 * @paths: NULL for every change, else as in conch_ws_changes_select (same errors).
 * Sets *@ret to a new object {"diff": str, "files": [{"path", "kind", "binary", "diff"}]}
 * with one file per selected change, in order. A file's diff is in `diff -u` format with
 * "a/"/"b/" prefixes and 3 lines of context ("/dev/null" for an added or deleted side);
 * a binary file (NUL in the first 8 KiB of either side) gets "Binary files a/p and b/p
 * differ"; a file over @max_bytes_per_file bytes (0 = no limit) gets "[diff omitted: file
 * larger than N bytes]"; a symlink is diffed as the text "target\n"; a permission change
 * adds "old mode 100644" / "new mode 100755" lines first; a type change is a deletion
 * then an addition; directories and special files have an empty diff. The top-level
 * "diff" is the non-empty file diffs as git sections: each (a type change: each half) is
 * preceded by "diff --git a/p b/p" and, for an added or deleted file, "new file mode M" /
 * "deleted file mode M", so that `git apply` takes it (binary files and symlinks aside).
 * Ill-formed UTF-8 (in content or paths) becomes U+FFFD. Nothing is followed through a
 * symlink. Returns 0 or -errno with @err.
 */
int conch_ws_diff(int upper_fd, int lower_fd, const struct conch_ws_changes *changes,
                  char *const *paths, size_t max_bytes_per_file, json_t **ret,
                  struct conch_err *err);

/*
 * conch_ws_upper_remove - take @changes (borrowed; any order) out of the overlay upper dir
 * @upper_fd, so that the merged view shows the host dir @lower_fd (both borrowed) at
 * those paths: after a discard (the host is unchanged) or after conch_ws_commit (the host
 * now holds the changes). Only while the overlay is not mounted. Each listed path's upper
 * entry is removed: file, symlink, whiteout, or a directory with everything beneath it
 * (so list a directory only when all beneath it goes: conch_ws_changes_select does that;
 * do not pass the added parent dirs of a partial commit). Unlisted entries, and the
 * parent dirs holding them, stay. Where an opaque upper dir hides the host's entry at a
 * listed path, the host's entry (tree) is copied into the upper dir with its mode, owner
 * and times, since removing the upper entry would leave it hidden. Nothing is followed
 * through a symlink. Afterwards conch_ws_changes_scan reports none of the listed paths
 * and the others as before. Returns the first error (-errno with @err) after trying every
 * path.
 */
int conch_ws_upper_remove(int upper_fd, int lower_fd, const struct conch_ws_changes *changes,
                          struct conch_err *err);

/*
 * conch_ws_upper_clear - remove everything inside the upper dir @upper_fd (borrowed; the
 * dir itself stays), discarding every change. Only while the overlay is not mounted.
 * Returns 0 or -errno with @err.
 */
int conch_ws_upper_clear(int upper_fd, struct conch_err *err);

#endif
