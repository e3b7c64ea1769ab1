/* spec.c - the jail spec's defaults (spec/'s), and the parent-side plan: which host paths are bound
 * where, who the warden and commands are, which fences apply. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "jail/jail-internal.h"
#include "jail/spec-internal.h"

void conch_jail_spec_init(struct conch_jail_spec *spec)
{
    struct conch_sandbox_spec def;
    conch_spec_defaults(&def);
    memset(spec, 0, sizeof(*spec));
    spec->ws_mode = def.mode;
    spec->tmp_bytes = def.tmp_bytes;
    spec->home_bytes = def.home_bytes;
    spec->disk_bytes = def.disk_bytes;
}

static int add_bind(struct jail_plan *plan, const char *host, const char *dst, bool is_dir,
                    struct conch_err *err)
{
    if (plan->n_binds >= JAIL_MAX_BINDS)
        return conch_err_set(err, E2BIG, "too many mounts in the sandbox plan (at '%s')", dst);
    struct jail_bind *b = &plan->binds[plan->n_binds++];
    /* Each bind takes at most JAIL_BIND_SRC_MAX + JAIL_BIND_DST_MAX of bind_paths: they fit. */
    b->src = plan->bind_paths_len;
    int n = snprintf(plan->bind_paths + b->src, JAIL_BIND_SRC_MAX, "/oldroot%s", host);
    b->dst = b->src + (uint32_t)(n < JAIL_BIND_SRC_MAX ? n : JAIL_BIND_SRC_MAX - 1) + 1;
    n = snprintf(plan->bind_paths + b->dst, JAIL_BIND_DST_MAX, "%s", dst);
    plan->bind_paths_len =
        b->dst + (uint32_t)(n < JAIL_BIND_DST_MAX ? n : JAIL_BIND_DST_MAX - 1) + 1;
    b->is_dir = is_dir;
    b->rw = false;
    return 0;
}

static int add_link(struct jail_plan *plan, const char *path, const char *target,
                    struct conch_err *err)
{
    if (plan->n_links >= JAIL_MAX_LINKS)
        return conch_err_set(err, E2BIG, "too many symlinks in the sandbox plan (at '%s')", path);
    struct jail_link *l = &plan->links[plan->n_links++];
    snprintf(l->path, sizeof(l->path), "%s", path);
    snprintf(l->target, sizeof(l->target), "%s", target);
    return 0;
}

/* Bind @host at the same place, or recreate it as a symlink when it is one (merged /usr
 * layouts make /bin a symlink to usr/bin). Missing paths are skipped. */
static int mirror(struct jail_plan *plan, const char *root, const char *src_root, const char *name,
                  struct conch_err *err)
{
    char host[PATH_MAX], src[PATH_MAX], dst[128];
    snprintf(host, sizeof(host), "%s/%s", root, name);
    snprintf(src, sizeof(src), "%s/%s", src_root, name);
    snprintf(dst, sizeof(dst), "/%s", name);
    struct stat st;
    if (lstat(host, &st) < 0)
        return 0;
    if (S_ISLNK(st.st_mode)) {
        char target[128];
        ssize_t n = readlink(host, target, sizeof(target) - 1);
        if (n < 0)
            return conch_err_set(err, errno, "readlink '%s': %s", host, strerror(errno));
        target[n] = '\0';
        return add_link(plan, dst, target, err);
    }
    return add_bind(plan, src, dst, S_ISDIR(st.st_mode), err);
}

/* The host's /etc, curated: what programs need to run (dynamic loader config, certs,
 * alternatives, locale and shell defaults), nothing secret (no shadow, no ssh keys). */
static const char *const etc_entries[] = {
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "mime.types",
    "protocols",
    "services",
    "nsswitch.conf",
    "gai.conf",
    "host.conf",
    "login.defs",
    "python3",
    "python3.11",
    "perl",
    "gitconfig",
    "magic",
    "terminfo",
    "environment",
    "skel",
    "manpath.config",
    "dpkg",
    "xdg",
    "vim",
    NULL,
};

int conch_jail_plan_rootfs(struct jail_plan *plan, const char *rootfs, const char *rootfs_src,
                           struct conch_err *err)
{
    int r;
    if (!rootfs) {
        static const char *const system_dirs[] = {"usr",   "bin",   "sbin",   "lib",
                                                  "lib32", "lib64", "libx32", NULL};
        for (int i = 0; system_dirs[i]; i++)
            if ((r = mirror(plan, "", "", system_dirs[i], err)) < 0)
                return r;
        for (int i = 0; etc_entries[i]; i++) {
            char host[128];
            snprintf(host, sizeof(host), "/etc/%s", etc_entries[i]);
            struct stat st;
            if (stat(host, &st) < 0)
                continue;
            if ((r = add_bind(plan, host, host, S_ISDIR(st.st_mode), err)) < 0)
                return r;
        }
        plan->curated_etc = true;
        return 0;
    }
    _cleanup_closedir_ DIR *d = opendir(rootfs);
    if (!d)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--rootfs '%s': %s", rootfs,
                              strerror(errno));
    static const char *const skipped[] = {"proc", "dev",       "sys",     "tmp", "home",
                                          "run",  "workspace", "oldroot", NULL};
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        bool skip = false;
        for (int i = 0; skipped[i]; i++)
            skip = skip || !strcmp(de->d_name, skipped[i]);
        if (skip)
            continue;
        if ((r = mirror(plan, rootfs, rootfs_src ? rootfs_src : rootfs, de->d_name, err)) < 0)
            return r;
    }
    plan->curated_etc = false;
    return 0;
}
