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

enum conch_change_kind {
    CONCH_CHANGE_ADDED,    /* path absent from the host dir */
    CONCH_CHANGE_MODIFIED, /* same type, different content, mode or symlink target */
    CONCH_CHANGE_DELETED,  /* present on the host dir, removed in the sandbox */
    CONCH_CHANGE_TYPE,     /* present on both, of a different file type (file → dir, ...) */
};

/* Flags of a change (conch_ws_change.flags). */
enum conch_ws_change_flag {
    CONCH_WS_F_LINK_OUTSIDE = 1 << 0, /* symlink whose target is absolute or climbs out of the
                                         workspace: committed as it is, but flagged */
    CONCH_WS_F_TOO_DEEP = 1 << 1,     /* dir whose entries lie past PATH_MAX: they are not
                                         listed, and commit skips the dir */
    CONCH_WS_F_FIFO = 1 << 2,         /* a FIFO: never committed */
    CONCH_WS_F_SOCKET = 1 << 3,       /* a unix socket: never committed */
    CONCH_WS_F_DEVICE = 1 << 4,       /* a device node: never created on the host */
    CONCH_WS_F_UNREADABLE = 1 << 5,   /* dir the sandbox made unreadable (e.g. mode 000) to
                                         the caller: its entries are not listed, and commit
                                         skips the dir */
    CONCH_WS_F_RULE_RO = 1 << 6,      /* at or beneath a read-only path (path rules): never
                                         committed (conch_ws_changes_mark_rules) */
    CONCH_WS_F_RULE_HIDDEN = 1 << 7,  /* at or beneath a hidden path: never committed */
    CONCH_WS_F_RULE_HOLDS = 1 << 8,   /* deletes or replaces a dir holding a rule's path: never
                                         committed */
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
    unsigned flags;            /* enum conch_ws_change_flag (not for DELETED, but TOO_DEEP) */
};

struct conch_ws_changes {
    struct conch_ws_change *items; /* owned; sorted by path */
    size_t n;
    size_t total; /* changes found by the scan, also those left out of @items by a page or cap
                     (0 in a hand-built list: count @n) */
};

/* Changes a result lists at most (conch_ws_changes_json_set, the run summary). */
#define CONCH_WS_CHANGES_MAX 1000

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
 * followed through a symlink. A directory whose entries would have paths of PATH_MAX bytes
 * or more is reported (whether or not it changed itself) with CONCH_WS_F_TOO_DEEP and not
 * descended into, so that a deep chain never makes the scan fail; likewise, with
 * CONCH_WS_F_UNREADABLE, a dir the caller may not read and search. Sets *@ret with every
 * change (total = n) (caller calls conch_ws_changes_done). Returns 0 or -errno with @err.
 */
int conch_ws_changes_scan(int upper_fd, int lower_fd, struct conch_ws_changes *ret,
                          struct conch_err *err);

/*
 * conch_ws_changes_scan_page - like conch_ws_changes_scan, but *@ret holds only the changes
 * at positions [@offset, @offset + @limit) in path order (@limit 0: all from @offset),
 * while ret->total counts them all. Memory grows with @offset + @limit, not with the
 * number of changes: the window is kept in a bounded heap while the walk goes on.
 */
int conch_ws_changes_scan_page(int upper_fd, int lower_fd, size_t offset, size_t limit,
                               struct conch_ws_changes *ret, struct conch_err *err);

/*
 * conch_ws_change_skip_reason - why commit leaves @ch out (a static string), or NULL when it
 * can be committed: sockets, FIFOs and device nodes have no meaning on the host (and a
 * device node would be a way in), and the entries of a TOO_DEEP or UNREADABLE dir are not
 * known. Deleting such an entry is always allowed.
 */
const char *conch_ws_change_skip_reason(const struct conch_ws_change *ch);

/*
 * conch_ws_changes_mark_rules - flag each change of @c that the path rules @rules (@n of
 * them, borrowed; struct conch_ws_rule) protect with CONCH_WS_F_RULE_*, so that every list of
 * changes says it will not be committed (conch_ws_change_skip_reason). conch_ws_commit
 * checks the rules itself, whatever the flags.
 */
struct conch_ws_rule;
void conch_ws_changes_mark_rules(struct conch_ws_changes *c, const struct conch_ws_rule *rules,
                                 size_t n);

/*
 * conch_ws_quote - @prefix followed by @name, as git quotes paths: unchanged when it holds
 * no control byte (< 0x20, 0x7f), '"' or '\\'; otherwise in double quotes with \n, \t,
 * \", \\, ... and \ooo octal escapes for other such bytes. @ascii (git's core.quotePath,
 * for patches): every byte >= 0x80 is escaped too, so the result is ASCII; otherwise (for a
 * terminal, like `ls`) well-formed UTF-8 stays as it is except C1 controls (U+0080..U+009F),
 * and ill-formed bytes are escaped. Returns a new string, or NULL when out of memory.
 */
char *conch_ws_quote(const char *prefix, const char *name, bool ascii);

/* conch_ws_changes_done - free @c's items; safe on a zeroed struct. */
void conch_ws_changes_done(struct conch_ws_changes *c);

/* conch_ws_change_kind_name - "added", "modified", "deleted", "type_changed". */
const char *conch_ws_change_kind_name(enum conch_change_kind kind);

/* A path rule as commit respects it (spec/spec.h: a read-only or hidden path, relative to the
 * workspace and normalised). */
struct conch_ws_rule {
    const char *path; /* borrowed */
    bool hidden;      /* hidden; else read-only */
};

struct conch_ws_commit_opts {
    /* Owner given to added entries; (uid_t)-1 / (gid_t)-1 = the owner of the host root
     * dir. Modified entries keep their existing host owner. Only applied when the caller
     * may chown (root); otherwise files belong to the caller. */
    uid_t new_uid;
    gid_t new_gid;
    /* The most bytes the commit may write: the total apparent size (holes included) of the
     * files it writes. 0: no limit. `conch run` and the daemon pass the disk limit. */
    uint64_t max_bytes;
    /* Path rules (@n_rules of them; borrowed): a change at or beneath a rule's path, and the
     * deletion or type change of a dir holding one, is skipped, whatever the upper dir holds
     * (the sandbox's mounts keep them out; this keeps out what got there another way). */
    const struct conch_ws_rule *rules;
    size_t n_rules;
};

enum conch_ws_commit_status {
    CONCH_WS_COMMIT_NOT_APPLIED = 0, /* the commit was refused before it, or stopped */
    CONCH_WS_COMMIT_APPLIED,         /* the host now holds the change */
    CONCH_WS_COMMIT_SKIPPED,         /* left out by policy (reason); the host is unchanged */
    CONCH_WS_COMMIT_FAILED,          /* tried and failed (reason); the host is unchanged */
};

/* What happened to one change. */
struct conch_ws_commit_entry {
    const char *path; /* borrowed from the change list */
    enum conch_ws_commit_status status;
    char *reason; /* owned; NULL for APPLIED / NOT_APPLIED */
};

/* What a commit applied, entry by entry (in path order). */
struct conch_ws_commit_report {
    struct conch_ws_commit_entry *entries; /* owned */
    size_t n;
    size_t applied, skipped, failed;
    uint64_t bytes; /* apparent size of the files written */
};

/* conch_ws_commit_report_done - free what @r owns; safe on a zeroed report. */
void conch_ws_commit_report_done(struct conch_ws_commit_report *r);

/*
 * conch_ws_commit - apply @changes (from conch_ws_changes_scan on the same fds) read from
 * @upper_fd to the host dir @host_fd. Every path is resolved with openat2
 * RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS (host side also
 * RESOLVE_NO_XDEV: the sandbox never saw what is mounted below the host dir), so a symlink
 * planted in the host dir or the sandbox cannot redirect a write outside @host_fd (the path
 * fails with ELOOP). Files and symlinks are written to a temporary name (".conch-tmp-*")
 * in the target dir and renamed over the old one (atomic); a file's holes are kept
 * (SEEK_DATA/SEEK_HOLE), so a sparse file stays sparse; deletions remove files, symlinks
 * (never their targets) and whole trees; directory modes are applied last, children
 * first, so read-only directories can still be filled.
 *
 * Policy (nothing a sandbox writes may carry privilege to the host): set-uid and set-gid
 * bits are never set (files and dirs); group- and world-write bits are only kept where the
 * host's entry at that path already had them (mode & ~(022 & ~host_mode)); no xattr is
 * copied, so neither file capabilities nor ACLs reach the host; sockets, FIFOs and device
 * nodes are skipped, as are TOO_DEEP dirs (conch_ws_change_skip_reason) and changes a path
 * rule protects (opts->rules); symlinks are
 * committed as they are, those pointing outside the workspace flagged by the scan.
 *
 * Before anything is applied every path is checked (-EINVAL, nothing applied) and the
 * total apparent size of the files to write is checked against opts->max_bytes (-EFBIG,
 * kind limit, nothing applied). Then every change is tried; one that fails leaves the
 * host's entry as it was (temporary names are removed) and the others go on.
 * Ownership as described in @opts (NULL = both -1, no size limit). @changes is borrowed
 * and may be in any order (it is applied in path order). @report (may be NULL) is filled
 * whatever the outcome (caller calls conch_ws_commit_report_done): exactly what was
 * applied, skipped and failed. Returns 0 when nothing failed (entries may have been
 * skipped), else the first error (-errno with @err naming the path).
 */
int conch_ws_commit(int upper_fd, int host_fd, const struct conch_ws_changes *changes,
                    const struct conch_ws_commit_opts *opts, struct conch_ws_commit_report *report,
                    struct conch_err *err);

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
 * Sets *@ret to a new object {"diff": str, "files": [{"path", "kind", "binary", "diff"}],
 * "omitted": n} with one file per selected change, in order. A file's diff is in `diff -u` format
 * with "a/"/"b/" prefixes and 3 lines of context ("/dev/null" for an added or deleted side); a
 * binary file (NUL in the first 8 KiB of either side) gets "Binary files a/p and b/p differ" (names
 * quoted as below); a file over @max_bytes_per_file bytes (0 = no limit) gets
 * "[diff omitted: file larger than N bytes]"; a symlink is diffed as the text "target\n"; a
 * permission change adds "old mode 100644" / "new mode 100755" lines first; a type change
 * is a deletion then an addition; directories and special files have an empty diff. The
 * top-level "diff" is the non-empty file diffs as git sections: each (a type change: each
 * half) is preceded by "diff --git a/p b/p" and, for an added or deleted file, "new file
 * mode M" / "deleted file mode M", so that `git apply` takes it (binary files and symlinks
 * aside). In every header the names are quoted as git quotes them (conch_ws_quote with
 * @ascii): a name holding a newline cannot add a header line. Ill-formed UTF-8 in content
 * (and in the "path" fields) becomes U+FFFD. The diff text held (the whole diff plus each
 * file's) stays within @max_total bytes (0: CONCH_WS_DIFF_MAX_TOTAL): the first file that
 * does not fit and every later one get an empty diff and "omitted": true, and the result
 * has "omitted": their count; no file is read beyond @max_total. Nothing is followed
 * through a symlink. A change marked CONCH_WS_F_RULE_HIDDEN (conch_ws_changes_mark_rules) is
 * never read: its diff is a one-line note and the top-level diff leaves it out. Returns 0
 * or -errno with @err.
 */
#define CONCH_WS_DIFF_MAX_TOTAL (16u << 20)
int conch_ws_diff(int upper_fd, int lower_fd, const struct conch_ws_changes *changes,
                  char *const *paths, size_t max_bytes_per_file, size_t max_total, json_t **ret,
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

/* ---- the layer store (layers.c) ----
 * A store is a directory (an fd the caller opened) holding one sub-directory per frozen
 * layer, named by its id, in overlayfs's upper format. Layers are read-only once frozen:
 * sandboxes stack them under their upper dir (conch_jail_spec.layers). Every function takes
 * fds borrowed and names checked by conch_ws_layer_id_ok. */

/* conch_ws_layer_id_ok - @id is a layer name: 1..63 of [a-z0-9-], not starting with '.'. */
bool conch_ws_layer_id_ok(const char *id);

/*
 * conch_ws_layer_freeze - make the upper dir @name beneath @from_fd the layer @id of the
 * store @store_fd: a rename (cost independent of its size), never a copy, never over an
 * existing layer. A missing upper dir (nothing was written) becomes an empty layer. Only
 * while no overlay is mounted on it. Returns 0 or -errno with @err (EXDEV: another
 * filesystem).
 */
int conch_ws_layer_freeze(int from_fd, const char *name, int store_fd, const char *id,
                          struct conch_err *err);

/* conch_ws_layer_measure - the allocated bytes (*@ret_bytes) and entries (*@ret_files, may be
 * NULL) of layer @id, never following a symlink or leaving its filesystem. */
int conch_ws_layer_measure(int store_fd, const char *id, uint64_t *ret_bytes, uint64_t *ret_files,
                           struct conch_err *err);

/* conch_ws_dir_usage - the allocated bytes and entries beneath the directory @dfd (taken
 * over), fd-relative, never following a symlink or leaving its filesystem, no global state
 * (worker threads call it). False when it was too deep to walk whole (or not a directory). */
bool conch_ws_dir_usage(int dfd, uint64_t *ret_bytes, uint64_t *ret_inodes);

/* conch_ws_layer_remove - remove layer @id and everything in it (missing: 0). */
int conch_ws_layer_remove(int store_fd, const char *id, struct conch_err *err);

/*
 * conch_ws_layers_merge - the stack @dirs (@n dir fds, borrowed, top first, each stacked on the
 * next) merged into one new dir @out_name of @out_parent (replaced if there), as
 * conch_ws_layer_squash merges: the merged view over the same base in one layer, in
 * overlayfs's upper format. Regular files are hard-linked (frozen layers are never written
 * again), copied where @live[i] (a mounted upper; @live may be NULL) or a link is refused.
 * On failure nothing is left under @out_name. Returns 0 or -errno with @err.
 */
int conch_ws_layers_merge(const int *dirs, const bool *live, int n, int out_parent,
                          const char *out_name, struct conch_err *err);

/*
 * conch_ws_layer_squash - merge the layers @ids (@n of them, top first, each stacked on the
 * next) into one new layer @new_id that shows over the same base what the stack shows:
 * upper entries replace lower ones, whiteouts stay (they hide the base's entries), an
 * opaque dir replaces the dir below it, a dir over a lower non-dir or whiteout becomes
 * opaque. The layers themselves are untouched (the caller removes them when nothing uses
 * them). Built under a temporary name, then renamed: a failure leaves no layer @new_id.
 * Costs a walk of the layers and a hard link per file (not a copy of the workspace).
 * Returns 0 or -errno with @err.
 */
int conch_ws_layer_squash(int store_fd, const char *const *ids, int n, const char *new_id,
                          struct conch_err *err);

/* ---- changes since a snapshot (since.c) ---- */
struct conch_ws_since {
    int upper;  /* what changed since the snapshot, in overlayfs's upper format; -1: nothing */
    int lower;  /* the workspace as it was at the snapshot (only where @upper looks) */
    int parent; /* the work dir the two were built in (removed by conch_ws_since_done) */
};

/* conch_ws_since_init - a prepared-nothing @s (conch_ws_since_done is then a no-op). */
void conch_ws_since_init(struct conch_ws_since *s);

/*
 * conch_ws_since_prepare - an upper and a lower dir that conch_ws_changes_scan and
 * conch_ws_diff compare to list the changes made after the snapshot @layers[@at]: the
 * workspace is @live_upper (-1: none) over the frozen @layers (@n_layers fds, top first) over
 * the host dir @host_fd (all borrowed). ret->upper is the live upper and the layers above
 * @at merged (conch_ws_layers_merge; a dup when there is one dir); ret->lower is the view at
 * the snapshot (the layers from @at down over the host) built beneath @work_fd, sparsely:
 * only the entries the upper names (with their content: a deleted file's diff shows it),
 * and the whole listing of each dir the upper makes opaque. Files of frozen layers are hard
 * links, the host's are copied (so the cost grows with what changed, not with the
 * workspace). ret->upper -1 (and ret->lower -1): nothing above the snapshot, no changes.
 * The caller calls conch_ws_since_done, which removes what was built. Returns 0 or -errno
 * with @err.
 */
int conch_ws_since_prepare(int live_upper, const int *layers, int n_layers, int at, int host_fd,
                           int work_fd, struct conch_ws_since *ret, struct conch_err *err);

/* conch_ws_since_done - close @s's fds and remove the dirs built for it. */
void conch_ws_since_done(struct conch_ws_since *s);

/* ---- named stores (store-db.c, store-sync.c) ----
 * Files kept in one SQLite database per store (<dir>/<name>.db), seen by a sandbox as an
 * ordinary directory (a view the daemon materialises and writes back after each command).
 * Changes are transactions; concurrent changes to one path: the last writer wins, and the
 * replaced writer is recorded in the store's history. */
#define CONCH_STORE_NAME_MAX 64
#define CONCH_STORE_PATH_MAX 1024
#define CONCH_STORE_FILE_MAX (64ULL << 20)       /* the largest file a store keeps */
#define CONCH_STORE_TOTAL_DEFAULT (256ULL << 20) /* a new store's cap on its files' bytes */
#define CONCH_STORE_TOTAL_MAX (16ULL << 30)
#define CONCH_STORE_ENTRIES_MAX 100000 /* files and dirs in one store */
enum { CONCH_STORE_FILE = 0, CONCH_STORE_DIR = 1 };

struct conch_store;

/* conch_store_name_check - @name is 1 to 64 of [A-Za-z0-9._-], not starting with '.' or '-'. */
int conch_store_name_check(const char *name, struct conch_err *err);
/* conch_store_path_normalize - @in ("/a//b/", "a/b") as the store keeps it ("a/b"; "" is the
 * root) in @out (@size bytes): no '.' or '..' component, no control character, components of
 * at most 255 bytes, at most CONCH_STORE_PATH_MAX - 1 bytes. Returns 0 or -errno (usage). */
int conch_store_path_normalize(const char *in, char *out, size_t size, struct conch_err *err);

/*
 * conch_store_open - open the store @name in @dir. @max_bytes 0: it must exist (ENOENT, a
 * usage error, otherwise); else it is created if missing, with @max_bytes as its cap (an
 * existing store keeps the cap it was made with). One connection, for one thread at a time;
 * several connections (threads, processes) may use one store. *@ret is the caller's
 * (conch_store_close). Returns 0 or -errno with @err.
 */
int conch_store_open(const char *dir, const char *name, uint64_t max_bytes,
                     struct conch_store **ret, struct conch_err *err);
void conch_store_close(struct conch_store *s);
/* The store's cap on its files' bytes, and on one file's (the smaller of it and 64 MiB). */
uint64_t conch_store_max_bytes(const struct conch_store *s);
uint64_t conch_store_file_max(const struct conch_store *s);

/* conch_store_ls - *@ret: a new array of the entries in the dir @path ("" or "/": the root),
 * each {name, path, type: "file"|"dir", size, mode, mtime, writer}. */
int conch_store_ls(struct conch_store *s, const char *path, json_t **ret, struct conch_err *err);
/* conch_store_read - the file @path: *@ret_buf (malloc'd, NUL-terminated beyond *@ret_len) and
 * *@ret_meta (a new object as conch_store_ls lists). */
int conch_store_read(struct conch_store *s, const char *path, char **ret_buf, size_t *ret_len,
                     json_t **ret_meta, struct conch_err *err);
/* conch_store_write - make @path a file of @len bytes of @buf (mode & 0777), its parent dirs
 * made, in one transaction recorded as @writer. Refused (EFBIG, ENOSPC; a `limit` error) past
 * the store's caps. */
int conch_store_write(struct conch_store *s, const char *path, const void *buf, size_t len,
                      uint32_t mode, const char *writer, struct conch_err *err);
/* conch_store_delete - remove the file or dir (with what is in it) @path; ENOENT if missing. */
int conch_store_delete(struct conch_store *s, const char *path, const char *writer,
                       struct conch_err *err);
/* conch_store_list - *@ret: a new array of the stores in @dir, each {name, bytes, entries,
 * max_bytes, version} (none when @dir is missing). */
int conch_store_list(const char *dir, json_t **ret, struct conch_err *err);

/* What one write-back did. */
struct conch_store_report {
    unsigned written, deleted, pulled; /* entries stored, removed, and brought in from others */
    unsigned skipped;                  /* symlinks, devices, fifos, sockets: never stored */
    unsigned refused;                  /* files over the largest-file cap: not stored */
    char first_skipped[256];           /* the first of those (skipped or refused), quoted */
};

struct conch_store_view;

/*
 * conch_store_view_new - a view of the store @name (in @db_dir; created with @max_bytes if
 * missing) at the host dir @dir (made if missing, mode 0700), written back as @writer (a
 * sandbox id). Nothing is read until conch_store_view_materialise. *@ret is the caller's
 * (conch_store_view_free). Returns 0 or -errno with @err.
 */
int conch_store_view_new(const char *db_dir, const char *name, uint64_t max_bytes, const char *dir,
                         const char *writer, struct conch_store_view **ret, struct conch_err *err);
void conch_store_view_free(struct conch_store_view *v);
const char *conch_store_view_name(const struct conch_store_view *v);
const char *conch_store_view_dir(const struct conch_store_view *v);

/*
 * conch_store_view_materialise - empty the view's dir and fill it with the store's files (their
 * modes and mtimes), remembering what each looked like. For before the sandbox starts.
 * conch_store_view_sync - write back what changed in the dir since (a file whose inode,
 * size, mode, mtime or ctime differs; a new file or dir; one gone) in one transaction, then
 * bring in what other writers changed since. Only regular files and dirs are stored: what
 * else is there is skipped (counted in @rep), never followed; nothing is followed through a
 * symlink. A transaction refused (over the store's cap) or interrupted leaves the store as
 * it was and the dir's changes pending (the next sync tries again). Both take the view's
 * lock: one at a time per view, from any thread. Return 0 or -errno with @err.
 */
int conch_store_view_materialise(struct conch_store_view *v, struct conch_err *err);
int conch_store_view_sync(struct conch_store_view *v, struct conch_store_report *rep,
                          struct conch_err *err);
/* conch_store_view_pull - bring what other writers changed into the dir, but where the dir
 * has a change of its own not written back yet (that write-back wins, later). Takes the
 * view's lock. Returns 0 or -errno with @err. */
int conch_store_view_pull(struct conch_store_view *v, struct conch_err *err);

#endif
