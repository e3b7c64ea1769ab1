/* fs.c - the fs module's entry point: method dispatch, error codes and messages, param
 * checking, and parsing the caller's workspace paths into clean relative ones. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "fs/fs-internal.h"
#include "fs/fs.h"

static const char *const errcode_names[] = {
    [CONCH_FS_OK] = "ok",
    [CONCH_FS_FILE_NOT_FOUND] = "file_not_found",
    [CONCH_FS_PERMISSION_DENIED] = "permission_denied",
    [CONCH_FS_IS_DIRECTORY] = "is_directory",
    [CONCH_FS_INVALID_PATH] = "invalid_path",
    [CONCH_FS_NOT_A_DIRECTORY] = "not_a_directory",
    [CONCH_FS_STRING_NOT_FOUND] = "string_not_found",
    [CONCH_FS_AMBIGUOUS_MATCH] = "ambiguous_match",
    [CONCH_FS_TOO_LARGE] = "too_large",
    [CONCH_FS_INVALID_PARAMS] = "invalid_params",
    [CONCH_FS_IO_ERROR] = "io_error",
};

const char *conch_fs_errcode_name(enum conch_fs_errcode c)
{
    if ((unsigned)c >= ARRAY_SIZE(errcode_names))
        return "io_error";
    return errcode_names[c];
}

static int vfail(struct conch_fs_error *ferr, enum conch_fs_errcode code, const char *fmt,
                 va_list ap) __attribute__((format(printf, 3, 0)));
static int vfail(struct conch_fs_error *ferr, enum conch_fs_errcode code, const char *fmt,
                 va_list ap)
{
    ferr->code = code;
    vsnprintf(ferr->message, sizeof(ferr->message), fmt, ap);
    return -1;
}

int conch_fs__fail(struct conch_fs_error *ferr, enum conch_fs_errcode code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(ferr, code, fmt, ap);
    va_end(ap);
    return -1;
}

int conch_fs__fail_param(struct conch_fs_error *ferr, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(ferr, CONCH_FS_INVALID_PARAMS, fmt, ap);
    va_end(ap);
    snprintf(ferr->param, sizeof(ferr->param), "%s", param);
    return -1;
}

int conch_fs__fail_errno(struct conch_fs_error *ferr, int errnum, const char *what,
                         const char *path)
{
    enum conch_fs_errcode code;
    const char *cause = NULL;
    switch (errnum) {
    case ENOENT:
        code = CONCH_FS_FILE_NOT_FOUND;
        cause = "no such file or directory";
        break;
    case EACCES:
    case EPERM:
        code = CONCH_FS_PERMISSION_DENIED;
        cause = "permission denied";
        break;
    case EROFS:
        code = CONCH_FS_PERMISSION_DENIED;
        cause = "read-only file system";
        break;
    case EBUSY:
        /* Removing or replacing a mount point: a path rule's cover, or a dir above one. */
        code = CONCH_FS_PERMISSION_DENIED;
        cause = "a mount point (a path rule protects it)";
        break;
    case EISDIR:
        code = CONCH_FS_IS_DIRECTORY;
        cause = "is a directory";
        break;
    case ENOTDIR:
        code = CONCH_FS_NOT_A_DIRECTORY;
        cause = "not a directory";
        break;
    case EXDEV:
    case ELOOP:
        /* RESOLVE_BENEATH says EXDEV for an absolute symlink or ".." out of the root;
         * ELOOP is a symlink loop (or a magic link), equally unusable. */
        code = CONCH_FS_INVALID_PATH;
        cause = "the path leads outside the workspace (or through too many symlinks)";
        break;
    case ENAMETOOLONG:
        code = CONCH_FS_INVALID_PATH;
        cause = "name too long";
        break;
    case EFBIG:
        code = CONCH_FS_TOO_LARGE;
        cause = "file too large (past the sandbox's disk limit)";
        break;
    default:
        code = CONCH_FS_IO_ERROR;
        cause = strerror(errnum);
        break;
    }
    return conch_fs__fail(ferr, code, "%s '%s': %s", what, path, cause);
}

int conch_fs__params_check(json_t *params, const char *const *keys, struct conch_fs_error *ferr)
{
    const char *key;
    json_t *val;
    json_object_foreach(params, key, val)
    {
        bool known = false;
        for (const char *const *k = keys; *k; k++)
            if (strcmp(*k, key) == 0)
                known = true;
        if (!known)
            return conch_fs__fail_param(ferr, key, "unknown param '%s'", key);
    }
    return 0;
}

static json_t *param_get(json_t *params, const char *key)
{
    json_t *v = json_object_get(params, key);
    return json_is_null(v) ? NULL : v;
}

int conch_fs__param_str(json_t *params, const char *key, bool required, const char **ret,
                        size_t *ret_len, struct conch_fs_error *ferr)
{
    json_t *v = param_get(params, key);
    if (!v) {
        if (required)
            return conch_fs__fail_param(ferr, key, "missing param '%s'", key);
        *ret = NULL;
        if (ret_len)
            *ret_len = 0;
        return 0;
    }
    if (!json_is_string(v))
        return conch_fs__fail_param(ferr, key, "param '%s' must be a string", key);
    *ret = json_string_value(v);
    if (ret_len)
        *ret_len = json_string_length(v);
    return 1;
}

int conch_fs__param_int(json_t *params, const char *key, long long def, long long min,
                        long long max, long long *ret, struct conch_fs_error *ferr)
{
    json_t *v = param_get(params, key);
    if (!v) {
        *ret = def;
        return 0;
    }
    if (!json_is_integer(v))
        return conch_fs__fail_param(ferr, key, "param '%s' must be an integer", key);
    long long n = json_integer_value(v);
    if (n < min || n > max)
        return conch_fs__fail_param(ferr, key, "param '%s' must be between %lld and %lld", key, min,
                                    max);
    *ret = n;
    return 1;
}

int conch_fs__param_bool(json_t *params, const char *key, bool def, bool *ret,
                         struct conch_fs_error *ferr)
{
    json_t *v = param_get(params, key);
    if (!v) {
        *ret = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return conch_fs__fail_param(ferr, key, "param '%s' must be a boolean", key);
    *ret = json_is_true(v);
    return 1;
}

int conch_fs__param_encoding(json_t *params, bool *ret_base64, struct conch_fs_error *ferr)
{
    const char *enc;
    int r = conch_fs__param_str(params, "encoding", false, &enc, NULL, ferr);
    if (r < 0)
        return r;
    if (r == 0 || strcmp(enc, "utf-8") == 0 || strcmp(enc, "utf8") == 0) {
        *ret_base64 = false;
        return r;
    }
    if (strcmp(enc, "base64") == 0) {
        *ret_base64 = true;
        return r;
    }
    return conch_fs__fail_param(ferr, "encoding", "param 'encoding' must be 'utf-8' or 'base64'");
}

int conch_fs__path_parse(const struct conch_fs__ctx *ctx, const char *s, size_t len,
                         bool allow_empty, char **ret_rel, struct conch_fs_error *ferr)
{
    if (!s || strlen(s) != len)
        return conch_fs__fail(ferr, CONCH_FS_INVALID_PATH, "path '%s' contains a NUL byte",
                              s ? s : "");
    if (len == 0 && !allow_empty)
        return conch_fs__fail(ferr, CONCH_FS_INVALID_PATH, "empty path");
    if (len >= PATH_MAX)
        return conch_fs__fail(ferr, CONCH_FS_INVALID_PATH, "path '%.64s...' is too long", s);

    /* Rooted at the sandbox's "/": a relative path (and "") is under the home dir. */
    _cleanup_free_ char *joined = NULL;
    if (*ctx->home && (len == 0 || s[0] != '/')) {
        if (asprintf(&joined, "%s/%s", ctx->home, s) < 0)
            return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
        s = joined;
        len = strlen(joined);
    }
    bool absolute = s[0] == '/';
    _cleanup_free_ char *out = malloc(len + 1);
    if (!out)
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    size_t olen = 0;
    for (const char *p = s; *p;) {
        while (*p == '/')
            p++;
        const char *e = strchrnul(p, '/');
        size_t n = (size_t)(e - p);
        if (n == 0 || (n == 1 && p[0] == '.')) {
            /* nothing */
        } else if (n == 2 && p[0] == '.' && p[1] == '.') {
            if (olen == 0) {
                /* "/.." is "/" (POSIX); a relative path may not climb out of the root. */
                if (!absolute)
                    return conch_fs__fail(ferr, CONCH_FS_INVALID_PATH,
                                          "path '%s' leads outside the workspace", s);
            } else {
                char *slash = memrchr(out, '/', olen);
                olen = slash ? (size_t)(slash - out) : 0;
            }
        } else {
            if (olen)
                out[olen++] = '/';
            memcpy(out + olen, p, n);
            olen += n;
        }
        p = e;
    }
    out[olen] = '\0';

    const char *rel = out;
    if (absolute) {
        /* without the leading '/'; "" for "/" */
        const char *root = *ctx->root_name ? ctx->root_name + 1 : "";
        size_t rlen = strlen(root);
        if (rlen) {
            if (strncmp(out, root, rlen) != 0 || (out[rlen] != '\0' && out[rlen] != '/'))
                return conch_fs__fail(ferr, CONCH_FS_INVALID_PATH,
                                      "path '%s' is outside the workspace %s", s, ctx->root_name);
            rel = out + rlen + (out[rlen] == '/');
        }
    }
    *ret_rel = strdup(rel);
    if (!*ret_rel)
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    return 0;
}

char *conch_fs__path_display(const struct conch_fs__ctx *ctx, const char *rel)
{
    char *s = NULL;
    if (!*rel)
        s = strdup(*ctx->root_name ? ctx->root_name : "/");
    else if (asprintf(&s, "%s/%s", ctx->root_name, rel) < 0)
        s = NULL;
    return s;
}

char *conch_fs__path_join(const char *a, const char *b)
{
    char *s = NULL;
    if (!*a)
        return strdup(b);
    if (asprintf(&s, "%s/%s", a, b) < 0)
        return NULL;
    return s;
}

typedef json_t *method_fn(const struct conch_fs__ctx *ctx, json_t *params,
                          struct conch_fs_error *ferr);

static const struct {
    const char *name;
    method_fn *fn;
} methods[] = {
    {"read", conch_fs__read},         {"write", conch_fs__write},
    {"edit", conch_fs__edit},         {"ls", conch_fs__ls},
    {"glob", conch_fs__glob},         {"grep", conch_fs__grep},
    {"delete", conch_fs__delete},     {"upload", conch_fs__upload},
    {"download", conch_fs__download}, {"copy_in", conch_fs__copy_in},
    {"copy_out", conch_fs__copy_out},
};

_Thread_local bool conch_fs__in_root;

/* Files replaced by writes, held open (O_PATH) until the answer is out
 * (conch_fs_defer_replaced): their names are gone at once, their inodes are freed by
 * conch_fs_release_deferred closing these. */
#define MAX_DEFERRED 64
static _Thread_local bool defer_on;
static _Thread_local int deferred[MAX_DEFERRED];
static _Thread_local unsigned ndeferred;

void conch_fs_defer_replaced(bool on)
{
    defer_on = on;
}

void conch_fs__hold_replaced(int dirfd, const char *name)
{
    if (!defer_on || ndeferred == MAX_DEFERRED)
        return;
    int fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0)
        deferred[ndeferred++] = fd;
}

void conch_fs_release_deferred(void)
{
    while (ndeferred > 0)
        close(deferred[--ndeferred]);
}

const char *conch_fs__default_shown(const struct conch_fs__ctx *ctx)
{
    return *ctx->home ? ctx->home : *ctx->root_name ? ctx->root_name : "/";
}

static json_t *call_ctx(const struct conch_fs__ctx *ctx, const char *method, json_t *params,
                        struct conch_fs_error *ferr);

json_t *conch_fs_call_rooted(int sys_root_fd, const char *home, const char *method, json_t *params,
                             struct conch_fs_error *ferr)
{
    return conch_fs_call_rooted_data(sys_root_fd, home, method, params, -1, ferr);
}

json_t *conch_fs_call_rooted_data(int sys_root_fd, const char *home, const char *method,
                                  json_t *params, int data_fd, struct conch_fs_error *ferr)
{
    conch_fs_release_deferred();
    memset(ferr, 0, sizeof(*ferr));
    struct conch_fs__ctx ctx = {
        .root_fd = sys_root_fd, .data_fd = data_fd, .root_name = "", .home = home};
    conch_fs__in_root = true;
    json_t *res = call_ctx(&ctx, method, params, ferr);
    conch_fs__in_root = false;
    return res;
}

json_t *conch_fs_call(int root_fd, const char *root_name, const char *method, json_t *params,
                      struct conch_fs_error *ferr)
{
    conch_fs_release_deferred();
    memset(ferr, 0, sizeof(*ferr));
    char root[PATH_MAX];
    snprintf(root, sizeof(root), "%s", root_name && *root_name ? root_name : "/workspace");
    size_t n = strlen(root);
    while (n > 0 && root[n - 1] == '/')
        root[--n] = '\0';
    if (root[0] != '/' && n > 0) {
        conch_fs__fail(ferr, CONCH_FS_INVALID_PARAMS, "workspace root '%s' is not absolute",
                       root_name);
        return NULL;
    }
    struct conch_fs__ctx ctx = {.root_fd = root_fd, .data_fd = -1, .root_name = root, .home = ""};
    return call_ctx(&ctx, method, params, ferr);
}

static json_t *call_ctx(const struct conch_fs__ctx *ctx, const char *method, json_t *params,
                        struct conch_fs_error *ferr)
{
    json_t *empty = NULL;
    if (!params)
        params = empty = json_object();
    json_t *res = NULL;
    if (!params) {
        conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    } else if (!json_is_object(params)) {
        conch_fs__fail_param(ferr, "params", "params must be an object");
    } else {
        bool found = false;
        for (size_t i = 0; i < ARRAY_SIZE(methods) && method; i++) {
            if (strcmp(methods[i].name, method) == 0) {
                found = true;
                res = methods[i].fn(ctx, params, ferr);
                break;
            }
        }
        if (!found)
            conch_fs__fail_param(ferr, "method", "unknown fs method '%s'",
                                 method ? method : "(null)");
    }
    json_decref(empty);
    if (res)
        memset(ferr, 0, sizeof(*ferr));
    else if (ferr->code == CONCH_FS_OK)
        conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "fs.%s failed", method ? method : "");
    return res;
}
