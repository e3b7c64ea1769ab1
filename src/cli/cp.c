/* cp.c - `conch cp`: files and directory trees into and out of a daemon sandbox, as `docker cp`
 * copies them, through the fs.* methods (docs/PROTOCOL.md): file contents of CP_COPY_MIN bytes
 * and more by fs.copy_in / fs.copy_out (the daemon opens the local file and a file worker
 * copies it in the kernel), smaller ones, and all where the daemon cannot open our files, in
 * chunks of CP_CHUNK (fs.write append / fs.read byte ranges); directories and modes recreated,
 * symbolic links copied as links; progress on stderr when it is a terminal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "workspace/workspace.h"

static const char usage[] =
    "usage: conch cp [--socket PATH] [--json] SRC DST\n"
    "\n"
    "Copy a file or a directory tree (any size) into or out of a sandbox, as docker cp does:\n"
    "exactly one of SRC and DST is ID:PATH (ID an id or a name; PATH relative to /workspace,\n"
    "or absolute inside the sandbox). A DST that is a directory (or ends in '/') receives SRC\n"
    "under its own name; otherwise DST becomes the copy. Modes and symbolic links are kept.\n"
    "Progress is shown on stderr when it is a terminal. Write a local path holding ':' as\n"
    "./a:b.\n";

/* Bytes moved per request: well below every cap of the protocol (10 MiB of content). */
#define CP_CHUNK (8u << 20)
/* Files from this size on go by fs.copy_in / fs.copy_out (a worker is forked for each: below
 * it, a chunk through the persistent workers costs less). */
#define CP_COPY_MIN (1u << 20)

/* One entry of the tree being copied: @rel is relative to the top ("" for the top). */
struct item {
    char *rel;
    char type; /* 'f', 'd', 'l' */
    unsigned mode;
    uint64_t size;
    char *link; /* 'l': the target */
};

struct cp {
    struct conch_cli_conn *c;
    char id[128];
    struct item *items;
    size_t n, cap;
    uint64_t total, done;
    bool progress;
    double t0, shown;
    unsigned skipped;
    bool no_copy;    /* the daemon cannot open our files (an old one, another host's): chunks */
    unsigned copied; /* files moved by fs.copy_in / fs.copy_out */
};

static void items_free(struct cp *cp)
{
    for (size_t i = 0; i < cp->n; i++) {
        free(cp->items[i].rel);
        free(cp->items[i].link);
    }
    free(cp->items);
}

static int add_item(struct cp *cp, const char *rel, char type, unsigned mode, uint64_t size,
                    const char *link)
{
    if (cp->n == cp->cap) {
        size_t cap = cp->cap ? cp->cap * 2 : 64;
        struct item *ni = realloc(cp->items, cap * sizeof(*ni));
        if (!ni)
            return -1;
        cp->items = ni;
        cp->cap = cap;
    }
    struct item *it = &cp->items[cp->n];
    *it = (struct item){.rel = strdup(rel), .type = type, .mode = mode & 07777, .size = size};
    if (link)
        it->link = strdup(link);
    if (!it->rel || (link && !it->link))
        return -1;
    cp->n++;
    if (type == 'f')
        cp->total += size;
    return 0;
}

/* @path for a message: quoted as git quotes names (a name is data, never raw on a terminal). */
static void warn_path(const char *what, const char *path, const char *why)
{
    _cleanup_free_ char *q = conch_ws_quote("", path, false);
    fprintf(stderr, "conch cp: %s %s%s%s\n", what, q ? q : "?", why ? ": " : "", why ? why : "");
}

static void show_progress(struct cp *cp, bool last)
{
    if (!cp->progress)
        return;
    double now = conch_cli_now();
    if (!last && now - cp->shown < 0.1)
        return;
    cp->shown = now;
    double secs = now - cp->t0;
    fprintf(stderr, "\rconch cp: %.1f / %.1f MiB  %.0f MB/s   ", (double)cp->done / 1048576.0,
            (double)cp->total / 1048576.0, secs > 0 ? (double)cp->done / 1e6 / secs : 0.0);
    if (last)
        fputc('\n', stderr);
}

/* ---- base64 ---- */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const unsigned char *p, size_t n)
{
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        *o++ = b64chars[v >> 18 & 63];
        *o++ = b64chars[v >> 12 & 63];
        *o++ = b64chars[v >> 6 & 63];
        *o++ = b64chars[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0);
        *o++ = b64chars[v >> 18 & 63];
        *o++ = b64chars[v >> 12 & 63];
        *o++ = i + 1 < n ? b64chars[v >> 6 & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

/* Decode @s (@n bytes) into a new buffer; -EINVAL for a byte outside the alphabet. */
static int b64_decode(const char *s, size_t n, unsigned char **ret, size_t *ret_len)
{
    static signed char table[256];
    if (!table['B']) {
        memset(table, -1, sizeof(table));
        for (int i = 0; i < 64; i++)
            table[(unsigned char)b64chars[i]] = (signed char)i;
    }
    unsigned char *out = malloc(n / 4 * 3 + 3);
    if (!out)
        return -ENOMEM;
    size_t len = 0;
    unsigned v = 0, bits = 0;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        int k = table[(unsigned char)s[i]];
        if (k < 0) {
            free(out);
            return -EINVAL;
        }
        v = v << 6 | (unsigned)k;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(v >> bits);
        }
    }
    *ret = out;
    *ret_len = len;
    return 0;
}

/* ---- requests ---- */

/* One request (takes @params) and its whole answer: the result (a new reference), or NULL
 * with the error's data.code in @ret_code (printed when @quiet is false). */
static json_t *call(struct cp *cp, const char *method, json_t *params, bool quiet, char *ret_code,
                    size_t size)
{
    if (ret_code)
        ret_code[0] = '\0';
    int id;
    if (conch_cli_conn_send(cp->c, method, params, &id) < 0) {
        fprintf(stderr, "conch cp: write to the daemon: %s\n", strerror(errno));
        return NULL;
    }
    for (;;) {
        json_t *msg = conch_cli_conn_next(cp->c, true);
        if (!msg) {
            fprintf(stderr, "conch cp: the daemon closed the connection\n");
            return NULL;
        }
        json_t *jid = json_object_get(msg, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) != id) {
            json_decref(msg);
            continue;
        }
        json_t *res = json_incref(json_object_get(msg, "result"));
        if (!res) {
            json_t *e = json_object_get(msg, "error");
            const char *code =
                json_string_value(json_object_get(json_object_get(e, "data"), "code"));
            if (ret_code)
                snprintf(ret_code, size, "%s", code ? code : "");
            if (!quiet) {
                _cleanup_free_ char *text = conch_cli_error_text(
                    json_string_value(json_object_get(e, "message")) ?: "failed");
                fprintf(stderr, "conch cp: error%s%s%s: %s\n", code ? " (" : "", code ? code : "",
                        code ? ")" : "", text ? text : "failed");
            }
        }
        json_decref(msg);
        return res;
    }
}

/* Join a directory and a relative path ("" is the directory itself). Returns a new string. */
static char *join(const char *dir, const char *rel)
{
    char *s = NULL;
    size_t dl = strlen(dir);
    if (!*rel)
        return strdup(dir);
    if (asprintf(&s, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", rel) < 0)
        return NULL;
    return s;
}

static const char *base_name(const char *p)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    const char *s = memrchr(p, '/', n);
    return s ? s + 1 : p;
}

/* Quote @s for bash: 'it'\''s', appended to @buf. */
static int append_quoted(char **buf, size_t *len, const char *s)
{
    char *nb = realloc(*buf, *len + strlen(s) * 4 + 4);
    if (!nb)
        return -1;
    *buf = nb;
    char *p = *buf + *len;
    *p++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            memcpy(p, "'\\''", 4);
            p += 4;
        } else {
            *p++ = *s;
        }
    }
    *p++ = '\'';
    *p++ = ' ';
    *p = '\0';
    *len = (size_t)(p - *buf);
    return 0;
}

static int append_text(char **buf, size_t *len, const char *s)
{
    size_t n = strlen(s);
    char *nb = realloc(*buf, *len + n + 1);
    if (!nb)
        return -1;
    *buf = nb;
    memcpy(*buf + *len, s, n + 1);
    *len += n;
    return 0;
}

/* Run @script in the sandbox (bash, at /workspace); 0 when it exited 0. */
static int sandbox_script(struct cp *cp, const char *script)
{
    json_t *res =
        call(cp, "exec.run",
             json_pack("{s:s,s:s,s:b}", "sandbox", cp->id, "command", script, "changes", 0), false,
             NULL, 0);
    if (!res)
        return -1;
    int code = (int)json_integer_value(json_object_get(res, "exit_code"));
    if (code != 0) {
        json_t *e = json_object_get(res, "stderr");
        fprintf(stderr, "conch cp: in the sandbox: %.*s", (int)json_string_length(e),
                json_string_value(e) ?: "");
    }
    json_decref(res);
    return code == 0 ? 0 : -1;
}

/* ---- into the sandbox ---- */

/* The local tree at @path (@rel under the top) into cp->items. */
static int walk_local(struct cp *cp, const char *path, const char *rel)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        warn_path("cannot read", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode))
        return add_item(cp, rel, 'f', st.st_mode, (uint64_t)st.st_size, NULL);
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n < 0) {
            warn_path("cannot read the link", path, strerror(errno));
            return -1;
        }
        target[n] = '\0';
        return add_item(cp, rel, 'l', 0777, 0, target);
    }
    if (!S_ISDIR(st.st_mode)) {
        warn_path("skipped (not a file, directory or link)", path, NULL);
        cp->skipped++;
        return 0;
    }
    if (add_item(cp, rel, 'd', st.st_mode, 0, NULL) < 0)
        return -1;
    DIR *d = opendir(path);
    if (!d) {
        warn_path("cannot read", path, strerror(errno));
        return -1;
    }
    int r = 0;
    struct dirent *e;
    while (r == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        _cleanup_free_ char *sub = join(path, e->d_name);
        _cleanup_free_ char *subrel = join(rel, e->d_name);
        r = sub && subrel ? walk_local(cp, sub, subrel) : -1;
    }
    closedir(d);
    return r;
}

/* @path made absolute (against the working directory); a new string. */
static char *absolute(const char *path)
{
    if (path[0] == '/')
        return strdup(path);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd)))
        return NULL;
    return join(cwd, path);
}

/*
 * Move the file open at @fd (the local @local) by fs.copy_in (@in) or fs.copy_out to @remote.
 * Returns 1 when done, 0 when not (the caller copies in chunks, which reports any error of
 * the sandbox's side as it always has; after a refusal of the host file, later files go in
 * chunks at once).
 */
static int try_copy(struct cp *cp, bool in, int fd, const char *local, const char *remote,
                    uint64_t size)
{
    /* One file out of the sandbox: its size is not known here (fs.ls lists directories). */
    bool unknown = !in && cp->n == 1 && size == 0;
    if (cp->no_copy || (size < CP_COPY_MIN && !unknown))
        return 0;
    struct stat st;
    _cleanup_free_ char *abs = absolute(local);
    if (!abs || fstat(fd, &st) < 0)
        return 0;
    char id[64], code[64];
    snprintf(id, sizeof(id), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
    json_t *res = call(cp, in ? "fs.copy_in" : "fs.copy_out",
                       json_pack("{s:s,s:s,s:s,s:s}", "sandbox", cp->id, "path", remote,
                                 "host_path", abs, "host_id", id),
                       true, code, sizeof(code));
    if (!res && (!strcmp(code, "method_not_found") || !strcmp(code, "invalid_params"))) {
        /* The daemon does not open files for us (another host, another uid, older): every
         * file goes in chunks from here on. */
        cp->no_copy = true;
        return 0;
    }
    if (!res) {
        /* Said again by the chunked path, which reports it as it always has. */
        return 0;
    }
    json_int_t moved = json_integer_value(json_object_get(res, in ? "bytes_written" : "size"));
    json_decref(res);
    cp->done += (uint64_t)(moved > 0 ? moved : 0);
    if (unknown)
        cp->total = cp->done;
    cp->copied++;
    show_progress(cp, false);
    return 1;
}

static int file_in(struct cp *cp, const char *src, const char *dst)
{
    _cleanup_close_ int fd = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        warn_path("cannot read", src, strerror(errno));
        return -1;
    }
    struct stat st;
    int via = fstat(fd, &st) == 0 && S_ISREG(st.st_mode)
                  ? try_copy(cp, true, fd, src, dst, (uint64_t)st.st_size)
                  : 0;
    if (via != 0)
        return via > 0 ? 0 : -1;
    _cleanup_free_ unsigned char *buf = malloc(CP_CHUNK);
    if (!buf)
        return -1;
    for (bool first = true;; first = false) {
        size_t n = 0;
        while (n < CP_CHUNK) {
            ssize_t got = read(fd, buf + n, CP_CHUNK - n);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0) {
                warn_path("cannot read", src, strerror(errno));
                return -1;
            }
            if (got == 0)
                break;
            n += (size_t)got;
        }
        if (n == 0 && !first)
            break;
        _cleanup_free_ char *b64 = b64_encode(buf, n);
        json_t *res = b64 ? call(cp, "fs.write",
                                 json_pack("{s:s,s:s,s:s,s:s,s:b}", "sandbox", cp->id, "path", dst,
                                           "encoding", "base64", "content", b64, "append", !first),
                                 false, NULL, 0)
                          : NULL;
        if (!res)
            return -1;
        json_decref(res);
        cp->done += n;
        show_progress(cp, false);
        if (n < CP_CHUNK)
            break;
    }
    return 0;
}

/* Directories first (one mkdir), then the files, then modes and links (one script). */
static int tree_in(struct cp *cp, const char *src, const char *dst)
{
    _cleanup_free_ char *mk = NULL, *fix = NULL;
    size_t mkl = 0, fixl = 0;
    if (append_text(&mk, &mkl, "mkdir -p -- ") < 0 || append_text(&fix, &fixl, "set -e; ") < 0)
        return -1;
    bool dirs = false, fixes = false;
    for (size_t i = 0; i < cp->n; i++) {
        struct item *it = &cp->items[i];
        _cleanup_free_ char *to = join(dst, it->rel);
        if (!to)
            return -1;
        char mode[32];
        snprintf(mode, sizeof(mode), "chmod %o -- ", it->mode & 0777);
        if (it->type == 'd') {
            dirs = true;
            if (append_quoted(&mk, &mkl, to) < 0)
                return -1;
        }
        if ((it->type == 'd' && (it->mode & 0777) != 0755) ||
            (it->type == 'f' && (it->mode & 0777) != 0644)) {
            fixes = true;
            if (append_text(&fix, &fixl, mode) < 0 || append_quoted(&fix, &fixl, to) < 0 ||
                append_text(&fix, &fixl, "; ") < 0)
                return -1;
        } else if (it->type == 'l') {
            fixes = true;
            if (append_text(&fix, &fixl, "ln -sfn -- ") < 0 ||
                append_quoted(&fix, &fixl, it->link) < 0 || append_quoted(&fix, &fixl, to) < 0 ||
                append_text(&fix, &fixl, "; ") < 0)
                return -1;
        }
    }
    if (dirs && sandbox_script(cp, mk) < 0)
        return -1;
    for (size_t i = 0; i < cp->n; i++) {
        struct item *it = &cp->items[i];
        if (it->type != 'f')
            continue;
        _cleanup_free_ char *from = join(src, it->rel);
        _cleanup_free_ char *to = join(dst, it->rel);
        if (!from || !to || file_in(cp, from, to) < 0)
            return -1;
    }
    /* Modes last: a directory made read-only first would refuse its files. */
    return fixes ? sandbox_script(cp, fix) : 0;
}

/* ---- out of the sandbox ---- */

/* The sandbox's tree at @path (@rel under the top; @type, @mode, @size from its listing) into
 * cp->items. */
static int walk_remote(struct cp *cp, const char *path, const char *rel, char type, unsigned mode,
                       uint64_t size)
{
    if (type == 'f')
        return add_item(cp, rel, 'f', mode, size, NULL);
    if (type == 'l') {
        _cleanup_free_ char *script = NULL;
        size_t len = 0;
        if (append_text(&script, &len, "readlink -- ") < 0 ||
            append_quoted(&script, &len, path) < 0)
            return -1;
        json_t *res =
            call(cp, "exec.run",
                 json_pack("{s:s,s:s,s:b}", "sandbox", cp->id, "command", script, "changes", 0),
                 false, NULL, 0);
        if (!res)
            return -1;
        json_t *out = json_object_get(res, "stdout");
        _cleanup_free_ char *target =
            strndup(json_string_value(out) ?: "", json_string_length(out));
        json_decref(res);
        if (!target)
            return -1;
        target[strcspn(target, "\n")] = '\0';
        return add_item(cp, rel, 'l', 0777, 0, target);
    }
    if (type != 'd') {
        warn_path("skipped (not a file, directory or link)", path, NULL);
        cp->skipped++;
        return 0;
    }
    if (add_item(cp, rel, 'd', mode, 0, NULL) < 0)
        return -1;
    json_t *res =
        call(cp, "fs.ls", json_pack("{s:s,s:s}", "sandbox", cp->id, "path", path), false, NULL, 0);
    if (!res)
        return -1;
    int r = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "entries"), i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *t = json_string_value(json_object_get(e, "type"));
        if (!name || !t || r < 0)
            continue;
        _cleanup_free_ char *sub = join(path, name);
        _cleanup_free_ char *subrel = join(rel, name);
        r = sub && subrel
                ? walk_remote(cp, sub, subrel, t[0],
                              (unsigned)strtoul(
                                  json_string_value(json_object_get(e, "mode")) ?: "0", NULL, 8),
                              (uint64_t)json_integer_value(json_object_get(e, "size")))
                : -1;
    }
    json_decref(res);
    return r;
}

/* The sandbox's file @src into the local file @dst, by byte ranges (fs.read offset/length). */
static int file_out(struct cp *cp, const char *src, const char *dst, unsigned mode, uint64_t size)
{
    _cleanup_close_ int fd =
        open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode ? mode & 0777 : 0644);
    if (fd < 0) {
        warn_path("cannot write", dst, strerror(errno));
        return -1;
    }
    struct stat st;
    int via =
        fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? try_copy(cp, false, fd, dst, src, size) : 0;
    if (via < 0)
        return -1;
    if (via > 0) {
        if (mode && fchmod(fd, mode & 0777) < 0) {
            warn_path("cannot set the mode of", dst, strerror(errno));
            return -1;
        }
        return 0;
    }
    json_int_t off = 0;
    for (;;) {
        json_t *res = call(cp, "fs.read",
                           json_pack("{s:s,s:s,s:s,s:I,s:i}", "sandbox", cp->id, "path", src,
                                     "encoding", "base64", "offset", off, "length", (int)CP_CHUNK),
                           false, NULL, 0);
        if (!res)
            return -1;
        json_t *content = json_object_get(res, "content");
        _cleanup_free_ unsigned char *data = NULL;
        size_t n = 0;
        int r = json_is_string(content)
                    ? b64_decode(json_string_value(content), json_string_length(content), &data, &n)
                    : -EINVAL;
        bool eof = json_is_true(json_object_get(res, "eof"));
        if (cp->n == 1 && !cp->total) /* one file: its size comes with its first piece */
            cp->total = (uint64_t)json_integer_value(json_object_get(res, "size"));
        json_decref(res);
        if (r < 0) {
            warn_path("the daemon sent invalid base64 for", src, NULL);
            return -1;
        }
        if (conch_write_all(fd, data, n) < 0) {
            warn_path("cannot write", dst, strerror(errno));
            return -1;
        }
        off += (json_int_t)n;
        cp->done += n;
        show_progress(cp, false);
        if (eof || n == 0)
            break;
    }
    if (mode && fchmod(fd, mode & 0777) < 0) {
        warn_path("cannot set the mode of", dst, strerror(errno));
        return -1;
    }
    return 0;
}

static int tree_out(struct cp *cp, const char *src, const char *dst)
{
    for (size_t i = 0; i < cp->n; i++) {
        struct item *it = &cp->items[i];
        _cleanup_free_ char *from = join(src, it->rel);
        _cleanup_free_ char *to = join(dst, it->rel);
        if (!from || !to)
            return -1;
        if (it->type == 'd' && mkdir(to, 0700) < 0 && errno != EEXIST) {
            warn_path("cannot make the directory", to, strerror(errno));
            return -1;
        }
        if (it->type == 'f' && file_out(cp, from, to, it->mode, it->size) < 0)
            return -1;
        if (it->type == 'l' && symlink(it->link, to) < 0) {
            warn_path("cannot make the link", to, strerror(errno));
            return -1;
        }
    }
    /* Directory modes last, deepest first: one made read-only early would refuse its files. */
    for (size_t i = cp->n; i-- > 0;) {
        struct item *it = &cp->items[i];
        _cleanup_free_ char *to = join(dst, it->rel);
        if (it->type == 'd' && to && chmod(to, it->mode & 0777) < 0) {
            warn_path("cannot set the mode of", to, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* ---- the verb ---- */

/* "ID:PATH" (a colon before any '/') names a path in a sandbox; anything else is local. */
static bool split_remote(char *arg, char **ret_ref, char **ret_path)
{
    char *colon = strchr(arg, ':');
    char *slash = strchr(arg, '/');
    if (!colon || colon == arg || (slash && slash < colon))
        return false;
    *colon = '\0';
    *ret_ref = arg;
    *ret_path = colon + 1;
    return true;
}

/* Whether the sandbox's @path is a directory (fs.ls lists it). */
static bool remote_is_dir(struct cp *cp, const char *path)
{
    json_t *res =
        call(cp, "fs.ls", json_pack("{s:s,s:s}", "sandbox", cp->id, "path", path), true, NULL, 0);
    json_decref(res);
    return res != NULL;
}

/* The copy of @src into @dst0 (one of them in the sandbox); *@ret_dst the path written. */
static int copy(struct cp *cp, bool in, const char *src, const char *dst0, char **ret_dst)
{
    int r;
    char code[64];
    size_t dl = strlen(dst0);
    bool dst_dir;
    struct stat st;
    if (in) {
        if ((r = walk_local(cp, src, "")) < 0)
            return r;
        dst_dir = dst0[dl - 1] == '/' || remote_is_dir(cp, dst0);
    } else {
        /* A directory lists; a file says not_a_directory. */
        json_t *res = call(cp, "fs.ls", json_pack("{s:s,s:s}", "sandbox", cp->id, "path", src),
                           true, code, sizeof(code));
        json_decref(res);
        if (!res && strcmp(code, "not_a_directory")) {
            json_decref(call(cp, "fs.ls", json_pack("{s:s,s:s}", "sandbox", cp->id, "path", src),
                             false, NULL, 0)); /* say why */
            return -1;
        }
        /* A file's size (for the progress) comes with its first piece. */
        r = res ? walk_remote(cp, src, "", 'd', 0755, 0) : add_item(cp, "", 'f', 0, 0, NULL);
        if (r < 0)
            return r;
        dst_dir = dst0[dl - 1] == '/' || (stat(dst0, &st) == 0 && S_ISDIR(st.st_mode));
    }
    char *dst = dst_dir ? join(dst0, base_name(src)) : strdup(dst0);
    if (!dst)
        return -1;
    *ret_dst = dst;
    cp->t0 = conch_cli_now();
    r = in ? tree_in(cp, src, dst) : tree_out(cp, src, dst);
    show_progress(cp, true);
    return r;
}

int conch_cli_cp(int argc, char **argv)
{
    struct conch_cli_sock_json o = {0};
    const struct conch_cli_parser p = {.verb = "cp",
                                       .table = conch_cli_sock_json_opts,
                                       .handler = conch_cli_sock_json_opt,
                                       .ctx = &o};
    struct conch_err err = {0};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("cp", usage, "%s", err.msg);
    if (argc - optind != 2)
        return conch_cli_usage_error("cp", usage, "expected SRC and DST");
    char *sref = NULL, *spath = NULL, *dref = NULL, *dpath = NULL;
    bool sremote = split_remote(argv[optind], &sref, &spath);
    bool dremote = split_remote(argv[optind + 1], &dref, &dpath);
    if (sremote == dremote)
        return conch_cli_usage_error("cp", usage, "%s",
                                     sremote ? "both SRC and DST are in a sandbox: copy through "
                                               "the host"
                                             : "neither SRC nor DST is ID:PATH");
    const char *src = sremote ? spath : argv[optind];
    const char *dst = dremote ? dpath : argv[optind + 1];
    if (!*src || !*dst)
        return conch_cli_usage_error("cp", usage, "empty path");
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    struct cp cp = {.c = &c, .progress = !o.json && isatty(STDERR_FILENO), .no_copy = c.remote};
    int status = 1;
    char *written = NULL;
    if (conch_cli_resolve(&c, sremote ? sref : dref, cp.id, sizeof(cp.id)) == 0 &&
        copy(&cp, dremote, src, dst, &written) == 0)
        status = cp.skipped ? 1 : 0;
    if (status == 0 && o.json) {
        json_t *j = json_pack("{s:s,s:s,s:I,s:I,s:I}", "src", src, "dst", written, "bytes",
                              (json_int_t)cp.done, "entries", (json_int_t)cp.n, "copied",
                              (json_int_t)cp.copied);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (s)
            puts(s);
        free(s);
        json_decref(j);
    }
    free(written);
    items_free(&cp);
    conch_cli_conn_close(&c);
    return status;
}
