/* command.c - the one command driver (command.h): stdio pipes, the pump from each pipe into
 * its capture, the stops (spill cap, sampled limits), and the classification of the end.
 * Both `conch run` and the daemon drive commands through it; it owns no loop. */
#include "exec/command.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fsutil.h"
#include "exec/result.h"

static const char *const stream_names[2] = {"stdout", "stderr"};

int conch_command_init(struct conch_command *c, const struct conch_command_opts *o,
                       const struct conch_command_ops *ops, void *data, struct conch_err *err)
{
    memset(c, 0, sizeof(*c));
    c->fd[0] = c->fd[1] = -1; /* first, so done() is safe whatever fails below */
    c->out[0].spill_fd = c->out[1].spill_fd = -1;
    c->ops = ops;
    c->data = data;
    c->stdin_fd = o->stdin_fd;
    c->stdin_data = o->stdin_data;
    c->stdin_len = o->stdin_len;
    c->timeout_ms = o->timeout_ms;
    c->grace_ms = o->grace_ms;
    c->limits = o->limits;
    c->shell = o->shell;
    for (int s = 0; s < 2; s++) {
        int r = conch_output_init(&c->out[s], stream_names[s], o->max_output, o->max_spill,
                                  o->spill_dir, err);
        if (r < 0)
            return r;
        conch_output_set_budget(&c->out[s], o->budget);
        if (o->spill_shown_dir)
            conch_output_show_spill_in(&c->out[s], o->spill_shown_dir);
    }
    return 0;
}

/* Stop reading @stream for good: the caller's loop lets go of the fd before it is closed. */
static void close_stream(struct conch_command *c, int s)
{
    if (c->fd[s] < 0)
        return;
    if (c->ops->watch && (c->watched & (1u << s)))
        c->ops->watch(c, s, c->fd[s], CONCH_COMMAND_WATCH_CLOSE);
    c->watched &= ~(1u << s);
    close(c->fd[s]);
    c->fd[s] = -1;
}

/* The report is complete once the end came and both streams are closed: the spill files stay
 * (a job's output is read back from them), their fds need not. The callee may free @c: this
 * is the last thing every entry point does. */
static void maybe_finish(struct conch_command *c)
{
    if (c->finished || !c->ended || c->fd[0] >= 0 || c->fd[1] >= 0)
        return;
    c->finished = true;
    c->end_ms = conch_clock_ms();
    conch_output_close_spill(&c->out[0]);
    conch_output_close_spill(&c->out[1]);
    if (c->ops->finished)
        c->ops->finished(c);
}

/* The stdin the command gets: a dup of the caller's fd, a memfd of the bytes, or /dev/null. */
static int open_stdin(struct conch_command *c, struct conch_err *err)
{
    int fd = -1;
    if (c->stdin_fd >= 0 && (fd = fcntl(c->stdin_fd, F_DUPFD_CLOEXEC, 3)) >= 0)
        return fd;
    if (c->stdin_fd < 0 && c->stdin_data && c->stdin_len) {
        /* A memfd holds any amount of stdin without a loop writing a pipe. */
        fd = memfd_create("conch-stdin", MFD_CLOEXEC);
        int w = fd < 0 ? -errno : conch_write_all(fd, c->stdin_data, c->stdin_len);
        if (w >= 0 && lseek(fd, 0, SEEK_SET) < 0)
            w = -errno;
        if (w < 0) {
            if (fd >= 0)
                close(fd);
            return conch_err_set(err, -w, "stdin: %s", strerror(-w));
        }
        return fd;
    }
    fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "stdin: open /dev/null: %s", strerror(errno));
    return fd;
}

int conch_command_open(struct conch_command *c, int ret_stdio[3], struct conch_err *err)
{
    int out[2] = {-1, -1}, errp[2] = {-1, -1};
    int r = 0;
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0)
        r = conch_err_set(err, errno, "pipe: %s", strerror(errno));
    /* Our ends only: the command's stay blocking, as a program expects of its stdout. */
    else if (fcntl(out[0], F_SETFL, O_NONBLOCK) < 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) < 0)
        r = conch_err_set(err, errno, "pipe: %s", strerror(errno));
    int in = r < 0 ? -1 : open_stdin(c, err);
    if (r < 0 || in < 0) {
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0)
                close(out[i]);
            if (errp[i] >= 0)
                close(errp[i]);
        }
        return r < 0 ? r : in;
    }
    c->fd[0] = out[0];
    c->fd[1] = errp[0];
    for (int s = 0; s < 2 && c->ops->watch && !c->paused; s++) {
        if ((r = c->ops->watch(c, s, c->fd[s], CONCH_COMMAND_WATCH_READ)) < 0) {
            conch_err_set(err, -r, "watching the command's %s: %s", stream_names[s], strerror(-r));
            close_stream(c, 0);
            close_stream(c, 1);
            close(in);
            close(out[1]);
            close(errp[1]);
            return r;
        }
        c->watched |= 1u << s;
    }
    ret_stdio[0] = in;
    ret_stdio[1] = out[1];
    ret_stdio[2] = errp[1];
    c->start_ms = conch_clock_ms();
    return 0;
}

static void on_started(struct conch_proc *p, pid_t pid)
{
    struct conch_command *c = p->data;
    if (c->ops->started)
        c->ops->started(c, pid, p->pidns_ino);
}

/* The final event, from the supervisor (or conch_command_abandon). */
static void on_end(struct conch_command *c, const struct conch_proc_end *end)
{
    c->ended = true;
    c->end = *end;
    if (c->jail && c->has_cgroup) {
        /* The cgroup's counters are the sandbox's: only what grew during this command
         * counts. Read now, while the supervisor still vouches for the jail. */
        struct conch_cgroup_stats cgs;
        conch_jail_cgroup_stats(c->jail, &cgs);
        c->oom_killed = cgs.oom_kills > c->oom_base;
        c->pids_hit = cgs.pids_events > c->pids_base;
    }
    c->jail = NULL;
    if (c->ops->ended)
        c->ops->ended(c);
    if (end->lost) {
        /* Nothing more will be written that anyone waits for. */
        close_stream(c, 0);
        close_stream(c, 1);
    }
    maybe_finish(c);
}

static void on_proc_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    on_end(p->data, end);
}

void conch_command_process_ended(struct conch_command *c, const struct conch_proc_end *end)
{
    if (!c->ended)
        on_end(c, end);
}

static const struct conch_proc_ops command_proc_ops = {.started = on_started,
                                                       .ended = on_proc_ended};

int conch_command_start(struct conch_command *c, struct conch_super *s, struct conch_jail_cmd *cmd,
                        struct conch_err *err)
{
    c->jail = s->jail;
    c->has_cgroup = s->jail && conch_jail_has_cgroup(s->jail);
    if (c->has_cgroup) {
        struct conch_cgroup_stats cgs;
        conch_jail_cgroup_stats(s->jail, &cgs);
        c->oom_base = cgs.oom_kills;
        c->pids_base = cgs.pids_events;
    }
    int fds[3];
    int r = conch_command_open(c, fds, err);
    if (r < 0) {
        c->jail = NULL;
        return r;
    }
    cmd->stdin_fd = fds[0];
    cmd->stdout_fd = fds[1];
    cmd->stderr_fd = fds[2];
    c->proc = (struct conch_proc){.ops = &command_proc_ops, .data = c};
    r = conch_super_run(s, &c->proc, cmd, c->timeout_ms, c->grace_ms, err);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    if (r < 0) {
        close_stream(c, 0);
        close_stream(c, 1);
        c->jail = NULL;
    }
    return r;
}

int conch_command_fd(const struct conch_command *c, int stream)
{
    return c->paused ? -1 : c->fd[stream];
}

void conch_command_signal(struct conch_command *c, int sig)
{
    if (c->ops->signal)
        c->ops->signal(c, sig);
    else
        conch_super_signal(&c->proc, sig);
}

/* Reads of one call: as libuv's stream reads, so that one flood cannot hold the loop (2 MiB). */
#define READS_PER_CALL 32

int conch_command_read(struct conch_command *c, int stream, struct conch_err *err)
{
    /* Not on the stack, which a caller's ulimit -s may make small; one thread drives. */
    static char buf[65536];
    struct conch_output *o = &c->out[stream];
    for (int i = 0; i < READS_PER_CALL && c->fd[stream] >= 0 && !c->paused; i++) {
        ssize_t got = read(c->fd[stream], buf, sizeof(buf));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && errno == EAGAIN)
            return 0;
        if (got <= 0) {
            close_stream(c, stream);
            maybe_finish(c); /* the last thing: @c may be gone */
            return 0;
        }
        uint64_t before = o->total;
        int a = conch_output_append(o, buf, (size_t)got, err);
        if (c->ops->output)
            c->ops->output(c, stream, buf, (size_t)got, before);
        if (a == 1 && !c->over_spill && !c->ended) {
            /* Past the spill cap the command is stopped: an agent's output flood must not
             * fill the host's disk, and nobody reads gigabytes of it. */
            c->over_spill = true;
            conch_command_signal(c, SIGKILL);
        }
        if (a < 0)
            return a;
        /* A short read emptied the pipe: the next poll says when there is more. */
        if ((size_t)got < sizeof(buf))
            return 0;
    }
    return 0;
}

void conch_command_pause(struct conch_command *c, bool on)
{
    if (c->paused == on)
        return;
    c->paused = on;
    for (int s = 0; s < 2; s++) {
        if (c->fd[s] >= 0 && c->ops->watch && (c->watched & (1u << s)))
            c->ops->watch(c, s, c->fd[s],
                          on ? CONCH_COMMAND_WATCH_PAUSE : CONCH_COMMAND_WATCH_READ);
    }
}

bool conch_command_sampling_wanted(struct conch_jail *j, const struct conch_cgroup_limits *lim)
{
    return j && !conch_jail_has_cgroup(j) && (lim->memory_bytes || lim->pids_max);
}

unsigned conch_command_sample(struct conch_jail *j, const struct conch_cgroup_limits *lim)
{
    struct conch_jail_usage u;
    if (!conch_command_sampling_wanted(j, lim) || conch_jail_usage(j, &u) < 0)
        return 0;
    unsigned hit = 0;
    if (lim->pids_max && u.processes + 1 >= lim->pids_max)
        hit |= CONCH_LIMIT_PIDS;
    if (lim->memory_bytes && u.rss_bytes > lim->memory_bytes)
        hit |= CONCH_LIMIT_MEMORY;
    return hit;
}

void conch_command_limit_hit(struct conch_command *c, unsigned limits)
{
    if (limits & CONCH_LIMIT_PIDS)
        c->sampled_pids = true;
    if ((limits & CONCH_LIMIT_MEMORY) && !c->sampled_oom) {
        /* Without a cgroup a memory hog is killed like an OOM kill. */
        c->sampled_oom = true;
        conch_command_signal(c, SIGKILL);
    }
}

void conch_command_disk_full(struct conch_command *c, const char *what)
{
    snprintf(c->disk_full, sizeof(c->disk_full), "%s", what);
    if (!c->ended)
        conch_command_signal(c, SIGKILL);
}

void conch_command_abandon(struct conch_command *c, const char *why)
{
    close_stream(c, 0);
    close_stream(c, 1);
    if (!c->ended) {
        struct conch_proc_end end = {.status = SIGKILL, .lost = true, .why = why};
        on_end(c, &end); /* ends with maybe_finish */
        return;
    }
    maybe_finish(c);
}

bool conch_command_ended(const struct conch_command *c)
{
    return c->ended;
}

bool conch_command_finished(const struct conch_command *c)
{
    return c->finished;
}

const struct conch_proc_end *conch_command_end(const struct conch_command *c)
{
    return &c->end;
}

const struct conch_output *conch_command_output(const struct conch_command *c, int stream)
{
    return &c->out[stream];
}

void conch_command_result(const struct conch_command *c, struct conch_run_result *res)
{
    struct conch_run_end end = {
        .status = c->end.status,
        .usage = c->end.usage,
        .start_failed = c->end.start_failed,
        .start_err = c->end.err,
        .start_shell = c->shell,
        .timed_out = c->end.timed_out,
        .timeout_ms = c->timeout_ms,
        .grace_ms = c->grace_ms,
        .spill_exceeded = c->over_spill ? c->out[0].spill_max : 0,
        .memory_exceeded = c->oom_killed || c->sampled_oom ? c->limits.memory_bytes : 0,
        .memory_sampled = !c->has_cgroup,
        .pids_hit = c->pids_hit || c->sampled_pids ? c->limits.pids_max : 0,
        .disk_full = c->disk_full[0] ? c->disk_full : NULL,
    };
    conch_run_result_end(res, &end);
    res->duration_ms = c->end_ms > c->start_ms ? c->end_ms - c->start_ms : 0;
}

void conch_command_take_outputs(struct conch_command *c, struct conch_output *ret_out,
                                struct conch_output *ret_err)
{
    *ret_out = c->out[0];
    *ret_err = c->out[1];
    for (int s = 0; s < 2; s++) {
        memset(&c->out[s], 0, sizeof(c->out[s]));
        c->out[s].spill_fd = -1;
    }
}

void conch_command_done(struct conch_command *c)
{
    for (int s = 0; s < 2; s++) {
        if (c->fd[s] >= 0)
            close(c->fd[s]);
        c->fd[s] = -1;
        conch_output_done(&c->out[s]);
    }
}
