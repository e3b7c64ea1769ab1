/* js.c - the daemon's JS sessions (issue 17): js.eval, js.reset, js.close, js.list. Each
 * session of a sandbox has at most one JS worker: a process of the supervisor
 * (conch_super_js_server) that the warden forks inside the sandbox, fenced as a file server
 * (agent uid, no capabilities, no_new_privs, Landlock) under a seccomp filter of its own (no
 * exec, no sockets: conch_seccomp_opts.js_worker), and that serves the session
 * (conch_js_worker_serve, src/js/js-worker.c) over a stream socket pair in frames (a
 * native-endian uint64_t length, then JSON). A session is created by its
 * first eval and its worker started then; globals live in the worker. A worker that dies
 * (a crash, the OOM killer, a SIGKILL from the host, a hang past the eval's deadline) fails
 * the request it held with the reason its final event gives; the session's next eval starts
 * a fresh worker and says so (restarted: true). One request runs at a time per session; a
 * second is refused (busy), but js.reset and js.close end an eval in flight (its worker is
 * killed). A script's tool calls (tool_call frames) go through the sandbox's tool bridge as a
 * caller with no socket (conch_bridge_local_*), under the origin {"kind": "js", "id":
 * SESSION} that each eval begins and ends: checked, capped, delivered, timed out and traced
 * exactly as a command's; the eval's end cancels its calls still in flight. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"
#include "core/strbuf.h"
#include "bridge/bridge.h"
#include "daemon/daemon-internal.h"
#include "js/js.h"

/* The largest frame a worker may send (its results are capped far below: 64 KiB of value,
 * 64 KiB of console). A larger one is a misbehaving worker: killed. */
#define JS_FRAME_MAX (16u << 20)
/* js.eval's timeout when none is given (seconds); 0 given means none. */
#define JS_DEFAULT_TIMEOUT_S 60.0
/* Past the eval's own deadline (which the worker enforces), the daemon waits this long
 * for its answer, then kills the worker. */
#define JS_GRACE_MS 5000
/* Sessions per sandbox. */
#define JS_SESSIONS_MAX 64
/* Spares in a row that ended unused, past which a sandbox makes no more. */
#define JS_SPARE_FAILURES 3
/* The read buffer's usual size; a larger frame grows it for itself, and it shrinks back. */
#define JS_INBUF (64u << 10)

enum js_op { JS_OP_NONE = 0, JS_OP_EVAL, JS_OP_RESET };

struct js_worker;

struct js_session {
    struct conch_list link;
    struct js_sessions *all;
    char name[CONCH_JS_SESSION_NAME_MAX + 1];
    struct js_worker *w; /* NULL: none running (the next eval starts one) */
    bool lost;           /* its worker died: the next eval's reply says restarted */
    char lost_why[512];
    unsigned evals;
    /* the request in flight */
    enum js_op op;
    struct conch_rpc_call *call;
    bool restarted; /* the eval in flight runs in a fresh worker after a lost one */
    struct conch_bridge_local *tools; /* the eval in flight's caller on the tool bridge */
    json_t *tool_set;   /* js.eval's `tools` as last given ("all", "none", {include|exclude}):
                           which registered tools the session sees; NULL: all */
    json_t *eval_tools; /* the names the eval in flight offers: a call to another is refused */
};

struct js_sessions {
    struct sandbox *sb;
    struct conch_list list; /* struct js_session */
    unsigned n;
    /* A worker started ahead, its engine built and warm, that the next session to need one
     * takes (NULL: none). Made once the sandbox has run JS (after an eval's answer, off its
     * path), again each time one is taken; not after JS_SPARE_FAILURES spares in a row
     * ended unused. */
    struct js_worker *spare;
    unsigned spare_failures;
    bool refill; /* make a spare after the eval in flight answers */
};

struct js_worker {
    struct js_session *s;    /* NULL once detached from its session (or while a spare) */
    struct js_sessions *all; /* a spare's sandbox (NULL once taken or detached) */
    struct conch_proc proc;
    struct conch_proc_end end;
    bool ended;
    uv_pipe_t pipe;
    uv_timer_t timer;
    uv_check_t flush; /* sends what w_send gathered, once per loop iteration */
    int handles;      /* open libuv handles, and the process until its final event: freed at 0 */
    bool closing;
    /* Frames read and not yet handled: every frame already there comes in one read. */
    char *in;
    size_t in_off, in_len, in_cap;
    /* Frames to send, gathered: 100 tool answers read from a client at once go in one
     * write. */
    struct conch_sb out;
    /* The tools (and those left out) it last got: an eval offering the same sends none. */
    json_t *sent_tools, *sent_hidden;
};

struct js_write {
    uv_write_t req;
    char *data;
};

static void spare_start(struct js_sessions *all);

/* ---- the worker ---- */

static void w_unref(struct js_worker *w)
{
    if (--w->handles == 0) {
        free(w->in);
        conch_sb_done(&w->out);
        json_decref(w->sent_tools);
        json_decref(w->sent_hidden);
        free(w);
    }
}

static void w_on_closed(uv_handle_t *h)
{
    w_unref(h->data);
}

static void w_on_written(uv_write_t *req, int status)
{
    struct js_write *wr = req->data;
    (void)status; /* a worker that is gone shows as EOF on the read side */
    free(wr->data);
    free(wr);
}

/* Close @w's handles (once) and kill it if @kill_it. */
static void w_close(struct js_worker *w, bool kill_it)
{
    if (kill_it)
        conch_super_signal(&w->proc, SIGKILL);
    if (w->closing)
        return;
    w->closing = true;
    if (w->all && w->all->spare == w) { /* a spare that could not start, or died waiting */
        w->all->spare = NULL;
        w->all->spare_failures++;
    }
    w->all = NULL;
    uv_read_stop((uv_stream_t *)&w->pipe);
    uv_timer_stop(&w->timer);
    uv_check_stop(&w->flush);
    uv_close((uv_handle_t *)&w->pipe, w_on_closed);
    uv_close((uv_handle_t *)&w->timer, w_on_closed);
    uv_close((uv_handle_t *)&w->flush, w_on_closed);
}

static const char watchdog_why[] =
    "an eval ran past its deadline inside an operation the engine cannot interrupt (a "
    "regular expression that backtracks), so the worker ended itself";

/* Why a worker ended, for a user: "killed by signal 9 (Killed): ...". */
static void describe_end(const struct conch_proc_end *end, char *buf, size_t size)
{
    if (end->start_failed)
        snprintf(buf, size, "it could not start: %.250s", end->err.msg);
    else if (end->lost)
        snprintf(buf, size, "%s", end->why ? end->why : "the sandbox stopped");
    else if (WIFSIGNALED(end->status))
        snprintf(buf, size, "it was killed by signal %d (%s)%s", WTERMSIG(end->status),
                 strsignal(WTERMSIG(end->status)),
                 WTERMSIG(end->status) == SIGKILL ? ": out of memory, or killed from outside" : "");
    else if (WIFEXITED(end->status) && WEXITSTATUS(end->status) == CONCH_JS_WATCHDOG_EXIT)
        snprintf(buf, size, "%s", watchdog_why);
    else
        snprintf(buf, size, "it exited with status %d",
                 WIFEXITED(end->status) ? WEXITSTATUS(end->status) : end->status);
}

/* The session's worker is gone (@why): its request fails (sandbox_stopped when @stopped: the
 * warden died or the sandbox is going), and its next eval starts a fresh worker. */
static void session_lost(struct js_session *s, const char *why, bool stopped)
{
    struct js_worker *w = s->w;
    if (w) {
        w->s = NULL;
        s->w = NULL;
    }
    s->lost = true;
    snprintf(s->lost_why, sizeof(s->lost_why), "the JS worker of session '%s' died: %.300s",
             s->name, why);
    conch_bridge_local_close(s->tools, NULL);
    s->tools = NULL;
    struct conch_rpc_call *call = s->call;
    s->call = NULL;
    s->op = JS_OP_NONE;
    if (call)
        conch_rpc_call_failf(call, stopped ? CONCH_RPC_SANDBOX_STOPPED : CONCH_RPC_INTERNAL_ERROR,
                             stopped ? "sandbox_stopped" : "internal_error", NULL,
                             "%s; the session's state is lost: the next js.eval starts a "
                             "fresh session",
                             s->lost_why);
}

static void w_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct js_worker *w = p->data;
    w->end = *end;
    w->ended = true;
    if (w->s) {
        char why[320];
        describe_end(end, why, sizeof(why));
        session_lost(w->s, why, end->lost);
    }
    w_close(w, false);
    w_unref(w);
}

static const struct conch_proc_ops w_ops = {.ended = w_ended};

/* EOF or a broken channel: the reason is in the final event; fail now if it came. */
static void w_gone(struct js_worker *w)
{
    w_close(w, true);
    if (w->ended && w->s) {
        char why[320];
        describe_end(&w->end, why, sizeof(why));
        session_lost(w->s, why, w->end.lost);
    }
}

/* The worker misbehaved (@why): killed, and its session lost. */
static void w_kill(struct js_worker *w, const char *why)
{
    if (w->s) {
        log_warn("sandbox %s: JS session '%s': %s: its worker is killed", w->s->all->sb->id,
                 w->s->name, why);
        session_lost(w->s, why, false);
    }
    w_close(w, true);
}

static void w_on_timeout(uv_timer_t *t)
{
    struct js_worker *w = t->data;
    w_kill(w, "it did not answer within its eval's timeout and 5 s more");
}

static int dump_to_sb(const char *buf, size_t size, void *data)
{
    conch_sb_putn(data, buf, size);
    return 0;
}

/* Send what w_send gathered, in one write. */
static void w_on_flush(uv_check_t *h)
{
    struct js_worker *w = h->data;
    uv_check_stop(&w->flush);
    if (w->closing || !w->out.len)
        return;
    struct js_write *wr = malloc(sizeof(*wr));
    size_t len = w->out.len;
    char *data = wr ? conch_sb_take(&w->out) : NULL;
    if (!data) {
        free(wr);
        w_kill(w, "out of memory for a frame to it");
        return;
    }
    wr->req.data = wr;
    wr->data = data;
    uv_buf_t buf = uv_buf_init(data, (unsigned)len);
    if (uv_write(&wr->req, (uv_stream_t *)&w->pipe, &buf, 1, w_on_written) < 0) {
        free(data);
        free(wr);
        w_kill(w, "a frame could not be sent to it");
    }
}

/* Frame @msg (taken) for @w: sent at the end of this loop iteration with every other frame
 * gathered by then. */
static int w_send(struct js_worker *w, json_t *msg)
{
    if (!msg || w->closing) {
        json_decref(msg);
        return -EPIPE;
    }
    struct conch_sb *b = &w->out;
    size_t at = b->len;
    uint64_t len = 0;
    conch_sb_putn(b, (const char *)&len, sizeof(len));
    int r = json_dump_callback(msg, dump_to_sb, b, JSON_COMPACT);
    json_decref(msg);
    if (r < 0 || b->oom) {
        conch_sb_done(b);
        return -ENOMEM;
    }
    len = b->len - at - sizeof(len);
    memcpy(b->buf + at, &len, sizeof(len));
    if (!uv_is_active((uv_handle_t *)&w->flush))
        uv_check_start(&w->flush, w_on_flush);
    return 0;
}

/* The bridge's answer @msg (taken: {id, ok, result} or {id, ok: false, error: {kind,
 * message}}) to a call of @data's eval in flight, relayed to its worker as a tool_result
 * frame (an error as its message: the tool's own, or why the bridge refused or gave up). */
static void tools_answer(void *data, json_t *msg)
{
    struct js_session *s = data;
    json_t *id = json_object_get(msg, "id");
    json_t *ans = NULL;
    if (s->w && json_is_integer(id)) {
        if (json_is_true(json_object_get(msg, "ok"))) {
            json_t *v = json_object_get(msg, "result");
            ans = json_pack("{s:s,s:{s:O,s:b,s:O}}", "method", "tool_result", "params", "id", id,
                            "ok", 1, "value", v ? v : json_null());
        } else {
            const char *m =
                json_string_value(json_object_get(json_object_get(msg, "error"), "message"));
            ans = json_pack("{s:s,s:{s:O,s:b,s:s}}", "method", "tool_result", "params", "id", id,
                            "ok", 0, "error", m ? m : "the tool call failed");
        }
    }
    json_decref(msg);
    if (ans && w_send(s->w, ans) < 0)
        w_kill(s->w, "a tool's answer could not be sent to it");
}

/* A script's call @tc ({id, name, input}; read from the frame @text, @len bytes) to the
 * bridge, as a request of its caller. */
static void tools_call(struct js_session *s, json_t *tc, const char *text, size_t len)
{
    json_t *id = json_object_get(tc, "id");
    if (!json_is_integer(id)) {
        w_kill(s->w, "it sent a tool call without an id");
        return;
    }
    struct sandbox *sb = s->all->sb;
    struct conch_err err = {0};
    /* The eval's caller on the bridge begins with its first call (an eval that calls no
     * tool costs the bridge nothing) and ends with the eval. */
    if (!s->tools && sb->bridge &&
        conch_bridge_local_open(sb->bridge, "js", s->name, tools_answer, s, &s->tools, &err) < 0)
        log_warn("sandbox %s: JS session '%s': %s", sb->id, s->name, err.msg);
    if (!s->tools) {
        tools_answer(s, json_pack("{s:O,s:b,s:{s:s,s:s}}", "id", id, "ok", 0, "error", "kind",
                                  "unavailable", "message",
                                  sb->bridge ? "no tools: the sandbox's tool bridge refused the "
                                               "session's calls"
                                             : "no tools: this sandbox has no tool bridge"));
        return;
    }
    const char *name = json_string_value(json_object_get(tc, "name"));
    bool offered = false;
    size_t i;
    json_t *n;
    json_array_foreach(s->eval_tools, i, n) offered =
        offered || (name && json_is_string(n) && !strcmp(json_string_value(n), name));
    if (!offered) {
        char msg[400];
        snprintf(msg, sizeof(msg),
                 "tool '%.100s' is not available to JS session '%s': it is not registered, or "
                 "the session's tools setting (js.eval's 'tools') leaves it out",
                 name ? name : "?", s->name);
        tools_answer(s, json_pack("{s:O,s:b,s:{s:s,s:s}}", "id", id, "ok", 0, "error", "kind",
                                  "unknown_tool", "message", msg));
        return;
    }
    /* Handed over as parsed (no second pass over its JSON), charged as its frame's text. */
    if (json_object_set_new(tc, "op", json_string("call")) < 0) {
        tools_answer(s, json_pack("{s:O,s:b,s:{s:s,s:s}}", "id", id, "ok", 0, "error", "kind",
                                  "unavailable", "message", "out of memory"));
        return;
    }
    conch_bridge_local_request(s->tools, tc, text, len);
}

/* The eval's tool calls into its @result: tool_calls (the bridge's CallRecords, in order of
 * completion; calls still in flight are cancelled now), tools_summary and a line of text. */
static void tools_finish(struct js_session *s, json_t *result)
{
    struct conch_bridge_report rep;
    conch_bridge_local_close(s->tools, &rep);
    s->tools = NULL;
    if (!result)
        goto out;
    /* rep.calls stays the report's (conch_bridge_report_done drops it); a new array is ours */
    if (rep.calls)
        json_object_set(result, "tool_calls", rep.calls);
    else
        json_object_set_new(result, "tool_calls", json_array());
    if (rep.summary) {
        json_object_set_new(result, "tools_summary", json_string(rep.summary));
        const char *text = json_string_value(json_object_get(result, "text"));
        char *t = NULL;
        if (text && asprintf(&t, "%s%s%s", text,
                             *text && text[strlen(text) - 1] != '\n' ? "\n" : "", rep.summary) >= 0)
            json_object_set_new(result, "text", json_string(t));
        free(t);
    }
out:
    conch_bridge_report_done(&rep);
}

/* A frame from the worker: a tool call, or the answer to the request in flight. */
static void w_frame(struct js_worker *w, const char *buf, size_t len)
{
    struct js_session *s = w->s;
    /* Duplicate keys refused, as the bridge refuses them in a caller's line. */
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *tc = j ? json_object_get(j, "tool_call") : NULL;
    if (!j || !s || !s->call) {
        json_decref(j);
        w_kill(w, j ? "it wrote out of turn" : "it wrote a frame that is not JSON");
        return;
    }
    if (tc) {
        if (s->op != JS_OP_EVAL || !json_is_object(tc))
            w_kill(w, "it sent a tool call out of an eval");
        else
            tools_call(s, tc, buf, len);
        json_decref(j);
        return;
    }
    struct conch_rpc_call *call = s->call;
    enum js_op op = s->op;
    bool restarted = s->restarted;
    s->call = NULL;
    s->op = JS_OP_NONE;
    s->restarted = false;
    uv_timer_stop(&w->timer);
    json_t *result = json_object_get(j, "result");
    json_t *error = json_object_get(j, "error");
    if (op == JS_OP_EVAL)
        tools_finish(s, json_is_object(result) ? result : NULL);
    if (json_is_object(result) && op == JS_OP_EVAL) {
        json_object_set_new(result, "session", json_string(s->name));
        json_object_set_new(result, "restarted", json_boolean(restarted));
        if (restarted)
            json_object_set_new(result, "restart_reason", json_string(s->lost_why));
        s->evals++;
        conch_rpc_call_reply(call, json_incref(result));
    } else if (json_is_object(result)) {
        conch_rpc_call_reply(call, json_pack("{s:s,s:b}", "session", s->name, "reset", 1));
    } else {
        const char *msg = json_string_value(json_object_get(error, "message"));
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "JS session '%s': %s", s->name,
                             msg ? msg : "the worker's answer has neither result nor error");
    }
    if (json_is_true(json_object_get(j, "ending")) && s->w == w) {
        /* Its watchdog answered and it ends: the session's next eval starts a fresh one. */
        session_lost(s, watchdog_why, false);
        w_close(w, true);
    }
    json_decref(j);
    if (s->all->refill) /* after the answer: the spare's start is not on its path */
        spare_start(s->all);
}

/* Room for the next read: up to JS_INBUF, or the whole frame under way when larger. */
static void w_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct js_worker *w = h->data;
    (void)suggested;
    if (w->in_off == w->in_len)
        w->in_off = w->in_len = 0;
    uint64_t flen;
    size_t need = sizeof(flen);
    if (w->in_len - w->in_off >= sizeof(flen)) {
        memcpy(&flen, w->in + w->in_off, sizeof(flen));
        need += flen <= JS_FRAME_MAX ? (size_t)flen : 0; /* too large: refused once read */
    }
    if (w->in_off && w->in_off + need > w->in_cap) {
        memmove(w->in, w->in + w->in_off, w->in_len - w->in_off);
        w->in_len -= w->in_off;
        w->in_off = 0;
    }
    size_t cap = w->in_cap < JS_INBUF ? JS_INBUF : w->in_cap;
    if (cap < w->in_off + need)
        cap = w->in_off + need;
    if (cap == w->in_len)
        cap += JS_INBUF;
    if (cap != w->in_cap) {
        char *n = realloc(w->in, cap);
        if (!n) {
            *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
            return;
        }
        w->in = n;
        w->in_cap = cap;
    }
    *buf = uv_buf_init(w->in + w->in_len, (unsigned)(w->in_cap - w->in_len));
}

static void w_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
    struct js_worker *w = st->data;
    (void)b;
    if (n == 0)
        return;
    if (n < 0) {
        w_gone(w);
        return;
    }
    w->in_len += (size_t)n;
    /* Every whole frame read; w_frame may close the worker (w_kill), which stops us. */
    while (!w->closing && w->in_len - w->in_off >= sizeof(uint64_t)) {
        uint64_t want;
        memcpy(&want, w->in + w->in_off, sizeof(want));
        if (want == 0 || want > JS_FRAME_MAX) {
            w_kill(w, "it sent a frame of a wrong size");
            return;
        }
        if (w->in_len - w->in_off - sizeof(want) < want)
            break;
        const char *frame = w->in + w->in_off + sizeof(want);
        w->in_off += sizeof(want) + (size_t)want;
        w_frame(w, frame, (size_t)want);
    }
    if (w->in_off == w->in_len && w->in_cap > JS_INBUF) { /* a large frame's room given back */
        free(w->in);
        w->in = NULL;
        w->in_off = w->in_len = w->in_cap = 0;
    }
}

/* A new worker in @sb, attached to nothing yet; NULL with @err. */
static struct js_worker *w_new(struct sandbox *sb, struct conch_err *err)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
        conch_err_set(err, errno, "JS worker: socketpair: %s", strerror(errno));
        return NULL;
    }
    struct js_worker *w = calloc(1, sizeof(*w));
    if (!w) {
        close(sp[0]);
        close(sp[1]);
        conch_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    w->proc.ops = &w_ops;
    w->proc.data = w;
    int r = conch_super_js_server(&sb->super, &w->proc, sp[1], err);
    close(sp[1]);
    if (r < 0) {
        close(sp[0]);
        free(w);
        return NULL;
    }
    uv_pipe_init(&sb->d->loop, &w->pipe, 0);
    uv_timer_init(&sb->d->loop, &w->timer);
    uv_check_init(&sb->d->loop, &w->flush);
    w->pipe.data = w->timer.data = w->flush.data = w;
    w->handles = 4; /* the pipe, the timer, the check, the process */
    if ((r = uv_pipe_open(&w->pipe, sp[0])) < 0) {
        close(sp[0]);
        w_close(w, true);
        conch_err_set(err, -r, "JS worker: %s", uv_strerror(r));
        return NULL;
    }
    uv_read_start((uv_stream_t *)&w->pipe, w_alloc, w_on_read);
    return w;
}

/* Make @all's spare worker, if it has none and spares have not kept failing. */
static void spare_start(struct js_sessions *all)
{
    all->refill = false;
    if (all->spare || all->spare_failures >= JS_SPARE_FAILURES || all->sb->d->stopping)
        return;
    struct conch_err err = {0};
    struct js_worker *w = w_new(all->sb, &err);
    if (!w) {
        all->spare_failures++;
        log_warn("sandbox %s: a spare JS worker: %s", all->sb->id, err.msg);
        return;
    }
    w->all = all;
    all->spare = w;
}

/* Give @s a worker: the sandbox's spare (its engine already built) when it has a live one,
 * else a new one; a spare is made again once the eval in flight answered. Returns 0, or
 * -errno with @err. */
static int w_start(struct js_session *s, struct conch_err *err)
{
    struct js_sessions *all = s->all;
    struct js_worker *w = all->spare;
    if (w && (w->ended || w->closing))
        w = NULL;
    if (w) {
        all->spare = NULL;
        w->all = NULL;
        all->spare_failures = 0;
    } else if (!(w = w_new(all->sb, err))) {
        return -(err->code ? err->code : EIO);
    }
    all->refill = true;
    w->s = s;
    s->w = w;
    return 0;
}

/* ---- sessions ---- */

static struct js_session *session_find(struct sandbox *sb, const char *name)
{
    if (!sb->js)
        return NULL;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->js->list)
    {
        struct js_session *s = conch_list_entry(pos, struct js_session, link);
        if (!strcmp(s->name, name))
            return s;
    }
    return NULL;
}

/* Close @s: its worker killed, its request failed with @why, its record freed. */
static void session_free(struct js_session *s, const char *why)
{
    conch_bridge_local_close(s->tools, NULL);
    s->tools = NULL;
    if (s->w) {
        struct js_worker *w = s->w;
        w->s = NULL;
        s->w = NULL;
        w_close(w, true);
    }
    if (s->call)
        conch_rpc_call_failf(s->call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "JS session '%s': %s", s->name, why);
    conch_list_del(&s->link);
    s->all->n--;
    json_decref(s->tool_set);
    json_decref(s->eval_tools);
    free(s);
}

static bool valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > CONCH_JS_SESSION_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* The running sandbox and the session named in @params (created if @create), or NULL after
 * failing @call. */
static struct js_session *session_for(struct client *c, struct conch_rpc_call *call, json_t *params,
                                      bool create, struct sandbox **ret_sb)
{
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return NULL;
    *ret_sb = sb;
    conch_daemon_sandbox_touch(sb);
    const char *name = conch_rpc_str(params, "session", "default");
    if (!valid_name(name)) {
        conch_rpc_call_fail_param(call, "session",
                                  "a session name is 1 to %d letters, digits, '-', '_' or '.'",
                                  CONCH_JS_SESSION_NAME_MAX);
        return NULL;
    }
    struct js_session *s = session_find(sb, name);
    if (s || !create) {
        if (!s && !create)
            conch_rpc_call_failf(call, CONCH_RPC_INVALID_PARAMS, "invalid_params", NULL,
                                 "sandbox %s has no JS session '%s'", sb->id, name);
        return s;
    }
    if (!sb->js) {
        if (!(sb->js = calloc(1, sizeof(*sb->js))))
            goto oom;
        sb->js->sb = sb;
        CONCH_LIST_INIT(&sb->js->list);
    }
    if (sb->js->n >= JS_SESSIONS_MAX) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "sandbox %s has %d JS sessions, the most it may: close one "
                             "(js.close)",
                             sb->id, JS_SESSIONS_MAX);
        return NULL;
    }
    if (!(s = calloc(1, sizeof(*s))))
        goto oom;
    s->all = sb->js;
    snprintf(s->name, sizeof(s->name), "%s", name);
    conch_list_add(&sb->js->list, &s->link);
    sb->js->n++;
    return s;
oom:
    conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL, "out of memory");
    return NULL;
}

/* Whether @set (js.eval's `tools`: "all", "none", {"include": [names]} or {"exclude":
 * [names]}) is well formed; fails @call if not. */
static bool valid_tool_set(struct conch_rpc_call *call, json_t *set)
{
    const char *why = NULL;
    if (json_is_string(set)) {
        if (strcmp(json_string_value(set), "all") && strcmp(json_string_value(set), "none"))
            why = "a string is \"all\" or \"none\"";
    } else if (json_is_object(set) && json_object_size(set) == 1) {
        json_t *l = json_object_get(set, "include");
        if (!l)
            l = json_object_get(set, "exclude");
        size_t i;
        json_t *n;
        if (!json_is_array(l))
            why = "an object is {\"include\": [names]} or {\"exclude\": [names]}";
        else
            json_array_foreach(l, i, n) if (!json_is_string(n)) why = "tool names are strings";
    } else {
        why = "it is \"all\", \"none\", {\"include\": [names]} or {\"exclude\": [names]}";
    }
    if (why)
        conch_rpc_call_fail_param(call, "tools", "invalid tools setting: %s", why);
    return !why;
}

static bool name_listed(json_t *list, const char *name)
{
    size_t i;
    json_t *n;
    json_array_foreach(list, i,
                       n) if (json_is_string(n) && !strcmp(json_string_value(n), name)) return true;
    return false;
}

/* Whether @set lets a session see tool @name. */
static bool tool_in_set(json_t *set, const char *name)
{
    if (!set)
        return true;
    if (json_is_string(set))
        return !strcmp(json_string_value(set), "all");
    json_t *inc = json_object_get(set, "include");
    if (inc)
        return name_listed(inc, name);
    return !name_listed(json_object_get(set, "exclude"), name);
}

/* The sandbox's registered tools' names that @s sees (*ret_shown; the worker offers each as
 * tools[name] and as its camelCase alias, web_search → tools.webSearch) and those its tools
 * setting leaves out (*ret_hidden: a script calling one gets an error saying so). */
static void tool_names(struct sandbox *sb, struct js_session *s, json_t **ret_shown,
                       json_t **ret_hidden)
{
    json_t *shown = json_array(), *hidden = json_array();
    json_t *l = sb->bridge ? conch_bridge_list(sb->bridge) : NULL;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(l, "tools"), i, t)
    {
        json_t *name = json_object_get(t, "name");
        if (json_is_string(name))
            json_array_append(tool_in_set(s->tool_set, json_string_value(name)) ? shown : hidden,
                              name);
    }
    json_decref(l);
    *ret_shown = shown;
    *ret_hidden = hidden;
}

static bool refuse_busy(struct js_session *s, struct conch_rpc_call *call)
{
    if (!s->call)
        return false;
    conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "busy", NULL,
                         "JS session '%s' is running an eval: wait for it, or use another "
                         "session",
                         s->name);
    return true;
}

void conch_daemon_handle_js_eval(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = NULL;
    json_t *set = json_object_get(params, "tools");
    if (json_is_null(set))
        set = NULL;
    if (set && !valid_tool_set(call, set))
        return;
    struct js_session *s = session_for(ctx, call, params, true, &sb);
    if (!s || refuse_busy(s, call))
        return;
    if (set) {
        json_decref(s->tool_set);
        s->tool_set = json_deep_copy(set);
    }
    struct conch_err err = {0};
    bool restarted = false;
    if (!s->w) {
        restarted = s->lost;
        if (w_start(s, &err) < 0) {
            conch_rpc_call_fail_err(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", &err);
            return;
        }
    }
    json_t *t = json_object_get(params, "timeout");
    double timeout = t ? json_number_value(t) : JS_DEFAULT_TIMEOUT_S;
    int64_t timeout_ms = timeout > 0 ? (int64_t)(timeout * 1000) : 0;
    json_t *shown, *hidden;
    tool_names(sb, s, &shown, &hidden);
    json_decref(s->eval_tools);
    s->eval_tools = json_incref(shown);
    struct js_worker *w = s->w;
    json_t *req = json_pack("{s:s,s:{s:O,s:I}}", "method", "eval", "params", "code",
                            json_object_get(params, "code"), "timeout_ms", (json_int_t)timeout_ms);
    if (req && !(w->sent_tools && json_equal(w->sent_tools, shown) &&
                 json_equal(w->sent_hidden, hidden))) {
        /* The worker keeps the tools it got until told others: sent when they change. */
        json_t *p = json_object_get(req, "params");
        json_object_set(p, "tools", shown);
        json_object_set(p, "hidden_tools", hidden);
        json_decref(w->sent_tools);
        json_decref(w->sent_hidden);
        w->sent_tools = json_incref(shown);
        w->sent_hidden = json_incref(hidden);
    }
    json_decref(shown);
    json_decref(hidden);
    if (!req || w_send(s->w, req) < 0) {
        w_kill(s->w, "the eval could not be sent to it");
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "JS session '%s': the eval could not be sent to its worker", s->name);
        return;
    }
    s->call = call;
    s->op = JS_OP_EVAL;
    s->restarted = restarted;
    if (restarted)
        s->lost = false;
    if (timeout_ms > 0)
        uv_timer_start(&s->w->timer, w_on_timeout, (uint64_t)timeout_ms + JS_GRACE_MS, 0);
}

void conch_daemon_handle_js_reset(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = NULL;
    struct js_session *s = session_for(ctx, call, params, false, &sb);
    if (!s || (s->op != JS_OP_EVAL && refuse_busy(s, call)))
        return;
    if (s->op == JS_OP_EVAL) {
        /* An eval in flight is cancelled: its worker may be deep in a loop that reads
         * nothing, so it is killed (its tool calls cancelled), and the next eval's worker is
         * fresh, as a reset asks. */
        struct conch_rpc_call *ev = s->call;
        struct js_worker *w = s->w;
        s->call = NULL;
        s->op = JS_OP_NONE;
        s->restarted = false;
        conch_bridge_local_close(s->tools, NULL);
        s->tools = NULL;
        if (w) {
            w->s = NULL;
            s->w = NULL;
            w_close(w, true);
        }
        s->lost = false;
        conch_rpc_call_failf(ev, CONCH_RPC_INTERNAL_ERROR, "cancelled", NULL,
                             "JS session '%s': the eval was cancelled by js.reset; the session's "
                             "state is reset",
                             s->name);
        conch_rpc_call_reply(call, json_pack("{s:s,s:b}", "session", s->name, "reset", 1));
        return;
    }
    if (!s->w) { /* no worker: the next eval's is fresh anyway */
        s->lost = false;
        conch_rpc_call_reply(call, json_pack("{s:s,s:b}", "session", s->name, "reset", 1));
        return;
    }
    if (w_send(s->w, json_pack("{s:s}", "method", "reset")) < 0) {
        w_kill(s->w, "the reset could not be sent to it");
        s->lost = false; /* reset asked for a fresh session: that is what the next eval gets */
        conch_rpc_call_reply(call, json_pack("{s:s,s:b}", "session", s->name, "reset", 1));
        return;
    }
    /* Its fresh engine has no tools: the next eval sends them. */
    json_decref(s->w->sent_tools);
    json_decref(s->w->sent_hidden);
    s->w->sent_tools = s->w->sent_hidden = NULL;
    s->call = call;
    s->op = JS_OP_RESET;
    uv_timer_start(&s->w->timer, w_on_timeout, JS_GRACE_MS, 0);
}

void conch_daemon_handle_js_close(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = NULL;
    struct js_session *s = session_for(ctx, call, params, false, &sb);
    if (!s)
        return;
    json_t *res = json_pack("{s:s,s:b}", "session", s->name, "closed", 1);
    session_free(s, "the session was closed (js.close) during the request");
    conch_rpc_call_reply(call, res);
}

void conch_daemon_handle_js_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return;
    json_t *arr = json_array();
    if (sb->js) {
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &sb->js->list)
        {
            struct js_session *s = conch_list_entry(pos, struct js_session, link);
            json_array_append_new(arr, json_pack("{s:s,s:b,s:b,s:b,s:I}", "session", s->name,
                                                 "running", s->w != NULL, "busy", s->call != NULL,
                                                 "lost", s->lost, "evals", (json_int_t)s->evals));
        }
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "sessions", arr));
}

unsigned conch_daemon_js_count(const struct sandbox *sb)
{
    return sb->js ? sb->js->n : 0;
}

unsigned conch_daemon_js_busy(const struct sandbox *sb)
{
    unsigned n = 0;
    if (!sb->js)
        return 0;
    for (struct conch_list *pos = sb->js->list.next; pos != &sb->js->list; pos = pos->next)
        n += conch_list_entry(pos, struct js_session, link)->call != NULL;
    return n;
}

void conch_daemon_js_drop_spare(struct sandbox *sb)
{
    struct js_sessions *all = sb->js;
    if (!all || !all->spare)
        return;
    struct js_worker *w = all->spare;
    all->spare = NULL; /* dropped, not failed: spares go on being made */
    w->all = NULL;
    w_close(w, true); /* the next eval makes a new one */
}

void conch_daemon_js_stop(struct sandbox *sb)
{
    if (!sb->js)
        return;
    struct js_worker *spare = sb->js->spare;
    if (spare) {
        sb->js->spare = NULL;
        spare->all = NULL;
        w_close(spare, true);
    }
    while (!conch_list_empty(&sb->js->list))
        session_free(conch_list_entry(sb->js->list.next, struct js_session, link),
                     "the sandbox stopped");
    free(sb->js);
    sb->js = NULL;
}

int conch_daemon_js_worker_main(int sock)
{
    return conch_js_worker_serve(sock, NULL);
}
