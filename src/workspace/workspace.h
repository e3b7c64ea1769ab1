/* workspace.h - the agent's working directory as an overlay: reading what changed from
 * the overlay's upper dir, and applying those changes to the host directory safely. */
#ifndef CONCH_WORKSPACE_WORKSPACE_H
#define CONCH_WORKSPACE_WORKSPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

#endif
