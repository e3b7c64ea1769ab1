/* js-worker.c - the JS worker's body: one engine session served over a stream socket in
 * frames (a native-endian uint64_t length, then JSON), the file workers' framing. During an
 * eval the worker sends the session's tool calls as frames and reads their answers, so a
 * script's Promise.all has every call out at once. Files are the worker's own (relative to
 * its working directory, the workspace inside a sandbox). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/proctitle.h"
#include "core/strbuf.h"
#include "core/utf8.h"
#include "js/js-internal.h"

/* The largest frame either way: a script, a tool's answer. */
#define JS_MAX_FRAME (64u << 20)
/* The largest file readFile loads. */
#define JS_MAX_READ (64u << 20)

/* What the worker has read and not yet taken: frames are parsed where they lie, and one read
 * takes every frame already there (100 answers of a Promise.all in one call). */
struct inbuf {
    char *buf;
    size_t off, len, cap;
};

struct worker {
    int fd;
    struct conch_js_limits limits;
    struct conch_js_session *s;
    struct conch_sb calls; /* tool_call frames not sent yet */
    struct conch_sb out;   /* the answer being framed (kept: no allocation per eval) */
    struct inbuf in;
    bool broken;
};

/* ---- the watchdog ----
 * QuickJS 2021-03-27 polls the interrupt handler that holds an eval's deadline from its
 * bytecode loop only: a backtracking regular expression (lre_exec) or another long native
 * operation runs past any deadline. So while an eval with a deadline runs, a SIGALRM comes
 * WATCHDOG_GRACE_MS after the deadline; if the eval is still in the engine then (not in a
 * host hook: waiting for tool answers, reading or writing a file), nothing can stop it but
 * the process's end: the handler writes the eval's answer, prepared before the eval (a
 * TimeoutError saying the session is lost, marked "ending": true beside "result"), and exits,
 * so the caller gets its answer at the deadline and the session's next eval starts a fresh
 * worker. */
#define WATCHDOG_GRACE_MS 1000

static struct {
    volatile sig_atomic_t armed;   /* an eval with a deadline runs */
    volatile sig_atomic_t in_host; /* in a host hook, not in the engine */
    int fd;
    char *frame; /* the answer, framed */
    size_t len;
} wd;

static void wd_timer(int64_t ms)
{
    struct itimerval it = {.it_value = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static void on_alarm(int sig)
{
    (void)sig;
    if (!wd.armed)
        return;
    if (wd.in_host) { /* the engine's wait ends at the deadline: look again */
        wd_timer(WATCHDOG_GRACE_MS);
        return;
    }
    size_t off = 0;
    while (off < wd.len) {
        ssize_t n = write(wd.fd, wd.frame + off, wd.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    _exit(CONCH_JS_WATCHDOG_EXIT);
}

/* Arm the watchdog for an eval of @timeout_ms (<= 0: none) on @fd. Its answer is the same
 * for every eval: framed once, the first time. */
static void wd_arm(int fd, int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        return;
    if (!wd.frame) {
        static const char msg[] =
            "the script ran past its deadline inside an operation the engine cannot interrupt "
            "(a regular expression that backtracks, or another long built-in call): the JS "
            "worker was ended, and the session's state is lost: the next eval starts a fresh "
            "session";
        json_t *res = json_pack("{s:b,s:{s:b,s:{s:s,s:s},s:[],s:[],s:[],s:s+}}", "ending", 1,
                                "result", "ok", 0, "error", "name", "TimeoutError", "message", msg,
                                "console", "tool_calls", "writes", "text", "TimeoutError: ", msg);
        char *text = res ? json_dumps(res, JSON_COMPACT) : NULL;
        json_decref(res);
        if (!text)
            return;
        uint64_t len = strlen(text);
        char *frame = malloc(sizeof(len) + len);
        if (frame) {
            memcpy(frame, &len, sizeof(len));
            memcpy(frame + sizeof(len), text, len);
            wd.len = sizeof(len) + len;
            struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
            sigemptyset(&sa.sa_mask);
            sigaction(SIGALRM, &sa, NULL);
            wd.frame = frame;
        }
        free(text);
        if (!wd.frame)
            return;
    }
    wd.fd = fd;
    wd.in_host = 0;
    wd.armed = 1;
    wd_timer(timeout_ms > CONCH_JS_MAX_TIMEOUT_MS ? CONCH_JS_MAX_TIMEOUT_MS
                                                  : timeout_ms + WATCHDOG_GRACE_MS);
}

static void wd_disarm(void)
{
    if (!wd.armed)
        return;
    wd.armed = 0;
    wd_timer(0);
}

/* Flush at this much: a Promise.all of many calls goes out in a few writes, not one each. */
#define JS_CALLS_FLUSH (1u << 20)

/* The read buffer's usual size; a larger frame grows it for itself, and it shrinks back. */
#define JS_INBUF (64u << 10)

/* Whether a whole frame is buffered; -1 if the one buffered has a wrong length. */
static int frame_buffered(const struct inbuf *in)
{
    uint64_t len;
    if (in->len - in->off < sizeof(len))
        return 0;
    memcpy(&len, in->buf + in->off, sizeof(len));
    if (len == 0 || len > JS_MAX_FRAME)
        return -1;
    return in->len - in->off - sizeof(len) >= len;
}

/* Read what the socket has into @in (waiting in poll, not in read: a reader asleep in read()
 * on a unix socket is woken each time the peer reads what we wrote, for nothing). Returns
 * 1, 0 at EOF, -1 on an error. */
static int fill(int fd, struct inbuf *in)
{
    if (in->off == in->len)
        in->off = in->len = 0;
    /* What the frame at in->off needs from there: its header, then all of it. */
    uint64_t flen;
    size_t need = sizeof(flen);
    if (in->len - in->off >= sizeof(flen)) {
        memcpy(&flen, in->buf + in->off, sizeof(flen));
        need += (size_t)flen; /* <= JS_MAX_FRAME: checked by frame_buffered */
    }
    if (in->off && in->off + need > in->cap) { /* room at the front: move down */
        memmove(in->buf, in->buf + in->off, in->len - in->off);
        in->len -= in->off;
        in->off = 0;
    }
    size_t cap = in->cap < JS_INBUF ? JS_INBUF : in->cap;
    if (cap < in->off + need)
        cap = in->off + need;
    if (cap != in->cap) {
        char *b = realloc(in->buf, cap);
        if (!b)
            return -1;
        in->buf = b;
        in->cap = cap;
    }
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        ssize_t n = read(fd, in->buf + in->len, in->cap - in->len);
        if (n > 0) {
            in->len += (size_t)n;
            return 1;
        }
        if (n == 0)
            return 0;
        if (errno != EINTR && errno != EAGAIN)
            return -1;
    }
}

/* One frame's JSON; NULL at EOF (*@ret_eof) or on a broken or oversize frame. */
static json_t *read_frame(struct worker *w, bool *ret_eof)
{
    struct inbuf *in = &w->in;
    *ret_eof = false;
    int r;
    while ((r = frame_buffered(in)) == 0) {
        int f = fill(w->fd, in);
        if (f <= 0) {
            *ret_eof = f == 0 && in->off == in->len;
            return NULL;
        }
    }
    if (r < 0)
        return NULL;
    uint64_t len;
    memcpy(&len, in->buf + in->off, sizeof(len));
    json_t *j = json_loadb(in->buf + in->off + sizeof(len), (size_t)len, 0, NULL);
    in->off += sizeof(len) + (size_t)len;
    if (in->off == in->len && in->cap > JS_INBUF) { /* a large frame's room given back */
        free(in->buf);
        *in = (struct inbuf){0};
    }
    return j ? j : json_object(); /* not JSON: a request without a method */
}

static int dump_to_sb(const char *buf, size_t size, void *data)
{
    conch_sb_putn(data, buf, size);
    return 0;
}

/* One frame of @j's JSON, in one send (MSG_NOSIGNAL: a peer gone is an error, not a
 * signal that kills the worker), built in the worker's one output buffer. */
static int write_frame(struct worker *w, json_t *j)
{
    struct conch_sb *b = &w->out;
    uint64_t len = 0;
    conch_sb_trunc(b, 0);
    conch_sb_putn(b, (const char *)&len, sizeof(len));
    if (json_dump_callback(j, dump_to_sb, b, JSON_COMPACT) < 0 || b->oom) {
        conch_sb_done(b);
        return -1;
    }
    len = b->len - sizeof(len);
    memcpy(b->buf, &len, sizeof(len));
    int r = conch_send_all(w->fd, b->buf, b->len);
    if (b->cap > JS_INBUF)
        conch_sb_done(b);
    return r < 0 ? -1 : 0;
}

static int worker_read(void *data, const char *path, char **ret_buf, size_t *ret_len,
                       struct conch_err *err)
{
    wd.in_host = 1;
    int r = conch_read_file(path, JS_MAX_READ, ret_buf, ret_len, err);
    wd.in_host = 0;
    if (r < 0)
        conch_err_wrap(err, "readFile");
    return r;
}

/* Atomic replace: a temporary file beside it, then rename; the mode of a file replaced is
 * kept, a new one is 0644 less the umask. */
static int write_file(const char *path, const char *buf, size_t len, struct conch_err *err);

static int worker_write(void *data, const char *path, const char *buf, size_t len,
                        struct conch_err *err)
{
    wd.in_host = 1;
    int r = write_file(path, buf, len, err);
    wd.in_host = 0;
    return r;
}

static int write_file(const char *path, const char *buf, size_t len, struct conch_err *err)
{
    struct stat st;
    mode_t mode = stat(path, &st) == 0 ? (st.st_mode & 07777) : 0644;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return conch_err_set(err, ENOMEM, "writeFile '%s': out of memory", path);
    snprintf(tmp, plen + 16, "%s.conch-XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return conch_err_set(err, e, "writeFile '%s': %s", path, strerror(e));
    }
    int r = conch_write_all(fd, buf, len);
    if (r == 0 && fchmod(fd, mode) < 0)
        r = -errno;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, path) < 0)
        r = -errno;
    if (r < 0) {
        unlink(tmp);
        free(tmp);
        return conch_err_set(err, -r, "writeFile '%s': %s", path, strerror(-r));
    }
    free(tmp);
    return 0;
}

/* Send the tool_call frames gathered since the last flush; -1 (and broken) if the channel
 * is gone. */
static int flush_calls(struct worker *w)
{
    if (!w->calls.len || w->broken)
        return w->broken ? -1 : 0;
    sig_atomic_t was = wd.in_host;
    wd.in_host = 1; /* no answer of the watchdog's in the middle of these frames */
    int r = w->calls.oom ? -1 : conch_send_all(w->fd, w->calls.buf, w->calls.len);
    wd.in_host = was;
    conch_sb_trunc(&w->calls, 0);
    if (r < 0)
        w->broken = true;
    return r < 0 ? -1 : 0;
}

/* A call's frame, gathered: its input is the script's JSON.stringify text, put in as it is
 * (the name is a tool name, [A-Za-z0-9_$-], checked by conch_js_session_set_tools). Sent at the
 * next wait or at the eval's end. */
static int worker_tool_start(void *data, struct conch_js_session *s, uint64_t id, const char *name,
                             const char *input, struct conch_err *err)
{
    struct worker *w = data;
    /* A lone surrogate in a script's string is not UTF-8: repaired (U+FFFD), as everything
     * conch sends. */
    char *fixed = NULL;
    size_t ilen = strlen(input);
    for (size_t i = 0; i < ilen;) {
        size_t k = conch_utf8_seq((const unsigned char *)input + i, ilen - i);
        if (!k) {
            size_t flen;
            fixed = conch_utf8_repair(input, ilen, &flen);
            if (!fixed)
                return conch_err_set(err, ENOMEM, "tools.%s: out of memory", name);
            input = fixed;
            break;
        }
        i += k;
    }
    /* JSON.stringify writes a lone surrogate as an escape ("\ud800"), which the daemon's
     * JSON reader (jansson) refuses: such an input is refused here, with the reason. */
    if (strstr(input, "\\ud") || strstr(input, "\\uD")) {
        json_t *check = json_loads(input, JSON_DECODE_ANY, NULL);
        json_decref(check);
        if (!check) {
            free(fixed);
            return conch_err_set(err, EINVAL,
                                 "tools.%s: the input has a lone UTF-16 surrogate (a \\ud800-"
                                 "\\udfff escape with no pair), which is not valid JSON text "
                                 "for the tool",
                                 name);
        }
    }
    size_t at = w->calls.len;
    uint64_t len = 0;
    conch_sb_putn(&w->calls, (const char *)&len, sizeof(len));
    conch_sb_printf(&w->calls, "{\"tool_call\":{\"id\":%llu,\"name\":\"%s\",\"input\":%s}}",
                    (unsigned long long)id, name, input);
    free(fixed);
    if (!w->calls.oom) {
        len = w->calls.len - at - sizeof(len);
        memcpy(w->calls.buf + at, &len, sizeof(len));
    }
    if ((w->calls.len > JS_CALLS_FLUSH || w->calls.oom) && flush_calls(w) < 0)
        return conch_err_set(err, EPIPE, "tools.%s: the worker's channel is gone", name);
    return 0;
}

static void deliver(struct worker *w, json_t *params)
{
    json_int_t id = json_integer_value(json_object_get(params, "id"));
    bool ok = json_is_true(json_object_get(params, "ok"));
    json_t *v = json_object_get(params, ok ? "value" : "error");
    char *text = json_dumps(v ? v : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
    if (text)
        conch_js_tool_answer(w->s, (uint64_t)id, ok, text, strlen(text));
    free(text);
}

static int answer_error(struct worker *w, const char *msg)
{
    json_t *e = json_pack("{s:{s:s}}", "error", "message", msg);
    int r = write_frame(w, e);
    json_decref(e);
    return r;
}

static int wait_answers(struct worker *w, struct conch_js_session *s, int timeout_ms,
                        struct conch_err *err);

static int worker_wait(void *data, struct conch_js_session *s, int timeout_ms,
                       struct conch_err *err)
{
    wd.in_host = 1;
    int r = wait_answers(data, s, timeout_ms, err);
    wd.in_host = 0;
    return r;
}

static int wait_answers(struct worker *w, struct conch_js_session *s, int timeout_ms,
                        struct conch_err *err)
{
    if (flush_calls(w) < 0)
        return conch_err_set(err, EPIPE, "send tool calls: the worker's channel is gone");
    struct pollfd p = {.fd = w->fd, .events = POLLIN};
    int n = frame_buffered(&w->in) ? 1 : poll(&p, 1, timeout_ms);
    if (n < 0 && errno != EINTR)
        return conch_err_set(err, errno, "wait for tool answers: %s", strerror(errno));
    if (n <= 0)
        return 0;
    /* Every answer already there, before the script runs again: 100 answers to a
     * Promise.all are one wake-up of the eval loop, not 100. */
    do {
        bool eof;
        json_t *req = read_frame(w, &eof);
        if (!req) {
            w->broken = true;
            return conch_err_set(err, EPIPE, "wait for tool answers: the worker's channel %s",
                                 eof ? "was closed" : "broke");
        }
        const char *method = json_string_value(json_object_get(req, "method"));
        if (method && strcmp(method, "tool_result") == 0)
            deliver(w, json_object_get(req, "params"));
        else if (answer_error(w, "an eval is under way: only tool_result frames are read") < 0)
            w->broken = true;
        json_decref(req);
    } while (!w->broken && s->calls && (frame_buffered(&w->in) || poll(&p, 1, 0) == 1));
    return 0;
}

static int new_session(struct worker *w, struct conch_err *err)
{
    struct conch_js_host host = {.data = w,
                                 .read_file = worker_read,
                                 .write_file = worker_write,
                                 .tool_start = worker_tool_start,
                                 .wait = worker_wait};
    /* Call ids go on from the last session's: an answer to a call of the session before a
     * reset, coming late, must find no call, not the new session's call of the same id. */
    uint64_t next_call_id = w->s ? w->s->next_call_id : 0;
    conch_js_session_free(w->s);
    w->s = NULL;
    int r = conch_js_session_new(&w->limits, &host, &w->s, err);
    if (r == 0)
        w->s->next_call_id = next_call_id;
    return r;
}

static json_t *do_eval(struct worker *w, json_t *params, struct conch_err *err)
{
    json_t *code = json_object_get(params, "code");
    if (!json_is_string(code)) {
        conch_err_set(err, EINVAL, "eval: 'code' must be a string");
        return NULL;
    }
    json_t *tools = json_object_get(params, "tools");
    if (json_is_array(tools)) {
        json_t *hidden = json_object_get(params, "hidden_tools");
        size_t n = json_array_size(tools), nh = json_array_size(hidden);
        const char **names = calloc(n + nh + 1, sizeof(*names));
        if (!names) {
            conch_err_set(err, ENOMEM, "eval: out of memory");
            return NULL;
        }
        for (size_t i = 0; i < n + nh; i++) {
            names[i] =
                json_string_value(i < n ? json_array_get(tools, i) : json_array_get(hidden, i - n));
            if (!names[i])
                names[i] = "";
        }
        int r = conch_js_session_set_tools(w->s, names, n, names + n, nh, err);
        free(names);
        if (r < 0)
            return NULL;
    }
    struct conch_js_eval_opts opts = {
        .timeout_ms = json_integer_value(json_object_get(params, "timeout_ms")),
        .cpu_ms = json_integer_value(json_object_get(params, "cpu_ms")),
        .filename = json_string_value(json_object_get(params, "filename")),
    };
    json_t *res = NULL;
    wd_arm(w->fd, opts.timeout_ms);
    int r =
        conch_js_eval(w->s, json_string_value(code), json_string_length(code), &opts, &res, err);
    wd_disarm();
    /* Calls the script started and did not wait for go out before its answer. */
    flush_calls(w);
    return r < 0 ? NULL : res;
}

/* Before the first request: one eval of a cell that declares nothing, so that what a first
 * eval pays once (the grammar's tables and QuickJS's compiler and renderer faulted in, their
 * first allocations) is paid here, while the worker waits as a spare. Its result is
 * dropped; the session's globals are as new. */
static void warm_up(struct worker *w)
{
    static const char cell[] = "(async () => ({ a: [1 as number, 'b'], c: null }))()";
    struct conch_js_eval_opts opts = {.timeout_ms = 1000};
    json_t *res = NULL;
    struct conch_err err = {0};
    if (conch_js_eval(w->s, cell, sizeof(cell) - 1, &opts, &res, &err) == 0) {
        char *text = json_dumps(res, JSON_COMPACT);
        free(text);
    }
    json_decref(res);
}

/* The worker's data segment (RLIMIT_DATA: heap and private mappings) beyond the engine's
 * heap limit: frames, files read and writes buffered (64 MiB each), jansson's copies. A
 * worker that grows past it fails its allocations (the engine's as "out of memory") instead
 * of taking the sandbox's memory. Not under AddressSanitizer, whose shadow memory alone is
 * terabytes of mappings. */
#define JS_DATA_MARGIN (768ull << 20)

static void limit_data(size_t engine_bytes)
{
#if defined(__SANITIZE_ADDRESS__)
    (void)engine_bytes;
#else
    if (!engine_bytes)
        return;
    struct rlimit rl;
    rlim_t want = (rlim_t)engine_bytes + JS_DATA_MARGIN;
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want)) {
        rl.rlim_cur = rl.rlim_max = want;
        setrlimit(RLIMIT_DATA, &rl);
    }
#endif
}

int conch_js_worker_serve(int fd, const struct conch_js_limits *limits)
{
    struct worker w = {.fd = fd};
    if (limits)
        w.limits = *limits;
    else
        conch_js_limits_default(&w.limits);
    limit_data(w.limits.memory_bytes);
    struct conch_err err = {0};
    if (new_session(&w, &err) < 0) {
        answer_error(&w, err.msg);
        return 1;
    }
    /* Warmed only while it waits: a request already there (a spare taken as it started)
     * is served at once. */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) == 0)
        warm_up(&w);
    int ret = 1;
    bool serving = false;
    for (;;) {
        bool eof;
        json_t *req = read_frame(&w, &eof);
        if (!req) {
            ret = eof ? 0 : 1;
            break;
        }
        if (!serving) {
            /* Started ahead ("conch-js-spare", its engine built), it now serves a session. */
            conch_proctitle_set_child("conch-js-worker");
            serving = true;
        }
        const char *method = json_string_value(json_object_get(req, "method"));
        json_t *params = json_object_get(req, "params");
        json_t *result = NULL;
        conch_err_clear(&err);
        if (!method) {
            conch_err_set(&err, EINVAL, "a request needs a 'method'");
        } else if (strcmp(method, "eval") == 0) {
            result = do_eval(&w, params, &err);
        } else if (strcmp(method, "reset") == 0) {
            if (new_session(&w, &err) == 0)
                result = json_pack("{s:b}", "reset", 1);
        } else if (strcmp(method, "tool_result") == 0) {
            /* An answer to a call of an eval that has ended: nothing waits for it. */
            json_decref(req);
            continue;
        } else {
            conch_err_set(&err, EINVAL, "unknown method '%s' (eval, reset, tool_result)", method);
        }
        json_decref(req);
        int r;
        if (result) {
            json_t *a = json_pack("{s:o}", "result", result);
            r = write_frame(&w, a);
            json_decref(a);
        } else {
            r = answer_error(&w, err.msg[0] ? err.msg : "out of memory");
        }
        if (r < 0 || w.broken || !w.s)
            break;
    }
    conch_js_session_free(w.s);
    conch_sb_done(&w.calls);
    conch_sb_done(&w.out);
    free(w.in.buf);
    return ret;
}
