/* mounts.c - extra mounts of a sandbox (issue 18): `tmpfs`, `bind` and `store`, written as docker's
 * --mount (type=bind,source=/a,target=/b,ro) or as JSON objects, and host unix sockets passed
 * in (issue 19: a bind of one socket file, --pass-socket HOST[:INSIDE] or "sockets"), parsed
 * and checked here once for every way in (conch run, conch create, sandbox.create). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "spec/spec.h"

/* Targets a mount may not cover or sit beneath: the workspace, the kernel's and conch's own
 * trees (/.conch-upper: conch run's upper tmpfs, in the tree while the extra mounts are made),
 * and the system the sandbox runs on. */
static const char *const deny_under[] = {
    "/workspace", "/proc", "/dev", "/sys",   "/run",   "/etc",    "/oldroot",     "/usr",
    "/bin",       "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/.conch-upper"};
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

/* The kernel's own filesystems: a bind of the host's gives the sandbox the host's processes
 * (/proc/PID/root, /proc/PID/mem of the caller's other processes), devices or kernel knobs. */
static const char *const kernel_fs[] = {
    "proc",    "sysfs",      "devtmpfs", "devpts",   "cgroup",    "cgroup2",  "debugfs",
    "tracefs", "securityfs", "bpf",      "configfs", "pstore",    "efivarfs", "binfmt_misc",
    "fusectl", "mqueue",     "nsfs",     "autofs",   "selinuxfs", "hugetlbfs"};

/* mountinfo's octal escapes (\040 for a space) undone in place. */
static void unescape_mountinfo(char *s)
{
    char *o = s;
    for (char *i = s; *i; i++) {
        if (i[0] == '\\' && i[1] >= '0' && i[1] <= '3' && i[2] >= '0' && i[2] <= '7' &&
            i[3] >= '0' && i[3] <= '7') {
            *o++ = (char)((i[1] - '0') * 64 + (i[2] - '0') * 8 + (i[3] - '0'));
            i += 3;
        } else {
            *o++ = *i;
        }
    }
    *o = '\0';
}

static bool is_kernel_fs(const char *type)
{
    for (size_t k = 0; k < sizeof(kernel_fs) / sizeof(kernel_fs[0]); k++)
        if (!strcmp(type, kernel_fs[k]))
            return true;
    return false;
}

/* Refuse a bind source @real (a realpath; @shown as the caller wrote it) that is on one of the
 * kernel's filesystems (the mount it lies in, the longest mount point above it), or holds a
 * mount of one beneath it (the bind is recursive), as this process's mount table shows them. */
static int source_clear_of_kernel_fs(const char *shown, const char *real, struct conch_err *err)
{
    _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return conch_err_setk(err, CONCH_ERR_INFRASTRUCTURE, errno,
                              "mount source '%s': read /proc/self/mountinfo: %s", shown,
                              strerror(errno));
    char line[4096], own_point[PATH_MAX] = "", own_type[64] = "";
    while (fgets(line, sizeof(line), f)) {
        /* id parent maj:min root MOUNTPOINT options [optional...] - FSTYPE source super */
        char *save = NULL, *field = strtok_r(line, " ", &save);
        char *point = NULL, *type = NULL;
        for (int i = 0; field; i++, field = strtok_r(NULL, " ", &save)) {
            if (i == 4)
                point = field;
            if (!strcmp(field, "-")) {
                type = strtok_r(NULL, " ", &save);
                break;
            }
        }
        if (!point || !type)
            continue;
        unescape_mountinfo(point);
        bool beneath = !strcmp(real, "/") ? strcmp(point, "/") != 0 : under(point, real);
        if (beneath && strcmp(point, real) != 0 && is_kernel_fs(type))
            return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                                  "mount source '%s' holds a kernel filesystem (%s at %s), which "
                                  "would give the sandbox the host's: bind a directory that "
                                  "holds none",
                                  shown, type, point);
        /* The mount @real lies in: the last (the one on top) of the longest point above it. */
        bool above = !strcmp(point, "/") || under(real, point);
        if (above && strlen(point) >= strlen(own_point)) {
            snprintf(own_point, sizeof(own_point), "%s", point);
            snprintf(own_type, sizeof(own_type), "%s", type);
        }
    }
    if (is_kernel_fs(own_type))
        return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                              "mount source '%s' is on a kernel filesystem (%s at %s), which would "
                              "give the sandbox the host's: bind a directory of your own",
                              shown, own_type, own_point);
    return 0;
}

/* An absolute path of plain components: no "", "." or ".." component, no trailing slash. */
static int path_ok(const char *what, const char *p, struct conch_err *err)
{
    size_t n = strlen(p);
    if (p[0] != '/' || n >= 1024)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "mount %s '%s': an absolute path (under 1024 bytes) is needed", what,
                              p);
    /* A control character (a newline) would make the mount table's lines (mountinfo, what
     * tools and the sandbox's own checks read) say something else than they mean. */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount %s: a control character in the path is refused", what);
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

/* A store's name: what workspace/'s conch_store_name_check allows (spec/ is below it). */
static int store_name_ok(const char *name, struct conch_err *err)
{
    size_t n = strlen(name);
    bool ok = n > 0 && n <= CONCH_MOUNT_STORE_NAME_MAX && name[0] != '.' && name[0] != '-';
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
             (name[i] >= '0' && name[i] <= '9') || name[i] == '-' || name[i] == '_' ||
             name[i] == '.';
    if (!ok)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "store name '%.80s': 1 to %d of [A-Za-z0-9._-], not starting with "
                              "'.' or '-'",
                              name, CONCH_MOUNT_STORE_NAME_MAX);
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
    if (m->type == CONCH_MOUNT_STORE) {
        if ((r = store_name_ok(m->name, err)) < 0)
            return r;
        if (m->bytes < CONCH_SPEC_SIZE_MIN || m->bytes > (16ULL << 30))
            return conch_err_setk(err, CONCH_ERR_USAGE, ERANGE,
                                  "mount '%s': a store's size must be between 64 KiB and 16 GiB",
                                  m->target);
        if (!m->source[0])
            return 0; /* its view is the daemon's to make */
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
    char real[PATH_MAX];
    if (!realpath(m->source, real))
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "mount source '%s': %s", m->source,
                              strerror(errno));
    return source_clear_of_kernel_fs(m->source, real, err);
}

static int set_type(struct conch_mount *m, const char *v, struct conch_err *err)
{
    if (!strcmp(v, "tmpfs"))
        m->type = CONCH_MOUNT_TMPFS;
    else if (!strcmp(v, "bind"))
        m->type = CONCH_MOUNT_BIND;
    else if (!strcmp(v, "store"))
        m->type = CONCH_MOUNT_STORE;
    else if (!strcmp(v, "overlay"))
        m->type = CONCH_MOUNT_OVERLAY;
    else
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "mount type '%s': tmpfs, bind, overlay or store", v);
    return 0;
}

static int set_str(char *dst, size_t size, const char *what, const char *v, struct conch_err *err)
{
    if (strlen(v) >= size)
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG, "mount %s: too long", what);
    snprintf(dst, size, "%s", v);
    return 0;
}

/* A size not given yet: finish() puts the type's default in its place (a size given as 0 is
 * refused by conch_mount_check, as any out of range). */
#define SIZE_UNSET UINT64_MAX

static void mount_init(struct conch_mount *m)
{
    memset(m, 0, sizeof(*m));
    m->type = -1;
    m->bytes = SIZE_UNSET;
}

static int finish(struct conch_mount *m, bool have_rw, struct conch_err *err)
{
    if ((int)m->type < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "mount: type=tmpfs|bind|overlay|store is needed");
    if (m->bytes == SIZE_UNSET)
        m->bytes = m->type == CONCH_MOUNT_STORE   ? 256ULL << 20
                   : m->type == CONCH_MOUNT_TMPFS ? 64ULL << 20
                                                  : 0;
    if (m->type == CONCH_MOUNT_STORE) {
        if (m->source[0])
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount '%s': a store has no source (its files are in the "
                                  "daemon's state dir; name=NAME says which)",
                                  m->target);
        if (!m->name[0])
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount '%s': a store needs name=NAME", m->target);
        m->rw = true;
    } else if (m->name[0]) {
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount '%s': only a store has a name",
                              m->target);
    }
    if (!m->target[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount: a target is needed");
    if ((m->type == CONCH_MOUNT_BIND || m->type == CONCH_MOUNT_OVERLAY) && !m->source[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "mount '%s': a %s needs a source",
                              m->target, m->type == CONCH_MOUNT_BIND ? "bind" : "overlay");
    /* The host dir is only read (the overlay's lower); the sandbox's writes go to its upper. */
    if (m->type == CONCH_MOUNT_OVERLAY)
        m->rw = false;
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
        else if (!strcmp(kv, "name") && v)
            r = set_str(m.name, sizeof(m.name), "name", v, err);
        else if ((!strcmp(kv, "ro") || !strcmp(kv, "readonly")) &&
                 (!v || !strcmp(v, "true") || !strcmp(v, "1")))
            m.rw = false, have_rw = true;
        else if (!strcmp(kv, "rw") && (!v || !strcmp(v, "true") || !strcmp(v, "1")))
            m.rw = true, have_rw = true;
        else
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                               "mount '%s': unknown or incomplete '%s' (type=, source=, "
                               "target=, size=, name=, ro, rw)",
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
        else if (!strcmp(k, "name") && str)
            r = set_str(m.name, sizeof(m.name), "name", json_string_value(e), err);
        else if (!strcmp(k, "size") && json_is_integer(e) && json_integer_value(e) > 0)
            m.bytes = (uint64_t)json_integer_value(e);
        else if (!strcmp(k, "size") && str)
            r = conch_parse_size(json_string_value(e), "mount size", &m.bytes, err);
        else if (!strcmp(k, "readonly") && json_is_boolean(e))
            m.rw = !json_is_true(e), have_rw = true;
        else
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                               "mount: unknown or mistyped member '%s' (type, source, target, "
                               "size, name, readonly)",
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
    if (m->type == CONCH_MOUNT_STORE)
        return json_pack("{s:s,s:s,s:s,s:I}", "type", "store", "name", m->name, "target", m->target,
                         "size", (json_int_t)m->bytes);
    if (m->type == CONCH_MOUNT_OVERLAY)
        return json_pack("{s:s,s:s,s:s}", "type", "overlay", "source", m->source, "target",
                         m->target);
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
    for (unsigned i = 0; i < s->n_sockets; i++)
        if (under(s->sockets[i].path, m->target))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount target '%s' would cover the passed socket '%s'", m->target,
                                  s->sockets[i].path);
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

/* ---- host unix sockets passed in ---- */

/* Where a socket may not be put inside, beyond what deny_under keeps for the system: the
 * workspace (the file would be made in the host's dir), conch's own /run/conch, and the links
 * the root holds. Its parent dirs are made on the sandbox's root, /tmp or /home/agent (tmpfs
 * mounts all), /tmp allowed so that ssh-agent's /tmp/ssh-XXXX/agent.N keeps its path. */
static const char *const socket_deny_under[] = {"/run/conch", "/var/tmp", "/large_tool_results",
                                                "/conversation_history", "/node_modules"};

static int socket_target_ok(const char *path, struct conch_err *err)
{
    int r = path_ok("target", path, err);
    if (r < 0)
        return conch_err_wrap(err, "socket");
    if (strlen(path) >= CONCH_SOCKET_PATH_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "socket path '%s': at most %d bytes (a unix socket address)", path,
                              CONCH_SOCKET_PATH_MAX - 1);
    for (size_t i = 0; i < ARRAY_SIZE(deny_under); i++)
        if (strcmp(deny_under[i], "/run") && under(path, deny_under[i]))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "socket path '%s': %s and what is beneath it are the "
                                  "sandbox's own; choose another place (e.g. /run/NAME.sock)",
                                  path, deny_under[i]);
    for (size_t i = 0; i < ARRAY_SIZE(socket_deny_under); i++)
        if (under(path, socket_deny_under[i]))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "socket path '%s': not beneath %s (conch's own, or a link); "
                                  "choose another place (e.g. /run/NAME.sock)",
                                  path, socket_deny_under[i]);
    for (size_t i = 0; i < ARRAY_SIZE(deny_exact); i++)
        if (!strcmp(path, deny_exact[i]) || !strcmp(path, "/run"))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "socket path '%s' would hide a directory of the sandbox's; "
                                  "name a file (e.g. /run/NAME.sock)",
                                  path);
    return 0;
}

int conch_socket_open(const char *host, struct stat *ret_st, char *ret_path, size_t path_size,
                      struct conch_err *err)
{
    if (host[0] != '/' || strlen(host) >= 1024)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "socket '%s': an absolute host path (under 1024 bytes) is needed",
                              host);
    /* O_NOFOLLOW: a link at the end is opened itself (and refused below), never followed to
     * whatever it is pointed at later. No magic link: /proc/PID/root/run/conch/ptc.sock is
     * another sandbox's tool bridge, /proc/PID/fd/N a socket of another process. */
    struct open_how how = {.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
                           .resolve = RESOLVE_NO_MAGICLINKS};
    _cleanup_close_ int fd = (int)syscall(SYS_openat2, AT_FDCWD, host, &how, sizeof(how));
    if (fd < 0 && errno == ELOOP)
        return conch_err_setk(err, CONCH_ERR_USAGE, ELOOP,
                              "socket '%s': a path through /proc's links (another process's "
                              "root or fds) is refused",
                              host);
    if (fd < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "socket '%s': %s", host,
                              strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "socket '%s': %s", host,
                              strerror(errno));
    if (S_ISLNK(st.st_mode))
        return conch_err_setk(err, CONCH_ERR_USAGE, ELOOP,
                              "socket '%s' is a symbolic link: name the socket itself (a link "
                              "may be pointed elsewhere after it was checked)",
                              host);
    if (!S_ISSOCK(st.st_mode))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOTSOCK, "socket '%s': not a unix socket",
                              host);
    /* The sandbox may reach what its caller may, and no more: a socket of another user's
     * (their ssh agent, a group's docker.sock) is theirs to hand out, not ours. Root's
     * callers may reach every socket anyway. */
    if (geteuid() != 0 && st.st_uid != geteuid())
        return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                              "socket '%s' is owned by uid %u, not by the calling user (uid "
                              "%u): only your own sockets may be passed",
                              host, (unsigned)st.st_uid, (unsigned)geteuid());
    if (ret_path) {
        char link[64];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, ret_path, path_size - 1);
        if (n <= 0 || (size_t)n >= path_size - 1 || ret_path[0] != '/')
            return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                                  "socket '%s': cannot tell where it is", host);
        ret_path[n] = '\0';
    }
    *ret_st = st;
    return TAKE_FD(fd);
}

int conch_socket_check(const struct conch_socket *s, struct conch_err *err)
{
    int r = socket_target_ok(s->path, err);
    if (r < 0)
        return r;
    struct stat st;
    int fd = conch_socket_open(s->host, &st, NULL, 0, err);
    if (fd < 0)
        return fd;
    close(fd);
    return 0;
}

int conch_socket_parse(const char *text, struct conch_socket *ret, struct conch_err *err)
{
    struct conch_socket s;
    memset(&s, 0, sizeof(s));
    const char *colon = strchr(text, ':');
    size_t hl = colon ? (size_t)(colon - text) : strlen(text);
    const char *in = colon ? colon + 1 : text;
    if (hl == 0 || hl >= sizeof(s.host) || !*in)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "socket '%s': HOST[:INSIDE] is needed (absolute paths)", text);
    if (strlen(in) >= sizeof(s.path))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "socket path '%s': at most %d bytes (a unix socket address)", in,
                              CONCH_SOCKET_PATH_MAX - 1);
    memcpy(s.host, text, hl);
    snprintf(s.path, sizeof(s.path), "%s", in);
    int r = conch_socket_check(&s, err);
    if (r < 0)
        return r;
    *ret = s;
    return 0;
}

int conch_socket_from_json(json_t *v, struct conch_socket *ret, struct conch_err *err)
{
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "socket: a NUL byte");
        return conch_socket_parse(json_string_value(v), ret, err);
    }
    json_t *host = json_object_get(v, "host"), *path = json_object_get(v, "path");
    if (!json_is_object(v) || !json_is_string(host) || (path && !json_is_string(path)) ||
        json_object_size(v) != 1u + (path != NULL))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "each socket is an object {host, path?} (absolute paths) or a "
                              "string HOST[:INSIDE]");
    const char *h = json_string_value(host), *p = path ? json_string_value(path) : h;
    if (strlen(h) != json_string_length(host) || (path && strlen(p) != json_string_length(path)))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "socket: a NUL byte");
    struct conch_socket s;
    memset(&s, 0, sizeof(s));
    if (strlen(h) >= sizeof(s.host))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "socket '%s': host path under 1024 bytes", h);
    if (strlen(p) >= sizeof(s.path))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "socket path '%s': at most %d bytes (a unix socket address)", p,
                              CONCH_SOCKET_PATH_MAX - 1);
    snprintf(s.host, sizeof(s.host), "%s", h);
    snprintf(s.path, sizeof(s.path), "%s", p);
    int r = conch_socket_check(&s, err);
    if (r < 0)
        return r;
    *ret = s;
    return 0;
}

int conch_spec_sockets_clear(const struct conch_socket *socks, unsigned n, const char *control,
                             const char *state_dir, struct conch_err *err)
{
    struct stat own_sock, dst;
    bool have_sock = control && stat(control, &own_sock) == 0;
    char state[PATH_MAX], sdir[PATH_MAX], dir[PATH_MAX];
    bool have_state = state_dir && realpath(state_dir, state) != NULL;
    snprintf(dir, sizeof(dir), "%s", control ? control : "");
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    /* A shared sticky dir (/tmp) beside the socket holds everyone's; conch's own does not. */
    bool have_sdir =
        slash && realpath(dir, sdir) && stat(sdir, &dst) == 0 && !(dst.st_mode & S_ISVTX);
    for (unsigned i = 0; i < n; i++) {
        char real[PATH_MAX];
        struct stat st;
        _cleanup_close_ int fd = conch_socket_open(socks[i].host, &st, real, sizeof(real), err);
        if (fd < 0)
            return fd;
        const char *what = NULL;
        if (have_sock && st.st_dev == own_sock.st_dev && st.st_ino == own_sock.st_ino)
            what = "is conch's own control socket";
        else if (have_state && under(real, state))
            what = "lies beneath the daemon's state directory";
        else if (have_sdir && under(real, sdir))
            what = "lies in the directory of conch's control socket";
        if (what)
            return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                                  "socket '%s' %s: a sandbox may not reach it", socks[i].host,
                                  what);
    }
    return 0;
}

json_t *conch_socket_to_json(const struct conch_socket *s)
{
    return json_pack("{s:s,s:s}", "host", s->host, "path", s->path);
}

int conch_spec_add_socket(struct conch_sandbox_spec *spec, const struct conch_socket *s,
                          struct conch_err *err)
{
    if (spec->n_sockets >= CONCH_SPEC_SOCKETS_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, E2BIG, "at most %d sockets",
                              CONCH_SPEC_SOCKETS_MAX);
    for (unsigned i = 0; i < spec->n_sockets; i++)
        if (under(s->path, spec->sockets[i].path) || under(spec->sockets[i].path, s->path))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "socket paths '%s' and '%s' overlap", spec->sockets[i].path,
                                  s->path);
    for (unsigned i = 0; i < spec->n_mounts; i++)
        if (under(s->path, spec->mounts[i].target))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "socket path '%s' is beneath the mount '%s': choose a place "
                                  "on the sandbox's root (e.g. /run/NAME.sock)",
                                  s->path, spec->mounts[i].target);
    struct conch_socket *n = reallocarray(spec->sockets, spec->n_sockets + 1, sizeof(*n));
    if (!n)
        return conch_err_set(err, ENOMEM, "out of memory");
    spec->sockets = n;
    spec->sockets[spec->n_sockets++] = *s;
    return 0;
}

int conch_spec_sockets_from_json(struct conch_sandbox_spec *spec, json_t *arr,
                                 struct conch_err *err)
{
    if (!json_is_array(arr))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "sockets must be an array");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        struct conch_socket s;
        int r = conch_socket_from_json(v, &s, err);
        if (r < 0 || (r = conch_spec_add_socket(spec, &s, err)) < 0)
            return r;
    }
    return 0;
}
