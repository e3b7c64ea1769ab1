/* run.c - one command in a fresh sandbox: start the jail, pump its output through the
 * capture buffers, enforce the deadline, classify how it ended, read (and maybe commit)
 * the workspace changes, tear everything down. */
#include "exec/run.h"
#include "ptc/ptc.h"

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
#include "core/clock.h"
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
    conch_run_tool_calls_done(&res->tools);
}

void conch_run_tool_calls_done(struct conch_run_tool_calls *t)
{
    json_decref(t->calls);
    json_decref(t->detached);
    free(t->summary);
    memset(t, 0, sizeof(*t));
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
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/conch/bin",
        "PYTHONPATH=/run/conch/python", /* conch_tools, the tool bridge's Python module */
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

/* One `conch run` in progress: the sandbox, its supervisor, the command as a process object,
 * and what the loop saw. Each step below takes it. */
struct run_ctx {
    const struct conch_run_opts *o;
    struct conch_run_result *res;
    struct conch_jail *jail;
    struct conch_super super;
    struct conch_proc proc;
    bool ended;
    struct conch_proc_end end;
    struct pump pumps[2];
    int sigfd;
    bool over_spill, sampled_oom, sampled_pids;
};

static void run_proc_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct run_ctx *x = p->data;
    x->ended = true;
    x->end = *end;
}

static const struct conch_proc_ops run_proc_ops = {.ended = run_proc_ended};

/* Step 1: send the command to the sandbox, its output into two pipes we read. */
static int run_start_command(struct run_ctx *x, char **env, struct conch_err *err)
{
    const struct conch_run_opts *o = x->o;
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) < 0)
        return conch_err_set(err, errno, "pipe: %s", strerror(errno));
    if (pipe2(err_pipe, O_CLOEXEC) < 0) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        return conch_err_set(err, errno, "pipe: %s", strerror(errno));
    }
    x->pumps[0] = (struct pump){out_pipe[0], o->stream ? 1 : -1, &x->res->out};
    x->pumps[1] = (struct pump){err_pipe[0], o->stream ? 2 : -1, &x->res->err};
    _cleanup_close_ int devnull = -1;
    int stdin_fd = o->stdin_fd;
    if (fcntl(stdin_fd, F_GETFD) < 0)
        stdin_fd = devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct conch_jail_cmd cmd = {
        .argv = o->argv,
        .envp = env,
        .cwd = o->cwd ? o->cwd : (o->jail.workspace ? "/workspace" : "/"),
        .stdin_fd = stdin_fd,
        .stdout_fd = out_pipe[1],
        .stderr_fd = err_pipe[1],
        .last = true, /* conch run: its one command, no spare shepherd after it */
        /* as for any program conch run starts, its own sandbox or a daemon's */
        .caller_attrs = true,
        /* --disk is also the largest file, borrowed (the pool sandbox's is its own) or not */
        .max_file = o->jail.file_bytes,
    };
    x->proc = (struct conch_proc){.ops = &run_proc_ops, .data = x};
    int r = conch_super_run(&x->super, &x->proc, &cmd, o->timeout_ms, o->grace_ms, err);
    close(out_pipe[1]);
    close(err_pipe[1]);
    return r;
}

/* Without a cgroup, memory and the process count are sampled from the sandbox's /proc: a
 * memory hog is killed like an OOM kill, a full process table is noted. */
static void run_sample(struct run_ctx *x)
{
    const struct conch_cgroup_limits *lim = &x->o->jail.limits;
    struct conch_jail_usage u;
    if (conch_jail_usage(x->jail, &u) < 0)
        return;
    if (lim->pids_max && u.processes + 1 >= lim->pids_max)
        x->sampled_pids = true;
    if (lim->memory_bytes && u.rss_bytes > lim->memory_bytes && !x->sampled_oom) {
        x->sampled_oom = true;
        conch_super_signal(&x->proc, SIGKILL);
    }
}

/* Read what pump @p has; closes it at EOF. Returns 0 or -errno with @err. */
static int run_pump_read(struct run_ctx *x, struct pump *p, struct conch_err *err)
{
    static char buf[65536]; /* not on the stack, which the caller's ulimit -s may make small */
    ssize_t got = read(p->fd, buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (got <= 0) {
        close(p->fd);
        p->fd = -1;
        return 0;
    }
    uint64_t before = p->o->total;
    int a = conch_output_append(p->o, buf, (size_t)got, err);
    if (a < 0)
        return a;
    if (p->echo_fd >= 0)
        stream_head(p->echo_fd, p->o, buf, (size_t)got, before);
    if (a == 1 && !x->over_spill) {
        /* Past the spill cap the command is stopped: an agent's output flood must not fill
         * the host's disk, and nobody reads gigabytes of it. */
        x->over_spill = true;
        conch_super_signal(&x->proc, SIGKILL);
    }
    return 0;
}

/* Step 2: pump output, forward signals (the first interrupt passes on, as a terminal would
 * to its foreground job; a second one kills) and wait for the command's final event, which
 * always comes. The deadline is the warden's. */
static int run_wait(struct run_ctx *x, struct conch_err *err)
{
    const struct conch_cgroup_limits *lim = &x->o->jail.limits;
    bool sample = !conch_jail_has_cgroup(x->jail) && (lim->memory_bytes || lim->pids_max);
    uint64_t next_sample = 0;
    int interrupts = 0;
    while (!x->ended || x->pumps[0].fd >= 0 || x->pumps[1].fd >= 0) {
        struct pollfd pfd[4] = {
            {.fd = x->pumps[0].fd, .events = POLLIN},
            {.fd = x->pumps[1].fd, .events = POLLIN},
            {.fd = x->ended ? -1 : conch_super_fd(&x->super),
             .events = POLLIN | (conch_super_wants_write(&x->super) ? POLLOUT : 0)},
            {.fd = x->sigfd, .events = POLLIN},
        };
        int n = poll(pfd, 4, sample && !x->ended ? SAMPLE_MS : -1);
        if (n < 0 && errno != EINTR)
            return conch_err_set(err, errno, "poll: %s", strerror(errno));
        if (sample && !x->ended && conch_clock_ms() >= next_sample) {
            next_sample = conch_clock_ms() + SAMPLE_MS;
            run_sample(x);
        }
        if (n <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            int r;
            if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                (r = run_pump_read(x, &x->pumps[i], err)) < 0)
                return r;
        }
        if (pfd[2].revents & POLLOUT)
            conch_super_flush(&x->super);
        if (pfd[2].revents & (POLLIN | POLLHUP | POLLERR))
            conch_super_dispatch(&x->super);
        struct signalfd_siginfo si;
        while ((pfd[3].revents & POLLIN) && read(x->sigfd, &si, sizeof(si)) == sizeof(si)) {
            if (!x->ended)
                conch_super_signal(&x->proc, ++interrupts > 1 ? SIGKILL : (int)si.ssi_signo);
        }
    }
    return 0;
}

/* Step 3: how did it end? (limits from the cgroup's counters or our samples, a full disk as
 * the explanation of a failure). @upper is the overlay's upper dir or -1. */
static void run_classify(struct run_ctx *x, int upper)
{
    const struct conch_run_opts *o = x->o;
    struct conch_cgroup_stats cgs;
    conch_jail_cgroup_stats(x->jail, &cgs);
    x->res->timed_out = x->end.timed_out;
    struct conch_run_end end = {
        .status = x->end.status,
        .usage = x->end.usage,
        .timed_out = x->end.timed_out,
        .timeout_ms = o->timeout_ms,
        .grace_ms = o->grace_ms,
        .spill_exceeded = x->over_spill ? o->max_spill : 0,
        .memory_exceeded = cgs.oom_killed || x->sampled_oom ? o->jail.limits.memory_bytes : 0,
        .memory_sampled = !conch_jail_has_cgroup(x->jail),
        .pids_hit = cgs.pids_limit_hit || x->sampled_pids ? o->jail.limits.pids_max : 0,
    };
    /* A full disk only explains a failure: a command may fill /tmp and still succeed. */
    char disk[160];
    char tmp_path[64];
    snprintf(tmp_path, sizeof(tmp_path), "/proc/%d/root/tmp", conch_jail_warden_pid(x->jail));
    bool failed = conch_exit_code(x->end.status, NULL) != 0;
    if (failed && upper >= 0 && fd_fs_full(upper)) {
        snprintf(disk, sizeof(disk), "the workspace's writable layer (%llu bytes, --disk)",
                 (unsigned long long)o->jail.disk_bytes);
        end.disk_full = disk;
    } else if (failed && path_fs_full(tmp_path)) {
        snprintf(disk, sizeof(disk), "/tmp (%llu bytes, --tmp-size)",
                 (unsigned long long)o->jail.tmp_bytes);
        end.disk_full = disk;
    }
    conch_run_result_end(x->res, &end);
}

/* Step 4: the workspace's changes, and the commit if asked and the command exited by itself.
 * A failed commit is reported beside the command's own outcome, never in its place: the
 * command ran, and the report says exactly what reached the host. */
static int run_changes(struct run_ctx *x, int upper, struct conch_err *err)
{
    const struct conch_run_opts *o = x->o;
    struct conch_run_result *res = x->res;
    int r = conch_ws_changes_scan(upper, conch_jail_host_ws_fd(x->jail), &res->changes, err);
    if (r < 0)
        return conch_err_wrap(err, "read workspace changes");
    res->has_changes = true;
    bool ended_normally = !res->timed_out && !res->signal && res->error_kind != CONCH_ERR_LIMIT;
    if (!o->commit || !ended_normally || res->changes.n == 0)
        return 0;
    struct conch_ws_commit_opts copts = {
        .new_uid = (uid_t)-1, .new_gid = (gid_t)-1, .max_bytes = o->jail.disk_bytes};
    res->commit_tried = true;
    if (conch_ws_commit(upper, conch_jail_host_ws_fd(x->jail), &res->changes, &copts, &res->commit,
                        &res->commit_err) < 0)
        conch_err_wrap(&res->commit_err, "commit workspace changes");
    else
        res->committed = true;
    return 0;
}

/* The command has ended: fill the result from its final event. Returns 0, or -errno with
 * @err when the sandbox failed it (not the command). */
static int run_report(struct run_ctx *x, struct conch_err *err)
{
    const struct conch_run_opts *o = x->o;
    if (x->end.lost)
        return conch_err_set(err, EIO, "the command's end was not reported: %s", x->end.why);
    if (x->end.start_failed) {
        if (x->end.err.kind != CONCH_ERR_COMMAND && x->end.err.kind != CONCH_ERR_USAGE) {
            *err = x->end.err;
            return -(err->code ? err->code : EIO);
        }
        struct conch_run_end end = {.start_failed = true, .start_err = x->end.err};
        conch_run_result_end(x->res, &end);
        return 0;
    }
    _cleanup_close_ int upper = -1;
    if (o->jail.workspace && o->jail.ws_mode == CONCH_WS_OVERLAY &&
        (upper = conch_jail_upper_open(x->jail, err)) < 0)
        return upper;
    run_classify(x, upper);
    if (upper >= 0)
        return run_changes(x, upper, err);
    return 0;
}

static int exec_run(const struct conch_run_opts *o, struct conch_jail **leased,
                    struct conch_run_result *res, struct conch_err *err);

int conch_exec_run(const struct conch_run_opts *o, struct conch_run_result *res,
                   struct conch_err *err)
{
    struct conch_jail *leased = o->leased;
    int r = exec_run(o, &leased, res, err);
    conch_jail_destroy(leased); /* not taken: a failure before the sandbox was needed */
    return r;
}

static int exec_run(const struct conch_run_opts *o, struct conch_jail **leased,
                    struct conch_run_result *res, struct conch_err *err)
{
    int r;
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

    uint64_t start = conch_clock_ms();
    struct run_ctx *x = calloc(1, sizeof(*x));
    if (!x) {
        conch_exec_env_free(env);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    x->o = o;
    x->res = res;
    x->sigfd = x->pumps[0].fd = x->pumps[1].fd = -1;
    /* The tool bridge: tool_call and the modules are always there (they say when no bridge
     * serves them); the socket only with --tools. */
    struct conch_jail_spec spec = o->jail;
    spec.ptc_socket = o->tools != NULL;
    _cleanup_free_ char *ptc_dir = NULL;
    struct conch_err ptc_err = {0};
    if (conch_ptc_find_dir(&ptc_dir, &ptc_err) < 0 && o->tools) {
        conch_exec_env_free(env);
        free(x);
        return conch_err_setk(err, CONCH_ERR_INFRASTRUCTURE, ENOENT, "--tools: %s", ptc_err.msg);
    }
    spec.ptc_dir = ptc_dir;
    if (*leased) {
        x->jail = *leased;
        *leased = NULL;
        r = 0;
    } else {
        r = conch_jail_start(&spec, &x->jail, err);
    }
    if (r < 0 ||
        (o->tools && (r = o->tools->start(o->tools, conch_jail_take_ptc_fd(x->jail), err)) < 0)) {
        if (x->jail)
            conch_jail_destroy(x->jail);
        conch_exec_env_free(env);
        free(x);
        return r;
    }
    conch_super_init(&x->super, x->jail);
    /* SIGINT, SIGTERM and SIGHUP are the command's to receive (run_wait forwards them). */
    sigset_t mask, oldmask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGPIPE);
    sigprocmask(SIG_BLOCK, &mask, &oldmask);
    sigdelset(&mask, SIGPIPE);
    x->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (x->sigfd < 0)
        r = conch_err_set(err, errno, "signalfd: %s", strerror(errno));
    else if ((r = run_start_command(x, env, err)) >= 0 && (r = run_wait(x, err)) >= 0) {
        res->duration_ms = conch_clock_ms() - start;
        if (o->tools) {
            o->tools->finish(o->tools, &res->tools);
            res->tools_summary = res->tools.summary;
        }
        r = run_report(x, err);
    }
    if (o->tools) {
        struct conch_run_tool_calls left;
        o->tools->finish(o->tools, &left); /* after a failure: stop its thread */
        conch_run_tool_calls_done(&left);
    }
    if (r >= 0 && o->stream) {
        stream_rest(1, &res->out);
        stream_rest(2, &res->err);
    }

    conch_super_done(&x->super, "conch run ended");
    for (int i = 0; i < 2; i++)
        if (x->pumps[i].fd >= 0)
            close(x->pumps[i].fd);
    if (x->sigfd >= 0)
        close(x->sigfd);
    conch_jail_destroy(x->jail);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    conch_exec_env_free(env);
    free(x);
    return r < 0 ? r : 0;
}
