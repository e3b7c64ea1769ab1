/* run.c - one command in a fresh sandbox: start the jail, pump its output through the
 * capture buffers, enforce the deadline, classify how it ended, read (and maybe commit)
 * the workspace changes, tear everything down. */
#include "exec/run.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "exec/result.h"
#include "super/super.h"

#define SAMPLE_MS 20

void conch_run_opts_init(struct conch_run_opts *o)
{
    memset(o, 0, sizeof(*o));
    conch_jail_spec_init(&o->jail);
    o->grace_ms = 2000;
    o->max_output = 1 << 20;
    o->max_spill = 64ULL << 20;
    o->stdin_fd = 0;
}

void conch_run_result_done(struct conch_run_result *res)
{
    conch_output_done(&res->out);
    conch_output_done(&res->err);
    conch_ws_changes_done(&res->changes);
    conch_ws_commit_report_done(&res->commit);
}

void conch_exec_env_free(char **env)
{
    if (!env)
        return;
    for (char **e = env; *e; e++)
        free(*e);
    free(env);
}

char **conch_exec_env_build(char *const *extra, bool as_root, struct conch_err *err)
{
    static const char *const base[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/home/agent",
        "SHELL=/bin/bash",
        "LANG=C.UTF-8",
        "TERM=dumb",
        "NO_COLOR=1",
        "PAGER=cat",
        "GIT_PAGER=cat",
        NULL,
    };
    size_t n = 0, cap = ARRAY_SIZE(base) + 2;
    for (char *const *e = extra; e && *e; e++)
        cap++;
    char **env = calloc(cap + 1, sizeof(char *));
    if (!env) {
        conch_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    const char *user = as_root ? "root" : "agent";
    char buf[64];
    snprintf(buf, sizeof(buf), "USER=%s", user);
    env[n++] = strdup(buf);
    snprintf(buf, sizeof(buf), "LOGNAME=%s", user);
    env[n++] = strdup(buf);
    for (int i = 0; base[i]; i++)
        env[n++] = strdup(base[i]);
    for (char *const *e = extra; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || eq == *e) {
            conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--env '%s': expected KEY=VALUE", *e);
            conch_exec_env_free(env);
            return NULL;
        }
        size_t klen = (size_t)(eq - *e) + 1;
        size_t i;
        for (i = 0; i < n; i++)
            if (env[i] && !strncmp(env[i], *e, klen))
                break;
        if (i < n) {
            free(env[i]);
            env[i] = strdup(*e);
        } else {
            env[n++] = strdup(*e);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!env[i]) {
            conch_err_set(err, ENOMEM, "out of memory");
            conch_exec_env_free(env);
            return NULL;
        }
    }
    return env;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Copy the part of @buf that falls within the first @limit bytes of the stream to @fd. */
static void stream_head(int fd, const struct conch_output *o, const char *buf, size_t len,
                        uint64_t before)
{
    size_t head_cap = o->max_bytes / 2;
    if (!conch_output_truncated(o)) {
        conch_write_all(fd, buf, len);
        return;
    }
    if (before < head_cap) {
        size_t n = head_cap - before < len ? head_cap - (size_t)before : len;
        conch_write_all(fd, buf, n);
    }
}

/* After the command: print the omission notice and the tail that were not streamed. */
static void stream_rest(int fd, const struct conch_output *o)
{
    if (!conch_output_truncated(o))
        return;
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    if (conch_output_text(o, &text, &len) < 0)
        return;
    size_t head = o->max_bytes / 2;
    if (len > head)
        conch_write_all(fd, text + head, len - head);
}

/* Full within a few pages: tmpfs rounds, and the last write may not fit a page. */
static bool nearly_full(const struct statvfs *sv)
{
    return sv->f_blocks > 0 && sv->f_bavail * sv->f_frsize < 64 * 1024;
}

static bool fd_fs_full(int fd)
{
    struct statvfs sv;
    return fstatvfs(fd, &sv) == 0 && nearly_full(&sv);
}

static bool path_fs_full(const char *path)
{
    struct statvfs sv;
    return statvfs(path, &sv) == 0 && nearly_full(&sv);
}

struct pump {
    int fd;
    int echo_fd;
    struct conch_output *o;
};

/* The one command of a `conch run`, as a process object of the supervisor. */
struct run_proc {
    struct conch_proc proc;
    bool ended;
    struct conch_proc_end end;
};

static void run_proc_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct run_proc *rp = p->data;
    rp->ended = true;
    rp->end = *end;
}

static const struct conch_proc_ops run_proc_ops = {.ended = run_proc_ended};

int conch_exec_run(const struct conch_run_opts *o, struct conch_run_result *res,
                   struct conch_err *err)
{
    int r;
    _cleanup_close_ int devnull = -1;
    _cleanup_close_ int upper = -1;
    memset(res, 0, sizeof(*res));
    res->out.spill_fd = res->err.spill_fd = -1;
    const char *spill_dir = o->spill_dir ? o->spill_dir : "/tmp";
    if ((r = conch_output_init(&res->out, "stdout", o->max_output, o->max_spill, spill_dir, err)) <
            0 ||
        (r = conch_output_init(&res->err, "stderr", o->max_output, o->max_spill, spill_dir, err)) <
            0)
        return r;
    char **env = conch_exec_env_build(o->env_extra, o->jail.as_root, err);
    if (!env)
        return -(err->code ? err->code : EINVAL);

    uint64_t start = now_ms();
    struct conch_jail jail;
    r = conch_jail_start(&o->jail, &jail, err);
    if (r < 0) {
        conch_exec_env_free(env);
        return r;
    }
    struct conch_super super;
    conch_super_init(&super, &jail);
    struct run_proc rp = {.proc = {.ops = &run_proc_ops, .data = &rp}};

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    int sigfd = -1;
    sigset_t mask, oldmask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGPIPE);
    sigprocmask(SIG_BLOCK, &mask, &oldmask);
    sigdelset(&mask, SIGPIPE);

    if (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0) {
        r = conch_err_set(err, errno, "pipe: %s", strerror(errno));
        goto out;
    }
    sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0) {
        r = conch_err_set(err, errno, "signalfd: %s", strerror(errno));
        goto out;
    }
    int stdin_fd = o->stdin_fd;
    if (fcntl(stdin_fd, F_GETFD) < 0) {
        devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        stdin_fd = devnull;
    }
    struct conch_jail_cmd cmd = {
        .argv = o->argv,
        .envp = env,
        .cwd = o->cwd ? o->cwd : (o->jail.workspace ? "/workspace" : "/"),
        .stdin_fd = stdin_fd,
        .stdout_fd = out_pipe[1],
        .stderr_fd = err_pipe[1],
    };
    r = conch_super_run(&super, &rp.proc, &cmd, o->timeout_ms, o->grace_ms, err);
    close(out_pipe[1]);
    close(err_pipe[1]);
    out_pipe[1] = err_pipe[1] = -1;
    if (r < 0)
        goto out;

    struct pump pumps[2] = {{out_pipe[0], o->stream ? 1 : -1, &res->out},
                            {err_pipe[0], o->stream ? 2 : -1, &res->err}};
    bool over_spill = false;
    int interrupts = 0;
    /* Without a cgroup, memory and the process count are sampled from the sandbox's /proc:
     * a memory hog is killed like an OOM kill, a full process table is noted. */
    bool sample = !jail.has_cgroup && (o->jail.limits.memory_bytes || o->jail.limits.pids_max);
    uint64_t next_sample = 0;
    bool sampled_oom = false, sampled_pids = false;
    char buf[65536];
    /* The deadline is the warden's; the loop only pumps output, forwards signals and waits
     * for the command's final event, which always comes. */
    while (!rp.ended || pumps[0].fd >= 0 || pumps[1].fd >= 0) {
        struct pollfd pfd[4] = {
            {.fd = pumps[0].fd, .events = POLLIN},
            {.fd = pumps[1].fd, .events = POLLIN},
            {.fd = rp.ended ? -1 : conch_super_fd(&super), .events = POLLIN},
            {.fd = sigfd, .events = POLLIN},
        };
        int timeout = sample && !rp.ended ? SAMPLE_MS : -1;
        int n = poll(pfd, 4, timeout);
        if (n < 0 && errno != EINTR) {
            r = conch_err_set(err, errno, "poll: %s", strerror(errno));
            goto out;
        }
        uint64_t now = now_ms();
        if (sample && !rp.ended && now >= next_sample) {
            next_sample = now + SAMPLE_MS;
            struct conch_jail_usage u;
            if (conch_jail_usage(&jail, &u) == 0) {
                uint64_t pids_max = o->jail.limits.pids_max;
                if (pids_max && u.processes + 1 >= pids_max)
                    sampled_pids = true;
                if (o->jail.limits.memory_bytes && u.rss_bytes > o->jail.limits.memory_bytes &&
                    !sampled_oom) {
                    sampled_oom = true;
                    conch_super_signal(&rp.proc, SIGKILL);
                }
            }
        }
        if (n <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t got = read(pumps[i].fd, buf, sizeof(buf));
            if (got < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (got <= 0) {
                close(pumps[i].fd);
                pumps[i].fd = -1;
                continue;
            }
            uint64_t before = pumps[i].o->total;
            int a = conch_output_append(pumps[i].o, buf, (size_t)got, err);
            if (a < 0)
                goto out;
            if (pumps[i].echo_fd >= 0)
                stream_head(pumps[i].echo_fd, pumps[i].o, buf, (size_t)got, before);
            if (a == 1 && !over_spill) {
                /* Past the spill cap the command is stopped: an agent's output flood must
                 * not fill the host's disk, and nobody reads gigabytes of it. */
                over_spill = true;
                conch_super_signal(&rp.proc, SIGKILL);
            }
        }
        if (pfd[2].revents & (POLLIN | POLLHUP | POLLERR))
            conch_super_dispatch(&super);
        if (pfd[3].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof(si)) == sizeof(si)) {
                if (rp.ended)
                    continue;
                /* First interrupt: pass it on, as a terminal would to its foreground job.
                 * A second one: stop everything. */
                interrupts++;
                conch_super_signal(&rp.proc, interrupts > 1 ? SIGKILL : (int)si.ssi_signo);
            }
        }
    }
    if (rp.end.lost) {
        r = conch_err_set(err, EIO, "the command's end was not reported: %s", rp.end.why);
        goto out;
    }
    if (rp.end.start_failed) {
        if (rp.end.err.kind == CONCH_ERR_COMMAND || rp.end.err.kind == CONCH_ERR_USAGE) {
            struct conch_run_end end = {.start_failed = true, .start_err = rp.end.err};
            conch_run_result_end(res, &end);
            r = 0;
        } else {
            *err = rp.end.err;
            r = -(err->code ? err->code : EIO);
        }
        goto out;
    }
    res->timed_out = rp.end.timed_out;
    res->duration_ms = now_ms() - start;
    /* How did it end? */
    struct conch_cgroup_stats cgs = {0};
    if (jail.has_cgroup)
        conch_cgroup_stats(&jail.cg, &cgs, NULL);
    if (o->jail.workspace && o->jail.ws_mode == CONCH_WS_OVERLAY) {
        upper = conch_jail_upper_open(&jail, err);
        if (upper < 0) {
            r = upper;
            goto out;
        }
    }
    struct conch_run_end end = {
        .status = rp.end.status,
        .usage = rp.end.usage,
        .timed_out = res->timed_out,
        .timeout_ms = o->timeout_ms,
        .grace_ms = o->grace_ms,
        .spill_exceeded = over_spill ? o->max_spill : 0,
        .memory_exceeded = cgs.oom_killed || sampled_oom ? o->jail.limits.memory_bytes : 0,
        .memory_sampled = !jail.has_cgroup,
        .pids_hit = cgs.pids_limit_hit || sampled_pids ? o->jail.limits.pids_max : 0,
    };
    /* A full disk only explains a failure: a command may fill /tmp and still succeed. */
    char disk[160];
    char tmp_path[64];
    snprintf(tmp_path, sizeof(tmp_path), "/proc/%d/root/tmp", jail.warden_pid);
    bool failed = conch_exit_code(rp.end.status, NULL) != 0;
    if (failed && upper >= 0 && fd_fs_full(upper)) {
        snprintf(disk, sizeof(disk), "the workspace's writable layer (%llu bytes, --disk)",
                 (unsigned long long)o->jail.disk_bytes);
        end.disk_full = disk;
    } else if (failed && path_fs_full(tmp_path)) {
        snprintf(disk, sizeof(disk), "/tmp (%llu bytes, --tmp-size)",
                 (unsigned long long)o->jail.tmp_bytes);
        end.disk_full = disk;
    }
    conch_run_result_end(res, &end);

    if (upper >= 0) {
        r = conch_ws_changes_scan(upper, jail.host_ws_fd, &res->changes, err);
        if (r < 0) {
            conch_err_wrap(err, "read workspace changes");
            goto out;
        }
        res->has_changes = true;
        bool ended_normally = !res->timed_out && !res->signal && res->error_kind != CONCH_ERR_LIMIT;
        if (o->commit && ended_normally && res->changes.n > 0) {
            /* A failed commit is reported beside the command's own outcome, never in its
             * place: the command ran, and the report says exactly what reached the host. */
            struct conch_ws_commit_opts copts = {
                .new_uid = (uid_t)-1, .new_gid = (gid_t)-1, .max_bytes = o->jail.disk_bytes};
            res->commit_tried = true;
            if (conch_ws_commit(upper, jail.host_ws_fd, &res->changes, &copts, &res->commit,
                                &res->commit_err) < 0)
                conch_err_wrap(&res->commit_err, "commit workspace changes");
            else
                res->committed = true;
        }
    }
    if (o->stream) {
        stream_rest(1, &res->out);
        stream_rest(2, &res->err);
    }
    r = 0;

out:
    conch_super_done(&super, "conch run ended");
    for (int i = 0; i < 2; i++) {
        if (out_pipe[i] >= 0)
            close(out_pipe[i]);
        if (err_pipe[i] >= 0)
            close(err_pipe[i]);
    }
    if (sigfd >= 0)
        close(sigfd);
    conch_jail_destroy(&jail);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    conch_exec_env_free(env);
    return r;
}
