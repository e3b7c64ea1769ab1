/* commands.c - exec.run (one command, answered when it ends) and jobs (background commands
 * read incrementally): pipes into capture buffers, deadlines, results, notifications. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "exec/result.h"
#include "exec/run.h"

#define MAX_JOBS 4096

static void run_try_finish(struct run *r);
static void run_signal(struct run *r, int sig);
static const struct conch_proc_ops run_proc_ops;

static void close_spill(struct conch_output *o)
{
    if (o->spill_fd >= 0 && o->spill_path[0])
        close(o->spill_fd);
    o->spill_fd = -1;
}

static void unlink_spill(struct conch_output *o)
{
    close_spill(o);
    if (o->spill_path[0])
        unlink(o->spill_path);
}

static void run_free(struct run *r)
{
    conch_daemon_client_sink_wait_cancel(&r->drain);
    conch_output_done(&r->out_cap);
    conch_output_done(&r->err_cap);
    free(r->command);
    conch_bridge_report_done(&r->tools);
    json_decref(r->request_id);
    if (r->notify)
        conch_rpc_sink_unref(r->notify);
    free(r);
}

/* Free @r once nothing needs it: finished, not a job that stays listed, no libuv handle
 * open, no change scan under way and no answer being built. Every entry point that may end a run
 * calls it last. */
static void run_maybe_free(struct run *r)
{
    if (r->finished && !r->is_job && r->handles == 0 && !r->scanning && !r->answering)
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

static void close_pipe(struct run *r, uv_pipe_t *p, bool *open)
{
    if (!*open)
        return;
    *open = false;
    uv_read_stop((uv_stream_t *)p);
    uv_close((uv_handle_t *)p, on_run_handle_closed);
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

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static char slab[65536];
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void on_pipe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct run *r = s->data;
    bool is_out = s == (uv_stream_t *)&r->out;
    if (n < 0) {
        close_pipe(r, is_out ? &r->out : &r->err, is_out ? &r->out_open : &r->err_open);
        run_try_finish(r);
        run_maybe_free(r);
        return;
    }
    if (n == 0)
        return;
    struct conch_err err = {0};
    int a = conch_output_append(is_out ? &r->out_cap : &r->err_cap, buf->base, (size_t)n, &err);
    stream_notify(r, is_out ? "stdout" : "stderr", buf->base, (size_t)n);
    /* A client that does not read its streamed output: stop reading the command's pipes
     * until it drains; the command then blocks on its writes (backpressure, not memory). */
    if (r->stream && r->notify && conch_daemon_client_sink_congested(r->notify) &&
        conch_daemon_client_sink_wait_drain(r->notify, &r->drain)) {
        if (r->out_open)
            uv_read_stop((uv_stream_t *)&r->out);
        if (r->err_open)
            uv_read_stop((uv_stream_t *)&r->err);
    }
    if (a == 1 && !r->exited) {
        /* Past the spill cap: stop the command (as `conch run` does). */
        r->over_spill = true;
        run_signal(r, SIGKILL);
    }
}

/* The client drained: read the command's output again. */
static void run_drained(struct sink_waiter *w)
{
    struct run *r = conch_list_entry(w, struct run, drain);
    if (r->out_open)
        uv_read_start((uv_stream_t *)&r->out, on_alloc, on_pipe_read);
    if (r->err_open)
        uv_read_start((uv_stream_t *)&r->err, on_alloc, on_pipe_read);
}

/* Signal every process of @r (the supervisor keeps a signal asked before the command runs
 * and sends it when it starts). Deadlines are the warden's, not ours. */
static void run_signal(struct run *r, int sig)
{
    conch_super_signal(&r->proc, sig);
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
    r->proc.ops = &run_proc_ops;
    r->proc.data = r;
    r->drain.cb = run_drained;
    r->command = strdup(command);
    if (!is_job)
        conch_daemon_make_id(d, "exec", r->origin_id, sizeof(r->origin_id));
    CONCH_LIST_INIT(&r->waiters);
    CONCH_LIST_INIT(&r->dlink);
    r->out_cap.spill_fd = r->err_cap.spill_fd = -1;
    long long max_output = conch_rpc_int(params, "max_output", 1 << 20); /* ranged by the table */
    /* Jobs keep every byte in their spill files (read back by offset); commands keep the
     * head and tail in memory. */
    if (conch_output_init(&r->out_cap, "stdout", is_job ? 0 : (size_t)max_output, 256ULL << 20,
                          conch_daemon_sandbox_spill_dir(sb), err) < 0 ||
        conch_output_init(&r->err_cap, "stderr", is_job ? 0 : (size_t)max_output, 256ULL << 20,
                          conch_daemon_sandbox_spill_dir(sb), err) < 0) {
        run_free(r);
        return NULL;
    }
    /* What every command keeps in memory counts against one budget: past it, output goes to
     * the spill files early instead of growing the daemon. */
    conch_output_set_budget(&r->out_cap, &d->output_budget);
    conch_output_set_budget(&r->err_cap, &d->output_budget);
    /* A sandbox's spill files are read through fs.* at /run/conch/output (files.c); a fresh
     * sandbox's outlive it and keep their host path. */
    if (!sb->fresh && !sandbox_in_pool(sb)) {
        conch_output_show_spill_in(&r->out_cap, CONCH_SPILL_SHOWN_DIR);
        conch_output_show_spill_in(&r->err_cap, CONCH_SPILL_SHOWN_DIR);
    }
    double timeout = conch_rpc_num(params, "timeout", is_job ? 0 : 120);
    double grace = conch_rpc_num(params, "grace", 2);
    r->timeout_ms = timeout > 0 ? (uint64_t)(timeout * 1000) : 0;
    r->grace_ms = grace >= 0 ? (uint64_t)(grace * 1000) : 2000;

    const char *cwd_param = conch_rpc_str(params, "cwd", NULL);
    char cwd[PATH_MAX + 16] = "/workspace";
    if (cwd_param && cwd_param[0] == '/')
        snprintf(cwd, sizeof(cwd), "%s", cwd_param);
    else if (cwd_param && *cwd_param)
        snprintf(cwd, sizeof(cwd), "/workspace/%s", cwd_param);

    char **extra = env_strings(sb->env, json_object_get(params, "env"));
    char **env = extra ? conch_exec_env_build(extra, sb->as_root, err) : NULL;
    free_strings(extra);
    if (!env) {
        if (!err->code)
            conch_err_set(err, ENOMEM, "out of memory");
        run_free(r);
        return NULL;
    }
    int out[2] = {-1, -1}, errp[2] = {-1, -1}, in = -1;
    size_t stdin_len = 0;
    const char *stdin_data = conch_rpc_strn(params, "stdin", &stdin_len);
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
        conch_err_set(err, errno, "pipe: %s", strerror(errno));
        goto fail;
    }
    if (stdin_data && stdin_len) {
        /* A memfd holds any amount of stdin without blocking the loop on a pipe. */
        in = memfd_create("conch-stdin", MFD_CLOEXEC);
        if (in < 0 || conch_write_all(in, stdin_data, stdin_len) < 0 ||
            lseek(in, 0, SEEK_SET) < 0) {
            conch_err_set(err, errno, "stdin: %s", strerror(errno));
            goto fail;
        }
    } else {
        in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    /* exec.run's "shell": "sh" runs /bin/sh as deepagents' LocalShellBackend does. */
    r->shell = strcmp(conch_rpc_str(params, "shell", "bash"), "sh") ? "/bin/bash" : "/bin/sh";
    char *argv[] = {(char *)r->shell, "-c", (char *)command, NULL};
    struct conch_jail_cmd cmd = {.argv = argv,
                                 .envp = env,
                                 .cwd = cwd,
                                 .stdin_fd = in,
                                 .stdout_fd = out[1],
                                 .stderr_fd = errp[1],
                                 .last = sb->fresh};
    if (conch_super_run(&sb->super, &r->proc, &cmd, r->timeout_ms, r->grace_ms, err) < 0)
        goto fail;
    close(in);
    close(out[1]);
    close(errp[1]);
    conch_exec_env_free(env);
    uv_pipe_init(&d->loop, &r->out, 0);
    uv_pipe_init(&d->loop, &r->err, 0);
    r->out.data = r->err.data = r;
    uv_pipe_open(&r->out, out[0]);
    uv_pipe_open(&r->err, errp[0]);
    r->out_open = r->err_open = true;
    r->handles = 2;
    uv_read_start((uv_stream_t *)&r->out, on_alloc, on_pipe_read);
    uv_read_start((uv_stream_t *)&r->err, on_alloc, on_pipe_read);
    if (conch_jail_has_cgroup(sb->jail)) {
        struct conch_cgroup_stats cgs;
        conch_jail_cgroup_stats(sb->jail, &cgs);
        r->oom_base = cgs.oom_kills;
        r->pids_base = cgs.pids_events;
    }
    r->start_ms = conch_daemon_now_ms();
    r->started_at = conch_daemon_now();
    conch_list_add(&sb->runs, &r->link);
    sb->commands++;
    conch_daemon_sandbox_touch(sb);
    return r;
fail:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0)
            close(out[i]);
        if (errp[i] >= 0)
            close(errp[i]);
    }
    if (in >= 0)
        close(in);
    conch_exec_env_free(env);
    run_free(r);
    return NULL;
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
    res->out = r->out_cap;
    res->err = r->err_cap;
    res->duration_ms = r->end_ms - r->start_ms;
    struct conch_cgroup_stats cgs = {0};
    if (r->sb->jail)
        conch_jail_cgroup_stats(r->sb->jail, &cgs);
    /* The cgroup's counters are the sandbox's: only what grew during this command counts. */
    char disk[160];
    snprintf(disk, sizeof(disk), "the workspace's room for changes (%llu bytes, disk)",
             (unsigned long long)r->sb->disk_bytes);
    struct conch_run_end end = {
        .status = r->end.status,
        .usage = r->end.usage,
        .start_failed = r->end.start_failed,
        .start_err = r->end.err,
        .start_shell = r->shell,
        .timed_out = r->end.timed_out,
        .timeout_ms = r->timeout_ms,
        .grace_ms = r->grace_ms,
        .spill_exceeded = r->over_spill ? r->out_cap.spill_max : 0,
        .memory_exceeded =
            r->sampled_oom || cgs.oom_kills > r->oom_base ? r->sb->limits.memory_bytes : 0,
        .memory_sampled = !(r->sb->jail && conch_jail_has_cgroup(r->sb->jail)),
        .pids_hit = r->sampled_pids || cgs.pids_events > r->pids_base ? r->sb->limits.pids_max : 0,
        .disk_full =
            r->sampled_disk || (WIFSIGNALED(r->end.status) && WTERMSIG(r->end.status) == SIGXFSZ)
                ? disk
                : NULL,
    };
    conch_run_result_end(res, &end);
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
    return run_result_build(&res, r->tools.calls, r->tools.detached);
}

static void job_record_exit(struct run *r)
{
    int sig = 0;
    int code = r->end.start_failed ? CONCH_RUN_EXIT_INFRA : conch_exit_code(r->end.status, &sig);
    struct conch_state_job rec;
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.id, sizeof(rec.id), "%s", r->job_id);
    snprintf(rec.sandbox_id, sizeof(rec.sandbox_id), "%s", r->sb->id);
    rec.command = r->command;
    rec.exit_code = code;
    rec.signal = sig;
    rec.started_at = r->started_at;
    rec.ended_at = conch_daemon_now();
    snprintf(rec.stdout_spill, sizeof(rec.stdout_spill), "%s", r->out_cap.spill_path);
    snprintf(rec.stderr_spill, sizeof(rec.stderr_spill), "%s", r->err_cap.spill_path);
    conch_state_job_put(r->sb->d->state, &rec, NULL);
}

static json_t *job_status_json(struct run *r)
{
    if (!r->finished)
        return json_pack("{s:b,s:n,s:n}", "running", 1, "exit_code", "signal");
    json_t *o;
    if (r->end.start_failed) {
        o = json_pack("{s:b,s:i,s:n}", "running", 0, "exit_code", CONCH_RUN_EXIT_INFRA, "signal");
    } else {
        int sig;
        int code = conch_exit_code(r->end.status, &sig);
        o = json_pack("{s:b,s:i,s:o}", "running", 0, "exit_code", code, "signal",
                      sig ? json_integer(sig) : json_null());
    }
    /* Ended without its own report (the warden died, the sandbox was stopped): say why. */
    if (o && r->end.lost && r->end.why)
        json_object_set_new(o, "lost", json_string(r->end.why));
    run_tools_json(r, o);
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
    conch_rpc_call_reply(w->call, job_status_json(w->job));
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
        unlink_spill(&r->out_cap);
        unlink_spill(&r->err_cap);
        run_free_job(r);
        done--;
    }
}

/* A result that keeps more output than this is built and serialised by a worker: repairing
 * the UTF-8 of 8 MiB, its text form and its JSON encoding take ~0.15 s (~0.5 s under ASan),
 * which every other client would wait for on the loop. Below it the threadpool's round trip
 * would cost a short command more than it saves. */
#define ANSWER_ON_LOOP_MAX (64u << 10)

/* A result being built off the loop. @r is kept (r->answering) until answer_done. */
struct answer_job {
    uv_work_t req;
    struct run *r;
    struct conch_run_result res; /* out/err borrowed from @r; changes owned */
    json_t *calls, *detached;    /* copies of @r's: the worker owns them */
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
    a->text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
}

static void answer_done(uv_work_t *req, int status)
{
    struct answer_job *a = req->data;
    struct run *r = a->r;
    struct sandbox *sb = r->sb;
    (void)status;
    /* NULL text (out of memory, or cancelled) is answered as an internal error. */
    conch_rpc_call_reply_dumped(r->call, a->text);
    r->call = NULL;
    conch_ws_changes_done(&a->res.changes);
    json_decref(a->calls);
    json_decref(a->detached);
    free(a);
    r->answering = false;
    run_answered(r);
    conch_daemon_sandbox_release(sb);
    run_maybe_free(r);
}

/* Build @r's result off the loop (see ANSWER_ON_LOOP_MAX), taking @changes' contents.
 * Returns false when it could not be queued (the caller answers on the loop). */
static bool run_answer_async(struct run *r, struct conch_ws_changes *changes)
{
    struct answer_job *a = calloc(1, sizeof(*a));
    if (!a)
        return false;
    a->r = r;
    a->req.data = a;
    run_result_fill(r, changes, &a->res);
    a->calls = r->tools.calls ? json_deep_copy(r->tools.calls) : NULL;
    a->detached = r->tools.detached ? json_deep_copy(r->tools.detached) : NULL;
    if ((r->tools.calls && !a->calls) || (r->tools.detached && !a->detached) ||
        uv_queue_work(&r->sb->d->loop, &a->req, answer_work, answer_done) < 0) {
        json_decref(a->calls);
        json_decref(a->detached);
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
    size_t kept =
        r->out_cap.head_len + r->out_cap.tail_len + r->err_cap.head_len + r->err_cap.tail_len;
    if (kept > ANSWER_ON_LOOP_MAX && run_answer_async(r, changes))
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

static void run_try_finish(struct run *r)
{
    if (r->finished || !r->exited || r->out_open || r->err_open)
        return;
    r->finished = true;
    r->end_ms = conch_daemon_now_ms();
    conch_list_del(&r->link);
    struct sandbox *sb = r->sb;
    /* The spill files stay (a job's output is read back from them by offset); their fds
     * need not: a finished run holds none. */
    close_spill(&r->out_cap);
    close_spill(&r->err_cap);
    if (r->is_job) {
        /* A short command ends between two samples of the disk: measure what it left. */
        conch_daemon_sandbox_measure(sb);
        job_record_exit(r);
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &r->waiters)
            waiter_finish(conch_list_entry(pos, struct job_wait, link));
        json_t *st = job_status_json(r);
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
    if (r->end.lost && sb->super.gone) {
        conch_rpc_call_failf(r->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "the command was stopped: %s", r->end.why);
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

void conch_daemon_run_forget(struct run *r)
{
    close_pipe(r, &r->out, &r->out_open);
    close_pipe(r, &r->err, &r->err_open);
    if (!r->finished) {
        r->exited = true;
        run_try_finish(r);
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
static void run_started(struct conch_proc *p, pid_t pid)
{
    struct run *r = p->data;
    (void)pid;
    if (r->sb->bridge && conch_bridge_origin_begin(r->sb->bridge, run_origin_kind(r),
                                                   run_origin_id(r), p->pidns_ino) < 0)
        log_warn("sandbox %s: out of memory tracing tool calls", r->sb->id);
}

/* The supervisor's final event for @p: exactly once per run. */
static void run_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct run *r = p->data;
    r->exited = true;
    r->end = *end;
    /* Its calls still pending are cancelled; what it called goes into its result. */
    if (r->sb->bridge)
        conch_bridge_origin_end(r->sb->bridge, run_origin_kind(r), run_origin_id(r), &r->tools);
    if (end->lost) {
        /* Nothing more will be written that anyone waits for. */
        close_pipe(r, &r->out, &r->out_open);
        close_pipe(r, &r->err, &r->err_open);
    }
    run_try_finish(r);
    run_maybe_free(r);
}

static const struct conch_proc_ops run_proc_ops = {.started = run_started, .ended = run_ended};

/* Sampling saw the sandbox over a limit: memory and disk kill @r, the process limit is only
 * noted (forks fail by themselves). */
void conch_daemon_run_limit_hit(struct run *r, enum run_limit which)
{
    if (r->finished)
        return;
    if (which == RUN_LIMIT_PIDS) {
        r->sampled_pids = true;
        return;
    }
    if (which == RUN_LIMIT_MEMORY)
        r->sampled_oom = true;
    else
        r->sampled_disk = true;
    run_signal(r, SIGKILL);
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
        if (ok && !spec.workspace && (sb = conch_daemon_pool_take(c->d)))
            sb->from_pool = true;
        if (ok && !sb && conch_daemon_sandbox_create(c->d, &spec, &sb, &err) < 0) {
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

static struct run *find_job(struct client *c, struct conch_rpc_call *call, json_t *params)
{
    const char *id = conch_rpc_str(params, "job_id", "");
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->jobs)
    {
        struct run *r = conch_list_entry(pos, struct run, dlink);
        if (!strcmp(r->job_id, id))
            return r;
    }
    conch_rpc_call_failf(call, CONCH_RPC_JOB_NOT_FOUND, "job_not_found", NULL, "no job '%s'", id);
    return NULL;
}

/* Read up to @max bytes of a job's stream from @offset (its spill file holds every byte). */
static json_t *read_stream(const struct conch_output *o, long long *offset, long long max)
{
    if (*offset < 0)
        *offset = 0;
    if (!o->spill_path[0] || (uint64_t)*offset >= o->spilled)
        return json_string("");
    _cleanup_close_ int fd = open(o->spill_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return json_string("");
    uint64_t avail = o->spilled - (uint64_t)*offset;
    size_t n = (size_t)((uint64_t)max < avail ? (uint64_t)max : avail);
    _cleanup_free_ char *buf = malloc(n + 1);
    if (!buf)
        return json_string("");
    ssize_t got = pread(fd, buf, n, *offset);
    if (got < 0)
        got = 0;
    *offset += got;
    json_t *s = conch_json_text(buf, (size_t)got);
    return s ? s : json_string("");
}

void conch_daemon_handle_job_output(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct run *r = find_job(ctx, call, params);
    if (!r)
        return;
    long long so = conch_rpc_int(params, "stdout_offset", 0);
    long long eo = conch_rpc_int(params, "stderr_offset", 0);
    long long max = conch_rpc_int(params, "max_bytes", 65536);
    if (max <= 0 || max > (16 << 20))
        max = 65536;
    json_t *out = read_stream(&r->out_cap, &so, max);
    json_t *err = read_stream(&r->err_cap, &eo, max);
    json_t *st = job_status_json(r);
    json_object_set_new(st, "stdout", out);
    json_object_set_new(st, "stderr", err);
    json_object_set_new(st, "stdout_offset", json_integer(so));
    json_object_set_new(st, "stderr_offset", json_integer(eo));
    json_object_del(st, "signal");
    conch_rpc_call_reply(call, st);
}

static void on_wait_timeout(uv_timer_t *t)
{
    waiter_finish(t->data);
}

void conch_daemon_handle_job_wait(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    struct run *r = find_job(c, call, params);
    if (!r)
        return;
    double timeout = conch_rpc_num(params, "timeout", 30);
    if (r->finished || timeout <= 0) {
        conch_rpc_call_reply(call, job_status_json(r));
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

void conch_daemon_handle_job_kill(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct run *r = find_job(ctx, call, params);
    if (!r)
        return;
    int sig = SIGTERM;
    json_t *s = json_object_get(params, "signal");
    if (json_is_integer(s))
        sig = (int)json_integer_value(s);
    else if (json_is_string(s)) {
        const char *name = json_string_value(s);
        if (!strncmp(name, "SIG", 3))
            name += 3;
        static const struct {
            const char *n;
            int s;
        } sigs[] = {{"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT},
                    {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1},
                    {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
        sig = 0;
        for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
            if (!strcmp(name, sigs[i].n))
                sig = sigs[i].s;
    } else if (s) {
        sig = 0;
    }
    if (sig <= 0 || sig >= 65) {
        conch_rpc_call_fail_param(call, "signal", "unknown signal");
        return;
    }
    if (!r->finished)
        run_signal(r, sig);
    conch_rpc_call_reply(call, json_pack("{s:b}", "killed", !r->finished));
}

void conch_daemon_handle_job_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *sb = conch_rpc_str(params, "sandbox", NULL);
    json_t *arr = json_array();
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->jobs)
    {
        struct run *r = conch_list_entry(pos, struct run, dlink);
        if (sb && strcmp(sb, r->sb->id))
            continue;
        json_t *o = job_status_json(r);
        json_object_set_new(o, "job_id", json_string(r->job_id));
        json_object_set_new(o, "sandbox", json_string(r->sb->id));
        json_object_set_new(o, "command", conch_json_text(r->command, strlen(r->command)));
        json_object_set_new(o, "started_at", json_real(r->started_at));
        json_array_append_new(arr, o);
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "jobs", arr));
}
