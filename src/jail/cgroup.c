/* cgroup.c - per-sandbox resource limits through cgroups, from the parent side: a leaf in
 * a delegated cgroup v2 subtree when one is writable, else v1 controller directories under
 * /sys/fs/cgroup/<controller>/conch/<name> when running as root. */
#include "jail/cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <linux/magic.h>

#include "core/cleanup.h"
#include "core/fsutil.h"

#define CGROUP_ROOT "/sys/fs/cgroup"
#define V1_PARENT "conch"
#define V2_PARENT "conch"

/* cpu.max / cpu.cfs_period_us: 100 ms, the kernel default period. */
#define CPU_PERIOD_US 100000

/* Control files are small; a cgroup.procs listing is bounded by pids_max in practice. */
#define READ_MAX (1024 * 1024)

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int join(char *buf, size_t len, const char *dir, const char *file, struct conch_err *err)
{
    int n = snprintf(buf, len, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= len)
        return conch_err_set(err, ENAMETOOLONG, "cgroup path '%s/%s' too long", dir, file);
    return 0;
}

static int write_at(const char *dir, const char *file, const char *val, struct conch_err *err)
{
    char path[1024];
    int r = join(path, sizeof(path), dir, file, err);
    if (r < 0)
        return r;
    return conch_write_file(path, val, strlen(val), err);
}

static int write_u64_at(const char *dir, const char *file, uint64_t v, struct conch_err *err)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    return write_at(dir, file, buf, err);
}

static bool file_exists_at(const char *dir, const char *file)
{
    char path[1024];
    if (join(path, sizeof(path), dir, file, NULL) < 0)
        return false;
    return access(path, F_OK) == 0;
}

static int read_at(const char *dir, const char *file, char **ret, struct conch_err *err)
{
    char path[1024];
    int r = join(path, sizeof(path), dir, file, err);
    if (r < 0)
        return r;
    return conch_read_file(path, READ_MAX, ret, NULL, err);
}

/* Find "@key N" on its own line of a flat-keyed file (memory.events, pids.events,
 * memory.oom_control). -ENOENT when the file or the key is absent. */
static int read_key_at(const char *dir, const char *file, const char *key, uint64_t *ret)
{
    _cleanup_free_ char *buf = NULL;
    int r = read_at(dir, file, &buf, NULL);
    if (r < 0)
        return r;
    size_t klen = strlen(key);
    for (char *line = buf; *line;) {
        if (!strncmp(line, key, klen) && line[klen] == ' ') {
            *ret = strtoull(line + klen + 1, NULL, 10);
            return 0;
        }
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return -ENOENT;
}

static int read_u64_at(const char *dir, const char *file, uint64_t *ret)
{
    _cleanup_free_ char *buf = NULL;
    int r = read_at(dir, file, &buf, NULL);
    if (r < 0)
        return r;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf)
        return -EINVAL;
    *ret = v;
    return 0;
}

static bool is_fs(const char *path, unsigned long magic)
{
    struct statfs sfs;
    return statfs(path, &sfs) == 0 && (unsigned long)sfs.f_type == magic;
}

/* Does a space-separated controller list (cgroup.controllers, cgroup.subtree_control)
 * name @ctrl? */
static bool list_has(const char *list, const char *ctrl)
{
    size_t n = strlen(ctrl);
    for (const char *p = list; (p = strstr(p, ctrl)); p += n) {
        bool start = p == list || p[-1] == ' ';
        bool end = p[n] == '\0' || p[n] == ' ' || p[n] == '\n';
        if (start && end)
            return true;
    }
    return false;
}

/* SIGKILL everything listed in @dir/cgroup.procs until it is empty, for up to ~2 s.
 * Repeated because a process can fork between our read and our kill; the pids limit
 * bounds how long that race can go on. */
static int kill_procs(const char *dir, struct conch_err *err)
{
    for (int round = 0; round < 200; round++) {
        _cleanup_free_ char *buf = NULL;
        int r = read_at(dir, "cgroup.procs", &buf, err);
        if (r == -ENOENT)
            return 0;
        if (r < 0)
            return r;
        bool any = false;
        for (char *p = buf; *p;) {
            char *end = NULL;
            long pid = strtol(p, &end, 10);
            if (end == p)
                break;
            if (pid > 0 && kill((pid_t)pid, SIGKILL) == 0)
                any = true;
            p = end;
            while (*p == '\n')
                p++;
        }
        if (!any)
            return 0;
        sleep_ms(10);
    }
    return conch_err_set(err, EBUSY, "cgroup '%s': processes survive SIGKILL", dir);
}

/* rmdir, retrying while the kernel still counts exiting tasks (EBUSY). */
static int remove_dir(const char *dir, struct conch_err *err)
{
    for (int i = 0;; i++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return 0;
        if (errno != EBUSY || i >= 50)
            return conch_err_set(err, errno, "rmdir '%s': %s", dir, strerror(errno));
        sleep_ms(20);
    }
}

static int kill_all(const char *dir, bool v2, struct conch_err *err)
{
    if (!dir[0] || access(dir, F_OK) < 0)
        return 0;
    /* cgroup.kill (Linux 5.14) kills the whole subtree atomically, with no fork race. */
    if (v2 && file_exists_at(dir, "cgroup.kill"))
        (void)write_at(dir, "cgroup.kill", "1", NULL);
    return kill_procs(dir, err);
}

static int destroy_dir(const char *dir, bool v2, struct conch_err *err)
{
    int r = kill_all(dir, v2, err);
    if (r < 0)
        return r;
    return dir[0] ? remove_dir(dir, err) : 0;
}

/* mkdir @dir; a leftover from a crashed run of the same name is emptied and replaced so
 * its counters (oom_kill, pids max) start at zero. */
static int make_fresh_dir(const char *dir, bool v2, struct conch_err *err)
{
    if (mkdir(dir, 0755) == 0)
        return 0;
    if (errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", dir, strerror(errno));
    int r = destroy_dir(dir, v2, err);
    if (r < 0)
        return conch_err_wrap(err, "remove stale cgroup");
    if (mkdir(dir, 0755) < 0)
        return conch_err_set(err, errno, "mkdir '%s': %s", dir, strerror(errno));
    return 0;
}

static bool name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    return n > 0 && n < 128 && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

/* ---- cgroup v2 ---- */

/* The process's own v2 cgroup, from the "0::" line of /proc/self/cgroup. */
static int own_v2_path(char *buf, size_t len, struct conch_err *err)
{
    _cleanup_free_ char *data = NULL;
    int r = conch_read_file("/proc/self/cgroup", 65536, &data, NULL, err);
    if (r < 0)
        return r;
    for (char *line = data; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!strncmp(line, "0::", 3)) {
            const char *rel = line + 3;
            /* A path outside our cgroup namespace shows as "/../.."; unusable. */
            if (strstr(rel, "/..") || strlen(CGROUP_ROOT) + strlen(rel) + 1 >= len)
                break;
            snprintf(buf, len, "%s%s", CGROUP_ROOT, strcmp(rel, "/") ? rel : "");
            return 0;
        }
        line = nl ? nl + 1 : NULL;
    }
    return conch_err_set(err, ENOENT, "no cgroup v2 entry in /proc/self/cgroup");
}

/* Can we create children under @dir and move processes between them? Delegation (the
 * systemd way) chowns the directory, cgroup.procs and cgroup.subtree_control. */
static bool v2_writable(const char *dir)
{
    char procs[1024], subtree[1024];
    if (join(procs, sizeof(procs), dir, "cgroup.procs", NULL) < 0 ||
        join(subtree, sizeof(subtree), dir, "cgroup.subtree_control", NULL) < 0)
        return false;
    return access(dir, W_OK | X_OK) == 0 && access(procs, W_OK) == 0 && access(subtree, W_OK) == 0;
}

/* Make sure @dir's children get each controller in @want (NULL-terminated), enabling
 * them in @dir/cgroup.subtree_control if needed. Fails with EBUSY when @dir holds
 * processes ("no internal processes"), EOPNOTSUPP when a controller is not offered. */
static int v2_enable(const char *dir, const char *const *want, struct conch_err *err)
{
    _cleanup_free_ char *avail = NULL, *enabled = NULL;
    int r = read_at(dir, "cgroup.controllers", &avail, err);
    if (r < 0)
        return r;
    r = read_at(dir, "cgroup.subtree_control", &enabled, err);
    if (r < 0)
        return r;
    for (const char *const *c = want; *c; c++) {
        if (list_has(enabled, *c))
            continue;
        if (!list_has(avail, *c))
            return conch_err_set(err, EOPNOTSUPP,
                                 "cgroup v2: controller '%s' is not delegated to '%s'", *c, dir);
        char val[32];
        snprintf(val, sizeof(val), "+%s", *c);
        r = write_at(dir, "cgroup.subtree_control", val, err);
        if (r < 0)
            return r;
    }
    return 0;
}

static int v2_setup(struct conch_cgroup *cg, const char *parent, const char *name,
                    const struct conch_cgroup_limits *lim, struct conch_err *err)
{
    char dir[sizeof(cg->path_v2)];
    int n = snprintf(dir, sizeof(dir), "%s/conch-%s", parent, name);
    if (n < 0 || (size_t)n >= sizeof(dir))
        return conch_err_set(err, ENAMETOOLONG, "cgroup path under '%s' too long", parent);
    int r = make_fresh_dir(dir, true, err);
    if (r < 0)
        return r;
    /* From here on, a failure removes the directory again. */
    if (lim->memory_bytes) {
        r = write_u64_at(dir, "memory.max", lim->memory_bytes, err);
        /* swap is limited to the same total: no swap on top of memory.max. */
        if (r >= 0 && file_exists_at(dir, "memory.swap.max"))
            r = write_at(dir, "memory.swap.max", "0", err);
    }
    if (r >= 0 && lim->pids_max)
        r = write_u64_at(dir, "pids.max", lim->pids_max, err);
    if (r >= 0 && lim->cpu_millicpus) {
        char val[64];
        snprintf(val, sizeof(val), "%" PRIu64 " %d", lim->cpu_millicpus * 100, CPU_PERIOD_US);
        r = write_at(dir, "cpu.max", val, err);
    }
    if (r < 0) {
        (void)rmdir(dir);
        return r;
    }
    memcpy(cg->path_v2, dir, sizeof(dir));
    cg->v2 = true;
    cg->active = true;
    return 0;
}

/* Append "; " and a formatted note to @buf (a NUL-terminated string of capacity @len). */
__attribute__((format(printf, 3, 4))) static void note(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used && used + 2 < len) {
        memcpy(buf + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* Try the places a v2 cgroup may live, most to least preferred. -EOPNOTSUPP with an
 * explanation of each refusal when none works. */
static int v2_create(struct conch_cgroup *cg, const char *name,
                     const struct conch_cgroup_limits *lim, struct conch_err *err)
{
    const char *want[4] = {"memory", "pids", NULL, NULL};
    if (lim->cpu_millicpus)
        want[2] = "cpu";
    char why[1024] = "";
    struct conch_err e = {0};
    int r;

    /* Root: a "conch" parent beside the service cgroups; it never holds processes, so
     * its subtree_control can always be set. */
    if (geteuid() == 0) {
        char parent[] = CGROUP_ROOT "/" V2_PARENT;
        r = v2_enable(CGROUP_ROOT, want, &e);
        if (r >= 0 && mkdir(parent, 0755) < 0 && errno != EEXIST)
            r = conch_err_set(&e, errno, "mkdir '%s': %s", parent, strerror(errno));
        if (r >= 0)
            r = v2_enable(parent, want, &e);
        if (r >= 0 && v2_setup(cg, parent, name, lim, &e) >= 0)
            return 0;
        note(why, sizeof(why), "%s", e.msg);
    }

    char own[512];
    r = own_v2_path(own, sizeof(own), &e);
    if (r < 0)
        return conch_err_set(err, EOPNOTSUPP, "cgroup v2: %s", e.msg);

    /* A child of our own cgroup: needs the subtree delegated to us, and our cgroup's
     * subtree_control able to enable the controllers, which the kernel refuses while we
     * live in it ourselves ("no internal processes"). */
    if (v2_writable(own)) {
        r = v2_enable(own, want, &e);
        if (r >= 0 && v2_setup(cg, own, name, lim, &e) >= 0)
            return 0;
        if (r == -EBUSY)
            note(why, sizeof(why),
                 "'%s' holds processes, so cgroup v2 will not enable controllers for its "
                 "children",
                 own);
        else
            note(why, sizeof(why), "%s", e.msg);
    } else {
        note(why, sizeof(why), "'%s' is not delegated to uid %u", own, (unsigned)geteuid());
    }

    /* A sibling under our cgroup's parent: works when conch was started in a leaf of a
     * delegated subtree (e.g. <delegated>/daemon), the layout systemd recommends. */
    char parent[512];
    snprintf(parent, sizeof(parent), "%s", own);
    char *slash = strrchr(parent, '/');
    if (slash && slash > parent + strlen(CGROUP_ROOT)) {
        *slash = '\0';
        if (v2_writable(parent)) {
            r = v2_enable(parent, want, &e);
            if (r >= 0 && v2_setup(cg, parent, name, lim, &e) >= 0)
                return 0;
            note(why, sizeof(why), "%s", e.msg);
        } else {
            note(why, sizeof(why), "'%s' is not delegated to uid %u", parent, (unsigned)geteuid());
        }
    }
    return conch_err_set(err, EOPNOTSUPP,
                         "cgroup limits need root or a delegated cgroup v2 subtree; falling "
                         "back to rlimits (%s; start conch in a leaf cgroup inside a delegated "
                         "subtree, e.g. a systemd unit with Delegate=yes)",
                         why);
}

/* ---- cgroup v1 ---- */

static int v1_make(char *out, size_t outlen, const char *ctrl, const char *name,
                   struct conch_err *err)
{
    char parent[256];
    snprintf(parent, sizeof(parent), "%s/%s/%s", CGROUP_ROOT, ctrl, V1_PARENT);
    if (mkdir(parent, 0755) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", parent, strerror(errno));
    int n = snprintf(out, outlen, "%s/%s", parent, name);
    if (n < 0 || (size_t)n >= outlen)
        return conch_err_set(err, ENAMETOOLONG, "cgroup path under '%s' too long", parent);
    int r = make_fresh_dir(out, false, err);
    if (r < 0)
        out[0] = '\0';
    return r;
}

/* A v1 hierarchy for @ctrl is mounted where we expect it (cpu may be a symlink to
 * "cpu,cpuacct"; statfs follows it). */
static bool v1_has(const char *ctrl, const char *probe_file)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/%s", CGROUP_ROOT, ctrl);
    return is_fs(dir, CGROUP_SUPER_MAGIC) && file_exists_at(dir, probe_file);
}

static int v1_create(struct conch_cgroup *cg, const char *name,
                     const struct conch_cgroup_limits *lim, struct conch_err *err)
{
    bool has_mem = v1_has("memory", "memory.usage_in_bytes");
    bool has_pids =
        v1_has("pids", "cgroup.procs") && ({
            /* pids.max lives only in non-root cgroups; check the feature via
             * /proc/cgroups instead of the root directory. */
            _cleanup_free_ char *c = NULL;
            conch_read_file("/proc/cgroups", 65536, &c, NULL, NULL) == 0 && strstr(c, "\npids\t");
        });
    bool has_cpu = v1_has("cpu", "cpu.cfs_quota_us");
    if (lim->memory_bytes && !has_mem)
        return conch_err_set(err, EOPNOTSUPP, "cgroup v1: memory controller not mounted");
    if (lim->pids_max && !has_pids)
        return conch_err_set(err, EOPNOTSUPP, "cgroup v1: pids controller not mounted");
    if (lim->cpu_millicpus && !has_cpu)
        return conch_err_set(err, EOPNOTSUPP,
                             "cgroup v1: cpu controller (CFS bandwidth) not mounted");
    if (!has_mem && !has_pids && !has_cpu)
        return conch_err_set(err, EOPNOTSUPP, "cgroup v1: no memory, pids or cpu hierarchy");

    int r = 0;
    if (has_mem) {
        r = v1_make(cg->path_mem, sizeof(cg->path_mem), "memory", name, err);
        if (r >= 0 && lim->memory_bytes) {
            r = write_u64_at(cg->path_mem, "memory.limit_in_bytes", lim->memory_bytes, err);
            /* memsw = memory + swap, so setting it equal allows no swap. Absent when the
             * kernel runs without swap accounting. */
            if (r >= 0 && file_exists_at(cg->path_mem, "memory.memsw.limit_in_bytes"))
                r = write_u64_at(cg->path_mem, "memory.memsw.limit_in_bytes", lim->memory_bytes,
                                 err);
            /* Best effort: refused when use_hierarchy is shared with a parent. */
            if (r >= 0)
                (void)write_at(cg->path_mem, "memory.swappiness", "0", NULL);
        }
    }
    if (r >= 0 && has_pids) {
        r = v1_make(cg->path_pids, sizeof(cg->path_pids), "pids", name, err);
        if (r >= 0 && lim->pids_max)
            r = write_u64_at(cg->path_pids, "pids.max", lim->pids_max, err);
    }
    if (r >= 0 && lim->cpu_millicpus) {
        r = v1_make(cg->path_cpu, sizeof(cg->path_cpu), "cpu", name, err);
        if (r >= 0)
            r = write_u64_at(cg->path_cpu, "cpu.cfs_period_us", CPU_PERIOD_US, err);
        if (r >= 0)
            r = write_u64_at(cg->path_cpu, "cpu.cfs_quota_us", lim->cpu_millicpus * 100, err);
    }
    if (r < 0) {
        (void)conch_cgroup_destroy(cg, NULL);
        memset(cg, 0, sizeof(*cg));
        return r;
    }
    cg->active = true;
    cg->v2 = false;
    return 0;
}

int conch_cgroup_create(struct conch_cgroup *cg, const char *name,
                        const struct conch_cgroup_limits *limits, struct conch_err *err)
{
    static const struct conch_cgroup_limits none = {0};
    const struct conch_cgroup_limits *lim = limits ? limits : &none;
    memset(cg, 0, sizeof(*cg));
    if (!name_ok(name))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "cgroup name '%s' is invalid",
                              name ? name : "");
    if (lim->cpu_millicpus > UINT64_MAX / 100)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "cpu limit too large");

    int r;
    if (is_fs(CGROUP_ROOT, CGROUP2_SUPER_MAGIC)) {
        r = v2_create(cg, name, lim, err);
    } else if (geteuid() == 0) {
        r = v1_create(cg, name, lim, err);
    } else {
        r = conch_err_set(err, EOPNOTSUPP,
                          "cgroup limits need root or a delegated cgroup v2 subtree; falling "
                          "back to rlimits (this machine uses cgroup v1 and uid %u is not root)",
                          (unsigned)geteuid());
    }
    if (r < 0)
        return conch_err_wrap(err, "create cgroup '%s'", name);
    return 0;
}

int conch_cgroup_attach(struct conch_cgroup *cg, pid_t pid, struct conch_err *err)
{
    if (!cg->active)
        return conch_err_set(err, EINVAL, "attach pid %d: cgroup not created", (int)pid);
    char val[32];
    snprintf(val, sizeof(val), "%d", (int)pid);
    const char *dirs[] = {cg->path_v2, cg->path_mem, cg->path_pids, cg->path_cpu};
    for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
        if (!dirs[i][0])
            continue;
        int r = write_at(dirs[i], "cgroup.procs", val, err);
        if (r < 0)
            return conch_err_wrap(err, "attach pid %d", (int)pid);
    }
    return 0;
}

int conch_cgroup_stats(struct conch_cgroup *cg, struct conch_cgroup_stats *ret,
                       struct conch_err *err)
{
    if (!cg->active)
        return conch_err_set(err, EINVAL, "cgroup stats: cgroup not created");
    struct conch_cgroup_stats st = {0};
    uint64_t v = 0;
    if (cg->v2) {
        if (read_key_at(cg->path_v2, "memory.events", "oom_kill", &v) == 0)
            st.oom_killed = (st.oom_kills = v) > 0;
        if (read_key_at(cg->path_v2, "pids.events", "max", &v) == 0)
            st.pids_limit_hit = (st.pids_events = v) > 0;
        /* memory.peak needs Linux 5.19. */
        if (read_u64_at(cg->path_v2, "memory.peak", &v) == 0)
            st.memory_peak = v;
    } else {
        if (cg->path_mem[0]) {
            if (read_key_at(cg->path_mem, "memory.oom_control", "oom_kill", &v) == 0) {
                st.oom_killed = (st.oom_kills = v) > 0;
            } else {
                /* Before Linux 4.13 there is no oom_kill counter; hitting the memsw limit
                 * with no swap to fall back on is the best remaining sign. */
                if (read_u64_at(cg->path_mem, "memory.memsw.failcnt", &v) == 0 ||
                    read_u64_at(cg->path_mem, "memory.failcnt", &v) == 0)
                    st.oom_killed = (st.oom_kills = v) > 0;
            }
            if (read_u64_at(cg->path_mem, "memory.max_usage_in_bytes", &v) == 0)
                st.memory_peak = v;
        }
        if (cg->path_pids[0] && read_key_at(cg->path_pids, "pids.events", "max", &v) == 0)
            st.pids_limit_hit = (st.pids_events = v) > 0;
    }
    *ret = st;
    return 0;
}

int conch_cgroup_destroy(struct conch_cgroup *cg, struct conch_err *err)
{
    char *dirs[] = {cg->path_v2, cg->path_mem, cg->path_pids, cg->path_cpu};
    /* Kill through every hierarchy before removing any, so a process that escaped one
     * listing (it forked mid-read) is caught by another while all still exist. */
    for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
        int r = kill_all(dirs[i], cg->v2, err);
        if (r < 0)
            return conch_err_wrap(err, "destroy cgroup");
    }
    for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
        if (!dirs[i][0])
            continue;
        int r = remove_dir(dirs[i], err);
        if (r < 0)
            return conch_err_wrap(err, "destroy cgroup");
        dirs[i][0] = '\0';
    }
    cg->active = false;
    cg->v2 = false;
    return 0;
}
