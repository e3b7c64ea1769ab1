/* mounts.c - extra mounts of a sandbox (issue 18): `tmpfs` and `bind`, written as docker's
 * --mount (type=bind,source=/a,target=/b,ro) or as JSON objects, parsed and checked here once
 * for every way in (conch run --mount, conch create --mount, sandbox.create "mounts"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "spec/spec.h"

/* Targets a mount may not cover or sit beneath: the workspace, the kernel's and conch's own
 * trees, and the system the sandbox runs on. */
static const char *const deny_under[] = {"/workspace", "/proc",    "/dev",   "/sys",   "/run",
                                         "/etc",       "/oldroot", "/usr",   "/bin",   "/sbin",
                                         "/lib",       "/lib32",   "/lib64", "/libx32"};
/* ... and that may not be covered themselves (beneath them is fine). */
static const char *const deny_exact[] = {"/",
                                         "/tmp",
                                         "/home",
                                         "/home/agent",
                                         "/var",
                                         "/var/tmp",
                                         "/large_tool_results",
                                         "/conversation_history"};

static bool under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* An absolute path of plain components: no "", "." or ".." component, no trailing slash. */
static int path_ok(const char *what, const char *p, struct conch_err *err)
{
    size_t n = strlen(p);
    if (p[0] != '/' || n >= 1024)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "mount %s '%s': an absolute path (under 1024 bytes) is needed", what,
                              p);
    if (n == 1)
        return 0;
    for (const char *c = p + 1;;) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount %s '%s': empty, '.' and '..' components are refused", what,
                                  p);
        if (!e)
            break;
        c = e + 1;
    }
    return 0;
}

int conch_mount_check(const struct conch_mount *m, struct conch_err *err)
{
    int r = path_ok("target", m->target, err);
    if (r < 0)
        return r;
    for (size_t i = 0; i < sizeof(deny_under) / sizeof(deny_under[0]); i++)
        if (under(m->target, deny_under[i]))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount target '%s': %s and what is beneath it are the "
                                  "sandbox's own; choose another place (e.g. /opt/NAME, /data)",
                                  m->target, deny_under[i]);
    for (size_t i = 0; i < sizeof(deny_exact) / sizeof(deny_exact[0]); i++)
        if (!strcmp(m->target, deny_exact[i]))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount target '%s' would hide the sandbox's own; mount "
                                  "beneath it instead",
                                  m->target);
    if (m->type == CONCH_MOUNT_TMPFS) {
        if (m->bytes < CONCH_SPEC_SIZE_MIN || m->bytes > CONCH_SPEC_TMP_MAX)
            return conch_err_setk(err, CONCH_ERR_USAGE, ERANGE,
                                  "mount '%s': size must be between 64 KiB and 1 TiB", m->target);
        return 0;
    }
    if ((r = path_ok("source", m->source, err)) < 0)
        return r;
    /* Followed as the caller would follow it: a link planted to a file (/etc/shadow) is
     * refused here; what it may read is the kernel's to decide when the sandbox binds it,
     * with the caller's rights (the daemon serves only its own uid and root). */
    struct stat st;
    if (stat(m->source, &st) < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "mount source '%s': %s", m->source,
                              strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR,
                              "mount source '%s': not a directory (only directories are bound)",
                              m->source);
    /* With the real ids: the user who runs conch, or the daemon's, whose clients are its own
     * uid and root. A bind would not let the sandbox read more than the caller (the kernel
     * checks as it reads), but a directory the caller cannot list is refused up front. */
    if (access(m->source, R_OK | X_OK | (m->rw ? W_OK : 0)) < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno,
                              "mount source '%s': the calling user may not %s it: %s", m->source,
                              m->rw ? "read and write" : "read", strerror(errno));
    return 0;
}

static int set_type(struct conch_mount *m, const char *v, struct conch_err *err)
{
    if (!strcmp(v, "tmpfs"))
        m->type = CONCH_MOUNT_TMPFS;
    else if (!strcmp(v, "bind"))
        m->type = CONCH_MOUNT_BIND;
    else if (!strcmp(v, "overlay") || !strcmp(v, "store"))
        return conch_err_setk(err, CONCH_ERR_USAGE, EOPNOTSUPP,
                              "mount type '%s' is not supported yet (tmpfs, bind)", v);
    else
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount type '%s': tmpfs or bind", v);
    return 0;
}

static int set_str(char *dst, size_t size, const char *what, const char *v, struct conch_err *err)
{
    if (strlen(v) >= size)
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG, "mount %s: too long", what);
    snprintf(dst, size, "%s", v);
    return 0;
}

static void mount_init(struct conch_mount *m)
{
    memset(m, 0, sizeof(*m));
    m->type = -1;
    m->bytes = 64ULL << 20;
}

static int finish(struct conch_mount *m, bool have_rw, struct conch_err *err)
{
    if ((int)m->type < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount: type=tmpfs|bind is needed");
    if (!m->target[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount: a target is needed");
    if (m->type == CONCH_MOUNT_BIND && !m->source[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount '%s': a bind needs a source",
                              m->target);
    (void)have_rw;
    if (m->type == CONCH_MOUNT_TMPFS && m->source[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount '%s': a tmpfs has no source",
                              m->target);
    if (m->type == CONCH_MOUNT_TMPFS)
        m->rw = true; /* scratch space; a bind is read-only unless rw is asked for */
    return conch_mount_check(m, err);
}

int conch_mount_parse(const char *text, struct conch_mount *ret, struct conch_err *err)
{
    struct conch_mount m;
    mount_init(&m);
    _cleanup_free_ char *copy = strdup(text);
    if (!copy)
        return conch_err_set(err, ENOMEM, "out of memory");
    bool have_rw = false;
    char *save = NULL;
    for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        const char *v = eq ? eq + 1 : NULL;
        if (eq)
            *eq = '\0';
        int r = 0;
        if (!strcmp(kv, "type") && v)
            r = set_type(&m, v, err);
        else if ((!strcmp(kv, "source") || !strcmp(kv, "src")) && v)
            r = set_str(m.source, sizeof(m.source), "source", v, err);
        else if ((!strcmp(kv, "target") || !strcmp(kv, "dst") || !strcmp(kv, "destination")) && v)
            r = set_str(m.target, sizeof(m.target), "target", v, err);
        else if (!strcmp(kv, "size") && v)
            r = conch_parse_size(v, "mount size", &m.bytes, err);
        else if ((!strcmp(kv, "ro") || !strcmp(kv, "readonly")) &&
                 (!v || !strcmp(v, "true") || !strcmp(v, "1")))
            m.rw = false, have_rw = true;
        else if (!strcmp(kv, "rw") && (!v || !strcmp(v, "true") || !strcmp(v, "1")))
            m.rw = true, have_rw = true;
        else
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                               "mount '%s': unknown or incomplete '%s' (type=, source=, "
                               "target=, size=, ro, rw)",
                               text, kv);
        if (r < 0)
            return r;
    }
    int r = finish(&m, have_rw, err);
    if (r < 0)
        return r;
    *ret = m;
    return 0;
}

int conch_mount_from_json(json_t *v, struct conch_mount *ret, struct conch_err *err)
{
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount: a NUL byte");
        return conch_mount_parse(json_string_value(v), ret, err);
    }
    if (!json_is_object(v))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "each mount is an object {type, source?, target, size?, readonly?} "
                              "or a string type=...,target=...");
    struct conch_mount m;
    mount_init(&m);
    const char *k;
    json_t *e;
    bool have_rw = false;
    json_object_foreach(v, k, e)
    {
        int r = 0;
        bool str = json_is_string(e) && strlen(json_string_value(e)) == json_string_length(e);
        if (!strcmp(k, "type") && str)
            r = set_type(&m, json_string_value(e), err);
        else if (!strcmp(k, "source") && str)
            r = set_str(m.source, sizeof(m.source), "source", json_string_value(e), err);
        else if (!strcmp(k, "target") && str)
            r = set_str(m.target, sizeof(m.target), "target", json_string_value(e), err);
        else if (!strcmp(k, "size") && json_is_integer(e) && json_integer_value(e) >= 0)
            m.bytes = (uint64_t)json_integer_value(e);
        else if (!strcmp(k, "size") && str)
            r = conch_parse_size(json_string_value(e), "mount size", &m.bytes, err);
        else if (!strcmp(k, "readonly") && json_is_boolean(e))
            m.rw = !json_is_true(e), have_rw = true;
        else
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                               "mount: unknown or mistyped member '%s' (type, source, target, "
                               "size, readonly)",
                               k);
        if (r < 0)
            return r;
    }
    int r = finish(&m, have_rw, err);
    if (r < 0)
        return r;
    *ret = m;
    return 0;
}

json_t *conch_mount_to_json(const struct conch_mount *m)
{
    if (m->type == CONCH_MOUNT_TMPFS)
        return json_pack("{s:s,s:s,s:I}", "type", "tmpfs", "target", m->target, "size",
                         (json_int_t)m->bytes);
    return json_pack("{s:s,s:s,s:s,s:b}", "type", "bind", "source", m->source, "target", m->target,
                     "readonly", !m->rw);
}

int conch_spec_add_mount(struct conch_sandbox_spec *s, const struct conch_mount *m,
                         struct conch_err *err)
{
    if (s->n_mounts >= CONCH_SPEC_MOUNTS_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, E2BIG, "at most %d mounts",
                              CONCH_SPEC_MOUNTS_MAX);
    for (unsigned i = 0; i < s->n_mounts; i++)
        if (under(m->target, s->mounts[i].target) || under(s->mounts[i].target, m->target))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount targets '%s' and '%s' overlap", s->mounts[i].target,
                                  m->target);
    struct conch_mount *n = reallocarray(s->mounts, s->n_mounts + 1, sizeof(*n));
    if (!n)
        return conch_err_set(err, ENOMEM, "out of memory");
    s->mounts = n;
    s->mounts[s->n_mounts++] = *m;
    return 0;
}

int conch_spec_mounts_from_json(struct conch_sandbox_spec *s, json_t *arr, struct conch_err *err)
{
    if (!json_is_array(arr))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mounts must be an array");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        struct conch_mount m;
        int r = conch_mount_from_json(v, &m, err);
        if (r < 0 || (r = conch_spec_add_mount(s, &m, err)) < 0)
            return r;
    }
    return 0;
}
