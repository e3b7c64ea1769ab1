/* recover.c - reaping what a SIGKILLed daemon left running (wardens checked against their
 * recorded start time so a reused pid is never killed) and garbage-collecting unreferenced
 * sandbox directories, spill files and cgroups with fd-relative, no-follow removal. */
#include "daemon/recover.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/clock.h"
#include "core/fsutil.h"
#include "jail/cgroup.h"

#define CGROUP_ROOT "/sys/fs/cgroup"
#define WAIT_GONE_MS 2000

static const char *const v1_controllers[] = {"memory", "pids", "cpu"};

static void fail(struct conch_recover_report *rep, int *first, struct conch_err *err,
                 const struct conch_err *e)
{
    rep->failures++;
    if (*first == 0) {
        *first = -(e->code ? e->code : EIO);
        if (err)
            *err = *e;
    }
}

/* ---- processes ---- */

/* State letter and start time of @pid from /proc/<pid>/stat; -errno when it is gone. */
static int read_stat(pid_t pid, char *ret_state, unsigned long long *ret_start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return n < 0 ? -errno : -ESRCH;
    buf[n] = '\0';
    /* comm (field 2) may hold spaces and parentheses: fields resume after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return -EBADMSG;
    p += 2;
    char *save = NULL;
    int field = 3;
    for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save), field++) {
        if (field == 3)
            *ret_state = tok[0];
        if (field == 22) {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(tok, &end, 10);
            if (errno || end == tok)
                return -EBADMSG;
            *ret_start = v;
            return 0;
        }
    }
    return -EBADMSG;
}

unsigned long long conch_recover_starttime(pid_t pid)
{
    char state = 0;
    unsigned long long start = 0;
    if (pid <= 0 || read_stat(pid, &state, &start) < 0)
        return 0;
    /* A zombie runs nothing; in a PID namespace's init it also means every other process
     * of the namespace is already dead (the kernel reaps them before init turns zombie). */
    if (state == 'Z' || state == 'X')
        return 0;
    return start;
}

/* SIGKILL the warden @pid if it is still the process started at @start. Returns 1 when
 * killed, 0 when there was nothing (left) to kill, or -errno with @err. The pid is pinned
 * with a pidfd before its start time is checked, so a recycled pid is never signalled, and
 * the pidfd tells when the process is gone. */
static int kill_warden(const char *id, pid_t pid, unsigned long long start, struct conch_err *err)
{
    /* Never signal init, ourselves, or a process group (pid <= 0) whatever the record says. */
    if (pid <= 1 || pid == getpid() || start == 0)
        return 0;
    _cleanup_close_ int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0 && errno == ESRCH)
        return 0;
    /* Without pidfds (Linux < 5.3, or valgrind) the pid and its start time are checked just
     * before the kill: a narrow race with pid reuse, as before pidfds existed. */
    if (pidfd < 0 && errno != ENOSYS)
        return conch_err_set(err, errno, "sandbox '%s': pidfd_open(%d): %s", id, (int)pid,
                             strerror(errno));
    if (conch_recover_starttime(pid) != start)
        return 0; /* another process now has that pid (or the warden is already a zombie) */
    int r = pidfd >= 0 ? (int)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0)
                       : kill(pid, SIGKILL);
    if (r < 0) {
        if (errno == ESRCH)
            return 0;
        return conch_err_set(err, errno, "sandbox '%s': kill warden %d: %s", id, (int)pid,
                             strerror(errno));
    }
    /* The pidfd turns readable when the process exits; a PID namespace's init exits after
     * every other process of its namespace. */
    for (int waited = 0; waited < WAIT_GONE_MS; waited += 10) {
        struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
        if (pidfd >= 0 ? poll(&pfd, 1, 10) > 0 : conch_recover_starttime(pid) != start)
            return 1;
        if (pidfd < 0)
            usleep(10 * 1000);
    }
    return conch_err_set(err, ETIMEDOUT,
                         "sandbox '%s': warden %d still alive %d ms after SIGKILL (stuck in "
                         "the kernel?)",
                         id, (int)pid, WAIT_GONE_MS);
}

/* ---- cgroups ---- */

/* An id usable as a path component (it comes from the database). */
static bool id_ok(const char *id)
{
    return id[0] && !strchr(id, '/') && strcmp(id, ".") && strcmp(id, "..");
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Kill what is left in sandbox @id's cgroups and remove them; *@ret_removed counts the
 * directories that existed and are gone. */
static int remove_cgroups(const char *id, unsigned *ret_removed, struct conch_err *err)
{
    struct conch_cgroup v1 = {.active = true, .v2 = false};
    struct conch_cgroup v2 = {.active = true, .v2 = true};
    char *v1_paths[] = {v1.path_mem, v1.path_pids, v1.path_cpu};
    unsigned before = 0, after = 0;

    for (size_t i = 0; i < ARRAY_SIZE(v1_controllers); i++) {
        snprintf(v1_paths[i], sizeof(v1.path_mem), CGROUP_ROOT "/%s/conch/%s", v1_controllers[i],
                 id);
        if (exists(v1_paths[i]))
            before++;
        else
            v1_paths[i][0] = '\0';
    }
    snprintf(v2.path_v2, sizeof(v2.path_v2), CGROUP_ROOT "/conch/conch-%s", id);
    if (exists(v2.path_v2))
        before++;
    else
        v2.path_v2[0] = '\0';
    if (!before)
        return 0;

    int r = conch_cgroup_destroy(&v2, err);
    if (r >= 0)
        r = conch_cgroup_destroy(&v1, err);
    const char *all[] = {v1.path_mem, v1.path_pids, v1.path_cpu, v2.path_v2};
    for (size_t i = 0; i < ARRAY_SIZE(all); i++)
        if (all[i][0] && exists(all[i]))
            after++;
    *ret_removed += before - after;
    if (r < 0)
        return conch_err_wrap(err, "sandbox '%s'", id);
    return 0;
}

int conch_recover_reap(struct conch_state *st, struct conch_recover_report *ret,
                       struct conch_err *err)
{
    struct conch_recover_report scratch = {0};
    struct conch_recover_report *rep = ret ? ret : &scratch;
    struct conch_state_sandbox *list = NULL;
    size_t n = 0;
    int r = conch_state_sandbox_list(st, &list, &n, err);
    if (r < 0)
        return conch_err_wrap(err, "reap orphaned sandboxes");

    int first = 0;
    for (size_t i = 0; i < n; i++) {
        const struct conch_state_sandbox *sb = &list[i];
        if (strcmp(sb->state, "running"))
            continue;
        struct conch_err e = {0};
        r = kill_warden(sb->id, sb->warden_pid, sb->warden_starttime, &e);
        if (r > 0)
            rep->wardens_killed++;
        else if (r < 0)
            fail(rep, &first, err, &e);
        if (id_ok(sb->id) && remove_cgroups(sb->id, &rep->cgroups_removed, &e) < 0)
            fail(rep, &first, err, &e);
        /* Stopped even if something survived: this daemon cannot drive that sandbox any
         * more, and the failure is reported; its upper dir is what still matters. */
        if (conch_state_sandbox_mark_stopped(st, sb->id, conch_clock_wall(), &e) < 0)
            fail(rep, &first, err, &e);
        else
            rep->sandboxes_stopped++;
    }
    conch_state_sandbox_free_list(list, n);
    if (first < 0)
        return conch_err_wrap(err, "reap orphaned sandboxes");
    return 0;
}

/* ---- recursive removal ---- */

int conch_recover_rm_tree(int dfd, const char *name, const char *what, struct conch_err *err)
{
    int r = conch_rm_at(dfd, name, CONCH_RM_ONE_FS);
    if (r < 0)
        return conch_err_set(err, -r, "remove '%s': %s", what, strerror(-r));
    return 0;
}

/* ---- gc ---- */

static bool older_than(const struct stat *st, double now, double age)
{
    double mtime = (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec / 1e9;
    return now - mtime >= age;
}

static bool is_dot(const char *name)
{
    return !strcmp(name, ".") || !strcmp(name, "..");
}

static int open_dir_path(const char *path, struct conch_err *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT)
        return conch_err_set(err, errno, "gc: open '%s': %s", path, strerror(errno));
    return fd < 0 ? -ENOENT : fd;
}

/* The directory @name of the state dir for reading, or NULL (a missing one is no failure). */
static DIR *open_subdir(int state_fd, const char *name, const char *state_dir,
                        struct conch_recover_report *rep, int *first, struct conch_err *err)
{
    int fd = openat(state_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) {
            struct conch_err e = {0};
            conch_err_set(&e, errno, "gc: open '%s/%s': %s", state_dir, name, strerror(errno));
            fail(rep, first, err, &e);
        }
        return NULL;
    }
    DIR *d = fdopendir(fd);
    if (!d)
        close(fd);
    return d;
}

static void gc_sandboxes(int state_fd, const char *state_dir, const struct conch_state_sandbox *sbs,
                         size_t n, struct conch_recover_report *rep, int *first,
                         struct conch_err *err)
{
    DIR *d = open_subdir(state_fd, "sandboxes", state_dir, rep, first, err);
    if (!d)
        return;
    double now = conch_clock_wall();
    struct dirent *de;
    while ((de = readdir(d))) {
        if (is_dot(de->d_name))
            continue;
        bool referenced = false;
        for (size_t i = 0; i < n && !referenced; i++)
            referenced = !strcmp(sbs[i].id, de->d_name);
        struct stat st;
        if (referenced || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            !older_than(&st, now, CONCH_RECOVER_GC_GRACE_S))
            continue;
        char what[4352];
        snprintf(what, sizeof(what), "%s/sandboxes/%s", state_dir, de->d_name);
        struct conch_err e = {0};
        if (conch_recover_rm_tree(dirfd(d), de->d_name, what, &e) < 0)
            fail(rep, first, err, &e);
        else
            rep->dirs_removed++;
    }
    closedir(d);
}

/* Whether a job names @name in a spill directory (or something inside it). Conservative:
 * any ".../spill/<name>" path counts, whichever state directory it is in. */
static bool spill_referenced(const char *name, const struct conch_state_job *jobs, size_t n)
{
    char needle[300];
    int len = snprintf(needle, sizeof(needle), "/spill/%s", name);
    if (len < 0 || (size_t)len >= sizeof(needle))
        return true;
    for (size_t i = 0; i < n; i++) {
        const char *paths[] = {jobs[i].stdout_spill, jobs[i].stderr_spill};
        for (size_t k = 0; k < ARRAY_SIZE(paths); k++) {
            for (const char *p = paths[k]; (p = strstr(p, needle)); p++)
                if (p[len] == '\0' || p[len] == '/')
                    return true;
        }
    }
    return false;
}

static void gc_spill(int state_fd, const char *state_dir, const struct conch_state_job *jobs,
                     size_t n, struct conch_recover_report *rep, int *first, struct conch_err *err)
{
    DIR *d = open_subdir(state_fd, "spill", state_dir, rep, first, err);
    if (!d)
        return;
    double now = conch_clock_wall();
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (is_dot(de->d_name) || spill_referenced(de->d_name, jobs, n) ||
            fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            !older_than(&st, now, CONCH_RECOVER_SPILL_TTL_S))
            continue;
        char what[4352];
        snprintf(what, sizeof(what), "%s/spill/%s", state_dir, de->d_name);
        struct conch_err e = {0};
        if (conch_recover_rm_tree(dirfd(d), de->d_name, what, &e) < 0)
            fail(rep, first, err, &e);
        else
            rep->spills_removed++;
    }
    closedir(d);
}

/* A `conch run` names its cgroup "run-<its pid>": when that process is gone (killed with
 * SIGKILL, it could not remove the cgroup), the cgroup is garbage at once. */
static bool run_owner_gone(const char *name)
{
    if (strncmp(name, "run-", 4))
        return false;
    char *end = NULL;
    long pid = strtol(name + 4, &end, 10);
    if (!end || *end || pid <= 0)
        return false;
    return kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

/* rmdir the empty cgroups of @parent that no running sandbox owns; @prefix is what
 * precedes the sandbox id in a cgroup's name. */
static void gc_cgroup_dir(const char *parent, const char *prefix,
                          const struct conch_state_sandbox *sbs, size_t n,
                          struct conch_recover_report *rep, int *first, struct conch_err *err)
{
    struct conch_err e = {0};
    int fd = open_dir_path(parent, &e);
    if (fd < 0) {
        if (fd != -ENOENT)
            fail(rep, first, err, &e);
        return;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    size_t plen = strlen(prefix);
    double now = conch_clock_wall();
    struct dirent *de;
    while ((de = readdir(d))) {
        if (is_dot(de->d_name) || de->d_type != DT_DIR || strncmp(de->d_name, prefix, plen))
            continue;
        const char *id = de->d_name + plen;
        bool running = false;
        for (size_t i = 0; i < n && !running; i++)
            running = !strcmp(sbs[i].state, "running") && !strcmp(sbs[i].id, id);
        struct stat st;
        if (running || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            (!older_than(&st, now, CONCH_RECOVER_GC_GRACE_S) && !run_owner_gone(de->d_name)))
            continue;
        /* rmdir of a cgroup fails with EBUSY while it has processes or children: such a
         * cgroup is in use, not garbage. */
        if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) == 0) {
            rep->cgroups_removed++;
        } else if (errno != EBUSY && errno != ENOTEMPTY && errno != ENOENT &&
                   !((errno == EACCES || errno == EPERM) && st.st_uid != geteuid())) {
            /* (another user's cgroup, a root conch run's say, is theirs to collect) */
            conch_err_set(&e, errno, "gc: rmdir cgroup '%s/%s': %s", parent, de->d_name,
                          strerror(errno));
            fail(rep, first, err, &e);
        }
    }
    closedir(d);
}

/* The private state dirs of `conch serve --stdio` (<state_dir>/stdio/XXXXXX) whose daemon is
 * gone: nobody holds their database's lock (a live daemon always does). Their wardens died
 * with the daemon, but a record may name one still alive: reap them, then remove it all. */
static void gc_private(int state_fd, const char *state_dir, struct conch_recover_report *rep,
                       int *first, struct conch_err *err)
{
    DIR *d = open_subdir(state_fd, "stdio", state_dir, rep, first, err);
    if (!d)
        return;
    double now = conch_clock_wall();
    struct dirent *de;
    while ((de = readdir(d))) {
        if (is_dot(de->d_name))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/stdio/%s", state_dir, de->d_name);
        int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int db = sub < 0 ? -1 : openat(sub, "state.db", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0)
            close(sub);
        if (db < 0 && !older_than(&st, now, CONCH_RECOVER_GC_GRACE_S))
            continue; /* being created */
        if (db >= 0 && flock(db, LOCK_EX | LOCK_NB) < 0) {
            close(db); /* in use */
            continue;
        }
        if (db >= 0) {
            char dbpath[PATH_MAX + 16];
            snprintf(dbpath, sizeof(dbpath), "%s/state.db", path);
            struct conch_state *ps = NULL;
            struct conch_err e = {0};
            if (conch_state_open(dbpath, &ps, &e) == 0) {
                conch_recover_reap(ps, rep, &e);
                conch_state_close(ps);
            }
        }
        struct conch_err e = {0};
        if (conch_recover_rm_tree(dirfd(d), de->d_name, path, &e) < 0)
            fail(rep, first, err, &e);
        else
            rep->dirs_removed++;
        if (db >= 0)
            close(db);
    }
    closedir(d);
}

int conch_recover_gc(struct conch_state *st, const char *state_dir,
                     struct conch_recover_report *ret, struct conch_err *err)
{
    struct conch_recover_report scratch = {0};
    struct conch_recover_report *rep = ret ? ret : &scratch;
    struct conch_state_sandbox *sbs = NULL;
    size_t nsb = 0;
    struct conch_state_job *jobs = NULL;
    size_t njobs = 0;
    int r = conch_state_sandbox_list(st, &sbs, &nsb, err);
    if (r < 0)
        return conch_err_wrap(err, "gc");
    r = conch_state_job_list(st, NULL, &jobs, &njobs, err);
    if (r < 0) {
        conch_state_sandbox_free_list(sbs, nsb);
        return conch_err_wrap(err, "gc");
    }

    int first = 0;
    struct conch_err e = {0};
    int state_fd = open_dir_path(state_dir, &e);
    if (state_fd >= 0) {
        gc_sandboxes(state_fd, state_dir, sbs, nsb, rep, &first, err);
        gc_spill(state_fd, state_dir, jobs, njobs, rep, &first, err);
        gc_private(state_fd, state_dir, rep, &first, err);
        close(state_fd);
    } else if (state_fd != -ENOENT) {
        fail(rep, &first, err, &e);
    }

    for (size_t i = 0; i < ARRAY_SIZE(v1_controllers); i++) {
        char parent[256];
        snprintf(parent, sizeof(parent), CGROUP_ROOT "/%s/conch", v1_controllers[i]);
        gc_cgroup_dir(parent, "", sbs, nsb, rep, &first, err);
    }
    gc_cgroup_dir(CGROUP_ROOT "/conch", "conch-", sbs, nsb, rep, &first, err);

    conch_state_sandbox_free_list(sbs, nsb);
    conch_state_job_free_list(jobs, njobs);
    if (first < 0)
        return conch_err_wrap(err, "gc");
    return 0;
}
