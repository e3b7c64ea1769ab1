/* toolhost.c - `conch run --tools FILE`: loads the tools file, serves the sandbox's tool
 * bridge on a libuv loop in a thread of its own, and answers each call by running the host
 * command the file names, with the call's input as JSON on its stdin (a sub-agent's task as
 * text) and its stdout as the result (JSON when it parses, else the text). See toolhost.h. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "bridge/bridge.h"
#include "cli/toolhost.h"

#define MAX_CAPTURE (4u << 20) /* bytes of a host command's stdout kept (the payload cap) */
/* Host commands running at once: more calls wait for a turn (they run outside the sandbox's
 * limits, so a command must not be able to start hundreds). */
#define MAX_RUNNING 16
#define MAX_STDERR 2048 /* bytes of its stderr kept for the error message */

struct conch_toolhost {
    struct conch_run_tools ops; /* first: the operations exec/ calls (conch_toolhost_tools) */
    json_t *tools, *agents;     /* the file's definitions, "command" included */
    uv_loop_t loop;
    uv_async_t wake;
    pthread_t thread;
    bool started, finished;
    struct conch_bridge *bridge;
    struct conch_bridge_report report;
    unsigned running; /* host commands not reaped yet */
    /* calls waiting for a turn (MAX_RUNNING), in order */
    struct waiting *wait_head, **wait_tail;
};

struct waiting {
    struct waiting *next;
    struct conch_bridge_call *call;
    json_t *def;
};

/* One host command answering one call. */
struct host_call {
    struct conch_toolhost *h;
    struct conch_bridge_call *call; /* NULL once cancelled */
    uv_process_t proc;
    uv_pipe_t in, out, err;
    int open; /* handles not closed yet */
    char *input;
    size_t input_len;
    uv_write_t wreq;
    char *outbuf;
    size_t out_len;
    bool out_over;
    char errbuf[MAX_STDERR];
    size_t err_len;
    bool exited;
    int64_t status;
    int term_signal;
};

/* ---- loading ------------------------------------------------------------------------------ */

static int check_command(json_t *def, const char *what, size_t i, struct conch_err *err)
{
    json_t *cmd = json_object_get(def, "command");
    const char *name = json_string_value(json_object_get(def, "name"));
    if (!json_is_array(cmd) || json_array_size(cmd) == 0 || json_array_size(cmd) > 256)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s[%zu] (%s).command: expected a non-empty array of strings "
                              "(the host program and its arguments)",
                              what, i, name ? name : "?");
    size_t k;
    json_t *a;
    json_array_foreach(cmd, k, a)
    {
        if (!json_is_string(a) || memchr(json_string_value(a), '\0', json_string_length(a)))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "%s[%zu] (%s).command[%zu]: expected a string without NUL", what,
                                  i, name ? name : "?", k);
    }
    return 0;
}

static void noop_close(uv_handle_t *h)
{
    (void)h;
}

int conch_toolhost_load(const char *path, struct conch_toolhost **ret, struct conch_err *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--tools '%s': %s (line %d)", path,
                              jerr.text, jerr.line);
    json_t *tools = json_is_array(root) ? root : json_object_get(root, "tools");
    json_t *agents = json_is_object(root) ? json_object_get(root, "agents") : NULL;
    if ((tools && !json_is_array(tools)) || (agents && !json_is_array(agents)) ||
        (!json_is_array(root) && !json_is_object(root))) {
        json_decref(root);
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--tools '%s': expected {\"tools\": [...], \"agents\": [...]} or an "
                              "array of tools",
                              path);
    }
    struct conch_toolhost *h = calloc(1, sizeof(*h));
    int r = h ? uv_loop_init(&h->loop) : -ENOMEM;
    if (r < 0) {
        free(h);
        json_decref(root);
        return conch_err_set(err, -r, "tool host: %s", uv_strerror(r));
    }
    h->wait_tail = &h->wait_head;
    h->tools = tools ? json_incref(tools) : json_array();
    h->agents = agents ? json_incref(agents) : json_array();
    json_decref(root);
    size_t i;
    json_t *d;
    json_array_foreach(h->tools, i, d)
    {
        if ((r = check_command(d, "tools", i, err)) < 0)
            break;
    }
    if (r == 0)
        json_array_foreach(h->agents, i, d)
        {
            if ((r = check_command(d, "agents", i, err)) < 0)
                break;
        }
    /* Names and schemas: the checks tools.register makes. */
    if (r == 0 && ((r = conch_bridge_check_defs(false, h->tools, err)) < 0 ||
                   (r = conch_bridge_check_defs(true, h->agents, err)) < 0))
        conch_err_wrap(err, "--tools '%s'", path);
    if (r < 0) {
        conch_toolhost_free(h);
        return r;
    }
    *ret = h;
    return 0;
}

/* ---- answering a call --------------------------------------------------------------------- */

static void host_next(struct conch_toolhost *h);

static void host_call_finish(struct host_call *hc)
{
    struct conch_toolhost *h = hc->h;
    struct conch_bridge_call *call = hc->call;
    if (call) {
        conch_bridge_call_set_handle(call, NULL);
        if (hc->status == 0 && !hc->term_signal && !hc->out_over) {
            json_t *v = NULL;
            if (hc->out_len)
                v = json_loadb(hc->outbuf, hc->out_len, JSON_DECODE_ANY, NULL);
            if (!v) {
                size_t n = hc->out_len;
                if (n && hc->outbuf[n - 1] == '\n')
                    n--;
                v = json_stringn(hc->outbuf ? hc->outbuf : "", n); /* NULL: not UTF-8 */
            }
            if (v)
                conch_bridge_call_answer(call, v);
            else
                conch_bridge_call_fail(call, "tool_error",
                                       "the tool's output is neither JSON nor UTF-8 text");
        } else if (hc->out_over) {
            conch_bridge_call_fail(call, "too_large", "the tool printed more than 4 MiB");
        } else {
            char msg[MAX_STDERR + 96];
            size_t n = hc->err_len;
            while (n && (hc->errbuf[n - 1] == '\n' || hc->errbuf[n - 1] == ' '))
                n--;
            if (n)
                snprintf(msg, sizeof(msg), "%.*s", (int)n, hc->errbuf);
            else if (hc->term_signal)
                snprintf(msg, sizeof(msg), "the tool's command was killed by signal %d",
                         hc->term_signal);
            else
                snprintf(msg, sizeof(msg), "the tool's command exited with status %lld",
                         (long long)hc->status);
            conch_bridge_call_fail(call, "tool_error", msg);
        }
    }
    free(hc->input);
    free(hc->outbuf);
    free(hc);
    h->running--;
    host_next(h);
}

static void on_hc_closed(uv_handle_t *hd)
{
    struct host_call *hc = hd->data;
    if (--hc->open == 0)
        host_call_finish(hc);
}

static void on_hc_exit(uv_process_t *p, int64_t status, int term_signal)
{
    struct host_call *hc = p->data;
    hc->exited = true;
    hc->status = status;
    hc->term_signal = term_signal;
    uv_close((uv_handle_t *)p, on_hc_closed);
}

static void on_hc_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    (void)hd;
    (void)suggested;
    static char chunk[65536];
    *buf = uv_buf_init(chunk, sizeof(chunk));
}

static void on_hc_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct host_call *hc = s->data;
    if (n < 0) {
        uv_close((uv_handle_t *)s, on_hc_closed);
        return;
    }
    if (s == (uv_stream_t *)&hc->out) {
        if (hc->out_over || hc->out_len + (size_t)n > MAX_CAPTURE) {
            hc->out_over = true;
            return;
        }
        char *nb = realloc(hc->outbuf, hc->out_len + (size_t)n + 1);
        if (!nb) {
            hc->out_over = true;
            return;
        }
        hc->outbuf = nb;
        memcpy(nb + hc->out_len, buf->base, (size_t)n);
        hc->out_len += (size_t)n;
    } else {
        size_t room = sizeof(hc->errbuf) - hc->err_len;
        size_t take = (size_t)n < room ? (size_t)n : room;
        memcpy(hc->errbuf + hc->err_len, buf->base, take);
        hc->err_len += take;
    }
}

static void on_hc_written(uv_write_t *w, int status)
{
    (void)status;
    struct host_call *hc = w->data;
    uv_close((uv_handle_t *)&hc->in, on_hc_closed);
}

static int host_start(struct conch_toolhost *h, json_t *def, struct conch_bridge_call *call)
{
    json_t *cmd = json_object_get(def, "command");
    if (!h || !json_is_array(cmd))
        return -1;
    struct host_call *hc = calloc(1, sizeof(*hc));
    if (!hc)
        return -1;
    hc->h = h;
    hc->call = call;
    json_t *params = conch_bridge_call_params(call);
    if (conch_bridge_call_kind(call) == CONCH_BRIDGE_TOOL) {
        hc->input = json_dumps(json_object_get(params, "input"), JSON_COMPACT | JSON_ENCODE_ANY);
    } else {
        const char *task = json_string_value(json_object_get(params, "task"));
        hc->input = strdup(task ? task : "");
    }
    size_t argc = json_array_size(cmd);
    char **argv = calloc(argc + 1, sizeof(char *));
    char name_env[128], id_env[96];
    snprintf(name_env, sizeof(name_env), "CONCH_TOOL_NAME=%s",
             json_string_value(json_object_get(def, "name")));
    snprintf(id_env, sizeof(id_env), "CONCH_CALL_ID=%s", conch_bridge_call_id(call));
    json_decref(params);
    extern char **environ;
    size_t envc = 0;
    while (environ[envc])
        envc++;
    char **env = calloc(envc + 3, sizeof(char *));
    if (!hc->input || !argv || !env) {
        free(argv);
        free(env);
        free(hc->input);
        free(hc);
        return -1;
    }
    hc->input_len = strlen(hc->input);
    for (size_t i = 0; i < argc; i++)
        argv[i] = (char *)json_string_value(json_array_get(cmd, i));
    memcpy(env, environ, envc * sizeof(char *));
    env[envc] = name_env;
    env[envc + 1] = id_env;

    uv_pipe_init(&h->loop, &hc->in, 0);
    uv_pipe_init(&h->loop, &hc->out, 0);
    uv_pipe_init(&h->loop, &hc->err, 0);
    hc->in.data = hc->out.data = hc->err.data = hc->proc.data = hc;
    uv_stdio_container_t stdio[3] = {
        {.flags = UV_CREATE_PIPE | UV_READABLE_PIPE, .data.stream = (uv_stream_t *)&hc->in},
        {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&hc->out},
        {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&hc->err},
    };
    uv_process_options_t opts = {
        .exit_cb = on_hc_exit,
        .file = argv[0],
        .args = argv,
        .env = env,
        .stdio_count = 3,
        .stdio = stdio,
        .flags = UV_PROCESS_DETACHED, /* a process group of its own, killed as one */
    };
    h->running++;
    int r = uv_spawn(&h->loop, &hc->proc, &opts);
    free(argv);
    free(env);
    hc->open = 4;
    if (r < 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "cannot run the tool's command '%s': %s",
                 json_string_value(json_array_get(cmd, 0)), uv_strerror(r));
        conch_bridge_call_set_handle(call, NULL);
        hc->call = NULL;
        conch_bridge_call_fail(call, "tool_error", msg);
        uv_close((uv_handle_t *)&hc->proc, on_hc_closed);
        uv_close((uv_handle_t *)&hc->in, on_hc_closed);
        uv_close((uv_handle_t *)&hc->out, on_hc_closed);
        uv_close((uv_handle_t *)&hc->err, on_hc_closed);
        return 0;
    }
    conch_bridge_call_set_handle(call, hc);
    uv_read_start((uv_stream_t *)&hc->out, on_hc_alloc, on_hc_read);
    uv_read_start((uv_stream_t *)&hc->err, on_hc_alloc, on_hc_read);
    hc->wreq.data = hc;
    uv_buf_t b = uv_buf_init(hc->input, (unsigned)hc->input_len);
    if (uv_write(&hc->wreq, (uv_stream_t *)&hc->in, &b, 1, on_hc_written) < 0)
        uv_close((uv_handle_t *)&hc->in, on_hc_closed);
    return 0;
}

static int host_deliver(void *ctx, void *owner, struct conch_bridge_call *call)
{
    struct conch_toolhost *h = ctx;
    if (h->running < MAX_RUNNING)
        return host_start(h, owner, call);
    struct waiting *w = calloc(1, sizeof(*w));
    if (!w)
        return -1;
    w->call = call;
    w->def = owner;
    *h->wait_tail = w;
    h->wait_tail = &w->next;
    return 0;
}

/* A host command ended: the next waiting call gets its turn. */
static void host_next(struct conch_toolhost *h)
{
    while (h->wait_head && h->running < MAX_RUNNING) {
        struct waiting *w = h->wait_head;
        h->wait_head = w->next;
        if (!h->wait_head)
            h->wait_tail = &h->wait_head;
        struct conch_bridge_call *call = w->call;
        json_t *def = w->def;
        free(w);
        if (host_start(h, def, call) < 0)
            conch_bridge_call_fail(call, "tool_error", "cannot start the tool's command");
    }
}

static void host_cancel(void *ctx, void *owner, struct conch_bridge_call *call, const char *reason)
{
    struct conch_toolhost *h = ctx;
    (void)owner;
    (void)reason;
    for (struct waiting **pw = &h->wait_head; *pw; pw = &(*pw)->next) {
        if ((*pw)->call == call) {
            struct waiting *w = *pw;
            *pw = w->next;
            if (!*pw)
                h->wait_tail = pw;
            free(w);
            return;
        }
    }
    struct host_call *hc = conch_bridge_call_handle(call);
    if (!hc)
        return;
    hc->call = NULL;
    if (!hc->exited && hc->proc.pid > 0)
        kill(-hc->proc.pid, SIGKILL); /* its process group: what it started too */
}

static const struct conch_bridge_ops host_ops = {
    .deliver = host_deliver,
    .cancel = host_cancel,
};

/* ---- the thread ------------------------------------------------------------------------------ */

static void on_wake(uv_async_t *a)
{
    struct conch_toolhost *h = a->data;
    conch_bridge_origin_end(h->bridge, "run", "1", &h->report);
    conch_bridge_free(h->bridge);
    h->bridge = NULL;
    uv_close((uv_handle_t *)a, noop_close);
}

static void *toolhost_main(void *arg)
{
    struct conch_toolhost *h = arg;
    /* conch run's loop takes the signals (the command's to receive). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int toolhost_start(struct conch_run_tools *t, int listen_fd, struct conch_err *err)
{
    struct conch_toolhost *h = (struct conch_toolhost *)t;
    int r;
    if ((r = conch_bridge_new(&h->loop, "run", NULL, &host_ops, h, &h->bridge, err)) < 0) {
        close(listen_fd);
        return r;
    }
    size_t i;
    json_t *d;
    /* The owner of each is its own definition (its command). */
    json_array_foreach(h->tools, i, d)
    {
        json_t *one = json_pack("[O]", d), *names = NULL;
        r = conch_bridge_register(h->bridge, false, one, d, &names, err);
        json_decref(one);
        json_decref(names);
        if (r < 0)
            break;
    }
    json_array_foreach(h->agents, i, d)
    {
        if (r < 0)
            break;
        json_t *one = json_pack("[O]", d), *names = NULL;
        r = conch_bridge_register(h->bridge, true, one, d, &names, err);
        json_decref(one);
        json_decref(names);
    }
    if (r < 0)
        close(listen_fd); /* not taken over: the bridge never listened */
    if (r < 0 || (r = conch_bridge_listen(h->bridge, listen_fd, err)) < 0 ||
        (r = conch_bridge_origin_begin(h->bridge, "run", "1", 0)) < 0) {
        if (r == -ENOMEM)
            conch_err_set(err, ENOMEM, "out of memory");
        conch_bridge_free(h->bridge);
        h->bridge = NULL;
        uv_run(&h->loop, UV_RUN_DEFAULT);
        return r;
    }
    uv_async_init(&h->loop, &h->wake, on_wake);
    h->wake.data = h;
    if ((r = pthread_create(&h->thread, NULL, toolhost_main, h)) != 0) {
        uv_close((uv_handle_t *)&h->wake, noop_close);
        conch_bridge_free(h->bridge);
        h->bridge = NULL;
        uv_run(&h->loop, UV_RUN_DEFAULT);
        return conch_err_set(err, r, "start the tool bridge's thread: %s", strerror(r));
    }
    h->started = true;
    return 0;
}

static void toolhost_finish(struct conch_run_tools *t, struct conch_run_tool_calls *ret)
{
    struct conch_toolhost *h = (struct conch_toolhost *)t;
    memset(ret, 0, sizeof(*ret));
    if (!h->started || h->finished)
        return;
    h->finished = true;
    uv_async_send(&h->wake);
    pthread_join(h->thread, NULL);
    ret->calls = h->report.calls;
    ret->detached = h->report.detached;
    ret->summary = h->report.summary;
    memset(&h->report, 0, sizeof(h->report));
}

struct conch_run_tools *conch_toolhost_tools(struct conch_toolhost *h)
{
    h->ops.start = toolhost_start;
    h->ops.finish = toolhost_finish;
    return &h->ops;
}

void conch_toolhost_free(struct conch_toolhost *h)
{
    if (!h)
        return;
    if (h->started && !h->finished) {
        struct conch_run_tool_calls r;
        toolhost_finish(&h->ops, &r);
        conch_run_tool_calls_done(&r);
    }
    uv_loop_close(&h->loop);
    conch_bridge_report_done(&h->report);
    json_decref(h->tools);
    json_decref(h->agents);
    free(h);
}
