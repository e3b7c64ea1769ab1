/* commands.c - exec.run (one command, answered when it ends) and jobs (background commands
 * read incrementally): the libuv adapter of the command driver (exec/command.h: pipes,
 * captures, limits, classification), the results, the notifications, the job table. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "exec/command.h"
#include "exec/result.h"
#include "exec/run.h"

#define MAX_JOBS 4096

static const struct conch_command_ops run_command_ops;

/* A forgotten job's spill files go with it (the run has finished: their fds are closed). */
static void unlink_spill(const struct conch_output *o)
{
    if (o->spill_path[0])
        unlink(o->spill_path);
}

static void run_free(struct run *r)
{
    conch_daemon_client_sink_wait_cancel(&r->drain);
    conch_command_done(&r->cmd);
    free(r->command);
    conch_bridge_report_done(&r->tools);
    json_decref(r->request_id);
    json_decref(r->stores);
    if (r->notify)
        conch_rpc_sink_unref(r->notify);
    free(r);
}

/* Free @r once nothing needs it: finished, not a job that stays listed, no libuv handle
 * open, no change scan under way, no answer being built and not being forgotten. Every entry
 * point that may end a run calls it last. */
static void run_maybe_free(struct run *r)
{
    if (r->finished && !r->is_job && r->handles == 0 && !r->scanning && !r->answering &&
        !r->forgetting && !r->syncing)
        run_free(r);
}

static void on_run_handle_closed(uv_handle_t *h)
{
    struct run *r = h->data;
    r->handles--;
    run_maybe_free(r);
}

/* A finished job's record is no longer wanted: free it (now, or when its handles close). */
static void run_free_job(struct run *r)
{
    conch_list_del(&r->link);
    conch_list_del(&r->dlink);
    r->is_job = false;
    r->finished = true;
    run_maybe_free(r);
}

/* A pipe of @r's command is readable (or hung up: libuv reports that as readable). The
 * driver reads it; @r may be freed when it returns (ops->finished). */
static void on_poll(uv_poll_t *h, int status, int events)
{
    struct run *r = h->data;
    (void)status;
    (void)events;
    int stream = h == &r->polls[CONCH_COMMAND_STDERR] ? CONCH_COMMAND_STDERR : CONCH_COMMAND_STDOUT;
    struct conch_err err = {0};
    /* A spill file that cannot be written is said in the result's text; the command goes on. */
    (void)conch_command_read(&r->cmd, stream, &err);
}

/* The driver's ops->watch: a uv_poll per pipe, made at the first READ, closed at CLOSE (before
 * the driver closes the fd, as libuv requires). */
static int run_watch(struct conch_command *c, int stream, int fd, enum conch_command_watch what)
{
    struct run *r = c->data;
    uv_poll_t *h = &r->polls[stream];
    unsigned bit = 1u << stream;
    if (what == CONCH_COMMAND_WATCH_READ) {
        bool made = false;
        if (!(r->polls_open & bit)) {
            int e = uv_poll_init(&r->sb->d->loop, h, fd);
            if (e < 0)
                return e;
            h->data = r;
            r->polls_open |= bit;
            r->handles++;
            made = true;
        }
        int e = uv_poll_start(h, UV_READABLE, on_poll);
        if (e < 0 && made) {
            r->polls_open &= ~bit;
            uv_close((uv_handle_t *)h, on_run_handle_closed);
        }
        return e;
    }
    if (!(r->polls_open & bit))
        return 0;
    uv_poll_stop(h);
    if (what == CONCH_COMMAND_WATCH_CLOSE) {
        r->polls_open &= ~bit;
        uv_close((uv_handle_t *)h, on_run_handle_closed);
    }
    return 0;
}

static void stream_notify(struct run *r, const char *stream, const char *buf, size_t len)
{
    if (!r->stream || !r->notify)
        return;
    json_t *data = conch_json_text(buf, len);
    json_t *params =
        json_pack("{s:O,s:s,s:o}", "request_id", r->request_id, "stream", stream, "data", data);
    conch_daemon_client_notify(r->notify, "exec.output", params);
}

/* The driver's ops->output: stream it to the client (exec.run "stream"). */
static void run_output(struct conch_command *c, int stream, const char *buf, size_t len,
                       uint64_t before)
{
    struct run *r = c->data;
    (void)before;
    stream_notify(r, stream == CONCH_COMMAND_STDERR ? "stderr" : "stdout", buf, len);
    /* A client that does not read its streamed output: stop reading the command's pipes
     * until it drains; the command then blocks on its writes (backpressure, not memory). */
    if (r->stream && r->notify && conch_daemon_client_sink_congested(r->notify) &&
        conch_daemon_client_sink_wait_drain(r->notify, &r->drain))
        conch_command_pause(c, true);
}

/* The client drained: read the command's output again. */
static void run_drained(struct sink_waiter *w)
{
    struct run *r = conch_list_entry(w, struct run, drain);
    conch_command_pause(&r->cmd, false);
}

/* The extra environment: the sandbox's, then the request's, as "K=V" strings. */
static char **env_strings(json_t *a, json_t *b)
{
    size_t n = json_object_size(a) + json_object_size(b);
    char **v = calloc(n + 1, sizeof(char *));
    if (!v)
        return NULL;
    size_t i = 0;
    json_t *objs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        const char *key;
        json_t *val;
        json_object_foreach(objs[k], key, val)
        {
            if (!json_is_string(val))
                continue;
            if (asprintf(&v[i], "%s=%s", key, json_string_value(val)) < 0)
                v[i] = NULL;
            else
                i++;
        }
    }
    return v;
}

static void free_strings(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

/* Start @command in @sb. Returns the run (registered in sb->runs) or NULL with @err. */
static struct run *run_start(struct sandbox *sb, const char *command, json_t *params, bool is_job,
                             struct conch_err *err)
{
    struct daemon *d = sb->d;
    struct run *r = calloc(1, sizeof(*r));
    if (!r) {
        conch_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    r->sb = sb;
    r->is_job = is_job;
    r->drain.cb = run_drained;
    CONCH_LIST_INIT(&r->waiters);
    CONCH_LIST_INIT(&r->dlink);
    long long max_output = conch_rpc_int(params, "max_output", 1 << 20); /* ranged by the table */
    double timeout = conch_rpc_num(params, "timeout", is_job ? 0 : 120);
    double grace = conch_rpc_num(params, "grace", 2);
    size_t stdin_len = 0;
    const char *stdin_data = conch_rpc_strn(params, "stdin", &stdin_len);
    /* exec.run's "shell": "sh" runs /bin/sh as deepagents' LocalShellBackend does. */
    r->shell = strcmp(conch_rpc_str(params, "shell", "bash"), "sh") ? "/bin/bash" : "/bin/sh";
    struct conch_command_opts copts = {
        .shell = r->shell,
        /* Jobs keep every byte in their spill files (read back by offset); commands keep the
         * head and tail in memory. */
        .max_output = is_job ? 0 : (size_t)max_output,
        .max_spill = 256ULL << 20,
        .spill_dir = conch_daemon_sandbox_spill_dir(sb),
        /* A sandbox's spill files are read through fs.* at /run/conch/output (files.c); a
         * fresh sandbox's outlive it and keep their host path. */
        .spill_shown_dir = !sb->fresh && !sandbox_in_pool(sb) ? CONCH_SPILL_SHOWN_DIR : NULL,
        /* What every command keeps in memory counts against one budget: past it, output
         * goes to the spill files early instead of growing the daemon. */
        .budget = &d->output_budget,
        .stdin_fd = -1,
        .stdin_data = stdin_data,
        .stdin_len = stdin_len,
        .timeout_ms = timeout > 0 ? (uint64_t)(timeout * 1000) : 0,
        .grace_ms = grace >= 0 ? (uint64_t)(grace * 1000) : 2000,
        .limits = sb->limits,
    };
    if (conch_command_init(&r->cmd, &copts, &run_command_ops, r, err) < 0 ||
        !(r->command = strdup(command))) {
        if (!err->code)
            conch_err_set(err, ENOMEM, "out of memory");
        run_free(r);
        return NULL;
    }
    if (!is_job)
        conch_daemon_make_id(d, "exec", r->origin_id, sizeof(r->origin_id));

    const char *cwd_param = conch_rpc_str(params, "cwd", NULL);
    char cwd[PATH_MAX + 16] = "/workspace";
    if (cwd_param && cwd_param[0] == '/')
        snprintf(cwd, sizeof(cwd), "%s", cwd_param);
    else if (cwd_param && *cwd_param)
        snprintf(cwd, sizeof(cwd), "/workspace/%s", cwd_param);

    char **extra = env_strings(sb->env, json_object_get(params, "env"));
    char **env =
        extra ? conch_exec_env_build(extra, sb->as_root, sb->net.mode == CONCH_NET_ALLOW, err)
              : NULL;
    free_strings(extra);
    if (!env) {
        if (!err->code)
            conch_err_set(err, ENOMEM, "out of memory");
        run_free(r);
        return NULL;
    }
    char *argv[] = {(char *)r->shell, "-c", (char *)command, NULL};
    struct conch_jail_cmd cmd = {.argv = argv, .envp = env, .cwd = cwd, .last = sb->fresh};
    int rc = conch_command_start(&r->cmd, &sb->super, &cmd, err);
    conch_exec_env_free(env);
    if (rc < 0) {
        /* Its pipes' handles may be closing: freed once they are. */
        r->is_job = false;
        r->finished = true;
        run_maybe_free(r);
        return NULL;
    }
    r->started_at = conch_daemon_now();
    conch_list_add(&sb->runs, &r->link);
    conch_sb_sample_wake(sb);
    sb->commands++;
    conch_daemon_sandbox_touch(sb);
    return r;
}

/* The tool calls and detached sub-agent requests of a command (borrowed, NULL: none), into
 * result @o. */
static void set_tools_json(json_t *o, json_t *calls, json_t *detached)
{
    if (!o)
        return;
    json_object_set_new(o, "tool_calls", calls ? json_incref(calls) : json_array());
    json_object_set_new(o, "detached_agents", detached ? json_incref(detached) : json_array());
}

/* The tool calls of @r and its detached sub-agent requests, into result @o. */
static void run_tools_json(const struct run *r, json_t *o)
{
    set_tools_json(o, r->tools.calls, r->tools.detached);
}

/* Fill @res with what the loop knows of finished @r: its status, limits, usage, the kept
 * output (borrowed from @r: @res is not to be done) and @changes (borrowed too, or NULL). */
static void run_result_fill(struct run *r, struct conch_ws_changes *changes,
                            struct conch_run_result *res)
{
    memset(res, 0, sizeof(*res));
    res->out = *conch_command_output(&r->cmd, CONCH_COMMAND_STDOUT);
    res->err = *conch_command_output(&r->cmd, CONCH_COMMAND_STDERR);
    conch_command_result(&r->cmd, res);
    res->tools_summary = r->tools.summary;
    /* The workspace's changes so far, scanned by a worker (conch_ws_changes_json_set caps
     * what is listed). */
    if (changes) {
        res->changes = *changes;
        res->has_changes = true;
    }
}

/* The result object of @res as exec.run returns it, with the tool calls @calls and @detached
 * (borrowed). Touches nothing of the daemon's: a worker may build it. */
static json_t *run_result_build(const struct conch_run_result *res, json_t *calls, json_t *detached)
{
    json_t *o = conch_run_result_json(res, NULL);
    char *text = conch_run_result_text(res);
    if (o && text)
        json_object_set_new(o, "text", conch_json_text(text, strlen(text)));
    free(text);
    json_object_del(o, "committed");
    set_tools_json(o, calls, detached);
    return o;
}

/* The result of a finished command, as exec.run returns it. */
static json_t *run_result(struct run *r, struct conch_ws_changes *changes)
{
    struct conch_run_result res;
    run_result_fill(r, changes, &res);
    json_t *o = run_result_build(&res, r->tools.calls, r->tools.detached);
    conch_daemon_net_result(r->sb, r->started_at, o);
    if (o && r->stores)
        json_object_set(o, "stores", r->stores);
    return o;
}

/* A job that never ran: its shell is missing or not executable (the sandbox's fault, as in
 * conch_run_result_end: 125), or the caller's request could not start (a working directory
 * that does not exist: 127; arguments too long: 126). */
static int job_start_failed_code(const struct conch_proc_end *end)
{
    int code = end->err.code;
    if (end->err.kind == CONCH_ERR_COMMAND &&
        (code == ENOENT || code == EACCES || code == ENOEXEC || code == ELIBBAD))
        return CONCH_RUN_EXIT_INFRA;
    return code == ENOENT ? 127 : 126;
}

static void job_record_exit(struct run *r)
{
    const struct conch_proc_end *end = conch_command_end(&r->cmd);
    int sig = 0;
    int code = end->start_failed ? job_start_failed_code(end) : conch_exit_code(end->status, &sig);
    struct conch_state_job rec;
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.id, sizeof(rec.id), "%s", r->job_id);
    snprintf(rec.sandbox_id, sizeof(rec.sandbox_id), "%s", r->sb->id);
    rec.command = r->command;
    rec.exit_code = code;
    rec.signal = sig;
    rec.started_at = r->started_at;
    rec.ended_at = conch_daemon_now();
    snprintf(rec.stdout_spill, sizeof(rec.stdout_spill), "%s",
             conch_command_output(&r->cmd, CONCH_COMMAND_STDOUT)->spill_path);
    snprintf(rec.stderr_spill, sizeof(rec.stderr_spill), "%s",
             conch_command_output(&r->cmd, CONCH_COMMAND_STDERR)->spill_path);
    conch_state_job_put(r->sb->d->state, &rec, NULL);
}

json_t *conch_daemon_job_status_json(struct run *r)
{
    if (!r->finished)
        return json_pack("{s:b,s:n,s:n}", "running", 1, "exit_code", "signal");
    const struct conch_proc_end *end = conch_command_end(&r->cmd);
    json_t *o;
    if (end->start_failed) {
        o = json_pack("{s:b,s:i,s:n}", "running", 0, "exit_code", job_start_failed_code(end),
                      "signal");
    } else {
        int sig;
        int code = conch_exit_code(end->status, &sig);
        o = json_pack("{s:b,s:i,s:o}", "running", 0, "exit_code", code, "signal",
                      sig ? json_integer(sig) : json_null());
    }
    /* Ended without its own report (the warden died, the sandbox was stopped): say why. */
    if (o && end->lost && end->why)
        json_object_set_new(o, "lost", json_string(end->why));
    run_tools_json(r, o);
    if (o && r->stores)
        json_object_set(o, "stores", r->stores);
    if (o && r->tools.summary)
        json_object_set_new(o, "tools_summary", json_string(r->tools.summary));
    return o;
}

static void waiter_closed(uv_handle_t *h)
{
    free(h->data);
}

static void waiter_finish(struct job_wait *w)
{
    conch_list_del(&w->link);
    conch_rpc_call_reply(w->call, conch_daemon_job_status_json(w->job));
    uv_timer_stop(&w->timer);
    w->timer.data = w;
    uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

/* The most finished jobs the daemon keeps listed: past it the oldest is forgotten. */
#define MAX_DONE_JOBS 1024

/* Forget the oldest finished jobs past MAX_DONE_JOBS, but never @keep (the job that just
 * finished: its caller still holds it). */
static void forget_old_jobs(struct daemon *d, struct run *keep)
{
    unsigned done = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->jobs)
    {
        if (conch_list_entry(pos, struct run, dlink)->finished)
            done++;
    }
    /* d->jobs is in start order, oldest first. */
    conch_list_for_each_safe(pos, tmp, &d->jobs)
    {
        struct run *r = conch_list_entry(pos, struct run, dlink);
        if (done <= MAX_DONE_JOBS)
            break;
        if (!r->finished || r == keep)
            continue;
        conch_state_job_delete(d->state, r->job_id, NULL);
        unlink_spill(conch_command_output(&r->cmd, CONCH_COMMAND_STDOUT));
        unlink_spill(conch_command_output(&r->cmd, CONCH_COMMAND_STDERR));
        run_free_job(r);
        done--;
    }
}

/* A result that keeps more output than this is built and serialised by a worker: repairing
 * the UTF-8 of 8 MiB, its text form and its JSON encoding take ~0.15 s (~0.5 s under ASan),
 * which every other client would wait for on the loop. Below it the threadpool's round trip
 * would cost a short command more than it saves. */
#define ANSWER_ON_LOOP_MAX (64u << 10)

/* What building a result holds at its peak, for each byte of output it keeps: the output's
 * repaired copy, its JSON string, and the serialised text in a buffer grown by doubling. */
#define ANSWER_PEAK_PER_BYTE 4

/* A result being built off the loop. @r is kept (r->answering) until answer_done. */
struct answer_job {
    uv_work_t req;
    struct conch_list link; /* in daemon.answers_waiting, until its build fits the budget */
    size_t charge;          /* held in daemon.answers_building while it is built */
    struct run *r;
    struct conch_run_result res; /* out/err borrowed from @r; changes owned */
    json_t *calls, *detached;    /* copies of @r's: the worker owns them */
    json_t *stores;              /* a copy of @r's, or NULL: the worker's */
    char *text;                  /* the serialised result */
};

/* After the answer is on its way: a short command ends between two samples of the disk, so
 * measure what it left (the worker's wake-up would have delayed the answer); a fresh
 * sandbox goes with its one command. */
static void run_answered(struct run *r)
{
    struct sandbox *sb = r->sb;
    if (sb->state == SB_GONE) /* destroyed while a worker built the answer */
        return;
    conch_daemon_sandbox_measure(sb);
    if (sb->fresh && !sb->super.gone && sb->state == SB_READY)
        conch_daemon_sandbox_retire(sb);
}

static void answer_work(uv_work_t *req)
{
    struct answer_job *a = req->data;
    json_t *o = run_result_build(&a->res, a->calls, a->detached);
    if (o && a->stores)
        json_object_set(o, "stores", a->stores);
    a->text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
}

static void answer_done(uv_work_t *req, int status);

/* Start the builds that wait, in order, while they fit the budget. */
static void answers_start_waiting(struct daemon *d)
{
    while (!conch_list_empty(&d->answers_waiting)) {
        struct answer_job *a = conch_list_entry(d->answers_waiting.next, struct answer_job, link);
        if (!conch_daemon_answer_reserve(d, a->charge))
            return;
        conch_list_del(&a->link);
        if (uv_queue_work(&d->loop, &a->req, answer_work, answer_done) < 0) {
            /* Cannot happen with a live loop; answered as an internal error, not lost. */
            a->text = NULL;
            answer_done(&a->req, UV_ECANCELED);
        }
    }
}

static void answer_done(uv_work_t *req, int status)
{
    struct answer_job *a = req->data;
    struct run *r = a->r;
    struct sandbox *sb = r->sb;
    struct daemon *d = sb->d;
    (void)status;
    /* NULL text (out of memory, or cancelled) is answered as an internal error. Sent before
     * the build's charge goes: the response is charged to its client now. */
    conch_rpc_call_reply_dumped(r->call, a->text);
    r->call = NULL;
    conch_daemon_answer_unreserve(d, a->charge);
    conch_ws_changes_done(&a->res.changes);
    json_decref(a->calls);
    json_decref(a->detached);
    json_decref(a->stores);
    free(a);
    r->answering = false;
    run_answered(r);
    conch_daemon_sandbox_release(sb);
    run_maybe_free(r);
    answers_start_waiting(d);
}

/* Build @r's result, which keeps @kept bytes of output, off the loop (see ANSWER_ON_LOOP_MAX),
 * taking @changes' contents; it waits its turn when the builds under way and the responses
 * unread hold the clients' budget already. Returns false when it could not be queued (the
 * caller answers on the loop). */
static bool run_answer_async(struct run *r, struct conch_ws_changes *changes, size_t kept)
{
    struct daemon *d = r->sb->d;
    struct answer_job *a = calloc(1, sizeof(*a));
    if (!a)
        return false;
    a->r = r;
    a->req.data = a;
    a->charge = kept * ANSWER_PEAK_PER_BYTE;
    run_result_fill(r, changes, &a->res);
    a->calls = r->tools.calls ? json_deep_copy(r->tools.calls) : NULL;
    a->detached = r->tools.detached ? json_deep_copy(r->tools.detached) : NULL;
    a->stores = r->stores ? json_deep_copy(r->stores) : NULL;
    bool queued = !(r->tools.calls && !a->calls) && !(r->tools.detached && !a->detached) &&
                  !(r->stores && !a->stores);
    if (queued && conch_list_empty(&d->answers_waiting) &&
        conch_daemon_answer_reserve(d, a->charge)) {
        queued = uv_queue_work(&d->loop, &a->req, answer_work, answer_done) == 0;
        if (!queued)
            conch_daemon_answer_unreserve(d, a->charge);
    } else if (queued) {
        conch_list_add(&d->answers_waiting, &a->link); /* answers_start_waiting queues it */
    }
    if (!queued) {
        json_decref(a->calls);
        json_decref(a->detached);
        json_decref(a->stores);
        free(a);
        return false;
    }
    /* Queued: the worker owns the list of changes now. */
    if (changes)
        memset(changes, 0, sizeof(*changes));
    r->answering = true;
    conch_daemon_sandbox_hold(r->sb);
    return true;
}

/* Answer @r's exec.run with its result (and @changes, or NULL: their contents may be taken);
 * a fresh sandbox goes with its one command. */
static void run_answer(struct run *r, struct conch_ws_changes *changes)
{
    const struct conch_output *out = conch_command_output(&r->cmd, CONCH_COMMAND_STDOUT);
    const struct conch_output *err = conch_command_output(&r->cmd, CONCH_COMMAND_STDERR);
    size_t kept = out->head_len + out->tail_len + err->head_len + err->tail_len;
    if (kept > ANSWER_ON_LOOP_MAX && run_answer_async(r, changes, kept))
        return;
    conch_rpc_call_reply(r->call, run_result(r, changes));
    r->call = NULL;
    run_answered(r);
}

static void run_changes_done(void *arg, int rc, struct conch_ws_changes *changes,
                             const struct conch_err *err)
{
    struct run *r = arg;
    (void)err;
    r->scanning = false;
    run_answer(r, rc == 0 ? changes : NULL);
    run_maybe_free(r);
}

/* The disk limit as a report names it. */
static void run_disk_what(const struct run *r, char *buf, size_t size)
{
    snprintf(buf, size, "the workspace's room for changes (%llu bytes, disk)",
             (unsigned long long)r->sb->disk_bytes);
}

/* The driver finished @r and its store mounts were written back: record a job's end, or
 * answer an exec.run. */
static void run_finish_rest(struct run *r)
{
    r->finished = true;
    conch_list_del(&r->link);
    struct sandbox *sb = r->sb;
    const struct conch_proc_end *end = conch_command_end(&r->cmd);
    /* A file larger than the disk limit (RLIMIT_FSIZE) is the disk limit too. */
    if (!end->start_failed && WIFSIGNALED(end->status) && WTERMSIG(end->status) == SIGXFSZ) {
        char what[160];
        run_disk_what(r, what, sizeof(what));
        conch_command_disk_full(&r->cmd, what);
    }
    if (r->is_job) {
        /* A short command ends between two samples of the disk: measure what it left. */
        conch_daemon_sandbox_measure(sb);
        job_record_exit(r);
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &r->waiters)
            waiter_finish(conch_list_entry(pos, struct job_wait, link));
        json_t *st = conch_daemon_job_status_json(r);
        json_object_set_new(st, "job_id", json_string(r->job_id));
        json_object_set_new(st, "sandbox", json_string(sb->id));
        json_object_del(st, "running");
        conch_daemon_client_notify(r->notify, "job.exited", st);
        /* A finished job stays listed (its output readable) until its sandbox goes; it no
         * longer keeps the sandbox busy. */
        conch_list_add(&sb->done_jobs, &r->link);
        forget_old_jobs(sb->d, r);
        return;
    }
    if (!r->call) {
        conch_daemon_sandbox_measure(sb);
        return;
    }
    if (end->lost && sb->super.gone) {
        conch_rpc_call_failf(r->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "the command was stopped: %s", end->why);
        r->call = NULL;
        return;
    }
    if (r->no_changes) {
        run_answer(r, NULL);
        return;
    }
    /* The result lists the workspace's changes: scanning them costs the size of the upper
     * dir (seconds for 300,000 files), so a worker does it and run_answer replies. */
    if (sb->upper_dir[0] && !sb->super.gone && conch_daemon_sandbox_changes_none(sb)) {
        struct conch_ws_changes none = {0};
        run_answer(r, &none);
        return;
    }
    if (sb->upper_dir[0] && !sb->super.gone &&
        conch_daemon_sandbox_changes_async(sb, run_changes_done, r) == 0) {
        r->scanning = true;
        return;
    }
    run_answer(r, NULL);
}

static void run_synced(void *arg, json_t *report)
{
    struct run *r = arg;
    r->syncing = false;
    json_decref(r->stores);
    r->stores = report;
    if (r->orphaned) { /* its sandbox went meanwhile (conch_daemon_run_forget) */
        if (r->call)
            conch_rpc_call_failf(r->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                                 "the sandbox was destroyed");
        r->call = NULL;
        r->finished = true;
        run_maybe_free(r);
        return;
    }
    run_finish_rest(r);
    run_maybe_free(r);
}

/* The driver finished @r (its end came, its pipes are closed): its store mounts are written
 * back first (in a worker; it stays in its sandbox's runs, busy, meanwhile), so that its
 * result, and whatever its caller does next, sees the store as the command left it. */
static void run_finish(struct run *r)
{
    if (!r->forgetting && conch_daemon_stores_sync(r->sb, run_synced, r) == 0) {
        r->syncing = true;
        return;
    }
    run_finish_rest(r);
}

void conch_daemon_run_forget(struct run *r)
{
    /* The driver closes the pipes and, if no end came, ends it as lost: its callbacks run
     * now, but @r is freed below, once. */
    r->forgetting = true;
    conch_command_abandon(&r->cmd, "the sandbox was destroyed");
    r->forgetting = false;
    if (r->syncing) { /* run_synced finishes it */
        r->orphaned = true;
        conch_list_del(&r->link);
        if (r->is_job)
            conch_list_del(&r->dlink);
        r->is_job = false;
        return;
    }
    if (r->is_job)
        run_free_job(r);
    else
        run_maybe_free(r);
}

static const char *run_origin_kind(const struct run *r)
{
    return r->is_job ? "job" : "exec";
}

static const char *run_origin_id(const struct run *r)
{
    return r->is_job ? r->job_id : r->origin_id;
}

/* The command runs: tool calls from its pid namespace are its own. */
static void run_started(struct conch_command *c, pid_t pid, uint64_t pidns_ino)
{
    struct run *r = c->data;
    (void)pid;
    if (r->sb->bridge && conch_bridge_origin_begin(r->sb->bridge, run_origin_kind(r),
                                                   run_origin_id(r), pidns_ino) < 0)
        log_warn("sandbox %s: out of memory tracing tool calls", r->sb->id);
}

/* Its final event (exactly once): its calls still pending are cancelled; what it called goes
 * into its result. */
static void run_ended(struct conch_command *c)
{
    struct run *r = c->data;
    if (r->sb->bridge)
        conch_bridge_origin_end(r->sb->bridge, run_origin_kind(r), run_origin_id(r), &r->tools);
}

static void run_finished(struct conch_command *c)
{
    struct run *r = c->data;
    run_finish(r);
    run_maybe_free(r);
}

static const struct conch_command_ops run_command_ops = {
    .watch = run_watch,
    .output = run_output,
    .started = run_started,
    .ended = run_ended,
    .finished = run_finished,
};

void conch_daemon_run_limit_hit(struct run *r, unsigned limits)
{
    if (!r->finished)
        conch_command_limit_hit(&r->cmd, limits);
}

void conch_daemon_run_disk_full(struct run *r)
{
    if (r->finished)
        return;
    char what[160];
    run_disk_what(r, what, sizeof(what));
    conch_command_disk_full(&r->cmd, what);
}

/* Checks of exec.run / job.start params beyond their JSON types. Returns false after
 * failing @call. */
static bool command_params_ok(struct conch_rpc_call *call, json_t *params)
{
    size_t len = 0;
    const char *cmd = conch_rpc_strn(params, "command", &len);
    if (cmd && strlen(cmd) != len) {
        conch_rpc_call_fail_param(call, "command", "command contains a NUL byte");
        return false;
    }
    const char *cwd = conch_rpc_strn(params, "cwd", &len);
    if (cwd && strlen(cwd) != len) {
        conch_rpc_call_fail(call, CONCH_RPC_INVALID_PATH, "invalid_path", "cwd contains a NUL byte",
                            json_pack("{s:s}", "param", "cwd"));
        return false;
    }
    static const char *const nonneg[] = {"timeout", "grace", "max_output"};
    for (size_t i = 0; i < ARRAY_SIZE(nonneg); i++) {
        json_t *v = json_object_get(params, nonneg[i]);
        if (v && json_number_value(v) < 0) {
            conch_rpc_call_fail_param(call, nonneg[i], "%s must not be negative", nonneg[i]);
            return false;
        }
    }
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(params, "env"), k, v)
    {
        if (!json_is_string(v) || !*k || strchr(k, '=') ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            conch_rpc_call_fail_param(call, "env",
                                      "env must map names (no '=') to strings without NUL bytes");
            return false;
        }
    }
    return true;
}

void conch_daemon_handle_exec_run(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    struct conch_err err = {0};
    struct sandbox *sb = NULL;
    if (!command_params_ok(call, params))
        return;
    const char *shell = conch_rpc_str(params, "shell", "bash");
    if (strcmp(shell, "bash") && strcmp(shell, "sh")) {
        conch_rpc_call_fail_param(call, "shell", "shell must be \"bash\" or \"sh\"");
        return;
    }
    const char *id = conch_rpc_str(params, "sandbox", NULL);
    if (conch_rpc_bool(params, "fresh", false)) {
        if (id) {
            conch_rpc_call_fail_param(call, "fresh", "give either sandbox or fresh, not both");
            return;
        }
        struct sandbox_spec spec;
        json_t *sp = json_pack("{s:O?,s:O?}", "workspace", json_object_get(params, "workspace"),
                               "mode", json_object_get(params, "mode"));
        bool ok = conch_daemon_spec_from_params(call, sp, &spec);
        if (ok && !spec.workspace && !spec.mounts && (sb = conch_daemon_pool_take(c->d)))
            sb->from_pool = true;
        int rc = ok && !sb ? conch_daemon_sandbox_create(c->d, &spec, &sb, &err) : 0;
        if (ok)
            conch_net_policy_done(&spec.net);
        if (rc < 0) {
            json_decref(sp);
            conch_rpc_call_fail_err(call, 0, NULL, &err);
            return;
        }
        json_decref(sp);
        if (!ok)
            return;
        sb->fresh = true;
    } else {
        if (!id) {
            conch_rpc_call_fail_param(call, "sandbox", "sandbox is required (or fresh: true)");
            return;
        }
        if (!(sb = conch_daemon_sandbox_find_running(c->d, call, id)))
            return;
    }
    if (!sb->fresh && conch_daemon_sandbox_disk_refuse(sb, call))
        return;
    struct run *r = run_start(sb, conch_rpc_str(params, "command", ""), params, false, &err);
    if (!r) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        if (sb->fresh)
            conch_daemon_sandbox_destroy(sb);
        return;
    }
    r->call = call;
    r->stream = conch_rpc_bool(params, "stream", false);
    r->no_changes = !conch_rpc_bool(params, "changes", true);
    r->request_id = json_incref(conch_rpc_call_id(call));
    if (r->stream && c->sink)
        r->notify = conch_rpc_sink_ref(c->sink);
}

void conch_daemon_handle_job_start(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    if (!command_params_ok(call, params))
        return;
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return;
    unsigned n = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->jobs) n++;
    if (n >= MAX_JOBS) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "too many jobs (%d): destroy old sandboxes", MAX_JOBS);
        return;
    }
    if (conch_daemon_sandbox_disk_refuse(sb, call))
        return;
    struct conch_err err = {0};
    struct run *r = run_start(sb, conch_rpc_str(params, "command", ""), params, true, &err);
    if (!r) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    conch_daemon_make_id(c->d, "job", r->job_id, sizeof(r->job_id));
    conch_list_add(&c->d->jobs, &r->dlink);
    if (c->sink)
        r->notify = conch_rpc_sink_ref(c->sink);
    struct conch_state_job rec;
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.id, sizeof(rec.id), "%s", r->job_id);
    snprintf(rec.sandbox_id, sizeof(rec.sandbox_id), "%s", sb->id);
    rec.command = r->command;
    rec.running = true;
    rec.exit_code = -1;
    rec.started_at = r->started_at;
    conch_state_job_put(c->d->state, &rec, NULL);
    conch_rpc_call_reply(call, json_pack("{s:s}", "job_id", r->job_id));
}

static void on_wait_timeout(uv_timer_t *t)
{
    waiter_finish(t->data);
}

void conch_daemon_handle_job_wait(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    struct run *r = conch_daemon_job_find(c->d, call, params);
    if (!r)
        return;
    double timeout = conch_rpc_num(params, "timeout", 30);
    if (r->finished || timeout <= 0) {
        conch_rpc_call_reply(call, conch_daemon_job_status_json(r));
        return;
    }
    struct job_wait *w = calloc(1, sizeof(*w));
    if (!w) {
        conch_rpc_call_fail(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", "out of memory",
                            NULL);
        return;
    }
    w->job = r;
    w->call = call;
    uv_timer_init(&c->d->loop, &w->timer);
    w->timer.data = w;
    uv_timer_start(&w->timer, on_wait_timeout, (uint64_t)(timeout * 1000), 0);
    conch_list_add(&r->waiters, &w->link);
}
