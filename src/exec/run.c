/* run.c - `conch run`: one command in a fresh (or leased) sandbox: start the jail, drive the
 * command (exec/command.c: pipes, captures, limits, classification) from a poll loop that
 * also forwards signals and drives the supervisor, read (and maybe commit) the workspace
 * changes, tear everything down. */
#include "exec/run.h"
#include "ptc/ptc.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/clock.h"
#include "core/fsutil.h"
#include "exec/command.h"
#include "exec/exec-internal.h"
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
    for (unsigned i = 0; i < res->n_mounts && i < CONCH_SPEC_MOUNTS_MAX; i++) {
        conch_ws_changes_done(&res->mounts[i].changes);
        conch_ws_commit_report_done(&res->mounts[i].commit);
    }
    res->n_mounts = 0;
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

char **conch_exec_env_build(char *const *extra, bool as_root, bool net_proxy, struct conch_err *err)
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
    const char *const *proxy = conch_net_proxy_env();
    size_t n = 0, cap = ARRAY_SIZE(base) + 2;
    for (const char *const *e = proxy; net_proxy && *e; e++)
        cap++;
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
    /* The allow mode's proxy, for what honours the usual variables (curl, pip, npm, git). */
    for (const char *const *e = proxy; net_proxy && *e; e++)
        env[n++] = strdup(*e);
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

/* One `conch run` in progress: the sandbox, its supervisor, the command (the driver of
 * exec/command.c, polled here) and the signals it is to receive. Each step below takes it. */
struct run_ctx {
    const struct conch_run_opts *o;
    struct conch_run_result *res;
    struct conch_jail *jail;
    struct conch_super super;
    struct conch_command cmd;
    struct conch_run_mounts mounts; /* its overlay and store mounts (run-mounts.c) */
    int sigfd;
};

/* --stream: the head of each stream is copied to ours as it comes. */
static void run_output(struct conch_command *c, int stream, const char *buf, size_t len,
                       uint64_t before)
{
    struct run_ctx *x = c->data;
    if (x->o->stream)
        stream_head(stream == CONCH_COMMAND_STDOUT ? 1 : 2, conch_command_output(c, stream), buf,
                    len, before);
}

/* This loop asks conch_command_fd() before each poll: no watch callback. */
static const struct conch_command_ops run_command_ops = {.output = run_output};

/* Step 1: send the command to the sandbox, its output into the driver's pipes. */
static int run_start_command(struct run_ctx *x, char **env, struct conch_err *err)
{
    const struct conch_run_opts *o = x->o;
    struct conch_jail_cmd cmd = {
        .argv = o->argv,
        .envp = env,
        .cwd = o->cwd ? o->cwd : (o->jail.workspace ? "/workspace" : "/"),
        .last = true, /* conch run: its one command, no spare shepherd after it */
        /* as for any program conch run starts, its own sandbox or a daemon's */
        .caller_attrs = true,
        /* --disk is also the largest file, borrowed (the pool sandbox's is its own) or not */
        .max_file = o->jail.file_bytes,
    };
    return conch_command_start(&x->cmd, &x->super, &cmd, err);
}

/* Step 2: pump output, forward signals (the first interrupt passes on, as a terminal would
 * to its foreground job; a second one kills) and wait until the command has finished: its
 * final event, which always comes, and both streams at their end. The deadline is the
 * warden's. Without a cgroup, memory and the process count are sampled. */
static int run_wait(struct run_ctx *x, struct conch_err *err)
{
    struct conch_command *c = &x->cmd;
    const struct conch_cgroup_limits *lim = &x->o->jail.limits;
    bool sample = conch_command_sampling_wanted(x->jail, lim);
    bool views = x->mounts.run_dir[0] != '\0'; /* store views: measured against --disk */
    uint64_t next_sample = 0;
    int interrupts = 0;
    while (!conch_command_finished(c)) {
        bool ended = conch_command_ended(c);
        struct pollfd pfd[4] = {
            {.fd = conch_command_fd(c, CONCH_COMMAND_STDOUT), .events = POLLIN},
            {.fd = conch_command_fd(c, CONCH_COMMAND_STDERR), .events = POLLIN},
            {.fd = ended ? -1 : conch_super_fd(&x->super),
             .events = POLLIN | (conch_super_wants_write(&x->super) ? POLLOUT : 0)},
            {.fd = x->sigfd, .events = POLLIN},
        };
        int n = poll(pfd, 4, (sample || views) && !ended ? SAMPLE_MS : -1);
        if (n < 0 && errno != EINTR)
            return conch_err_set(err, errno, "poll: %s", strerror(errno));
        if (sample && !ended && conch_clock_ms() >= next_sample) {
            next_sample = conch_clock_ms() + SAMPLE_MS;
            conch_command_limit_hit(c, conch_command_sample(x->jail, lim));
        }
        if (views && !ended && conch_run_mounts_views_over(&x->mounts, x->o->jail.disk_bytes)) {
            char what[96];
            snprintf(what, sizeof(what), "the store mounts (%llu bytes, --disk)",
                     (unsigned long long)x->o->jail.disk_bytes);
            conch_command_disk_full(c, what);
        }
        if (n <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            int r;
            if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                (r = conch_command_read(c, i, err)) < 0)
                return r;
        }
        if (pfd[2].revents & POLLOUT)
            conch_super_flush(&x->super);
        if (pfd[2].revents & (POLLIN | POLLHUP | POLLERR))
            conch_super_dispatch(&x->super);
        struct signalfd_siginfo si;
        while ((pfd[3].revents & POLLIN) && read(x->sigfd, &si, sizeof(si)) == sizeof(si)) {
            if (!conch_command_ended(c))
                conch_command_signal(c, ++interrupts > 1 ? SIGKILL : (int)si.ssi_signo);
        }
    }
    return 0;
}

/* Step 3: how did it end? The driver classifies; a full disk (the overlay's upper dir, or
 * /tmp) is this sandbox's explanation of a failure. @upper is the upper dir or -1. */
static void run_classify(struct run_ctx *x, int upper)
{
    const struct conch_run_opts *o = x->o;
    /* A full disk only explains a failure: a command may fill /tmp and still succeed. */
    char disk[160];
    char tmp_path[64];
    snprintf(tmp_path, sizeof(tmp_path), "/proc/%d/root/tmp", conch_jail_warden_pid(x->jail));
    bool failed = conch_exit_code(conch_command_end(&x->cmd)->status, NULL) != 0;
    if (failed && upper >= 0 && fd_fs_full(upper)) {
        snprintf(disk, sizeof(disk), "the workspace's writable layer (%llu bytes, --disk)",
                 (unsigned long long)o->jail.disk_bytes);
        conch_command_disk_full(&x->cmd, disk);
    } else if (failed && path_fs_full(tmp_path)) {
        snprintf(disk, sizeof(disk), "/tmp (%llu bytes, --tmp-size)",
                 (unsigned long long)o->jail.tmp_bytes);
        conch_command_disk_full(&x->cmd, disk);
    }
    conch_command_result(&x->cmd, x->res);
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
    struct conch_ws_rule rules[CONCH_SPEC_RULES_MAX];
    size_t n_rules = 0;
    for (unsigned i = 0; i < o->jail.n_rules && i < CONCH_SPEC_RULES_MAX; i++)
        rules[n_rules++] = (struct conch_ws_rule){o->jail.rules[i].path,
                                                  o->jail.rules[i].kind == CONCH_RULE_HIDDEN};
    /* What the rules protect is listed as never committed. */
    conch_ws_changes_mark_rules(&res->changes, rules, n_rules);
    bool ended_normally = !res->timed_out && !res->signal && res->error_kind != CONCH_ERR_LIMIT;
    /* Overlay mounts follow the workspace: read, and committed when it would be. */
    conch_run_mounts_changes(&x->mounts, x->jail, o->commit && ended_normally, o->jail.disk_bytes,
                             res);
    if (!o->commit || !ended_normally || res->changes.n == 0)
        return 0;
    struct conch_ws_commit_opts copts = {.new_uid = (uid_t)-1,
                                         .new_gid = (gid_t)-1,
                                         .max_bytes = o->jail.disk_bytes,
                                         .rules = rules,
                                         .n_rules = n_rules};
    res->commit_tried = true;
    if (conch_ws_commit(upper, conch_jail_host_ws_fd(x->jail), &res->changes, &copts, &res->commit,
                        &res->commit_err) < 0)
        conch_err_wrap(&res->commit_err, "commit workspace changes");
    else
        res->committed = true;
    return 0;
}

/* The command has finished: fill the result from its final event. Returns 0, or -errno with
 * @err when the sandbox failed it (not the command). */
static int run_report(struct run_ctx *x, struct conch_err *err)
{
    const struct conch_run_opts *o = x->o;
    const struct conch_proc_end *end = conch_command_end(&x->cmd);
    if (end->lost)
        return conch_err_set(err, EIO, "the command's end was not reported: %s", end->why);
    if (end->start_failed) {
        if (end->err.kind != CONCH_ERR_COMMAND && end->err.kind != CONCH_ERR_USAGE) {
            *err = end->err;
            return -(err->code ? err->code : EIO);
        }
        conch_command_result(&x->cmd, x->res);
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

/* Free @x and what it holds, the command's captures going to @res (which owns them after any
 * failure too: what the command printed before it, for --json). */
static void run_ctx_free(struct run_ctx *x, struct conch_run_result *res, char **env)
{
    conch_run_mounts_done(&x->mounts);
    conch_command_take_outputs(&x->cmd, &res->out, &res->err);
    conch_command_done(&x->cmd);
    conch_exec_env_free(env);
    free(x);
}

static int exec_run(const struct conch_run_opts *o, struct conch_jail **leased,
                    struct conch_run_result *res, struct conch_err *err)
{
    int r;
    memset(res, 0, sizeof(*res));
    res->out.spill_fd = res->err.spill_fd = -1;
    struct run_ctx *x = calloc(1, sizeof(*x));
    if (!x)
        return conch_err_set(err, ENOMEM, "out of memory");
    x->o = o;
    x->res = res;
    x->sigfd = -1;
    struct conch_command_opts copts = {
        .max_output = o->max_output,
        .max_spill = o->max_spill,
        .spill_dir = o->spill_dir ? o->spill_dir : "/tmp",
        .stdin_fd = o->stdin_fd,
        .timeout_ms = o->timeout_ms,
        .grace_ms = o->grace_ms,
        .limits = o->jail.limits,
    };
    char **env = NULL;
    if ((r = conch_command_init(&x->cmd, &copts, &run_command_ops, x, err)) < 0 ||
        (r = conch_run_mounts_prepare(&x->mounts, o, err)) < 0 ||
        !(env = conch_exec_env_build(o->env_extra, o->jail.as_root, o->jail.net == CONCH_NET_ALLOW,
                                     err))) {
        run_ctx_free(x, res, env);
        return r < 0 ? r : -(err->code ? err->code : EINVAL);
    }

    uint64_t start = conch_clock_ms();
    /* The tool bridge: tool_call and the modules are always there (they say when no bridge
     * serves them); the socket only with --tools. */
    struct conch_jail_spec spec = o->jail;
    spec.ptc_socket = o->tools != NULL;
    _cleanup_free_ char *ptc_dir = NULL;
    struct conch_err ptc_err = {0};
    if (conch_ptc_find_dir(&ptc_dir, &ptc_err) < 0 && o->tools) {
        run_ctx_free(x, res, env);
        return conch_err_setk(err, CONCH_ERR_INFRASTRUCTURE, ENOENT, "--tools: %s", ptc_err.msg);
    }
    spec.ptc_dir = ptc_dir;
    spec.mounts = x->mounts.mounts; /* the stores' with their views */
    if (*leased && spec.n_mounts) {
        conch_jail_destroy(*leased); /* a pool sandbox has no extra mount: build one here */
        *leased = NULL;
    }
    if (*leased) {
        x->jail = *leased;
        *leased = NULL;
        r = 0;
    } else {
        r = conch_jail_start(&spec, &x->jail, err);
    }
    if (r == 0 && o->jail.net == CONCH_NET_ALLOW && !o->net)
        r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "the allow network mode needs a proxy");
    if (r < 0 ||
        (o->net && (r = o->net->start(o->net, conch_jail_take_net_fd(x->jail), err)) < 0) ||
        (o->tools && (r = o->tools->start(o->tools, conch_jail_take_ptc_fd(x->jail), err)) < 0)) {
        if (o->net)
            o->net->finish(o->net);
        if (x->jail)
            conch_jail_destroy(x->jail);
        run_ctx_free(x, res, env);
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
        uint64_t duration_ms = conch_clock_ms() - start;
        if (o->tools) {
            o->tools->finish(o->tools, &res->tools);
            res->tools_summary = res->tools.summary;
        }
        r = run_report(x, err);
        /* conch run's duration counts the sandbox's build too, not only the command's */
        res->duration_ms = duration_ms;
    }
    if (o->tools) {
        struct conch_run_tool_calls left;
        o->tools->finish(o->tools, &left); /* after a failure: stop its thread */
        conch_run_tool_calls_done(&left);
    }
    if (o->net)
        o->net->finish(o->net); /* what it recorded stays its own */
    /* The supervisor ends the command (lost) if it still runs, before the jail goes. */
    conch_super_done(&x->super, "conch run ended");
    if (x->sigfd >= 0)
        close(x->sigfd);
    conch_jail_destroy(x->jail);
    /* Nothing writes to the store views any more, whatever way the command ended (a timeout,
     * a signal): each is written back whole, in one transaction. */
    conch_run_mounts_sync(&x->mounts, res);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    run_ctx_free(x, res, env);
    if (r >= 0 && o->stream) {
        stream_rest(1, &res->out);
        stream_rest(2, &res->err);
    }
    return r < 0 ? r : 0;
}
