/* fs.h - the daemon's file operations (fs.read, fs.write, ... of docs/PROTOCOL.md), run by a
 * worker inside the sandbox against the workspace's root directory fd, and the bodies of
 * those workers (conch_fs_worker_*). Nothing here ever resolves a path outside that
 * directory. */
#ifndef CONCH_FS_FS_H
#define CONCH_FS_FS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Largest file fs.read / fs.download / fs.edit / fs.grep will load (the error's data.limit). */
#define CONCH_FS_MAX_FILE (10LL * 1024 * 1024)
/* Largest fs.glob max_results and fs.grep max_matches. */
#define CONCH_FS_MAX_RESULTS 10000
/* Deepest directory level fs.glob and fs.grep descend to, below their start directory. */
#define CONCH_FS_MAX_DEPTH 64

/* Mirrors the protocol's data.code strings (conch_fs_errcode_name). */
enum conch_fs_errcode {
    CONCH_FS_OK = 0,
    CONCH_FS_FILE_NOT_FOUND,
    CONCH_FS_PERMISSION_DENIED,
    CONCH_FS_IS_DIRECTORY,
    CONCH_FS_INVALID_PATH,
    CONCH_FS_NOT_A_DIRECTORY,
    CONCH_FS_STRING_NOT_FOUND,
    CONCH_FS_AMBIGUOUS_MATCH,
    CONCH_FS_TOO_LARGE,
    CONCH_FS_INVALID_PARAMS,
    CONCH_FS_IO_ERROR,
};

/* Caller-allocated, fixed size: a worker can write it to its parent over a pipe unchanged. */
struct conch_fs_error {
    enum conch_fs_errcode code;
    char message[512];     /* for people; quotes the path as the caller gave it */
    char param[64];        /* CONCH_FS_INVALID_PARAMS: the offending param ("files", ...) */
    long long occurrences; /* CONCH_FS_AMBIGUOUS_MATCH / STRING_NOT_FOUND: the count */
};

/*
 * conch_fs_errcode_name - "ok", "file_not_found", "permission_denied", "is_directory",
 * "invalid_path", "not_a_directory", "string_not_found", "ambiguous_match", "too_large",
 * "invalid_params", "io_error"; a static string ("io_error" for an unknown value).
 */
const char *conch_fs_errcode_name(enum conch_fs_errcode c);

/*
 * conch_fs_call - run @method ("read", "write", "edit", "ls", "glob", "grep", "delete",
 * "upload", "download") with @params (a JSON object or NULL, borrowed) against the
 * workspace whose root directory is @root_fd (borrowed, opened O_DIRECTORY) and whose
 * absolute name inside the sandbox is @root_name (e.g. "/workspace").
 *
 * Params are PROTOCOL.md's fs.* params without "sandbox"; a JSON null counts as absent.
 * An unknown method, an unknown key, a missing or mistyped value or one out of range is
 * CONCH_FS_INVALID_PARAMS with @ferr->param naming it. Paths may be relative or start with
 * @root_name; "" means the root only where a directory is the default (ls, glob, grep).
 * Every path is resolved beneath @root_fd (openat2 RESOLVE_BENEATH, or an equivalent
 * user-space walk where openat2 is missing): symlinks that stay inside are followed where
 * a file is opened, any that lead out fail with CONCH_FS_INVALID_PATH. Walks (glob, grep,
 * recursive delete) never follow symlinks and skip names starting with '.' unless a
 * pattern component names them (bash globstar rules).
 *
 * Notes beyond PROTOCOL.md: write and edit replace a regular file atomically (temporary
 * file + rename in the same directory; mode
 * kept, new files 0644, new dirs 0755 less the umask); a final symlink is written through
 * in place instead, and an existing file the caller may not write is permission_denied
 * even in a writable directory. Deleting the root is invalid_path. ls fails with too_large
 * past 100000 entries. glob returns files and directories; a trailing "**" matches
 * everything beneath (not the directory itself);
 * "{a,b}" alternatives are expanded; an absolute pattern (under @root_name) ignores
 * "path"; ".." in a pattern is invalid_params. grep's "glob" filter matches the file name,
 * or with a '/' the path relative to the start directory; grep match text is cut at 4096
 * bytes; grep skips files above CONCH_FS_MAX_FILE found while walking (a named one is
 * too_large). upload and download take at most 1000 entries; download stops sending
 * content past 64 MiB in all (later entries get too_large); per-entry errors carry the
 * same codes, invalid base64 being "invalid_params". Strings returned are valid UTF-8:
 * invalid bytes in text become U+FFFD.
 *
 * Returns a new json_t result (caller decrefs), or NULL with @ferr filled (@ferr is reset
 * on entry; on success its code is CONCH_FS_OK).
 */
json_t *conch_fs_call(int root_fd, const char *root_name, const char *method, json_t *params,
                      struct conch_fs_error *ferr);

/*
 * conch_fs_call_rooted - conch_fs_call over a whole sandbox: @sys_root_fd is its "/"
 * (borrowed), every absolute path is resolved from it with RESOLVE_IN_ROOT (absolute
 * symlinks and ".." stay inside, as the kernel resolves them for a process chrooted there),
 * and relative paths, "" and the default directory of ls, glob and grep are under @home
 * (e.g. "/workspace"). Deleting "/" or @home is invalid_path. What the caller may read or
 * write is what the process may: run it under the sandbox's fences.
 */
json_t *conch_fs_call_rooted(int sys_root_fd, const char *home, const char *method, json_t *params,
                             struct conch_fs_error *ferr);

/*
 * conch_fs_call_rooted_data - conch_fs_call_rooted with @data_fd (borrowed; -1: none), the
 * host file of "copy_in" (read from its start: the content of "path", replaced atomically as
 * by "write", with no size cap but the process's RLIMIT_FSIZE; result {bytes_written,
 * created}) and "copy_out" ("path", a regular file, copied over it from its start, which is
 * truncated; result {size}). The copy is done by the kernel (copy_file_range, sendfile).
 * Those two methods fail without @data_fd; the others ignore it.
 */
json_t *conch_fs_call_rooted_data(int sys_root_fd, const char *home, const char *method,
                                  json_t *params, int data_fd, struct conch_fs_error *ferr);

/*
 * conch_fs_defer_replaced - with @on, a write or edit that replaces a regular file holds the
 * old one open (O_PATH) while it renames the new one over it, and conch_fs_release_deferred
 * closes it once the answer is sent: freeing the old inode's blocks is then no part of the
 * write's latency. The name is replaced at once, as without. Off by default; the caller
 * that turns it on must call conch_fs_release_deferred after each answer. Per thread.
 */
void conch_fs_defer_replaced(bool on);

/*
 * conch_fs_release_deferred - free what writes held for after their answer (see
 * conch_fs_defer_replaced); the next conch_fs_call* does it too.
 */
void conch_fs_release_deferred(void);

/*
 * conch_fs_json_object_check - whether the @n bytes at @text are exactly one JSON object
 * (surrounded by spaces or tabs at most) that may be spliced as it is into a JSON-RPC line:
 * no raw CR, LF or other control character anywhere, strings of valid UTF-8 with valid
 * escapes, no duplicate key within an object. Stricter than JSON, to stay cheap (one pass,
 * no allocation): false also for escaped keys, \u escapes of surrogates, more than 32 keys
 * in one object or nesting deeper than 32; such text takes the caller's slow path (parse
 * and serialise anew).
 */
bool conch_fs_json_object_check(const char *text, size_t n);

/* ---- The file workers' bodies (fs-worker.c): they run inside the sandbox ---- */

/* The largest fs.* request a file worker takes. */
#define CONCH_FS_MAX_REQUEST (256u << 20)

/*
 * conch_fs_worker_answer - inside the sandbox: do the fs.* request @buf (@len bytes of JSON
 * {method, params}) with conch_fs_call_rooted over the process's "/" (home "/workspace") and
 * return the answer's JSON text ({"result": ...} or {"error": {code, message, param?,
 * occurrences?, limit?}}; a new string), or NULL for a malformed request.
 */
char *conch_fs_worker_answer(const char *buf, size_t len);
/* conch_fs_worker_answer_data - conch_fs_worker_answer with the host file @data_fd
 * (borrowed; -1: none) of conch_fs_call_rooted_data. */
char *conch_fs_worker_answer_data(const char *buf, size_t len, int data_fd);

/*
 * conch_fs_worker_run - inside the sandbox: a per-request file worker's body. Reads the
 * request from the memfd @req_fd (borrowed; at most CONCH_FS_MAX_REQUEST bytes), writes the
 * answer of conch_fs_worker_answer_data (with @data_fd, borrowed, -1: none) to @resp_fd
 * (borrowed). Returns the exit status: 0, or 1 when the request could not be read, was
 * malformed or the answer could not be written.
 */
int conch_fs_worker_run(int req_fd, int resp_fd, int data_fd);

/*
 * conch_fs_worker_serve - inside the sandbox: a persistent file worker's loop on the stream
 * socket @sock (borrowed). Reads a frame (a native-endian uint64_t length, then that many
 * bytes of JSON request), answers it with conch_fs_worker_answer in a frame of the same form
 * (length 0: the request was malformed), one at a time, until EOF. Replaced files are freed
 * after each answer (conch_fs_defer_replaced). Returns the exit status: 0 at EOF, 1 on a
 * read or write error or a frame of 0 or over CONCH_FS_MAX_REQUEST bytes.
 */
int conch_fs_worker_serve(int sock);

/* conch_fs_base64_encode - a new NUL-terminated standard base64 (padded) string of @data.
 * conch_fs_base64_decode - decode @s (@len bytes; padding optional, no other characters) into
 * a new *@ret of *@ret_len bytes. Returns 0, -EINVAL for bad base64, -ENOMEM. (The same
 * coding as the file operations' "encoding": "base64", for the daemon's other methods.) */
char *conch_fs_base64_encode(const unsigned char *data, size_t len, size_t *ret_len);
int conch_fs_base64_decode(const char *s, size_t len, unsigned char **ret, size_t *ret_len);

#endif
