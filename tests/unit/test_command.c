/* test_command.c - unit tests for src/exec/command (the one command driver), with real pipes
 * and real processes: the test is a third driver (a poll loop like conch run's, with a
 * watch callback like the daemon's), starting a shell with the driver's stdio and reporting
 * its end from waitpid. Checked: the order of EOFs and the end, the caps and the spill file,
 * a stream that never ends, pausing, stdin, and the classification of every kind of end. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/cleanup.h"
#include "exec/command.h"
#include "exec/result.h"

static char dir[64];

static void mkdir_tmp(void)
{
    strcpy(dir, "/tmp/conch-test-command-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_tmp(void)
{
    /* Only flat files are ever created here. */
    _cleanup_closedir_ DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        unlink(p);
    }
    rmdir(dir);
}

TestSuite(command, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 30);

/* What the driver told the test, in order. */
struct harness {
    struct conch_command c;
    pid_t pid;
    char log[256]; /* one letter per callback: R/P/C watch (stream digit after), E ended, F finished
                    */
    int watching[2]; /* the fd each stream is watched on, -1: none (as a uv_poll would hold) */
    bool paused[2];
    uint64_t out_bytes[2];
    int finished, ended;
    int signals[8], nsignals;
    bool pause_on_output; /* pause the command from ops->output, as a congested client does */
};

static void logc(struct harness *h, char ch)
{
    size_t n = strlen(h->log);
    if (n + 1 < sizeof(h->log))
        h->log[n] = ch;
}

static int h_watch(struct conch_command *c, int stream, int fd, enum conch_command_watch what)
{
    struct harness *h = c->data;
    cr_assert(fd >= 0);
    switch (what) {
    case CONCH_COMMAND_WATCH_READ:
        logc(h, 'R');
        h->watching[stream] = fd;
        h->paused[stream] = false;
        break;
    case CONCH_COMMAND_WATCH_PAUSE:
        logc(h, 'P');
        cr_assert_eq(h->watching[stream], fd);
        h->paused[stream] = true;
        break;
    case CONCH_COMMAND_WATCH_CLOSE:
        logc(h, 'C');
        /* the fd must still be open: the loop lets go of it before the close */
        cr_assert_eq(h->watching[stream], fd);
        cr_assert(fcntl(fd, F_GETFD) >= 0, "watch CLOSE came after the fd was closed");
        h->watching[stream] = -1;
        break;
    }
    logc(h, (char)('0' + stream));
    return 0;
}

static void h_output(struct conch_command *c, int stream, const char *buf, size_t len,
                     uint64_t before)
{
    struct harness *h = c->data;
    (void)buf;
    cr_assert_eq(before, h->out_bytes[stream], "before counts the bytes of earlier calls");
    h->out_bytes[stream] += len;
    if (h->pause_on_output)
        conch_command_pause(c, true);
}

static void h_ended(struct conch_command *c)
{
    struct harness *h = c->data;
    h->ended++;
    logc(h, 'E');
}

static void h_finished(struct conch_command *c)
{
    struct harness *h = c->data;
    h->finished++;
    logc(h, 'F');
}

static void h_signal(struct conch_command *c, int sig)
{
    struct harness *h = c->data;
    if (h->nsignals < 8)
        h->signals[h->nsignals++] = sig;
    if (h->pid > 0)
        kill(h->pid, sig);
}

static const struct conch_command_ops h_ops = {
    .watch = h_watch,
    .output = h_output,
    .ended = h_ended,
    .finished = h_finished,
    .signal = h_signal,
};

static struct conch_command_opts h_opts(size_t max_output, uint64_t max_spill)
{
    return (struct conch_command_opts){
        .max_output = max_output,
        .max_spill = max_spill,
        .spill_dir = dir,
        .stdin_fd = -1,
        .timeout_ms = 5000,
        .grace_ms = 1000,
        .limits = {.memory_bytes = 64 << 20, .pids_max = 32},
    };
}

static void h_init(struct harness *h, const struct conch_command_opts *o)
{
    memset(h, 0, sizeof(*h));
    h->watching[0] = h->watching[1] = -1;
    struct conch_err err = {0};
    cr_assert_eq(conch_command_init(&h->c, o, &h_ops, h, &err), 0, "%s", err.msg);
}

/* Start `sh -c @script` on the driver's stdio, as the supervisor would have. */
static void h_spawn(struct harness *h, const char *script)
{
    struct conch_err err = {0};
    int fds[3];
    cr_assert_eq(conch_command_open(&h->c, fds, &err), 0, "%s", err.msg);
    h->pid = fork();
    cr_assert(h->pid >= 0);
    if (h->pid == 0) {
        for (int i = 0; i < 3; i++)
            dup2(fds[i], i);
        execl("/bin/sh", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 3; i++)
        close(fds[i]);
}

/* The process's end, as the supervisor reports it. */
static void h_report_end(struct harness *h, int status)
{
    struct conch_proc_end end = {.status = status};
    conch_command_process_ended(&h->c, &end);
}

/* Wait for the child; report its end when @report. */
static int h_reap(struct harness *h, bool report)
{
    int status = 0;
    cr_assert_eq(waitpid(h->pid, &status, 0), h->pid);
    h->pid = -1;
    if (report)
        h_report_end(h, status);
    return status;
}

/* One round of a poll loop over the fds the driver names (a loop like conch run's). Returns
 * the number of reads done. */
static int h_poll_once(struct harness *h, int timeout_ms)
{
    struct pollfd pfd[2];
    for (int s = 0; s < 2; s++)
        pfd[s] = (struct pollfd){.fd = conch_command_fd(&h->c, s), .events = POLLIN};
    int n = poll(pfd, 2, timeout_ms);
    cr_assert(n >= 0 || errno == EINTR);
    int reads = 0;
    for (int s = 0; s < 2; s++) {
        if (pfd[s].fd >= 0 && (pfd[s].revents & (POLLIN | POLLHUP | POLLERR))) {
            struct conch_err err = {0};
            cr_assert_eq(conch_command_read(&h->c, s, &err), 0, "%s", err.msg);
            reads++;
        }
    }
    return reads;
}

/* Poll until both streams are closed (the driver closes them at EOF). */
static void h_drain(struct harness *h)
{
    while (conch_command_fd(&h->c, 0) >= 0 || conch_command_fd(&h->c, 1) >= 0)
        h_poll_once(h, 1000);
}

static char *h_text(struct harness *h, int stream)
{
    char *text = NULL;
    cr_assert_eq(conch_output_text(conch_command_output(&h->c, stream), &text, NULL), 0);
    return text;
}

Test(command, eof_then_end_finishes_at_the_end)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    h_spawn(&h, "printf out; printf err >&2; exit 3");
    cr_assert_str_eq(h.log, "R0R1", "both streams watched at open");
    h_drain(&h);
    /* Both streams at EOF, but no end yet: not finished, whatever the pipes say. */
    cr_assert_eq(h.finished, 0);
    cr_assert_not(conch_command_finished(&h.c));
    h_reap(&h, true);
    cr_assert_eq(h.ended, 1);
    cr_assert_eq(h.finished, 1);
    cr_assert(conch_command_finished(&h.c));
    /* watch CLOSE for each stream (in EOF order), then the end, then finished, once */
    cr_assert(!strcmp(h.log, "R0R1C0C1EF") || !strcmp(h.log, "R0R1C1C0EF"), "log %s", h.log);
    _cleanup_free_ char *out = h_text(&h, 0);
    _cleanup_free_ char *err = h_text(&h, 1);
    cr_assert_str_eq(out, "out");
    cr_assert_str_eq(err, "err");
    struct conch_run_result res = {0};
    conch_command_result(&h.c, &res);
    cr_assert_eq(res.exit_code, 3);
    cr_assert_eq(res.error_kind, CONCH_ERR_COMMAND);
    cr_assert_str_eq(res.error_msg, "exited with status 3");
    conch_command_done(&h.c);
}

Test(command, end_before_eof_keeps_every_byte)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    /* 40 KB fit in the pipe: the process exits before a byte is read. */
    h_spawn(&h, "head -c 40000 /dev/zero | tr '\\0' x; printf e >&2");
    h_reap(&h, true);
    cr_assert_eq(h.ended, 1);
    cr_assert_eq(h.finished, 0, "ended, but output is still in the pipes");
    cr_assert_not(conch_command_finished(&h.c));
    h_drain(&h);
    cr_assert_eq(h.finished, 1);
    cr_assert_eq(conch_command_output(&h.c, 0)->total, 40000);
    cr_assert_eq(conch_command_output(&h.c, 1)->total, 1);
    cr_assert_eq(h.out_bytes[0], 40000);
    size_t n = strlen(h.log);
    cr_assert(n >= 2 && h.log[n - 2] >= '0' && h.log[n - 1] == 'F', "log %s", h.log);
    conch_command_done(&h.c);
}

Test(command, a_stream_that_never_ends_holds_the_finish_until_abandoned)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    /* The process exits; a child it left behind keeps stdout open (and quiet). */
    h_spawn(&h, "sleep 30 & echo $!");
    h_reap(&h, true);
    for (int i = 0; i < 5; i++)
        h_poll_once(&h, 20);
    cr_assert_eq(h.ended, 1);
    cr_assert_eq(h.finished, 0, "stdout is still open: not finished");
    cr_assert_geq(conch_command_fd(&h.c, 0), 0);
    conch_command_abandon(&h.c, "the sandbox was destroyed");
    cr_assert_eq(h.finished, 1);
    cr_assert_eq(conch_command_fd(&h.c, 0), -1);
    cr_assert_eq(h.watching[0], -1);
    cr_assert_eq(h.watching[1], -1);
    cr_assert_not(conch_command_end(&h.c)->lost, "a real end is kept, not replaced");
    _cleanup_free_ char *out = h_text(&h, 0);
    pid_t left = atoi(out);
    cr_assert_gt(left, 0, "the output read before is kept: '%s'", out);
    kill(left, SIGKILL);
    conch_command_done(&h.c);
}

Test(command, a_lost_end_closes_the_streams_at_once)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    h_spawn(&h, "exec sleep 30");
    struct conch_proc_end end = {
        .status = SIGKILL, .lost = true, .why = "the sandbox's warden died"};
    conch_command_process_ended(&h.c, &end);
    cr_assert_eq(h.finished, 1, "nothing more will be written that anyone waits for");
    cr_assert_str_eq(h.log, "R0R1EC0C1F");
    cr_assert_str_eq(conch_command_end(&h.c)->why, "the sandbox's warden died");
    /* A second end (a late report) changes nothing. */
    struct conch_proc_end late = {.status = 0};
    conch_command_process_ended(&h.c, &late);
    cr_assert(conch_command_end(&h.c)->lost);
    cr_assert_eq(h.finished, 1);
    kill(h.pid, SIGKILL);
    h_reap(&h, false);
    conch_command_done(&h.c);
}

Test(command, abandon_before_any_end_reports_it_lost)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    h_spawn(&h, "exec sleep 30");
    conch_command_abandon(&h.c, "the sandbox was destroyed");
    cr_assert_eq(h.ended, 1);
    cr_assert_eq(h.finished, 1);
    const struct conch_proc_end *end = conch_command_end(&h.c);
    cr_assert(end->lost);
    cr_assert_str_eq(end->why, "the sandbox was destroyed");
    cr_assert(WIFSIGNALED(end->status) && WTERMSIG(end->status) == SIGKILL);
    kill(h.pid, SIGKILL);
    h_reap(&h, false);
    conch_command_done(&h.c);
}

Test(command, output_past_memory_goes_to_the_spill_file)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1000, 1 << 20);
    h_init(&h, &o);
    h_spawn(&h, "i=0; while [ $i -lt 500 ]; do printf '%04d\\n' $i; i=$((i+1)); done");
    h_drain(&h);
    h_reap(&h, true);
    cr_assert_eq(h.finished, 1);
    const struct conch_output *out = conch_command_output(&h.c, 0);
    cr_assert_eq(out->total, 2500);
    cr_assert(conch_output_truncated(out));
    cr_assert_eq(out->spill_fd, -1, "a finished command holds no spill fd");
    struct stat st;
    cr_assert_eq(stat(out->spill_path, &st), 0, "the spill file stays");
    cr_assert_eq(st.st_size, 2500, "the spill file holds the whole stream");
    _cleanup_free_ char *text = h_text(&h, 0);
    cr_assert(!strncmp(text, "0000\n0001\n", 10));
    cr_assert_not_null(strstr(text, "1500 bytes omitted; full output in"));
    cr_assert(strstr(text, "0499\n") && text[strlen(text) - 1] == '\n');
    struct conch_run_result res = {0};
    conch_command_result(&h.c, &res);
    cr_assert_eq(res.exit_code, 0);
    cr_assert_eq(res.error_kind, CONCH_ERR_NONE);
    cr_assert_eq(h.nsignals, 0);
    conch_command_done(&h.c);
}

Test(command, an_endless_stream_is_killed_at_the_spill_cap)
{
    struct harness h;
    struct conch_command_opts o = h_opts(4096, 256 << 10);
    h_init(&h, &o);
    h_spawn(&h, "exec yes conch");
    /* Read until the driver kills it, then until EOF: a flood stops, it does not fill the
     * disk. */
    h_drain(&h);
    int status = h_reap(&h, true);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    cr_assert_eq(h.nsignals, 1, "killed once");
    cr_assert_eq(h.signals[0], SIGKILL);
    cr_assert_eq(h.finished, 1);
    const struct conch_output *out = conch_command_output(&h.c, 0);
    cr_assert(out->spill_full);
    cr_assert_eq(out->spilled, 256 << 10);
    cr_assert_gt(out->total, 256 << 10);
    struct conch_run_result res = {0};
    conch_command_result(&h.c, &res);
    cr_assert_eq(res.exit_code, 137);
    cr_assert_eq(res.signal, SIGKILL);
    cr_assert_eq(res.error_kind, CONCH_ERR_LIMIT);
    cr_assert_str_eq(res.error_msg,
                     "output limit: more than 262144 bytes on one stream; the command was killed");
    conch_command_done(&h.c);
}

Test(command, memory_is_charged_to_the_budget_and_spills_early)
{
    struct conch_budget budget;
    conch_budget_init(&budget, "output", 16 << 10, NULL);
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    o.budget = &budget;
    o.spill_shown_dir = "/run/conch/output";
    h_init(&h, &o);
    h_spawn(&h, "head -c 100000 /dev/zero");
    h_drain(&h);
    h_reap(&h, true);
    const struct conch_output *out = conch_command_output(&h.c, 0);
    cr_assert_eq(out->total, 100000);
    cr_assert(conch_output_truncated(out), "the budget let it keep less than max_output");
    cr_assert_leq(conch_budget_held(&budget), 16 << 10);
    cr_assert_eq(out->spilled, 100000);
    char shown[600];
    conch_output_spill_shown(out, shown, sizeof(shown));
    cr_assert(!strncmp(shown, "/run/conch/output/conch-stdout-", 31), "%s", shown);
    conch_command_done(&h.c);
    cr_assert_eq(conch_budget_held(&budget), 0, "done gives the budget back");
}

Test(command, pause_stops_reading_until_resumed)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    h_spawn(&h, "printf a; sleep 0.2; printf b");
    conch_command_pause(&h.c, true);
    cr_assert(h.paused[0] && h.paused[1]);
    cr_assert_eq(conch_command_fd(&h.c, 0), -1, "a paused command names no fd to poll");
    cr_assert_eq(h_poll_once(&h, 100), 0);
    h_reap(&h, true);
    cr_assert_eq(h.finished, 0, "the output was not read: not finished");
    conch_command_pause(&h.c, false);
    cr_assert_not(h.paused[0] || h.paused[1]);
    h_drain(&h);
    cr_assert_eq(h.finished, 1);
    _cleanup_free_ char *out = h_text(&h, 0);
    cr_assert_str_eq(out, "ab");
    conch_command_done(&h.c);
}

Test(command, a_read_takes_what_the_pipe_holds_and_stops_when_paused)
{
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    h_init(&h, &o);
    h_spawn(&h, "head -c 10000000 /dev/zero");
    /* The pipe is full (64 KiB) and the writer waits: one call reads until the pipe is
     * empty, not one read per wakeup. */
    struct pollfd p = {.fd = conch_command_fd(&h.c, 0), .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 5000), 1);
    usleep(100 * 1000);
    struct conch_err err = {0};
    cr_assert_eq(conch_command_read(&h.c, 0, &err), 0);
    cr_assert_geq(h.out_bytes[0], 65536);
    cr_assert_leq(h.out_bytes[0], 2 << 20, "at most 2 MiB per call: one stream cannot hold a loop");
    /* Paused from the output callback: that call reads no further. */
    h.pause_on_output = true;
    uint64_t before = h.out_bytes[0];
    usleep(100 * 1000);
    cr_assert_eq(conch_command_read(&h.c, 0, &err), 0);
    cr_assert_leq(h.out_bytes[0] - before, 65536, "one read, then paused");
    cr_assert(h.paused[0]);
    h.pause_on_output = false;
    conch_command_pause(&h.c, false);
    h_drain(&h);
    h_reap(&h, true);
    cr_assert_eq(h.finished, 1);
    cr_assert_eq(conch_command_output(&h.c, 0)->total, 10000000);
    conch_command_done(&h.c);
}

Test(command, stdin_from_bytes_from_an_fd_or_nothing)
{
    /* bytes: a memfd, any amount */
    struct harness h;
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    static char big[300000];
    memset(big, 'z', sizeof(big));
    o.stdin_data = big;
    o.stdin_len = sizeof(big);
    h_init(&h, &o);
    h_spawn(&h, "wc -c");
    h_drain(&h);
    h_reap(&h, true);
    _cleanup_free_ char *n1 = h_text(&h, 0);
    cr_assert_eq(atoi(n1), 300000);
    conch_command_done(&h.c);

    /* a caller's fd, dup'd: the caller keeps its own */
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(write(p[1], "hello", 5), 5);
    close(p[1]);
    o = h_opts(1 << 20, 1 << 20);
    o.stdin_fd = p[0];
    h_init(&h, &o);
    h_spawn(&h, "cat");
    h_drain(&h);
    h_reap(&h, true);
    _cleanup_free_ char *n2 = h_text(&h, 0);
    cr_assert_str_eq(n2, "hello");
    cr_assert(fcntl(p[0], F_GETFD) >= 0, "the caller's fd stays open");
    close(p[0]);
    conch_command_done(&h.c);

    /* a closed fd, or none: /dev/null */
    o = h_opts(1 << 20, 1 << 20);
    o.stdin_fd = 987;
    h_init(&h, &o);
    h_spawn(&h, "wc -c");
    h_drain(&h);
    h_reap(&h, true);
    _cleanup_free_ char *n3 = h_text(&h, 0);
    cr_assert_eq(atoi(n3), 0);
    conch_command_done(&h.c);
}

/* A command that ran nothing (no stdio opened): the end alone finishes it. */
static void classify(struct conch_command_opts *o, const struct conch_proc_end *end,
                     void (*before)(struct conch_command *), struct conch_run_result *res)
{
    struct harness h;
    h_init(&h, o);
    if (before)
        before(&h.c);
    conch_command_process_ended(&h.c, end);
    cr_assert_eq(h.finished, 1);
    memset(res, 0, sizeof(*res));
    conch_command_result(&h.c, res);
    conch_command_done(&h.c);
}

static void hit_memory(struct conch_command *c)
{
    conch_command_limit_hit(c, CONCH_LIMIT_MEMORY);
    conch_command_limit_hit(c, CONCH_LIMIT_MEMORY);
    struct harness *h = c->data;
    cr_assert_eq(h->nsignals, 1, "a memory hog is killed once");
    cr_assert_eq(h->signals[0], SIGKILL);
}

static void hit_pids(struct conch_command *c)
{
    conch_command_limit_hit(c, CONCH_LIMIT_PIDS);
    struct harness *h = c->data;
    cr_assert_eq(h->nsignals, 0, "the process limit is only noted");
}

static void hit_disk(struct conch_command *c)
{
    conch_command_disk_full(c, "/tmp (1 MiB, --tmp-size)");
}

Test(command, classification)
{
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    struct conch_run_result res;

    struct conch_proc_end ok = {.status = 0};
    classify(&o, &ok, NULL, &res);
    cr_assert_eq(res.exit_code, 0);
    cr_assert_eq(res.error_kind, CONCH_ERR_NONE);

    struct conch_proc_end term = {.status = SIGTERM};
    classify(&o, &term, NULL, &res);
    cr_assert_eq(res.exit_code, 143);
    cr_assert_eq(res.signal, SIGTERM);
    cr_assert_eq(res.error_kind, CONCH_ERR_COMMAND);

    struct conch_proc_end late = {.status = SIGKILL, .timed_out = true};
    classify(&o, &late, NULL, &res);
    cr_assert_eq(res.exit_code, CONCH_RUN_EXIT_TIMEOUT);
    cr_assert(res.timed_out);
    cr_assert_eq(res.error_kind, CONCH_ERR_TIMEOUT);
    cr_assert_str_eq(res.error_msg,
                     "timed out after 5 s (SIGTERM to every process, SIGKILL after 1 s)");

    struct conch_proc_end nf = {
        .start_failed = true,
        .err = {.code = ENOENT, .kind = CONCH_ERR_COMMAND, .msg = "'nope': command not found"}};
    classify(&o, &nf, NULL, &res);
    cr_assert_eq(res.exit_code, 127);
    cr_assert_eq(res.error_kind, CONCH_ERR_COMMAND);
    cr_assert_str_eq(res.error_msg, "'nope': command not found");

    /* Memory sampled (no cgroup): killed, reported before the timeout it may cause too. */
    struct conch_proc_end killed = {.status = SIGKILL, .timed_out = true};
    classify(&o, &killed, hit_memory, &res);
    cr_assert_eq(res.error_kind, CONCH_ERR_LIMIT);
    cr_assert_str_eq(res.error_msg, "memory limit: killed for using more than 67108864 bytes "
                                    "(resident memory, sampled: no cgroup)");

    /* The process limit explains a failure, not a success. */
    struct conch_proc_end failed = {.status = 1 << 8};
    classify(&o, &failed, hit_pids, &res);
    cr_assert_eq(res.error_kind, CONCH_ERR_LIMIT);
    cr_assert_str_eq(res.error_msg, "process limit: hit the limit of 32 processes");
    classify(&o, &ok, hit_pids, &res);
    cr_assert_eq(res.error_kind, CONCH_ERR_NONE);

    struct conch_proc_end xfsz = {.status = SIGXFSZ};
    classify(&o, &xfsz, hit_disk, &res);
    cr_assert_eq(res.error_kind, CONCH_ERR_LIMIT);
    cr_assert_str_eq(res.error_msg, "disk limit: /tmp (1 MiB, --tmp-size) is full");
}

Test(command, a_spill_dir_too_long_fails_init_safely)
{
    char longdir[400];
    memset(longdir, 'a', sizeof(longdir) - 1);
    longdir[0] = '/';
    longdir[sizeof(longdir) - 1] = '\0';
    struct conch_command_opts o = h_opts(1 << 20, 1 << 20);
    o.spill_dir = longdir;
    struct conch_command c;
    struct conch_err err = {0};
    cr_assert_lt(conch_command_init(&c, &o, &h_ops, NULL, &err), 0);
    cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    conch_command_done(&c);
    conch_command_done(&c);
}
